/* rope.cu -- rotary position embeddings in transformers' rotate_half
 * layout (kernels.cuh; the formulas and table of kernels/cpu/rope.c, the
 * table made on the host by zk_rope_table and copied up). A thread a pair
 * (row, head, i < hs/2): elements i and i + hs/2 turned in place. Each
 * product and sum rounded on its own (__fmul_rn, __fadd_rn: nvcc would
 * fuse a * c - b * s into an FMA), so the CPU's bits. X is float, or
 * uint16_t for bf16 rows (widened exactly, the result rounded once). */
#include "common.cuh"

/* dir 1: the forward's turn; -1: the backward's (sin negated) */
template <typename X>
__global__ static void k_rope(X *x, int N, int T, int ld, int nh, int hs,
                              const float *cos_t, const float *sin_t, int pos0, float dir)
{
    int h2 = hs / 2;
    ZKC_FOR(k, (size_t)N * nh * h2) {
        int i = (int)(k % h2), h = (int)(k / h2 % nh);
        size_t r = k / h2 / nh, p = (size_t)(pos0 + (int)(r % T)) * h2 + i;
        float c = cos_t[p], s = dir * sin_t[p];
        X *a = x + r * ld + (size_t)h * hs;
        float x1 = zkc_get(a + i), x2 = zkc_get(a + i + h2);
        zkc_put(a + i, __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
        zkc_put(a + i + h2, __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
    }
}

template <typename X>
static int rope(cudaStream_t s, X *x, int N, int T, int ld, int nh, int hs,
                const float *cos_t, const float *sin_t, int pos0, float dir)
{
    size_t n = (size_t)N * nh * (hs / 2);
    if (n == 0) return 0;
    k_rope<X><<<zkc_grid(n, 256), 256, 0, s>>>(x, N, T, ld, nh, hs, cos_t, sin_t, pos0, dir);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_rope_forward(cudaStream_t s, float *x, int N, int T, int ld, int nh, int hs,
                                const float *cos_t, const float *sin_t, int pos0)
{
    return rope(s, x, N, T, ld, nh, hs, cos_t, sin_t, pos0, 1.0f);
}

extern "C" int zkc_rope_backward(cudaStream_t s, float *dx, int N, int T, int ld, int nh, int hs,
                                 const float *cos_t, const float *sin_t, int pos0)
{
    return rope(s, dx, N, T, ld, nh, hs, cos_t, sin_t, pos0, -1.0f);
}

extern "C" int zkc_rope_forward_b16(cudaStream_t s, uint16_t *x, int N, int T, int ld, int nh,
                                    int hs, const float *cos_t, const float *sin_t, int pos0)
{
    return rope(s, x, N, T, ld, nh, hs, cos_t, sin_t, pos0, 1.0f);
}

extern "C" int zkc_rope_backward_b16(cudaStream_t s, uint16_t *dx, int N, int T, int ld, int nh,
                                     int hs, const float *cos_t, const float *sin_t, int pos0)
{
    return rope(s, dx, N, T, ld, nh, hs, cos_t, sin_t, pos0, -1.0f);
}
