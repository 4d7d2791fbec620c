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

/* acc[k] += (double)e[i + k] for the chunk's whole lanes, i from 0 by
 * XE_LANES below c: each lane's adds in index order, as the plain loop
 * does them (GCC leaves that loop scalar: one convert and one add an
 * element; two ymm of lanes take four a vector). Returns where the whole
 * lanes end. */
#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2")))
static int lanes_add_avx2(double *restrict acc, const float *restrict e, int c) {
    __m256d lo = _mm256_loadu_pd(acc), hi = _mm256_loadu_pd(acc + 4);
    int i = 0;
    for (; i + XE_LANES <= c; i += XE_LANES) {
        __m256 v = _mm256_loadu_ps(e + i);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    }
    _mm256_storeu_pd(acc, lo);
    _mm256_storeu_pd(acc + 4, hi);
    return i;
}
#endif
static int lanes_add(double *restrict acc, const float *restrict e, int c) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) return lanes_add_avx2(acc, e, c);
#endif
    int i = 0;
    for (; i + XE_LANES <= c; i += XE_LANES)
        for (int k = 0; k < XE_LANES; k++) acc[k] += (double)e[i + k];
    return i;
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
        i += lanes_add(acc, e + c0, c1 - c0);
        for (int k = 0; i < c1; i++, k++) acc[k] += (double)e[i];
    }
    double s = 0.0;
    for (int k = 0; k < XE_LANES; k++) s += acc[k];
    return s;
}

/* losses (N) WRITTEN = logsumexp(logits[n]) - logits[n, target];
 * dlogits (N,V) WRITTEN (if not NULL) = (softmax - onehot) * dscale, and
 * may alias logits (each element is read before it is overwritten).
 * Rows are ld apart (ld >= V: GPT-2's 50257 logits in rows of 50304);
 * dlogits' columns [V, ld) are WRITTEN as 0, never read.
 * A target outside [0,V) is not read: its loss and dlogits row are 0.
 * Returns how many there were. */
int zk_crossentropy(float *losses, float *dlogits, const float *logits,
                    const int32_t *targets, int N, int V, int ld, float dscale) {
    int bad = 0;
    const int plain = zk_scalar_forced();   /* the two-exp path, for tests and benches */
    #pragma omp parallel for schedule(static) reduction(+:bad) if ((long)N * V >= 65536)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * ld;       // (V)
        float *d = dlogits == NULL ? NULL : dlogits + (size_t)n * ld;   // (V), may be x
        if (d != NULL && ld > V) memset(d + V, 0, (size_t)(ld - V) * sizeof(float));
        int tgt = targets[n];
        if (tgt < 0 || tgt >= V) {
            bad++;
            losses[n] = 0.0f;
            if (d != NULL) memset(d, 0, (size_t)V * sizeof(float));
            continue;
        }
        float xt = x[tgt];
        float mx = row_max(x, V);
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

/* The bf16 twin: each row read as fp32 (exact), the fp32 kernel's
 * arithmetic on it (max, the double lanes of exp, the same quotients), and
 * dlogits rounded once to bf16 (nearest even): dlogits and losses have the
 * bits zk_crossentropy gives on the widened row, dlogits then cast. The row
 * goes through a float chunk on the stack (XE_CHUNK, a multiple of the
 * lanes: each lane sums the same elements in the same order), three times:
 * the max, the sum (row_sumexp_store's chunk loop), dlogits. Each exp is
 * computed twice (there is no fp32 row to keep them in), by the same
 * vectorised loop, so the same floats. */
static void widen(float *restrict f, const uint16_t *restrict b, int n) {
    #pragma omp simd
    for (int i = 0; i < n; i++) { uint32_t u = (uint32_t)b[i] << 16; memcpy(f + i, &u, 4); }
}

/* exp(f - mx) in place over a chunk */
static void exp_chunk(float *restrict f, float mx, int c) {
    #pragma omp simd
    for (int i = 0; i < c; i++) f[i] = exp_nonpos(f[i] - mx);
}

int zk_crossentropy_bf16(float *losses, uint16_t *dlogits, const uint16_t *logits,
                         const int32_t *targets, int N, int V, int ld, float dscale) {
    int bad = 0;
    #pragma omp parallel for schedule(static) reduction(+:bad) if ((long)N * V >= 65536)
    for (int n = 0; n < N; n++) {
        float f[XE_CHUNK];
        const uint16_t *x = logits + (size_t)n * ld;          // (V)
        uint16_t *d = dlogits == NULL ? NULL : dlogits + (size_t)n * ld;   // may be x
        if (d != NULL && ld > V) memset(d + V, 0, (size_t)(ld - V) * sizeof(uint16_t));
        int tgt = targets[n];
        if (tgt < 0 || tgt >= V) {
            bad++;
            losses[n] = 0.0f;
            if (d != NULL) memset(d, 0, (size_t)V * sizeof(uint16_t));
            continue;
        }
        float xt;
        widen(&xt, x + tgt, 1);
        float lanes[XE_LANES];
        for (int k = 0; k < XE_LANES; k++) lanes[k] = -INFINITY;
        for (int c0 = 0; c0 < V; c0 += XE_CHUNK) {
            int c = V - c0 < XE_CHUNK ? V - c0 : XE_CHUNK, i = 0;
            widen(f, x + c0, c);
            for (; i + XE_LANES <= c; i += XE_LANES) max_lanes(lanes, f + i);
            for (int k = 0; i < c; i++, k++) lanes[k] = f[i] > lanes[k] ? f[i] : lanes[k];
        }
        float mx = lanes[0];
        for (int k = 1; k < XE_LANES; k++) mx = lanes[k] > mx ? lanes[k] : mx;
        double acc[XE_LANES] = {0};
        for (int c0 = 0; c0 < V; c0 += XE_CHUNK) {
            int c = V - c0 < XE_CHUNK ? V - c0 : XE_CHUNK, i = 0;
            widen(f, x + c0, c);
            exp_chunk(f, mx, c);
            i = lanes_add(acc, f, c);
            for (int k = 0; i < c; i++, k++) acc[k] += (double)f[i];
        }
        double sum = 0.0;
        for (int k = 0; k < XE_LANES; k++) sum += acc[k];
        losses[n] = (float)((double)mx + log(sum) - (double)xt);
        if (d == NULL) continue;
        float fsum = (float)sum;
        for (int c0 = 0; c0 < V; c0 += XE_CHUNK) {
            int c = V - c0 < XE_CHUNK ? V - c0 : XE_CHUNK;
            widen(f, x + c0, c);
            exp_chunk(f, mx, c);
            #pragma omp simd
            for (int i = 0; i < c; i++) f[i] = f[i] / fsum * dscale;
            zk_cast_f32_bf16(d + c0, f, (size_t)c);
        }
        float ft = (exp_nonpos(xt - mx) / fsum - 1.0f) * dscale;
        zk_cast_f32_bf16(d + tgt, &ft, 1);
    }
    return bad;
}
