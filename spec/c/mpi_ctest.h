/*
 * mpi_ctest.h -- the harness of the C tests that run under mpirun (and of
 * test_comm_local, one rank without a launcher). ctest.h is the
 * single-process harness; mpi_inputs.h (included here) the inputs.
 *
 * Every rank runs every check: rank 0 prints the "ok" lines, every rank its
 * own FAIL lines (prefixed "rank R: " where the world has more than one
 * rank) with the check's file:line. mt_finish() prints, on rank 0, one line
 * "N passed, N failed" with the totals over all ranks: the line
 * tools/run_tests.sh reads. The exit status is nonzero on any rank's failure.
 *
 * A test sets R and P itself (mt_init does, from the world W), or leaves them
 * 0 for one process without a launcher.
 */
#ifndef ZT_MPI_CTEST_H
#define ZT_MPI_CTEST_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"     /* white-box: reads zt_tensor's fields */
#include "mpi_inputs.h"

static int passed, failed, R, P;
static zt_comm *W;

#define CHECK(name, cond, ...) do { \
    if (cond) { passed++; if (R == 0) printf("ok %s\n", name); } \
    else { failed++; if (P > 1) printf("rank %d: ", R); printf("FAIL %s: ", name); \
           printf(__VA_ARGS__); printf(" (%s:%d)\n", __FILE__, __LINE__); } \
} while (0)

/* Does the last error message hold s? */
static inline int has(const char *s) { return strstr(zt_last_error(), s) != NULL; }

/* A 1-d tensor of n elements; one that cannot be made ends the job (2). */
static inline zt_tensor *mt_tensor(int tier, int cat, int dtype, int64_t n)
{
    zt_tensor *t = NULL;
    if (zt_tensor_new(&t, tier, cat, dtype, 1, &n) != ZT_OK) {
        printf("rank %d: cannot allocate a test tensor: %s\n", R, zt_last_error());
        zt_comm_abort(2);
    }
    return t;
}

/* t (any tier, through zt_tensor_write) = val(seed, r, lo + i) */
static inline void mt_put(zt_tensor *t, uint32_t seed, int r, int64_t lo)
{
    float *h = malloc((size_t)t->numel * 4);
    for (int64_t i = 0; i < t->numel; i++) h[i] = val(seed, r, lo + i);
    zt_tensor_write(t, h, (size_t)t->numel * 4);
    free(h);
}

/* a malloc'd host copy of t's floats (any tier) */
static inline float *mt_get(const zt_tensor *t)
{
    float *h = malloc((size_t)t->numel * 4);
    zt_tensor_read(t, h, (size_t)t->numel * 4);
    return h;
}

/* The f32 sum over the world's ranks in rank order: ((v0 + v1) + v2) + ... */
static inline float mt_rank_sum(uint32_t seed, int64_t i)
{
    float s = val(seed, 0, i);
    for (int r = 1; r < P; r++) s += val(seed, r, i);
    return s;
}

/* On a group g whose rank k is world rank P-1-k (the world split with key
 * P-1-R): an all_reduce of a device tensor of n values val(seed, R, i), its
 * status in *rc; returns how many elements differ in bits from the f32 sum
 * in g's rank order. */
static inline int64_t mt_all_reduce_reversed(zt_comm *g, uint32_t seed, int64_t n, int *rc)
{
    zt_tensor *x = mt_tensor(ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, n);
    mt_put(x, seed, R, 0);
    *rc = zt_all_reduce(g, x, NULL);
    float *h = mt_get(x);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float s = val(seed, P - 1, i);
        for (int k = 1; k < P; k++) s += val(seed, P - 1 - k, i);
        bad += memcmp(&h[i], &s, 4) != 0;
    }
    free(h);
    zt_tensor_release(x);
    return bad;
}

/* The world W, R and P, stdout line-buffered (ranks' lines interleave whole).
 * 0, or 1 after a FAIL and a "0 passed, 1 failed" line: no world, or a world
 * of fewer than min_ranks or more than 64 ranks. */
static inline int mt_init(int min_ranks)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (zt_comm_world(&W) != ZT_OK) {
        printf("FAIL zt_comm_world: %s\n0 passed, 1 failed\n", zt_last_error());
        return 1;
    }
    R = zt_comm_rank(W);
    P = zt_comm_size(W);
    if (P < min_ranks || P > 64) {
        printf("FAIL this test needs %d..64 ranks (mpirun -np 2), got %d\n0 passed, 1 failed\n",
               min_ranks, P);
        return 1;
    }
    return 0;
}

/* The totals of passed and failed over all ranks (a collective); a failed
 * gather counts one failure. */
static inline void mt_totals(int *tp, int *tf)
{
    int mine[2] = { passed, failed }, all[2 * 64] = { 0 };
    *tp = *tf = 0;
    if (zt_comm_all_gather_host(W, all, mine, sizeof mine) != ZT_OK) {
        printf("rank %d: FAIL gathering totals: %s\n", R, zt_last_error());
        (*tf)++;
        return;
    }
    for (int r = 0; r < P; r++) { *tp += all[2 * r]; *tf += all[2 * r + 1]; }
}

/* Rank 0 prints "N passed, N failed"; the exit status (nonzero on a failure
 * in the totals, or on this rank). */
static inline int mt_report(int tp, int tf)
{
    if (R == 0) printf("%d passed, %d failed\n", tp, tf);
    return (tf != 0 || failed != 0) ? 1 : 0;
}

/* The end of a test: totals over ranks, zt_comm_finalize (a failure counts),
 * the summary line; returns the exit status. */
static inline int mt_finish(void)
{
    int tp, tf;
    mt_totals(&tp, &tf);
    if (zt_comm_finalize() != ZT_OK) {
        printf("rank %d: FAIL finalize: %s\n", R, zt_last_error());
        tf++;
    }
    return mt_report(tp, tf);
}

#endif
