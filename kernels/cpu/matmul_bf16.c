/*
 * matmul_bf16.c -- linear layer on bf16 operands with fp32 accumulation.
 *
 * The arithmetic is VDPBF16PS's (AVX512_BF16), defined exactly so that a
 * portable path gives the same bits on any CPU:
 *
 *   dot(x, y) over K bf16 pairs: K is padded with one +0 to an even length;
 *   acc = +0; for each pair p: acc = S(acc, x[2p+1], y[2p+1]);
 *                              acc = S(acc, x[2p],   y[2p]);
 *   S(c, a, b) = a*b + c as ONE fp32 fused multiply-add rounded to nearest
 *   even, with denormal inputs read as zero (DAZ) and a result that is tiny
 *   after rounding (below 2^-126 when rounded to 24 bits with an unbounded
 *   exponent) flushed to a zero of its sign (FTZ); MXCSR is neither read nor
 *   written. NaN: a's NaN quieted, else b's, else c's, else (inf*0, inf-inf)
 *   the default NaN 0xffc00000.
 *
 * That is Intel's pseudo-code for VDPBF16PS (two FMAs per lane, the odd
 * element first), checked on this machine against the instruction on 20M
 * random operands, every special value (zeros, infinities, NaN payloads,
 * denormals) and 2000 operands built to land on the FTZ boundary, where a
 * plain fmaf + flush differs. a is always the LEFT matrix's element (the
 * NaN order depends on it).
 *
 * Every output element is this one sequential chain over k, stored and
 * reloaded as fp32 between K blocks, so its bits do not depend on the
 * blocking, the thread count or the split of the work: nothing is summed
 * in a different order anywhere. Two paths compute it:
 *   - AVX512_BF16 (vdpbf16ps), chosen at run time where the CPU has it;
 *   - a portable C micro-kernel (the same packed operands, the chain above
 *     in C), elsewhere.
 * spec/c/test_matmul_bf16.c checks both against a naive loop of S, bit for
 * bit, and against a double-precision reference.
 *
 * Speed (tools/bench_bf16.c; docs/performance.md has the sittings). On the
 * Xeon this was first written on, vdpbf16ps retired one instruction per ~2
 * cycles (~115 GFLOP/s a core) against two vfmadd231ps zmm per cycle, so
 * this GEMM (~90 GFLOP/s a core) could not beat OpenBLAS's sgemm there. On
 * the AMD EPYC development machine (AVX512_BF16, no AMX) vdpbf16ps runs at
 * twice the fp32 FMA rate: this GEMM reaches 547-697 GFLOP/s on 2 threads
 * at GPT-2's shapes, 1.5-1.8x ztrain's fp32 GEMM; the micro-kernel alone
 * runs at its register-only peak, the rest goes to C-tile traffic and
 * packing. It halves the operand bytes either way. The portable path runs
 * ~2.7 GFLOP/s (a correctness fallback).
 *
 * AMX (tdpbf16ps, ~3.4 TFLOP/s a core, register-only) sums differently:
 * two lanes of 16 steps per 32-deep chunk, then two adds (matmul_amx.c
 * states it, measured). Where the CPU and the kernel allow AMX, the GEMMs
 * go there instead (matmul_amx.c): bits of their own, not this chain's,
 * the same on any thread count and blocking. The path is chosen once per
 * process (zk_bf16_simd; ZTRAIN_BF16_GEMM overrides) and named by
 * zk_bf16_info, which also says why AMX is not used where it is not.
 *
 * Layout (Goto/BLIS): C (M,N) = A (M,K) B (K,N). Operands are packed into
 * dwords holding a k pair (low half k = 2p, high half 2p+1), as vdpbf16ps
 * reads them: A blocks of MC rows x KC into [sliver][p][MR], B slivers of
 * KC x NR into [p][NR], both on the stack (48 + 8 KiB). A task is one
 * MC x NC block of C; OpenMP spreads the tasks. Packing is ~10% of the time
 * (each B sliver is packed once per MC rows, each A block once per NC
 * columns); the micro-kernel runs at ~90% of the vdpbf16ps peak.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BF_HAVE_X86 1
#endif

#define BF_MR 12     /* rows of C per micro-kernel call                     */
#define BF_NR 32     /* columns of C per micro-kernel call (two zmm)        */
#define BF_KC 128    /* k per packed block (even: pairs never straddle)     */
#define BF_MC 192    /* rows per task (multiple of MR)                      */
#define BF_NC 1024   /* columns per task (multiple of NR)                   */
#define BF_COL_CHUNK 64

/* A bf16 matrix seen as (R, K): element (r, k) at p[r*rs + k*ks]. Both the
 * left operand A (R = M) and the transposed right operand B^T (R = N) use it. */
typedef struct { const uint16_t *p; long rs, ks; } bf_view;

static inline uint16_t at(bf_view v, long r, long k) { return v.p[r * v.rs + k * v.ks]; }

/* dst[p][R] for the pairs of k in [k0, k0+kl), rows [r0, r0+rn) of v; rows
 * rn..R-1 and k >= K are zero. A dword holds k = 2p (low) and 2p+1 (high). */
static void pack(uint32_t *restrict dst, bf_view v, long r0, int rn, int R,
                 long k0, int kl, long K) {
    int np = (kl + 1) / 2;
    int full = (int)((K - k0) / 2 < np ? (K - k0) / 2 : np);   /* pairs with both k < K */
    if (rn < R || full < np) memset(dst, 0, sizeof(uint32_t) * (size_t)np * R);
    if (v.ks == 1) {            /* pairs contiguous in a row: a dword transpose */
        for (int r = 0; r < rn; r++) {
            const uint16_t *row = v.p + (r0 + r) * v.rs + k0;
            for (int q = 0; q < full; q++) {
                uint32_t d;
                memcpy(&d, row + 2 * q, 4);
                dst[(size_t)q * R + r] = d;
            }
        }
    } else if (v.rs == 1) {     /* rows contiguous: interleave two k rows */
        for (int q = 0; q < full; q++) {
            const uint16_t *lo = v.p + (k0 + 2 * q) * v.ks + r0, *hi = lo + v.ks;
            uint32_t *restrict d = dst + (size_t)q * R;
            for (int r = 0; r < rn; r++) d[r] = (uint32_t)lo[r] | (uint32_t)hi[r] << 16;
        }
    } else {
        for (int q = 0; q < full; q++)
            for (int r = 0; r < rn; r++)
                dst[(size_t)q * R + r] = (uint32_t)at(v, r0 + r, k0 + 2 * q) |
                                         (uint32_t)at(v, r0 + r, k0 + 2 * q + 1) << 16;
    }
    if (full < np)              /* odd K: the last pair's high half is the +0 pad */
        for (int r = 0; r < rn; r++)
            dst[(size_t)full * R + r] = at(v, r0 + r, K - 1);
}

/* ---- the portable step: one VDPBF16PS lane FMA, bit for bit ------------- */
static inline uint32_t f2u(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float u2f(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* Branch-free (selects only), so the portable micro-kernel's column loop
 * vectorizes: a vector fmaf rounds exactly as the scalar one, and every NaN
 * and flush is decided here by selects, not by the FMA unit. */
static inline float bf_step(float c, float a, float b) {
    uint32_t ua = f2u(a), ub = f2u(b), uc = f2u(c);
    /* DAZ: a denormal (exponent 0) input reads as a zero of its sign */
    ua = (ua & 0x7f800000u) ? ua : ua & 0x80000000u;
    ub = (ub & 0x7f800000u) ? ub : ub & 0x80000000u;
    uc = (uc & 0x7f800000u) ? uc : uc & 0x80000000u;
    float ad = u2f(ua), bd = u2f(ub), cd = u2f(uc);
    uint32_t ur = f2u(fmaf(ad, bd, cd)), mag = ur & 0x7fffffffu, sign = ur & 0x80000000u;
    /* fmaf rounds with gradual underflow; the instruction detects tininess
     * after rounding to 24 bits with an unbounded exponent. The two differ
     * only for a result of 2^-126: redo it scaled by 2^64, where nothing is
     * tiny (a result of 2^-126 implies |a|, |b| < 2^25: no overflow). */
    float rs = fmaf(ad * 0x1p32f, bd * 0x1p32f, cd * 0x1p64f);
    uint32_t tiny = (mag < 0x00800000u) |
                    ((mag == 0x00800000u) & ((f2u(rs) & 0x7fffffffu) < 0x20800000u));
    ur = tiny ? sign : ur;                                          /* FTZ */
    /* NaN: a's quieted, else b's, else c's, else the default NaN */
    uint32_t na = (ua & 0x7fffffffu) > 0x7f800000u, nb = (ub & 0x7fffffffu) > 0x7f800000u;
    uint32_t nc = (uc & 0x7fffffffu) > 0x7f800000u, nr = mag > 0x7f800000u;
    ur = nr ? 0xffc00000u : ur;
    ur = nc ? uc | 0x00400000u : ur;
    ur = nb ? ub | 0x00400000u : ur;
    ur = na ? ua | 0x00400000u : ur;
    return u2f(ur);
}

/* out = dot + bias, one fp32 add; a NaN dot stays itself (x86 keeps the
 * first operand's NaN; said here so that no compiler operand swap and no
 * other CPU's default NaN changes the bits). */
static inline float bf_add_bias(float acc, float b) {
    uint32_t ua = f2u(acc), ub = f2u(b);
    if ((ua & 0x7fffffffu) > 0x7f800000u) return acc;
    if ((ub & 0x7fffffffu) > 0x7f800000u) return u2f(ub | 0x00400000u);
    float r = acc + b;
    return r != r ? u2f(0xffc00000u) : r;
}

static inline float bf_lo(uint32_t d) { return u2f(d << 16); }
static inline float bf_hi(uint32_t d) { return u2f(d & 0xffff0000u); }

/* C tile (mr, nr) of rows ldc apart: first ? start at +0 : continue from C;
 * bias (nr) is added once the chain is complete (bias != NULL only then). */
typedef void (*ukr_fn)(int np, const uint32_t *pa, const uint32_t *pb, float *c,
                       long ldc, int mr, int nr, int first, const float *bias);

static void ukr_portable(int np, const uint32_t *restrict pa, const uint32_t *restrict pb,
                         float *c, long ldc, int mr, int nr, int first, const float *bias) {
    float acc[BF_MR][BF_NR];
    for (int i = 0; i < BF_MR; i++)
        for (int j = 0; j < BF_NR; j++)
            acc[i][j] = (first || i >= mr || j >= nr) ? 0.0f : c[i * ldc + j];
    for (int q = 0; q < np; q++) {      /* padded rows and columns are zeros */
        const uint32_t *a = pa + (size_t)q * BF_MR, *b = pb + (size_t)q * BF_NR;
        for (int i = 0; i < BF_MR; i++) {
            float ah = bf_hi(a[i]), al = bf_lo(a[i]);
            for (int j = 0; j < BF_NR; j++)
                acc[i][j] = bf_step(bf_step(acc[i][j], ah, bf_hi(b[j])), al, bf_lo(b[j]));
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            c[i * ldc + j] = bias ? bf_add_bias(acc[i][j], bias[j]) : acc[i][j];
}

#ifdef BF_HAVE_X86
#define BF_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

BF_AVX512
static void ukr_avx512(int np, const uint32_t *restrict pa, const uint32_t *restrict pb,
                       float *c, long ldc, int mr, int nr, int first, const float *bias) {
    __m512 acc0[BF_MR], acc1[BF_MR];
    __mmask16 k0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
    __mmask16 k1 = nr >= 32 ? 0xffff : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1) : 0;
    #pragma GCC unroll 12
    for (int i = 0; i < BF_MR; i++) {
        if (first || i >= mr) {
            acc0[i] = _mm512_setzero_ps();
            acc1[i] = _mm512_setzero_ps();
        } else {
            acc0[i] = _mm512_maskz_loadu_ps(k0, c + i * ldc);
            acc1[i] = _mm512_maskz_loadu_ps(k1, c + i * ldc + 16);
        }
    }
    for (int q = 0; q < np; q++) {
        const uint32_t *a = pa + (size_t)q * BF_MR;
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(pb + (size_t)q * BF_NR);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(pb + (size_t)q * BF_NR + 16);
        #pragma GCC unroll 12
        for (int i = 0; i < BF_MR; i++) {
            __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i]);
            acc0[i] = _mm512_dpbf16_ps(acc0[i], ai, b0);   /* a = left matrix: NaN order */
            acc1[i] = _mm512_dpbf16_ps(acc1[i], ai, b1);
        }
    }
    __m512 bias0 = bias ? _mm512_maskz_loadu_ps(k0, bias) : _mm512_setzero_ps();
    __m512 bias1 = bias ? _mm512_maskz_loadu_ps(k1, bias + 16) : _mm512_setzero_ps();
    #pragma GCC unroll 12
    for (int i = 0; i < BF_MR; i++) {
        if (i >= mr) break;
        __m512 o0 = acc0[i], o1 = acc1[i];
        if (bias) {     /* as bf_add_bias: a NaN dot stays itself */
            o0 = _mm512_mask_mov_ps(_mm512_add_ps(o0, bias0),
                                    _mm512_cmp_ps_mask(o0, o0, _CMP_UNORD_Q), o0);
            o1 = _mm512_mask_mov_ps(_mm512_add_ps(o1, bias1),
                                    _mm512_cmp_ps_mask(o1, o1, _CMP_UNORD_Q), o1);
        }
        _mm512_mask_storeu_ps(c + i * ldc, k0, o0);
        _mm512_mask_storeu_ps(c + i * ldc + 16, k1, o1);
    }
}

static int cpu_has_bf16(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}
#else
static int cpu_has_bf16(void) { return 0; }
#define ukr_avx512 ukr_portable
#endif

/* -1: not decided yet; 0: portable; 1: AVX512_BF16; 2: AMX. */
static int bf_simd = -1;

/* What the process may use, probed once (pthread_once: the AMX probe asks
 * the kernel for the tile state and runs a self-test): AMX's verdict, the
 * ZTRAIN_BF16_GEMM override, and each path's line for zk_bf16_info. */
static pthread_once_t bf_once = PTHREAD_ONCE_INIT;
static int bf_amx_ok, bf_has_bf16, bf_env = -1;
static char bf_info[3][400];

static void bf_probe(void) {
    char why[200];
    bf_has_bf16 = cpu_has_bf16();
    bf_amx_ok = zk_amx_enable(why, sizeof why);
    const char *e = getenv("ZTRAIN_BF16_GEMM"), *note = "";
    if (e && *e) {
        if (!strcmp(e, "amx")) bf_env = 2;
        else if (!strcmp(e, "avx512_bf16")) bf_env = 1;
        else if (!strcmp(e, "portable")) bf_env = 0;
        else note = " (ZTRAIN_BF16_GEMM not understood: say amx, avx512_bf16 or portable)";
    }
    char amx[260];
    if (bf_amx_ok) snprintf(amx, sizeof amx, "%s", bf_env >= 0 && bf_env < 2 ?
                            "; AMX usable, not chosen (ZTRAIN_BF16_GEMM)" : "");
    else snprintf(amx, sizeof amx, "; AMX not used: %s", why);
    snprintf(bf_info[0], sizeof bf_info[0], "portable C (the VDPBF16PS chain, much slower)%s%s",
             amx, note);
    snprintf(bf_info[1], sizeof bf_info[1], "AVX512_BF16 (vdpbf16ps)%s%s", amx, note);
    snprintf(bf_info[2], sizeof bf_info[2], "AMX (tdpbf16ps; its own bits, see kernels.h)%s", note);
}

int zk_bf16_simd(int mode) {
    int v = __atomic_load_n(&bf_simd, __ATOMIC_RELAXED);
    if (mode >= 0 || v < 0) {   /* racing first calls store the same value */
        pthread_once(&bf_once, bf_probe);
        int want = mode >= 0 ? mode : bf_env >= 0 ? bf_env : 2;
        v = want >= 2 && bf_amx_ok ? 2 : want >= 1 && bf_has_bf16 ? 1 : 0;
        __atomic_store_n(&bf_simd, v, __ATOMIC_RELAXED);
    }
    return v;
}

const char *zk_bf16_info(void) {
    return bf_info[zk_bf16_simd(-1)];
}

/* C (M,N) fp32, rows ldc apart, WRITTEN = A (M,K) B (K,N) (+ bias (N)),
 * where A is a (M, K) view and Bt a (N, K) view of B^T. */
static void gemm_bf16(float *C, long ldc, bf_view A, bf_view Bt, const float *bias,
                      int M, int N, int K) {
    int path = zk_bf16_simd(-1);
    ukr_fn ukr = path ? ukr_avx512 : ukr_portable;
    int mt = (M + BF_MC - 1) / BF_MC, nt = (N + BF_NC - 1) / BF_NC;
    if (K == 0) {   /* an empty sum: +0, plus the bias (on every path) */
        #pragma omp parallel for schedule(static) if ((long)M * N >= 65536)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) C[m * ldc + n] = bias ? bf_add_bias(0.0f, bias[n]) : 0.0f;
        return;
    }
    if (path == 2) {
        zk_amx_gemm(C, ldc, A.p, A.rs, A.ks, Bt.p, Bt.rs, Bt.ks, bias, M, N, K);
        return;
    }
    #pragma omp parallel for schedule(dynamic, 1) if (mt * nt > 1 && (long)M * N * K >= 1L << 20)
    for (int t = 0; t < mt * nt; t++) {
        uint32_t pa[BF_MC / 2 * BF_KC], pb[BF_KC / 2 * BF_NR];   /* 48 + 8 KiB */
        int m0 = (t / nt) * BF_MC, n0 = (t % nt) * BF_NC;
        int mc = M - m0 < BF_MC ? M - m0 : BF_MC, nc = N - n0 < BF_NC ? N - n0 : BF_NC;
        for (int k0 = 0; k0 < K; k0 += BF_KC) {
            int kl = K - k0 < BF_KC ? K - k0 : BF_KC, np = (kl + 1) / 2;
            int first = k0 == 0, last = k0 + kl == K;
            for (int i = 0; i < mc; i += BF_MR)
                pack(pa + (size_t)(i / BF_MR) * np * BF_MR, A, m0 + i,
                     mc - i < BF_MR ? mc - i : BF_MR, BF_MR, k0, kl, K);
            for (int j = 0; j < nc; j += BF_NR) {
                int nr = nc - j < BF_NR ? nc - j : BF_NR;
                pack(pb, Bt, n0 + j, nr, BF_NR, k0, kl, K);
                for (int i = 0; i < mc; i += BF_MR)
                    ukr(np, pa + (size_t)(i / BF_MR) * np * BF_MR, pb,
                        C + (long)(m0 + i) * ldc + n0 + j, ldc,
                        mc - i < BF_MR ? mc - i : BF_MR, nr, first,
                        last && bias ? bias + n0 + j : NULL);
            }
        }
    }
}

void zk_matmul_bf16_forward(float *out, const uint16_t *inp, const uint16_t *weight,
                            const float *bias, int N, int C, int OC, int ldo) {
    bf_view A = {inp, C, 1};        /* (N, C)                      */
    bf_view Bt = {weight, C, 1};    /* B^T = weight (OC, C)        */
    gemm_bf16(out, ldo, A, Bt, bias, N, OC, C);
}

/* bf16 output: C tiles of BF_OMC x BF_NR in fp32 on the stack, each the
 * fp32 kernel's chains (the K blocks in order: the same bits), then rounded
 * to bf16 once. A is packed again for each column sliver (~1/32 of the
 * micro-kernel's loads): the price of a tile that fits the stack. */
#define BF_OMC 96
static void gemm_bf16_out16(uint16_t *Cb, long ldc, bf_view A, bf_view Bt, const float *bias,
                            int M, int N, int K) {
    int path = zk_bf16_simd(-1);
    ukr_fn ukr = path ? ukr_avx512 : ukr_portable;
    int mt = (M + BF_OMC - 1) / BF_OMC, nt = (N + BF_NR - 1) / BF_NR;
    #pragma omp parallel for schedule(dynamic, 8) if (mt * nt > 1 && (long)M * N * K >= 1L << 20)
    for (int t = 0; t < mt * nt; t++) {
        uint32_t pa[BF_MR * BF_KC / 2], pb[BF_KC / 2 * BF_NR];    /* 3 + 8 KiB */
        float ct[BF_OMC * BF_NR];                                  /* 12 KiB */
        int m0 = (t % mt) * BF_OMC, n0 = (t / mt) * BF_NR;
        int mc = M - m0 < BF_OMC ? M - m0 : BF_OMC, nr = N - n0 < BF_NR ? N - n0 : BF_NR;
        if (K == 0) {
            for (int i = 0; i < mc * BF_NR; i++) ct[i] = 0.0f;
            if (bias)
                for (int i = 0; i < mc; i++)
                    for (int j = 0; j < nr; j++) ct[i * BF_NR + j] = bf_add_bias(0.0f, bias[n0 + j]);
        } else if (path == 2) {     /* AMX: its own chains, the same bits in any tile */
            bf_view a = {A.p + (long)m0 * A.rs, A.rs, A.ks}, b = {Bt.p + (long)n0 * Bt.rs, Bt.rs, Bt.ks};
            zk_amx_gemm(ct, BF_NR, a.p, a.rs, a.ks, b.p, b.rs, b.ks, bias ? bias + n0 : NULL,
                        mc, nr, K);
        } else {
            for (int k0 = 0; k0 < K; k0 += BF_KC) {
                int kl = K - k0 < BF_KC ? K - k0 : BF_KC, np = (kl + 1) / 2;
                int first = k0 == 0, last = k0 + kl == K;
                pack(pb, Bt, n0, nr, BF_NR, k0, kl, K);
                for (int i = 0; i < mc; i += BF_MR) {
                    int mr = mc - i < BF_MR ? mc - i : BF_MR;
                    pack(pa, A, m0 + i, mr, BF_MR, k0, kl, K);
                    ukr(np, pa, pb, ct + (long)i * BF_NR, BF_NR, mr, nr, first,
                        last && bias ? bias + n0 : NULL);
                }
            }
        }
        for (int i = 0; i < mc; i++)
            zk_cast_f32_bf16(Cb + (long)(m0 + i) * ldc + n0, ct + (long)i * BF_NR, (size_t)nr);
    }
}

void zk_matmul_bf16_forward_b16(uint16_t *out, const uint16_t *inp, const uint16_t *weight,
                                const float *bias, int N, int C, int OC, int ldo) {
    bf_view A = {inp, C, 1};
    bf_view Bt = {weight, C, 1};
    gemm_bf16_out16(out, ldo, A, Bt, bias, N, OC, C);
}

static void bwd_weights(float *dweight, float *dbias, const uint16_t *dout, const uint16_t *inp,
                        int N, int C, int OC, int ldo);

void zk_matmul_bf16_backward(float *dinp, float *dweight, float *dbias,
                             const uint16_t *dout, const uint16_t *inp,
                             const uint16_t *weight, int N, int C, int OC, int ldo) {
    if (dinp != NULL) {             /* (N,C) = dout (N,OC) @ weight (OC,C) */
        bf_view A = {dout, ldo, 1};
        bf_view Bt = {weight, 1, C};    /* B^T (C, OC): element (c, o) = weight[o][c] */
        gemm_bf16(dinp, C, A, Bt, NULL, N, C, OC);
    }
    bwd_weights(dweight, dbias, dout, inp, N, C, OC, ldo);
}

void zk_matmul_bf16_backward_b16(uint16_t *dinp, float *dweight, float *dbias,
                                 const uint16_t *dout, const uint16_t *inp,
                                 const uint16_t *weight, int N, int C, int OC, int ldo) {
    if (dinp != NULL) {             /* the f32 chains in tiles, each rounded once */
        bf_view A = {dout, ldo, 1};
        bf_view Bt = {weight, 1, C};
        gemm_bf16_out16(dinp, C, A, Bt, NULL, N, C, OC);
    }
    bwd_weights(dweight, dbias, dout, inp, N, C, OC, ldo);
}

/* AMX: its blocks' fp32 sums in a per-thread scratch, rounded as each
 * block is done; the other paths: gemm_bf16_out16's stack tiles (A, the
 * strided dout^T, packed again for each column sliver: slower, the same
 * bits) */
int zk_matmul_bf16_dweight_b16(uint16_t *dweight, const uint16_t *dout, const uint16_t *inp,
                               int N, int C, int OC, int ldo) {
    bf_view A = {dout, 1, ldo};     /* (OC, N): element (o, n) = dout[n][o] */
    bf_view Bt = {inp, 1, C};       /* (C, N):  element (c, n) = inp[n][c]  */
    if (N > 0 && zk_bf16_simd(-1) == 2)
        return zk_amx_gemm_b16(dweight, C, A.p, A.rs, A.ks, Bt.p, Bt.rs, Bt.ks, NULL, OC, C, N);
    gemm_bf16_out16(dweight, C, A, Bt, NULL, OC, C, N);
    return 0;
}

/* dweight (OC,C) and dbias (OC), both skipped when NULL */
static void bwd_weights(float *dweight, float *dbias, const uint16_t *dout, const uint16_t *inp,
                        int N, int C, int OC, int ldo) {
    if (dweight != NULL) {          /* (OC,C) = dout^T (OC,N) @ inp (N,C) */
        bf_view A = {dout, 1, ldo};     /* element (o, n) = dout[n][o] */
        bf_view Bt = {inp, 1, C};       /* element (c, n) = inp[n][c]  */
        gemm_bf16(dweight, C, A, Bt, NULL, OC, C, N);
    }
    if (dbias == NULL) return;
    int nchunk = (OC + BF_COL_CHUNK - 1) / BF_COL_CHUNK;
    #pragma omp parallel for schedule(static) if ((long)N * OC >= 65536)
    for (int k = 0; k < nchunk; k++) {
        int j0 = k * BF_COL_CHUNK, w = OC - j0 < BF_COL_CHUNK ? OC - j0 : BF_COL_CHUNK;
        double acc[BF_COL_CHUNK] = {0};
        for (int n = 0; n < N; n++) {
            const uint16_t *restrict d = dout + (size_t)n * ldo + j0;
            for (int j = 0; j < w; j++) acc[j] += (double)u2f((uint32_t)d[j] << 16);
        }
        for (int j = 0; j < w; j++) dbias[j0 + j] = (float)acc[j];
    }
}
