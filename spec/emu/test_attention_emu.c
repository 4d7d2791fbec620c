/*
 * test_attention_emu.c -- kernels/cuda/attention.cu's own source (the plain
 * kernels: one warp a row) run on the CPU under spec/emu/cuda_emu.h against
 * the CPU twin (zk_attention_*_gqa): grouped-query heads (NKV 1, 2 and NH)
 * and sliding windows (1, inside a row, wider than T). Not the same bits --
 * the GPU kernel sums a row's keys one by one, the CPU in tiles -- so
 * within fp32 rounding: forward out and lse, backward dq, dk, dv (a kv
 * head's dk, dv summed over its query heads by one warp). Bit for bit:
 * decode rows (a prefill, then single steps; caches (B,NKV,maxT,hs)) against
 * the emulated forward's rows, the bf16-I/O kernels (qkv, out, dqkv and
 * the backward's dout bf16) against the f32 ones on the widened inputs,
 * rounded once, and the GPT-2 entry points against NKV = NH, W = 0; the
 * bf16-I/O backward also against the CPU twin's (zk_attention_backward_
 * gqa_bb, the same bf16 inputs) within fp32 rounding and one bf16 step.
 * Run: sh tools/emu_kernel.sh attention.
 */
#include <math.h>
#include <string.h>
#include "ctest.h"
#include "kernels.h"

int zkc_attention_forward(void *s, void *out, float *lse, const void *qkv, int io16,
                          int B, int T, int C, int NH);
int zkc_attention_backward(void *s, void *dqkv, const void *dout, const void *qkv,
                           const void *out, const float *lse, int io16, int B, int T, int C,
                           int NH, float *scratch);
int zkc_attention_forward_gqa(void *s, void *out, float *lse, const void *qkv, int io16,
                              int B, int T, int C, int NH, int NKV, int W);
int zkc_attention_backward_gqa(void *s, void *dqkv, const void *dout, const void *qkv,
                               const void *out, const float *lse, int io16, int B, int T, int C,
                               int NH, int NKV, int W, float *scratch);
int zkc_attention_decode_gqa(void *s, float *out, float *kcache, float *vcache,
                             const float *qkv, int B, int T, int C, int NH, int NKV, int W,
                             int maxT, int pos);

static void one(int B, int T, int NH, int NKV, int hs, int W)
{
    char name[192], tag[96];
    snprintf(tag, sizeof tag, "B=%d T=%d NH=%d NKV=%d hs=%d W=%d", B, T, NH, NKV, hs, W);
    int C = NH * hs, R = (NH + 2 * NKV) * hs;
    size_t nq = (size_t)B * T * R, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = ct_rand(nq, -1.5f, 1.5f), *dy = ct_rand(no, -1, 1);
    float *o = ct_alloc(no * 4), *l = ct_alloc(nl * 4), *d = ct_alloc(nq * 4);
    float *eo = ct_rand(no, 9, 10), *el = ct_rand(nl, 9, 10), *ed = ct_rand(nq, 9, 10);
    float *scratch = ct_alloc(nl * 4);
    zk_attention_forward_gqa(o, l, qkv, B, T, C, NH, NKV, W);
    zk_attention_backward_gqa(d, dy, qkv, o, l, B, T, C, NH, NKV, W);
    int rc = zkc_attention_forward_gqa(NULL, eo, el, qkv, 0, B, T, C, NH, NKV, W);
    rc |= zkc_attention_backward_gqa(NULL, ed, dy, qkv, eo, el, 0, B, T, C, NH, NKV, W, scratch);
    snprintf(name, sizeof name, "emu attention %s: rc", tag);
    ct_check(rc == 0, name, "rc %d", rc);
    snprintf(name, sizeof name, "emu attention forward %s out vs the CPU", tag);
    ct_close_f(name, eo, o, no, 2e-6, 1e-5);
    snprintf(name, sizeof name, "emu attention forward %s lse vs the CPU", tag);
    ct_close_f(name, el, l, nl, 2e-6, 1e-5);
    snprintf(name, sizeof name, "emu attention backward %s dqkv vs the CPU", tag);
    ct_close_f(name, ed, d, nq, 1e-5, 1e-4);

    /* decode: a prefill of T - 3, then three single steps: the emulated forward's rows */
    int maxT = T + 2;
    size_t nc = (size_t)B * NKV * maxT * hs;
    float *kc = ct_rand(nc, 9, 10), *vc = ct_rand(nc, 9, 10), *got = ct_rand(no, 9, 10);
    int pos = 0, ok = 1;
    while (pos < T) {
        int n = pos == 0 ? T - 3 : 1;
        float *q = ct_alloc((size_t)B * n * R * 4), *out = ct_alloc((size_t)B * n * C * 4);
        for (int b = 0; b < B; b++)
            memcpy(q + (size_t)b * n * R, qkv + ((size_t)b * T + pos) * R, (size_t)n * R * 4);
        ok &= zkc_attention_decode_gqa(NULL, out, kc, vc, q, B, n, C, NH, NKV, W, maxT, pos) == 0;
        for (int b = 0; b < B; b++)
            memcpy(got + ((size_t)b * T + pos) * C, out + (size_t)b * n * C, (size_t)n * C * 4);
        free(q); free(out);
        pos += n;
    }
    snprintf(name, sizeof name, "emu attention decode %s: the emulated forward's rows, bits", tag);
    ct_check(ok && !memcmp(got, eo, no * 4), name, "rc or rows differ");
    for (int b = 0; b < B; b++)
        for (int g = 0; g < NKV; g++)
            for (int t = 0; t < T; t++) {
                size_t c = (((size_t)b * NKV + g) * maxT + t) * hs;
                const float *row = qkv + ((size_t)b * T + t) * R + C + (size_t)g * hs;
                ok &= !memcmp(kc + c, row, hs * 4) && !memcmp(vc + c, row + (size_t)NKV * hs, hs * 4);
            }
    snprintf(name, sizeof name, "emu attention decode %s: caches (B,NKV,maxT,hs)", tag);
    ct_check(ok, name, "a cache row differs");

    /* bf16 I/O: round(f32 kernel(widened)), bit for bit; the backward's
     * dout bf16 too (dy16, widened dyw for the f32 run) */
    uint16_t *q16 = ct_alloc(nq * 2), *o16 = ct_alloc(no * 2), *d16 = ct_alloc(nq * 2);
    uint16_t *wo = ct_alloc(no * 2), *wd = ct_alloc(nq * 2), *dy16 = ct_alloc(no * 2);
    uint16_t *cd16 = ct_alloc(nq * 2);
    float *qw = ct_alloc(nq * 4), *ow = ct_alloc(no * 4), *l16 = ct_alloc(nl * 4);
    float *dyw = ct_alloc(no * 4), *gw = ct_alloc(nq * 4), *cw = ct_alloc(nq * 4);
    zk_cast_f32_bf16(q16, qkv, nq);
    zk_cast_bf16_f32(qw, q16, nq);
    zk_cast_f32_bf16(dy16, dy, no);
    zk_cast_bf16_f32(dyw, dy16, no);
    rc = zkc_attention_forward_gqa(NULL, eo, el, qw, 0, B, T, C, NH, NKV, W);
    rc |= zkc_attention_forward_gqa(NULL, o16, l16, q16, 1, B, T, C, NH, NKV, W);
    zk_cast_f32_bf16(wo, eo, no);
    zk_cast_bf16_f32(ow, o16, no);
    for (size_t i = 0; i < nq; i++) d16[i] = 0x7fc1;   /* WRITTEN: every element */
    rc |= zkc_attention_backward_gqa(NULL, ed, dyw, qw, ow, l16, 0, B, T, C, NH, NKV, W, scratch);
    rc |= zkc_attention_backward_gqa(NULL, d16, dy16, q16, o16, l16, 1, B, T, C, NH, NKV, W, scratch);
    zk_cast_f32_bf16(wd, ed, nq);
    snprintf(name, sizeof name, "emu attention bf16 I/O %s: round(f32(widened)), bits", tag);
    ct_check(rc == 0 && !memcmp(o16, wo, no * 2) && !memcmp(l16, el, nl * 4) &&
             !memcmp(d16, wd, nq * 2), name, "rc %d; out, lse or dqkv differs", rc);
    /* the CPU twin's bf16-I/O backward on the same bf16 inputs: within the
     * f32 tolerance above plus one bf16 step (2^-7 relative) */
    rc = zk_attention_backward_gqa_bb(cd16, dy16, q16, o16, l16, B, T, C, NH, NKV, W);
    zk_cast_bf16_f32(gw, d16, nq);
    zk_cast_bf16_f32(cw, cd16, nq);
    snprintf(name, sizeof name, "emu attention bf16 I/O %s: dqkv vs the CPU's _bb: rc", tag);
    ct_check(rc == 0, name, "rc %d", rc);
    snprintf(name, sizeof name, "emu attention bf16 I/O %s: dqkv vs the CPU's _bb", tag);
    ct_close_f(name, gw, cw, nq, 1e-5, 1e-4 + 0x1p-7);
    free(qkv); free(dy); free(o); free(l); free(d); free(eo); free(el); free(ed); free(scratch);
    free(kc); free(vc); free(got); free(q16); free(o16); free(d16); free(wo); free(wd);
    free(qw); free(ow); free(l16); free(dy16); free(cd16); free(dyw); free(gw); free(cw);
}

/* the GPT-2 entry points are NKV = NH, W = 0, bit for bit */
static void gpt2(void)
{
    int B = 2, T = 9, NH = 2, hs = 8, C = NH * hs;
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = ct_rand(nq, -1.5f, 1.5f), *dy = ct_rand(no, -1, 1), *s = ct_alloc(nl * 4);
    float *o[2], *l[2], *d[2];
    for (int k = 0; k < 2; k++) { o[k] = ct_alloc(no * 4); l[k] = ct_alloc(nl * 4); d[k] = ct_alloc(nq * 4); }
    int rc = zkc_attention_forward(NULL, o[0], l[0], qkv, 0, B, T, C, NH) |
             zkc_attention_backward(NULL, d[0], dy, qkv, o[0], l[0], 0, B, T, C, NH, s) |
             zkc_attention_forward_gqa(NULL, o[1], l[1], qkv, 0, B, T, C, NH, NH, 0) |
             zkc_attention_backward_gqa(NULL, d[1], dy, qkv, o[1], l[1], 0, B, T, C, NH, NH, 0, s);
    ct_check(rc == 0 && !memcmp(o[0], o[1], no * 4) && !memcmp(l[0], l[1], nl * 4) &&
             !memcmp(d[0], d[1], nq * 4), "emu attention: the GPT-2 calls = NKV = NH, W = 0, bits",
             "rc %d or outputs differ", rc);
    rc = zkc_attention_forward_gqa(NULL, o[1], l[1], qkv, 0, B, T, C, 3, 2, 0);
    ct_check(rc != 0, "emu attention: NH % NKV != 0 refused", "rc %d", rc);
    for (int k = 0; k < 2; k++) { free(o[k]); free(l[k]); free(d[k]); }
    free(qkv); free(dy); free(s);
}

int main(void)
{
    ct_seed(5);
    one(2, 11, 4, 2, 8, 0);      /* GQA, plain causal */
    one(1, 13, 4, 1, 5, 4);      /* MQA, a window inside the rows, hs not a lane multiple */
    one(1, 9, 2, 2, 40, 1);      /* NKV = NH, window 1, hs > 32: two values a lane */
    one(2, 7, 6, 3, 4, 30);      /* window > T */
    gpt2();
    return ct_summary();
}
