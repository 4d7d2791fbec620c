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
 * Run: sh tools/emu_kernel.sh reduce.
 */
#include <string.h>
#include "ctest.h"
#include "kernels.h"

int zkc_sumsq_blocks(void *s, double *partials, const float *x, size_t n);
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
    int rc = zkc_sumsq_blocks(NULL, got, x, n);
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

int main(void)
{
    ct_seed(7);
    size_t sizes[] = { 0, 1, 3, 4, 7, 1000, 1024, 1025, 1026, 1027, 1028, 1029, 1030, 1031,
                       3 * 1024, 5000, 33 * 1024 + 17, 70 * 1024, 130 * 1024 + 5 };
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        one(sizes[i], 0);
        one(sizes[i], 1);
    }
    return ct_summary();
}
