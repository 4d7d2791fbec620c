/*
 * comm_stage.c -- the MPI transport with device tensors on a device whose
 * memory the host cannot address (CUDA; device_fakegpu.c and
 * device_fakegpu_async.c, its stand-ins for tests on the CPU): their bytes go through host buffers (pinned on CUDA),
 * so MPI never reads GPU memory (no CUDA-aware MPI needed) and several
 * ranks can share one GPU -- for testing dp and ZeRO at N = 2 on one GPU,
 * where NCCL refuses to run. Slow by design: the communication thread
 * copies whole tensors down before the operation and up after it,
 * blocking (the execution table's copy_blocking, CUDA's cudaMemcpy; the
 * device's synchronous copy on a device without one). The arithmetic is
 * comm_mpi.c's, on the host, so the bits are the MPI transport's.
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
 * The events exist on a device with an execution table (internal.h); the
 * others run their ops synchronously, so there is nothing to wait for.
 */
#include <stdlib.h>
#include <string.h>
#include "comm.h"

typedef struct {
    void *dev_out, *dev_in;     /* the tensors' device bytes */
    char *h_out, *h_in;         /* their staging buffers (h_out may lie inside h_in) */
    size_t out_bytes, in_bytes, held_out, held_in;
    int up;                     /* copy out back to the device when done */
    int tier, retiered;         /* the operation's own tier (it runs as a host one) */
    const zt_exec_ops *x;       /* the device's execution table, or NULL */
} staged;

/* a device-tier operation on a device whose memory is not the host's */
static int staged_device(const zt_comm_req *op)
{
    return op->tier == ZT_TIER_DEVICE && zt_dev() != &zt_cpu_device;
}

/* ... on a device with streams of its own (an execution table: CUDA,
 * fakegpu-async): ordered by an event, copied by exec->copy_blocking */
static const zt_exec_ops *exec_of(const zt_comm_req *op)
{
    return staged_device(op) ? zt_exec() : NULL;
}

/* n bytes between the device and a staging buffer; up: host -> device.
 * exec: blocking and ordered after nothing (CUDA's cudaMemcpy): the issue
 * event ordered the copy down, the request's waiters order the copy up. */
static int stage_copy(const zt_exec_ops *x, const zt_comm_req *op, void *dst, const void *src,
                      size_t n, int up)
{
    if (!x) {
        zt_dev()->copy(dst, src, n);   /* synchronous, pointers of either side */
        return ZT_OK;
    }
    int rc = x->copy_blocking(dst, src, n);
    return rc == ZT_OK ? ZT_OK
         : zt_error(rc, "%s: staging device tensors for MPI (%s): %s", op->fn,
                    up ? "host to device" : "device to host", zt_last_error());
}

int zt_comm_stage_issue(zt_comm_req *op)
{
    const zt_exec_ops *x = exec_of(op);
    if (!x) return ZT_OK;
    void *ev = NULL;
    ZT_TRY(x->event_new(&ev));
    int rc = x->event_record(ev, NULL);
    if (rc != ZT_OK) { x->event_free(ev); return rc; }
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
    if (!staged_device(op)) return ZT_OK;
    const zt_exec_ops *x = exec_of(op);
    int rc = x ? x->bind_thread() : ZT_OK;
    staged *s = rc ? NULL : calloc(1, sizeof *s);
    if (!rc && !s) rc = zt_error(ZT_ENOMEM, "%s: out of memory", op->fn);
    if (op->ready) {            /* the caller's kernels first */
        int e = x->event_sync(op->ready);
        x->event_free(op->ready);
        op->ready = NULL;
        if (!rc && e != ZT_OK) rc = e;
    }
    if (rc) { free(s); return rc; }
    s->x = x;
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
    if (!rc && s->in_bytes && !in_in_out) rc = stage_copy(s->x, op, s->h_in, op->in, s->in_bytes, 0);
    if (!rc && down_out) rc = stage_copy(s->x, op, s->h_out, op->out, s->out_bytes, 0);
    if (!rc && in_in_out)       /* in's bytes are inside out's buffer */
        rc = stage_copy(s->x, op, s->h_in, op->in, s->in_bytes, 0);
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
    if (rc == ZT_OK && s->up && s->out_bytes) rc = stage_copy(s->x, op, s->dev_out, s->h_out, s->out_bytes, 1);
    op->out = s->dev_out;
    op->in = s->dev_in;
    if (s->retiered) op->tier = s->tier;
    if (s->held_in) zt_mem_free(s->h_in, s->held_in, ZT_TIER_HOST, ZT_CAT_COMM);
    if (s->held_out) zt_mem_free(s->h_out, s->held_out, ZT_TIER_HOST, ZT_CAT_COMM);
    free(s);
    return rc;
}
