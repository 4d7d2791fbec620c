/*
 * comm_stage.c -- the MPI transport with device tensors on the CUDA device
 * (a `make CUDA=1` build only): their bytes go through pinned host buffers,
 * so MPI never reads GPU memory (no CUDA-aware MPI needed) and several
 * ranks can share one GPU -- for testing dp and ZeRO at N = 2 on one GPU,
 * where NCCL refuses to run. Slow by design: the communication thread
 * copies whole tensors down before the operation and up after it,
 * blocking (cudaMemcpy). The arithmetic is comm_mpi.c's, on the host, so
 * the bits are the MPI transport's.
 *
 *  issue  (caller's thread): an event on the caller's current stream, so
 *         the copy down reads what the kernels issued before wrote;
 *  start  (communication thread): wait for it, pinned buffers on the host
 *         tier ("comm"), copy down what the operation reads, point the
 *         operation at the buffers and make it a host-tier one (MPI's own
 *         receive scratch is then host memory too);
 *  finish (communication thread, after the MPI operation): copy up what it
 *         wrote, free the buffers.
 * Host-tier operations, and every operation on the CPU device, pass through.
 */
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "comm.h"
#include "cuda_stream.h"

typedef struct {
    void *dev_out, *dev_in;     /* the tensors' device bytes */
    char *h_out, *h_in;         /* their staging buffers (h_out may lie inside h_in) */
    size_t out_bytes, in_bytes, held_out, held_in;
    int up;                     /* copy out back to the device when done */
    int tier, retiered;         /* the operation's own tier (it runs as a host one) */
} staged;

static int on_cuda(const zt_comm_req *op)
{
    return op->tier == ZT_TIER_DEVICE && strcmp(zt_dev()->name, "cuda") == 0;
}

static int cu_fail(const char *fn, const char *call, cudaError_t e)
{
    (void)cudaGetLastError();
    return zt_error(ZT_EIO, "%s: staging device tensors for MPI: %s:%d: %s: %s (%s)", fn,
                    __FILE__, __LINE__, call, cudaGetErrorName(e), cudaGetErrorString(e));
}

int zt_comm_stage_issue(zt_comm_req *op)
{
    if (!on_cuda(op)) return ZT_OK;
    void *ev = NULL;
    ZT_TRY(zt_cuda_event_new(&ev, 0));
    int rc = zt_cuda_event_record(ev, NULL);
    if (rc != ZT_OK) { zt_cuda_event_free(ev); return rc; }
    op->ready = ev;
    return ZT_OK;
}

/* Bytes the operation reads (in) and writes (out), by kind; down: whether
 * out's device bytes are read too. */
static void extents(const zt_comm_req *op, size_t *out, size_t *in, int *down_out, int *up)
{
    size_t m = (size_t)op->count * op->esize, p = (size_t)op->comm->size;
    *out = *in = 0;
    *down_out = 0;
    *up = 1;
    switch (op->kind) {
    case ZT_OP_ALL_REDUCE: case ZT_OP_BROADCAST: *out = m; *down_out = 1; break;
    case ZT_OP_REDUCE_SCATTER: *out = m; *in = m * p; break;
    case ZT_OP_ALL_GATHER: *out = m * p; *in = m; break;
    case ZT_OP_SEND: *in = m; *up = 0; break;
    case ZT_OP_RECV: *out = m; break;
    default: *up = 0; break;
    }
}

static int inside(const void *p, size_t n, const void *base, size_t bn)
{
    const char *a = p, *b = base;
    return a >= b && a + n <= b + bn;
}

int zt_comm_stage_in(zt_comm_req *op)
{
    if (!on_cuda(op)) return ZT_OK;
    int rc = zt_cuda_bind_thread();
    staged *s = rc ? NULL : calloc(1, sizeof *s);
    if (!rc && !s) rc = zt_error(ZT_ENOMEM, "%s: out of memory", op->fn);
    if (op->ready) {            /* the caller's kernels first */
        cudaError_t e = cudaEventSynchronize((cudaEvent_t)op->ready);
        cudaEventDestroy((cudaEvent_t)op->ready);
        op->ready = NULL;
        if (!rc && e != cudaSuccess) rc = cu_fail(op->fn, "cudaEventSynchronize", e);
    }
    if (rc) { free(s); return rc; }
    int down_out = 0;
    extents(op, &s->out_bytes, &s->in_bytes, &down_out, &s->up);
    s->dev_out = op->out;
    s->dev_in = (void *)op->in;
    /* in place (out inside in, or in inside out): one buffer, the larger */
    int out_in_in = s->out_bytes && s->in_bytes && inside(op->out, s->out_bytes, op->in, s->in_bytes);
    int in_in_out = s->out_bytes && s->in_bytes && !out_in_in &&
                    inside(op->in, s->in_bytes, op->out, s->out_bytes);
    if (s->in_bytes && !in_in_out) {
        rc = zt_mem_alloc((void **)&s->h_in, s->in_bytes, ZT_TIER_HOST, ZT_CAT_COMM,
                          "MPI staging of a device tensor");
        if (!rc) s->held_in = s->in_bytes;
    }
    if (!rc && s->out_bytes && !out_in_in) {
        rc = zt_mem_alloc((void **)&s->h_out, s->out_bytes, ZT_TIER_HOST, ZT_CAT_COMM,
                          "MPI staging of a device tensor");
        if (!rc) s->held_out = s->out_bytes;
    }
    if (!rc && out_in_in) s->h_out = s->h_in + ((const char *)op->out - (const char *)op->in);
    if (!rc && in_in_out) s->h_in = s->h_out + ((const char *)op->in - (char *)op->out);
    cudaError_t e = cudaSuccess;
    if (!rc && s->in_bytes && !in_in_out)
        e = cudaMemcpy(s->h_in, op->in, s->in_bytes, cudaMemcpyDeviceToHost);
    if (!rc && e == cudaSuccess && down_out)
        e = cudaMemcpy(s->h_out, op->out, s->out_bytes, cudaMemcpyDeviceToHost);
    if (!rc && in_in_out && e == cudaSuccess)   /* in's bytes are inside out's buffer */
        e = cudaMemcpy(s->h_in, op->in, s->in_bytes, cudaMemcpyDeviceToHost);
    if (!rc && e != cudaSuccess) rc = cu_fail(op->fn, "cudaMemcpy(device to host)", e);
    op->staged = s;
    if (rc) return zt_comm_stage_out(op, rc);
    if (s->h_out) op->out = s->h_out;
    if (s->h_in) op->in = s->h_in;
    /* MPI's receive scratch goes on op->tier: host memory, not the GPU's */
    s->tier = op->tier;
    s->retiered = 1;
    op->tier = ZT_TIER_HOST;
    return ZT_OK;
}

int zt_comm_stage_out(zt_comm_req *op, int rc)
{
    staged *s = op->staged;
    if (!s) return rc;
    op->staged = NULL;
    if (rc == ZT_OK && s->up && s->out_bytes) {
        cudaError_t e = cudaMemcpy(s->dev_out, s->h_out, s->out_bytes, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) rc = cu_fail(op->fn, "cudaMemcpy(host to device)", e);
    }
    op->out = s->dev_out;
    op->in = s->dev_in;
    if (s->retiered) op->tier = s->tier;
    if (s->held_in) zt_mem_free(s->h_in, s->held_in, ZT_TIER_HOST, ZT_CAT_COMM);
    if (s->held_out) zt_mem_free(s->h_out, s->held_out, ZT_TIER_HOST, ZT_CAT_COMM);
    free(s);
    return rc;
}
