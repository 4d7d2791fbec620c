/*
 * ops.c -- tensor-level ops: validate shapes and dtypes, then issue the raw
 * kernel to the active device. Validation lives here, once, so kernels can
 * trust their sizes and a bad call from Lua becomes a clear error instead of
 * a crash.
 */
#include <stdio.h>
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

int zt_fill(zt_tensor *x, float v)
{
    ZT_TRY(need("zt_fill", "x", x, ZT_F32));
    zt_dev()->fill(x->data, v, (size_t)x->numel);
    return ZT_OK;
}

int zt_copy(zt_tensor *dst, const zt_tensor *src)
{
    ZT_CHECK(dst && src, "zt_copy: NULL tensor");
    ZT_TRY(need_numel("zt_copy", "dst", dst, src->dtype, src->numel, "(same as src)"));
    zt_dev()->copy(dst->data, src->data, (size_t)src->numel * zt_dtype_size(src->dtype));
    return ZT_OK;
}

int zt_scale(zt_tensor *x, float a)
{
    ZT_TRY(need("zt_scale", "x", x, ZT_F32));
    zt_dev()->scale(x->data, a, (size_t)x->numel);
    return ZT_OK;
}

int zt_axpy(zt_tensor *y, float a, const zt_tensor *x)
{
    ZT_TRY(need("zt_axpy", "x", x, ZT_F32));
    ZT_TRY(need_numel("zt_axpy", "y", y, ZT_F32, x->numel, "(same as x)"));
    zt_dev()->axpy(y->data, a, x->data, (size_t)x->numel);
    return ZT_OK;
}

int zt_add(zt_tensor *y, const zt_tensor *x)
{
    ZT_TRY(need("zt_add", "x", x, ZT_F32));
    ZT_TRY(need_numel("zt_add", "y", y, ZT_F32, x->numel, "(same as x)"));
    zt_dev()->add(y->data, x->data, (size_t)x->numel);
    return ZT_OK;
}

int zt_add3(zt_tensor *out, const zt_tensor *a, const zt_tensor *b)
{
    ZT_TRY(need("zt_add3", "a", a, ZT_F32));
    ZT_TRY(need_numel("zt_add3", "b", b, ZT_F32, a->numel, "(same as a)"));
    ZT_TRY(need_numel("zt_add3", "out", out, ZT_F32, a->numel, "(same as a)"));
    zt_dev()->add3(out->data, a->data, b->data, (size_t)a->numel);
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
    zt_dev()->cast(dst->data, dst->dtype, src->data, src->dtype, (size_t)src->numel);
    return ZT_OK;
}

int zt_encoder_forward(zt_tensor *out, const zt_tensor *tokens, const zt_tensor *wte,
                       const zt_tensor *wpe)
{
    const char *op = "zt_encoder_forward";
    ZT_TRY(need(op, "tokens", tokens, ZT_I32));
    ZT_TRY(need(op, "wte", wte, ZT_F32));
    ZT_TRY(need(op, "wpe", wpe, ZT_F32));
    ZT_CHECK(tokens->ndim == 2, "%s: tokens must be (B,T)", op);
    ZT_CHECK(wte->ndim == 2 && wpe->ndim == 2 && wte->shape[1] == wpe->shape[1],
             "%s: wte (V,C) and wpe (maxT,C) must be 2-D with equal C", op);
    int64_t B = tokens->shape[0], T = tokens->shape[1], C = wte->shape[1];
    ZT_CHECK(T <= wpe->shape[0], "%s: sequence length %lld exceeds the model's context %lld; "
             "lower data.seq_len", op, (long long)T, (long long)wpe->shape[0]);
    ZT_TRY(need_numel(op, "out", out, ZT_F32, B * T * C, "(B,T,C)"));
    const int32_t *tk = tokens->data;
    for (int64_t i = 0; i < B * T; i++)
        ZT_CHECK(tk[i] >= 0 && tk[i] < wte->shape[0],
                 "%s: token %d at position %lld is outside the vocabulary [0,%lld); "
                 "the tokenizer and model.vocab_size disagree", op, tk[i], (long long)i,
                 (long long)wte->shape[0]);
    zt_dev()->encoder_forward(out->data, tk, wte->data, wpe->data, (int)B, (int)T, (int)C);
    return ZT_OK;
}

int zt_encoder_backward(zt_tensor *dwte, zt_tensor *dwpe, const zt_tensor *dout,
                        const zt_tensor *tokens)
{
    const char *op = "zt_encoder_backward";
    ZT_TRY(need(op, "tokens", tokens, ZT_I32));
    ZT_TRY(need(op, "dwte", dwte, ZT_F32));
    ZT_TRY(need(op, "dwpe", dwpe, ZT_F32));
    ZT_CHECK(tokens->ndim == 2 && dwte->ndim == 2 && dwpe->ndim == 2,
             "%s: tokens (B,T), dwte (V,C), dwpe (maxT,C) must be 2-D", op);
    int64_t B = tokens->shape[0], T = tokens->shape[1], V = dwte->shape[0], C = dwte->shape[1];
    ZT_CHECK(dwpe->shape[1] == C && T <= dwpe->shape[0], "%s: dwpe shape mismatch", op);
    ZT_TRY(need_numel(op, "dout", dout, ZT_F32, B * T * C, "(B,T,C)"));
    const int32_t *tk = tokens->data;
    for (int64_t i = 0; i < B * T; i++)
        ZT_CHECK(tk[i] >= 0 && tk[i] < V, "%s: token %d at position %lld is outside the "
                 "vocabulary [0,%lld)", op, tk[i], (long long)i, (long long)V);
    zt_dev()->encoder_backward(dwte->data, dwpe->data, dout->data, tokens->data,
                               (int)B, (int)T, (int)C, (int)V);
    return ZT_OK;
}

int zt_layernorm_forward(zt_tensor *out, zt_tensor *mean, zt_tensor *rstd,
                         const zt_tensor *inp, const zt_tensor *w, const zt_tensor *b)
{
    const char *op = "zt_layernorm_forward";
    ZT_TRY(need(op, "weight", w, ZT_F32));
    int64_t C = w->numel;
    ZT_TRY(need_numel(op, "bias", b, ZT_F32, C, "(C)"));
    ZT_TRY(need(op, "inp", inp, ZT_F32));
    ZT_CHECK(last_dim(inp) == C, "%s: inp's last dim must be C=%lld", op, (long long)C);
    int64_t N = inp->numel / C;
    ZT_TRY(need_numel(op, "out", out, ZT_F32, N * C, "(N,C)"));
    ZT_TRY(need_numel(op, "mean", mean, ZT_F32, N, "(N)"));
    ZT_TRY(need_numel(op, "rstd", rstd, ZT_F32, N, "(N)"));
    zt_dev()->layernorm_forward(out->data, mean->data, rstd->data, inp->data, w->data,
                                b->data, (int)N, (int)C);
    return ZT_OK;
}

int zt_layernorm_backward(zt_tensor *dinp, zt_tensor *dw, zt_tensor *db,
                          const zt_tensor *dout, const zt_tensor *inp,
                          const zt_tensor *w, const zt_tensor *mean, const zt_tensor *rstd)
{
    const char *op = "zt_layernorm_backward";
    ZT_TRY(need(op, "weight", w, ZT_F32));
    int64_t C = w->numel;
    ZT_TRY(need(op, "inp", inp, ZT_F32));
    ZT_CHECK(last_dim(inp) == C, "%s: inp's last dim must be C=%lld", op, (long long)C);
    int64_t N = inp->numel / C;
    ZT_TRY(need_numel(op, "dinp", dinp, ZT_F32, N * C, "(N,C)"));
    ZT_TRY(need_numel(op, "dout", dout, ZT_F32, N * C, "(N,C)"));
    ZT_TRY(need_numel(op, "dweight", dw, ZT_F32, C, "(C)"));
    ZT_TRY(need_numel(op, "dbias", db, ZT_F32, C, "(C)"));
    ZT_TRY(need_numel(op, "mean", mean, ZT_F32, N, "(N)"));
    ZT_TRY(need_numel(op, "rstd", rstd, ZT_F32, N, "(N)"));
    zt_dev()->layernorm_backward(dinp->data, dw->data, db->data, dout->data, inp->data,
                                 w->data, mean->data, rstd->data, (int)N, (int)C);
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
    int64_t N = inp->numel / C;
    ZT_TRY(need_numel(op, "out", out, ZT_F32, N * OC, "(N,OC)"));
    if (b) ZT_TRY(need_numel(op, "bias", b, ZT_F32, OC, "(OC)"));
    zt_dev()->matmul_forward(out->data, inp->data, w->data, b ? b->data : NULL, (int)N,
                             (int)C, (int)OC);
    return ZT_OK;
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
    ZT_TRY(need_numel(op, "dout", dout, ZT_F32, N * OC, "(N,OC)"));
    ZT_TRY(need_numel(op, "dweight", dw, ZT_F32, OC * C, "(OC,C)"));
    if (dinp) ZT_TRY(need_numel(op, "dinp", dinp, ZT_F32, N * C, "(N,C)"));
    if (db) ZT_TRY(need_numel(op, "dbias", db, ZT_F32, OC, "(OC)"));
    zt_dev()->matmul_backward(dinp ? dinp->data : NULL, dw->data, db ? db->data : NULL,
                              dout->data, inp->data, w->data, (int)N, (int)C, (int)OC);
    return ZT_OK;
}

static int attn_dims(const char *op, const zt_tensor *qkv, int NH, int64_t *B, int64_t *T,
                     int64_t *C)
{
    char d[96];
    ZT_TRY(need(op, "qkv", qkv, ZT_F32));
    ZT_CHECK(qkv->ndim == 3 && qkv->shape[2] % 3 == 0,
             "%s: qkv must be (B,T,3C), got %s", op, desc(qkv, d, sizeof d));
    *B = qkv->shape[0]; *T = qkv->shape[1]; *C = qkv->shape[2] / 3;
    ZT_CHECK(NH >= 1 && *C % NH == 0, "%s: %d heads do not divide C=%lld", op, NH,
             (long long)*C);
    return ZT_OK;
}

int zt_attention_forward(zt_tensor *out, zt_tensor *lse, const zt_tensor *qkv, int NH)
{
    const char *op = "zt_attention_forward";
    int64_t B = 0, T = 0, C = 0;
    ZT_TRY(attn_dims(op, qkv, NH, &B, &T, &C));
    ZT_TRY(need_numel(op, "out", out, ZT_F32, B * T * C, "(B,T,C)"));
    ZT_TRY(need_numel(op, "lse", lse, ZT_F32, B * NH * T, "(B,NH,T)"));
    zt_dev()->attention_forward(out->data, lse->data, qkv->data, (int)B, (int)T, (int)C, NH);
    return ZT_OK;
}

int zt_attention_backward(zt_tensor *dqkv, const zt_tensor *dout, const zt_tensor *qkv,
                          const zt_tensor *out, const zt_tensor *lse, int NH)
{
    const char *op = "zt_attention_backward";
    int64_t B = 0, T = 0, C = 0;
    ZT_TRY(attn_dims(op, qkv, NH, &B, &T, &C));
    ZT_TRY(need_numel(op, "dqkv", dqkv, ZT_F32, B * T * 3 * C, "(B,T,3C)"));
    ZT_TRY(need_numel(op, "dout", dout, ZT_F32, B * T * C, "(B,T,C)"));
    ZT_TRY(need_numel(op, "out", out, ZT_F32, B * T * C, "(B,T,C)"));
    ZT_TRY(need_numel(op, "lse", lse, ZT_F32, B * NH * T, "(B,NH,T)"));
    zt_dev()->attention_backward(dqkv->data, dout->data, qkv->data, out->data, lse->data,
                                 (int)B, (int)T, (int)C, NH);
    return ZT_OK;
}

int zt_gelu_forward(zt_tensor *out, const zt_tensor *inp)
{
    ZT_TRY(need("zt_gelu_forward", "inp", inp, ZT_F32));
    ZT_TRY(need_numel("zt_gelu_forward", "out", out, ZT_F32, inp->numel, "(same as inp)"));
    zt_dev()->gelu_forward(out->data, inp->data, (size_t)inp->numel);
    return ZT_OK;
}

int zt_gelu_backward(zt_tensor *dinp, const zt_tensor *inp, const zt_tensor *dout)
{
    const char *op = "zt_gelu_backward";
    ZT_TRY(need(op, "inp", inp, ZT_F32));
    ZT_TRY(need_numel(op, "dout", dout, ZT_F32, inp->numel, "(same as inp)"));
    ZT_TRY(need_numel(op, "dinp", dinp, ZT_F32, inp->numel, "(same as inp)"));
    zt_dev()->gelu_backward(dinp->data, inp->data, dout->data, (size_t)inp->numel);
    return ZT_OK;
}

int zt_crossentropy(zt_tensor *losses, zt_tensor *dlogits, const zt_tensor *logits,
                    const zt_tensor *targets, float dscale)
{
    const char *op = "zt_crossentropy";
    ZT_TRY(need(op, "logits", logits, ZT_F32));
    ZT_TRY(need(op, "targets", targets, ZT_I32));
    int64_t N = targets->numel;
    ZT_CHECK(logits->numel % N == 0, "%s: logits must be (N,V) with N=%lld targets", op,
             (long long)N);
    int64_t V = logits->numel / N;
    ZT_CHECK(last_dim(logits) == V, "%s: logits' last dim must be V=%lld", op, (long long)V);
    ZT_TRY(need_numel(op, "losses", losses, ZT_F32, N, "(N)"));
    if (dlogits) ZT_TRY(need_numel(op, "dlogits", dlogits, ZT_F32, N * V, "(N,V)"));
    const int32_t *tg = targets->data;
    for (int64_t i = 0; i < N; i++)
        ZT_CHECK(tg[i] >= 0 && tg[i] < V, "%s: target %d at %lld outside [0,%lld)", op,
                 tg[i], (long long)i, (long long)V);
    zt_dev()->crossentropy(losses->data, dlogits ? dlogits->data : NULL, logits->data, tg,
                           (int)N, (int)V, dscale);
    return ZT_OK;
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
    zt_dev()->adamw(p->data, g->data, m->data, v->data, (size_t)p->numel, lr, b1, b2, eps,
                    wd, gscale, step);
    return ZT_OK;
}

int64_t zt_sum_block(void) { return ZK_SUM_BLOCK; }

int zt_sumsq_blocks(double *partials, const zt_tensor *x)
{
    ZT_CHECK(partials != NULL, "zt_sumsq_blocks: partials is NULL");
    ZT_TRY(need("zt_sumsq_blocks", "x", x, ZT_F32));
    zt_dev()->sumsq_blocks(partials, x->data, (size_t)x->numel);
    return ZT_OK;
}

int zt_sum(double *out, const zt_tensor *x)
{
    ZT_CHECK(out != NULL, "zt_sum: out is NULL");
    ZT_TRY(need("zt_sum", "x", x, ZT_F32));
    *out = zt_dev()->sum(x->data, (size_t)x->numel);
    return ZT_OK;
}

int zt_randn(zt_tensor *x, uint64_t seed, uint64_t stream, float mean, float std)
{
    ZT_TRY(need("zt_randn", "x", x, ZT_F32));
    ZT_CHECK(std >= 0, "zt_randn: std must be >= 0, got %g", (double)std);
    zt_dev()->randn(x->data, (size_t)x->numel, seed, stream, mean, std);
    return ZT_OK;
}
