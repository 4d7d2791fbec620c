/*
 * device_cpu.c -- the CPU device: kernels/cpu behind the device table.
 *
 * Ops run synchronously on the calling thread, spreading over OpenMP threads
 * inside kernels; OpenBLAS runs one thread per sgemm call for the whole
 * process (kernels/cpu/matmul.c), its calls spread over OpenMP blocks. So
 * zt_set_threads sizes the OpenMP pool alone, and a rank never
 * oversubscribes its share of cores.
 *
 * Device memory is plain 64-byte-aligned host memory: the device tier is a
 * pool that behaves like a GPU's (own accounting and limit), nothing more.
 */
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "internal.h"
#include "../kernels/cpu/kernels.h"

/* OpenBLAS extensions (not in cblas.h on every build). */
int openblas_get_num_threads(void);
char *openblas_get_corename(void);
char *openblas_get_config(void);

static int cpu_sync(void) { return ZT_OK; }

static int cpu_alloc(void **out, size_t nbytes)
{
    size_t rounded = (nbytes + 63) & ~(size_t)63;
    void *p = NULL;
    if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0) return ZT_ENOMEM;
    *out = p;
    return ZT_OK;
}

static void cpu_free(void *p) { free(p); }

static void cpu_zero(void *p, size_t nbytes) { memset(p, 0, nbytes); }

/* The GEMMs need OpenBLAS at one thread (fixed blocks over OpenMP give the
 * bits; a threaded sgemm inside them would not). It is set once at load;
 * this catches code that changed it and did not put it back. */
static int blas_single(const char *op)
{
    int n = openblas_get_num_threads();
    if (n == 1) return ZT_OK;
    return zt_error(ZT_ESTATE, "%s: OpenBLAS is set to %d threads, but ztrain's GEMMs need 1 "
                    "(they spread fixed blocks over OpenMP; zt_set_threads sizes that): "
                    "whoever called openblas_set_num_threads(%d) must set it back to 1",
                    op, n, n);
}

static int cpu_matmul_forward(float *out, const float *inp, const float *w, const float *b,
                              int N, int C, int OC, int ldo)
{
    ZT_TRY(blas_single("zt_matmul_forward"));
    zk_matmul_forward(out, inp, w, b, N, C, OC, ldo);
    return ZT_OK;
}

static int cpu_matmul_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, int N, int C, int OC, int ldo)
{
    ZT_TRY(blas_single("zt_matmul_backward"));
    zk_matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC, ldo);
    return ZT_OK;
}

/* The bf16 GEMMs are our own kernels (no OpenBLAS inside): nothing to check. */
/* b16: the bias bf16 (a bf16 run's stored one), widened into f32 first:
 * the kernels' bits on the widened bias */
static int cpu_matmul_bf16_forward(void *out, int out_bf16, const uint16_t *inp,
                                   const uint16_t *w, const void *b, int b16, int N, int C,
                                   int OC, int ldo)
{
    float *bw = NULL;
    if (b && b16) {
        bw = malloc((size_t)OC * sizeof *bw);
        if (!bw) return zt_error(ZT_ENOMEM, "a bf16 GEMM (zt_matmul_bf16_forward, or its GELU "
                                 "op): no host memory to widen its bf16 bias (%d floats)", OC);
        zk_cast_bf16_f32(bw, b, (size_t)OC);
        b = bw;
    }
    if (out_bf16) zk_matmul_bf16_forward_b16(out, inp, w, b, N, C, OC, ldo);
    else zk_matmul_bf16_forward(out, inp, w, b, N, C, OC, ldo);
    free(bw);
    return ZT_OK;
}

/* g16: dw and db bf16 (a bf16 run's stored gradients). dw straight from
 * the GEMM (zk_matmul_bf16_dweight_b16: rounded as each block is done),
 * db through an fp32 row here, each rounded once: the f32 op's bits */
static int cpu_matmul_bf16_backward(void *dinp, int dinp16, void *dw, void *db, int g16,
                                    const uint16_t *dout, const uint16_t *inp, const uint16_t *w,
                                    int N, int C, int OC, int ldo)
{
    float *db32 = db;
    if (g16 && db && !(db32 = malloc((size_t)OC * sizeof(float))))
        return zt_error(ZT_ENOMEM, "zt_matmul_bf16_backward: no memory for the bias "
                        "gradient's fp32 row (%d floats)", OC);
    if (g16 && dw && zk_matmul_bf16_dweight_b16(dw, dout, inp, N, C, OC, ldo) != 0) {
        if (db) free(db32);
        return zt_error(ZT_ENOMEM, "zt_matmul_bf16_backward: no memory for the weight "
                        "gradient's fp32 blocks");
    }
    float *dw32 = g16 ? NULL : dw;
    if (dinp16) zk_matmul_bf16_backward_b16(dinp, dw32, db32, dout, inp, w, N, C, OC, ldo);
    else zk_matmul_bf16_backward(dinp, dw32, db32, dout, inp, w, N, C, OC, ldo);
    if (g16 && db) {
        zk_cast_f32_bf16(db, db32, (size_t)OC);
        free(db32);
    }
    return ZT_OK;
}

/* p16: a norm's bf16 weight (and bias), widened into f32 rows on this
 * thread's stack (C <= ZT_R16_MAX_C: ops.c; at most 128 KiB, beside the
 * r16 kernels' own widened rows, 3 C floats more on the calling thread),
 * then the f32-parameter kernels: their bits. wb holds the weight then the
 * bias (no room for a bias where b is NULL; one float at least). */
#define WIDEN_PARAMS(w, b, C)                                                  \
    float wb_[p16 ? ((b) ? 2 : 1) * (size_t)(C) + 1 : 1];                      \
    if (p16) {                                                                 \
        zk_cast_bf16_f32(wb_, (w), (size_t)(C));                               \
        if (b) zk_cast_bf16_f32(wb_ + (C), (b), (size_t)(C));                  \
    }                                                                          \
    const float *wf = p16 ? wb_ : (const float *)(w);                          \
    const float *bf = p16 ? wb_ + (C) : (const float *)(b)

/* in16 / r16: the bf16 residual stream's kernels (kernels.h, "_r16"; ops.c
 * pairs a bf16 input with a bf16 out) */
static void cpu_layernorm_forward(void *out, int out16, float *mean, float *rstd,
                                  const void *inp, int in16, const void *w_, const void *b_,
                                  int p16, int N, int C)
{
    WIDEN_PARAMS(w_, b_, C);
    const float *w = wf, *b = bf;
    if (in16) zk_layernorm_forward_r16(out, mean, rstd, inp, w, b, N, C);
    else if (out16) zk_layernorm_forward_b16(out, mean, rstd, inp, w, b, N, C);
    else zk_layernorm_forward(out, mean, rstd, inp, w, b, N, C);
}

static void cpu_layernorm_residual_forward(void *resid, void *out, int out16, float *mean,
                                           float *rstd, const void *a, const void *b, int r16,
                                           const void *w_, const void *bias_, int p16, int N,
                                           int C)
{
    WIDEN_PARAMS(w_, bias_, C);
    const float *w = wf, *bias = bf;
    if (r16) zk_layernorm_residual_forward_r16(resid, out, mean, rstd, a, b, w, bias, N, C);
    else zk_layernorm_residual_forward(resid, out16 ? NULL : out, out16 ? out : NULL, mean, rstd,
                                       a, b, w, bias, N, C);
}

/* g16: the norms' bf16 weight gradients through fp32 rows on the stack
 * (C <= ZT_R16_MAX_C: ops.c), each rounded once after: the f32 bits */
#define GRADS32(dw, db, C)                                                     \
    float g32_[g16 ? 2 * (size_t)(C) : 1];                                     \
    float *dw32 = g16 && (dw) ? g32_ : (float *)(dw);                          \
    float *db32 = g16 && (db) ? g32_ + (C) : (float *)(db)
#define GRADS16(dw, db, C)                                                     \
    do {                                                                       \
        if (g16 && (dw)) zk_cast_f32_bf16((dw), dw32, (size_t)(C));            \
        if (g16 && (db)) zk_cast_f32_bf16((db), db32, (size_t)(C));            \
    } while (0)

static void cpu_layernorm_backward(void *dinp, uint16_t *dinp16, void *dw, void *db, int g16,
                                   const void *dout, const void *inp, int r16, const void *w_,
                                   int p16, const float *mean, const float *rstd, int N, int C)
{
    WIDEN_PARAMS(w_, NULL, C);
    const float *w = wf;
    (void)bf;
    GRADS32(dw, db, C);
    if (r16) zk_layernorm_backward_r16(dinp, dw32, db32, dout, inp, w, mean, rstd, N, C);
    else zk_layernorm_backward_b16(dinp, dinp16, dw32, db32, dout, inp, w, mean, rstd, N, C);
    GRADS16(dw, db, C);
}

static void cpu_add(float *y, const void *x, int x_dtype, size_t n)
{
    if (x_dtype == ZT_BF16) zk_add_bf16(y, x, n);
    else if (x_dtype == ZT_F16) zk_add_f16(y, x, n);
    else zk_add(y, x, n);
}

static void cpu_add3(void *out, const void *a, const void *b, int r16, size_t n)
{
    if (r16) zk_add3_b16(out, a, b, n);
    else zk_add3(out, a, b, n);
}

/* w16: wte and wpe bf16 (the stored parameters), widened as read; out16:
 * out bf16 (the bf16 residual stream's first rows) */
static int cpu_encoder_forward(void *out, int out16, const int32_t *tok, const void *wte,
                               const void *wpe, int w16, int B, int T, int C, int V)
{
    if (out16) return zk_encoder_forward_o16(out, tok, wte, wpe, w16, B, T, C, V);
    return w16 ? zk_encoder_forward_b16(out, tok, wte, wpe, B, T, C, V)
               : zk_encoder_forward(out, tok, wte, wpe, B, T, C, V);
}

static int cpu_encoder_backward(void *dwte, void *dwpe, int g16, const void *dout, int dout16,
                                const int32_t *tok, int B, int T, int C, int V)
{
    if (g16) {
        int bad = zk_encoder_backward_g16(dwte, dwpe, dout, dout16, tok, B, T, C, V);
        return bad >= 0 ? bad : zt_error(ZT_ENOMEM, "zt_encoder_backward: no memory for the "
                                         "fp32 rows of %d tokens x %d channels", B * T, C);
    }
    return dout16 ? zk_encoder_backward_b16(dwte, dwpe, dout, tok, B, T, C, V)
                  : zk_encoder_backward(dwte, dwpe, dout, tok, B, T, C, V);
}

/* g_dtype: a 2-byte gradient (zk_adamw_g16: widened as read), else f32 */
/* one segment: p, g, m, v (lp) at its first element */
static void adamw_one(float *p, const void *g, int g_dtype, float *m, float *v, void *lp,
                      int lp_dtype, size_t n, float wd, float lr, float b1, float b2, float eps,
                      float gscale, int t)
{
    int has_lp = lp_dtype == ZT_BF16 || lp_dtype == ZT_F16;
    if (g_dtype != ZT_F32)
        zk_adamw_g16(p, g, g_dtype == ZT_F16, m, v, has_lp ? lp : NULL, lp_dtype == ZT_F16, n, lr,
                     b1, b2, eps, wd, gscale, t);
    else if (has_lp)
        zk_adamw_lp(p, g, m, v, lp, lp_dtype == ZT_F16, n, lr, b1, b2, eps, wd, gscale, t);
    else zk_adamw(p, g, m, v, n, lr, b1, b2, eps, wd, gscale, t);
}

static void cpu_adamw_segments(float *p, const void *g, int g_dtype, float *m, float *v, void *lp,
                               int lp_dtype, const zt_adamw_segs *sg, float lr, float b1,
                               float b2, float eps, float gscale, int t)
{
    size_t gs = g_dtype == ZT_F32 ? 4 : 2;
    for (int s = 0; s < sg->n; s++) {
        int64_t o = sg->off[s];
        adamw_one(p + o, (const char *)g + o * gs, g_dtype, m + o, v + o,
                  lp ? (char *)lp + o * 2 : NULL, lp_dtype, (size_t)sg->len[s], sg->wd[s], lr, b1,
                  b2, eps, gscale, t);
    }
}

/* item after item: each its own op's bits (the update is elementwise) */
static void cpu_adamw_multi(const zt_adamw_item *it, int n, int g_dtype, int lp_dtype, float lr,
                            float b1, float b2, float eps, float gscale, int t)
{
    for (int k = 0; k < n; k++)
        adamw_one(it[k].p, it[k].g, g_dtype, it[k].m, it[k].v, it[k].lp, lp_dtype,
                  (size_t)it[k].n, it[k].wd, lr, b1, b2, eps, gscale, t);
}

/* x_dtype: a 2-byte x (zk_sumsq_blocks_16: widened as read), else f32 */
static void cpu_sumsq_blocks(double *partials, const void *x, int x_dtype, size_t n)
{
    if (x_dtype == ZT_F32) zk_sumsq_blocks(partials, x, n);
    else zk_sumsq_blocks_16(partials, x, x_dtype == ZT_F16, n);
}

static void cpu_sumsq_blocks_many(double *partials, const void *const *x, int x_dtype,
                                  const size_t *n, int count)
{
    for (int i = 0; i < count; i++) {
        cpu_sumsq_blocks(partials, x[i], x_dtype, n[i]);
        partials += (n[i] + ZK_SUM_BLOCK - 1) / ZK_SUM_BLOCK;
    }
}

static void cpu_gelu_forward(void *out, int out16, const void *inp, int in16, size_t n)
{
    if (in16) zk_gelu_forward_bb(out, inp, n);      /* a bf16 inp: bf16 out (ops.c) */
    else if (out16) zk_gelu_forward_b16(out, inp, n);
    else zk_gelu_forward(out, inp, n);
}

static void cpu_gelu_backward(void *dinp, int out16, const void *inp, int in16, const float *dout,
                              size_t n)
{
    if (in16) zk_gelu_backward_bb(dinp, inp, dout, n);
    else if (out16) zk_gelu_backward_b16(dinp, inp, dout, n);
    else zk_gelu_backward(dinp, inp, dout, n);
}

/* bf16 I/O: f32 tiles per thread (kernels.h); their allocation can fail */
static int cpu_attention_forward(void *out, float *lse, const void *qkv, int io16,
                                 int B, int T, int C, int NH, int NKV, int W)
{
    if (!io16) { zk_attention_forward_gqa(out, lse, qkv, B, T, C, NH, NKV, W); return ZT_OK; }
    if (zk_attention_forward_gqa_bb(out, lse, qkv, B, T, C, NH, NKV, W) == 0) return ZT_OK;
    return zt_error(ZT_ENOMEM, "zt_attention_forward: no host memory for the bf16 kernel's f32 "
                    "tiles (%zu bytes a thread)", (size_t)(2 * 32 + 2 * 64) * (C / NH) * sizeof(float));
}

static int cpu_attention_backward(void *dqkv, const void *dout, const void *qkv, const void *out,
                                  const float *lse, int io16, int B, int T, int C, int NH,
                                  int NKV, int W)
{
    if (!io16) {
        zk_attention_backward_gqa(dqkv, dout, qkv, out, lse, B, T, C, NH, NKV, W);
        return ZT_OK;
    }
    if (zk_attention_backward_gqa_bb(dqkv, dout, qkv, out, lse, B, T, C, NH, NKV, W) == 0)
        return ZT_OK;
    return zt_error(ZT_ENOMEM, "zt_attention_backward: no host memory for the bf16 kernel's f32 "
                    "buffers (about %zu bytes a thread: 2 x T x head size floats)",
                    (size_t)2 * T * (C / NH) * sizeof(float));
}

static int cpu_crossentropy(float *losses, void *dlogits, const void *logits,
                            const int32_t *targets, int N, int V, int ld, int bf16, float dscale)
{
    return bf16 ? zk_crossentropy_bf16(losses, dlogits, logits, targets, N, V, ld, dscale)
                : zk_crossentropy(losses, dlogits, logits, targets, N, V, ld, dscale);
}

static void cpu_copy(void *dst, const void *src, size_t nbytes)
{
    if (nbytes % sizeof(float) == 0 && ((uintptr_t)dst | (uintptr_t)src) % 4 == 0)
        zk_copy(dst, src, nbytes / sizeof(float));
    else
        memcpy(dst, src, nbytes);
}

static void cpu_cast(void *dst, int dd, const void *src, int sd, size_t n)
{
    if (dd == sd) { cpu_copy(dst, src, n * zt_dtype_size(dd)); return; }
    if (sd == ZT_F32 && dd == ZT_BF16) zk_cast_f32_bf16(dst, src, n);
    else if (sd == ZT_BF16 && dd == ZT_F32) zk_cast_bf16_f32(dst, src, n);
    else if (sd == ZT_F32 && dd == ZT_F16) zk_cast_f32_f16(dst, src, n);
    else if (sd == ZT_F16 && dd == ZT_F32) zk_cast_f16_f32(dst, src, n);
}

static void cpu_rmsnorm_forward(void *out, int out16, float *rstd, const void *inp, int in16,
                                const void *w_, int p16, float eps, int N, int C)
{
    WIDEN_PARAMS(w_, NULL, C);
    const float *w = wf;
    (void)bf;
    if (in16) zk_rmsnorm_forward_r16(out, rstd, inp, w, eps, N, C);
    else if (out16) zk_rmsnorm_forward_b16(out, rstd, inp, w, eps, N, C);
    else zk_rmsnorm_forward(out, rstd, inp, w, eps, N, C);
}

static void cpu_rmsnorm_backward(void *dinp, uint16_t *dinp16, void *dw, int g16,
                                 const void *dout, const void *inp, int r16, const void *w_,
                                 int p16, const float *rstd, int N, int C)
{
    WIDEN_PARAMS(w_, NULL, C);
    const float *w = wf;
    (void)bf;
    GRADS32(dw, NULL, C);
    (void)db32;
    if (r16) zk_rmsnorm_backward_r16(dinp, dw32, dout, inp, w, rstd, N, C);
    else zk_rmsnorm_backward_b16(dinp, dinp16, dw32, dout, inp, w, rstd, N, C);
    GRADS16(dw, NULL, C);
}

static void cpu_rope(void *x, int x16, int N, int T, int ld, int nh, int hs, const float *cos_t,
                     const float *sin_t, int pos0, int dir)
{
    if (x16 && dir > 0) zk_rope_forward_b16(x, N, T, ld, nh, hs, cos_t, sin_t, pos0);
    else if (x16) zk_rope_backward_b16(x, N, T, ld, nh, hs, cos_t, sin_t, pos0);
    else if (dir > 0) zk_rope_forward(x, N, T, ld, nh, hs, cos_t, sin_t, pos0);
    else zk_rope_backward(x, N, T, ld, nh, hs, cos_t, sin_t, pos0);
}

static void cpu_swiglu_forward(void *out, const void *gu, int io16, int N, int F)
{
    if (io16) zk_swiglu_forward_bb(out, gu, N, F);
    else zk_swiglu_forward(out, gu, N, F);
}

static void cpu_swiglu_backward(void *dgu, const void *dout, const void *gu, int io16, int N,
                                int F)
{
    if (io16) zk_swiglu_backward_bb(dgu, dout, gu, N, F);
    else zk_swiglu_backward(dgu, dout, gu, N, F);
}

const zt_device_ops zt_cpu_device = {
    .name = "cpu",
    .sync = cpu_sync,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .fill = zk_fill,
    .copy = cpu_copy,
    .scale = zk_scale,
    .axpy = zk_axpy,
    .add = cpu_add,
    .add3 = cpu_add3,
    .cast = cpu_cast,
    .encoder_forward = cpu_encoder_forward,
    .encoder_backward = cpu_encoder_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_residual_forward = cpu_layernorm_residual_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope = cpu_rope,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .matmul_bf16_forward = cpu_matmul_bf16_forward,
    .matmul_bf16_backward = cpu_matmul_bf16_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .attention_decode = zk_attention_decode_gqa,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .crossentropy = cpu_crossentropy,
    .adamw = zk_adamw,
    .adamw_segments = cpu_adamw_segments,
    .adamw_multi = cpu_adamw_multi,
    .sumsq_blocks_many = cpu_sumsq_blocks_many,
    .sumsq_blocks = cpu_sumsq_blocks,
    .sum = zk_sum_f64,
    .randn = zk_randn,
};

/* device_cuda.c, linked in a `make CUDA=1` build only: weak references,
 * NULL in a CPU build, so this object is the same in both builds (no
 * #ifdef ZT_CUDA: a CPU build and a CUDA build differ by what they link). */
extern const zt_device_ops zt_cuda_device __attribute__((weak));
int zt_cuda_init(void) __attribute__((weak));
int zt_cuda_attention_mode(int mode) __attribute__((weak));
const char *zt_cuda_model(void) __attribute__((weak));
static int have_cuda(void) { return &zt_cuda_device != NULL && zt_cuda_init != NULL; }

static const zt_device_ops *active = &zt_cpu_device;
static int nthreads = 0;

const zt_device_ops *zt_dev(void) { return active; }

int zt_device_init(const char *backend)
{
    ZT_CHECK(backend != NULL, "zt_device_init: backend is NULL");
    if (strcmp(backend, "cpu") == 0) { active = &zt_cpu_device; return ZT_OK; }
    /* device_fakegpu.c: the CPU kernels behind memory the host cannot address (tests) */
    if (strcmp(backend, "fakegpu") == 0) { active = &zt_fakegpu_device; return ZT_OK; }
    /* device_fakegpu_async.c: the same, with streams that run later in a
     * seeded order a GPU permits (a missing wait gives wrong bits) */
    if (strncmp(backend, "fakegpu-async", 13) == 0 && (backend[13] == 0 || backend[13] == ':')) {
        char *end = NULL;
        const char *d = backend + 14;
        errno = 0;
        unsigned long long seed = backend[13] ? strtoull(d, &end, 10) : 1;
        if (backend[13] && (*d < '0' || *d > '9' || *end || errno == ERANGE))
            return zt_error(ZT_EINVAL, "zt_device_init(\"%s\"): the seed after \"fakegpu-async:\" "
                            "must be a whole number, e.g. fakegpu-async:7", backend);
        zt_fakegpu_async_seed(seed);
        active = &zt_fakegpu_async_device;
        return ZT_OK;
    }
    if (strcmp(backend, "cuda") == 0) {
        if (!have_cuda())
            return zt_error(ZT_EINVAL, "zt_device_init(\"cuda\"): built without CUDA: rebuild with "
                            "make CUDA=1 (or use the cpu backend)");
        ZT_TRY(zt_cuda_init());             /* device_cuda.c: GPU, stream, cuBLAS */
        active = &zt_cuda_device;
        return ZT_OK;
    }
    return zt_error(ZT_EINVAL, "zt_device_init(\"%s\"): unknown device backend; known: cpu, cuda, "
                    "fakegpu and fakegpu-async[:SEED] (test devices)", backend);
}

void zt_device_install(const zt_device_ops *dev) { active = dev ? dev : &zt_cpu_device; }

const char *zt_device_name(void) { return active->name; }

const char *zt_device_model(void)
{
    if (have_cuda() && active == &zt_cuda_device && zt_cuda_model) return zt_cuda_model();
    return "";
}

int zt_device_attention(const char *mode)
{
    ZT_CHECK(mode != NULL, "zt_device_attention: mode is NULL");
    int bf16 = strcmp(mode, "bf16") == 0;
    if (!bf16 && strcmp(mode, "exact") != 0)
        return zt_error(ZT_EINVAL, "zt_device_attention(\"%s\"): known: exact, bf16 (tensor cores, "
                        "the cuda device)", mode);
    if (have_cuda() && active == &zt_cuda_device) {
        int m = zt_cuda_attention_mode(bf16);
        return m < 0 ? m : ZT_OK;
    }
    if (bf16)
        return zt_error(ZT_EINVAL, "zt_device_attention(\"bf16\"): the tensor-core attention is a "
                        "CUDA kernel and the active device is %s: use \"exact\", or the cuda "
                        "device (zt_device_init) in a make CUDA=1 build", active->name);
    return ZT_OK;
}

int zt_device_sync(void) { return active->sync(); }

int64_t zt_device_count(const char *what)
{
    ZT_CHECK(what != NULL, "zt_device_count: what is NULL");
    if (strcmp(what, "attention_tc") == 0)
        return active->attention_tc_calls ? active->attention_tc_calls() : 0;
    if (strcmp(what, "host_waits") == 0)
        return active->host_waits ? active->host_waits() : 0;
    if (strcmp(what, "host_wait_us") == 0)
        return active->host_wait_ns ? active->host_wait_ns() / 1000 : 0;
    return zt_error(ZT_EINVAL, "zt_device_count: \"%s\" is not counted; known: attention_tc, "
                    "host_waits, host_wait_us", what);
}

int zt_set_threads(int n)
{
    ZT_CHECK(n >= 1 && n <= 1024, "threads must be in 1..1024, got %d", n);
    omp_set_num_threads(n);     /* OpenMP only: OpenBLAS stays at 1 (see top) */
    nthreads = n;
    return ZT_OK;
}

int zt_get_threads(void) { return nthreads ? nthreads : omp_get_max_threads(); }

const char *zt_blas_info(void)
{
    static char buf[256];
    snprintf(buf, sizeof buf, "OpenBLAS core %s (%s)", openblas_get_corename(),
             openblas_get_config());
    return buf;
}

const char *zt_matmul_bf16_info(void)
{
    return zk_bf16_info();     /* AMX, AVX512_BF16 or portable, and why not AMX */
}

double zt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *zt_version(void) { return "ztrain 0.1.0"; }
