/*
 * comm_ops.c -- the collectives of ztrain.h: validate every argument on the
 * caller's thread (a rejected call never reaches MPI, so it cannot leave the
 * other ranks waiting), then hand one request to the communication engine
 * in comm.c. Here: what each operation means and what it accepts.
 */
#include <stdio.h>
#include <string.h>
#include "comm.h"

/* ---- argument checks ---------------------------------------------------------- */
static const char *desc(const zt_tensor *t, char *buf, size_t n) { return zt_describe(t, buf, n); }

static int need_tensor(const char *fn, const char *name, const zt_tensor *t)
{
    char b[96];
    ZT_CHECK(t != NULL, "%s: %s is NULL (freed tensor?)", fn, name);
    ZT_CHECK(t->dtype >= 0 && t->dtype < ZT_NDTYPES && t->storage != NULL,
             "%s: %s is not a valid tensor (freed?)", fn, name);
    ZT_CHECK(t->storage->tier != ZT_TIER_NVME, "%s: %s (%s) is on the nvme tier, whose bytes "
             "are not addressable; copy it to the device or host tier first", fn, name,
             desc(t, b, sizeof b));
    return ZT_OK;
}

/* Tier discipline (as for ops): a collective's tensors live on one tier. */
static int same_tier(const char *fn, const zt_tensor *out, const zt_tensor *in)
{
    char b1[96], b2[96];
    ZT_CHECK(out->storage->tier == in->storage->tier,
             "%s: out (%s on %s) and in (%s on %s) are on different tiers; a collective's "
             "tensors live on one tier: copy one with zt_copy_async first", fn,
             desc(out, b1, sizeof b1), zt_tier_name(out->storage->tier),
             desc(in, b2, sizeof b2), zt_tier_name(in->storage->tier));
    return ZT_OK;
}

static int need_f32(const char *fn, const char *name, const zt_tensor *t)
{
    char b[96];
    ZT_TRY(need_tensor(fn, name, t));
    ZT_CHECK(t->dtype == ZT_F32, "%s: %s must be f32 (reductions sum in f32), got %s; "
             "cast it with zt_cast first", fn, name, desc(t, b, sizeof b));
    return ZT_OK;
}

static int need_max(const char *fn, const char *name, const zt_tensor *t)
{
    ZT_CHECK(t->numel <= ZT_COMM_MAX_ELEMS, "%s: %s has %lld elements; one collective "
             "moves at most %lld (MPI counts are int): split it into buckets", fn, name,
             (long long)t->numel, (long long)ZT_COMM_MAX_ELEMS);
    return ZT_OK;
}

static size_t nbytes_of(const zt_tensor *t) { return (size_t)t->numel * zt_dtype_size(t->dtype); }

/* Do [a, a+na) and [b, b+nb) share a byte? */
static int overlap(const void *a, size_t na, const void *b, size_t nb)
{
    const char *x = a, *y = b;
    return x < y + nb && y < x + na;
}

/* ---- collectives ------------------------------------------------------------ */
int zt_all_reduce(zt_comm *c, zt_tensor *x, zt_comm_req **req)
{
    const char *fn = "zt_all_reduce";
    if (req) *req = NULL;
    ZT_TRY(zt_comm_usable(fn, c));
    ZT_TRY(need_f32(fn, "x", x));
    ZT_TRY(need_max(fn, "x", x));
    zt_comm_req *op = NULL;
    ZT_TRY(zt_comm_new_op(&op, ZT_OP_ALL_REDUCE, fn, c));
    op->out = x->data;
    op->count = x->numel;
    op->dtype = ZT_F32;
    op->esize = 4;
    op->tier = x->storage->tier;
    zt_comm_hold(op, x, NULL);
    return zt_comm_submit(op, req);
}

int zt_reduce_scatter(zt_comm *c, zt_tensor *out, const zt_tensor *in, zt_comm_req **req)
{
    const char *fn = "zt_reduce_scatter";
    char b1[96], b2[96];
    if (req) *req = NULL;
    ZT_TRY(zt_comm_usable(fn, c));
    ZT_TRY(need_f32(fn, "in", in));
    ZT_TRY(need_f32(fn, "out", out));
    ZT_TRY(same_tier(fn, out, in));
    ZT_TRY(need_max(fn, "in", in));
    ZT_CHECK(in->numel == (int64_t)c->size * out->numel,
             "%s: in must hold size x numel(out) = %d x %lld = %lld elements, got in %s, "
             "out %s", fn, c->size, (long long)out->numel,
             (long long)c->size * out->numel, desc(in, b1, sizeof b1), desc(out, b2, sizeof b2));
    const float *own = (const float *)in->data + (size_t)c->rank * (size_t)out->numel;
    ZT_CHECK(out->data == own || !overlap(out->data, nbytes_of(out), in->data, nbytes_of(in)),
             "%s: out overlaps in; out may only be this rank's own chunk of in (elements "
             "[rank*n, (rank+1)*n)) or separate memory", fn);
    zt_comm_req *op = NULL;
    ZT_TRY(zt_comm_new_op(&op, ZT_OP_REDUCE_SCATTER, fn, c));
    op->out = out->data;
    op->in = in->data;
    op->count = out->numel;
    op->dtype = ZT_F32;
    op->esize = 4;
    op->tier = in->storage->tier;
    zt_comm_hold(op, out, in);
    return zt_comm_submit(op, req);
}

int zt_all_gather(zt_comm *c, zt_tensor *out, const zt_tensor *in, zt_comm_req **req)
{
    const char *fn = "zt_all_gather";
    char b1[96], b2[96];
    if (req) *req = NULL;
    ZT_TRY(zt_comm_usable(fn, c));
    ZT_TRY(need_tensor(fn, "in", in));
    ZT_TRY(need_tensor(fn, "out", out));
    ZT_TRY(same_tier(fn, out, in));
    ZT_CHECK(in->dtype == out->dtype, "%s: in is %s but out is %s; the dtypes must match",
             fn, desc(in, b1, sizeof b1), desc(out, b2, sizeof b2));
    ZT_TRY(need_max(fn, "out", out));
    ZT_CHECK(out->numel == (int64_t)c->size * in->numel,
             "%s: out must hold size x numel(in) = %d x %lld = %lld elements, got out %s, "
             "in %s", fn, c->size, (long long)in->numel, (long long)c->size * in->numel,
             desc(out, b1, sizeof b1), desc(in, b2, sizeof b2));
    const char *own = (const char *)out->data + (size_t)c->rank * nbytes_of(in);
    ZT_CHECK(in->data == own || !overlap(out->data, nbytes_of(out), in->data, nbytes_of(in)),
             "%s: in overlaps out; in may only be this rank's own chunk of out (elements "
             "[rank*n, (rank+1)*n)) or separate memory", fn);
    zt_comm_req *op = NULL;
    ZT_TRY(zt_comm_new_op(&op, ZT_OP_ALL_GATHER, fn, c));
    op->out = out->data;
    op->in = in->data;
    op->count = in->numel;
    op->dtype = in->dtype;
    op->esize = zt_dtype_size(in->dtype);
    op->tier = out->storage->tier;
    zt_comm_hold(op, out, in);
    return zt_comm_submit(op, req);
}

int zt_broadcast(zt_comm *c, zt_tensor *x, int root, zt_comm_req **req)
{
    const char *fn = "zt_broadcast";
    if (req) *req = NULL;
    ZT_TRY(zt_comm_usable(fn, c));
    ZT_TRY(need_tensor(fn, "x", x));
    ZT_CHECK(root >= 0 && root < c->size, "%s: root %d is not a rank of this communicator "
             "(0..%d)", fn, root, c->size - 1);
    zt_comm_req *op = NULL;
    ZT_TRY(zt_comm_new_op(&op, ZT_OP_BROADCAST, fn, c));
    op->out = x->data;
    op->count = x->numel;
    op->dtype = x->dtype;
    op->esize = zt_dtype_size(x->dtype);
    op->tier = x->storage->tier;
    op->root = root;
    zt_comm_hold(op, x, NULL);
    return zt_comm_submit(op, req);
}

static int check_peer(const char *fn, const zt_comm *c, int peer, int tag)
{
    ZT_CHECK(peer >= 0 && peer < c->size, "%s: peer %d is not a rank of this communicator "
             "(0..%d)", fn, peer, c->size - 1);
    ZT_CHECK(peer != c->rank, "%s: peer %d is this rank; a rank cannot send to itself "
             "(use zt_copy)", fn, peer);
    ZT_CHECK(tag >= 0 && tag <= 32767, "%s: tag %d out of range (0..32767)", fn, tag);
    return ZT_OK;
}

int zt_send(zt_comm *c, const zt_tensor *x, int peer, int tag, zt_comm_req **req)
{
    const char *fn = "zt_send";
    if (req) *req = NULL;
    ZT_TRY(zt_comm_usable(fn, c));
    ZT_TRY(need_tensor(fn, "x", x));
    ZT_TRY(check_peer(fn, c, peer, tag));
    zt_comm_req *op = NULL;
    ZT_TRY(zt_comm_new_op(&op, ZT_OP_SEND, fn, c));
    op->in = x->data;
    op->count = x->numel;
    op->dtype = x->dtype;
    op->esize = zt_dtype_size(x->dtype);
    op->tier = x->storage->tier;
    op->peer = peer;
    op->tag = tag;
    zt_comm_hold(op, x, NULL);
    return zt_comm_submit(op, req);
}

int zt_recv(zt_comm *c, zt_tensor *x, int peer, int tag, zt_comm_req **req)
{
    const char *fn = "zt_recv";
    if (req) *req = NULL;
    ZT_TRY(zt_comm_usable(fn, c));
    ZT_TRY(need_tensor(fn, "x", x));
    ZT_TRY(check_peer(fn, c, peer, tag));
    zt_comm_req *op = NULL;
    ZT_TRY(zt_comm_new_op(&op, ZT_OP_RECV, fn, c));
    op->out = x->data;
    op->count = x->numel;
    op->dtype = x->dtype;
    op->esize = zt_dtype_size(x->dtype);
    op->tier = x->storage->tier;
    op->peer = peer;
    op->tag = tag;
    zt_comm_hold(op, x, NULL);
    return zt_comm_submit(op, req);
}

/* An operation with no payload (a barrier, a fence). */
static int bare_op(zt_comm *c, int kind, const char *fn, zt_comm_req **req)
{
    if (req) *req = NULL;
    ZT_TRY(zt_comm_usable(fn, c));
    zt_comm_req *op = NULL;
    ZT_TRY(zt_comm_new_op(&op, kind, fn, c));
    return zt_comm_submit(op, req);
}

int zt_barrier(zt_comm *c, zt_comm_req **req) { return bare_op(c, ZT_OP_BARRIER, "zt_barrier", req); }

int zt_comm_fence(zt_comm *c, zt_comm_req **req) { return bare_op(c, ZT_OP_FENCE, "zt_comm_fence", req); }

int zt_comm_all_gather_host(zt_comm *c, void *out, const void *in, size_t nbytes)
{
    const char *fn = "zt_comm_all_gather_host";
    ZT_TRY(zt_comm_usable(fn, c));
    ZT_CHECK(out != NULL && in != NULL, "%s: out or in is NULL", fn);
    ZT_CHECK(nbytes <= (size_t)ZT_COMM_MAX_ELEMS / (size_t)c->size,
             "%s: %zu bytes per rank x %d ranks is more than this call moves (2 GiB); it "
             "is meant for small metadata: use zt_all_gather on a tensor", fn, nbytes, c->size);
    const char *own = (const char *)out + (size_t)c->rank * nbytes;
    ZT_CHECK(in == own || !overlap(out, nbytes * (size_t)c->size, in, nbytes),
             "%s: in overlaps out; in may only be this rank's own slot of out", fn);
    if (nbytes == 0) return ZT_OK;
    zt_comm_req *op = NULL;
    ZT_TRY(zt_comm_new_op(&op, ZT_OP_ALL_GATHER_HOST, fn, c));
    op->out = out;
    op->in = in;
    op->count = (int64_t)nbytes;
    return zt_comm_submit(op, NULL);
}

int zt_comm_broadcast_host(zt_comm *c, void *buf, size_t nbytes, int root)
{
    const char *fn = "zt_comm_broadcast_host";
    ZT_TRY(zt_comm_usable(fn, c));
    ZT_CHECK(buf != NULL, "%s: buf is NULL", fn);
    ZT_CHECK(root >= 0 && root < c->size, "%s: root %d is not a rank of this communicator "
             "(0..%d)", fn, root, c->size - 1);
    ZT_CHECK(nbytes <= (size_t)ZT_COMM_MAX_ELEMS, "%s: %zu bytes is more than this call "
             "moves (2 GiB); it is meant for small metadata: use zt_broadcast on a tensor",
             fn, nbytes);
    if (nbytes == 0) return ZT_OK;
    zt_comm_req *op = NULL;
    ZT_TRY(zt_comm_new_op(&op, ZT_OP_BROADCAST_HOST, fn, c));
    op->out = buf;
    op->count = (int64_t)nbytes;
    op->root = root;
    return zt_comm_submit(op, NULL);
}
