/*
 * reduce.c -- fp64 sums over the fixed ZK_SUM_BLOCK partition.
 *
 * A block's sum uses ZK_SUM_LANES interleaved double accumulators (element i
 * of the block goes to lane i % LANES, lanes added in order at the end), so a
 * partial depends only on the block's data: any rank holding the block gets
 * the same bits, which is what keeps the global gradient norm identical
 * under every sharding. The lanes let the loop vectorize.
 */
#include "kernels.h"

/* blocks per parallel region in zk_sum_f64: the partials of one group live
 * on the stack (no heap in kernels) and are then added in block order */
#define SUM_GROUP 512
#define SUM_PAR_BLOCKS 4

static double lanes_total(const double *s) {
    double t = 0.0;
    for (int k = 0; k < ZK_SUM_LANES; k++) t += s[k];
    return t;
}

static double block_sumsq(const float *restrict x, size_t lo, size_t hi) {
    double s[ZK_SUM_LANES] = { 0 };
    size_t i = lo;
    for (; i + ZK_SUM_LANES <= hi; i += ZK_SUM_LANES)
        for (int k = 0; k < ZK_SUM_LANES; k++) s[k] += (double)x[i + k] * (double)x[i + k];
    for (int k = 0; i < hi; i++, k++) s[k] += (double)x[i] * (double)x[i];
    return lanes_total(s);
}

static double block_sum(const float *restrict x, size_t lo, size_t hi) {
    double s[ZK_SUM_LANES] = { 0 };
    size_t i = lo;
    for (; i + ZK_SUM_LANES <= hi; i += ZK_SUM_LANES)
        for (int k = 0; k < ZK_SUM_LANES; k++) s[k] += (double)x[i + k];
    for (int k = 0; i < hi; i++, k++) s[k] += (double)x[i];
    return lanes_total(s);
}

/* partials[i] = sum of x[j]^2 over block i (index order), ceil(n/BLOCK) of them. */
void zk_sumsq_blocks(double *partials, const float *x, size_t n) {
    size_t nb = (n + ZK_SUM_BLOCK - 1) / ZK_SUM_BLOCK;
    #pragma omp parallel for schedule(static) if (nb >= SUM_PAR_BLOCKS)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * ZK_SUM_BLOCK;
        size_t hi = lo + ZK_SUM_BLOCK < n ? lo + ZK_SUM_BLOCK : n;
        partials[b] = block_sumsq(x, lo, hi);
    }
}

/* sum of x: block partials (index order), then the partials in block order. */
double zk_sum_f64(const float *x, size_t n) {
    size_t nb = (n + ZK_SUM_BLOCK - 1) / ZK_SUM_BLOCK;
    double total = 0.0;
    double part[SUM_GROUP];
    for (size_t g0 = 0; g0 < nb; g0 += SUM_GROUP) {
        size_t gn = nb - g0 < SUM_GROUP ? nb - g0 : SUM_GROUP;
        #pragma omp parallel for schedule(static) if (gn >= SUM_PAR_BLOCKS)
        for (size_t k = 0; k < gn; k++) {
            size_t lo = (g0 + k) * ZK_SUM_BLOCK;
            size_t hi = lo + ZK_SUM_BLOCK < n ? lo + ZK_SUM_BLOCK : n;
            part[k] = block_sum(x, lo, hi);
        }
        for (size_t k = 0; k < gn; k++) total += part[k];
    }
    return total;
}

void zk_sum_ranks(float *restrict dst, const float *restrict src, int nsrc, size_t n)
{
    /* Blocks keep dst in cache across the sources; each element still gets
     * ((s0 + s1) + s2) + ... exactly. */
    const size_t B = 2048;
    for (size_t i0 = 0; i0 < n; i0 += B) {
        size_t m = n - i0 < B ? n - i0 : B;
        float *restrict d = dst + i0;
        const float *restrict s0 = src + i0;
        if (nsrc == 1) {
            for (size_t i = 0; i < m; i++) d[i] = s0[i];
            continue;
        }
        const float *restrict s1 = src + n + i0;
        for (size_t i = 0; i < m; i++) d[i] = s0[i] + s1[i];
        for (int j = 2; j < nsrc; j++) {
            const float *restrict sj = src + (size_t)j * n + i0;
            for (size_t i = 0; i < m; i++) d[i] += sj[i];
        }
    }
}
