/*
 * test_mpi_comm.c -- the MPI transport, run by `make test` under
 * `mpirun -np 2` and `-np 4`.
 *
 * Every rank runs every check. Inputs are a known function of (seed, rank,
 * index), so each rank computes the expected result of a reduction itself: a
 * sequential f32 sum in rank order, compared bit for bit. Values span
 * several binary exponents so that a different summation order would give
 * different bits (checked where the world has >= 3 ranks).
 *
 * Output: rank 0 prints "ok" lines and, at the end, one line "N passed, N
 * failed" with totals over all ranks; every rank prints its FAIL lines
 * prefixed with its rank. The exit status is nonzero on any failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "internal.h"     /* white-box: reads zt_tensor's fields */
#include "comm.h"      /* zt_comm_tune: small rounds and messages */
#include "mpi_ctest.h" /* CHECK, the tensors, the summary; the inputs */

/* ---- inputs and references ------------------------------------------------ */

/* Sum over ranks[0..n) in that order: ((v0 + v1) + v2) + ... */
static float ref_sum(uint32_t seed, const int *ranks, int n, int64_t i)
{
    float s = val(seed, ranks[0], i);
    for (int k = 1; k < n; k++) s += val(seed, ranks[k], i);
    return s;
}

static int world_ranks[64];

static zt_tensor *mk(int tier, int dtype, int64_t n)
{
    return mt_tensor(tier, ZT_CAT_ACTIVATIONS, dtype, n);
}

static zt_tensor *mk_vals(uint32_t seed, int r, int64_t n, int64_t first)
{
    zt_tensor *t = mk(ZT_TIER_DEVICE, ZT_F32, n);
    float *x = t->data;
    for (int64_t i = 0; i < n; i++) x[i] = val(seed, r, first + i);
    return t;
}

/* First index where x differs from the rank-order sum over ranks, else -1. */
static int64_t diff_ref(const float *x, uint32_t seed, const int *ranks, int nr,
                        int64_t first, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float want = ref_sum(seed, ranks, nr, first + i);
        if (memcmp(&x[i], &want, 4) != 0) return i;
    }
    return -1;
}

/* ---- tests ------------------------------------------------------------------ */
static void test_world(void)
{
    const char *sz = getenv("OMPI_COMM_WORLD_SIZE"), *rk = getenv("OMPI_COMM_WORLD_RANK");
    CHECK("backend is mpi", strcmp(zt_comm_backend(W), "mpi") == 0, "backend %s",
          zt_comm_backend(W));
    CHECK("world size and rank from the launcher",
          (!sz || atoi(sz) == P) && (!rk || atoi(rk) == R), "size %d rank %d env %s/%s",
          P, R, sz ? sz : "-", rk ? rk : "-");
    zt_comm *again = NULL;
    CHECK("zt_comm_world returns the same world", zt_comm_world(&again) == ZT_OK && again == W,
          "%p vs %p", (void *)again, (void *)W);
}

static void check_all_reduce(const char *name, uint32_t seed, int64_t n)
{
    zt_tensor *x = mk_vals(seed, R, n, 0);
    int rc = zt_all_reduce(W, x, NULL);
    int64_t at = rc == ZT_OK ? diff_ref(x->data, seed, world_ranks, P, 0, n) : -2;
    char nm[128];
    snprintf(nm, sizeof nm, "all_reduce bit-exact rank-order sum, %s (numel %lld)", name,
             (long long)n);
    CHECK(nm, at == -1, "rc %d (%s), first difference at %lld", rc, zt_last_error(),
          (long long)at);
    zt_tensor_release(x);
}

static void test_all_reduce(void)
{
    check_all_reduce("1 element", 11, 1);
    if (P > 1) check_all_reduce("numel < size", 12, P - 1);
    check_all_reduce("numel = size + 1", 13, P + 1);
    check_all_reduce("not divisible by size", 14, 100003);
    zt_comm_tune(4096, 0);          /* rounds of 1024 / size elements per chunk */
    check_all_reduce("many rounds", 15, 20011);
    zt_comm_tune(0, 0);
    check_all_reduce("1M elements", 16, 1 << 20);

    if (P >= 3) {   /* the reference is order-sensitive, so the checks mean something */
        int rev[64];
        for (int r = 0; r < P; r++) rev[r] = P - 1 - r;
        int64_t differ = 0;
        for (int64_t i = 0; i < 100003; i++) {
            float a = ref_sum(14, world_ranks, P, i), b = ref_sum(14, rev, P, i);
            differ += memcmp(&a, &b, 4) != 0;
        }
        CHECK("reverse rank order gives other bits (test is order-sensitive)", differ > 0,
              "no element differs");
    }
}

static void check_reduce_scatter(const char *name, uint32_t seed, int64_t m, int inplace)
{
    zt_tensor *in = mk_vals(seed, R, (int64_t)P * m, 0), *out;
    if (inplace) {
        int64_t s = m;
        zt_tensor_view(&out, in, (int64_t)R * m, 1, &s);
    } else {
        out = mk(ZT_TIER_DEVICE, ZT_F32, m);
    }
    int rc = zt_reduce_scatter(W, out, in, NULL);
    int64_t at = rc == ZT_OK ? diff_ref(out->data, seed, world_ranks, P, (int64_t)R * m, m) : -2;
    char nm[128];
    snprintf(nm, sizeof nm, "reduce_scatter bit-exact rank-order sum, %s (chunk %lld)", name,
             (long long)m);
    CHECK(nm, at == -1, "rc %d (%s), first difference at %lld", rc, zt_last_error(),
          (long long)at);
    zt_tensor_release(out);
    zt_tensor_release(in);
}

static void test_reduce_scatter(void)
{
    check_reduce_scatter("1 element chunks", 21, 1, 0);
    check_reduce_scatter("odd chunk", 22, 7777, 0);
    check_reduce_scatter("in place (out = own chunk of in)", 23, 5001, 1);
    zt_comm_tune(1000, 0);
    check_reduce_scatter("many rounds", 24, 3001, 0);
    zt_comm_tune(0, 0);

    /* all_reduce == reduce_scatter + all_gather, bit for bit */
    const int64_t m = 33333, n = (int64_t)P * m;
    zt_tensor *a = mk_vals(25, R, n, 0), *in = mk_vals(25, R, n, 0);
    zt_tensor *chunk = mk(ZT_TIER_DEVICE, ZT_F32, m), *full = mk(ZT_TIER_DEVICE, ZT_F32, n);
    int rc1 = zt_all_reduce(W, a, NULL);
    int rc2 = zt_reduce_scatter(W, chunk, in, NULL);
    int rc3 = zt_all_gather(W, full, chunk, NULL);
    CHECK("all_reduce == reduce_scatter + all_gather (bitwise)",
          rc1 == ZT_OK && rc2 == ZT_OK && rc3 == ZT_OK &&
          memcmp(a->data, full->data, (size_t)n * 4) == 0, "rc %d %d %d", rc1, rc2, rc3);
    zt_tensor_release(a); zt_tensor_release(in); zt_tensor_release(chunk); zt_tensor_release(full);
}

static void check_all_gather(const char *name, int dtype, int64_t m, int inplace)
{
    size_t es = zt_dtype_size(dtype);
    zt_tensor *out = mk(ZT_TIER_DEVICE, dtype, (int64_t)P * m), *in;
    if (inplace) zt_tensor_view(&in, out, (int64_t)R * m, 1, &m);
    else in = mk(ZT_TIER_DEVICE, dtype, m);
    unsigned char *b = in->data;
    for (size_t i = 0; i < (size_t)m * es; i++) b[i] = (unsigned char)(mix((uint64_t)R * 1000003 + i));
    int rc = zt_all_gather(W, out, in, NULL);
    int ok = rc == ZT_OK;
    const unsigned char *o = out->data;
    for (int r = 0; r < P && ok; r++)
        for (size_t i = 0; i < (size_t)m * es; i++)
            if (o[(size_t)r * m * es + i] != (unsigned char)(mix((uint64_t)r * 1000003 + i))) {
                ok = 0;
                break;
            }
    char nm[128];
    snprintf(nm, sizeof nm, "all_gather %s %s (numel %lld per rank)", zt_dtype_name(dtype),
             name, (long long)m);
    CHECK(nm, ok, "rc %d (%s) or wrong bytes", rc, zt_last_error());
    zt_tensor_release(in);
    zt_tensor_release(out);
}

static void test_all_gather(void)
{
    check_all_gather("", ZT_F32, 1, 0);
    check_all_gather("", ZT_BF16, 12345, 0);
    check_all_gather("in place", ZT_I32, 4321, 1);
    zt_comm_tune(0, 256);           /* messages of 256 bytes: many rounds */
    check_all_gather("small messages", ZT_U16, 1001, 0);
    check_all_gather("small messages in place", ZT_F32, 999, 1);
    zt_comm_tune(0, 0);
}

static void test_broadcast(void)
{
    const int64_t n = 10007;
    int ok = 1;
    for (int root = 0; root < P; root++) {
        zt_tensor *x = mk_vals(31, R, n, 0);
        int rc = zt_broadcast(W, x, root, NULL);
        int64_t at = diff_ref(x->data, 31, &root, 1, 0, n);
        if (rc != ZT_OK || at != -1) {
            ok = 0;
            printf("rank %d: broadcast from root %d: rc %d (%s), first difference %lld\n",
                   R, root, rc, zt_last_error(), (long long)at);
        }
        zt_tensor_release(x);
    }
    CHECK("broadcast from every root", ok, "see above");

    zt_comm_tune(0, 1000);          /* 500 u16 per message */
    zt_tensor *y = mk(ZT_TIER_HOST, ZT_U16, 4099);
    uint16_t *u = y->data;
    for (int i = 0; i < 4099; i++) u[i] = (uint16_t)(R == P - 1 ? i * 7 + 1 : 0);
    int rc = zt_broadcast(W, y, P - 1, NULL);
    ok = rc == ZT_OK;
    for (int i = 0; i < 4099 && ok; i++) ok = u[i] == (uint16_t)(i * 7 + 1);
    CHECK("broadcast u16 host tensor in several messages", ok, "rc %d (%s)", rc, zt_last_error());
    zt_comm_tune(0, 0);
    zt_tensor_release(y);
}

static void check_ring(const char *name, int64_t n)
{
    if (P < 2) return;
    int right = (R + 1) % P, left = (R + P - 1) % P;
    zt_tensor *s = mk_vals(41, R, n, 0), *r = mk(ZT_TIER_DEVICE, ZT_F32, n);
    zt_comm_req *rs = NULL, *rr = NULL;
    int rc1 = zt_send(W, s, right, 7, &rs);
    int rc2 = zt_recv(W, r, left, 7, &rr);
    int rc3 = zt_comm_wait(rr);
    int rc4 = zt_comm_wait(rs);
    int64_t at = diff_ref(r->data, 41, &left, 1, 0, n);
    char nm[128];
    snprintf(nm, sizeof nm, "send/recv ring %s (%lld elements)", name, (long long)n);
    CHECK(nm, rc1 == 0 && rc2 == 0 && rc3 == 0 && rc4 == 0 && at == -1,
          "rc %d %d %d %d (%s), first difference %lld", rc1, rc2, rc3, rc4, zt_last_error(),
          (long long)at);
    zt_tensor_release(s);
    zt_tensor_release(r);
}

static void test_p2p(void)
{
    check_ring("small", 5);
    check_ring("large (rendezvous)", 1 << 20);
    zt_comm_tune(0, 4000);
    check_ring("in many messages", 30001);
    zt_comm_tune(0, 0);

    /* A send still in flight while a collective runs, the matching receive
     * issued after it: no deadlock, whatever the size. */
    if (P >= 2) {
        const int64_t n = 1 << 19;
        zt_tensor *t = R == 0 ? mk_vals(42, 0, n, 0) : mk(ZT_TIER_DEVICE, ZT_F32, n);
        zt_tensor *a = mk_vals(43, R, 1000, 0);
        zt_comm_req *rq = NULL;
        int rc1 = 0, rc2, rc3 = 0;
        if (R == 0) rc1 = zt_send(W, t, 1, 3, &rq);
        rc2 = zt_all_reduce(W, a, NULL);
        if (R == 1) rc3 = zt_recv(W, t, 0, 3, NULL);
        if (R == 0) rc3 = zt_comm_wait(rq);
        int zero = 0;
        int ok = rc1 == 0 && rc2 == 0 && rc3 == 0 &&
                 diff_ref(a->data, 43, world_ranks, P, 0, 1000) == -1 &&
                 (R != 1 || diff_ref(t->data, 42, &zero, 1, 0, n) == -1);
        CHECK("send in flight across a collective, then blocking recv", ok, "rc %d %d %d (%s)",
              rc1, rc2, rc3, zt_last_error());
        zt_tensor_release(t);
        zt_tensor_release(a);
    }
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void test_barrier(void)
{
    int rc = zt_barrier(W, NULL);
    CHECK("barrier", rc == ZT_OK, "rc %d (%s)", rc, zt_last_error());
    /* Rank 0 arrives 150 ms late: nobody may leave before it arrived. The
     * ranks share one machine's CLOCK_MONOTONIC: rank 0's arrival time,
     * broadcast after, against each rank's leaving time (no bound on how
     * long anything took: a loaded machine cannot fail it). */
    if (R == 0) usleep(150000);
    double arrived = now();
    zt_comm_req *q = NULL;
    rc = zt_barrier(W, &q);
    if (rc == ZT_OK) rc = zt_comm_wait(q);
    double left = now();
    int rc_b = zt_comm_broadcast_host(W, &arrived, sizeof arrived, 0);
    CHECK("async barrier waits for the last rank", rc == ZT_OK && rc_b == ZT_OK && left >= arrived,
          "rc %d %d, left %.4f s before rank 0 arrived", rc, rc_b, arrived - left);
}

/* A fence moves nothing with checking off; with it on, a rank still in
 * another collective fails it and the others' fence alike, naming both,
 * and a fence more leaves the ranks level (the multi-rank REPL's end of a
 * chunk). */
static void test_fence(void)
{
    int rc = zt_comm_fence(W, NULL);
    CHECK("fence, checking off", rc == ZT_OK, "rc %d (%s)", rc, zt_last_error());
    zt_comm_watch(0, 1);
    zt_tensor *x = mk_vals(41, R, 8, 0);
    rc = R == 0 ? zt_all_reduce(W, x, NULL) : zt_comm_fence(W, NULL);
    CHECK("rank 0's all_reduce meets the others' fence: both fail, naming both",
          rc == ZT_EINVAL && has("differs between ranks: rank 0 calls all_reduce (f32, 8 elements)") &&
          has("rank 1 calls a fence at"), "rc %d msg %s", rc, zt_last_error());
    rc = R == 0 ? zt_comm_fence(W, NULL) : ZT_OK;
    zt_comm_req *q = NULL;
    if (R != 0) rc = zt_comm_fence(W, &q);
    if (rc == ZT_OK && q) rc = zt_comm_wait(q);
    CHECK("a fence more: level again (blocking and async)", rc == ZT_OK, "rc %d (%s)", rc, zt_last_error());
    rc = zt_all_reduce(W, x, NULL);
    CHECK("then a collective sums as ever", rc == ZT_OK && diff_ref(x->data, 41, world_ranks, P, 0, 8) < 0,
          "rc %d (%s)", rc, zt_last_error());
    zt_comm_watch(0, 0);
    zt_tensor_release(x);
}

static void test_async(void)
{
    /* Issue several, wait in another order. */
    const int64_t n = 200001, m = 3001;
    zt_tensor *a = mk_vals(51, R, n, 0);
    zt_tensor *gin = mk_vals(52, R, m, 0), *gout = mk(ZT_TIER_DEVICE, ZT_F32, (int64_t)P * m);
    zt_tensor *b = mk_vals(53, R, m, 0);
    zt_comm_req *qa, *qg, *qb, *qz;
    int root = P - 1;
    int rc = zt_all_reduce(W, a, &qa) | zt_all_gather(W, gout, gin, &qg) |
             zt_broadcast(W, b, root, &qb) | zt_barrier(W, &qz);
    int w1 = zt_comm_wait(qz), w2 = zt_comm_wait(qb), w3 = zt_comm_wait(qa),
        w4 = zt_comm_wait(qg);
    int ok = rc == 0 && w1 == 0 && w2 == 0 && w3 == 0 && w4 == 0 &&
             diff_ref(a->data, 51, world_ranks, P, 0, n) == -1 &&
             diff_ref(b->data, 53, &root, 1, 0, m) == -1;
    for (int r = 0; r < P && ok; r++)
        ok = diff_ref((float *)gout->data + (size_t)r * m, 52, &r, 1, 0, m) == -1;
    CHECK("async ops waited in another order than issued", ok, "rc %d waits %d %d %d %d",
          rc, w1, w2, w3, w4);
    zt_tensor_release(a); zt_tensor_release(gin); zt_tensor_release(gout); zt_tensor_release(b);

    /* Many in flight, waited last to first. */
    enum { K = 40 };
    zt_tensor *t[K];
    zt_comm_req *q[K];
    rc = 0;
    for (int k = 0; k < K; k++) {
        t[k] = mk_vals(100 + k, R, 100 + k * 37, 0);
        rc |= zt_all_reduce(W, t[k], &q[k]);
    }
    ok = rc == 0;
    for (int k = K - 1; k >= 0; k--) {
        ok &= zt_comm_wait(q[k]) == ZT_OK;
        ok &= diff_ref(t[k]->data, 100 + k, world_ranks, P, 0, 100 + k * 37) == -1;
        zt_tensor_release(t[k]);
    }
    CHECK("40 async all_reduces in flight, waited in reverse", ok, "rc %d", rc);

    /* Polling with zt_comm_test. */
    zt_tensor *x = mk_vals(54, R, 1 << 20, 0);
    zt_comm_req *qx = NULL;
    rc = zt_all_reduce(W, x, &qx);
    int done = 0, polls = 0;
    double t0 = now();
    while (rc == ZT_OK && !done && now() - t0 < 20) {
        rc = zt_comm_test(qx, &done);
        polls++;
        if (!done) usleep(100);
    }
    int wrc = rc == ZT_OK ? zt_comm_wait(qx) : -99;
    CHECK("zt_comm_test polls until done, then wait", rc == ZT_OK && done && wrc == ZT_OK &&
          diff_ref(x->data, 54, world_ranks, P, 0, 1 << 20) == -1,
          "rc %d done %d polls %d wait %d", rc, done, polls, wrc);
    zt_tensor_release(x);

    /* The caller may drop its tensors while an operation is in flight. */
    size_t act = zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_ACTIVATIONS);
    zt_tensor *y = mk_vals(55, R, 300000, 0);
    rc = zt_all_reduce(W, y, &qx);
    zt_tensor_release(y);
    wrc = rc == ZT_OK ? zt_comm_wait(qx) : -99;
    CHECK("tensor released while in flight: kept alive, then freed",
          rc == ZT_OK && wrc == ZT_OK && zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_ACTIVATIONS) == act,
          "rc %d wait %d activations %zu -> %zu", rc, wrc, act,
          zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_ACTIVATIONS));
}

static void test_split(void)
{
    zt_comm *g = NULL;
    int rc = zt_comm_split(&g, W, R % 2, R);
    int members[64], nm = 0;
    for (int r = R % 2; r < P; r += 2) members[nm++] = r;
    CHECK("split into even/odd groups", rc == ZT_OK && g && zt_comm_size(g) == nm &&
          zt_comm_rank(g) == R / 2 && strcmp(zt_comm_backend(g), "mpi") == 0,
          "rc %d (%s) size %d rank %d", rc, zt_last_error(), zt_comm_size(g), zt_comm_rank(g));
    if (rc != ZT_OK) return;
    zt_tensor *x = mk_vals(61, R, 5003, 0);
    rc = zt_all_reduce(g, x, NULL);
    CHECK("all_reduce within a group sums the group's ranks in order",
          rc == ZT_OK && diff_ref(x->data, 61, members, nm, 0, 5003) == -1, "rc %d (%s)", rc,
          zt_last_error());
    const int64_t m = 1001;
    zt_tensor *in = mk_vals(62, R, (int64_t)nm * m, 0), *out = mk(ZT_TIER_DEVICE, ZT_F32, m);
    rc = zt_reduce_scatter(g, out, in, NULL);
    CHECK("reduce_scatter within a group", rc == ZT_OK &&
          diff_ref(out->data, 62, members, nm, (int64_t)(R / 2) * m, m) == -1, "rc %d (%s)", rc,
          zt_last_error());
    zt_tensor_release(x); zt_tensor_release(in); zt_tensor_release(out);
    zt_comm_free(g);

    /* key orders the group: reversed keys reverse the ranks and the sum. */
    rc = zt_comm_split(&g, W, 0, -R);
    int rev[64];
    for (int r = 0; r < P; r++) rev[r] = P - 1 - r;
    zt_tensor *y = mk_vals(63, R, 4001, 0);
    int rc2 = rc == ZT_OK ? zt_all_reduce(g, y, NULL) : rc;
    CHECK("split by key: rank order follows the key, and so does the sum",
          rc == ZT_OK && zt_comm_rank(g) == P - 1 - R && rc2 == ZT_OK &&
          diff_ref(y->data, 63, rev, P, 0, 4001) == -1, "rc %d %d (%s)", rc, rc2, zt_last_error());
    zt_tensor_release(y);
    /* free with an operation still queued on the group: it runs first */
    zt_comm_req *q = NULL;
    rc = zt_barrier(g, &q);
    zt_comm_free(g);
    rc2 = rc == ZT_OK ? zt_comm_wait(q) : rc;
    CHECK("zt_comm_free after an async op on the group", rc == ZT_OK && rc2 == ZT_OK,
          "rc %d %d", rc, rc2);
    /* free a group while a large send on it is still in flight */
    if (P >= 2 && zt_comm_split(&g, W, 0, R) == ZT_OK) {
        const int64_t n = 1 << 19;
        zt_tensor *t = R == 0 ? mk_vals(64, 0, n, 0) : mk(ZT_TIER_DEVICE, ZT_F32, n);
        int zero = 0;
        rc = rc2 = ZT_OK;
        q = NULL;
        if (R == 0) rc = zt_send(g, t, 1, 1, &q);
        if (R == 1) usleep(50000);          /* the send is surely in flight */
        if (R == 1) rc = zt_recv(g, t, 0, 1, NULL);
        zt_comm_free(g);
        if (R == 0) rc2 = rc == ZT_OK ? zt_comm_wait(q) : rc;
        CHECK("zt_comm_free with a transfer in flight on the group", rc == ZT_OK &&
              rc2 == ZT_OK && (R != 1 || diff_ref(t->data, 64, &zero, 1, 0, n) == -1),
              "rc %d %d (%s)", rc, rc2, zt_last_error());
        zt_tensor_release(t);
    }
    zt_comm_free(W);    /* the world is not freed */
    CHECK("zt_comm_free(world) is a no-op", zt_barrier(W, NULL) == ZT_OK, "%s", zt_last_error());
}

static void test_host(void)
{
    struct { int rank; double x; } me = { R, R * 1.5 }, all[64];
    int rc = zt_comm_all_gather_host(W, all, &me, sizeof me);
    int ok = rc == ZT_OK;
    for (int r = 0; r < P && ok; r++) ok = all[r].rank == r && all[r].x == r * 1.5;
    CHECK("all_gather_host", ok, "rc %d (%s)", rc, zt_last_error());
    int slots[64];
    slots[R] = R * 10 + 1;
    rc = zt_comm_all_gather_host(W, slots, &slots[R], sizeof(int));
    ok = rc == ZT_OK;
    for (int r = 0; r < P && ok; r++) ok = slots[r] == r * 10 + 1;
    CHECK("all_gather_host in place", ok, "rc %d (%s)", rc, zt_last_error());
    ok = 1;
    for (int root = 0; root < P; root++) {
        char buf[32];
        snprintf(buf, sizeof buf, "from %d at %d", root, R);
        rc = zt_comm_broadcast_host(W, buf, sizeof buf, root);
        char want[32];
        snprintf(want, sizeof want, "from %d at %d", root, root);
        if (rc != ZT_OK || strcmp(buf, want) != 0) ok = 0;
    }
    CHECK("broadcast_host from every root", ok, "rc %d (%s)", rc, zt_last_error());
}


static void test_errors(void)
{
    zt_tensor *f = mk(ZT_TIER_DEVICE, ZT_F32, 10), *g = mk(ZT_TIER_DEVICE, ZT_F32, 3);
    zt_tensor *h = mk(ZT_TIER_DEVICE, ZT_BF16, 10 * P);
    zt_comm_req *q = (zt_comm_req *)&q;
    int rc = zt_reduce_scatter(W, g, f, &q);
    CHECK("reduce_scatter with in != size x out is EINVAL", rc == ZT_EINVAL && q == NULL &&
          has("size x numel(out)"), "rc %d q %p msg %s", rc, (void *)q, zt_last_error());
    rc = zt_all_gather(W, f, g, NULL);
    CHECK("all_gather with out != size x in is EINVAL", rc == ZT_EINVAL &&
          has("size x numel(in)"), "rc %d msg %s", rc, zt_last_error());
    rc = zt_all_gather(W, h, f, NULL);
    CHECK("all_gather with mixed dtypes is EINVAL", rc == ZT_EINVAL && has("dtypes must match"),
          "rc %d msg %s", rc, zt_last_error());
    rc = zt_all_reduce(W, h, NULL);
    CHECK("all_reduce of bf16 is EINVAL", rc == ZT_EINVAL && has("must be f32"),
          "rc %d msg %s", rc, zt_last_error());
    rc = zt_reduce_scatter(W, g, h, NULL);
    CHECK("reduce_scatter of bf16 is EINVAL", rc == ZT_EINVAL && has("must be f32"),
          "rc %d msg %s", rc, zt_last_error());
    rc = zt_broadcast(W, f, P, NULL);
    CHECK("broadcast with root = size is EINVAL", rc == ZT_EINVAL && has("root"),
          "rc %d msg %s", rc, zt_last_error());
    rc = zt_broadcast(W, f, -1, NULL);
    CHECK("broadcast with root -1 is EINVAL", rc == ZT_EINVAL && has("root -1"),
          "rc %d msg %s", rc, zt_last_error());
    rc = zt_send(W, f, R, 0, NULL);
    CHECK("send to oneself is EINVAL", rc == ZT_EINVAL && has("itself"), "rc %d msg %s", rc,
          zt_last_error());
    rc = zt_recv(W, f, P, 0, NULL);
    CHECK("recv from peer = size is EINVAL", rc == ZT_EINVAL && has("peer"), "rc %d msg %s",
          rc, zt_last_error());
    rc = zt_send(W, f, (R + 1) % P, 40000, NULL);
    CHECK("send with tag out of range is EINVAL", rc == ZT_EINVAL && (P == 1 || has("tag")),
          "rc %d msg %s", rc, zt_last_error());
    zt_comm *sub = NULL;
    rc = zt_comm_split(&sub, W, -1, 0);
    CHECK("split with a negative color is EINVAL", rc == ZT_EINVAL && sub == NULL &&
          has("color"), "rc %d msg %s", rc, zt_last_error());
    rc = zt_all_reduce(NULL, f, NULL);
    CHECK("NULL communicator is EINVAL", rc == ZT_EINVAL && has("zt_comm_world"),
          "rc %d msg %s", rc, zt_last_error());
    rc = zt_all_reduce(W, NULL, NULL);
    CHECK("NULL tensor is EINVAL", rc == ZT_EINVAL && has("NULL"), "rc %d msg %s", rc,
          zt_last_error());
    rc = zt_comm_broadcast_host(W, &rc, sizeof rc, P);
    CHECK("broadcast_host with a bad root is EINVAL", rc == ZT_EINVAL, "rc %d", rc);
    CHECK("zt_comm_wait(NULL) is EINVAL", zt_comm_wait(NULL) == ZT_EINVAL, "%s", zt_last_error());
    /* Nothing was left half-issued: the next collective still lines up. */
    zt_tensor *x = mk_vals(71, R, 777, 0);
    rc = zt_all_reduce(W, x, NULL);
    CHECK("collectives still line up after rejected calls",
          rc == ZT_OK && diff_ref(x->data, 71, world_ranks, P, 0, 777) == -1, "rc %d", rc);
    zt_tensor_release(x); zt_tensor_release(f); zt_tensor_release(g); zt_tensor_release(h);

    /* MPI's own errors come back as EIO with MPI's text. */
    if (P >= 2 && R <= 1) {
        zt_tensor *big = mk(ZT_TIER_DEVICE, ZT_F32, 10), *small = mk(ZT_TIER_DEVICE, ZT_F32, 5);
        if (R == 0) {
            int a = zt_send(W, big, 1, 99, NULL);
            int b = zt_send(W, small, 1, 98, NULL);
            CHECK("sends of mismatched sizes complete", a == ZT_OK && b == ZT_OK,
                  "rc %d %d (%s)", a, b, zt_last_error());
        } else {
            rc = zt_recv(W, small, 0, 99, NULL);
            CHECK("recv of a too-long message is EIO with MPI's message",
                  rc == ZT_EIO && has("MPI") && has("zt_recv"), "rc %d msg %s", rc,
                  zt_last_error());
            rc = zt_recv(W, big, 0, 98, NULL);
            CHECK("recv of a too-short message is EIO", rc == ZT_EIO && has("received 5"),
                  "rc %d msg %s", rc, zt_last_error());
        }
        zt_tensor_release(big); zt_tensor_release(small);
    }
    zt_barrier(W, NULL);
}

static void test_memory(void)
{
    size_t dev = zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_COMM);
    size_t host = zt_mem_current(ZT_TIER_HOST, ZT_CAT_COMM);
    zt_mem_reset_peak();
    zt_tensor *x = mk_vals(81, R, 100000, 0);
    zt_tensor *in = mk_vals(82, R, 100000 * (int64_t)P, 0), *out = mk(ZT_TIER_DEVICE, ZT_F32, 100000);
    int rc = zt_all_reduce(W, x, NULL) | zt_reduce_scatter(W, out, in, NULL);
    size_t pk = zt_mem_peak(ZT_TIER_DEVICE, ZT_CAT_COMM);
    CHECK("comm scratch is accounted on the tensors' tier, and freed",
          rc == 0 && zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_COMM) == dev &&
          (P == 1 || pk >= dev + 100000 * 4) && zt_mem_peak(ZT_TIER_HOST, ZT_CAT_COMM) == host,
          "rc %d device comm %zu -> %zu (peak %zu), host comm peak %zu", rc, dev,
          zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_COMM), pk, zt_mem_peak(ZT_TIER_HOST, ZT_CAT_COMM));
    zt_tensor_release(x); zt_tensor_release(in); zt_tensor_release(out);

    zt_tensor *hx = mk(ZT_TIER_HOST, ZT_F32, 50000);
    rc = zt_all_reduce(W, hx, NULL);
    CHECK("host tensor: scratch on the host tier, freed", rc == 0 &&
          (P == 1 || zt_mem_peak(ZT_TIER_HOST, ZT_CAT_COMM) > host) &&
          zt_mem_current(ZT_TIER_HOST, ZT_CAT_COMM) == host, "rc %d host comm peak %zu", rc,
          zt_mem_peak(ZT_TIER_HOST, ZT_CAT_COMM));
    zt_tensor_release(hx);

    /* Scratch is bounded by the round budget, not by the tensor. */
    zt_comm_tune(1 << 16, 0);
    zt_mem_reset_peak();
    zt_tensor *y = mk_vals(83, R, 300001, 0);
    rc = zt_all_reduce(W, y, NULL);
    CHECK("scratch of one op stays within the round budget", rc == 0 &&
          zt_mem_peak(ZT_TIER_DEVICE, ZT_CAT_COMM) <= dev + (1 << 16) &&
          diff_ref(y->data, 83, world_ranks, P, 0, 300001) == -1, "peak %zu",
          zt_mem_peak(ZT_TIER_DEVICE, ZT_CAT_COMM));
    zt_comm_tune(0, 0);
    zt_tensor_release(y);

    /* A tier limit that the scratch would break: ELIMIT, on every rank alike. */
    zt_tensor *z = mk(ZT_TIER_DEVICE, ZT_F32, 1 << 16);
    size_t used = zt_mem_current(ZT_TIER_DEVICE, -1);
    zt_mem_set_limit(ZT_TIER_DEVICE, used + 1024);
    rc = zt_all_reduce(W, z, NULL);
    zt_mem_set_limit(ZT_TIER_DEVICE, 0);
    CHECK("scratch over the tier's limit is ELIMIT, nothing held", (P == 1 || rc == ZT_ELIMIT) &&
          zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_COMM) == dev, "rc %d (%s)", rc, zt_last_error());
    zt_tensor_release(z);
}

int main(void)
{
    double t0 = now();
    if (mt_init(1)) return 1;
    for (int r = 0; r < P; r++) world_ranks[r] = r;

    test_world();
    test_all_reduce();
    test_reduce_scatter();
    test_all_gather();
    test_broadcast();
    test_p2p();
    test_barrier();
    test_fence();
    test_async();
    test_split();
    test_host();
    test_errors();
    test_memory();

    /* An async request nobody waited on before shutdown. */
    zt_comm_req *late = NULL;
    int lrc = zt_barrier(W, &late);

    int tp, tf;
    mt_totals(&tp, &tf);

    /* After shutdown (rank 0 counts its own checks here; a failure on
     * another rank shows as its FAIL line and exit status). */
    passed = failed = 0;
    int rc = zt_comm_finalize();
    CHECK("finalize", rc == ZT_OK, "rc %d (%s)", rc, zt_last_error());
    CHECK("request issued before finalize can be waited on after it",
          lrc == ZT_OK && zt_comm_wait(late) == ZT_OK, "rc %d", lrc);
    zt_tensor *x = mk(ZT_TIER_DEVICE, ZT_F32, 4);
    rc = zt_all_reduce(W, x, NULL);
    CHECK("collective after finalize is ESTATE", rc == ZT_ESTATE && has("finalize"),
          "rc %d msg %s", rc, zt_last_error());
    zt_tensor_release(x);
    zt_comm *w2 = NULL;
    rc = zt_comm_world(&w2);
    CHECK("zt_comm_world after finalize is ESTATE", rc == ZT_ESTATE && w2 == NULL,
          "rc %d msg %s", rc, zt_last_error());
    CHECK("finalize twice is harmless", zt_comm_finalize() == ZT_OK, "%s", zt_last_error());
    tp += passed;
    tf += failed;
    if (R == 0) fprintf(stderr, "test_mpi_comm: %d ranks, %.2f s\n", P, now() - t0);
    return mt_report(tp, tf);
}
