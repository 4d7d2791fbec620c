/* reduce.cu -- fp64 block partials over kernels/cpu/reduce.c's fixed blocks
 * (ZK_SUM_BLOCK = 1024 elements, 8 lanes, element j to lane j % 8 in index
 * order, then the lanes in order): one thread per block, the same
 * double operations in the same order, so the same bits as the CPU. */
#include "common.cuh"

#define SUM_BLOCK 1024
#define SUM_LANES 8

template <bool SQ>
__global__ static void k_blocks(double *partials, const float *x, size_t n, size_t nb)
{
    size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nb) return;
    size_t lo = b * SUM_BLOCK, hi = lo + SUM_BLOCK < n ? lo + SUM_BLOCK : n;
    double s[SUM_LANES] = { 0 };
    for (size_t i = lo; i < hi; i++) {
        double xi = (double)x[i];
        /* __dmul_rn/__dadd_rn: no FMA contraction (the CPU rounds each) */
        s[(i - lo) % SUM_LANES] = __dadd_rn(s[(i - lo) % SUM_LANES], SQ ? __dmul_rn(xi, xi) : xi);
    }
    double t = 0.0;
    for (int k = 0; k < SUM_LANES; k++) t += s[k];
    partials[b] = t;
}

extern "C" int zkc_sumsq_blocks(cudaStream_t s, double *partials, const float *x, size_t n)
{
    size_t nb = (n + SUM_BLOCK - 1) / SUM_BLOCK;
    if (nb == 0) return 0;
    k_blocks<true><<<zkc_grid(nb, 128), 128, 0, s>>>(partials, x, n, nb);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_sum_blocks(cudaStream_t s, double *partials, const float *x, size_t n)
{
    size_t nb = (n + SUM_BLOCK - 1) / SUM_BLOCK;
    if (nb == 0) return 0;
    k_blocks<false><<<zkc_grid(nb, 128), 128, 0, s>>>(partials, x, n, nb);
    return ZKC_LAUNCHED();
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
