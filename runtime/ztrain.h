/*
 * ztrain.h -- the public C API of the ztrain runtime.
 *
 * This header is the single source of truth for the LuaJIT FFI: lua/ztrain/ffi.lua
 * reads it, drops preprocessor lines and comments, and passes the rest to
 * ffi.cdef. So: no macros in declarations, plain C types only, and every
 * constant an enum.
 *
 * Conventions (libuv style):
 *  - Functions return 0 (ZT_OK) or a negative error code; on error
 *    zt_last_error() holds a message naming what was wrong and what to do.
 *    The message is per thread. Nothing in the library calls exit(). Three
 *    paths end the process, each off until the host program turns it on:
 *    the collective watchdog (zt_comm_watch with timeout_s > 0: from the
 *    communication thread, after printing its diagnosis, zt_comm_abort(5)),
 *    a stop request's grace period running out (zt_interrupt_grace:
 *    _exit(128 + the signal) from the alarm handler), and the "second
 *    signal" of zt_interrupt_hard (the signal's default action).
 *  - Functions validate all arguments before acquiring anything, so a failed
 *    call leaves no resource held and no state half-changed.
 *  - Tensors are refcounted: zt_tensor_new/zt_tensor_view return a tensor with
 *    one reference; zt_tensor_release drops it. A view keeps its base's
 *    storage alive.
 */
#ifndef ZTRAIN_H
#define ZTRAIN_H

#include <stddef.h>
#include <stdint.h>

/* ---- errors ------------------------------------------------------------ */
enum {
    ZT_OK = 0,
    ZT_EINVAL = -1,   /* bad argument: shape, dtype, range */
    ZT_ENOMEM = -2,   /* the system allocator failed */
    ZT_ELIMIT = -3,   /* a tier's memory limit would be exceeded */
    ZT_EIO = -4,      /* file or device I/O failed */
    ZT_ESTATE = -5    /* call not valid in the current state */
};
/* Message of the last failing call on this thread ("" if none). */
const char *zt_last_error(void);
/* Short name of an error code ("EINVAL", ...). */
const char *zt_strerror(int code);

/* ---- memory tiers and categories --------------------------------------- */
typedef enum { ZT_F32 = 0, ZT_BF16 = 1, ZT_F16 = 2, ZT_I32 = 3, ZT_U16 = 4, ZT_NDTYPES = 5 } zt_dtype;
typedef enum { ZT_TIER_DEVICE = 0, ZT_TIER_HOST = 1, ZT_TIER_NVME = 2, ZT_NTIERS = 3 } zt_tier;
typedef enum {
    ZT_CAT_PARAMS = 0, ZT_CAT_GRADS = 1, ZT_CAT_OPTIM = 2,
    ZT_CAT_ACTIVATIONS = 3, ZT_CAT_COMM = 4, ZT_CAT_OTHER = 5, ZT_NCATS = 6
} zt_category;

const char *zt_dtype_name(int dtype);
size_t zt_dtype_size(int dtype);
const char *zt_tier_name(int tier);
const char *zt_category_name(int category);

/* Current and peak bytes allocated on a tier in a category (category -1: all). */
size_t zt_mem_current(int tier, int category);
size_t zt_mem_peak(int tier, int category);
/* Peak of the tier total (not the sum of per-category peaks). */
size_t zt_mem_peak_total(int tier);
/* Set peaks to the current values (start of a measured region). */
void zt_mem_reset_peak(void);
/* Limit a tier's total bytes; 0 = no limit. Allocations beyond it fail with
 * ZT_ELIMIT and a message naming the request, the use by category and the
 * limit. Fails with ZT_EINVAL if the tier already holds more than the limit. */
int zt_mem_set_limit(int tier, size_t bytes);
size_t zt_mem_limit(int tier);

/* ---- tensors ----------------------------------------------------------- */
/* Opaque: what a tensor is, the runtime keeps (internal.h); callers ask
 * the accessors below, so no binding can write a refcount or a shape. */
typedef struct zt_storage zt_storage;
typedef struct zt_tensor zt_tensor;

/* A tensor's first element (storage data + offset; an nvme tensor's is an
 * opaque handle), element count, dimensions, dim i (0 <= i < ndim, else
 * 0), dtype (ZT_F32 ...), its storage's tier and category, and its offset
 * in elements into the storage (views share one). NULL or 0 for NULL. */
void *zt_tensor_data(const zt_tensor *t);
int64_t zt_tensor_numel(const zt_tensor *t);
int zt_tensor_ndim(const zt_tensor *t);
int64_t zt_tensor_dim(const zt_tensor *t, int i);
int zt_tensor_dtype(const zt_tensor *t);
int zt_tensor_tier(const zt_tensor *t);
int zt_tensor_category(const zt_tensor *t);
int64_t zt_tensor_offset(const zt_tensor *t);

/* New contiguous tensor on a tier, tagged with a category, zero-filled (by
 * the tier's owner: the device zeroes device memory; a new swap file reads
 * as zeros). ndim in 1..4, every dim >= 1. Host storage is ZT_AIO_PAGE
 * (4096) aligned. The nvme tier needs zt_nvme_configure first (see "nvme
 * tier / aio"); its tensors have data NULL. */
int zt_tensor_new(zt_tensor **out, int tier, int category, int dtype,
                  int ndim, const int64_t *shape);
/* A view of numel(shape) elements of base's storage starting at element
 * offset (relative to base), same dtype. Must lie inside base. */
int zt_tensor_view(zt_tensor **out, zt_tensor *base, int64_t offset,
                   int ndim, const int64_t *shape);
void zt_tensor_retain(zt_tensor *t);
/* Drop one reference; frees the tensor (and its storage with the last
 * reference to it). NULL is ignored. */
void zt_tensor_release(zt_tensor *t);
/* The explicit synchronous copies between host memory and a tensor on any
 * tier (the device's copy; on nvme a blocking aio request): the only way
 * host code reads or writes device-tier bytes. nbytes must equal numel *
 * dtype size. The calling thread's current stream finishes its earlier work
 * first. */
int zt_tensor_write(zt_tensor *t, const void *src, size_t nbytes);
int zt_tensor_read(const zt_tensor *t, void *dst, size_t nbytes);
/* zt_tensor_write ordered like an op instead: on a GPU the bytes are taken
 * now (src may be reused on return) and reach a device-tier tensor in the
 * current stream's order, with no host wait (a micro-batch's tokens: the
 * host does not wait for the previous micro-batch's kernels). Other tiers,
 * and devices without an asynchronous path: zt_tensor_write. */
int zt_tensor_upload(zt_tensor *t, const void *src, size_t nbytes);

/* ---- device ------------------------------------------------------------ */
/* Select the compute backend: "cpu" (always) or "cuda" (when built with it).
 * Ops are issued to it; on the CPU they complete before returning. */
int zt_device_init(const char *backend);
const char *zt_device_name(void);
/* Wait for every op the calling thread issued so far on its current
 * stream (the default compute stream unless zt_stream_set_current chose
 * another; other streams: zt_stream_sync), and return a kept error of the
 * device's asynchronous ops, if any. */
int zt_device_sync(void);
/* The attention kernels of the active device (recipe key device.attention):
 * "exact" (the plain fp32 kernels; every device) or "bf16" (CUDA only: the
 * tensor-core kernels of kernels/cuda/attention_tc.cu where the head size is
 * 64, bf16 operands with fp32 accumulation; other head sizes stay exact).
 * ZT_EINVAL for an unknown mode, or "bf16" on a device without it. Call it
 * after zt_device_init, while no attention op runs; zt_device_init leaves
 * the mode as it was (a process-wide setting of the CUDA device). */
int zt_device_attention(const char *mode);
/* How many times the active device took a kernel path since the process
 * started, for tests that must see a path run: "attention_tc" (the
 * tensor-core attention's forward and backward calls; 0 on a device
 * without it), "host_waits" (the times the host waited for queued device
 * work: syncs, value-returning ops, copies with host memory, frees;
 * fakegpu-async counts a wait only where work was issued since the last,
 * CUDA every wait it makes; 0 elsewhere). ZT_EINVAL for a name not
 * counted. */
int64_t zt_device_count(const char *what);
/* Threads used by the kernels (the OpenMP pool); n >= 1. OpenBLAS runs one
 * thread per call for the whole process (set once when the library loads):
 * the GEMMs spread fixed blocks over OpenMP, which keeps their bits the same
 * on any thread count. Code that changes openblas_set_num_threads for its
 * own sgemm must set it back to 1; a GEMM op fails with ZT_ESTATE until then. */
int zt_set_threads(int n);
int zt_get_threads(void);
/* The OpenBLAS core in use and its build config (for benchmark reports). */
const char *zt_blas_info(void);
/* The bf16 GEMMs' path, fixed for the process: "AMX (tdpbf16ps)",
 * "AVX512_BF16 (vdpbf16ps)" or "portable C (...)", with the reason AMX is not
 * used where it is not (ZTRAIN_BF16_GEMM=amx|avx512_bf16|portable picks one).
 * AMX's bits differ from the other two paths' (kernels.h). */
const char *zt_matmul_bf16_info(void);

/* ---- ops ---------------------------------------------------------------- */
/* Shapes: N = rows (B*T), C = channels, OC = out channels, V = vocab.
 * Activations may be given as (B,T,C) or (N,C): ops check numel. Gradient
 * outputs are WRITTEN unless marked ACCUMULATED. All f32 unless stated.
 *
 * Tiers: an op's tensors all live on one tier, device or host (nvme bytes
 * are not addressable); otherwise it fails with ZT_EINVAL naming both
 * tensors and tiers. Move bytes between tiers with zt_copy_async.
 * Streams: an op runs on the calling thread's current stream (see "streams
 * and events" below). */
int zt_fill(zt_tensor *x, float value);
int zt_copy(zt_tensor *dst, const zt_tensor *src);          /* same dtype, numel, tier */
int zt_scale(zt_tensor *x, float a);
int zt_axpy(zt_tensor *y, float a, const zt_tensor *x);      /* y += a*x */
int zt_add(zt_tensor *y, const zt_tensor *x);                /* y += x */
int zt_add3(zt_tensor *out, const zt_tensor *a, const zt_tensor *b); /* out = a+b */
/* dst and src of equal numel, f32 <-> bf16/f16 (or equal dtypes: a copy). */
int zt_cast(zt_tensor *dst, const zt_tensor *src);

/* tokens (B,T) i32; out (B,T,C); wte (V,C); wpe (maxT,C), T <= maxT.
 * Token ids are not read on the host: a kernel skips ids outside [0,V)
 * (memory-safe) and the op then fails with ZT_EINVAL saying how many (its
 * outputs are then wrong for them). Check tokens where they are made: the
 * data loader's vocab_size option. The same holds for zt_crossentropy's
 * targets. */
int zt_encoder_forward(zt_tensor *out, const zt_tensor *tokens,
                       const zt_tensor *wte, const zt_tensor *wpe);
/* dwte ACCUMULATED, dwpe rows [0,T) WRITTEN. */
int zt_encoder_backward(zt_tensor *dwte, zt_tensor *dwpe, const zt_tensor *dout,
                        const zt_tensor *tokens);
/* out (N,C) f32, or bf16 (each element the f32 out's, rounded once: what a
 * bf16 GEMM reads, written so instead of cast after); mean, rstd (N). */
int zt_layernorm_forward(zt_tensor *out, zt_tensor *mean, zt_tensor *rstd,
                         const zt_tensor *inp, const zt_tensor *weight,
                         const zt_tensor *bias);
/* The residual add fused with the layer norm that reads it: resid (N,C) f32
 * WRITTEN = a + b, then out = layernorm(resid) (f32 or bf16), mean, rstd:
 * the bits of zt_add3 followed by zt_layernorm_forward, one pass. resid
 * may not alias a or b. */
int zt_layernorm_residual_forward(zt_tensor *resid, zt_tensor *out, zt_tensor *mean,
                                  zt_tensor *rstd, const zt_tensor *a, const zt_tensor *b,
                                  const zt_tensor *weight, const zt_tensor *bias);
/* dinp ACCUMULATED; dweight, dbias WRITTEN. Split backward: dinp NULL
 * computes the weight gradients only; dweight and dbias both NULL the input
 * gradient only. Each output has the same bits as in the fused call. */
int zt_layernorm_backward(zt_tensor *dinp, zt_tensor *dweight, zt_tensor *dbias,
                          const zt_tensor *dout, const zt_tensor *inp,
                          const zt_tensor *weight, const zt_tensor *mean,
                          const zt_tensor *rstd);
/* The same, and dinp16 (bf16, (N,C), with dinp) WRITTEN = the accumulated
 * dinp rounded once (zt_cast's bits): the residual gradient as the next
 * bf16 GEMM reads it, without a cast pass. */
int zt_layernorm_backward_b16(zt_tensor *dinp, zt_tensor *dinp16, zt_tensor *dweight,
                              zt_tensor *dbias, const zt_tensor *dout, const zt_tensor *inp,
                              const zt_tensor *weight, const zt_tensor *mean,
                              const zt_tensor *rstd);
/* Padded rows: a matmul's out (forward) or dout (backward) and the
 * cross-entropy's logits may be (..., zt_padded_cols(OC)) instead of
 * (N,OC): each row then holds OC values and zt_padded_cols(OC) - OC
 * columns the GEMMs neither read nor write (the cross-entropy writes them
 * 0 in dlogits). GPT-2's LM head keeps its logits so (50257 in rows of
 * 50304): a GPU's GEMMs need rows on 16 bytes for their fast kernels. The
 * bits do not depend on the padding. */
int64_t zt_padded_cols(int64_t n);   /* n rounded up to a multiple of 128 */
/* out (N,OC) = inp (N,C) @ weight(OC,C)^T + bias(OC); bias may be NULL. */
int zt_matmul_forward(zt_tensor *out, const zt_tensor *inp,
                      const zt_tensor *weight, const zt_tensor *bias);
/* dinp, dbias may be NULL. Split backward: dweight NULL (then dbias NULL
 * too) computes dinp only. Each output has the same bits as in the fused call. */
int zt_matmul_backward(zt_tensor *dinp, zt_tensor *dweight, zt_tensor *dbias,
                       const zt_tensor *dout, const zt_tensor *inp,
                       const zt_tensor *weight);
/* The same on bf16 operands with fp32 accumulation (mixed precision):
 * inp (N,C), weight (OC,C), dout (N,OC) bf16; dinp, dweight, bias, dbias
 * f32; out f32, or bf16 (each element the f32 out's, rounded once). Every output element is one fixed sequential chain over k with
 * VDPBF16PS's arithmetic (kernels/cpu/matmul_bf16.c states it exactly), so
 * the bits are the same on any thread count and any CPU (AVX512_BF16 where
 * present, a much slower portable path elsewhere: zt_matmul_bf16_info).
 * All outputs WRITTEN; NULLs and split backward as zt_matmul_backward. */
int zt_matmul_bf16_forward(zt_tensor *out, const zt_tensor *inp,
                           const zt_tensor *weight, const zt_tensor *bias);
int zt_matmul_bf16_backward(zt_tensor *dinp, zt_tensor *dweight, zt_tensor *dbias,
                            const zt_tensor *dout, const zt_tensor *inp,
                            const zt_tensor *weight);
/* qkv (B,T,3C) -> out (B,T,C), lse (B,NH,T). qkv and out f32, or both
 * bf16 (bf16 activations): then the bits of the f32 kernel on the widened
 * qkv, out rounded once; backward likewise with qkv, out and dqkv bf16
 * together, dout and lse f32 either way. Generation (decode) is f32. */
int zt_attention_forward(zt_tensor *out, zt_tensor *lse, const zt_tensor *qkv,
                         int NH);
int zt_attention_backward(zt_tensor *dqkv, const zt_tensor *dout,
                          const zt_tensor *qkv, const zt_tensor *out,
                          const zt_tensor *lse, int NH);
/* Generation with a KV cache: kcache, vcache (B,NH,maxT,C/NH) hold the keys
 * and values of positions [0,pos) of each sequence; qkv (B,T,3C) those of
 * the T new positions [pos, pos+T), pos + T <= maxT. Writes the new keys and
 * values into the caches, then out (B,T,C) = causal attention of each new
 * query over positions [0, its own]. Each out row has the bits of the same
 * row of zt_attention_forward over the whole sequence. A prefill is pos = 0
 * with the prompt; a decode step T = 1, costing O(pos). */
int zt_attention_decode(zt_tensor *out, zt_tensor *kcache, zt_tensor *vcache,
                        const zt_tensor *qkv, int NH, int pos);
/* out (gelu_backward's dinp) f32 or bf16 (rounded once, as layernorm's);
 * inp f32, or bf16 (the c_fc GEMM's bf16 out, widened exactly: then out
 * is bf16 too); dout f32. */
int zt_gelu_forward(zt_tensor *out, const zt_tensor *inp);
int zt_gelu_backward(zt_tensor *dinp, const zt_tensor *inp, const zt_tensor *dout);
/* Bad ids (zt_encoder_*, zt_crossentropy): the CPU fails the op at once; a
 * GPU (and fakegpu-async) counts them on the device and fails the next
 * zt_device_sync (or a later op) naming the op, so that no call waits:
 * sync before trusting outputs (the trainer does, once a step and after an
 * evaluation). */
/* logits (N,V) f32 or bf16, targets (N) i32, losses (N) f32; dlogits (the
 * logits' dtype) may be NULL or logits. V = 0: the logits' last dim; V > 0:
 * logits may also be (N, zt_padded_cols(V)) (padded rows, above). */
int zt_crossentropy(zt_tensor *losses, zt_tensor *dlogits,
                    const zt_tensor *logits, const zt_tensor *targets,
                    float dscale, int64_t V);
/* AdamW over equal-numel param, grad, m, v (see kernels.h for the formula).
 * zt_adamw_segments: the same over nseg (1..ZT_ADAMW_SEGS) segments of the
 * tensors, [offset[s], offset[s] + length[s]), in increasing order, not
 * overlapping, each with its weight decay; elements outside every segment
 * are left alone. One launch on a GPU (a unit's tensors at once), each
 * element the bits of zt_adamw on its segment. lp (NULL, or bf16 / f16 of
 * param's numel): the stored low-precision parameters, each updated
 * element also written there rounded (zt_cast's bits), in the same pass:
 * mixed precision's master -> stored parameters without a cast of its own
 * (elements outside the segments are not written). */
#define ZT_ADAMW_SEGS 16
int zt_adamw_segments(zt_tensor *param, const zt_tensor *grad, zt_tensor *m, zt_tensor *v,
                      zt_tensor *lp, int nseg, const int64_t *offset, const int64_t *length,
                      const float *weight_decay, float lr, float beta1, float beta2,
                      float eps, float grad_scale, int step);
int zt_adamw(zt_tensor *param, const zt_tensor *grad, zt_tensor *m,
             zt_tensor *v, float lr, float beta1, float beta2, float eps,
             float weight_decay, float grad_scale, int step);
/* Elements per block of the fixed-partition fp64 sums. */
int64_t zt_sum_block(void);
/* partials[i] = sum of squares of block i of x (f32); writes
 * ceil(numel / zt_sum_block()) doubles. */
int zt_sumsq_blocks(double *partials, const zt_tensor *x);
/* zt_sumsq_blocks of n tensors (f32, one tier) in one call: partials holds
 * each one's ceil(numel / zt_sum_block()) block sums in turn, the bits of
 * n calls. On a GPU one copy to the host and one wait for all of them
 * (the gradient norm: a wait a step, not one a unit). */
int zt_sumsq_blocks_many(double *partials, const zt_tensor *const *xs, int n);
/* sum of x (f32) in fp64 over fixed blocks, in block order. */
int zt_sum(double *out, const zt_tensor *x);
/* zt_sum's value (the same fixed-block fp64 sum, the same bits) of n floats
 * of host memory, on the calling thread: no device, no wait, no error. */
double zt_host_sum(const float *x, size_t n);

/* x (f32) = mean + std * N(0,1), deterministic in (seed, stream, element index):
 * the same values on any thread count. Used for model initialisation. */
int zt_randn(zt_tensor *x, uint64_t seed, uint64_t stream, float mean, float std);

/* ---- communication ----------------------------------------------------------
 * A communicator is a group of ranks (the world, or a sub-group of it).
 * Under an MPI launcher (mpirun / srun: detected from the environment) the
 * world spans the job's processes over MPI; otherwise it is one rank and no
 * MPI is touched. Every MPI call runs on one communication thread owned by
 * the runtime, so collectives proceed while kernels run: an async call
 * enqueues the operation and returns a request to wait on or test (polling;
 * there are no callbacks).
 *
 * Reductions are deterministic: contributions are summed in rank order
 * (rank 0 + rank 1 + ...) whatever the world size or timing, in f32 as
 * ((x0 + x1) + x2) + ... Tensors in collectives must stay alive and
 * untouched until the request completes. f32 for reductions; any dtype
 * for gather / broadcast / send / recv (moved as bytes).
 * Passing req = NULL makes a call blocking. */
typedef struct zt_comm zt_comm;
typedef struct zt_comm_req zt_comm_req;

/* 1 if the world will be MPI (a launcher is in the environment, or
 * ZTRAIN_COMM=mpi), 0 if local (none, or ZTRAIN_COMM=local), -1 if
 * ZTRAIN_COMM holds anything else. Reads the environment only. */
int zt_comm_launched(void);
/* The world communicator (created on first call; the same one afterwards). */
int zt_comm_world(zt_comm **out);
int zt_comm_rank(const zt_comm *c);
int zt_comm_size(const zt_comm *c);
/* Collective over parent: ranks with equal color form a group, ordered by
 * key then parent rank (MPI_Comm_split). */
int zt_comm_split(zt_comm **out, zt_comm *parent, int color, int key);
void zt_comm_free(zt_comm *c);
/* Name of the transport: "mpi", "nccl" or "local" (one rank, no MPI). */
const char *zt_comm_backend(const zt_comm *c);
/* Collective over c (an MPI communicator, the CUDA device active): from now
 * on c's device-tier collectives and transfers run on NCCL (one GPU per
 * rank), host-tier ones stay on MPI; groups split from c later run NCCL
 * too. deterministic != 0: all_reduce / reduce_scatter keep the rank-order
 * sum (an all-to-all, then the ordered sum on the GPU: the MPI transport's
 * bits); 0: NCCL's own all-reduce / reduce-scatter. NCCL runs a
 * communicator's device operations in issue order on one stream, and a
 * send waits for its receive (no tags, no buffering): ranks must issue
 * transfers and collectives on c in orders that match, or they deadlock.
 * A one-rank (local) c is left as it is. Without CUDA: ZT_EINVAL. */
int zt_comm_use_nccl(zt_comm *c, int deterministic);
/* Shut the communication thread and MPI down (after all requests). */
int zt_comm_finalize(void);
/* The collective watchdog and checker (docs/cli.md "When a rank stalls").
 * timeout_s > 0: an operation in flight longer than that makes its rank ask
 * every member of the group where it is, print which ranks arrived and each
 * other's last completed operation, and end the job with exit status 5;
 * 0 = off. check != 0: before each collective the ranks exchange a signature
 * (operation, dtype, count, root, sequence number, call site) and every rank
 * fails that collective, naming both call sites, where they differ. */
int zt_comm_watch(double timeout_s, int check);
/* The calling thread's call site (e.g. "trainer.lua:120"), carried by the
 * collectives it issues next while checking is on. */
void zt_comm_set_site(const char *site);
/* The program's last resort when one rank fails: terminate every rank of
 * the job with this exit code (MPI_Abort where MPI is up, then _exit). The
 * library calls it itself only from the collective watchdog (zt_comm_watch
 * with timeout_s > 0), with ZT_EXIT_COMM (5): the stuck rank cannot return
 * from the collective it waits in. */
void zt_comm_abort(int code);

/* x (f32, same numel on every rank) = sum over ranks, in rank order. */
int zt_all_reduce(zt_comm *c, zt_tensor *x, zt_comm_req **req);
/* in (f32, numel = size * numel(out)) on every rank; out = this rank's
 * chunk [rank*n, (rank+1)*n) of the rank-ordered sum. */
int zt_reduce_scatter(zt_comm *c, zt_tensor *out, const zt_tensor *in, zt_comm_req **req);
/* out (numel = size * numel(in)) = concatenation of every rank's in, by rank. */
int zt_all_gather(zt_comm *c, zt_tensor *out, const zt_tensor *in, zt_comm_req **req);
int zt_broadcast(zt_comm *c, zt_tensor *x, int root, zt_comm_req **req);
int zt_send(zt_comm *c, const zt_tensor *x, int peer, int tag, zt_comm_req **req);
int zt_recv(zt_comm *c, zt_tensor *x, int peer, int tag, zt_comm_req **req);
int zt_barrier(zt_comm *c, zt_comm_req **req);
/* Wait for a request and free it. Returns the operation's result. */
int zt_comm_wait(zt_comm_req *req);
/* *done = 1 if finished (the request must still be passed to zt_comm_wait). */
int zt_comm_test(zt_comm_req *req, int *done);

/* Blocking collectives on host memory, for small metadata (losses, norm
 * partials, memory stats, recipe hashes). out holds size * nbytes. */
int zt_comm_all_gather_host(zt_comm *c, void *out, const void *in, size_t nbytes);
int zt_comm_broadcast_host(zt_comm *c, void *buf, size_t nbytes, int root);

/* Communication counters (runtime/comm_stats.c; docs/architecture.md
 * "Communication"): this rank's operations over every communicator, by
 * kind. Bytes are what the operation moves between this rank and its peers
 * as the transport runs it, each message counted once at its sender and
 * once at its receiver, a rank's own share not counted (nothing moves over
 * one rank): all_reduce of n elements of e bytes over p ranks, rank r's
 * chunk L_r = n/p rounded as the partition does: sent = recv =
 * e (n + (p-2) L_r) (an all-to-all of chunks, then an all-gather of the
 * sums; 2 e n (p-1)/p when p divides n); reduce_scatter and all_gather of
 * m elements per rank: e m (p-1) each way; broadcast of n: the root sends
 * e n (p-1), every other rank receives e n; send / recv: e n. Counted when
 * the operation is issued (so a step's traffic is the operations it
 * issued). The comm.check signature exchanges are not counted.
 * busy_s: wall time during which at least one operation of this rank was
 * in flight (issued, not finished: queued behind its communicator's earlier
 * collectives and waiting for a peer included); exposed_s: time callers spent blocked in zt_comm_wait and in a
 * compute stream's zt_stream_wait_comm for an operation not yet finished
 * (summed over threads). Cheap: a few atomic adds per operation. */
enum {
    ZT_COMM_KIND_ALL_REDUCE, ZT_COMM_KIND_REDUCE_SCATTER, ZT_COMM_KIND_ALL_GATHER,
    ZT_COMM_KIND_BROADCAST, ZT_COMM_KIND_SEND, ZT_COMM_KIND_RECV, ZT_COMM_KIND_BARRIER,
    ZT_COMM_KIND_HOST,          /* zt_comm_all_gather_host / broadcast_host (metadata) */
    ZT_COMM_KIND_OTHER,         /* split, NCCL attach: no payload */
    ZT_COMM_KINDS
};
typedef struct { uint64_t sent, recv, calls; } zt_comm_kind_stats;
typedef struct {
    zt_comm_kind_stats kind[ZT_COMM_KINDS];
    uint64_t sent, recv, calls;     /* over every kind */
    double busy_s, exposed_s;
} zt_comm_stats;
/* This rank's counters since the start (or the last reset). c: any
 * communicator of this process, or NULL (the counters are the rank's, over
 * all its communicators). */
int zt_comm_stats_get(const zt_comm *c, zt_comm_stats *out);
/* Zero the counters (operations in flight count their time from now). */
void zt_comm_stats_reset(void);
/* "all_reduce", "reduce_scatter", ..., "host", "other"; NULL out of range. */
const char *zt_comm_kind_name(int kind);

/* ---- streams and events -----------------------------------------------------
 * Work is issued to a stream; one stream's work runs in issue order, two
 * streams' work may overlap. A stream can wait on an event (recorded on
 * another stream) or on a communication request; the host waits only where
 * it asks (zt_stream_sync, zt_event_sync). Write strategies as if every copy
 * and collective were asynchronous: on a GPU they are.
 *
 * Kinds: COMPUTE (kernels), COPY (transfers between tiers), COMM (work that
 * follows collectives). Each thread has a current stream, the default
 * compute stream unless zt_stream_set_current chose another; ops, and
 * stream arguments given as NULL, use it.
 *
 * The CPU backend:
 *  - A compute stream is the calling thread: its work is done when the call
 *    returns, an event recorded on it completes at once, and a compute
 *    stream told to wait (event, comm request) blocks the caller until the
 *    wait is met.
 *  - A copy or comm stream is real: a worker thread of its own runs its
 *    queue in order (copies through the device copy, waits, event records);
 *    an event completes when the worker reaches it. Reading a tensor before
 *    the event after its copy has completed is a race, as on a GPU.
 *  - An op (zt_add, ...) or zt_tensor_read/write issued while a copy or comm
 *    stream is current first waits for that stream's queued work, then runs
 *    on the caller: the stream's order holds; only the queued work overlaps.
 *
 * Errors in queued work (a GPU's asynchronous faults; on the CPU only a
 * failure passed on through a waited-on event, or a test's injected one)
 * are kept by the stream, which skips its later work until the error is
 * reported: the next zt_stream_sync (or op drain, above) returns it with its
 * message and clears it. An event recorded after the failure carries it too: zt_event_sync and
 * zt_event_query return it.
 *
 * Lifetimes: tensors given to zt_copy_async are retained until the copy is
 * done (releasing them meanwhile is safe; the bytes stay accounted until
 * then); an event is kept alive by the streams that will record or wait on
 * it. Nothing else is allocated: memory accounting is unchanged. */
typedef struct zt_stream zt_stream;
typedef struct zt_event zt_event;
typedef enum { ZT_STREAM_COMPUTE = 0, ZT_STREAM_COPY = 1, ZT_STREAM_COMM = 2 } zt_stream_kind;

int zt_stream_new(zt_stream **out, int kind);
/* Wait for the stream's queued work, then free it. An error it still keeps
 * is dropped (sync first to see it). NULL and the default stream are
 * ignored. If it is the calling thread's current stream, the thread goes
 * back to the default; other threads must have stopped using it. */
void zt_stream_free(zt_stream *s);
/* The default compute stream (it is never freed). */
zt_stream *zt_stream_default(void);
/* Make s the calling thread's current stream (NULL: the default). */
int zt_stream_set_current(zt_stream *s);
zt_stream *zt_stream_current(void);
/* Block until all work issued to s (NULL: current) so far is done; returns
 * the error its work kept, if any. */
int zt_stream_sync(zt_stream *s);
/* Later work on s waits until e's latest record at the time of this call
 * has completed (an event never recorded is complete). */
int zt_stream_wait_event(zt_stream *s, zt_event *e);
/* Later work on s waits until the request r has completed. This does NOT
 * consume r: it must still be waited exactly once with zt_comm_wait (which
 * frees it), and not before s has passed this wait -- zt_stream_sync(s), or
 * an event recorded on s after this call has completed -- because s reads r
 * until then. The operation's own result is returned by zt_comm_wait. */
int zt_stream_wait_comm(zt_stream *s, zt_comm_req *r);

int zt_event_new(zt_event **out);
/* Drop the caller's reference (streams that will still record or wait on
 * it keep it alive). NULL is ignored. */
void zt_event_free(zt_event *e);
/* e completes when s (NULL: current) reaches this point: at once on a
 * compute stream. Recording again moves the event to the new point. */
int zt_event_record(zt_event *e, zt_stream *s);
/* Block until e's latest record has completed; the error it carries, if any. */
int zt_event_sync(zt_event *e);
/* *done = 1 if e's latest record has completed (never blocks); errors as
 * zt_event_sync once done. */
int zt_event_query(zt_event *e, int *done);

/* dst = src on stream s (NULL: current): same dtype and numel; device <->
 * host, within one of them, or nvme <-> host (a GPU cannot read a file:
 * nvme <-> device goes through a host tensor); dst and src must not overlap.
 * Asynchronous: the host must touch neither tensor (read, write, or use in
 * an op on another stream) until an event recorded on s after this call has
 * completed, or s was synced.
 * An nvme copy on a copy stream: the stream's worker issues the blocks
 * through the nvme engine (up to its queue depth in flight) and goes on
 * when all are done, so events recorded after it complete after the bytes
 * are on disk (or in memory); an I/O error becomes the stream's error. On a
 * compute stream it runs on the caller and returns the I/O error itself.
 * Two nvme copies in flight at once (on two streams) must not share a 4 KiB
 * page of one swap file if either writes it (see the aio section). */
int zt_copy_async(zt_tensor *dst, const zt_tensor *src, zt_stream *s);

/* ---- nvme tier / aio ----------------------------------------------------------
 * An aio engine does asynchronous reads and writes of host buffers at
 * offsets of swap files it owns, on libuv's thread pool. A request is cut
 * into blocks of block_bytes (at multiples of block_bytes in the file) and
 * the engine keeps up to queue_depth blocks in flight, over all its
 * requests, in submission order. Completion is polled (zt_aio_test) or
 * waited for (zt_aio_wait); libuv's callbacks run on the engine's own loop
 * thread, in C: nothing ever calls back into Lua.
 *
 * Files are opened with O_DIRECT where the file system accepts it (probed
 * with a real write at open); elsewhere (ramfs, tmpfs before Linux 6.6, some
 * FUSE mounts) the engine uses buffered I/O and zt_aio_mode() says so, once,
 * for the caller to print. A block whose buffer, offset and length are
 * multiples of ZT_AIO_PAGE goes straight from the caller's buffer; any other
 * goes through a bounce buffer (one per queue slot), reading the partial
 * first and last pages before writing them, so bytes around the range are
 * kept. Host tensors are ZT_AIO_PAGE-aligned, so whole tensors take the
 * direct path; views at other offsets are bounced (correct, slower).
 *
 * Flags: ZT_AIO_CHECKSUM keeps a 32-bit hash per 4 KiB page of every file
 * (4 bytes of host memory per 4 KiB on disk), set by writes and verified by
 * every read: a mismatch is an error naming the file and offset.
 * ZT_AIO_BUFFERED never uses O_DIRECT. ZT_AIO_SPARSE does not reserve a
 * file's space when it is made (a full disk then fails a write instead of
 * zt_aio_file_new).
 *
 * Ownership: the engine makes DIR/ztrain-aio.HOST.PID.N with a locked
 * `owner` file and its swap files (swap.N) in it, and removes them at
 * zt_aio_close and at process exit. zt_aio_open removes the swap files left
 * by a dead run of ztrain on this host (its owner lock is free: the kernel
 * drops it when a process dies, even by SIGKILL); it leaves alone live
 * runs' directories, other hosts', and anything without ztrain's owner
 * file, and says what it did in zt_aio_notes().
 *
 * Errors of a request (ZT_EIO: short reads past the end of a file, ENOSPC,
 * EIO, checksum mismatches) are copied into the request and returned by
 * zt_aio_wait with a message naming the file, the operation, the offset and
 * sizes, and what to do. The engine stays usable after a failed request.
 *
 * Concurrency: any thread may submit, test and wait. Requests in flight at
 * the same time must not touch the same ZT_AIO_PAGE-byte page of a file if
 * either writes (a partial page is read-modify-written). The caller's buffer
 * must stay alive and untouched until the request completes. */
typedef struct zt_aio zt_aio;
typedef struct zt_aio_req zt_aio_req;
enum {
    ZT_AIO_CHECKSUM = 1,            /* flag: verify every read against page hashes */
    ZT_AIO_BUFFERED = 2,            /* flag: never O_DIRECT */
    ZT_AIO_SPARSE = 4,              /* flag: do not reserve file space at creation */
    ZT_AIO_PAGE = 4096,             /* O_DIRECT alignment: buffers, offsets, lengths */
    ZT_AIO_DEFAULT_BLOCK = 1048576, /* block_bytes 0 means this (DeepSpeed's default) */
    ZT_AIO_DEFAULT_DEPTH = 8        /* queue_depth 0 means this */
};
typedef struct zt_aio_stats {
    uint64_t bytes_read, bytes_written;   /* of completed, successful requests */
    uint64_t requests, blocks;            /* completed requests; blocks issued */
    uint64_t bounced;                     /* blocks that went through a bounce buffer */
    uint64_t errors;                      /* failed requests */
    uint64_t host_bytes;                  /* host memory held: bounce buffers + page hashes */
    uint64_t peak_inflight;               /* most blocks in flight at once (<= queue_depth) */
} zt_aio_stats;

/* Open an engine over swap directory dir (made if missing when its parent
 * exists; an error if it is not a directory or not writable). block_bytes:
 * a multiple of ZT_AIO_PAGE up to 256 MiB (0: 1 MiB); queue_depth 1..256
 * (0: 8). Holds queue_depth * block_bytes of host memory (accounted: host,
 * other). libuv's thread pool is process-wide and sized once, at the first
 * open, to max(8, queue_depth) unless UV_THREADPOOL_SIZE is set. */
int zt_aio_open(zt_aio **out, const char *dir, size_t block_bytes, int queue_depth, int flags);
/* Finish every request in flight, then remove the engine's files and
 * directory. Requests not yet waited are freed (their handles die). NULL
 * is ignored. */
void zt_aio_close(zt_aio *a);
/* Remove every open engine's swap files and directories now, without
 * closing anything: for a process about to die without exit handlers
 * (before zt_comm_abort). The engines are unusable afterwards. */
void zt_aio_remove_files(void);
/* "O_DIRECT", or "buffered: DIR refuses O_DIRECT (...)", or "buffered (...)". */
const char *zt_aio_mode(const zt_aio *a);
/* The engine's own directory (DIR/ztrain-aio.HOST.PID.N). */
const char *zt_aio_dir(const zt_aio *a);
/* What opening cleaned up or left alone in DIR, one line each ("" if nothing). */
const char *zt_aio_notes(const zt_aio *a);
size_t zt_aio_block_bytes(const zt_aio *a);
int zt_aio_queue_depth(const zt_aio *a);
int zt_aio_flags(const zt_aio *a);
/* 1 if files use O_DIRECT. */
int zt_aio_direct(const zt_aio *a);
int zt_aio_get_stats(zt_aio *a, zt_aio_stats *out);

/* A new swap file of nbytes (>= 1), zero-filled, its space reserved
 * (rounded up to ZT_AIO_PAGE) unless ZT_AIO_SPARSE: a full disk is an error
 * here (ZT_EIO, naming the path). *id names it in requests. */
int zt_aio_file_new(zt_aio *a, size_t nbytes, int *id);
/* Remove a file. ZT_ESTATE while requests on it are in flight. */
int zt_aio_file_free(zt_aio *a, int id);
/* The file's path (valid until it is freed), NULL if unknown. */
const char *zt_aio_file_path(zt_aio *a, int id);

/* Write nbytes from buf to file at offset / read them into buf. Any offset,
 * length and buffer alignment; [offset, offset+nbytes) must lie inside the
 * file's size. With req, the call queues the request and returns; the
 * request must be waited exactly once (zt_aio_wait frees it). req NULL:
 * blocking. */
int zt_aio_write(zt_aio *a, int file, size_t offset, const void *buf, size_t nbytes,
                 zt_aio_req **req);
int zt_aio_read(zt_aio *a, int file, size_t offset, void *buf, size_t nbytes, zt_aio_req **req);
/* Block until the request is done, free it, return its result. */
int zt_aio_wait(zt_aio_req *r);
/* *done = 1 if finished (never blocks; the request must still be waited). */
int zt_aio_test(zt_aio_req *r, int *done);

/* The nvme tier: one engine for the process, configured by the run. Each
 * nvme storage is one swap file; tensors are accounted on tier nvme like
 * any other tier (current/peak bytes, limit). An nvme tensor's bytes are
 * not addressable (tensor->data is NULL; storage->data is an opaque
 * handle): ops refuse it; bytes move with zt_copy_async between an nvme
 * tensor and a host tensor, or with zt_tensor_read/write (synchronous).
 * Until configured, allocating on nvme fails with ZT_EINVAL saying so.
 * Configuring again moves the tier (ZT_ESTATE while nvme tensors exist). */
int zt_nvme_configure(const char *dir, size_t block_bytes, int queue_depth, int flags);
/* The tier's engine (mode, notes, stats), NULL if not configured. */
zt_aio *zt_nvme_engine(void);
/* Close the tier's engine and remove its files (ZT_ESTATE while nvme
 * tensors exist). Harmless when not configured. */
int zt_nvme_shutdown(void);
/* The swap file holding an nvme tensor's storage, and the tensor's byte
 * offset in it (for messages, reports and tests); NULL if t is not on nvme. */
const char *zt_nvme_path(const zt_tensor *t, size_t *offset);

/* ---- SHA-256 (for parameter digests) ------------------------------------ */
typedef struct zt_sha256 {
    uint32_t h[8];
    uint64_t nbytes;
    uint8_t buf[64];
    uint32_t nbuf;
} zt_sha256;
void zt_sha256_init(zt_sha256 *s);
void zt_sha256_update(zt_sha256 *s, const void *data, size_t n);
/* Writes 65 bytes: 64 lowercase hex digits and a NUL. */
void zt_sha256_hex(zt_sha256 *s, char *hex65);

/* ---- interrupts (interrupt.c) --------------------------------------------
 * A process-wide counter that the installed signal handler increments (and
 * nothing else: it is async-signal-safe). Long loops poll it at boundaries
 * where stopping is safe; what an interrupt means is the caller's choice. */
/* Handle signal `sig` (SIGINT 2, SIGTERM 15, SIGUSR1 10) by counting it;
 * without SA_RESTART, so a blocking read returns EINTR. */
int zt_interrupt_install(int sig);
/* Give `sig` its default action back. */
int zt_interrupt_restore(int sig);
/* Signals counted since the last clear. */
int zt_interrupt_count(void);
void zt_interrupt_clear(void);
/* Count one as a signal would (tests, a caller forwarding an interrupt). */
void zt_interrupt_raise(void);
/* n > 0: the n-th signal received (counting from the start, cleared or not)
 * takes its default action at once instead of being counted: a graceful
 * stop's "second signal stops now". 0 = never. */
void zt_interrupt_hard(int n);
/* With zt_interrupt_hard set: the first signal leaves `seconds` to reach a
 * safe stop (the end of the step in flight), after which the process says
 * so and ends with 128 + that signal (a rank stuck in a collective with a
 * dead peer). zt_interrupt_grace_done() when the stop point was reached. */
void zt_interrupt_grace(int seconds);
void zt_interrupt_grace_done(void);

/* ---- misc ---------------------------------------------------------------- */
/* Monotonic clock in seconds. */
double zt_now(void);
/* Runtime version string. */
const char *zt_version(void);

#endif
