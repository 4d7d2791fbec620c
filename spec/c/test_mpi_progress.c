/*
 * test_mpi_progress.c -- every communicator makes progress on its own: an
 * operation on one group is never queued behind a long collective on
 * another. Run by `make test` under `mpirun -np 2` and `-np 4`.
 *
 * Two groups A and B are split over the same ranks (the whole world). The
 * ping-pongs on B are between ranks 0 and 1; every rank joins the
 * collectives on A.
 *
 *  - Crossed order: rank 0 issues a large all_reduce on A, then ping-pongs
 *    with rank 1 on B; rank 1 ping-pongs on B first and only then joins the
 *    all_reduce. One FIFO for all communicators deadlocks here (rank 0's
 *    send waits behind an all_reduce that waits for rank 1, which waits for
 *    that send), so every wait has a deadline: a rank that passes it prints
 *    its FAIL line and a summary, and ends the job (zt_comm_abort) instead
 *    of hanging.
 *  - Timing: the ping-pong round trip alone, then while a large all_reduce
 *    (48 MiB per rank) runs on A (issued first on every rank): the ping-pong must finish
 *    while the all_reduce is still running (zt_comm_test says not done),
 *    so it was not queued behind it.
 *  - Collectives on two groups issued in opposite orders on different
 *    ranks; a split of the world while an all_reduce on A waits for it; many
 *    operations on one group interleaved with another group's (issue order
 *    on one communicator is kept); freeing a group with operations in
 *    flight while another group is busy.
 *  - Gentle waiting: while operations wait a second for a late rank, the
 *    engine sleeps between polls (CPU time well under the wall time).
 *
 * Every reduction is checked bit for bit against the rank-order sum
 * ((x0 + x1) + x2) + ..., computed here from the inputs.
 *
 * Arguments name the tests to run (crossed timing opposite split interleaved
 * free gentle); none runs them all.
 *
 * Output: rank 0 prints "ok" lines and one line "N passed, N failed" with
 * totals over all ranks; every rank prints its FAIL lines.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "internal.h"     /* white-box: reads zt_tensor's fields */
#include "mpi_ctest.h" /* CHECK, the tensors, the summary; the inputs */

static int world_ranks[64];

/* Seconds any one wait may take before the test calls it a hang. A healthy
 * engine needs well under a second for everything below, even with 4 ranks
 * on 2 cores. */
#define DEADLINE_S 20.0

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* ---- inputs and references (as test_mpi_comm.c) --------------------------- */
static zt_tensor *mk(int64_t n)
{
    return mt_tensor(ZT_TIER_DEVICE, ZT_CAT_ACTIVATIONS, ZT_F32, n);
}

static zt_tensor *mk_vals(uint32_t seed, int r, int64_t n)
{
    zt_tensor *t = mk(n);
    float *x = t->data;
    for (int64_t i = 0; i < n; i++) x[i] = val(seed, r, i);
    return t;
}

/* First index where x differs from the rank-order sum over ranks[0..nr), else -1. */
static int64_t diff_ref(const zt_tensor *t, uint32_t seed, const int *ranks, int nr)
{
    const float *x = t->data;
    for (int64_t i = 0; i < t->numel; i++) {
        float s = val(seed, ranks[0], i);
        for (int k = 1; k < nr; k++) s += val(seed, ranks[k], i);
        if (memcmp(&x[i], &s, 4) != 0) return i;
    }
    return -1;
}

/* Large tensors: values repeat with a prime period, so the reference needs
 * PER sums, not one per element. */
#define PER 65521
static zt_tensor *mk_periodic(uint32_t seed, int r, int64_t n)
{
    zt_tensor *t = mk(n);
    float *x = t->data;
    for (int64_t i = 0; i < n && i < PER; i++) x[i] = val(seed, r, i);
    for (int64_t i = PER; i < n; i++) x[i] = x[i - PER];
    return t;
}

static int64_t diff_periodic(const zt_tensor *t, uint32_t seed)
{
    static float ref[PER];
    for (int64_t i = 0; i < PER; i++) {
        ref[i] = val(seed, 0, i);
        for (int k = 1; k < P; k++) ref[i] += val(seed, k, i);
    }
    const float *x = t->data;
    for (int64_t i = 0; i < t->numel; i++)
        if (memcmp(&x[i], &ref[i % PER], 4) != 0) return i;
    return -1;
}

/* ---- waiting with a deadline ------------------------------------------------ */

/* The job cannot go on once a wait has hung (the engine may be stuck inside
 * MPI): report and end every rank. */
static void hung(const char *what)
{
    failed++;
    printf("rank %d: FAIL %s: not finished after %.0f s -- the operation is queued behind "
           "another communicator's (no independent progress)\n", R, what, DEADLINE_S);
    printf("%d passed, %d failed\n", passed, failed);
    fflush(NULL);
    zt_comm_abort(3);
}

/* Poll until done (sleeping between tests), then wait. Returns the result.
 * deadline 0: block in zt_comm_wait (no polling thread competing for the
 * cores), with the watchdog armed by the caller. */
static int wait_by(zt_comm_req *q, double deadline, const char *what)
{
    int done = 0;
    if (deadline == 0) return zt_comm_wait(q);
    for (;;) {
        int rc = zt_comm_test(q, &done);
        if (rc != ZT_OK) return rc;
        if (done) return zt_comm_wait(q);
        if (now() > deadline) hung(what);
        usleep(50);
    }
}

/* A blocking call cannot be polled: a watchdog thread ends the job if it
 * has not returned by the deadline. */
static pthread_mutex_t wd_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *wd_what;
static double wd_deadline;

static void *watchdog(void *arg)
{
    (void)arg;
    for (;;) {
        usleep(50000);
        pthread_mutex_lock(&wd_lock);
        const char *what = wd_what;
        int late = what && now() > wd_deadline;
        pthread_mutex_unlock(&wd_lock);
        if (late) hung(what);
    }
    return NULL;
}

static void watch(const char *what)
{
    pthread_mutex_lock(&wd_lock);
    wd_what = what;
    wd_deadline = now() + DEADLINE_S;
    pthread_mutex_unlock(&wd_lock);
}

static void unwatch(void)
{
    pthread_mutex_lock(&wd_lock);
    wd_what = NULL;
    pthread_mutex_unlock(&wd_lock);
}

/* One round trip between ranks 0 and 1 on g: rank 0 sends then receives,
 * rank 1 receives then sends (back the same tensor). Returns the result. */
static int ping_pong(zt_comm *g, zt_tensor *t, int tag, double deadline, const char *what)
{
    zt_comm_req *q = NULL;
    int rc;
    if (R == 0) {
        if ((rc = zt_send(g, t, 1, tag, &q)) != ZT_OK) return rc;
        if ((rc = wait_by(q, deadline, what)) != ZT_OK) return rc;
        if ((rc = zt_recv(g, t, 1, tag, &q)) != ZT_OK) return rc;
        return wait_by(q, deadline, what);
    }
    if (R == 1) {
        if ((rc = zt_recv(g, t, 0, tag, &q)) != ZT_OK) return rc;
        if ((rc = wait_by(q, deadline, what)) != ZT_OK) return rc;
        if ((rc = zt_send(g, t, 0, tag, &q)) != ZT_OK) return rc;
        return wait_by(q, deadline, what);
    }
    return ZT_OK;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---- tests --------------------------------------------------------------------- */
static zt_comm *A, *B;

/* Rank 0: all_reduce on A, then ping-pong on B. Rank 1: ping-pong on B, then
 * the all_reduce on A. Others: the all_reduce. */
static void test_crossed(void)
{
    const char *name = "crossed order: rank 0's ping-pong on B is not stuck behind its "
                       "all_reduce on A, which rank 1 joins only after the ping-pong";
    const int64_t n = (int64_t)4 << 20;            /* 16 MiB */
    zt_tensor *x = mk_periodic(1, R, n), *t = mk(256);
    double deadline = now() + DEADLINE_S;
    zt_comm_req *qa = NULL;
    int rc = ZT_OK, rc_pp = ZT_OK;
    for (int i = 0; i < 256; i++) ((float *)t->data)[i] = (float)(i + R);
    if (R == 1) {
        for (int k = 0; k < 3 && rc_pp == ZT_OK; k++) rc_pp = ping_pong(B, t, 5, deadline, name);
        rc = zt_all_reduce(A, x, &qa);
    } else {
        rc = zt_all_reduce(A, x, &qa);
        for (int k = 0; k < 3 && rc_pp == ZT_OK; k++) rc_pp = ping_pong(B, t, 5, deadline, name);
    }
    if (rc == ZT_OK) rc = wait_by(qa, deadline, name);
    int ok_t = 1;
    for (int i = 0; i < 256 && R <= 1; i++) ok_t &= ((float *)t->data)[i] == (float)i;
    CHECK(name, rc == ZT_OK && rc_pp == ZT_OK && ok_t, "rc %d ping-pong %d (%s), payload %s",
          rc, rc_pp, zt_last_error(), ok_t ? "ok" : "wrong");
    CHECK("crossed order: the all_reduce is the rank-order sum, bit for bit",
          rc == ZT_OK && diff_periodic(x, 1) == -1, "rc %d", rc);
    zt_tensor_release(x);
    zt_tensor_release(t);
}

/* The round trip alone, and while a large all_reduce runs on A. */
static void test_timing(void)
{
    enum { K = 2 };
    /* 48 MiB per rank (96 MiB at 2 ranks, 192 MiB at 4): with more ranks on
     * the same cores the round trips slow down as much as the all_reduce.
     * A round trip beside it takes a few of the all_reduce's steps (MPI
     * progresses every request in any MPI_Test, big copies included), so
     * the margin grows with the size. */
    const int64_t n = (int64_t)P * (12 << 20);
    zt_tensor *t = mk(256);
    double rtt[32], deadline = now() + DEADLINE_S;
    int rc = ZT_OK;
    zt_barrier(W, NULL);
    for (int k = 0; k < 15 && rc == ZT_OK; k++) {
        double t0 = now();
        rc = ping_pong(B, t, 6, deadline, "ping-pong alone");
        rtt[k] = now() - t0;
    }
    qsort(rtt, 15, sizeof *rtt, cmp_d);
    double alone = rtt[7];

    /* The all_reduce alone, for scale. */
    zt_tensor *x = mk_periodic(2, R, n);
    zt_barrier(W, NULL);
    double t0 = now();
    int rc_a = zt_all_reduce(A, x, NULL);
    double ar_alone = now() - t0;
    zt_tensor_release(x);

    /* Blocking waits from here: with 4 ranks on 2 cores, polling threads
     * would take the time slices the engines need. */
    x = mk_periodic(3, R, n);
    zt_barrier(W, NULL);
    zt_comm_req *qa = NULL;
    watch("ping-pong during an all_reduce");
    t0 = now();
    int rc_b = zt_all_reduce(A, x, &qa);
    double t_pp = 0;
    int ar_done_at_pp = -1;
    if (rc_b == ZT_OK && R <= 1) {
        for (int k = 0; k < K && rc == ZT_OK; k++) rc = ping_pong(B, t, 7, 0, NULL);
        t_pp = now() - t0;
        zt_comm_test(qa, &ar_done_at_pp);
    }
    if (rc_b == ZT_OK) rc_b = zt_comm_wait(qa);
    double t_ar = now() - t0;
    unwatch();
    if (R <= 1) {
        if (R == 0)
            printf("   ping-pong round trip alone %.1f us; all_reduce of %lld MiB on %d ranks "
                   "alone %.1f ms; with the all_reduce running, %d round trips took %.1f ms "
                   "(%.1f us each), the all_reduce %.1f ms\n", alone * 1e6,
                   (long long)(n >> 18), P, ar_alone * 1e3,
                   K, t_pp * 1e3, t_pp / K * 1e6, t_ar * 1e3);
        CHECK("ping-pong on B finishes while a large all_reduce on A is still running",
              rc == ZT_OK && rc_b == ZT_OK && ar_done_at_pp == 0,
              "rc %d %d (%s); all_reduce %s when the %d round trips were over (%.1f ms; "
              "all_reduce %.1f ms, alone %.1f ms)", rc, rc_b, zt_last_error(),
              ar_done_at_pp ? "already done" : "running", K, t_pp * 1e3, t_ar * 1e3,
              ar_alone * 1e3);
    }
    CHECK("all_reduce with a ping-pong beside it is the rank-order sum, bit for bit",
          rc_a == ZT_OK && rc_b == ZT_OK && diff_periodic(x, 3) == -1,
          "rc %d %d (%s)", rc_a, rc_b, zt_last_error());
    zt_tensor_release(x);
    zt_tensor_release(t);
}

/* Rank 0 issues A's all_reduce then B's; every other rank B's then A's. */
static void test_opposite_orders(void)
{
    const int64_t n = (int64_t)1 << 20;
    zt_tensor *a = mk_vals(11, R, n), *b = mk_vals(12, R, n);
    zt_comm_req *qa = NULL, *qb = NULL;
    double deadline = now() + DEADLINE_S;
    int rc;
    if (R == 0) rc = zt_all_reduce(A, a, &qa) | zt_all_reduce(B, b, &qb);
    else rc = zt_all_reduce(B, b, &qb) | zt_all_reduce(A, a, &qa);
    const char *name = "all_reduces on two groups issued in opposite orders on different ranks";
    int w1 = rc == ZT_OK ? wait_by(qa, deadline, name) : rc;
    int w2 = rc == ZT_OK ? wait_by(qb, deadline, name) : rc;
    CHECK(name, rc == ZT_OK && w1 == ZT_OK && w2 == ZT_OK &&
          diff_ref(a, 11, world_ranks, P) == -1 && diff_ref(b, 12, world_ranks, P) == -1,
          "rc %d waits %d %d (%s)", rc, w1, w2, zt_last_error());
    zt_tensor_release(a);
    zt_tensor_release(b);
}

/* Rank 0 has an all_reduce on A in flight that rank 1 joins only after a
 * split of the world: the split (blocking, so guarded by the watchdog) must
 * not wait behind the all_reduce. */
static void test_split_while_busy(void)
{
    const char *name = "split of the world while an all_reduce on A waits for the split's "
                       "other ranks";
    zt_tensor *x = mk_vals(21, R, 100000);
    double deadline = now() + DEADLINE_S;
    zt_comm *g = NULL;
    zt_comm_req *q = NULL;
    int rc = ZT_OK, rc_s;
    if (R == 0) rc = zt_all_reduce(A, x, &q);
    watch(name);
    rc_s = zt_comm_split(&g, W, 0, R);
    unwatch();
    if (R != 0) rc = zt_all_reduce(A, x, &q);
    if (rc == ZT_OK) rc = wait_by(q, deadline, name);
    CHECK(name, rc == ZT_OK && rc_s == ZT_OK && g && zt_comm_size(g) == P &&
          diff_ref(x, 21, world_ranks, P) == -1, "rc %d split %d (%s)", rc, rc_s,
          zt_last_error());
    zt_comm_free(g);
    zt_tensor_release(x);
}

/* Many operations on A interleaved with B's: on each communicator they reach
 * MPI in issue order (so every rank's collectives line up), and each sum is
 * still exact. */
static void test_interleaved(void)
{
    enum { K = 24 };
    zt_tensor *t[K];
    zt_comm_req *q[K];
    double deadline = now() + DEADLINE_S;
    int rc = ZT_OK;
    for (int k = 0; k < K; k++) {
        t[k] = mk_vals(40 + k, R, 1000 + 4001 * k);
        /* even k on A, odd on B; rank 0 issues its odd ones first */
        zt_comm *g = (k % 2 == 0) ? A : B;
        rc |= zt_all_reduce(g, t[k], &q[k]);
    }
    int ok = rc == ZT_OK;
    for (int k = K - 1; k >= 0; k--) {
        if (rc == ZT_OK) ok &= wait_by(q[k], deadline, "interleaved all_reduces") == ZT_OK;
        ok &= diff_ref(t[k], 40 + k, world_ranks, P) == -1;
        zt_tensor_release(t[k]);
    }
    CHECK("24 all_reduces interleaved on two groups, waited in reverse: each exact", ok,
          "rc %d (%s)", rc, zt_last_error());

    /* All four kinds on A while B carries sends: results unchanged. */
    const int64_t m = 7001;
    zt_tensor *in = mk_vals(60, R, (int64_t)P * m), *out = mk(m);
    zt_tensor *gat = mk((int64_t)P * m), *own = mk_vals(61, R, m), *bc = mk_vals(62, R, m);
    zt_tensor *s = mk(4096);
    zt_comm_req *qr, *qg, *qbc, *qbar, *qs = NULL;
    rc = zt_reduce_scatter(A, out, in, &qr) | zt_all_gather(A, gat, own, &qg) |
         zt_broadcast(A, bc, P - 1, &qbc) | zt_barrier(A, &qbar);
    if (rc == ZT_OK && R == 0) rc = zt_send(B, s, 1, 9, &qs);
    if (rc == ZT_OK && R == 1) rc = zt_recv(B, s, 0, 9, &qs);
    ok = rc == ZT_OK;
    if (ok && qs) ok &= wait_by(qs, deadline, "send on B beside A's collectives") == ZT_OK;
    if (rc == ZT_OK) {
        ok &= wait_by(qbar, deadline, "barrier") == ZT_OK;
        ok &= wait_by(qg, deadline, "all_gather") == ZT_OK;
        ok &= wait_by(qr, deadline, "reduce_scatter") == ZT_OK;
        ok &= wait_by(qbc, deadline, "broadcast") == ZT_OK;
    }
    /* reduce_scatter: chunk R of the rank-order sum */
    for (int64_t i = 0; i < m && ok; i++) {
        float want = val(60, 0, R * m + i);
        for (int r = 1; r < P; r++) want += val(60, r, R * m + i);
        ok = memcmp((float *)out->data + i, &want, 4) == 0;
    }
    for (int r = 0; r < P && ok; r++)
        for (int64_t i = 0; i < m && ok; i++) {
            float want = val(61, r, i);
            ok = memcmp((float *)gat->data + r * m + i, &want, 4) == 0;
        }
    int root = P - 1;
    ok = ok && diff_ref(bc, 62, &root, 1) == -1;
    CHECK("reduce_scatter, all_gather, broadcast, barrier on A with a send on B", ok,
          "rc %d (%s)", rc, zt_last_error());
    zt_tensor_release(in); zt_tensor_release(out); zt_tensor_release(gat);
    zt_tensor_release(own); zt_tensor_release(bc); zt_tensor_release(s);
}

/* A group freed with a large all_reduce in flight, while another group's
 * transfer runs: both finish, and the freed group's result is exact. */
static void test_free_in_flight(void)
{
    zt_comm *g = NULL;
    int rc = zt_comm_split(&g, W, 0, R);
    if (rc != ZT_OK) { CHECK("split for the free test", 0, "%s", zt_last_error()); return; }
    const int64_t n = (int64_t)2 << 20;
    zt_tensor *x = mk_vals(70, R, n), *s = mk(100000);
    zt_comm_req *qx = NULL, *qs = NULL;
    double deadline = now() + DEADLINE_S;
    rc = zt_all_reduce(g, x, &qx);
    zt_comm_free(g);
    if (rc == ZT_OK && R == 0) rc = zt_send(B, s, 1, 10, &qs);
    if (rc == ZT_OK && R == 1) rc = zt_recv(B, s, 0, 10, &qs);
    int w1 = qs ? wait_by(qs, deadline, "send beside a freed group") : ZT_OK;
    int w2 = rc == ZT_OK ? wait_by(qx, deadline, "all_reduce on a freed group") : rc;
    CHECK("group freed with an all_reduce in flight, another group busy", rc == ZT_OK &&
          w1 == ZT_OK && w2 == ZT_OK && diff_ref(x, 70, world_ranks, P) == -1,
          "rc %d waits %d %d (%s)", rc, w1, w2, zt_last_error());
    zt_tensor_release(x);
    zt_tensor_release(s);
}

/* While a collective on A and a receive on B wait a second for a late rank
 * 1, rank 0's engine sleeps between polls instead of spinning: the process
 * uses a small part of that second of CPU (the compute threads need it). */
static void test_gentle(void)
{
    const double late = 1.0;
    zt_tensor *x = mk_vals(80, R, 100000), *t = mk(1000);
    zt_comm_req *qa = NULL, *qr = NULL;
    double deadline = now() + DEADLINE_S;
    struct timespec c0, c1;
    int rc = ZT_OK;
    zt_barrier(W, NULL);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    double t0 = now();
    if (R == 1) {
        usleep((useconds_t)(late * 1e6));
        rc = zt_send(B, t, 0, 11, &qr) | zt_all_reduce(A, x, &qa);
    } else {
        rc = zt_all_reduce(A, x, &qa);
        if (rc == ZT_OK && R == 0) rc = zt_recv(B, t, 1, 11, &qr);
    }
    /* zt_comm_wait sleeps on a condition variable: the CPU is the engine's. */
    int w1 = qr && rc == ZT_OK ? zt_comm_wait(qr) : rc;
    int w2 = rc == ZT_OK ? wait_by(qa, deadline, "all_reduce with a late rank") : rc;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    double wall = now() - t0;
    double cpu = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
    if (R == 0) {
        printf("   waiting %.2f s for a late rank took %.3f s of CPU\n", wall, cpu);
        CHECK("waiting on a late rank does not spin: under 25% of a core", rc == ZT_OK &&
              w1 == ZT_OK && w2 == ZT_OK && wall >= 0.9 * late && cpu < 0.25 * wall,
              "rc %d %d %d (%s), %.3f s of CPU in %.3f s", rc, w1, w2, zt_last_error(), cpu,
              wall);
    }
    CHECK("the late all_reduce is the rank-order sum", w2 == ZT_OK &&
          diff_ref(x, 80, world_ranks, P) == -1, "rc %d", w2);
    zt_tensor_release(x);
    zt_tensor_release(t);
}

int main(int argc, char **argv)
{
    double t0 = now();
    if (mt_init(2)) return 1;
    for (int r = 0; r < P; r++) world_ranks[r] = r;
    int rc1 = zt_comm_split(&A, W, 0, R), rc2 = zt_comm_split(&B, W, 0, R);
    if (rc1 != ZT_OK || rc2 != ZT_OK) {
        printf("rank %d: FAIL splitting A and B: %s\n0 passed, 1 failed\n", R, zt_last_error());
        return 1;
    }

    pthread_t wd;
    pthread_create(&wd, NULL, watchdog, NULL);
    pthread_detach(wd);

    static const struct { const char *name; void (*fn)(void); } tests[] = {
        { "crossed", test_crossed }, { "timing", test_timing },
        { "opposite", test_opposite_orders }, { "split", test_split_while_busy },
        { "interleaved", test_interleaved }, { "free", test_free_in_flight },
        { "gentle", test_gentle },
    };
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        int run = argc < 2;
        for (int a = 1; a < argc; a++) run |= strcmp(argv[a], tests[i].name) == 0;
        if (run) tests[i].fn();
    }

    zt_comm_free(A);
    zt_comm_free(B);
    if (R == 0) fprintf(stderr, "test_mpi_progress: %d ranks, %.2f s\n", P, now() - t0);
    return mt_finish();
}
