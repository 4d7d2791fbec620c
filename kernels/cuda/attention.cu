/* attention.cu -- causal multi-head self-attention (kernels.cuh).
 *
 * A first, plain version: one warp per (b, head, row), online softmax over
 * the keys (no (T,T) buffer anywhere), each score a warp-reduced dot
 * product. Backward in three passes with one owner per output row, so no
 * atomics and the same bits run to run: D = rowsum(dout * out), then dq per
 * query row, then dk and dv per key row. Decode (KV cache) runs the
 * forward's row arithmetic over cache rows. Correct and deterministic, not
 * fast: a tiled, tensor-core kernel (FlashAttention style) replaces it.
 * Forward and backward are templates on the element (IO) of qkv, out,
 * dqkv and the backward's dout: float, or uint16_t bf16 bits (io16: every
 * element read widened exactly by zkc_get, every output the fp32 value
 * rounded once by zkc_put), so a bf16 call is the f32 kernel's arithmetic
 * on the widened inputs, then one rounding: round(f32 kernel(widen(x)))
 * bit for bit. lse and the D scratch stay fp32; decode is fp32 only.
 *
 * Grouped-query heads and a sliding window (zk_attention_*_gqa's
 * contract): qkv rows of R = C + 2 NKV hs, q (NH heads) | k (NKV) | v (NKV),
 * query head h reading kv head h / G, G = NH / NKV; window W > 0: query i
 * sees keys (i - W, i], the loops simply start at the window's first key.
 * dk and dv of a kv head: one warp per (b, kv head, key row), its query
 * heads ascending, queries ascending inside each -- one owner, one order.
 * NKV = NH, W = 0 runs exactly the loops (and bits) of before. */
#include "common.cuh"

#define HS_MAX 256             /* head size limit: 8 values per lane */
#define PER (HS_MAX / 32)
#define AW 4                   /* warps (rows) per block */

struct rowp { int B, T, C, NH, hs, NKV, G, W; size_t R; float scale; };

/* row t of batch b: query head h's q (which 0), kv head h's k (1) or v (2);
 * for NKV = NH offsets h hs, C + h hs, 2C + h hs of a 3C row */
template <class IO>
__device__ __forceinline__ IO *qkv_at(IO *qkv, rowp a, int b, int t, int h, int which)
{
    size_t o = which == 0 ? 0 : (size_t)a.C + (size_t)(which - 1) * a.NKV * a.hs;
    return qkv + ((size_t)b * a.T + t) * a.R + o + (size_t)h * a.hs;
}

/* the first key query position p sees: 0, or p - W + 1 in a window */
__device__ __forceinline__ int key_lo(rowp a, int p) { return a.W > 0 && p - a.W + 1 > 0 ? p - a.W + 1 : 0; }

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
    const int g = h / a.G;
    float qr[PER], acc[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) { int d = lane + 32 * k; qr[k] = d < a.hs ? zkc_get(q + d) : 0.0f; acc[k] = 0.0f; }
    float m = -INFINITY, l = 0.0f;
    for (int j = key_lo(a, i); j <= i; j++) {
        float s = dot_lane(qr, qkv_at(qkv, a, b, j, g, 1), a.hs, lane) * a.scale;
        float mn = fmaxf(m, s), c = expf(m - mn), p = expf(s - mn);
        const IO *v = qkv_at(qkv, a, b, j, g, 2);
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

/* Decode with a KV cache (zk_attention_decode_gqa's layout): cache row p
 * of (b, kv head g) at ((b*NKV + g)*maxT + p)*hs. First the T new rows' k and v go into
 * the cache, then each new query row i runs k_attn_fwd's arithmetic over
 * cache rows [0, pos+i]: the same dot products, online-softmax updates and
 * order, so a row's output has the bits of the GPU's full forward row. */
__global__ static void k_cache_put(float *kc, float *vc, const float *qkv, rowp a,
                                   int maxT, int pos)
{
    size_t n = (size_t)a.B * a.NKV * a.T * a.hs;
    ZKC_FOR(x, n) {
        int d = (int)(x % a.hs);
        size_t r = x / a.hs;
        int t = (int)(r % a.T), h = (int)((r / a.T) % a.NKV), b = (int)(r / ((size_t)a.T * a.NKV));
        size_t dst = (((size_t)b * a.NKV + h) * maxT + pos + t) * a.hs + d;
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
    const size_t base = ((size_t)b * a.NKV + h / a.G) * maxT * a.hs;
    float qr[PER], acc[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) { int d = lane + 32 * k; qr[k] = d < a.hs ? q[d] : 0.0f; acc[k] = 0.0f; }
    float m = -INFINITY, l = 0.0f;
    for (int j = key_lo(a, pos + i); j <= pos + i; j++) {
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
__global__ static void k_attn_D(float *D, const IO *dout, const IO *out, rowp a)
{
    int row = blockIdx.x * AW + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= a.B * a.NH * a.T) return;
    int i = row % a.T, h = (row / a.T) % a.NH, b = row / (a.T * a.NH);
    size_t off = ((size_t)b * a.T + i) * a.C + (size_t)h * a.hs;
    float s = 0.0f;
    for (int d = lane; d < a.hs; d += 32) s += zkc_get(dout + (off + d)) * zkc_get(out + (off + d));
    s = zkc_warp_sum(s);
    if (lane == 0) D[row] = s;
}

/* dq_i = scale * sum_{j<=i} p_ij (dout_i . v_j - D_i) k_j */
template <class IO>
__global__ static void k_attn_dq(IO *dqkv, const IO *dout, const IO *qkv,
                                 const float *lse, const float *D, rowp a)
{
    int row = blockIdx.x * AW + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= a.B * a.NH * a.T) return;
    int i = row % a.T, h = (row / a.T) % a.NH, b = row / (a.T * a.NH);
    const IO *q = qkv_at(qkv, a, b, i, h, 0);
    const IO *go = dout + ((size_t)b * a.T + i) * a.C + (size_t)h * a.hs;
    float qr[PER], gr[PER], acc[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) {
        int d = lane + 32 * k;
        qr[k] = d < a.hs ? zkc_get(q + d) : 0.0f; gr[k] = d < a.hs ? zkc_get(go + d) : 0.0f; acc[k] = 0.0f;
    }
    float L = lse[row], Di = D[row];
    const int g = h / a.G;
    for (int j = key_lo(a, i); j <= i; j++) {
        const IO *kj = qkv_at(qkv, a, b, j, g, 1), *vj = qkv_at(qkv, a, b, j, g, 2);
        float p = expf(dot_lane(qr, kj, a.hs, lane) * a.scale - L);
        float ds = p * (dot_lane(gr, vj, a.hs, lane) - Di) * a.scale;
#pragma unroll
        for (int k = 0; k < PER; k++) { int d = lane + 32 * k; if (d < a.hs) acc[k] += ds * zkc_get(kj + d); }
    }
    IO *dq = qkv_at(dqkv, a, b, i, h, 0);
#pragma unroll
    for (int k = 0; k < PER; k++) { int d = lane + 32 * k; if (d < a.hs) zkc_put(dq + d, acc[k]); }
}

/* dv_j = sum_{i>=j} p_ij dout_i;  dk_j = scale * sum_{i>=j} p_ij (dout_i . v_j - D_i) q_i,
 * row = (b, kv head g, key j): over g's query heads ascending, i ascending
 * inside each (i < j + W in a window) */
template <class IO>
__global__ static void k_attn_dkv(IO *dqkv, const IO *dout, const IO *qkv,
                                  const float *lse, const float *D, rowp a)
{
    int row = blockIdx.x * AW + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= a.B * a.NKV * a.T) return;
    int j = row % a.T, g = (row / a.T) % a.NKV, b = row / (a.T * a.NKV);
    const IO *kp = qkv_at(qkv, a, b, j, g, 1), *vp = qkv_at(qkv, a, b, j, g, 2);
    float kr[PER], vr[PER], dk[PER], dv[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) {
        int d = lane + 32 * k;
        kr[k] = d < a.hs ? zkc_get(kp + d) : 0.0f; vr[k] = d < a.hs ? zkc_get(vp + d) : 0.0f;
        dk[k] = dv[k] = 0.0f;
    }
    const int iend = a.W > 0 && a.W < a.T - j ? j + a.W : a.T;   /* no j + W overflow */
    for (int h = g * a.G; h < (g + 1) * a.G; h++) {
        size_t rbase = (size_t)(b * a.NH + h) * a.T;
        for (int i = j; i < iend; i++) {
            const IO *qi = qkv_at(qkv, a, b, i, h, 0);
            const IO *gi = dout + ((size_t)b * a.T + i) * a.C + (size_t)h * a.hs;
            float p = expf(dot_lane(kr, qi, a.hs, lane) * a.scale - lse[rbase + i]);
            float ds = p * (dot_lane(vr, gi, a.hs, lane) - D[rbase + i]) * a.scale;
#pragma unroll
            for (int k = 0; k < PER; k++) {
                int d = lane + 32 * k;
                if (d < a.hs) { dv[k] += p * zkc_get(gi + d); dk[k] += ds * zkc_get(qi + d); }
            }
        }
    }
    IO *ok = qkv_at(dqkv, a, b, j, g, 1), *ov = qkv_at(dqkv, a, b, j, g, 2);
#pragma unroll
    for (int k = 0; k < PER; k++) {
        int d = lane + 32 * k;
        if (d < a.hs) { zkc_put(ok + d, dk[k]); zkc_put(ov + d, dv[k]); }
    }
}

static rowp params(int B, int T, int C, int NH, int NKV, int W)
{
    rowp a;
    a.B = B; a.T = T; a.C = C; a.NH = NH; a.hs = C / NH;
    a.NKV = NKV > 0 ? NKV : 1; a.G = NH / a.NKV; a.W = W;
    a.R = (size_t)C + 2 * (size_t)a.NKV * a.hs;
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
static int bwd(cudaStream_t s, IO *dqkv, const IO *dout, const IO *qkv, const IO *out,
               const float *lse, rowp a, size_t rows, float *scratch)
{
    unsigned g = (unsigned)((rows + AW - 1) / AW);
    k_attn_D<IO><<<g, 32 * AW, 0, s>>>(scratch, dout, out, a);
    int e = ZKC_LAUNCHED(); if (e) return e;
    k_attn_dq<IO><<<g, 32 * AW, 0, s>>>(dqkv, dout, qkv, lse, scratch, a);
    e = ZKC_LAUNCHED(); if (e) return e;
    unsigned gk = (unsigned)(((size_t)a.B * a.NKV * a.T + AW - 1) / AW);
    k_attn_dkv<IO><<<gk, 32 * AW, 0, s>>>(dqkv, dout, qkv, lse, scratch, a);
    return ZKC_LAUNCHED();
}

/* NH % NKV == 0 and W >= 0 (the runtime checks; else cudaErrorInvalidValue) */
static int bad(rowp a, int NKV) { return a.hs > HS_MAX || NKV < 1 || a.NH % NKV != 0 || a.W < 0; }

extern "C" int zkc_attention_forward_gqa(cudaStream_t s, void *out, float *lse, const void *qkv,
                                         int io16, int B, int T, int C, int NH, int NKV, int W)
{
    rowp a = params(B, T, C, NH, NKV, W);
    if (bad(a, NKV)) return (int)cudaErrorInvalidValue;
    size_t rows = (size_t)B * NH * T;
    if (rows == 0) return 0;
    return io16 ? fwd(s, (uint16_t *)out, lse, (const uint16_t *)qkv, a, rows)
                : fwd(s, (float *)out, lse, (const float *)qkv, a, rows);
}

extern "C" int zkc_attention_backward_gqa(cudaStream_t s, void *dqkv, const void *dout,
                                          const void *qkv, const void *out, const float *lse,
                                          int io16, int B, int T, int C, int NH, int NKV, int W,
                                          float *scratch)
{
    rowp a = params(B, T, C, NH, NKV, W);
    if (bad(a, NKV)) return (int)cudaErrorInvalidValue;
    size_t rows = (size_t)B * NH * T;
    if (rows == 0) return 0;
    return io16 ? bwd(s, (uint16_t *)dqkv, (const uint16_t *)dout, (const uint16_t *)qkv,
                      (const uint16_t *)out, lse, a, rows, scratch)
                : bwd(s, (float *)dqkv, (const float *)dout, (const float *)qkv,
                      (const float *)out, lse, a, rows, scratch);
}

extern "C" int zkc_attention_decode_gqa(cudaStream_t s, float *out, float *kcache, float *vcache,
                                        const float *qkv, int B, int T, int C, int NH, int NKV,
                                        int W, int maxT, int pos)
{
    rowp a = params(B, T, C, NH, NKV, W);
    if (bad(a, NKV)) return (int)cudaErrorInvalidValue;
    size_t rows = (size_t)B * NH * T;
    if (rows == 0) return 0;
    /* the same stream: every new row is in the cache before a query reads it */
    size_t kvn = (size_t)B * a.NKV * T * a.hs;
    k_cache_put<<<zkc_grid(kvn, 256), 256, 0, s>>>(kcache, vcache, qkv, a, maxT, pos);
    int e = ZKC_LAUNCHED(); if (e) return e;
    unsigned g = (unsigned)((rows + AW - 1) / AW);
    k_attn_decode<<<g, 32 * AW, 0, s>>>(out, kcache, vcache, qkv, a, maxT, pos);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_attention_forward(cudaStream_t s, void *out, float *lse, const void *qkv,
                                     int io16, int B, int T, int C, int NH)
{
    return zkc_attention_forward_gqa(s, out, lse, qkv, io16, B, T, C, NH, NH, 0);
}

extern "C" int zkc_attention_backward(cudaStream_t s, void *dqkv, const void *dout,
                                      const void *qkv, const void *out, const float *lse,
                                      int io16, int B, int T, int C, int NH, float *scratch)
{
    return zkc_attention_backward_gqa(s, dqkv, dout, qkv, out, lse, io16, B, T, C, NH, NH, 0,
                                      scratch);
}

extern "C" int zkc_attention_decode(cudaStream_t s, float *out, float *kcache, float *vcache,
                                    const float *qkv, int B, int T, int C, int NH, int maxT,
                                    int pos)
{
    return zkc_attention_decode_gqa(s, out, kcache, vcache, qkv, B, T, C, NH, NH, 0, maxT, pos);
}
