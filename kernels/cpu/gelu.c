/*
 * gelu.c -- GELU, tanh approximation (PyTorch approximate="tanh"):
 *   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *
 * libm's tanhf is a scalar call that stops the loop from vectorizing and
 * costs more than the rest of the kernel; tanh here is built on a
 * polynomial exp (fastmath.h) that vectorizes. Fixed
 * blocks keep the per-index code independent of the thread count.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "kernels.h"
#include "fastmath.h"

#define GELU_BLOCK 4096
#define GELU_PAR_BLOCKS 4

/* tanh(u) = sign(u) (1 - t) / (1 + t), t = exp(-2|u|) <= 1: no overflow.
 * Absolute error ~1e-7 near 0, which is what GELU's 1 + tanh needs. */
static inline float tanh_fast(float u) {
    float t = exp_nonpos(-2.0f * fabsf(u));
    float a = (1.0f - t) / (1.0f + t);
    return copysignf(a, u);
}

#define GELU_K 0.7978845608028654f   /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* One block of each pass, inlined into a default and an AVX-512 twin:
 * elementwise arithmetic in the same operations (no contraction), so the
 * twins give the same bits and only the vector width differs. */
static inline __attribute__((always_inline)) void
gelu_fwd_block(float *restrict out, const float *restrict inp, size_t lo, size_t hi) {
    #pragma omp simd
    for (size_t i = lo; i < hi; i++) {
        float x = inp[i];
        float inner = GELU_K * (x + GELU_A * (x * x * x));
        out[i] = 0.5f * x * (1.0f + tanh_fast(inner));
    }
}

/* The derivative is written the way PyTorch's GeluBackward (tanh) writes
 * it, sech^2 = 1 - tanh^2. dinp may alias dout (no restrict on them). */
static inline __attribute__((always_inline)) void
gelu_bwd_block(float *dinp, const float *restrict inp, const float *dout, size_t lo, size_t hi) {
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

#define GELU_AVX512 __attribute__((target("avx512f")))
static void fwd8(float *out, const float *inp, size_t lo, size_t hi) { gelu_fwd_block(out, inp, lo, hi); }
GELU_AVX512 static void fwd16(float *out, const float *inp, size_t lo, size_t hi) { gelu_fwd_block(out, inp, lo, hi); }
static void bwd8(float *dinp, const float *inp, const float *dout, size_t lo, size_t hi) {
    gelu_bwd_block(dinp, inp, dout, lo, hi);
}
GELU_AVX512 static void bwd16(float *dinp, const float *inp, const float *dout, size_t lo, size_t hi) {
    gelu_bwd_block(dinp, inp, dout, lo, hi);
}

void zk_gelu_forward(float *out, const float *inp, size_t n) {
    size_t nb = (n + GELU_BLOCK - 1) / GELU_BLOCK;
    void (*f)(float *, const float *, size_t, size_t) = zk_avx512_twin() ? fwd16 : fwd8;
    #pragma omp parallel for schedule(static) if (nb >= GELU_PAR_BLOCKS)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * GELU_BLOCK, hi = lo + GELU_BLOCK < n ? lo + GELU_BLOCK : n;
        f(out, inp, lo, hi);
    }
}

/* bf16 out: each block through a float tile on the stack (16 KiB), then
 * rounded: the fp32 kernel's floats, rounded once. A bf16 inp (inp16, else
 * inp32) widens exactly into a second tile first: the bits of the fp32
 * kernel on the cast input. */
static void fwd_b16(uint16_t *out, const float *inp32, const uint16_t *inp16, size_t n) {
    size_t nb = (n + GELU_BLOCK - 1) / GELU_BLOCK;
    void (*f)(float *, const float *, size_t, size_t) = zk_avx512_twin() ? fwd16 : fwd8;
    #pragma omp parallel for schedule(static) if (nb >= GELU_PAR_BLOCKS)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * GELU_BLOCK, hi = lo + GELU_BLOCK < n ? lo + GELU_BLOCK : n;
        float t[GELU_BLOCK], xt[GELU_BLOCK];
        const float *x = inp32 ? inp32 + lo : xt;
        if (!inp32) zk_cast_bf16_f32(xt, inp16 + lo, hi - lo);
        f(t, x, 0, hi - lo);
        zk_cast_f32_bf16(out + lo, t, hi - lo);
    }
}

static void bwd_b16(uint16_t *dinp, const float *inp32, const uint16_t *inp16, const float *dout,
                    size_t n) {
    size_t nb = (n + GELU_BLOCK - 1) / GELU_BLOCK;
    void (*f)(float *, const float *, const float *, size_t, size_t) = zk_avx512_twin() ? bwd16 : bwd8;
    #pragma omp parallel for schedule(static) if (nb >= GELU_PAR_BLOCKS)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * GELU_BLOCK, hi = lo + GELU_BLOCK < n ? lo + GELU_BLOCK : n;
        float t[GELU_BLOCK], xt[GELU_BLOCK];
        const float *x = inp32 ? inp32 + lo : xt;
        if (!inp32) zk_cast_bf16_f32(xt, inp16 + lo, hi - lo);
        f(t, x, dout + lo, 0, hi - lo);
        zk_cast_f32_bf16(dinp + lo, t, hi - lo);
    }
}

void zk_gelu_forward_b16(uint16_t *out, const float *inp, size_t n) { fwd_b16(out, inp, NULL, n); }
void zk_gelu_forward_bb(uint16_t *out, const uint16_t *inp, size_t n) { fwd_b16(out, NULL, inp, n); }
void zk_gelu_backward_b16(uint16_t *dinp, const float *inp, const float *dout, size_t n) {
    bwd_b16(dinp, inp, NULL, dout, n);
}
void zk_gelu_backward_bb(uint16_t *dinp, const uint16_t *inp, const float *dout, size_t n) {
    bwd_b16(dinp, NULL, inp, dout, n);
}

/* dinp = dout * gelu'(inp), WRITTEN; dinp may alias dout. */
void zk_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    size_t nb = (n + GELU_BLOCK - 1) / GELU_BLOCK;
    void (*f)(float *, const float *, const float *, size_t, size_t) = zk_avx512_twin() ? bwd16 : bwd8;
    #pragma omp parallel for schedule(static) if (nb >= GELU_PAR_BLOCKS)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * GELU_BLOCK, hi = lo + GELU_BLOCK < n ? lo + GELU_BLOCK : n;
        f(dinp, inp, dout, lo, hi);
    }
}
