/*
 * comm_stats.c -- this rank's communication counters (contract in ztrain.h,
 * "Communication counters"): bytes and calls by kind, busy and exposed time.
 *
 * Hot path: the caller's thread adds an operation's bytes and its call at
 * issue (zt_stats_issue); the engine marks it running and finished
 * (zt_stats_start / zt_stats_end); a waiter adds the time it was blocked
 * (zt_stats_exposed). Each is a few relaxed atomic adds on counters of their
 * own: no lock, so the comm thread, stream workers and the caller never
 * wait on each other here. A reader (zt_comm_stats_get) copies the counters
 * one by one: it may see an operation's bytes without its call when one is
 * being issued at that instant, which a step boundary (nothing issued
 * then) never does.
 *
 * Bytes follow the transport's algorithm (comm_mpi.c), each message
 * counted at its sender and its receiver, a rank's own share never:
 *  - all_reduce of n elements over p ranks: the balanced partition gives
 *    rank r a chunk of L_r = n/p (+1 for the first n%p ranks). The
 *    all-to-all sends the other ranks their slices (n - L_r) and receives
 *    (p-1) L_r; the all-gather sends the reduced chunk to p-1 ranks and
 *    receives the rest (n - L_r): n + (p-2) L_r each way, 2n(p-1)/p when p
 *    divides n (a ring all-reduce's volume).
 *  - reduce_scatter (m = out's elements), all_gather (m = in's): m (p-1)
 *    each way (all-to-all / all-gather of p chunks of m).
 *  - broadcast of n: counted as if the root sent straight to every rank
 *    (n (p-1) sent at the root, n received elsewhere); MPI's tree relays
 *    move the same total.
 *  - send / recv: n. barrier, split: no payload, a call.
 * NCCL's deterministic mode uses the same partition; its own all-reduce
 * (a ring) moves 2n(p-1)/p as well.
 */
#include <string.h>
#include <time.h>
#include "comm.h"

static uint64_t c_sent[ZT_COMM_KINDS], c_recv[ZT_COMM_KINDS], c_calls[ZT_COMM_KINDS];
static uint64_t inflight;       /* operations started, not finished */
static uint64_t busy_t0;        /* when inflight last went 0 -> 1 (ns) */
static uint64_t busy_ns;        /* closed busy intervals */
static uint64_t exposed_ns;

#define ADD(v, x) __atomic_fetch_add(&(v), (x), __ATOMIC_RELAXED)
#define LOAD(v) __atomic_load_n(&(v), __ATOMIC_RELAXED)
#define STORE(v, x) __atomic_store_n(&(v), (x), __ATOMIC_RELAXED)

uint64_t zt_stats_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static const char *const kind_names[ZT_COMM_KINDS] = {
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv",
    "barrier", "host", "other",
};

const char *zt_comm_kind_name(int kind)
{
    return kind >= 0 && kind < ZT_COMM_KINDS ? kind_names[kind] : NULL;
}

/* The public kind of an operation; -1: not counted (a group's release). */
static int public_kind(int op_kind)
{
    switch (op_kind) {
    case ZT_OP_ALL_REDUCE: return ZT_COMM_KIND_ALL_REDUCE;
    case ZT_OP_REDUCE_SCATTER: return ZT_COMM_KIND_REDUCE_SCATTER;
    case ZT_OP_ALL_GATHER: return ZT_COMM_KIND_ALL_GATHER;
    case ZT_OP_BROADCAST: return ZT_COMM_KIND_BROADCAST;
    case ZT_OP_SEND: return ZT_COMM_KIND_SEND;
    case ZT_OP_RECV: return ZT_COMM_KIND_RECV;
    case ZT_OP_BARRIER: return ZT_COMM_KIND_BARRIER;
    case ZT_OP_ALL_GATHER_HOST: case ZT_OP_BROADCAST_HOST: return ZT_COMM_KIND_HOST;
    case ZT_OP_FREE: case ZT_OP_FENCE: return -1;
    default: return ZT_COMM_KIND_OTHER;
    }
}

static void zt_stats_bytes(const zt_comm_req *op, uint64_t *sent, uint64_t *recv)
{
    const uint64_t p = op->comm->size, r = op->comm->rank;
    const uint64_t n = (uint64_t)op->count, e = op->esize;
    *sent = *recv = 0;
    switch (op->kind) {
    case ZT_OP_SEND: *sent = n * e; return;
    case ZT_OP_RECV: *recv = n * e; return;
    default: break;
    }
    if (p < 2) return;
    switch (op->kind) {
    case ZT_OP_ALL_REDUCE: {
        const uint64_t L = n / p + (r < n % p ? 1 : 0);
        *sent = *recv = (n + (p - 2) * L) * e;
        return;
    }
    case ZT_OP_REDUCE_SCATTER: case ZT_OP_ALL_GATHER: case ZT_OP_ALL_GATHER_HOST:
        *sent = *recv = n * (p - 1) * e;
        return;
    case ZT_OP_BROADCAST: case ZT_OP_BROADCAST_HOST:
        if ((int)r == op->root) *sent = n * (p - 1) * e;
        else *recv = n * e;
        return;
    default:
        return;
    }
}

void zt_stats_issue(const zt_comm_req *op)
{
    const int k = public_kind(op->kind);
    if (k < 0) return;
    uint64_t s, r;
    zt_stats_bytes(op, &s, &r);
    if (s) ADD(c_sent[k], s);
    if (r) ADD(c_recv[k], r);
    ADD(c_calls[k], 1);
}

/* Busy time is the union of the operations' intervals from issue to
 * completion (comm.c: queued behind the communicator's earlier collectives
 * counts, so a waiter's blocked time lies inside it): the clock runs while
 * inflight > 0. busy_t0 changes only on a 0 -> 1 step, which cannot happen
 * while this operation is still counted in inflight: zt_stats_end reads it
 * before its own decrement, so an operation issued by another thread right
 * after the count reaches 0 cannot hide the interval that just closed. A
 * snapshot (zt_comm_stats_get) taken between a 0 -> 1 step and its store of
 * busy_t0 may still see the previous interval's start for that instant. */
void zt_stats_start(void)
{
    if (__atomic_fetch_add(&inflight, 1, __ATOMIC_ACQ_REL) == 0) STORE(busy_t0, zt_stats_now_ns());
}

void zt_stats_end(void)
{
    const uint64_t t0 = LOAD(busy_t0);          /* ours: see above */
    if (__atomic_sub_fetch(&inflight, 1, __ATOMIC_ACQ_REL) == 0) {
        const uint64_t t = zt_stats_now_ns();   /* only the last one out reads the clock */
        if (t > t0) ADD(busy_ns, t - t0);
    }
}

void zt_stats_exposed(uint64_t ns) { ADD(exposed_ns, ns); }

int zt_comm_stats_get(const zt_comm *c, zt_comm_stats *out)
{
    (void)c;
    ZT_CHECK(out != NULL, "zt_comm_stats_get: out is NULL");
    memset(out, 0, sizeof *out);
    for (int k = 0; k < ZT_COMM_KINDS; k++) {
        out->kind[k].sent = LOAD(c_sent[k]);
        out->kind[k].recv = LOAD(c_recv[k]);
        out->kind[k].calls = LOAD(c_calls[k]);
        out->sent += out->kind[k].sent;
        out->recv += out->kind[k].recv;
        out->calls += out->kind[k].calls;
    }
    uint64_t b = LOAD(busy_ns);
    if (__atomic_load_n(&inflight, __ATOMIC_ACQUIRE) > 0) {   /* the open interval so far */
        uint64_t t = zt_stats_now_ns(), t0 = LOAD(busy_t0);
        if (t > t0) b += t - t0;
    }
    out->busy_s = 1e-9 * (double)b;
    out->exposed_s = 1e-9 * (double)LOAD(exposed_ns);
    return ZT_OK;
}

void zt_comm_stats_reset(void)
{
    for (int k = 0; k < ZT_COMM_KINDS; k++) {
        STORE(c_sent[k], 0);
        STORE(c_recv[k], 0);
        STORE(c_calls[k], 0);
    }
    STORE(busy_ns, 0);
    STORE(exposed_ns, 0);
    if (__atomic_load_n(&inflight, __ATOMIC_ACQUIRE) > 0) STORE(busy_t0, zt_stats_now_ns());
}
