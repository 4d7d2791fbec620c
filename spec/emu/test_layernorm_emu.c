/*
 * test_layernorm_emu.c -- kernels/cuda/layernorm.cu's own source run on the
 * CPU under spec/emu/cuda_emu.h, against the CPU twin (zk_layernorm_*):
 * the forward, dinp (accumulated), and the weight gradients summed in
 * chunks of rows in double, then the chunks in order (the CPU sums every
 * row in order in double: the same terms, so within a float ulp). Both
 * paths: the scalar one (C not a multiple of 4) and the vector one (C % 4
 * == 0: 16-byte loads, the forward's row in registers, the backward's one
 * pass; cuda_emu.h aborts on a misaligned vector access), at 1 and 2
 * float4 groups a backward thread, a forward too wide for registers (C > 2048:
 * the scalar forward beside the vector backward), a backward too wide
 * (C > 4096: both scalar), chunks of 32 rows with
 * a last one short and row steps of 4 cut by it, and a single row.
 * Catches indexing, chunk and step bounds, the barrier, the scratch
 * layout; not the GPU's speed. Run: sh tools/emu_kernel.sh layernorm.
 */
#include <math.h>
#include <string.h>
#include "ctest.h"
#include "kernels.h"

int zkc_layernorm_forward(void *s, void *out, int out16, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, int N, int C);
int zkc_layernorm_backward(void *s, float *dinp, uint16_t *dinp16, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, const float *mean,
                           const float *rstd, int N, int C, double *scratch);
size_t zkc_layernorm_scratch(int N, int C);
int zkc_rmsnorm_forward(void *s, void *out, int out16, float *rstd, const float *inp,
                        const float *w, float eps, int N, int C);
int zkc_rmsnorm_backward(void *s, float *dinp, uint16_t *dinp16, float *dw, const float *dout,
                         const float *inp, const float *w, const float *rstd, int N, int C,
                         double *scratch);
size_t zkc_rmsnorm_scratch(int N, int C);
int zkc_layernorm_residual_forward(void *s, float *resid, void *out, int out16, float *mean,
                                   float *rstd, const float *a, const float *b2, const float *w,
                                   const float *b, int N, int C);

/* max |a - b| / max(max |b|, floor) over n */
static double rel(const float *a, const float *b, size_t n, double floor)
{
    double m = floor, d = 0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(b[i]) > m) m = fabs(b[i]);
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= d)) d = e;           /* NaN counts */
    }
    return d / m;
}

static void one(int N, int C)
{
    char name[160];
    size_t nc = (size_t)N * C;
    float *x = ct_rand(nc, -2, 2), *w = ct_rand(C, 0.5f, 1.5f), *b = ct_rand(C, -0.5f, 0.5f);
    float *dy = ct_rand(nc, -1, 1);
    float *o = malloc(nc * 4), *m = malloc(N * 4), *r = malloc(N * 4);
    float *go = malloc(nc * 4), *gm = malloc(N * 4), *gr = malloc(N * 4);
    zk_layernorm_forward(o, m, r, x, w, b, N, C);
    int rc = zkc_layernorm_forward(NULL, go, 0, gm, gr, x, w, b, N, C);
    double eo = rel(go, o, nc, 1e-3), em = rel(gm, m, N, 1e-3), er = rel(gr, r, N, 1e-3);
    snprintf(name, sizeof name, "emu layernorm forward N=%d C=%d: out, mean, rstd within 1e-5", N, C);
    ct_check(rc == 0 && eo < 1e-5 && em < 1e-5 && er < 1e-5, name, "rc %d, out %.3g, mean %.3g, "
             "rstd %.3g", rc, eo, em, er);
    /* a bf16 out: the fp32 out's elements rounded once, mean and rstd the same */
    uint16_t *g16 = malloc(nc * 2), *want16 = malloc(nc * 2);
    float *gm2 = malloc(N * 4), *gr2 = malloc(N * 4);
    rc = zkc_layernorm_forward(NULL, g16, 1, gm2, gr2, x, w, b, N, C);
    zk_cast_f32_bf16(want16, go, nc);
    snprintf(name, sizeof name, "emu layernorm forward N=%d C=%d bf16 out: the fp32 out rounded once", N, C);
    ct_check(rc == 0 && !memcmp(g16, want16, nc * 2) && !memcmp(gm2, gm, N * 4) && !memcmp(gr2, gr, N * 4),
             name, "rc %d, differ", rc);
    /* fused with the residual add: x = a + b2, the same kernel row on it */
    float *a = ct_rand(nc, -2, 2), *b2 = malloc(nc * 4), *res = malloc(nc * 4);
    for (size_t i = 0; i < nc; i++) b2[i] = x[i] - a[i];      /* a + b2: x or within an ulp */
    float *sum = malloc(nc * 4), *fo = malloc(nc * 4), *so = malloc(nc * 4);
    for (size_t i = 0; i < nc; i++) sum[i] = a[i] + b2[i];
    zkc_layernorm_forward(NULL, so, 0, gm2 = malloc(N * 4), gr2 = malloc(N * 4), sum, w, b, N, C);
    float *fm = malloc(N * 4), *fr = malloc(N * 4);
    rc = zkc_layernorm_residual_forward(NULL, res, fo, 0, fm, fr, a, b2, w, b, N, C);
    snprintf(name, sizeof name, "emu layernorm fused with the residual N=%d C=%d: add then forward's bits", N, C);
    ct_check(rc == 0 && !memcmp(res, sum, nc * 4) && !memcmp(fo, so, nc * 4) && !memcmp(fm, gm2, N * 4) &&
             !memcmp(fr, gr2, N * 4), name, "rc %d, differ", rc);
    uint16_t *f16 = malloc(nc * 2), *s16 = malloc(nc * 2);
    zk_cast_f32_bf16(s16, so, nc);
    rc = zkc_layernorm_residual_forward(NULL, res, f16, 1, fm, fr, a, b2, w, b, N, C);
    snprintf(name, sizeof name, "emu layernorm fused with the residual N=%d C=%d, bf16 out", N, C);
    ct_check(rc == 0 && !memcmp(f16, s16, nc * 2), name, "rc %d, differ", rc);
    free(a); free(b2); free(res); free(sum); free(fo); free(so); free(fm); free(fr); free(f16); free(s16);
    free(g16); free(want16); free(gm2); free(gr2);
    float *di = malloc(nc * 4), *gdi = malloc(nc * 4);
    float *dw = malloc(C * 4), *db = malloc(C * 4), *gdw = malloc(C * 4), *gdb = malloc(C * 4);
    for (size_t i = 0; i < nc; i++) di[i] = gdi[i] = 0.25f;    /* ACCUMULATED */
    for (int c = 0; c < C; c++) gdw[c] = gdb[c] = NAN;         /* WRITTEN */
    size_t ns = zkc_layernorm_scratch(N, C);
    double *scratch = malloc((ns ? ns : 1) * sizeof(double));
    for (size_t i = 0; i < ns; i++) scratch[i] = NAN;
    zk_layernorm_backward(di, dw, db, dy, x, w, m, r, N, C);
    /* the GPU side on the CPU's mean and rstd: the weight sums then see
     * the same terms, so only the grouping of double additions differs */
    rc = zkc_layernorm_backward(NULL, gdi, NULL, gdw, gdb, dy, x, w, m, r, N, C, scratch);
    double edi = rel(gdi, di, nc, 1e-3), edw = rel(gdw, dw, C, 1e-3), edb = rel(gdb, db, C, 1e-3);
    snprintf(name, sizeof name, "emu layernorm backward N=%d C=%d: dinp within 1e-5, dw and db "
             "within 1e-6 (chunked double sums)", N, C);
    ct_check(rc == 0 && edi < 1e-5 && edw < 1e-6 && edb < 1e-6, name, "rc %d, dinp %.3g, dw %.3g, "
             "db %.3g (scratch %zu doubles)", rc, edi, edw, edb, ns);
    /* dinp alone (weights NULL): no scratch touched */
    for (size_t i = 0; i < nc; i++) gdi[i] = 0.25f;
    rc = zkc_layernorm_backward(NULL, gdi, NULL, NULL, NULL, dy, x, w, m, r, N, C, NULL);
    edi = rel(gdi, di, nc, 1e-3);
    snprintf(name, sizeof name, "emu layernorm backward N=%d C=%d: dinp alone, no scratch", N, C);
    ct_check(rc == 0 && edi < 1e-5, name, "rc %d, dinp %.3g", rc, edi);
    /* with dinp16: dinp the same, dinp16 its bits rounded once (the cast's) */
    float *gdi2 = malloc(nc * 4);
    uint16_t *b16 = malloc(nc * 2), *w16 = malloc(nc * 2);
    for (size_t i = 0; i < nc; i++) { gdi2[i] = 0.25f; b16[i] = 0x7fc1; }
    rc = zkc_layernorm_backward(NULL, gdi2, b16, NULL, NULL, dy, x, w, m, r, N, C, NULL);
    zk_cast_f32_bf16(w16, gdi2, nc);
    snprintf(name, sizeof name, "emu layernorm backward N=%d C=%d: dinp16 = the new dinp rounded "
             "once, dinp unchanged", N, C);
    ct_check(rc == 0 && !memcmp(b16, w16, nc * 2) && !memcmp(gdi2, gdi, nc * 4), name,
             "rc %d, dinp16 %s, dinp %s", rc, memcmp(b16, w16, nc * 2) ? "differs" : "same",
             memcmp(gdi2, gdi, nc * 4) ? "differs" : "same");
    free(gdi2); free(b16); free(w16);
    free(x); free(w); free(b); free(dy); free(o); free(m); free(r); free(go); free(gm); free(gr);
    free(di); free(gdi); free(dw); free(db); free(gdw); free(gdb); free(scratch);
}

/* the RMS norm (the same paths, the mean 0, no bias) against zk_rmsnorm_* */
static void one_rms(int N, int C)
{
    char name[160];
    size_t nc = (size_t)N * C;
    float *x = ct_rand(nc, -2, 2), *w = ct_rand(C, 0.5f, 1.5f), *dy = ct_rand(nc, -1, 1);
    for (int n = 0; n < N; n++) x[(size_t)n * C] += (float)n;     /* rows of other scales */
    float *o = malloc(nc * 4), *r = malloc(N * 4), *go = malloc(nc * 4), *gr = malloc(N * 4);
    zk_rmsnorm_forward(o, r, x, w, 1e-6f, N, C);
    int rc = zkc_rmsnorm_forward(NULL, go, 0, gr, x, w, 1e-6f, N, C);
    double eo = rel(go, o, nc, 1e-3), er = rel(gr, r, N, 1e-3);
    snprintf(name, sizeof name, "emu rmsnorm forward N=%d C=%d: out, rstd within 1e-5", N, C);
    ct_check(rc == 0 && eo < 1e-5 && er < 1e-5, name, "rc %d, out %.3g, rstd %.3g", rc, eo, er);
    uint16_t *g16 = malloc(nc * 2), *want16 = malloc(nc * 2);
    rc = zkc_rmsnorm_forward(NULL, g16, 1, gr, x, w, 1e-6f, N, C);
    zk_cast_f32_bf16(want16, go, nc);
    snprintf(name, sizeof name, "emu rmsnorm forward N=%d C=%d bf16 out: the fp32 out rounded once", N, C);
    ct_check(rc == 0 && !memcmp(g16, want16, nc * 2), name, "rc %d, differ", rc);
    float *di = malloc(nc * 4), *gdi = malloc(nc * 4), *gdi2 = malloc(nc * 4);
    float *dw = malloc(C * 4), *gdw = malloc(C * 4);
    for (size_t i = 0; i < nc; i++) di[i] = gdi[i] = gdi2[i] = 0.25f;    /* ACCUMULATED */
    for (int c = 0; c < C; c++) gdw[c] = NAN;                            /* WRITTEN */
    size_t ns = zkc_rmsnorm_scratch(N, C);
    double *scratch = malloc((ns ? ns : 1) * sizeof(double));
    for (size_t i = 0; i < ns; i++) scratch[i] = NAN;
    zk_rmsnorm_backward(di, dw, dy, x, w, r, N, C);
    rc = zkc_rmsnorm_backward(NULL, gdi, NULL, gdw, dy, x, w, r, N, C, scratch);
    double edi = rel(gdi, di, nc, 1e-3), edw = rel(gdw, dw, C, 1e-3);
    snprintf(name, sizeof name, "emu rmsnorm backward N=%d C=%d: dinp within 1e-5, dw within 1e-6 "
             "(scratch of N/32 x C doubles)", N, C);
    ct_check(rc == 0 && edi < 1e-5 && edw < 1e-6, name, "rc %d, dinp %.3g, dw %.3g", rc, edi, edw);
    uint16_t *b16 = malloc(nc * 2), *w16 = malloc(nc * 2);
    rc = zkc_rmsnorm_backward(NULL, gdi2, b16, NULL, dy, x, w, r, N, C, NULL);
    zk_cast_f32_bf16(w16, gdi2, nc);
    snprintf(name, sizeof name, "emu rmsnorm backward N=%d C=%d: dinp alone has the fused call's "
             "bits, dinp16 it rounded once", N, C);
    ct_check(rc == 0 && !memcmp(gdi2, gdi, nc * 4) && !memcmp(b16, w16, nc * 2), name, "rc %d, differ", rc);
    /* the weight pass alone (dinp NULL): the fused call's dw bits */
    float *gdw2 = malloc(C * 4);
    for (size_t i = 0; i < ns; i++) scratch[i] = NAN;
    rc = zkc_rmsnorm_backward(NULL, NULL, NULL, gdw2, dy, x, w, r, N, C, scratch);
    snprintf(name, sizeof name, "emu rmsnorm backward N=%d C=%d: dw alone has the fused call's bits", N, C);
    ct_check(rc == 0 && !memcmp(gdw2, gdw, C * 4), name, "rc %d, differ", rc);
    free(gdw2);
    free(x); free(w); free(dy); free(o); free(r); free(go); free(gr); free(g16); free(want16);
    free(di); free(gdi); free(gdi2); free(dw); free(gdw); free(scratch); free(b16); free(w16);
}

/* rows 16-byte aligned only by C: a misaligned base (x one float off) takes
 * the scalar path, still within the tolerances of the CPU twin */
static void misaligned(int N, int C)
{
    char name[160];
    size_t nc = (size_t)N * C;
    float *x0 = ct_rand(nc + 1, -2, 2), *x = x0 + 1, *w = ct_rand(C, 0.5f, 1.5f), *b = ct_rand(C, -0.5f, 0.5f);
    float *o = malloc(nc * 4), *m = malloc(N * 4), *r = malloc(N * 4);
    float *go = malloc(nc * 4), *gm = malloc(N * 4), *gr = malloc(N * 4);
    zk_layernorm_forward(o, m, r, x, w, b, N, C);
    int rc = zkc_layernorm_forward(NULL, go, 0, gm, gr, x, w, b, N, C);
    snprintf(name, sizeof name, "emu layernorm forward N=%d C=%d, x misaligned: the scalar path, within 1e-5", N, C);
    ct_check(rc == 0 && rel(go, o, nc, 1e-3) < 1e-5, name, "rc %d, out %.3g", rc, rel(go, o, nc, 1e-3));
    free(x0); free(w); free(b); free(o); free(m); free(r); free(go); free(gm); free(gr);
}

int main(void)
{
    one(1, 5);
    one(300, 70);       /* scalar: 10 chunks, the last of 12 rows */
    one(257, 129);      /* scalar: two column blocks, the second of one column */
    one(1, 8);          /* vector: one row, 2 of 32 lanes' groups */
    one(67, 768);       /* vector: GPT-2's C (6 groups a lane forward, 192 threads backward);
                         * the last chunk 3 rows, a step of 4 cut at 3 */
    one(41, 1028);      /* vector: 257 groups, 12 a lane forward (9 in use), 288 threads */
    one(9, 2056);       /* forward scalar (17 groups a lane), backward vector, 2 a thread */
    one(5, 4100);       /* both scalar: C > 4096 */
    misaligned(9, 768);
    one_rms(300, 70);    /* scalar */
    one_rms(67, 768);    /* vector */
    one_rms(9, 2056);    /* scalar forward, vector backward (2 groups a thread) */
    size_t s = zkc_layernorm_scratch(16384, 768);
    ct_check(s == 2u * 512 * 768, "scratch for GPT-2's B=16 T=1024: 2 x 512 chunks x 768 doubles",
             "%zu", s);
    return ct_summary();
}
