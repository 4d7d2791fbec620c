/*
 * bench_kernels.c -- rough timings of the CPU kernels at GPT-2 124M sizes
 * (B=4, T=256, C=768, NH=12, V=50257). Prints the best of a few runs.
 * First an A/B table: each kernel that has a plain scalar path and a vector
 * path (zk_force_scalar) timed both ways in this process, reps alternating
 * A and B, min of N, GB/s beside a parallel memcpy measured in the same run
 * (on a loaded machine only the ratios within one run mean anything).
 *
 *   make build/bench_kernels && build/bench_kernels
 */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kernels.h"

static float *rnd(size_t n, float scale) {
    float *x = malloc(n * sizeof(float));
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        x[i] = ((float)(s >> 40) * 0x1p-24f * 2 - 1) * scale;
    }
    return x;
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

/* ---- A/B: scalar path vs vector path ------------------------------------ */

#define AB_REPS 7

static double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* best wall ms of the scalar (ms[0]) and vector (ms[1]) paths, reps
 * alternating, and their best process CPU ms (cms): on a loaded machine the
 * CPU time (with OMP_WAIT_POLICY=passive) is the steadier figure */
#define AB(ms, cms, CODE)                                               \
    do {                                                                \
        ms[0] = ms[1] = cms[0] = cms[1] = 1e30;                         \
        for (int r_ = 0; r_ < 2 * AB_REPS; r_++) {                      \
            zk_force_scalar(!(r_ & 1));                                 \
            double t0_ = omp_get_wtime(), c0_ = cpu_ms();               \
            CODE;                                                       \
            double t_ = (omp_get_wtime() - t0_) * 1e3, c_ = cpu_ms() - c0_; \
            if (t_ < ms[r_ & 1]) ms[r_ & 1] = t_;                       \
            if (c_ < cms[r_ & 1]) cms[r_ & 1] = c_;                     \
        }                                                               \
        zk_force_scalar(0);                                             \
    } while (0)

static void par_memcpy(float *dst, const float *src, size_t n) {
    #pragma omp parallel
    {
        int id = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t per = (n / nt + 15) & ~(size_t)15;
        size_t lo = per * id < n ? per * id : n, hi = per * (id + 1) < n ? per * (id + 1) : n;
        memcpy(dst + lo, src + lo, (hi - lo) * sizeof(float));
    }
}

static void ab_row(const char *name, const double ms[2], const double cms[2], double bytes,
                   double copy) {
    printf("%-34s %8.3f  %8.3f  %5.2fx  %6.1f GB/s  %4.0f%% of copy   cpu ms %8.3f %8.3f  %5.2fx\n",
           name, ms[0], ms[1], ms[0] / ms[1], bytes / ms[1] / 1e6,
           100 * bytes / ms[1] / 1e6 / copy, cms[0], cms[1], cms[0] / cms[1]);
}

static void ab_table(void) {
    const size_t np = 124475904 / 4;   /* a quarter of GPT-2's parameters: out of cache */
    float *g = rnd(np, 1e-3f), *d = rnd(np, 1);
    double ms[2], cms[2], copy = 1e30;
    for (int r = 0; r < AB_REPS; r++) {
        double t0 = omp_get_wtime();
        par_memcpy(d, g, np);
        double t = (omp_get_wtime() - t0) * 1e3;
        if (t < copy) copy = t;
    }
    copy = 8.0 * np / copy / 1e6;      /* GB/s, STREAM's count (read + write) */
    printf("A/B, same process (min of %d, reps alternating; measured now, not quiet):\n", AB_REPS);
    printf("  parallel memcpy %.1f GB/s (%d threads)\n", copy, omp_get_max_threads());
    printf("%-34s %8s  %8s  %6s\n", "kernel", "scalar", "vector", "gain");
    double *parts = malloc((np / ZK_SUM_BLOCK + 1) * sizeof(double));
    /* in L2, in L3 (a layer's gradient just written by backward), in DRAM */
    const size_t sizes[3] = {(size_t)1 << 17, (size_t)3 << 20, np};
    for (int k = 0; k < 3; k++) {
        size_t n = sizes[k];
        char name[64];
        for (int rep = 0; rep < 3; rep++) zk_sumsq_blocks(parts, g, n);   /* warm */
        AB(ms, cms, zk_sumsq_blocks(parts, g, n));
        snprintf(name, sizeof name, "sumsq_blocks (grad norm), %.2fM", n / 1e6);
        ab_row(name, ms, cms, 4.0 * n, copy);
        volatile double sink;
        AB(ms, cms, sink = zk_sum_f64(g, n));
        (void)sink;
        snprintf(name, sizeof name, "sum_f64, %.2fM", n / 1e6);
        ab_row(name, ms, cms, 4.0 * n, copy);
    }
    free(parts); free(g); free(d);

    /* the memory-bound ops of a GPT-2 124M step (B=4, T=256), no second
     * path: GB/s counting each array read or written once */
    const int N = 1024, C = 768, V = 50257;
    size_t nc = (size_t)N * C, n4 = 4 * nc;
    float *x = rnd(nc, 2), *y = rnd(nc, 1), *w = rnd(C, 1), *b = rnd(C, 1), *dy = rnd(nc, 1);
    float *mean = rnd(N, 1), *rstd = rnd(N, 1), *dx = rnd(nc, 1), *dw = rnd(C, 1), *db = rnd(C, 1);
    float *h = rnd(n4, 3), *ho = rnd(n4, 1), *hd = rnd(n4, 1), *lg = rnd((size_t)N * V, 5);
    float *loss = rnd(N, 1);
    int32_t *tg = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) tg[i] = (i * 7919) % V;
    double t;
    printf("%-34s %8s  %8s\n", "kernel (one path)", "", "ms");
#define ONE(name, bytes, CODE)                                                   \
    do {                                                                         \
        t = 1e30;                                                                \
        for (int r_ = 0; r_ < AB_REPS; r_++) {                                   \
            double t0_ = omp_get_wtime();                                        \
            CODE;                                                                \
            double t_ = (omp_get_wtime() - t0_) * 1e3;                           \
            if (t_ < t) t = t_;                                                  \
        }                                                                        \
        printf("%-34s %8s  %8.3f  %5s  %6.1f GB/s  %4.0f%% of copy\n", name, "", t, "",  \
               (bytes) / t / 1e6, 100 * (bytes) / t / 1e6 / copy);               \
    } while (0)
    ONE("layernorm fwd (N*C; 8 B/elem)", 8.0 * nc, zk_layernorm_forward(y, mean, rstd, x, w, b, N, C));
    ONE("residual add3 (N*C; 12 B/elem)", 12.0 * nc, zk_add3(y, x, dy, nc));
    ONE("gelu fwd (4*N*C; 8 B/elem)", 8.0 * n4, zk_gelu_forward(ho, h, n4));
    ONE("gelu bwd (4*N*C; 12 B/elem)", 12.0 * n4, zk_gelu_backward(hd, h, ho, n4));
#undef ONE
    /* A/B: the input-gradient sums of layer norm backward (plain lane loop
     * vs AVX2), then the whole backward */
    AB(ms, cms, zk_layernorm_backward(dx, NULL, NULL, dy, x, w, mean, rstd, N, C));
    ab_row("layernorm bwd dinp (16 B/elem)", ms, cms, 16.0 * nc, copy);
    AB(ms, cms, zk_layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C));
    ab_row("layernorm bwd all (24 B/elem)", ms, cms, 24.0 * nc, copy);
    /* A/B: plain = each exp twice; vector = once, kept in dlogits. Into a
     * second buffer, so every rep sees the same logits. */
    float *dl = rnd((size_t)N * V, 1);
    AB(ms, cms, zk_crossentropy(loss, dl, lg, tg, N, V, V, 1.0f / N));
    ab_row("crossentropy N*V (12 B/elem)", ms, cms, 12.0 * N * V, copy);
    free(dl);
    free(x); free(y); free(w); free(b); free(dy); free(mean); free(rstd); free(dx); free(dw);
    free(db); free(h); free(ho); free(hd); free(lg); free(loss); free(tg);
}

int main(void) {
    const int B = 4, T = 256, C = 768, NH = 12, V = 50257, N = B * T, L = 12;
    double ms, ms2;
    printf("threads: OpenMP %d\n", omp_get_max_threads());
    ab_table();
    if (getenv("BENCH_AB_ONLY")) return 0;

    float *qkv = rnd((size_t)N * 3 * C, 1), *out = rnd((size_t)N * C, 1);
    float *lse = rnd((size_t)B * NH * T, 1), *dout = rnd((size_t)N * C, 1);
    float *dqkv = rnd((size_t)N * 3 * C, 1);
    double pairs = (double)B * NH * T * (T + 1) / 2, hs = C / NH;
    BEST(ms, 5, zk_attention_forward(out, lse, qkv, B, T, C, NH));
    BEST(ms2, 5, zk_attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH));
    printf("attention fwd %7.2f ms (%5.1f GFLOP/s)  bwd %7.2f ms (%5.1f GFLOP/s)  x%d layers = %.0f ms\n",
           ms, 4 * hs * pairs / ms / 1e6, ms2, 10 * hs * pairs / ms2 / 1e6, L, (ms + ms2) * L);

    float *x = rnd((size_t)N * C, 2), *w = rnd(C, 1), *b = rnd(C, 1), *y = rnd((size_t)N * C, 1);
    float *mean = rnd(N, 1), *rstd = rnd(N, 1), *dx = rnd((size_t)N * C, 1);
    float *dw = rnd(C, 1), *db = rnd(C, 1);
    BEST(ms, 10, zk_layernorm_forward(y, mean, rstd, x, w, b, N, C));
    BEST(ms2, 10, zk_layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C));
    printf("layernorm (N=%d, C=%d) fwd %6.3f ms  bwd %6.3f ms  x%d = %.1f ms\n", N, C, ms, ms2,
           2 * L + 1, (ms + ms2) * (2 * L + 1));

    size_t ng = (size_t)N * 4 * C;
    float *g = rnd(ng, 3), *go = rnd(ng, 1), *gd = rnd(ng, 1);
    BEST(ms, 10, zk_gelu_forward(go, g, ng));
    BEST(ms2, 10, zk_gelu_backward(gd, g, go, ng));
    printf("gelu (n=%zu) fwd %6.3f ms  bwd %6.3f ms  x%d = %.1f ms\n", ng, ms, ms2, L, (ms + ms2) * L);

    float *logits = rnd((size_t)N * V, 5), *losses = rnd(N, 1);
    int32_t *tg = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) tg[i] = (i * 7919) % V;
    BEST(ms, 3, zk_crossentropy(losses, logits, logits, tg, N, V, V, 1.0f / N));
    printf("crossentropy (N=%d, V=%d, in place) %7.2f ms\n", N, V, ms);

    size_t np = 124475904;
    float *p = rnd(np, 1), *pg = rnd(np, 1e-3f), *pm = rnd(np, 1e-3f), *pv = rnd(np, 1e-6f);
    for (size_t i = 0; i < np; i++) pv[i] = pv[i] < 0 ? -pv[i] : pv[i];
    BEST(ms, 3, zk_adamw(p, pg, pm, pv, np, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 3));
    double *parts = malloc((np / ZK_SUM_BLOCK + 1) * sizeof(double));
    BEST(ms2, 3, zk_sumsq_blocks(parts, pg, np));
    printf("adamw (n=%zu) %7.2f ms (%.1f GB/s at 28 B/element)   sumsq_blocks %7.2f ms\n", np,
           ms, 28.0 * np / ms / 1e6, ms2);
    BEST(ms, 5, zk_add3(x, x, dout, (size_t)N * C));
    BEST(ms2, 5, zk_cast_f32_bf16((uint16_t *)dx, x, (size_t)N * C));
    printf("add3 (N*C) %6.3f ms   cast f32->bf16 (N*C) %6.3f ms\n", ms, ms2);
    free(p); free(pg); free(pm); free(pv); free(parts);

    int32_t *tok = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) tok[i] = (i * 7919) % V;
    float *wte = rnd((size_t)V * C, 1), *wpe = rnd((size_t)1024 * C, 1);
    BEST(ms, 5, zk_encoder_forward(y, tok, wte, wpe, B, T, C, V));
    BEST(ms2, 5, zk_encoder_backward(wte, wpe, dout, tok, B, T, C, V));
    printf("encoder fwd %6.3f ms  bwd %6.3f ms\n", ms, ms2);

    /* matmul: the four GEMM shapes of a layer plus the LM head, fwd + bwd */
    const int shapes[5][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}, {C, V}};
    const char *names[5] = {"qkv", "attproj", "fc", "fcproj", "lm_head"};
    float *A = rnd((size_t)N * 4 * C, 1), *Wt = rnd((size_t)V * C, 1), *bias = rnd(V, 1);
    float *Out = rnd((size_t)N * V, 1), *dA = rnd((size_t)N * 4 * C, 1), *dW = rnd((size_t)V * C, 1);
    float *dB = rnd(V, 1);
    for (int s = 0; s < 5; s++) {
        int ic = shapes[s][0], oc = shapes[s][1], reps = oc > 10000 ? 2 : 5;
        double fl = 2.0 * N * ic * oc;
        BEST(ms, reps, zk_matmul_forward(Out, A, Wt, bias, N, ic, oc, oc));
        BEST(ms2, reps, zk_matmul_backward(dA, dW, dB, Out, A, Wt, N, ic, oc, oc));
        /* OpenBLAS's own threading for this comparison only: ztrain's GEMMs
         * need it at 1 (kernels.h), so put it back before the next shape. */
        openblas_set_num_threads(omp_get_max_threads());
        double ms3;
        BEST(ms3, reps, cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, oc, ic, 1.0f,
                                    A, ic, Wt, ic, 0.0f, Out, oc));
        openblas_set_num_threads(1);
        printf("matmul %-8s fwd %7.2f ms (%5.1f GFLOP/s)  bwd %7.2f ms (%5.1f GFLOP/s)  "
               "[plain threaded sgemm fwd %5.1f GFLOP/s]\n",
               names[s], ms, fl / ms / 1e6, ms2, 2 * fl / ms2 / 1e6, fl / ms3 / 1e6);
    }
    return 0;
}
