/*
 * gelu.c -- GELU, tanh approximation (PyTorch approximate="tanh"):
 *   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *
 * libm's tanhf is a scalar call that stops the loop from vectorizing and
 * costs more than the rest of the kernel; tanh here is built on a
 * polynomial exp (as in attention.c and xent.c) that vectorizes. Fixed
 * blocks keep the per-index code independent of the thread count.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "kernels.h"

#define GELU_BLOCK 4096
#define GELU_PAR_BLOCKS 4

/* exp(x) for x <= 0 (Cephes expf polynomial, <= 1.3 ulp on every float in
 * [-87, 0], checked exhaustively); 0 below -87, NaN
 * stays NaN. Branch-free so loops calling it vectorize. The same function
 * is in attention.c and xent.c: keep the copies identical. */
static inline float exp_nonpos(float x) {
    float xc = x < -87.0f ? -87.0f : x;          /* NaN passes through */
    /* n = round(x / ln2) by the 1.5*2^23 trick: t holds n in its low bits */
    float t = fmaf(xc, 1.44269504088896341f, 12582912.0f);
    float n = t - 12582912.0f;
    float r = fmaf(n, -0.693359375f, xc);       /* ln2 split hi/lo: n*hi exact */
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r + 1.0f);
    uint32_t tb;
    memcpy(&tb, &t, 4);
    uint32_t eb = (tb + 127u) << 23;            /* 2^n, n in [-126, 1] */
    float s;
    memcpy(&s, &eb, 4);
    float y = p * s;
    /* flush to 0 below -87 with an integer mask: a ?: on the float result
     * would be turned into a branch (trapping math) and block vectorizing */
    uint32_t yb;
    memcpy(&yb, &y, 4);
    yb &= -(uint32_t)!(x < -87.0f);
    memcpy(&y, &yb, 4);
    return y;
}

/* tanh(u) = sign(u) (1 - t) / (1 + t), t = exp(-2|u|) <= 1: no overflow.
 * Absolute error ~1e-7 near 0, which is what GELU's 1 + tanh needs. */
static inline float tanh_fast(float u) {
    float t = exp_nonpos(-2.0f * fabsf(u));
    float a = (1.0f - t) / (1.0f + t);
    return copysignf(a, u);
}

#define GELU_K 0.7978845608028654f   /* sqrt(2/pi) */
#define GELU_A 0.044715f

void zk_gelu_forward(float *out, const float *inp, size_t n) {
    size_t nb = (n + GELU_BLOCK - 1) / GELU_BLOCK;
    #pragma omp parallel for schedule(static) if (nb >= GELU_PAR_BLOCKS)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * GELU_BLOCK, hi = lo + GELU_BLOCK < n ? lo + GELU_BLOCK : n;
        #pragma omp simd
        for (size_t i = lo; i < hi; i++) {
            float x = inp[i];
            float inner = GELU_K * (x + GELU_A * (x * x * x));
            out[i] = 0.5f * x * (1.0f + tanh_fast(inner));
        }
    }
}

/* dinp = dout * gelu'(inp), WRITTEN; dinp may alias dout. The derivative is
 * written the way PyTorch's GeluBackward (tanh) writes it, sech^2 = 1 - tanh^2. */
void zk_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    size_t nb = (n + GELU_BLOCK - 1) / GELU_BLOCK;
    #pragma omp parallel for schedule(static) if (nb >= GELU_PAR_BLOCKS)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * GELU_BLOCK, hi = lo + GELU_BLOCK < n ? lo + GELU_BLOCK : n;
        #pragma omp simd
        for (size_t i = lo; i < hi; i++) {
            float x = inp[i];
            float x2 = x * x;
            float inner = GELU_K * (x + GELU_A * (x2 * x));
            float th = tanh_fast(inner);
            float left_d = 0.5f * (1.0f + th);
            float inner_d = GELU_K * (1.0f + 3.0f * GELU_A * x2);
            float right_d = 0.5f * x * (1.0f - th * th) * inner_d;
            dinp[i] = dout[i] * (left_d + right_d);
        }
    }
}
