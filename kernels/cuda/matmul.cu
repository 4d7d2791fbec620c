/* matmul.cu -- GEMMs through cuBLAS (kernels.cuh), row-major layouts of
 * zk_matmul_*: a row-major (R,K) array is cuBLAS's column-major (K,R), so
 *   out (N,OC) = inp (N,C) @ w (OC,C)^T   is  out^T = w^T(op T) . inp^T
 * and likewise for the two backward products (llm.c's calls). fp32 compute
 * throughout; the bias is a kernel after the GEMM (one fp32 add, as the
 * CPU), dbias a column sum in double, rows in order. */
#include <cuda_bf16.h>
#include "common.cuh"

/* out[n,oc] += b[oc] */
__global__ static void k_bias(float *out, const float *b, size_t N, int OC)
{
    ZKC_FOR(i, N * (size_t)OC) out[i] += b[i % OC];
}

/* db[oc] = sum over rows of dout[n,oc], in double, rows in order */
template <typename T>
__global__ static void k_colsum(float *db, const T *dout, int N, int OC)
{
    int oc = blockIdx.x * blockDim.x + threadIdx.x;
    if (oc >= OC) return;
    double s = 0.0;
    for (int n = 0; n < N; n++) s += (double)(float)dout[(size_t)n * OC + oc];
    db[oc] = (float)s;
}

#define CUBLAS_TRY(x) do { cublasStatus_t st_ = (x); if (st_ != CUBLAS_STATUS_SUCCESS) return (int)st_; } while (0)
#define LAUNCH_TRY() do { int e_ = ZKC_LAUNCHED(); if (e_) return ZKC_LAUNCH_BASE + e_; } while (0)

static const float one = 1.0f, zero = 0.0f;

/* the one GEMM shape family, for fp32 (CUDA_R_32F) or bf16 (CUDA_R_16BF) A, B */
static int gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                int k, const void *a, int lda, const void *b, int ldb, float *c, int ldc,
                cudaDataType_t ab)
{
    if (ab == CUDA_R_32F) {
        CUBLAS_TRY(cublasSgemm(h, ta, tb, m, n, k, &one, (const float *)a, lda,
                               (const float *)b, ldb, &zero, c, ldc));
    } else {
        CUBLAS_TRY(cublasGemmEx(h, ta, tb, m, n, k, &one, a, ab, lda, b, ab, ldb, &zero,
                                c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    return 0;
}

static int fwd(cublasHandle_t h, cudaStream_t s, float *out, const void *inp, const void *w,
               const float *b, int N, int C, int OC, cudaDataType_t ab)
{
    if (N == 0 || OC == 0) return 0;
    CUBLAS_TRY(cublasSetStream(h, s));
    if (C == 0) {                 /* an empty sum: cuBLAS may not write C at k = 0 */
        if (cudaMemsetAsync(out, 0, (size_t)N * OC * sizeof(float), s)) return ZKC_LAUNCH_BASE + (int)cudaGetLastError();
    } else {
        int e = gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, w, C, inp, C, out, OC, ab);
        if (e) return e;
    }
    if (b) {
        k_bias<<<zkc_grid((size_t)N * OC, 256), 256, 0, s>>>(out, b, (size_t)N, OC);
        LAUNCH_TRY();
    }
    return 0;
}

template <typename T>
static int bwd(cublasHandle_t h, cudaStream_t s, float *dinp, float *dw, float *db,
               const T *dout, const T *inp, const T *w, int N, int C, int OC, cudaDataType_t ab)
{
    CUBLAS_TRY(cublasSetStream(h, s));
    if (dinp && N > 0 && C > 0) {          /* dinp (N,C) = dout (N,OC) @ w (OC,C) */
        if (OC == 0) { if (cudaMemsetAsync(dinp, 0, (size_t)N * C * 4, s)) return ZKC_LAUNCH_BASE + (int)cudaGetLastError(); }
        else { int e = gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, w, C, dout, OC, dinp, C, ab); if (e) return e; }
    }
    if (dw && OC > 0 && C > 0) {           /* dw (OC,C) = dout^T @ inp, k over the N rows */
        if (N == 0) { if (cudaMemsetAsync(dw, 0, (size_t)OC * C * 4, s)) return ZKC_LAUNCH_BASE + (int)cudaGetLastError(); }
        else { int e = gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, OC, dw, C, ab); if (e) return e; }
    }
    if (db && OC) {
        k_colsum<T><<<(OC + 127) / 128, 128, 0, s>>>(db, dout, N, OC);
        LAUNCH_TRY();
    }
    return 0;
}

extern "C" {
int zkc_matmul_forward(cublasHandle_t h, cudaStream_t s, float *out, const float *inp,
                       const float *w, const float *b, int N, int C, int OC)
{
    return fwd(h, s, out, inp, w, b, N, C, OC, CUDA_R_32F);
}

int zkc_matmul_backward(cublasHandle_t h, cudaStream_t s, float *dinp, float *dw, float *db,
                        const float *dout, const float *inp, const float *w,
                        int N, int C, int OC)
{
    return bwd<float>(h, s, dinp, dw, db, dout, inp, w, N, C, OC, CUDA_R_32F);
}

int zkc_matmul_bf16_forward(cublasHandle_t h, cudaStream_t s, float *out, const uint16_t *inp,
                            const uint16_t *w, const float *b, int N, int C, int OC)
{
    return fwd(h, s, out, inp, w, b, N, C, OC, CUDA_R_16BF);
}

int zkc_matmul_bf16_backward(cublasHandle_t h, cudaStream_t s, float *dinp, float *dw,
                             float *db, const uint16_t *dout, const uint16_t *inp,
                             const uint16_t *w, int N, int C, int OC)
{
    return bwd<__nv_bfloat16>(h, s, dinp, dw, db, (const __nv_bfloat16 *)dout,
                              (const __nv_bfloat16 *)inp, (const __nv_bfloat16 *)w, N, C, OC,
                              CUDA_R_16BF);
}
}
