/*
 * xent.c -- softmax cross-entropy over the vocabulary, fused with its
 * backward. One row per task; within a row, fixed lanes and a fixed
 * combination order (independent of threads).
 *
 * With dlogits, each exp(x - max) is computed once and kept in dlogits
 * between the sum and the scaling (the row, 200 KB at GPT-2's vocabulary,
 * stays in L2); the plain path (zk_force_scalar) computes it twice, as this
 * file once did, and spec/c/test_layers.c checks both give the same bits.
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

/* row_sumexp, also storing each exp(x - mx) to e, which may be x itself.
 * In chunks that stay in L1: the exps (a per-index loop, so e == x is safe),
 * then the chunk's floats into the lanes in index order, as row_sumexp adds
 * them (XE_CHUNK is a multiple of XE_LANES, so lane k still gets the
 * elements i with i % XE_LANES == k). */
#define XE_CHUNK 512
static double row_sumexp_store(float *e, const float *x, float mx, int V) {
    double acc[XE_LANES] = {0};
    for (int c0 = 0; c0 < V; c0 += XE_CHUNK) {
        int c1 = V - c0 < XE_CHUNK ? V : c0 + XE_CHUNK, i = c0;
        #pragma omp simd
        for (int j = c0; j < c1; j++) e[j] = exp_nonpos(x[j] - mx);
        for (; i + XE_LANES <= c1; i += XE_LANES)
            for (int k = 0; k < XE_LANES; k++) acc[k] += (double)e[i + k];
        for (int k = 0; i < c1; i++, k++) acc[k] += (double)e[i];
    }
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
    const int plain = zk_scalar_forced();   /* the two-exp path, for tests and benches */
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
        float *d = dlogits == NULL ? NULL : dlogits + (size_t)n * V;   // (V), may be x
        if (d != NULL && !plain) {
            /* each exp once: kept in d between the sum and the scaling (the
             * same floats the plain path computes twice, so the same bits) */
            double sum = row_sumexp_store(d, x, mx, V);
            losses[n] = (float)((double)mx + log(sum) - (double)xt);
            float fsum = (float)sum, et = d[tgt];
            #pragma omp simd
            for (int i = 0; i < V; i++) d[i] = d[i] / fsum * dscale;
            d[tgt] = (et / fsum - 1.0f) * dscale;
            continue;
        }
        double sum = row_sumexp(x, mx, V);
        losses[n] = (float)((double)mx + log(sum) - (double)xt);
        if (d == NULL) continue;
        float fsum = (float)sum;
        #pragma omp simd
        for (int i = 0; i < V; i++) d[i] = exp_nonpos(x[i] - mx) / fsum * dscale;
        d[tgt] = (exp_nonpos(xt - mx) / fsum - 1.0f) * dscale;
    }
    return bad;
}
