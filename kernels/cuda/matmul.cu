/* matmul.cu -- GEMMs through cuBLAS (kernels.cuh), row-major layouts of
 * zk_matmul_*: a row-major (R,K) array is cuBLAS's column-major (K,R), so
 *   out (N,OC) = inp (N,C) @ w (OC,C)^T   is  out^T = w^T(op T) . inp^T
 * and likewise for the two backward products (llm.c's calls). fp32 compute
 * throughout; the bias is a kernel after the GEMM (one fp32 add, as the
 * CPU) or cuBLASLt's bias epilogue (zkc_matmul_epilogue, below), the bias
 * fp32 or (b16) bf16 widened exactly (the bits of its fp32 copy); dbias a
 * column sum in two fixed passes (colsum.cu). out and dout may have padded rows
 * (ldo >= OC, the LM head's logits): cuBLAS takes aligned kernels when the
 * row stride is a multiple of 16 bytes, which V = 50257 is not. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include "common.cuh"

/* The bias kernels read b as B: float, or uint16_t (b16: a bf16 run's
 * stored bias, widened exactly, zkc_get), so a bf16 bias gives the bits of
 * an fp32 one holding the widened values. */

/* out[n,oc] += b[oc], rows ld apart */
template <class B>
__global__ static void k_bias(float *out, const B *b, size_t N, int OC, int ld)
{
    ZKC_FOR(i, N * (size_t)OC) out[i / OC * ld + i % OC] += zkc_get(b + i % OC);
}

/* each row set to the bias in out's type O: a bf16 out's rows before a
 * beta = 1 GEMM, which adds the product to them in fp32 and rounds once
 * (adding the bias after the GEMM rounded twice: off by half a bf16 ulp of
 * the product where the bias cancels it, which an H200 showed); and one
 * row (N = 1) staging the bias for cuBLASLt's epilogue (lt_gemm). The bias
 * rounded to bf16 (exact for a widened bf16 one), or fp32 as it is. */
__device__ __forceinline__ __nv_bfloat16 bias_as(const __nv_bfloat16 *, float v) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ float bias_as(const float *, float v) { return v; }
template <class B, class O>
__global__ static void k_bias_fill(O *out, const B *b, size_t N, int OC, int ld)
{
    ZKC_FOR(i, N * (size_t)OC) out[i / OC * ld + i % OC] = bias_as(out, zkc_get(b + i % OC));
}

/* the bias b (N rows of OC, ld apart) onto out: added to an fp32 out
 * (add), else written in out's type ct (k_bias_fill) */
template <class B>
static int bias_rows_t(cudaStream_t s, void *out, cudaDataType_t ct, int add, const B *b,
                       size_t N, int OC, int ld)
{
    unsigned g = zkc_grid(N * (size_t)OC, 256);
    if (add) k_bias<B><<<g, 256, 0, s>>>((float *)out, b, N, OC, ld);
    else if (ct == CUDA_R_16BF) k_bias_fill<B, __nv_bfloat16><<<g, 256, 0, s>>>((__nv_bfloat16 *)out, b, N, OC, ld);
    else k_bias_fill<B, float><<<g, 256, 0, s>>>((float *)out, b, N, OC, ld);
    return ZKC_LAUNCHED();
}
/* ... with b fp32, or (b16) bf16; a launch error + ZKC_LAUNCH_BASE */
static int bias_rows(cudaStream_t s, void *out, cudaDataType_t ct, int add, const void *b, int b16,
                     size_t N, int OC, int ld)
{
    int e = b16 ? bias_rows_t(s, out, ct, add, (const uint16_t *)b, N, OC, ld)
                : bias_rows_t(s, out, ct, add, (const float *)b, N, OC, ld);
    return e ? ZKC_LAUNCH_BASE + e : 0;
}

#define CUBLAS_TRY(x) do { cublasStatus_t st_ = (x); if (st_ != CUBLAS_STATUS_SUCCESS) return (int)st_; } while (0)

static const float one = 1.0f, zero = 0.0f;

/* cublasGemmEx adding onto a bf16 C (beta = 1: the bias rows filled
 * first) in pedantic math, so no kernel rounds a partial sum to bf16 on the
 * way (the plain path only: cuBLASLt's plans mask split-K off for a bf16
 * D); slow, and only where cuBLASLt is off or has no plan */
static int gemm_onto_bf16(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                          int k, const void *a, int lda, const void *b, int ldb, void *c, int ldc)
{
    cublasMath_t was;
    CUBLAS_TRY(cublasGetMathMode(h, &was));
    CUBLAS_TRY(cublasSetMathMode(h, (cublasMath_t)(CUBLAS_PEDANTIC_MATH |
                                                   CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    cublasStatus_t st = cublasGemmEx(h, ta, tb, m, n, k, &one, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb,
                                     &one, c, CUDA_R_16BF, ldc, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT);
    CUBLAS_TRY(cublasSetMathMode(h, was));
    return (int)st;
}

/* the one GEMM shape family, for fp32 (CUDA_R_32F) or bf16 (CUDA_R_16BF) A,
 * B; C fp32, or bf16 (ct) with bf16 A, B */
static int gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                int k, const void *a, int lda, const void *b, int ldb, void *c, int ldc,
                cudaDataType_t ab, cudaDataType_t ct = CUDA_R_32F, const float *beta = &zero)
{
    if (ab == CUDA_R_32F) {
        CUBLAS_TRY(cublasSgemm(h, ta, tb, m, n, k, &one, (const float *)a, lda,
                               (const float *)b, ldb, beta, (float *)c, ldc));
    } else {
        CUBLAS_TRY(cublasGemmEx(h, ta, tb, m, n, k, &one, a, ab, lda, b, ab, ldb, beta,
                                c, ct, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    return 0;
}

/* ---- cuBLASLt (zkc_matmul_epilogue): every GEMM of a call through one
 * cublasLtMatmul with a plan kept per shape, layout and dtype -- the
 * forward's bias in the epilogue (CUBLASLT_EPILOGUE_BIAS, added to the fp32
 * accumulator before the one rounding of the output, as the CPU adds it;
 * the bias in D's type: for a bf16 out a bf16 bias as it is, an fp32 one
 * rounded to bf16 into the stream's workspace first -- exact for a bf16
 * model, whose stored biases are bf16, so the CPU's bits; the cuBLAS path
 * gets the same by filling the rows with the bias and a beta = 1 GEMM),
 * padded rows through the layouts' leading dimensions, bf16 or fp32 out,
 * and both backward products. Mode 2 (the default) takes it for bf16
 * operands only: an H200 ran the qkv bf16 forward at 469 TFLOP/s through it
 * against 232 through cublasGemmEx; fp32 stays on cublasSgemm (mode 1 takes
 * it for both, mode 0 for neither).
 *
 * One algorithm per plan, chosen by the heuristic at first use and kept for
 * the process: the same bits run to run. Split-K is allowed (the backward's
 * weight gradient has k = N = B*T and few output tiles), with its partial
 * sums in fp32 only: the reduction schemes are masked to none, fp32 partials
 * in the workspace, and in place only where the output is fp32 (in place
 * sums in the output's type; bf16 partials are what the handle's
 * DISALLOW_REDUCED_PRECISION_REDUCTION keeps out of cublasGemmEx). Each
 * stream has its own workspace (matmuls on two streams may overlap on the
 * GPU; one shared workspace would be a race). A shape, layout or alignment
 * the heuristic has no algorithm for keeps the plain path, decided once per
 * plan (or at its first call, where cublasLtMatmul refuses it), so the
 * path is a function of the shapes (the same for every strategy, whose
 * views share offsets and alignment). Callers serialise
 * (device_cuda.c's lock): the plan cache, the workspace table and the
 * descriptors whose bias and aux pointers change per call need no lock of
 * their own. The MLP's GELU rides the same plans through its epilogues
 * (LT_GELU_*, zkc_matmul_gelu_fusion, at the end of this file).
 * ---- */
static int lt_mode = 2;

int zkc_matmul_epilogue(int on)
{
    if (on >= 0 && on <= 2) lt_mode = on;
    return lt_mode;
}

static int lt_wanted(cudaDataType_t ab) { return lt_mode == 1 || (lt_mode == 2 && ab != CUDA_R_32F); }

struct lt_key {
    int m, n, k, lda, ldb, ldc;
    cublasOperation_t ta, tb;
    cudaDataType_t ab, ct;
    int bias;                        /* CUBLASLT_EPILOGUE_BIAS, the bias in D's type */
    int gelu;                        /* LT_GELU_*: the GELU epilogues (below) */
    int auxld;                       /* their aux matrix's leading dimension (0 without) */
};

/* The GELU epilogues (zkc_matmul_gelu_fusion), both with a bf16 D and a
 * bf16 aux matrix of D's shape (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_*, ld
 * auxld, 16-byte aligned as the operands):
 *  - LT_GELU_FWD: CUBLASLT_EPILOGUE_GELU_AUX_BIAS (GELU_AUX without a
 *    bias): aux = acc + bias rounded to bf16 (the pre-activation, which the
 *    BIAS epilogue would have written to D), D = gelu(acc + bias) computed
 *    from the fp32 sum by cuBLASLt's GELU and rounded once;
 *  - LT_GELU_BWD: CUBLASLT_EPILOGUE_DGELU: D = gelu'(aux) * acc rounded
 *    once, aux read (the forward's pre-activation). Not DGELU_BGRAD: the
 *    bias gradient stays colsum.cu's deterministic sum. */
enum { LT_GELU_NONE = 0, LT_GELU_FWD = 1, LT_GELU_BWD = 2 };

#define LT_PLANS 128
struct lt_plan {
    struct lt_key key;
    int ok;                          /* 0: no algorithm (plain path) */
    int ran;                         /* a call succeeded: from then on a failure is an error */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    size_t ws;                       /* the algorithm's workspace */
};
static cublasLtHandle_t lt;
static struct lt_plan lt_plans[LT_PLANS];
static int lt_nplans;

#define LT_WS ((size_t)32 << 20)     /* a stream's workspace for the GEMMs */
#define LT_BIAS 65536                /* then room for a staged bias of this many columns
                                      * (fp32): the most a bias epilogue takes */
#define LT_STREAMS 16
static struct { cudaStream_t s; void *p; } lt_ws[LT_STREAMS];

/* stream s's workspace (allocated at its first Lt GEMM), or NULL */
static void *lt_workspace(cudaStream_t s)
{
    int freeslot = -1;
    for (int i = 0; i < LT_STREAMS; i++) {
        if (lt_ws[i].p && lt_ws[i].s == s) return lt_ws[i].p;
        if (!lt_ws[i].p && freeslot < 0) freeslot = i;
    }
    if (freeslot < 0) return NULL;   /* more live streams than slots: the plain path */
    if (cudaMalloc(&lt_ws[freeslot].p, LT_WS + LT_BIAS * 4) != cudaSuccess) {
        (void)cudaGetLastError();
        lt_ws[freeslot].p = NULL;
        return NULL;
    }
    lt_ws[freeslot].s = s;
    return lt_ws[freeslot].p;
}

/* stream s is gone (device_cuda.c, after syncing it): its workspace back */
extern "C" void zkc_matmul_stream_gone(cudaStream_t s)
{
    for (int i = 0; i < LT_STREAMS; i++)
        if (lt_ws[i].p && lt_ws[i].s == s) {
            cudaFree(lt_ws[i].p);
            lt_ws[i].p = NULL;
            lt_ws[i].s = NULL;
        }
}

/* 16-byte aligned pointers and row strides: the alignment the plans ask for */
static int lt_aligned(const void *p, int ld, cudaDataType_t t)
{
    size_t es = t == CUDA_R_32F ? 4 : 2;
    return p == NULL || ((((uintptr_t)p) & 15) == 0 && ((size_t)ld * es) % 16 == 0);
}

/* A, B and D of key k as the plans promise them */
static int lt_operands(const struct lt_key *k, const void *a, const void *b, const void *d)
{
    return lt_aligned(a, k->lda, k->ab) && lt_aligned(b, k->ldb, k->ab) && lt_aligned(d, k->ldc, k->ct);
}

/* The heuristic's candidates, best first: a plan takes the first. (A
 * filter that kept a bias on a bf16 D to candidates making each tile in one
 * pass -- split-K 1, custom option 0 -- cost an H200 2.7 ms a GPT-2 step,
 * the fc GEMM at 275 TFLOP/s against 508, and was not needed: the bias
 * epilogue was right on its first candidate, custom option 4; what was
 * wrong was a beta = 1 GEMM onto bf16 rows, below.) */
#define LT_RESULTS 16
static int lt_cfg(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t at)
{
    uint32_t v = 0;            /* every attribute read here is 2 or 4 bytes */
    size_t w = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(a, at, &v, sizeof v, &w) == CUBLAS_STATUS_SUCCESS) return (int)v;
    uint16_t h = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(a, at, &h, sizeof h, &w) == CUBLAS_STATUS_SUCCESS) return h;
    return -1;
}
/* ZTRAIN_LT_DEBUG=1: each plan's shape and the heuristic's candidates */
static void lt_debug(const struct lt_key *k, const cublasLtMatmulHeuristicResult_t *res, int n, int pick)
{
    fprintf(stderr, "lt plan m=%d n=%d k=%d ld=%d,%d,%d t=%d%d ab=%d ct=%d bias=%d gelu=%d auxld=%d: "
            "%d candidates, took %d\n", k->m, k->n, k->k, k->lda, k->ldb, k->ldc, (int)k->ta, (int)k->tb,
            (int)k->ab, (int)k->ct, k->bias, k->gelu, k->auxld, n, pick);
    for (int i = 0; i < n && i < 6; i++)
        fprintf(stderr, "  %d: id %d tile %d splitk %d red %d custom %d stages %d cluster %d ws %zu waves %.2f\n", i,
                lt_cfg(&res[i].algo, CUBLASLT_ALGO_CONFIG_ID), lt_cfg(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                lt_cfg(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                lt_cfg(&res[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
                lt_cfg(&res[i].algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
                lt_cfg(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                lt_cfg(&res[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), res[i].workspaceSize, res[i].wavesCount);
}

static int lt_make(struct lt_plan *p)
{
    const struct lt_key *k = &p->key;
    cublasLtEpilogue_t ep = k->gelu == LT_GELU_FWD ? (k->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                              : CUBLASLT_EPILOGUE_GELU_AUX)
                          : k->gelu == LT_GELU_BWD ? CUBLASLT_EPILOGUE_DGELU
                          : k->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    /* the bias in D's type (cuBLASLt's rule for a bf16 D): a bf16 bias, or
     * an fp32 one rounded to bf16 first, then added to the fp32 accumulator
     * and the sum rounded once -- the bits of the bias rows filled first
     * and a beta = 1 GEMM (k_bias_fill); the CPU's where the bias is bf16
     * (a bf16 model's are) */
    cudaDataType_t bt = k->ct == CUDA_R_16BF ? CUDA_R_16BF : CUDA_R_32F;
    /* split-K: fp32 partials only; none at all for a bf16 D (an H200 gave
     * one-ulp errors on a bf16 out with a bias at 16x768x50176, in both
     * libraries, where one GEMM of 50257 columns had none) */
    uint32_t al = 16, red = k->ct == CUDA_R_32F ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                                                  CUBLASLT_REDUCTION_SCHEME_INPLACE
                                                : CUBLASLT_REDUCTION_SCHEME_NONE;
    size_t ws = LT_WS;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res[LT_RESULTS];
    int nres = 0;
    /* the heuristic reads the bias pointer's value for its alignment: a
     * stand-in on exactly 16 bytes, what lt_gemm promises (NULL would read
     * as aligned on anything) */
    const void *bias16 = (const void *)(uintptr_t)16;
    /* the GELU epilogues' aux matrix: ld auxld, its pointer a stand-in on
     * 16 bytes as the bias's (lt_gemm sets the real one); its type left at
     * the default, D's (bf16), as llm.c runs these epilogues on an H100 --
     * naming it is one more attribute a library version may refuse */
    int64_t auxld = k->auxld;
    /* as stored: A (k, m) when transposed else (m, k), B (n, k) when
     * transposed else (k, n), C = D (m, n); column-major, the given ld */
    int ar = k->ta == CUBLAS_OP_T ? k->k : k->m, ac = k->ta == CUBLAS_OP_T ? k->m : k->k;
    int br = k->tb == CUBLAS_OP_T ? k->n : k->k, bc = k->tb == CUBLAS_OP_T ? k->k : k->n;
    int bad = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) ||
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &k->ta, sizeof k->ta) ||
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &k->tb, sizeof k->tb) ||
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep) ||
        (k->bias && cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                   &bt, sizeof bt)) ||
        (k->bias && cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &bias16, sizeof bias16)) ||
        (k->gelu && (cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                    &auxld, sizeof auxld) ||
                     cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                    &bias16, sizeof bias16))) ||
        cublasLtMatrixLayoutCreate(&p->la, k->ab, ar, ac, k->lda) ||
        cublasLtMatrixLayoutCreate(&p->lb, k->ab, br, bc, k->ldb) ||
        cublasLtMatrixLayoutCreate(&p->lc, k->ct, k->m, k->n, k->ldc) ||
        cublasLtMatmulPreferenceCreate(&pref) ||
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ||
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof red) ||
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al) ||
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al) ||
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al) ||
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al) ||
        cublasLtMatmulAlgoGetHeuristic(lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, LT_RESULTS, res, &nres);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    int pick = -1;
    for (int i = 0; !bad && i < nres && pick < 0; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= LT_WS) pick = i;
    if (getenv("ZTRAIN_LT_DEBUG")) lt_debug(k, res, bad ? 0 : nres, pick);
    if (pick < 0) return 0;
    p->algo = res[pick].algo;
    p->ws = res[pick].workspaceSize;
    return 1;
}

/* the plan of key k, made at its first use; NULL: the plain path */
static struct lt_plan *lt_plan(const struct lt_key *k)
{
    for (int i = 0; i < lt_nplans; i++)
        if (!memcmp(&lt_plans[i].key, k, sizeof *k)) return lt_plans[i].ok ? &lt_plans[i] : NULL;
    if (!lt && cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) { lt = NULL; return NULL; }
    if (lt_nplans == LT_PLANS) return NULL;                  /* plain path from here */
    struct lt_plan *p = &lt_plans[lt_nplans++];
    memset(p, 0, sizeof *p);
    p->key = *k;
    p->ok = lt_make(p);
    return p->ok ? p : NULL;
}

/* D = op(A) op(B) (+ bias) (+ D when beta is 1), through the key's GELU
 * epilogue with aux (bf16, rows k->auxld apart) where it has one; *done =
 * 0 where the key has no plan (the caller takes the plain path). bias
 * fp32, or (b16) bf16: the epilogue takes it as it is where it is in D's
 * type and on 16 bytes, else staged after the workspace in D's type
 * (rounded, widened or copied: k_bias_fill), so the path and the bits
 * never depend on the bias's type or alignment (a bf16 bias has the bits
 * of an fp32 one holding its widened values), and a bias epilogue takes
 * at most LT_BIAS columns, either way */
static int lt_gemm(cudaStream_t s, const struct lt_key *k, const void *a, const void *b, void *d,
                   const void *bias, int b16, int *done, const float *beta = &zero,
                   const void *aux = NULL)
{
    *done = 0;
    if (!lt_operands(k, a, b, d)) return 0;
    if (k->gelu && (!aux || !lt_aligned(aux, k->auxld, CUDA_R_16BF))) return 0;
    if (k->bias && k->m > LT_BIAS) return 0;
    struct lt_plan *p = lt_plan(k);
    if (!p) return 0;
    int stage = k->bias && ((b16 != 0) != (k->ct == CUDA_R_16BF) || ((uintptr_t)bias & 15));
    void *ws = p->ws || stage ? lt_workspace(s) : NULL;
    /* no workspace (out of memory, or more live streams than slots): an
     * error, not cuBLAS -- the path, hence the bits, must follow the shapes */
    if ((p->ws || stage) && !ws) return ZKC_LAUNCH_BASE + (int)cudaErrorMemoryAllocation;
    const void *bp = bias;
    if (stage) {        /* one row of the bias in D's type after the workspace, in stream order */
        bp = (char *)ws + LT_WS;
        int e = bias_rows(s, (void *)bp, k->ct, 0, bias, b16, 1, k->m, k->m);
        if (e) return e;
    }
    if (k->bias)
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
    if (k->gelu)
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    cublasStatus_t st = cublasLtMatmul(lt, p->desc, &one, a, p->la, b, p->lb, beta, d, p->lc, d,
                                       p->lc, &p->algo, ws, p->ws, s);
    if (!p->ran && (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE)) {
        p->ok = 0;                   /* refused at its first call (nothing launched): cuBLAS from now on */
        return 0;
    }
    if (st != CUBLAS_STATUS_SUCCESS) return (int)st;
    p->ran = 1;
    *done = 1;
    return 0;
}

static struct lt_key lt_key_of(int m, int n, int k, cublasOperation_t ta, cublasOperation_t tb,
                               int lda, int ldb, int ldc, cudaDataType_t ab, cudaDataType_t ct,
                               int bias, int gelu = LT_GELU_NONE, int auxld = 0)
{
    struct lt_key key;
    memset(&key, 0, sizeof key);     /* the padding too: keys are compared with memcmp */
    key.m = m; key.n = n; key.k = k; key.lda = lda; key.ldb = ldb; key.ldc = ldc;
    key.ta = ta; key.tb = tb; key.ab = ab; key.ct = ct; key.bias = bias;
    key.gelu = gelu; key.auxld = auxld;
    return key;
}

/* The LM head's OC is V = 50257 rows of wte: an H200 ran its bf16 GEMMs at
 * 95 TFLOP/s forward and 200 backward, against 460-590 for the block's
 * (bench_cuda), whatever the library or the padding of the logits' rows.
 * So a bf16 GEMM with many output columns not a multiple of 128 is two:
 * columns [0, split_at(OC)) and the rest (81 of the LM head's), each
 * element still one sum over k (the forward and the weight gradient), or
 * (dinp, whose k is OC) two partial sums added in that order (in fp32: a
 * bf16 dinp is their fp32 sum in scratch, rounded once). A function of
 * the shapes: the same path, the same bits, for every strategy.
 * zkc_matmul_split(0) turns it off (bench_cuda compares). */
static int split_on = 1;
int zkc_matmul_split(int on)
{
    if (on == 0 || on == 1) split_on = on;
    return split_on;
}
static int split_at(int OC, cudaDataType_t ab)
{
    return split_on && ab != CUDA_R_32F && OC > 8192 && OC % 128 ? OC & ~127 : 0;
}

/* A bf16 run's weight gradient (g16) on a small output: a bf16-D plan has
 * no split-K (lt_make), so a dw of few output tiles and a long k = N runs
 * on a fraction of the GPU (GPT-2's attn.c_proj dw: 768x768, 36 tiles of
 * 128x128 on a 132-SM H100, k = 16384 tokens), where the fp32-D plan may
 * split k. The rule: the output's 128x128 tiles, ceil(OC/128) *
 * ceil(C/128), fewer than the device's SMs (less than one wave of
 * output tiles without split-K) -> dw through the fp32 path into scratch
 * (the g16 0 call's GEMMs, its plan and its bits) and zkc_cast_f32_bf16
 * into dw: the fp32 call's dw rounded once, bit for bit. Otherwise one
 * GEMM with a bf16 D. A function of the shapes and the GPU model (its SM
 * count, read once per device), so every strategy on one kind of GPU
 * takes the same path; the bf16-D shapes' bits may differ between GPU
 * models anyway (cuBLAS's heuristic). GPT-2 124M on an H100 or H200 (132
 * SMs): qkv (2304x768, 108 tiles) and attn.c_proj (36) take the fp32
 * path, the MLP's (144 each) and the LM head's the bf16 D.
 * zkc_matmul_g16_hybrid(0) turns it off (bench_cuda compares). */
static int g16_hybrid_on = 1;
int zkc_matmul_g16_hybrid(int on)
{
    if (on == 0 || on == 1) g16_hybrid_on = on;
    return g16_hybrid_on;
}
#define SM_DEVS 64
static int sm_count(void)
{
    static int sms[SM_DEVS];            /* callers serialise (device_cuda.c's lock) */
    int d = 0, n = 0;
    if (cudaGetDevice(&d) != cudaSuccess) { (void)cudaGetLastError(); return 0; }
    if (d >= 0 && d < SM_DEVS && sms[d]) return sms[d];
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, d) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;                        /* unknown: the bf16 D (no scratch asked for) */
    }
    if (d >= 0 && d < SM_DEVS) sms[d] = n;
    return n;
}
static int dw_via_f32(int N, int C, int OC)
{
    if (!g16_hybrid_on || N <= 0 || C <= 0 || OC <= 0) return 0;
    long long tiles = (long long)((OC + 127) / 128) * ((C + 127) / 128);
    return tiles < sm_count();
}

static int fwd1(cublasHandle_t h, cudaStream_t s, void *out, const void *inp, const void *w,
                const void *b, int b16, int N, int C, int OC, int ldo, cudaDataType_t ab,
                cudaDataType_t ct);

/* out (N,OC), rows ldo apart, fp32 or (ct = CUDA_R_16BF) bf16; b (NULL:
 * none) fp32, or (b16) bf16 */
static int fwd(cublasHandle_t h, cudaStream_t s, void *out, const void *inp, const void *w,
               const void *b, int b16, int N, int C, int OC, int ldo, cudaDataType_t ab,
               cudaDataType_t ct)
{
    int at = N > 0 && C > 0 ? split_at(OC, ab) : 0;
    if (!at) return fwd1(h, s, out, inp, w, b, b16, N, C, OC, ldo, ab, ct);
    size_t eo = ct == CUDA_R_32F ? 4 : 2;
    int e = fwd1(h, s, out, inp, w, b, b16, N, C, at, ldo, ab, ct);
    if (e) return e;
    return fwd1(h, s, (char *)out + (size_t)at * eo, inp, (const char *)w + (size_t)at * C * 2,
                b ? (const char *)b + (size_t)at * (b16 ? 2 : 4) : NULL, b16, N, C, OC - at, ldo,
                ab, ct);
}

static int fwd1(cublasHandle_t h, cudaStream_t s, void *out, const void *inp, const void *w,
               const void *b, int b16, int N, int C, int OC, int ldo, cudaDataType_t ab,
               cudaDataType_t ct)
{
    if (N == 0 || OC == 0) return 0;
    if (lt_wanted(ab) && C > 0) {
        /* out^T (OC, N) = w (C, OC)^T . inp^T (C, N), column-major */
        struct lt_key k = lt_key_of(OC, N, C, CUBLAS_OP_T, CUBLAS_OP_N, C, C, ldo, ab, ct, b != NULL);
        int done, e = lt_gemm(s, &k, w, inp, out, b, b16, &done);
        if (e || done) return e;
        /* a bias on a bf16 out without an epilogue plan: the plain path's
         * bias rows and pedantic beta = 1 GEMM below. Not cuBLASLt's beta =
         * 1: on an H200 its first candidate for 16x768x50176 (custom option
         * 1) rounded a partial to bf16 before adding the rows (one ulp off) */
    }
    CUBLAS_TRY(cublasSetStream(h, s));
    size_t es = ct == CUDA_R_32F ? 4 : 2;
    if (C == 0) {                 /* an empty sum: cuBLAS may not write C at k = 0 */
        if (cudaMemset2DAsync(out, (size_t)ldo * es, 0, (size_t)OC * es, (size_t)N, s))
            return ZKC_LAUNCH_BASE + (int)cudaGetLastError();
    } else if (b && ct != CUDA_R_32F) {    /* bf16 out: the bias first, beta = 1 */
        int e = bias_rows(s, out, ct, 0, b, b16, (size_t)N, OC, ldo);
        if (e) return e;
        return gemm_onto_bf16(h, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, w, C, inp, C, out, ldo);
    } else {
        int e = gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, w, C, inp, C, out, ldo, ab, ct);
        if (e) return e;
    }
    /* an fp32 out: the bias added; a bf16 one here had C == 0 (an empty
     * sum): the bias alone */
    return b ? bias_rows(s, out, ct, ct == CUDA_R_32F, b, b16, (size_t)N, OC, ldo) : 0;
}

/* one backward product, fp32 out (or ct = CUDA_R_16BF: a bf16 out, the
 * fp32 sum rounded once, beta 0 only): through cuBLASLt where wanted and
 * planned (a bf16 D's plan without split-K partials: lt_make), else cuBLAS
 * (the handle already on stream s; a bf16 C as the forward's bf16 out
 * without a bias: the handle's DISALLOW_REDUCED_PRECISION_REDUCTION keeps
 * its partial sums fp32) */
static int prod(cublasHandle_t h, cudaStream_t s, cublasOperation_t ta, cublasOperation_t tb,
                int m, int n, int k, const void *a, int lda, const void *b, int ldb, void *c,
                int ldc, cudaDataType_t ab, const float *beta = &zero,
                cudaDataType_t ct = CUDA_R_32F)
{
    if (lt_wanted(ab)) {
        struct lt_key key = lt_key_of(m, n, k, ta, tb, lda, ldb, ldc, ab, ct, 0);
        int done, e = lt_gemm(s, &key, a, b, c, NULL, 0, &done, beta);
        if (e || done) return e;
    }
    return gemm(h, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, ab, ct, beta);
}

/* dinp16 (bf16 operands only): dinp bf16, the fp32 dinp rounded once --
 * one GEMM with a bf16 D where OC is not split (prod), else (split_at: k =
 * OC in two partial sums, which cannot be added in bf16) the fp32 path's
 * two products into scratch as fp32 (N*C floats) and zkc_cast_f32_bf16
 * from there: then exactly the fp32 dinp's bits rounded once. The scratch
 * is free again for db's colsum afterwards (stream order).
 * g16 (bf16 operands only): dw and db bf16, a bf16 run's stored gradients
 * written by the op (no fp32 image of them in the caller's memory). dw by
 * the output's size (dw_via_f32, after split_at):
 *  - a small output (fewer 128x128 tiles than the GPU has SMs): the fp32
 *    path's GEMMs (the g16 0 call's, its plan, split-K partials and all)
 *    into scratch (OC*C floats), then zkc_cast_f32_bf16 into dw: the
 *    fp32 call's dw rounded once, bit for bit (an fp32 dw on 16 bytes, as
 *    the scratch is: the same plan; lt_gemm's alignment rule could send a
 *    misaligned fp32 dw down the plain path). The scratch is then free
 *    for db's colsum (stream order, as after dinp16's use above);
 *  - else one GEMM with a bf16 D (dw's k is N, never split, so every
 *    element is one fp32 sum; prod: cuBLASLt's bf16-D plan, its own
 *    algorithm pinned per shape like every plan, split-K masked off; or
 *    cublasGemmEx with a bf16 C, partial sums fp32 by the handle's
 *    DISALLOW_REDUCED_PRECISION_REDUCTION), the fp32 accumulator rounded
 *    once -- within the fp32 GEMM's bound plus half a bf16 ulp, as
 *    dinp16's, not necessarily the fp32 call's dw rounded (the bf16-D plan
 *    may be another algorithm). With many output tiles the GPU is full
 *    without split-K, and the bf16 D saves the fp32 image's traffic.
 * db is colsum.cu's double sums rounded to float, then to bf16 once: the
 * fp32 call's db rounded, bit for bit. fp32 dw, db (g16 0): unchanged. */
template <typename T>
static int bwd(cublasHandle_t h, cudaStream_t s, void *dinp, int dinp16, void *dw, void *db,
               int g16, const T *dout, const T *inp, const T *w, int N, int C, int OC, int ldo,
               cudaDataType_t ab, double *scratch)
{
    CUBLAS_TRY(cublasSetStream(h, s));
    int at = split_at(OC, ab);             /* see split_at: 0 or where OC is cut */
    if ((dinp16 || g16) && ab == CUDA_R_32F) return ZKC_LAUNCH_BASE + (int)cudaErrorInvalidValue;
    if (dinp && N > 0 && C > 0) {          /* dinp (N,C) = dout (N,OC) @ w (OC,C) */
        size_t es = dinp16 ? 2 : 4;
        cudaDataType_t ct = dinp16 ? CUDA_R_16BF : CUDA_R_32F;
        if (OC == 0) { if (cudaMemsetAsync(dinp, 0, (size_t)N * C * es, s)) return ZKC_LAUNCH_BASE + (int)cudaGetLastError(); }
        else if (!at) { int e = prod(h, s, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, w, C, dout, ldo, dinp, C, ab, &zero, ct); if (e) return e; }
        else {                             /* k = OC in two parts, the second added to the first */
            if (dinp16 && !scratch) return ZKC_LAUNCH_BASE + (int)cudaErrorInvalidValue;
            float *d32 = dinp16 ? (float *)scratch : (float *)dinp;
            int e = prod(h, s, CUBLAS_OP_N, CUBLAS_OP_N, C, N, at, w, C, dout, ldo, d32, C, ab);
            if (!e) e = prod(h, s, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC - at, w + (size_t)at * C, C,
                             dout + at, ldo, d32, C, ab, &one);
            if (e) return e;
            if (dinp16) {                  /* the fp32 sum rounded once (RNE) */
                e = zkc_cast_f32_bf16(s, (uint16_t *)dinp, d32, (size_t)N * C);
                if (e) return ZKC_LAUNCH_BASE + e;
            }
        }
    }
    if (dw && OC > 0 && C > 0) {           /* dw (OC,C) = dout^T @ inp, k over the N rows */
        /* g16 on a small output (dw_via_f32): the fp32 GEMMs into scratch,
         * then one cast into dw (stream order: after dinp's use of the
         * scratch, before db's) */
        int via = g16 && dw_via_f32(N, C, OC);
        if (via && !scratch) return ZKC_LAUNCH_BASE + (int)cudaErrorInvalidValue;
        void *d = via ? (void *)scratch : dw;
        int d16 = g16 && !via;             /* D's element: fp32, or bf16 */
        size_t es = d16 ? 2 : 4;
        cudaDataType_t ct = d16 ? CUDA_R_16BF : CUDA_R_32F;
        if (N == 0) { if (cudaMemsetAsync(dw, 0, (size_t)OC * C * (g16 ? 2 : 4), s)) return ZKC_LAUNCH_BASE + (int)cudaGetLastError(); }
        else if (!at) { int e = prod(h, s, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, ldo, d, C, ab, &zero, ct); if (e) return e; }
        else {                             /* the rows of dw [0, at), then the rest */
            int e = prod(h, s, CUBLAS_OP_N, CUBLAS_OP_T, C, at, N, inp, C, dout, ldo, d, C, ab, &zero, ct);
            if (!e) e = prod(h, s, CUBLAS_OP_N, CUBLAS_OP_T, C, OC - at, N, inp, C, dout + at, ldo,
                             (char *)d + (size_t)at * C * es, C, ab, &zero, ct);
            if (e) return e;
        }
        if (via && N > 0) {                /* the fp32 dw rounded once (RNE) */
            int e = zkc_cast_f32_bf16(s, (uint16_t *)dw, (const float *)scratch, (size_t)OC * C);
            if (e) return ZKC_LAUNCH_BASE + e;
        }
    }
    if (db && OC) {                        /* two passes, fixed chunks: colsum.cu */
        int e = ab == CUDA_R_32F ? zkc_colsum(s, db, 0, (const float *)dout, N, OC, ldo, scratch)   /* no g16: above */
                                 : zkc_colsum_bf16(s, db, g16, (const uint16_t *)dout, N, OC, ldo, scratch);
        if (e) return ZKC_LAUNCH_BASE + e;
    }
    return 0;
}

/* ---- the MLP's GEMMs with the GELU (zkc_matmul_bf16_forward_gelu,
 * zkc_matmul_bf16_backward_dgelu): one cublasLtMatmul through the GELU
 * epilogues (LT_GELU_*) where the shape has a plan, else exactly the two
 * ops apart that runtime/ops.c issues where a device has no fused entry
 * (fwd() into pre then gelu.cu's bf16-in, bf16-out kernel; bwd() into the
 * f32 dinp32 then gelu.cu's backward, bf16 pre and dinp16). The fused
 * path needs cuBLASLt wanted for bf16 (zkc_matmul_epilogue 1 or 2), the
 * fusion on, a non-empty product (N, C, OC > 0), no column split
 * (split_at(OC) == 0: the backward's DGELU must see the whole sum over
 * OC; a split forward would be two plans, either of which could fall
 * back alone, and no MLP has such an OC),
 * every operand, out / dinp16 and pre on 16 bytes with rows a multiple of
 * 16 bytes (aux ld = the rows of D: OC forward, C backward, a multiple of
 * 8 elements as cuBLASLt asks), a bias within LT_BIAS columns (fp32 or
 * bf16, any alignment: lt_gemm), and a plan (the heuristic found one and
 * cublasLtMatmul did not refuse its first call): all functions of the
 * shapes and alignments, decided once per plan, so every strategy takes
 * the same path.
 *
 * Bits: the fused forward's pre is the BIAS epilogue's kind of value
 * (acc + bf16 bias rounded once, possibly another algorithm's sum), its out
 * cuBLASLt's GELU of the fp32 sum (not of the rounded pre, and not gelu.cu's
 * tanhf); the fused backward's dinp16 is cuBLASLt's gelu'(pre) times the
 * fp32 product, rounded once (no f32 dinp is written: dinp32 untouched).
 * Within bf16 tolerances of the two-op path (spec/c/test_cuda.c); dw, db
 * are always bwd()'s, the same bits fused or not. ---- */
static int gelu_fusion_on = 1;
static int64_t gelu_fused_n;         /* calls that took an epilogue (callers serialise) */
int zkc_matmul_gelu_fusion(int on)
{
    if (on == 0 || on == 1) gelu_fusion_on = on;
    return gelu_fusion_on;
}
int64_t zkc_matmul_gelu_fused(void) { return gelu_fused_n; }

static int gelu_fusable(int N, int C, int OC)
{
    return gelu_fusion_on && lt_wanted(CUDA_R_16BF) && N > 0 && C > 0 && OC > 0 &&
           !split_at(OC, CUDA_R_16BF);
}

extern "C" {
int zkc_matmul_forward(cublasHandle_t h, cudaStream_t s, float *out, const float *inp,
                       const float *w, const float *b, int N, int C, int OC, int ldo)
{
    return fwd(h, s, out, inp, w, b, 0, N, C, OC, ldo, CUDA_R_32F, CUDA_R_32F);
}

int zkc_matmul_backward(cublasHandle_t h, cudaStream_t s, float *dinp, float *dw, float *db,
                        const float *dout, const float *inp, const float *w,
                        int N, int C, int OC, int ldo, double *scratch)
{
    return bwd<float>(h, s, dinp, 0, dw, db, 0, dout, inp, w, N, C, OC, ldo, CUDA_R_32F, scratch);
}

int zkc_matmul_bf16_forward(cublasHandle_t h, cudaStream_t s, void *out, int out_bf16,
                            const uint16_t *inp, const uint16_t *w, const void *b, int b16,
                            int N, int C, int OC, int ldo)
{
    return fwd(h, s, out, inp, w, b, b16, N, C, OC, ldo, CUDA_R_16BF,
               out_bf16 ? CUDA_R_16BF : CUDA_R_32F);
}

size_t zkc_matmul_bf16_backward_scratch(int N, int C, int OC, int db, int dinp16, int g16dw)
{
    size_t cs = db ? zkc_colsum_scratch(N, OC) : 0;
    size_t ds = dinp16 && N > 0 && C > 0 && split_at(OC, CUDA_R_16BF)
                    ? ((size_t)N * C + 1) / 2 : 0;
    size_t ws = g16dw && dw_via_f32(N, C, OC) ? ((size_t)OC * C + 1) / 2 : 0;
    size_t m = cs > ds ? cs : ds;
    return m > ws ? m : ws;
}

int zkc_matmul_g16_dw_f32(int N, int C, int OC) { return dw_via_f32(N, C, OC); }

int zkc_matmul_bf16_backward(cublasHandle_t h, cudaStream_t s, void *dinp, int dinp16,
                             void *dw, void *db, int g16, const uint16_t *dout,
                             const uint16_t *inp, const uint16_t *w, int N, int C, int OC,
                             int ldo, double *scratch)
{
    return bwd<__nv_bfloat16>(h, s, dinp, dinp16, dw, db, g16, (const __nv_bfloat16 *)dout,
                              (const __nv_bfloat16 *)inp, (const __nv_bfloat16 *)w, N, C, OC,
                              ldo, CUDA_R_16BF, scratch);
}

int zkc_matmul_bf16_forward_gelu(cublasHandle_t h, cudaStream_t s, uint16_t *out, uint16_t *pre,
                                 const uint16_t *inp, const uint16_t *w, const void *b,
                                 int b16, int N, int C, int OC)
{
    if (gelu_fusable(N, C, OC)) {
        /* out^T (OC, N) = gelu(w (C, OC)^T . inp^T (C, N) + b), pre^T the
         * sum; both column-major with ld OC */
        struct lt_key k = lt_key_of(OC, N, C, CUBLAS_OP_T, CUBLAS_OP_N, C, C, OC, CUDA_R_16BF,
                                    CUDA_R_16BF, b != NULL, LT_GELU_FWD, OC);
        int done, e = lt_gemm(s, &k, w, inp, out, b, b16, &done, &zero, pre);
        gelu_fused_n += done;
        if (e || done) return e;
    }
    int e = fwd(h, s, pre, inp, w, b, b16, N, C, OC, OC, CUDA_R_16BF, CUDA_R_16BF);
    if (e) return e;
    if (N > 0 && OC > 0) {
        e = zkc_gelu_forward(s, out, 1, pre, 1, (size_t)N * OC);
        if (e) return ZKC_LAUNCH_BASE + e;
    }
    return 0;
}

int zkc_matmul_bf16_backward_dgelu(cublasHandle_t h, cudaStream_t s, uint16_t *dinp16,
                                   float *dinp32, void *dw, void *db, int g16,
                                   const uint16_t *dout, const uint16_t *inp, const uint16_t *w,
                                   const uint16_t *pre, int N, int C, int OC, int ldo,
                                   double *scratch)
{
    int done = 0;
    if (dinp16 && gelu_fusable(N, C, OC)) {
        /* dinp16^T (C, N) = gelu'(pre^T) * (w^T (C, OC) . dout^T (OC, N)),
         * bwd()'s dinp product with a bf16 D; pre^T (C, N) ld C */
        struct lt_key k = lt_key_of(C, N, OC, CUBLAS_OP_N, CUBLAS_OP_N, C, ldo, C, CUDA_R_16BF,
                                    CUDA_R_16BF, 0, LT_GELU_BWD, C);
        int e = lt_gemm(s, &k, w, dout, dinp16, NULL, 0, &done, &zero, pre);
        if (e) return e;
        gelu_fused_n += done;
    }
    float *d32 = dinp16 && !done ? dinp32 : NULL;      /* the two ops' f32 product */
    int e = bwd<__nv_bfloat16>(h, s, d32, 0, dw, db, g16, (const __nv_bfloat16 *)dout,
                               (const __nv_bfloat16 *)inp, (const __nv_bfloat16 *)w, N, C, OC,
                               ldo, CUDA_R_16BF, scratch);
    if (e) return e;
    if (d32 && N > 0 && C > 0) {
        e = zkc_gelu_backward(s, dinp16, 1, pre, 1, d32, (size_t)N * C);
        if (e) return ZKC_LAUNCH_BASE + e;
    }
    return 0;
}
}
