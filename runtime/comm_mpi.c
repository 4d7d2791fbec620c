/*
 * comm_mpi.c -- the MPI transport. Everything here except mpi_abort runs on
 * the communication thread (comm.c), which initialised MPI: MPI sees one
 * thread.
 *
 * Nothing here waits. mpi_start posts an operation's first nonblocking
 * request (MPI_Isend/Irecv, MPI_Ialltoallv, MPI_Ibcast, ...) and returns;
 * mpi_progress tests it and takes the operation's next step when it
 * completed, so the engine can progress every communicator's operations
 * side by side. The one blocking call, MPI_Comm_split, comes only after an
 * Ibarrier on the parent has shown that every rank is in the split too.
 *
 * Reductions never use MPI's arithmetic (whose order is MPI's choice): the
 * contributions are exchanged and summed here in rank order, so the bits do
 * not depend on the world's size, the algorithm MPI picks, or timing.
 *
 *  reduce_scatter: MPI_Alltoallv of the chunks -- each rank receives every
 *    rank's copy of its own chunk into a scratch buffer -- then
 *    out = ((c0 + c1) + c2) + ...
 *  all_reduce: the same reduce-scatter over a balanced partition of x (chunk
 *    sizes differ by at most one element, so numel need not divide by the
 *    size, and may be smaller), each rank writing its reduced chunk in place,
 *    then MPI_Allgatherv of the reduced chunks. Element by element this is the
 *    very sum reduce_scatter computes, so all_reduce == reduce_scatter +
 *    all_gather, bit for bit.
 *
 * Both run in rounds (one state-machine step per MPI request): a round moves at most S elements of every chunk, with S
 * chosen so the scratch (size x S floats, accounted as "comm" on the tier of
 * the tensor, freed after the operation) stays within the scratch budget
 * (default max(4 MiB, size x 256 KiB), see comm.h). Every MPI count is
 * therefore small, and every displacement is below the tensor's element
 * count, which comm.c bounds by INT_MAX (8 GiB of f32). Broadcast, all_gather
 * and point-to-point split large tensors into messages of at most msg_bytes
 * (1 GiB); broadcast and send/recv have no size limit.
 * Errors come back as codes (MPI_ERRORS_RETURN) and become ZT_EIO with MPI's
 * error string.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>
#include "comm.h"

static int mpi_up;              /* MPI initialised and not finalised (atomic) */
static MPI_Comm side = MPI_COMM_NULL;   /* the watchdog's channel (comm_watch.c) */
#define SIDE_TAG 7
static int mpi_owned;           /* we called MPI_Init_thread */

#define HANDLE(c) (*(MPI_Comm *)(c)->impl)

static int mpi_fail(const char *fn, const char *call, int err)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", err);
    return zt_error(ZT_EIO, "%s: %s failed: %s", fn, call, s);
}

/* Run an MPI call; on failure record the error and leave through `out`. */
#define MPI_DO(fn, call, expr) \
    do { int e_ = (expr); if (e_ != MPI_SUCCESS) { rc = mpi_fail(fn, call, e_); goto out; } } while (0)

static MPI_Datatype mpi_type(const zt_comm_req *op)
{
    switch (op->dtype) {
    case ZT_F32: return MPI_FLOAT;
    case ZT_I32: return MPI_INT32_T;
    case ZT_BF16: case ZT_F16: case ZT_U16: return MPI_UINT16_T;
    default: return MPI_BYTE;
    }
}

/* ---- lifetime -------------------------------------------------------------- */
static int mpi_init(zt_comm *w)
{
    int inited = 0, provided = 0, rc = ZT_OK;
    MPI_Comm *h = malloc(sizeof *h);
    if (!h) return zt_error(ZT_ENOMEM, "zt_comm_world: out of memory");
    MPI_Initialized(&inited);
    if (inited) {
        /* The program started MPI itself: usable only if any thread may call it. */
        MPI_Query_thread(&provided);
        if (provided < MPI_THREAD_MULTIPLE) {
            free(h);
            return zt_error(ZT_ESTATE, "zt_comm_world: MPI was initialised by the program "
                            "without MPI_THREAD_MULTIPLE; let ztrain initialise it, or "
                            "request MPI_THREAD_MULTIPLE");
        }
    } else {
        /* MULTIPLE although only this thread calls MPI: it makes zt_comm_abort's
         * MPI_Abort from another thread legal. FUNNELED would do otherwise. */
        int e = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (e != MPI_SUCCESS) { free(h); return mpi_fail("zt_comm_world", "MPI_Init_thread", e); }
        mpi_owned = 1;
        if (provided < MPI_THREAD_FUNNELED) {
            MPI_Finalize();
            mpi_owned = 0;
            free(h);
            return zt_error(ZT_EIO, "zt_comm_world: this MPI library provides thread level %d; "
                            "ztrain needs at least MPI_THREAD_FUNNELED", provided);
        }
    }
    __atomic_store_n(&mpi_up, 1, __ATOMIC_RELEASE);
    MPI_DO("zt_comm_world", "MPI_Comm_set_errhandler",
           MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    /* A private copy of the world: ztrain's traffic never matches the program's. */
    MPI_DO("zt_comm_world", "MPI_Comm_dup", MPI_Comm_dup(MPI_COMM_WORLD, h));
    MPI_DO("zt_comm_world", "MPI_Comm_rank", MPI_Comm_rank(*h, &w->rank));
    MPI_DO("zt_comm_world", "MPI_Comm_size", MPI_Comm_size(*h, &w->size));
    /* The watchdog's questions and answers never match collective traffic. */
    MPI_DO("zt_comm_world", "MPI_Comm_dup", MPI_Comm_dup(MPI_COMM_WORLD, &side));
    w->impl = h;
    return ZT_OK;
out:
    free(h);
    __atomic_store_n(&mpi_up, 0, __ATOMIC_RELEASE);
    if (mpi_owned) { MPI_Finalize(); mpi_owned = 0; }
    return rc;
}

static int mpi_finalize(zt_comm *w)
{
    int rc = ZT_OK;
    if (side != MPI_COMM_NULL) MPI_Comm_free(&side);
    if (w->impl) {
        MPI_Comm_free((MPI_Comm *)w->impl);
        free(w->impl);
        w->impl = NULL;
    }
    if (mpi_owned) {
        __atomic_store_n(&mpi_up, 0, __ATOMIC_RELEASE);
        mpi_owned = 0;
        int e = MPI_Finalize();
        if (e != MPI_SUCCESS) rc = mpi_fail("zt_comm_finalize", "MPI_Finalize", e);
    }
    return rc;
}

static void mpi_abort(int code)
{
    if (__atomic_load_n(&mpi_up, __ATOMIC_ACQUIRE)) MPI_Abort(MPI_COMM_WORLD, code);
}

static int mpi_free_comm(zt_comm *c)
{
    int rc = ZT_OK;
    if (c->impl) {
        int e = MPI_Comm_free((MPI_Comm *)c->impl);
        if (e != MPI_SUCCESS) rc = mpi_fail("zt_comm_free", "MPI_Comm_free", e);
        free(c->impl);
        c->impl = NULL;
    }
    return rc;
}

/* ---- collectives: state machines over nonblocking MPI ---------------------------
 * A collective never blocks the engine: mpi_start sets up its state and posts
 * its first request; mpi_progress tests the request and, once it completed,
 * takes the next step (sum a round, post the next request) until the last
 * one. The engine runs one collective per communicator at a time, so the
 * requests of one communicator are posted in the same order on every rank
 * (MPI's rule for collectives); other communicators' operations progress
 * between the steps. The arithmetic and the partition into rounds are
 * exactly those of a blocking run, so the bits do not depend on timing. */
typedef struct {
    MPI_Request rq;
    int phase;                  /* kind-specific step, see each step_* */
    int64_t k0, S;              /* current round's first element; elements per round */
    int64_t n;                  /* elements per chunk / message rounds bound */
    float *scr;                 /* reduction scratch (p x S floats), "comm" on op->tier */
    size_t scr_bytes;
    int v[];                    /* counts and displacements: 4 x size ints */
} coll_state;

static int coll_new(zt_comm_req *op, int nints, coll_state **out)
{
    coll_state *st = calloc(1, sizeof *st + (size_t)nints * sizeof(int));
    if (!st) return zt_error(ZT_ENOMEM, "%s: out of memory for %d counts", op->fn, nints);
    st->rq = MPI_REQUEST_NULL;
    op->pending = st;
    *out = st;
    return ZT_OK;
}

/* Release a collective's state (scratch with its accounting); on every exit. */
static void coll_free(zt_comm_req *op)
{
    coll_state *st = op->pending;
    if (!st) return;
    if (st->rq != MPI_REQUEST_NULL) MPI_Request_free(&st->rq);
    zt_mem_free(st->scr, st->scr_bytes, op->tier, ZT_CAT_COMM);
    free(st);
    op->pending = NULL;
}

static int coll_scratch(zt_comm_req *op, coll_state *st, int p, const char *what)
{
    st->scr_bytes = (size_t)p * (size_t)st->S * sizeof(float);
    return zt_mem_alloc((void **)&st->scr, st->scr_bytes, op->tier, ZT_CAT_COMM, what);
}

/* Each step_* runs once at start (phase 0) and again each time st->rq
 * completed: it posts the next request, or sets *done. */

/* all_reduce, per round: phase 1 = Ialltoallv of the round's slices of every
 * chunk posted; phase 2 = own chunk summed in rank order, Iallgatherv of the
 * reduced slices posted. */
static int step_all_reduce(zt_comm_req *op, coll_state *st, int *done)
{
    zt_comm *c = op->comm;
    const int p = c->size, me = c->rank;
    MPI_Comm h = HANDLE(c);
    float *x = op->out;
    const int64_t n = op->count, base = n / p, rem = n % p;
    int *cnt = st->v, *dsp = st->v + p, *rcnt = st->v + 2 * p, *rdsp = st->v + 3 * p;
    int rc = ZT_OK;
    switch (st->phase) {
    case 0:
        st->n = base + (rem ? 1 : 0);                   /* largest chunk */
        if (st->n == 0) { *done = 1; return ZT_OK; }
        st->S = zt_comm_round_elems(op, p, st->n);
        ZT_TRY(coll_scratch(op, st, p, "all_reduce receive buffer"));
        st->k0 = 0;
        break;
    case 1: {
        const int L = cnt[me];
        if (L) zt_comm_sum_ranks(x + dsp[me], st->scr, p, (size_t)L);
        MPI_DO(op->fn, "MPI_Iallgatherv",
               MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, cnt, dsp, MPI_FLOAT, h,
                               &st->rq));
        st->phase = 2;
        return ZT_OK;
    }
    case 2:
        st->k0 += st->S;
        if (st->k0 >= st->n) { *done = 1; return ZT_OK; }
        break;
    }
    for (int r = 0; r < p; r++) {
        int64_t off = r * base + (r < rem ? r : rem);
        int64_t len = base + (r < rem ? 1 : 0) - st->k0;
        if (len < 0) len = 0;
        if (len > st->S) len = st->S;
        cnt[r] = (int)len;
        dsp[r] = len ? (int)(off + st->k0) : 0;
    }
    const int L = cnt[me];
    for (int j = 0; j < p; j++) { rcnt[j] = L; rdsp[j] = j * L; }
    MPI_DO(op->fn, "MPI_Ialltoallv",
           MPI_Ialltoallv(x, cnt, dsp, MPI_FLOAT, st->scr, rcnt, rdsp, MPI_FLOAT, h, &st->rq));
    st->phase = 1;
out:
    return rc;
}

/* reduce_scatter, per round: Ialltoallv of every rank's copy of this rank's
 * round slice, then the rank-order sum into out. */
static int step_reduce_scatter(zt_comm_req *op, coll_state *st, int *done)
{
    zt_comm *c = op->comm;
    const int p = c->size;
    const int64_t m = op->count;
    int *cnt = st->v, *dsp = st->v + p, *rcnt = st->v + 2 * p, *rdsp = st->v + 3 * p;
    int rc = ZT_OK;
    if (st->phase == 0) {
        if (m == 0) { *done = 1; return ZT_OK; }
        st->S = zt_comm_round_elems(op, p, m);
        ZT_TRY(coll_scratch(op, st, p, "reduce_scatter receive buffer"));
        st->k0 = 0;
    } else {
        zt_comm_sum_ranks((float *)op->out + st->k0, st->scr, p, (size_t)cnt[0]);
        st->k0 += st->S;
        if (st->k0 >= m) { *done = 1; return ZT_OK; }
    }
    const int L = (int)(m - st->k0 < st->S ? m - st->k0 : st->S);
    for (int r = 0; r < p; r++) {
        cnt[r] = L;
        dsp[r] = (int)(r * m + st->k0);
        rcnt[r] = L;
        rdsp[r] = r * L;
    }
    MPI_DO(op->fn, "MPI_Ialltoallv",
           MPI_Ialltoallv(op->in, cnt, dsp, MPI_FLOAT, st->scr, rcnt, rdsp, MPI_FLOAT,
                          HANDLE(c), &st->rq));
    st->phase = 1;
out:
    return rc;
}

/* all_gather: one Iallgather, or rounds of Iallgatherv of msg_bytes each. */
static int step_all_gather(zt_comm_req *op, coll_state *st, int *done)
{
    zt_comm *c = op->comm;
    const int p = c->size, me = c->rank;
    const int64_t m = op->count;
    const size_t es = op->esize;
    char *out = op->out;
    const char *in = op->in;
    const int inplace = in == out + (size_t)me * (size_t)m * es;
    MPI_Comm h = HANDLE(c);
    MPI_Datatype T = mpi_type(op);
    int *cnt = st->v, *dsp = st->v + p;
    int rc = ZT_OK;
    if (st->phase == 0) {
        st->S = (int64_t)(op->msg_bytes / es);
        if (st->S < 1) st->S = 1;
        st->k0 = 0;
        if (m <= st->S) {
            MPI_DO(op->fn, "MPI_Iallgather",
                   MPI_Iallgather(inplace ? MPI_IN_PLACE : in, (int)m, T, out, (int)m, T, h,
                                  &st->rq));
            st->k0 = m;
            st->phase = 1;
            return ZT_OK;
        }
    } else {
        st->k0 += st->S;
        if (st->k0 >= m) { *done = 1; return ZT_OK; }
    }
    const int L = (int)(m - st->k0 < st->S ? m - st->k0 : st->S);
    for (int r = 0; r < p; r++) { cnt[r] = L; dsp[r] = (int)(r * m + st->k0); }
    MPI_DO(op->fn, "MPI_Iallgatherv",
           MPI_Iallgatherv(inplace ? MPI_IN_PLACE : in + (size_t)st->k0 * es, L, T, out, cnt,
                           dsp, T, h, &st->rq));
    st->phase = 1;
out:
    return rc;
}

/* broadcast (tensor or host bytes): rounds of Ibcast of msg_bytes each. */
static int step_broadcast(zt_comm_req *op, coll_state *st, int *done)
{
    const int64_t n = op->count;
    int rc = ZT_OK;
    if (st->phase == 0) {
        if (n == 0) { *done = 1; return ZT_OK; }
        st->S = (int64_t)(op->msg_bytes / op->esize);
        if (st->S < 1) st->S = 1;
        st->k0 = 0;
    } else {
        st->k0 += st->S;
        if (st->k0 >= n) { *done = 1; return ZT_OK; }
    }
    const int L = (int)(n - st->k0 < st->S ? n - st->k0 : st->S);
    MPI_DO(op->fn, "MPI_Ibcast",
           MPI_Ibcast((char *)op->out + (size_t)st->k0 * op->esize, L, mpi_type(op), op->root,
                      HANDLE(op->comm), &st->rq));
    st->phase = 1;
out:
    return rc;
}

static int step_barrier(zt_comm_req *op, coll_state *st, int *done)
{
    int rc = ZT_OK;
    if (st->phase) { *done = 1; return ZT_OK; }
    MPI_DO(op->fn, "MPI_Ibarrier", MPI_Ibarrier(HANDLE(op->comm), &st->rq));
    st->phase = 1;
out:
    return rc;
}

static int step_all_gather_host(zt_comm_req *op, coll_state *st, int *done)
{
    int rc = ZT_OK;
    if (st->phase) { *done = 1; return ZT_OK; }
    const size_t nb = (size_t)op->count;
    const int inplace = (const char *)op->in == (char *)op->out + (size_t)op->comm->rank * nb;
    MPI_DO(op->fn, "MPI_Iallgather",
           MPI_Iallgather(inplace ? MPI_IN_PLACE : op->in, (int)nb, MPI_BYTE, op->out, (int)nb,
                          MPI_BYTE, HANDLE(op->comm), &st->rq));
    st->phase = 1;
out:
    return rc;
}

static int step_split(zt_comm_req *op, coll_state *st, int *done);

typedef int (*step_fn)(zt_comm_req *, coll_state *, int *);

static step_fn coll_step(int kind)
{
    switch (kind) {
    case ZT_OP_ALL_REDUCE: return step_all_reduce;
    case ZT_OP_REDUCE_SCATTER: return step_reduce_scatter;
    case ZT_OP_ALL_GATHER: return step_all_gather;
    case ZT_OP_BROADCAST: case ZT_OP_BROADCAST_HOST: return step_broadcast;
    case ZT_OP_BARRIER: return step_barrier;
    case ZT_OP_ALL_GATHER_HOST: return step_all_gather_host;
    case ZT_OP_SPLIT: return step_split;
    default: return NULL;
    }
}

/* Start a collective: its state, its first request. */
static int coll_start(zt_comm_req *op, step_fn step)
{
    coll_state *st = NULL;
    int done = 0, p = op->comm->size;
    ZT_TRY(coll_new(op, 4 * p, &st));
    int rc = step(op, st, &done);
    if (rc != ZT_OK || done) { coll_free(op); return rc; }
    op->inflight = 1;
    return ZT_OK;
}

/* Test a collective's request; on completion take its next step. Several
 * steps may follow one another at once (a request can complete at post). */
static int coll_progress(zt_comm_req *op, int *done)
{
    coll_state *st = op->pending;
    step_fn step = coll_step(op->kind);
    *done = 0;
    for (;;) {
        int flag = 0, e = MPI_Test(&st->rq, &flag, MPI_STATUS_IGNORE);
        if (e != MPI_SUCCESS) {
            int rc = mpi_fail(op->fn, "completing a collective (MPI_Test)", e);
            coll_free(op);
            *done = 1;
            return rc;
        }
        if (!flag) return ZT_OK;
        op->moved = 1;
        int rc = step(op, st, done);
        if (rc != ZT_OK || *done) {
            coll_free(op);
            *done = 1;
            return rc;
        }
    }
}

/* ---- point to point: started here, finished by mpi_progress ----------------- */
typedef struct {
    int n, next;                /* messages; first one not yet seen complete */
    int64_t per;                /* elements per message (the last may be short) */
    MPI_Request req[];
} p2p_state;

static int run_p2p(zt_comm_req *op)
{
    MPI_Comm h = HANDLE(op->comm);
    MPI_Datatype T = mpi_type(op);
    const int64_t n = op->count;
    int64_t P = (int64_t)(op->msg_bytes / op->esize);
    if (P < 1) P = 1;
    if (P > INT_MAX) P = INT_MAX;
    int64_t nmsg64 = (n + P - 1) / P;
    if (nmsg64 > INT_MAX / 2)
        return zt_error(ZT_EINVAL, "%s: %lld elements is too many messages", op->fn, (long long)n);
    const int nmsg = (int)nmsg64;
    p2p_state *st = malloc(sizeof *st + (size_t)nmsg * sizeof(MPI_Request));
    if (!st) return zt_error(ZT_ENOMEM, "%s: out of memory for %d requests", op->fn, nmsg);
    st->n = nmsg;
    st->next = 0;
    st->per = P;
    int rc = ZT_OK;
    for (int i = 0; i < nmsg; i++) {
        int64_t k0 = (int64_t)i * P;
        const int L = (int)(n - k0 < P ? n - k0 : P);
        int e;
        if (op->kind == ZT_OP_SEND)
            e = MPI_Isend((const char *)op->in + (size_t)k0 * op->esize, L, T, op->peer,
                          op->tag, h, &st->req[i]);
        else
            e = MPI_Irecv((char *)op->out + (size_t)k0 * op->esize, L, T, op->peer,
                          op->tag, h, &st->req[i]);
        if (e != MPI_SUCCESS) {
            rc = mpi_fail(op->fn, op->kind == ZT_OP_SEND ? "MPI_Isend" : "MPI_Irecv", e);
            for (int j = 0; j < i; j++) MPI_Request_free(&st->req[j]);
            free(st);
            return rc;
        }
    }
    op->pending = st;
    op->inflight = 1;
    return ZT_OK;
}

static int p2p_progress(zt_comm_req *op, int *done)
{
    p2p_state *st = op->pending;
    *done = 0;
    while (st->next < st->n) {
        int flag = 0, i = st->next;
        MPI_Status status;
        /* A single-completion call returns the request's error itself. */
        int e = MPI_Test(&st->req[i], &flag, &status);
        if (e != MPI_SUCCESS) {
            int rc = mpi_fail(op->fn, op->kind == ZT_OP_SEND ? "sending (MPI_Isend)"
                                                            : "receiving (MPI_Irecv)", e);
            for (int j = i + 1; j < st->n; j++) MPI_Request_free(&st->req[j]);
            *done = 1;
            return rc;
        }
        if (!flag) return ZT_OK;
        if (op->kind == ZT_OP_RECV) {
            int got = 0;
            int64_t want = op->count - (int64_t)i * st->per;
            if (want > st->per) want = st->per;
            MPI_Get_count(&status, mpi_type(op), &got);
            if (got != want) {
                for (int j = i + 1; j < st->n; j++) MPI_Request_free(&st->req[j]);
                *done = 1;
                return zt_error(ZT_EIO, "%s: received %lld elements from rank %d (tag %d) "
                                "where %lld were expected: the sent and received tensors "
                                "must have the same size", op->fn,
                                (long long)((int64_t)i * st->per + got), op->peer, op->tag,
                                (long long)op->count);
            }
        }
        st->next++;
    }
    *done = 1;
    return ZT_OK;
}

/* ---- groups ------------------------------------------------------------------------ */

/* split: MPI has no nonblocking MPI_Comm_split, and a blocking one would hold
 * every other communicator until the last rank of the parent arrives. So
 * phase 1 is an Ibarrier on the parent (progressed like any collective):
 * once it completed, every rank of the parent has started this split, and
 * the blocking MPI_Comm_split that follows waits only for the other ranks'
 * engines, not for their programs. */
static int step_split(zt_comm_req *op, coll_state *st, int *done)
{
    int rc = ZT_OK;
    if (st->phase == 0) {
        int e = MPI_Ibarrier(HANDLE(op->comm), &st->rq);
        if (e != MPI_SUCCESS) return mpi_fail(op->fn, "MPI_Ibarrier", e);
        st->phase = 1;
        return ZT_OK;
    }
    zt_comm *c = calloc(1, sizeof *c);
    MPI_Comm *h = malloc(sizeof *h);
    if (!c || !h) {
        free(c); free(h);
        return zt_error(ZT_ENOMEM, "%s: out of memory for a communicator", op->fn);
    }
    *h = MPI_COMM_NULL;
    MPI_DO(op->fn, "MPI_Comm_split",
           MPI_Comm_split(HANDLE(op->comm), op->color, op->key, h));
    MPI_Comm_set_errhandler(*h, MPI_ERRORS_RETURN);
    MPI_DO(op->fn, "MPI_Comm_rank", MPI_Comm_rank(*h, &c->rank));
    MPI_DO(op->fn, "MPI_Comm_size", MPI_Comm_size(*h, &c->size));
    c->tp = &zt_transport_mpi;
    c->impl = h;
    *op->split_out = c;
    *done = 1;
    return ZT_OK;
out:
    if (*h != MPI_COMM_NULL) MPI_Comm_free(h);
    free(h);
    free(c);
    return rc;
}

/* ---- the watchdog's side channel (comm_watch.c) ------------------------------
 * Messages of a few hundred bytes: MPI_Send returns once the message is
 * buffered (eager), so a stopped peer does not hold the sender. */
static int side_send(int world_rank, const void *buf, int n)
{
    return MPI_Send(buf, n, MPI_BYTE, world_rank, SIDE_TAG, side) == MPI_SUCCESS ? ZT_OK : ZT_EIO;
}

static int side_poll(void *buf, int n, int *from)
{
    int flag = 0;
    MPI_Status st;
    if (side == MPI_COMM_NULL || MPI_Iprobe(MPI_ANY_SOURCE, SIDE_TAG, side, &flag, &st) != MPI_SUCCESS ||
        !flag)
        return 0;
    if (MPI_Recv(buf, n, MPI_BYTE, st.MPI_SOURCE, SIDE_TAG, side, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        return 0;
    *from = st.MPI_SOURCE;
    return 1;
}

static int world_ranks(zt_comm *c, int *out)
{
    MPI_Group g, wg;
    if (MPI_Comm_group(HANDLE(c), &g) != MPI_SUCCESS) return ZT_EIO;
    if (MPI_Comm_group(side, &wg) != MPI_SUCCESS) { MPI_Group_free(&g); return ZT_EIO; }
    int *in = malloc((size_t)c->size * sizeof *in);
    int rc = in ? ZT_OK : ZT_ENOMEM;
    if (in) {
        for (int i = 0; i < c->size; i++) in[i] = i;
        if (MPI_Group_translate_ranks(g, c->size, in, wg, out) != MPI_SUCCESS) rc = ZT_EIO;
    }
    free(in);
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    return rc;
}

static int mpi_start_host(zt_comm_req *op)
{
    if (op->kind == ZT_OP_SEND || op->kind == ZT_OP_RECV) return run_p2p(op);
    step_fn step = coll_step(op->kind);
    if (!step) return zt_error(ZT_EINVAL, "%s: unknown operation %d", op->fn, op->kind);
    /* Over one rank there is nothing to exchange (copies where out != in). */
    if (op->comm->size == 1 && op->kind != ZT_OP_SPLIT) {
        size_t nb = (size_t)op->count * op->esize;
        if ((op->kind == ZT_OP_REDUCE_SCATTER || op->kind == ZT_OP_ALL_GATHER ||
             op->kind == ZT_OP_ALL_GATHER_HOST) && op->out != op->in)
            memcpy(op->out, op->in, nb);
        return ZT_OK;
    }
    return coll_start(op, step);
}

/* Device tensors of a device whose memory is not the host's (CUDA,
 * fakegpu) go through host buffers (comm_stage.c; on the CPU device they
 * pass through): MPI reads and writes host memory only. */
static int mpi_start(zt_comm_req *op)
{
    ZT_TRY(zt_comm_stage_in(op));
    int rc = mpi_start_host(op);
    return rc != ZT_OK || !op->inflight ? zt_comm_stage_out(op, rc) : rc;
}

static int mpi_progress(zt_comm_req *op, int *done)
{
    int rc = op->kind == ZT_OP_SEND || op->kind == ZT_OP_RECV ? p2p_progress(op, done)
                                                              : coll_progress(op, done);
    if (*done) rc = zt_comm_stage_out(op, rc);
    return rc;
}

const zt_transport zt_transport_mpi = {
    .name = "mpi",
    .threaded = 1,
    .issue = zt_comm_stage_issue,
    .init = mpi_init,
    .start = mpi_start,
    .progress = mpi_progress,
    .free_comm = mpi_free_comm,
    .finalize = mpi_finalize,
    .abort = mpi_abort,
    .side_send = side_send,
    .side_poll = side_poll,
    .world_ranks = world_ranks,
};
