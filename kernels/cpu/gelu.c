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

/* bf16 out: the fp32 kernel's expressions on each element, the result
 * rounded once in the same loop (zk_bf16_round, the casts' rounding): the
 * fp32 kernel's floats rounded, bit for bit. A bf16 inp (in16) is widened
 * exactly as it is read: the bits of the fp32 kernel on the cast input.
 * Written as one loop (was: widen into a stack tile, the fp32 kernel, a
 * cast pass: three passes over L1 at AVX2 width). */
static inline __attribute__((always_inline)) float gelu_in(const void *p, size_t i, int in16) {
    return in16 ? zk_bf16_widen(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline __attribute__((always_inline)) void
gelu_fwd_block_b16(uint16_t *out, const void *inp, int in16, size_t lo, size_t hi) {
    #pragma omp simd
    for (size_t i = lo; i < hi; i++) {
        float x = gelu_in(inp, i, in16);
        float inner = GELU_K * (x + GELU_A * (x * x * x));
        out[i] = zk_bf16_round(0.5f * x * (1.0f + tanh_fast(inner)));
    }
}

/* out may be inp itself (the same element read, then written); dinp does
 * not alias dout (kernels.h) */
static inline __attribute__((always_inline)) void
gelu_bwd_block_b16(uint16_t *dinp, const void *inp, int in16,
                   const float *restrict dout, size_t lo, size_t hi) {
    #pragma omp simd
    for (size_t i = lo; i < hi; i++) {
        float x = gelu_in(inp, i, in16);
        float x2 = x * x;
        float inner = GELU_K * (x + GELU_A * (x2 * x));
        float th = tanh_fast(inner);
        float left_d = 0.5f * (1.0f + th);
        float inner_d = GELU_K * (1.0f + 3.0f * GELU_A * x2);
        float right_d = 0.5f * x * (1.0f - th * th) * inner_d;
        dinp[i] = zk_bf16_round(dout[i] * (left_d + right_d));
    }
}

/* the twins, in16 a constant in each call so the load is one kind */
static void fwdb8(uint16_t *out, const void *inp, int in16, size_t lo, size_t hi) {
    if (in16) gelu_fwd_block_b16(out, inp, 1, lo, hi); else gelu_fwd_block_b16(out, inp, 0, lo, hi);
}
GELU_AVX512 static void fwdb16(uint16_t *out, const void *inp, int in16, size_t lo, size_t hi) {
    if (in16) gelu_fwd_block_b16(out, inp, 1, lo, hi); else gelu_fwd_block_b16(out, inp, 0, lo, hi);
}
static void bwdb8(uint16_t *dinp, const void *inp, int in16, const float *dout, size_t lo, size_t hi) {
    if (in16) gelu_bwd_block_b16(dinp, inp, 1, dout, lo, hi);
    else gelu_bwd_block_b16(dinp, inp, 0, dout, lo, hi);
}
GELU_AVX512 static void bwdb16(uint16_t *dinp, const void *inp, int in16, const float *dout, size_t lo,
                               size_t hi) {
    if (in16) gelu_bwd_block_b16(dinp, inp, 1, dout, lo, hi);
    else gelu_bwd_block_b16(dinp, inp, 0, dout, lo, hi);
}

static void fwd_b16(uint16_t *out, const void *inp, int in16, size_t n) {
    size_t nb = (n + GELU_BLOCK - 1) / GELU_BLOCK;
    void (*f)(uint16_t *, const void *, int, size_t, size_t) = zk_avx512_twin() ? fwdb16 : fwdb8;
    #pragma omp parallel for schedule(static) if (nb >= GELU_PAR_BLOCKS)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * GELU_BLOCK, hi = lo + GELU_BLOCK < n ? lo + GELU_BLOCK : n;
        f(out, inp, in16, lo, hi);
    }
}

static void bwd_b16(uint16_t *dinp, const void *inp, int in16, const float *dout, size_t n) {
    size_t nb = (n + GELU_BLOCK - 1) / GELU_BLOCK;
    void (*f)(uint16_t *, const void *, int, const float *, size_t, size_t) =
        zk_avx512_twin() ? bwdb16 : bwdb8;
    #pragma omp parallel for schedule(static) if (nb >= GELU_PAR_BLOCKS)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * GELU_BLOCK, hi = lo + GELU_BLOCK < n ? lo + GELU_BLOCK : n;
        f(dinp, inp, in16, dout, lo, hi);
    }
}

void zk_gelu_forward_b16(uint16_t *out, const float *inp, size_t n) { fwd_b16(out, inp, 0, n); }
void zk_gelu_forward_bb(uint16_t *out, const uint16_t *inp, size_t n) { fwd_b16(out, inp, 1, n); }
void zk_gelu_backward_b16(uint16_t *dinp, const float *inp, const float *dout, size_t n) {
    bwd_b16(dinp, inp, 0, dout, n);
}
void zk_gelu_backward_bb(uint16_t *dinp, const uint16_t *inp, const float *dout, size_t n) {
    bwd_b16(dinp, inp, 1, dout, n);
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
