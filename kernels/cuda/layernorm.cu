/* layernorm.cu -- layer norm, eps 1e-5, biased variance, and RMS norm
 * (Llama's: no mean, no bias, eps given), kernels.cuh. One template
 * parameter RMS tells them apart: the RMS norm is the layer norm's rows
 * with the mean taken as 0 and no bias, so both share the paths below.
 *
 * Two ways through each op, chosen per call by the shape and the pointers:
 *  - the vector path (C % 4 == 0, every row pointer 16-byte aligned -- an
 *    8-byte bf16 out --, C <= 2048 forward, C <= 4096 backward): 16-byte
 *    loads and stores, the forward's row kept in a warp's registers (read
 *    once from memory: was three passes over it), the backward one pass
 *    over the rows that writes dinp and the weight gradients' per-chunk
 *    partials together (was a second pass re-reading dout and inp);
 *  - the scalar path otherwise (any C, any alignment): a warp per row,
 *    element by element, and the weight gradients in their own pass.
 * Both are deterministic: every sum has an order fixed by (N, C) alone
 * (never by the GPU's SM count). The paths differ in the order of the
 * float sums of a row (a lane holds 4 neighbouring columns, not every
 * 32nd), so their bits differ from each other and from the CPU twin by
 * float rounding (test_cuda's tolerances); a given call always takes the
 * same path, and dinp's bits do not depend on whether the weight
 * gradients are asked for.
 *
 * The weight gradients: chunk k of zkc_ln_rows(N) rows sums its rows in
 * order in double per column (the CPU twin's terms); the chunks' sums are
 * then added per column in a fixed grouping (k_ln_bwd_w_sum). The CPU
 * sums all rows in order in double: another grouping of the same double
 * additions, within far less than a float ulp.
 *
 * History: one thread per column summed every row in the weight pass
 * (0.78 ms per call at B=16, T=1024 on an H100, 97 ms a step); then
 * chunks of 64 rows in a second pass (an H200: backward 1,263 GB/s,
 * forward 1,787 GB/s against a 3,719 GB/s copy, 4.0 + 1.7 ms a step).
 * The vector path is checked on the CPU under spec/emu (sh
 * tools/emu_kernel.sh layernorm); not yet timed on a GPU.
 *
 * The bf16 residual stream ("r16", kernels.cuh's _r16 entry points): the
 * same kernels instantiated with the row type I = uint16_t for the input
 * rows (resid, a, b2 of the residual forward; inp, dinp and dout of the
 * backward -- dout the gradient of the bf16 norm output, a bf16 GEMM's
 * input gradient): each element widened exactly as it is loaded (zkc_get,
 * or ln_ld4: 8 bytes, 4 bf16, where the f32 path loads 16 bytes, 4
 * floats), each element stored rounded once (zkc_put, ln_st4), and every
 * float operation in between the f32 instantiation's; so the r16 results
 * are the f32 kernels' on the widened rows, rounded once (checked bit for
 * bit under spec/emu). The vector path takes bf16 rows on 8 bytes (a
 * warp's loads 256 contiguous bytes), the weights on 16 as before (bf16
 * ones, below, on 8). The I = float instantiations are the float
 * operations of before (the same
 * PTX instructions; the backward's stores scheduled differently; dout's
 * type following I left their SASS unchanged).
 *
 * A bf16 run's parameters ("p16"): every kernel that reads w (and b)
 * takes them through a third type P, float or uint16_t (bf16 bits, each
 * widened exactly as it is read: zkc_get, ln_ld4 -- 8 bytes of 4 bf16 on
 * the vector path), so a bf16 run passes its stored parameters with no
 * cast before the op; every float operation is the f32 parameters' on the
 * widened values, hence the same bits as an f32 copy of them (checked
 * under spec/emu). The path is chosen as before, bf16 parameters on 8
 * bytes counting as f32 ones on 16: a parameter at a given element offset
 * takes the same path in either type. The weight-gradient pass apart
 * (k_ln_bwd_w_part) reads no w: no P. The P = float instantiations are
 * the kernels of before (the same SASS, sm_80 and sm_90).
 *
 * A bf16 run's weight gradients ("g16"): dw and db (the RMS norm's dw)
 * bf16, written by the op -- the final store of k_ln_bwd_w_sum rounds the
 * fp32 value once (zkc_put), so a bf16 run keeps no fp32 image of them
 * and casts nothing after; the partials, their order and every other
 * kernel are the fp32 call's, hence its dw, db rounded, bit for bit. */
#include <cuda_bf16.h>
#include "mma.cuh"
#include "common.cuh"

#define LN_WARPS 8      /* rows per 256-thread block (forward, scalar backward) */
#define LN_BWD_MAX 512  /* threads a vector backward block at most */
#define LN_SUM_WARPS 8  /* k_ln_bwd_w_sum: warps per 32 columns */

/* rows per chunk of the weight gradients: 32, more for N > 32 * 65535 (a
 * grid's dimension) */
static inline int zkc_ln_rows(int N)
{
    int r = 32;
    while ((N + r - 1) / r > 65535) r *= 2;
    return r;
}

extern "C" size_t zkc_layernorm_scratch(int N, int C)
{
    return N <= 0 ? 0 : 2 * (size_t)((N + zkc_ln_rows(N) - 1) / zkc_ln_rows(N)) * (size_t)C;
}

/* the vector path's 4 neighbouring elements as floats: 16 bytes of fp32,
 * or 8 bytes of bf16 widened exactly (p on 8 bytes) */
__device__ __forceinline__ float4 ln_ld4(const float *p) { return zkc_ldg4(p); }
__device__ __forceinline__ float4 ln_ld4(const uint16_t *p)
{
    uint32_t lo, hi;
#ifdef __CUDACC__
    uint2 v = *(const uint2 *)p;
    lo = v.x;
    hi = v.y;
#else
    emu_aligned(p, 8, "load");
    memcpy(&lo, p, 4);
    memcpy(&hi, p + 2, 4);
#endif
    return float4{ __uint_as_float(lo << 16), __uint_as_float(lo & 0xffff0000u),
                   __uint_as_float(hi << 16), __uint_as_float(hi & 0xffff0000u) };
}
/* ... and stored: fp32 as they are (16 bytes), or bf16 rounded once (8) */
__device__ __forceinline__ void ln_st4(float *p, float4 v) { zkc_stg4(p, v); }
__device__ __forceinline__ void ln_st4(uint16_t *p, float4 v)
{
    zkc_stg4h(p, (uint32_t)zkc_bf16(v.x) | (uint32_t)zkc_bf16(v.y) << 16,
              (uint32_t)zkc_bf16(v.z) | (uint32_t)zkc_bf16(v.w) << 16);
}
/* the values ln_st4 stores into a row of p's type, as floats: v itself, or
 * v rounded to bf16 and widened back */
__device__ __forceinline__ float4 ln_stored4(const float *, float4 v) { return v; }
__device__ __forceinline__ float4 ln_stored4(const uint16_t *, float4 v)
{
    return float4{ __uint_as_float((uint32_t)zkc_bf16(v.x) << 16),
                   __uint_as_float((uint32_t)zkc_bf16(v.y) << 16),
                   __uint_as_float((uint32_t)zkc_bf16(v.z) << 16),
                   __uint_as_float((uint32_t)zkc_bf16(v.w) << 16) };
}

/* ------------------------------------------------------------------ */
/* the scalar path                                                      */

/* out (N,C) fp32 or bf16 (O = uint16_t: rounded once); mean (N, not
 * written for RMS), rstd (N). RMS: out = w * (x * rstd), the mean 0 and
 * no bias (transformers' LlamaRMSNorm's order). inp fp32, or (I =
 * uint16_t) bf16 widened: a warp's loads 64 contiguous bytes */
template <class I, class O, class P, bool RMS>
__device__ __forceinline__ void ln_fwd(O *out, float *mean, float *rstd, const I *inp,
                                       const P *w, const P *b, float eps, int N, int C)
{
    int row = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const I *x = inp + (size_t)row * C;
    float m = 0.0f;
    if (!RMS) {
        float s = 0.0f;
        for (int c = lane; c < C; c += 32) s += zkc_get(x + c);
        m = zkc_warp_sum(s) / (float)C;
    }
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) { float d = zkc_get(x + c) - m; v += d * d; }
    float r = 1.0f / sqrtf(zkc_warp_sum(v) / (float)C + eps);
    O *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float xc = zkc_get(x + c);
        float wc = zkc_get(w + c);
        zkc_put(o + c, RMS ? wc * (xc * r) : (xc - m) * r * wc + zkc_get(b + c));
    }
    if (lane == 0) { if (!RMS) mean[row] = m; rstd[row] = r; }
}
template <class I, class O, class P, bool RMS>
__global__ static void k_ln_fwd(O *out, float *mean, float *rstd, const I *inp,
                                const P *w, const P *b, float eps, int N, int C)
{ ln_fwd<I, O, P, RMS>(out, mean, rstd, inp, w, b, eps, N, C); }

/* the residual add first: resid = a + b (the row written, then read back
 * from cache by the same lane), then ln_fwd's row on it; I = uint16_t:
 * resid = the sum rounded once, the norm on the stored (rounded) row */
template <class I, class O, class P>
__global__ static void k_ln_res_fwd(I *resid, O *out, float *mean, float *rstd,
                                    const I *a, const I *b2, const P *w,
                                    const P *b, int N, int C)
{
    int row = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    I *x = resid + (size_t)row * C;
    const I *ar = a + (size_t)row * C, *br = b2 + (size_t)row * C;
    for (int c = lane; c < C; c += 32) zkc_put(x + c, zkc_get(ar + c) + zkc_get(br + c));
    __syncwarp();
    ln_fwd<I, O, P, false>(out, mean, rstd, resid, w, b, 1e-5f, N, C);
}

/* dinp += (g - mean(g) - norm * mean(g * norm)) * rstd, g = w * dout
 * (RMS: no mean(g), norm = x * rstd); dinp16 (NULL: none) the new dinp
 * rounded once. I = uint16_t: inp, dout and dinp bf16, widened, the new
 * dinp rounded once (dinp16 NULL) */
template <class I, class P, bool RMS>
__global__ static void k_ln_bwd_dinp(I *dinp, uint16_t *dinp16, const I *dout,
                                     const I *inp, const P *w, const float *mean,
                                     const float *rstd, int N, int C)
{
    int row = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const I *x = inp + (size_t)row * C;
    const I *d = dout + (size_t)row * C;
    I *di = dinp + (size_t)row * C;
    float m = RMS ? 0.0f : mean[row], s = rstd[row], a1 = 0.0f, a2 = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float g = zkc_get(w + c) * zkc_get(d + c);
        a1 += g;
        a2 += g * ((zkc_get(x + c) - m) * s);
    }
    float g_mean = RMS ? 0.0f : zkc_warp_sum(a1) / (float)C, gn_mean = zkc_warp_sum(a2) / (float)C;
    uint16_t *d16 = dinp16 ? dinp16 + (size_t)row * C : NULL;
    for (int c = lane; c < C; c += 32) {
        float norm = (zkc_get(x + c) - m) * s;
        float wc = zkc_get(w + c);
        float v = RMS ? zkc_get(di + c) + (wc * zkc_get(d + c) - norm * gn_mean) * s
                      : zkc_get(di + c) + (wc * zkc_get(d + c) - g_mean - norm * gn_mean) * s;
        zkc_put(di + c, v);
        if (d16) d16[c] = zkc_bf16(v);
    }
}

/* part (P, nk, C), P = 2 (1 for RMS): chunk k's sums of column c, dw's
 * then db's (I = uint16_t: inp and dout bf16, widened) */
template <class I, bool RMS>
__global__ static void k_ln_bwd_w_part(double *part, const I *dout, const I *inp,
                                       const float *mean, const float *rstd, int N, int C, int R)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, k = blockIdx.y;
    if (c >= C) return;
    int n0 = k * R, n1 = min(N, n0 + R);
    double sw = 0.0, sb = 0.0;
    for (int n = n0; n < n1; n++) {
        float x = zkc_get(inp + (size_t)n * C + c), d = zkc_get(dout + (size_t)n * C + c);
        sw += (double)(((x - (RMS ? 0.0f : mean[n])) * rstd[n]) * d);
        sb += (double)d;
    }
    size_t nk = gridDim.y;
    part[(size_t)k * C + c] = sw;
    if (!RMS) part[(nk + k) * C + c] = sb;
}

/* ------------------------------------------------------------------ */
/* the vector path                                                      */

__device__ __forceinline__ float ln_sum4(float4 v) { return ((v.x + v.y) + v.z) + v.w; }

/* V float4 groups a lane: group j of a lane is columns 4 (32 j + lane) ..
 * +3 (j < V, those past C skipped). RES: the row is a + b2, written to
 * resid first. O: the out's element type (float, or uint16_t bf16 rounded
 * once). I: the rows' (inp, b2, resid): float, or uint16_t bf16 (loaded 8
 * bytes a group, widened; resid the sum rounded once, the norm on the
 * rounded row). */
template <int V, class I, class O, class P, bool RES, bool RMS>
__global__ static void k_ln_fwd_v(I *resid, O *out, float *mean, float *rstd,
                                  const I *inp, const I *b2, const P *w,
                                  const P *b, float eps, int N, int C)
{
    int row = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    int C4 = C / 4;
    size_t base = (size_t)row * C;
    float4 x[V];
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < V; j++) {
        int g = 32 * j + lane;
        x[j] = float4{ 0.0f, 0.0f, 0.0f, 0.0f };
        if (g >= C4) continue;
        if (RES) {
            float4 p = ln_ld4(inp + base + 4 * g), q = ln_ld4(b2 + base + 4 * g);
            x[j] = float4{ p.x + q.x, p.y + q.y, p.z + q.z, p.w + q.w };
            ln_st4(resid + base + 4 * g, x[j]);
            x[j] = ln_stored4(resid, x[j]);
        } else {
            x[j] = ln_ld4(inp + base + 4 * g);
        }
        if (!RMS) s += ln_sum4(x[j]);
    }
    float m = RMS ? 0.0f : zkc_warp_sum(s) / (float)C;
    float v = 0.0f;
#pragma unroll
    for (int j = 0; j < V; j++) {
        if (32 * j + lane >= C4) continue;
        float4 d = float4{ x[j].x - m, x[j].y - m, x[j].z - m, x[j].w - m };
        v += ((d.x * d.x + d.y * d.y) + d.z * d.z) + d.w * d.w;
    }
    float r = 1.0f / sqrtf(zkc_warp_sum(v) / (float)C + eps);
#pragma unroll
    for (int j = 0; j < V; j++) {
        int g = 32 * j + lane;
        if (g >= C4) continue;
        float4 wv = ln_ld4(w + 4 * g), y;
        if (RMS) {
            y = float4{ wv.x * (x[j].x * r), wv.y * (x[j].y * r), wv.z * (x[j].z * r),
                        wv.w * (x[j].w * r) };
        } else {
            float4 bv = ln_ld4(b + 4 * g);
            y = float4{ (x[j].x - m) * r * wv.x + bv.x, (x[j].y - m) * r * wv.y + bv.y,
                        (x[j].z - m) * r * wv.z + bv.z, (x[j].w - m) * r * wv.w + bv.w };
        }
        if (sizeof(O) == 2)
            zkc_stg4h((uint16_t *)out + base + 4 * g,
                      (uint32_t)zkc_bf16(y.x) | (uint32_t)zkc_bf16(y.y) << 16,
                      (uint32_t)zkc_bf16(y.z) | (uint32_t)zkc_bf16(y.w) << 16);
        else
            zkc_stg4((float *)out + base + 4 * g, y);
    }
    if (lane == 0) { if (!RMS) mean[row] = m; rstd[row] = r; }
}

/* One pass: block k takes rows [k R, k R + R), RG = 4 / V at a time
 * (the loads of a step in flight together, 4 float4 groups' worth a
 * thread: <= 128 registers, so 512 threads fit an SM's 64K; V = 4 spilled,
 * so C > 4096 takes the scalar path); thread t the
 * float4 groups t + j blockDim.x (j < V). Each step loads its rows'
 * dout, inp and dinp, sums a row's g = w dout and g norm per warp, then
 * over the block's warps in warp order (smem, double-buffered: one
 * barrier a step), updates dinp (dinp16) and adds norm dout and dout into
 * the thread's double sums. part NULL: no weight gradients; dinp NULL:
 * none of dinp. I = uint16_t: inp, dout and dinp bf16 (8-byte loads and
 * stores a group, widened exactly), the new dinp rounded once (dinp16
 * NULL). */
template <int V, class I, class P, bool RMS>
__global__ static void __launch_bounds__(LN_BWD_MAX) k_ln_bwd_v(I *dinp, uint16_t *dinp16, double *part,
                                  const I *dout, const I *inp, const P *w,
                                  const float *mean, const float *rstd, int N, int C, int R)
{
    enum { RG = 4 / V };
    __shared__ float red[2][2 * RG][32];
    int C4 = C / 4, k = blockIdx.x, nw = blockDim.x / 32;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int n0 = k * R, n1 = min(N, n0 + R);
    float4 wv[V];
    double sw[V][4], sb[V][4];
#pragma unroll
    for (int j = 0; j < V; j++) {
        int g = threadIdx.x + j * blockDim.x;
        wv[j] = g < C4 ? ln_ld4(w + 4 * g) : float4{ 0.0f, 0.0f, 0.0f, 0.0f };
        for (int e = 0; e < 4; e++) sw[j][e] = sb[j][e] = 0.0;
    }
    int buf = 0;
    for (int n = n0; n < n1; n += RG, buf ^= 1) {
        float4 xv[RG][V], dv[RG][V], iv[RG][V];
        float m[RG], s[RG], p[2 * RG];
#pragma unroll
        for (int r = 0; r < RG; r++) {
            bool on = n + r < n1;
            m[r] = on && !RMS ? mean[n + r] : 0.0f;
            s[r] = on ? rstd[n + r] : 0.0f;
            float a1 = 0.0f, a2 = 0.0f;
#pragma unroll
            for (int j = 0; j < V; j++) {
                int g = threadIdx.x + j * blockDim.x;
                size_t at = (size_t)(n + r) * C + 4 * (size_t)g;
                const float4 z = { 0.0f, 0.0f, 0.0f, 0.0f };
                bool here = on && g < C4;
                xv[r][j] = here ? ln_ld4(inp + at) : z;
                dv[r][j] = here ? ln_ld4(dout + at) : z;
                iv[r][j] = here && dinp ? ln_ld4(dinp + at) : z;
                float4 x = xv[r][j], d = dv[r][j], ww = wv[j];
                float g0 = ww.x * d.x, g1 = ww.y * d.y, g2 = ww.z * d.z, g3 = ww.w * d.w;
                a1 += ((g0 + g1) + g2) + g3;
                a2 += ((g0 * ((x.x - m[r]) * s[r]) + g1 * ((x.y - m[r]) * s[r])) +
                       g2 * ((x.z - m[r]) * s[r])) + g3 * ((x.w - m[r]) * s[r]);
            }
            p[2 * r] = a1;
            p[2 * r + 1] = a2;
        }
#pragma unroll
        for (int i = 0; i < 2 * RG; i++) {
            float t = zkc_warp_sum(p[i]);
            if (lane == 0) red[buf][i][warp] = t;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 2 * RG; i++) {
            float t = 0.0f;
            for (int q = 0; q < nw; q++) t += red[buf][i][q];
            p[i] = t / (float)C;
        }
#pragma unroll
        for (int r = 0; r < RG; r++) {
            if (n + r >= n1) continue;
#pragma unroll
            for (int j = 0; j < V; j++) {
                int g = threadIdx.x + j * blockDim.x;
                if (g >= C4) continue;
                size_t at = (size_t)(n + r) * C + 4 * (size_t)g;
                float xs[4] = { xv[r][j].x, xv[r][j].y, xv[r][j].z, xv[r][j].w };
                float ds[4] = { dv[r][j].x, dv[r][j].y, dv[r][j].z, dv[r][j].w };
                float is[4] = { iv[r][j].x, iv[r][j].y, iv[r][j].z, iv[r][j].w };
                float ws[4] = { wv[j].x, wv[j].y, wv[j].z, wv[j].w };
                float o[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float norm = (xs[e] - m[r]) * s[r];
                    o[e] = RMS ? is[e] + (ws[e] * ds[e] - norm * p[2 * r + 1]) * s[r]
                               : is[e] + (ws[e] * ds[e] - p[2 * r] - norm * p[2 * r + 1]) * s[r];
                    sw[j][e] += (double)(norm * ds[e]);
                    sb[j][e] += (double)ds[e];
                }
                if (dinp) ln_st4(dinp + at, float4{ o[0], o[1], o[2], o[3] });
                if (sizeof(I) == 4 && dinp && dinp16)
                    zkc_stg4h(dinp16 + at, (uint32_t)zkc_bf16(o[0]) | (uint32_t)zkc_bf16(o[1]) << 16,
                              (uint32_t)zkc_bf16(o[2]) | (uint32_t)zkc_bf16(o[3]) << 16);
            }
        }
    }
    if (!part) return;
    size_t nk = gridDim.x;
#pragma unroll
    for (int j = 0; j < V; j++) {
        int g = threadIdx.x + j * blockDim.x;
        if (g >= C4) continue;
        for (int e = 0; e < 4; e++) {
            part[(size_t)k * C + 4 * g + e] = sw[j][e];
            if (!RMS) part[(nk + k) * C + 4 * g + e] = sb[j][e];
        }
    }
}

/* dw, db (C) from part (2, nk, C) (db NULL: dw alone from (1, nk, C)):
 * 32 columns a block (a lane each, loads coalesced), warp q summing chunks
 * q, q + LN_SUM_WARPS, ... in order, then the warps' sums in warp order:
 * a grouping fixed by (N, C). G: dw's and db's type, float, or uint16_t
 * (g16: a bf16 run's stored gradients, written by the op with no fp32
 * image and no cast after): the double sum rounded to float, then to bf16
 * once (zkc_put: nearest even) -- the fp32 store's bits, cast. The only
 * place g16 enters: the partials and their order are the fp32 call's. */
template <class G>
__global__ static void k_ln_bwd_w_sum(G *dw, G *db, const double *part, int nk, int C)
{
    __shared__ double red[2][LN_SUM_WARPS][32];
    int lane = threadIdx.x % 32, q = threadIdx.x / 32, c = blockIdx.x * 32 + lane;
    double sw = 0.0, sb = 0.0;
    if (c < C)
        for (int k = q; k < nk; k += LN_SUM_WARPS) {
            sw += part[(size_t)k * C + c];
            if (db) sb += part[(size_t)(nk + k) * C + c];
        }
    red[0][q][lane] = sw;
    red[1][q][lane] = sb;
    __syncthreads();
    if (q != 0 || c >= C) return;
    sw = sb = 0.0;
    for (int i = 0; i < LN_SUM_WARPS; i++) { sw += red[0][i][lane]; sb += red[1][i][lane]; }
    float fw = (float)sw, fb = (float)sb;   /* (this order: G = float's PTX of before) */
    zkc_put(dw + c, fw);
    if (db) zkc_put(db + c, fb);
}

/* ------------------------------------------------------------------ */
/* launchers                                                            */

/* the forward's vector path: V float4 groups a lane (C <= 2048), or 0 */
static int ln_fwd_groups(int C)
{
    int need = (C / 4 + 31) / 32;
    static const int vs[] = { 2, 4, 6, 8, 12, 16 };
    for (int i = 0; i < 6; i++)
        if (need <= vs[i]) return vs[i];
    return 0;
}
/* a row pointer on its vector access's bytes: 16 (4 floats), 8 for bf16
 * (4 bf16); NULL counts as aligned */
static int ln_al(const void *p, size_t esize)
{
    return !((uintptr_t)p & (esize == 2 ? 7 : 15));
}

template <int V, class I, class O, class P, bool RES, bool RMS>
static int ln_fwd_launch(cudaStream_t s, I *resid, void *out, float *mean, float *rstd,
                         const I *inp, const I *b2, const P *w, const P *b,
                         float eps, int N, int C)
{
    unsigned g = (unsigned)((N + LN_WARPS - 1) / LN_WARPS);   /* launches on one line: spec/emu */
    k_ln_fwd_v<V, I, O, P, RES, RMS><<<g, 32 * LN_WARPS, 0, s>>>(resid, (O *)out, mean, rstd, inp, b2, w, b, eps, N, C);
    return ZKC_LAUNCHED();
}
/* a forward: the vector path where the shape and pointers allow, else the
 * scalar one (RES: the residual add first, resid = a + b2); I the rows'
 * type, O the out's, P the parameters' (w and b: float, or uint16_t bf16
 * widened exactly, on 8 bytes for the vector path's loads of 4) */
template <class I, class O, class P, bool RES, bool RMS>
static int ln_fwd_any(cudaStream_t s, I *resid, void *out, float *mean, float *rstd,
                      const I *inp, const I *b2, const P *w, const P *b,
                      float eps, int N, int C)
{
    if (N == 0) return 0;
    int V = ln_fwd_groups(C);
    if (V && C % 4 == 0 && ln_al(w, sizeof(P)) && ln_al(RMS ? NULL : b, sizeof(P)) &&
        ln_al(inp, sizeof(I)) && ln_al(b2, sizeof(I)) && ln_al(resid, sizeof(I)) &&
        ln_al(out, sizeof(O))) {
        switch (V) {
        case 2: return ln_fwd_launch<2, I, O, P, RES, RMS>(s, resid, out, mean, rstd, inp, b2, w, b, eps, N, C);
        case 4: return ln_fwd_launch<4, I, O, P, RES, RMS>(s, resid, out, mean, rstd, inp, b2, w, b, eps, N, C);
        case 6: return ln_fwd_launch<6, I, O, P, RES, RMS>(s, resid, out, mean, rstd, inp, b2, w, b, eps, N, C);
        case 8: return ln_fwd_launch<8, I, O, P, RES, RMS>(s, resid, out, mean, rstd, inp, b2, w, b, eps, N, C);
        case 12: return ln_fwd_launch<12, I, O, P, RES, RMS>(s, resid, out, mean, rstd, inp, b2, w, b, eps, N, C);
        default: return ln_fwd_launch<16, I, O, P, RES, RMS>(s, resid, out, mean, rstd, inp, b2, w, b, eps, N, C);
        }
    }
    unsigned g = (unsigned)((N + LN_WARPS - 1) / LN_WARPS);
    if (RES) k_ln_res_fwd<I, O, P><<<g, 32 * LN_WARPS, 0, s>>>(resid, (O *)out, mean, rstd, inp, b2, w, b, N, C);
    else k_ln_fwd<I, O, P, RMS><<<g, 32 * LN_WARPS, 0, s>>>((O *)out, mean, rstd, inp, w, b, eps, N, C);
    return ZKC_LAUNCHED();
}
/* ln_fwd_any with the parameters' type picked by p16 (kernels.cuh) */
template <class I, class O, bool RES, bool RMS>
static int ln_fwd_p(cudaStream_t s, I *resid, void *out, float *mean, float *rstd,
                    const I *inp, const I *b2, const void *w, const void *b, int p16,
                    float eps, int N, int C)
{
    if (p16)
        return ln_fwd_any<I, O, uint16_t, RES, RMS>(s, resid, out, mean, rstd, inp, b2, (const uint16_t *)w,
                                                    (const uint16_t *)b, eps, N, C);
    return ln_fwd_any<I, O, float, RES, RMS>(s, resid, out, mean, rstd, inp, b2, (const float *)w,
                                             (const float *)b, eps, N, C);
}

extern "C" int zkc_layernorm_forward(cudaStream_t s, void *out, int out16, float *mean,
                                     float *rstd, const float *inp, const void *w,
                                     const void *b, int p16, int N, int C)
{
    if (out16) return ln_fwd_p<float, uint16_t, false, false>(s, NULL, out, mean, rstd, inp, NULL, w, b, p16, 1e-5f, N, C);
    return ln_fwd_p<float, float, false, false>(s, NULL, out, mean, rstd, inp, NULL, w, b, p16, 1e-5f, N, C);
}

extern "C" int zkc_layernorm_residual_forward(cudaStream_t s, float *resid, void *out, int out16,
                                              float *mean, float *rstd, const float *a,
                                              const float *b2, const void *w, const void *b,
                                              int p16, int N, int C)
{
    if (out16) return ln_fwd_p<float, uint16_t, true, false>(s, resid, out, mean, rstd, a, b2, w, b, p16, 1e-5f, N, C);
    return ln_fwd_p<float, float, true, false>(s, resid, out, mean, rstd, a, b2, w, b, p16, 1e-5f, N, C);
}

extern "C" int zkc_rmsnorm_forward(cudaStream_t s, void *out, int out16, float *rstd,
                                   const float *inp, const void *w, int p16, float eps, int N,
                                   int C)
{
    if (out16) return ln_fwd_p<float, uint16_t, false, true>(s, NULL, out, NULL, rstd, inp, NULL, w, NULL, p16, eps, N, C);
    return ln_fwd_p<float, float, false, true>(s, NULL, out, NULL, rstd, inp, NULL, w, NULL, p16, eps, N, C);
}

extern "C" int zkc_layernorm_forward_r16(cudaStream_t s, uint16_t *out, float *mean, float *rstd,
                                         const uint16_t *inp, const void *w, const void *b,
                                         int p16, int N, int C)
{
    return ln_fwd_p<uint16_t, uint16_t, false, false>(s, NULL, out, mean, rstd, inp, NULL, w, b, p16, 1e-5f, N, C);
}

extern "C" int zkc_layernorm_residual_forward_r16(cudaStream_t s, uint16_t *resid, uint16_t *out,
                                                  float *mean, float *rstd, const uint16_t *a,
                                                  const uint16_t *b2, const void *w,
                                                  const void *b, int p16, int N, int C)
{
    return ln_fwd_p<uint16_t, uint16_t, true, false>(s, resid, out, mean, rstd, a, b2, w, b, p16, 1e-5f, N, C);
}

extern "C" int zkc_rmsnorm_forward_r16(cudaStream_t s, uint16_t *out, float *rstd,
                                       const uint16_t *inp, const void *w, int p16, float eps,
                                       int N, int C)
{
    return ln_fwd_p<uint16_t, uint16_t, false, true>(s, NULL, out, NULL, rstd, inp, NULL, w, NULL, p16, eps, N, C);
}

/* the vector backward: V float4 groups a thread, threads a block (a
 * multiple of 32, at most LN_BWD_MAX); V 0: the scalar path */
static int ln_bwd_shape(int C, int *threads)
{
    int C4 = C / 4;
    for (int V = 1; V <= 2; V++) {
        int t = (C4 + V - 1) / V;
        if (t <= LN_BWD_MAX) { *threads = (t + 31) / 32 * 32; return V; }
    }
    return 0;
}

/* dinp (dinp16) and the weights' partials into scratch (weights), then dw
 * (db unless RMS) from them, fp32 or (g16) bf16; I: inp's, dout's and
 * dinp's type, P: w's (as the forward's) */
template <class I, class P, bool RMS>
static int ln_bwd_any(cudaStream_t s, I *dinp, uint16_t *dinp16, void *dw, void *db, int g16,
                      const I *dout, const I *inp, const P *w, const float *mean,
                      const float *rstd, int N, int C, double *scratch)
{
    if (N == 0) return 0;
    int weights = dw && (RMS || db), R = zkc_ln_rows(N), nk = (N + R - 1) / R, threads = 0, e;
    int V = ln_bwd_shape(C, &threads);
    if (!dinp && !weights) return 0;
    if (V && C % 4 == 0 && ln_al(w, sizeof(P)) && ln_al(dout, sizeof(I)) &&
        ln_al(dinp, sizeof(I)) && ln_al(inp, sizeof(I)) && ln_al(dinp16, 2)) {
        unsigned g = (unsigned)nk;
        double *part = weights ? scratch : NULL;
        if (V == 1) k_ln_bwd_v<1, I, P, RMS><<<g, threads, 0, s>>>(dinp, dinp16, part, dout, inp, w, mean, rstd, N, C, R);
        else k_ln_bwd_v<2, I, P, RMS><<<g, threads, 0, s>>>(dinp, dinp16, part, dout, inp, w, mean, rstd, N, C, R);
        e = ZKC_LAUNCHED();
    } else {
        if (dinp) {
            unsigned g = (unsigned)((N + LN_WARPS - 1) / LN_WARPS);
            k_ln_bwd_dinp<I, P, RMS><<<g, 32 * LN_WARPS, 0, s>>>(dinp, dinp16, dout, inp, w, mean, rstd, N, C);
            if ((e = ZKC_LAUNCHED())) return e;
        }
        if (!weights) return 0;
        dim3 g((unsigned)((C + 127) / 128), (unsigned)nk);
        k_ln_bwd_w_part<I, RMS><<<g, 128, 0, s>>>(scratch, dout, inp, mean, rstd, N, C, R);
        e = ZKC_LAUNCHED();
    }
    if (e || !weights) return e;
    unsigned gs = (unsigned)((C + 31) / 32);
    if (g16) k_ln_bwd_w_sum<uint16_t><<<gs, 32 * LN_SUM_WARPS, 0, s>>>((uint16_t *)dw, RMS ? NULL : (uint16_t *)db, scratch, nk, C);
    else k_ln_bwd_w_sum<float><<<gs, 32 * LN_SUM_WARPS, 0, s>>>((float *)dw, RMS ? NULL : (float *)db, scratch, nk, C);
    return ZKC_LAUNCHED();
}
/* ln_bwd_any with w's type picked by p16 */
template <class I, bool RMS>
static int ln_bwd_p(cudaStream_t s, I *dinp, uint16_t *dinp16, void *dw, void *db, int g16,
                    const I *dout, const I *inp, const void *w, int p16, const float *mean,
                    const float *rstd, int N, int C, double *scratch)
{
    if (p16)
        return ln_bwd_any<I, uint16_t, RMS>(s, dinp, dinp16, dw, db, g16, dout, inp, (const uint16_t *)w,
                                            mean, rstd, N, C, scratch);
    return ln_bwd_any<I, float, RMS>(s, dinp, dinp16, dw, db, g16, dout, inp, (const float *)w, mean,
                                     rstd, N, C, scratch);
}

extern "C" int zkc_layernorm_backward(cudaStream_t s, float *dinp, uint16_t *dinp16, void *dw,
                                      void *db, int g16, const float *dout, const float *inp,
                                      const void *w, int p16, const float *mean, const float *rstd,
                                      int N, int C, double *scratch)
{
    return ln_bwd_p<float, false>(s, dinp, dinp16, dw, db, g16, dout, inp, w, p16, mean, rstd, N, C,
                                  scratch);
}

extern "C" int zkc_rmsnorm_backward(cudaStream_t s, float *dinp, uint16_t *dinp16, void *dw, int g16,
                                    const float *dout, const float *inp, const void *w, int p16,
                                    const float *rstd, int N, int C, double *scratch)
{
    return ln_bwd_p<float, true>(s, dinp, dinp16, dw, NULL, g16, dout, inp, w, p16, NULL, rstd, N, C,
                                 scratch);
}

extern "C" int zkc_layernorm_backward_r16(cudaStream_t s, uint16_t *dinp, void *dw, void *db,
                                          int g16, const uint16_t *dout, const uint16_t *inp,
                                          const void *w, int p16, const float *mean,
                                          const float *rstd, int N, int C, double *scratch)
{
    return ln_bwd_p<uint16_t, false>(s, dinp, NULL, dw, db, g16, dout, inp, w, p16, mean, rstd, N, C,
                                     scratch);
}

extern "C" int zkc_rmsnorm_backward_r16(cudaStream_t s, uint16_t *dinp, void *dw, int g16,
                                        const uint16_t *dout, const uint16_t *inp, const void *w,
                                        int p16, const float *rstd, int N, int C,
                                        double *scratch)
{
    return ln_bwd_p<uint16_t, true>(s, dinp, NULL, dw, NULL, g16, dout, inp, w, p16, NULL, rstd, N, C,
                                    scratch);
}

extern "C" size_t zkc_rmsnorm_scratch(int N, int C)
{
    return zkc_layernorm_scratch(N, C) / 2;
}
