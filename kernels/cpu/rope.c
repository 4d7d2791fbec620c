/*
 * rope.c -- rotary position embeddings in Hugging Face's rotate_half
 * layout (Llama, Qwen 2.5, Mistral): in a head of hs values, element i and
 * element i + hs/2 (i < hs/2) turn by the angle pos * inv_freq[i]:
 *   out[i]        = x[i] cos - x[i + hs/2] sin
 *   out[i + hs/2] = x[i + hs/2] cos + x[i] sin
 * The backward turns the gradient back (the transpose of the rotation).
 *
 * The table rounds where transformers rounds: inv_freq step by step in
 * float (below), the angle as the float product inv_freq * pos (its rotary
 * embedding is a float32 matmul of the two), then cos and sin of that float
 * angle (here in double, rounded once). At pos 8192 an angle's float ulp is
 * ~1e-3 rad: rounding the angle elsewhere would be visible at fp32 noise.
 */
#include <math.h>
#include "kernels.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#define ROPE_NOCONTRACT
#else
#define ROPE_NOCONTRACT __attribute__((optimize("fp-contract=off")))
#endif

/* inv_freq[i] for i < hs/2 as transformers computes it, each step a float
 * op in its order (checked against the inv_freq its rotary embedding held
 * for the spec/fixtures/llama models: all 24 equal; rounding once from
 * double left 8 of 24 a float ulp off, ~1e-4 rad at position 8192):
 * 1 / theta^(float(2i) / hs), then for Llama 3 (modeling_rope_utils'
 * _compute_llama3_parameters; a scalar over a tensor is the tensor's
 * reciprocal times the scalar, as torch computes it):
 *   wavelen = 2 pi / f; f / factor where wavelen > old / low; between the
 *   bounds (1 - s) f' / factor + s f', s = (old / wavelen - low) / (high - low) */
ROPE_NOCONTRACT
static float inv_freq(int i, int hs, double theta, const zk_rope_scaling *sc) {
    float e = (float)(2 * i) / (float)hs;
    float f = 1.0f / powf((float)theta, e);
    if (!sc || sc->factor <= 0.0) return f;
    float factor = (float)sc->factor, lo = (float)sc->low_freq_factor, hi = (float)sc->high_freq_factor;
    float old = (float)sc->original_max_positions;
    double low_wl = sc->original_max_positions / sc->low_freq_factor;   /* Python floats */
    double high_wl = sc->original_max_positions / sc->high_freq_factor;
    float wl = (1.0f / f) * (float)(2.0 * 3.14159265358979323846);
    float g = (double)wl > low_wl ? f / factor : f;
    if (!((double)wl < high_wl) && !((double)wl > low_wl)) {
        float s = ((1.0f / wl) * old - lo) / (hi - lo);
        g = (1.0f - s) * g / factor + s * g;
    }
    return g;
}

void zk_rope_table(float *cos_t, float *sin_t, int P, int hs, double theta,
                   const zk_rope_scaling *sc) {
    int h2 = hs / 2;
    for (int i = 0; i < h2; i++) {
        float f = inv_freq(i, hs, theta, sc);
        for (int p = 0; p < P; p++) {
            float a = f * (float)p;                 /* one float rounding, as the matmul */
            cos_t[(size_t)p * h2 + i] = (float)cos((double)a);
            sin_t[(size_t)p * h2 + i] = (float)sin((double)a);
        }
    }
}

/* the pairs (a[i], b[i]), i < n, turned by cs, sn (dir +1 the forward's
 * turn, -1 the backward's: sin negated) */
ROPE_NOCONTRACT
static inline void turn_pairs(float *restrict a, float *restrict b, const float *cs,
                              const float *sn, int n, float dir) {
    for (int i = 0; i < n; i++) {
        float s = dir * sn[i], x1 = a[i], x2 = b[i];
        a[i] = x1 * cs[i] - x2 * s;
        b[i] = x2 * cs[i] + x1 * s;
    }
}

ROPE_NOCONTRACT
static void turn(float *x, int N, int T, int ld, int nh, int hs, const float *cos_t,
                 const float *sin_t, int pos0, float dir) {
    int h2 = hs / 2;
    #pragma omp parallel for schedule(static) if ((long)N * nh * hs >= 65536)
    for (int r = 0; r < N; r++) {
        size_t p = (size_t)(pos0 + r % T) * h2;
        for (int h = 0; h < nh; h++) {
            float *a = x + (size_t)r * ld + (size_t)h * hs;
            turn_pairs(a, a + h2, cos_t + p, sin_t + p, h2, dir);
        }
    }
}

/* bf16 rows: each head's halves widened into float tiles of ROPE_TILE
 * pairs, turned as above, rounded back once */
#define ROPE_TILE 256
ROPE_NOCONTRACT
static void turn16(uint16_t *x, int N, int T, int ld, int nh, int hs, const float *cos_t,
                   const float *sin_t, int pos0, float dir) {
    int h2 = hs / 2;
    #pragma omp parallel for schedule(static) if ((long)N * nh * hs >= 65536)
    for (int r = 0; r < N; r++) {
        size_t p = (size_t)(pos0 + r % T) * h2;
        float ta[ROPE_TILE], tb[ROPE_TILE];
        for (int h = 0; h < nh; h++) {
            uint16_t *a = x + (size_t)r * ld + (size_t)h * hs, *b = a + h2;
            for (int i0 = 0; i0 < h2; i0 += ROPE_TILE) {
                int n = h2 - i0 < ROPE_TILE ? h2 - i0 : ROPE_TILE;
                zk_cast_bf16_f32(ta, a + i0, (size_t)n);
                zk_cast_bf16_f32(tb, b + i0, (size_t)n);
                turn_pairs(ta, tb, cos_t + p + i0, sin_t + p + i0, n, dir);
                zk_cast_f32_bf16(a + i0, ta, (size_t)n);
                zk_cast_f32_bf16(b + i0, tb, (size_t)n);
            }
        }
    }
}

void zk_rope_forward_b16(uint16_t *x, int N, int T, int ld, int nh, int hs, const float *cos_t,
                         const float *sin_t, int pos0) {
    turn16(x, N, T, ld, nh, hs, cos_t, sin_t, pos0, 1.0f);
}

void zk_rope_backward_b16(uint16_t *dx, int N, int T, int ld, int nh, int hs,
                          const float *cos_t, const float *sin_t, int pos0) {
    turn16(dx, N, T, ld, nh, hs, cos_t, sin_t, pos0, -1.0f);
}

void zk_rope_forward(float *x, int N, int T, int ld, int nh, int hs, const float *cos_t,
                     const float *sin_t, int pos0) {
    turn(x, N, T, ld, nh, hs, cos_t, sin_t, pos0, 1.0f);
}

void zk_rope_backward(float *dx, int N, int T, int ld, int nh, int hs, const float *cos_t,
                      const float *sin_t, int pos0) {
    turn(dx, N, T, ld, nh, hs, cos_t, sin_t, pos0, -1.0f);
}
