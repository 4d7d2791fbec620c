/*
 * comm_local.c -- the one-rank transport: the world of a process started
 * without an MPI launcher. Every collective over one rank is an identity
 * (or a copy where out != in); operations complete on the caller at once.
 * MPI is never touched.
 */
#include <stdlib.h>
#include <string.h>
#include "comm.h"

static int local_init(zt_comm *w)
{
    w->rank = 0;
    w->size = 1;
    w->impl = NULL;
    return ZT_OK;
}

static int local_start(zt_comm_req *op)
{
    switch (op->kind) {
    case ZT_OP_ALL_REDUCE:          /* the sum over one rank */
    case ZT_OP_BROADCAST:           /* root is this rank */
    case ZT_OP_BROADCAST_HOST:
    case ZT_OP_BARRIER:
        return ZT_OK;
    case ZT_OP_REDUCE_SCATTER:
    case ZT_OP_ALL_GATHER:          /* out and in are equal-sized */
        if (op->out != op->in)
            zt_dev()->copy(op->out, op->in, (size_t)op->count * op->esize);
        return ZT_OK;
    case ZT_OP_ALL_GATHER_HOST:
        if (op->out != op->in) memcpy(op->out, op->in, (size_t)op->count);
        return ZT_OK;
    case ZT_OP_SPLIT: {
        zt_comm *c = calloc(1, sizeof *c);
        if (!c) return zt_error(ZT_ENOMEM, "%s: out of memory for a communicator", op->fn);
        c->tp = &zt_transport_local;
        c->rank = 0;
        c->size = 1;
        *op->split_out = c;
        return ZT_OK;
    }
    default:                        /* send/recv: validation found no peer */
        return zt_error(ZT_EINVAL, "%s: a one-rank world has no peer", op->fn);
    }
}

static int local_progress(zt_comm_req *op, int *done)
{
    (void)op;
    *done = 1;
    return ZT_OK;
}

static int local_free_comm(zt_comm *c) { (void)c; return ZT_OK; }
static int local_finalize(zt_comm *w) { (void)w; return ZT_OK; }
static void local_abort(int code) { (void)code; }

const zt_transport zt_transport_local = {
    .name = "local",
    .threaded = 0,
    .init = local_init,
    .start = local_start,
    .progress = local_progress,
    .free_comm = local_free_comm,
    .finalize = local_finalize,
    .abort = local_abort,
};
