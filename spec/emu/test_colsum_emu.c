/*
 * test_colsum_emu.c -- kernels/cuda/colsum.cu's own source run on the CPU
 * under spec/emu/cuda_emu.h, against the CPU twin: the bias gradient of
 * zk_matmul_backward (fp32) and zk_matmul_bf16_backward (bf16), each column
 * summed over every row in order in double. The GPU side sums chunks of 64
 * rows in double, then the chunks in order: the same terms, another
 * grouping, so within a float ulp (relative 2^-23 of the column's largest
 * partial magnitude). Shapes: N not a multiple of the chunk, OC not of the
 * 128-thread block, padded rows (ld > OC, the pad NaN: never read), one
 * row, and N = 0 (zeros). A bf16 out (out16: a bf16 run's stored bias
 * gradient): the fp32 out rounded once (zk_cast_f32_bf16's bits), zeros
 * for N = 0. Run: sh tools/emu_kernel.sh colsum.
 */
#include <math.h>
#include <string.h>
#include "ctest.h"
#include "kernels.h"

size_t zkc_colsum_scratch(int N, int OC);
int zkc_colsum(void *s, void *out, int out16, const float *x, int N, int OC, int ld,
               double *scratch);
int zkc_colsum_bf16(void *s, void *out, int out16, const uint16_t *x, int N, int OC, int ld,
                    double *scratch);

/* max |got - want| / max(sum |x| of the column) over the columns */
static double worst(const float *got, const float *want, const double *mag, int OC)
{
    double e = 0;
    for (int c = 0; c < OC; c++) {
        double d = fabs((double)got[c] - want[c]) / (mag[c] > 0 ? mag[c] : 1);
        if (!(d <= e)) e = d;
    }
    return e;
}

static void one(int N, int OC, int ld, int bf16)
{
    char name[160];
    size_t nl = (size_t)(N ? N : 1) * ld;
    float *x = ct_rand(nl, -1, 1);
    uint16_t *xb = malloc(nl * 2);
    zk_cast_f32_bf16(xb, x, nl);
    for (int n = 0; n < N; n++)
        for (int c = OC; c < ld; c++) { x[(size_t)n * ld + c] = NAN; xb[(size_t)n * ld + c] = 0x7fc1; }
    /* the twin: the matmul's dbias alone (dinp, dweight NULL), dout rows ld apart */
    float *want = malloc(OC * 4), *got = malloc(OC * 4);
    double *mag = calloc(OC, sizeof(double));
    if (bf16) zk_matmul_bf16_backward(NULL, NULL, want, xb, NULL, NULL, N, 1, OC, ld);
    else zk_matmul_backward(NULL, NULL, want, x, NULL, NULL, N, 1, OC, ld);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < OC; c++) mag[c] += fabs(x[(size_t)n * ld + c]);
    size_t ns = zkc_colsum_scratch(N, OC);
    double *scratch = malloc((ns ? ns : 1) * sizeof(double));
    for (size_t i = 0; i < ns; i++) scratch[i] = NAN;
    for (int c = 0; c < OC; c++) got[c] = NAN;                  /* WRITTEN */
    int rc = bf16 ? zkc_colsum_bf16(NULL, got, 0, xb, N, OC, ld, scratch)
                  : zkc_colsum(NULL, got, 0, x, N, OC, ld, scratch);
    double e = worst(got, want, mag, OC);
    snprintf(name, sizeof name, "emu colsum %s N=%d OC=%d ld=%d: the CPU's dbias within a float ulp",
             bf16 ? "bf16" : "f32", N, OC, ld);
    ct_check(rc == 0 && e <= 0x1p-23, name, "rc %d, worst %.3g of the column's magnitude", rc, e);
    /* deterministic: a second run, the same bits */
    float *again = malloc(OC * 4);
    rc = bf16 ? zkc_colsum_bf16(NULL, again, 0, xb, N, OC, ld, scratch)
              : zkc_colsum(NULL, again, 0, x, N, OC, ld, scratch);
    snprintf(name, sizeof name, "emu colsum %s N=%d OC=%d: run twice, the same bits",
             bf16 ? "bf16" : "f32", N, OC);
    ct_check(rc == 0 && !memcmp(again, got, OC * 4), name, "differ");
    /* a bf16 out: the fp32 out rounded once */
    uint16_t *g16 = malloc(OC * 2), *w16 = malloc(OC * 2);
    for (int c = 0; c < OC; c++) g16[c] = 0x7fc1;                /* WRITTEN */
    rc = bf16 ? zkc_colsum_bf16(NULL, g16, 1, xb, N, OC, ld, scratch)
              : zkc_colsum(NULL, g16, 1, x, N, OC, ld, scratch);
    zk_cast_f32_bf16(w16, got, OC);
    snprintf(name, sizeof name, "emu colsum %s N=%d OC=%d, bf16 out: the fp32 out rounded once",
             bf16 ? "bf16" : "f32", N, OC);
    ct_check(rc == 0 && !memcmp(g16, w16, OC * 2), name, "rc %d, differ", rc);
    free(x); free(xb); free(want); free(got); free(mag); free(scratch); free(again); free(g16); free(w16);
}

int main(void)
{
    ct_seed(11);
    one(300, 200, 200, 0);      /* N and OC off the chunk and block */
    one(300, 200, 256, 0);      /* padded rows */
    one(300, 200, 256, 1);
    one(1, 130, 130, 1);
    one(64, 128, 128, 0);
    one(1000, 77, 128, 1);
    one(0, 50, 50, 0);          /* no rows: zeros */
    return ct_summary();
}
