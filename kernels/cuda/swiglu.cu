/* swiglu.cu -- the gated MLP's activation (kernels.cuh; the formulas of
 * kernels/cpu/swiglu.c): out = silu(gate) * up on rows [gate (F) | up
 * (F)], a thread an element. sigmoid from expf of -|x| (the CPU: its own
 * polynomial exp; within ~2 float ulps of each other). G is float, or
 * uint16_t for bf16 gu, out / dgu and the backward's dout (widened
 * exactly, rounded once). */
#include "common.cuh"

__device__ __forceinline__ float sg_sigmoid(float x)
{
    float e = expf(-fabsf(x));
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

template <typename G>
__global__ static void k_swiglu_fwd(G *out, const G *gu, int N, int F)
{
    ZKC_FOR(k, (size_t)N * F) {
        size_t n = k / F, i = k % F;
        float g = zkc_get(gu + n * 2 * F + i), u = zkc_get(gu + n * 2 * F + F + i);
        zkc_put(out + k, (g * sg_sigmoid(g)) * u);
    }
}

/* dgate = dout * up * silu'(gate), silu'(x) = s (1 + x (1 - s));
 * dup = dout * silu(gate); dout of gu's type (bf16: the down GEMM's bf16
 * input gradient, widened exactly) */
template <typename G>
__global__ static void k_swiglu_bwd(G *dgu, const G *dout, const G *gu, int N, int F)
{
    ZKC_FOR(k, (size_t)N * F) {
        size_t n = k / F, i = k % F;
        float x = zkc_get(gu + n * 2 * F + i), u = zkc_get(gu + n * 2 * F + F + i);
        float d = zkc_get(dout + k), s = sg_sigmoid(x);
        zkc_put(dgu + n * 2 * F + i, (d * u) * (s * (1.0f + x * (1.0f - s))));
        zkc_put(dgu + n * 2 * F + F + i, d * (x * s));
    }
}

template <typename G>
static int fwd(cudaStream_t s, G *out, const G *gu, int N, int F)
{
    size_t n = (size_t)N * F;
    if (n == 0) return 0;
    k_swiglu_fwd<G><<<zkc_grid(n, 256), 256, 0, s>>>(out, gu, N, F);
    return ZKC_LAUNCHED();
}

template <typename G>
static int bwd(cudaStream_t s, G *dgu, const G *dout, const G *gu, int N, int F)
{
    size_t n = (size_t)N * F;
    if (n == 0) return 0;
    k_swiglu_bwd<G><<<zkc_grid(n, 256), 256, 0, s>>>(dgu, dout, gu, N, F);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_swiglu_forward(cudaStream_t s, float *out, const float *gu, int N, int F)
{
    return fwd(s, out, gu, N, F);
}

extern "C" int zkc_swiglu_backward(cudaStream_t s, float *dgu, const float *dout, const float *gu,
                                   int N, int F)
{
    return bwd(s, dgu, dout, gu, N, F);
}

extern "C" int zkc_swiglu_forward_bb(cudaStream_t s, uint16_t *out, const uint16_t *gu, int N,
                                     int F)
{
    return fwd(s, out, gu, N, F);
}

extern "C" int zkc_swiglu_backward_bb(cudaStream_t s, uint16_t *dgu, const uint16_t *dout,
                                      const uint16_t *gu, int N, int F)
{
    return bwd(s, dgu, dout, gu, N, F);
}
