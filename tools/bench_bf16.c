/*
 * bench_bf16.c -- the bf16 GEMMs (kernels/cpu/matmul_bf16.c) beside the fp32
 * sgemm path (matmul.c) at GPT-2 124M's shapes, N = B*T = 1024 rows:
 * qkv 768->2304, attproj 768->768, fc 768->3072, fcproj 3072->768 and the
 * vocabulary head 768->50257; forward, input gradient and weight gradient
 * separately, GFLOP/s (2*N*C*OC per GEMM), best of a few runs, on 1 and 2
 * OpenMP threads. Beside them, in the same run, the register-only peaks of
 * one core: vdpbf16ps zmm (32 multiply-adds) and vfmadd231ps zmm (16).
 *
 *   make build/bench_bf16 && build/bench_bf16 [--quick]
 * --quick: one thread count (OMP_NUM_THREADS or all), no LM head.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>
#include "kernels.h"

static uint64_t rs = 88172645463325252ull;
static float unif(void) {
    rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
    return (float)(rs >> 40) * 0x1p-24f * 2 - 1;
}
static float *rnd32(size_t n) {
    float *x = malloc(n * 4);
    for (size_t i = 0; i < n; i++) x[i] = unif();
    return x;
}
static uint16_t *to16(const float *x, size_t n) {
    uint16_t *y = malloc(n * 2);
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

static void shape(const char *name, int N, int C, int OC, int reps) {
    float *x = rnd32((size_t)N * C), *w = rnd32((size_t)OC * C), *d = rnd32((size_t)N * OC);
    float *b = rnd32(OC);
    uint16_t *x16 = to16(x, (size_t)N * C), *w16 = to16(w, (size_t)OC * C), *d16 = to16(d, (size_t)N * OC);
    float *out = malloc((size_t)N * OC * 4), *dx = malloc((size_t)N * C * 4);
    float *dw = malloc((size_t)OC * C * 4), *db = malloc((size_t)OC * 4);
    double gf = 2.0 * N * C * OC / 1e6, t[6];
    /* warm-up (page faults, OpenMP team) */
    zk_matmul_bf16_forward(out, x16, w16, b, N, C, OC);
    zk_matmul_forward(out, x, w, b, N, C, OC);
    BEST(t[0], reps, zk_matmul_bf16_forward(out, x16, w16, b, N, C, OC));
    BEST(t[1], reps, zk_matmul_bf16_backward(dx, NULL, NULL, d16, x16, w16, N, C, OC));
    BEST(t[2], reps, zk_matmul_bf16_backward(NULL, dw, db, d16, x16, w16, N, C, OC));
    BEST(t[3], reps, zk_matmul_forward(out, x, w, b, N, C, OC));
    BEST(t[4], reps, zk_matmul_backward(dx, NULL, NULL, d, x, w, N, C, OC));
    BEST(t[5], reps, zk_matmul_backward(NULL, dw, db, d, x, w, N, C, OC));
    printf("%-8s %5d x %5d -> %5d | bf16 fwd %6.1f  dinp %6.1f  dw %6.1f | fp32 fwd %6.1f  "
           "dinp %6.1f  dw %6.1f | bf16/fp32 step %.2fx\n", name, N, C, OC,
           gf / t[0], gf / t[1], gf / t[2], gf / t[3], gf / t[4], gf / t[5],
           (t[3] + t[4] + t[5]) / (t[0] + t[1] + t[2]));
    free(x); free(w); free(d); free(b); free(x16); free(w16); free(d16);
    free(out); free(dx); free(dw); free(db);
}

int main(int argc, char **argv) {
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    int simd = zk_bf16_simd(-1);
    printf("bf16 GEMMs (GFLOP/s, 2*N*C*OC per GEMM; best of runs); bf16 path: %s\n",
           simd ? "AVX512_BF16 (vdpbf16ps)" : "portable C (this CPU has no AVX512_BF16)");
    if (simd && __builtin_cpu_supports("avx512f")) {
        double pb = peak_dpbf16(5000000), pf = peak_fma(5000000);
        printf("one core, register-only peaks: vdpbf16ps %.0f GFLOP/s, vfmadd231ps zmm %.0f GFLOP/s "
               "(ratio %.2f)\n", pb, pf, pb / pf);
    }
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
    return 0;
}
