/*
 * test_swiglu_emu.c -- kernels/cuda/swiglu.cu's own source run on the CPU
 * under spec/emu/cuda_emu.h against its CPU twin (zk_swiglu_*): out and
 * [dgate | dup] within 4e-7 relative (expf against the CPU's polynomial
 * exp), rows of odd widths, gates out to +-30. The bf16 entry points (_bb:
 * gu, out, dout and dgu bf16) bit for bit against the f32 kernels on the
 * widened inputs, rounded once, and within a bf16 rounding of the CPU
 * twins. Run: sh tools/emu_kernel.sh swiglu.
 */
#include <math.h>
#include <string.h>
#include "ctest.h"
#include "kernels.h"

int zkc_swiglu_forward(void *s, float *out, const float *gu, int N, int F);
int zkc_swiglu_backward(void *s, float *dgu, const float *dout, const float *gu, int N, int F);
int zkc_swiglu_forward_bb(void *s, uint16_t *out, const uint16_t *gu, int N, int F);
int zkc_swiglu_backward_bb(void *s, uint16_t *dgu, const uint16_t *dout, const uint16_t *gu,
                           int N, int F);

/* bf16 gu, out, dout and dgu: the f32 kernels on the widened gu and dout,
 * rounded once, bit for bit; the CPU's _bb results within one bf16
 * rounding (the f32 values within 4e-7 may round to neighbouring bf16
 * values) */
static void one16(int N, int F)
{
    char name[128];
    size_t nf = (size_t)N * F;
    float *gu = ct_rand(2 * nf, -30, 30), *d = ct_rand(nf, -1, 1);
    uint16_t *g16 = malloc(2 * nf * 2), *o = malloc(nf * 2), *go = malloc(nf * 2);
    uint16_t *g = malloc(2 * nf * 2), *gg = malloc(2 * nf * 2), *d16 = malloc(nf * 2);
    zk_cast_f32_bf16(g16, gu, 2 * nf);
    zk_cast_f32_bf16(d16, d, nf);
    zk_cast_bf16_f32(gu, g16, 2 * nf);             /* gu and d now the widened bf16 values */
    zk_cast_bf16_f32(d, d16, nf);
    zk_swiglu_forward_bb(o, g16, N, F);
    zk_swiglu_backward_bb(g, d16, g16, N, F);
    int rc = zkc_swiglu_forward_bb(NULL, go, g16, N, F) | zkc_swiglu_backward_bb(NULL, gg, d16, g16, N, F);
    {   /* the f32 kernels on the widened inputs, rounded once: the bits */
        float *fo = malloc(nf * 4), *fg = malloc(2 * nf * 4);
        uint16_t *wo = malloc(nf * 2), *wg = malloc(2 * nf * 2);
        int rc2 = zkc_swiglu_forward(NULL, fo, gu, N, F) | zkc_swiglu_backward(NULL, fg, d, gu, N, F);
        zk_cast_f32_bf16(wo, fo, nf); zk_cast_f32_bf16(wg, fg, 2 * nf);
        snprintf(name, sizeof name, "emu swiglu bf16 N=%d F=%d: the f32 kernels' bits rounded once", N, F);
        ct_check(rc == 0 && rc2 == 0 && !memcmp(go, wo, nf * 2) && !memcmp(gg, wg, 2 * nf * 2), name,
                 "rc %d/%d, forward %s, backward %s", rc, rc2, memcmp(go, wo, nf * 2) ? "differs" : "same",
                 memcmp(gg, wg, 2 * nf * 2) ? "differs" : "same");
        free(fo); free(fg); free(wo); free(wg);
    }
    float *a = malloc(2 * nf * 4), *b = malloc(2 * nf * 4);
    zk_cast_bf16_f32(a, go, nf); zk_cast_bf16_f32(b, o, nf);
    snprintf(name, sizeof name, "emu swiglu bf16 N=%d F=%d: forward within a bf16 ulp of the CPU's", N, F);
    ct_check(rc == 0, name, "rc %d", rc);
    ct_close_f(name, a, b, nf, 1e-30, 1.0 / 128);
    zk_cast_bf16_f32(a, gg, 2 * nf); zk_cast_bf16_f32(b, g, 2 * nf);
    snprintf(name, sizeof name, "emu swiglu bf16 N=%d F=%d: backward within a bf16 ulp of the CPU's", N, F);
    ct_close_f(name, a, b, 2 * nf, 1e-30, 1.0 / 128);
    free(gu); free(d); free(g16); free(o); free(go); free(g); free(gg); free(a); free(b); free(d16);
}

static void one(int N, int F)
{
    char name[128];
    size_t nf = (size_t)N * F;
    float *gu = ct_rand(2 * nf, -30, 30), *d = ct_rand(nf, -1, 1);
    float *o = malloc(nf * 4), *go = malloc(nf * 4), *g = malloc(2 * nf * 4), *gg = malloc(2 * nf * 4);
    zk_swiglu_forward(o, gu, N, F);
    zk_swiglu_backward(g, d, gu, N, F);
    int rc = zkc_swiglu_forward(NULL, go, gu, N, F) | zkc_swiglu_backward(NULL, gg, d, gu, N, F);
    snprintf(name, sizeof name, "emu swiglu N=%d F=%d: forward within 4e-7 of the CPU's", N, F);
    ct_check(rc == 0, name, "rc %d", rc);
    ct_close_f(name, go, o, nf, 1e-30, 4e-7);
    snprintf(name, sizeof name, "emu swiglu N=%d F=%d: backward within 4e-7 of the CPU's", N, F);
    ct_close_f(name, gg, g, 2 * nf, 1e-30, 4e-7);
    free(gu); free(d); free(o); free(go); free(g); free(gg);
}

int main(void)
{
    one(3, 37);
    one(2, 1000);
    one16(3, 37);
    one16(2, 1000);
    return ct_summary();
}
