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
#include <string.h>
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

/* out[c - lo] for c in [lo, hi): one expression, so the fp32 and the
 * bf16 forwards round the same floats */
RMS_NOCONTRACT
static inline void row_out(float *restrict o, const float *restrict x, const float *restrict w,
                           float r, int lo, int hi) {
    for (int c = lo; c < hi; c++) o[c - lo] = w[c] * (x[c] * r);
}

RMS_NOCONTRACT
static float row_rstd(const float *x, int C, float eps) {
    return 1.0f / sqrtf(row_dot(x, x, C) / (float)C + eps);
}

RMS_NOCONTRACT
void zk_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                        float eps, int N, int C) {
    #pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float r = row_rstd(x, C, eps);
        row_out(out + (size_t)n * C, x, weight, r, 0, C);
        rstd[n] = r;
    }
}

/* a row's bf16 out: through a float chunk on the stack, then rounded
 * (the bf16 forwards of an f32 and of a bf16 row share it) */
#define RMS_CHUNK 1024
RMS_NOCONTRACT
static void row_out16(uint16_t *o16, const float *x, const float *w, float r, int C) {
    float o[RMS_CHUNK];
    for (int c0 = 0; c0 < C; c0 += RMS_CHUNK) {
        int c1 = C - c0 < RMS_CHUNK ? C : c0 + RMS_CHUNK;
        row_out(o, x, w, r, c0, c1);
        zk_cast_f32_bf16(o16 + c0, o, (size_t)(c1 - c0));
    }
}
RMS_NOCONTRACT
void zk_rmsnorm_forward_b16(uint16_t *out, float *rstd, const float *inp, const float *weight,
                            float eps, int N, int C) {
    #pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float r = row_rstd(x, C, eps);
        row_out16(out + (size_t)n * C, x, weight, r, C);
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

/* dweight: column slices down the rows in order, in double; r16: inp and
 * dout bf16, widened (the same floats) */
RMS_NOCONTRACT
static void rms_weight_grad(float *dweight, const void *dout, const void *inp, int r16,
                            const float *rstd, int N, int C) {
    int chunks = (C + RMS_COL_CHUNK - 1) / RMS_COL_CHUNK;
    #pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
    for (int k = 0; k < chunks; k++) {
        int c0 = k * RMS_COL_CHUNK, nc = C - c0 < RMS_COL_CHUNK ? C - c0 : RMS_COL_CHUNK;
        double dw[RMS_COL_CHUNK] = {0};
        float xw[RMS_COL_CHUNK], dw16[RMS_COL_CHUNK];
        for (int n = 0; n < N; n++) {
            const float *x = (const float *)inp + (size_t)n * C + c0;
            const float *d = (const float *)dout + (size_t)n * C + c0;
            if (r16) {
                zk_cast_bf16_f32(xw, (const uint16_t *)inp + (size_t)n * C + c0, (size_t)nc);
                zk_cast_bf16_f32(dw16, (const uint16_t *)dout + (size_t)n * C + c0, (size_t)nc);
                x = xw;
                d = dw16;
            }
            float r = rstd[n];
            for (int j = 0; j < nc; j++) dw[j] += (double)((x[j] * r) * d[j]);
        }
        for (int j = 0; j < nc; j++) dweight[c0 + j] = (float)dw[j];
    }
}

void zk_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, const float *rstd, int N, int C) {
    zk_rmsnorm_backward_b16(dinp, NULL, dweight, dout, inp, weight, rstd, N, C);
}

RMS_NOCONTRACT
void zk_rmsnorm_backward_b16(float *dinp, uint16_t *dinp16, float *dweight, const float *dout,
                             const float *inp, const float *weight, const float *rstd, int N,
                             int C) {
    if (dinp) {
        #pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
        for (int n = 0; n < N; n++) {
            dinp_row(dinp + (size_t)n * C, dout + (size_t)n * C, inp + (size_t)n * C, weight,
                     rstd[n], C);
            if (dinp16) zk_cast_f32_bf16(dinp16 + (size_t)n * C, dinp + (size_t)n * C, (size_t)C);
        }
    }
    if (dweight) rms_weight_grad(dweight, dout, inp, 0, rstd, N, C);
}

/* ---- the bf16 residual stream (kernels.h, "_r16"): a bf16 row widened on
 * the stack (exact), the f32 row functions on it, a gradient rounded back
 * once */
RMS_NOCONTRACT
void zk_rmsnorm_forward_r16(uint16_t *out, float *rstd, const uint16_t *inp,
                            const float *weight, float eps, int N, int C) {
    #pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
    for (int n = 0; n < N; n++) {
        float x[C];
        zk_cast_bf16_f32(x, inp + (size_t)n * C, (size_t)C);
        float r = row_rstd(x, C, eps);
        row_out16(out + (size_t)n * C, x, weight, r, C);
        rstd[n] = r;
    }
}

RMS_NOCONTRACT
void zk_rmsnorm_backward_r16(uint16_t *dinp, float *dweight, const uint16_t *dout,
                             const uint16_t *inp, const float *weight, const float *rstd,
                             int N, int C) {
    if (dinp) {
        #pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
        for (int n = 0; n < N; n++) {
            float x[C], di[C], d[C];
            zk_cast_bf16_f32(x, inp + (size_t)n * C, (size_t)C);
            zk_cast_bf16_f32(di, dinp + (size_t)n * C, (size_t)C);
            zk_cast_bf16_f32(d, dout + (size_t)n * C, (size_t)C);
            dinp_row(di, d, x, weight, rstd[n], C);
            zk_cast_f32_bf16(dinp + (size_t)n * C, di, (size_t)C);
        }
    }
    if (dweight) rms_weight_grad(dweight, dout, inp, 1, rstd, N, C);
}
