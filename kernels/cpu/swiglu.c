/*
 * swiglu.c -- the gated MLP's activation (Llama, Qwen 2.5, Mistral):
 * out = silu(gate) * up, silu(x) = x * sigmoid(x), with gate and up the two
 * halves of one GEMM's output row [gate (F) | up (F)] (gate_proj and
 * up_proj stacked: one GEMM, one read of x).
 *
 * sigmoid through exp_nonpos (fastmath.h) of -|x|, so the loops vectorize
 * and no exp overflows: x >= 0: 1 / (1 + e^-x); x < 0: e^x / (1 + e^x).
 * Within ~2 float ulps of PyTorch's x / (1 + exp(-x)). Elementwise: the
 * same bits whatever the threads.
 */
#include "fastmath.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#define SG_NOCONTRACT
#else
#define SG_NOCONTRACT __attribute__((optimize("fp-contract=off")))
#endif

static inline float sigmoid_fast(float x) {
    float e = exp_nonpos(-fabsf(x));
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

SG_NOCONTRACT
static void fwd_row(float *restrict o, const float *restrict g, const float *restrict u, int F) {
    #pragma omp simd
    for (int i = 0; i < F; i++) o[i] = (g[i] * sigmoid_fast(g[i])) * u[i];
}

void zk_swiglu_forward(float *out, const float *gu, int N, int F) {
    #pragma omp parallel for schedule(static) if ((long)N * F >= 65536)
    for (int n = 0; n < N; n++) {
        const float *row = gu + (size_t)n * 2 * F;
        fwd_row(out + (size_t)n * F, row, row + F, F);
    }
}

/* dgate = dout * up * silu'(gate), silu'(x) = s (1 + x (1 - s));
 * dup = dout * silu(gate) */
SG_NOCONTRACT
static void bwd_row(float *restrict dg, float *restrict du, const float *restrict d,
                    const float *restrict g, const float *restrict u, int F) {
    #pragma omp simd
    for (int i = 0; i < F; i++) {
        float x = g[i], s = sigmoid_fast(x);
        dg[i] = (d[i] * u[i]) * (s * (1.0f + x * (1.0f - s)));
        du[i] = d[i] * (x * s);
    }
}

void zk_swiglu_backward(float *dgu, const float *dout, const float *gu, int N, int F) {
    #pragma omp parallel for schedule(static) if ((long)N * F >= 65536)
    for (int n = 0; n < N; n++) {
        const float *row = gu + (size_t)n * 2 * F;
        float *drow = dgu + (size_t)n * 2 * F;
        bwd_row(drow, drow + F, dout + (size_t)n * F, row, row + F, F);
    }
}

/* bf16 gu: a row's chunks widened into float tiles, the rows above on
 * them, the results rounded once */
#define SG_TILE 512
void zk_swiglu_forward_bb(uint16_t *out, const uint16_t *gu, int N, int F) {
    #pragma omp parallel for schedule(static) if ((long)N * F >= 65536)
    for (int n = 0; n < N; n++) {
        const uint16_t *row = gu + (size_t)n * 2 * F;
        float g[SG_TILE], u[SG_TILE], o[SG_TILE];
        for (int i0 = 0; i0 < F; i0 += SG_TILE) {
            int k = F - i0 < SG_TILE ? F - i0 : SG_TILE;
            zk_cast_bf16_f32(g, row + i0, (size_t)k);
            zk_cast_bf16_f32(u, row + F + i0, (size_t)k);
            fwd_row(o, g, u, k);
            zk_cast_f32_bf16(out + (size_t)n * F + i0, o, (size_t)k);
        }
    }
}

void zk_swiglu_backward_bb(uint16_t *dgu, const uint16_t *dout, const uint16_t *gu, int N, int F) {
    #pragma omp parallel for schedule(static) if ((long)N * F >= 65536)
    for (int n = 0; n < N; n++) {
        const uint16_t *row = gu + (size_t)n * 2 * F;
        uint16_t *drow = dgu + (size_t)n * 2 * F;
        float g[SG_TILE], u[SG_TILE], dg[SG_TILE], du[SG_TILE], d[SG_TILE];
        for (int i0 = 0; i0 < F; i0 += SG_TILE) {
            int k = F - i0 < SG_TILE ? F - i0 : SG_TILE;
            zk_cast_bf16_f32(g, row + i0, (size_t)k);
            zk_cast_bf16_f32(u, row + F + i0, (size_t)k);
            zk_cast_bf16_f32(d, dout + (size_t)n * F + i0, (size_t)k);
            bwd_row(dg, du, d, g, u, k);
            zk_cast_f32_bf16(drow + i0, dg, (size_t)k);
            zk_cast_f32_bf16(drow + F + i0, du, (size_t)k);
        }
    }
}
