/*
 * bench_cuda.c -- the CUDA device's ops at GPT-2 124M shapes (B=4, T=1024,
 * C=768, NH=12, V=50257): milliseconds per call, GFLOP/s for the GEMMs and
 * attention (plain fp32 and the bf16 tensor-core kernels, each with fp32
 * and bf16 I/O), GB/s for the memory-bound ones beside the roofline: the
 * device-to-device copy's rate measured first (bytes read + written), and
 * each kernel's bytes moved at that rate ("x roof": its time over the
 * copy's for the same bytes).
 * `make bench-cuda` (CUDA=1, build-cuda/); needs a GPU. Measures the
 * kernels alone (device memory, one warm-up call, events).
 */
#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime_api.h>
#include "internal.h"
#include "cuda_stream.h"
#include "kernels.h"      /* ZK_SUM_BLOCK */
#include "../kernels/cuda/kernels.cuh"   /* zkc_matmul_gelu_fusion */

extern const zt_device_ops zt_cuda_device;
int zt_cuda_init(void);
static const zt_device_ops *dv = &zt_cuda_device;

static float *dalloc(size_t n)
{
    float *p = NULL;
    if (dv->alloc((void **)&p, n * 4) != ZT_OK) { printf("alloc failed\n"); exit(1); }
    dv->randn(p, n, 1, n, 0.0f, 0.5f);
    return p;
}

#define TIME(label, flops, reps, stmt) do { \
    stmt; dv->sync(); \
    cudaEvent_t a_, b_; cudaEventCreate(&a_); cudaEventCreate(&b_); \
    cudaEventRecord(a_, 0); \
    for (int r_ = 0; r_ < (reps); r_++) { stmt; } \
    dv->sync(); cudaEventRecord(b_, 0); cudaEventSynchronize(b_); \
    float ms_ = 0; cudaEventElapsedTime(&ms_, a_, b_); ms_ /= (reps); \
    if ((flops) > 0) printf("%-34s %9.3f ms  %8.1f GFLOP/s\n", label, ms_, (flops) / ms_ / 1e6); \
    else printf("%-34s %9.3f ms\n", label, ms_); \
    last_ms = ms_; \
    } while (0)

/* a memory-bound kernel moving `bytes`: GB/s and its time over the copy's */
static double copy_gbs, last_ms;
#define TIMEB(label, bytes, reps, stmt) do { \
    TIME(label, 0, reps, stmt); \
    double gbs_ = (bytes) / last_ms / 1e6; \
    printf("%-34s %9s    %8.1f GB/s  %.2fx roof\n", "", "", gbs_, copy_gbs / gbs_); \
    } while (0)

/* adamw_segments a unit over a step's tensors laid out one after another
 * (tensor i: off[i], len[i]; unit u: tensors u0[u] .. u0[u+1]-1, at most
 * ZT_ADAMW_SEGS), the stored bf16 parameters written */
static void adamw_units(float *p, const void *g, int g_dtype, float *m, float *v, uint16_t *lp,
                        const int64_t *off, const int64_t *len, const int *u0, int nu)
{
    size_t gs = g_dtype == ZT_F32 ? 4 : 2;
    for (int u = 0; u < nu; u++) {
        zt_adamw_segs sg;
        int64_t b0 = off[u0[u]];
        sg.n = u0[u + 1] - u0[u];
        for (int j = 0; j < sg.n; j++) {
            sg.off[j] = off[u0[u] + j] - b0;
            sg.len[j] = len[u0[u] + j];
            sg.wd[j] = 0.1f;
        }
        dv->adamw_segments(p + b0, (const char *)g + b0 * gs, g_dtype, m + b0, v + b0, lp + b0,
                           ZT_BF16, &sg, 1e-4f, 0.9f, 0.95f, 1e-8f, 1.0f, 1);
    }
}

#ifdef BENCH_DQ_ATOMIC
/* build-cuda/bench_cuda_dqatomic (this file with -DBENCH_DQ_ATOMIC, linked
 * with attention_tc_bwd.cu built -DZKC_ATTN_TC_DQ_ATOMIC): the tensor-core
 * backward with dQ added by fp32 atomics in the dK/dV kernel (FA2's scheme:
 * 5 matmul-equivalents, bits that vary run to run), at bench_cuda's
 * attention shapes with fp32 I/O (that build refuses a bf16 dqkv). The price
 * of determinism is bench_cuda's "attention bwd ... bf16 tc" row at the same
 * shape minus this one (docs/gpu.md). */
static int bench_dq_atomic(void)
{
    struct cudaDeviceProp pr;
    if (cudaGetDeviceProperties(&pr, 0) != cudaSuccess || pr.major != 9 || pr.minor != 0) {
        printf("bench_cuda_dqatomic: built for sm_90 only (H100, H200), skipped on this GPU\n");
        return 0;
    }
    static const int cfg[][4] = { { 4, 1024, 12, 64 }, { 16, 1024, 16, 128 }, { 4, 4096, 16, 64 },
                                  { 4, 4096, 16, 128 }, { 2, 8192, 16, 64 }, { 2, 8192, 16, 128 } };
    zt_cuda_attention_mode(1);
    for (int k = 0; k < 6; k++) {
        int Bk = cfg[k][0], Tk = cfg[k][1], NHk = cfg[k][2], Ck = NHk * cfg[k][3];
        size_t nq = (size_t)Bk * Tk * 3 * Ck, no = (size_t)Bk * Tk * Ck;
        float *q2 = dalloc(nq), *d2 = dalloc(nq), *o2 = dalloc(no), *g2 = dalloc(no);
        float *l2 = dalloc((size_t)Bk * NHk * Tk);
        dv->fill(q2, 0.01f, nq); dv->fill(g2, 0.01f, no);
        dv->attention_forward(o2, l2, q2, 0, Bk, Tk, Ck, NHk, NHk, 0);
        double fk = 4.0 * Bk * NHk * ((double)Tk * Tk / 2) * cfg[k][3];
        char nm[96];
        snprintf(nm, sizeof nm, "attention bwd B=%d T=%d hs=%d bf16 tc, dQ atomics", Bk, Tk, cfg[k][3]);
        TIME(nm, 2.5 * fk, Tk > 1024 ? 5 : 20, dv->attention_backward(d2, g2, q2, o2, l2, 0, Bk, Tk, Ck, NHk, NHk, 0));
        if (cfg[k][3] == 128 ? zt_cuda_attention_bwd_wide(1) : zt_cuda_attention_bwd_wide64(1)) {
            /* the wide dK/dV kernel adding by atomics */
            snprintf(nm, sizeof nm, "attention bwd B=%d T=%d hs=%d bf16 tc, wide, dQ atomics", Bk, Tk, cfg[k][3]);
            TIME(nm, 2.5 * fk, Tk > 1024 ? 5 : 20, dv->attention_backward(d2, g2, q2, o2, l2, 0, Bk, Tk, Ck, NHk, NHk, 0));
            zt_cuda_attention_bwd_wide(0);
            zt_cuda_attention_bwd_wide64(0);
        }
        dv->free(q2); dv->free(d2); dv->free(o2); dv->free(g2); dv->free(l2);
    }
    zt_cuda_attention_mode(0);
    int rc = dv->sync();
    printf("sync: %s\n", rc == ZT_OK ? "ok" : zt_last_error());
    return rc != ZT_OK;
}
#endif

/* The tensor-core attention at T = 1024, 4096 and 8192, head sizes 64 and
 * 128 (the GPU-Attention issue's shapes, beside PyTorch's flash attention:
 * tools/torch_attention_bench.py; B=4 T=1024 hs 64 is in main's rows). late
 * 0: the default kernels, bf16 and fp32 I/O. late 1, at the end of the
 * run: the variants no GPU has run yet (a fault there loses only them):
 * the ordered dQ (beside the default rows and bench_cuda_dqatomic's, the
 * same kernel adding by atomics: the price of the order), head size
 * 128's wide forward, the wide backward at both head sizes, and the pair
 * forward (4 warps of 32 rows) at both, each beside its default row. Each
 * variant is switched on for its rows and off after them (a switch set
 * from the environment is not kept here). */
static void attention_shapes(int late)
{
    static const int cfg[][4] = { { 4, 1024, 12, 64 }, { 16, 1024, 16, 128 }, { 4, 4096, 16, 64 },
                                  { 4, 4096, 16, 128 }, { 2, 8192, 16, 64 }, { 2, 8192, 16, 128 } };
    zt_cuda_attention_mode(1);
    for (int k = late ? 0 : 1; k < 6; k++) {
        int Bk = cfg[k][0], Tk = cfg[k][1], NHk = cfg[k][2], hs = cfg[k][3], Ck = NHk * hs;
        size_t nq = (size_t)Bk * Tk * 3 * Ck, no = (size_t)Bk * Tk * Ck;
        float *q2 = dalloc(nq), *d2 = dalloc(nq), *o2 = dalloc(no), *g2 = dalloc(no);
        float *l2 = dalloc((size_t)Bk * NHk * Tk), *gb2 = dalloc(no / 2 + 1);
        dv->fill(q2, 0.01f, nq); dv->fill(g2, 0.01f, no);
        /* bf16 I/O: q2 rounded into d2's first half, dqkv its second, out o2's
         * bytes, dout g2 rounded into gb2 */
        uint16_t *qh = (uint16_t *)d2, *oh = (uint16_t *)o2, *dh = (uint16_t *)d2 + nq;
        uint16_t *gh = (uint16_t *)gb2;
        dv->cast(qh, ZT_BF16, q2, ZT_F32, nq);
        dv->cast(gh, ZT_BF16, g2, ZT_F32, no);
        double fk = 4.0 * Bk * NHk * ((double)Tk * Tk / 2) * hs;
        char nm[96];
#define ROW(io, what, reps, stmt) do { \
            snprintf(nm, sizeof nm, "attention %s B=%d T=%d hs=%d bf16 tc%s%s", (what)[0] == 'f' ? "fwd" : "bwd", \
                     Bk, Tk, hs, (io) ? ", bf16 I/O" : "", (what) + 1); \
            TIME(nm, ((what)[0] == 'f' ? 1.0 : 2.5) * fk, reps, stmt); } while (0)
#define FWD16 dv->attention_forward(oh, l2, qh, 1, Bk, Tk, Ck, NHk, NHk, 0)
#define BWD16 dv->attention_backward(dh, gh, qh, oh, l2, 1, Bk, Tk, Ck, NHk, NHk, 0)
#define FWD32 dv->attention_forward(o2, l2, q2, 0, Bk, Tk, Ck, NHk, NHk, 0)
#define BWD32 dv->attention_backward(d2, g2, q2, o2, l2, 0, Bk, Tk, Ck, NHk, NHk, 0)
        FWD16;                                       /* out and lse for the backwards */
        if (!late) {
            ROW(1, "f", 10, FWD16);
            ROW(1, "b", 5, BWD16);
        } else {
            zt_cuda_attention_dq(1);
            ROW(1, "b, ordered dQ", 5, BWD16);
            zt_cuda_attention_dq(0);
            if (hs == 128 && zt_cuda_attention_fwd_wide(1)) {   /* blocks of 128 query rows */
                ROW(1, "f, wide", 10, FWD16);
                zt_cuda_attention_fwd_wide(0);
            }
            if (zt_cuda_attention_fwd_pair(1)) {   /* 4 warps of 32 query rows */
                ROW(1, "f, pair", 10, FWD16);
                zt_cuda_attention_fwd_pair(0);
            }
            if (hs == 128 ? zt_cuda_attention_bwd_wide(1) : zt_cuda_attention_bwd_wide64(1)) {
                ROW(1, "b, wide", 5, BWD16);             /* dK/dV in blocks of 128 keys */
                zt_cuda_attention_dq(1);
                ROW(1, "b, wide, ordered dQ", 5, BWD16);
                zt_cuda_attention_dq(0);
                zt_cuda_attention_bwd_wide(0);
                zt_cuda_attention_bwd_wide64(0);
            }
        }
        /* fp32 I/O (overwrites oh and qh's bytes) */
        FWD32;
        if (!late) {
            ROW(0, "f", 10, FWD32);
            ROW(0, "b", 5, BWD32);
        } else {
            zt_cuda_attention_dq(1);
            ROW(0, "b, ordered dQ", 5, BWD32);
            if (hs == 128 ? zt_cuda_attention_bwd_wide(1) : zt_cuda_attention_bwd_wide64(1)) {
                ROW(0, "b, wide, ordered dQ", 5, BWD32);   /* beside bench_cuda_dqatomic's wide row */
                zt_cuda_attention_bwd_wide(0);
                zt_cuda_attention_bwd_wide64(0);
            }
            zt_cuda_attention_dq(0);
            if (hs == 128 && zt_cuda_attention_fwd_wide(1)) {
                ROW(0, "f, wide", 10, FWD32);
                zt_cuda_attention_fwd_wide(0);
            }
            if (zt_cuda_attention_fwd_pair(1)) {
                ROW(0, "f, pair", 10, FWD32);
                zt_cuda_attention_fwd_pair(0);
            }
        }
#undef ROW
#undef FWD16
#undef BWD16
#undef FWD32
#undef BWD32
        dv->free(q2); dv->free(d2); dv->free(o2); dv->free(g2); dv->free(l2); dv->free(gb2);
    }
    zt_cuda_attention_mode(0);
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) { printf("cuda: no GPU here, bench skipped\n"); return 0; }
    if (zt_cuda_init() != ZT_OK) { printf("zt_cuda_init: %s\n", zt_last_error()); return 1; }
#ifdef BENCH_DQ_ATOMIC
    return bench_dq_atomic();
#endif
    int B = 4, T = 1024, C = 768, NH = 12, V = 50257, N = B * T;
    float *x = dalloc((size_t)N * 4 * C), *w = dalloc((size_t)4 * C * C), *b = dalloc(4 * C);
    float *y = dalloc((size_t)N * 4 * C), *g = dalloc((size_t)N * 4 * C);
    float *dw = dalloc((size_t)4 * C * C), *db = dalloc(4 * C), *dx = dalloc((size_t)N * 4 * C);
    float *qkv = dalloc((size_t)N * 3 * C), *lse = dalloc((size_t)B * NH * T);
    float *dq = dalloc((size_t)N * 3 * C), *mean = dalloc(N), *rstd = dalloc(N);
    float *logits = dalloc((size_t)N * V / 4), *loss = dalloc(N);
    int32_t *tg = NULL; dv->alloc((void **)&tg, (size_t)N * 4); dv->zero(tg, (size_t)N * 4);
    size_t cb = (size_t)N * 4 * C * 4;       /* the copy roofline: 50 MB each way */
    TIME("copy d2d (roofline)", 0, 20, cudaMemcpyAsync(y, x, cb, cudaMemcpyDeviceToDevice, 0));
    copy_gbs = 2.0 * cb / last_ms / 1e6;
    printf("%-34s %9s    %8.1f GB/s (read + write)\n", "", "", copy_gbs);
    double f = 2.0 * N * C * 4 * C;
    TIME("matmul fwd fc (N,768)->(N,3072)", f, 20, dv->matmul_forward(y, x, w, b, N, C, 4 * C, 4 * C));
    TIME("matmul bwd fc (dinp, dw, db)", 2 * f, 20, dv->matmul_backward(dx, dw, db, g, x, w, N, C, 4 * C, 4 * C));
    /* the bias gradient alone (colsum.cu's two passes): N*4C floats read */
    TIMEB("bias grad fc (N,3072) f32", (double)N * 4 * C * 4, 20,
          dv->matmul_backward(NULL, NULL, db, g, x, w, N, C, 4 * C, 4 * C));
    TIMEB("bias grad proj (N,768) bf16", (double)N * C * 2, 20,
          dv->matmul_bf16_backward(NULL, 0, NULL, db, 0, (uint16_t *)g, (uint16_t *)x, (uint16_t *)w, N, C, C, C));
    /* cuBLAS (mode 0) against cuBLASLt (1: every matmul; 2, the default:
     * bf16 operands), the bias a kernel after the GEMM or in the epilogue;
     * fp32, and the bf16 qkv and attention-projection shapes (x and w's
     * bits read as bf16) */
    zt_cuda_matmul_epilogue(1);
    TIME("matmul fwd fc, cuBLASLt", f, 20, dv->matmul_forward(y, x, w, b, N, C, 4 * C, 4 * C));
    TIME("matmul bwd fc, cuBLASLt", 2 * f, 20, dv->matmul_backward(dx, dw, db, g, x, w, N, C, 4 * C, 4 * C));
    double fq = 2.0 * N * C * 3 * C, fp = 2.0 * N * C * C;
    for (int lt = 0; lt <= 2; lt += 2) {
        char nm[96];
        zt_cuda_matmul_epilogue(lt);
        const char *lib = lt ? "cuBLASLt" : "cuBLAS";
        snprintf(nm, sizeof nm, "matmul bf16 fwd qkv, %s", lib);
        TIME(nm, fq, 20, dv->matmul_bf16_forward(y, 0, (uint16_t *)x, (uint16_t *)w, b, 0, N, C, 3 * C, 3 * C));
        snprintf(nm, sizeof nm, "matmul bf16 fwd qkv bf16 out, %s", lib);
        TIME(nm, fq, 20, dv->matmul_bf16_forward(y, 1, (uint16_t *)x, (uint16_t *)w, b, 0, N, C, 3 * C, 3 * C));
        /* a bf16 run's stored bias as it is (b16; b's bits read as bf16):
         * no rounding launch before cuBLASLt's epilogue */
        snprintf(nm, sizeof nm, "matmul bf16 fwd qkv bf16 out, bf16 bias, %s", lib);
        TIME(nm, fq, 20, dv->matmul_bf16_forward(y, 1, (uint16_t *)x, (uint16_t *)w, b, 1, N, C, 3 * C, 3 * C));
        snprintf(nm, sizeof nm, "matmul bf16 fwd qkv bf16 out, no bias, %s", lib);
        TIME(nm, fq, 20, dv->matmul_bf16_forward(y, 1, (uint16_t *)x, (uint16_t *)w, NULL, 0, N, C, 3 * C, 3 * C));
        snprintf(nm, sizeof nm, "matmul bf16 fwd fc bf16 out, %s", lib);
        TIME(nm, f, 20, dv->matmul_bf16_forward(y, 1, (uint16_t *)x, (uint16_t *)w, b, 0, N, C, 4 * C, 4 * C));
        snprintf(nm, sizeof nm, "matmul bf16 bwd qkv (dinp, dw), %s", lib);
        TIME(nm, 2 * fq, 20, dv->matmul_bf16_backward(dx, 0, dw, NULL, 0, (uint16_t *)g, (uint16_t *)x, (uint16_t *)w, N, C, 3 * C, 3 * C));
        /* the same with a bf16 dinp (bf16 activations: one GEMM with a bf16 D) */
        snprintf(nm, sizeof nm, "matmul bf16 bwd qkv (bf16 dinp, dw), %s", lib);
        TIME(nm, 2 * fq, 20, dv->matmul_bf16_backward(dx, 1, dw, NULL, 0, (uint16_t *)g, (uint16_t *)x, (uint16_t *)w, N, C, 3 * C, 3 * C));
        snprintf(nm, sizeof nm, "matmul bf16 bwd proj (dinp, dw), %s", lib);
        TIME(nm, 2 * fp, 20, dv->matmul_bf16_backward(dx, 0, dw, NULL, 0, (uint16_t *)g, (uint16_t *)x, (uint16_t *)w, N, C, C, C));
        snprintf(nm, sizeof nm, "matmul bf16 bwd proj (bf16 dinp, dw), %s", lib);
        TIME(nm, 2 * fp, 20, dv->matmul_bf16_backward(dx, 1, dw, NULL, 0, (uint16_t *)g, (uint16_t *)x, (uint16_t *)w, N, C, C, C));
        /* the weight gradient alone, fp32 against a bf16 run's stored bf16
         * dw (g16) at the qkv and proj shapes (k = N): by matmul.cu's rule
         * (fewer 128x128 output tiles than SMs: the fp32 GEMM into scratch
         * and a cast; else a bf16 D, no split-K partials in its plan), and
         * always the bf16 D (zkc_matmul_g16_hybrid(0)) */
        snprintf(nm, sizeof nm, "matmul bf16 bwd qkv dw f32, %s", lib);
        TIME(nm, fq, 20, dv->matmul_bf16_backward(NULL, 0, dw, NULL, 0, (uint16_t *)g, (uint16_t *)x, (uint16_t *)w, N, C, 3 * C, 3 * C));
        snprintf(nm, sizeof nm, "matmul bf16 bwd qkv dw bf16 (g16), %s", lib);
        TIME(nm, fq, 20, dv->matmul_bf16_backward(NULL, 0, dw, NULL, 1, (uint16_t *)g, (uint16_t *)x, (uint16_t *)w, N, C, 3 * C, 3 * C));
        snprintf(nm, sizeof nm, "matmul bf16 bwd proj dw f32, %s", lib);
        TIME(nm, fp, 20, dv->matmul_bf16_backward(NULL, 0, dw, NULL, 0, (uint16_t *)g, (uint16_t *)x, (uint16_t *)w, N, C, C, C));
        snprintf(nm, sizeof nm, "matmul bf16 bwd proj dw bf16 (g16), %s", lib);
        TIME(nm, fp, 20, dv->matmul_bf16_backward(NULL, 0, dw, NULL, 1, (uint16_t *)g, (uint16_t *)x, (uint16_t *)w, N, C, C, C));
        zkc_matmul_g16_hybrid(0);
        snprintf(nm, sizeof nm, "matmul bf16 bwd qkv dw bf16 D (g16), %s", lib);
        TIME(nm, fq, 20, dv->matmul_bf16_backward(NULL, 0, dw, NULL, 1, (uint16_t *)g, (uint16_t *)x, (uint16_t *)w, N, C, 3 * C, 3 * C));
        snprintf(nm, sizeof nm, "matmul bf16 bwd proj dw bf16 D (g16), %s", lib);
        TIME(nm, fp, 20, dv->matmul_bf16_backward(NULL, 0, dw, NULL, 1, (uint16_t *)g, (uint16_t *)x, (uint16_t *)w, N, C, C, C));
        zkc_matmul_g16_hybrid(1);
    }
    /* the MLP's GEMMs with the GELU (bf16 activations, cuBLASLt, mode 2 as
     * the loop leaves it): c_fc's forward (N,768) -> pre, out (N,3072) and
     * c_proj's backward dinp16 (N,3072) = gelu'(pre) * (dout (N,768) @ w),
     * through cuBLASLt's GELU_AUX_BIAS / DGELU epilogues
     * (zkc_matmul_gelu_fusion(1)) against the GEMM and the GELU kernel
     * apart (0); the backward alone (dinp) and with dw, db (the same
     * kernels either way). "fused" says whether the epilogue ran (the
     * shape had a plan); GFLOP/s counts the GEMM's flops only. */
    {
        size_t nh = (size_t)N * 4 * C;
        uint16_t *in16 = NULL, *w16 = NULL, *pre16 = NULL, *out16 = NULL, *dout16 = NULL;
        dv->alloc((void **)&in16, (size_t)N * C * 2); dv->alloc((void **)&w16, (size_t)4 * C * C * 2);
        dv->alloc((void **)&pre16, nh * 2); dv->alloc((void **)&out16, nh * 2);
        dv->alloc((void **)&dout16, (size_t)N * C * 2);
        dv->cast(in16, ZT_BF16, x, ZT_F32, (size_t)N * C);
        dv->cast(w16, ZT_BF16, w, ZT_F32, (size_t)4 * C * C);
        dv->cast(dout16, ZT_BF16, g, ZT_F32, (size_t)N * C);
        char nm[96];
        for (int fu = 0; fu <= 1; fu++) {
            zkc_matmul_gelu_fusion(fu);
            const char *how = fu ? "fused" : "two ops";
            int64_t n0 = zkc_matmul_gelu_fused();
            snprintf(nm, sizeof nm, "mlp fc fwd + gelu bf16, %s", how);
            TIME(nm, f, 20, dv->matmul_bf16_forward_gelu(out16, pre16, in16, w16, b, 0, N, C, 4 * C));
            int64_t n1 = zkc_matmul_gelu_fused();
            /* c_proj: w (C, 4C), dout (N, C): OC = C, the GEMM's C = 4C */
            snprintf(nm, sizeof nm, "mlp proj bwd dinp + dgelu bf16, %s", how);
            TIME(nm, f, 20, dv->matmul_bf16_backward_dgelu(out16, dx, NULL, NULL, 0, dout16, pre16, w16,
                                                           pre16, N, 4 * C, C, C));
            int64_t n2 = zkc_matmul_gelu_fused();
            snprintf(nm, sizeof nm, "mlp proj bwd + dgelu (dinp, dw, db), %s", how);
            TIME(nm, 2 * f, 20, dv->matmul_bf16_backward_dgelu(out16, dx, dw, db, 0, dout16, pre16, w16,
                                                               pre16, N, 4 * C, C, C));
            if (fu) printf("%-34s fused: forward %s, backward %s\n", "", n1 > n0 ? "yes" : "no (no plan)",
                           n2 > n1 ? "yes" : "no (no plan)");
        }
        dv->free(in16); dv->free(w16); dv->free(pre16); dv->free(out16); dv->free(dout16);
    }
    double fa = 4.0 * B * NH * ((double)T * T / 2) * (C / NH);
    /* bf16 I/O (io16): qkv (cast from qkv), out, dout (cast from g) and
     * dqkv bf16 */
    uint16_t *q16 = NULL, *o16 = NULL, *dq16 = NULL, *go16 = NULL;
    dv->alloc((void **)&q16, (size_t)N * 3 * C * 2); dv->alloc((void **)&o16, (size_t)N * C * 2);
    dv->alloc((void **)&dq16, (size_t)N * 3 * C * 2); dv->alloc((void **)&go16, (size_t)N * C * 2);
    dv->cast(q16, ZT_BF16, qkv, ZT_F32, (size_t)N * 3 * C);
    dv->cast(go16, ZT_BF16, g, ZT_F32, (size_t)N * C);
    TIME("attention fwd T=1024", fa, 5, dv->attention_forward(y, lse, qkv, 0, B, T, C, NH, NH, 0));
    TIME("attention bwd T=1024", 2.5 * fa, 3, dv->attention_backward(dq, g, qkv, y, lse, 0, B, T, C, NH, NH, 0));
    TIME("attention fwd T=1024 bf16 I/O", fa, 5, dv->attention_forward(o16, lse, q16, 1, B, T, C, NH, NH, 0));
    TIME("attention bwd T=1024 bf16 I/O", 2.5 * fa, 3, dv->attention_backward(dq16, go16, q16, o16, lse, 1, B, T, C, NH, NH, 0));
    zt_cuda_attention_mode(1);      /* bf16 tensor cores (attention_tc_*.cu) */
    TIME("attention fwd T=1024 bf16 tc", fa, 20, dv->attention_forward(y, lse, qkv, 0, B, T, C, NH, NH, 0));
    TIME("attention bwd T=1024 bf16 tc", 2.5 * fa, 20, dv->attention_backward(dq, g, qkv, y, lse, 0, B, T, C, NH, NH, 0));
    TIME("attention fwd T=1024 bf16 tc, bf16 I/O", fa, 20, dv->attention_forward(o16, lse, q16, 1, B, T, C, NH, NH, 0));
    TIME("attention bwd T=1024 bf16 tc, bf16 I/O", 2.5 * fa, 20, dv->attention_backward(dq16, go16, q16, o16, lse, 1, B, T, C, NH, NH, 0));
    dv->free(q16); dv->free(o16); dv->free(dq16); dv->free(go16);
    attention_shapes(0);
    zt_cuda_attention_mode(0);
    /* the LM head (B=4 of the step's 16): bf16 operands, logits in rows of
     * V (fp32, the old layout) against rows padded to Vp (bf16, the new) */
    int Vp = (V + 127) / 128 * 128;
    float *lg = dalloc((size_t)N * Vp), *wte = dalloc((size_t)Vp * C / 2);
    float *dwte = dalloc((size_t)Vp * C);       /* the head's weight gradient (V,C) */
    double fl = 2.0 * N * C * V;
    for (int lt = 0; lt <= 2; lt += 2) {
        char nm[96];
        zt_cuda_matmul_epilogue(lt);
        const char *lib = lt ? "cuBLASLt" : "cuBLAS";
        snprintf(nm, sizeof nm, "lm head fwd bf16, f32 rows of V, %s", lib);
        TIME(nm, fl, 5, dv->matmul_bf16_forward(lg, 0, (uint16_t *)x, (uint16_t *)wte, NULL, 0, N, C, V, V));
        snprintf(nm, sizeof nm, "lm head fwd bf16, bf16 rows of Vp, %s", lib);
        TIME(nm, fl, 5, dv->matmul_bf16_forward(lg, 1, (uint16_t *)x, (uint16_t *)wte, NULL, 0, N, C, V, Vp));
        snprintf(nm, sizeof nm, "lm head bwd bf16, dout rows of V, %s", lib);
        TIME(nm, 2 * fl, 5, dv->matmul_bf16_backward(dx, 0, dwte, NULL, 0, (uint16_t *)lg, (uint16_t *)x, (uint16_t *)wte, N, C, V, V));
        snprintf(nm, sizeof nm, "lm head bwd bf16, dout rows of Vp, %s", lib);
        TIME(nm, 2 * fl, 5, dv->matmul_bf16_backward(dx, 0, dwte, NULL, 0, (uint16_t *)lg, (uint16_t *)x, (uint16_t *)wte, N, C, V, Vp));
        /* a bf16 dinp: split, so the two partial sums in fp32 scratch, then a cast */
        snprintf(nm, sizeof nm, "lm head bwd bf16 dinp, rows of Vp, %s", lib);
        TIME(nm, 2 * fl, 5, dv->matmul_bf16_backward(dx, 1, dwte, NULL, 0, (uint16_t *)lg, (uint16_t *)x, (uint16_t *)wte, N, C, V, Vp));
        /* a bf16 run's: bf16 dinp and the stored bf16 dwte (g16) */
        snprintf(nm, sizeof nm, "lm head bwd bf16 dinp, bf16 dw (g16), %s", lib);
        TIME(nm, 2 * fl, 5, dv->matmul_bf16_backward(dx, 1, dwte, NULL, 1, (uint16_t *)lg, (uint16_t *)x, (uint16_t *)wte, N, C, V, Vp));
        /* the above split at 50176 (zt_cuda_matmul_split, the default)
         * against one GEMM of V columns, and one of Vp (a padded wte) */
        zt_cuda_matmul_split(0);
        snprintf(nm, sizeof nm, "lm head fwd bf16, rows of Vp, one GEMM, %s", lib);
        TIME(nm, fl, 5, dv->matmul_bf16_forward(lg, 1, (uint16_t *)x, (uint16_t *)wte, NULL, 0, N, C, V, Vp));
        snprintf(nm, sizeof nm, "lm head bwd bf16, rows of Vp, one GEMM, %s", lib);
        TIME(nm, 2 * fl, 5, dv->matmul_bf16_backward(dx, 0, dwte, NULL, 0, (uint16_t *)lg, (uint16_t *)x, (uint16_t *)wte, N, C, V, Vp));
        snprintf(nm, sizeof nm, "lm head bwd bf16 dinp, one GEMM, %s", lib);
        TIME(nm, 2 * fl, 5, dv->matmul_bf16_backward(dx, 1, dwte, NULL, 0, (uint16_t *)lg, (uint16_t *)x, (uint16_t *)wte, N, C, V, Vp));
        snprintf(nm, sizeof nm, "lm head fwd bf16, OC = Vp (wte padded), %s", lib);
        TIME(nm, fl, 5, dv->matmul_bf16_forward(lg, 1, (uint16_t *)x, (uint16_t *)wte, NULL, 0, N, C, Vp, Vp));
        snprintf(nm, sizeof nm, "lm head bwd bf16, OC = Vp (wte padded), %s", lib);
        TIME(nm, 2 * fl, 5, dv->matmul_bf16_backward(dx, 0, dwte, NULL, 0, (uint16_t *)lg, (uint16_t *)x, (uint16_t *)wte, N, C, Vp, Vp));
        zt_cuda_matmul_split(1);
    }
    /* the classifier: the row read twice, dlogits written once */
    TIMEB("classifier f32 (N, V rows of Vp)", 3.0 * N * Vp * 4, 5,
          dv->crossentropy(loss, lg, lg, tg, N, V, Vp, 0, 1.0f));
    dv->fill(lg, 0.0f, (size_t)N * Vp / 2);     /* bf16 zeros: finite logits */
    TIMEB("classifier bf16 (N, V rows of Vp)", 3.0 * N * Vp * 2, 5,
          dv->crossentropy(loss, lg, lg, tg, N, V, Vp, 1, 1.0f));
    /* last, so that a fault here leaves every row above printed: the
     * memory-bound ops of a step, each with the bytes it must move at
     * the least (every operand read or written once) beside the copy's
     * rate: GPU-Step's "within 1.5x of its roofline" */
    double nc = (double)N * C, nf = (double)N * 4 * C;
    TIMEB("layernorm fwd (N,768)", nc * 8 + N * 8.0, 50, dv->layernorm_forward(y, 0, mean, rstd, x, 0, w, b, 0, N, C));
    TIMEB("layernorm fwd (N,768) bf16 out", nc * 6 + N * 8.0, 50,
          dv->layernorm_forward(y, 1, mean, rstd, x, 0, w, b, 0, N, C));
    /* the bf16 residual stream (r16): its rows bf16, cast from x, g, dx
     * (finite values) */
    uint16_t *x16 = NULL, *g16 = NULL, *s16 = NULL;
    dv->alloc((void **)&x16, (size_t)nc * 2); dv->alloc((void **)&g16, (size_t)nc * 2);
    dv->alloc((void **)&s16, (size_t)nc * 2);
    dv->cast(x16, ZT_BF16, x, ZT_F32, (size_t)nc); dv->cast(g16, ZT_BF16, g, ZT_F32, (size_t)nc);
    dv->cast(s16, ZT_BF16, dx, ZT_F32, (size_t)nc);
    TIMEB("layernorm fwd (N,768) bf16 in, out", nc * 4 + N * 8.0, 50,
          dv->layernorm_forward(y, 1, mean, rstd, x16, 1, w, b, 0, N, C));
    /* a bf16 run's stored parameters read as they are (p16) */
    uint16_t *p16 = NULL;
    dv->alloc((void **)&p16, (size_t)2 * C * 2);
    dv->cast(p16, ZT_BF16, w, ZT_F32, (size_t)C); dv->cast(p16 + C, ZT_BF16, b, ZT_F32, (size_t)C);
    TIMEB("layernorm fwd (N,768) bf16 in, out, params", nc * 4 + N * 8.0, 50,
          dv->layernorm_forward(y, 1, mean, rstd, x16, 1, p16, p16 + C, 1, N, C));
    /* resid = a + b, then its layer norm (bf16 out): a, b read, resid and out written */
    TIMEB("layernorm + residual fwd, bf16 out", nc * 14 + N * 8.0, 50,
          dv->layernorm_residual_forward(dx, y, 1, mean, rstd, x, g, 0, w, b, 0, N, C));
    TIMEB("layernorm + residual fwd, bf16 stream", nc * 8 + N * 8.0, 50,
          dv->layernorm_residual_forward(s16, y, 1, mean, rstd, x16, g16, 1, w, b, 0, N, C));
    /* dout, inp read, dinp read and written (it accumulates) */
    TIMEB("layernorm bwd (N,768)", nc * 16 + N * 8.0, 50, dv->layernorm_backward(dx, NULL, dw, db, 0, g, x, 0, w, 0, mean, rstd, N, C));
    TIMEB("layernorm bwd (N,768) + bf16 dinp", nc * 18 + N * 8.0, 50,
          dv->layernorm_backward(dx, (uint16_t *)y, dw, db, 0, g, x, 0, w, 0, mean, rstd, N, C));
    /* r16: dout and inp bf16, dinp bf16 read and written */
    TIMEB("layernorm bwd (N,768) bf16 stream", nc * 8 + N * 8.0, 50,
          dv->layernorm_backward(s16, NULL, dw, db, 0, g16, x16, 1, w, 0, mean, rstd, N, C));
    TIMEB("layernorm bwd (N,768) bf16 stream, params", nc * 8 + N * 8.0, 50,
          dv->layernorm_backward(s16, NULL, dw, db, 0, g16, x16, 1, p16, 1, mean, rstd, N, C));
    /* ... and its gradients dw, db stored bf16 (g16) */
    TIMEB("layernorm bwd (N,768) bf16 stream, all bf16", nc * 8 + N * 8.0, 50,
          dv->layernorm_backward(s16, NULL, dw, db, 1, g16, x16, 1, p16, 1, mean, rstd, N, C));
    TIMEB("residual add (N,768)", nc * 12, 50, dv->add3(dx, x, g, 0, (size_t)nc));
    TIMEB("residual add (N,768) bf16", nc * 6, 50, dv->add3(s16, x16, g16, 1, (size_t)nc));
    TIMEB("gelu fwd (N,3072)", nf * 8, 50, dv->gelu_forward(y, 0, x, 0, (size_t)nf));
    TIMEB("gelu fwd (N,3072) bf16 in and out", nf * 4, 50, dv->gelu_forward(y, 1, x, 1, (size_t)nf));
    TIMEB("gelu bwd (N,3072)", nf * 12, 50, dv->gelu_backward(dx, 0, x, 0, g, (size_t)nf));
    TIMEB("gelu bwd (N,3072) bf16 in and dinp", nf * 8, 50, dv->gelu_backward(dx, 1, x, 1, g, (size_t)nf));
    TIMEB("cast f32 -> bf16 (N,3072)", nf * 6, 50, dv->cast(y, ZT_BF16, x, ZT_F32, (size_t)nf));
    TIMEB("cast bf16 -> f32 (N,3072)", nf * 6, 50, dv->cast(y, ZT_F32, x, ZT_BF16, (size_t)nf));
    TIMEB("adamw 12.6M params", nf * 28, 10, dv->adamw(x, g, y, dx, (size_t)nf, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1));
    /* a mixed-precision step's stored bf16 gradient (12.6M, cast from g),
     * which AdamW and the gradient norm read as it is when the step
     * accumulates nothing */
    uint16_t *gb = NULL;
    dv->alloc((void **)&gb, (size_t)nf * 2);
    dv->cast(gb, ZT_BF16, g, ZT_F32, (size_t)nf);
    {   /* one unit's update as the trainer calls it: the stored bf16 parameters written too */
        zt_adamw_segs sg = { 1, { 0 }, { (int64_t)nf }, { 0.1f } };
        uint16_t *lp = NULL;
        dv->alloc((void **)&lp, (size_t)nf * 2);
        TIMEB("adamw segments + bf16 params", nf * 30, 10,
              dv->adamw_segments(x, g, ZT_F32, y, dx, lp, ZT_BF16, &sg, 1e-4f, 0.9f, 0.95f, 1e-8f,
                                 1.0f, 1));
        /* the same reading the bf16 gradient (2 bytes a parameter, not 4) */
        TIMEB("adamw segments, bf16 g + bf16 params", nf * 28, 10,
              dv->adamw_segments(x, gb, ZT_BF16, y, dx, lp, ZT_BF16, &sg, 1e-4f, 0.9f, 0.95f,
                                 1e-8f, 1.0f, 1));
        dv->free(lp);
    }
    {   /* a whole GPT-2 124M step's update: its 148 tensors (wte, wpe, 12
         * layers of 12, the final norm's 2; 124.4M parameters) laid out one
         * after another, the stored bf16 parameters written. adamw_multi:
         * one launch for all 148 (zt_adamw_multi); against adamw_segments a
         * unit (the trainer's call before it: the embeddings, each layer,
         * the final norm; 14 launches) over the same elements. Bytes: p, m,
         * v read and written, g read (4 or 2), lp written (2). */
        enum { NT = 148 };
        int64_t len[NT], off[NT + 1];
        int u0[16], nu = 0, k = 0;
        len[k++] = (int64_t)V * C; len[k++] = (int64_t)T * C; u0[nu++] = 0;
        for (int l = 0; l < 12; l++) {
            int64_t ls[12] = { C, C, (int64_t)C * 3 * C, 3 * C, (int64_t)C * C, C, C, C,
                               (int64_t)C * 4 * C, 4 * C, (int64_t)4 * C * C, C };
            u0[nu++] = k;
            for (int j = 0; j < 12; j++) len[k++] = ls[j];
        }
        u0[nu++] = k;
        len[k++] = C; len[k++] = C;
        u0[nu] = k;
        off[0] = 0;
        for (int i = 0; i < NT; i++) off[i + 1] = off[i] + len[i];
        size_t np = (size_t)off[NT];
        float *pp = dalloc(np), *pg = dalloc(np), *pm = NULL, *pv = NULL;
        uint16_t *pgb = NULL, *plp = NULL;
        dv->alloc((void **)&pm, np * 4); dv->alloc((void **)&pv, np * 4);
        dv->alloc((void **)&pgb, np * 2); dv->alloc((void **)&plp, np * 2);
        if (!pm || !pv || !pgb || !plp) { printf("alloc failed\n"); exit(1); }
        dv->zero(pm, np * 4); dv->zero(pv, np * 4);
        dv->cast(pgb, ZT_BF16, pg, ZT_F32, np);
        for (int gk = 0; gk < 2; gk++) {
            int gd = gk ? ZT_BF16 : ZT_F32;
            const void *gp = gk ? (const void *)pgb : (const void *)pg;
            size_t gs = gk ? 2 : 4;
            double bytes = (double)np * (24 + gs + 2);
            zt_adamw_item it[NT];
            for (int i = 0; i < NT; i++)
                it[i] = (zt_adamw_item){ pp + off[i], (const char *)gp + off[i] * gs, pm + off[i],
                                         pv + off[i], plp + off[i], len[i], 0.1f };
            char nm[96];
            snprintf(nm, sizeof nm, "adamw multi 148 (124M), %s g, bf16 lp", gk ? "bf16" : "f32");
            TIMEB(nm, bytes, 10,
                  dv->adamw_multi(it, NT, gd, ZT_BF16, 1e-4f, 0.9f, 0.95f, 1e-8f, 1.0f, 1));
            snprintf(nm, sizeof nm, "adamw segments a unit (%d), %s g", nu, gk ? "bf16" : "f32");
            TIMEB(nm, bytes, 10, adamw_units(pp, gp, gd, pm, pv, plp, off, len, u0, nu));
        }
        dv->free(pp); dv->free(pg); dv->free(pm); dv->free(pv); dv->free(pgb); dv->free(plp);
    }
    {   /* the gradient norm's partials over 12.6M floats (zt_sumsq_blocks_many:
         * the block partials, then one copy to the host and one wait) */
        size_t cnt = (size_t)nf, nb = (cnt + ZK_SUM_BLOCK - 1) / ZK_SUM_BLOCK;
        double *part = malloc(nb * sizeof(double));
        const void *xs[1] = { x };
        TIMEB("sumsq partials 12.6M floats", nf * 4, 20,
              dv->sumsq_blocks_many(part, xs, ZT_F32, &cnt, 1));
        /* the same over the bf16 gradient, widened as read (8-byte loads) */
        xs[0] = gb;
        TIMEB("sumsq partials 12.6M bf16", nf * 2, 20,
              dv->sumsq_blocks_many(part, xs, ZT_BF16, &cnt, 1));
        free(part);
    }
    dv->free(gb);
    {   /* the embedding: wte rows and wpe read, (B,T,C) written; backward:
         * dout read, the tokens' dwte rows read and written (distinct
         * tokens here: the most rows), dwpe written */
        int Vb = N;                       /* a vocabulary of N rows, token n = n */
        int32_t *tok = NULL, *htok = malloc((size_t)N * 4);
        float *tw = dalloc((size_t)Vb * C), *tp = dalloc((size_t)T * C);
        for (int i = 0; i < N; i++) htok[i] = (i * 7919) % Vb;
        dv->alloc((void **)&tok, (size_t)N * 4);
        dv->upload(tok, htok, (size_t)N * 4);
        TIMEB("encoder fwd (B,T,768)", nc * 12, 50, dv->encoder_forward(y, 0, tok, tw, tp, 0, B, T, C, Vb));
        TIMEB("encoder bwd (B,T,768)", nc * 16, 20, dv->encoder_backward(tw, tp, 0, g, 0, tok, B, T, C, Vb));
        /* the bf16 residual stream: out (dout) bf16 */
        TIMEB("encoder fwd (B,T,768) bf16 out", nc * 10, 50,
              dv->encoder_forward(y, 1, tok, tw, tp, 0, B, T, C, Vb));
        TIMEB("encoder bwd (B,T,768) bf16 dout", nc * 14, 20,
              dv->encoder_backward(tw, tp, 0, g16, 1, tok, B, T, C, Vb));
        /* a bf16 run's: dwte, dwpe bf16 (g16; tw's and tp's bytes as bf16,
         * rows read and written at 2 bytes), the counting scan first */
        dv->fill(tw, 0.0f, (size_t)Vb * C / 2);
        TIMEB("encoder bwd (B,T,768) bf16 dout, dwte", nc * 8, 20,
              dv->encoder_backward(tw, tp, 1, g16, 1, tok, B, T, C, Vb));
        /* every position one token: a giant run over N / 2048 flushes
         * (bf16: its fp32 row carried in the scratch between them) */
        for (int i = 0; i < N; i++) htok[i] = 7;
        dv->upload(tok, htok, (size_t)N * 4);
        TIMEB("encoder bwd one token, f32", nc * 4, 5, dv->encoder_backward(tw, tp, 0, g, 0, tok, B, T, C, Vb));
        dv->fill(tw, 0.0f, (size_t)Vb * C / 2);
        TIMEB("encoder bwd one token, bf16 dwte", nc * 4, 5,
              dv->encoder_backward(tw, tp, 1, g, 0, tok, B, T, C, Vb));
        dv->free(tok); dv->free(tw); dv->free(tp); free(htok);
    }
    dv->free(x16); dv->free(g16); dv->free(s16); dv->free(p16);
    (void)logits;
    attention_shapes(1);                        /* last: the variants no GPU has run */
    int rc = dv->sync();
    printf("sync: %s\n", rc == ZT_OK ? "ok" : zt_last_error());
    return rc != ZT_OK;
}
