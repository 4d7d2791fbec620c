/*
 * comm_mpi.c -- the MPI transport. Everything here except mpi_abort runs on
 * the communication thread (comm.c), which initialised MPI: MPI sees one
 * thread.
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
 * Both run in rounds: a round moves at most S elements of every chunk, with S
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
#include <time.h>
#include <mpi.h>
#include "comm.h"

static int mpi_up;              /* MPI initialised and not finalised (atomic) */
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

/* ---- collectives ---------------------------------------------------------------- */

/* Finish a nonblocking collective without holding a core. While this thread
 * waits, the peers are usually still computing (the backward of the next
 * unit), and on a machine with as many busy threads as cores a blocking MPI
 * call's polling would take their time: measured on 2 cores with 2 ranks,
 * step times varied by 50% under blocking collectives. So: test for a few
 * tens of microseconds, then sleep between tests (MPI progresses inside
 * MPI_Test), backing off to WAIT_MAX_NS. Returns the MPI error code. */
#define WAIT_SPIN_S 30e-6
#define WAIT_MAX_NS 200000L
static int wait_gently(int started, MPI_Request *r)
{
    if (started != MPI_SUCCESS) return started;
    double t0 = MPI_Wtime();
    long ns = 10000;
    for (;;) {
        int flag = 0, e = MPI_Test(r, &flag, MPI_STATUS_IGNORE);
        if (e != MPI_SUCCESS || flag) return e;
        if (MPI_Wtime() - t0 < WAIT_SPIN_S) continue;
        struct timespec ts = { 0, ns };
        nanosleep(&ts, NULL);
        if (ns < WAIT_MAX_NS) ns *= 2;
    }
}

/* Elements per chunk and round for a reduction over p ranks: the scratch of a
 * round (p x S floats) fits the budget; a message never exceeds msg_bytes. */
static int64_t round_elems(const zt_comm_req *op, int p, int64_t chunk)
{
    size_t budget = op->scratch_bytes;
    if (budget == 0) {
        budget = (size_t)p * ZT_COMM_AUTO_SLICE;
        if (budget < ZT_COMM_AUTO_SCRATCH) budget = ZT_COMM_AUTO_SCRATCH;
    }
    int64_t s = (int64_t)(budget / (4 * (size_t)p));
    int64_t m = (int64_t)(op->msg_bytes / 4);
    if (s > m) s = m;
    if (s < 1) s = 1;
    if (s > chunk) s = chunk;
    return s < 1 ? 1 : s;
}

static int alloc_ints(const char *fn, int **v, int n)
{
    *v = malloc((size_t)n * sizeof **v);
    if (!*v) return zt_error(ZT_ENOMEM, "%s: out of memory for %d counts", fn, n);
    return ZT_OK;
}

static int run_all_reduce(zt_comm_req *op)
{
    MPI_Request rq = MPI_REQUEST_NULL;
    zt_comm *c = op->comm;
    const int p = c->size, me = c->rank;
    if (p == 1) return ZT_OK;
    MPI_Comm h = HANDLE(c);
    float *x = op->out;
    const int64_t n = op->count, base = n / p, rem = n % p;
    const int64_t maxcnt = base + (rem ? 1 : 0);
    const int64_t S = round_elems(op, p, maxcnt);
    float *scr = NULL;
    int *v = NULL, rc;
    size_t scr_bytes = (size_t)p * (size_t)S * sizeof(float);
    ZT_TRY(alloc_ints(op->fn, &v, 4 * p));
    int *cnt = v, *dsp = v + p, *rcnt = v + 2 * p, *rdsp = v + 3 * p;
    rc = zt_mem_alloc((void **)&scr, scr_bytes, op->tier, ZT_CAT_COMM, "all_reduce receive buffer");
    if (rc != ZT_OK) goto out;
    for (int64_t k0 = 0; k0 < maxcnt; k0 += S) {
        for (int r = 0; r < p; r++) {
            int64_t off = r * base + (r < rem ? r : rem);
            int64_t len = base + (r < rem ? 1 : 0) - k0;
            if (len < 0) len = 0;
            if (len > S) len = S;
            cnt[r] = (int)len;
            dsp[r] = len ? (int)(off + k0) : 0;
        }
        const int L = cnt[me];
        for (int j = 0; j < p; j++) { rcnt[j] = L; rdsp[j] = j * L; }
        MPI_DO(op->fn, "MPI_Ialltoallv",
               wait_gently(MPI_Ialltoallv(x, cnt, dsp, MPI_FLOAT, scr, rcnt, rdsp, MPI_FLOAT, h, &rq),
                           &rq));
        if (L) zt_comm_sum_ranks(x + dsp[me], scr, p, (size_t)L);
        MPI_DO(op->fn, "MPI_Iallgatherv",
               wait_gently(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, cnt, dsp, MPI_FLOAT,
                                           h, &rq), &rq));
    }
    rc = ZT_OK;
out:
    zt_mem_free(scr, scr_bytes, op->tier, ZT_CAT_COMM);
    free(v);
    return rc;
}

static int run_reduce_scatter(zt_comm_req *op)
{
    MPI_Request rq = MPI_REQUEST_NULL;
    zt_comm *c = op->comm;
    const int p = c->size;
    float *out = op->out;
    const float *in = op->in;
    const int64_t m = op->count;
    if (p == 1) {
        if (out != in) memcpy(out, in, (size_t)m * sizeof(float));
        return ZT_OK;
    }
    MPI_Comm h = HANDLE(c);
    const int64_t S = round_elems(op, p, m);
    float *scr = NULL;
    int *v = NULL, rc;
    size_t scr_bytes = (size_t)p * (size_t)S * sizeof(float);
    ZT_TRY(alloc_ints(op->fn, &v, 4 * p));
    int *cnt = v, *dsp = v + p, *rcnt = v + 2 * p, *rdsp = v + 3 * p;
    rc = zt_mem_alloc((void **)&scr, scr_bytes, op->tier, ZT_CAT_COMM,
                      "reduce_scatter receive buffer");
    if (rc != ZT_OK) goto out;
    for (int64_t k0 = 0; k0 < m; k0 += S) {
        const int L = (int)(m - k0 < S ? m - k0 : S);
        for (int r = 0; r < p; r++) {
            cnt[r] = L;
            dsp[r] = (int)(r * m + k0);
            rcnt[r] = L;
            rdsp[r] = r * L;
        }
        MPI_DO(op->fn, "MPI_Ialltoallv",
               wait_gently(MPI_Ialltoallv(in, cnt, dsp, MPI_FLOAT, scr, rcnt, rdsp, MPI_FLOAT, h, &rq),
                           &rq));
        zt_comm_sum_ranks(out + k0, scr, p, (size_t)L);
    }
    rc = ZT_OK;
out:
    zt_mem_free(scr, scr_bytes, op->tier, ZT_CAT_COMM);
    free(v);
    return rc;
}

static int run_all_gather(zt_comm_req *op)
{
    MPI_Request rq = MPI_REQUEST_NULL;
    zt_comm *c = op->comm;
    const int p = c->size, me = c->rank;
    const int64_t m = op->count;
    const size_t es = op->esize;
    char *out = op->out;
    const char *in = op->in;
    const int inplace = in == out + (size_t)me * (size_t)m * es;
    if (p == 1) {
        if (!inplace) memcpy(out, in, (size_t)m * es);
        return ZT_OK;
    }
    MPI_Comm h = HANDLE(c);
    MPI_Datatype T = mpi_type(op);
    int64_t P = (int64_t)(op->msg_bytes / es);
    if (P < 1) P = 1;
    int *v = NULL, rc;
    ZT_TRY(alloc_ints(op->fn, &v, 2 * p));
    int *cnt = v, *dsp = v + p;
    if (m <= P) {
        MPI_DO(op->fn, "MPI_Iallgather",
               wait_gently(MPI_Iallgather(inplace ? MPI_IN_PLACE : in, (int)m, T, out, (int)m, T, h,
                                          &rq), &rq));
    } else {
        for (int64_t k0 = 0; k0 < m; k0 += P) {
            const int L = (int)(m - k0 < P ? m - k0 : P);
            for (int r = 0; r < p; r++) { cnt[r] = L; dsp[r] = (int)(r * m + k0); }
            MPI_DO(op->fn, "MPI_Iallgatherv",
                   wait_gently(MPI_Iallgatherv(inplace ? MPI_IN_PLACE : in + (size_t)k0 * es, L, T,
                                               out, cnt, dsp, T, h, &rq), &rq));
        }
    }
    rc = ZT_OK;
out:
    free(v);
    return rc;
}

static int run_broadcast(zt_comm_req *op)
{
    MPI_Request rq = MPI_REQUEST_NULL;
    if (op->comm->size == 1) return ZT_OK;
    MPI_Comm h = HANDLE(op->comm);
    MPI_Datatype T = mpi_type(op);
    const int64_t n = op->count;
    int64_t P = (int64_t)(op->msg_bytes / op->esize);
    if (P < 1) P = 1;
    int rc = ZT_OK;
    for (int64_t k0 = 0; k0 < n; k0 += P) {
        const int L = (int)(n - k0 < P ? n - k0 : P);
        MPI_DO(op->fn, "MPI_Ibcast",
               wait_gently(MPI_Ibcast((char *)op->out + (size_t)k0 * op->esize, L, T, op->root, h,
                                      &rq), &rq));
    }
out:
    return rc;
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

static int mpi_progress(zt_comm_req *op, int *done)
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

/* ---- groups and host metadata ---------------------------------------------------- */
static int run_split(zt_comm_req *op)
{
    int rc = ZT_OK;
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
    return ZT_OK;
out:
    if (*h != MPI_COMM_NULL) MPI_Comm_free(h);
    free(h);
    free(c);
    return rc;
}

static int mpi_start(zt_comm_req *op)
{
    int rc = ZT_OK;
    MPI_Comm h = HANDLE(op->comm);
    switch (op->kind) {
    case ZT_OP_ALL_REDUCE: return run_all_reduce(op);
    case ZT_OP_REDUCE_SCATTER: return run_reduce_scatter(op);
    case ZT_OP_ALL_GATHER: return run_all_gather(op);
    case ZT_OP_BROADCAST: return run_broadcast(op);
    case ZT_OP_SEND: case ZT_OP_RECV: return run_p2p(op);
    case ZT_OP_SPLIT: return run_split(op);
    case ZT_OP_BARRIER:
    {
        MPI_Request rq = MPI_REQUEST_NULL;
        MPI_DO(op->fn, "MPI_Ibarrier", wait_gently(MPI_Ibarrier(h, &rq), &rq));
    }
        break;
    case ZT_OP_ALL_GATHER_HOST: {
        const int me = op->comm->rank;
        const size_t nb = (size_t)op->count;
        const int inplace = (const char *)op->in == (char *)op->out + (size_t)me * nb;
        MPI_DO(op->fn, "MPI_Allgather",
               MPI_Allgather(inplace ? MPI_IN_PLACE : op->in, (int)nb, MPI_BYTE,
                             op->out, (int)nb, MPI_BYTE, h));
        break;
    }
    case ZT_OP_BROADCAST_HOST:
        MPI_DO(op->fn, "MPI_Bcast", MPI_Bcast(op->out, (int)op->count, MPI_BYTE, op->root, h));
        break;
    default:
        return zt_error(ZT_EINVAL, "%s: unknown operation %d", op->fn, op->kind);
    }
out:
    return rc;
}

const zt_transport zt_transport_mpi = {
    .name = "mpi",
    .threaded = 1,
    .init = mpi_init,
    .start = mpi_start,
    .progress = mpi_progress,
    .free_comm = mpi_free_comm,
    .finalize = mpi_finalize,
    .abort = mpi_abort,
};
