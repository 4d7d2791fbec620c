/*
 * bench_bf16.c -- the bf16 GEMMs (kernels/cpu/matmul_bf16.c) beside the fp32
 * sgemm path (matmul.c) at GPT-2 124M's shapes, N = B*T = 1024 rows:
 * qkv 768->2304, attproj 768->768, fc 768->3072, fcproj 3072->768 and the
 * vocabulary head 768->50257; forward, input gradient and weight gradient
 * separately, GFLOP/s (2*N*C*OC per GEMM), best of a few runs, on 1 and 2
 * OpenMP threads, for each bf16 path this CPU has (AMX, AVX512_BF16; the
 * portable path only where neither is). Beside them, in the same run, the
 * register-only peaks of one core: tdpbf16ps (16x16x32 multiply-adds),
 * vdpbf16ps zmm (32) and vfmadd231ps zmm (16).
 *
 *   make build/bench_bf16 && build/bench_bf16 [--quick]
 * --quick: one thread count (OMP_NUM_THREADS or all), no LM head.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>
#include <unistd.h>
#include <sys/syscall.h>
#include "kernels.h"

static uint64_t rs = 88172645463325252ull;
static float unif(void) {
    rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
    return (float)(rs >> 40) * 0x1p-24f * 2 - 1;
}
/* page-aligned, as the runtime allocates tensors (AMX tile rows that straddle
 * cache lines load at about half speed) */
static void *amalloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? bytes : 1) != 0) { perror("posix_memalign"); exit(1); }
    return p;
}
static float *rnd32(size_t n) {
    float *x = amalloc(n * 4);
    for (size_t i = 0; i < n; i++) x[i] = unif();
    return x;
}
static uint16_t *to16(const float *x, size_t n) {
    uint16_t *y = amalloc(n * 2);
    zk_cast_f32_bf16(y, x, n);
    return y;
}

#define BEST(ms, reps, CODE)                                           \
    do {                                                               \
        ms = 1e30;                                                     \
        for (int r_ = 0; r_ < (reps); r_++) {                          \
            double t0_ = omp_get_wtime();                              \
            CODE;                                                      \
            double t_ = (omp_get_wtime() - t0_) * 1e3;                 \
            if (t_ < ms) ms = t_;                                      \
        }                                                              \
    } while (0)

#define NACC 24
__attribute__((target("avx512f,avx512bf16"), noinline))
static double peak_dpbf16(long n) {
    __m512 acc[NACC];
    for (int i = 0; i < NACC; i++) acc[i] = _mm512_setzero_ps();
    __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x3c003c00);
    double t = omp_get_wtime();
    for (long k = 0; k < n; k++) {
        #pragma GCC unroll 24
        for (int i = 0; i < NACC; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
        __asm__ volatile("" : "+v"(a));
    }
    t = omp_get_wtime() - t;
    __m512 s = acc[0];
    for (int i = 1; i < NACC; i++) s = _mm512_add_ps(s, acc[i]);
    volatile float sink = _mm512_reduce_add_ps(s); (void)sink;
    return n * (double)NACC * 64 / t / 1e9;
}
__attribute__((target("avx512f"), noinline))
static double peak_fma(long n) {
    __m512 acc[NACC];
    for (int i = 0; i < NACC; i++) acc[i] = _mm512_setzero_ps();
    __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(1e-30f);
    double t = omp_get_wtime();
    for (long k = 0; k < n; k++) {
        #pragma GCC unroll 24
        for (int i = 0; i < NACC; i++) acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
        __asm__ volatile("" : "+v"(a));
    }
    t = omp_get_wtime() - t;
    __m512 s = acc[0];
    for (int i = 1; i < NACC; i++) s = _mm512_add_ps(s, acc[i]);
    volatile float sink = _mm512_reduce_add_ps(s); (void)sink;
    return n * (double)NACC * 32 / t / 1e9;
}

/* tdpbf16ps on 4 accumulators from 4 fixed tiles (zk_amx_enable has run) */
static const struct __attribute__((packed, aligned(64))) {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tcfg = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
__attribute__((target("amx-tile,amx-bf16"), noinline))
static double peak_tdpbf16(long n) {
    static uint8_t z[1024] __attribute__((aligned(64)));
    _tile_loadconfig(&tcfg);
    _tile_loadd(4, z, 64); _tile_loadd(5, z, 64); _tile_loadd(6, z, 64); _tile_loadd(7, z, 64);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    double t = omp_get_wtime();
    for (long k = 0; k < n; k++) {
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
    }
    t = omp_get_wtime() - t;
    _tile_release();
    return n * 4.0 * 16 * 16 * 32 * 2 / t / 1e9;
}

static int paths[3], npaths;    /* the bf16 paths measured, fastest first */

static void shape(const char *name, int N, int C, int OC, int reps) {
    float *x = rnd32((size_t)N * C), *w = rnd32((size_t)OC * C), *d = rnd32((size_t)N * OC);
    float *b = rnd32(OC);
    uint16_t *x16 = to16(x, (size_t)N * C), *w16 = to16(w, (size_t)OC * C), *d16 = to16(d, (size_t)N * OC);
    float *out = amalloc((size_t)N * OC * 4), *dx = amalloc((size_t)N * C * 4);
    float *dw = amalloc((size_t)OC * C * 4), *db = amalloc((size_t)OC * 4);
    double gf = 2.0 * N * C * OC / 1e6, t[4][3];
    /* warm-up (page faults, OpenMP team) */
    zk_matmul_forward(out, x, w, b, N, C, OC, OC);
    BEST(t[3][0], reps, zk_matmul_forward(out, x, w, b, N, C, OC, OC));
    BEST(t[3][1], reps, zk_matmul_backward(dx, NULL, NULL, d, x, w, N, C, OC, OC));
    BEST(t[3][2], reps, zk_matmul_backward(NULL, dw, db, d, x, w, N, C, OC, OC));
    printf("%-8s %4d x %5d -> %5d |", name, N, C, OC);
    for (int i = 0; i < npaths; i++) {
        zk_bf16_simd(paths[i]);
        zk_matmul_bf16_forward(out, x16, w16, b, N, C, OC, OC);
        BEST(t[i][0], reps, zk_matmul_bf16_forward(out, x16, w16, b, N, C, OC, OC));
        BEST(t[i][1], reps, zk_matmul_bf16_backward(dx, NULL, NULL, d16, x16, w16, N, C, OC, OC));
        BEST(t[i][2], reps, zk_matmul_bf16_backward(NULL, dw, db, d16, x16, w16, N, C, OC, OC));
        printf(" %s %6.0f %6.0f %6.0f |", paths[i] == 2 ? "amx" : paths[i] == 1 ? "vdp" : "c",
               gf / t[i][0], gf / t[i][1], gf / t[i][2]);
    }
    printf(" fp32 %5.0f %5.0f %5.0f |", gf / t[3][0], gf / t[3][1], gf / t[3][2]);
    for (int i = 0; i < npaths; i++)
        printf(" %.2fx", (t[3][0] + t[3][1] + t[3][2]) / (t[i][0] + t[i][1] + t[i][2]));
    printf("\n");
    free(x); free(w); free(d); free(b); free(x16); free(w16); free(d16);
    free(out); free(dx); free(dw); free(db);
}

int main(int argc, char **argv) {
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    int def = zk_bf16_simd(-1);
    for (int p = 2; p >= 0; p--)        /* each path this CPU has; portable only alone */
        if (zk_bf16_simd(p) == p && (p > 0 || npaths == 0)) paths[npaths++] = p;
    zk_bf16_simd(def);
    printf("bf16 GEMMs (GFLOP/s, 2*N*C*OC per GEMM; best of runs); default path: %s\n",
           zk_bf16_info());
    if (__builtin_cpu_supports("avx512f")) {
        char why[200];
        double pt = zk_amx_enable(why, sizeof why) ? peak_tdpbf16(2000000) : 0;
        int vdp = 0;
        for (int i = 0; i < npaths; i++) vdp |= paths[i] == 1;
        double pb = vdp ? peak_dpbf16(5000000) : 0, pf = peak_fma(5000000);
        printf("one core, register-only peaks (GFLOP/s): ");
        if (pt) printf("tdpbf16ps %.0f, ", pt);
        if (pb) printf("vdpbf16ps %.0f, ", pb);
        printf("vfmadd231ps zmm %.0f\n", pf);
    }
    printf("columns: per path fwd dinp dw; then fp32 sgemm; then each path's step (3 GEMMs) "
           "speed-up over fp32\n");
    int maxt = omp_get_max_threads();
    for (int nt = quick ? maxt : 1; nt <= maxt && nt <= 2; nt++) {
        omp_set_num_threads(nt);
        printf("-- %d thread%s\n", nt, nt > 1 ? "s" : "");
        shape("qkv", 1024, 768, 2304, 3);
        shape("attproj", 1024, 768, 768, 3);
        shape("fc", 1024, 768, 3072, 3);
        shape("fcproj", 1024, 3072, 768, 3);
        if (!quick) shape("lm_head", 1024, 768, 50257, 1);
    }
    zk_bf16_simd(def);
    return 0;
}
