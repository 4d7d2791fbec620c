/*
 * xent.c -- softmax cross-entropy over the vocabulary, fused with its
 * backward. One row per task; within a row, fixed lanes and a fixed
 * combination order (independent of threads).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "kernels.h"

#define XE_LANES 8

/* exp(x) for x <= 0 (Cephes expf polynomial, <= 1.3 ulp on every float in
 * [-87, 0], checked exhaustively); 0 below -87, NaN
 * stays NaN. Branch-free so loops calling it vectorize. The same function
 * is in attention.c and gelu.c: keep the copies identical. */
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

/* acc = max(acc, x) lane by lane. Written as an elementwise op on memory
 * (not a reduction), which the compiler vectorizes without -ffast-math. */
static inline void max_lanes(float *restrict acc, const float *restrict x) {
    for (int k = 0; k < XE_LANES; k++) acc[k] = x[k] > acc[k] ? x[k] : acc[k];
}

static float row_max(const float *restrict x, int V) {
    float acc[XE_LANES];
    for (int k = 0; k < XE_LANES; k++) acc[k] = -INFINITY;
    int i = 0;
    for (; i + XE_LANES <= V; i += XE_LANES) max_lanes(acc, x + i);
    for (int k = 0; k < XE_LANES && i < V; i++, k++) acc[k] = x[i] > acc[k] ? x[i] : acc[k];
    float m = acc[0];
    for (int k = 1; k < XE_LANES; k++) m = acc[k] > m ? acc[k] : m;
    return m;
}

/* sum of exp(x - mx) in double lanes (V terms: float would lose ~1e-4) */
static double row_sumexp(const float *restrict x, float mx, int V) {
    double acc[XE_LANES] = {0};
    int i = 0;
    for (; i + XE_LANES <= V; i += XE_LANES)
        for (int k = 0; k < XE_LANES; k++) acc[k] += (double)exp_nonpos(x[i + k] - mx);
    for (int k = 0; k < XE_LANES && i < V; i++, k++) acc[k] += (double)exp_nonpos(x[i] - mx);
    double s = 0.0;
    for (int k = 0; k < XE_LANES; k++) s += acc[k];
    return s;
}

/* losses (N) WRITTEN = logsumexp(logits[n]) - logits[n, target];
 * dlogits (N,V) WRITTEN (if not NULL) = (softmax - onehot) * dscale, and
 * may alias logits (each element is read before it is overwritten). */
void zk_crossentropy(float *losses, float *dlogits, const float *logits,
                     const int32_t *targets, int N, int V, float dscale) {
    #pragma omp parallel for schedule(static) if ((long)N * V >= 65536)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * V;        // (V)
        int tgt = targets[n];
        float xt = x[tgt];
        float mx = row_max(x, V);
        double sum = row_sumexp(x, mx, V);
        losses[n] = (float)((double)mx + log(sum) - (double)xt);
        if (dlogits == NULL) continue;
        float *d = dlogits + (size_t)n * V;             // (V), may be x
        float fsum = (float)sum;
        #pragma omp simd
        for (int i = 0; i < V; i++) d[i] = exp_nonpos(x[i] - mx) / fsum * dscale;
        d[tgt] = (exp_nonpos(xt - mx) / fsum - 1.0f) * dscale;
    }
}
