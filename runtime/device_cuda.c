/*
 * device_cuda.c -- the CUDA device: kernels/cuda behind the device table
 * (compiled only with `make CUDA=1`; zt_device_init("cuda") selects it).
 *
 * One GPU per process (the current device: CUDA_VISIBLE_DEVICES or
 * cudaSetDevice before zt_device_init picks it), one non-blocking compute
 * stream, one cuBLAS handle on it. Ops are asynchronous on that stream;
 * copies that touch host memory, and ops that return a count (token ids
 * outside the vocabulary) or host values (sums), wait for it.
 *
 * Errors. Every CUDA and cuBLAS status is checked, and every launcher
 * returns cudaGetLastError() after its launches; a failure becomes
 * zt_error(ZT_EIO, "cuda: file:line: call: name (text)"). The device table
 * has ops that return void (fill, layernorm, adamw, ...): their first
 * failure is kept and returned by the next op that returns a code, or by
 * zt_device_sync -- like CUDA's own asynchronous errors. The library
 * never exits.
 *
 * Not on CUDA yet: attention_decode (the KV-cache generation path) -- its
 * entry is NULL and ops.c answers that it is not available on this device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include <cublas_v2.h>
#include "internal.h"
#include "../kernels/cpu/kernels.h"
#include "../kernels/cuda/kernels.cuh"

static cudaStream_t cu_stream;
static cublasHandle_t cu_blas;
static int *cu_flag;              /* device int: counts of bad token ids */
static double *cu_scratch;        /* device: block partials of sum/sumsq */
static size_t cu_scratch_n;
static int cu_ready;
static int cu_pending;            /* first error of a void op, not yet returned */

static int cu_err(const char *file, int line, const char *call, cudaError_t e)
{
    return zt_error(ZT_EIO, "cuda: %s:%d: %s: %s (%s)", file, line, call,
                    cudaGetErrorName(e), cudaGetErrorString(e));
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

static void note(int rc) { if (rc != ZT_OK && cu_pending == ZT_OK) cu_pending = rc; }

/* The kept error, once: an op returning a code reports it first. */
static int take_pending(void)
{
    int rc = cu_pending;
    cu_pending = ZT_OK;
    return rc;
}

int zt_cuda_init(void)
{
    if (cu_ready) return ZT_OK;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return zt_error(ZT_EINVAL, "device.backend=cuda: no CUDA GPU is visible (%s); check "
                        "nvidia-smi and CUDA_VISIBLE_DEVICES, or use device.backend=cpu",
                        e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    CU(cudaStreamCreateWithFlags(&cu_stream, cudaStreamNonBlocking));
    cublasStatus_t st = cublasCreate(&cu_blas);
    if (st != CUBLAS_STATUS_SUCCESS) return blas_err(__FILE__, __LINE__, "cublasCreate", st);
    /* fp32 GEMMs in fp32: no TF32 (the CPU's math, to fp32 rounding) */
    st = cublasSetMathMode(cu_blas, CUBLAS_DEFAULT_MATH);
    if (st != CUBLAS_STATUS_SUCCESS) return blas_err(__FILE__, __LINE__, "cublasSetMathMode", st);
    st = cublasSetStream(cu_blas, cu_stream);
    if (st != CUBLAS_STATUS_SUCCESS) return blas_err(__FILE__, __LINE__, "cublasSetStream", st);
    CU(cudaMalloc((void **)&cu_flag, sizeof(int)));
    cu_ready = 1;
    return ZT_OK;
}

static int cuda_sync(void)
{
    CU(cudaStreamSynchronize(cu_stream));
    return take_pending();
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

static void cuda_zero(void *p, size_t nbytes) { CU_NOTE(cudaMemsetAsync(p, 0, nbytes, cu_stream)); }

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
    CU_NOTE(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, cu_stream));
    if (!on_device(dst) || !on_device(src)) CU_NOTE(cudaStreamSynchronize(cu_stream));
}

static void cuda_fill(float *x, float v, size_t n) { KC_NOTE(zkc_fill(cu_stream, x, v, n)); }
static void cuda_scale(float *x, float a, size_t n) { KC_NOTE(zkc_scale(cu_stream, x, a, n)); }
static void cuda_axpy(float *y, float a, const float *x, size_t n) { KC_NOTE(zkc_axpy(cu_stream, y, a, x, n)); }
static void cuda_add(float *y, const float *x, size_t n) { KC_NOTE(zkc_add(cu_stream, y, x, n)); }
static void cuda_add3(float *o, const float *a, const float *b, size_t n) { KC_NOTE(zkc_add3(cu_stream, o, a, b, n)); }

static void cuda_cast(void *dst, int dd, const void *src, int sd, size_t n)
{
    if (dd == sd) {
        size_t es = dd == ZT_F32 || dd == ZT_I32 ? 4 : 2;
        cuda_copy(dst, src, n * es);
    } else if (sd == ZT_F32 && dd == ZT_BF16) KC_NOTE(zkc_cast_f32_bf16(cu_stream, dst, src, n));
    else if (sd == ZT_BF16 && dd == ZT_F32) KC_NOTE(zkc_cast_bf16_f32(cu_stream, dst, src, n));
    else if (sd == ZT_F32 && dd == ZT_F16) KC_NOTE(zkc_cast_f32_f16(cu_stream, dst, src, n));
    else if (sd == ZT_F16 && dd == ZT_F32) KC_NOTE(zkc_cast_f16_f32(cu_stream, dst, src, n));
}

/* Count of bad ids: zero the device flag, run, read it back (waits). A
 * CUDA failure returns its (negative) error code instead. */
static int flag_reset(void) { CU(cudaMemsetAsync(cu_flag, 0, sizeof(int), cu_stream)); return ZT_OK; }
static int flag_read(void)
{
    int bad = 0;
    CU(cudaMemcpyAsync(&bad, cu_flag, sizeof(int), cudaMemcpyDeviceToHost, cu_stream));
    CU(cudaStreamSynchronize(cu_stream));
    return bad;
}

static int cuda_encoder_forward(float *out, const int32_t *tok, const float *wte,
                                const float *wpe, int B, int T, int C, int V)
{
    ZT_TRY(take_pending());
    ZT_TRY(flag_reset());
    KC(zkc_encoder_forward(cu_stream, out, tok, wte, wpe, B, T, C, V, cu_flag));
    return flag_read();
}

static int cuda_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                 const int32_t *tok, int B, int T, int C, int V)
{
    ZT_TRY(take_pending());
    ZT_TRY(flag_reset());
    KC(zkc_encoder_backward(cu_stream, dwte, dwpe, dout, tok, B, T, C, V, cu_flag));
    return flag_read();
}

static void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                   const float *w, const float *b, int N, int C)
{
    KC_NOTE(zkc_layernorm_forward(cu_stream, out, mean, rstd, inp, w, b, N, C));
}

static void cuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                    const float *inp, const float *w, const float *mean,
                                    const float *rstd, int N, int C)
{
    KC_NOTE(zkc_layernorm_backward(cu_stream, dinp, dw, db, dout, inp, w, mean, rstd, N, C));
}

#define BLAS(call) do { int st_ = (call); \
    if (st_ != 0) return blas_err(__FILE__, __LINE__, #call, st_); } while (0)

static int cuda_matmul_forward(float *out, const float *inp, const float *w, const float *b,
                               int N, int C, int OC)
{
    ZT_TRY(take_pending());
    BLAS(zkc_matmul_forward(cu_blas, cu_stream, out, inp, w, b, N, C, OC));
    return ZT_OK;
}

static int cuda_matmul_backward(float *dinp, float *dw, float *db, const float *dout,
                                const float *inp, const float *w, int N, int C, int OC)
{
    ZT_TRY(take_pending());
    BLAS(zkc_matmul_backward(cu_blas, cu_stream, dinp, dw, db, dout, inp, w, N, C, OC));
    return ZT_OK;
}

static int cuda_matmul_bf16_forward(float *out, const uint16_t *inp, const uint16_t *w,
                                    const float *b, int N, int C, int OC)
{
    ZT_TRY(take_pending());
    BLAS(zkc_matmul_bf16_forward(cu_blas, cu_stream, out, inp, w, b, N, C, OC));
    return ZT_OK;
}

static int cuda_matmul_bf16_backward(float *dinp, float *dw, float *db, const uint16_t *dout,
                                     const uint16_t *inp, const uint16_t *w, int N, int C, int OC)
{
    ZT_TRY(take_pending());
    BLAS(zkc_matmul_bf16_backward(cu_blas, cu_stream, dinp, dw, db, dout, inp, w, N, C, OC));
    return ZT_OK;
}

static void cuda_gelu_forward(float *out, const float *inp, size_t n)
{
    KC_NOTE(zkc_gelu_forward(cu_stream, out, inp, n));
}

static void cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    KC_NOTE(zkc_gelu_backward(cu_stream, dinp, inp, dout, n));
}

static int cuda_crossentropy(float *losses, float *dlogits, const float *logits,
                             const int32_t *targets, int N, int V, float dscale)
{
    ZT_TRY(take_pending());
    ZT_TRY(flag_reset());
    KC(zkc_crossentropy(cu_stream, losses, dlogits, logits, targets, N, V, dscale, cu_flag));
    return flag_read();
}

static void cuda_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr,
                       float b1, float b2, float eps, float wd, float gscale, int t)
{
    KC_NOTE(zkc_adamw(cu_stream, p, g, m, v, n, lr, b1, b2, eps, wd, gscale, t));
}

/* nb doubles of device scratch for block partials (kept, grown) */
static int scratch(size_t nb)
{
    if (nb <= cu_scratch_n) return ZT_OK;
    if (cu_scratch) CU(cudaFree(cu_scratch));
    cu_scratch = NULL;
    cu_scratch_n = 0;
    CU(cudaMalloc((void **)&cu_scratch, nb * sizeof(double)));
    cu_scratch_n = nb;
    return ZT_OK;
}

/* partials (host, ceil(n/ZK_SUM_BLOCK) doubles): the CPU's bits */
static int sumsq_blocks(double *partials, const float *x, size_t n)
{
    size_t nb = (n + ZK_SUM_BLOCK - 1) / ZK_SUM_BLOCK;
    if (nb == 0) return ZT_OK;
    ZT_TRY(scratch(nb));
    KC(zkc_sumsq_blocks(cu_stream, cu_scratch, x, n));
    CU(cudaMemcpyAsync(partials, cu_scratch, nb * sizeof(double), cudaMemcpyDeviceToHost,
                       cu_stream));
    CU(cudaStreamSynchronize(cu_stream));
    return ZT_OK;
}

static void cuda_sumsq_blocks(double *partials, const float *x, size_t n)
{
    note(sumsq_blocks(partials, x, n));
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
    if ((rc = scratch(nb)) == ZT_OK) {
        rc = zkc_sum_blocks(cu_stream, cu_scratch, x, n);
        if (rc) rc = cu_err(__FILE__, __LINE__, "zkc_sum_blocks", (cudaError_t)rc);
    }
    if (rc == ZT_OK) {
        cudaError_t e = cudaMemcpyAsync(part, cu_scratch, nb * sizeof(double),
                                        cudaMemcpyDeviceToHost, cu_stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(cu_stream);
        if (e != cudaSuccess) rc = cu_err(__FILE__, __LINE__, "cudaMemcpyAsync(partials)", e);
    }
    if (rc == ZT_OK) for (size_t k = 0; k < nb; k++) total += part[k];
    note(rc);
    free(part);
    return total;
}

static void cuda_attention_forward(float *out, float *lse, const float *qkv,
                                   int B, int T, int C, int NH)
{
    KC_NOTE(zkc_attention_forward(cu_stream, out, lse, qkv, B, T, C, NH));
}

/* D = rowsum(dout * out) (B*NH*T floats) lives in the scratch buffer */
static void cuda_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                    const float *out, const float *lse, int B, int T, int C, int NH)
{
    size_t rows = (size_t)B * NH * T;
    int rc = scratch(rows / 2 + 1);
    if (rc != ZT_OK) { note(rc); return; }
    KC_NOTE(zkc_attention_backward(cu_stream, dqkv, dout, qkv, out, lse, B, T, C, NH,
                                   (float *)cu_scratch));
}

/* Initialization only: the CPU generator on the host, then one upload --
 * the same parameters on both backends, bit for bit. */
static void cuda_randn(float *x, size_t n, uint64_t seed, uint64_t stream, float mean, float std)
{
    if (n == 0) return;
    float *h = malloc(n * sizeof(float));
    if (!h) { note(zt_error(ZT_ENOMEM, "cuda randn: %zu bytes of host staging", n * 4)); return; }
    zk_randn(h, n, seed, stream, mean, std);
    CU_NOTE(cudaMemcpyAsync(x, h, n * sizeof(float), cudaMemcpyHostToDevice, cu_stream));
    CU_NOTE(cudaStreamSynchronize(cu_stream));
    free(h);
}

const zt_device_ops zt_cuda_device = {
    .name = "cuda",
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
    .layernorm_backward = cuda_layernorm_backward,
    .matmul_forward = cuda_matmul_forward,
    .matmul_backward = cuda_matmul_backward,
    .matmul_bf16_forward = cuda_matmul_bf16_forward,
    .matmul_bf16_backward = cuda_matmul_bf16_backward,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .attention_decode = NULL,       /* not yet: ops.c says so */
    .gelu_forward = cuda_gelu_forward,
    .gelu_backward = cuda_gelu_backward,
    .crossentropy = cuda_crossentropy,
    .adamw = cuda_adamw,
    .sumsq_blocks = cuda_sumsq_blocks,
    .sum = cuda_sum,
    .randn = cuda_randn,
};
