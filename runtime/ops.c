/*
 * ops.c -- tensor-level ops: validate shapes, dtypes and tiers, then issue
 * the raw kernel to the active device. Validation lives here, once, so
 * kernels can trust their sizes and a bad call from Lua becomes a clear error
 * instead of a crash.
 *
 * Tier discipline: an op's operands live on one tier (device or host; nvme
 * bytes are not addressable), and moving bytes between tiers is an explicit
 * zt_copy_async. On the CPU backend every tier is ordinary memory, so a
 * mixed-tier op would silently work here and break on a GPU: it is refused.
 * The host never reads operand bytes here (token ids included: the kernels
 * count bad ids and the op reports them).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include "internal.h"
#include "../kernels/cpu/kernels.h"

/* "f32 [4,64,768]" */
static const char *desc(const zt_tensor *t, char *buf, size_t n) { return zt_describe(t, buf, n); }

static int need(const char *op, const char *name, const zt_tensor *t, int dtype)
{
    char b[96];
    if (!t) return zt_error(ZT_EINVAL, "%s: %s is NULL (freed tensor?)", op, name);
    if (t->dtype != dtype)
        return zt_error(ZT_EINVAL, "%s: %s must be %s, got %s", op, name,
                        zt_dtype_name(dtype), desc(t, b, sizeof b));
    return ZT_OK;
}

static int need_numel(const char *op, const char *name, const zt_tensor *t,
                      int dtype, int64_t numel, const char *shape_hint)
{
    char b[96];
    ZT_TRY(need(op, name, t, dtype));
    if (t->numel != numel)
        return zt_error(ZT_EINVAL, "%s: %s must hold %lld elements %s, got %s", op, name,
                        (long long)numel, shape_hint, desc(t, b, sizeof b));
    return ZT_OK;
}

static int64_t last_dim(const zt_tensor *t) { return t->shape[t->ndim - 1]; }

/* A backward's parameter gradients (a, b: NULL where not computed): f32,
 * or all bf16 (*g16: a bf16 run's stored gradients, written by the op,
 * each element the f32 one rounded once), never a mix. */
static int grads_dtype(const char *op, const zt_tensor *a, const zt_tensor *b, int *g16)
{
    const zt_tensor *t = a ? a : b;
    *g16 = t != NULL && t->dtype == ZT_BF16;
    ZT_CHECK(!a || !b || a->dtype == b->dtype, "%s: the parameter gradients must share one "
             "dtype (f32, or bf16: a bf16 run's stored gradients), got %s and %s", op,
             zt_dtype_name(a->dtype), zt_dtype_name(b->dtype));
    return ZT_OK;
}

/* The residual stream's tensors: f32, or bf16 (bf16 activations end to
 * end: "r16" in the device table). t must be one of the two; *r16 says
 * which. */
static int need_stream(const char *op, const char *name, const zt_tensor *t, int *r16)
{
    ZT_TRY(need(op, name, t, t && t->dtype == ZT_BF16 ? ZT_BF16 : ZT_F32));
    *r16 = t->dtype == ZT_BF16;
    return ZT_OK;
}

/* The CPU's bf16-stream norms widen a row (and its gradient) on the
 * thread's stack: a bound on C keeps that to 128 KiB (ZT_R16_MAX_C:
 * internal.h) */
static int r16_width(const char *op, int r16, int64_t C)
{
    ZT_CHECK(!r16 || C <= ZT_R16_MAX_C, "%s: a bf16 residual stream of %lld channels is past "
             "the %d the CPU kernels take; run this model with an fp32 stream (the bf16 GEMMs "
             "off: the bf16 weights are kept)", op, (long long)C, ZT_R16_MAX_C);
    return ZT_OK;
}

/* A norm's weight (named `name`): f32, or bf16 (*p16: a bf16 run's stored
 * parameters, which the kernels widen as they read them). The CPU widens a
 * bf16 weight and bias on the caller's stack, so C is bounded as above
 * (checked on every device: the path must not depend on it). */
static int need_param(const char *op, const char *name, const zt_tensor *w, int *p16)
{
    ZT_TRY(need(op, name, w, w && w->dtype == ZT_BF16 ? ZT_BF16 : ZT_F32));
    *p16 = w->dtype == ZT_BF16;
    ZT_CHECK(!*p16 || w->numel <= ZT_R16_MAX_C, "%s: a bf16 %s of %lld channels is past the "
             "%d the CPU kernels take; run this model with the bf16 GEMMs off (its parameters "
             "are then widened to f32 before the op), or pass an f32 %s", op, name,
             (long long)w->numel, ZT_R16_MAX_C, name);
    return ZT_OK;
}

/* whether two tensors' bytes overlap (views of one storage) */
static int overlaps(const zt_tensor *x, const zt_tensor *y)
{
    if (x->storage != y->storage) return 0;
    size_t sx = zt_dtype_size(x->dtype), sy = zt_dtype_size(y->dtype);
    uintptr_t x0 = (uintptr_t)x->data, x1 = x0 + (size_t)x->numel * sx;
    uintptr_t y0 = (uintptr_t)y->data, y1 = y0 + (size_t)y->numel * sy;
    return x0 < y1 && y0 < x1;
}

int64_t zt_padded_cols(int64_t n) { return (n + ZK_COL_PAD - 1) / ZK_COL_PAD * ZK_COL_PAD; }

/* t is N rows of OC: N*OC elements (any shape), or padded rows (last dim
 * zt_padded_cols(OC), N*that elements); their stride to *ld */
static int need_rows(const char *op, const char *name, const zt_tensor *t, int dtype,
                     int64_t N, int64_t OC, const char *hint, int64_t *ld)
{
    char b[96];
    ZT_TRY(need(op, name, t, dtype));
    int64_t pad = zt_padded_cols(OC);
    *ld = OC;
    if (t->numel == N * OC) return ZT_OK;
    *ld = pad;
    if (last_dim(t) == pad && t->numel == N * pad) return ZT_OK;
    return zt_error(ZT_EINVAL, "%s: %s must be %s: %lld rows of %lld (or rows padded to %lld), "
                    "got %s", op, name, hint, (long long)N, (long long)OC, (long long)pad,
                    desc(t, b, sizeof b));
}

/* ready(&dev, op, "name", tensor, ..., NULL): every non-NULL operand is on
 * one addressable tier, the calling thread's stream has finished its earlier
 * work (stream order), and dev is the table to issue to: the CPU device for
 * host-tier operands, the active device for the device tier (zt_tier_enter).
 * Call after the shape checks, right before issuing. */
static int ready(const zt_device_ops **dev, const char *op, ...)
{
    const char *first_name = NULL;
    const zt_tensor *first = NULL;
    va_list ap;
    va_start(ap, op);
    for (const char *name; (name = va_arg(ap, const char *)) != NULL;) {
        const zt_tensor *t = va_arg(ap, const zt_tensor *);
        if (t == NULL) continue;
        char a[96], b[96];
        int tier = t->storage->tier;
        if (tier == ZT_TIER_NVME) {
            va_end(ap);
            return zt_error(ZT_EINVAL, "%s: %s (%s) is on the nvme tier, whose bytes are not "
                            "addressable; copy it to host or device first", op, name,
                            zt_describe(t, a, sizeof a));
        }
        if (first == NULL) { first = t; first_name = name; continue; }
        if (tier != first->storage->tier) {
            va_end(ap);
            return zt_error(ZT_EINVAL, "%s: %s (%s on %s) and %s (%s on %s) are on different "
                            "tiers; an op's operands must share one tier: copy one with "
                            "zt_copy_async first", op, first_name,
                            zt_describe(first, a, sizeof a),
                            zt_tier_name(first->storage->tier), name,
                            zt_describe(t, b, sizeof b), zt_tier_name(tier));
        }
    }
    va_end(ap);
    return zt_tier_enter(first ? first->storage->tier : ZT_TIER_DEVICE, dev);
}

/* A kernel skipped `bad` token ids outside [0,V): a clear error, never a
 * wild read (zt_bad_tokens_error, error.c). */
static int bad_tokens(const char *op, const char *what, int bad, int64_t n, int64_t V)
{
    if (bad == 0) return ZT_OK;
    if (bad < 0) return bad;    /* a device error (CUDA), its message already set */
    return zt_bad_tokens_error(op, what, bad, n, V, 0);
}

int zt_fill(zt_tensor *x, float v)
{
    int r16 = 0;
    ZT_TRY(need_stream("zt_fill", "x", x, &r16));
    ZT_CHECK(!r16 || v == 0.0f, "zt_fill: a bf16 tensor is filled with 0 only (got %g); fill "
             "an f32 tensor and cast it", (double)v);
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, "zt_fill", "x", x, NULL));
    if (r16) dev->zero(x->data, (size_t)x->numel * 2);
    else dev->fill(x->data, v, (size_t)x->numel);
    return ZT_OK;
}

int zt_copy(zt_tensor *dst, const zt_tensor *src)
{
    ZT_CHECK(dst && src, "zt_copy: NULL tensor");
    ZT_TRY(need_numel("zt_copy", "dst", dst, src->dtype, src->numel, "(same as src)"));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, "zt_copy", "dst", dst, "src", src, NULL));
    dev->copy(dst->data, src->data, (size_t)src->numel * zt_dtype_size(src->dtype));
    return ZT_OK;
}

int zt_scale(zt_tensor *x, float a)
{
    ZT_TRY(need("zt_scale", "x", x, ZT_F32));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, "zt_scale", "x", x, NULL));
    dev->scale(x->data, a, (size_t)x->numel);
    return ZT_OK;
}

int zt_axpy(zt_tensor *y, float a, const zt_tensor *x)
{
    ZT_TRY(need("zt_axpy", "x", x, ZT_F32));
    ZT_TRY(need_numel("zt_axpy", "y", y, ZT_F32, x->numel, "(same as x)"));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, "zt_axpy", "y", y, "x", x, NULL));
    dev->axpy(y->data, a, x->data, (size_t)x->numel);
    return ZT_OK;
}

int zt_add(zt_tensor *y, const zt_tensor *x)
{
    /* x f32, or a 2-byte x (a bf16 or fp16 run's stored gradient into its
     * fp32 accumulator), widened as read */
    ZT_TRY(need("zt_add", "x", x, x && (x->dtype == ZT_BF16 || x->dtype == ZT_F16) ? x->dtype
                                                                                : ZT_F32));
    ZT_TRY(need_numel("zt_add", "y", y, ZT_F32, x->numel, "(same as x, f32)"));
    /* (a 2-byte x cannot share y's bytes: views keep their base's dtype) */
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, "zt_add", "y", y, "x", x, NULL));
    dev->add(y->data, x->data, x->dtype, (size_t)x->numel);
    return ZT_OK;
}

int zt_add3(zt_tensor *out, const zt_tensor *a, const zt_tensor *b)
{
    int r16 = 0;
    ZT_TRY(need_stream("zt_add3", "a", a, &r16));
    int dt = r16 ? ZT_BF16 : ZT_F32;
    ZT_TRY(need_numel("zt_add3", "b", b, dt, a->numel, "(same as a, and a's dtype)"));
    ZT_TRY(need_numel("zt_add3", "out", out, dt, a->numel, "(same as a, and a's dtype)"));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, "zt_add3", "out", out, "a", a, "b", b, NULL));
    dev->add3(out->data, a->data, b->data, r16, (size_t)a->numel);
    return ZT_OK;
}

int zt_cast(zt_tensor *dst, const zt_tensor *src)
{
    ZT_CHECK(dst && src, "zt_cast: NULL tensor");
    ZT_CHECK(dst->numel == src->numel, "zt_cast: dst has %lld elements, src %lld",
             (long long)dst->numel, (long long)src->numel);
    int ok = dst->dtype == src->dtype ||
             (src->dtype == ZT_F32 && (dst->dtype == ZT_BF16 || dst->dtype == ZT_F16)) ||
             (dst->dtype == ZT_F32 && (src->dtype == ZT_BF16 || src->dtype == ZT_F16));
    ZT_CHECK(ok, "zt_cast: no cast from %s to %s (supported: f32 <-> bf16, f32 <-> f16)",
             zt_dtype_name(src->dtype), zt_dtype_name(dst->dtype));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, "zt_cast", "dst", dst, "src", src, NULL));
    dev->cast(dst->data, dst->dtype, src->data, src->dtype, (size_t)src->numel);
    return ZT_OK;
}

int zt_encoder_forward(zt_tensor *out, const zt_tensor *tokens, const zt_tensor *wte,
                       const zt_tensor *wpe)
{
    const char *op = "zt_encoder_forward";
    ZT_TRY(need(op, "tokens", tokens, ZT_I32));
    /* fp32 tables, or bf16 ones (a bf16 run's stored parameters), both alike */
    ZT_TRY(need(op, "wte", wte, wte && wte->dtype == ZT_BF16 ? ZT_BF16 : ZT_F32));
    int w16 = wte->dtype == ZT_BF16;
    if (wpe) ZT_TRY(need(op, "wpe", wpe, wte->dtype));
    ZT_CHECK(tokens->ndim == 2, "%s: tokens must be (B,T)", op);
    ZT_CHECK(wte->ndim == 2 && (!wpe || (wpe->ndim == 2 && wte->shape[1] == wpe->shape[1])),
             "%s: wte (V,C) and wpe (maxT,C) must be 2-D with equal C", op);
    int64_t B = tokens->shape[0], T = tokens->shape[1], C = wte->shape[1];
    ZT_CHECK(!wpe || T <= wpe->shape[0], "%s: tokens' sequence length T = %lld exceeds wpe's "
             "%lld positions (the model's context); pass shorter sequences", op, (long long)T,
             wpe ? (long long)wpe->shape[0] : 0LL);
    int out16 = out != NULL && out->dtype == ZT_BF16;   /* a bf16 residual stream's */
    ZT_TRY(need_numel(op, "out", out, out16 ? ZT_BF16 : ZT_F32, B * T * C, "(B,T,C) f32 or bf16"));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "out", out, "tokens", tokens, "wte", wte, "wpe", wpe, NULL));
    int64_t V = wte->shape[0];
    int bad = dev->encoder_forward(out->data, out16, tokens->data, wte->data,
                                   wpe ? wpe->data : NULL, w16, (int)B, (int)T, (int)C, (int)V);
    return bad_tokens(op, "tokens", bad, B * T, V);
}

int zt_encoder_backward(zt_tensor *dwte, zt_tensor *dwpe, const zt_tensor *dout,
                        const zt_tensor *tokens)
{
    const char *op = "zt_encoder_backward";
    ZT_TRY(need(op, "tokens", tokens, ZT_I32));
    int g16 = 0;   /* bf16: a bf16 run's stored gradients */
    ZT_CHECK(dwte != NULL, "%s: dwte is NULL (freed tensor?)", op);
    ZT_TRY(grads_dtype(op, dwte, dwpe, &g16));
    ZT_TRY(need(op, "dwte", dwte, g16 ? ZT_BF16 : ZT_F32));
    ZT_CHECK(tokens->ndim == 2 && dwte->ndim == 2 && (!dwpe || dwpe->ndim == 2),
             "%s: tokens (B,T), dwte (V,C), dwpe (maxT,C) must be 2-D", op);
    int64_t B = tokens->shape[0], T = tokens->shape[1], V = dwte->shape[0], C = dwte->shape[1];
    ZT_CHECK(!dwpe || (dwpe->shape[1] == C && T <= dwpe->shape[0]), "%s: dwpe shape mismatch", op);
    int d16 = dout != NULL && dout->dtype == ZT_BF16;   /* a bf16 residual gradient */
    ZT_TRY(need_numel(op, "dout", dout, d16 ? ZT_BF16 : ZT_F32, B * T * C, "(B,T,C) f32 or bf16"));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "dwte", dwte, "dwpe", dwpe, "dout", dout, "tokens", tokens, NULL));
    int bad = dev->encoder_backward(dwte->data, dwpe ? dwpe->data : NULL, g16, dout->data, d16,
                                    tokens->data, (int)B, (int)T, (int)C, (int)V);
    return bad_tokens(op, "tokens", bad, B * T, V);
}

/* A layer norm forward's operands: weight, bias (C) f32 or both bf16
 * (*p16), the input (named
 * `in_name`, (N,C) f32 or bf16: *in16, the bf16 residual stream's), out
 * (N,C) f32 or bf16 (*out16; bf16 when the input is), mean, rstd (N). */
static int ln_forward_dims(const char *op, const char *in_name, const zt_tensor *inp,
                           const zt_tensor *w, const zt_tensor *b, const zt_tensor *out,
                           const zt_tensor *mean, const zt_tensor *rstd, int64_t *N, int64_t *C,
                           int *out16, int *in16, int *p16)
{
    ZT_TRY(need_param(op, "weight", w, p16));
    *C = w->numel;
    ZT_TRY(need_numel(op, "bias", b, w->dtype, *C, "(C), the weight's dtype"));
    ZT_TRY(need_stream(op, in_name, inp, in16));
    ZT_CHECK(last_dim(inp) == *C, "%s: %s's last dim must be C=%lld", op, in_name, (long long)*C);
    ZT_TRY(r16_width(op, *in16, *C));
    *N = inp->numel / *C;
    *out16 = out != NULL && out->dtype == ZT_BF16;
    ZT_CHECK(!*in16 || out == NULL || *out16, "%s: a bf16 %s takes a bf16 out (a bf16 stream "
             "feeds bf16 GEMMs)", op, in_name);
    ZT_TRY(need_numel(op, "out", out, *out16 ? ZT_BF16 : ZT_F32, *N * *C, "(N,C) f32 or bf16"));
    ZT_TRY(need_numel(op, "mean", mean, ZT_F32, *N, "(N)"));
    ZT_TRY(need_numel(op, "rstd", rstd, ZT_F32, *N, "(N)"));
    return ZT_OK;
}

int zt_layernorm_forward(zt_tensor *out, zt_tensor *mean, zt_tensor *rstd,
                         const zt_tensor *inp, const zt_tensor *w, const zt_tensor *b)
{
    const char *op = "zt_layernorm_forward";
    int64_t N = 0, C = 0;
    int out16 = 0, in16 = 0, p16 = 0;
    ZT_TRY(ln_forward_dims(op, "inp", inp, w, b, out, mean, rstd, &N, &C, &out16, &in16, &p16));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "out", out, "mean", mean, "rstd", rstd, "inp", inp, "weight", w,
                 "bias", b, NULL));
    dev->layernorm_forward(out->data, out16, mean->data, rstd->data, inp->data, in16, w->data,
                           b->data, p16, (int)N, (int)C);
    return ZT_OK;
}

int zt_layernorm_residual_forward(zt_tensor *resid, zt_tensor *out, zt_tensor *mean,
                                  zt_tensor *rstd, const zt_tensor *a, const zt_tensor *b,
                                  const zt_tensor *w, const zt_tensor *bias)
{
    const char *op = "zt_layernorm_residual_forward";
    int64_t N = 0, C = 0;
    int out16 = 0, r16 = 0, p16 = 0;
    ZT_TRY(ln_forward_dims(op, "a", a, w, bias, out, mean, rstd, &N, &C, &out16, &r16, &p16));
    ZT_TRY(need_numel(op, "b", b, r16 ? ZT_BF16 : ZT_F32, N * C, "(N,C), a's dtype"));
    ZT_TRY(need_numel(op, "resid", resid, r16 ? ZT_BF16 : ZT_F32, N * C, "(N,C), a's dtype"));
    ZT_CHECK(!overlaps(resid, a) && !overlaps(resid, b),
             "%s: resid must be a tensor of its own (it may not overlap a or b)", op);
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "resid", resid, "out", out, "mean", mean, "rstd", rstd, "a", a,
                 "b", b, "weight", w, "bias", bias, NULL));
    dev->layernorm_residual_forward(resid->data, out->data, out16, mean->data, rstd->data,
                                    a->data, b->data, r16, w->data, bias->data, p16, (int)N,
                                    (int)C);
    return ZT_OK;
}

int zt_layernorm_backward(zt_tensor *dinp, zt_tensor *dw, zt_tensor *db,
                          const zt_tensor *dout, const zt_tensor *inp,
                          const zt_tensor *w, const zt_tensor *mean, const zt_tensor *rstd)
{
    return zt_layernorm_backward_b16(dinp, NULL, dw, db, dout, inp, w, mean, rstd);
}

int zt_layernorm_backward_b16(zt_tensor *dinp, zt_tensor *dinp16, zt_tensor *dw, zt_tensor *db,
                              const zt_tensor *dout, const zt_tensor *inp, const zt_tensor *w,
                              const zt_tensor *mean, const zt_tensor *rstd)
{
    const char *op = dinp16 ? "zt_layernorm_backward_b16" : "zt_layernorm_backward";
    int p16 = 0;   /* a bf16 weight, widened as read */
    ZT_TRY(need_param(op, "weight", w, &p16));
    int64_t C = w->numel;
    int r16 = 0;   /* the bf16 residual stream: inp and dinp bf16 */
    ZT_TRY(need_stream(op, "inp", inp, &r16));
    ZT_CHECK(last_dim(inp) == C, "%s: inp's last dim must be C=%lld", op, (long long)C);
    ZT_TRY(r16_width(op, r16, C));
    int64_t N = inp->numel / C;
    ZT_CHECK((dw == NULL) == (db == NULL), "%s: dweight and dbias are computed together: "
             "pass both (weight gradient) or neither (input gradient only)", op);
    ZT_CHECK(dinp != NULL || dw != NULL, "%s: nothing to compute: dinp, dweight and dbias "
             "are all NULL", op);
    if (dinp) ZT_TRY(need_numel(op, "dinp", dinp, r16 ? ZT_BF16 : ZT_F32, N * C,
                                "(N,C), inp's dtype"));
    ZT_CHECK(dinp16 == NULL || dinp != NULL, "%s: dinp16 is dinp rounded: pass dinp too", op);
    ZT_CHECK(dinp16 == NULL || !r16, "%s: dinp is bf16 already (a bf16 inp): pass no dinp16", op);
    if (dinp16) ZT_TRY(need_numel(op, "dinp16", dinp16, ZT_BF16, N * C, "(N,C) bf16"));
    ZT_TRY(need_numel(op, "dout", dout, r16 ? ZT_BF16 : ZT_F32, N * C, "(N,C), inp's dtype"));
    int g16 = 0;
    ZT_TRY(grads_dtype(op, dw, db, &g16));
    ZT_CHECK(!g16 || C <= ZT_R16_MAX_C, "%s: bf16 weight gradients take C <= %d, got %lld",
             op, ZT_R16_MAX_C, (long long)C);
    if (dw) ZT_TRY(need_numel(op, "dweight", dw, g16 ? ZT_BF16 : ZT_F32, C, "(C)"));
    if (db) ZT_TRY(need_numel(op, "dbias", db, g16 ? ZT_BF16 : ZT_F32, C, "(C)"));
    ZT_TRY(need_numel(op, "mean", mean, ZT_F32, N, "(N)"));
    ZT_TRY(need_numel(op, "rstd", rstd, ZT_F32, N, "(N)"));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "dinp", dinp, "dinp16", dinp16, "dweight", dw, "dbias", db, "dout",
                 dout, "inp", inp, "weight", w, "mean", mean, "rstd", rstd, NULL));
    dev->layernorm_backward(dinp ? dinp->data : NULL, dinp16 ? dinp16->data : NULL,
                            dw ? dw->data : NULL,
                            db ? db->data : NULL, g16, dout->data, inp->data, r16,
                            w->data, p16, mean->data, rstd->data, (int)N, (int)C);
    return ZT_OK;
}

int zt_matmul_forward(zt_tensor *out, const zt_tensor *inp, const zt_tensor *w,
                      const zt_tensor *b)
{
    const char *op = "zt_matmul_forward";
    char d[96];
    ZT_TRY(need(op, "weight", w, ZT_F32));
    ZT_CHECK(w->ndim == 2, "%s: weight must be 2-D (OC,C), got %s", op, desc(w, d, sizeof d));
    int64_t OC = w->shape[0], C = w->shape[1];
    ZT_TRY(need(op, "inp", inp, ZT_F32));
    ZT_CHECK(last_dim(inp) == C, "%s: inp %s does not match weight (OC=%lld, C=%lld)", op,
             desc(inp, d, sizeof d), (long long)OC, (long long)C);
    int64_t N = inp->numel / C, ld = OC;
    ZT_TRY(need_rows(op, "out", out, ZT_F32, N, OC, "(N,OC)", &ld));
    if (b) ZT_TRY(need_numel(op, "bias", b, ZT_F32, OC, "(OC)"));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "out", out, "inp", inp, "weight", w, "bias", b, NULL));
    return dev->matmul_forward(out->data, inp->data, w->data, b ? b->data : NULL,
                               (int)N, (int)C, (int)OC, (int)ld);
}

int zt_matmul_backward(zt_tensor *dinp, zt_tensor *dw, zt_tensor *db, const zt_tensor *dout,
                       const zt_tensor *inp, const zt_tensor *w)
{
    const char *op = "zt_matmul_backward";
    ZT_TRY(need(op, "weight", w, ZT_F32));
    ZT_CHECK(w->ndim == 2, "%s: weight must be 2-D (OC,C)", op);
    int64_t OC = w->shape[0], C = w->shape[1];
    ZT_TRY(need(op, "inp", inp, ZT_F32));
    ZT_CHECK(last_dim(inp) == C, "%s: inp's last dim must be C=%lld", op, (long long)C);
    int64_t N = inp->numel / C;
    ZT_CHECK(dw != NULL || db == NULL, "%s: dbias without dweight; the weight gradient "
             "computes both (pass dweight too, or neither for the input gradient only)", op);
    ZT_CHECK(dinp != NULL || dw != NULL, "%s: nothing to compute: dinp and dweight are "
             "both NULL", op);
    int64_t ld = OC;
    ZT_TRY(need_rows(op, "dout", dout, ZT_F32, N, OC, "(N,OC)", &ld));
    if (dw) ZT_TRY(need_numel(op, "dweight", dw, ZT_F32, OC * C, "(OC,C)"));
    if (dinp) ZT_TRY(need_numel(op, "dinp", dinp, ZT_F32, N * C, "(N,C)"));
    if (db) ZT_TRY(need_numel(op, "dbias", db, ZT_F32, OC, "(OC)"));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "dinp", dinp, "dweight", dw, "dbias", db, "dout", dout, "inp", inp,
                 "weight", w, NULL));
    return dev->matmul_backward(dinp ? dinp->data : NULL, dw ? dw->data : NULL,
                                db ? db->data : NULL, dout->data, inp->data, w->data,
                                (int)N, (int)C, (int)OC, (int)ld);
}

/* The bf16 linear layer: weight (OC,C) and inp (..,C) bf16, the rest f32.
 * Sizes must fit the kernels' int. */
static int bf16_dims(const char *op, const zt_tensor *inp, const zt_tensor *w,
                     int64_t *N, int64_t *C, int64_t *OC)
{
    char d[96];
    ZT_TRY(need(op, "weight", w, ZT_BF16));
    ZT_CHECK(w->ndim == 2, "%s: weight must be 2-D (OC,C) bf16, got %s", op,
             desc(w, d, sizeof d));
    *OC = w->shape[0]; *C = w->shape[1];
    ZT_TRY(need(op, "inp", inp, ZT_BF16));
    ZT_CHECK(last_dim(inp) == *C, "%s: inp %s does not match weight (OC=%lld, C=%lld)", op,
             desc(inp, d, sizeof d), (long long)*OC, (long long)*C);
    *N = inp->numel / *C;
    ZT_CHECK(*N <= INT32_MAX && *C <= INT32_MAX && *OC <= INT32_MAX,
             "%s: N=%lld, C=%lld, OC=%lld: each must be below 2^31", op, (long long)*N,
             (long long)*C, (long long)*OC);
    return ZT_OK;
}

/* a bf16 GEMM's bias: NULL, (OC) f32, or (OC) bf16 (*b16: a bf16 run's
 * stored bias, widened as read) */
static int need_bias(const char *op, const zt_tensor *b, int64_t OC, int *b16)
{
    *b16 = b != NULL && b->dtype == ZT_BF16;
    if (b) ZT_TRY(need_numel(op, "bias", b, *b16 ? ZT_BF16 : ZT_F32, OC, "(OC) f32 or bf16"));
    return ZT_OK;
}

int zt_matmul_bf16_forward(zt_tensor *out, const zt_tensor *inp, const zt_tensor *w,
                           const zt_tensor *b)
{
    const char *op = "zt_matmul_bf16_forward";
    int64_t N = 0, C = 0, OC = 0;
    ZT_TRY(bf16_dims(op, inp, w, &N, &C, &OC));
    int64_t ld = OC;
    int out16 = out != NULL && out->dtype == ZT_BF16;
    ZT_TRY(need_rows(op, "out", out, out16 ? ZT_BF16 : ZT_F32, N, OC, "(N,OC) f32 or bf16", &ld));
    int b16 = 0;
    ZT_TRY(need_bias(op, b, OC, &b16));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "out", out, "inp", inp, "weight", w, "bias", b, NULL));
    return dev->matmul_bf16_forward(out->data, out16, inp->data, w->data, b ? b->data : NULL,
                                    b16, (int)N, (int)C, (int)OC, (int)ld);
}

int zt_matmul_bf16_backward(zt_tensor *dinp, zt_tensor *dw, zt_tensor *db,
                            const zt_tensor *dout, const zt_tensor *inp, const zt_tensor *w)
{
    const char *op = "zt_matmul_bf16_backward";
    int64_t N = 0, C = 0, OC = 0;
    ZT_TRY(bf16_dims(op, inp, w, &N, &C, &OC));
    ZT_CHECK(dw != NULL || db == NULL, "%s: dbias without dweight; the weight gradient "
             "computes both (pass dweight too, or neither for the input gradient only)", op);
    ZT_CHECK(dinp != NULL || dw != NULL, "%s: nothing to compute: dinp and dweight are "
             "both NULL", op);
    int64_t ld = OC;
    ZT_TRY(need_rows(op, "dout", dout, ZT_BF16, N, OC, "(N,OC) bf16", &ld));
    int g16 = 0;
    ZT_TRY(grads_dtype(op, dw, db, &g16));
    if (dw) ZT_TRY(need_numel(op, "dweight", dw, g16 ? ZT_BF16 : ZT_F32, OC * C,
                              "(OC,C) f32 or bf16"));
    /* dinp f32, or bf16 (bf16 activations: an activation's gradient) */
    int d16 = dinp != NULL && dinp->dtype == ZT_BF16;
    if (dinp) ZT_TRY(need_numel(op, "dinp", dinp, d16 ? ZT_BF16 : ZT_F32, N * C, "(N,C) f32 or bf16"));
    if (db) ZT_TRY(need_numel(op, "dbias", db, g16 ? ZT_BF16 : ZT_F32, OC, "(OC), dweight's dtype"));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "dinp", dinp, "dweight", dw, "dbias", db, "dout", dout, "inp", inp,
                 "weight", w, NULL));
    return dev->matmul_bf16_backward(dinp ? dinp->data : NULL, d16, dw ? dw->data : NULL,
                                     db ? db->data : NULL, g16, dout->data, inp->data,
                                     w->data, (int)N, (int)C, (int)OC, (int)ld);
}

int zt_matmul_bf16_forward_gelu(zt_tensor *out, const zt_tensor *inp, const zt_tensor *w,
                                const zt_tensor *b, zt_tensor *pre)
{
    const char *op = "zt_matmul_bf16_forward_gelu";
    int64_t N = 0, C = 0, OC = 0;
    ZT_TRY(bf16_dims(op, inp, w, &N, &C, &OC));
    ZT_TRY(need_numel(op, "out", out, ZT_BF16, N * OC, "(N,OC) bf16"));
    ZT_TRY(need_numel(op, "pre", pre, ZT_BF16, N * OC, "(N,OC) bf16"));
    int b16 = 0;
    ZT_TRY(need_bias(op, b, OC, &b16));
    ZT_CHECK(!overlaps(out, pre) && !overlaps(out, inp) && !overlaps(pre, inp),
             "%s: out, pre and inp must be tensors apart (none may overlap another)", op);
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "out", out, "pre", pre, "inp", inp, "weight", w, "bias", b, NULL));
    if (dev->matmul_bf16_forward_gelu)
        return dev->matmul_bf16_forward_gelu(out->data, pre->data, inp->data, w->data,
                                             b ? b->data : NULL, b16, (int)N, (int)C, (int)OC);
    ZT_TRY(dev->matmul_bf16_forward(pre->data, 1, inp->data, w->data, b ? b->data : NULL, b16,
                                    (int)N, (int)C, (int)OC, (int)OC));
    dev->gelu_forward(out->data, 1, pre->data, 1, (size_t)(N * OC));
    return ZT_OK;
}

int zt_matmul_bf16_backward_dgelu(zt_tensor *dinp16, zt_tensor *dw, zt_tensor *db,
                                  const zt_tensor *dout, const zt_tensor *inp, const zt_tensor *w,
                                  const zt_tensor *pre, zt_tensor *dinp32)
{
    const char *op = "zt_matmul_bf16_backward_dgelu";
    int64_t N = 0, C = 0, OC = 0;
    ZT_TRY(bf16_dims(op, inp, w, &N, &C, &OC));
    ZT_CHECK(dw != NULL || db == NULL, "%s: dbias without dweight; the weight gradient "
             "computes both (pass dweight too, or neither for the input gradient only)", op);
    ZT_CHECK(dinp16 != NULL || dw != NULL, "%s: nothing to compute: dinp16 and dweight are "
             "both NULL", op);
    int64_t ld = OC;
    ZT_TRY(need_rows(op, "dout", dout, ZT_BF16, N, OC, "(N,OC) bf16", &ld));
    int g16 = 0;
    ZT_TRY(grads_dtype(op, dw, db, &g16));
    if (dw) ZT_TRY(need_numel(op, "dweight", dw, g16 ? ZT_BF16 : ZT_F32, OC * C,
                              "(OC,C) f32 or bf16"));
    if (db) ZT_TRY(need_numel(op, "dbias", db, g16 ? ZT_BF16 : ZT_F32, OC, "(OC), dweight's dtype"));
    if (dinp16) {
        ZT_TRY(need_numel(op, "dinp16", dinp16, ZT_BF16, N * C, "(N,C) bf16"));
        ZT_TRY(need_numel(op, "pre", pre, ZT_BF16, N * C, "(N,C) bf16: the GELU's input"));
        ZT_TRY(need_numel(op, "dinp32", dinp32, ZT_F32, N * C, "(N,C) f32 scratch"));
        ZT_CHECK(!overlaps(dinp16, pre) && !overlaps(dinp16, dinp32) && !overlaps(dinp32, pre) &&
                 !overlaps(dinp16, dout) && !overlaps(dinp32, dout),
                 "%s: dinp16, dinp32, pre and dout must be tensors apart", op);
    }
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "dinp16", dinp16, "dweight", dw, "dbias", db, "dout", dout, "inp", inp,
                 "weight", w, "pre", dinp16 ? pre : NULL, "dinp32", dinp16 ? dinp32 : NULL, NULL));
    void *d16 = dinp16 ? dinp16->data : NULL, *d32 = dinp16 ? dinp32->data : NULL;
    if (dev->matmul_bf16_backward_dgelu)
        return dev->matmul_bf16_backward_dgelu(d16, d32, dw ? dw->data : NULL, db ? db->data : NULL,
                                               g16, dout->data, inp->data, w->data,
                                               dinp16 ? pre->data : NULL, (int)N, (int)C, (int)OC,
                                               (int)ld);
    ZT_TRY(dev->matmul_bf16_backward(d32, 0, dw ? dw->data : NULL, db ? db->data : NULL, g16, dout->data,
                                     inp->data, w->data, (int)N, (int)C, (int)OC, (int)ld));
    if (dinp16) dev->gelu_backward(d16, 1, pre->data, 1, d32, (size_t)(N * C));
    return ZT_OK;
}

/* qkv (B,T,R): R = 3C for NKV = NH (GPT-2), else (NH + 2 NKV) hs with
 * C = NH hs; query heads a multiple of kv heads, window >= 0 */
static int attn_dims(const char *op, const zt_tensor *qkv, int NH, int NKV, int W, int64_t *B,
                     int64_t *T, int64_t *C)
{
    char d[96];
    /* f32, or bf16 (bf16 activations; not for the decode, which checks) */
    ZT_TRY(need(op, "qkv", qkv, qkv && qkv->dtype == ZT_BF16 ? ZT_BF16 : ZT_F32));
    ZT_CHECK(NH >= 1, "%s: %d heads; there must be at least one", op, NH);
    ZT_CHECK(NKV >= 1 && NH % NKV == 0, "%s: %d query heads are not a multiple of %d kv heads "
             "(each kv head serves NH/NKV query heads: config.json's num_attention_heads must "
             "be a multiple of num_key_value_heads)", op, NH, NKV);
    ZT_CHECK(W >= 0, "%s: window %d; it must be >= 0 (0: plain causal, else config.json's "
             "sliding_window)", op, W);
    if (NKV == NH) {
        ZT_CHECK(qkv->ndim == 3 && qkv->shape[2] % 3 == 0,
                 "%s: qkv must be (B,T,3C), got %s", op, desc(qkv, d, sizeof d));
        *B = qkv->shape[0]; *T = qkv->shape[1]; *C = qkv->shape[2] / 3;
        ZT_CHECK(*C % NH == 0, "%s: %d heads do not divide C=%lld", op, NH, (long long)*C);
        return ZT_OK;
    }
    int64_t parts = (int64_t)NH + 2 * (int64_t)NKV;
    ZT_CHECK(qkv->ndim == 3 && qkv->shape[2] % parts == 0,
             "%s: qkv must be (B,T,(NH+2*NKV)*hs), rows of q (NH=%d heads) | k | v (NKV=%d "
             "heads each), got %s: its rows do not split into %lld heads of one size", op, NH,
             NKV, desc(qkv, d, sizeof d), (long long)parts);
    *B = qkv->shape[0]; *T = qkv->shape[1]; *C = qkv->shape[2] / parts * NH;
    return ZT_OK;
}

/* the attention's activations share qkv's dtype: f32, or bf16 together */
static int like_qkv(const char *op, const char *name, const zt_tensor *t, const zt_tensor *qkv)
{
    char b[96];
    if (t && t->dtype != qkv->dtype)
        return zt_error(ZT_EINVAL, "%s: %s must be %s as qkv is (qkv, out and dqkv are all f32, "
                        "or all bf16 for bf16 activations), got %s", op, name,
                        zt_dtype_name(qkv->dtype), desc(t, b, sizeof b));
    return ZT_OK;
}

/* Grouped-query heads (NKV kv heads, NH a multiple) and a sliding window
 * (W > 0: query i sees keys (i - W, i]); zt_attention_forward is NKV = NH,
 * W = 0 (the kernels' bits unchanged). */
static int attn_forward(const char *op, zt_tensor *out, zt_tensor *lse, const zt_tensor *qkv,
                        int NH, int NKV, int W)
{
    int64_t B = 0, T = 0, C = 0;
    ZT_TRY(attn_dims(op, qkv, NH, NKV, W, &B, &T, &C));
    int io16 = qkv->dtype == ZT_BF16;      /* bf16 activations: out bf16 too */
    ZT_TRY(like_qkv(op, "out", out, qkv));
    ZT_TRY(need_numel(op, "out", out, qkv->dtype, B * T * C, "(B,T,C)"));
    ZT_TRY(need_numel(op, "lse", lse, ZT_F32, B * NH * T, "(B,NH,T)"));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "out", out, "lse", lse, "qkv", qkv, NULL));
    ZT_CHECK(dev->attention_forward != NULL, "%s: not implemented on the %s device yet; "
             "the cpu device has it (zt_device_init)", op, dev->name);
    return dev->attention_forward(out->data, lse->data, qkv->data, io16, (int)B, (int)T, (int)C,
                                  NH, NKV, W);
}

int zt_attention_forward(zt_tensor *out, zt_tensor *lse, const zt_tensor *qkv, int NH)
{
    return attn_forward("zt_attention_forward", out, lse, qkv, NH, NH, 0);
}

int zt_attention_forward_gqa(zt_tensor *out, zt_tensor *lse, const zt_tensor *qkv, int NH,
                             int NKV, int window)
{
    return attn_forward("zt_attention_forward_gqa", out, lse, qkv, NH, NKV, window);
}

static int attn_backward(const char *op, zt_tensor *dqkv, const zt_tensor *dout,
                         const zt_tensor *qkv, const zt_tensor *out, const zt_tensor *lse,
                         int NH, int NKV, int W)
{
    int64_t B = 0, T = 0, C = 0;
    ZT_TRY(attn_dims(op, qkv, NH, NKV, W, &B, &T, &C));
    /* bf16 activations: qkv, out, dout and dqkv bf16 together */
    int io16 = qkv->dtype == ZT_BF16;
    ZT_TRY(like_qkv(op, "dqkv", dqkv, qkv));
    ZT_TRY(like_qkv(op, "out", out, qkv));
    ZT_TRY(like_qkv(op, "dout", dout, qkv));
    ZT_TRY(need_numel(op, "dqkv", dqkv, qkv->dtype, qkv->numel,
                      NKV == NH ? "(B,T,3C)" : "qkv's (B,T,(NH+2*NKV)*hs)"));
    ZT_TRY(need_numel(op, "dout", dout, qkv->dtype, B * T * C, "(B,T,C)"));
    ZT_TRY(need_numel(op, "out", out, qkv->dtype, B * T * C, "(B,T,C)"));
    ZT_TRY(need_numel(op, "lse", lse, ZT_F32, B * NH * T, "(B,NH,T)"));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "dqkv", dqkv, "dout", dout, "qkv", qkv, "out", out, "lse", lse, NULL));
    ZT_CHECK(dev->attention_backward != NULL, "%s: not implemented on the %s device yet; "
             "the cpu device has it (zt_device_init)", op, dev->name);
    return dev->attention_backward(dqkv->data, dout->data, qkv->data, out->data, lse->data, io16,
                                   (int)B, (int)T, (int)C, NH, NKV, W);
}

int zt_attention_backward(zt_tensor *dqkv, const zt_tensor *dout, const zt_tensor *qkv,
                          const zt_tensor *out, const zt_tensor *lse, int NH)
{
    return attn_backward("zt_attention_backward", dqkv, dout, qkv, out, lse, NH, NH, 0);
}

int zt_attention_backward_gqa(zt_tensor *dqkv, const zt_tensor *dout, const zt_tensor *qkv,
                              const zt_tensor *out, const zt_tensor *lse, int NH, int NKV,
                              int window)
{
    return attn_backward("zt_attention_backward_gqa", dqkv, dout, qkv, out, lse, NH, NKV, window);
}

static int attn_decode(const char *op, zt_tensor *out, zt_tensor *kcache, zt_tensor *vcache,
                       const zt_tensor *qkv, int NH, int NKV, int W, int pos)
{
    char d[96];
    int64_t B = 0, T = 0, C = 0;
    ZT_TRY(attn_dims(op, qkv, NH, NKV, W, &B, &T, &C));
    ZT_TRY(need(op, "qkv", qkv, ZT_F32));        /* generation keeps f32 caches */
    int64_t hs = C / NH;
    const char *kvn = NKV == NH ? "NH" : "NKV";
    ZT_TRY(need(op, "kcache", kcache, ZT_F32));
    ZT_CHECK(kcache->ndim == 4 && kcache->shape[0] == B && kcache->shape[1] == NKV &&
             kcache->shape[3] == hs, "%s: kcache must be (B,%s,maxT,hs) = (%lld,%d,maxT,%lld) "
             "for qkv (B,T,%s) with %d %sheads, got %s", op, kvn, (long long)B, NKV,
             (long long)hs, NKV == NH ? "3C" : "(NH+2*NKV)*hs", NKV, NKV == NH ? "" : "kv ",
             desc(kcache, d, sizeof d));
    int64_t maxT = kcache->shape[2];
    ZT_TRY(need_numel(op, "vcache", vcache, ZT_F32, kcache->numel, "(same as kcache)"));
    ZT_CHECK(vcache->ndim == 4 && vcache->shape[2] == maxT, "%s: vcache must have kcache's "
             "shape (B,%s,maxT,hs), got %s", op, kvn, desc(vcache, d, sizeof d));
    ZT_CHECK(kcache->data != vcache->data, "%s: kcache and vcache are the same tensor; keys "
             "and values need a cache each", op);
    ZT_CHECK(pos >= 0 && pos + T <= maxT, "%s: positions [%d, %lld) do not fit the cache's "
             "%lld positions (the model's context); stop generating at the context or "
             "start a new sequence", op, pos, (long long)(pos + T), (long long)maxT);
    ZT_TRY(need_numel(op, "out", out, ZT_F32, B * T * C, "(B,T,C)"));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "out", out, "kcache", kcache, "vcache", vcache, "qkv", qkv, NULL));
    ZT_CHECK(dev->attention_decode != NULL, "%s: not available on the %s device", op,
             dev->name);
    dev->attention_decode(out->data, kcache->data, vcache->data, qkv->data, (int)B, (int)T,
                          (int)C, NH, NKV, W, (int)maxT, pos);
    return ZT_OK;
}

int zt_attention_decode(zt_tensor *out, zt_tensor *kcache, zt_tensor *vcache,
                        const zt_tensor *qkv, int NH, int pos)
{
    return attn_decode("zt_attention_decode", out, kcache, vcache, qkv, NH, NH, 0, pos);
}

int zt_attention_decode_gqa(zt_tensor *out, zt_tensor *kcache, zt_tensor *vcache,
                            const zt_tensor *qkv, int NH, int NKV, int window, int pos)
{
    return attn_decode("zt_attention_decode_gqa", out, kcache, vcache, qkv, NH, NKV, window, pos);
}

/* inp f32, or bf16 (then out bf16 too); out f32 or bf16 */
static int gelu_inp(const char *op, const zt_tensor *inp, int *in16)
{
    *in16 = inp != NULL && inp->dtype == ZT_BF16;
    return need(op, "inp", inp, *in16 ? ZT_BF16 : ZT_F32);
}

int zt_gelu_forward(zt_tensor *out, const zt_tensor *inp)
{
    const char *op = "zt_gelu_forward";
    int in16;
    ZT_TRY(gelu_inp(op, inp, &in16));
    int out16 = in16 || (out != NULL && out->dtype == ZT_BF16);
    ZT_TRY(need_numel(op, "out", out, out16 ? ZT_BF16 : ZT_F32, inp->numel,
                      in16 ? "(same as inp) bf16, as inp" : "(same as inp) f32 or bf16"));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "out", out, "inp", inp, NULL));
    dev->gelu_forward(out->data, out16, inp->data, in16, (size_t)inp->numel);
    return ZT_OK;
}

int zt_gelu_backward(zt_tensor *dinp, const zt_tensor *inp, const zt_tensor *dout)
{
    const char *op = "zt_gelu_backward";
    int in16;
    ZT_TRY(gelu_inp(op, inp, &in16));
    ZT_TRY(need_numel(op, "dout", dout, ZT_F32, inp->numel, "(same as inp)"));
    int out16 = in16 || (dinp != NULL && dinp->dtype == ZT_BF16);
    ZT_TRY(need_numel(op, "dinp", dinp, out16 ? ZT_BF16 : ZT_F32, inp->numel,
                      in16 ? "(same as inp) bf16, as inp" : "(same as inp) f32 or bf16"));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "dinp", dinp, "inp", inp, "dout", dout, NULL));
    dev->gelu_backward(dinp->data, out16, inp->data, in16, dout->data, (size_t)inp->numel);
    return ZT_OK;
}

/* ---- Llama's ops ---- */

/* inp (N,C) f32 or bf16 (*r16: the bf16 residual stream), w (C) f32 or
 * bf16 (*p16): N and C */
static int rms_dims(const char *op, const zt_tensor *inp, const zt_tensor *w, int64_t *N,
                    int64_t *C, int *r16, int *p16)
{
    ZT_TRY(need_param(op, "weight", w, p16));
    ZT_TRY(need_stream(op, "inp", inp, r16));
    *C = w->numel;
    ZT_TRY(r16_width(op, *r16, *C));
    ZT_CHECK(*C > 0 && last_dim(inp) == *C, "%s: inp's last dim must be C=%lld (the weight's "
             "length)", op, (long long)*C);
    *N = inp->numel / *C;
    ZT_CHECK(*N <= INT32_MAX && *C <= INT32_MAX, "%s: %lld rows of %lld is past the kernels' "
             "int range", op, (long long)*N, (long long)*C);
    return ZT_OK;
}

int zt_rmsnorm_forward(zt_tensor *out, zt_tensor *rstd, const zt_tensor *inp, const zt_tensor *w,
                       float eps)
{
    const char *op = "zt_rmsnorm_forward";
    int64_t N = 0, C = 0;
    int in16 = 0, p16 = 0;
    ZT_TRY(rms_dims(op, inp, w, &N, &C, &in16, &p16));
    ZT_CHECK(eps > 0.0f && eps < 1.0f, "%s: eps must be in (0, 1), got %g (config.json's "
             "rms_norm_eps: 1e-5 or 1e-6)", op, (double)eps);
    int out16 = out != NULL && out->dtype == ZT_BF16;
    ZT_CHECK(!in16 || out == NULL || out16, "%s: a bf16 inp takes a bf16 out (a bf16 stream "
             "feeds bf16 GEMMs)", op);
    ZT_TRY(need_numel(op, "out", out, out16 ? ZT_BF16 : ZT_F32, N * C, "(N,C) f32 or bf16"));
    ZT_TRY(need_numel(op, "rstd", rstd, ZT_F32, N, "(N)"));
    ZT_CHECK(!overlaps(out, inp) && !overlaps(rstd, out) && !overlaps(rstd, inp),
             "%s: out and rstd may not overlap inp or each other", op);
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "out", out, "rstd", rstd, "inp", inp, "weight", w, NULL));
    dev->rmsnorm_forward(out->data, out16, rstd->data, inp->data, in16, w->data, p16, eps,
                         (int)N, (int)C);
    return ZT_OK;
}

int zt_rmsnorm_backward(zt_tensor *dinp, zt_tensor *dweight, const zt_tensor *dout,
                        const zt_tensor *inp, const zt_tensor *w, const zt_tensor *rstd)
{
    return zt_rmsnorm_backward_b16(dinp, NULL, dweight, dout, inp, w, rstd);
}

int zt_rmsnorm_backward_b16(zt_tensor *dinp, zt_tensor *dinp16, zt_tensor *dweight,
                            const zt_tensor *dout, const zt_tensor *inp, const zt_tensor *w,
                            const zt_tensor *rstd)
{
    const char *op = dinp16 ? "zt_rmsnorm_backward_b16" : "zt_rmsnorm_backward";
    int64_t N = 0, C = 0;
    int r16 = 0, p16 = 0;
    ZT_TRY(rms_dims(op, inp, w, &N, &C, &r16, &p16));
    ZT_CHECK(dinp != NULL || dweight != NULL, "%s: nothing to compute: dinp and dweight are "
             "both NULL", op);
    if (dinp) ZT_TRY(need_numel(op, "dinp", dinp, r16 ? ZT_BF16 : ZT_F32, N * C,
                                "(N,C), inp's dtype"));
    ZT_CHECK(dinp16 == NULL || dinp != NULL, "%s: dinp16 is dinp rounded: pass dinp too", op);
    ZT_CHECK(dinp16 == NULL || !r16, "%s: dinp is bf16 already (a bf16 inp): pass no dinp16", op);
    if (dinp16) ZT_TRY(need_numel(op, "dinp16", dinp16, ZT_BF16, N * C, "(N,C) bf16"));
    ZT_CHECK(!dinp16 || (!overlaps(dinp16, dinp) && !overlaps(dinp16, dout) &&
                         !overlaps(dinp16, inp)),
             "%s: dinp16 may not overlap dinp, dout or inp", op);
    int g16 = 0;
    ZT_TRY(grads_dtype(op, dweight, NULL, &g16));
    ZT_CHECK(!g16 || C <= ZT_R16_MAX_C, "%s: a bf16 weight gradient takes C <= %d, got %lld",
             op, ZT_R16_MAX_C, (long long)C);
    if (dweight) ZT_TRY(need_numel(op, "dweight", dweight, g16 ? ZT_BF16 : ZT_F32, C, "(C)"));
    ZT_TRY(need_numel(op, "dout", dout, r16 ? ZT_BF16 : ZT_F32, N * C, "(N,C), inp's dtype"));
    ZT_TRY(need_numel(op, "rstd", rstd, ZT_F32, N, "(N)"));
    /* the outputs apart from what is read (dweight may be the weight's own
     * gradient view standing in for it: a weight-only pass reads no weight) */
    ZT_CHECK(!dinp || (!overlaps(dinp, dout) && !overlaps(dinp, inp) && !overlaps(dinp, rstd) &&
                       !overlaps(dinp, w)),
             "%s: dinp may not overlap dout, inp, weight or rstd", op);
    ZT_CHECK(!dweight || (!overlaps(dweight, dout) && !overlaps(dweight, inp) &&
                          !overlaps(dweight, rstd) && !(dinp && overlaps(dweight, dinp))),
             "%s: dweight may not overlap dinp, dout, inp or rstd", op);
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "dinp", dinp, "dinp16", dinp16, "dweight", dweight, "dout", dout,
                 "inp", inp, "weight", w, "rstd", rstd, NULL));
    dev->rmsnorm_backward(dinp ? dinp->data : NULL, dinp16 ? dinp16->data : NULL,
                          dweight ? dweight->data : NULL, g16, dout->data, inp->data, r16, w->data,
                          p16, rstd->data, (int)N, (int)C);
    return ZT_OK;
}

int zt_rope_table(zt_tensor *cos, zt_tensor *sin, double theta, double factor,
                  double low_freq_factor, double high_freq_factor, double original_max_positions)
{
    const char *op = "zt_rope_table";
    char b[96];
    ZT_TRY(need(op, "cos", cos, ZT_F32));
    ZT_TRY(need(op, "sin", sin, ZT_F32));
    ZT_CHECK(cos->ndim == 2 && sin->ndim == 2 && cos->shape[0] == sin->shape[0] &&
             cos->shape[1] == sin->shape[1] && cos->shape[0] > 0 && cos->shape[1] > 0,
             "%s: cos and sin must both be (positions, head_size/2), got %s and %s", op,
             desc(cos, b, sizeof b), zt_describe(sin, b + 48, 48));
    ZT_CHECK(theta > 1.0 && isfinite(theta), "%s: theta must be a finite number > 1 "
             "(config.json's rope_theta), got %g", op, theta);
    ZT_CHECK(!overlaps(cos, sin), "%s: cos and sin must be two tensors", op);
    ZT_CHECK(!isnan(factor) && !isinf(factor) && !isnan(low_freq_factor) && !isnan(high_freq_factor) &&
             !isnan(original_max_positions), "%s: the Llama 3 scaling's numbers must be finite "
             "(config.json's rope_scaling)", op);
    ZT_CHECK(!(factor > 0) || (low_freq_factor > 0 && high_freq_factor > low_freq_factor &&
                               original_max_positions > 0),
             "%s: Llama 3 scaling needs low_freq_factor > 0, high_freq_factor > low_freq_factor "
             "and original_max_position_embeddings > 0 (config.json's rope_scaling), got %g, "
             "%g, %g", op, low_freq_factor, high_freq_factor, original_max_positions);
    int64_t P = cos->shape[0], h2 = cos->shape[1];
    ZT_CHECK(P <= INT32_MAX && 2 * h2 <= INT32_MAX, "%s: the table is past the kernels' int "
             "range", op);
    size_t n = (size_t)(P * h2);
    float *c = malloc(n * sizeof(float)), *s = malloc(n * sizeof(float));
    if (!c || !s) {
        free(c); free(s);
        return zt_error(ZT_ENOMEM, "%s: no host memory for a %lld x %lld table", op,
                        (long long)P, (long long)h2);
    }
    zk_rope_scaling sc = { factor, low_freq_factor, high_freq_factor, original_max_positions };
    zk_rope_table(c, s, (int)P, (int)(2 * h2), theta, factor > 0 ? &sc : NULL);
    int rc = zt_tensor_write(cos, c, n * sizeof(float));
    if (rc == ZT_OK) rc = zt_tensor_write(sin, s, n * sizeof(float));
    free(c); free(s);
    return rc;
}

static int rope(const char *op, zt_tensor *x, int64_t col0, int nh, int hs, int T, int pos0,
                const zt_tensor *cos, const zt_tensor *sin, int dir)
{
    char b[96];
    int x16 = x != NULL && x->dtype == ZT_BF16;
    ZT_TRY(need(op, "x", x, x16 ? ZT_BF16 : ZT_F32));
    ZT_TRY(need(op, "cos", cos, ZT_F32));
    ZT_TRY(need(op, "sin", sin, ZT_F32));
    int64_t ld = last_dim(x), N = ld > 0 ? x->numel / ld : 0;
    ZT_CHECK(hs > 0 && hs % 2 == 0 && nh > 0, "%s: head_size must be even and > 0 and heads "
             "> 0, got head_size %d, %d heads", op, hs, nh);
    ZT_CHECK(col0 >= 0 && col0 + (int64_t)nh * hs <= ld, "%s: %d heads of %d from column %lld "
             "do not fit x's rows of %lld (%s)", op, nh, hs, (long long)col0, (long long)ld,
             desc(x, b, sizeof b));
    ZT_CHECK(T > 0 && N % T == 0, "%s: x's %lld rows are not whole sequences of T=%d", op,
             (long long)N, T);
    ZT_CHECK(cos->ndim == 2 && cos->shape[1] == hs / 2 && sin->ndim == 2 &&
             sin->shape[1] == hs / 2 && sin->shape[0] == cos->shape[0],
             "%s: cos and sin must be (positions, %d) tables of head_size %d (zt_rope_table)", op,
             hs / 2, hs);
    ZT_CHECK(pos0 >= 0 && (int64_t)pos0 + T <= cos->shape[0], "%s: positions %d..%lld are past "
             "the table's %lld; make the table longer (the model's max positions)", op, pos0,
             (long long)pos0 + T - 1, (long long)cos->shape[0]);
    ZT_CHECK(N <= INT32_MAX && ld <= INT32_MAX, "%s: x is past the kernels' int range", op);
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "x", x, "cos", cos, "sin", sin, NULL));
    void *base = (char *)x->data + col0 * (int64_t)zt_dtype_size(x->dtype);
    dev->rope(base, x16, (int)N, T, (int)ld, nh, hs, cos->data, sin->data, pos0, dir);
    return ZT_OK;
}

int zt_rope_forward(zt_tensor *x, int64_t col0, int nh, int hs, int T, int pos0,
                    const zt_tensor *cos, const zt_tensor *sin)
{
    return rope("zt_rope_forward", x, col0, nh, hs, T, pos0, cos, sin, 1);
}

int zt_rope_backward(zt_tensor *dx, int64_t col0, int nh, int hs, int T, int pos0,
                     const zt_tensor *cos, const zt_tensor *sin)
{
    return rope("zt_rope_backward", dx, col0, nh, hs, T, pos0, cos, sin, -1);
}

/* gu (N, 2F) f32 or bf16 (*io16): N and F */
static int gu_dims(const char *op, const zt_tensor *gu, int64_t *N, int64_t *F, int *io16)
{
    char b[96];
    *io16 = gu != NULL && gu->dtype == ZT_BF16;
    ZT_TRY(need(op, "gu", gu, *io16 ? ZT_BF16 : ZT_F32));
    int64_t two = last_dim(gu);
    ZT_CHECK(two > 0 && two % 2 == 0, "%s: gu's rows must be [gate | up], an even width, got "
             "%s", op, desc(gu, b, sizeof b));
    *F = two / 2;
    *N = gu->numel / two;
    ZT_CHECK(*N <= INT32_MAX, "%s: gu is past the kernels' int range", op);
    return ZT_OK;
}

int zt_swiglu_forward(zt_tensor *out, const zt_tensor *gu)
{
    const char *op = "zt_swiglu_forward";
    int64_t N = 0, F = 0;
    int io16 = 0;
    ZT_TRY(gu_dims(op, gu, &N, &F, &io16));
    ZT_TRY(need_numel(op, "out", out, gu->dtype, N * F, io16 ?
                      "(N,F): gu's rows, half their width, bf16 as gu" :
                      "(N,F): gu's rows, half their width"));
    ZT_CHECK(!overlaps(out, gu), "%s: out may not overlap gu", op);
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "out", out, "gu", gu, NULL));
    dev->swiglu_forward(out->data, gu->data, io16, (int)N, (int)F);
    return ZT_OK;
}

int zt_swiglu_backward(zt_tensor *dgu, const zt_tensor *dout, const zt_tensor *gu)
{
    const char *op = "zt_swiglu_backward";
    int64_t N = 0, F = 0;
    int io16 = 0;
    ZT_TRY(gu_dims(op, gu, &N, &F, &io16));
    ZT_TRY(need_numel(op, "dgu", dgu, gu->dtype, N * 2 * F, "(N,2F), as gu (and its dtype)"));
    ZT_TRY(need_numel(op, "dout", dout, io16 ? ZT_BF16 : ZT_F32, N * F, "(N,F), gu's dtype"));
    ZT_CHECK(!overlaps(dgu, gu) && !overlaps(dgu, dout), "%s: dgu may not overlap gu or dout",
             op);
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "dgu", dgu, "dout", dout, "gu", gu, NULL));
    dev->swiglu_backward(dgu->data, dout->data, gu->data, io16, (int)N, (int)F);
    return ZT_OK;
}

int zt_crossentropy(zt_tensor *losses, zt_tensor *dlogits, const zt_tensor *logits,
                    const zt_tensor *targets, float dscale, int64_t V)
{
    const char *op = "zt_crossentropy";
    char d[96];
    ZT_CHECK(logits != NULL, "%s: logits is NULL", op);
    int dt = logits->dtype;
    ZT_CHECK(dt == ZT_F32 || dt == ZT_BF16, "%s: logits must be f32 or bf16, got %s", op,
             desc(logits, d, sizeof d));
    ZT_TRY(need(op, "targets", targets, ZT_I32));
    int64_t N = targets->numel, ld = 0;
    ZT_CHECK(V >= 0 && V <= INT32_MAX, "%s: V=%lld: must be 0 (the logits' last dim) or a "
             "vocabulary size below 2^31", op, (long long)V);
    if (V == 0) {
        V = last_dim(logits);
        ZT_CHECK(logits->numel == N * V, "%s: logits %s must be (N,V) with N=%lld targets", op,
                 desc(logits, d, sizeof d), (long long)N);
    }
    ZT_TRY(need_rows(op, "logits", logits, dt, N, V, "(N,V)", &ld));
    ZT_CHECK(ld == last_dim(logits), "%s: logits %s: the last dim must be V=%lld or %lld (padded)",
             op, desc(logits, d, sizeof d), (long long)V, (long long)zt_padded_cols(V));
    ZT_TRY(need_numel(op, "losses", losses, ZT_F32, N, "(N)"));
    if (dlogits) ZT_TRY(need_numel(op, "dlogits", dlogits, dt, logits->numel, "(as logits)"));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "losses", losses, "dlogits", dlogits, "logits", logits,
                 "targets", targets, NULL));
    int bad = dev->crossentropy(losses->data, dlogits ? dlogits->data : NULL,
                                logits->data, targets->data, (int)N, (int)V, (int)ld,
                                dt == ZT_BF16, dscale);
    return bad_tokens(op, "targets", bad, N, V);
}

int zt_adamw(zt_tensor *p, const zt_tensor *g, zt_tensor *m, zt_tensor *v, float lr,
             float b1, float b2, float eps, float wd, float gscale, int step)
{
    const char *op = "zt_adamw";
    ZT_TRY(need(op, "param", p, ZT_F32));
    ZT_TRY(need_numel(op, "grad", g, ZT_F32, p->numel, "(same as param)"));
    ZT_TRY(need_numel(op, "m", m, ZT_F32, p->numel, "(same as param)"));
    ZT_TRY(need_numel(op, "v", v, ZT_F32, p->numel, "(same as param)"));
    ZT_CHECK(step >= 1, "%s: step must be >= 1 (1-based), got %d", op, step);
    ZT_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1, "%s: betas must be in [0,1)", op);
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "param", p, "grad", g, "m", m, "v", v, NULL));
    dev->adamw(p->data, g->data, m->data, v->data, (size_t)p->numel, lr, b1, b2, eps,
               wd, gscale, step);
    return ZT_OK;
}

int zt_adamw_segments(zt_tensor *p, const zt_tensor *g, zt_tensor *m, zt_tensor *v,
                      zt_tensor *lp, int nseg,
                      const int64_t *offset, const int64_t *length, const float *wd, float lr,
                      float b1, float b2, float eps, float gscale, int step)
{
    const char *op = "zt_adamw_segments";
    ZT_TRY(need(op, "param", p, ZT_F32));
    /* grad f32, or a mixed-precision step's stored 2-byte gradient */
    int gd = g && (g->dtype == ZT_BF16 || g->dtype == ZT_F16) ? g->dtype : ZT_F32;
    ZT_TRY(need_numel(op, "grad", g, gd, p->numel, "(same as param; f32, bf16 or f16)"));
    ZT_TRY(need_numel(op, "m", m, ZT_F32, p->numel, "(same as param)"));
    ZT_TRY(need_numel(op, "v", v, ZT_F32, p->numel, "(same as param)"));
    ZT_CHECK(step >= 1, "%s: step must be >= 1 (1-based), got %d", op, step);
    ZT_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1, "%s: betas must be in [0,1)", op);
    if (lp) {
        char d[96];
        ZT_CHECK(lp->dtype == ZT_BF16 || lp->dtype == ZT_F16, "%s: lp must be bf16 or f16, got %s",
                 op, zt_describe(lp, d, sizeof d));
        ZT_TRY(need_numel(op, "lp", lp, lp->dtype, p->numel, "(same as param)"));
    }
    ZT_CHECK(nseg >= 1 && nseg <= ZT_ADAMW_SEGS, "%s: %d segments (1 to %d)", op, nseg,
             ZT_ADAMW_SEGS);
    ZT_CHECK(offset && length && wd, "%s: offset, length and weight_decay are required", op);
    zt_adamw_segs sg;
    sg.n = nseg;
    int64_t end = 0;
    for (int s = 0; s < nseg; s++) {
        ZT_CHECK(offset[s] >= end && offset[s] < p->numel && length[s] >= 1 &&
                 length[s] <= p->numel - offset[s],
                 "%s: segment %d [%lld, +%lld) must be non-empty, after the one before and "
                 "inside the %lld elements", op, s, (long long)offset[s], (long long)length[s],
                 (long long)p->numel);
        end = offset[s] + length[s];
        sg.off[s] = offset[s]; sg.len[s] = length[s]; sg.wd[s] = wd[s];
    }
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, op, "param", p, "grad", g, "m", m, "v", v, "lp", lp, NULL));
    dev->adamw_segments(p->data, g->data, gd, m->data, v->data, lp ? lp->data : NULL,
                        lp ? lp->dtype : -1, &sg, lr, b1, b2, eps, gscale, step);
    return ZT_OK;
}

/* a byte range a part writes (p, m, v, lp: `what`) or reads (its grad) */
typedef struct { uintptr_t lo, hi; int part; const char *what; } wrange;

static int by_lo(const void *a, const void *b)
{
    uintptr_t x = ((const wrange *)a)->lo, y = ((const wrange *)b)->lo;
    return x < y ? -1 : x > y;
}

/* No element written twice, nor written by one part where another reads
 * its gradient: on a GPU either is a race. w: the n written ranges (sorted
 * here), g: the m gradient ranges. */
static int apart(const char *op, wrange *w, int n, const wrange *g, int m)
{
    qsort(w, (size_t)n, sizeof *w, by_lo);
    for (int k = 1; k < n; k++)
        ZT_CHECK(w[k].lo >= w[k - 1].hi, "%s: part %d's %s and part %d's %s overlap (each element "
                 "is written once, by one part)", op, w[k - 1].part, w[k - 1].what, w[k].part,
                 w[k].what);
    for (int j = 0; j < m; j++) {
        int lo = 0, hi = n;                 /* the first written range ending past g's start */
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2;
            if (w[mid].hi <= g[j].lo) lo = mid + 1; else hi = mid;
        }
        ZT_CHECK(lo == n || w[lo].lo >= g[j].hi, "%s: part %d's grad overlaps part %d's %s (a "
                 "gradient is read while another part writes it)", op, g[j].part, w[lo].part,
                 w[lo].what);
    }
    return ZT_OK;
}

/* one part's operands: as zt_adamw_segments' (g_dtype, lp_dtype: the first
 * part's, every part's the same) */
static int adamw_part(const char *op, const zt_adamw_part *q, int k, int g_dtype, int lp_dtype,
                      const zt_device_ops **dev)
{
    char name[64], d[96];
    ZT_CHECK(q->param && q->grad && q->m && q->v, "%s: part %d: param, grad, m and v are required",
             op, k);
    snprintf(name, sizeof name, "part %d's param", k);
    ZT_TRY(need(op, name, q->param, ZT_F32));
    int64_t n = q->param->numel;
    snprintf(name, sizeof name, "part %d's grad", k);
    ZT_TRY(need_numel(op, name, q->grad, g_dtype, n, "(as its param; every part's one dtype)"));
    snprintf(name, sizeof name, "part %d's m", k);
    ZT_TRY(need_numel(op, name, q->m, ZT_F32, n, "(as its param)"));
    snprintf(name, sizeof name, "part %d's v", k);
    ZT_TRY(need_numel(op, name, q->v, ZT_F32, n, "(as its param)"));
    ZT_CHECK((q->lp != NULL) == (lp_dtype >= 0), "%s: part %d %s an lp where part 0 %s: all "
             "parts or none", op, k, q->lp ? "has" : "has no", lp_dtype >= 0 ? "has" : "has none");
    if (q->lp) {
        ZT_CHECK(q->lp->dtype == lp_dtype, "%s: part %d's lp must be %s as part 0's, got %s", op,
                 k, zt_dtype_name(lp_dtype), zt_describe(q->lp, d, sizeof d));
        snprintf(name, sizeof name, "part %d's lp", k);
        ZT_TRY(need_numel(op, name, q->lp, lp_dtype, n, "(as its param)"));
    }
    ZT_CHECK(q->offset >= 0 && q->offset < n && q->length >= 1 && q->length <= n - q->offset,
             "%s: part %d's segment [%lld, +%lld) must be non-empty and inside its %lld elements",
             op, k, (long long)q->offset, (long long)q->length, (long long)n);
    const zt_device_ops *pd;
    ZT_TRY(ready(&pd, op, "param", q->param, "grad", q->grad, "m", q->m, "v", q->v, "lp", q->lp,
                 NULL));
    ZT_CHECK(k == 0 || pd == *dev, "%s: part %d is on another device than part 0's", op, k);
    *dev = pd;
    return ZT_OK;
}

int zt_adamw_multi(const zt_adamw_part *parts, int n, float lr, float b1, float b2, float eps,
                   float gscale, int step)
{
    const char *op = "zt_adamw_multi";
    ZT_CHECK(parts != NULL && n >= 1 && n <= ZT_ADAMW_PARTS, "%s: %d parts (1 to %d)", op, n,
             ZT_ADAMW_PARTS);
    ZT_CHECK(step >= 1, "%s: step must be >= 1 (1-based), got %d", op, step);
    ZT_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1, "%s: betas must be in [0,1)", op);
    ZT_CHECK(parts[0].grad != NULL, "%s: part 0: grad is required", op);
    int gd = parts[0].grad->dtype;
    ZT_CHECK(gd == ZT_F32 || gd == ZT_BF16 || gd == ZT_F16, "%s: grads must be f32, bf16 or f16, "
             "got %s", op, zt_dtype_name(gd));
    int ld = parts[0].lp ? parts[0].lp->dtype : -1;
    ZT_CHECK(ld == -1 || ld == ZT_BF16 || ld == ZT_F16, "%s: lp must be bf16 or f16, got %s", op,
             zt_dtype_name(ld));
    const zt_device_ops *dev = NULL;
    for (int k = 0; k < n; k++) ZT_TRY(adamw_part(op, &parts[k], k, gd, ld, &dev));
    /* validated: the items, and no element written twice (a race on a GPU) */
    zt_adamw_item *it = malloc((size_t)n * sizeof *it);
    wrange *w = malloc((size_t)n * 4 * sizeof *w), *gr = malloc((size_t)n * sizeof *gr);
    if (!it || !w || !gr) {
        free(it); free(w); free(gr);
        return zt_error(ZT_ENOMEM, "%s: no memory for %d parts", op, n);
    }
    size_t gs = zt_dtype_size(gd);
    int nw = 0;
    for (int k = 0; k < n; k++) {
        const zt_adamw_part *q = &parts[k];
        int64_t o = q->offset;
        uintptr_t len = (uintptr_t)q->length;
        it[k] = (zt_adamw_item){ (float *)q->param->data + o, (const char *)q->grad->data + o * gs,
                                 (float *)q->m->data + o, (float *)q->v->data + o,
                                 q->lp ? (char *)q->lp->data + o * 2 : NULL, q->length,
                                 q->weight_decay };
        w[nw++] = (wrange){ (uintptr_t)it[k].p, (uintptr_t)it[k].p + 4 * len, k, "param" };
        w[nw++] = (wrange){ (uintptr_t)it[k].m, (uintptr_t)it[k].m + 4 * len, k, "m" };
        w[nw++] = (wrange){ (uintptr_t)it[k].v, (uintptr_t)it[k].v + 4 * len, k, "v" };
        if (it[k].lp) w[nw++] = (wrange){ (uintptr_t)it[k].lp, (uintptr_t)it[k].lp + 2 * len, k, "lp" };
        gr[k] = (wrange){ (uintptr_t)it[k].g, (uintptr_t)it[k].g + gs * len, k, "grad" };
    }
    int rc = apart(op, w, nw, gr, n);
    if (rc == ZT_OK)
        dev->adamw_multi(it, n, gd, ld, lr, b1, b2, eps, gscale, step);
    free(it); free(w); free(gr);
    return rc;
}

int64_t zt_sum_block(void) { return ZK_SUM_BLOCK; }

/* the sums of squares take f32, or a stored 2-byte gradient (bf16, f16)
 * widened as read */
static int sum_dtype(const zt_tensor *x)
{
    return x && (x->dtype == ZT_BF16 || x->dtype == ZT_F16) ? x->dtype : ZT_F32;
}

int zt_sumsq_blocks(double *partials, const zt_tensor *x)
{
    ZT_CHECK(partials != NULL, "zt_sumsq_blocks: partials is NULL");
    ZT_TRY(need("zt_sumsq_blocks", "x", x, sum_dtype(x)));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, "zt_sumsq_blocks", "x", x, NULL));
    dev->sumsq_blocks(partials, x->data, x->dtype, (size_t)x->numel);
    return ZT_OK;
}

int zt_sumsq_blocks_many(double *partials, const zt_tensor *const *xs, int n)
{
    const char *op = "zt_sumsq_blocks_many";
    ZT_CHECK(partials != NULL, "%s: partials is NULL", op);
    ZT_CHECK(n >= 0 && (n == 0 || xs != NULL), "%s: %d tensors", op, n);
    if (n == 0) return ZT_OK;
    const void **x = malloc((size_t)n * sizeof *x);
    size_t *len = malloc((size_t)n * sizeof *len);
    int rc = (x && len) ? ZT_OK : zt_error(ZT_ENOMEM, "%s: %d tensors' table", op, n);
    const zt_device_ops *dev = NULL;
    for (int i = 0; i < n && rc == ZT_OK; i++) {
        const zt_device_ops *d = NULL;
        if ((rc = need(op, "x", xs[i], sum_dtype(xs[i]))) != ZT_OK) break;
        if (i > 0 && xs[i]->dtype != xs[0]->dtype) {
            rc = zt_error(ZT_EINVAL, "%s: tensor %d is %s, tensor 0 %s: one call takes one dtype "
                          "(f32, bf16 or f16)", op, i, zt_dtype_name(xs[i]->dtype),
                          zt_dtype_name(xs[0]->dtype));
            break;
        }
        if ((rc = ready(&d, op, "x", xs[i], NULL)) != ZT_OK) break;
        if (i > 0 && (d != dev || xs[i]->storage->tier != xs[0]->storage->tier)) {
            rc = zt_error(ZT_EINVAL, "%s: tensor %d is on another tier than tensor 0 (%s, %s): "
                          "one call takes one tier", op, i, zt_tier_name(xs[i]->storage->tier),
                          zt_tier_name(xs[0]->storage->tier));
            break;
        }
        dev = d;
        x[i] = xs[i]->data;
        len[i] = (size_t)xs[i]->numel;
    }
    if (rc == ZT_OK) dev->sumsq_blocks_many(partials, x, xs[0]->dtype, len, n);
    free(x);
    free(len);
    return rc;
}

int zt_sum(double *out, const zt_tensor *x)
{
    ZT_CHECK(out != NULL, "zt_sum: out is NULL");
    ZT_TRY(need("zt_sum", "x", x, ZT_F32));
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, "zt_sum", "x", x, NULL));
    *out = dev->sum(x->data, (size_t)x->numel);
    return ZT_OK;
}

double zt_host_sum(const float *x, size_t n) { return n ? zk_sum_f64(x, n) : 0.0; }

int zt_randn(zt_tensor *x, uint64_t seed, uint64_t stream, float mean, float std)
{
    ZT_TRY(need("zt_randn", "x", x, ZT_F32));
    ZT_CHECK(std >= 0, "zt_randn: std must be >= 0, got %g", (double)std);
    const zt_device_ops *dev;
    ZT_TRY(ready(&dev, "zt_randn", "x", x, NULL));
    dev->randn(x->data, (size_t)x->numel, seed, stream, mean, std);
    return ZT_OK;
}
