/*
 * matmul.c -- linear layer (x @ W^T + b) on OpenBLAS sgemm.
 *
 * sgemm is only ever called here, from the calling (main) thread, never
 * inside an OpenMP region: OpenBLAS splits M and N across its own threads
 * and every C element keeps one K loop, so the bits do not depend on its
 * thread count. All GEMMs use beta = 0 (see "Same math" in DESIGN.md: a
 * beta = 1 GEMM adds into C one K-block at a time).
 */
#include <cblas.h>
#include "kernels.h"

/* output columns per task when summing dbias down the rows */
#define MM_COL_CHUNK 64

/* out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be NULL.
 * The bias is added after the GEMM (one rounding, as torch.addmm's
 * beta = 1 epilogue would give for a sum computed first). */
void zk_matmul_forward(float *out, const float *inp, const float *weight,
                       const float *bias, int N, int C, int OC) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C,
                1.0f, inp, C, weight, C, 0.0f, out, OC);
    if (bias == NULL) return;
    #pragma omp parallel for schedule(static) if ((long)N * OC >= 65536)
    for (int n = 0; n < N; n++) {
        float *restrict o = out + (size_t)n * OC;   // (OC)
        const float *restrict b = bias;
        for (int j = 0; j < OC; j++) o[j] += b[j];
    }
}

/* dinp (N,C) = dout @ weight WRITTEN (if not NULL); dweight (OC,C) =
 * dout^T @ inp WRITTEN; dbias (OC) = column sums of dout WRITTEN (if not
 * NULL), each column summed over the rows in order, in double. */
void zk_matmul_backward(float *dinp, float *dweight, float *dbias,
                        const float *dout, const float *inp,
                        const float *weight, int N, int C, int OC) {
    if (dinp != NULL)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC,
                    1.0f, dout, OC, weight, C, 0.0f, dinp, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N,
                1.0f, dout, OC, inp, C, 0.0f, dweight, C);
    if (dbias == NULL) return;
    int nchunk = (OC + MM_COL_CHUNK - 1) / MM_COL_CHUNK;
    #pragma omp parallel for schedule(static) if ((long)N * OC >= 65536)
    for (int k = 0; k < nchunk; k++) {
        int j0 = k * MM_COL_CHUNK, w = OC - j0 < MM_COL_CHUNK ? OC - j0 : MM_COL_CHUNK;
        double acc[MM_COL_CHUNK] = {0};
        for (int n = 0; n < N; n++) {
            const float *restrict d = dout + (size_t)n * OC + j0;
            for (int j = 0; j < w; j++) acc[j] += (double)d[j];
        }
        for (int j = 0; j < w; j++) dbias[j0 + j] = (float)acc[j];
    }
}
