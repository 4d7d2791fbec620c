/*
 * test_mpi_comm_stats.c -- the communication counters (comm_stats.c), run by
 * `make test` under `mpirun -np 2` and `-np 4`.
 *
 * Each kind of operation, alone between two resets, must count the bytes
 * its algorithm moves for this rank (the formulas of ztrain.h's contract,
 * written out here from the sizes), one call, and nothing under any other
 * kind. A rank held back makes the others wait: their exposed time must
 * show it, and lie within their busy time and the time they spent waiting.
 * No check bounds a wall-clock time from above (the machine is shared):
 * the ranks order themselves through a second communicator instead, and
 * what the counters cost per operation is measured by
 * tools/bench_comm_stats.c (make bench).
 *
 * Output as test_mpi_comm.c: rank 0 prints "ok" lines and the totals over
 * ranks; every rank prints its own FAIL lines.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "internal.h"     /* white-box: reads zt_tensor's fields */
#include "mpi_ctest.h" /* CHECK, the tensors, the summary */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static zt_tensor *mk(int64_t n)
{
    zt_tensor *t = mt_tensor(ZT_TIER_DEVICE, ZT_CAT_ACTIVATIONS, ZT_F32, n);
    memset(t->data, 0, (size_t)n * 4);
    return t;
}

/* After one operation of `kind`: exactly (sent, recv, 1 call) there, nothing
 * elsewhere, totals the sums. */
static void expect_only(const char *name, int kind, uint64_t sent, uint64_t recv)
{
    zt_comm_stats s;
    int rc = zt_comm_stats_get(W, &s);
    CHECK(name, rc == ZT_OK, "zt_comm_stats_get: %s", zt_last_error());
    char what[160];
    snprintf(what, sizeof what, "%s: %s bytes and one call", name, zt_comm_kind_name(kind));
    CHECK(what, s.kind[kind].sent == sent && s.kind[kind].recv == recv && s.kind[kind].calls == 1,
          "sent %llu recv %llu calls %llu; expected %llu %llu 1",
          (unsigned long long)s.kind[kind].sent, (unsigned long long)s.kind[kind].recv,
          (unsigned long long)s.kind[kind].calls, (unsigned long long)sent,
          (unsigned long long)recv);
    int others = 0;
    for (int k = 0; k < ZT_COMM_KINDS; k++)
        if (k != kind && (s.kind[k].sent || s.kind[k].recv || s.kind[k].calls)) others++;
    snprintf(what, sizeof what, "%s: no other kind counted, totals add up", name);
    CHECK(what, others == 0 && s.sent == sent && s.recv == recv && s.calls == 1,
          "%d other kinds; totals %llu %llu %llu", others, (unsigned long long)s.sent,
          (unsigned long long)s.recv, (unsigned long long)s.calls);
    zt_comm_stats_reset();
}

static void test_kinds(void)
{
    const uint64_t p = (uint64_t)P, r = (uint64_t)R;
    zt_comm_stats_reset();

    /* all_reduce: n not divisible by p, so chunk sizes differ by rank */
    const int64_t n = 1001;
    zt_tensor *x = mk(n);
    zt_all_reduce(W, x, NULL);
    uint64_t L = (uint64_t)n / p + (r < (uint64_t)n % p ? 1 : 0);
    uint64_t ar = 4 * ((uint64_t)n + (p - 2) * L);
    expect_only("all_reduce", ZT_COMM_KIND_ALL_REDUCE, ar, ar);

    /* reduce_scatter: m elements out, p*m in */
    const int64_t m = 37;
    zt_tensor *rs_out = mk(m), *rs_in = mk(m * P);
    zt_reduce_scatter(W, rs_out, rs_in, NULL);
    expect_only("reduce_scatter", ZT_COMM_KIND_REDUCE_SCATTER, 4 * m * (p - 1), 4 * m * (p - 1));

    zt_all_gather(W, rs_in, rs_out, NULL);
    expect_only("all_gather", ZT_COMM_KIND_ALL_GATHER, 4 * m * (p - 1), 4 * m * (p - 1));

    /* broadcast from the last rank: it sends to every other, they receive */
    zt_broadcast(W, x, P - 1, NULL);
    expect_only("broadcast", ZT_COMM_KIND_BROADCAST, R == P - 1 ? 4 * n * (p - 1) : 0,
                R == P - 1 ? 0 : 4 * n);

    /* a ring of transfers: to the next rank, from the previous */
    zt_tensor *buf = mk(50), *got = mk(50);
    zt_comm_req *sq = NULL, *rq = NULL;
    zt_recv(W, got, (R + P - 1) % P, 3, &rq);
    zt_send(W, buf, (R + 1) % P, 3, &sq);
    zt_comm_wait(sq);
    zt_comm_wait(rq);
    zt_comm_stats s;
    zt_comm_stats_get(W, &s);
    CHECK("send and recv counted apart",
          s.kind[ZT_COMM_KIND_SEND].sent == 4 * 50 && s.kind[ZT_COMM_KIND_SEND].recv == 0 &&
          s.kind[ZT_COMM_KIND_RECV].recv == 4 * 50 && s.kind[ZT_COMM_KIND_RECV].sent == 0 &&
          s.kind[ZT_COMM_KIND_SEND].calls == 1 && s.kind[ZT_COMM_KIND_RECV].calls == 1,
          "send %llu/%llu recv %llu/%llu",
          (unsigned long long)s.kind[ZT_COMM_KIND_SEND].sent,
          (unsigned long long)s.kind[ZT_COMM_KIND_SEND].calls,
          (unsigned long long)s.kind[ZT_COMM_KIND_RECV].recv,
          (unsigned long long)s.kind[ZT_COMM_KIND_RECV].calls);
    zt_comm_stats_reset();

    zt_barrier(W, NULL);
    expect_only("barrier", ZT_COMM_KIND_BARRIER, 0, 0);

    char hin[16] = { 0 }, hout[16 * 64];
    zt_comm_all_gather_host(W, hout, hin, sizeof hin);
    expect_only("host all_gather", ZT_COMM_KIND_HOST, 16 * (p - 1), 16 * (p - 1));

    zt_comm *g = NULL;
    zt_comm_split(&g, W, R % 2, R);
    expect_only("split", ZT_COMM_KIND_OTHER, 0, 0);
    zt_comm_free(g);

    zt_tensor_release(x);
    zt_tensor_release(rs_out);
    zt_tensor_release(rs_in);
    zt_tensor_release(buf);
    zt_tensor_release(got);
}

/* "go" from every rank to every other on g, a communicator of its own (the
 * engine progresses it beside an operation in flight on W): a rank's
 * operation on W issued before go cannot complete before another rank's
 * issued after it. */
static void go(zt_comm *g)
{
    int me = R, all[64];
    int rc = zt_comm_all_gather_host(g, all, &me, sizeof me);
    CHECK("go (an all_gather_host on a second communicator)", rc == ZT_OK, "%s", zt_last_error());
}

/* Rank 0 arrives late at a barrier: the others were blocked (exposed) for
 * it, no longer than they waited, inside their busy time. Ordered through
 * a second communicator, not timed: nothing here fails on a slow machine. */
static void test_time(void)
{
    zt_comm *g = NULL;
    int rc = zt_comm_split(&g, W, 0, R);
    CHECK("a second communicator for go", rc == ZT_OK, "%s", zt_last_error());
    if (rc != ZT_OK || P > 64) return;

    /* the others issue the barrier, say go, then wait; rank 0 issues it
     * 80 ms after go */
    zt_comm_req *q = NULL;
    zt_comm_stats s;
    if (R != 0) zt_barrier(W, &q);
    go(g);
    zt_comm_stats_reset();
    double t0 = now();
    if (R == 0) { usleep(80000); zt_barrier(W, &q); }
    zt_comm_wait(q);
    double waited = now() - t0;
    zt_comm_stats_get(W, &s);
    if (R != 0) {
        CHECK("a late peer shows as exposed time, no more than the wait took",
              s.exposed_s > 0 && s.exposed_s <= waited + 1e-3, "exposed %.4f s, waited %.4f s",
              s.exposed_s, waited);
    }
    CHECK("exposed lies within busy", s.busy_s >= s.exposed_s - 1e-3,
          "busy %.4f s exposed %.4f s", s.busy_s, s.exposed_s);

    /* an operation left in flight: the open interval counts in a snapshot
     * (rank 0 issues its barrier only after the others' snapshots) */
    zt_barrier(W, NULL);
    zt_comm_stats_reset();
    q = NULL;
    if (R != 0) {
        zt_barrier(W, &q);
        usleep(20000);
        zt_comm_stats_get(W, &s);
        CHECK("busy includes an operation still in flight", s.busy_s >= 0.02,
              "busy %.4f s after 20 ms in flight", s.busy_s);
    }
    go(g);
    if (R == 0) zt_barrier(W, &q);
    zt_comm_wait(q);

    /* finished before its wait (zt_comm_test saw it done): hidden, not exposed */
    zt_barrier(W, NULL);
    zt_comm_stats_reset();
    zt_barrier(W, &q);
    int done = 0;
    for (double t = now(); !done && now() - t < 60; usleep(1000)) zt_comm_test(q, &done);
    zt_comm_wait(q);
    zt_comm_stats_get(W, &s);
    CHECK("an operation finished before its wait is not exposed", done && s.exposed_s == 0,
          "done %d, exposed %.6f s", done, s.exposed_s);
    zt_comm_free(g);
}

static void test_api(void)
{
    CHECK("kind names", strcmp(zt_comm_kind_name(ZT_COMM_KIND_ALL_REDUCE), "all_reduce") == 0 &&
          strcmp(zt_comm_kind_name(ZT_COMM_KIND_OTHER), "other") == 0 &&
          zt_comm_kind_name(ZT_COMM_KINDS) == NULL && zt_comm_kind_name(-1) == NULL, "names");
    int rc = zt_comm_stats_get(W, NULL);
    CHECK("stats_get(NULL) is an error naming the argument",
          rc == ZT_EINVAL && strstr(zt_last_error(), "out is NULL"), "rc %d: %s", rc, zt_last_error());
}

int main(void)
{
    if (mt_init(1)) return 1;
    test_api();
    test_kinds();
    test_time();

    return mt_finish();
}
