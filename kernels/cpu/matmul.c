/*
 * matmul.c -- linear layer (x @ W^T + b) on OpenBLAS sgemm.
 *
 * Why sgemm runs on fixed blocks inside OpenMP, single-threaded: OpenBLAS's
 * own threading does NOT give the same bits for every thread count. With
 * the Haswell kernels the micro-kernel that computes an element (and so the
 * order of its K sum) depends on where the element falls in a thread's
 * share; e.g. 1024x768 @ 768x2304 differs in ~5% of elements between 1 and
 * 2 OpenBLAS threads. So every GEMM output is cut into fixed blocks of
 * rows or columns (zk_gemm_plan: chosen from the shape and the sgemm core,
 * never the thread count), each block is one single-threaded sgemm call,
 * and OpenMP spreads the blocks: the bits then depend on the shapes (and
 * core) alone. Cost measured at GPT-2 124M shapes on 2 cores with the
 * 256 cut: 92-98% of OpenBLAS's own 2-thread speed, and there is no second
 * thread pool spinning against OpenMP's. The wider SkylakeX cut (below)
 * repacks less and balances 2 threads; tools/bench_gemm_shapes.c measures
 * every GPT-2 shape.
 *
 * All GEMMs use beta = 0 (see "Same math" in DESIGN.md: a beta = 1 GEMM adds
 * into C one K-block at a time).
 *
 * OpenBLAS's own thread count is 1 for the whole process, set once when the
 * library loads (below) and never touched per call: openblas_set_num_threads
 * is one global, so flipping it around every GEMM (as this file once did)
 * races with any other thread that calls BLAS -- a copy-stream worker, a CPU
 * optimizer, the loader -- and can hand a block a multi-threaded sgemm with
 * different bits. zt_set_threads sizes OpenMP only. Code that wants a
 * threaded sgemm of its own (tools/bench.lua's peak) sets the count around
 * its call and puts 1 back; the CPU device refuses to run a GEMM otherwise.
 */
#include <cblas.h>
#include <strings.h>
#include "kernels.h"

/* OpenBLAS's library constructor has run by now (a dependency is initialised
 * before the objects that need it), so this wins over OPENBLAS_NUM_THREADS. */
__attribute__((constructor)) static void zk_blas_one_thread(void) {
    openblas_set_num_threads(1);
}

#define MM_BLOCK 256       /* rows or columns of the output per sgemm call */
#define MM_COL_CHUNK 64    /* output columns per task when summing dbias */
/* the cut on a cut-free core: a multiple of MM_SPLITS blocks of about
 * MM_WIDE or more where the dimension allows, block edges on MM_GRAIN */
#define MM_SPLITS 4
#define MM_WIDE 1024
#define MM_GRAIN 64
/* OpenBLAS 0.3.21 sends small calls down other code with other bits
 * (row-major NN under 28*512*512 multiply-adds: sgemm_direct on SkylakeX;
 * its small-matrix kernels lower still). A cut is free only where every
 * block of it, and of the MM_BLOCK cut, is above this. */
#define MM_BIG_MNK (8.0 * 1024 * 1024)

/* Whether this process's sgemm kernel gives each output element the same
 * bits whichever (big) block computes it. OpenBLAS's K blocking depends on
 * K and the core only, so an element's sum is the same in any cut if the
 * micro-kernel's is: true of SkylakeX's (every GPT-2 shape, both cut
 * dimensions, blocks 192-6144: tools/bench_gemm_shapes.c;
 * spec/c/test_gemm_plan.c), false of Haswell's (most other cuts change
 * bits). Any core not checked keeps the MM_BLOCK cut. */
static int cut_free_core(void) {
    static int known = -1;
    int v = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *core = openblas_get_corename();
        v = core != NULL && strcasecmp(core, "SkylakeX") == 0;
        __atomic_store_n(&known, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* The cut of a GEMM's output, from the shape and the sgemm core alone: the
 * longer dimension D in MM_BLOCK pieces. On a cut-free core, where every
 * block is big, in MM_SPLITS * max(1, D / (MM_SPLITS * MM_WIDE)) near-equal
 * blocks with edges on MM_GRAIN: fewer, wider calls repack the other
 * operand less (each call packs all of it), and a multiple of 4 equal
 * blocks loads 1, 2 or 4 threads evenly (the MM_BLOCK cut gave qkv's 2304
 * columns 9 blocks and a 768-wide output 3: one thread of 2 idled for a
 * ninth, a third of the call). Below 4 * MM_WIDE that is 4 blocks, so
 * under 1024 they are narrower than MM_BLOCK (768: 4 of 192); rounding the
 * block up to MM_GRAIN can leave one block fewer than the multiple of 4
 * (V = 50257: 48 planned, 47 of 1088). */
zk_gemm_cut zk_gemm_plan(int M, int N, int K) {
    const int by_cols = N >= M, D = by_cols ? N : M;
    zk_gemm_cut cut = { by_cols, MM_BLOCK };
    if (!cut_free_core() || D <= MM_BLOCK) return cut;
    int nb = MM_SPLITS * (D / (MM_SPLITS * MM_WIDE) > 1 ? D / (MM_SPLITS * MM_WIDE) : 1);
    int s = (D + nb - 1) / nb;
    s = (s + MM_GRAIN - 1) / MM_GRAIN * MM_GRAIN;
    /* the smallest block of either cut: its last one, or a whole one */
    int tail_old = D % MM_BLOCK ? D % MM_BLOCK : MM_BLOCK, tail_new = D % s ? D % s : s;
    int least = tail_old < tail_new ? tail_old : tail_new;
    if ((double)(by_cols ? M : N) * least * K < MM_BIG_MNK) return cut;
    cut.block = s;
    return cut;
}

/* C (M,N) = op(A) op(B) (+ bias (N) per row when bias is not NULL),
 * row-major, beta = 0, cut as `cut` says: block b covers [b*block, ...) of
 * the columns (by_cols) or rows. The bias is added to a block right after
 * its sgemm, while the block is still in cache: one fp32 add per element on
 * the finished dot, the same as a separate pass. */
static void gemm_blocks(int transA, int transB, int M, int N, int K,
                        const float *A, int lda, const float *B, int ldb,
                        float *C, int ldc, const float *bias, zk_gemm_cut cut) {
    const int by_cols = cut.by_cols, D = by_cols ? N : M;
    const int S = cut.block > 0 ? cut.block : (D > 0 ? D : 1);   /* no block size: one call */
    const int nb = (D + S - 1) / S;
    const enum CBLAS_TRANSPOSE ta = transA ? CblasTrans : CblasNoTrans;
    const enum CBLAS_TRANSPOSE tb = transB ? CblasTrans : CblasNoTrans;
    /* one thread inside each call (the process-wide setting above): blocks
     * are the only parallelism. */
    #pragma omp parallel for schedule(dynamic, 1) if (nb > 1)
    for (int b = 0; b < nb; b++) {
        int s = b * S, n = D - s < S ? D - s : S;
        /* the block: rows r0 .. r0+nr, columns c0 .. c0+nc of C */
        int r0 = by_cols ? 0 : s, nr = by_cols ? M : n, c0 = by_cols ? s : 0, nc = by_cols ? n : N;
        if (by_cols)   /* C[:, s:s+n] = op(A) op(B)[:, s:s+n] */
            cblas_sgemm(CblasRowMajor, ta, tb, M, n, K, 1.0f, A, lda,
                        transB ? B + (size_t)s * ldb : B + s, ldb, 0.0f, C + s, ldc);
        else           /* C[s:s+n, :] = op(A)[s:s+n, :] op(B) */
            cblas_sgemm(CblasRowMajor, ta, tb, n, N, K, 1.0f,
                        transA ? A + s : A + (size_t)s * lda, lda, B, ldb, 0.0f,
                        C + (size_t)s * ldc, ldc);
        if (bias == NULL) continue;
        for (int r = r0; r < r0 + nr; r++) {
            float *restrict o = C + (size_t)r * ldc + c0;
            const float *restrict bb = bias + c0;
            for (int j = 0; j < nc; j++) o[j] += bb[j];
        }
    }
}

void zk_gemm_blocked(int transA, int transB, int M, int N, int K,
                     const float *A, int lda, const float *B, int ldb,
                     float *C, int ldc, zk_gemm_cut cut) {
    gemm_blocks(transA, transB, M, N, K, A, lda, B, ldb, C, ldc, NULL, cut);
}

static void gemm_fixed_blocks(int transA, int transB, int M, int N, int K,
                              const float *A, int lda, const float *B, int ldb,
                              float *C, int ldc) {
    gemm_blocks(transA, transB, M, N, K, A, lda, B, ldb, C, ldc, NULL, zk_gemm_plan(M, N, K));
}

/* out (N,OC), rows ldo apart, = inp (N,C) @ weight (OC,C)^T + bias (OC);
 * bias may be NULL. The bias is added to each block right after its sgemm
 * (gemm_blocks), one rounding on the finished dot. ldo only places rows:
 * sgemm packs and sums the same, so the bits do not depend on it. */
void zk_matmul_forward(float *out, const float *inp, const float *weight,
                       const float *bias, int N, int C, int OC, int ldo) {
    gemm_blocks(0, 1, N, OC, C, inp, C, weight, C, out, ldo, bias, zk_gemm_plan(N, OC, C));
}

/* dinp (N,C) = dout @ weight WRITTEN (if not NULL); dweight (OC,C) =
 * dout^T @ inp WRITTEN (if not NULL), dout's rows ldo apart; dbias (OC) =
 * column sums of dout
 * WRITTEN (if not NULL), each column summed over the rows in order, in
 * double. The three outputs are independent computations over the same
 * fixed blocks, so each has the same bits whether computed in one call or in
 * separate calls (split backward: dinp first, the weights later). */
void zk_matmul_backward(float *dinp, float *dweight, float *dbias,
                        const float *dout, const float *inp,
                        const float *weight, int N, int C, int OC, int ldo) {
    if (dinp != NULL)
        gemm_fixed_blocks(0, 0, N, C, OC, dout, ldo, weight, C, dinp, C);
    if (dweight != NULL)
        gemm_fixed_blocks(1, 0, OC, C, N, dout, ldo, inp, C, dweight, C);
    if (dbias == NULL) return;
    int nchunk = (OC + MM_COL_CHUNK - 1) / MM_COL_CHUNK;
    #pragma omp parallel for schedule(static) if ((long)N * OC >= 65536)
    for (int k = 0; k < nchunk; k++) {
        int j0 = k * MM_COL_CHUNK, w = OC - j0 < MM_COL_CHUNK ? OC - j0 : MM_COL_CHUNK;
        double acc[MM_COL_CHUNK] = {0};
        for (int n = 0; n < N; n++) {
            const float *restrict d = dout + (size_t)n * ldo + j0;
            for (int j = 0; j < w; j++) acc[j] += (double)d[j];
        }
        for (int j = 0; j < w; j++) dbias[j0 + j] = (float)acc[j];
    }
}
