/*
 * layernorm.c -- LayerNorm over the last dim, PyTorch semantics
 * (eps = 1e-5, biased variance).
 *
 * Row sums use LN_LANES independent float accumulators combined in a fixed
 * order: the compiler can vectorize them (it may not reorder a single float
 * accumulator), and the order depends on C only, never on threads.
 */
#include <math.h>
#include "kernels.h"

#define LN_EPS 1e-5f
#define LN_LANES 16
/* columns per task when summing dweight/dbias down the rows */
#define LN_COL_CHUNK 64

static inline float lanes_total(const float acc[LN_LANES]) {
    float s = 0.0f;
    for (int k = 0; k < LN_LANES; k++) s += acc[k];
    return s;
}

static float row_sum(const float *restrict x, int C) {
    float acc[LN_LANES] = {0};
    int c = 0;
    for (; c + LN_LANES <= C; c += LN_LANES)
        for (int k = 0; k < LN_LANES; k++) acc[k] += x[c + k];
    for (int k = 0; k < LN_LANES && c < C; c++, k++) acc[k] += x[c];
    return lanes_total(acc);
}

static float row_sumsq_dev(const float *restrict x, float m, int C) {
    float acc[LN_LANES] = {0};
    int c = 0;
    for (; c + LN_LANES <= C; c += LN_LANES)
        for (int k = 0; k < LN_LANES; k++) { float d = x[c + k] - m; acc[k] += d * d; }
    for (int k = 0; k < LN_LANES && c < C; c++, k++) { float d = x[c] - m; acc[k] += d * d; }
    return lanes_total(acc);
}

/* out (N,C) = (inp - mean) * rstd * weight + bias; mean, rstd (N) saved. */
void zk_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C) {
    #pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
    for (int n = 0; n < N; n++) {
        const float *restrict x = inp + (size_t)n * C;   // (C)
        float *restrict o = out + (size_t)n * C;         // (C)
        float m = row_sum(x, C) / (float)C;
        float var = row_sumsq_dev(x, m, C) / (float)C;   // biased
        float s = 1.0f / sqrtf(var + LN_EPS);
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

/* dinp (N,C) ACCUMULATED; dweight, dbias (C) WRITTEN (rows in order).
 * dinp NULL: weights only; dweight = dbias = NULL: input gradient only. The
 * two parts share nothing but their inputs, so each output has the same bits
 * in the fused call and in a split one. */
void zk_layernorm_backward(float *dinp, float *dweight, float *dbias,
                           const float *dout, const float *inp,
                           const float *weight, const float *mean,
                           const float *rstd, int N, int C) {
    int par = (long)N * C >= 32768;
    /* dinp: one row per task. With norm = (x - mean) * rstd and
     * g = weight * dout:  dinp += (g - mean(g) - norm * mean(g * norm)) * rstd */
    if (dinp != NULL) {
    #pragma omp parallel for schedule(static) if (par)
    for (int n = 0; n < N; n++) {
        const float *restrict x = inp + (size_t)n * C;
        const float *restrict d = dout + (size_t)n * C;
        float *restrict di = dinp + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        float a1[LN_LANES] = {0}, a2[LN_LANES] = {0};
        int c = 0;
        for (; c + LN_LANES <= C; c += LN_LANES)
            for (int k = 0; k < LN_LANES; k++) {
                float g = weight[c + k] * d[c + k];
                a1[k] += g;
                a2[k] += g * ((x[c + k] - m) * s);
            }
        for (int k = 0; k < LN_LANES && c < C; c++, k++) {
            float g = weight[c] * d[c];
            a1[k] += g;
            a2[k] += g * ((x[c] - m) * s);
        }
        float g_mean = lanes_total(a1) / (float)C;
        float gn_mean = lanes_total(a2) / (float)C;
        for (c = 0; c < C; c++) {
            float norm = (x[c] - m) * s;
            di[c] += (weight[c] * d[c] - g_mean - norm * gn_mean) * s;
        }
    }
    }
    if (dweight == NULL || dbias == NULL) return;
    /* dweight, dbias: column slices, each summing all rows in order in
     * double (N terms; double keeps large N accurate at no real cost). */
    int nchunk = (C + LN_COL_CHUNK - 1) / LN_COL_CHUNK;
    #pragma omp parallel for schedule(static) if (par)
    for (int k = 0; k < nchunk; k++) {
        int c0 = k * LN_COL_CHUNK, w = C - c0 < LN_COL_CHUNK ? C - c0 : LN_COL_CHUNK;
        double dw[LN_COL_CHUNK] = {0}, db[LN_COL_CHUNK] = {0};
        for (int n = 0; n < N; n++) {
            const float *restrict x = inp + (size_t)n * C + c0;
            const float *restrict d = dout + (size_t)n * C + c0;
            float m = mean[n], s = rstd[n];
            for (int j = 0; j < w; j++) {
                dw[j] += (double)(((x[j] - m) * s) * d[j]);
                db[j] += (double)d[j];
            }
        }
        for (int j = 0; j < w; j++) {
            dweight[c0 + j] = (float)dw[j];
            dbias[c0 + j] = (float)db[j];
        }
    }
}
