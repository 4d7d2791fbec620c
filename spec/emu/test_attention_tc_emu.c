/*
 * test_attention_tc_emu.c -- kernels/cuda/attention_tc_*.cu's own source run
 * on the CPU under spec/emu/cuda_emu.h (threads, barriers, mma.sync and
 * ldmatrix by their per-lane register layouts), against the CPU twin with
 * the tolerances of test_cuda.c (spec/c/attn_tc_check.h), head sizes 64
 * and 128. Catches indexing, masking, tile
 * offsets, fragment layouts and alignment, and (as races) missing syncs;
 * not the hardware's rounding or speed. The bf16-I/O kernels (io16) too,
 * bit for bit against the fp32 kernels on the widened inputs, their
 * outputs rounded once (zk_cast_f32_bf16): the forward's out and lse, the
 * backward's dqkv from the bf16 forward's own out and a bf16 dout (the
 * fp32 run reads both widened: dy is bf16-valued, so dy itself is the
 * widened dout). Run: sh tools/emu_kernel.sh attention_tc.
 */
#include "ctest.h"
#include "kernels.h"
#include "attn_tc_check.h"

int zkc_attention_forward_tc(void *s, void *out, float *lse, const void *qkv, int io16,
                             int B, int T, int C, int NH);
int zkc_attention_backward_tc(void *s, void *dqkv, const void *dout, const void *qkv,
                              const void *out, const float *lse, int io16, int B, int T, int C,
                              int NH, float *scratch);
int zkc_attention_forward_tc_gqa(void *s, void *out, float *lse, const void *qkv, int io16,
                                 int B, int T, int C, int NH, int NKV, int W);
int zkc_attention_backward_tc_gqa(void *s, void *dqkv, const void *dout, const void *qkv,
                                  const void *out, const float *lse, int io16, int B, int T, int C,
                                  int NH, int NKV, int W, float *scratch);
int zkc_attention_tc_ordered_dq(int on);
int zkc_attention_tc_fwd_wide(int on);
int zkc_attention_tc_fwd_pair(int on);
int zkc_attention_tc_bwd_wide(int on);
int zkc_attention_tc_bwd_wide64(int on);
size_t zkc_attention_backward_tc_scratch(int io16, int B, int T, int C, int NH);
void emu_set_block_order(int o);             /* spec/emu/cuda_emu.h */
void emu_set_cp_early(int on);
void emu_set_warp_major(int on);

/* -DZKC_ATTN_TC_DQ_ATOMIC (EMU_DEFS, passed here too): the io16 backward
 * is refused */
#ifdef ZKC_ATTN_TC_DQ_ATOMIC
#define DQA 1
#else
#define DQA 0
#endif

static uint16_t *to_bf16(const float *x, size_t n)
{
    uint16_t *h = malloc(n * 2);
    zk_cast_f32_bf16(h, x, n);
    return h;
}
static void same16(const char *name, const uint16_t *got, const float *f32, size_t n)
{
    uint16_t *want = to_bf16(f32, n);
    size_t i = 0;
    while (i < n && got[i] == want[i]) i++;
    ct_check(i == n, name, "element %zu of %zu: got 0x%04x want 0x%04x (f32 %.9g)", i, n,
             i < n ? got[i] : 0, i < n ? want[i] : 0, i < n ? (double)f32[i] : 0.0);
    free(want);
}

/* io16: out, lse, dqkv of the bf16-I/O kernels against the fp32 kernels'
 * on the same (bf16-valued) qkv, dy: out16 = bf16(out), lse the same bits;
 * dqkv16 = bf16(the fp32 backward given widen(out16) and dy = widen(dy16)),
 * every element written (prefilled with a NaN) */
static void one16(const char *at, const float *qkv, const float *dy, const float *go,
                  const float *gl, int B, int T, int C, int NH)
{
    char name[256];
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    uint16_t *q16 = to_bf16(qkv, nq), *o16 = malloc(no * 2), *dq16 = malloc(nq * 2);
    uint16_t *dy16 = to_bf16(dy, no);             /* dy's own values (bf16-valued) */
    float *l16 = malloc(nl * 4), *ow = malloc(no * 4), *dqw = malloc(nq * 4), *scratch = malloc(nl * 4);
    for (size_t i = 0; i < nq; i++) { dq16[i] = 0x7fc1; dqw[i] = NAN; }
    int rc = zkc_attention_forward_tc(NULL, o16, l16, q16, 1, B, T, C, NH);
    snprintf(name, sizeof name, "%s io16: forward returns 0", at);
    ct_check(rc == 0, name, "rc %d", rc);
    snprintf(name, sizeof name, "%s io16: out = bf16(the fp32 kernel's out), bit for bit", at);
    same16(name, o16, go, no);
    snprintf(name, sizeof name, "%s io16: lse the fp32 kernel's bits", at);
    ct_check(!memcmp(l16, gl, nl * 4), name, "lse differs");
    zk_cast_bf16_f32(ow, o16, no);
    int r1 = zkc_attention_backward_tc(NULL, dqw, dy, qkv, ow, l16, 0, B, T, C, NH, scratch);
    int r2 = zkc_attention_backward_tc(NULL, dq16, dy16, q16, o16, l16, 1, B, T, C, NH, scratch);
    if (DQA) {
        snprintf(name, sizeof name, "%s io16: the atomic build refuses the backward", at);
        ct_check(r1 == 0 && r2 == 1, name, "fp32 rc %d, io16 rc %d", r1, r2);
    } else {
        snprintf(name, sizeof name, "%s io16: backward returns 0", at);
        ct_check(r1 == 0 && r2 == 0, name, "fp32 rc %d, io16 rc %d", r1, r2);
        snprintf(name, sizeof name, "%s io16: dqkv = bf16(fp32 kernel(widened out, dout)), all written", at);
        same16(name, dq16, dqw, nq);
    }
    free(q16); free(o16); free(dq16); free(dy16); free(l16); free(ow); free(dqw); free(scratch);
}

static void one(int B, int T, int NH, int hs)
{
    char name[128];
    const int C = hs * NH;
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = ct_rand(nq, -2, 2), *dy = ct_rand(no, -1, 1);
    tc_round_bf16(qkv, nq); tc_round_bf16(dy, no);
    float *o = malloc(no * 4), *l = malloc(nl * 4), *dq = malloc(nq * 4);
    double *mo = malloc(no * 8), *ml = malloc(nl * 8), *mdq = malloc(nq * 8);
    zk_attention_forward(o, l, qkv, B, T, C, NH);
    zk_attention_backward(dq, dy, qkv, o, l, B, T, C, NH);
    tc_mags(mo, ml, mdq, qkv, dy, B, T, C, NH);
    float *go[2], *gl[2], *gq[2], *scratch = malloc(nl * 4);
    int rc = 0;
    for (int r = 0; r < 2; r++) {
        go[r] = malloc(no * 4); gl[r] = malloc(nl * 4); gq[r] = malloc(nq * 4);
        for (size_t i = 0; i < nq; i++) gq[r][i] = NAN;       /* WRITTEN: every element */
        rc |= zkc_attention_forward_tc(NULL, go[r], gl[r], qkv, 0, B, T, C, NH);
        rc |= zkc_attention_backward_tc(NULL, gq[r], dy, qkv, go[r], gl[r], 0, B, T, C, NH, scratch);
    }
    snprintf(name, sizeof name, "emu B=%d T=%d NH=%d hs=%d: launchers return 0", B, T, NH, hs);
    ct_check(rc == 0, name, "rc %d", rc);
    snprintf(name, sizeof name, "emu B=%d T=%d NH=%d hs=%d: out", B, T, NH, hs);
    tc_check(name, go[0], o, mo, no, TC_RHO);
    snprintf(name, sizeof name, "emu B=%d T=%d NH=%d hs=%d: lse", B, T, NH, hs);
    tc_check(name, gl[0], l, ml, nl, 1.0);
    snprintf(name, sizeof name, "emu B=%d T=%d NH=%d hs=%d: dqkv", B, T, NH, hs);
    tc_check(name, gq[0], dq, mdq, nq, TC_RHO);
    snprintf(name, sizeof name, "emu B=%d T=%d NH=%d hs=%d: the same bits twice", B, T, NH, hs);
    ct_check(!memcmp(go[0], go[1], no * 4) && !memcmp(gl[0], gl[1], nl * 4) &&
             !memcmp(gq[0], gq[1], nq * 4), name, "out, lse or dqkv differ");
    snprintf(name, sizeof name, "emu B=%d T=%d NH=%d hs=%d", B, T, NH, hs);
    one16(name, qkv, dy, go[0], gl[0], B, T, C, NH);
    free(qkv); free(dy); free(o); free(l); free(dq); free(mo); free(ml); free(mdq); free(scratch);
    for (int r = 0; r < 2; r++) { free(go[r]); free(gl[r]); free(gq[r]); }
}

/* A problem in zk_attention_*_gqa's layout and the CPU twin's answer:
 * qkv (rows of R = C + 2 NKV hs) and dy, random and rounded to bf16 (both
 * sides see the same inputs), the CPU's out, lse and dqkv, and
 * attn_tc_check.h's magnitudes of each */
typedef struct cpu_ref {
    float *qkv, *dy, *o, *l, *dq;
    double *mo, *ml, *mq;
} cpu_ref;
static cpu_ref ref_make(int B, int T, int NH, int NKV, int hs, int W)
{
    const int C = NH * hs, R = (NH + 2 * NKV) * hs;
    size_t nq = (size_t)B * T * R, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    cpu_ref f = { ct_rand(nq, -2, 2), ct_rand(no, -1, 1), malloc(no * 4), malloc(nl * 4),
                  malloc(nq * 4), malloc(no * 8), malloc(nl * 8), malloc(nq * 8) };
    tc_round_bf16(f.qkv, nq); tc_round_bf16(f.dy, no);
    zk_attention_forward_gqa(f.o, f.l, f.qkv, B, T, C, NH, NKV, W);
    zk_attention_backward_gqa(f.dq, f.dy, f.qkv, f.o, f.l, B, T, C, NH, NKV, W);
    tc_mags_gqa(f.mo, f.ml, f.mq, f.qkv, f.dy, B, T, C, NH, NKV, W);
    return f;
}
static void ref_free(cpu_ref *f)
{
    free(f->qkv); free(f->dy); free(f->o); free(f->l); free(f->dq);
    free(f->mo); free(f->ml); free(f->mq);
}

/* Grouped-query heads and a sliding window (zkc_attention_*_tc_gqa):
 * out, lse and dqkv against the CPU twin (zk_attention_*_gqa) at
 * attn_tc_check.h's tolerances (tc_mags_gqa: the window's rows, a kv
 * head's dk, dv magnitudes summed over its query heads); every dqkv
 * element WRITTEN; the same bits twice; without a window, out, lse and dq
 * the bits of the same problem with every kv head copied to its query
 * heads (a query head reads the same k, v tiles either way); a window
 * >= T the bits of none; (io) io16 = round(f32(widened)), bits. */
static void gqa(int B, int T, int NH, int NKV, int hs, int W, int io)
{
    char name[192], tag[80];
    snprintf(tag, sizeof tag, "emu gqa B=%d T=%d NH=%d NKV=%d hs=%d W=%d", B, T, NH, NKV, hs, W);
    const int C = NH * hs, R = (NH + 2 * NKV) * hs, G = NH / NKV;
    size_t nq = (size_t)B * T * R, nx = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
    size_t nl = (size_t)B * NH * T;
    cpu_ref f = ref_make(B, T, NH, NKV, hs, W);
    float *qkv = f.qkv, *dy = f.dy, *o = f.o, *l = f.l, *dq = f.dq, *qx = malloc(nx * 4);
    double *mo = f.mo, *ml = f.ml, *mq = f.mq;
    for (int b = 0; b < B; b++)                  /* expanded: kv head h / G copied to head h */
        for (int t = 0; t < T; t++) {
            const float *src = qkv + ((size_t)b * T + t) * R;
            float *dst = qx + ((size_t)b * T + t) * 3 * C;
            memcpy(dst, src, (size_t)C * 4);
            for (int h = 0; h < NH; h++) {
                memcpy(dst + C + h * hs, src + C + (h / G) * hs, (size_t)hs * 4);
                memcpy(dst + 2 * C + h * hs, src + C + (NKV + h / G) * hs, (size_t)hs * 4);
            }
        }
    float *scratch = malloc(nl * 4);
    float *go[3], *gl[3], *gq[3];
    int rc = 0, nrun = W >= T ? 3 : 2;           /* twice; then W = 0 for a window >= T */
    for (int r = 0; r < 3; r++) {
        go[r] = gl[r] = gq[r] = NULL;
        if (r >= nrun) continue;
        go[r] = malloc(no * 4); gl[r] = malloc(nl * 4); gq[r] = malloc(nq * 4);
        for (size_t i = 0; i < nq; i++) gq[r][i] = NAN;       /* WRITTEN: every element */
        int w = r < 2 ? W : 0;
        rc |= zkc_attention_forward_tc_gqa(NULL, go[r], gl[r], qkv, 0, B, T, C, NH, NKV, w);
        rc |= zkc_attention_backward_tc_gqa(NULL, gq[r], dy, qkv, go[r], gl[r], 0, B, T, C, NH, NKV, w,
                                            scratch);
    }
    snprintf(name, sizeof name, "%s: launchers return 0", tag);
    ct_check(rc == 0, name, "rc %d", rc);
    snprintf(name, sizeof name, "%s: out vs the CPU", tag);
    tc_check(name, go[0], o, mo, no, TC_RHO);
    snprintf(name, sizeof name, "%s: lse vs the CPU", tag);
    tc_check(name, gl[0], l, ml, nl, 1.0);
    snprintf(name, sizeof name, "%s: dqkv (dk, dv summed over the group) vs the CPU", tag);
    tc_check(name, gq[0], dq, mq, nq, TC_RHO);
    snprintf(name, sizeof name, "%s: the same bits twice", tag);
    ct_check(!memcmp(go[0], go[1], no * 4) && !memcmp(gl[0], gl[1], nl * 4) &&
             !memcmp(gq[0], gq[1], nq * 4), name, "out, lse or dqkv differ");
    if (W == 0 || W >= T) {
        float *xo = malloc(no * 4), *xl = malloc(nl * 4), *xq = malloc(nx * 4);
        int rx = zkc_attention_forward_tc(NULL, xo, xl, qx, 0, B, T, C, NH);
        rx |= zkc_attention_backward_tc(NULL, xq, dy, qx, xo, xl, 0, B, T, C, NH, scratch);
        int dq_same = 1;
        for (size_t r = 0; r < (size_t)B * T; r++)
            dq_same &= !memcmp(gq[0] + r * R, xq + r * 3 * C, (size_t)C * 4);
        snprintf(name, sizeof name, "%s: out, lse, dq the expanded problem's bits", tag);
        ct_check(rx == 0 && !memcmp(go[0], xo, no * 4) && !memcmp(gl[0], xl, nl * 4) && dq_same,
                 name, "differ");
        if (nrun == 3) {
            snprintf(name, sizeof name, "%s: W = 0's bits", tag);
            ct_check(!memcmp(go[0], go[2], no * 4) && !memcmp(gl[0], gl[2], nl * 4) &&
                     !memcmp(gq[0], gq[2], nq * 4), name, "differ");
        }
        free(xo); free(xl); free(xq);
    }
    if (io && !DQA) {                            /* io16: round(f32 kernel(widened)) */
        uint16_t *q16 = to_bf16(qkv, nq), *o16 = malloc(no * 2), *d16 = malloc(nq * 2);
        uint16_t *dy16 = to_bf16(dy, no);         /* dy = widen(dy16) */
        float *l16 = malloc(nl * 4);
        for (size_t i = 0; i < nq; i++) d16[i] = 0x7fc1;       /* WRITTEN: every element */
        int r16 = zkc_attention_forward_tc_gqa(NULL, o16, l16, q16, 1, B, T, C, NH, NKV, W);
        r16 |= zkc_attention_backward_tc_gqa(NULL, d16, dy16, q16, o16, l16, 1, B, T, C, NH, NKV, W,
                                             scratch);
        float *ow = malloc(no * 4), *dw = malloc(nq * 4);
        zk_cast_bf16_f32(ow, o16, no);
        r16 |= zkc_attention_backward_tc_gqa(NULL, dw, dy, qkv, ow, l16, 0, B, T, C, NH, NKV, W,
                                             scratch);
        snprintf(name, sizeof name, "%s io16: returns 0, lse the fp32 kernel's bits", tag);
        ct_check(r16 == 0 && !memcmp(l16, gl[0], nl * 4), name, "rc %d", r16);
        snprintf(name, sizeof name, "%s io16: out = bf16(the fp32 kernel's)", tag);
        same16(name, o16, go[0], no);
        snprintf(name, sizeof name, "%s io16: dqkv = bf16(fp32 kernel(widened out, dout))", tag);
        same16(name, d16, dw, nq);
        free(q16); free(o16); free(d16); free(dy16); free(l16); free(ow); free(dw);
    }
    int e = zkc_attention_forward_tc_gqa(NULL, go[0], gl[0], qkv, 0, B, T, C, NH, NH + 1, 0);
    int e2 = zkc_attention_forward_tc_gqa(NULL, go[0], gl[0], qkv, 0, B, T, C, NH, NKV, -1);
    snprintf(name, sizeof name, "%s: NH %% NKV != 0 or W < 0 is cudaErrorInvalidValue", tag);
    ct_check(e == 1 && e2 == 1, name, "rc %d %d", e, e2);
    ref_free(&f);
    free(qx); free(scratch);
    for (int r = 0; r < 3; r++) { free(go[r]); free(gl[r]); free(gq[r]); }
}

/* The ordered dQ (zkc_attention_tc_ordered_dq(1): dQ made in the dK/dV
 * kernel, each query chunk's parts added in a fixed key-tile order by
 * blocks that take tickets and wait on counts; cuda_emu.h aborts a wait
 * that no earlier block can end, a deadlock on a GPU). dqkv against the
 * CPU twin at attn_tc_check.h's tolerances, every element written; the
 * same bits with the grid's blocks run in reverse order (the tickets, not
 * blockIdx, give the work and the order); dk, dv the two-pass kernels'
 * bits (the same code and D); io16 = round(the fp32 ordered kernel on the
 * widened out, dout), bit for bit. */
static void ordered(int B, int T, int NH, int NKV, int hs, int W)
{
    char name[192], tag[96];
    snprintf(tag, sizeof tag, "emu ordered dQ B=%d T=%d NH=%d NKV=%d hs=%d W=%d", B, T, NH, NKV, hs, W);
    const int C = NH * hs, R = (NH + 2 * NKV) * hs;
    size_t nq = (size_t)B * T * R, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    int on = zkc_attention_tc_ordered_dq(1);
    if (DQA) {                                   /* that build has no ordered dQ */
        snprintf(name, sizeof name, "%s: the atomic build refuses it", tag);
        ct_check(on == 0, name, "mode %d", on);
        return;
    }
    cpu_ref f = ref_make(B, T, NH, NKV, hs, W);
    float *qkv = f.qkv, *dy = f.dy, *dq = f.dq, *go = malloc(no * 4), *gl = malloc(nl * 4), *d[3];
    float *scratch = malloc(zkc_attention_backward_tc_scratch(1, B, T, C, NH) * 4);
    int rc = zkc_attention_forward_tc_gqa(NULL, go, gl, qkv, 0, B, T, C, NH, NKV, W);
    for (int r = 0; r < 3; r++) {                /* two-pass; ordered; ordered, blocks reversed */
        d[r] = malloc(nq * 4);
        for (size_t i = 0; i < nq; i++) d[r][i] = NAN;
        zkc_attention_tc_ordered_dq(r > 0);
        emu_set_block_order(r == 2);
        rc |= zkc_attention_backward_tc_gqa(NULL, d[r], dy, qkv, go, gl, 0, B, T, C, NH, NKV, W, scratch);
    }
    emu_set_block_order(0);
    snprintf(name, sizeof name, "%s: launchers return 0", tag);
    ct_check(rc == 0, name, "rc %d", rc);
    snprintf(name, sizeof name, "%s: dqkv vs the CPU, every element written", tag);
    tc_check(name, d[1], dq, f.mq, nq, TC_RHO);
    snprintf(name, sizeof name, "%s: the same bits with the blocks run in reverse", tag);
    ct_check(!memcmp(d[1], d[2], nq * 4), name, "dqkv differs");
    size_t at = 0;
    while (at < (size_t)B * T && !memcmp(d[0] + at * R + C, d[1] + at * R + C, (size_t)(R - C) * 4)) at++;
    snprintf(name, sizeof name, "%s: dk, dv the two-pass kernels' bits", tag);
    ct_check(at == (size_t)B * T, name, "row %zu differs", at);
    {
        uint16_t *q16 = to_bf16(qkv, nq), *o16 = malloc(no * 2), *d16 = malloc(nq * 2);
        uint16_t *dy16 = to_bf16(dy, no);
        float *l16 = malloc(nl * 4), *ow = malloc(no * 4), *dw = malloc(nq * 4);
        for (size_t i = 0; i < nq; i++) d16[i] = 0x7fc1;
        int r16 = zkc_attention_forward_tc_gqa(NULL, o16, l16, q16, 1, B, T, C, NH, NKV, W);
        zk_cast_bf16_f32(ow, o16, no);
        emu_set_block_order(1);
        r16 |= zkc_attention_backward_tc_gqa(NULL, d16, dy16, q16, o16, l16, 1, B, T, C, NH, NKV, W,
                                             scratch);
        emu_set_block_order(0);
        r16 |= zkc_attention_backward_tc_gqa(NULL, dw, dy, qkv, ow, l16, 0, B, T, C, NH, NKV, W, scratch);
        snprintf(name, sizeof name, "%s io16: returns 0", tag);
        ct_check(r16 == 0, name, "rc %d", r16);
        snprintf(name, sizeof name, "%s io16: dqkv = bf16(fp32 kernel(widened out, dout))", tag);
        same16(name, d16, dw, nq);
        free(q16); free(o16); free(d16); free(dy16); free(l16); free(ow); free(dw);
    }
    zkc_attention_tc_ordered_dq(0);
    ref_free(&f);
    free(go); free(gl); free(scratch);
    for (int r = 0; r < 3; r++) free(d[r]);
}

/* The forward's other block shapes, each switched on in turn against the
 * default: head size 128's wide forward (zkc_attention_tc_fwd_wide(1): 8
 * warps, 128 rows a block, the next tile prefetched) and the pair forward
 * at head sizes 64 and 128 (zkc_attention_tc_fwd_pair(1): 4 warps of 32
 * rows, the next K, V tile staged by cp.async into a second buffer). Every
 * row sees the same tiles in the same order as in the default blocks (a
 * warp or m-tile skips the tiles after its rows, and outside its rows'
 * windows), so out and lse have the default forward's bits, fp32 and bf16
 * I/O; and out against the CPU twin. The pair runs again with each
 * cp.async landing at issue and each warp run from barrier to barrier
 * before the next (a stage into a buffer a warp still reads shows). */
static void variant(const char *what, int (*set)(int), int B, int T, int NH, int NKV, int hs, int W)
{
    char name[256], tag[112];
    snprintf(tag, sizeof tag, "emu %s forward B=%d T=%d NH=%d NKV=%d hs=%d W=%d", what, B, T, NH, NKV, hs, W);
    const int C = NH * hs, R = (NH + 2 * NKV) * hs, runs = set == zkc_attention_tc_fwd_pair ? 3 : 2;
    size_t nq = (size_t)B * T * R, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    cpu_ref f = ref_make(B, T, NH, NKV, hs, W);
    float *qkv = f.qkv;
    uint16_t *q16 = to_bf16(qkv, nq), *h[3];
    float *go[3], *gl[3], *hl[3];
    int rc = 0;
    for (int r = 0; r < runs; r++) {             /* default, the variant, (pair) the variant warp-major */
        go[r] = malloc(no * 4); gl[r] = malloc(nl * 4); h[r] = malloc(no * 2); hl[r] = malloc(nl * 4);
        rc |= set(r > 0) != (r > 0);
        emu_set_cp_early(r == 2);
        emu_set_warp_major(r == 2);
        rc |= zkc_attention_forward_tc_gqa(NULL, go[r], gl[r], qkv, 0, B, T, C, NH, NKV, W);
        rc |= zkc_attention_forward_tc_gqa(NULL, h[r], hl[r], q16, 1, B, T, C, NH, NKV, W);
    }
    set(0);
    emu_set_cp_early(0);
    emu_set_warp_major(0);
    snprintf(name, sizeof name, "%s: returns 0", tag);
    ct_check(rc == 0, name, "rc %d", rc);
    snprintf(name, sizeof name, "%s: out vs the CPU", tag);
    tc_check(name, go[1], f.o, f.mo, no, TC_RHO);
    for (int r = 1; r < runs; r++) {
        snprintf(name, sizeof name, "%s%s: out, lse the default blocks' bits, fp32 and bf16 I/O", tag,
                 r == 2 ? ", warp-major, copies at issue" : "");
        ct_check(!memcmp(go[0], go[r], no * 4) && !memcmp(gl[0], gl[r], nl * 4) &&
                 !memcmp(h[0], h[r], no * 2) && !memcmp(hl[0], hl[r], nl * 4), name, "differ");
    }
    ref_free(&f);
    free(q16);
    for (int r = 0; r < runs; r++) { free(go[r]); free(gl[r]); free(h[r]); free(hl[r]); }
}
static void wide(int B, int T, int NH, int NKV, int W) { variant("wide", zkc_attention_tc_fwd_wide, B, T, NH, NKV, 128, W); }
static void pair(int B, int T, int NH, int NKV, int hs, int W) { variant("pair", zkc_attention_tc_fwd_pair, B, T, NH, NKV, hs, W); }

/* the first row of dqkv's k, v part (columns C .. R) where a and b differ, or rows */
static size_t kv_differs(const float *a, const float *b, size_t rows, int C, int R)
{
    size_t at = 0;
    while (at < rows && !memcmp(a + at * R + C, b + at * R + C, (size_t)(R - C) * 4)) at++;
    return at;
}

/* The wide backward at head size 128 and 64 (zkc_attention_tc_bwd_wide(1), _wide64(1): 8 warps,
 * 128 keys, chunks of 64 queries, the products tiled in two dimensions,
 * P^T and dS^T through shared memory, the next chunk staged by cp.async).
 * Each dK, dV element takes the narrow kernel's mma steps in its order, so
 * with the two-pass dQ the whole dqkv has the narrow kernels' bits, fp32
 * and bf16 I/O. With the ordered dQ (parts of 128 keys): dqkv against the
 * CPU twin, every element written; the same bits with the grid's blocks
 * run in reverse; dk, dv the narrow bits still; io16 = round(the fp32
 * kernel on the widened out, dout); and (io16: Q, dO staged by cp.async)
 * the same bits with each copy landing as issued, not as late as allowed,
 * and each warp run from barrier to barrier before the next (a copy into
 * a buffer another warp still reads shows). The atomic build (its dQ by atomics,
 * in the wide kernel too): dqkv against the CPU, dk, dv the narrow bits. */
static void wide_bwd_hs(int B, int T, int NH, int NKV, int W, int hs)
{
    int (*wide)(int) = hs == 128 ? zkc_attention_tc_bwd_wide : zkc_attention_tc_bwd_wide64;
    char name[192], tag[96];
    snprintf(tag, sizeof tag, "emu wide backward B=%d T=%d NH=%d NKV=%d hs=%d W=%d", B, T, NH, NKV, hs, W);
    const int C = NH * hs, R = (NH + 2 * NKV) * hs;
    size_t nq = (size_t)B * T * R, no = (size_t)B * T * C, nl = (size_t)B * NH * T, rows = (size_t)B * T;
    cpu_ref f = ref_make(B, T, NH, NKV, hs, W);
    float *qkv = f.qkv, *dy = f.dy, *go = malloc(no * 4), *gl = malloc(nl * 4), *d[4];
    zkc_attention_tc_ordered_dq(1);
    float *scratch = malloc(zkc_attention_backward_tc_scratch(1, B, T, C, NH) * 4);
    zkc_attention_tc_ordered_dq(0);
    int rc = zkc_attention_forward_tc_gqa(NULL, go, gl, qkv, 0, B, T, C, NH, NKV, W), set = 1;
    /* narrow, two-pass; wide, two-pass; wide, ordered; the same, blocks reversed */
    const int nrun = DQA ? 2 : 4;
    for (int r = 0; r < nrun; r++) {
        d[r] = malloc(nq * 4);
        for (size_t i = 0; i < nq; i++) d[r][i] = NAN;
        set &= wide(r > 0) == (r > 0);
        zkc_attention_tc_ordered_dq(r > 1);
        emu_set_block_order(r == 3);
        rc |= zkc_attention_backward_tc_gqa(NULL, d[r], dy, qkv, go, gl, 0, B, T, C, NH, NKV, W, scratch);
    }
    emu_set_block_order(0);
    zkc_attention_tc_ordered_dq(0);
    snprintf(name, sizeof name, "%s: launchers return 0, the switch takes", tag);
    ct_check(rc == 0 && set, name, "rc %d, set %d", rc, set);
    snprintf(name, sizeof name, "%s: dqkv vs the CPU, every element written", tag);
    tc_check(name, d[1], f.dq, f.mq, nq, TC_RHO);
    size_t at = kv_differs(d[0], d[1], rows, C, R);
    snprintf(name, sizeof name, "%s: dk, dv the narrow kernel's bits", tag);
    ct_check(at == rows, name, "row %zu differs", at);
    if (!DQA) {
        snprintf(name, sizeof name, "%s: dq (k_tc_dq's) the same bits", tag);
        ct_check(!memcmp(d[0], d[1], nq * 4), name, "dqkv differs");
        snprintf(name, sizeof name, "%s, ordered dQ: dqkv vs the CPU, every element written", tag);
        tc_check(name, d[2], f.dq, f.mq, nq, TC_RHO);
        snprintf(name, sizeof name, "%s, ordered dQ: the same bits with the blocks run in reverse", tag);
        ct_check(!memcmp(d[2], d[3], nq * 4), name, "dqkv differs");
        at = kv_differs(d[0], d[2], rows, C, R);
        snprintf(name, sizeof name, "%s, ordered dQ: dk, dv the narrow kernel's bits", tag);
        ct_check(at == rows, name, "row %zu differs", at);
        uint16_t *q16 = to_bf16(qkv, nq), *o16 = malloc(no * 2), *dy16 = to_bf16(dy, no), *h[4];
        float *l16 = malloc(nl * 4), *ow = malloc(no * 4), *dw = malloc(nq * 4);
        int r16 = zkc_attention_forward_tc_gqa(NULL, o16, l16, q16, 1, B, T, C, NH, NKV, W);
        zk_cast_bf16_f32(ow, o16, no);
        /* narrow, wide; wide ordered, blocks reversed; wide with each cp.async
         * landing as issued (not at the barrier after its wait) */
        for (int r = 0; r < 4; r++) {
            h[r] = malloc(nq * 2);
            for (size_t i = 0; i < nq; i++) h[r][i] = 0x7fc1;
            wide(r > 0);
            zkc_attention_tc_ordered_dq(r == 2);
            emu_set_block_order(r == 2);
            emu_set_cp_early(r == 3);
            emu_set_warp_major(r == 3);
            r16 |= zkc_attention_backward_tc_gqa(NULL, h[r], dy16, q16, o16, l16, 1, B, T, C, NH, NKV, W,
                                                 scratch);
        }
        emu_set_cp_early(0);
        emu_set_warp_major(0);
        emu_set_block_order(0);
        zkc_attention_tc_ordered_dq(1);          /* h[2]'s mode, fp32 */
        r16 |= zkc_attention_backward_tc_gqa(NULL, dw, dy, qkv, ow, l16, 0, B, T, C, NH, NKV, W, scratch);
        zkc_attention_tc_ordered_dq(0);
        snprintf(name, sizeof name, "%s io16: returns 0, dqkv the narrow kernels' bits", tag);
        ct_check(r16 == 0 && !memcmp(h[0], h[1], nq * 2), name, "rc %d", r16);
        snprintf(name, sizeof name, "%s io16: the same bits with cp.async landing as issued, warps run "
                 "barrier to barrier", tag);
        ct_check(!memcmp(h[1], h[3], nq * 2), name, "dqkv differs");
        snprintf(name, sizeof name, "%s io16, ordered dQ: dqkv = bf16(fp32 kernel(widened out, dout))", tag);
        same16(name, h[2], dw, nq);
        free(q16); free(o16); free(dy16); free(l16); free(ow); free(dw);
        for (int r = 0; r < 4; r++) free(h[r]);
    }
    wide(0);
    ref_free(&f);
    free(go); free(gl); free(scratch);
    for (int r = 0; r < nrun; r++) free(d[r]);
}
static void wide_bwd(int B, int T, int NH, int NKV, int W) { wide_bwd_hs(B, T, NH, NKV, W, 128); }

int main(void)
{
    ct_seed(99);
    int e1 = zkc_attention_forward_tc(NULL, NULL, NULL, NULL, 0, 1, 8, 96, 3);
    int e2 = zkc_attention_backward_tc(NULL, NULL, NULL, NULL, NULL, NULL, 0, 1, 8, 130, 2, NULL);
    int e3 = zkc_attention_forward_tc(NULL, NULL, NULL, NULL, 1, 1, 8, 192, 2);
    ct_check(e1 == 1 && e2 == 1 && e3 == 1, "emu: head size 32, 65 or 96 is cudaErrorInvalidValue",
             "forward %d, backward %d, forward io16 %d", e1, e2, e3);
    static _Alignas(16) float buf[8 * 3 * 64 + 4];
    static _Alignas(16) uint16_t b16[8 * 3 * 64 + 8];
    int e4 = zkc_attention_forward_tc(NULL, buf, buf, buf + 1, 0, 1, 8, 64, 1);
    int e5 = zkc_attention_backward_tc(NULL, buf, buf + 2, buf, buf, buf, 0, 1, 8, 64, 1, buf);
    int e6 = zkc_attention_forward_tc(NULL, b16, buf, b16 + 4, 1, 1, 8, 64, 1);   /* 8 bytes off */
    int e7 = zkc_attention_backward_tc(NULL, b16, b16, b16, b16 + 1, buf, 1, 1, 8, 64, 1, buf);
    int e8 = zkc_attention_backward_tc(NULL, b16, b16 + 4, b16, b16, buf, 1, 1, 8, 64, 1, buf);
    ct_check(e4 == 1 && e5 == 1 && e6 == 1 && e7 == 1 && e8 == 1,
             "emu: qkv, dout or (io16) out, bf16 dout not 16-byte aligned is cudaErrorInvalidValue",
             "forward %d, backward %d, io16 forward %d, io16 backward out %d, dout %d", e4, e5,
             e6, e7, e8);
    one(1, 1, 1, 64);       /* one key */
    one(2, 17, 2, 64);      /* under one tile, B*NH = 4 */
    one(1, 64, 3, 64);      /* exactly one tile */
    one(2, 100, 2, 64);     /* ragged second tile */
    one(1, 257, 1, 64);     /* five tiles, the rescale across them; one row in the last */
    one(1, 1, 1, 128);
    one(2, 33, 1, 128);     /* B*NH = 2, ragged backward chunks of 16 */
    one(1, 100, 2, 128);
    one(1, 193, 1, 128);    /* four tiles */
    gqa(1, 70, 4, 2, 64, 0, 1);     /* GQA, a ragged second tile; io16 too */
    gqa(1, 70, 3, 1, 64, 0, 0);     /* MQA */
    gqa(1, 33, 2, 1, 128, 0, 0);
    gqa(1, 140, 2, 1, 64, 40, 1);   /* a window inside a tile: tiles and chunks skipped, rows masked */
    gqa(1, 130, 2, 1, 64, 70, 0);   /* a window straddling tiles */
    gqa(1, 90, 2, 2, 128, 17, 1);   /* NKV = NH, hs 128, a window across chunks of 16 */
    gqa(1, 40, 2, 1, 64, 1, 0);     /* window 1: each query its own key */
    gqa(1, 40, 2, 1, 64, 100, 0);   /* a window > T: no window's bits */
    wide(1, 1, 1, 1, 0);            /* one key */
    wide(1, 300, 2, 1, 0);          /* three 128-row blocks, the last ragged; GQA */
    wide(1, 200, 1, 1, 70);         /* a window: a block's rows start at other tiles */
    pair(1, 1, 1, 1, 64, 0);        /* one key: rows and keys past T zero-filled by cp.async */
    pair(1, 1, 1, 1, 128, 0);
    pair(2, 300, 2, 1, 64, 0);      /* batches, GQA, three 128-row blocks, the last ragged */
    pair(1, 193, 2, 2, 128, 0);     /* hs 128 (one m-tile a score pass), ragged */
    pair(1, 200, 2, 1, 64, 70);     /* a window: m-tiles of one warp active on different tiles */
    pair(1, 260, 1, 1, 128, 20);    /* a window inside a tile at hs 128 */
    ordered(1, 1, 1, 1, 64, 0);     /* one key: one tile, first and last */
    ordered(1, 150, 1, 1, 64, 0);   /* three tiles, ragged: a chunk summed over three */
    ordered(1, 100, 1, 1, 128, 0);  /* chunks of 16: four a tile */
    ordered(1, 70, 2, 1, 64, 0);    /* GQA: a block's two query heads */
    ordered(1, 140, 1, 1, 64, 40);  /* a window: the lowest tile of a chunk not 0 */
    ordered(1, 90, 1, 1, 128, 17);  /* a window across chunks of 16 */
    ordered(2, 150, 4, 2, 64, 0);   /* batches and kv heads: the ticket's (b, kv head), the counts' (b, h) */
    ordered(2, 130, 4, 2, 128, 30); /* the same at hs 128, a window */
    wide_bwd(1, 1, 1, 1, 0);        /* one key: rows past T zero-filled by cp.async */
    wide_bwd(2, 200, 2, 1, 0);      /* batches, GQA (chunks staged across a block's two heads), */
                                    /* two tiles of 128, the last chunk ragged, tile 0's chunk 2 */
                                    /* with no masked pair (the full shortcut) */
    wide_bwd(1, 300, 1, 1, 40);     /* a window: chunks past it skipped, chunk 4's lowest tile 1 */
    wide_bwd_hs(1, 1, 1, 1, 0, 64);     /* head size 64: one key */
    wide_bwd_hs(2, 200, 2, 1, 0, 64);   /* batches, GQA, two tiles of 128, ragged */
    wide_bwd_hs(1, 300, 2, 2, 40, 64);  /* a window, NKV = NH */
    return ct_summary();
}
