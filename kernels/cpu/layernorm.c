/*
 * layernorm.c -- LayerNorm over the last dim, PyTorch semantics
 * (eps = 1e-5, biased variance).
 *
 * Row sums use LN_LANES independent float accumulators combined in a fixed
 * order: the compiler can vectorize them (it may not reorder a single float
 * accumulator), and the order depends on C only, never on threads.
 */
#include <math.h>
#include <string.h>
#include "kernels.h"
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LN_X86 1
#endif

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#define LN_NOCONTRACT
#else
#define LN_NOCONTRACT __attribute__((optimize("fp-contract=off")))
#endif

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

/* The first pass of a row's input gradient: a1[k] += g and a2[k] += g *
 * ((x - m) * s), g = weight * dout, for element c going to lane c %
 * LN_LANES in order; returns the lane totals in *g_sum, *gn_sum. */
LN_NOCONTRACT
static void dinp_sums_plain(float *g_sum, float *gn_sum, const float *restrict w,
                            const float *restrict d, const float *restrict x, float m, float s,
                            int C) {
    float a1[LN_LANES] = {0}, a2[LN_LANES] = {0};
    int c = 0;
    for (; c + LN_LANES <= C; c += LN_LANES)
        for (int k = 0; k < LN_LANES; k++) {
            float g = w[c + k] * d[c + k];
            a1[k] += g;
            a2[k] += g * ((x[c + k] - m) * s);
        }
    for (int k = 0; k < LN_LANES && c < C; c++, k++) {
        float g = w[c] * d[c];
        a1[k] += g;
        a2[k] += g * ((x[c] - m) * s);
    }
    *g_sum = lanes_total(a1);
    *gn_sum = lanes_total(a2);
}

#ifdef LN_X86
/* The same operations with lanes 0-7 and 8-15 in two ymm each: GCC's own
 * vectorization of the lane loop above shuffled and spilled (2-3x slower).
 * No FMA, same order: the same bits (spec/c/test_layers.c compares). */
_Static_assert(LN_LANES == 16, "two ymm registers of lanes");
__attribute__((target("avx2"))) LN_NOCONTRACT
static void dinp_sums_avx2(float *g_sum, float *gn_sum, const float *restrict w,
                           const float *restrict d, const float *restrict x, float m, float s,
                           int C) {
    __m256 a1l = _mm256_setzero_ps(), a1h = a1l, a2l = a1l, a2h = a1l;
    const __m256 vm = _mm256_set1_ps(m), vs = _mm256_set1_ps(s);
    int c = 0;
    for (; c + LN_LANES <= C; c += LN_LANES) {
        __m256 gl = _mm256_mul_ps(_mm256_loadu_ps(w + c), _mm256_loadu_ps(d + c));
        __m256 gh = _mm256_mul_ps(_mm256_loadu_ps(w + c + 8), _mm256_loadu_ps(d + c + 8));
        __m256 nl = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), vm), vs);
        __m256 nh = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c + 8), vm), vs);
        a1l = _mm256_add_ps(a1l, gl);
        a1h = _mm256_add_ps(a1h, gh);
        a2l = _mm256_add_ps(a2l, _mm256_mul_ps(gl, nl));
        a2h = _mm256_add_ps(a2h, _mm256_mul_ps(gh, nh));
    }
    float a1[LN_LANES], a2[LN_LANES];
    _mm256_storeu_ps(a1, a1l);
    _mm256_storeu_ps(a1 + 8, a1h);
    _mm256_storeu_ps(a2, a2l);
    _mm256_storeu_ps(a2 + 8, a2h);
    for (int k = 0; k < LN_LANES && c < C; c++, k++) {
        float g = w[c] * d[c];
        a1[k] += g;
        a2[k] += g * ((x[c] - m) * s);
    }
    *g_sum = lanes_total(a1);
    *gn_sum = lanes_total(a2);
}
#endif

typedef void (*dinp_sums_fn)(float *, float *, const float *restrict, const float *restrict,
                             const float *restrict, float, float, int);

static dinp_sums_fn dinp_sums_pick(void) {
#ifdef LN_X86
    if (!zk_scalar_forced() && __builtin_cpu_supports("avx2")) return dinp_sums_avx2;
#endif
    return dinp_sums_plain;
}

/* A row's statistics: mean and rstd (biased variance) */
static inline void row_stats(const float *restrict x, int C, float *m, float *s) {
    *m = row_sum(x, C) / (float)C;
    float var = row_sumsq_dev(x, *m, C) / (float)C;   // biased
    *s = 1.0f / sqrtf(var + LN_EPS);
}

/* out[c] for c in [lo, hi): one expression, so the fp32 and the bf16
 * forwards round the same floats */
static inline void row_out(float *restrict o, const float *restrict x, float m, float s,
                           const float *restrict weight, const float *restrict bias,
                           int lo, int hi) {
    for (int c = lo; c < hi; c++) o[c - lo] = (x[c] - m) * s * weight[c] + bias[c];
}

/* out (N,C) = (inp - mean) * rstd * weight + bias; mean, rstd (N) saved. */
void zk_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C) {
    #pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
    for (int n = 0; n < N; n++) {
        const float *restrict x = inp + (size_t)n * C;   // (C)
        float m, s;
        row_stats(x, C, &m, &s);
        row_out(out + (size_t)n * C, x, m, s, weight, bias, 0, C);
        mean[n] = m;
        rstd[n] = s;
    }
}

/* a row's bf16 out: through a float chunk on the stack, then rounded */
#define LN_CHUNK 1024
static void row_out16(uint16_t *o16, const float *restrict x, float m, float s,
                      const float *restrict weight, const float *restrict bias, int C) {
    float o[LN_CHUNK];
    for (int c0 = 0; c0 < C; c0 += LN_CHUNK) {
        int c1 = C - c0 < LN_CHUNK ? C : c0 + LN_CHUNK;
        row_out(o, x, m, s, weight, bias, c0, c1);
        zk_cast_f32_bf16(o16 + c0, o, (size_t)(c1 - c0));
    }
}

void zk_layernorm_forward_b16(uint16_t *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int N, int C) {
    #pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
    for (int n = 0; n < N; n++) {
        const float *restrict x = inp + (size_t)n * C;   // (C)
        float m, s;
        row_stats(x, C, &m, &s);
        row_out16(out + (size_t)n * C, x, m, s, weight, bias, C);
        mean[n] = m;
        rstd[n] = s;
    }
}

/* The residual add fused with the next layer norm: resid (N,C) = a + b
 * (one fp32 add each, zk_add3's), then out = layernorm(resid) from the
 * stored resid, fp32 (out) or bf16 (out16; exactly one of them given): the
 * bits of zk_add3 then zk_layernorm_forward(_b16), one pass over the row
 * while it is in cache. */
void zk_layernorm_residual_forward(float *resid, float *out, uint16_t *out16, float *mean,
                                   float *rstd, const float *a, const float *b,
                                   const float *weight, const float *bias, int N, int C) {
    #pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
    for (int n = 0; n < N; n++) {
        const float *restrict an = a + (size_t)n * C, *restrict bn = b + (size_t)n * C;
        float *restrict x = resid + (size_t)n * C;       // (C)
        for (int c = 0; c < C; c++) x[c] = an[c] + bn[c];
        float m, s;
        row_stats(x, C, &m, &s);
        if (out != NULL) row_out(out + (size_t)n * C, x, m, s, weight, bias, 0, C);
        else row_out16(out16 + (size_t)n * C, x, m, s, weight, bias, C);
        mean[n] = m;
        rstd[n] = s;
    }
}

/* ---- the bf16 residual stream (kernels.h, "_r16") ----------------------
 * A bf16 row is widened into a float row on the stack (exact), and the f32
 * kernel's row functions run on it: their bits on the widened values. */
static inline float widen16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void zk_layernorm_forward_r16(uint16_t *out, float *mean, float *rstd, const uint16_t *inp,
                              const float *weight, const float *bias, int N, int C) {
    #pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
    for (int n = 0; n < N; n++) {
        float x[C];                                       // (C) the widened row
        zk_cast_bf16_f32(x, inp + (size_t)n * C, (size_t)C);
        float m, s;
        row_stats(x, C, &m, &s);
        row_out16(out + (size_t)n * C, x, m, s, weight, bias, C);
        mean[n] = m;
        rstd[n] = s;
    }
}

void zk_layernorm_residual_forward_r16(uint16_t *resid, uint16_t *out, float *mean,
                                       float *rstd, const uint16_t *a, const uint16_t *b,
                                       const float *weight, const float *bias, int N, int C) {
    #pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
    for (int n = 0; n < N; n++) {
        uint16_t *r = resid + (size_t)n * C;
        zk_add3_b16(r, a + (size_t)n * C, b + (size_t)n * C, (size_t)C);
        float x[C];                                       // the stored resid, widened
        zk_cast_bf16_f32(x, r, (size_t)C);
        float m, s;
        row_stats(x, C, &m, &s);
        row_out16(out + (size_t)n * C, x, m, s, weight, bias, C);
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
    zk_layernorm_backward_b16(dinp, NULL, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

/* The input gradient of row n: di (C) += the term (below), x the row */
static inline void dinp_row(float *restrict di, const float *restrict d,
                            const float *restrict x, const float *restrict weight, float m,
                            float s, int C, dinp_sums_fn sums) {
    float g_sum, gn_sum;
    sums(&g_sum, &gn_sum, weight, d, x, m, s, C);
    float g_mean = g_sum / (float)C;
    float gn_mean = gn_sum / (float)C;
    for (int c = 0; c < C; c++) {
        float norm = (x[c] - m) * s;
        di[c] += (weight[c] * d[c] - g_mean - norm * gn_mean) * s;
    }
}

/* dweight, dbias: column slices, each summing all rows in order in double
 * (N terms; double keeps large N accurate at no real cost). r16: inp and
 * dout bf16, each element widened (the same floats). */
static void ln_weight_grads(float *dweight, float *dbias, const void *dout, const void *inp,
                            int r16, const float *mean, const float *rstd, int N, int C,
                            int par) {
    int nchunk = (C + LN_COL_CHUNK - 1) / LN_COL_CHUNK;
    #pragma omp parallel for schedule(static) if (par)
    for (int k = 0; k < nchunk; k++) {
        int c0 = k * LN_COL_CHUNK, w = C - c0 < LN_COL_CHUNK ? C - c0 : LN_COL_CHUNK;
        double dw[LN_COL_CHUNK] = {0}, db[LN_COL_CHUNK] = {0};
        float xw[LN_COL_CHUNK], dw16[LN_COL_CHUNK];
        for (int n = 0; n < N; n++) {
            const float *restrict x = (const float *)inp + (size_t)n * C + c0;
            const float *restrict d = (const float *)dout + (size_t)n * C + c0;
            if (r16) {
                zk_cast_bf16_f32(xw, (const uint16_t *)inp + (size_t)n * C + c0, (size_t)w);
                zk_cast_bf16_f32(dw16, (const uint16_t *)dout + (size_t)n * C + c0, (size_t)w);
                x = xw;
                d = dw16;
            }
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

void zk_layernorm_backward_b16(float *dinp, uint16_t *dinp16, float *dweight, float *dbias,
                               const float *dout, const float *inp,
                               const float *weight, const float *mean,
                               const float *rstd, int N, int C) {
    int par = (long)N * C >= 32768;
    /* dinp: one row per task. With norm = (x - mean) * rstd and
     * g = weight * dout:  dinp += (g - mean(g) - norm * mean(g * norm)) * rstd */
    if (dinp != NULL) {
        dinp_sums_fn sums = dinp_sums_pick();
        #pragma omp parallel for schedule(static) if (par)
        for (int n = 0; n < N; n++) {
            float *restrict di = dinp + (size_t)n * C;
            dinp_row(di, dout + (size_t)n * C, inp + (size_t)n * C, weight, mean[n], rstd[n],
                     C, sums);
            if (dinp16) zk_cast_f32_bf16(dinp16 + (size_t)n * C, di, (size_t)C);
        }
    }
    if (dweight == NULL || dbias == NULL) return;
    ln_weight_grads(dweight, dbias, dout, inp, 0, mean, rstd, N, C, par);
}

/* The bf16 stream's: the row and its gradient widened on the stack, the
 * f32 row function, the gradient rounded back once */
void zk_layernorm_backward_r16(uint16_t *dinp, float *dweight, float *dbias,
                               const uint16_t *dout, const uint16_t *inp,
                               const float *weight, const float *mean,
                               const float *rstd, int N, int C) {
    int par = (long)N * C >= 32768;
    if (dinp != NULL) {
        dinp_sums_fn sums = dinp_sums_pick();
        #pragma omp parallel for schedule(static) if (par)
        for (int n = 0; n < N; n++) {
            float x[C], di[C], d[C];                     // (C) each, widened
            zk_cast_bf16_f32(x, inp + (size_t)n * C, (size_t)C);
            zk_cast_bf16_f32(di, dinp + (size_t)n * C, (size_t)C);
            zk_cast_bf16_f32(d, dout + (size_t)n * C, (size_t)C);
            dinp_row(di, d, x, weight, mean[n], rstd[n], C, sums);
            zk_cast_f32_bf16(dinp + (size_t)n * C, di, (size_t)C);
        }
    }
    if (dweight == NULL || dbias == NULL) return;
    ln_weight_grads(dweight, dbias, dout, inp, 1, mean, rstd, N, C, par);
}
