/*
 * rope.c -- rotary position embeddings in Hugging Face's rotate_half
 * layout (Llama, Qwen 2.5, Mistral): in a head of hs values, element i and
 * element i + hs/2 (i < hs/2) turn by the angle pos * inv_freq[i]:
 *   out[i]        = x[i] cos - x[i + hs/2] sin
 *   out[i + hs/2] = x[i + hs/2] cos + x[i] sin
 * The backward turns the gradient back (the transpose of the rotation).
 *
 * The table rounds where transformers rounds: inv_freq to float, the angle
 * as the float product inv_freq * pos (its rotary embedding is a float32
 * matmul of the two), then cos and sin of that float angle (here in
 * double, rounded once). At pos 8192 an angle's float ulp is ~1e-3 rad:
 * rounding the angle elsewhere would be visible at fp32 noise. Llama 3's
 * frequency scaling as transformers' _compute_llama3_parameters.
 */
#include <math.h>
#include "kernels.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#define ROPE_NOCONTRACT
#else
#define ROPE_NOCONTRACT __attribute__((optimize("fp-contract=off")))
#endif

/* inv_freq[i] for i < hs/2, float as transformers keeps it */
static float inv_freq(int i, int hs, double theta, const zk_rope_scaling *sc) {
    float f = (float)(1.0 / pow(theta, (double)(float)(2.0 * i) / hs));
    if (!sc || sc->factor <= 0.0) return f;
    const double pi = 3.14159265358979323846;
    double old = sc->original_max_positions;
    double low_wl = old / sc->low_freq_factor, high_wl = old / sc->high_freq_factor;
    double wl = 2.0 * pi / f;
    double g = wl > low_wl ? f / sc->factor : f;
    if (!(wl < high_wl) && !(wl > low_wl)) {
        double s = (old / wl - sc->low_freq_factor) / (sc->high_freq_factor - sc->low_freq_factor);
        g = (1.0 - s) * g / sc->factor + s * g;
    }
    return (float)g;
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

/* dir +1 the forward's turn, -1 the backward's (sin negated) */
ROPE_NOCONTRACT
static void turn(float *x, int N, int T, int ld, int nh, int hs, const float *cos_t,
                 const float *sin_t, int pos0, float dir) {
    int h2 = hs / 2;
    #pragma omp parallel for schedule(static) if ((long)N * nh * hs >= 65536)
    for (int r = 0; r < N; r++) {
        size_t p = (size_t)(pos0 + r % T) * h2;
        const float *cs = cos_t + p, *sn = sin_t + p;
        for (int h = 0; h < nh; h++) {
            float *a = x + (size_t)r * ld + (size_t)h * hs, *b = a + h2;
            for (int i = 0; i < h2; i++) {
                float s = dir * sn[i], x1 = a[i], x2 = b[i];
                a[i] = x1 * cs[i] - x2 * s;
                b[i] = x2 * cs[i] + x1 * s;
            }
        }
    }
}

void zk_rope_forward(float *x, int N, int T, int ld, int nh, int hs, const float *cos_t,
                     const float *sin_t, int pos0) {
    turn(x, N, T, ld, nh, hs, cos_t, sin_t, pos0, 1.0f);
}

void zk_rope_backward(float *dx, int N, int T, int ld, int nh, int hs, const float *cos_t,
                      const float *sin_t, int pos0) {
    turn(dx, N, T, ld, nh, hs, cos_t, sin_t, pos0, -1.0f);
}
