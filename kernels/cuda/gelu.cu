/* gelu.cu -- GELU, tanh approximation (kernels.cuh; formulas of kernels/cpu/gelu.c).
 * The output (forward's out, backward's dinp) fp32, or bf16 rounded once:
 * a bf16 GEMM's input, written so instead of cast afterwards. The input
 * fp32, or bf16 (the c_fc GEMM's bf16 out: widened exactly, zkc_get). */
#include "common.cuh"

#define GELU_K 0.7978845608028654f     /* sqrt(2/pi) */
#define GELU_A 0.044715f

template <class O, class I>
__device__ __forceinline__ void gelu_fwd(O *out, const I *inp, size_t n)
{
    ZKC_FOR(i, n) {
        float x = zkc_get(inp + i);
        float inner = GELU_K * (x + GELU_A * (x * x * x));
        zkc_put(out + i, 0.5f * x * (1.0f + tanhf(inner)));
    }
}

/* dinp may alias dout (fp32): each element reads both before it writes */
template <class O, class I>
__device__ __forceinline__ void gelu_bwd(O *dinp, const I *inp, const float *dout, size_t n)
{
    ZKC_FOR(i, n) {
        float x = zkc_get(inp + i), x2 = x * x;
        float th = tanhf(GELU_K * (x + GELU_A * (x2 * x)));
        float left_d = 0.5f * (1.0f + th);
        float inner_d = GELU_K * (1.0f + 3.0f * GELU_A * x2);
        float right_d = 0.5f * x * (1.0f - th * th) * inner_d;
        zkc_put(dinp + i, dout[i] * (left_d + right_d));
    }
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
    if (in16) k_gelu_fwd_bb<<<zkc_grid(n, 256), 256, 0, s>>>((uint16_t *)out, (const uint16_t *)inp, n);
    else if (out16) k_gelu_fwd_b16<<<zkc_grid(n, 256), 256, 0, s>>>((uint16_t *)out, (const float *)inp, n);
    else k_gelu_fwd<<<zkc_grid(n, 256), 256, 0, s>>>((float *)out, (const float *)inp, n);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_gelu_backward(cudaStream_t s, void *dinp, int out16, const void *inp, int in16,
                                 const float *dout, size_t n)
{
    if (n == 0) return 0;
    if (in16) k_gelu_bwd_bb<<<zkc_grid(n, 256), 256, 0, s>>>((uint16_t *)dinp, (const uint16_t *)inp, dout, n);
    else if (out16) k_gelu_bwd_b16<<<zkc_grid(n, 256), 256, 0, s>>>((uint16_t *)dinp, (const float *)inp, dout, n);
    else k_gelu_bwd<<<zkc_grid(n, 256), 256, 0, s>>>((float *)dinp, (const float *)inp, dout, n);
    return ZKC_LAUNCHED();
}
