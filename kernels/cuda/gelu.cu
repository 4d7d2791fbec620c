/* gelu.cu -- GELU, tanh approximation (kernels.cuh; formulas of kernels/cpu/gelu.c).
 * The output (forward's out, backward's dinp) fp32, or bf16 rounded once:
 * a bf16 GEMM's input, written so instead of cast afterwards. The input
 * fp32, or bf16 (the c_fc GEMM's bf16 out: widened exactly, zkc_get). */
#include "common.cuh"

#define GELU_K 0.7978845608028654f     /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* one element: the forward's value, the backward's dinp (the CPU's formulas) */
__device__ __forceinline__ float gelu_f(float x)
{
    float inner = GELU_K * (x + GELU_A * (x * x * x));
    return 0.5f * x * (1.0f + tanhf(inner));
}
__device__ __forceinline__ float gelu_df(float x, float d)
{
    float x2 = x * x;
    float th = tanhf(GELU_K * (x + GELU_A * (x2 * x)));
    float left_d = 0.5f * (1.0f + th);
    float inner_d = GELU_K * (1.0f + 3.0f * GELU_A * x2);
    float right_d = 0.5f * x * (1.0f - th * th) * inner_d;
    return d * (left_d + right_d);
}

template <class O, class I>
__device__ __forceinline__ void gelu_fwd(O *out, const I *inp, size_t n)
{
    ZKC_FOR(i, n) zkc_put(out + i, gelu_f(zkc_get(inp + i)));
}

/* dinp may alias dout (fp32): each element reads both before it writes */
template <class O, class I>
__device__ __forceinline__ void gelu_bwd(O *dinp, const I *inp, const float *dout, size_t n)
{
    ZKC_FOR(i, n) zkc_put(dinp + i, gelu_df(zkc_get(inp + i), dout[i]));
}

/* bf16 in and out (the block's fch, dfch for the c_fc GEMM): 8 elements a
 * thread by 16-byte loads and stores, the tail (n mod 8) by block 0; the
 * same arithmetic per element, the same bits. An H200 ran the scalar
 * kernels at 1.15 TB/s forward, 2.1 backward, of a 3.7 TB/s copy. */
__global__ static void k_gelu_fwd_bb8(uint16_t *out, const uint16_t *inp, size_t n)
{
    size_t n8 = n / 8;
    ZKC_FOR(i, n8) {
        uint4 v = ((const uint4 *)inp)[i], o;
        const uint16_t *pv = (const uint16_t *)&v;
        uint16_t *po = (uint16_t *)&o;
#pragma unroll
        for (int j = 0; j < 8; j++) zkc_put(po + j, gelu_f(zkc_get(pv + j)));
        ((uint4 *)out)[i] = o;
    }
    size_t t = n8 * 8 + threadIdx.x;
    if (blockIdx.x == 0 && t < n) zkc_put(out + t, gelu_f(zkc_get(inp + t)));
}
__global__ static void k_gelu_bwd_bb8(uint16_t *dinp, const uint16_t *inp, const float *dout, size_t n)
{
    size_t n8 = n / 8;
    ZKC_FOR(i, n8) {
        uint4 v = ((const uint4 *)inp)[i], o;
        float4 d0 = ((const float4 *)dout)[2 * i], d1 = ((const float4 *)dout)[2 * i + 1];
        const uint16_t *pv = (const uint16_t *)&v;
        uint16_t *po = (uint16_t *)&o;
        float d[8] = { d0.x, d0.y, d0.z, d0.w, d1.x, d1.y, d1.z, d1.w };
#pragma unroll
        for (int j = 0; j < 8; j++) zkc_put(po + j, gelu_df(zkc_get(pv + j), d[j]));
        ((uint4 *)dinp)[i] = o;
    }
    size_t t = n8 * 8 + threadIdx.x;
    if (blockIdx.x == 0 && t < n) zkc_put(dinp + t, gelu_df(zkc_get(inp + t), dout[t]));
}

__global__ static void k_gelu_fwd(float *out, const float *inp, size_t n) { gelu_fwd(out, inp, n); }
__global__ static void k_gelu_fwd_b16(uint16_t *out, const float *inp, size_t n) { gelu_fwd(out, inp, n); }
__global__ static void k_gelu_fwd_bb(uint16_t *out, const uint16_t *inp, size_t n) { gelu_fwd(out, inp, n); }
__global__ static void k_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{ gelu_bwd(dinp, inp, dout, n); }
__global__ static void k_gelu_bwd_b16(uint16_t *dinp, const float *inp, const float *dout, size_t n)
{ gelu_bwd(dinp, inp, dout, n); }
__global__ static void k_gelu_bwd_bb(uint16_t *dinp, const uint16_t *inp, const float *dout, size_t n)
{ gelu_bwd(dinp, inp, dout, n); }

extern "C" int zkc_gelu_forward(cudaStream_t s, void *out, int out16, const void *inp, int in16,
                                size_t n)
{
    if (n == 0) return 0;
    if (in16 && out16 && zkc_aligned16(out, inp, NULL))
        k_gelu_fwd_bb8<<<zkc_grid(n / 8 + 1, 256), 256, 0, s>>>((uint16_t *)out, (const uint16_t *)inp, n);
    else if (in16) k_gelu_fwd_bb<<<zkc_grid(n, 256), 256, 0, s>>>((uint16_t *)out, (const uint16_t *)inp, n);
    else if (out16) k_gelu_fwd_b16<<<zkc_grid(n, 256), 256, 0, s>>>((uint16_t *)out, (const float *)inp, n);
    else k_gelu_fwd<<<zkc_grid(n, 256), 256, 0, s>>>((float *)out, (const float *)inp, n);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_gelu_backward(cudaStream_t s, void *dinp, int out16, const void *inp, int in16,
                                 const float *dout, size_t n)
{
    if (n == 0) return 0;
    if (in16 && out16 && zkc_aligned16(dinp, inp, dout))
        k_gelu_bwd_bb8<<<zkc_grid(n / 8 + 1, 256), 256, 0, s>>>((uint16_t *)dinp, (const uint16_t *)inp, dout, n);
    else if (in16) k_gelu_bwd_bb<<<zkc_grid(n, 256), 256, 0, s>>>((uint16_t *)dinp, (const uint16_t *)inp, dout, n);
    else if (out16) k_gelu_bwd_b16<<<zkc_grid(n, 256), 256, 0, s>>>((uint16_t *)dinp, (const float *)inp, dout, n);
    else k_gelu_bwd<<<zkc_grid(n, 256), 256, 0, s>>>((float *)dinp, (const float *)inp, dout, n);
    return ZKC_LAUNCHED();
}
