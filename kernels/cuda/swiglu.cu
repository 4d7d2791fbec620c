/* swiglu.cu -- the gated MLP's activation (kernels.cuh; the formulas of
 * kernels/cpu/swiglu.c): out = silu(gate) * up on rows [gate (F) | up
 * (F)], a thread an element. sigmoid from expf of -|x| (the CPU: its own
 * polynomial exp; within ~2 float ulps of each other). */
#include "common.cuh"

__device__ __forceinline__ float sg_sigmoid(float x)
{
    float e = expf(-fabsf(x));
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

__global__ static void k_swiglu_fwd(float *out, const float *gu, int N, int F)
{
    ZKC_FOR(k, (size_t)N * F) {
        size_t n = k / F, i = k % F;
        float g = gu[n * 2 * F + i], u = gu[n * 2 * F + F + i];
        out[k] = (g * sg_sigmoid(g)) * u;
    }
}

/* dgate = dout * up * silu'(gate), silu'(x) = s (1 + x (1 - s));
 * dup = dout * silu(gate) */
__global__ static void k_swiglu_bwd(float *dgu, const float *dout, const float *gu, int N, int F)
{
    ZKC_FOR(k, (size_t)N * F) {
        size_t n = k / F, i = k % F;
        float x = gu[n * 2 * F + i], u = gu[n * 2 * F + F + i], d = dout[k], s = sg_sigmoid(x);
        dgu[n * 2 * F + i] = (d * u) * (s * (1.0f + x * (1.0f - s)));
        dgu[n * 2 * F + F + i] = d * (x * s);
    }
}

extern "C" int zkc_swiglu_forward(cudaStream_t s, float *out, const float *gu, int N, int F)
{
    size_t n = (size_t)N * F;
    if (n == 0) return 0;
    k_swiglu_fwd<<<zkc_grid(n, 256), 256, 0, s>>>(out, gu, N, F);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_swiglu_backward(cudaStream_t s, float *dgu, const float *dout, const float *gu,
                                   int N, int F)
{
    size_t n = (size_t)N * F;
    if (n == 0) return 0;
    k_swiglu_bwd<<<zkc_grid(n, 256), 256, 0, s>>>(dgu, dout, gu, N, F);
    return ZKC_LAUNCHED();
}
