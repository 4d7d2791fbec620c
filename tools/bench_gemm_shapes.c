/*
 * bench_gemm_shapes.c -- ztrain's blocked fp32 GEMM at every GPT-2 GEMM
 * shape (B=4, T=256: N = 1024 rows) against one OpenBLAS call threaded by
 * OpenBLAS itself, and against other cuts of the same output.
 *
 * For each layer GEMM (qkv, attention proj, fc, fc proj, lm head) and each
 * product (forward out = x W^T, dinp = dout W, dweight = dout^T x) it
 * prints: the old cut's speed (the longer dimension in 256 blocks, the
 * reference bits); ztrain's plan (zk_gemm_plan: which dimension is cut,
 * block size), its GFLOP/s, share of the sgemm peak measured in the same
 * run, and whether its bits equal the reference's (they must); the one
 * threaded OpenBLAS call's GFLOP/s and bits (OpenBLAS's own threading does
 * not generally keep them); and the cheapest other cut whose output has the
 * reference bits, with the cuts whose bits differ counted.
 *
 * Timings are the min of `reps` runs, wall clock and process CPU time (run
 * with OMP_WAIT_POLICY=passive so waiting threads do not count). On a
 * machine shared with other work only the CPU-time ratios mean much.
 *
 *   make build/bench_gemm_shapes
 *   build/bench_gemm_shapes [gpt2|gpt2-medium|all] [reps]     (default all 3)
 *
 * Run it with OPENBLAS_CORETYPE as ztrain would set it (unset in the
 * environment, ztrain names SkylakeX or Haswell itself; set it by hand
 * here, e.g. OPENBLAS_CORETYPE=SkylakeX): the core decides the bits.
 */
#include <cblas.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kernels.h"

static float *rnd(size_t n, uint64_t seed) {
    float *x = malloc(n * sizeof(float));
    if (x == NULL) { fprintf(stderr, "bench_gemm_shapes: out of memory (%zu floats)\n", n); exit(1); }
    uint64_t s = 88172645463325252ull ^ seed;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        x[i] = (float)(s >> 40) * 0x1p-24f * 2 - 1;
    }
    return x;
}

static double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* min wall ms and min process CPU ms over reps: on a loaded machine the CPU
 * time (with OMP_WAIT_POLICY=passive, so waiting threads do not spin) still
 * shows the work a cut costs -- repacking, cache misses -- though not how
 * evenly its blocks fill the threads. */
#define BEST(ms, cms, reps, CODE)                                      \
    do {                                                               \
        ms = cms = 1e30;                                               \
        for (int r_ = 0; r_ < (reps); r_++) {                          \
            double t0_ = omp_get_wtime(), c0_ = cpu_ms();              \
            CODE;                                                      \
            double t_ = (omp_get_wtime() - t0_) * 1e3;                 \
            double c_ = cpu_ms() - c0_;                                \
            if (t_ < ms) ms = t_;                                      \
            if (c_ < cms) cms = c_;                                    \
        }                                                              \
    } while (0)

/* one row-major GEMM C (M,N) = op(A) op(B) */
typedef struct {
    int ta, tb, M, N, K, lda, ldb;
    const float *A, *B;
} gemm;

/* OpenBLAS's own threading, for the comparison only: ztrain's GEMMs need
 * it at 1 (kernels.h), so it is put back right after */
static void one_call(const gemm *g, float *C, int nt) {
    openblas_set_num_threads(nt);
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans,
                g->tb ? CblasTrans : CblasNoTrans, g->M, g->N, g->K, 1.0f, g->A, g->lda,
                g->B, g->ldb, 0.0f, C, g->N);
    openblas_set_num_threads(1);
}

static void run_cut(const gemm *g, float *C, zk_gemm_cut cut) {
    zk_gemm_blocked(g->ta, g->tb, g->M, g->N, g->K, g->A, g->lda, g->B, g->ldb, C, g->N, cut);
}

static double peak_gflops(int nt, int reps) {
    const int n = 2048;
    float *a = rnd((size_t)n * n, 1), *b = rnd((size_t)n * n, 2), *c = rnd((size_t)n * n, 3);
    gemm g = {0, 0, n, n, n, n, n, a, b};
    double ms, cms;
    one_call(&g, c, nt);   /* warm */
    BEST(ms, cms, reps, one_call(&g, c, nt));
    free(a); free(b); free(c);
    return 2.0 * n * n * n / ms / 1e6;
}

static const char *cut_name(zk_gemm_cut c, char *buf, size_t n) {
    snprintf(buf, n, "%s %d", c.by_cols ? "cols" : "rows", c.block);
    return buf;
}

static void bench_gemm(const char *name, const gemm *g, float *C, float *ref, int nt,
                       int reps, double peak) {
    size_t bytes = (size_t)g->M * g->N * sizeof(float);
    double fl = 2.0 * g->M * g->N * g->K, ms, cms;
    if (fl > 3e10 && reps > 2) reps = 2;   /* the lm head: a quarter second a call */
    /* the reference: the longer dimension in blocks of 256, the cut every
     * core had before zk_gemm_plan could choose (and Haswell's still) */
    zk_gemm_cut old = {g->N >= g->M, 256}, plan = zk_gemm_plan(g->M, g->N, g->K);
    run_cut(g, ref, old);   /* warm, and the reference bits */
    BEST(ms, cms, reps, run_cut(g, ref, old));
    double go = fl / ms / 1e6, goc = fl / cms / 1e6;
    run_cut(g, C, plan);
    int samep = memcmp(C, ref, bytes) == 0;
    BEST(ms, cms, reps, run_cut(g, C, plan));
    double gp = fl / ms / 1e6, gpc = fl / cms / 1e6;
    BEST(ms, cms, reps, one_call(g, C, nt));
    double g1 = fl / ms / 1e6;
    int same1 = memcmp(C, ref, bytes) == 0;
    /* other cuts: both dimensions, blocks that leave every thread a block;
     * the one with the old cut's bits that costs the least CPU time */
    static const int blocks[] = {192, 256, 512, 576, 768, 1024, 1536, 2048, 3072, 4096, 6144};
    double gbest = 0, gbest_w = 0;
    zk_gemm_cut best = old;
    int ndiff = 0, ntried = 0;
    for (int by = 0; by < 2; by++)
        for (size_t k = 0; k < sizeof blocks / sizeof blocks[0]; k++) {
            zk_gemm_cut cut = {by, blocks[k]};
            int D = by ? g->N : g->M;
            if ((D + cut.block - 1) / cut.block < nt ||
                (cut.by_cols == old.by_cols && cut.block == old.block))
                continue;
            ntried++;
            run_cut(g, C, cut);
            if (memcmp(C, ref, bytes) != 0) { ndiff++; continue; }
            BEST(ms, cms, reps, run_cut(g, C, cut));
            if (fl / cms / 1e6 > gbest) { gbest = fl / cms / 1e6; gbest_w = fl / ms / 1e6; best = cut; }
        }
    char pc[32], bc[32] = "-";
    if (gbest > 0) cut_name(best, bc, sizeof bc);
    printf("%-17s %5dx%-5dx%5d %6.1f %6.1f  %-9s %6.1f %4.0f%% %6.1f %-4s  %6.1f %-4s  "
           "%-9s %6.1f %6.1f  %d/%d\n", name, g->M, g->N, g->K, go, goc,
           cut_name(plan, pc, sizeof pc), gp, 100 * gp / peak, gpc, samep ? "same" : "DIFF",
           g1, same1 ? "same" : "diff", bc, gbest_w, gbest, ndiff, ntried);
}

static void bench_model(const char *model, int C, int reps, int nt, double peak) {
    const int N = 1024, V = 50257;   /* B*T = 4*256; GPT-2's vocabulary */
    /* buffers sized for the largest operand (the lm head's N x V, V x C) */
    size_t big = (size_t)N * V > (size_t)V * C ? (size_t)N * V : (size_t)V * C;
    float *x = rnd((size_t)N * 4 * C, 11), *w = rnd((size_t)V * C, 12), *dout = rnd(big, 13);
    float *out = rnd(big, 14), *ref = rnd(big, 15);
    const struct { const char *name; int ic, oc; } layers[] = {
        {"qkv", C, 3 * C}, {"attn proj", C, C}, {"fc", C, 4 * C}, {"fc proj", 4 * C, C},
        {"lm head", C, V}};
    printf("\n%s (C=%d, N=B*T=%d, V=%d)\n", model, C, N, V);
    printf("%-17s %-17s %-13s  %-29s  %-11s  %-23s  %s\n", "", "", "old cut 256", "plan",
           "1-call", "best other cut", "");
    printf("%-17s %-17s %6s %6s  %-9s %6s %5s %6s %-4s  %6s %-4s  %-9s %6s %6s  %s\n", "gemm",
           "M x N x K", "GF/s", "cpu", "cut", "GF/s", "peak", "cpu", "bits", "GF/s", "bits",
           "cut", "GF/s", "cpu", "other bits");
    for (size_t l = 0; l < sizeof layers / sizeof layers[0]; l++) {
        int ic = layers[l].ic, oc = layers[l].oc;
        char name[40];
        /* forward: out (N,oc) = x (N,ic) @ w (oc,ic)^T */
        gemm f = {0, 1, N, oc, ic, ic, ic, x, w};
        snprintf(name, sizeof name, "%s fwd", layers[l].name);
        bench_gemm(name, &f, out, ref, nt, reps, peak);
        /* dinp (N,ic) = dout (N,oc) @ w (oc,ic) */
        gemm di = {0, 0, N, ic, oc, oc, ic, dout, w};
        snprintf(name, sizeof name, "%s dinp", layers[l].name);
        bench_gemm(name, &di, out, ref, nt, reps, peak);
        /* dweight (oc,ic) = dout (N,oc)^T @ x (N,ic) */
        gemm dw = {1, 0, oc, ic, N, oc, ic, dout, x};
        snprintf(name, sizeof name, "%s dweight", layers[l].name);
        bench_gemm(name, &dw, out, ref, nt, reps, peak);
    }
    free(x); free(w); free(dout); free(out); free(ref);
}

int main(int argc, char **argv) {
    const char *which = argc > 1 ? argv[1] : "all";
    int reps = argc > 2 ? atoi(argv[2]) : 3;
    if (reps < 1 || (strcmp(which, "all") && strcmp(which, "gpt2") && strcmp(which, "gpt2-medium"))) {
        fprintf(stderr, "usage: bench_gemm_shapes [gpt2|gpt2-medium|all] [reps >= 1]\n");
        return 2;
    }
    int nt = omp_get_max_threads();
    const char *core = getenv("OPENBLAS_CORETYPE");
    double peak = peak_gflops(nt, reps);
    printf("fp32 GEMM shapes, %d threads, OpenBLAS core %s (%s); sgemm peak (2048^3, one "
           "threaded call) %.1f GFLOP/s; min of %d\n", nt, openblas_get_corename(),
           core ? core : "OPENBLAS_CORETYPE unset", peak, reps);
    printf("old cut: the longer dimension in 256 blocks (the reference bits); plan: "
           "zk_gemm_plan's cut;\nGF/s: wall clock; cpu: GF/s per CPU-second (the work, not the "
           "balance); 1-call: one OpenBLAS call\non %d threads; best other cut: the one with the "
           "reference bits that costs the least CPU time;\nother bits: cuts whose bits differ / "
           "cuts tried\n", nt);
    if (!strcmp(which, "all") || !strcmp(which, "gpt2")) bench_model("gpt2", 768, reps, nt, peak);
    if (!strcmp(which, "all") || !strcmp(which, "gpt2-medium"))
        bench_model("gpt2-medium", 1024, reps, nt, peak);
    return 0;
}
