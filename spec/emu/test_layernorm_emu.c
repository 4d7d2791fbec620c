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
 * The bf16 residual stream's entry points (_r16: bf16 rows in and out,
 * the backward's dout bf16, dinp bf16 accumulated) bit for bit against the
 * f32 kernels on the widened rows and within a bf16 ulp of the CPU twins,
 * on both paths, a C not a multiple of 4, rows 8-byte aligned but not 16,
 * and misaligned.
 * A bf16 run's parameters (p16: w and b bf16, widened as read): every
 * entry point bit for bit against the same call on their widened f32
 * copies, on every path, f32 rows (f32 and bf16 out) and bf16 ones, rows
 * misaligned, parameters on 8 bytes (bf16) and 16 (f32) and off both
 * (a kernel reading the bf16 parameters as f32 fails it: checked by hand
 * with SRC=). A bf16 run's weight gradients (g16: dw, db bf16) on the same
 * calls: the fp32 dw, db rounded once, dinp the same bits.
 * Catches indexing, chunk and step bounds, the barrier, the scratch
 * layout; not the GPU's speed. Run: sh tools/emu_kernel.sh layernorm.
 */
#include <math.h>
#include <string.h>
#include "ctest.h"
#include "kernels.h"

/* kernels/cuda/layernorm.cu's entry points (kernels.cuh; the stream a
 * void * here) */
int zkc_layernorm_forward(void *s, void *out, int out16, float *mean, float *rstd, const float *inp,
                          const void *w, const void *b, int p16, int N, int C);
int zkc_layernorm_backward(void *s, float *dinp, uint16_t *dinp16, void *dw, void *db, int g16, const float *dout,
                           const float *inp, const void *w, int p16, const float *mean,
                           const float *rstd, int N, int C, double *scratch);
size_t zkc_layernorm_scratch(int N, int C);
int zkc_rmsnorm_forward(void *s, void *out, int out16, float *rstd, const float *inp,
                        const void *w, int p16, float eps, int N, int C);
int zkc_rmsnorm_backward(void *s, float *dinp, uint16_t *dinp16, void *dw, int g16, const float *dout,
                         const float *inp, const void *w, int p16, const float *rstd, int N, int C,
                         double *scratch);
size_t zkc_rmsnorm_scratch(int N, int C);
int zkc_layernorm_residual_forward(void *s, float *resid, void *out, int out16, float *mean,
                                   float *rstd, const float *a, const float *b2, const void *w,
                                   const void *b, int p16, int N, int C);
int zkc_layernorm_forward_r16(void *s, uint16_t *out, float *mean, float *rstd,
                              const uint16_t *inp, const void *w, const void *b, int p16, int N,
                              int C);
int zkc_layernorm_residual_forward_r16(void *s, uint16_t *resid, uint16_t *out, float *mean,
                                       float *rstd, const uint16_t *a, const uint16_t *b2,
                                       const void *w, const void *b, int p16, int N, int C);
int zkc_layernorm_backward_r16(void *s, uint16_t *dinp, void *dw, void *db, int g16, const uint16_t *dout,
                               const uint16_t *inp, const void *w, int p16, const float *mean,
                               const float *rstd, int N, int C, double *scratch);
int zkc_rmsnorm_forward_r16(void *s, uint16_t *out, float *rstd, const uint16_t *inp,
                            const void *w, int p16, float eps, int N, int C);
int zkc_rmsnorm_backward_r16(void *s, uint16_t *dinp, void *dw, int g16, const uint16_t *dout,
                             const uint16_t *inp, const void *w, int p16, const float *rstd, int N,
                             int C, double *scratch);

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
    int rc = zkc_layernorm_forward(NULL, go, 0, gm, gr, x, w, b, 0, N, C);
    double eo = rel(go, o, nc, 1e-3), em = rel(gm, m, N, 1e-3), er = rel(gr, r, N, 1e-3);
    snprintf(name, sizeof name, "emu layernorm forward N=%d C=%d: out, mean, rstd within 1e-5", N, C);
    ct_check(rc == 0 && eo < 1e-5 && em < 1e-5 && er < 1e-5, name, "rc %d, out %.3g, mean %.3g, "
             "rstd %.3g", rc, eo, em, er);
    /* a bf16 out: the fp32 out's elements rounded once, mean and rstd the same */
    uint16_t *g16 = malloc(nc * 2), *want16 = malloc(nc * 2);
    float *gm2 = malloc(N * 4), *gr2 = malloc(N * 4);
    rc = zkc_layernorm_forward(NULL, g16, 1, gm2, gr2, x, w, b, 0, N, C);
    zk_cast_f32_bf16(want16, go, nc);
    snprintf(name, sizeof name, "emu layernorm forward N=%d C=%d bf16 out: the fp32 out rounded once", N, C);
    ct_check(rc == 0 && !memcmp(g16, want16, nc * 2) && !memcmp(gm2, gm, N * 4) && !memcmp(gr2, gr, N * 4),
             name, "rc %d, differ", rc);
    /* fused with the residual add: x = a + b2, the same kernel row on it */
    float *a = ct_rand(nc, -2, 2), *b2 = malloc(nc * 4), *res = malloc(nc * 4);
    for (size_t i = 0; i < nc; i++) b2[i] = x[i] - a[i];      /* a + b2: x or within an ulp */
    float *sum = malloc(nc * 4), *fo = malloc(nc * 4), *so = malloc(nc * 4);
    for (size_t i = 0; i < nc; i++) sum[i] = a[i] + b2[i];
    zkc_layernorm_forward(NULL, so, 0, gm2 = malloc(N * 4), gr2 = malloc(N * 4), sum, w, b, 0, N, C);
    float *fm = malloc(N * 4), *fr = malloc(N * 4);
    rc = zkc_layernorm_residual_forward(NULL, res, fo, 0, fm, fr, a, b2, w, b, 0, N, C);
    snprintf(name, sizeof name, "emu layernorm fused with the residual N=%d C=%d: add then forward's bits", N, C);
    ct_check(rc == 0 && !memcmp(res, sum, nc * 4) && !memcmp(fo, so, nc * 4) && !memcmp(fm, gm2, N * 4) &&
             !memcmp(fr, gr2, N * 4), name, "rc %d, differ", rc);
    uint16_t *f16 = malloc(nc * 2), *s16 = malloc(nc * 2);
    zk_cast_f32_bf16(s16, so, nc);
    rc = zkc_layernorm_residual_forward(NULL, res, f16, 1, fm, fr, a, b2, w, b, 0, N, C);
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
    rc = zkc_layernorm_backward(NULL, gdi, NULL, gdw, gdb, 0, dy, x, w, 0, m, r, N, C, scratch);
    double edi = rel(gdi, di, nc, 1e-3), edw = rel(gdw, dw, C, 1e-3), edb = rel(gdb, db, C, 1e-3);
    snprintf(name, sizeof name, "emu layernorm backward N=%d C=%d: dinp within 1e-5, dw and db "
             "within 1e-6 (chunked double sums)", N, C);
    ct_check(rc == 0 && edi < 1e-5 && edw < 1e-6 && edb < 1e-6, name, "rc %d, dinp %.3g, dw %.3g, "
             "db %.3g (scratch %zu doubles)", rc, edi, edw, edb, ns);
    /* dinp alone (weights NULL): no scratch touched */
    for (size_t i = 0; i < nc; i++) gdi[i] = 0.25f;
    rc = zkc_layernorm_backward(NULL, gdi, NULL, NULL, NULL, 0, dy, x, w, 0, m, r, N, C, NULL);
    edi = rel(gdi, di, nc, 1e-3);
    snprintf(name, sizeof name, "emu layernorm backward N=%d C=%d: dinp alone, no scratch", N, C);
    ct_check(rc == 0 && edi < 1e-5, name, "rc %d, dinp %.3g", rc, edi);
    /* with dinp16: dinp the same, dinp16 its bits rounded once (the cast's) */
    float *gdi2 = malloc(nc * 4);
    uint16_t *b16 = malloc(nc * 2), *w16 = malloc(nc * 2);
    for (size_t i = 0; i < nc; i++) { gdi2[i] = 0.25f; b16[i] = 0x7fc1; }
    rc = zkc_layernorm_backward(NULL, gdi2, b16, NULL, NULL, 0, dy, x, w, 0, m, r, N, C, NULL);
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
    int rc = zkc_rmsnorm_forward(NULL, go, 0, gr, x, w, 0, 1e-6f, N, C);
    double eo = rel(go, o, nc, 1e-3), er = rel(gr, r, N, 1e-3);
    snprintf(name, sizeof name, "emu rmsnorm forward N=%d C=%d: out, rstd within 1e-5", N, C);
    ct_check(rc == 0 && eo < 1e-5 && er < 1e-5, name, "rc %d, out %.3g, rstd %.3g", rc, eo, er);
    uint16_t *g16 = malloc(nc * 2), *want16 = malloc(nc * 2);
    rc = zkc_rmsnorm_forward(NULL, g16, 1, gr, x, w, 0, 1e-6f, N, C);
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
    rc = zkc_rmsnorm_backward(NULL, gdi, NULL, gdw, 0, dy, x, w, 0, r, N, C, scratch);
    double edi = rel(gdi, di, nc, 1e-3), edw = rel(gdw, dw, C, 1e-3);
    snprintf(name, sizeof name, "emu rmsnorm backward N=%d C=%d: dinp within 1e-5, dw within 1e-6 "
             "(scratch of N/32 x C doubles)", N, C);
    ct_check(rc == 0 && edi < 1e-5 && edw < 1e-6, name, "rc %d, dinp %.3g, dw %.3g", rc, edi, edw);
    uint16_t *b16 = malloc(nc * 2), *w16 = malloc(nc * 2);
    rc = zkc_rmsnorm_backward(NULL, gdi2, b16, NULL, 0, dy, x, w, 0, r, N, C, NULL);
    zk_cast_f32_bf16(w16, gdi2, nc);
    snprintf(name, sizeof name, "emu rmsnorm backward N=%d C=%d: dinp alone has the fused call's "
             "bits, dinp16 it rounded once", N, C);
    ct_check(rc == 0 && !memcmp(gdi2, gdi, nc * 4) && !memcmp(b16, w16, nc * 2), name, "rc %d, differ", rc);
    /* the weight pass alone (dinp NULL): the fused call's dw bits */
    float *gdw2 = malloc(C * 4);
    for (size_t i = 0; i < ns; i++) scratch[i] = NAN;
    rc = zkc_rmsnorm_backward(NULL, NULL, NULL, gdw2, 0, dy, x, w, 0, r, N, C, scratch);
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
    int rc = zkc_layernorm_forward(NULL, go, 0, gm, gr, x, w, b, 0, N, C);
    snprintf(name, sizeof name, "emu layernorm forward N=%d C=%d, x misaligned: the scalar path, within 1e-5", N, C);
    ct_check(rc == 0 && rel(go, o, nc, 1e-3) < 1e-5, name, "rc %d, out %.3g", rc, rel(go, o, nc, 1e-3));
    free(x0); free(w); free(b); free(o); free(m); free(r); free(go); free(gm); free(gr);
}

/* ---- the bf16 residual stream ("r16") ---------------------------------- */

/* n elements at element offset off from a 64-byte boundary (free(p - off)):
 * bf16 rows off % 4 != 0 miss their 8-byte vector access, float rows their
 * 16-byte one, so both take the scalar path; off 4: bf16 rows on 8 bytes,
 * not 16, float rows on 16 -- both the vector path */
static uint16_t *h_at(size_t n, int off)
{
    return (uint16_t *)aligned_alloc(64, ((n + (size_t)off) * 2 + 63) / 64 * 64) + off;
}
static float *f_at(size_t n, int off)
{
    return (float *)aligned_alloc(64, ((n + (size_t)off) * 4 + 63) / 64 * 64) + off;
}
static float wide(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* the worst |a - b| over n bf16 pairs in units of (one bf16 ulp of b +
 * tol x max |b|): <= 1 is "within a bf16 ulp" (NaN counts) */
static double ulps16(const uint16_t *a, const uint16_t *b, size_t n, double tol)
{
    double m = 0, worst = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(wide(b[i])) > m) m = fabs(wide(b[i]));
    for (size_t i = 0; i < n; i++) {
        double fa = wide(a[i]), fb = wide(b[i]), d = fb == 0 ? 0 : ldexp(1.0, ilogb(fb) - 7);
        d += tol * m;
        double e = d > 0 ? fabs(fa - fb) / d : fa == fb ? 0 : INFINITY;
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

/* The r16 entry points (rows x, resid, dinp and the backward's dout bf16)
 * are the f32 kernels on the widened rows with each bf16 store rounded
 * once: checked bit for bit
 * against the f32 kernels run on the widened rows at the same offset (so
 * the same path; their bf16 out, and dinp16 = their accumulated dinp
 * rounded once), and against the CPU twins (zk_*_r16) within a bf16 ulp.
 * The backward accumulates onto random bf16 dinp; split calls (dinp alone,
 * the weights alone) give the fused call's bits. */
static void one_r16(int N, int C, int off, int rms)
{
    char name[200];
    const char *k = rms ? "rmsnorm" : "layernorm";
    const float eps = rms ? 1e-6f : 1e-5f;
    size_t nc = (size_t)N * C;
    float *xf = ct_rand(nc, -2, 2), *w = ct_rand(C, 0.5f, 1.5f), *b = ct_rand(C, -0.5f, 0.5f);
    float *dyf = ct_rand(nc, -1, 1), *d0f = ct_rand(nc, -1, 1);
    for (size_t i = 0; i < nc; i++) xf[i] += 0.25f * (float)(i / (size_t)C);  /* rows of other means */
    uint16_t *x = h_at(nc, off), *d0 = h_at(nc, off), *dy = h_at(nc, off);
    float *xw = f_at(nc, off), *d0w = f_at(nc, off), *dyw = f_at(nc, off);
    zk_cast_f32_bf16(x, xf, nc); zk_cast_bf16_f32(xw, x, nc);
    zk_cast_f32_bf16(d0, d0f, nc); zk_cast_bf16_f32(d0w, d0, nc);
    zk_cast_f32_bf16(dy, dyf, nc); zk_cast_bf16_f32(dyw, dy, nc);     /* dout bf16, and widened */
    uint16_t *go = h_at(nc, off), *fo = h_at(nc, off), *co = h_at(nc, off);
    float *gm = malloc(N * 4), *gr = malloc(N * 4), *fm = malloc(N * 4), *fr = malloc(N * 4);
    float *cm = malloc(N * 4), *cr = malloc(N * 4);
    for (int n = 0; n < N; n++) gm[n] = fm[n] = cm[n] = 0.0f;     /* RMS: no mean */

    /* forward */
    int rc, rc2;
    if (rms) {
        rc = zkc_rmsnorm_forward_r16(NULL, go, gr, x, w, 0, eps, N, C);
        rc2 = zkc_rmsnorm_forward(NULL, fo, 1, fr, xw, w, 0, eps, N, C);
        zk_rmsnorm_forward_r16(co, cr, x, w, eps, N, C);
    } else {
        rc = zkc_layernorm_forward_r16(NULL, go, gm, gr, x, w, b, 0, N, C);
        rc2 = zkc_layernorm_forward(NULL, fo, 1, fm, fr, xw, w, b, 0, N, C);
        zk_layernorm_forward_r16(co, cm, cr, x, w, b, N, C);
    }
    snprintf(name, sizeof name, "emu %s r16 forward N=%d C=%d off=%d: out, %srstd the f32 kernel's "
             "bits on the widened rows", k, N, C, off, rms ? "" : "mean, ");
    ct_check(rc == 0 && rc2 == 0 && !memcmp(go, fo, nc * 2) && !memcmp(gm, fm, N * 4) &&
             !memcmp(gr, fr, N * 4), name, "rc %d/%d, out %s, mean %s, rstd %s", rc, rc2,
             memcmp(go, fo, nc * 2) ? "differs" : "same", memcmp(gm, fm, N * 4) ? "differs" : "same",
             memcmp(gr, fr, N * 4) ? "differs" : "same");
    double eo = ulps16(go, co, nc, 1e-5), em = rel(gm, cm, N, 1e-3), er = rel(gr, cr, N, 1e-3);
    snprintf(name, sizeof name, "emu %s r16 forward N=%d C=%d off=%d: the CPU twin's out within a bf16 "
             "ulp, %srstd within 1e-5", k, N, C, off, rms ? "" : "mean, ");
    ct_check(eo <= 1 && em < 1e-5 && er < 1e-5, name, "out %.3g ulps, mean %.3g, rstd %.3g", eo, em, er);

    /* the residual add fused (layer norm only): resid = a + b2 rounded
     * once, the norm on the stored (rounded) resid */
    if (!rms) {
        float *af = ct_rand(nc, -2, 2), *bf = ct_rand(nc, -1, 1);
        for (size_t i = 0; i < nc; i++) af[i] += 0.25f * (float)(i / (size_t)C);
        uint16_t *a = h_at(nc, off), *b2 = h_at(nc, off), *want = h_at(nc, off);
        uint16_t *gres = h_at(nc, off), *go2 = h_at(nc, off), *so = h_at(nc, off);
        uint16_t *cres = h_at(nc, off), *co2 = h_at(nc, off);
        float *gm2 = malloc(N * 4), *gr2 = malloc(N * 4), *sm = malloc(N * 4), *sr = malloc(N * 4);
        zk_cast_f32_bf16(a, af, nc); zk_cast_f32_bf16(b2, bf, nc);
        zk_add3_b16(want, a, b2, nc);
        rc = zkc_layernorm_residual_forward_r16(NULL, gres, go2, gm2, gr2, a, b2, w, b, 0, N, C);
        snprintf(name, sizeof name, "emu layernorm r16 residual N=%d C=%d off=%d: resid = a + b2 rounded "
                 "once (zk_add3_b16's bits)", N, C, off);
        ct_check(rc == 0 && !memcmp(gres, want, nc * 2), name, "rc %d, resid differs", rc);
        rc2 = zkc_layernorm_forward_r16(NULL, so, sm, sr, want, w, b, 0, N, C);
        snprintf(name, sizeof name, "emu layernorm r16 residual N=%d C=%d off=%d: out, mean, rstd the r16 "
                 "forward's bits on the rounded resid", N, C, off);
        ct_check(rc == 0 && rc2 == 0 && !memcmp(go2, so, nc * 2) && !memcmp(gm2, sm, N * 4) &&
                 !memcmp(gr2, sr, N * 4), name, "rc %d/%d, out %s, mean %s, rstd %s", rc, rc2,
                 memcmp(go2, so, nc * 2) ? "differs" : "same", memcmp(gm2, sm, N * 4) ? "differs" : "same",
                 memcmp(gr2, sr, N * 4) ? "differs" : "same");
        zk_layernorm_residual_forward_r16(cres, co2, sm, sr, a, b2, w, b, N, C);
        eo = ulps16(go2, co2, nc, 1e-5);
        snprintf(name, sizeof name, "emu layernorm r16 residual N=%d C=%d off=%d: the CPU twin's resid "
                 "bits, out within a bf16 ulp", N, C, off);
        ct_check(!memcmp(gres, cres, nc * 2) && eo <= 1, name, "resid %s, out %.3g ulps",
                 memcmp(gres, cres, nc * 2) ? "differs" : "same", eo);
        free(af); free(bf); free(a - off); free(b2 - off); free(want - off); free(gres - off);
        free(go2 - off); free(so - off); free(cres - off); free(co2 - off);
        free(gm2); free(gr2); free(sm); free(sr);
    }

    /* backward on the CPU twin's mean and rstd; dinp ACCUMULATED onto d0,
     * dw and db WRITTEN */
    size_t ns = rms ? zkc_rmsnorm_scratch(N, C) : zkc_layernorm_scratch(N, C);
    double *scratch = malloc((ns ? ns : 1) * sizeof(double));
    for (size_t i = 0; i < ns; i++) scratch[i] = NAN;
    uint16_t *gdi = h_at(nc, off), *fdi16 = h_at(nc, off), *cdi = h_at(nc, off);
    float *fdi = f_at(nc, off);
    memcpy(gdi, d0, nc * 2); memcpy(cdi, d0, nc * 2); memcpy(fdi, d0w, nc * 4);
    for (size_t i = 0; i < nc; i++) fdi16[i] = 0x7fc1;
    float *gdw = malloc(C * 4), *gdb = malloc(C * 4), *fdw = malloc(C * 4), *fdb = malloc(C * 4);
    float *cdw = malloc(C * 4), *cdb = malloc(C * 4);
    for (int c = 0; c < C; c++) gdw[c] = gdb[c] = fdw[c] = fdb[c] = cdb[c] = NAN;
    if (rms) {
        rc = zkc_rmsnorm_backward_r16(NULL, gdi, gdw, 0, dy, x, w, 0, cr, N, C, scratch);
        rc2 = zkc_rmsnorm_backward(NULL, fdi, fdi16, fdw, 0, dyw, xw, w, 0, cr, N, C, scratch);
        zk_rmsnorm_backward_r16(cdi, cdw, dy, x, w, cr, N, C);
        for (int c = 0; c < C; c++) gdb[c] = fdb[c] = cdb[c] = 0.0f;
    } else {
        rc = zkc_layernorm_backward_r16(NULL, gdi, gdw, gdb, 0, dy, x, w, 0, cm, cr, N, C, scratch);
        rc2 = zkc_layernorm_backward(NULL, fdi, fdi16, fdw, fdb, 0, dyw, xw, w, 0, cm, cr, N, C, scratch);
        zk_layernorm_backward_r16(cdi, cdw, cdb, dy, x, w, cm, cr, N, C);
    }
    snprintf(name, sizeof name, "emu %s r16 backward N=%d C=%d off=%d: dinp (accumulated) the f32 "
             "kernel's dinp16 bits on the widened rows, dw%s its bits", k, N, C, off, rms ? "" : " and db");
    ct_check(rc == 0 && rc2 == 0 && !memcmp(gdi, fdi16, nc * 2) && !memcmp(gdw, fdw, C * 4) &&
             !memcmp(gdb, fdb, C * 4), name, "rc %d/%d, dinp %s, dw %s, db %s", rc, rc2,
             memcmp(gdi, fdi16, nc * 2) ? "differs" : "same", memcmp(gdw, fdw, C * 4) ? "differs" : "same",
             memcmp(gdb, fdb, C * 4) ? "differs" : "same");
    double edi = ulps16(gdi, cdi, nc, 1e-5), edw = rel(gdw, cdw, C, 1e-3), edb = rel(gdb, cdb, C, 1e-3);
    snprintf(name, sizeof name, "emu %s r16 backward N=%d C=%d off=%d: the CPU twin's dinp within a bf16 "
             "ulp, dw%s within 1e-6", k, N, C, off, rms ? "" : " and db");
    ct_check(edi <= 1 && edw < 1e-6 && edb < 1e-6, name, "dinp %.3g ulps, dw %.3g, db %.3g", edi, edw, edb);
    /* split: dinp alone (no scratch), then the weights alone */
    uint16_t *gdi2 = h_at(nc, off);
    float *gdw2 = malloc(C * 4), *gdb2 = malloc(C * 4);
    memcpy(gdi2, d0, nc * 2);
    rc = rms ? zkc_rmsnorm_backward_r16(NULL, gdi2, NULL, 0, dy, x, w, 0, cr, N, C, NULL)
             : zkc_layernorm_backward_r16(NULL, gdi2, NULL, NULL, 0, dy, x, w, 0, cm, cr, N, C, NULL);
    snprintf(name, sizeof name, "emu %s r16 backward N=%d C=%d off=%d: dinp alone has the fused call's "
             "bits", k, N, C, off);
    ct_check(rc == 0 && !memcmp(gdi2, gdi, nc * 2), name, "rc %d, differ", rc);
    for (int c = 0; c < C; c++) gdw2[c] = gdb2[c] = NAN;
    for (size_t i = 0; i < ns; i++) scratch[i] = NAN;
    if (rms) {
        rc = zkc_rmsnorm_backward_r16(NULL, NULL, gdw2, 0, dy, x, w, 0, cr, N, C, scratch);
        for (int c = 0; c < C; c++) gdb2[c] = 0.0f;
    } else {
        rc = zkc_layernorm_backward_r16(NULL, NULL, gdw2, gdb2, 0, dy, x, w, 0, cm, cr, N, C, scratch);
    }
    snprintf(name, sizeof name, "emu %s r16 backward N=%d C=%d off=%d: dw%s alone %s the fused call's bits",
             k, N, C, off, rms ? "" : " and db", rms ? "has" : "have");
    ct_check(rc == 0 && !memcmp(gdw2, gdw, C * 4) && !memcmp(gdb2, gdb, C * 4), name, "rc %d, differ", rc);

    free(xf); free(w); free(b); free(dyf); free(dy - off); free(dyw - off); free(d0f); free(x - off);
    free(d0 - off); free(xw - off);
    free(d0w - off); free(go - off); free(fo - off); free(co - off); free(gm); free(gr); free(fm);
    free(fr); free(cm); free(cr); free(scratch); free(gdi - off); free(fdi16 - off); free(cdi - off);
    free(fdi - off); free(gdw); free(gdb); free(fdw); free(fdb); free(cdw); free(cdb);
    free(gdi2 - off); free(gdw2); free(gdb2);
}

/* ---- a bf16 run's parameters ("p16") ----------------------------------- */

/* one side of one_p16: every norm output */
struct p16_io {
    void *o, *res, *o2, *di, *o3, *di3;     /* rows: out, resid, out2, dinp (LN); out, dinp (RMS) */
    float *m, *r, *m2, *r2, *r3, *dw, *db, *dw3;
};
/* the layer norm's forward, residual forward and backward, the RMS norm's
 * forward and backward, with the parameters w, b as p16 says; the rows f32
 * (out16: the outs bf16) or bf16 (r16); the backwards on the given mean,
 * rstd (rstd3 the RMS norm's) */
static int p16_run(struct p16_io *io, int r16, int out16, const void *x, const void *a,
                   const void *b2, const void *dy, const void *w, const void *b, int p16,
                   const float *mean, const float *rstd, const float *rstd3, int N, int C,
                   double *scratch)
{
    int rc = 0;
    if (r16) {
        rc |= zkc_layernorm_forward_r16(NULL, io->o, io->m, io->r, x, w, b, p16, N, C);
        rc |= zkc_layernorm_residual_forward_r16(NULL, io->res, io->o2, io->m2, io->r2, a, b2, w, b,
                                                 p16, N, C);
        rc |= zkc_layernorm_backward_r16(NULL, io->di, io->dw, io->db, 0, dy, x, w, p16, mean, rstd,
                                         N, C, scratch);
        rc |= zkc_rmsnorm_forward_r16(NULL, io->o3, io->r3, x, w, p16, 1e-6f, N, C);
        rc |= zkc_rmsnorm_backward_r16(NULL, io->di3, io->dw3, 0, dy, x, w, p16, rstd3, N, C, scratch);
    } else {
        rc |= zkc_layernorm_forward(NULL, io->o, out16, io->m, io->r, x, w, b, p16, N, C);
        rc |= zkc_layernorm_residual_forward(NULL, io->res, io->o2, out16, io->m2, io->r2, a, b2, w,
                                             b, p16, N, C);
        rc |= zkc_layernorm_backward(NULL, io->di, NULL, io->dw, io->db, 0, dy, x, w, p16, mean, rstd,
                                     N, C, scratch);
        rc |= zkc_rmsnorm_forward(NULL, io->o3, out16, io->r3, x, w, p16, 1e-6f, N, C);
        rc |= zkc_rmsnorm_backward(NULL, io->di3, NULL, io->dw3, 0, dy, x, w, p16, rstd3, N, C, scratch);
    }
    return rc;
}

/* Every entry point with bf16 parameters (p16 1: w and b bf16 bits)
 * against the same call on their widened f32 copies (p16 0), bit for bit
 * -- the contract: widened exactly as read, nothing else changes. The rows
 * f32 (an f32 or a bf16 out) or bf16 (r16), roff elements past 64 bytes
 * (1: off their vector access, the scalar paths); both parameter copies
 * poff elements past 64 bytes: 4, the bf16 ones on 8 bytes and the f32
 * ones on 16 (the vector path either way), 1 neither (the scalar path
 * either way: a bf16 parameter counts as aligned where its f32 copy at the
 * same element offset would). */
static void one_p16(int N, int C, int r16, int out16, int roff, int poff)
{
    char name[240];
    size_t nc = (size_t)N * C, es = r16 ? 2 : 4, oes = r16 || out16 ? 2 : 4;
    float *rf[5];                            /* x, a, b2, dy, dinp's start: bf16 values */
    void *rows[5];
    for (int k = 0; k < 5; k++) {
        rf[k] = ct_rand(nc, -2, 2);
        for (size_t i = 0; i < nc; i++) rf[k][i] += 0.25f * (float)(i / (size_t)C);
        uint16_t *h = h_at(nc, roff);
        zk_cast_f32_bf16(h, rf[k], nc); zk_cast_bf16_f32(rf[k], h, nc);
        if (r16) rows[k] = h;
        else { rows[k] = f_at(nc, roff); memcpy(rows[k], rf[k], nc * 4); free(h - roff); }
    }
    float *wr = ct_rand(C, 0.5f, 1.5f), *br = ct_rand(C, -0.5f, 0.5f);
    uint16_t *w16 = h_at(C, poff), *b16 = h_at(C, poff);
    float *wf = f_at(C, poff), *bf = f_at(C, poff);
    zk_cast_f32_bf16(w16, wr, C); zk_cast_f32_bf16(b16, br, C);
    zk_cast_bf16_f32(wf, w16, C); zk_cast_bf16_f32(bf, b16, C);
    /* the backwards' mean and rstd: the CPU twins' on the widened rows */
    float *o = malloc(nc * 4), *mean = malloc(N * 4), *rstd = malloc(N * 4), *rstd3 = malloc(N * 4);
    zk_layernorm_forward(o, mean, rstd, rf[0], wf, bf, N, C);
    zk_rmsnorm_forward(o, rstd3, rf[0], wf, 1e-6f, N, C);
    size_t ns = zkc_layernorm_scratch(N, C);
    double *scratch = malloc((ns ? ns : 1) * sizeof(double));
    struct p16_io io[2];
    size_t rsz[6] = { nc * oes, nc * es, nc * oes, nc * es, nc * oes, nc * es };
    int rc[2];
    for (int p = 0; p < 2; p++) {
        void **rw[6] = { &io[p].o, &io[p].res, &io[p].o2, &io[p].di, &io[p].o3, &io[p].di3 };
        float **fl[8] = { &io[p].m, &io[p].r, &io[p].m2, &io[p].r2, &io[p].r3, &io[p].dw, &io[p].db,
                          &io[p].dw3 };
        for (int k = 0; k < 6; k++) {
            *rw[k] = rsz[k] / nc == 2 ? (void *)h_at(nc, roff) : (void *)f_at(nc, roff);
            memset(*rw[k], 0x7f, rsz[k]);
        }
        memcpy(io[p].di, rows[4], nc * es);        /* ACCUMULATED */
        memcpy(io[p].di3, rows[4], nc * es);
        for (int k = 0; k < 8; k++) {
            *fl[k] = malloc((size_t)(k < 5 ? N : C) * 4);
            memset(*fl[k], 0x7f, (size_t)(k < 5 ? N : C) * 4);
        }
        rc[p] = p16_run(&io[p], r16, out16, rows[0], rows[1], rows[2], rows[3], p ? (void *)w16 : wf,
                        p ? (void *)b16 : bf, p, mean, rstd, rstd3, N, C, scratch);
    }
    static const char *rn[6] = { "out", "resid", "residual out", "dinp", "rms out", "rms dinp" };
    static const char *fn[8] = { "mean", "rstd", "residual mean", "residual rstd", "rms rstd", "dw",
                                 "db", "rms dw" };
    char diff[200] = "";
    const void *r0[6] = { io[0].o, io[0].res, io[0].o2, io[0].di, io[0].o3, io[0].di3 };
    const void *r1[6] = { io[1].o, io[1].res, io[1].o2, io[1].di, io[1].o3, io[1].di3 };
    const float *f0[8] = { io[0].m, io[0].r, io[0].m2, io[0].r2, io[0].r3, io[0].dw, io[0].db, io[0].dw3 };
    const float *f1[8] = { io[1].m, io[1].r, io[1].m2, io[1].r2, io[1].r3, io[1].dw, io[1].db, io[1].dw3 };
    for (int k = 0; k < 6; k++)
        if (memcmp(r0[k], r1[k], rsz[k])) snprintf(diff + strlen(diff), sizeof diff - strlen(diff), " %s", rn[k]);
    for (int k = 0; k < 8; k++)
        if (memcmp(f0[k], f1[k], (size_t)(k < 5 ? N : C) * 4))
            snprintf(diff + strlen(diff), sizeof diff - strlen(diff), " %s", fn[k]);
    snprintf(name, sizeof name, "emu norms p16 N=%d C=%d%s%s roff=%d poff=%d: every output the f32 "
             "parameters' bits on the widened values", N, C, r16 ? " r16" : "",
             out16 && !r16 ? " bf16 out" : "", roff, poff);
    ct_check(rc[0] == 0 && rc[1] == 0 && !diff[0], name, "rc %d/%d, differ:%s", rc[0], rc[1],
             diff[0] ? diff : " none");
    {   /* g16: both backwards again (bf16 parameters) into bf16 dw, db:
         * each the fp32 call's rounded once, dinp the same bits */
        void *di = r16 ? (void *)h_at(nc, roff) : (void *)f_at(nc, roff);
        void *di3 = r16 ? (void *)h_at(nc, roff) : (void *)f_at(nc, roff);
        uint16_t *g[3], *want[3];
        const float *f32[3] = { io[1].dw, io[1].db, io[1].dw3 };
        memcpy(di, rows[4], nc * es);
        memcpy(di3, rows[4], nc * es);
        for (int k = 0; k < 3; k++) {
            g[k] = malloc(C * 2); want[k] = malloc(C * 2);
            memset(g[k], 0x7f, C * 2);
            zk_cast_f32_bf16(want[k], f32[k], C);
        }
        int rg = 0;
        for (size_t i = 0; i < ns; i++) scratch[i] = NAN;
        if (r16) {
            rg |= zkc_layernorm_backward_r16(NULL, di, g[0], g[1], 1, rows[3], rows[0], w16, 1, mean,
                                             rstd, N, C, scratch);
            rg |= zkc_rmsnorm_backward_r16(NULL, di3, g[2], 1, rows[3], rows[0], w16, 1, rstd3, N, C,
                                           scratch);
        } else {
            rg |= zkc_layernorm_backward(NULL, di, NULL, g[0], g[1], 1, rows[3], rows[0], w16, 1, mean,
                                         rstd, N, C, scratch);
            rg |= zkc_rmsnorm_backward(NULL, di3, NULL, g[2], 1, rows[3], rows[0], w16, 1, rstd3, N, C,
                                       scratch);
        }
        snprintf(name, sizeof name, "emu norms g16 N=%d C=%d%s roff=%d poff=%d: dw, db (rms dw) bf16 "
                 "the fp32 call's rounded once, dinp the same bits", N, C, r16 ? " r16" : "", roff, poff);
        int gd = memcmp(g[0], want[0], C * 2) || memcmp(g[1], want[1], C * 2) || memcmp(g[2], want[2], C * 2);
        int dd = memcmp(di, io[1].di, nc * es) || memcmp(di3, io[1].di3, nc * es);
        ct_check(rg == 0 && !gd && !dd, name, "rc %d, weights %s, dinp %s", rg, gd ? "differ" : "same",
                 dd ? "differs" : "same");
        for (int k = 0; k < 3; k++) { free(g[k]); free(want[k]); }
        free((char *)di - (size_t)roff * es); free((char *)di3 - (size_t)roff * es);
    }
    for (int p = 0; p < 2; p++) {
        void *rw[6] = { io[p].o, io[p].res, io[p].o2, io[p].di, io[p].o3, io[p].di3 };
        float *fl[8] = { io[p].m, io[p].r, io[p].m2, io[p].r2, io[p].r3, io[p].dw, io[p].db, io[p].dw3 };
        for (int k = 0; k < 6; k++) free((char *)rw[k] - (size_t)roff * (rsz[k] / nc));
        for (int k = 0; k < 8; k++) free(fl[k]);
    }
    for (int k = 0; k < 5; k++) { free((char *)rows[k] - (size_t)roff * es); free(rf[k]); }
    free(wr); free(br); free(w16 - poff); free(b16 - poff); free(wf - poff); free(bf - poff);
    free(o); free(mean); free(rstd); free(rstd3); free(scratch);
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
    for (int rms = 0; rms <= 1; rms++) {
        one_r16(33, 70, 0, rms);    /* scalar (C % 4 != 0): 2 chunks, the last of 1 row */
        one_r16(35, 256, 0, rms);   /* vector: 2 groups a lane forward, 64 threads backward;
                                     * the last chunk 3 rows, a step of 4 cut at 3 */
        one_r16(35, 256, 4, rms);   /* vector: bf16 rows on 8 bytes, not 16 */
        one_r16(35, 256, 1 + rms, rms);   /* scalar: rows 2 (4) bytes off their 8 */
        one_r16(9, 2056, 0, rms);   /* scalar forward, vector backward (2 groups a thread) */
    }
    /* p16: the scalar paths (C % 4 != 0), the vector ones, the scalar
     * forward beside the vector backward, both scalar (C > 4096); f32 rows
     * with an f32 and a bf16 out, bf16 rows; rows off their vector access;
     * parameters on 8 (bf16) and 16 (f32) bytes, and off both */
    static const int p16sh[][2] = { { 33, 70 }, { 35, 256 }, { 9, 2056 }, { 5, 4100 } };
    for (size_t i = 0; i < sizeof p16sh / sizeof p16sh[0]; i++)
        for (int r16 = 0; r16 <= 1; r16++)
            for (int out16 = r16; out16 <= 1; out16++)
                one_p16(p16sh[i][0], p16sh[i][1], r16, out16, 0, 0);
    one_p16(35, 256, 0, 1, 1, 0);
    one_p16(35, 256, 1, 1, 1, 0);
    one_p16(35, 256, 0, 0, 0, 4);
    one_p16(35, 256, 1, 1, 0, 4);
    one_p16(35, 256, 0, 1, 0, 1);
    one_p16(35, 256, 1, 1, 0, 1);
    size_t s = zkc_layernorm_scratch(16384, 768);
    ct_check(s == 2u * 512 * 768, "scratch for GPT-2's B=16 T=1024: 2 x 512 chunks x 768 doubles",
             "%zu", s);
    return ct_summary();
}
