/*
 * device_fakegpu.c -- a GPU stand-in on the CPU, for tests: the CPU kernels
 * behind device memory that the host cannot address.
 *
 * `device.backend = "fakegpu"` (zt_device_init("fakegpu")). Device memory is
 * host memory whose pointer carries a tag (bit 62 set: a non-canonical
 * x86-64 address), so code that reads or writes device-tier bytes on the
 * host, instead of through the device table, faults at once -- as on a
 * GPU, where such a read gets garbage or a fault and a CPU run would never
 * notice. Every op here clears the tag and runs zt_cpu_device's op, so a
 * training run has the CPU's bits exactly: equal digests with
 * device.backend=cpu say the trainer, the strategies and the runtime keep
 * to the host/device boundary a GPU needs (spec/e2e/fakegpu_spec.lua). copy
 * takes host or device pointers on either side (cudaMemcpyDefault's
 * contract). Nothing is asynchronous: ordering bugs between streams still
 * need a GPU (or the fake-CUDA tests, docs/gpu.md).
 */
#include <stdint.h>
#include "internal.h"

#define TAG ((uintptr_t)1 << 62)

static void *tag(void *p) { return p ? (void *)((uintptr_t)p | TAG) : NULL; }
/* host pointers (copy's other side, sumsq's partials) pass unchanged */
static void *un(const void *p) { return (void *)((uintptr_t)p & ~TAG); }
#define F(p) ((float *)un(p))
#define CF(p) ((const float *)un(p))
#define CPU zt_cpu_device

static int fg_sync(void) { return CPU.sync(); }

static int fg_alloc(void **out, size_t nbytes)
{
    void *p = NULL;
    int rc = CPU.alloc(&p, nbytes);
    if (rc == ZT_OK) *out = tag(p);
    return rc;
}

static void fg_free(void *p) { CPU.free(un(p)); }
static void fg_zero(void *p, size_t n) { CPU.zero(un(p), n); }
static void fg_fill(float *x, float v, size_t n) { CPU.fill(F(x), v, n); }
static void fg_copy(void *dst, const void *src, size_t n) { CPU.copy(un(dst), un(src), n); }
static void fg_scale(float *x, float a, size_t n) { CPU.scale(F(x), a, n); }
static void fg_axpy(float *y, float a, const float *x, size_t n) { CPU.axpy(F(y), a, CF(x), n); }
static void fg_add(float *y, const void *x, int xd, size_t n) { CPU.add(F(y), un(x), xd, n); }
static void fg_add3(void *o, const void *a, const void *b, int r16, size_t n)
{
    CPU.add3(un(o), un(a), un(b), r16, n);
}

static void fg_cast(void *dst, int dt, const void *src, int st, size_t n)
{
    CPU.cast(un(dst), dt, un(src), st, n);
}

static int fg_encoder_forward(void *out, int out16, const int32_t *tok, const void *wte,
                              const void *wpe, int w16, int B, int T, int C, int V)
{
    return CPU.encoder_forward(un(out), out16, un(tok), un(wte), un(wpe), w16, B, T, C, V);
}

static int fg_encoder_backward(void *dwte, void *dwpe, int g16, const void *dout, int dout16,
                               const int32_t *tok, int B, int T, int C, int V)
{
    return CPU.encoder_backward(un(dwte), un(dwpe), g16, un(dout), dout16, un(tok), B, T, C, V);
}

static void fg_layernorm_forward(void *out, int out16, float *mean, float *rstd, const void *inp,
                                 int in16, const void *w, const void *b, int p16, int N, int C)
{
    CPU.layernorm_forward(un(out), out16, F(mean), F(rstd), un(inp), in16, un(w), un(b), p16, N,
                          C);
}

static void fg_layernorm_backward(void *dinp, uint16_t *dinp16, void *dw, void *db, int g16,
                                  const void *dout, const void *inp, int r16, const void *w,
                                  int p16, const float *mean, const float *rstd, int N, int C)
{
    CPU.layernorm_backward(un(dinp), un(dinp16), un(dw), un(db), g16, un(dout), un(inp), r16, un(w),
                           p16, CF(mean), CF(rstd), N, C);
}

static int fg_matmul_forward(float *out, const float *inp, const float *w, const float *b,
                             int N, int C, int OC, int ldo)
{
    return CPU.matmul_forward(F(out), CF(inp), CF(w), CF(b), N, C, OC, ldo);
}

static int fg_matmul_backward(float *dinp, float *dw, float *db, const float *dout,
                              const float *inp, const float *w, int N, int C, int OC, int ldo)
{
    return CPU.matmul_backward(F(dinp), F(dw), F(db), CF(dout), CF(inp), CF(w), N, C, OC, ldo);
}

static int fg_matmul_bf16_forward(void *out, int out_bf16, const uint16_t *inp,
                                  const uint16_t *w, const void *b, int b16, int N, int C, int OC,
                                  int ldo)
{
    return CPU.matmul_bf16_forward(un(out), out_bf16, un(inp), un(w), un(b), b16, N, C, OC, ldo);
}

static int fg_matmul_bf16_backward(void *dinp, int dinp16, void *dw, void *db, int g16,
                                   const uint16_t *dout, const uint16_t *inp, const uint16_t *w,
                                   int N, int C, int OC, int ldo)
{
    return CPU.matmul_bf16_backward(un(dinp), dinp16, un(dw), un(db), g16, un(dout), un(inp), un(w),
                                    N, C, OC, ldo);
}

static int fg_attention_forward(void *out, float *lse, const void *qkv, int io16,
                                int B, int T, int C, int NH, int NKV, int W)
{
    return CPU.attention_forward(un(out), F(lse), un((void *)qkv), io16, B, T, C, NH, NKV, W);
}

static int fg_attention_backward(void *dqkv, const void *dout, const void *qkv, const void *out,
                                 const float *lse, int io16, int B, int T, int C, int NH,
                                 int NKV, int W)
{
    return CPU.attention_backward(un(dqkv), un((void *)dout), un((void *)qkv), un((void *)out), CF(lse),
                                  io16, B, T, C, NH, NKV, W);
}

static void fg_attention_decode(float *out, float *kc, float *vc, const float *qkv,
                                int B, int T, int C, int NH, int NKV, int W, int maxT,
                                int pos)
{
    CPU.attention_decode(F(out), F(kc), F(vc), CF(qkv), B, T, C, NH, NKV, W, maxT, pos);
}

static void fg_layernorm_residual_forward(void *resid, void *out, int out16, float *mean,
                                          float *rstd, const void *a, const void *b, int r16,
                                          const void *w, const void *bias, int p16, int N, int C)
{
    CPU.layernorm_residual_forward(un(resid), un(out), out16, F(mean), F(rstd), un(a), un(b), r16,
                                   un(w), un(bias), p16, N, C);
}

static void fg_adamw_segments(float *p, const void *g, int g_dtype, float *m, float *v, void *lp,
                              int lp_dtype, const zt_adamw_segs *sg, float lr, float b1,
                              float b2, float eps, float gscale, int t)
{
    CPU.adamw_segments(F(p), un(g), g_dtype, F(m), F(v), un(lp), lp_dtype, sg, lr, b1, b2, eps,
                       gscale, t);
}

/* the items' pointers untagged into a copy (the caller's stay as they are) */
static void fg_adamw_multi(const zt_adamw_item *it, int n, int g_dtype, int lp_dtype, float lr,
                           float b1, float b2, float eps, float gscale, int t)
{
    zt_adamw_item one;
    for (int k = 0; k < n; k++) {
        one = (zt_adamw_item){ F(it[k].p), un(it[k].g), F(it[k].m), F(it[k].v), un(it[k].lp),
                               it[k].n, it[k].wd };
        CPU.adamw_multi(&one, 1, g_dtype, lp_dtype, lr, b1, b2, eps, gscale, t);
    }
}

static void fg_gelu_forward(void *out, int out16, const void *inp, int in16, size_t n)
{
    CPU.gelu_forward(un(out), out16, un((void *)inp), in16, n);
}

static void fg_gelu_backward(void *dinp, int out16, const void *inp, int in16, const float *dout,
                             size_t n)
{
    CPU.gelu_backward(un(dinp), out16, un((void *)inp), in16, CF(dout), n);
}

static int fg_crossentropy(float *losses, void *dlogits, const void *logits,
                           const int32_t *targets, int N, int V, int ld, int bf16, float dscale)
{
    return CPU.crossentropy(F(losses), un(dlogits), un(logits), un(targets), N, V, ld, bf16, dscale);
}

static void fg_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                     float b2, float eps, float wd, float gscale, int t)
{
    CPU.adamw(F(p), CF(g), F(m), F(v), n, lr, b1, b2, eps, wd, gscale, t);
}

/* partials are the caller's host array, as on CUDA */
static void fg_sumsq_blocks(double *partials, const void *x, int xd, size_t n)
{
    CPU.sumsq_blocks(partials, un(x), xd, n);
}
static void fg_sumsq_blocks_many(double *partials, const void *const *x, int xd, const size_t *n,
                                 int count)
{
    for (int i = 0; i < count; i++) {
        CPU.sumsq_blocks(partials, un(x[i]), xd, n[i]);
        partials += (n[i] + (size_t)zt_sum_block() - 1) / (size_t)zt_sum_block();
    }
}
static double fg_sum(const float *x, size_t n) { return CPU.sum(CF(x), n); }

static void fg_randn(float *x, size_t n, uint64_t seed, uint64_t stream, float mean, float std)
{
    CPU.randn(F(x), n, seed, stream, mean, std);
}

static void fg_rmsnorm_forward(void *out, int out16, float *rstd, const void *inp, int in16,
                               const void *w, int p16, float eps, int N, int C)
{
    CPU.rmsnorm_forward(un(out), out16, F(rstd), un(inp), in16, un(w), p16, eps, N, C);
}
static void fg_rmsnorm_backward(void *dinp, uint16_t *dinp16, void *dw, int g16,
                                const void *dout, const void *inp, int r16, const void *w,
                                int p16, const float *rstd, int N, int C)
{
    CPU.rmsnorm_backward(un(dinp), un(dinp16), un(dw), g16, un(dout), un(inp), r16, un(w), p16, CF(rstd),
                         N, C);
}
static void fg_rope(void *x, int x16, int N, int T, int ld, int nh, int hs, const float *cos_t,
                    const float *sin_t, int pos0, int dir)
{
    CPU.rope(un(x), x16, N, T, ld, nh, hs, CF(cos_t), CF(sin_t), pos0, dir);
}
static void fg_swiglu_forward(void *out, const void *gu, int io16, int N, int F_)
{
    CPU.swiglu_forward(un(out), un(gu), io16, N, F_);
}
static void fg_swiglu_backward(void *dgu, const void *dout, const void *gu, int io16, int N,
                               int F_)
{
    CPU.swiglu_backward(un(dgu), un(dout), un(gu), io16, N, F_);
}

const zt_device_ops zt_fakegpu_device = {
    .name = "fakegpu",
    .sync = fg_sync, .alloc = fg_alloc, .free = fg_free, .zero = fg_zero, .fill = fg_fill,
    .copy = fg_copy, .scale = fg_scale, .axpy = fg_axpy, .add = fg_add, .add3 = fg_add3,
    .cast = fg_cast,
    .encoder_forward = fg_encoder_forward, .encoder_backward = fg_encoder_backward,
    .layernorm_forward = fg_layernorm_forward, .layernorm_backward = fg_layernorm_backward,
    .layernorm_residual_forward = fg_layernorm_residual_forward,
    .rmsnorm_forward = fg_rmsnorm_forward, .rmsnorm_backward = fg_rmsnorm_backward,
    .rope = fg_rope, .swiglu_forward = fg_swiglu_forward, .swiglu_backward = fg_swiglu_backward,
    .matmul_forward = fg_matmul_forward, .matmul_backward = fg_matmul_backward,
    .matmul_bf16_forward = fg_matmul_bf16_forward, .matmul_bf16_backward = fg_matmul_bf16_backward,
    .attention_forward = fg_attention_forward, .attention_backward = fg_attention_backward,
    .attention_decode = fg_attention_decode,
    .gelu_forward = fg_gelu_forward, .gelu_backward = fg_gelu_backward,
    .crossentropy = fg_crossentropy, .adamw = fg_adamw, .adamw_segments = fg_adamw_segments,
    .adamw_multi = fg_adamw_multi,
    .sumsq_blocks = fg_sumsq_blocks, .sumsq_blocks_many = fg_sumsq_blocks_many,
    .sum = fg_sum, .randn = fg_randn,
};
