/*
 * bench_cuda.c -- the CUDA device's ops at GPT-2 124M shapes (B=4, T=1024,
 * C=768, NH=12, V=50257): milliseconds per call, GFLOP/s for the GEMMs and
 * attention (plain fp32 and the bf16 tensor-core kernels). `make bench-cuda` (CUDA=1, build-cuda/); needs a GPU.
 * Measures the kernels alone (device memory, one warm-up call, events).
 */
#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime_api.h>
#include "internal.h"
#include "cuda_stream.h"

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
    } while (0)

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) { printf("cuda: no GPU here, bench skipped\n"); return 0; }
    if (zt_cuda_init() != ZT_OK) { printf("zt_cuda_init: %s\n", zt_last_error()); return 1; }
    int B = 4, T = 1024, C = 768, NH = 12, V = 50257, N = B * T;
    float *x = dalloc((size_t)N * 4 * C), *w = dalloc((size_t)4 * C * C), *b = dalloc(4 * C);
    float *y = dalloc((size_t)N * 4 * C), *g = dalloc((size_t)N * 4 * C);
    float *dw = dalloc((size_t)4 * C * C), *db = dalloc(4 * C), *dx = dalloc((size_t)N * 4 * C);
    float *qkv = dalloc((size_t)N * 3 * C), *lse = dalloc((size_t)B * NH * T);
    float *dq = dalloc((size_t)N * 3 * C), *mean = dalloc(N), *rstd = dalloc(N);
    float *logits = dalloc((size_t)N * V / 4), *loss = dalloc(N);
    int32_t *tg = NULL; dv->alloc((void **)&tg, (size_t)N * 4); dv->zero(tg, (size_t)N * 4);
    double f = 2.0 * N * C * 4 * C;
    TIME("matmul fwd fc (N,768)->(N,3072)", f, 20, dv->matmul_forward(y, x, w, b, N, C, 4 * C));
    TIME("matmul bwd fc (dinp, dw, db)", 2 * f, 20, dv->matmul_backward(dx, dw, db, g, x, w, N, C, 4 * C));
    /* the bias: a kernel after the GEMM (above) or cuBLASLt's epilogue;
     * both dtypes, the qkv shape too (bf16 operands: w and x's bits) */
    zt_cuda_matmul_epilogue(1);
    TIME("matmul fwd fc, bias epilogue", f, 20, dv->matmul_forward(y, x, w, b, N, C, 4 * C));
    zt_cuda_matmul_epilogue(0);
    double fq = 2.0 * N * C * 3 * C;
    TIME("matmul bf16 fwd qkv (N,768)->(N,2304)", fq, 20,
         dv->matmul_bf16_forward(y, (uint16_t *)x, (uint16_t *)w, b, N, C, 3 * C));
    zt_cuda_matmul_epilogue(1);
    TIME("matmul bf16 fwd qkv, bias epilogue", fq, 20,
         dv->matmul_bf16_forward(y, (uint16_t *)x, (uint16_t *)w, b, N, C, 3 * C));
    zt_cuda_matmul_epilogue(0);
    double fa = 4.0 * B * NH * ((double)T * T / 2) * (C / NH);
    TIME("attention fwd T=1024", fa, 5, dv->attention_forward(y, lse, qkv, B, T, C, NH));
    TIME("attention bwd T=1024", 2.5 * fa, 3, dv->attention_backward(dq, g, qkv, y, lse, B, T, C, NH));
    zt_cuda_attention_mode(1);      /* bf16 tensor cores (attention_tc.cu) */
    TIME("attention fwd T=1024 bf16 tc", fa, 20, dv->attention_forward(y, lse, qkv, B, T, C, NH));
    TIME("attention bwd T=1024 bf16 tc", 2.5 * fa, 20, dv->attention_backward(dq, g, qkv, y, lse, B, T, C, NH));
    zt_cuda_attention_mode(0);
    TIME("layernorm fwd (N,768)", 0, 50, dv->layernorm_forward(y, mean, rstd, x, w, b, N, C));
    TIME("layernorm bwd (N,768)", 0, 50, dv->layernorm_backward(dx, dw, db, g, x, w, mean, rstd, N, C));
    TIME("gelu fwd (N,3072)", 0, 50, dv->gelu_forward(y, x, (size_t)N * 4 * C));
    TIME("adamw 12.6M params", 0, 10, dv->adamw(x, g, y, dx, (size_t)N * 4 * C, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1));
    TIME("crossentropy (N/4, V)", 0, 10, dv->crossentropy(loss, logits, logits, tg, N / 4, V, 1.0f));
    int rc = dv->sync();
    printf("sync: %s\n", rc == ZT_OK ? "ok" : zt_last_error());
    return rc != ZT_OK;
}
