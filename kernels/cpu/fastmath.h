/*
 * fastmath.h -- private to kernels/cpu: a branch-free exp for x <= 0, and
 * which vector path the kernels with an AVX-512 twin take.
 *
 * libm's expf is a scalar call that keeps loops from vectorizing; attention,
 * GELU and cross-entropy all need exp of non-positive arguments (scores minus
 * their max, -2|u|), so they share this one.
 */
#ifndef ZT_KERNELS_FASTMATH_H
#define ZT_KERNELS_FASTMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "kernels.h"

/* The AVX-512 twins (attention's products, GELU) run where the CPU has
 * avx512f, unless a test forces the plain AVX2 path (zk_force_scalar). */
static inline int zk_avx512_twin(void) {
    return !zk_scalar_forced() && __builtin_cpu_supports("avx512f");
}

/* exp(x) for x <= 0 (Cephes expf polynomial, <= 1.3 ulp on every float in
 * [-87, 0], checked exhaustively); 0 below -87, NaN
 * stays NaN. Branch-free so loops calling it vectorize. */
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

#endif
