/*
 * attention.c -- causal multi-head self-attention, tiled flash-style.
 *
 * qkv (B,T,3C) = [q | k | v]; head h uses channels [h*hs, (h+1)*hs) of each,
 * hs = C/NH, scores scaled by 1/sqrt(hs). No (T,T) buffer: the forward walks
 * key tiles keeping a running max and sum per query row and saves
 * lse = logsumexp of each scaled score row; the backward recomputes the
 * probabilities from lse, with D_i = dout_i . out_i.
 *
 * Determinism: every output element has one owner that adds in a fixed
 * order. Forward tasks are (b, h, query tile), each owning its out rows.
 * Backward tasks are (b, h): query tiles in order, key tiles in order inside,
 * so dq, dk and dv of a head are accumulated by one task in one order.
 *
 * Vectorization: score tiles are (AQ, AK) with AK a compile-time constant;
 * S = Q K^T is computed against a transposed key tile so the inner loop runs
 * over AK contiguous keys, and P V / dS K / P^T dO run over the contiguous
 * head dim. Row max and sum use fixed halving trees over AK.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "kernels.h"
#include "fastmath.h"

#define AQ 32   /* queries per tile */
#define AK 64   /* keys per tile */
#define AD 64   /* head-dim chunk of a transposed tile (hs > AD is chunked) */

/* keep ? v : fill, as an integer blend (see exp_nonpos) */
static inline float keep_or(int keep, float v, float fill) {
    uint32_t a, b, m = -(uint32_t)(keep != 0);
    memcpy(&a, &v, 4);
    memcpy(&b, &fill, 4);
    a = (a & m) | (b & ~m);
    memcpy(&v, &a, 4);
    return v;
}

static inline float max_ak(const float *restrict s) {
    float t[AK / 2];
    for (int k = 0; k < AK / 2; k++) t[k] = s[k] > s[k + AK / 2] ? s[k] : s[k + AK / 2];
    for (int w = AK / 4; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) t[k] = t[k] > t[k + w] ? t[k] : t[k + w];
    return t[0];
}

static inline float sum_ak(const float *restrict s) {
    float t[AK / 2];
    for (int k = 0; k < AK / 2; k++) t[k] = s[k] + s[k + AK / 2];
    for (int w = AK / 4; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) t[k] = t[k] + t[k + w];
    return t[0];
}

/* a . b over n in 8 fixed lanes */
static inline float dot_lanes(const float *restrict a, const float *restrict b, int n) {
    float acc[8] = {0};
    int d = 0;
    for (; d + 8 <= n; d += 8)
        for (int k = 0; k < 8; k++) acc[k] = fmaf(a[d + k], b[d + k], acc[k]);
    for (int k = 0; k < 8 && d < n; d++, k++) acc[k] = fmaf(a[d], b[d], acc[k]);
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* S (nq, AK) = A (nq, hs; row stride lda) . Bm (nk, hs; row stride ldb)^T.
 * Columns j >= nk come out 0. Each S element sums d = 0..hs-1 in order
 * with fused multiply-adds. BT is scratch (AD, AK): a transposed chunk of
 * Bm, so the inner loop runs over AK contiguous keys. */
static inline void qk_tile(float *restrict S, const float *restrict A, size_t lda,
                           int nq, const float *restrict Bm, size_t ldb, int nk,
                           int hs, float *restrict BT) {
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < AK; j++) S[i * AK + j] = 0.0f;
    for (int d0 = 0; d0 < hs; d0 += AD) {
        int dn = hs - d0 < AD ? hs - d0 : AD;
        for (int j = 0; j < nk; j++) {
            const float *restrict b = Bm + (size_t)j * ldb + d0;
            for (int d = 0; d < dn; d++) BT[d * AK + j] = b[d];
        }
        for (int d = 0; d < dn; d++)
            for (int j = nk; j < AK; j++) BT[d * AK + j] = 0.0f;
        for (int i = 0; i < nq; i++) {
            const float *restrict a = A + (size_t)i * lda + d0;
            float *restrict s = S + i * AK;
            for (int d = 0; d < dn; d++) {
                float ad = a[d];
                const float *restrict bt = BT + d * AK;
                for (int j = 0; j < AK; j++) s[j] = fmaf(ad, bt[j], s[j]);
            }
        }
    }
}

/* One forward task: queries [q0, q0+nq) of head h in batch b. The out rows
 * serve as the running accumulator (this task owns them). */
static inline void attn_fwd_tile(float *out, float *lse, const float *qkv,
                                 int b, int h, int q0, int T, int C, int NH, int hs) {
    const size_t C3 = 3 * (size_t)C;
    const float scale = 1.0f / sqrtf((float)hs);
    const float *Q = qkv + (size_t)b * T * C3 + (size_t)h * hs;    // (T, hs) rows of stride 3C
    const float *K = Q + C;
    const float *V = Q + 2 * (size_t)C;
    float *O = out + (size_t)b * T * C + (size_t)h * hs;           // (T, hs) rows of stride C
    float *L = lse + ((size_t)b * NH + h) * T;                     // (T)
    const int nq = T - q0 < AQ ? T - q0 : AQ;
    const int qlast = q0 + nq - 1;
    float S[AQ * AK], BT[AD * AK], m[AQ], l[AQ];

    for (int i = 0; i < nq; i++) {
        float *restrict o = O + (size_t)(q0 + i) * C;
        for (int d = 0; d < hs; d++) o[d] = 0.0f;
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }
    for (int k0 = 0; k0 <= qlast; k0 += AK) {
        int nk = qlast + 1 - k0 < AK ? qlast + 1 - k0 : AK;
        qk_tile(S, Q + (size_t)q0 * C3, C3, nq, K + (size_t)k0 * C3, C3, nk, hs, BT);
        for (int i = 0; i < nq; i++) {
            int jn = q0 + i - k0 + 1;              /* causal: keys <= query */
            if (jn <= 0) continue;
            if (jn > nk) jn = nk;
            float *restrict s = S + i * AK;
            for (int j = 0; j < AK; j++) s[j] = keep_or(j < jn, s[j] * scale, -INFINITY);
            float mt = max_ak(s);
            float mnew = mt > m[i] ? mt : m[i];
            float alpha = exp_nonpos(m[i] - mnew); /* 0 on the first tile */
            for (int j = 0; j < AK; j++) s[j] = exp_nonpos(s[j] - mnew);
            l[i] = l[i] * alpha + sum_ak(s);
            m[i] = mnew;
            float *restrict o = O + (size_t)(q0 + i) * C;
            if (alpha != 1.0f)
                for (int d = 0; d < hs; d++) o[d] *= alpha;
        }
        /* O_i += sum_j P_ij V_j. Keys outer, queries inner: consecutive
         * updates hit different rows, so no row waits on its own previous
         * store; each O_i still adds its keys in ascending order. */
        for (int j = 0; j < nk; j++) {
            const float *restrict v = V + (size_t)(k0 + j) * C3;
            for (int i = k0 + j - q0 > 0 ? k0 + j - q0 : 0; i < nq; i++) {
                float p = S[i * AK + j];
                float *restrict o = O + (size_t)(q0 + i) * C;
                for (int d = 0; d < hs; d++) o[d] = fmaf(p, v[d], o[d]);
            }
        }
    }
    for (int i = 0; i < nq; i++) {
        float *restrict o = O + (size_t)(q0 + i) * C;
        float inv = 1.0f / l[i];
        for (int d = 0; d < hs; d++) o[d] *= inv;
        L[q0 + i] = m[i] + logf(l[i]);
    }
}

/* out (B,T,C), lse (B,NH,T) from qkv (B,T,3C). */
void zk_attention_forward(float *out, float *lse, const float *qkv,
                          int B, int T, int C, int NH) {
    const int hs = C / NH;
    const int nqt = (T + AQ - 1) / AQ;
    const long ntask = (long)B * NH * nqt;
    /* dynamic: causal tiles differ in cost; heavy (late) tiles go first */
    #pragma omp parallel for schedule(dynamic, 1) if ((long)B * T * C >= 16384)
    for (long task = 0; task < ntask; task++) {
        int qt = nqt - 1 - (int)(task % nqt);
        int bh = (int)(task / nqt);
        int b = bh / NH, h = bh % NH;
        if (hs == 64)   /* GPT-2's head size: constant trip counts unroll */
            attn_fwd_tile(out, lse, qkv, b, h, qt * AQ, T, C, NH, 64);
        else
            attn_fwd_tile(out, lse, qkv, b, h, qt * AQ, T, C, NH, hs);
    }
}

/* One backward task: all of head h in batch b. */
static inline void attn_bwd_head(float *dqkv, const float *dout, const float *qkv,
                                 const float *out, const float *lse,
                                 int b, int h, int T, int C, int NH, int hs) {
    const size_t C3 = 3 * (size_t)C;
    const float scale = 1.0f / sqrtf((float)hs);
    const size_t qoff = (size_t)b * T * C3 + (size_t)h * hs;
    const float *Q = qkv + qoff, *K = Q + C, *V = Q + 2 * (size_t)C;   // rows of stride 3C
    float *dQ = dqkv + qoff, *dK = dQ + C, *dV = dQ + 2 * (size_t)C;
    const size_t ooff = (size_t)b * T * C + (size_t)h * hs;
    const float *O = out + ooff, *dO = dout + ooff;                    // rows of stride C
    const float *L = lse + ((size_t)b * NH + h) * T;
    float P[AQ * AK], dS[AQ * AK], BT[AD * AK], Dv[AQ];

    for (int t = 0; t < T; t++)
        for (int d = 0; d < hs; d++) {
            dQ[(size_t)t * C3 + d] = 0.0f;
            dK[(size_t)t * C3 + d] = 0.0f;
            dV[(size_t)t * C3 + d] = 0.0f;
        }
    for (int q0 = 0; q0 < T; q0 += AQ) {
        const int nq = T - q0 < AQ ? T - q0 : AQ;
        const int qlast = q0 + nq - 1;
        for (int i = 0; i < nq; i++)
            Dv[i] = dot_lanes(dO + (size_t)(q0 + i) * C, O + (size_t)(q0 + i) * C, hs);
        for (int k0 = 0; k0 <= qlast; k0 += AK) {
            int nk = qlast + 1 - k0 < AK ? qlast + 1 - k0 : AK;
            qk_tile(P, Q + (size_t)q0 * C3, C3, nq, K + (size_t)k0 * C3, C3, nk, hs, BT);
            qk_tile(dS, dO + (size_t)q0 * C, C, nq, V + (size_t)k0 * C3, C3, nk, hs, BT);
            for (int i = 0; i < nq; i++) {
                int jn = q0 + i - k0 + 1;
                jn = jn < 0 ? 0 : (jn > nk ? nk : jn);
                float Li = L[q0 + i], Di = Dv[i];
                float *restrict p = P + i * AK;
                float *restrict ds = dS + i * AK;
                for (int j = 0; j < AK; j++) {
                    float pj = keep_or(j < jn, exp_nonpos(p[j] * scale - Li), 0.0f);
                    p[j] = pj;
                    ds[j] = pj * (ds[j] - Di) * scale;   /* dS = P (dP - D), scaled */
                }
            }
            /* dV_j += sum_i P_ij dO_i;  dK_j += sum_i dS_ij Q_i  (i ascending),
             * through an AD-wide local accumulator: a dqkv row updated in
             * place would make each step wait on the previous step's store. */
            for (int j = 0; j < nk; j++) {
                int i0 = k0 + j - q0 > 0 ? k0 + j - q0 : 0;
                float *restrict dv = dV + (size_t)(k0 + j) * C3;
                float *restrict dk = dK + (size_t)(k0 + j) * C3;
                for (int d0 = 0; d0 < hs; d0 += AD) {
                    int dn = hs - d0 < AD ? hs - d0 : AD;
                    float acc[AD];
                    for (int d = 0; d < dn; d++) acc[d] = dv[d0 + d];
                    for (int i = i0; i < nq; i++) {
                        float pij = P[i * AK + j];
                        const float *restrict dor = dO + (size_t)(q0 + i) * C + d0;
                        for (int d = 0; d < dn; d++) acc[d] = fmaf(pij, dor[d], acc[d]);
                    }
                    for (int d = 0; d < dn; d++) dv[d0 + d] = acc[d];
                    for (int d = 0; d < dn; d++) acc[d] = dk[d0 + d];
                    for (int i = i0; i < nq; i++) {
                        float dsij = dS[i * AK + j];
                        const float *restrict qr = Q + (size_t)(q0 + i) * C3 + d0;
                        for (int d = 0; d < dn; d++) acc[d] = fmaf(dsij, qr[d], acc[d]);
                    }
                    for (int d = 0; d < dn; d++) dk[d0 + d] = acc[d];
                }
            }
            /* dQ_i += sum_j dS_ij K_j  (j ascending) */
            for (int j = 0; j < nk; j++) {
                const float *restrict kr = K + (size_t)(k0 + j) * C3;
                for (int i = k0 + j - q0 > 0 ? k0 + j - q0 : 0; i < nq; i++) {
                    float dsij = dS[i * AK + j];
                    float *restrict dq = dQ + (size_t)(q0 + i) * C3;
                    for (int d = 0; d < hs; d++) dq[d] = fmaf(dsij, kr[d], dq[d]);
                }
            }
        }
    }
}

/* dqkv (B,T,3C) WRITTEN from dout (B,T,C), qkv, out and lse. */
void zk_attention_backward(float *dqkv, const float *dout, const float *qkv,
                           const float *out, const float *lse,
                           int B, int T, int C, int NH) {
    const int hs = C / NH;
    #pragma omp parallel for schedule(dynamic, 1) if ((long)B * T * C >= 16384)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        if (hs == 64)
            attn_bwd_head(dqkv, dout, qkv, out, lse, b, h, T, C, NH, 64);
        else
            attn_bwd_head(dqkv, dout, qkv, out, lse, b, h, T, C, NH, hs);
    }
}
