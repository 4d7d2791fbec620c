/*
 * comm_nccl.c -- NCCL under a communicator (a `make CUDA=1` build only).
 *
 * zt_comm_use_nccl(c, deterministic) moves an MPI communicator's device-tier
 * collectives to NCCL: a collective over c, run by the communication thread
 * (comm.c) like every operation. Rank 0 makes an ncclUniqueId and MPI
 * broadcasts it over c; every rank then joins with ncclCommInitRank on its
 * GPU (the CUDA device the process selected: zt_cuda_init maps the local
 * rank to a device, one GPU per rank; NCCL refuses two ranks on one GPU --
 * ranks sharing a GPU stay on MPI, which stages device tensors through
 * pinned host memory). Groups split from c get their own NCCL communicator
 * (ncclCommSplit), so a data-parallel group of a pipeline runs NCCL too.
 *
 * What runs where. Host-tier tensors, host bytes, barriers and splits stay
 * on MPI (comm_mpi.c reads the MPI_Comm that starts this transport's
 * handle). Device-tier operations are enqueued on the communicator's own
 * CUDA stream (highest priority), after an event recorded on the caller's
 * current stream when it issued them (so NCCL reads what the compute stream
 * wrote); the engine polls an event recorded after them. Nothing here
 * waits, except the bootstrap and ncclCommSplit (both collective set-ups).
 *
 * Reductions. deterministic (the default; recipe comm.deterministic):
 * all_reduce and reduce_scatter are comm_mpi.c's algorithms with NCCL
 * moving the bytes -- an all-to-all of the chunks (ncclSend/ncclRecv in a
 * group), then zkc_sum_ranks, the rank-order sum ((c0 + c1) + c2) + ...
 * with the CPU's bits; all_reduce then all-gathers the reduced chunks with
 * the same balanced partition. Element by element the arithmetic is the MPI
 * communicator's, so results match it bit for bit whatever the world's size
 * or the rounds (of at most the scratch budget). deterministic = 0:
 * ncclAllReduce / ncclReduceScatter (NCCL's ring/tree order: faster, not
 * the same bits as one rank).
 *
 * Point to point: ncclSend / ncclRecv on the communicator's stream. Unlike
 * MPI there are no tags and no size check (a mismatch hangs or faults the
 * GPU), and transfers between two ranks run in issue order: a send and a
 * receive issued in opposite orders on two ranks deadlock. The pipeline
 * schedules pair them; anything else should stay on MPI (host tensors).
 *
 * Errors: every ncclResult_t and cudaError_t is checked; failures become
 * zt_error(ZT_EIO, "nccl: file:line: call: name (detail)"). NCCL's
 * asynchronous errors are polled while an operation is in flight.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <mpi.h>
#include "comm.h"
#include "cuda_stream.h"
#include "../kernels/cuda/kernels.cuh"

/* The handle of an NCCL communicator. mpi comes first: comm_mpi.c reads
 * *(MPI_Comm *)c->impl for the operations that stay on MPI, and frees the
 * whole block with free(). */
typedef struct {
    MPI_Comm mpi;
    ncclComm_t nc;
    cudaStream_t st;
    int det;
    float *scr;                 /* the deterministic reductions' receive buffer (device tier,
                                   "comm"), kept between operations: receive_buffer() */
    size_t scr_bytes;
} nccl_impl;

#define IMPL(c) ((nccl_impl *)(c)->impl)

/* An operation's NCCL state (op->pending; freed by the engine). */
typedef struct {
    cudaEvent_t done;           /* recorded after its last call on the stream */
} nccl_state;

static int nc_err(const char *file, int line, const char *call, ncclResult_t r, ncclComm_t c)
{
    const char *last = c ? ncclGetLastError(c) : "";
    return zt_error(ZT_EIO, "nccl: %s:%d: %s: %s%s%s", file, line, call, ncclGetErrorString(r),
                    last && *last ? ": " : "", last ? last : "");
}

static int cu_fail(const char *file, int line, const char *call, cudaError_t e)
{
    (void)cudaGetLastError();
    return zt_error(ZT_EIO, "nccl: %s:%d: %s: %s (%s)", file, line, call, cudaGetErrorName(e),
                    cudaGetErrorString(e));
}

#define NC(c, call) do { ncclResult_t r_ = (call); \
    if (r_ != ncclSuccess) { rc = nc_err(__FILE__, __LINE__, #call, r_, c); goto out; } } while (0)
#define CUD(call) do { cudaError_t e_ = (call); \
    if (e_ != cudaSuccess) { rc = cu_fail(__FILE__, __LINE__, #call, e_); goto out; } } while (0)

static int is_device_op(const zt_comm_req *op)
{
    switch (op->kind) {
    case ZT_OP_ALL_REDUCE: case ZT_OP_REDUCE_SCATTER: case ZT_OP_ALL_GATHER:
    case ZT_OP_BROADCAST: case ZT_OP_SEND: case ZT_OP_RECV:
        return op->tier == ZT_TIER_DEVICE;
    default:
        return 0;
    }
}

/* ---- set-up ------------------------------------------------------------------------ */

/* On the communication thread: c (MPI) gets an NCCL communicator. Blocking
 * and collective over c: every rank runs it at the same point of c's queue. */
static int attach(zt_comm_req *op)
{
    zt_comm *c = op->comm;
    MPI_Comm mpi = *(MPI_Comm *)c->impl;
    struct { int ok; ncclUniqueId id; } boot;
    int rc = ZT_OK;
    ZT_TRY(zt_cuda_bind_thread());     /* this thread's CUDA calls go to the rank's GPU */
    nccl_impl *im = calloc(1, sizeof *im);
    if (!im) return zt_error(ZT_ENOMEM, "%s: out of memory", op->fn);
    memset(&boot, 0, sizeof boot);
    if (c->rank == 0) boot.ok = ncclGetUniqueId(&boot.id) == ncclSuccess;
    /* rank 0 sends even when it failed: the others must not wait forever */
    int e = MPI_Bcast(&boot, (int)sizeof boot, MPI_BYTE, 0, mpi);
    if (e != MPI_SUCCESS) { free(im); return zt_error(ZT_EIO, "%s: MPI_Bcast of the ncclUniqueId failed (MPI error %d)", op->fn, e); }
    if (!boot.ok) { free(im); return zt_error(ZT_EIO, "%s: rank 0 could not create an ncclUniqueId (ncclGetUniqueId failed there)", op->fn); }
    int lo = 0, hi = 0;
    CUD(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    CUD(cudaStreamCreateWithPriority(&im->st, cudaStreamNonBlocking, hi));
    NC(NULL, ncclCommInitRank(&im->nc, c->size, boot.id, c->rank));
    im->mpi = mpi;
    im->det = op->color;        /* the deterministic flag travels in color */
    free(c->impl);
    c->impl = im;
    c->tp = &zt_transport_nccl;
    return ZT_OK;
out:
    if (im->st) cudaStreamDestroy(im->st);
    free(im);
    return rc;
}

/* A group split from an NCCL communicator joins NCCL too (ncclCommSplit
 * over the parent: every parent rank is in this split). child came from
 * MPI's split with its own MPI_Comm handle. */
static int attach_child(zt_comm_req *op, zt_comm *child)
{
    nccl_impl *pi = IMPL(op->comm);
    nccl_impl *im = calloc(1, sizeof *im);
    int rc = ZT_OK;
    if (!im) return zt_error(ZT_ENOMEM, "%s: out of memory", op->fn);
    int lo = 0, hi = 0;
    CUD(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    CUD(cudaStreamCreateWithPriority(&im->st, cudaStreamNonBlocking, hi));
    NC(pi->nc, ncclCommSplit(pi->nc, op->color, op->key, &im->nc, NULL));
    im->mpi = *(MPI_Comm *)child->impl;
    im->det = pi->det;
    free(child->impl);
    child->impl = im;
    child->tp = &zt_transport_nccl;
    return ZT_OK;
out:
    if (im->st) cudaStreamDestroy(im->st);
    free(im);
    return rc;
}

/* ---- device operations ------------------------------------------------------------- */

static int64_t clamp(int64_t v, int64_t hi) { return v < 0 ? 0 : v > hi ? hi : v; }

/* Each rank's chunk of rank r's slice [lo, lo + len) in this round: its
 * slice is sent to r; r's copies of my slice land in scr row r. dst = the
 * rank-order sum of the rows. (all_reduce and reduce_scatter alike.) */
static int exchange_sum(nccl_impl *im, zt_comm *c, float *scr, int64_t S,
                        const float *const *send, const int64_t *slen, float *dst, int64_t mylen)
{
    const int p = c->size, me = c->rank;
    int rc = ZT_OK;
    if (mylen) CUD(cudaMemcpyAsync(scr + (size_t)me * mylen, send[me], (size_t)mylen * 4,
                                   cudaMemcpyDeviceToDevice, im->st));
    NC(im->nc, ncclGroupStart());
    for (int r = 0; r < p && rc == ZT_OK; r++) {
        if (r == me) continue;
        ncclResult_t a = slen[r] ? ncclSend(send[r], (size_t)slen[r], ncclFloat, r, im->nc, im->st)
                                 : ncclSuccess;
        ncclResult_t b = mylen ? ncclRecv(scr + (size_t)r * mylen, (size_t)mylen, ncclFloat, r,
                                          im->nc, im->st) : ncclSuccess;
        if (a != ncclSuccess) rc = nc_err(__FILE__, __LINE__, "ncclSend", a, im->nc);
        else if (b != ncclSuccess) rc = nc_err(__FILE__, __LINE__, "ncclRecv", b, im->nc);
    }
    {
        ncclResult_t g = ncclGroupEnd();    /* always closes the group */
        if (rc == ZT_OK && g != ncclSuccess) rc = nc_err(__FILE__, __LINE__, "ncclGroupEnd", g, im->nc);
    }
    if (rc == ZT_OK && mylen) {
        int e = zkc_sum_ranks(im->st, dst, scr, p, (size_t)mylen);
        if (e) rc = cu_fail(__FILE__, __LINE__, "zkc_sum_ranks", (cudaError_t)e);
    }
    (void)S;
out:
    return rc;
}

/* The deterministic reductions' receive buffer, at least `bytes`: the
 * communicator's own, kept from one operation to the next. Its operations
 * run in issue order on im->st, so one buffer serves them all; a larger
 * one replaces it once that stream has drained (a few times a run: the
 * rounds cap its size). Allocated and freed per operation it cost a
 * cudaFree each -- a wait for the whole device on the communication
 * thread, so a backward's next bucket could not start before the compute
 * stream was done, and an NCCL transfer in flight on another communicator
 * was waited for from inside this one's progress. */
static int receive_buffer(nccl_impl *im, size_t bytes, float **out)
{
    if (im->scr_bytes < bytes) {
        if (im->scr) {
            cudaError_t e = cudaStreamSynchronize(im->st);      /* its last reader */
            if (e != cudaSuccess) return cu_fail(__FILE__, __LINE__, "cudaStreamSynchronize", e);
            zt_mem_free(im->scr, im->scr_bytes, ZT_TIER_DEVICE, ZT_CAT_COMM);
            im->scr = NULL;
            im->scr_bytes = 0;
        }
        ZT_TRY(zt_mem_alloc((void **)&im->scr, bytes, ZT_TIER_DEVICE, ZT_CAT_COMM,
                            "nccl reduction receive buffer"));
        im->scr_bytes = bytes;
    }
    *out = im->scr;
    return ZT_OK;
}

/* all_reduce, deterministic: per round, exchange + sum of this rank's chunk
 * of the balanced partition, then every rank's reduced slice to every rank. */
static int all_reduce_det(zt_comm_req *op, nccl_impl *im)
{
    zt_comm *c = op->comm;
    const int p = c->size, me = c->rank;
    float *x = op->out;
    const int64_t n = op->count, base = n / p, rem = n % p, big = base + (rem ? 1 : 0);
    if (big == 0) return ZT_OK;
    const int64_t S = zt_comm_round_elems(op, p, big);
    float *scr = NULL;
    ZT_TRY(receive_buffer(im, (size_t)p * (size_t)S * 4, &scr));
    const float **send = malloc((size_t)p * sizeof *send);
    int64_t *len = malloc((size_t)p * sizeof *len);
    int rc = send && len ? ZT_OK : zt_error(ZT_ENOMEM, "%s: out of memory", op->fn);
    for (int64_t k0 = 0; rc == ZT_OK && k0 < big; k0 += S) {
        for (int r = 0; r < p; r++) {
            int64_t off = r * base + (r < rem ? r : rem), L = base + (r < rem ? 1 : 0);
            len[r] = clamp(L - k0, S);
            send[r] = x + off + k0;
        }
        float *mine = (float *)send[me];
        const int64_t ml = len[me];
        rc = exchange_sum(im, c, scr, S, send, len, mine, ml);
        if (rc) break;
        NC(im->nc, ncclGroupStart());
        for (int r = 0; r < p; r++) {
            if (r == me) continue;
            ncclResult_t a = ml ? ncclSend(mine, (size_t)ml, ncclFloat, r, im->nc, im->st) : ncclSuccess;
            ncclResult_t b = len[r] ? ncclRecv((float *)send[r], (size_t)len[r], ncclFloat, r,
                                               im->nc, im->st) : ncclSuccess;
            if (rc == ZT_OK && a != ncclSuccess) rc = nc_err(__FILE__, __LINE__, "ncclSend", a, im->nc);
            if (rc == ZT_OK && b != ncclSuccess) rc = nc_err(__FILE__, __LINE__, "ncclRecv", b, im->nc);
        }
        ncclResult_t g = ncclGroupEnd();
        if (rc == ZT_OK && g != ncclSuccess) rc = nc_err(__FILE__, __LINE__, "ncclGroupEnd", g, im->nc);
    }
out:
    free(send);
    free(len);
    return rc;
}

/* reduce_scatter, deterministic: in holds p chunks of m; rank r's chunk k
 * goes to rank k; out = the rank-order sum of what arrives. */
static int reduce_scatter_det(zt_comm_req *op, nccl_impl *im)
{
    zt_comm *c = op->comm;
    const int p = c->size;
    const int64_t m = op->count;
    if (m == 0) return ZT_OK;
    const int64_t S = zt_comm_round_elems(op, p, m);
    float *scr = NULL;
    ZT_TRY(receive_buffer(im, (size_t)p * (size_t)S * 4, &scr));
    const float **send = malloc((size_t)p * sizeof *send);
    int64_t *len = malloc((size_t)p * sizeof *len);
    int rc = send && len ? ZT_OK : zt_error(ZT_ENOMEM, "%s: out of memory", op->fn);
    for (int64_t k0 = 0; rc == ZT_OK && k0 < m; k0 += S) {
        const int64_t L = clamp(m - k0, S);
        for (int r = 0; r < p; r++) {
            len[r] = L;
            send[r] = (const float *)op->in + (size_t)r * m + k0;
        }
        rc = exchange_sum(im, c, scr, S, send, len, (float *)op->out + k0, L);
    }
    free(send);
    free(len);
    return rc;
}

/* Enqueue a device operation on the communicator's stream. */
static int enqueue_device(zt_comm_req *op, nccl_state *ns)
{
    nccl_impl *im = IMPL(op->comm);
    ncclComm_t nc = im->nc;
    const size_t bytes = (size_t)op->count * op->esize;
    int rc = ZT_OK;
    if (op->ready) {            /* what the issuing stream wrote first */
        CUD(cudaStreamWaitEvent(im->st, (cudaEvent_t)op->ready, 0));
    }
    switch (op->kind) {
    case ZT_OP_ALL_REDUCE:
        if (im->det) rc = all_reduce_det(op, im);
        else if (op->count) NC(nc, ncclAllReduce(op->out, op->out, (size_t)op->count, ncclFloat, ncclSum, nc, im->st));
        break;
    case ZT_OP_REDUCE_SCATTER:
        if (im->det) rc = reduce_scatter_det(op, im);
        else if (op->count) NC(nc, ncclReduceScatter(op->in, op->out, (size_t)op->count, ncclFloat, ncclSum, nc, im->st));
        break;
    case ZT_OP_ALL_GATHER:      /* in place when in is out's own slot (NCCL's rule too) */
        if (bytes) NC(nc, ncclAllGather(op->in, op->out, bytes, ncclUint8, nc, im->st));
        break;
    case ZT_OP_BROADCAST:
        if (bytes) NC(nc, ncclBroadcast(op->out, op->out, bytes, ncclUint8, op->root, nc, im->st));
        break;
    case ZT_OP_SEND:
        if (bytes) NC(nc, ncclSend(op->in, bytes, ncclUint8, op->peer, nc, im->st));
        break;
    case ZT_OP_RECV:
        if (bytes) NC(nc, ncclRecv(op->out, bytes, ncclUint8, op->peer, nc, im->st));
        break;
    }
    if (rc == ZT_OK) CUD(cudaEventRecord(ns->done, im->st));
out:
    return rc;
}

static void state_free(zt_comm_req *op)
{
    nccl_state *ns = op->pending;
    if (!ns) return;
    if (ns->done) cudaEventDestroy(ns->done);
    ns->done = NULL;
}

/* ---- the transport ----------------------------------------------------------------- */

/* On the caller's thread: a device operation remembers where the caller's
 * stream is, so NCCL reads the tensor after the kernels that wrote it. */
static int nccl_issue(zt_comm_req *op)
{
    if (!is_device_op(op)) return ZT_OK;
    void *ev = NULL;
    ZT_TRY(zt_cuda_event_new(&ev, 0));
    int rc = zt_cuda_event_record(ev, NULL);
    if (rc != ZT_OK) { zt_cuda_event_free(ev); return rc; }
    op->ready = ev;
    return ZT_OK;
}

static int nccl_start(zt_comm_req *op)
{
    if (op->kind == ZT_OP_NCCL_ATTACH) return attach(op);
    if (!is_device_op(op)) return zt_transport_mpi.start(op);
    op->on_nccl = 1;
    ZT_TRY(zt_cuda_bind_thread());
    nccl_state *ns = calloc(1, sizeof *ns);
    if (!ns) return zt_error(ZT_ENOMEM, "%s: out of memory", op->fn);
    op->pending = ns;
    int rc = ZT_OK;
    CUD(cudaEventCreateWithFlags(&ns->done, cudaEventDisableTiming));
    rc = enqueue_device(op, ns);
out:
    if (op->ready) { cudaEventDestroy((cudaEvent_t)op->ready); op->ready = NULL; }
    if (rc != ZT_OK) {
        /* what was enqueued may still run: let it end before its event goes */
        cudaStreamSynchronize(IMPL(op->comm)->st);
        state_free(op);
        return rc;
    }
    op->inflight = 1;
    return ZT_OK;
}

static int nccl_progress(zt_comm_req *op, int *done)
{
    *done = 0;
    if (!op->on_nccl) {
        zt_comm *parent = op->comm;
        int rc = zt_transport_mpi.progress(op, done);
        if (rc == ZT_OK && *done && op->kind == ZT_OP_SPLIT && *op->split_out)
            rc = attach_child(op, *op->split_out);      /* MPI split done: NCCL's */
        (void)parent;
        return rc;
    }
    nccl_state *ns = op->pending;
    nccl_impl *im = IMPL(op->comm);
    cudaError_t e = cudaEventQuery(ns->done);
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        ncclResult_t ae = ncclSuccess;
        if (ncclCommGetAsyncError(im->nc, &ae) == ncclSuccess && ae != ncclSuccess &&
            ae != ncclInProgress) {
            int rc = nc_err(__FILE__, __LINE__, "ncclCommGetAsyncError", ae, im->nc);
            *done = 1;              /* the communicator is broken */
            cudaEventDestroy(ns->done);
            ns->done = NULL;
            return rc;
        }
        return ZT_OK;
    }
    op->moved = 1;
    *done = 1;
    int rc = e == cudaSuccess ? ZT_OK : cu_fail(__FILE__, __LINE__, "cudaEventQuery", e);
    state_free(op);
    return rc;
}

static int nccl_free_comm(zt_comm *c)
{
    nccl_impl *im = IMPL(c);
    int rc = ZT_OK;
    if (im) {
        cudaStreamSynchronize(im->st);
        ncclResult_t r = ncclCommDestroy(im->nc);
        if (r != ncclSuccess) rc = nc_err(__FILE__, __LINE__, "ncclCommDestroy", r, NULL);
        cudaStreamDestroy(im->st);
        zt_mem_free(im->scr, im->scr_bytes, ZT_TIER_DEVICE, ZT_CAT_COMM);   /* its stream drained */
        im->scr = NULL;
    }
    int rm = zt_transport_mpi.free_comm(c);     /* MPI_Comm_free + free(impl) */
    return rc ? rc : rm;
}

static int nccl_init(zt_comm *w)
{
    (void)w;
    return zt_error(ZT_EINVAL, "nccl: not a world transport; zt_comm_use_nccl upgrades an "
                    "MPI communicator");
}

static int nccl_finalize(zt_comm *w)
{
    nccl_impl *im = IMPL(w);
    if (im) {
        cudaStreamSynchronize(im->st);
        ncclCommDestroy(im->nc);
        cudaStreamDestroy(im->st);
        zt_mem_free(im->scr, im->scr_bytes, ZT_TIER_DEVICE, ZT_CAT_COMM);
        MPI_Comm *h = malloc(sizeof *h);    /* hand MPI its handle back, as it made it */
        if (h) *h = im->mpi;
        free(im);
        w->impl = h;
    }
    return zt_transport_mpi.finalize(w);
}

static void nccl_abort(int code) { zt_transport_mpi.abort(code); }

const zt_transport zt_transport_nccl = {
    .name = "nccl",
    .threaded = 1,
    .init = nccl_init,
    .issue = nccl_issue,
    .start = nccl_start,
    .progress = nccl_progress,
    .free_comm = nccl_free_comm,
    .finalize = nccl_finalize,
    .abort = nccl_abort,
};

/* ---- API --------------------------------------------------------------------------- */

int zt_comm_use_nccl(zt_comm *c, int deterministic)
{
    const char *fn = "zt_comm_use_nccl";
    ZT_TRY(zt_comm_usable(fn, c));
    ZT_CHECK(strcmp(zt_dev()->name, "cuda") == 0, "%s: NCCL needs the cuda device "
             "(zt_device_init); this process runs on the %s device", fn, zt_dev()->name);
    if (c->tp == &zt_transport_nccl) {
        ZT_CHECK(!IMPL(c)->det == !deterministic, "%s: this communicator already runs NCCL "
                 "with deterministic = %s", fn, IMPL(c)->det ? "true" : "false");
        return ZT_OK;
    }
    if (c->tp == &zt_transport_local) return ZT_OK;     /* one rank: nothing to move */
    ZT_CHECK(c->tp == &zt_transport_mpi, "%s: the %s transport cannot carry NCCL", fn,
             c->tp->name);
    zt_comm_req *op = NULL;
    ZT_TRY(zt_comm_new_op(&op, ZT_OP_NCCL_ATTACH, fn, c));
    op->tp = &zt_transport_nccl;        /* runs NCCL's start on the MPI communicator */
    op->color = deterministic != 0;
    return zt_comm_submit(op, NULL);
}
