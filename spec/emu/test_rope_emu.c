/*
 * test_rope_emu.c -- kernels/cuda/rope.cu's own source run on the CPU under
 * spec/emu/cuda_emu.h against its CPU twin (zk_rope_forward/backward): the
 * same products and sums, each rounded, so the same bits (memcmp), on
 * q and k heads of a strided (B,T,q|k|v) row, at pos0 = 0 and a decode
 * step's pos0, head sizes 16 and 128 (Llama 3's table with its scaling).
 * Run: sh tools/emu_kernel.sh rope.
 */
#include <string.h>
#include "ctest.h"
#include "kernels.h"

int zkc_rope_forward(void *s, float *x, int N, int T, int ld, int nh, int hs,
                     const float *cos_t, const float *sin_t, int pos0);
int zkc_rope_backward(void *s, float *dx, int N, int T, int ld, int nh, int hs,
                      const float *cos_t, const float *sin_t, int pos0);
int zkc_rope_forward_b16(void *s, uint16_t *x, int N, int T, int ld, int nh, int hs,
                         const float *cos_t, const float *sin_t, int pos0);
int zkc_rope_backward_b16(void *s, uint16_t *dx, int N, int T, int ld, int nh, int hs,
                          const float *cos_t, const float *sin_t, int pos0);

/* bf16 rows (bf16 activations): the CPU's zk_rope_*_b16 bits */
static void one16(int B, int T, int hs, int nq, int nkv, int pos0)
{
    char name[160];
    int N = B * T, ld = (nq + 2 * nkv) * hs, P = pos0 + T, h2 = hs / 2;
    size_t n = (size_t)N * ld;
    float *c = malloc((size_t)P * h2 * 4), *s = malloc((size_t)P * h2 * 4);
    zk_rope_table(c, s, P, hs, 10000.0, NULL);
    float *x = ct_rand(n, -2, 2);
    uint16_t *want = malloc(n * 2), *got = malloc(n * 2);
    zk_cast_f32_bf16(want, x, n);
    memcpy(got, want, n * 2);
    zk_rope_forward_b16(want, N, T, ld, nq + nkv, hs, c, s, pos0);
    int rc = zkc_rope_forward_b16(NULL, got, N, T, ld, nq + nkv, hs, c, s, pos0);
    snprintf(name, sizeof name, "emu rope forward bf16 B=%d T=%d hs=%d pos0 %d: the CPU's bits", B, T,
             hs, pos0);
    ct_check(rc == 0 && !memcmp(got, want, n * 2), name, "rc %d, differ", rc);
    zk_rope_backward_b16(want, N, T, ld, nq, hs, c, s, pos0);
    rc = zkc_rope_backward_b16(NULL, got, N, T, ld, nq, hs, c, s, pos0);
    snprintf(name, sizeof name, "emu rope backward bf16 B=%d T=%d hs=%d: the CPU's bits", B, T, hs);
    ct_check(rc == 0 && !memcmp(got, want, n * 2), name, "rc %d, differ", rc);
    free(c); free(s); free(x); free(want); free(got);
}

static void one(int B, int T, int hs, int nq, int nkv, int pos0, const zk_rope_scaling *sc)
{
    char name[160];
    int N = B * T, ld = (nq + 2 * nkv) * hs, P = pos0 + T, h2 = hs / 2;
    size_t n = (size_t)N * ld;
    float *c = malloc((size_t)P * h2 * 4), *s = malloc((size_t)P * h2 * 4);
    zk_rope_table(c, s, P, hs, sc ? 500000.0 : 10000.0, sc);
    float *x = ct_rand(n, -2, 2), *want = malloc(n * 4), *got = malloc(n * 4);
    memcpy(want, x, n * 4);
    memcpy(got, x, n * 4);
    zk_rope_forward(want, N, T, ld, nq, hs, c, s, pos0);
    zk_rope_forward(want + nq * hs, N, T, ld, nkv, hs, c, s, pos0);
    int rc = zkc_rope_forward(NULL, got, N, T, ld, nq, hs, c, s, pos0) |
             zkc_rope_forward(NULL, got + nq * hs, N, T, ld, nkv, hs, c, s, pos0);
    snprintf(name, sizeof name, "emu rope forward B=%d T=%d hs=%d q %d k %d pos0 %d%s: the CPU's bits",
             B, T, hs, nq, nkv, pos0, sc ? " llama3" : "");
    ct_check(rc == 0 && !memcmp(got, want, n * 4), name, "rc %d, differ", rc);
    zk_rope_backward(want, N, T, ld, nq, hs, c, s, pos0);
    rc = zkc_rope_backward(NULL, got, N, T, ld, nq, hs, c, s, pos0);
    snprintf(name, sizeof name, "emu rope backward B=%d T=%d hs=%d pos0 %d: the CPU's bits", B, T, hs, pos0);
    ct_check(rc == 0 && !memcmp(got, want, n * 4), name, "rc %d, differ", rc);
    free(c); free(s); free(x); free(want); free(got);
}

int main(void)
{
    zk_rope_scaling l3 = { 8.0, 1.0, 4.0, 8192.0 };
    one(3, 5, 16, 4, 2, 0, NULL);
    one(2, 1, 16, 4, 2, 37, NULL);       /* a decode step */
    one(2, 33, 128, 2, 1, 0, &l3);
    one(1, 300, 64, 3, 3, 0, NULL);      /* a long sequence, 3 k heads */
    one16(3, 5, 16, 4, 2, 0);
    one16(2, 33, 128, 2, 1, 11);
    return ct_summary();
}
