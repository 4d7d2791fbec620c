/* matmul.cu -- GEMMs through cuBLAS (kernels.cuh), row-major layouts of
 * zk_matmul_*: a row-major (R,K) array is cuBLAS's column-major (K,R), so
 *   out (N,OC) = inp (N,C) @ w (OC,C)^T   is  out^T = w^T(op T) . inp^T
 * and likewise for the two backward products (llm.c's calls). fp32 compute
 * throughout; the bias is a kernel after the GEMM (one fp32 add, as the
 * CPU) or, with zkc_matmul_epilogue(1), cuBLASLt's bias epilogue; dbias a
 * column sum in two fixed passes (colsum.cu). out and dout may have padded rows
 * (ldo >= OC, the LM head's logits): cuBLAS takes aligned kernels when the
 * row stride is a multiple of 16 bytes, which V = 50257 is not. */
#include <stdint.h>
#include <string.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include "common.cuh"

/* out[n,oc] += b[oc], rows ld apart */
__global__ static void k_bias(float *out, const float *b, size_t N, int OC, int ld)
{
    ZKC_FOR(i, N * (size_t)OC) out[i / OC * ld + i % OC] += b[i % OC];
}

/* a bf16 out with a bias: each row set to the bias (rounded to bf16) before
 * a beta = 1 GEMM, which adds the product to it in fp32 and rounds once.
 * (Adding the bias after the GEMM rounded twice: off by half a bf16 ulp of
 * the product where the bias cancels it, which an H200 showed.) */
__global__ static void k_bias_fill_b16(__nv_bfloat16 *out, const float *b, size_t N, int OC, int ld)
{
    ZKC_FOR(i, N * (size_t)OC) out[i / OC * ld + i % OC] = __float2bfloat16_rn(b[i % OC]);
}



#define CUBLAS_TRY(x) do { cublasStatus_t st_ = (x); if (st_ != CUBLAS_STATUS_SUCCESS) return (int)st_; } while (0)
#define LAUNCH_TRY() do { int e_ = ZKC_LAUNCHED(); if (e_) return ZKC_LAUNCH_BASE + e_; } while (0)

static const float one = 1.0f, zero = 0.0f;

/* the one GEMM shape family, for fp32 (CUDA_R_32F) or bf16 (CUDA_R_16BF) A,
 * B; C fp32, or bf16 (ct) with bf16 A, B */
static int gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                int k, const void *a, int lda, const void *b, int ldb, void *c, int ldc,
                cudaDataType_t ab, cudaDataType_t ct = CUDA_R_32F, const float *beta = &zero)
{
    if (ab == CUDA_R_32F) {
        CUBLAS_TRY(cublasSgemm(h, ta, tb, m, n, k, &one, (const float *)a, lda,
                               (const float *)b, ldb, &zero, (float *)c, ldc));
    } else {
        CUBLAS_TRY(cublasGemmEx(h, ta, tb, m, n, k, &one, a, ab, lda, b, ab, ldb, beta,
                                c, ct, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    return 0;
}

/* ---- the bias epilogue (cuBLASLt, CUBLASLT_EPILOGUE_BIAS): out = w.inp
 * + b in one kernel, the bias added to the fp32 accumulator as the bias
 * kernel adds it to the stored fp32 product (the same rounding; cuBLASLt
 * may pick another GEMM algorithm than cublasSgemm/GemmEx, so not their
 * bits). Off by default (zkc_matmul_epilogue): on only once a GPU shows it
 * pays (bench_cuda's "bias epilogue" rows). One plan per shape and dtype
 * (operands 16-byte aligned, else the plain path), kept for the process;
 * callers serialise (device_cuda.c's lock), so the plan cache and the one descriptor whose
 * bias pointer changes per call need no lock of their own. ---- */
static int lt_on = 0;

int zkc_matmul_epilogue(int on)
{
    if (on == 0 || on == 1) lt_on = on;
    return lt_on;
}

#define LT_PLANS 64
struct lt_plan {
    int m, n, k;
    cudaDataType_t ab;
    int ok;                          /* 0: no algorithm (plain path) */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};
static cublasLtHandle_t lt;
static struct lt_plan lt_plans[LT_PLANS];
static int lt_nplans;

/* every operand 16-byte aligned: the heuristic's promise (a view at an
 * odd offset of a slab, or an odd row length, keeps the plain path) */
static int lt_aligned(const void *a, const void *b, const void *c, const void *bias)
{
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)bias) & 15) == 0;
}

/* No workspace: matmuls on two streams may overlap on the GPU, and one
 * shared workspace would be a race (cuBLAS keeps one per stream); it also
 * keeps split-K, whose partial sums change the bits, out of the choice. */
static struct lt_plan *lt_plan(int m, int n, int k, cudaDataType_t ab)
{
    for (int i = 0; i < lt_nplans; i++) {
        struct lt_plan *p = &lt_plans[i];
        if (p->m == m && p->n == n && p->k == k && p->ab == ab) return p;
    }
    if (!lt && cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) { lt = NULL; return NULL; }
    if (lt_nplans == LT_PLANS) return NULL;                  /* plain path from here */
    struct lt_plan *p = &lt_plans[lt_nplans];
    memset(p, 0, sizeof *p);
    p->m = m; p->n = n; p->k = k; p->ab = ab;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
    uint32_t al = 16;                /* lt_aligned's promise */
    size_t ws = 0;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    /* A = w, stored (k, m) column-major (w's (OC, C) rows), used transposed;
     * B = inp, stored (k, n); C = D = out, (m, n), all leading dimensions
     * the stored row lengths */
    if (cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) ||
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ||
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ||
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep) ||
        cublasLtMatrixLayoutCreate(&p->la, ab, k, m, k) ||
        cublasLtMatrixLayoutCreate(&p->lb, ab, k, n, k) ||
        cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, m, n, m) ||
        cublasLtMatmulPreferenceCreate(&pref) ||
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &ws, sizeof ws) ||
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al) ||
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al) ||
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al) ||
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al) ||
        cublasLtMatmulAlgoGetHeuristic(lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &nres) ||
        nres < 1) {
        p->ok = 0;                   /* this shape stays on the plain path */
    } else {
        p->ok = 1; p->algo = res.algo;
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    lt_nplans++;
    return p;
}

/* out (N,OC) = inp (N,C) @ w (OC,C)^T + b through the epilogue; *done = 0
 * when this shape has no plan (the caller takes the plain path) */
static int lt_fwd(cudaStream_t s, float *out, const void *inp, const void *w, const float *b,
                  int N, int C, int OC, cudaDataType_t ab, int *done)
{
    *done = 0;
    if (!lt_aligned(inp, w, out, b)) return 0;
    struct lt_plan *p = lt_plan(OC, N, C, ab);
    if (!p || !p->ok) return 0;
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b));
    CUBLAS_TRY(cublasLtMatmul(lt, p->desc, &one, w, p->la, inp, p->lb, &zero, out, p->lc, out, p->lc,
                              &p->algo, NULL, 0, s));
    *done = 1;
    return 0;
}

/* out (N,OC), rows ldo apart, fp32 or (ct = CUDA_R_16BF) bf16 */
static int fwd(cublasHandle_t h, cudaStream_t s, void *out, const void *inp, const void *w,
               const float *b, int N, int C, int OC, int ldo, cudaDataType_t ab,
               cudaDataType_t ct)
{
    if (N == 0 || OC == 0) return 0;
    if (lt_on && b && C > 0 && ldo == OC && ct == CUDA_R_32F) {
        int done, e = lt_fwd(s, (float *)out, inp, w, b, N, C, OC, ab, &done);
        if (e || done) return e;
    }
    CUBLAS_TRY(cublasSetStream(h, s));
    size_t es = ct == CUDA_R_32F ? 4 : 2;
    if (C == 0) {                 /* an empty sum: cuBLAS may not write C at k = 0 */
        if (cudaMemset2DAsync(out, (size_t)ldo * es, 0, (size_t)OC * es, (size_t)N, s))
            return ZKC_LAUNCH_BASE + (int)cudaGetLastError();
    } else if (b && ct != CUDA_R_32F) {    /* bf16 out: the bias first, beta = 1 */
        k_bias_fill_b16<<<zkc_grid((size_t)N * OC, 256), 256, 0, s>>>((__nv_bfloat16 *)out, b, (size_t)N, OC, ldo);
        LAUNCH_TRY();
        int e = gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, w, C, inp, C, out, ldo, ab, ct, &one);
        if (e) return e;
        return 0;
    } else {
        int e = gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, w, C, inp, C, out, ldo, ab, ct);
        if (e) return e;
    }
    if (b && ct == CUDA_R_32F) {
        k_bias<<<zkc_grid((size_t)N * OC, 256), 256, 0, s>>>((float *)out, b, (size_t)N, OC, ldo);
        LAUNCH_TRY();
    } else if (b) {       /* C == 0: an empty sum, the bias alone */
        k_bias_fill_b16<<<zkc_grid((size_t)N * OC, 256), 256, 0, s>>>((__nv_bfloat16 *)out, b, (size_t)N, OC, ldo);
        LAUNCH_TRY();
    }
    return 0;
}

template <typename T>
static int bwd(cublasHandle_t h, cudaStream_t s, float *dinp, float *dw, float *db,
               const T *dout, const T *inp, const T *w, int N, int C, int OC, int ldo,
               cudaDataType_t ab, double *scratch)
{
    CUBLAS_TRY(cublasSetStream(h, s));
    if (dinp && N > 0 && C > 0) {          /* dinp (N,C) = dout (N,OC) @ w (OC,C) */
        if (OC == 0) { if (cudaMemsetAsync(dinp, 0, (size_t)N * C * 4, s)) return ZKC_LAUNCH_BASE + (int)cudaGetLastError(); }
        else { int e = gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, w, C, dout, ldo, dinp, C, ab); if (e) return e; }
    }
    if (dw && OC > 0 && C > 0) {           /* dw (OC,C) = dout^T @ inp, k over the N rows */
        if (N == 0) { if (cudaMemsetAsync(dw, 0, (size_t)OC * C * 4, s)) return ZKC_LAUNCH_BASE + (int)cudaGetLastError(); }
        else { int e = gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, ldo, dw, C, ab); if (e) return e; }
    }
    if (db && OC) {                        /* two passes, fixed chunks: colsum.cu */
        int e = ab == CUDA_R_32F ? zkc_colsum(s, db, (const float *)dout, N, OC, ldo, scratch)
                                 : zkc_colsum_bf16(s, db, (const uint16_t *)dout, N, OC, ldo, scratch);
        if (e) return ZKC_LAUNCH_BASE + e;
    }
    return 0;
}

extern "C" {
int zkc_matmul_forward(cublasHandle_t h, cudaStream_t s, float *out, const float *inp,
                       const float *w, const float *b, int N, int C, int OC, int ldo)
{
    return fwd(h, s, out, inp, w, b, N, C, OC, ldo, CUDA_R_32F, CUDA_R_32F);
}

int zkc_matmul_backward(cublasHandle_t h, cudaStream_t s, float *dinp, float *dw, float *db,
                        const float *dout, const float *inp, const float *w,
                        int N, int C, int OC, int ldo, double *scratch)
{
    return bwd<float>(h, s, dinp, dw, db, dout, inp, w, N, C, OC, ldo, CUDA_R_32F, scratch);
}

int zkc_matmul_bf16_forward(cublasHandle_t h, cudaStream_t s, void *out, int out_bf16,
                            const uint16_t *inp, const uint16_t *w, const float *b,
                            int N, int C, int OC, int ldo)
{
    return fwd(h, s, out, inp, w, b, N, C, OC, ldo, CUDA_R_16BF,
               out_bf16 ? CUDA_R_16BF : CUDA_R_32F);
}

int zkc_matmul_bf16_backward(cublasHandle_t h, cudaStream_t s, float *dinp, float *dw,
                             float *db, const uint16_t *dout, const uint16_t *inp,
                             const uint16_t *w, int N, int C, int OC, int ldo,
                             double *scratch)
{
    return bwd<__nv_bfloat16>(h, s, dinp, dw, db, (const __nv_bfloat16 *)dout,
                              (const __nv_bfloat16 *)inp, (const __nv_bfloat16 *)w, N, C, OC,
                              ldo, CUDA_R_16BF, scratch);
}
}
