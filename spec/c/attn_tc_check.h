/*
 * attn_tc_check.h -- how the bf16 tensor-core attention (kernels/cuda/
 * attention_tc_*.cu) is judged against the fp32 CPU twin (zk_attention_*):
 * shared by spec/c/test_cuda.c (the GPU kernels) and spec/c/
 * test_attention_tiles.c (their algorithm mirrored on the CPU), so both
 * apply the same tolerances. Include after ctest.h.
 *
 * The inputs (qkv, dout) are made bf16 values first (tc_round_bf16), so
 * the kernel's own rounding of q, k, v, dout is exact and both sides see
 * the same numbers. What is left to differ, with u = 2^-9 (bf16's unit
 * roundoff, RNE):
 *  - p rounded to bf16 before P V (forward) and P^T dO (dV), dS before
 *    dS^T Q (dK) and dS K (dQ): relative error <= u per term;
 *  - fp32 sums in another order (tensor cores; possibly not round to
 *    nearest): an hs-term score s within hs * 2^-23 * sum_d |q_d k_d| * scale
 *    (twice the gamma_hs bound; for |q|, |k| <= 2 that is 4 hs^1.5 2^-23:
 *    2.4e-4 = 0.125 u at hs = 64, 6.9e-4 = 0.35 u at hs = 128), so
 *    p = exp(s - lse) moves by |ds| + |dlse| <= 0.3 u (0.7 u at 128)
 *    relative; the sums over T <= 257 keys add < 0.01 u; the kernel's
 *    p = 2^(fma(s, scale log2 e, -m scale log2 e)) (the scale folded,
 *    ex2.approx) moves p by < 0.01 u more.
 * From a double reference (tc_mags), per element, A = the sum of the
 * absolute values of the terms (head size 64; at 128 read 0.7 for 0.3):
 *  out[i,d]: A = sum_j p_ij |v_jd|;        err <= u A + 0.3 u A
 *  D_i (GPU's out vs the CPU's): err <= sum_d |dO_id| err(out_id)
 *            <= 1.3 u Dm_i,                Dm_i = sum_d |dO_id| A_out[i,d]
 *  dS_ij:    Sm_ij = p_ij (sum_d |dO_id v_jd| + Dm_i) scale;
 *            err <= u Sm (rounding) + p scale err(D) + 0.3 u Sm <= 2.6 u Sm
 *  dv[j,d]:  A = sum_i p_ij |dO_id|;       err <= 1.3 u A
 *  dk[j,d]:  A = sum_i Sm_ij |q_id|;       err <= 2.6 u A (dq: sum_j Sm_ij |k_jd|)
 * Pass: |got - want| <= TC_ATOL + TC_RHO A with TC_RHO = 4u: 1.5x the worst
 * case above at head size 64, 1.2x at 128 (3.4 u); errors of random sign
 * sit far below it (test_attention_tiles prints the worst share: ~0.4).
 * lse: l sums the unrounded p, so only fp32 differs: |err| <= 64 2^-23 Lm_i
 * (Lm_i = scale max_j sum_d |q_id k_jd|, the score bound) + 2^-22 (T + |lse|)
 * (a sum of T terms, expf, logf), as an absolute tolerance per row.
 *
 * Can it fail? A dropped causal mask changes row 0 (one key) by O(|v|); a
 * dropped scale multiplies scores by 8; a dropped rescale (T > 64) mixes
 * tiles' p of different maxima: each moves outputs by a fraction of A far
 * above 4u. test_attention_tiles.c runs such broken variants of the
 * algorithm and requires them to FAIL these checks.
 */
#ifndef ZT_ATTN_TC_CHECK_H
#define ZT_ATTN_TC_CHECK_H

#define TC_U (1.0 / 512)            /* bf16 unit roundoff, 2^-9 */
#define TC_RHO (4 * TC_U)
#define TC_ATOL 1e-6

/* RNE to bf16 and back, for finite x (the bits of __float2bfloat16_rn) */
static inline float tc_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}
static inline void tc_round_bf16(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = tc_bf16(x[i]);
}

/* Tolerance magnitudes (above) of a causal attention's outputs, in double,
 * with NKV kv heads (qkv rows (NH + 2 NKV) hs: q | k | v, query head h
 * reading kv head h / (NH/NKV); a kv head's dk, dv magnitudes summed over
 * its query heads) and a sliding window W (0: none; query i sees keys
 * (i - W, i]): mout (B,T,C), mlse (B,NH,T) (already an absolute
 * tolerance), mdqkv like qkv. */
static inline void tc_mags_gqa(double *mout, double *mlse, double *mdqkv, const float *qkv,
                               const float *dout, int B, int T, int C, int NH, int NKV, int W)
{
    const int hs = C / NH, G = NH / NKV;
    const size_t st = (size_t)C + 2 * (size_t)NKV * hs, vo = (size_t)NKV * hs;
    const double scale = 1.0 / sqrt((double)hs);
    double *p = malloc((size_t)T * sizeof(double));
    memset(mdqkv, 0, (size_t)B * T * st * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const size_t ko = C + (size_t)(h / G) * hs;
                const int j0 = W > 0 && i - W + 1 > 0 ? i - W + 1 : 0;
                const float *q = qkv + ((size_t)b * T + i) * st + (size_t)h * hs;
                const float *g = dout + ((size_t)b * T + i) * C + (size_t)h * hs;
                double m = -INFINITY, lm = 0, sum = 0, Dm = 0;
                for (int j = j0; j <= i; j++) {
                    const float *k = qkv + ((size_t)b * T + j) * st + ko;
                    double s = 0, a = 0;
                    for (int d = 0; d < hs; d++) { s += (double)q[d] * k[d]; a += fabs((double)q[d] * k[d]); }
                    p[j] = s * scale;
                    if (p[j] > m) m = p[j];
                    if (a * scale > lm) lm = a * scale;
                }
                for (int j = j0; j <= i; j++) sum += exp(p[j] - m);
                for (int j = j0; j <= i; j++) p[j] = exp(p[j] - m) / sum;
                double L = m + log(sum);
                mlse[((size_t)b * NH + h) * T + i] = hs * 0x1p-23 * lm + 0x1p-22 * (T + fabs(L));
                double *mo = mout + ((size_t)b * T + i) * C + (size_t)h * hs;
                for (int d = 0; d < hs; d++) {
                    double a = 0;
                    for (int j = j0; j <= i; j++)
                        a += p[j] * fabs((double)qkv[((size_t)b * T + j) * st + ko + vo + d]);
                    mo[d] = a;
                    Dm += fabs((double)g[d]) * a;
                }
                double *mq = mdqkv + ((size_t)b * T + i) * st + (size_t)h * hs;
                for (int j = j0; j <= i; j++) {
                    const float *k = qkv + ((size_t)b * T + j) * st + ko;
                    const float *v = k + vo;
                    double *mk = mdqkv + ((size_t)b * T + j) * st + ko, *mv = mk + vo;
                    double dpm = 0;
                    for (int d = 0; d < hs; d++) dpm += fabs((double)g[d] * v[d]);
                    double sm = p[j] * (dpm + Dm) * scale;
                    for (int d = 0; d < hs; d++) {
                        mq[d] += sm * fabs((double)k[d]);
                        mk[d] += sm * fabs((double)q[d]);
                        mv[d] += p[j] * fabs((double)g[d]);
                    }
                }
            }
    free(p);
}

/* the same for GPT-2's (B,T,3C): NKV = NH, no window */
static inline void tc_mags(double *mout, double *mlse, double *mdqkv, const float *qkv,
                           const float *dout, int B, int T, int C, int NH)
{
    tc_mags_gqa(mout, mlse, mdqkv, qkv, dout, B, T, C, NH, NH, 0);
}

/* worst |got - want| / (TC_ATOL + rho mag) over n elements (NaN: infinity) */
static inline double tc_worst(const float *got, const float *want, const double *mag, size_t n,
                              double rho, size_t *at)
{
    double worst = 0;
    *at = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]) / (TC_ATOL + rho * mag[i]);
        if (isnan(e)) { *at = i; return INFINITY; }
        if (e > worst) { worst = e; *at = i; }
    }
    return worst;
}

/* pass when tc_worst <= 1 */
static inline void tc_check(const char *name, const float *got, const float *want,
                            const double *mag, size_t n, double rho)
{
    size_t at;
    double w = tc_worst(got, want, mag, n, rho, &at);
    ct_check(w <= 1.0, name, "element %zu: got %.9g want %.9g (%.3g of the tolerance %.3g)",
             at, (double)got[at], (double)want[at], w, TC_ATOL + rho * mag[at]);
}
#endif
