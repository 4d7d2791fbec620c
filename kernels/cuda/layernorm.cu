/* layernorm.cu -- layer norm, eps 1e-5, biased variance (kernels.cuh).
 * One warp per row for the row work; one thread per column for the weight
 * gradients, summing rows in order in double (the CPU's order and width, so
 * dw/db differ from the CPU only through their inputs). */
#include "common.cuh"

#define LN_WARPS 8      /* rows per 256-thread block */

/* out (N,C); mean, rstd (N) */
__global__ static void k_ln_fwd(float *out, float *mean, float *rstd, const float *inp,
                                const float *w, const float *b, int N, int C)
{
    int row = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += x[c];
    float m = zkc_warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) { float d = x[c] - m; v += d * d; }
    float r = 1.0f / sqrtf(zkc_warp_sum(v) / (float)C + 1e-5f);
    float *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * r * w[c] + b[c];
    if (lane == 0) { mean[row] = m; rstd[row] = r; }
}

/* dinp += (g - mean(g) - norm * mean(g * norm)) * rstd, g = w * dout */
__global__ static void k_ln_bwd_dinp(float *dinp, const float *dout, const float *inp,
                                     const float *w, const float *mean, const float *rstd,
                                     int N, int C)
{
    int row = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;
    float *di = dinp + (size_t)row * C;
    float m = mean[row], s = rstd[row], a1 = 0.0f, a2 = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float g = w[c] * d[c];
        a1 += g;
        a2 += g * ((x[c] - m) * s);
    }
    float g_mean = zkc_warp_sum(a1) / (float)C, gn_mean = zkc_warp_sum(a2) / (float)C;
    for (int c = lane; c < C; c += 32) {
        float norm = (x[c] - m) * s;
        di[c] += (w[c] * d[c] - g_mean - norm * gn_mean) * s;
    }
}

__global__ static void k_ln_bwd_w(float *dw, float *db, const float *dout, const float *inp,
                                  const float *mean, const float *rstd, int N, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double sw = 0.0, sb = 0.0;
    for (int n = 0; n < N; n++) {
        float x = inp[(size_t)n * C + c], d = dout[(size_t)n * C + c];
        sw += (double)(((x - mean[n]) * rstd[n]) * d);
        sb += (double)d;
    }
    dw[c] = (float)sw;
    db[c] = (float)sb;
}

extern "C" int zkc_layernorm_forward(cudaStream_t s, float *out, float *mean, float *rstd,
                                     const float *inp, const float *w, const float *b,
                                     int N, int C)
{
    if (N == 0) return 0;
    k_ln_fwd<<<(N + LN_WARPS - 1) / LN_WARPS, 32 * LN_WARPS, 0, s>>>(out, mean, rstd, inp,
                                                                      w, b, N, C);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_layernorm_backward(cudaStream_t s, float *dinp, float *dw, float *db,
                                      const float *dout, const float *inp, const float *w,
                                      const float *mean, const float *rstd, int N, int C)
{
    if (N == 0) return 0;
    if (dinp) {
        k_ln_bwd_dinp<<<(N + LN_WARPS - 1) / LN_WARPS, 32 * LN_WARPS, 0, s>>>(
            dinp, dout, inp, w, mean, rstd, N, C);
        int e = ZKC_LAUNCHED();
        if (e) return e;
    }
    if (dw && db) {
        k_ln_bwd_w<<<(C + 127) / 128, 128, 0, s>>>(dw, db, dout, inp, mean, rstd, N, C);
        return ZKC_LAUNCHED();
    }
    return 0;
}
