/* xent.cu -- softmax cross-entropy fused with its backward, fp32 or bf16
 * logits in rows ld apart (kernels.cuh). One 512-thread block per row; the
 * row is read twice (before: three times, max then sum then dlogits):
 *  1. online softmax: thread t reads the 16-byte vectors t, t + 512,
 *     t + 1024, ... of columns [0,V) in order, then the tail's columns
 *     V/W*W + t, + 512, ... one by one, keeping a running max m and sum s of
 *     exp(x - m); s is rescaled by exp(m_old - m_new) when m grows (at most
 *     once a vector: its max first). The partition depends on V and the
 *     vector width W only, never on the GPU.
 *  2. a fixed merge: in each warp the max by butterfly, each s rescaled to
 *     it, summed by butterfly (__shfl_xor_sync); then the 16 warps in index
 *     order through shared memory, by every thread alike. So the same bits
 *     run to run and on any GPU (not the CPU's: its double lanes, ~1e-6).
 *  3. dlogits = (softmax - onehot) * dscale: each thread re-reads its own
 *     columns and writes them, bf16 rounded once to nearest even; [V,ld) 0.
 * In place (dlogits == logits) is safe: every read of pass 1 (x[target]
 * too) comes before the barrier of the merge, and in pass 3 a thread reads
 * each element before it writes it. Columns [V,ld) of logits are not read.
 * 512 threads: GPT-2's 50257 columns are 12-13 vectors a thread in bf16
 * (24-25 in fp32), enough to amortise the merge, with a small imbalance
 * from the last vector, and 3-4 blocks on an SM (1024 threads: at most 2,
 * twice the relative imbalance). 16-byte loads and stores when ld is a
 * multiple of W (4 fp32, 8 bf16) and the pointers are 16-byte aligned,
 * chosen at launch; else scalar ones -- another partition, so other bits
 * (within rounding). Two vectors in flight a thread; ptxas (CUDA 13,
 * sm_90): 32-40 registers, no spills. Roofline: N*ld elements read twice
 * and written once, (2+2+2)*N*ld bytes in bf16.
 * Checked on the CPU under spec/emu (sh tools/emu_kernel.sh xent); not yet
 * timed on a GPU. */
#include "common.cuh"

#define XE_T 512                    /* threads a block: one row */
#define XE_WARPS (XE_T / 32)
/* the running max's start, -FLT_MAX: exp(-inf - XE_LOW) = 0, never NaN, so
 * a thread whose columns are all -inf adds 0 and no guard is needed */
#define XE_LOW (-3.402823466e+38f)

struct __align__(16) xe_vec { uint32_t u[4]; };    /* 4 fp32 or 8 bf16 */

__device__ __forceinline__ float xe_f(float v) { return v; }
__device__ __forceinline__ float xe_f(uint16_t v) { return __uint_as_float((uint32_t)v << 16); }


/* a vector's elements widened, in column order, and back */
__device__ __forceinline__ void xe_unpack(const xe_vec &v, float (&f)[4])
{
    for (int k = 0; k < 4; k++) f[k] = __uint_as_float(v.u[k]);
}
__device__ __forceinline__ void xe_unpack(const xe_vec &v, float (&f)[8])
{
    for (int k = 0; k < 4; k++) {
        f[2 * k] = __uint_as_float(v.u[k] << 16);
        f[2 * k + 1] = __uint_as_float(v.u[k] & 0xffff0000u);
    }
}
__device__ __forceinline__ xe_vec xe_pack(const float (&f)[4])
{
    xe_vec v;
    for (int k = 0; k < 4; k++) v.u[k] = __float_as_uint(f[k]);
    return v;
}
__device__ __forceinline__ xe_vec xe_pack(const float (&f)[8])
{
    xe_vec v;
    for (int k = 0; k < 4; k++) v.u[k] = (uint32_t)zkc_bf16(f[2 * k]) | (uint32_t)zkc_bf16(f[2 * k + 1]) << 16;
    return v;
}

/* fold W values into the running (m, s): rescale once to the new max, then
 * the exps summed in order. fmaxf skips a NaN, whose exp then makes s NaN. */
template <int W>
__device__ __forceinline__ void xe_fold(float &m, float &s, const float (&f)[W])
{
    float vm = f[0];
    for (int k = 1; k < W; k++) vm = fmaxf(vm, f[k]);
    if (vm > m) { s *= expf(m - vm); m = vm; }
    float e = 0.0f;
    for (int k = 0; k < W; k++) e += expf(f[k] - m);
    s += e;
}

/* block blockIdx.x does row n. T float or uint16_t (bf16 bits); VEC: 16-byte
 * vectors (ld % W == 0, pointers aligned) */
template <class T, bool VEC>
__device__ __forceinline__ void xe_row(float *losses, T *dlogits, const T *logits,
                                       const int32_t *targets, int V, int ld, float dscale,
                                       int *bad)
{
    constexpr int W = 16 / sizeof(T);
    __shared__ float wm[XE_WARPS], ws[XE_WARPS];
    const int n = blockIdx.x, t = threadIdx.x, lane = t % 32, wid = t / 32;
    const T *x = logits + (size_t)n * ld;                                // (V)
    T *d = dlogits ? dlogits + (size_t)n * ld : NULL;                    // (ld), may be x
    const xe_vec *xv = (const xe_vec *)x;                                // (V/W)
    xe_vec *dv = (xe_vec *)d;                                            // (ld/W)
    const int nv = VEC ? V / W : 0;     /* whole vectors in [0,V); the rest one by one */
    const int tgt = targets[n];
    if (tgt < 0 || tgt >= V) {          /* the whole block alike: no barrier skipped */
        if (t == 0) { losses[n] = 0.0f; if (bad) atomicAdd(bad, 1); }
        if (!d) return;
        if (VEC) {
            xe_vec z;
            for (int k = 0; k < 4; k++) z.u[k] = 0;
            for (int j = t; j < ld / W; j += XE_T) dv[j] = z;
        } else {
            for (int i = t; i < ld; i += XE_T) d[i] = (T)0;
        }
        return;
    }

    /* pass 1: read the row once */
    float m = XE_LOW, s = 0.0f, xt = 0.0f;
    if (t == 0) xt = xe_f(x[tgt]);
    int j = t;
    for (; j + XE_T < nv; j += 2 * XE_T) {
        xe_vec a = xv[j], b = xv[j + XE_T];
        float f[W];
        xe_unpack(a, f);
        xe_fold(m, s, f);
        xe_unpack(b, f);
        xe_fold(m, s, f);
    }
    if (j < nv) {
        float f[W];
        xe_unpack(xv[j], f);
        xe_fold(m, s, f);
    }
    for (int i = nv * W + t; i < V; i += XE_T) {
        float f[1] = { xe_f(x[i]) };
        xe_fold(m, s, f);
    }

    /* the fixed merge: warps by butterfly, then warps 0..15 in order */
    float mw = zkc_warp_max(m);
    float sw = zkc_warp_sum(s * expf(m - mw));
    if (lane == 0) { wm[wid] = mw; ws[wid] = sw; }
    __syncthreads();        /* every read of pass 1 precedes any write of the row */
    float M = wm[0], S = 0.0f;
    for (int w = 1; w < XE_WARPS; w++) M = fmaxf(M, wm[w]);
    for (int w = 0; w < XE_WARPS; w++) S += ws[w] * expf(wm[w] - M);
    if (t == 0) losses[n] = (float)((double)M + log((double)S) - (double)xt);
    if (!d) return;

    /* pass 2: read again, write dlogits (each element by its reader) */
    const float inv = 1.0f / S;
    for (j = t; j + XE_T < nv; j += 2 * XE_T) {
        xe_vec a = xv[j], b = xv[j + XE_T];
        float f[W], g[W];
        xe_unpack(a, f);
        xe_unpack(b, g);
        for (int k = 0; k < W; k++) {
            f[k] = (expf(f[k] - M) * inv - (j * W + k == tgt ? 1.0f : 0.0f)) * dscale;
            g[k] = (expf(g[k] - M) * inv - ((j + XE_T) * W + k == tgt ? 1.0f : 0.0f)) * dscale;
        }
        dv[j] = xe_pack(f);
        dv[j + XE_T] = xe_pack(g);
    }
    if (j < nv) {
        float f[W];
        xe_unpack(xv[j], f);
        for (int k = 0; k < W; k++)
            f[k] = (expf(f[k] - M) * inv - (j * W + k == tgt ? 1.0f : 0.0f)) * dscale;
        dv[j] = xe_pack(f);
    }
    for (int i = nv * W + t; i < V; i += XE_T)
        zkc_put(d + i, (expf(xe_f(x[i]) - M) * inv - (i == tgt ? 1.0f : 0.0f)) * dscale);
    for (int i = V + t; i < ld; i += XE_T) d[i] = (T)0;
}

#define XE_ARGS(T) float *losses, T *dlogits, const T *logits, const int32_t *targets, \
                   int V, int ld, float dscale, int *bad
__global__ static void __launch_bounds__(XE_T) k_xent(XE_ARGS(float))
{ xe_row<float, false>(losses, dlogits, logits, targets, V, ld, dscale, bad); }
__global__ static void __launch_bounds__(XE_T) k_xent_v(XE_ARGS(float))
{ xe_row<float, true>(losses, dlogits, logits, targets, V, ld, dscale, bad); }
__global__ static void __launch_bounds__(XE_T) k_xent_bf16(XE_ARGS(uint16_t))
{ xe_row<uint16_t, false>(losses, dlogits, logits, targets, V, ld, dscale, bad); }
__global__ static void __launch_bounds__(XE_T) k_xent_bf16_v(XE_ARGS(uint16_t))
{ xe_row<uint16_t, true>(losses, dlogits, logits, targets, V, ld, dscale, bad); }

/* 16-byte vectors: rows a whole number of them apart, both bases aligned */
static int xe_vec_ok(const void *logits, const void *dlogits, int ld, int W)
{
    return ld % W == 0 && (uintptr_t)logits % 16 == 0 && (uintptr_t)dlogits % 16 == 0;
}

extern "C" int zkc_crossentropy(cudaStream_t s, float *losses, float *dlogits,
                                const float *logits, const int32_t *targets, int N, int V,
                                int ld, float dscale, int *dbad)
{
    if (N == 0) return 0;
    if (xe_vec_ok(logits, dlogits, ld, 4))
        k_xent_v<<<N, XE_T, 0, s>>>(losses, dlogits, logits, targets, V, ld, dscale, dbad);
    else
        k_xent<<<N, XE_T, 0, s>>>(losses, dlogits, logits, targets, V, ld, dscale, dbad);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_crossentropy_bf16(cudaStream_t s, float *losses, uint16_t *dlogits,
                                     const uint16_t *logits, const int32_t *targets, int N,
                                     int V, int ld, float dscale, int *dbad)
{
    if (N == 0) return 0;
    if (xe_vec_ok(logits, dlogits, ld, 8))
        k_xent_bf16_v<<<N, XE_T, 0, s>>>(losses, dlogits, logits, targets, V, ld, dscale, dbad);
    else
        k_xent_bf16<<<N, XE_T, 0, s>>>(losses, dlogits, logits, targets, V, ld, dscale, dbad);
    return ZKC_LAUNCHED();
}
