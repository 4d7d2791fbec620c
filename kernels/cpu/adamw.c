/*
 * adamw.c -- AdamW with decoupled weight decay, torch.optim.AdamW's formula.
 *
 * Scalar factors (decay, 1-beta, bias corrections, step size) are computed
 * in double from the float arguments and rounded to float once, as PyTorch
 * does with its Python-float hyperparameters; the per-element math is float.
 * Per-element and free of fused multiply-adds, so any partition gives the
 * same bits and a plain loop of the same expressions reproduces them.
 *
 * Speed. The update is memory-bound: 28 bytes per element (read param,
 * grad, m, v; write param, m, v). The body is written in AVX2 intrinsics,
 * one IEEE operation per step of the formula (mul, add, sqrt, div each
 * correctly rounded, the same as the scalar loop), so its speed does not
 * depend on the build flags: the plain loop only vectorizes under
 * -fno-math-errno (sqrtf keeps an errno branch otherwise) and was 2.5x
 * slower without it. Measured on this 2-core Xeon (make bench, 64M
 * elements): ~26 GB/s on 1 thread, ~49 GB/s on 2, at or above memcpy.
 * AVX-512 (same per-element cost of sqrt and div) and non-temporal stores
 * (the written lines were just read, so nothing is saved; 15% slower) gave
 * nothing, so neither is here.
 *
 * No fused multiply-add may appear: GCC contracts a*b+c into an FMA, even
 * between intrinsics, under -ffp-contract=fast (its default outside strict
 * -std=c11). The block functions switch contraction off for themselves, so
 * the bits do not depend on -std either (clang: an explicit
 * -ffp-contract=fast overrides the pragma; do not build with it).
 * spec/c/test_elementwise.c checks every path against a reference that
 * rounds each operation separately.
 */
#include <math.h>
#include "kernels.h"
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ADAM_X86 1
#endif

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#define ADAM_NOCONTRACT
#else
#define ADAM_NOCONTRACT __attribute__((optimize("fp-contract=off")))
#endif

/* Blocks of this many elements are handed to threads whole (a static
 * split: contiguous ranges), so the code that computes element i does not
 * depend on the thread count. */
#define ADAM_BLOCK 4096
/* below this many blocks a parallel region costs more than it saves */
#define ADAM_PAR_BLOCKS 8

typedef struct { float decay, b1, b2, omb1, omb2, step, bc2_sqrt, eps, gscale; } adam_coef;

/* The formula, one element at a time (a function so restrict applies): the
 * reference the vector body matches, its tail, and the whole update on a
 * CPU without AVX2. */
ADAM_NOCONTRACT
static void adamw_block_scalar(float *restrict param, const float *restrict grad,
                               float *restrict m, float *restrict v, size_t n,
                               const adam_coef *c) {
    const adam_coef k = *c;
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * k.gscale;
        float p = param[i] * k.decay;
        float mi = k.b1 * m[i] + k.omb1 * g;
        float vi = k.b2 * v[i] + k.omb2 * (g * g);
        float denom = sqrtf(vi) / k.bc2_sqrt + k.eps;
        m[i] = mi;
        v[i] = vi;
        param[i] = p - k.step * (mi / denom);
    }
}

#ifdef ADAM_X86
/* The same expressions, 8 lanes at a time, in the scalar loop's order. */
__attribute__((target("avx2"))) ADAM_NOCONTRACT
static void adamw_block_avx2(float *restrict param, const float *restrict grad,
                             float *restrict m, float *restrict v, size_t n,
                             const adam_coef *c) {
    const __m256 gscale = _mm256_set1_ps(c->gscale), decay = _mm256_set1_ps(c->decay);
    const __m256 b1 = _mm256_set1_ps(c->b1), omb1 = _mm256_set1_ps(c->omb1);
    const __m256 b2 = _mm256_set1_ps(c->b2), omb2 = _mm256_set1_ps(c->omb2);
    const __m256 bc2 = _mm256_set1_ps(c->bc2_sqrt), eps = _mm256_set1_ps(c->eps);
    const __m256 step = _mm256_set1_ps(c->step);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + i), gscale);
        __m256 p = _mm256_mul_ps(_mm256_loadu_ps(param + i), decay);
        __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)),
                                  _mm256_mul_ps(omb1, g));
        __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)),
                                  _mm256_mul_ps(omb2, _mm256_mul_ps(g, g)));
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2), eps);
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        _mm256_storeu_ps(param + i, _mm256_sub_ps(p, _mm256_mul_ps(step, _mm256_div_ps(mi, denom))));
    }
    adamw_block_scalar(param + i, grad + i, m + i, v + i, n - i, c);
}
#endif

typedef void (*adam_block_fn)(float *restrict, const float *restrict, float *restrict,
                              float *restrict, size_t, const adam_coef *);

static adam_block_fn adamw_pick(void) {
#if defined(ADAM_X86) && defined(__AVX2__)
    return adamw_block_avx2;            /* the build requires AVX2 anyway */
#elif defined(ADAM_X86)
    return __builtin_cpu_supports("avx2") ? adamw_block_avx2 : adamw_block_scalar;
#else
    return adamw_block_scalar;
#endif
}

/* lp (if not NULL): each block's updated param rounded into it while the
 * block is in cache (lp_f16: IEEE half, else bf16). g16 (if not NULL, then
 * grad is NULL): a 2-byte gradient (g_f16: IEEE half, else bf16), each
 * block widened exactly into the thread's stack before the f32 block: the
 * bits of an f32 copy of it */
static void adamw_run(float *param, const float *grad, const uint16_t *g16, int g_f16,
                      float *m, float *v, uint16_t *lp,
                      int lp_f16, size_t n, float lr, float beta1, float beta2, float eps,
                      float wd, float grad_scale, int t) {
    adam_coef c;
    c.decay = (float)(1.0 - (double)lr * (double)wd);
    c.b1 = beta1;
    c.b2 = beta2;
    c.omb1 = (float)(1.0 - (double)beta1);
    c.omb2 = (float)(1.0 - (double)beta2);
    c.step = (float)((double)lr / (1.0 - pow((double)beta1, t)));
    c.bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, t));
    c.eps = eps;
    c.gscale = grad_scale;
    adam_block_fn block = adamw_pick();
    size_t nb = (n + ADAM_BLOCK - 1) / ADAM_BLOCK;
    /* a team of the calling thread's OpenMP size (see kernels.h) */
    #pragma omp parallel for schedule(static) if (nb >= ADAM_PAR_BLOCKS)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * ADAM_BLOCK, hi = lo + ADAM_BLOCK < n ? lo + ADAM_BLOCK : n;
        float gw[g16 ? ADAM_BLOCK : 1];
        if (g16 && g_f16) zk_cast_f16_f32(gw, g16 + lo, hi - lo);
        else if (g16) zk_cast_bf16_f32(gw, g16 + lo, hi - lo);
        block(param + lo, g16 ? gw : grad + lo, m + lo, v + lo, hi - lo, &c);
        if (lp && lp_f16) zk_cast_f32_f16(lp + lo, param + lo, hi - lo);
        else if (lp) zk_cast_f32_bf16(lp + lo, param + lo, hi - lo);
    }
}

void zk_adamw(float *param, const float *grad, float *m, float *v, size_t n,
              float lr, float beta1, float beta2, float eps, float wd,
              float grad_scale, int t) {
    adamw_run(param, grad, NULL, 0, m, v, NULL, 0, n, lr, beta1, beta2, eps, wd, grad_scale, t);
}

void zk_adamw_lp(float *param, const float *grad, float *m, float *v, uint16_t *lp, int lp_f16,
                 size_t n, float lr, float beta1, float beta2, float eps, float wd,
                 float grad_scale, int t) {
    adamw_run(param, grad, NULL, 0, m, v, lp, lp_f16, n, lr, beta1, beta2, eps, wd, grad_scale, t);
}

void zk_adamw_g16(float *param, const uint16_t *grad, int g_f16, float *m, float *v,
                  uint16_t *lp, int lp_f16, size_t n, float lr, float beta1, float beta2,
                  float eps, float wd, float grad_scale, int t) {
    adamw_run(param, NULL, grad, g_f16, m, v, lp, lp_f16, n, lr, beta1, beta2, eps, wd,
              grad_scale, t);
}
