/*
 * test_gemm_plan.c -- zk_gemm_plan's cut of an fp32 GEMM keeps the bits of
 * the cut every core used before it (the longer output dimension in blocks
 * of 256), on the sgemm core this process loaded, and the same again under
 * each other OpenBLAS core the CPU can run (the test re-runs itself with
 * OPENBLAS_CORETYPE set: the core is chosen when OpenBLAS loads).
 *
 * On SkylakeX the plan cuts differently (wider, fewer blocks) because that
 * core's bits do not depend on the cut; on Haswell they do and the plan
 * must keep the 256 cut. Deleting matmul.c's core check fails the Haswell
 * run here. Also: the cuts the plan may produce (edges on 64) and a few
 * others give the reference bits on SkylakeX, and the plan's blocks cover
 * the output.
 */
#include <cblas.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>
#include "ctest.h"
#include "kernels.h"

typedef struct { int ta, tb, M, N, K; } shape;

/* C (M,N) with `cut`; A, B hold enough for any op() of the shape */
static void run(const shape *s, const float *A, const float *B, float *C, zk_gemm_cut cut) {
    int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    zk_gemm_blocked(s->ta, s->tb, s->M, s->N, s->K, A, lda, B, ldb, C, s->N, cut);
}

static int core_is(const char *name) {
    const char *c = openblas_get_corename();
    return c != NULL && strcasecmp(c, name) == 0;
}

/* Below this many multiply-adds a call may take OpenBLAS's small-matrix or
 * direct path (other bits); the test's own figure, from OpenBLAS 0.3.21's
 * source (sgemm_direct_performant: 28*512*512), not the library's. */
#define BIG (28.0 * 512 * 512)

/* whether every block of `cut` is a big call */
static int all_big(const shape *s, zk_gemm_cut cut) {
    int D = cut.by_cols ? s->N : s->M, other = cut.by_cols ? s->M : s->N;
    int least = D < cut.block ? D : (D % cut.block ? D % cut.block : cut.block);
    return (double)other * least * s->K >= BIG;
}

static void check_shapes(void) {
    /* the three products of GPT-2-like layers at N = 256 rows and C = 384
     * (qkv, fc, a long "vocabulary"), then sizes whose 256 cut has a small
     * last block (the plan must keep the 256 cut there) */
    const int C = 384;
    const shape shapes[] = {
        {0, 1, 256, 3 * C, C}, {0, 0, 256, C, 3 * C}, {1, 0, 3 * C, C, 256},
        {0, 1, 256, 4 * C, C}, {1, 0, 4 * C, C, 256},
        {0, 1, 256, 2000, C}, {0, 0, 256, C, 2000}, {1, 0, 2000, C, 256},
        {0, 1, 37, 1000, 77}, {1, 1, 999, 300, 65}, {0, 0, 513, 257, 129}, {0, 0, 1100, 640, 300},
    };
    const char *core = openblas_get_corename();
    char name[160];
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        size_t na = (size_t)s->M * s->K, nb = (size_t)s->K * s->N, nc = (size_t)s->M * s->N;
        float *A = ct_rand(na, -1, 1), *B = ct_rand(nb, -1, 1);
        float *ref = ct_alloc(nc * 4), *got = ct_alloc(nc * 4);
        zk_gemm_cut old = {s->N >= s->M, 256}, plan = zk_gemm_plan(s->M, s->N, s->K);
        int same_cut = plan.by_cols == old.by_cols && plan.block == old.block;
        run(s, A, B, ref, old);
        memset(got, 0xff, nc * 4);   /* NaNs: a block the cut misses shows */
        run(s, A, B, got, plan);
        snprintf(name, sizeof name, "%s: plan (%s %d) of %dx%dx%d ta=%d tb=%d has the 256 cut's bits",
                 core, plan.by_cols ? "cols" : "rows", plan.block, s->M, s->N, s->K, s->ta, s->tb);
        ct_same_bits(name, got, ref, nc * 4);
        if (!core_is("SkylakeX") || !all_big(s, old)) {
            snprintf(name, sizeof name, "%s: plan of %dx%dx%d is the 256 cut (bits depend on it)",
                     core, s->M, s->N, s->K);
            ct_check(same_cut, name, "got %s %d", plan.by_cols ? "cols" : "rows", plan.block);
        } else {
            snprintf(name, sizeof name, "%s: plan of %dx%dx%d takes its own cut", core, s->M, s->N,
                     s->K);
            ct_check(!same_cut, name, "got %s %d",
                     plan.by_cols ? "cols" : "rows", plan.block);
            /* other big cuts on the cut-free core: both dimensions, odd edges */
            const zk_gemm_cut cuts[] = {{1, 320}, {0, 448}, {1, 1088}, {0, 4096}};
            int bad = -1, tried = 0;
            for (int k = 0; k < 4 && bad < 0; k++) {
                if (!all_big(s, cuts[k])) continue;
                tried++;
                run(s, A, B, got, cuts[k]);
                if (memcmp(got, ref, nc * 4) != 0) bad = k;
            }
            snprintf(name, sizeof name, "%s: %d other big cuts of %dx%dx%d have the 256 cut's bits",
                     core, tried, s->M, s->N, s->K);
            ct_check(bad < 0, name, "cut %d differs", bad);
        }
        free(A); free(B); free(ref); free(got);
    }
}

/* run this binary again under OPENBLAS_CORETYPE=core; 0 if all its checks pass */
static int rerun(const char *self, const char *core) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        setenv("OPENBLAS_CORETYPE", core, 1);
        execl(self, self, "--child", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) < 0) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(int argc, char **argv) {
    omp_set_num_threads(2);
    check_shapes();
    if (argc > 1 && strcmp(argv[1], "--child") == 0) return ct_failed != 0;
    fflush(stdout);
    const char *cores[2] = {"Haswell", "SkylakeX"};
    int can[2] = {__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"),
                  __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512cd")};
    /* readlink, not exec of /proc/self/exe: under valgrind that link names
     * valgrind's tool, and valgrind's readlink names the test */
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) { ct_fail("find this test's executable", "readlink failed"); return ct_summary(); }
    self[len] = 0;
    for (int k = 0; k < 2; k++) {
        if (!can[k] || core_is(cores[k])) continue;
        char name[96];
        snprintf(name, sizeof name, "the checks above pass again under OPENBLAS_CORETYPE=%s", cores[k]);
        int rc = rerun(self, cores[k]);
        ct_check(rc == 0, name, "exit %d", rc);
    }
    return ct_summary();
}
