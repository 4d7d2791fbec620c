/*
 * test_attention_tc_emu.c -- kernels/cuda/attention_tc.cu's own source run
 * on the CPU under spec/emu/cuda_emu.h (threads, barriers, mma.sync and
 * ldmatrix by their per-lane register layouts), against the CPU twin with
 * the tolerances of test_cuda.c (spec/c/attn_tc_check.h), head sizes 64
 * and 128. Catches indexing, masking, tile
 * offsets, fragment layouts and alignment, and (as races) missing syncs;
 * not the hardware's rounding or speed. Run: sh tools/emu_kernel.sh attention_tc.
 */
#include "ctest.h"
#include "kernels.h"
#include "attn_tc_check.h"

int zkc_attention_forward_tc(void *s, float *out, float *lse, const float *qkv,
                             int B, int T, int C, int NH);
int zkc_attention_backward_tc(void *s, float *dqkv, const float *dout, const float *qkv,
                              const float *out, const float *lse, int B, int T, int C, int NH,
                              float *scratch);

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
        rc |= zkc_attention_forward_tc(NULL, go[r], gl[r], qkv, B, T, C, NH);
        rc |= zkc_attention_backward_tc(NULL, gq[r], dy, qkv, go[r], gl[r], B, T, C, NH, scratch);
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
    free(qkv); free(dy); free(o); free(l); free(dq); free(mo); free(ml); free(mdq); free(scratch);
    for (int r = 0; r < 2; r++) { free(go[r]); free(gl[r]); free(gq[r]); }
}

int main(void)
{
    ct_seed(99);
    int e1 = zkc_attention_forward_tc(NULL, NULL, NULL, NULL, 1, 8, 96, 3);
    int e2 = zkc_attention_backward_tc(NULL, NULL, NULL, NULL, NULL, NULL, 1, 8, 130, 2, NULL);
    int e3 = zkc_attention_forward_tc(NULL, NULL, NULL, NULL, 1, 8, 192, 2);
    ct_check(e1 == 1 && e2 == 1 && e3 == 1, "emu: head size 32, 65 or 96 is cudaErrorInvalidValue",
             "forward %d, backward %d, forward %d", e1, e2, e3);
    static _Alignas(16) float buf[8 * 3 * 64 + 4];
    int e4 = zkc_attention_forward_tc(NULL, buf, buf, buf + 1, 1, 8, 64, 1);
    int e5 = zkc_attention_backward_tc(NULL, buf, buf + 2, buf, buf, buf, 1, 8, 64, 1, buf);
    ct_check(e4 == 1 && e5 == 1, "emu: qkv or dout not 16-byte aligned is cudaErrorInvalidValue",
             "forward %d, backward %d", e4, e5);
    one(1, 1, 1, 64);       /* one key */
    one(2, 17, 2, 64);      /* under one tile, B*NH = 4 */
    one(1, 64, 3, 64);      /* exactly one tile */
    one(2, 100, 2, 64);     /* ragged second tile */
    one(1, 257, 1, 64);     /* five tiles, the rescale across them; one row in the last */
    one(1, 1, 1, 128);
    one(2, 33, 1, 128);     /* B*NH = 2, ragged backward chunks of 16 */
    one(1, 100, 2, 128);
    one(1, 193, 1, 128);    /* four tiles */
    return ct_summary();
}
