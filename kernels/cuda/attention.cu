/* attention.cu -- causal multi-head self-attention (kernels.cuh).
 *
 * A first, plain version: one warp per (b, head, row), online softmax over
 * the keys (no (T,T) buffer anywhere), each score a warp-reduced dot
 * product. Backward in three passes with one owner per output row, so no
 * atomics and the same bits run to run: D = rowsum(dout * out), then dq per
 * query row, then dk and dv per key row. Decode (KV cache) runs the
 * forward's row arithmetic over cache rows. Correct and deterministic, not
 * fast: a tiled, tensor-core kernel (FlashAttention style) replaces it.
 * Forward and backward are templates on qkv's, out's and dqkv's element
 * (IO): float, or uint16_t bf16 bits (io16: every element read widened
 * exactly by zkc_get, every output the fp32 value rounded once by zkc_put),
 * so a bf16 call is the f32 kernel's arithmetic on the widened inputs,
 * then one rounding: round(f32 kernel(widen(x))) bit for bit. lse, dout
 * and the D scratch stay fp32; decode is fp32 only. */
#include "common.cuh"

#define HS_MAX 256             /* head size limit: 8 values per lane */
#define PER (HS_MAX / 32)
#define AW 4                   /* warps (rows) per block */

struct rowp { int B, T, C, NH, hs; float scale; };

/* row i of head h of batch b: q, k, v at offsets 0, C, 2C of qkv's (3C) row */
template <class IO>
__device__ __forceinline__ const IO *qkv_at(const IO *qkv, rowp a, int b, int t, int h, int which)
{
    return qkv + ((size_t)b * a.T + t) * 3 * a.C + (size_t)which * a.C + (size_t)h * a.hs;
}

template <class IO>
__device__ __forceinline__ float dot_lane(const float *r, const IO *x, int hs, int lane)
{
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < PER; k++) { int d = lane + 32 * k; if (d < hs) s += r[k] * zkc_get(x + d); }
    return zkc_warp_sum(s);
}

template <class IO>
__global__ static void k_attn_fwd(IO *out, float *lse, const IO *qkv, rowp a)
{
    int row = blockIdx.x * AW + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= a.B * a.NH * a.T) return;
    int i = row % a.T, h = (row / a.T) % a.NH, b = row / (a.T * a.NH);
    const IO *q = qkv_at(qkv, a, b, i, h, 0);
    float qr[PER], acc[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) { int d = lane + 32 * k; qr[k] = d < a.hs ? zkc_get(q + d) : 0.0f; acc[k] = 0.0f; }
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j <= i; j++) {
        float s = dot_lane(qr, qkv_at(qkv, a, b, j, h, 1), a.hs, lane) * a.scale;
        float mn = fmaxf(m, s), c = expf(m - mn), p = expf(s - mn);
        const IO *v = qkv_at(qkv, a, b, j, h, 2);
        l = l * c + p;
#pragma unroll
        for (int k = 0; k < PER; k++) { int d = lane + 32 * k; if (d < a.hs) acc[k] = acc[k] * c + p * zkc_get(v + d); }
        m = mn;
    }
    IO *o = out + ((size_t)b * a.T + i) * a.C + (size_t)h * a.hs;
#pragma unroll
    for (int k = 0; k < PER; k++) { int d = lane + 32 * k; if (d < a.hs) zkc_put(o + d, acc[k] / l); }
    if (lane == 0) lse[row] = m + logf(l);      /* row = (b*NH + h)*T + i: lse's (B,NH,T) */
}

/* Decode with a KV cache (zk_attention_decode's layout): cache row p of
 * (b, h) at ((b*NH + h)*maxT + p)*hs. First the T new rows' k and v go into
 * the cache, then each new query row i runs k_attn_fwd's arithmetic over
 * cache rows [0, pos+i]: the same dot products, online-softmax updates and
 * order, so a row's output has the bits of the GPU's full forward row. */
__global__ static void k_cache_put(float *kc, float *vc, const float *qkv, rowp a,
                                   int maxT, int pos)
{
    size_t n = (size_t)a.B * a.NH * a.T * a.hs;
    ZKC_FOR(x, n) {
        int d = (int)(x % a.hs);
        size_t r = x / a.hs;
        int t = (int)(r % a.T), h = (int)((r / a.T) % a.NH), b = (int)(r / ((size_t)a.T * a.NH));
        size_t dst = (((size_t)b * a.NH + h) * maxT + pos + t) * a.hs + d;
        kc[dst] = qkv_at(qkv, a, b, t, h, 1)[d];
        vc[dst] = qkv_at(qkv, a, b, t, h, 2)[d];
    }
}

__global__ static void k_attn_decode(float *out, const float *kc, const float *vc,
                                     const float *qkv, rowp a, int maxT, int pos)
{
    int row = blockIdx.x * AW + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= a.B * a.NH * a.T) return;
    int i = row % a.T, h = (row / a.T) % a.NH, b = row / (a.T * a.NH);
    const float *q = qkv_at(qkv, a, b, i, h, 0);
    const size_t base = ((size_t)b * a.NH + h) * maxT * a.hs;
    float qr[PER], acc[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) { int d = lane + 32 * k; qr[k] = d < a.hs ? q[d] : 0.0f; acc[k] = 0.0f; }
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j <= pos + i; j++) {
        float s = dot_lane(qr, kc + base + (size_t)j * a.hs, a.hs, lane) * a.scale;
        float mn = fmaxf(m, s), c = expf(m - mn), p = expf(s - mn);
        const float *v = vc + base + (size_t)j * a.hs;
        l = l * c + p;
#pragma unroll
        for (int k = 0; k < PER; k++) { int d = lane + 32 * k; if (d < a.hs) acc[k] = acc[k] * c + p * v[d]; }
        m = mn;
    }
    float *o = out + ((size_t)b * a.T + i) * a.C + (size_t)h * a.hs;
#pragma unroll
    for (int k = 0; k < PER; k++) { int d = lane + 32 * k; if (d < a.hs) o[d] = acc[k] / l; }
}

/* D[b,h,i] = sum over the head's d of dout * out */
template <class IO>
__global__ static void k_attn_D(float *D, const float *dout, const IO *out, rowp a)
{
    int row = blockIdx.x * AW + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= a.B * a.NH * a.T) return;
    int i = row % a.T, h = (row / a.T) % a.NH, b = row / (a.T * a.NH);
    size_t off = ((size_t)b * a.T + i) * a.C + (size_t)h * a.hs;
    float s = 0.0f;
    for (int d = lane; d < a.hs; d += 32) s += dout[off + d] * zkc_get(out + (off + d));
    s = zkc_warp_sum(s);
    if (lane == 0) D[row] = s;
}

/* dq_i = scale * sum_{j<=i} p_ij (dout_i . v_j - D_i) k_j */
template <class IO>
__global__ static void k_attn_dq(IO *dqkv, const float *dout, const IO *qkv,
                                 const float *lse, const float *D, rowp a)
{
    int row = blockIdx.x * AW + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= a.B * a.NH * a.T) return;
    int i = row % a.T, h = (row / a.T) % a.NH, b = row / (a.T * a.NH);
    const IO *q = qkv_at(qkv, a, b, i, h, 0);
    const float *go = dout + ((size_t)b * a.T + i) * a.C + (size_t)h * a.hs;
    float qr[PER], gr[PER], acc[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) {
        int d = lane + 32 * k;
        qr[k] = d < a.hs ? zkc_get(q + d) : 0.0f; gr[k] = d < a.hs ? go[d] : 0.0f; acc[k] = 0.0f;
    }
    float L = lse[row], Di = D[row];
    for (int j = 0; j <= i; j++) {
        const IO *kj = qkv_at(qkv, a, b, j, h, 1), *vj = qkv_at(qkv, a, b, j, h, 2);
        float p = expf(dot_lane(qr, kj, a.hs, lane) * a.scale - L);
        float ds = p * (dot_lane(gr, vj, a.hs, lane) - Di) * a.scale;
#pragma unroll
        for (int k = 0; k < PER; k++) { int d = lane + 32 * k; if (d < a.hs) acc[k] += ds * zkc_get(kj + d); }
    }
    IO *dq = dqkv + ((size_t)b * a.T + i) * 3 * a.C + (size_t)h * a.hs;
#pragma unroll
    for (int k = 0; k < PER; k++) { int d = lane + 32 * k; if (d < a.hs) zkc_put(dq + d, acc[k]); }
}

/* dv_j = sum_{i>=j} p_ij dout_i;  dk_j = scale * sum_{i>=j} p_ij (dout_i . v_j - D_i) q_i */
template <class IO>
__global__ static void k_attn_dkv(IO *dqkv, const float *dout, const IO *qkv,
                                  const float *lse, const float *D, rowp a)
{
    int row = blockIdx.x * AW + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= a.B * a.NH * a.T) return;
    int j = row % a.T, h = (row / a.T) % a.NH, b = row / (a.T * a.NH);
    const IO *kp = qkv_at(qkv, a, b, j, h, 1), *vp = qkv_at(qkv, a, b, j, h, 2);
    float kr[PER], vr[PER], dk[PER], dv[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) {
        int d = lane + 32 * k;
        kr[k] = d < a.hs ? zkc_get(kp + d) : 0.0f; vr[k] = d < a.hs ? zkc_get(vp + d) : 0.0f;
        dk[k] = dv[k] = 0.0f;
    }
    size_t rbase = (size_t)(b * a.NH + h) * a.T;
    for (int i = j; i < a.T; i++) {
        const IO *qi = qkv_at(qkv, a, b, i, h, 0);
        const float *gi = dout + ((size_t)b * a.T + i) * a.C + (size_t)h * a.hs;
        float p = expf(dot_lane(kr, qi, a.hs, lane) * a.scale - lse[rbase + i]);
        float ds = p * (dot_lane(vr, gi, a.hs, lane) - D[rbase + i]) * a.scale;
#pragma unroll
        for (int k = 0; k < PER; k++) {
            int d = lane + 32 * k;
            if (d < a.hs) { dv[k] += p * gi[d]; dk[k] += ds * zkc_get(qi + d); }
        }
    }
    IO *o = dqkv + ((size_t)b * a.T + j) * 3 * a.C + (size_t)h * a.hs;
#pragma unroll
    for (int k = 0; k < PER; k++) {
        int d = lane + 32 * k;
        if (d < a.hs) { zkc_put(o + (a.C + d), dk[k]); zkc_put(o + (2 * a.C + d), dv[k]); }
    }
}

static rowp params(int B, int T, int C, int NH)
{
    rowp a;
    a.B = B; a.T = T; a.C = C; a.NH = NH; a.hs = C / NH;
    a.scale = 1.0f / sqrtf((float)a.hs);
    return a;
}

template <class IO>
static int fwd(cudaStream_t s, IO *out, float *lse, const IO *qkv, rowp a, size_t rows)
{
    k_attn_fwd<IO><<<(unsigned)((rows + AW - 1) / AW), 32 * AW, 0, s>>>(out, lse, qkv, a);
    return ZKC_LAUNCHED();
}

template <class IO>
static int bwd(cudaStream_t s, IO *dqkv, const float *dout, const IO *qkv, const IO *out,
               const float *lse, rowp a, size_t rows, float *scratch)
{
    unsigned g = (unsigned)((rows + AW - 1) / AW);
    k_attn_D<IO><<<g, 32 * AW, 0, s>>>(scratch, dout, out, a);
    int e = ZKC_LAUNCHED(); if (e) return e;
    k_attn_dq<IO><<<g, 32 * AW, 0, s>>>(dqkv, dout, qkv, lse, scratch, a);
    e = ZKC_LAUNCHED(); if (e) return e;
    k_attn_dkv<IO><<<g, 32 * AW, 0, s>>>(dqkv, dout, qkv, lse, scratch, a);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_attention_forward(cudaStream_t s, void *out, float *lse, const void *qkv,
                                     int io16, int B, int T, int C, int NH)
{
    rowp a = params(B, T, C, NH);
    if (a.hs > HS_MAX) return (int)cudaErrorInvalidValue;
    size_t rows = (size_t)B * NH * T;
    if (rows == 0) return 0;
    return io16 ? fwd(s, (uint16_t *)out, lse, (const uint16_t *)qkv, a, rows)
                : fwd(s, (float *)out, lse, (const float *)qkv, a, rows);
}

extern "C" int zkc_attention_backward(cudaStream_t s, void *dqkv, const float *dout,
                                      const void *qkv, const void *out, const float *lse,
                                      int io16, int B, int T, int C, int NH, float *scratch)
{
    rowp a = params(B, T, C, NH);
    if (a.hs > HS_MAX) return (int)cudaErrorInvalidValue;
    size_t rows = (size_t)B * NH * T;
    if (rows == 0) return 0;
    return io16 ? bwd(s, (uint16_t *)dqkv, dout, (const uint16_t *)qkv, (const uint16_t *)out,
                      lse, a, rows, scratch)
                : bwd(s, (float *)dqkv, dout, (const float *)qkv, (const float *)out, lse, a,
                      rows, scratch);
}

extern "C" int zkc_attention_decode(cudaStream_t s, float *out, float *kcache, float *vcache,
                                    const float *qkv, int B, int T, int C, int NH, int maxT,
                                    int pos)
{
    rowp a = params(B, T, C, NH);
    if (a.hs > HS_MAX) return (int)cudaErrorInvalidValue;
    size_t rows = (size_t)B * NH * T;
    if (rows == 0) return 0;
    /* the same stream: every new row is in the cache before a query reads it */
    k_cache_put<<<zkc_grid(rows * a.hs, 256), 256, 0, s>>>(kcache, vcache, qkv, a, maxT, pos);
    int e = ZKC_LAUNCHED(); if (e) return e;
    k_attn_decode<<<(unsigned)((rows + AW - 1) / AW), 32 * AW, 0, s>>>(out, kcache, vcache, qkv,
                                                                      a, maxT, pos);
    return ZKC_LAUNCHED();
}
