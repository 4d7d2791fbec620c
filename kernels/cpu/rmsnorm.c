/*
 * rmsnorm.c -- RMSNorm over the last dim (Llama, Qwen 2.5, Mistral):
 * out = weight * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps), in that
 * order (Hugging Face's LlamaRMSNorm: the normalised row, then the weight).
 *
 * Row sums use RMS_LANES float accumulators combined in a fixed order (the
 * compiler vectorizes them; the order depends on C only, never on
 * threads), as layernorm.c. dweight sums down the rows in row order in
 * double, a task per chunk of columns.
 */
#include <math.h>
#include "kernels.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#define RMS_NOCONTRACT
#else
#define RMS_NOCONTRACT __attribute__((optimize("fp-contract=off")))
#endif

#define RMS_LANES 16
#define RMS_COL_CHUNK 64    /* columns per task when summing dweight down the rows */

static inline float lanes_total(const float acc[RMS_LANES]) {
    float s = 0.0f;
    for (int k = 0; k < RMS_LANES; k++) s += acc[k];
    return s;
}

/* sum of x * y over the row, element c in lane c % RMS_LANES */
RMS_NOCONTRACT
static float row_dot(const float *restrict x, const float *restrict y, int C) {
    float acc[RMS_LANES] = {0};
    int c = 0;
    for (; c + RMS_LANES <= C; c += RMS_LANES)
        for (int k = 0; k < RMS_LANES; k++) acc[k] += x[c + k] * y[c + k];
    for (int k = 0; k < RMS_LANES && c < C; c++, k++) acc[k] += x[c] * y[c];
    return lanes_total(acc);
}

RMS_NOCONTRACT
void zk_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                        float eps, int N, int C) {
    #pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        float r = 1.0f / sqrtf(row_dot(x, x, C) / (float)C + eps);
        for (int c = 0; c < C; c++) o[c] = weight[c] * (x[c] * r);
        rstd[n] = r;
    }
}

/* g = weight * dout, norm = x * rstd:
 * dinp += rstd * (g - norm * mean(g * norm)) */
RMS_NOCONTRACT
static void dinp_row(float *restrict di, const float *restrict d, const float *restrict x,
                     const float *restrict w, float r, int C) {
    float acc[RMS_LANES] = {0};
    int c = 0;
    for (; c + RMS_LANES <= C; c += RMS_LANES)
        for (int k = 0; k < RMS_LANES; k++)
            acc[k] += (w[c + k] * d[c + k]) * (x[c + k] * r);
    for (int k = 0; k < RMS_LANES && c < C; c++, k++) acc[k] += (w[c] * d[c]) * (x[c] * r);
    float gn_mean = lanes_total(acc) / (float)C;
    for (c = 0; c < C; c++) di[c] += r * (w[c] * d[c] - (x[c] * r) * gn_mean);
}

RMS_NOCONTRACT
void zk_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, const float *rstd, int N, int C) {
    if (dinp) {
        #pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
        for (int n = 0; n < N; n++)
            dinp_row(dinp + (size_t)n * C, dout + (size_t)n * C, inp + (size_t)n * C, weight,
                     rstd[n], C);
    }
    if (!dweight) return;
    int chunks = (C + RMS_COL_CHUNK - 1) / RMS_COL_CHUNK;
    #pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
    for (int k = 0; k < chunks; k++) {
        int c0 = k * RMS_COL_CHUNK, nc = C - c0 < RMS_COL_CHUNK ? C - c0 : RMS_COL_CHUNK;
        double dw[RMS_COL_CHUNK] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C + c0, *d = dout + (size_t)n * C + c0;
            float r = rstd[n];
            for (int j = 0; j < nc; j++) dw[j] += (double)((x[j] * r) * d[j]);
        }
        for (int j = 0; j < nc; j++) dweight[c0 + j] = (float)dw[j];
    }
}
