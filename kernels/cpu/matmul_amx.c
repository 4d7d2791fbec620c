/*
 * matmul_amx.c -- the bf16 GEMMs of matmul_bf16.c on AMX (TDPBF16PS), where
 * the CPU and the kernel allow it. matmul_bf16.c dispatches here; this file
 * knows nothing of the layer, only C (M,N) = A (M,K) B (K,N) (+ bias).
 *
 * The arithmetic (measured on this machine, kernels.h states it; the test
 * checks it against an independent model bit for bit). One TDPBF16PS does,
 * for each element of the 16x16 accumulator tile, with a[0..31] the row of
 * A and b[0..31] the column of B over its 32 k:
 *     e = +0, o = +0;
 *     for p = 0..15: e = S(e, a[2p], b[2p]);  o = S(o, a[2p+1], b[2p+1]);
 *     acc = ADD(acc, ADD(e, o));
 * S is VDPBF16PS's step (matmul_bf16.c: one fp32 FMA, RNE, DAZ, FTZ with
 * tininess after rounding, NaN: a's, b's, c's, else default), ADD an fp32
 * add with DAZ, FTZ and the first operand's NaN first. That is the newer
 * SDM pseudo-code (two lanes per dword, added after the loop), not the
 * older one (one chain over k) nor VDPBF16PS's, so the bits differ from
 * the AVX512_BF16 path's. Measured: 0 differences from this model on
 * 768,000 elements of random tiles mixing NaN payloads, infinities,
 * denormals and results near 2^-126, and on built cases that single out
 * the lane split, the order of the two final adds, FMA (not multiply then
 * add) in the lanes and tininess after rounding. An element's result
 * depends only on its accumulator, its A row and its B column: not on its
 * place in the tile, the tile's configured shape, or the other elements
 * (0 of 4000 moved or 1x1-configured elements differed).
 *
 * Hence the bits of this path: K is padded with +0 to a multiple of 32 and
 * every output element runs the chunks [0,32), [32,64), ... in order
 * through one accumulator starting at +0 (stored to C and reloaded between
 * K blocks: fp32, exact), then + bias in one fp32 add as matmul_bf16.c
 * does. Nothing depends on the blocking, the thread count, or which tile
 * an element falls in; test_matmul_bf16.c checks 1/2/3 threads, several
 * blockings (zk_amx_set_blocking) and shifted/cropped problems.
 *
 * Layout. All 8 tiles are 16 rows x 64 bytes; the micro-kernel computes a
 * 32x32 block of C in tiles 0-3 from two A tiles (4, 5: 16 rows x 32 k)
 * and two B tiles (6, 7: 16 k pairs x 16 columns, a dword = the pair,
 * low half k even, as VDPBF16PS reads them). B is packed per 32-column
 * strip of KC k: [chunk][tile][pair][column], 2 KiB a chunk. A is read
 * in place where its rows hold k contiguously (forward, dinp), otherwise
 * (dweight: A = dout^T) packed per block into [row][k]. Tails (rows past M,
 * columns past N, k past K) go through zero-padded copies and a 32x32
 * scratch block of C. Every buffer is on the stack (<= 52 KiB).
 *
 * Speed, one core of this machine (tools/bench_bf16.c, GPT-2 124M shapes,
 * page-aligned operands): ~800-1100 GFLOP/s forward and dinp, 430-800
 * dweight (lm_head 380-640), 4-6.5x fp32 sgemm over the three; 2 threads
 * 1.7-2.7x that. The register-only TDPBF16PS rate is ~3.4 TFLOP/s with
 * zero operands; a GEMM loop runs ~18% slower on random data than on
 * zeros (the unit's power draw depends on the data). What is left: a tile load from
 * L2 delivers ~57 B/cycle and a 2x2 step needs 32 B/cycle of A from L2
 * beside B from L1, so the kernel alone runs ~1700-1900 GFLOP/s; C is
 * written and re-read once per K block (RFO of fresh lines included) and
 * B is packed per task (10-15%, dweight's A and B 40%); the 64 KiB stack
 * limit (kernels.h) is what bounds KC and MC: with 256 KiB, dweight runs
 * ~1.3-1.6x faster. Tile rows that straddle cache lines (a base or row
 * stride not a multiple of 64 bytes) load at about half speed.
 *
 * Linux hands out the tile state only after arch_prctl(ARCH_REQ_XCOMP_PERM,
 * XFEATURE_XTILEDATA) (once per process); zk_amx_enable does it, with a
 * self-test of the arithmetic above, and says why when AMX is not usable.
 * Each thread loads the tile configuration at the start of a GEMM and
 * releases the tiles at its end (no tile state across calls, so a context
 * switch between GEMMs saves none).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels.h"

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#include <cpuid.h>
#include <unistd.h>
#include <sys/syscall.h>

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")))

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA  18

/* Default blocking (measured best of a small grid at GPT-2's shapes, all
 * within +-15%): forward/dinp read A in place, KC = 384 deep B strips of 24
 * KiB, A tails copied into 24 KiB, tasks of 512 x 256 (A block 384 KiB and
 * C block 512 KiB stay in L2); dweight packs A blocks of 128 x 128 (32 KiB)
 * with B strips of 8 KiB, tasks of 128 x 768. */
#define AMX_KC_DIRECT 384
#define AMX_MC_DIRECT 512
#define AMX_NC_DIRECT 256
#define AMX_KC_PACKED 128
#define AMX_MC_PACKED 128
#define AMX_NC_PACKED 768
#define AMX_BUF_BYTES (48 * 1024)

static int set_mc, set_nc, set_kc;     /* zk_amx_set_blocking; 0 = default */

/* ldtilecfg's 64-byte operand: palette 1, 8 tiles of 16 rows x 64 bytes.
 * static const: GCC does not see the instruction read a stack struct and
 * drops part of a memset (reserved bytes left as garbage fault). */
static const struct __attribute__((packed, aligned(64))) {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

/* ---- packing --------------------------------------------------------------- */

/* 16x16 dwords in r[16] transposed in place */
AMX_TARGET static inline void tr16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; i++) {
            t[h + i] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    }
}

static inline __mmask32 mask32(long n) {    /* the low n of 32 u16 lanes */
    return n >= 32 ? 0xffffffffu : n <= 0 ? 0 : (__mmask32)((1u << n) - 1);
}

/* u16 lanes of two rows interleaved: lo = (x0,y0,x1,y1,...,x15,y15), hi = lanes 16..31 */
AMX_TARGET static inline void zip16(__m512i x, __m512i y, __m512i *lo, __m512i *hi) {
    const __m512i il = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                        39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i ih = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24,
                                        55, 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
    *lo = _mm512_permutex2var_epi16(x, il, y);
    *hi = _mm512_permutex2var_epi16(x, ih, y);
}

/* A matrix seen as (R, K): element (r, k) at p[r*rs + k*ks]; ks == 1 or rs == 1. */
typedef struct { const uint16_t *p; long rs, ks; } amx_view;

/* B strip: columns [n0, n0+nn) (nn <= 32) of Bt (N, K), k in [k0, k0+kl),
 * into dst[q][t][p][c] dwords (chunk q of 32 k, tile t of 16 columns, pair
 * p, column c); columns past nn and k past kl are +0. */
AMX_TARGET static void pack_b(uint32_t *dst, amx_view Bt, long n0, int nn, long k0, int kl) {
    int nq = (kl + 31) / 32;
    if (Bt.ks == 1) {           /* a column's k pairs are contiguous: dword transpose */
        for (int q = 0; q < nq; q++)
            for (int t = 0; t < 2; t++) {
                __m512i r[16];
                __mmask32 m = mask32(kl - 32 * q);
                for (int c = 0; c < 16; c++) {
                    int col = 16 * t + c;
                    r[c] = col < nn ? _mm512_maskz_loadu_epi16(m, Bt.p + (n0 + col) * Bt.rs + k0 + 32 * q)
                                    : _mm512_setzero_si512();
                }
                tr16(r);
                uint32_t *d = dst + (size_t)(2 * q + t) * 256;
                for (int p = 0; p < 16; p++) _mm512_store_si512(d + 16 * p, r[p]);
            }
    } else {                    /* rows of k contiguous along n: interleave row pairs */
        __mmask32 m = mask32(nn);
        for (int q = 0; q < nq; q++)
            for (int p = 0; p < 16; p++) {
                int k = 32 * q + 2 * p;
                const uint16_t *row = Bt.p + (k0 + k) * Bt.ks + n0;
                __m512i x = k < kl ? _mm512_maskz_loadu_epi16(m, row) : _mm512_setzero_si512();
                __m512i y = k + 1 < kl ? _mm512_maskz_loadu_epi16(m, row + Bt.ks) : _mm512_setzero_si512();
                __m512i lo, hi;
                zip16(x, y, &lo, &hi);
                _mm512_store_si512(dst + (size_t)(2 * q) * 256 + 16 * p, lo);
                _mm512_store_si512(dst + (size_t)(2 * q + 1) * 256 + 16 * p, hi);
            }
    }
}

/* A rows [m0, m0+mm) x k [k0, k0+kl) into dst[r][ld] (r < mp, a multiple
 * of 16; ld = kl rounded up to 32); rows past mm and k past kl are +0. */
AMX_TARGET static void pack_a(uint16_t *dst, long ld, amx_view A, long m0, int mm, int mp,
                              long k0, int kl) {
    int nq = (kl + 31) / 32;
    if (A.ks == 1) {            /* rows of k: copy */
        for (int r = 0; r < mp; r++)
            for (int q = 0; q < nq; q++)
                _mm512_store_si512(dst + r * ld + 32 * q,
                                   r < mm ? _mm512_maskz_loadu_epi16(mask32(kl - 32 * q),
                                                                     A.p + (m0 + r) * A.rs + k0 + 32 * q)
                                          : _mm512_setzero_si512());
    } else {                    /* k rows along m: interleave pairs of k rows, then
                                 * transpose 16x16 dwords: rows of k pairs */
        for (int g = 0; g < mp; g += 32)
            for (int q = 0; q < nq; q++) {
                __m512i lo[16], hi[16];
                __mmask32 m = mask32(mm - g);
                for (int p = 0; p < 16; p++) {
                    int k = 32 * q + 2 * p;
                    const uint16_t *row = A.p + (k0 + k) * A.ks + m0 + g;
                    __m512i x = k < kl ? _mm512_maskz_loadu_epi16(m, row) : _mm512_setzero_si512();
                    __m512i y = k + 1 < kl ? _mm512_maskz_loadu_epi16(m, row + A.ks)
                                           : _mm512_setzero_si512();
                    zip16(x, y, &lo[p], &hi[p]);
                }
                tr16(lo);
                for (int r = 0; r < 16; r++) _mm512_store_si512(dst + (g + r) * ld + 32 * q, lo[r]);
                if (g + 16 < mp) {
                    tr16(hi);
                    for (int r = 0; r < 16; r++)
                        _mm512_store_si512(dst + (g + 16 + r) * ld + 32 * q, hi[r]);
                }
            }
    }
}

/* ---- the micro-kernel: C (32x32, rows ldc bytes apart) (+)= A B ------------- */
/* A: rows 0-15 at a, 16-31 at a + 16*lda, chunk q 64 bytes on; B: pack_b's. */
AMX_TARGET static void kern(int nq, const uint16_t *a, long lda, const uint32_t *b,
                            float *c, long ldc, int first) {
    if (first) {
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    } else {
        _tile_loadd(0, c, ldc);
        _tile_loadd(1, c + 16, ldc);
        _tile_loadd(2, (char *)c + 16 * ldc, ldc);
        _tile_loadd(3, (char *)c + 16 * ldc + 64, ldc);
    }
    const char *a1 = (const char *)a + 16 * lda;
    for (int q = 0; q < nq; q++) {
        _tile_loadd(4, (const char *)a + 64 * q, lda);
        _tile_loadd(6, b + (size_t)q * 512, 64);
        _tile_loadd(7, b + (size_t)q * 512 + 256, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(5, a1 + 64 * q, lda);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, ldc);
    _tile_stored(1, c + 16, ldc);
    _tile_stored(2, (char *)c + 16 * ldc, ldc);
    _tile_stored(3, (char *)c + 16 * ldc + 64, ldc);
}

/* c[r][0..nn) += bias for r < mm, a NaN sum staying itself (matmul_bf16.c's
 * bf_add_bias: the same one fp32 add on every path) */
AMX_TARGET static void add_bias(float *c, long ldc, const float *bias, int mm, int nn) {
    for (int h = 0; h < nn; h += 16) {
        __mmask16 k = nn - h >= 16 ? 0xffff : (__mmask16)((1u << (nn - h)) - 1);
        __m512 b = _mm512_maskz_loadu_ps(k, bias + h);
        for (int r = 0; r < mm; r++) {
            __m512 o = _mm512_maskz_loadu_ps(k, c + r * ldc + h);
            o = _mm512_mask_mov_ps(_mm512_add_ps(o, b), _mm512_cmp_ps_mask(o, o, _CMP_UNORD_Q), o);
            _mm512_mask_storeu_ps(c + r * ldc + h, k, o);
        }
    }
}

typedef struct {
    float *C; long ldc;
    amx_view A, Bt;
    const float *bias;
    int M, N, K, MC, NC, KC;
    uint16_t *C16;      /* zk_amx_gemm_b16: the bf16 out (C unused) */
} amx_gemm;

/* one MC x NC block of C over all of K, into c (element (m0, n0) of the
 * block's fp32 home, rows ldc apart: C itself, or a bf16 out's scratch) */
AMX_TARGET static void task(const amx_gemm *g, int m0, int mc, int n0, int nc, float *cb,
                            long ldc) {
    /* B strip (KC/32 x 2 KiB) | A block or tail rows | C scratch (4 KiB) */
    uint8_t buf[AMX_BUF_BYTES] __attribute__((aligned(64)));
    float cs[32 * 32] __attribute__((aligned(64)));
    int direct = g->A.ks == 1, KC = g->KC;
    uint32_t *bp = (uint32_t *)buf;
    uint16_t *ap = (uint16_t *)(buf + (size_t)KC * 64);
    for (int k0 = 0; k0 < g->K; k0 += KC) {
        int kl = g->K - k0 < KC ? g->K - k0 : KC, nq = (kl + 31) / 32;
        long ld = 32L * nq;
        int first = k0 == 0, last = k0 + kl == g->K;
        if (!direct) pack_a(ap, ld, g->A, m0, mc, (mc + 31) & ~31, k0, kl);
        for (int j = 0; j < nc; j += 32) {
            int nn = nc - j < 32 ? nc - j : 32;
            pack_b(bp, g->Bt, n0 + j, nn, k0, kl);
            for (int i = 0; i < mc; i += 32) {
                int mm = mc - i < 32 ? mc - i : 32;
                const uint16_t *a;
                long lda;
                if (!direct) {
                    a = ap + i * ld; lda = ld * 2;
                } else if (mm == 32 && kl % 32 == 0) {     /* A in place */
                    a = g->A.p + (m0 + i) * g->A.rs + k0; lda = g->A.rs * 2;
                } else {                                    /* a tail: zero-padded copy */
                    pack_a(ap, ld, g->A, m0 + i, mm, 32, k0, kl);
                    a = ap; lda = ld * 2;
                }
                float *c = cb + (long)i * ldc + j;
                if (mm == 32 && nn == 32) {
                    kern(nq, a, lda, bp, c, ldc * 4, first);
                    if (last && g->bias) add_bias(c, ldc, g->bias + n0 + j, 32, 32);
                } else {            /* a partial block through the scratch */
                    if (!first)
                        for (int r = 0; r < mm; r++) memcpy(cs + 32 * r, c + r * ldc, nn * 4);
                    kern(nq, a, lda, bp, cs, 128, first);
                    if (last && g->bias) add_bias(cs, 32, g->bias + n0 + j, mm, nn);
                    for (int r = 0; r < mm; r++) memcpy(c + r * ldc, cs + 32 * r, nn * 4);
                }
            }
        }
    }
}

/* A bf16 out (g->C16): each task's block in an fp32 scratch of its
 * thread's (MC x NC, <= 512 KiB: L2-sized), rounded once into C16 when its
 * last K block is done, so the fp32 result never goes to memory (a weight
 * gradient written as a bf16 run stores it: no fp32 image and no cast
 * pass over it). The same chains: each element's bits are the fp32 out's,
 * rounded to nearest even. Returns 0, or -1 when a thread's scratch
 * could not be allocated (C16 then holds only some blocks). */
AMX_TARGET static int run(const amx_gemm *g) {
    int mt = (g->M + g->MC - 1) / g->MC, nt = (g->N + g->NC - 1) / g->NC, failed = 0;
    #pragma omp parallel if (mt * nt > 1 && (long)g->M * g->N * g->K >= 1L << 20)
    {
        float *scr = NULL;
        if (g->C16) {
            scr = aligned_alloc(64, (size_t)g->MC * g->NC * sizeof(float));
            if (!scr) {
                #pragma omp atomic write
                failed = 1;
            }
        }
        _tile_loadconfig(&amx_cfg);
        #pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < mt * nt; t++) {
            int m0 = (t / nt) * g->MC, n0 = (t % nt) * g->NC;
            int mc = g->M - m0 < g->MC ? g->M - m0 : g->MC, nc = g->N - n0 < g->NC ? g->N - n0 : g->NC;
            if (!g->C16) {
                task(g, m0, mc, n0, nc, g->C + (long)m0 * g->ldc + n0, g->ldc);
            } else if (scr) {
                task(g, m0, mc, n0, nc, scr, g->NC);
                for (int r = 0; r < mc; r++)
                    zk_cast_f32_bf16(g->C16 + (long)(m0 + r) * g->ldc + n0, scr + (long)r * g->NC,
                                     (size_t)nc);
            }
        }
        _tile_release();
        free(scr);
    }
    return failed ? -1 : 0;
}

static void blocking(amx_gemm *g) {
    int direct = g->A.ks == 1;
    g->KC = set_kc ? set_kc : direct ? AMX_KC_DIRECT : AMX_KC_PACKED;
    g->MC = set_mc ? set_mc : direct ? AMX_MC_DIRECT : AMX_MC_PACKED;
    g->NC = set_nc ? set_nc : direct ? AMX_NC_DIRECT : AMX_NC_PACKED;
}

void zk_amx_gemm(float *C, long ldc, const uint16_t *a, long a_rs, long a_ks,
                 const uint16_t *bt, long bt_rs, long bt_ks, const float *bias,
                 int M, int N, int K) {
    amx_gemm g = {C, ldc, {a, a_rs, a_ks}, {bt, bt_rs, bt_ks}, bias, M, N, K, 0, 0, 0, NULL};
    blocking(&g);
    run(&g);
}

int zk_amx_gemm_b16(uint16_t *C16, long ldc, const uint16_t *a, long a_rs, long a_ks,
                    const uint16_t *bt, long bt_rs, long bt_ks, const float *bias,
                    int M, int N, int K) {
    amx_gemm g = {NULL, ldc, {a, a_rs, a_ks}, {bt, bt_rs, bt_ks}, bias, M, N, K, 0, 0, 0, C16};
    blocking(&g);
    return run(&g);
}

int zk_amx_set_blocking(int mc, int nc, int kc) {
    int ok = (mc == 0 || (mc > 0 && mc % 32 == 0)) && (nc == 0 || (nc > 0 && nc % 32 == 0)) &&
             (kc == 0 || (kc > 0 && kc % 32 == 0));
    /* the buffers: B strip KC*64 bytes + A (direct: 32 rows, packed: MC rows) */
    int kcd = kc ? kc : AMX_KC_DIRECT, kcp = kc ? kc : AMX_KC_PACKED, mcp = mc ? mc : AMX_MC_PACKED;
    if (!ok || kcd * 64 + 32 * kcd * 2 > AMX_BUF_BYTES || kcp * 64 + mcp * kcp * 2 > AMX_BUF_BYTES)
        return -1;
    set_mc = mc; set_nc = nc; set_kc = kc;
    return 0;
}

/* ---- can this process use AMX? ------------------------------------------ */

/* a TDPBF16PS on built operands whose results single out the arithmetic
 * kernels.h states (the lane split, the order of the adds); 0 if it holds */
AMX_TARGET static int self_test(void) {
    static const float want[4] = {0.0f, 1.0f, 0.0f, 3.0f};
    uint16_t a[16 * 32] __attribute__((aligned(64))) = {0};
    uint32_t b[16 * 16] __attribute__((aligned(64))) = {0};
    float c[16 * 16] __attribute__((aligned(64))) = {0};
    for (int i = 0; i < 4; i++) b[i * 16] = 0x3f803f80u;       /* column 0: ones at k 0..7 */
    /* row 0: even lane 2^24, 1, -2^24 in order: a chain over the lane loses the 1 */
    a[0] = 0x4b80; a[2] = 0x3f80; a[4] = 0xcb80;
    /* row 1: even lane 2^24, -2^24, 1: the 1 survives */
    a[32 + 0] = 0x4b80; a[32 + 2] = 0xcb80; a[32 + 4] = 0x3f80;
    /* row 2: acc -2^24, e = 2^24, o = 1: acc + (e + o) = 0; (acc + e) + o = 1 */
    c[2 * 16] = -0x1p24f; a[64 + 0] = 0x4b80; a[64 + 1] = 0x3f80;
    /* row 3: 1 + 2 in the odd lane, acc 0 */
    a[96 + 1] = 0x3f80; a[96 + 3] = 0x4000;
    _tile_loadconfig(&amx_cfg);
    _tile_loadd(0, c, 64);
    _tile_loadd(4, a, 64);
    _tile_loadd(6, b, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_stored(0, c, 64);
    _tile_release();
    for (int i = 0; i < 4; i++)
        if (memcmp(&c[i * 16], &want[i], 4) != 0) return -1;
    return 0;
}

int zk_amx_enable(char *why, size_t n) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) {
        snprintf(why, n, "the CPU has no AMX-TILE/AMX-BF16");
        return 0;
    }
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl")) {
        snprintf(why, n, "the CPU has AMX but not AVX-512F/BW/VL (used to pack operands)");
        return 0;
    }
    /* the OS must have enabled the tile state in XCR0 (bits 17, 18) */
    __get_cpuid(1, &a, &b, &c, &d);
    if (!(c & (1u << 27))) {
        snprintf(why, n, "the OS has not enabled XSAVE (no OSXSAVE)");
        return 0;
    }
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) {
        snprintf(why, n, "the kernel does not enable the AMX tile state (XCR0 = %#x)", lo);
        return 0;
    }
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        snprintf(why, n, "arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) failed: %s",
                 strerror(errno));
        return 0;
    }
    if (self_test() != 0) {
        snprintf(why, n, "TDPBF16PS does not follow the arithmetic kernels.h states "
                 "(self-test failed; a CPU kind this path was not measured on)");
        return 0;
    }
    snprintf(why, n, "AMX usable");
    return 1;
}

#else   /* not x86-64 Linux: never enabled, never called */

int zk_amx_enable(char *why, size_t n) {
    snprintf(why, n, "AMX needs x86-64 Linux");
    return 0;
}

void zk_amx_gemm(float *C, long ldc, const uint16_t *a, long a_rs, long a_ks,
                 const uint16_t *bt, long bt_rs, long bt_ks, const float *bias,
                 int M, int N, int K) {
    (void)C; (void)ldc; (void)a; (void)a_rs; (void)a_ks; (void)bt; (void)bt_rs;
    (void)bt_ks; (void)bias; (void)M; (void)N; (void)K;
}

int zk_amx_gemm_b16(uint16_t *C16, long ldc, const uint16_t *a, long a_rs, long a_ks,
                    const uint16_t *bt, long bt_rs, long bt_ks, const float *bias,
                    int M, int N, int K) {
    (void)C16; (void)ldc; (void)a; (void)a_rs; (void)a_ks; (void)bt; (void)bt_rs;
    (void)bt_ks; (void)bias; (void)M; (void)N; (void)K;
    return -1;
}

int zk_amx_set_blocking(int mc, int nc, int kc) { (void)mc; (void)nc; (void)kc; return -1; }

#endif
