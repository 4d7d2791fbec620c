/*
 * internal.h -- private to runtime/: error reporting and the device table.
 */
#ifndef ZT_INTERNAL_H
#define ZT_INTERNAL_H

#include "ztrain.h"

/* The tensor and its storage (opaque in ztrain.h: zt_tensor_data ...).
 * White-box tests include this header to read them. */
struct zt_storage {
    void *data;         /* 64-byte aligned (host: 4096); nvme: an opaque handle */
    size_t nbytes;
    int32_t tier;
    int32_t category;
    int32_t refcount;
    int32_t pad_;
};

struct zt_tensor {
    void *data;         /* storage->data + offset * dtype size */
    zt_storage *storage;
    int64_t offset;     /* in elements, into the storage */
    int64_t numel;
    int64_t shape[4];
    int32_t ndim;
    int32_t dtype;
    int32_t refcount;
    int32_t pad_;
};

/* Record an error message for zt_last_error() and return code. The message
 * is formatted like printf; keep it actionable: name the thing, say what to do. */
int zt_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void zt_clear_error(void);

/* Validate, else return the error from the calling function. */
#define ZT_CHECK(cond, ...) \
    do { if (!(cond)) return zt_error(ZT_EINVAL, __VA_ARGS__); } while (0)
#define ZT_TRY(expr) \
    do { int zt_rc_ = (expr); if (zt_rc_ != ZT_OK) return zt_rc_; } while (0)

/* The widest row the CPU's bf16 kernels widen on a thread's stack: a bf16
 * residual stream's rows (and their gradients) and a norm's bf16 weight
 * and bias. ops.c refuses wider ones before dispatch (128 KiB of floats). */
#define ZT_R16_MAX_C 16384

/* "f32 [4,64,768]": a tensor (or a dtype + shape) for error messages. */
const char *zt_describe_shape(char *buf, size_t n, int dtype, int ndim, const int64_t *shape);
const char *zt_describe(const zt_tensor *t, char *buf, size_t n);

/* Raw allocation on a tier with accounting and limits (memory.c), through
 * the tier's allocator: device -> the device backend's alloc; host -> plain
 * 4096-byte-aligned memory (O_DIRECT-ready; pinned by cudaHostAlloc while
 * the CUDA device is active); nvme -> a swap file of the nvme engine (an opaque handle, not
 * bytes; ZT_EINVAL until zt_nvme_configure). */
int zt_mem_alloc(void **out, size_t nbytes, int tier, int category,
                 const char *what);
void zt_mem_free(void *p, size_t nbytes, int tier, int category);
/* Zero nbytes at p on tier, by whoever owns the bytes: the device's zero op
 * for the device tier (the host never writes device bytes), memset on host. */
void zt_mem_zero(void *p, size_t nbytes, int tier);

/* The nvme tier (aio.c). zt_nvme_alloc: a new zero-filled swap file of
 * nbytes as an opaque handle; errors carry their message (not configured:
 * ZT_EINVAL; a full disk: ZT_EIO). zt_nvme_rw: blocking transfer between
 * host bytes buf and the nvme tensor t (all of it: nbytes = t's bytes). */
int zt_nvme_alloc(void **out, size_t nbytes);
void zt_nvme_free(void *handle);
int zt_nvme_rw(int write, const zt_tensor *t, void *buf, size_t nbytes);
/* The same, queued: *req to zt_aio_wait. */
int zt_nvme_submit(int write, const zt_tensor *t, void *buf, size_t nbytes, zt_aio_req **req);
/* Test hook: the nth transfer from now (1 = the next) of engine a fails with
 * errno err at its submission (ZT_AIO_FAULT_SUBMIT: io_uring_submit's error,
 * io_uring only) or at its completion (ZT_AIO_FAULT_COMPLETE: the CQE's res,
 * or pread/pwrite's errno on the thread pool). err 0 disarms. */
enum { ZT_AIO_FAULT_SUBMIT = 1, ZT_AIO_FAULT_COMPLETE = 2 };
void zt_aio_inject_fault(zt_aio *a, int where, int err, int nth);

/* Streams (stream.c). Before an op runs on the calling thread, the thread's
 * current stream must have finished its earlier work (stream order): a
 * no-op for a compute stream, a drain for a copy/comm stream whose worker
 * may still hold queued work. Returns that stream's kept error, if any. */
int zt_stream_enter(void);
/* Test hook: queue on s an item that fails with code and msg when the worker
 * reaches it (to exercise error propagation; nothing else fails on the CPU). */
int zt_stream_inject_error(zt_stream *s, int code, const char *msg);

/* A device's execution model: streams, events, copies and host memory.
 * NULL in a device table (the CPU device, fakegpu): stream.c's own model
 * runs (a compute stream is the calling thread; a copy or comm stream a
 * worker thread). A device with one (CUDA; fakegpu-async, a CPU stand-in
 * whose streams run later, in any order a GPU permits) queues its ops on
 * the calling thread's current stream, and stream.c maps zt_stream and
 * zt_event onto these handles. The contract is CUDA's:
 *  - stream_new: a stream of its own, no implicit sync with any other;
 *    stream_free waits for its work. NULL as a stream argument means the
 *    calling thread's current stream (set_stream; NULL: compute_stream()).
 *  - event_record marks a point of a stream; stream_wait_event makes the
 *    stream's later work wait for the event's latest record as of the call
 *    (never recorded: no wait); event_sync and stream_sync block the host;
 *    event_query never blocks (a never-recorded event is done).
 *  - copy_async: nbytes on a stream, device or host memory on either side;
 *    host bytes are read or written when the copy runs, not when issued.
 *    copy_blocking: the host waits for the copy, which is ordered after
 *    nothing on any stream (CUDA's cudaMemcpy on the legacy stream with
 *    non-blocking streams): the caller orders it with an event first.
 *  - host_alloc: host memory the device copies asynchronously (pinned);
 *    NULL: plain memory. is_pinned(p): p came from host_alloc.
 *  - bind_thread: a thread other than the initialising one calls it before
 *    its first use of the device.
 * Every int-returning call is 0 or an error code with its message. */
typedef struct zt_exec_ops {
    int (*stream_new)(void **out, int kind);
    void (*stream_free)(void *s);
    int (*stream_sync)(void *s);
    void (*set_stream)(void *s);
    void *(*compute_stream)(void);
    int (*bind_thread)(void);
    int (*event_new)(void **out);
    void (*event_free)(void *e);
    int (*event_record)(void *e, void *s);
    int (*stream_wait_event)(void *s, void *e);
    int (*event_sync)(void *e);
    int (*event_query)(void *e, int *done);
    int (*copy_async)(void *dst, const void *src, size_t nbytes, void *s);
    int (*copy_blocking)(void *dst, const void *src, size_t nbytes);
    int (*host_alloc)(void **out, size_t nbytes);
    void (*host_free)(void *p);
    int (*is_pinned)(const void *p);
} zt_exec_ops;

/* A device is a table of raw-pointer ops. The CPU device calls kernels/cpu;
 * a CUDA device would launch on its stream. Ops receive validated sizes.
 * Most ops cannot fail. Those that index by token id return the number of
 * ids outside [0,V) (skipped, memory-safe; on CUDA the count comes back
 * through a device flag); matmul returns 0 or an error code with a message. */
/* The bad-token error's text (ops.c), for devices that count bad ids on
 * the device and report them at their next sync (deferred = 1) instead of
 * waiting for each count: returns ZT_EINVAL with the message set. */
int zt_bad_tokens_error(const char *op, const char *what, int64_t bad, int64_t n, int64_t V,
                        int deferred);

/* zt_adamw_segments' segments, validated (ztrain.h) */
typedef struct zt_adamw_segs {
    int n;
    int64_t off[ZT_ADAMW_SEGS], len[ZT_ADAMW_SEGS];
    float wd[ZT_ADAMW_SEGS];
} zt_adamw_segs;

/* zt_adamw_multi's parts, validated: the raw pointers at each segment's
 * first element (g and lp in their dtypes), n elements, the decay */
typedef struct zt_adamw_item {
    float *p;
    const void *g;
    float *m, *v;
    void *lp;
    int64_t n;
    float wd;
} zt_adamw_item;

typedef struct zt_device_ops {
    const char *name;
    const zt_exec_ops *exec;    /* streams, events, copies; NULL: stream.c's CPU model */
    int (*sync)(void);
    /* device memory: 64-byte aligned; alloc returns ZT_ENOMEM (no message)
     * when the backend is out of memory. zero writes nbytes of zeros. */
    int (*alloc)(void **out, size_t nbytes);
    void (*free)(void *p);
    void (*zero)(void *p, size_t nbytes);
    void (*fill)(float *x, float v, size_t n);
    void (*copy)(void *dst, const void *src, size_t nbytes);
    /* host bytes into device memory in stream order, without waiting: src
     * may be reused on return (the device keeps its own copy until the
     * transfer is done). 0 or an error with its message. NULL: copy. */
    int (*upload)(void *dst, const void *src, size_t nbytes);
    void (*scale)(float *x, float a, size_t n);
    void (*axpy)(float *y, float a, const float *x, size_t n);
    /* y += x; x f32, or (x_dtype ZT_BF16 / ZT_F16) a 2-byte x widened
     * exactly: the bits of a cast then an f32 add */
    void (*add)(float *y, const void *x, int x_dtype, size_t n);
    /* r16 ("the residual stream is bf16", bf16 activations end to end):
     * out, a, b all bf16 (uint16_t bits), out = round(widen(a) + widen(b)),
     * one fp32 add rounded once to nearest even; else all f32 */
    void (*add3)(void *out, const void *a, const void *b, int r16, size_t n);
    void (*cast)(void *dst, int dst_dtype, const void *src, int src_dtype, size_t n);
    /* w16: wte and wpe bf16 (widened exactly); out16: out bf16, the f32
     * sum rounded once */
    int (*encoder_forward)(void *out, int out16, const int32_t *tok, const void *wte,
                           const void *wpe, int w16, int B, int T, int C, int V);
    /* dout16: dout bf16, widened exactly (the f32 kernel's bits on the
     * widened rows). g16: dwte and dwpe bf16 (a bf16 run's stored
     * gradients, written by the op: no fp32 work buffer and no cast
     * after): each dwte element round(the f32 kernel's additions onto
     * widen(dwte)), each dwpe element the f32 one rounded once.
     * Return as below, or a negative error code, zt_error'd (the CPU's
     * bf16 dwte allocates its row accumulators). */
    int (*encoder_backward)(void *dwte, void *dwpe, int g16, const void *dout, int dout16,
                            const int32_t *tok, int B, int T, int C, int V);
    /* out16: out (dinp for gelu_backward) is bf16, the fp32 result rounded
     * once (a bf16 GEMM's input) */
    /* in16: inp bf16, widened exactly (then out16 is set: ops.c). p16:
     * the parameters (w and b; rmsnorm's w) bf16, a bf16 run's stored
     * ones, widened exactly as read: the f32 kernel's bits on the widened
     * values, so no cast of them before the op (else f32). */
    void (*layernorm_forward)(void *out, int out16, float *mean, float *rstd,
                              const void *inp, int in16, const void *w, const void *b,
                              int p16, int N, int C);
    /* resid = a + b, then out = layernorm(resid) (out16 as above); r16:
     * resid, a, b bf16 (resid = add3's r16 rounding) and out bf16, the
     * layer norm of the stored (rounded) resid */
    void (*layernorm_residual_forward)(void *resid, void *out, int out16, float *mean,
                                       float *rstd, const void *a, const void *b, int r16,
                                       const void *w, const void *bias, int p16, int N, int C);
    /* dinp16: NULL, or the accumulated dinp rounded once (bf16). r16: dinp,
     * inp and dout bf16 (dinp16 NULL): inp and dout widened exactly, each
     * dinp element round(widen(dinp) + the f32 kernel's term), one
     * rounding; dw, db the f32 kernel's on the widened inp and dout.
     * g16: dw and db bf16 (a bf16 run's stored gradients), each the f32
     * value rounded once (zk_cast_f32_bf16's bits) */
    void (*layernorm_backward)(void *dinp, uint16_t *dinp16, void *dw, void *db, int g16,
                               const void *dout, const void *inp, int r16,
                               const void *w, int p16, const float *mean,
                               const float *rstd, int N, int C);
    /* ldo: the row stride of out (forward) or dout (backward), >= OC
     * (kernels.h: padded rows) */
    int (*matmul_forward)(float *out, const float *inp, const float *w,
                          const float *b, int N, int C, int OC, int ldo);
    int (*matmul_backward)(float *dinp, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, int N, int C, int OC, int ldo);
    /* bf16 operands (uint16_t bits), the bias fp32 or (b16) bf16 (a bf16
     * run's stored one, widened exactly: the fp32 bias's bits), out fp32
     * or (out_bf16) bf16, the other outputs fp32; the CPU's arithmetic is
     * kernels.h's zk_matmul_bf16_* (the same bits on every CPU backend). */
    int (*matmul_bf16_forward)(void *out, int out_bf16, const uint16_t *inp, const uint16_t *w,
                               const void *b, int b16, int N, int C, int OC, int ldo);
    /* dinp16: dinp bf16, the f32 dinp rounded once (bf16 activations: an
     * activation's gradient); dw, db f32, or (g16) both bf16 (a bf16
     * run's stored gradients), each the f32 value rounded once (CUDA: a
     * dw of at least as many 128x128 tiles as the card has SMs is one
     * GEMM with a bf16 D, its own algorithm's fp32 sum rounded once:
     * deterministic for a shape on a card, not the fp32 call's bits) */
    int (*matmul_bf16_backward)(void *dinp, int dinp16, void *dw, void *db, int g16,
                                const uint16_t *dout, const uint16_t *inp, const uint16_t *w,
                                int N, int C, int OC, int ldo);
    /* The MLP's GEMMs fused with its GELU (bf16 activations; NULL: ops.c
     * issues the GEMM and the GELU apart, which is what the CPU devices
     * do, the bits of the two ops). forward_gelu: pre (N,OC) = inp @ w^T
     * + b and out (N,OC) = gelu(pre), both bf16, rows dense. backward_dgelu:
     * dinp16 (N,C) = gelu'(pre) * (dout @ w) in bf16 (pre (N,C) bf16;
     * dinp32 (N,C) f32 scratch for a device that forms the product apart);
     * dw, db as matmul_bf16_backward. The CUDA device takes cuBLASLt's
     * GELU_AUX_BIAS and DGELU epilogues where it has a plan for the shape
     * (GELU of the fp32 sum there: its own bits, within the bf16
     * tolerances of the CPU's), else the two kernels. */
    int (*matmul_bf16_forward_gelu)(uint16_t *out, uint16_t *pre, const uint16_t *inp,
                                    const uint16_t *w, const void *b, int b16, int N, int C,
                                    int OC);
    int (*matmul_bf16_backward_dgelu)(uint16_t *dinp16, float *dinp32, void *dw, void *db, int g16,
                                      const uint16_t *dout, const uint16_t *inp,
                                      const uint16_t *w, const uint16_t *pre, int N, int C,
                                      int OC, int ldo);
    /* io16: qkv, out and (backward) dqkv are bf16 (uint16_t bits), else
     * f32; lse and dout are f32 either way. A bf16 qkv (and out) is widened
     * exactly and the arithmetic is the f32 kernel's on those values; out
     * (dqkv) is its f32 result rounded once to nearest even. So, on each
     * device and kernel path, io16 gives round(f32 kernel(widen(x))) bit
     * for bit (bf16 activations: the GEMMs around attention read and write
     * bf16, no cast passes). Return 0 or an error code (zt_error'd: the
     * CPU's bf16 path allocates per-thread f32 tiles; a GPU returns its
     * launch result as the other kernels do). C = NH hs is out's row;
     * qkv's is C + 2 NKV hs (q | k | v, NKV kv heads, NH % NKV == 0);
     * window W >= 0 (0 plain causal, else keys (i - W, i]): kernels.h's
     * zk_attention_*_gqa. Caches (B,NKV,maxT,hs). */
    int (*attention_forward)(void *out, float *lse, const void *qkv, int io16,
                             int B, int T, int C, int NH, int NKV, int W);
    /* (backward: io16 takes dout bf16 too, widened exactly) */
    int (*attention_backward)(void *dqkv, const void *dout, const void *qkv,
                              const void *out, const float *lse, int io16,
                              int B, int T, int C, int NH, int NKV, int W);
    void (*attention_decode)(float *out, float *kcache, float *vcache, const float *qkv,
                             int B, int T, int C, int NH, int NKV, int W, int maxT, int pos);
    /* in16: inp is bf16 (the c_fc GEMM's bf16 out), widened exactly */
    void (*gelu_forward)(void *out, int out16, const void *inp, int in16, size_t n);
    void (*gelu_backward)(void *dinp, int out16, const void *inp, int in16, const float *dout,
                          size_t n);
    /* Llama's (kernels.h zk_rmsnorm_*, zk_rope_*, zk_swiglu_*); rope's dir
     * 1 the forward's turn, -1 the backward's. bf16 activations: out16 a
     * bf16 out, dinp16 (NULL or) the accumulated dinp rounded, x16 bf16
     * rows turned in place, io16 a bf16 gu with a bf16 out / dgu and a
     * bf16 dout (widened exactly); each the f32 kernel's floats rounded
     * once. */
    /* in16, r16 and p16 as layernorm's */
    void (*rmsnorm_forward)(void *out, int out16, float *rstd, const void *inp, int in16,
                            const void *w, int p16, float eps, int N, int C);
    /* g16: dw bf16 as layernorm_backward's */
    void (*rmsnorm_backward)(void *dinp, uint16_t *dinp16, void *dw, int g16, const void *dout,
                             const void *inp, int r16, const void *w, int p16,
                             const float *rstd, int N, int C);
    void (*rope)(void *x, int x16, int N, int T, int ld, int nh, int hs, const float *cos_t,
                 const float *sin_t, int pos0, int dir);
    void (*swiglu_forward)(void *out, const void *gu, int io16, int N, int F);
    /* io16: dout bf16 too (the down GEMM's bf16 input gradient) */
    void (*swiglu_backward)(void *dgu, const void *dout, const void *gu, int io16, int N, int F);
    /* logits and dlogits (N,V) in rows ld apart, fp32 or (bf16) bf16 */
    /* encoder_forward/backward and crossentropy return the bad ids they
     * skipped, or 0 on a device that counts them on the device and reports
     * them (zt_bad_tokens_error) at its next sync, so that no call waits
     * (the CUDA device, fakegpu-async) */
    int (*crossentropy)(float *losses, void *dlogits, const void *logits,
                        const int32_t *targets, int N, int V, int ld, int bf16, float dscale);
    void (*adamw)(float *p, const float *g, float *m, float *v, size_t n,
                  float lr, float b1, float b2, float eps, float wd,
                  float gscale, int t);
    /* adamw over segments of p, g, m, v (one launch on a GPU) */
    /* lp: NULL or the low-precision copy (lp_dtype ZT_BF16 / ZT_F16). g_dtype:
     * ZT_F32, or ZT_BF16 / ZT_F16 (a mixed-precision step's stored gradient
     * read as it is, each element widened exactly: the bits of an f32 copy
     * of it, so no accumulator is needed without accumulation) */
    void (*adamw_segments)(float *p, const void *g, int g_dtype, float *m, float *v, void *lp,
                           int lp_dtype, const zt_adamw_segs *segs, float lr, float b1,
                           float b2, float eps, float gscale, int t);
    /* adamw over many tensors' segments (zt_adamw_multi: one launch on a
     * GPU, or a few, for a step's update); g_dtype and lp_dtype (-1: no
     * lp) as adamw_segments', one for all items */
    void (*adamw_multi)(const zt_adamw_item *items, int n, int g_dtype, int lp_dtype, float lr,
                        float b1, float b2, float eps, float gscale, int t);
    /* x_dtype: ZT_F32, or ZT_BF16 / ZT_F16 widened exactly as read (the
     * partials of an f32 copy, bit for bit) */
    void (*sumsq_blocks)(double *partials, const void *x, int x_dtype, size_t n);
    /* count tensors' block partials one after another (zt_sumsq_blocks_many),
     * all of one dtype */
    void (*sumsq_blocks_many)(double *partials, const void *const *x, int x_dtype,
                              const size_t *n, int count);
    double (*sum)(const float *x, size_t n);
    void (*randn)(float *x, size_t n, uint64_t seed, uint64_t stream, float mean, float std);
    /* zt_device_count's "attention_tc" (NULL: the device has no such path) */
    int64_t (*attention_tc_calls)(void);
    /* zt_device_count's "host_waits" (NULL: not counted, 0) */
    int64_t (*host_waits)(void);
    /* zt_device_count's "host_wait_us": nanoseconds the host spent in those
     * waits (NULL: not counted, 0) */
    int64_t (*host_wait_ns)(void);
} zt_device_ops;

/* comm_stats.c: a thread was blocked this long waiting for a comm request
 * (stream.c's compute-stream wait; comm.c's zt_comm_wait); the clock. */
void zt_stats_exposed(uint64_t ns);
uint64_t zt_stats_now_ns(void);

extern const zt_device_ops zt_cpu_device;
/* device_fakegpu.c: the CPU kernels behind tagged, host-unaddressable device memory */
extern const zt_device_ops zt_fakegpu_device;
/* device_fakegpu_async.c: fakegpu whose streams run later, in a seeded order */
extern const zt_device_ops zt_fakegpu_async_device;
int zt_fakegpu_async_seed(uint64_t seed);
/* The active device (CPU until zt_device_init selects another). */
const zt_device_ops *zt_dev(void);
/* The active device's execution table, NULL for stream.c's CPU model. */
static inline const zt_exec_ops *zt_exec(void) { return zt_dev()->exec; }
/* Tests: make dev the active device (a fake of their own). */
void zt_device_install(const zt_device_ops *dev);

/* Before work on the calling thread on bytes of one tier: stream order
 * (zt_stream_enter), and *dev, the table that runs it. Host-tier bytes are
 * the CPU device's whatever device is active (ZeRO-Offload's optimizer step,
 * offload staging chunks, checkpointed inputs on the host run the CPU
 * kernels, not GPU kernels on pinned host pointers); with another device
 * active the current stream's device work is waited for first, since a copy
 * into those bytes may still be queued there. The device tier is the active
 * device's. On the CPU backend both are zt_cpu_device and nothing waits. */
static inline int zt_tier_enter(int tier, const zt_device_ops **dev)
{
    ZT_TRY(zt_stream_enter());
    *dev = tier == ZT_TIER_HOST ? &zt_cpu_device : zt_dev();
    return *dev != zt_dev() ? zt_dev()->sync() : ZT_OK;
}

#endif
