/*
 * test_reduce_emu.c -- kernels/cuda/reduce.cu's own source run on the CPU
 * under spec/emu/cuda_emu.h, against the CPU twin: the fp64 block partials
 * of zk_sumsq_blocks (the gradient norm) and the plain sums behind
 * zt_sum. The same double operations in the same order, so the same bits:
 * compared with memcmp. Both paths: x 16-byte aligned (two threads a sum
 * block, 16-byte loads; cuda_emu.h aborts on a misaligned one) and x one
 * float off (a thread a lane). Sizes: empty, one element, one short block,
 * whole blocks, partial last blocks cut at every place in a step of 8,
 * more blocks than one CUDA block holds (32 and 128) with a remainder.
 * 2-byte x (bf16, fp16: a mixed-precision step's stored gradient), read
 * as it is and widened exactly: the sums of squares must be the bits of
 * the f32 call on the widened copy and of zk_sumsq_blocks on it, at every
 * element offset 0..4 (0 and 4: the 8-byte loads of the two-thread path,
 * 1..3 a thread a lane, as the same offsets of an f32 x choose), on values
 * of the gradients' range and on every finite bit pattern (fp16
 * subnormals, bf16's whole exponent range).
 * Run: sh tools/emu_kernel.sh reduce. A kernel whose 2-byte path widens
 * wrongly or feeds its lanes in another order fails here (checked with a
 * broken copy: SRC=... sh tools/emu_kernel.sh reduce).
 */
#include <math.h>
#include <string.h>
#include "ctest.h"
#include "kernels.h"

int zkc_sumsq_blocks(void *s, double *partials, const void *x, int x_kind, size_t n);
int zkc_sum_blocks(void *s, double *partials, const float *x, size_t n);

/* the plain sums' twin: lane i % 8 in index order, then the lanes in order
 * (kernels/cpu/reduce.c's scheme, written out) */
static void sum_blocks_ref(double *partials, const float *x, size_t n)
{
    for (size_t lo = 0, b = 0; lo < n; lo += ZK_SUM_BLOCK, b++) {
        double s[8] = { 0 };
        size_t hi = lo + ZK_SUM_BLOCK < n ? lo + ZK_SUM_BLOCK : n;
        for (size_t i = lo; i < hi; i++) s[(i - lo) % 8] += (double)x[i];
        double t = 0.0;
        for (int k = 0; k < 8; k++) t += s[k];
        partials[b] = t;
    }
}

static void one(size_t n, int off)
{
    char name[128];
    size_t nb = (n + ZK_SUM_BLOCK - 1) / ZK_SUM_BLOCK;
    float *x0 = ct_rand(n + 1, -3, 3), *x = x0 + off;
    double *want = calloc(nb + 1, 8), *got = calloc(nb + 1, 8);
    zk_sumsq_blocks(want, x, n);
    for (size_t b = 0; b <= nb; b++) got[b] = -1.0;      /* got[nb]: never written */
    int rc = zkc_sumsq_blocks(NULL, got, x, 0, n);
    snprintf(name, sizeof name, "emu n=%zu x+%d: sumsq partials, the CPU's bits", n, off);
    ct_check(rc == 0 && !memcmp(got, want, nb * 8) && got[nb] == -1.0, name,
             "rc %d, first partial %.17g vs %.17g", rc, nb ? got[0] : 0.0, nb ? want[0] : 0.0);
    sum_blocks_ref(want, x, n);
    rc = zkc_sum_blocks(NULL, got, x, n);
    snprintf(name, sizeof name, "emu n=%zu x+%d: sum partials, the CPU's bits", n, off);
    ct_check(rc == 0 && !memcmp(got, want, nb * 8) && got[nb] == -1.0, name,
             "rc %d, first partial %.17g vs %.17g", rc, nb ? got[0] : 0.0, nb ? want[0] : 0.0);
    free(x0); free(want); free(got);
}

/* kind 1 (bf16) or 2 (f16) x at element offset off of a 16-byte aligned
 * buffer: gradient-like values (of [-1, 1) times 2^-12 .. 2^12, rounded to
 * the type), or (bits) any finite bit pattern; its partials against
 * zk_sumsq_blocks on the widened copy and the f32 kernel on that copy (at
 * the same offset: the same path). The spread of magnitudes matters: the
 * squares of 2-byte values of one binade add exactly in double, in any
 * order, and would hide a lane order broken (the chains round here). */
static void one16(size_t n, int off, int kind, int bits)
{
    char name[160];
    const char *ty = kind == 1 ? "bf16" : "f16";
    size_t nb = (n + ZK_SUM_BLOCK - 1) / ZK_SUM_BLOCK, m = n + (size_t)off;
    uint16_t *h0 = aligned_alloc(16, (m * 2 + 16) & ~(size_t)15), *h = h0 + off;
    float *w0 = aligned_alloc(16, (m * 4 + 16) & ~(size_t)15), *w = w0 + off;
    double *want = calloc(nb + 1, 8), *got = calloc(nb + 1, 8), *g32 = calloc(nb + 1, 8);
    for (size_t i = 0; i < m; i++) w0[i] = ldexpf(ct_unif(-1, 1), (int)ct_unif(-12, 13));
    if (kind == 1) zk_cast_f32_bf16(h0, w0, m); else zk_cast_f32_f16(h0, w0, m);
    uint16_t inf = kind == 1 ? 0x7f80 : 0x7c00;           /* the exponent all ones */
    for (size_t i = 0; bits && i < m; i++)
        do h0[i] = (uint16_t)ct_u64(); while ((h0[i] & inf) == inf);
    if (kind == 1) zk_cast_bf16_f32(w0, h0, m); else zk_cast_f16_f32(w0, h0, m);
    zk_sumsq_blocks(want, w, n);
    for (size_t b = 0; b <= nb; b++) got[b] = g32[b] = -1.0;      /* [nb]: never written */
    int rc = zkc_sumsq_blocks(NULL, got, h, kind, n);
    int rc32 = zkc_sumsq_blocks(NULL, g32, w, 0, n);
    snprintf(name, sizeof name, "emu n=%zu x+%d %s%s: sumsq partials, the f32 call's and the CPU's "
             "bits on the widened values", n, off, ty, bits ? " (any finite bits)" : "");
    ct_check(rc == 0 && rc32 == 0 && !memcmp(got, want, nb * 8) && !memcmp(g32, want, nb * 8) &&
             got[nb] == -1.0, name, "rc %d/%d, first partial %.17g vs %.17g (f32 %.17g)", rc, rc32,
             nb ? got[0] : 0.0, nb ? want[0] : 0.0, nb ? g32[0] : 0.0);
    free(h0); free(w0); free(want); free(got); free(g32);
}

int main(void)
{
    ct_seed(7);
    size_t sizes[] = { 0, 1, 3, 4, 7, 1000, 1024, 1025, 1026, 1027, 1028, 1029, 1030, 1031,
                       3 * 1024, 5000, 33 * 1024 + 17, 70 * 1024, 130 * 1024 + 5 };
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        one(sizes[i], 0);
        one(sizes[i], 1);
        for (int off = 0; off <= 4; off++)
            for (int kind = 1; kind <= 2; kind++) one16(sizes[i], off, kind, 0);
    }
    size_t bsizes[] = { 1027, 33 * 1024 + 17 };
    for (size_t i = 0; i < sizeof bsizes / sizeof *bsizes; i++)
        for (int off = 0; off <= 1; off++)
            for (int kind = 1; kind <= 2; kind++) one16(bsizes[i], off, kind, 1);
    {   /* another kind is refused, nothing written */
        double p = -1.0;
        float x = 1.0f;
        int rc = zkc_sumsq_blocks(NULL, &p, &x, 3, 1);
        ct_check(rc != 0 && p == -1.0, "emu: x kind 3 refused", "rc %d, partial %g", rc, p);
    }
    return ct_summary();
}
