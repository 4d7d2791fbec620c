/*
 * device_cuda.c -- the CUDA device: kernels/cuda behind the device table
 * (compiled only with `make CUDA=1`; zt_device_init("cuda") selects it).
 *
 * One GPU per process (the current device: CUDA_VISIBLE_DEVICES or
 * cudaSetDevice before zt_device_init picks it), one non-blocking compute
 * stream, one cuBLAS handle. Every op launches on the calling thread's
 * current stream (zt_cuda_set_stream; the compute stream until set), the
 * cuBLAS handle bound to it per call. Ops are asynchronous on that stream;
 * copies that touch host memory, and ops that return a count (token ids
 * outside the vocabulary) or host values (sums), wait for it. More streams
 * (copy, comm), events and asynchronous copies: cuda_stream.h.
 *
 * Errors. Every CUDA and cuBLAS status is checked, and every launcher
 * returns cudaGetLastError() after its launches; a failure becomes
 * zt_error(ZT_EIO, "cuda: file:line: call: name (text)"). The device table
 * has ops that return void (fill, layernorm, adamw, ...): their first
 * failure is kept and returned by the next op that returns a code, or by
 * zt_device_sync -- like CUDA's own asynchronous errors. The library
 * never exits.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include <cublas_v2.h>
#include <pthread.h>
#include <time.h>
#include "internal.h"
#include "cuda_stream.h"
#include "../kernels/cpu/kernels.h"
#include "../kernels/cuda/kernels.cuh"

static cudaStream_t cu_stream;
static cublasHandle_t cu_blas;
static int *cu_flag;              /* device ints: bad token ids, one count an op (BAD_*) */
enum { BAD_ENC_FWD, BAD_ENC_BWD, BAD_XENT, BAD_OPS };
static double *cu_scratch;        /* device: block partials of sum/sumsq */
static size_t cu_scratch_n;
static int cu_ready;
static int cu_pending;            /* first error of a void op, not yet returned */
static int cu_dev;                /* the GPU of this process (zt_cuda_bind_thread) */

/* The calling thread's current stream (zt_cuda_set_stream); 0: cu_stream. */
static _Thread_local cudaStream_t cu_cur;
#define S() (cu_cur ? cu_cur : cu_stream)

/* Shared by every stream: the cuBLAS handle (bound to the caller's stream
 * per call), the bad-id flag and the scratch buffer. cu_lock serialises the
 * host side of their use across threads; scratch_user + scratch_ev order
 * the device side across streams: the next stream to use the scratch
 * waits for the last one's work on it (a sum on the compute stream after an
 * attention backward on another stream must not overwrite its D rows). */
static pthread_mutex_t cu_lock = PTHREAD_MUTEX_INITIALIZER;
static cudaEvent_t scratch_ev;
static cudaStream_t scratch_user;

static int cu_err(const char *file, int line, const char *call, cudaError_t e)
{
    /* A failed runtime call also sets the thread's last error; reset it, or
     * the next launcher's cudaGetLastError reports this failure again under
     * that kernel's name (sticky errors stay: the context is gone). */
    (void)cudaGetLastError();
    return zt_error(ZT_EIO, "cuda: %s:%d: %s: %s (%s)", file, line, call,
                    cudaGetErrorName(e), cudaGetErrorString(e));
}

/* zt_device_count("host_waits"): every host wait this device makes (a
 * stream or event sync, a copy with host memory, an op returning a value,
 * an upload slot's reuse), counted as called: unlike fakegpu-async, a wait
 * on an idle stream counts too */
static int64_t cu_waits, cu_wait_ns;
static inline void waited(void) { __atomic_add_fetch(&cu_waits, 1, __ATOMIC_RELAXED); }
static int64_t cuda_host_waits(void) { return __atomic_load_n(&cu_waits, __ATOMIC_RELAXED); }
/* zt_device_count("host_wait_us"): the time the host spent blocked in
 * those stream and event syncs (and a blocking copy's, the bad-token
 * read's) -- a step's wall time minus this is the host's own (Lua,
 * launches): near the step's time, the launches are what bounds it
 * (tools/bench_gpu.lua prints both). Every thread's waits add up here: with
 * a communication thread waiting too (dp, ZeRO) the sum can pass the wall
 * time; bench_gpu runs one rank, single. A cudaFree's implicit wait is not
 * timed. */
static int64_t cuda_host_wait_ns(void) { return __atomic_load_n(&cu_wait_ns, __ATOMIC_RELAXED); }
static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
static int64_t wait_begin(void) { waited(); return mono_ns(); }
static cudaError_t wait_end(int64_t t0, cudaError_t e)
{
    __atomic_add_fetch(&cu_wait_ns, mono_ns() - t0, __ATOMIC_RELAXED);
    return e;
}
static cudaError_t wait_stream(cudaStream_t s)
{
    int64_t t0 = wait_begin();
    return wait_end(t0, cudaStreamSynchronize(s));
}
static cudaError_t wait_event(cudaEvent_t ev)
{
    int64_t t0 = wait_begin();
    return wait_end(t0, cudaEventSynchronize(ev));
}

static int blas_err(const char *file, int line, const char *call, int st)
{
    if (st >= ZKC_LAUNCH_BASE)           /* a kernel launch inside a matmul */
        return cu_err(file, line, call, (cudaError_t)(st - ZKC_LAUNCH_BASE));
    return zt_error(ZT_EIO, "cuda: %s:%d: %s: cuBLAS %s (%s)", file, line, call,
                    cublasGetStatusName((cublasStatus_t)st),
                    cublasGetStatusString((cublasStatus_t)st));
}

/* In an op returning a code: fail with the call's error. */
#define CU(call) do { cudaError_t e_ = (call); \
    if (e_ != cudaSuccess) return cu_err(__FILE__, __LINE__, #call, e_); } while (0)
/* A kernel launcher (returns a cudaError_t as int). */
#define KC(call) do { int e_ = (call); \
    if (e_ != 0) return cu_err(__FILE__, __LINE__, #call, (cudaError_t)e_); } while (0)
/* In a void op: keep the first failure for later. */
#define CU_NOTE(call) do { cudaError_t e_ = (call); \
    if (e_ != cudaSuccess) note(cu_err(__FILE__, __LINE__, #call, e_)); } while (0)
#define KC_NOTE(call) do { int e_ = (call); \
    if (e_ != 0) note(cu_err(__FILE__, __LINE__, #call, (cudaError_t)e_)); } while (0)

/* cu_pending is shared by every thread that issues ops (the caller, stream
 * workers, the communication thread): the first error wins, atomically. */
static void note(int rc)
{
    int none = ZT_OK;
    if (rc != ZT_OK)
        __atomic_compare_exchange_n(&cu_pending, &none, rc, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

/* The kept error, once: an op returning a code reports it first. */
static int take_pending(void) { return __atomic_exchange_n(&cu_pending, ZT_OK, __ATOMIC_ACQ_REL); }

/* A two-way switch read from the environment at init: *v = 0 for off, 1
 * for on, untouched when unset; any other value is refused, naming the
 * variable and what each value does (help) */
static int env_switch(const char *name, const char *off, const char *on, const char *help, int *v)
{
    const char *e = getenv(name);
    if (!e) return ZT_OK;
    if (strcmp(e, off) && strcmp(e, on))
        return zt_error(ZT_EINVAL, "zt_device_init(\"cuda\"): %s is '%.40s'; use %s", name, e, help);
    *v = strcmp(e, on) == 0;
    return ZT_OK;
}

/* The kernels' switches read from the environment at init (after the
 * rank's device is set: some ask it what it grants). Each: the variable,
 * its off and on values, the help a bad value gets, the setter (returns the
 * setting it took), and what it means when on is not taken. */
static const struct env_knob {
    const char *name, *off, *on, *help;
    int (*set)(int);
    const char *refused;
} env_knobs[] = {
    /* the MLP's GEMM and GELU always as two ops (matmul.cu; 1, or unset:
     * fused through cuBLASLt's epilogues where a shape has a plan) */
    { "ZTRAIN_GELU_FUSION", "0", "1", "0 (the GEMM and the GELU apart) or 1 (fused where cuBLASLt "
      "can, the default)", zkc_matmul_gelu_fusion, NULL },
    /* the tensor-core backward makes dQ in its dK/dV kernel, the key tiles'
     * parts added in a fixed order (5 matmul-equivalents); pass (or unset,
     * the default until a GPU has timed both): its own pass (7). Both
     * deterministic (attention_tc_bwd.cu) */
    { "ZTRAIN_ATTN_DQ", "pass", "ordered", "pass (dQ by its own kernel, the default) or ordered "
      "(in the dK/dV kernel, in a fixed order)", zkc_attention_tc_ordered_dq, NULL },
    /* the tensor-core forward at head size 128 in blocks of 128 query rows
     * (8 warps, prefetching); narrow (the default until a GPU has timed
     * both): 64. The same bits */
    { "ZTRAIN_ATTN_FWD128", "narrow", "wide", "narrow (blocks of 64 query rows, the default) or "
      "wide (128)", zkc_attention_tc_fwd_wide, NULL },
    /* the tensor-core forward, both head sizes, in blocks of 4 warps of 32
     * query rows (two m-tiles sharing each K, V fragment), the next tile
     * staged by cp.async, 54 / 102 KB of shared memory (over
     * ZTRAIN_ATTN_FWD128); single (the default until a GPU has timed
     * both): 16 rows a warp. The same bits */
    { "ZTRAIN_ATTN_FWD", "single", "pair", "single (16 query rows a warp, the default) or pair "
      "(32)", zkc_attention_tc_fwd_pair,
      "this GPU does not grant the pair forward's 54 KB of shared memory a block (an A100, H100 "
      "or H200 does); unset ZTRAIN_ATTN_FWD or set it to single" },
    /* the backward's dK/dV in blocks of 128 keys, 8 warps, at head size 128
     * (173 KB of shared memory) and 64 (111 KB); narrow (the default until
     * a GPU has timed both): 64 keys. dk, dv the same bits */
    { "ZTRAIN_ATTN_BWD128", "narrow", "wide", "narrow (blocks of 64 keys, the default) or wide "
      "(128 keys, 8 warps)", zkc_attention_tc_bwd_wide,
      "this GPU does not grant the wide backward's 173 KB of shared memory a block (an H100 or "
      "H200 does); unset ZTRAIN_ATTN_BWD128 or set it to narrow" },
    { "ZTRAIN_ATTN_BWD64", "narrow", "wide", "narrow (blocks of 64 keys, the default) or wide "
      "(128 keys, 8 warps)", zkc_attention_tc_bwd_wide64,
      "this GPU does not grant the wide backward's 111 KB of shared memory a block (an A100, H100 "
      "or H200 does); unset ZTRAIN_ATTN_BWD64 or set it to narrow" },
};

static int env_switches(void)
{
    for (size_t k = 0; k < sizeof env_knobs / sizeof env_knobs[0]; k++) {
        const struct env_knob *e = &env_knobs[k];
        int v = -1;
        ZT_TRY(env_switch(e->name, e->off, e->on, e->help, &v));
        if (v >= 0 && e->set(v) != v && e->refused)
            return zt_error(ZT_EINVAL, "%s=%s: %s", e->name, e->on, e->refused);
    }
    return ZT_OK;
}

static char cu_model[256];         /* the card's name (cudaDeviceProp), at init */
const char *zt_cuda_model(void) { return cu_model; }

int zt_cuda_init(void)
{
    if (cu_ready) return ZT_OK;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return zt_error(ZT_EINVAL, "zt_device_init(\"cuda\"): no CUDA GPU is visible (%s); check "
                        "nvidia-smi and CUDA_VISIBLE_DEVICES, or use the cpu backend",
                        e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    /* One GPU per rank: the launcher's local rank picks the device (ranks
     * beyond the GPUs share them, round robin: the MPI transport stages
     * their device tensors; NCCL would refuse). With one visible device
     * (CUDA_VISIBLE_DEVICES set per rank, or one GPU) it is that one. */
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!lr) lr = getenv("SLURM_LOCALID");
    if (!lr) lr = getenv("LOCAL_RANK");
    if (lr && n > 1) CU(cudaSetDevice(atoi(lr) % n));
    ZT_TRY(env_switches());
    CU(cudaGetDevice(&cu_dev));
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, cu_dev) == cudaSuccess)
        snprintf(cu_model, sizeof cu_model, "%s", prop.name);
    CU(cudaStreamCreateWithFlags(&cu_stream, cudaStreamNonBlocking));
    cublasStatus_t st = cublasCreate(&cu_blas);
    if (st != CUBLAS_STATUS_SUCCESS) return blas_err(__FILE__, __LINE__, "cublasCreate", st);
    /* fp32 GEMMs in fp32: no TF32 (the CPU's math, to fp32 rounding) */
    /* and a bf16 output summed in fp32 to the end: cuBLAS may otherwise
     * reduce split-K partials in the output type (an H200 showed 0.11 off
     * on a 16x768x50257 bf16-out GEMM) */
    st = cublasSetMathMode(cu_blas, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                                  CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    if (st != CUBLAS_STATUS_SUCCESS) return blas_err(__FILE__, __LINE__, "cublasSetMathMode", st);
    st = cublasSetStream(cu_blas, cu_stream);
    if (st != CUBLAS_STATUS_SUCCESS) return blas_err(__FILE__, __LINE__, "cublasSetStream", st);
    CU(cudaMalloc((void **)&cu_flag, BAD_OPS * sizeof(int)));
    CU(cudaMemset(cu_flag, 0, BAD_OPS * sizeof(int)));
    CU(cudaEventCreateWithFlags(&scratch_ev, cudaEventDisableTiming));
    cu_ready = 1;
    return ZT_OK;
}

/* Bad token ids: each op's kernels add to their own device count; no call
 * waits for it. The counts are read at the next device sync (zt_device_sync:
 * the trainer's once a step), reported naming the op, and zeroed. The host
 * keeps the positions and V since the last read, for the message. */
static const char *bad_op[BAD_OPS] = { "zt_encoder_forward", "zt_encoder_backward",
                                       "zt_crossentropy" };
static const char *bad_what[BAD_OPS] = { "tokens", "tokens", "targets" };
static int64_t bad_n[BAD_OPS], bad_V[BAD_OPS];
static void bad_note(int op, int64_t n, int V) { bad_n[op] += n; bad_V[op] = V; }  /* cu_lock held */

static int bad_check(void)
{
    int bad[BAD_OPS] = { 0 }, any = 0;
    pthread_mutex_lock(&cu_lock);
    cudaError_t e = cudaMemcpyAsync(bad, cu_flag, sizeof bad, cudaMemcpyDeviceToHost, S());
    if (e == cudaSuccess) { int64_t t0 = mono_ns(); e = wait_end(t0, cudaStreamSynchronize(S())); }
    for (int i = 0; i < BAD_OPS; i++) any |= bad[i] != 0;
    if (e == cudaSuccess && any) e = cudaMemsetAsync(cu_flag, 0, sizeof bad, S());
    int rc = e == cudaSuccess ? ZT_OK : cu_err(__FILE__, __LINE__, "bad token counts", e);
    for (int i = 0; rc == ZT_OK && i < BAD_OPS; i++)
        if (bad[i]) rc = zt_bad_tokens_error(bad_op[i], bad_what[i], bad[i], bad_n[i], bad_V[i], 1);
    /* the positions since the last report (a count from a kernel on another
     * stream, still running at this read, is reported at a later sync; the
     * zeroing above can lose such a count: the ops run on the compute
     * stream, so only a caller that moves them elsewhere meets that) */
    for (int i = 0; i < BAD_OPS; i++) if (bad[i]) bad_n[i] = 0;
    pthread_mutex_unlock(&cu_lock);
    return rc;
}

static int cuda_sync(void)
{
    CU(wait_stream(S()));
    ZT_TRY(take_pending());
    return bad_check();
}

static int cuda_alloc(void **out, size_t nbytes)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, nbytes ? nbytes : 64);   /* 256-byte aligned */
    if (e == cudaErrorMemoryAllocation) { (void)cudaGetLastError(); return ZT_ENOMEM; }
    CU(e);
    *out = p;
    return ZT_OK;
}

static void cuda_free(void *p) { if (p) CU_NOTE(cudaFree(p)); }

static void cuda_zero(void *p, size_t nbytes) { CU_NOTE(cudaMemsetAsync(p, 0, nbytes, S())); }

static int on_device(const void *p)
{
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) { (void)cudaGetLastError(); return 0; }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* dst and src may each be device or host memory (tensor upload/download go
 * through here): device to device stays asynchronous; with host memory on
 * either side it waits, since the caller may reuse or read the host bytes
 * as soon as it returns. */
static void cuda_copy(void *dst, const void *src, size_t nbytes)
{
    if (nbytes == 0) return;
    CU_NOTE(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, S()));
    if (!on_device(dst) || !on_device(src)) CU_NOTE(wait_stream(S()));
}

/* ---- uploads (zt_tensor_upload: a micro-batch's tokens and targets):
 * the host bytes are copied into one of UP_SLOTS pinned slots, and the
 * slot's transfer is queued on the stream with an event behind it; a slot
 * is reused once its event has passed -- the upload UP_SLOTS calls ago, so
 * the host waits for nothing in the step (cuda_copy would wait for the
 * whole stream: every prior kernel). Larger than UP_MAX: cuda_copy. ---- */
#define UP_SLOTS 8
#define UP_MAX ((size_t)64 << 20)
static struct up_slot { void *buf; size_t cap; cudaEvent_t ev; int queued; } up[UP_SLOTS];
static int up_next;

static int upload(void *dst, const void *src, size_t nbytes)
{
    struct up_slot *u = &up[up_next];
    if (u->queued) CU(wait_event(u->ev));
    u->queued = 0;
    if (!u->ev) CU(cudaEventCreateWithFlags(&u->ev, cudaEventDisableTiming));
    if (u->cap < nbytes) {
        if (u->buf) CU(cudaFreeHost(u->buf));
        u->buf = NULL;
        u->cap = 0;
        CU(cudaHostAlloc(&u->buf, nbytes, cudaHostAllocPortable));
        u->cap = nbytes;
    }
    memcpy(u->buf, src, nbytes);
    CU(cudaMemcpyAsync(dst, u->buf, nbytes, cudaMemcpyHostToDevice, S()));
    cudaError_t e = cudaEventRecord(u->ev, S());
    if (e != cudaSuccess) {          /* no event to wait for: the copy's end, then the error */
        (void)cudaStreamSynchronize(S());
        return cu_err(__FILE__, __LINE__, "cudaEventRecord(upload slot)", e);
    }
    u->queued = 1;
    up_next = (up_next + 1) % UP_SLOTS;
    return ZT_OK;
}

static int cuda_upload(void *dst, const void *src, size_t nbytes)
{
    if (nbytes == 0) return ZT_OK;
    ZT_TRY(take_pending());
    if (nbytes > UP_MAX || !on_device(dst)) { cuda_copy(dst, src, nbytes); return take_pending(); }
    pthread_mutex_lock(&cu_lock);
    int rc = upload(dst, src, nbytes);
    pthread_mutex_unlock(&cu_lock);
    return rc;
}

static void cuda_fill(float *x, float v, size_t n) { KC_NOTE(zkc_fill(S(), x, v, n)); }
static void cuda_scale(float *x, float a, size_t n) { KC_NOTE(zkc_scale(S(), x, a, n)); }
static void cuda_axpy(float *y, float a, const float *x, size_t n) { KC_NOTE(zkc_axpy(S(), y, a, x, n)); }
/* x f32, or (x_dtype ZT_BF16 / ZT_F16) 2-byte, widened exactly (internal.h) */
static void cuda_add(float *y, const void *x, int x_dtype, size_t n)
{
    if (x_dtype == ZT_BF16) KC_NOTE(zkc_add_bf16(S(), y, x, n));
    else if (x_dtype == ZT_F16) KC_NOTE(zkc_add_f16(S(), y, x, n));
    else KC_NOTE(zkc_add(S(), y, x, n));
}
static void cuda_add3(void *o, const void *a, const void *b, int r16, size_t n)
{
    if (r16) KC_NOTE(zkc_add3_b16(S(), o, a, b, n));
    else KC_NOTE(zkc_add3(S(), o, a, b, n));
}

static void cuda_cast(void *dst, int dd, const void *src, int sd, size_t n)
{
    if (dd == sd) {
        size_t es = dd == ZT_F32 || dd == ZT_I32 ? 4 : 2;
        cuda_copy(dst, src, n * es);
    } else if (sd == ZT_F32 && dd == ZT_BF16) KC_NOTE(zkc_cast_f32_bf16(S(), dst, src, n));
    else if (sd == ZT_BF16 && dd == ZT_F32) KC_NOTE(zkc_cast_bf16_f32(S(), dst, src, n));
    else if (sd == ZT_F32 && dd == ZT_F16) KC_NOTE(zkc_cast_f32_f16(S(), dst, src, n));
    else if (sd == ZT_F16 && dd == ZT_F32) KC_NOTE(zkc_cast_f16_f32(S(), dst, src, n));
}

/* The ops that count bad ids return 0: the count is read at the next
 * device sync (bad_check, above). A CUDA failure returns its error code. */
static int cuda_encoder_forward(void *out, int out16, const int32_t *tok, const void *wte,
                                const void *wpe, int w16, int B, int T, int C, int V)
{
    ZT_TRY(take_pending());
    pthread_mutex_lock(&cu_lock);      /* the host's notes of the counts */
    bad_note(BAD_ENC_FWD, (int64_t)B * T, V);
    int e = out16 ? zkc_encoder_forward_o16(S(), out, tok, wte, wpe, w16, B, T, C, V,
                                            cu_flag + BAD_ENC_FWD)
                  : zkc_encoder_forward(S(), out, tok, wte, wpe, w16, B, T, C, V,
                                        cu_flag + BAD_ENC_FWD);
    int rc = e ? cu_err(__FILE__, __LINE__, "zkc_encoder_forward", (cudaError_t)e) : ZT_OK;
    pthread_mutex_unlock(&cu_lock);
    return rc;
}

static int scratch(size_t nb);       /* below: the shared device scratch, cu_lock held */

/* g16: dwte, dwpe bf16, written by the op (zkc_encoder_backward_g16: the
 * fp32 kernel's dwte on the widened values, rounded once), its carry rows
 * in the shared scratch */
static int cuda_encoder_backward(void *dwte, void *dwpe, int g16, const void *dout, int dout16,
                                 const int32_t *tok, int B, int T, int C, int V)
{
    ZT_TRY(take_pending());
    pthread_mutex_lock(&cu_lock);
    int rc = ZT_OK, e = 0;
    if (g16) {
        size_t nf = zkc_encoder_backward_g16_scratch(C, V);
        rc = nf ? scratch((nf + 1) / 2) : ZT_OK;
        if (rc == ZT_OK) {
            bad_note(BAD_ENC_BWD, (int64_t)B * T, V);
            e = zkc_encoder_backward_g16(S(), dwte, dwpe, dout, dout16, tok, B, T, C, V,
                                         cu_flag + BAD_ENC_BWD, (float *)cu_scratch);
        }
    } else {
        bad_note(BAD_ENC_BWD, (int64_t)B * T, V);
        e = dout16 ? zkc_encoder_backward_b16(S(), dwte, dwpe, dout, tok, B, T, C, V,
                                              cu_flag + BAD_ENC_BWD)
                   : zkc_encoder_backward(S(), dwte, dwpe, dout, tok, B, T, C, V,
                                          cu_flag + BAD_ENC_BWD);
    }
    if (e) rc = cu_err(__FILE__, __LINE__, g16 ? "zkc_encoder_backward_g16" : "zkc_encoder_backward",
                       (cudaError_t)e);
    pthread_mutex_unlock(&cu_lock);
    return rc;
}

/* the bf16 residual stream's ops take bf16 rows with a bf16 out, and no
 * dinp16 (internal.h; ops.c guarantees): another mix is a caller's bug,
 * kept as an error for the next sync */
static void r16_misuse(const char *op)
{
    note(zt_error(ZT_EINVAL, "cuda: %s: a bf16 residual row needs a bf16 out and no dinp16", op));
}

/* p16 (the norms' parameters bf16, widened as read) goes through to the
 * kernels: layernorm.cu, the f32 parameters' bits on the widened values */
static void cuda_layernorm_forward(void *out, int out16, float *mean, float *rstd,
                                   const void *inp, int in16, const void *w, const void *b,
                                   int p16, int N, int C)
{
    if (in16 && !out16) r16_misuse("layernorm_forward");
    else if (in16) KC_NOTE(zkc_layernorm_forward_r16(S(), out, mean, rstd, inp, w, b, p16, N, C));
    else KC_NOTE(zkc_layernorm_forward(S(), out, out16, mean, rstd, inp, w, b, p16, N, C));
}

static void cuda_layernorm_residual_forward(void *resid, void *out, int out16, float *mean,
                                            float *rstd, const void *a, const void *b, int r16,
                                            const void *w, const void *bias, int p16, int N,
                                            int C)
{
    if (r16 && !out16) r16_misuse("layernorm_residual_forward");
    else if (r16)
        KC_NOTE(zkc_layernorm_residual_forward_r16(S(), resid, out, mean, rstd, a, b, w, bias,
                                                   p16, N, C));
    else
        KC_NOTE(zkc_layernorm_residual_forward(S(), resid, out, out16, mean, rstd, a, b, w, bias,
                                               p16, N, C));
}

/* r16: dinp, inp and dout bf16 (zkc_layernorm_backward_r16); g16: dw, db
 * bf16, the fp32 values rounded once (layernorm.cu's last store) */
static int ln_bwd(void *dinp, uint16_t *dinp16, void *dw, void *db, int g16, const void *dout,
                  const void *inp, int r16, const void *w, int p16, const float *mean,
                  const float *rstd, int N, int C, double *scr)
{
    return r16 ? zkc_layernorm_backward_r16(S(), dinp, dw, db, g16, dout, inp, w, p16, mean, rstd,
                                            N, C, scr)
               : zkc_layernorm_backward(S(), dinp, dinp16, dw, db, g16, dout, inp, w, p16, mean,
                                        rstd, N, C, scr);
}

static void cuda_layernorm_backward(void *dinp, uint16_t *dinp16, void *dw, void *db, int g16,
                                    const void *dout, const void *inp, int r16, const void *w,
                                    int p16, const float *mean, const float *rstd, int N, int C)
{
    if (r16 && dinp16) { r16_misuse("layernorm_backward"); return; }
    if (!dw || !db) {               /* no weight gradients: no scratch */
        KC_NOTE(ln_bwd(dinp, dinp16, dw, db, g16, dout, inp, r16, w, p16, mean, rstd, N, C, NULL));
        return;
    }
    pthread_mutex_lock(&cu_lock);   /* the shared scratch (see scratch()) */
    int rc = scratch(zkc_layernorm_scratch(N, C));
    if (rc == ZT_OK)
        KC_NOTE(ln_bwd(dinp, dinp16, dw, db, g16, dout, inp, r16, w, p16, mean, rstd, N, C,
                       cu_scratch));
    else note(rc);
    pthread_mutex_unlock(&cu_lock);
}

/* One cuBLAS handle: zkc_matmul_* bind it to the caller's stream
 * (cublasSetStream) and launch under cu_lock, so two threads on two
 * streams never race on the binding. */
#define BLAS(call) do { pthread_mutex_lock(&cu_lock); int st_ = (call); \
    pthread_mutex_unlock(&cu_lock); \
    if (st_ != 0) return blas_err(__FILE__, __LINE__, #call, st_); } while (0)

static int cuda_matmul_forward(float *out, const float *inp, const float *w, const float *b,
                               int N, int C, int OC, int ldo)
{
    ZT_TRY(take_pending());
    BLAS(zkc_matmul_forward(cu_blas, S(), out, inp, w, b, N, C, OC, ldo));
    return ZT_OK;
}

/* the backward GEMMs, and the bias gradient through the shared scratch */
#define BLAS_DB(call) do { pthread_mutex_lock(&cu_lock); \
    int rc_ = db ? scratch(zkc_colsum_scratch(N, OC)) : ZT_OK; \
    int st_ = rc_ == ZT_OK ? (call) : 0; \
    pthread_mutex_unlock(&cu_lock); \
    if (rc_ != ZT_OK) return rc_; \
    if (st_ != 0) return blas_err(__FILE__, __LINE__, #call, st_); } while (0)

static int cuda_matmul_backward(float *dinp, float *dw, float *db, const float *dout,
                                const float *inp, const float *w, int N, int C, int OC, int ldo)
{
    ZT_TRY(take_pending());
    BLAS_DB(zkc_matmul_backward(cu_blas, S(), dinp, dw, db, dout, inp, w, N, C, OC, ldo,
                                cu_scratch));
    return ZT_OK;
}

/* b16: the bias bf16 (matmul.cu: the bits of its widened fp32 copy) */
static int cuda_matmul_bf16_forward(void *out, int out_bf16, const uint16_t *inp,
                                    const uint16_t *w, const void *b, int b16, int N, int C,
                                    int OC, int ldo)
{
    ZT_TRY(take_pending());
    BLAS(zkc_matmul_bf16_forward(cu_blas, S(), out, out_bf16, inp, w, b, b16, N, C, OC, ldo));
    return ZT_OK;
}

/* dinp16: a bf16 dinp (the fp32 one rounded once); the scratch holds db's
 * colsum, for the LM head's split (matmul.cu) the fp32 dinp rounded from,
 * and a small g16 dw's fp32 image: zkc_matmul_bf16_backward_scratch, the
 * largest of the three. g16: dw, db bf16, written by the op (a bf16-D GEMM, or on a small output the
 * fp32 dw in the scratch, cast; colsum rounded once) */
/* Takes cu_lock (the caller releases it) and sizes the scratch for a bf16
 * backward GEMM (zkc_matmul_bf16_backward_scratch); its status */
static int bwd_scratch_locked(int N, int C, int OC, int db, int dinp16, int g16dw)
{
    pthread_mutex_lock(&cu_lock);
    size_t nb = zkc_matmul_bf16_backward_scratch(N, C, OC, db, dinp16, g16dw);
    return db || nb ? scratch(nb) : ZT_OK;
}

static int cuda_matmul_bf16_backward(void *dinp, int dinp16, void *dw, void *db, int g16,
                                     const uint16_t *dout, const uint16_t *inp, const uint16_t *w,
                                     int N, int C, int OC, int ldo)
{
    ZT_TRY(take_pending());
    int rc = bwd_scratch_locked(N, C, OC, db != NULL, dinp16 && dinp, g16 && dw);
    int st = rc == ZT_OK ? zkc_matmul_bf16_backward(cu_blas, S(), dinp, dinp16, dw, db, g16, dout,
                                                    inp, w, N, C, OC, ldo, cu_scratch)
                         : 0;
    pthread_mutex_unlock(&cu_lock);
    if (rc != ZT_OK) return rc;
    if (st != 0) return blas_err(__FILE__, __LINE__, "zkc_matmul_bf16_backward", st);
    return ZT_OK;
}

/* the MLP's GEMM and GELU in one (matmul.cu: cuBLASLt's GELU epilogues
 * where the shape has a plan, else the two ops apart, bits and all) */
static int cuda_matmul_bf16_forward_gelu(uint16_t *out, uint16_t *pre, const uint16_t *inp,
                                         const uint16_t *w, const void *b, int b16, int N, int C,
                                         int OC)
{
    ZT_TRY(take_pending());
    BLAS(zkc_matmul_bf16_forward_gelu(cu_blas, S(), out, pre, inp, w, b, b16, N, C, OC));
    return ZT_OK;
}

static int cuda_matmul_bf16_backward_dgelu(uint16_t *dinp16, float *dinp32, void *dw, void *db,
                                           int g16, const uint16_t *dout, const uint16_t *inp,
                                           const uint16_t *w, const uint16_t *pre, int N, int C,
                                           int OC, int ldo)
{
    ZT_TRY(take_pending());
    int rc = bwd_scratch_locked(N, C, OC, db != NULL, 0, g16 && dw);   /* no dinp16 split */
    int st = rc == ZT_OK ? zkc_matmul_bf16_backward_dgelu(cu_blas, S(), dinp16, dinp32, dw, db,
                                                          g16, dout, inp, w, pre, N, C, OC, ldo,
                                                          cu_scratch)
                         : 0;
    pthread_mutex_unlock(&cu_lock);
    if (rc != ZT_OK) return rc;
    if (st != 0) return blas_err(__FILE__, __LINE__, "zkc_matmul_bf16_backward_dgelu", st);
    return ZT_OK;
}

static void cuda_gelu_forward(void *out, int out16, const void *inp, int in16, size_t n)
{
    KC_NOTE(zkc_gelu_forward(S(), out, out16, inp, in16, n));
}

static void cuda_gelu_backward(void *dinp, int out16, const void *inp, int in16, const float *dout,
                               size_t n)
{
    KC_NOTE(zkc_gelu_backward(S(), dinp, out16, inp, in16, dout, n));
}

static int cuda_crossentropy(float *losses, void *dlogits, const void *logits,
                             const int32_t *targets, int N, int V, int ld, int bf16, float dscale)
{
    ZT_TRY(take_pending());
    pthread_mutex_lock(&cu_lock);
    bad_note(BAD_XENT, N, V);
    int e = bf16 ? zkc_crossentropy_bf16(S(), losses, dlogits, logits, targets, N, V, ld,
                                         dscale, cu_flag + BAD_XENT)
                 : zkc_crossentropy(S(), losses, dlogits, logits, targets, N, V, ld, dscale,
                                    cu_flag + BAD_XENT);
    int rc = e ? cu_err(__FILE__, __LINE__, "zkc_crossentropy", (cudaError_t)e) : ZT_OK;
    pthread_mutex_unlock(&cu_lock);
    return rc;
}

/* an input's zt_dtype as the kernels' kind (kernels.cuh): 0 f32, 1 bf16,
 * 2 f16; another -1, which the kernels refuse (a noted error, not a
 * misread tensor) */
static int kc_kind(int dtype)
{
    return dtype == ZT_F32 ? 0 : dtype == ZT_BF16 ? 1 : dtype == ZT_F16 ? 2 : -1;
}

/* g_dtype ZT_BF16 / ZT_F16: the stored gradient read as it is, widened
 * exactly in the kernel (the bits of an f32 g) */
static void cuda_adamw_segments(float *p, const void *g, int g_dtype, float *m, float *v,
                                void *lp, int lp_dtype, const zt_adamw_segs *sg, float lr,
                                float b1, float b2, float eps, float gscale, int t)
{
    int kind = lp == NULL ? 0 : lp_dtype == ZT_BF16 ? 1 : 2;
    KC_NOTE(zkc_adamw_segments(S(), p, g, kc_kind(g_dtype), m, v, lp, kind, sg->n, sg->off,
                               sg->len, sg->wd, lr, b1, b2, eps, gscale, t));
}

/* the whole step's update in one launch (zkc_adamw_multi; one per 600
 * items): the items' fields as the launcher's arrays, read before it
 * returns (the table travels in the kernel's parameters) */
static void cuda_adamw_multi(const zt_adamw_item *it, int n, int g_dtype, int lp_dtype, float lr,
                             float b1, float b2, float eps, float gscale, int t)
{
    int kind = lp_dtype == ZT_BF16 ? 1 : lp_dtype == ZT_F16 ? 2 : 0;
    size_t nn = n > 0 ? (size_t)n : 1;
    void **ptr = malloc(nn * 5 * sizeof *ptr);
    int64_t *len = malloc(nn * sizeof *len);
    float *wd = malloc(nn * sizeof *wd);
    if (!ptr || !len || !wd) {
        free(ptr); free(len); free(wd);
        note(zt_error(ZT_ENOMEM, "cuda: adamw_multi: no memory for %d items", n));
        return;
    }
    float **p = (float **)ptr, **m = (float **)(ptr + nn), **v = (float **)(ptr + 2 * nn);
    const void **g = (const void **)(ptr + 3 * nn);
    void **lp = ptr + 4 * nn;
    for (int k = 0; k < n; k++) {
        p[k] = it[k].p; g[k] = it[k].g; m[k] = it[k].m; v[k] = it[k].v; lp[k] = it[k].lp;
        len[k] = it[k].n; wd[k] = it[k].wd;
    }
    KC_NOTE(zkc_adamw_multi(S(), n, p, g, m, v, lp, len, wd, kc_kind(g_dtype), kind, lr, b1, b2,
                            eps, gscale, t));
    free(ptr); free(len); free(wd);
}

static void cuda_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr,
                       float b1, float b2, float eps, float wd, float gscale, int t)
{
    KC_NOTE(zkc_adamw(S(), p, g, m, v, n, lr, b1, b2, eps, wd, gscale, t));
}

/* nb doubles of device scratch for block partials (kept, grown), for use
 * on S(); cu_lock held. */
static int scratch(size_t nb)
{
    if (scratch_user && scratch_user != S()) {   /* the last user's work on it first */
        CU(cudaEventRecord(scratch_ev, scratch_user));
        CU(cudaStreamWaitEvent(S(), scratch_ev, 0));
    }
    scratch_user = S();
    if (nb <= cu_scratch_n) return ZT_OK;
    if (cu_scratch) CU(cudaFree(cu_scratch));
    cu_scratch = NULL;
    cu_scratch_n = 0;
    CU(cudaMalloc((void **)&cu_scratch, nb * sizeof(double)));
    cu_scratch_n = nb;
    return ZT_OK;
}

/* partials (host, ceil(n/ZK_SUM_BLOCK) doubles): the CPU's bits (of the
 * widened values, x_dtype ZT_BF16 / ZT_F16) */
static int sumsq_blocks(double *partials, const void *x, int x_dtype, size_t n)
{
    size_t nb = (n + ZK_SUM_BLOCK - 1) / ZK_SUM_BLOCK;
    if (nb == 0) return ZT_OK;
    ZT_TRY(scratch(nb));
    KC(zkc_sumsq_blocks(S(), cu_scratch, x, kc_kind(x_dtype), n));
    CU(cudaMemcpyAsync(partials, cu_scratch, nb * sizeof(double), cudaMemcpyDeviceToHost,
                       S()));
    CU(wait_stream(S()));
    return ZT_OK;
}

static void cuda_sumsq_blocks(double *partials, const void *x, int x_dtype, size_t n)
{
    pthread_mutex_lock(&cu_lock);
    note(sumsq_blocks(partials, x, x_dtype, n));
    pthread_mutex_unlock(&cu_lock);
}

/* every tensor's blocks into the scratch one after another, then one copy
 * and one wait: the gradient norm's host wait once a step */
static int sumsq_blocks_many(double *partials, const void *const *x, int x_dtype,
                             const size_t *n, int count)
{
    size_t nb = 0;
    for (int i = 0; i < count; i++) nb += (n[i] + ZK_SUM_BLOCK - 1) / ZK_SUM_BLOCK;
    if (nb == 0) return ZT_OK;
    ZT_TRY(scratch(nb));
    size_t off = 0;
    for (int i = 0; i < count; i++) {
        if (n[i] == 0) continue;
        KC(zkc_sumsq_blocks(S(), cu_scratch + off, x[i], kc_kind(x_dtype), n[i]));
        off += (n[i] + ZK_SUM_BLOCK - 1) / ZK_SUM_BLOCK;
    }
    CU(cudaMemcpyAsync(partials, cu_scratch, nb * sizeof(double), cudaMemcpyDeviceToHost, S()));
    CU(wait_stream(S()));
    return ZT_OK;
}

static void cuda_sumsq_blocks_many(double *partials, const void *const *x, int x_dtype,
                                   const size_t *n, int count)
{
    pthread_mutex_lock(&cu_lock);
    note(sumsq_blocks_many(partials, x, x_dtype, n, count));
    pthread_mutex_unlock(&cu_lock);
}

/* zk_sum_f64: block partials, then added in block order from 0.0 */
static double cuda_sum(const float *x, size_t n)
{
    size_t nb = (n + ZK_SUM_BLOCK - 1) / ZK_SUM_BLOCK;
    if (nb == 0) return 0.0;
    double *part = malloc(nb * sizeof(double));
    if (!part) { note(zt_error(ZT_ENOMEM, "cuda sum: %zu bytes of host memory", nb * 8)); return 0.0; }
    double total = 0.0;
    int rc = ZT_OK;
    pthread_mutex_lock(&cu_lock);
    if ((rc = scratch(nb)) == ZT_OK) {
        rc = zkc_sum_blocks(S(), cu_scratch, x, n);
        if (rc) rc = cu_err(__FILE__, __LINE__, "zkc_sum_blocks", (cudaError_t)rc);
    }
    if (rc == ZT_OK) {
        cudaError_t e = cudaMemcpyAsync(part, cu_scratch, nb * sizeof(double),
                                        cudaMemcpyDeviceToHost, S());
        if (e == cudaSuccess) e = wait_stream(S());
        else waited();
        if (e != cudaSuccess) rc = cu_err(__FILE__, __LINE__, "cudaMemcpyAsync(partials)", e);
    }
    pthread_mutex_unlock(&cu_lock);
    if (rc == ZT_OK) for (size_t k = 0; k < nb; k++) total += part[k];
    note(rc);
    free(part);
    return total;
}

/* Attention mode (cuda_stream.h): 0 exact (the plain kernels, fp32
 * arithmetic), 1 bf16 (attention_tc_*.cu where the head size is 64 or 128);
 * either with fp32 or (io16) bf16 I/O. Process-wide; set by
 * zt_device_attention (recipe key device.attention). Decode always runs the
 * plain kernel, so in bf16 mode a decode row no longer has a forward row's
 * bits. */
static int attn_mode_v;

int zt_cuda_attention_mode(int mode)
{
    if (mode == -1) return attn_mode_v;
    ZT_CHECK(mode == 0 || mode == 1, "zt_cuda_attention_mode: mode %d (known: 0 exact, "
             "1 bf16, -1 query)", mode);
    attn_mode_v = mode;
    return mode;
}

int zt_cuda_matmul_epilogue(int on)
{
    ZT_CHECK(on >= -1 && on <= 2, "zt_cuda_matmul_epilogue: %d (known: 0 cuBLAS, 1 cuBLASLt, "
             "2 cuBLASLt for bf16 operands, -1 query)", on);
    return zkc_matmul_epilogue(on);
}

/* a 0/1 switch's wrapper: on in -1 .. 1 (-1 asks), else ZT_EINVAL naming
 * the function and its known values */
static int switch01(int on, int (*set)(int), const char *fn, const char *known)
{
    ZT_CHECK(on >= -1 && on <= 1, "%s: %d (known: %s, -1 query)", fn, on, known);
    return set(on);
}

int zt_cuda_matmul_split(int on)
{
    return switch01(on, zkc_matmul_split, "zt_cuda_matmul_split",
                    "0 one GEMM, 1 the LM head's columns in two");
}

int zt_cuda_attention_dq(int on)
{
    return switch01(on, zkc_attention_tc_ordered_dq, "zt_cuda_attention_dq",
                    "0 dQ by its own pass, 1 in the dK/dV kernel in a fixed order");
}

int zt_cuda_attention_fwd_wide(int on)
{
    return switch01(on, zkc_attention_tc_fwd_wide, "zt_cuda_attention_fwd_wide",
                    "0 blocks of 64 query rows at head size 128, 1 of 128");
}

int zt_cuda_attention_fwd_pair(int on)
{
    return switch01(on, zkc_attention_tc_fwd_pair, "zt_cuda_attention_fwd_pair",
                    "0 16 query rows a warp, 1 a pair of m-tiles, 32 rows");
}

int zt_cuda_attention_bwd_wide(int on)
{
    return switch01(on, zkc_attention_tc_bwd_wide, "zt_cuda_attention_bwd_wide",
                    "0 dK/dV blocks of 64 keys at head size 128, 1 of 128");
}

int zt_cuda_attention_bwd_wide64(int on)
{
    return switch01(on, zkc_attention_tc_bwd_wide64, "zt_cuda_attention_bwd_wide64",
                    "0 dK/dV blocks of 64 keys at head size 64, 1 of 128");
}

static int64_t tc_calls;          /* zt_device_count("attention_tc") */
static int64_t cuda_attention_tc_calls(void) { return __atomic_load_n(&tc_calls, __ATOMIC_RELAXED); }

/* The tensor-core kernels take this call (counted): device.attention =
 * bf16, head size 64 or 128, every pointer on 16 bytes (their 16-byte
 * loads of q, k, v rows, fp32 or bf16: a bf16 row (6C bytes) and head
 * (128 or 256 bytes) keep a 16-byte base's alignment as fp32 ones do);
 * else the plain kernel, decided by the operands, so the same for every
 * call of a shape and I/O type. */
static int attn_tc(int C, int NH, const void *a, const void *b, const void *c, const void *d)
{
    int hs = NH > 0 && C % NH == 0 ? C / NH : 0;
    int on = attn_mode_v == 1 && (hs == 64 || hs == 128) &&
             ((((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) & 15) == 0);
    if (on) __atomic_fetch_add(&tc_calls, 1, __ATOMIC_RELAXED);
    return on;
}

/* io16: qkv, out (and dqkv) bf16, the kernels' contract (kernels.cuh);
 * the kept error of an earlier op first, then the launch's */
static int cuda_attention_forward(void *out, float *lse, const void *qkv, int io16,
                                  int B, int T, int C, int NH, int NKV, int W)
{
    ZT_TRY(take_pending());
    int tc = attn_tc(C, NH, out, qkv, NULL, NULL);
    int e = tc ? zkc_attention_forward_tc_gqa(S(), out, lse, qkv, io16, B, T, C, NH, NKV, W)
               : zkc_attention_forward_gqa(S(), out, lse, qkv, io16, B, T, C, NH, NKV, W);
    return e ? cu_err(__FILE__, __LINE__,
                      tc ? "zkc_attention_forward_tc" : "zkc_attention_forward_gqa", (cudaError_t)e)
             : ZT_OK;
}

static void cuda_attention_decode(float *out, float *kcache, float *vcache, const float *qkv,
                                  int B, int T, int C, int NH, int NKV, int W, int maxT, int pos)
{
    KC_NOTE(zkc_attention_decode_gqa(S(), out, kcache, vcache, qkv, B, T, C, NH, NKV, W, maxT,
                                     pos));
}

/* D = rowsum(dout * out) (B*NH*T floats) lives in the scratch buffer, and
 * the tensor-core kernels' ordered dQ's counts and sums
 * (zkc_attention_backward_tc_scratch) */
static int cuda_attention_backward(void *dqkv, const void *dout, const void *qkv,
                                   const void *out, const float *lse, int io16,
                                   int B, int T, int C, int NH, int NKV, int W)
{
    ZT_TRY(take_pending());
    pthread_mutex_lock(&cu_lock);
    int tc = attn_tc(C, NH, dqkv, dout, qkv, out), e = 0;
    size_t nf = tc ? zkc_attention_backward_tc_scratch(io16, B, T, C, NH) : (size_t)B * NH * T;
    int rc = scratch(nf / 2 + 1);
    if (rc == ZT_OK) {
        e = tc ? zkc_attention_backward_tc_gqa(S(), dqkv, dout, qkv, out, lse, io16, B, T, C, NH,
                                               NKV, W, (float *)cu_scratch)
               : zkc_attention_backward_gqa(S(), dqkv, dout, qkv, out, lse, io16, B, T, C, NH,
                                            NKV, W, (float *)cu_scratch);
        if (e) rc = cu_err(__FILE__, __LINE__, tc ? "zkc_attention_backward_tc"
                                                  : "zkc_attention_backward_gqa", (cudaError_t)e);
    }
    pthread_mutex_unlock(&cu_lock);
    return rc;
}

/* Initialization only: the CPU generator on the host, then one upload --
 * the same parameters on both backends, bit for bit. */
static void cuda_randn(float *x, size_t n, uint64_t seed, uint64_t stream, float mean, float std)
{
    if (n == 0) return;
    float *h = malloc(n * sizeof(float));
    if (!h) { note(zt_error(ZT_ENOMEM, "cuda randn: %zu bytes of host staging", n * 4)); return; }
    zk_randn(h, n, seed, stream, mean, std);
    CU_NOTE(cudaMemcpyAsync(x, h, n * sizeof(float), cudaMemcpyHostToDevice, S()));
    CU_NOTE(wait_stream(S()));
    free(h);
}

/* ---- streams, events, pinned host memory (cuda_stream.h) ---------------------------- */

/* Before any of these: the device must be up (zt_device_init("cuda")). */
#define NEED_INIT(fn) ZT_CHECK(cu_ready, "%s: the CUDA device is not initialised; call " \
                               "zt_device_init(\"cuda\") first", fn)

int zt_cuda_stream_new(void **out, int kind)
{
    ZT_CHECK(out != NULL, "zt_cuda_stream_new: out is NULL");
    *out = NULL;
    ZT_CHECK(kind == ZT_STREAM_COMPUTE || kind == ZT_STREAM_COPY || kind == ZT_STREAM_COMM,
             "zt_cuda_stream_new: unknown stream kind %d (known: ZT_STREAM_COMPUTE, "
             "ZT_STREAM_COPY, ZT_STREAM_COMM)", kind);
    NEED_INIT("zt_cuda_stream_new");
    int lo = 0, hi = 0;                 /* greatest priority is the lowest number */
    CU(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    cudaStream_t st;
    CU(cudaStreamCreateWithPriority(&st, cudaStreamNonBlocking, kind == ZT_STREAM_COMM ? hi : lo));
    *out = st;
    return ZT_OK;
}

void zt_cuda_stream_free(void *s)
{
    if (!s || s == (void *)cu_stream) return;
    cudaStream_t st = s;
    if (cu_cur == st) cu_cur = NULL;
    CU_NOTE(cudaStreamSynchronize(st));   /* its work finishes; then nothing names it */
    pthread_mutex_lock(&cu_lock);
    if (scratch_user == st) scratch_user = NULL;
    zkc_matmul_stream_gone(st);          /* its cuBLASLt workspace (matmul.cu) */
    pthread_mutex_unlock(&cu_lock);
    CU_NOTE(cudaStreamDestroy(st));
}

int zt_cuda_stream_sync(void *s)
{
    NEED_INIT("zt_cuda_stream_sync");
    CU(wait_stream(s ? (cudaStream_t)s : S()));
    return take_pending();
}

void zt_cuda_set_stream(void *s) { cu_cur = s == (void *)cu_stream ? NULL : (cudaStream_t)s; }

void *zt_cuda_get_stream(void) { return S(); }

void *zt_cuda_compute_stream(void) { return cu_stream; }

int zt_cuda_bind_thread(void)
{
    NEED_INIT("zt_cuda_bind_thread");
    CU(cudaSetDevice(cu_dev));
    return ZT_OK;
}

int zt_cuda_event_new(void **out, int timing)
{
    ZT_CHECK(out != NULL, "zt_cuda_event_new: out is NULL");
    *out = NULL;
    NEED_INIT("zt_cuda_event_new");
    cudaEvent_t e;
    CU(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    *out = e;
    return ZT_OK;
}

void zt_cuda_event_free(void *e)
{
    if (e) CU_NOTE(cudaEventDestroy((cudaEvent_t)e));   /* CUDA frees it once it completes */
}

int zt_cuda_event_record(void *e, void *s)
{
    ZT_CHECK(e != NULL, "zt_cuda_event_record: event is NULL (freed?)");
    CU(cudaEventRecord((cudaEvent_t)e, s ? (cudaStream_t)s : S()));
    return ZT_OK;
}

int zt_cuda_stream_wait_event(void *s, void *e)
{
    ZT_CHECK(e != NULL, "zt_cuda_stream_wait_event: event is NULL (freed?)");
    NEED_INIT("zt_cuda_stream_wait_event");
    CU(cudaStreamWaitEvent(s ? (cudaStream_t)s : S(), (cudaEvent_t)e, 0));
    return ZT_OK;
}

int zt_cuda_event_sync(void *e)
{
    ZT_CHECK(e != NULL, "zt_cuda_event_sync: event is NULL (freed?)");
    CU(wait_event((cudaEvent_t)e));
    return take_pending();
}

int zt_cuda_event_query(void *e, int *done)
{
    ZT_CHECK(e != NULL && done != NULL, "zt_cuda_event_query: event or done is NULL");
    cudaError_t r = cudaEventQuery((cudaEvent_t)e);
    if (r == cudaErrorNotReady) {
        /* not an error: make sure the next launcher's cudaGetLastError does
         * not read it as one */
        if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
        *done = 0;
        return ZT_OK;
    }
    *done = r == cudaSuccess;
    CU(r);
    return ZT_OK;
}

int zt_cuda_copy_async(void *dst, const void *src, size_t nbytes, void *s)
{
    ZT_CHECK(nbytes == 0 || (dst != NULL && src != NULL), "zt_cuda_copy_async: dst or src is NULL");
    NEED_INIT("zt_cuda_copy_async");
    if (nbytes == 0) return ZT_OK;
    CU(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, s ? (cudaStream_t)s : S()));
    return ZT_OK;
}

/* Pinned host memory, page-aligned and in whole pages: the nvme tier's
 * O_DIRECT transfers read and write host tensors in place (memory.c checks).
 * cudaHostAlloc does not promise a page: on an H200 (driver 580, CUDA 13)
 * 16 KiB came at ...a04200, and every MPI-staged collective failed. So the
 * pages come from posix_memalign and are pinned by cudaHostRegister
 * (portable: every context sees them as pinned). */
enum { HOST_PAGE = 4096 };
int zt_cuda_host_alloc(void **out, size_t nbytes)
{
    ZT_CHECK(out != NULL, "zt_cuda_host_alloc: out is NULL");
    *out = NULL;
    NEED_INIT("zt_cuda_host_alloc");
    size_t n = nbytes ? (nbytes + HOST_PAGE - 1) & ~(size_t)(HOST_PAGE - 1) : HOST_PAGE;
    void *p = NULL;
    if (posix_memalign(&p, HOST_PAGE, n) != 0) return ZT_ENOMEM;
    cudaError_t e = cudaHostRegister(p, n, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        free(p);
        (void)cudaGetLastError();
        if (e == cudaErrorMemoryAllocation || e == cudaErrorHostMemoryAlreadyRegistered) return ZT_ENOMEM;
        CU(e);
    }
    *out = p;
    return ZT_OK;
}

void zt_cuda_host_free(void *p)
{
    if (!p) return;
    CU_NOTE(cudaHostUnregister(p));
    free(p);
}

int zt_cuda_is_pinned(const void *p)
{
    if (!cu_ready || !p) return 0;
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) { (void)cudaGetLastError(); return 0; }
    return a.type == cudaMemoryTypeHost;
}

static int cuda_event_new(void **out) { return zt_cuda_event_new(out, 0); }

/* Blocking, on the legacy stream, which the device's non-blocking streams
 * do not wait for (nor it for them): comm_stage.c orders it by an event. */
static int cuda_copy_blocking(void *dst, const void *src, size_t nbytes)
{
    NEED_INIT("cuda copy_blocking");
    if (!nbytes) return ZT_OK;
    int64_t t0 = mono_ns();             /* its blocking time is a wait's (counted below) */
    CU(wait_end(t0, cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault)));
    /* from pageable memory cudaMemcpy may return before the bytes land:
     * the caller's waiters must see them */
    CU(wait_stream(cudaStreamLegacy));
    return ZT_OK;
}

/* stream.c's streams and events, memory.c's pinned host tier and
 * comm_stage.c's staging through this table (internal.h's contract). */
static const zt_exec_ops cuda_exec = {
    .stream_new = zt_cuda_stream_new, .stream_free = zt_cuda_stream_free,
    .stream_sync = zt_cuda_stream_sync, .set_stream = zt_cuda_set_stream,
    .compute_stream = zt_cuda_compute_stream, .bind_thread = zt_cuda_bind_thread,
    .event_new = cuda_event_new, .event_free = zt_cuda_event_free,
    .event_record = zt_cuda_event_record, .stream_wait_event = zt_cuda_stream_wait_event,
    .event_sync = zt_cuda_event_sync, .event_query = zt_cuda_event_query,
    .copy_async = zt_cuda_copy_async, .copy_blocking = cuda_copy_blocking,
    .host_alloc = zt_cuda_host_alloc, .host_free = zt_cuda_host_free,
    .is_pinned = zt_cuda_is_pinned,
};

/* Llama's ops (kernels/cuda/layernorm.cu's RMS paths, rope.cu, swiglu.cu) */
static void cuda_rmsnorm_forward(void *out, int out16, float *rstd, const void *inp, int in16,
                                 const void *w, int p16, float eps, int N, int C)
{
    if (in16 && !out16) r16_misuse("rmsnorm_forward");
    else if (in16) KC_NOTE(zkc_rmsnorm_forward_r16(S(), out, rstd, inp, w, p16, eps, N, C));
    else KC_NOTE(zkc_rmsnorm_forward(S(), out, out16, rstd, inp, w, p16, eps, N, C));
}
/* r16: dinp, inp and dout bf16 (zkc_rmsnorm_backward_r16); p16, g16 as the
 * layer norm's */
static int rms_bwd(void *dinp, uint16_t *dinp16, void *dw, int g16, const void *dout,
                   const void *inp, int r16, const void *w, int p16, const float *rstd, int N,
                   int C, double *scr)
{
    return r16 ? zkc_rmsnorm_backward_r16(S(), dinp, dw, g16, dout, inp, w, p16, rstd, N, C, scr)
               : zkc_rmsnorm_backward(S(), dinp, dinp16, dw, g16, dout, inp, w, p16, rstd, N, C,
                                      scr);
}
static void cuda_rmsnorm_backward(void *dinp, uint16_t *dinp16, void *dw, int g16,
                                  const void *dout, const void *inp, int r16, const void *w,
                                  int p16, const float *rstd, int N, int C)
{
    if (r16 && dinp16) { r16_misuse("rmsnorm_backward"); return; }
    if (!dw) {                      /* no weight gradient: no scratch */
        KC_NOTE(rms_bwd(dinp, dinp16, NULL, g16, dout, inp, r16, w, p16, rstd, N, C, NULL));
        return;
    }
    pthread_mutex_lock(&cu_lock);   /* the shared scratch (see scratch()) */
    int rc = scratch(zkc_rmsnorm_scratch(N, C));
    if (rc == ZT_OK)
        KC_NOTE(rms_bwd(dinp, dinp16, dw, g16, dout, inp, r16, w, p16, rstd, N, C, cu_scratch));
    else note(rc);
    pthread_mutex_unlock(&cu_lock);
}
static void cuda_rope(void *x, int x16, int N, int T, int ld, int nh, int hs, const float *cos_t,
                      const float *sin_t, int pos0, int dir)
{
    if (x16 && dir > 0) KC_NOTE(zkc_rope_forward_b16(S(), x, N, T, ld, nh, hs, cos_t, sin_t, pos0));
    else if (x16) KC_NOTE(zkc_rope_backward_b16(S(), x, N, T, ld, nh, hs, cos_t, sin_t, pos0));
    else if (dir > 0) KC_NOTE(zkc_rope_forward(S(), x, N, T, ld, nh, hs, cos_t, sin_t, pos0));
    else KC_NOTE(zkc_rope_backward(S(), x, N, T, ld, nh, hs, cos_t, sin_t, pos0));
}
static void cuda_swiglu_forward(void *out, const void *gu, int io16, int N, int F)
{
    if (io16) KC_NOTE(zkc_swiglu_forward_bb(S(), out, gu, N, F));
    else KC_NOTE(zkc_swiglu_forward(S(), out, gu, N, F));
}
static void cuda_swiglu_backward(void *dgu, const void *dout, const void *gu, int io16, int N,
                                 int F)
{
    if (io16) KC_NOTE(zkc_swiglu_backward_bb(S(), dgu, dout, gu, N, F));
    else KC_NOTE(zkc_swiglu_backward(S(), dgu, dout, gu, N, F));
}

const zt_device_ops zt_cuda_device = {
    .name = "cuda",
    .exec = &cuda_exec,
    .sync = cuda_sync,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .zero = cuda_zero,
    .fill = cuda_fill,
    .copy = cuda_copy,
    .scale = cuda_scale,
    .axpy = cuda_axpy,
    .add = cuda_add,
    .add3 = cuda_add3,
    .cast = cuda_cast,
    .encoder_forward = cuda_encoder_forward,
    .encoder_backward = cuda_encoder_backward,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_residual_forward = cuda_layernorm_residual_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .matmul_forward = cuda_matmul_forward,
    .matmul_backward = cuda_matmul_backward,
    .matmul_bf16_forward = cuda_matmul_bf16_forward,
    .matmul_bf16_backward = cuda_matmul_bf16_backward,
    .matmul_bf16_forward_gelu = cuda_matmul_bf16_forward_gelu,
    .matmul_bf16_backward_dgelu = cuda_matmul_bf16_backward_dgelu,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .attention_decode = cuda_attention_decode,
    .gelu_forward = cuda_gelu_forward,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .rope = cuda_rope,
    .swiglu_forward = cuda_swiglu_forward,
    .swiglu_backward = cuda_swiglu_backward,
    .gelu_backward = cuda_gelu_backward,
    .crossentropy = cuda_crossentropy,
    .adamw = cuda_adamw,
    .adamw_segments = cuda_adamw_segments,
    .adamw_multi = cuda_adamw_multi,
    .sumsq_blocks_many = cuda_sumsq_blocks_many,
    .upload = cuda_upload,
    .host_waits = cuda_host_waits,
    .host_wait_ns = cuda_host_wait_ns,
    .sumsq_blocks = cuda_sumsq_blocks,
    .sum = cuda_sum,
    .randn = cuda_randn,
    .attention_tc_calls = cuda_attention_tc_calls,
};
