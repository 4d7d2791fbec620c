/*
 * xent.c -- softmax cross-entropy over the vocabulary, fused with its
 * backward. One row per task; within a row, fixed lanes and a fixed
 * combination order (independent of threads).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "kernels.h"
#include "fastmath.h"

#define XE_LANES 8

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
 * may alias logits (each element is read before it is overwritten).
 * A target outside [0,V) is not read: its loss and dlogits row are 0.
 * Returns how many there were. */
int zk_crossentropy(float *losses, float *dlogits, const float *logits,
                    const int32_t *targets, int N, int V, float dscale) {
    int bad = 0;
    #pragma omp parallel for schedule(static) reduction(+:bad) if ((long)N * V >= 65536)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * V;        // (V)
        int tgt = targets[n];
        if (tgt < 0 || tgt >= V) {
            bad++;
            losses[n] = 0.0f;
            if (dlogits != NULL) memset(dlogits + (size_t)n * V, 0, (size_t)V * sizeof(float));
            continue;
        }
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
    return bad;
}
