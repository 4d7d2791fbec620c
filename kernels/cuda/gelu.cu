/* gelu.cu -- GELU, tanh approximation (kernels.cuh; formulas of kernels/cpu/gelu.c) */
#include "common.cuh"

#define GELU_K 0.7978845608028654f     /* sqrt(2/pi) */
#define GELU_A 0.044715f

__global__ static void k_gelu_fwd(float *out, const float *inp, size_t n)
{
    ZKC_FOR(i, n) {
        float x = inp[i];
        float inner = GELU_K * (x + GELU_A * (x * x * x));
        out[i] = 0.5f * x * (1.0f + tanhf(inner));
    }
}

/* dinp may alias dout: each element reads both before it writes */
__global__ static void k_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    ZKC_FOR(i, n) {
        float x = inp[i], x2 = x * x;
        float th = tanhf(GELU_K * (x + GELU_A * (x2 * x)));
        float left_d = 0.5f * (1.0f + th);
        float inner_d = GELU_K * (1.0f + 3.0f * GELU_A * x2);
        float right_d = 0.5f * x * (1.0f - th * th) * inner_d;
        dinp[i] = dout[i] * (left_d + right_d);
    }
}

extern "C" int zkc_gelu_forward(cudaStream_t s, float *out, const float *inp, size_t n)
{
    if (n == 0) return 0;
    k_gelu_fwd<<<zkc_grid(n, 256), 256, 0, s>>>(out, inp, n);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_gelu_backward(cudaStream_t s, float *dinp, const float *inp,
                                 const float *dout, size_t n)
{
    if (n == 0) return 0;
    k_gelu_bwd<<<zkc_grid(n, 256), 256, 0, s>>>(dinp, inp, dout, n);
    return ZKC_LAUNCHED();
}
