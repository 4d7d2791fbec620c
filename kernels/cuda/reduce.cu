/* reduce.cu -- fp64 block partials over kernels/cpu/reduce.c's fixed blocks
 * (ZK_SUM_BLOCK = 1024 elements, 8 lanes, element j to lane j % 8 in index
 * order, then the lanes in order): the same double operations in the same
 * order, so the same bits as the CPU.
 *
 * x 16-byte aligned (f32; every tensor the runtime allocates): two threads a
 * sum block, thread t holding lanes 4t .. 4t+3 -- elements 8m + 4t + e
 * come with one 16-byte load and go to four independent fp64 chains (the
 * loads of later m issued ahead of the adds); the pair reads 32
 * contiguous bytes a step. Otherwise eight threads a block, one per lane,
 * element by element (the same chains, so the same bits). The lanes then
 * meet in shared memory and one thread sums them in lane order.
 * (One thread a block, walking its 4 KiB alone, read each warp's loads from
 * 32 lines 4 KiB apart: 205 GB/s on an H200, 2.4 ms a GPT-2 124M step; a
 * thread per lane, scalar loads: 421 GB/s, 1.18 ms. The two-thread form is
 * checked on the CPU (spec/emu, tools/emu_kernel.sh reduce), not yet timed
 * on a GPU.)
 *
 * The sums of squares read x through its type X: float, or a 2-byte
 * gradient read as stored (uint16_t: bf16 bits, __half: fp16), each
 * element widened exactly (zkc_get) before its fp64 chain -- so a 2-byte
 * x's partials are the bits of an f32 x holding the widened values, and a
 * mixed-precision step needs no fp32 copy of its gradient. A 2-byte x's
 * vector path loads the same four lanes' elements with one 8-byte load
 * (zkc_ldg4h: 4 elements a step, the chains fed in the same order); a
 * 16-byte load of 8 would span both threads' lanes of a step. The path is
 * chosen by x on 4 elements' bytes (16 for f32, 8 for 2-byte): the same
 * element offset from an aligned base takes the same path in either type.
 * (Both paths give the same bits anyway; this keeps the speed alike.) */
#include <cuda_bf16.h>
#include "mma.cuh"
#include "common.cuh"

#define SUM_BLOCK 1024
#define SUM_LANES 8
#define SUM_THREADS 256                          /* 32 sum blocks a CUDA block */

template <class X>
__global__ static void __launch_bounds__(SUM_THREADS) k_blocks(double *partials, const X *x, size_t n,
                                                                 size_t nb, int sq)
{
    __shared__ double lanes[SUM_THREADS];
    int k = threadIdx.x % SUM_LANES;
    size_t b = (size_t)blockIdx.x * (SUM_THREADS / SUM_LANES) + threadIdx.x / SUM_LANES;
    double s = 0.0;
    if (b < nb) {
        size_t lo = b * SUM_BLOCK, hi = lo + SUM_BLOCK < n ? lo + SUM_BLOCK : n;
        for (size_t i = lo + k; i < hi; i += SUM_LANES) {
            double xi = (double)zkc_get(x + i);
            /* __dmul_rn/__dadd_rn: no FMA contraction (the CPU rounds each) */
            s = __dadd_rn(s, sq ? __dmul_rn(xi, xi) : xi);
        }
    }
    lanes[threadIdx.x] = s;
    __syncthreads();
    if (b < nb && k == 0) {
        double t = 0.0;
        for (int j = 0; j < SUM_LANES; j++) t = __dadd_rn(t, lanes[threadIdx.x + j]);
        partials[b] = t;
    }
}

/* one element into its lane's chain: x or x squared, each op rounded */
__device__ __forceinline__ double sum_step(double s, float v, int sq)
{
    double xi = (double)v;
    return __dadd_rn(s, sq ? __dmul_rn(xi, xi) : xi);
}

/* the vector path's 4 neighbouring elements as floats: 16 bytes of fp32,
 * or 8 bytes of a 2-byte type, each widened exactly (zkc_get) */
__device__ __forceinline__ float4 sum_ld4(const float *p) { return zkc_ldg4(p); }
template <class X>
__device__ __forceinline__ float4 sum_ld4(const X *p)
{
    uint2 v = zkc_ldg4h(p);
    X e[4];
    memcpy(e, &v, sizeof e);
    return float4{ zkc_get(e), zkc_get(e + 1), zkc_get(e + 2), zkc_get(e + 3) };
}

/* two threads a sum block, four lanes each (x on 4 elements' bytes) */
template <class X>
__global__ static void __launch_bounds__(SUM_THREADS) k_blocks4(double *partials, const X *x,
                                                                  size_t n, size_t nb, int sq)
{
    __shared__ double lanes[SUM_THREADS * 4];
    int t = threadIdx.x % 2;
    size_t b = (size_t)blockIdx.x * (SUM_THREADS / 2) + threadIdx.x / 2;
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    if (b < nb) {
        size_t lo = b * SUM_BLOCK, hi = lo + SUM_BLOCK < n ? lo + SUM_BLOCK : n;
        size_t i = lo + 4 * (size_t)t;
#pragma unroll 4
        for (; i + 3 < hi; i += SUM_LANES) {
            float4 v = sum_ld4(x + i);
            s0 = sum_step(s0, v.x, sq);
            s1 = sum_step(s1, v.y, sq);
            s2 = sum_step(s2, v.z, sq);
            s3 = sum_step(s3, v.w, sq);
        }
        /* the block's last step cut by n: its first elements, if any */
        if (i < hi) s0 = sum_step(s0, zkc_get(x + i), sq);
        if (i + 1 < hi) s1 = sum_step(s1, zkc_get(x + i + 1), sq);
        if (i + 2 < hi) s2 = sum_step(s2, zkc_get(x + i + 2), sq);
    }
    double *l = lanes + 4 * threadIdx.x;       /* the pair's 8 lanes, in lane order */
    l[0] = s0; l[1] = s1; l[2] = s2; l[3] = s3;
    __syncthreads();
    if (b < nb && t == 0) {
        double r = 0.0;
        for (int j = 0; j < SUM_LANES; j++) r = __dadd_rn(r, l[j]);
        partials[b] = r;
    }
}

/* the vector path where x is on its 4 elements' bytes (then so is every
 * load, x + 1024 b + 8 m + 4 t), else a thread a lane */
template <class X>
static int blocks(cudaStream_t s, double *partials, const X *x, size_t n, int sq)
{
    size_t nb = (n + SUM_BLOCK - 1) / SUM_BLOCK;
    if (nb == 0) return 0;
    if (!((uintptr_t)x % (4 * sizeof(X)))) {
        unsigned g4 = (unsigned)((nb + SUM_THREADS / 2 - 1) / (SUM_THREADS / 2));
        k_blocks4<X><<<g4, SUM_THREADS, 0, s>>>(partials, x, n, nb, sq);
        return ZKC_LAUNCHED();
    }
    unsigned grid = (unsigned)((nb + SUM_THREADS / SUM_LANES - 1) / (SUM_THREADS / SUM_LANES));
    k_blocks<X><<<grid, SUM_THREADS, 0, s>>>(partials, x, n, nb, sq);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_sumsq_blocks(cudaStream_t s, double *partials, const void *x, int x_kind,
                                size_t n)
{
    switch (x_kind) {
    case 0: return blocks(s, partials, (const float *)x, n, 1);
    case 1: return blocks(s, partials, (const uint16_t *)x, n, 1);
    case 2: return blocks(s, partials, (const __half *)x, n, 1);
    default: return (int)cudaErrorInvalidValue;
    }
}

extern "C" int zkc_sum_blocks(cudaStream_t s, double *partials, const float *x, size_t n)
{
    return blocks(s, partials, x, n, 0);
}

/* One thread per element, sources in rank order; __fadd_rn keeps each add
 * a separately rounded fp32 add (no contraction or reassociation). */
__global__ static void k_sum_ranks(float *__restrict__ dst, const float *__restrict__ src,
                                   int nsrc, size_t n)
{
    ZKC_FOR(i, n) {
        float acc = src[i];
        for (int j = 1; j < nsrc; j++) acc = __fadd_rn(acc, src[(size_t)j * n + i]);
        dst[i] = acc;
    }
}

extern "C" int zkc_sum_ranks(cudaStream_t s, float *dst, const float *src, int nsrc, size_t n)
{
    if (n == 0 || nsrc < 1) return 0;
    k_sum_ranks<<<zkc_grid(n, 256), 256, 0, s>>>(dst, src, nsrc, n);
    return ZKC_LAUNCHED();
}
