/*
 * ctest.h -- a tiny C test harness for the kernel tests.
 *
 * Each check prints "ok NAME" or "FAIL NAME: detail"; ct_summary() prints
 * "N passed, N failed" and returns the exit status. Also: a seeded RNG,
 * closeness / bit-identity checks, central differences in double, and a
 * helper to run a kernel under several OpenMP thread counts.
 * Everything is static inline so a test file uses what it likes, warning-free.
 */
#ifndef ZT_CTEST_H
#define ZT_CTEST_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

static int ct_passed, ct_failed;

static inline void ct_ok(const char *name) {
    ct_passed++;
    printf("ok %s\n", name);
}

static inline void ct_fail(const char *name, const char *fmt, ...) {
    va_list ap;
    ct_failed++;
    printf("FAIL %s: ", name);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

/* pass if cond, else FAIL with the formatted detail */
static inline void ct_check(int cond, const char *name, const char *fmt, ...) {
    if (cond) { ct_ok(name); return; }
    va_list ap;
    ct_failed++;
    printf("FAIL %s: ", name);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

static inline int ct_summary(void) {
    printf("%d passed, %d failed\n", ct_passed, ct_failed);
    return ct_failed != 0;
}

/* ---- data --------------------------------------------------------------- */

static uint64_t ct_rng_state = 0x9e3779b97f4a7c15ull;

static inline void ct_seed(uint64_t s) { ct_rng_state = s * 0x9e3779b97f4a7c15ull + 1; }

static inline uint64_t ct_u64(void) {            /* splitmix64 */
    uint64_t z = (ct_rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [lo, hi) */
static inline float ct_unif(float lo, float hi) {
    return lo + (hi - lo) * (float)((ct_u64() >> 40) * 0x1p-24);
}

static inline float *ct_rand(size_t n, float lo, float hi) {
    float *x = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) x[i] = ct_unif(lo, hi);
    return x;
}

static inline void *ct_alloc(size_t bytes) {      /* zeroed */
    void *p = calloc(1, bytes + 1);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    return p;
}

static inline double *ct_to_double(const float *x, size_t n) {
    double *d = ct_alloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* ---- comparisons -------------------------------------------------------- */

/* |got - ref| <= atol + rtol*|ref| everywhere; reports the worst element */
static inline void ct_close(const char *name, const float *got, const double *ref,
                            size_t n, double atol, double rtol) {
    double worst = -1, max_abs = 0, max_rel = 0;
    size_t at = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]);
        if (!(e == e) || isnan(got[i]) != isnan(ref[i])) e = INFINITY;
        double rel = e / (fabs(ref[i]) > 1e-30 ? fabs(ref[i]) : 1e-30);
        double over = e / (atol + rtol * fabs(ref[i]));
        if (e > max_abs) max_abs = e;
        if (rel > max_rel && fabs(ref[i]) > atol) max_rel = rel;
        if (over > worst) { worst = over; at = i; }
        if (over > 1.0) bad = 1;
    }
    if (!bad) { ct_ok(name); return; }
    ct_fail(name, "max abs err %.3g, max rel err %.3g; worst at [%zu] got %.9g want %.9g",
            max_abs, max_rel, at, (double)got[at], ref[at]);
}

static inline void ct_close_f(const char *name, const float *got, const float *ref,
                              size_t n, double atol, double rtol) {
    double *r = ct_to_double(ref, n);
    ct_close(name, got, r, n, atol, rtol);
    free(r);
}

/* byte-identical; reports the first differing float/element */
static inline void ct_same_bits(const char *name, const void *a, const void *b,
                                size_t bytes) {
    if (memcmp(a, b, bytes) == 0) { ct_ok(name); return; }
    const unsigned char *x = a, *y = b;
    size_t i = 0;
    while (x[i] == y[i]) i++;
    ct_fail(name, "bits differ first at byte %zu (element %zu if 4-byte)", i, i / 4);
}

/* ---- finite differences -------------------------------------------------- */

typedef double (*ct_loss_fn)(void *ctx, const double *x);

/* g[i] = (L(x + eps e_i) - L(x - eps e_i)) / (2 eps), all in double */
static inline void ct_fd_grad(double *g, ct_loss_fn f, void *ctx, double *x,
                              size_t n, double eps) {
    for (size_t i = 0; i < n; i++) {
        double xi = x[i];
        x[i] = xi + eps;
        double lp = f(ctx, x);
        x[i] = xi - eps;
        double lm = f(ctx, x);
        x[i] = xi;
        g[i] = (lp - lm) / (2 * eps);
    }
}

#endif
