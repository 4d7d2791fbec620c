/*
 * reduce.c -- fp64 sums over the fixed ZK_SUM_BLOCK partition.
 *
 * A block's sum uses ZK_SUM_LANES interleaved double accumulators (element i
 * of the block goes to lane i % LANES, lanes added in order at the end), so a
 * partial depends only on the block's data: any rank holding the block gets
 * the same bits, which is what keeps the global gradient norm identical
 * under every sharding. The lanes let the loop vectorize.
 *
 * Speed. GCC left the lane loop scalar (one vcvtss2sd, vmulsd, vaddsd per
 * element). The AVX2 path holds lanes 0-3 in one ymm and 4-7 in another and
 * does the same IEEE convert, mul and add per element in the same order (no
 * FMA), so each partial has the same bits; spec/c/test_elementwise.c checks
 * both paths against the lane scheme written out. Each lane is one chain
 * of dependent adds; running several blocks side by side to put more chains
 * in flight (same bits) was tried and dropped: ~1.2x in L2, but 1.3-2.5x
 * SLOWER from DRAM on the 2-core EPYC (measured under load; interleaved
 * 4 KiB streams seem to defeat the prefetcher), where one block at a time
 * already reads at about copy bandwidth.
 */
#include <string.h>
#include "kernels.h"
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SUM_X86 1
#endif

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#define SUM_NOCONTRACT
#else
#define SUM_NOCONTRACT __attribute__((optimize("fp-contract=off")))
#endif

/* blocks per parallel region in zk_sum_f64: the partials of one group live
 * on the stack (no heap in kernels) and are then added in block order */
#define SUM_GROUP 512
/* blocks per task (a call per run keeps the dispatch off the per-block path) */
#define SUM_RUN 4
/* below this many blocks a parallel region costs more than it saves */
#define SUM_PAR_BLOCKS 4

_Static_assert(ZK_SUM_LANES == 8 && ZK_SUM_BLOCK % 8 == 0,
               "the AVX2 path holds the 8 lanes in two ymm registers");

static double lanes_total(const double *s) {
    double t = 0.0;
    for (int k = 0; k < ZK_SUM_LANES; k++) t += s[k];
    return t;
}

/* The lane scheme written plainly: the reference the vector path matches
 * (and the whole sum on a CPU without AVX2). sq: square each element. */
SUM_NOCONTRACT
static double block_scalar(const float *restrict x, size_t len, int sq) {
    double s[ZK_SUM_LANES] = { 0 };
    size_t i = 0;
    for (; i + ZK_SUM_LANES <= len; i += ZK_SUM_LANES)
        for (int k = 0; k < ZK_SUM_LANES; k++)
            s[k] += sq ? (double)x[i + k] * (double)x[i + k] : (double)x[i + k];
    for (int k = 0; i < len; i++, k++) s[k] += sq ? (double)x[i] * (double)x[i] : (double)x[i];
    return lanes_total(s);
}

/* parts[j] = the partial of the block of len elements at x + j*ZK_SUM_BLOCK,
 * for j < nblk (all blocks full except perhaps the last). */
typedef void (*sum_blocks_fn)(double *restrict, const float *restrict, size_t, size_t);

static inline void blocks_scalar(double *restrict parts, const float *restrict x, size_t nblk,
                                 size_t last_len, int sq) {
    for (size_t j = 0; j < nblk; j++)
        parts[j] = block_scalar(x + j * ZK_SUM_BLOCK, j + 1 < nblk ? ZK_SUM_BLOCK : last_len, sq);
}

#ifdef SUM_X86
/* The vector path, for an f32 x or a stored 2-byte gradient's (kind X_BF16,
 * X_F16: zk_sumsq_blocks_16) widened in registers as loaded -- bf16 by a
 * shift, f16 by F16C, both exact -- so a 2-byte x gives the partials of an
 * f32 copy without writing one. GPT-2 124M's 124M bf16 gradients, 2
 * threads of this VM: 23-31 ms, 30-36 through a stack copy before; the
 * f32 path reads twice the bytes in 18-22 ms, so the 2-byte path is bound
 * by its widening work, not by memory. Every CPU with AVX2 has F16C. */
enum { X_F32, X_BF16, X_F16 };
#define SUM_TARGET __attribute__((target("avx2,f16c"), always_inline)) SUM_NOCONTRACT

/* x advanced by n elements of its kind */
static inline const void *at(const void *x, size_t n, int kind) {
    return (const char *)x + n * (kind == X_F32 ? 4 : 2);
}

/* 8 elements at x widened to lanes 0-3 (lo) and 4-7 (hi), squared if sq */
SUM_TARGET static inline void load8(const void *x, int kind, int sq, __m256d *lo, __m256d *hi) {
    __m256 v;
    if (kind == X_F32) {
        v = _mm256_loadu_ps(x);
    } else {
        __m128i h = _mm_loadu_si128((const __m128i *)x);
        v = kind == X_F16 ? _mm256_cvtph_ps(h)
                          : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    *lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    *hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    if (sq) { *lo = _mm256_mul_pd(*lo, *lo); *hi = _mm256_mul_pd(*hi, *hi); }
}

/* One block of len elements, any len: the vector lanes, then the tail
 * (widened) into lanes 0.. in order, as block_scalar. */
SUM_TARGET static inline double block_avx2(const void *x, size_t len, int kind, int sq) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd(), lo, hi;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        load8(at(x, i, kind), kind, sq, &lo, &hi);
        a0 = _mm256_add_pd(a0, lo);
        a1 = _mm256_add_pd(a1, hi);
    }
    double s[8];
    float t[8];
    _mm256_storeu_pd(s, a0);
    _mm256_storeu_pd(s + 4, a1);
    size_t r = len - i;
    if (kind == X_F32) memcpy(t, at(x, i, kind), r * 4);
    else if (kind == X_F16) zk_cast_f16_f32(t, at(x, i, kind), r);
    else zk_cast_bf16_f32(t, at(x, i, kind), r);
    for (size_t k = 0; k < r; k++) s[k] += sq ? (double)t[k] * (double)t[k] : (double)t[k];
    return lanes_total(s);
}

/* Four full blocks at once: eight independent chains of adds where one
 * block has two, so the adds' latency no longer bounds the loop (a block
 * alone ran at ~3 G elements/s a thread, latency-bound). Each block's lanes
 * take the same values in the same order as block_avx2's: the same bits. */
SUM_TARGET static inline void block4_avx2(double *restrict parts, const void *x, int kind, int sq) {
    __m256d a[8], lo, hi;
    for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_pd();
    for (size_t i = 0; i < ZK_SUM_BLOCK; i += 8)
        for (int b = 0; b < 4; b++) {
            load8(at(x, (size_t)b * ZK_SUM_BLOCK + i, kind), kind, sq, &lo, &hi);
            a[2 * b] = _mm256_add_pd(a[2 * b], lo);
            a[2 * b + 1] = _mm256_add_pd(a[2 * b + 1], hi);
        }
    for (int b = 0; b < 4; b++) {
        double s[8];
        _mm256_storeu_pd(s, a[2 * b]);
        _mm256_storeu_pd(s + 4, a[2 * b + 1]);
        parts[b] = lanes_total(s);
    }
}

SUM_TARGET static inline void blocks_avx2(double *restrict parts, const void *x, size_t nblk,
                                          size_t last_len, int kind, int sq) {
    size_t j = 0;
    /* blocks j .. j+3 all full: the last one is not among them, or is full */
    for (; j + 4 < nblk || (j + 4 == nblk && last_len == ZK_SUM_BLOCK); j += 4)
        block4_avx2(parts + j, at(x, j * ZK_SUM_BLOCK, kind), kind, sq);
    for (; j < nblk; j++)
        parts[j] = block_avx2(at(x, j * ZK_SUM_BLOCK, kind), j + 1 < nblk ? ZK_SUM_BLOCK : last_len,
                              kind, sq);
}

/* kind and sq fixed at compile time in each instance: no branch in the loops */
#define SUM_INSTANCE(name, T, kind, sq)                                        \
    __attribute__((target("avx2,f16c"))) SUM_NOCONTRACT                        \
    static void name(double *restrict p, const T *restrict x, size_t nb, size_t last) { \
        blocks_avx2(p, x, nb, last, kind, sq);                                 \
    }
SUM_INSTANCE(sumsq_avx2, float, X_F32, 1)
SUM_INSTANCE(sum_avx2, float, X_F32, 0)
SUM_INSTANCE(sumsq_bf16_avx2, uint16_t, X_BF16, 1)
SUM_INSTANCE(sumsq_f16_avx2, uint16_t, X_F16, 1)
typedef void (*sum16_fn)(double *restrict, const uint16_t *restrict, size_t, size_t);
#endif

static void sumsq_scalar(double *restrict p, const float *restrict x, size_t nb, size_t last) {
    blocks_scalar(p, x, nb, last, 1);
}
static void sum_scalar(double *restrict p, const float *restrict x, size_t nb, size_t last) {
    blocks_scalar(p, x, nb, last, 0);
}

/* Tests and benches compare the plain loops with the vector paths in one
 * process (kernels.h); a plain int: set it only while no kernel runs. */
static int scalar_forced;
void zk_force_scalar(int on) { scalar_forced = on != 0; }
int zk_scalar_forced(void) { return scalar_forced; }

static sum_blocks_fn sum_pick(int sq) {
#if defined(SUM_X86)
    if (!scalar_forced && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"))
        return sq ? sumsq_avx2 : sum_avx2;
#endif
    return sq ? sumsq_scalar : sum_scalar;
}

/* parts[j] = partial of block b0 + j of x (n elements), j < nblk, in runs
 * of SUM_RUN whole blocks per task (a static split). */
static void sum_blocks(double *parts, const float *x, size_t n, size_t b0, size_t nblk, int sq) {
    sum_blocks_fn fn = sum_pick(sq);
    size_t nr = (nblk + SUM_RUN - 1) / SUM_RUN;
    #pragma omp parallel for schedule(static) if (nblk >= SUM_PAR_BLOCKS)
    for (size_t r = 0; r < nr; r++) {
        size_t j0 = r * SUM_RUN, m = nblk - j0 < SUM_RUN ? nblk - j0 : SUM_RUN;
        size_t lo = (b0 + j0) * ZK_SUM_BLOCK, end = lo + m * ZK_SUM_BLOCK;
        size_t last_len = (end < n ? end : n) - (lo + (m - 1) * ZK_SUM_BLOCK);
        fn(parts + j0, x + lo, m, last_len);
    }
}

/* partials[i] = sum of x[j]^2 over block i (index order), ceil(n/BLOCK) of them. */
void zk_sumsq_blocks(double *partials, const float *x, size_t n) {
    sum_blocks(partials, x, n, 0, (n + ZK_SUM_BLOCK - 1) / ZK_SUM_BLOCK, 1);
}

/* a 2-byte x: widened in registers (AVX2 and F16C: sumsq_bf16_avx2), or
 * each run of SUM_RUN blocks widened into the thread's stack (16 KB), then
 * the f32 blocks' lanes -- either way the partials of the widened copy */
void zk_sumsq_blocks_16(double *partials, const uint16_t *x, int x_f16, size_t n) {
    size_t nb = (n + ZK_SUM_BLOCK - 1) / ZK_SUM_BLOCK, nr = (nb + SUM_RUN - 1) / SUM_RUN;
#if defined(SUM_X86)
    if (!scalar_forced && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
        sum16_fn f = x_f16 ? sumsq_f16_avx2 : sumsq_bf16_avx2;
        #pragma omp parallel for schedule(static) if (nb >= SUM_PAR_BLOCKS)
        for (size_t r = 0; r < nr; r++) {
            size_t j0 = r * SUM_RUN, m = nb - j0 < SUM_RUN ? nb - j0 : SUM_RUN;
            size_t lo = j0 * ZK_SUM_BLOCK, end = lo + m * ZK_SUM_BLOCK;
            f(partials + j0, x + lo, m, (end < n ? end : n) - (lo + (m - 1) * ZK_SUM_BLOCK));
        }
        return;
    }
#endif
    sum_blocks_fn fn = sum_pick(1);
    #pragma omp parallel for schedule(static) if (nb >= SUM_PAR_BLOCKS)
    for (size_t r = 0; r < nr; r++) {
        size_t lo = r * SUM_RUN * ZK_SUM_BLOCK, len = n - lo;
        if (len > SUM_RUN * ZK_SUM_BLOCK) len = SUM_RUN * ZK_SUM_BLOCK;
        size_t m = (len + ZK_SUM_BLOCK - 1) / ZK_SUM_BLOCK;
        float w[SUM_RUN * ZK_SUM_BLOCK];
        if (x_f16) zk_cast_f16_f32(w, x + lo, len);
        else zk_cast_bf16_f32(w, x + lo, len);
        fn(partials + r * SUM_RUN, w, m, len - (m - 1) * ZK_SUM_BLOCK);
    }
}

/* sum of x: block partials (index order), then the partials in block order. */
double zk_sum_f64(const float *x, size_t n) {
    size_t nb = (n + ZK_SUM_BLOCK - 1) / ZK_SUM_BLOCK;
    double total = 0.0;
    double part[SUM_GROUP];
    for (size_t g0 = 0; g0 < nb; g0 += SUM_GROUP) {
        size_t gn = nb - g0 < SUM_GROUP ? nb - g0 : SUM_GROUP;
        sum_blocks(part, x, n, g0, gn, 0);
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
