/*
 * attention.c -- causal multi-head self-attention, tiled flash-style.
 *
 * qkv (B,T,3C) = [q | k | v]; head h uses channels [h*hs, (h+1)*hs) of each,
 * hs = C/NH, scores scaled by 1/sqrt(hs). No (T,T) buffer: the forward walks
 * key tiles keeping a running max and sum per query row and saves
 * lse = logsumexp of each scaled score row; the backward recomputes the
 * probabilities from lse, with D_i = dout_i . out_i.
 *
 * Grouped-query heads and a sliding window (the _gqa kernels): qkv rows
 * are q (NH heads) | k (NKV) | v (NKV), query head h reading kv head
 * h / (NH/NKV); with a window W > 0 query i sees keys (i - W, i], and key
 * tiles wholly before a query tile's windows are skipped. NKV = NH, W = 0
 * is the (B,T,3C) layout, with the same arithmetic and bits as before.
 *
 * Determinism: every output element has one owner that adds in a fixed
 * order. Forward tasks are (b, h, query tile), each owning its out rows.
 * Backward tasks are (b, kv head): its query heads ascending, query tiles
 * in order inside each, key tiles in order inside those, so dq of a query
 * head and the dk, dv a kv head sums over its query heads are accumulated
 * by one task in one order (no atomics).
 *
 * Vectorization: score tiles are (AQ, AK) with AK a compile-time constant.
 * All five products (Q K^T, dO V^T against an 8x8-transposed key/value
 * tile; P V, dS K, P^T dO, dS^T Q over the contiguous head dim) go through
 * one register-blocked micro-kernel: on AVX-512 CPUs 6x64 C blocks in zmm
 * accumulators (gemm_acc16), the rest (and CPUs without AVX-512) 3x32 /
 * 6x16 / 6x8 blocks in ymm (gemm_acc8), a scalar tail for head dims not a
 * multiple of 8. Each output element is still a single fused multiply-add
 * chain in ascending order, so neither the blocking nor the path changes
 * which terms meet where (the AVX-512 path cut gpt2's attention by ~30%:
 * docs/performance.md).
 * Row max and sum use fixed halving trees over AK.
 *
 * Generation: zk_attention_decode runs the same row arithmetic (attn_rows)
 * for new query positions over a KV cache, so a cached position's output
 * has the bits of that row of a full forward over the whole sequence.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>
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
    float acc[8];
    __m256 va = _mm256_setzero_ps();
    int d = 0;
    for (; d + 8 <= n; d += 8)
        va = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), va);
    _mm256_storeu_ps(acc, va);
    for (int k = 0; k < 8 && d < n; d++, k++) acc[k] = fmaf(a[d], b[d], acc[k]);
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* Register-blocked micro-kernel: C (MR, 8*NV) += A (MR, kk) . B (kk, 8*NV)
 * over kk in [kb, ke) ascending. A(r, kk) = A[r*ars + kk*aks]; B row kk at
 * B + kk*ldb; C row r at C + r*ldc. Every C element is one fused
 * multiply-add chain in kk order, whatever the blocking, so results do not
 * depend on which path (or thread) computes them. */
static inline __attribute__((always_inline)) void
mk_blk(const int MR, const int NV, float *restrict C, size_t ldc,
       const float *restrict A, size_t ars, size_t aks,
       const float *restrict B, size_t ldb, int kb, int ke) {
    __m256 acc[6][4];
    #pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
        #pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[r][v] = _mm256_loadu_ps(C + r * ldc + 8 * v);
    for (int kk = kb; kk < ke; kk++) {
        const float *restrict b = B + (size_t)kk * ldb;
        const float *restrict a = A + (size_t)kk * aks;
        __m256 av[6];
        #pragma GCC unroll 6
        for (int r = 0; r < MR; r++) av[r] = _mm256_broadcast_ss(a + r * ars);
        #pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            __m256 bv = _mm256_loadu_ps(b + 8 * v);
            #pragma GCC unroll 6
            for (int r = 0; r < MR; r++) acc[r][v] = _mm256_fmadd_ps(av[r], bv, acc[r][v]);
        }
    }
    #pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
        #pragma GCC unroll 4
        for (int v = 0; v < NV; v++) _mm256_storeu_ps(C + r * ldc + 8 * v, acc[r][v]);
}

/* row range [r0, r0+mr) -> kk range, causal by mode:
 * 0 none; 1 kk <= r + off (rows are queries, kk keys);
 * 2 kk >= r + off (rows are keys, kk queries). Skipped terms have A = 0. */
static inline void kk_range(int mode, int off, int r0, int mr, int K, int *kb, int *ke) {
    *kb = 0;
    *ke = K;
    if (mode == 1) {
        int e = r0 + mr - 1 + off + 1;
        if (e < *ke) *ke = e;
    } else if (mode == 2) {
        int s = r0 + off;
        if (s > 0) *kb = s;
    }
}

/* C (M, N) += A (M, K) . B (K, N), see mk_blk; mode/off as kk_range. */
static void gemm_acc8(float *restrict C, size_t ldc, const float *restrict A,
                     size_t ars, size_t aks, const float *restrict B, size_t ldb,
                     int M, int N, int K, int mode, int off) {
    int n = 0, kb, ke;
    for (; n + 32 <= N; n += 32) {
        int r = 0;
        for (; r + 3 <= M; r += 3) {
            kk_range(mode, off, r, 3, K, &kb, &ke);
            if (kb < ke) mk_blk(3, 4, C + r * ldc + n, ldc, A + r * ars, ars, aks, B + n, ldb, kb, ke);
        }
        if (M - r == 2) {
            kk_range(mode, off, r, 2, K, &kb, &ke);
            if (kb < ke) mk_blk(2, 4, C + r * ldc + n, ldc, A + r * ars, ars, aks, B + n, ldb, kb, ke);
        } else if (M - r == 1) {
            kk_range(mode, off, r, 1, K, &kb, &ke);
            if (kb < ke) mk_blk(1, 4, C + r * ldc + n, ldc, A + r * ars, ars, aks, B + n, ldb, kb, ke);
        }
    }
    for (; n + 16 <= N; n += 16) {
        int r = 0;
        for (; r + 6 <= M; r += 6) {
            kk_range(mode, off, r, 6, K, &kb, &ke);
            if (kb < ke) mk_blk(6, 2, C + r * ldc + n, ldc, A + r * ars, ars, aks, B + n, ldb, kb, ke);
        }
        if (r < M) {
            int mr = M - r;
            kk_range(mode, off, r, mr, K, &kb, &ke);
            if (kb < ke) switch (mr) {
            case 5: mk_blk(5, 2, C + r * ldc + n, ldc, A + r * ars, ars, aks, B + n, ldb, kb, ke); break;
            case 4: mk_blk(4, 2, C + r * ldc + n, ldc, A + r * ars, ars, aks, B + n, ldb, kb, ke); break;
            case 3: mk_blk(3, 2, C + r * ldc + n, ldc, A + r * ars, ars, aks, B + n, ldb, kb, ke); break;
            case 2: mk_blk(2, 2, C + r * ldc + n, ldc, A + r * ars, ars, aks, B + n, ldb, kb, ke); break;
            default: mk_blk(1, 2, C + r * ldc + n, ldc, A + r * ars, ars, aks, B + n, ldb, kb, ke); break;
            }
        }
    }
    for (; n + 8 <= N; n += 8) {
        int r = 0;
        for (; r + 6 <= M; r += 6) {
            kk_range(mode, off, r, 6, K, &kb, &ke);
            if (kb < ke) mk_blk(6, 1, C + r * ldc + n, ldc, A + r * ars, ars, aks, B + n, ldb, kb, ke);
        }
        if (r < M) {
            int mr = M - r;
            kk_range(mode, off, r, mr, K, &kb, &ke);
            if (kb < ke) switch (mr) {
            case 5: mk_blk(5, 1, C + r * ldc + n, ldc, A + r * ars, ars, aks, B + n, ldb, kb, ke); break;
            case 4: mk_blk(4, 1, C + r * ldc + n, ldc, A + r * ars, ars, aks, B + n, ldb, kb, ke); break;
            case 3: mk_blk(3, 1, C + r * ldc + n, ldc, A + r * ars, ars, aks, B + n, ldb, kb, ke); break;
            case 2: mk_blk(2, 1, C + r * ldc + n, ldc, A + r * ars, ars, aks, B + n, ldb, kb, ke); break;
            default: mk_blk(1, 1, C + r * ldc + n, ldc, A + r * ars, ars, aks, B + n, ldb, kb, ke); break;
            }
        }
    }
    if (n < N)
        for (int r = 0; r < M; r++) {
            kk_range(mode, off, r, 1, K, &kb, &ke);
            for (int c = n; c < N; c++) {
                float s = C[r * ldc + c];
                for (int kk = kb; kk < ke; kk++)
                    s = fmaf(A[r * ars + (size_t)kk * aks], B[(size_t)kk * ldb + c], s);
                C[r * ldc + c] = s;
            }
        }
}

/* The same products on AVX-512 (16-float registers): 6x64 C blocks in 24
 * zmm accumulators, then gemm_acc for the columns left over. Every C
 * element is still one fused multiply-add chain over its kk range in
 * ascending order; a block's kk range is the union of its rows' ranges and
 * the extra terms have A = 0 (masked probabilities and their dS), which
 * leave a sum that is never -0 unchanged. So both paths give the same bits
 * (test_attention checks it against zk_force_scalar's AVX2 path). */
#define ATT_AVX512 __attribute__((target("avx512f")))
ATT_AVX512 static inline __attribute__((always_inline)) void
mk_blk16(const int MR, float *restrict C, size_t ldc,
         const float *restrict A, size_t ars, size_t aks,
         const float *restrict B, size_t ldb, int kb, int ke) {
    __m512 acc[6][4];
    #pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
        #pragma GCC unroll 4
        for (int v = 0; v < 4; v++) acc[r][v] = _mm512_loadu_ps(C + r * ldc + 16 * v);
    for (int kk = kb; kk < ke; kk++) {
        const float *restrict b = B + (size_t)kk * ldb;
        const float *restrict a = A + (size_t)kk * aks;
        __m512 bv[4];
        #pragma GCC unroll 4
        for (int v = 0; v < 4; v++) bv[v] = _mm512_loadu_ps(b + 16 * v);
        #pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            __m512 av = _mm512_set1_ps(a[r * ars]);
            #pragma GCC unroll 4
            for (int v = 0; v < 4; v++) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    #pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
        #pragma GCC unroll 4
        for (int v = 0; v < 4; v++) _mm512_storeu_ps(C + r * ldc + 16 * v, acc[r][v]);
}

ATT_AVX512 static void gemm_acc16(float *restrict C, size_t ldc, const float *restrict A,
                                  size_t ars, size_t aks, const float *restrict B, size_t ldb,
                                  int M, int N, int K, int mode, int off) {
    int n = 0, kb, ke;
    for (; n + 64 <= N; n += 64) {
        int r = 0;
        for (; r + 6 <= M; r += 6) {
            kk_range(mode, off, r, 6, K, &kb, &ke);
            if (kb < ke) mk_blk16(6, C + r * ldc + n, ldc, A + r * ars, ars, aks, B + n, ldb, kb, ke);
        }
        if (r < M) {
            int mr = M - r;
            kk_range(mode, off, r, mr, K, &kb, &ke);
            float *c = C + r * ldc + n;
            const float *a = A + r * ars, *b = B + n;
            if (kb < ke) switch (mr) {
            case 5: mk_blk16(5, c, ldc, a, ars, aks, b, ldb, kb, ke); break;
            case 4: mk_blk16(4, c, ldc, a, ars, aks, b, ldb, kb, ke); break;
            case 3: mk_blk16(3, c, ldc, a, ars, aks, b, ldb, kb, ke); break;
            case 2: mk_blk16(2, c, ldc, a, ars, aks, b, ldb, kb, ke); break;
            default: mk_blk16(1, c, ldc, a, ars, aks, b, ldb, kb, ke); break;
            }
        }
    }
    if (n < N) gemm_acc8(C + n, ldc, A, ars, aks, B + n, ldb, M, N - n, K, mode, off);
}

typedef void (*gemm_acc_fn)(float *restrict, size_t, const float *restrict, size_t, size_t,
                            const float *restrict, size_t, int, int, int, int, int);

static gemm_acc_fn pick_gemm_acc(void) { return zk_avx512_twin() ? gemm_acc16 : gemm_acc8; }

/* dst[c*ldd + r] = src[r*lds + c] for an 8x8 block */
static inline void tr8x8(const float *restrict src, size_t lds, float *restrict dst, size_t ldd) {
    __m256 r0 = _mm256_loadu_ps(src + 0 * lds), r1 = _mm256_loadu_ps(src + 1 * lds);
    __m256 r2 = _mm256_loadu_ps(src + 2 * lds), r3 = _mm256_loadu_ps(src + 3 * lds);
    __m256 r4 = _mm256_loadu_ps(src + 4 * lds), r5 = _mm256_loadu_ps(src + 5 * lds);
    __m256 r6 = _mm256_loadu_ps(src + 6 * lds), r7 = _mm256_loadu_ps(src + 7 * lds);
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    _mm256_storeu_ps(dst + 0 * ldd, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(dst + 1 * ldd, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(dst + 2 * ldd, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(dst + 3 * ldd, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(dst + 4 * ldd, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(dst + 5 * ldd, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(dst + 6 * ldd, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(dst + 7 * ldd, _mm256_permute2f128_ps(u3, u7, 0x31));
}

/* S (nq, AK) = A (nq, hs; row stride lda) . Bm (nk, hs; row stride ldb)^T.
 * Columns j >= nk come out 0. Each S element sums d = 0..hs-1 in order
 * with fused multiply-adds. BT is scratch (AD, AK): a transposed chunk of
 * Bm, so the inner loop runs over AK contiguous keys. */
static inline void qk_tile(gemm_acc_fn gemm_acc, float *restrict S, const float *restrict A, size_t lda,
                           int nq, const float *restrict Bm, size_t ldb, int nk,
                           int hs, float *restrict BT) {
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < AK; j++) S[i * AK + j] = 0.0f;
    for (int d0 = 0; d0 < hs; d0 += AD) {
        int dn = hs - d0 < AD ? hs - d0 : AD;
        int j8 = nk & ~7, d8 = dn & ~7;
        for (int j = 0; j < j8; j += 8)
            for (int d = 0; d < d8; d += 8)
                tr8x8(Bm + (size_t)j * ldb + d0 + d, ldb, BT + d * AK + j, AK);
        for (int j = 0; j < nk; j++) {
            const float *restrict b = Bm + (size_t)j * ldb + d0;
            for (int d = j < j8 ? d8 : 0; d < dn; d++) BT[d * AK + j] = b[d];
        }
        for (int d = 0; d < dn; d++)
            for (int j = nk; j < AK; j++) BT[d * AK + j] = 0.0f;
        gemm_acc(S, AK, A + d0, lda, 1, BT, AK, nq, (nk + 7) & ~7, dn, 0, 0);
    }
}

/* The forward's arithmetic for nq query rows of one head, shared by the
 * training forward and the KV-cache kernel so a cached row has the bits of
 * the same row of a full forward. Query i sits at absolute position
 * qpos + i and sees keys [0, qpos + i]. Q rows (hs) at stride ldq; key and
 * value rows j at K + j*ldk, V + j*ldv; out rows at stride ldo serve as the
 * running accumulator (the caller's task owns them); lse (nq), if not NULL,
 * gets each row's log-sum-exp. Key tiles start at multiples of AK from key
 * 0 whatever qpos is: a row's tiles, and so its sums, depend only on its
 * position. */
/* Sliding window W (0: none): the first key position p sees (keys
 * (p - W, p]), and the first key tile (a multiple of AK from key 0, so a
 * row's tiles still depend only on its position) a query tile from p on
 * needs: tiles wholly before every row's window are skipped. */
static inline int win_lo(int p, int W) { return W > 0 && p - W + 1 > 0 ? p - W + 1 : 0; }
static inline int first_tile(int p, int W) { return win_lo(p, W) / AK * AK; }

/* Key and value rows in bf16 (the bf16-I/O kernels): rows j at k16 + j*ld,
 * v16 + j*ld, widened exactly tile by tile into kw, vw (AK*hs floats each),
 * so the products read the very floats the f32 kernel would. */
typedef struct { const uint16_t *k16, *v16; size_t ld; float *kw, *vw; } kv16;

/* rows [0, n) of src (stride lds) widened into dst (stride hs) */
static void widen_rows(float *dst, const uint16_t *src, size_t lds, int n, int hs) {
    for (int r = 0; r < n; r++) zk_cast_bf16_f32(dst + (size_t)r * hs, src + (size_t)r * lds, (size_t)hs);
}

/* rows [0, n) of src (stride hs) rounded once into dst (stride ldd) */
static void round_rows(uint16_t *dst, size_t ldd, const float *src, int n, int hs) {
    for (int r = 0; r < n; r++) zk_cast_f32_bf16(dst + (size_t)r * ldd, src + (size_t)r * hs, (size_t)hs);
}

static inline void attn_rows(gemm_acc_fn gemm_acc, float *O, size_t ldo, float *lse, const float *Q, size_t ldq,
                             const float *K, size_t ldk, const float *V, size_t ldv,
                             int qpos, int nq, int hs, int W, const kv16 *w16) {
    const float scale = 1.0f / sqrtf((float)hs);
    const int qlast = qpos + nq - 1;
    float S[AQ * AK], BT[AD * AK], m[AQ], l[AQ];

    for (int i = 0; i < nq; i++) {
        float *restrict o = O + (size_t)i * ldo;
        for (int d = 0; d < hs; d++) o[d] = 0.0f;
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }
    for (int k0 = first_tile(qpos, W); k0 <= qlast; k0 += AK) {
        int nk = qlast + 1 - k0 < AK ? qlast + 1 - k0 : AK;
        const float *Kt = K + (size_t)k0 * ldk, *Vt = V + (size_t)k0 * ldv;
        size_t ldkt = ldk, ldvt = ldv;
        if (w16) {
            widen_rows(w16->kw, w16->k16 + (size_t)k0 * w16->ld, w16->ld, nk, hs);
            widen_rows(w16->vw, w16->v16 + (size_t)k0 * w16->ld, w16->ld, nk, hs);
            Kt = w16->kw; Vt = w16->vw; ldkt = ldvt = (size_t)hs;
        }
        qk_tile(gemm_acc, S, Q, ldq, nq, Kt, ldkt, nk, hs, BT);
        for (int i = 0; i < nq; i++) {
            int jn = qpos + i - k0 + 1;            /* causal: keys <= query */
            int j0 = win_lo(qpos + i, W) - k0;      /* window: keys > query - W */
            if (jn > nk) jn = nk;
            if (jn <= 0 || j0 >= jn) {              /* no keys: P row is 0 */
                for (int j = 0; j < AK; j++) S[i * AK + j] = 0.0f;
                continue;
            }
            float *restrict s = S + i * AK;
            for (int j = 0; j < AK; j++) s[j] = keep_or(j >= j0 && j < jn, s[j] * scale, -INFINITY);
            float mt = max_ak(s);
            float mnew = mt > m[i] ? mt : m[i];
            float alpha = exp_nonpos(m[i] - mnew); /* 0 on the first tile */
            for (int j = 0; j < AK; j++) s[j] = exp_nonpos(s[j] - mnew);
            l[i] = l[i] * alpha + sum_ak(s);
            m[i] = mnew;
            float *restrict o = O + (size_t)i * ldo;
            if (alpha != 1.0f)
                for (int d = 0; d < hs; d++) o[d] *= alpha;
        }
        /* O_i += sum_j P_ij V_j. Keys outer, queries inner: consecutive
         * updates hit different rows, so no row waits on its own previous
         * store; each O_i still adds its keys in ascending order. */
        gemm_acc(O, ldo, S, AK, 1, Vt, ldvt, nq, hs, nk, 1, qpos - k0);
    }
    for (int i = 0; i < nq; i++) {
        float *restrict o = O + (size_t)i * ldo;
        float inv = 1.0f / l[i];
        for (int d = 0; d < hs; d++) o[d] *= inv;
        if (lse) lse[i] = m[i] + logf(l[i]);
    }
}

/* A call's layout: qkv rows of R = C + 2 NKV hs floats, q (C = NH hs) |
 * k (NKV hs) | v (NKV hs); query head h reads kv head h / (NH / NKV);
 * window W (0: plain causal). NKV = NH, W = 0 is GPT-2's (B,T,3C). */
typedef struct { int T, C, NH, NKV, W; size_t R; } geo;

static inline geo mk_geo(int T, int C, int NH, int NKV, int W) {
    geo g = { T, C, NH, NKV, W, (size_t)C + 2 * (size_t)NKV * (size_t)(C / NH) };
    return g;
}

/* offset of q head h (which 0), or of kv head kh's k (1) or v (2), in row 0 of batch b */
static inline size_t head_at(const geo *g, int b, int which, int h, int hs) {
    size_t o = (size_t)b * g->T * g->R;
    if (which == 0) return o + (size_t)h * hs;
    return o + (size_t)g->C + ((size_t)(which - 1) * g->NKV + h) * hs;
}

/* One forward task: queries [q0, q0+nq) of head h in batch b. */
static inline void attn_fwd_tile(gemm_acc_fn gemm_acc, float *out, float *lse, const float *qkv,
                                 int b, int h, int q0, const geo *g, int hs) {
    const int T = g->T, C = g->C, kh = h / (g->NH / g->NKV);
    const float *Q = qkv + head_at(g, b, 0, h, hs);                // (T, hs) rows of stride R
    const float *K = qkv + head_at(g, b, 1, kh, hs);
    const float *V = qkv + head_at(g, b, 2, kh, hs);
    float *O = out + (size_t)b * T * C + (size_t)h * hs;           // (T, hs) rows of stride C
    float *L = lse + ((size_t)b * g->NH + h) * T;                  // (T)
    const int nq = T - q0 < AQ ? T - q0 : AQ;
    attn_rows(gemm_acc, O + (size_t)q0 * C, C, L + q0, Q + (size_t)q0 * g->R, g->R, K, g->R, V, g->R,
              q0, nq, hs, g->W, NULL);
}

/* The bf16-I/O forward task: the same rows through f32 tiles of buf
 * (fwd16_floats(hs)): q rows widened, the output accumulated in f32 and
 * rounded once, key and value tiles widened as attn_rows walks them. */
static size_t fwd16_floats(int hs) { return (size_t)(2 * AQ + 2 * AK) * hs; }

static inline void attn_fwd_tile16(gemm_acc_fn gemm_acc, uint16_t *out, float *lse, const uint16_t *qkv,
                                   int b, int h, int q0, const geo *g, int hs, float *buf) {
    const int T = g->T, C = g->C, kh = h / (g->NH / g->NKV);
    const uint16_t *Q = qkv + head_at(g, b, 0, h, hs);
    uint16_t *O = out + (size_t)b * T * C + (size_t)h * hs;
    float *L = lse + ((size_t)b * g->NH + h) * T;
    const int nq = T - q0 < AQ ? T - q0 : AQ;
    float *qw = buf, *ow = qw + (size_t)AQ * hs;
    kv16 w16 = { qkv + head_at(g, b, 1, kh, hs), qkv + head_at(g, b, 2, kh, hs), g->R,
                 ow + (size_t)AQ * hs, ow + (size_t)(AQ + AK) * hs };
    widen_rows(qw, Q + (size_t)q0 * g->R, g->R, nq, hs);
    attn_rows(gemm_acc, ow, hs, L + q0, qw, hs, NULL, 0, NULL, 0, q0, nq, hs, g->W, &w16);
    round_rows(O + (size_t)q0 * C, C, ow, nq, hs);
}

void zk_attention_forward_gqa(float *out, float *lse, const float *qkv,
                              int B, int T, int C, int NH, int NKV, int W) {
    const gemm_acc_fn gemm = pick_gemm_acc();
    const geo g = mk_geo(T, C, NH, NKV, W);
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
            attn_fwd_tile(gemm, out, lse, qkv, b, h, qt * AQ, &g, 64);
        else
            attn_fwd_tile(gemm, out, lse, qkv, b, h, qt * AQ, &g, hs);
    }
}

void zk_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    zk_attention_forward_gqa(out, lse, qkv, B, T, C, NH, NH, 0);
}

/* The bf16-I/O forward: each thread's f32 tiles on the heap (hs is any
 * C/NH; the stack is not sized for it). -1 if they cannot be had. */
int zk_attention_forward_gqa_bb(uint16_t *out, float *lse, const uint16_t *qkv,
                                int B, int T, int C, int NH, int NKV, int W) {
    const gemm_acc_fn gemm = pick_gemm_acc();
    const geo g = mk_geo(T, C, NH, NKV, W);
    const int hs = C / NH;
    const int nqt = (T + AQ - 1) / AQ;
    const long ntask = (long)B * NH * nqt;
    int failed = 0;
    #pragma omp parallel if ((long)B * T * C >= 16384)
    {
        float *buf = malloc(fwd16_floats(hs) * sizeof(float));
        if (!buf) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < ntask; task++) {
            if (!buf) continue;
            int qt = nqt - 1 - (int)(task % nqt);
            int bh = (int)(task / nqt);
            int b = bh / NH, h = bh % NH;
            if (hs == 64)
                attn_fwd_tile16(gemm, out, lse, qkv, b, h, qt * AQ, &g, 64, buf);
            else
                attn_fwd_tile16(gemm, out, lse, qkv, b, h, qt * AQ, &g, hs, buf);
        }
        free(buf);
    }
    return failed ? -1 : 0;
}

int zk_attention_forward_bb(uint16_t *out, float *lse, const uint16_t *qkv,
                            int B, int T, int C, int NH) {
    return zk_attention_forward_gqa_bb(out, lse, qkv, B, T, C, NH, NH, 0);
}

/* One cache task: new queries [q0, q0+nq) of head h in batch b, at
 * absolute positions pos + q0 + i, over its kv head's cached keys and
 * values (rows of hs floats, contiguous). */
static inline void attn_cache_tile(gemm_acc_fn gemm_acc, float *out, const float *kcache, const float *vcache,
                                   const float *qkv, int b, int h, int q0, const geo *g,
                                   int maxT, int pos, int hs) {
    const int T = g->T, C = g->C, kh = h / (g->NH / g->NKV);
    const size_t head = ((size_t)b * g->NKV + kh) * maxT * hs;
    const int nq = T - q0 < AQ ? T - q0 : AQ;
    attn_rows(gemm_acc, out + ((size_t)b * T + q0) * C + (size_t)h * hs, C, NULL,
              qkv + head_at(g, b, 0, h, hs) + (size_t)q0 * g->R, g->R,
              kcache + head, hs, vcache + head, hs, pos + q0, nq, hs, g->W, NULL);
}

/* Appends the new positions' k and v to the caches, then attends. */
void zk_attention_decode_gqa(float *out, float *kcache, float *vcache, const float *qkv,
                             int B, int T, int C, int NH, int NKV, int W, int maxT, int pos) {
    const gemm_acc_fn gemm = pick_gemm_acc();
    const geo g = mk_geo(T, C, NH, NKV, W);
    const int hs = C / NH;
    const long nrow = (long)B * NKV * T;
    /* every new row is in the cache before any query reads it: a query
     * sees the new keys before it in the same call */
    #pragma omp parallel for schedule(static) if (nrow * hs >= 65536)
    for (long r = 0; r < nrow; r++) {
        int t = (int)(r % T), bh = (int)(r / T);
        int b = bh / NKV, kh = bh % NKV;
        const float *k = qkv + head_at(&g, b, 1, kh, hs) + (size_t)t * g.R;
        const float *v = qkv + head_at(&g, b, 2, kh, hs) + (size_t)t * g.R;
        size_t dst = ((size_t)bh * maxT + pos + t) * hs;
        memcpy(kcache + dst, k, (size_t)hs * sizeof(float));
        memcpy(vcache + dst, v, (size_t)hs * sizeof(float));
    }
    const int nqt = (T + AQ - 1) / AQ;
    const long ntask = (long)B * NH * nqt;
    #pragma omp parallel for schedule(dynamic, 1) if ((long)B * (pos + T) * C >= 16384)
    for (long task = 0; task < ntask; task++) {
        int qt = nqt - 1 - (int)(task % nqt);
        int bh = (int)(task / nqt);
        int b = bh / NH, h = bh % NH;
        if (hs == 64)
            attn_cache_tile(gemm, out, kcache, vcache, qkv, b, h, qt * AQ, &g, maxT, pos, 64);
        else
            attn_cache_tile(gemm, out, kcache, vcache, qkv, b, h, qt * AQ, &g, maxT, pos, hs);
    }
}

void zk_attention_decode(float *out, float *kcache, float *vcache, const float *qkv,
                         int B, int T, int C, int NH, int maxT, int pos) {
    zk_attention_decode_gqa(out, kcache, vcache, qkv, B, T, C, NH, NH, 0, maxT, pos);
}

/* The bf16-I/O backward's tensors and its thread's f32 buffer
 * (bwd16_floats(T, hs)): dK and dV of the whole kv head (they gather terms
 * from every query tile of every query head reading it), then one query
 * tile's dQ, q and o rows, one key tile's k and v rows, and the query
 * tile's dout rows. */
typedef struct { uint16_t *dqkv; const uint16_t *qkv, *out, *dout; float *buf; } io16;

static size_t bwd16_floats(int T, int hs) { return (2 * (size_t)T + 4 * AQ + 2 * AK) * (size_t)hs; }

/* Query head h's terms of one backward task (attn_bwd_group): dQ of h
 * WRITTEN, dK and dV (of h's kv head, rows at dK, dV of stride ld) added to.
 * f32 tensors, or (x) bf16 qkv, out, dout and dqkv: their rows widened into
 * x->buf tile by tile, dQ accumulated there in f32 in the same order and
 * rounded once at the end of its query tile. */
static inline void attn_bwd_qhead(gemm_acc_fn gemm_acc, float *dqkv, const float *dout, const float *qkv,
                                  const float *out, const float *lse, float *dK, float *dV, size_t ld,
                                  int b, int h, const geo *g, int hs, const io16 *x) {
    const int T = g->T, C = g->C, kh = h / (g->NH / g->NKV);
    const size_t R = g->R;
    const float scale = 1.0f / sqrtf((float)hs);
    const size_t qoff = head_at(g, b, 0, h, hs), koff = head_at(g, b, 1, kh, hs);
    const size_t voff = head_at(g, b, 2, kh, hs);
    const size_t ooff = (size_t)b * T * C + (size_t)h * hs;
    const float *dO = x ? NULL : dout + ooff;                          // rows of stride C
    const float *L = lse + ((size_t)b * g->NH + h) * T;
    float P[AQ * AK], dS[AQ * AK], BT[AD * AK], Dv[AQ];
    /* f32: rows of stride R (q, k, v, their gradients) and C (out) */
    const float *Q = NULL, *K = NULL, *V = NULL, *O = NULL;
    float *dQ = NULL;
    size_t ldq = R, ldkv = R, ldo = C;                   /* strides of the tiles used below */
    float *qw = NULL, *ow = NULL, *kw = NULL, *vw = NULL, *dqw = NULL, *dow = NULL;
    size_t lddo = C;                                     /* dout's rows: stride C, or hs widened */
    if (x) {
        dqw = x->buf + 2 * (size_t)T * hs; qw = dqw + (size_t)AQ * hs; ow = qw + (size_t)AQ * hs;
        kw = ow + (size_t)AQ * hs; vw = kw + (size_t)AK * hs; dow = vw + (size_t)AK * hs;
        ldq = ldkv = ldo = lddo = (size_t)hs;
    } else {
        Q = qkv + qoff; K = qkv + koff; V = qkv + voff;
        dQ = dqkv + qoff;
        O = out + ooff;
        for (int t = 0; t < T; t++) {
            float *restrict row = dQ + (size_t)t * R;
            int d = 0;
            for (; d + 8 <= hs; d += 8) _mm256_storeu_ps(row + d, _mm256_setzero_ps());
            for (; d < hs; d++) row[d] = 0.0f;
        }
    }
    for (int q0 = 0; q0 < T; q0 += AQ) {
        const int nq = T - q0 < AQ ? T - q0 : AQ;
        const int qlast = q0 + nq - 1;
        const float *Qt, *Ot, *dOt;
        float *dQt;
        if (x) {
            widen_rows(qw, x->qkv + qoff + (size_t)q0 * R, R, nq, hs);
            widen_rows(ow, x->out + ooff + (size_t)q0 * C, C, nq, hs);
            widen_rows(dow, x->dout + ooff + (size_t)q0 * C, C, nq, hs);
            memset(dqw, 0, (size_t)nq * hs * sizeof(float));
            Qt = qw; Ot = ow; dQt = dqw; dOt = dow;
        } else {
            Qt = Q + (size_t)q0 * R; Ot = O + (size_t)q0 * C; dQt = dQ + (size_t)q0 * R;
            dOt = dO + (size_t)q0 * C;
        }
        for (int i = 0; i < nq; i++)
            Dv[i] = dot_lanes(dOt + (size_t)i * lddo, Ot + (size_t)i * ldo, hs);
        for (int k0 = first_tile(q0, g->W); k0 <= qlast; k0 += AK) {
            int nk = qlast + 1 - k0 < AK ? qlast + 1 - k0 : AK;
            const float *Kt, *Vt;
            if (x) {
                widen_rows(kw, x->qkv + koff + (size_t)k0 * R, R, nk, hs);
                widen_rows(vw, x->qkv + voff + (size_t)k0 * R, R, nk, hs);
                Kt = kw; Vt = vw;
            } else {
                Kt = K + (size_t)k0 * R; Vt = V + (size_t)k0 * R;
            }
            qk_tile(gemm_acc, P, Qt, ldq, nq, Kt, ldkv, nk, hs, BT);
            qk_tile(gemm_acc, dS, dOt, lddo, nq, Vt, ldkv, nk, hs, BT);
            for (int i = 0; i < nq; i++) {
                int jn = q0 + i - k0 + 1, j0 = win_lo(q0 + i, g->W) - k0;
                jn = jn < 0 ? 0 : (jn > nk ? nk : jn);
                float Li = L[q0 + i], Di = Dv[i];
                float *restrict p = P + i * AK;
                float *restrict ds = dS + i * AK;
                for (int j = 0; j < AK; j++) {
                    float pj = keep_or(j >= j0 && j < jn, exp_nonpos(p[j] * scale - Li), 0.0f);
                    p[j] = pj;
                    ds[j] = pj * (ds[j] - Di) * scale;   /* dS = P (dP - D), scaled */
                }
            }
            /* dV_j += sum_i P_ij dO_i;  dK_j += sum_i dS_ij Q_i  (i ascending),
             * through an AD-wide local accumulator: a dqkv row updated in
             * place would make each step wait on the previous step's store. */
            gemm_acc(dV + (size_t)k0 * ld, ld, P, 1, AK, dOt, lddo,
                     nk, hs, nq, 2, k0 - q0);
            gemm_acc(dK + (size_t)k0 * ld, ld, dS, 1, AK, Qt, ldq,
                     nk, hs, nq, 2, k0 - q0);
            /* dQ_i += sum_j dS_ij K_j  (j ascending) */
            gemm_acc(dQt, ldq, dS, AK, 1, Kt, ldkv,
                     nq, hs, nk, 1, q0 - k0);
        }
        if (x) round_rows(x->dqkv + qoff + (size_t)q0 * R, R, dqw, nq, hs);
    }
}

/* One backward task: kv head kh of batch b and the query heads reading it
 * (ascending), so dK and dV of the kv head gather every term in one fixed
 * order -- query heads ascending, query tiles in order inside -- with no
 * atomics; each dQ has one owner. NKV = NH: one query head a task. */
static inline void attn_bwd_group(gemm_acc_fn gemm_acc, float *dqkv, const float *dout, const float *qkv,
                                  const float *out, const float *lse, int b, int kh, const geo *g,
                                  int hs, const io16 *x) {
    const int T = g->T, G = g->NH / g->NKV;
    float *dK, *dV;
    size_t ld;
    if (x) {
        dK = x->buf; dV = dK + (size_t)T * hs; ld = (size_t)hs;
        memset(dK, 0, 2 * (size_t)T * hs * sizeof(float));
    } else {
        dK = dqkv + head_at(g, b, 1, kh, hs); dV = dqkv + head_at(g, b, 2, kh, hs); ld = g->R;
        for (int t = 0; t < T; t++) {
            float *restrict rk = dK + (size_t)t * ld, *restrict rv = dV + (size_t)t * ld;
            int d = 0;
            for (; d + 8 <= hs; d += 8) {
                _mm256_storeu_ps(rk + d, _mm256_setzero_ps());
                _mm256_storeu_ps(rv + d, _mm256_setzero_ps());
            }
            for (; d < hs; d++) rk[d] = rv[d] = 0.0f;
        }
    }
    for (int h = kh * G; h < (kh + 1) * G; h++)
        attn_bwd_qhead(gemm_acc, dqkv, dout, qkv, out, lse, dK, dV, ld, b, h, g, hs, x);
    if (x) {
        round_rows(x->dqkv + head_at(g, b, 1, kh, hs), g->R, dK, T, hs);
        round_rows(x->dqkv + head_at(g, b, 2, kh, hs), g->R, dV, T, hs);
    }
}

void zk_attention_backward_gqa(float *dqkv, const float *dout, const float *qkv,
                               const float *out, const float *lse,
                               int B, int T, int C, int NH, int NKV, int W) {
    const gemm_acc_fn gemm = pick_gemm_acc();
    const geo g = mk_geo(T, C, NH, NKV, W);
    const int hs = C / NH;
    #pragma omp parallel for schedule(dynamic, 1) if ((long)B * T * C >= 16384)
    for (int bk = 0; bk < B * NKV; bk++) {
        int b = bk / NKV, kh = bk % NKV;
        if (hs == 64)
            attn_bwd_group(gemm, dqkv, dout, qkv, out, lse, b, kh, &g, 64, NULL);
        else
            attn_bwd_group(gemm, dqkv, dout, qkv, out, lse, b, kh, &g, hs, NULL);
    }
}

void zk_attention_backward(float *dqkv, const float *dout, const float *qkv,
                           const float *out, const float *lse, int B, int T, int C, int NH) {
    zk_attention_backward_gqa(dqkv, dout, qkv, out, lse, B, T, C, NH, NH, 0);
}

/* The bf16-I/O backward: each thread's f32 buffer on the heap (a kv head's
 * dK and dV, 2 T hs floats). -1 if it cannot be had. */
int zk_attention_backward_gqa_bb(uint16_t *dqkv, const uint16_t *dout, const uint16_t *qkv,
                                 const uint16_t *out, const float *lse,
                                 int B, int T, int C, int NH, int NKV, int W) {
    const gemm_acc_fn gemm = pick_gemm_acc();
    const geo g = mk_geo(T, C, NH, NKV, W);
    const int hs = C / NH;
    int failed = 0;
    #pragma omp parallel if ((long)B * T * C >= 16384)
    {
        io16 x = { dqkv, qkv, out, dout, malloc(bwd16_floats(T, hs) * sizeof(float)) };
        if (!x.buf) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int bk = 0; bk < B * NKV; bk++) {
            if (!x.buf) continue;
            int b = bk / NKV, kh = bk % NKV;
            if (hs == 64)
                attn_bwd_group(gemm, NULL, NULL, NULL, NULL, lse, b, kh, &g, 64, &x);
            else
                attn_bwd_group(gemm, NULL, NULL, NULL, NULL, lse, b, kh, &g, hs, &x);
        }
        free(x.buf);
    }
    return failed ? -1 : 0;
}

int zk_attention_backward_bb(uint16_t *dqkv, const uint16_t *dout, const uint16_t *qkv,
                             const uint16_t *out, const float *lse, int B, int T, int C, int NH) {
    return zk_attention_backward_gqa_bb(dqkv, dout, qkv, out, lse, B, T, C, NH, NH, 0);
}
