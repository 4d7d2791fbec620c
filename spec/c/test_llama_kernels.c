/*
 * test_llama_kernels.c -- the Llama family's CPU kernels (rmsnorm.c,
 * rope.c, swiglu.c) against plain double-precision references written
 * here: RMSNorm forward, and its backward against the analytic double
 * gradient and central differences of the double forward on a scalar loss
 * L = sum(out * R); RoPE's table against theta^(-2i/hs) (and Llama 3's
 * scaling as transformers writes it), its forward against the rotation
 * in double on a strided (B,T,q|k|v) layout (the v columns untouched),
 * its backward as the forward's adjoint, a decode step's row equal to the
 * full sequence's; SwiGLU forward and backward against double, extreme
 * gates finite; every kernel bit-identical under 1/2/3 OpenMP threads;
 * split backward bit for bit against the fused call.
 */
#include <omp.h>
#include "ctest.h"
#include "kernels.h"

#define FD_EPS 1e-5

/* ---- RMSNorm ------------------------------------------------------------ */

struct rms_ctx { int N, C; const double *w, *R; double eps; };

static void rms_ref(double *out, double *rstd, const double *x, const double *w, double eps,
                    int N, int C) {
    for (int n = 0; n < N; n++) {
        double ss = 0;
        for (int c = 0; c < C; c++) ss += x[n * C + c] * x[n * C + c];
        double r = 1.0 / sqrt(ss / C + eps);
        if (rstd) rstd[n] = r;
        for (int c = 0; c < C; c++) out[n * C + c] = w[c] * x[n * C + c] * r;
    }
}

static double rms_loss(void *vc, const double *x) {
    struct rms_ctx *k = vc;
    double *o = malloc(sizeof(double) * k->N * k->C), L = 0;
    rms_ref(o, NULL, x, k->w, k->eps, k->N, k->C);
    for (int i = 0; i < k->N * k->C; i++) L += o[i] * k->R[i];
    free(o);
    return L;
}
static double rms_loss_w(void *vc, const double *w) {
    struct rms_ctx *k = vc;
    struct rms_ctx kk = *k;
    kk.w = w;
    return rms_loss(&kk, k->R + k->N * k->C);    /* x stored after R */
}

static void test_rmsnorm_small(int N, int C) {
    char name[128];
    size_t nc = (size_t)N * C;
    float *x = ct_rand(nc, -2, 2), *w = ct_rand(C, 0.5f, 1.5f), *R = ct_rand(nc, -1, 1);
    for (int n = 0; n < N; n++) x[(size_t)n * C] += 3.0f * n;     /* rows of other scales */
    float *o = ct_alloc(nc * 4), *r = ct_alloc(N * 4);
    zk_rmsnorm_forward(o, r, x, w, 1e-6f, N, C);
    double *xd = ct_to_double(x, nc), *wd = ct_to_double(w, C), *Rd = ct_to_double(R, nc);
    double *od = ct_alloc(nc * 8), *rd = ct_alloc(N * 8);
    rms_ref(od, rd, xd, wd, 1e-6, N, C);
    snprintf(name, sizeof name, "rmsnorm forward N=%d C=%d: out within 1e-5 of double", N, C);
    ct_close(name, o, od, nc, 1e-6, 1e-5);
    snprintf(name, sizeof name, "rmsnorm forward N=%d C=%d: rstd within 1e-6 of double", N, C);
    ct_close(name, r, rd, N, 0, 1e-6);
    /* backward: dinp accumulated onto 0.5, dweight written over NaN */
    float *di = ct_alloc(nc * 4), *dw = ct_alloc(C * 4);
    for (size_t i = 0; i < nc; i++) di[i] = 0.5f;
    for (int c = 0; c < C; c++) dw[c] = NAN;
    zk_rmsnorm_backward(di, dw, R, x, w, r, N, C);
    double *g = ct_alloc(nc * 8), *gw = ct_alloc(C * 8);
    struct rms_ctx k = { N, C, wd, Rd, 1e-6 };
    ct_fd_grad(g, rms_loss, &k, xd, nc, FD_EPS);
    for (size_t i = 0; i < nc; i++) g[i] += 0.5;
    snprintf(name, sizeof name, "rmsnorm backward N=%d C=%d: dinp (accumulated) = central differences", N, C);
    ct_close(name, di, g, nc, 1e-5, 1e-4);
    double *Rx = ct_alloc((2 * nc) * 8);             /* R then x for rms_loss_w */
    memcpy(Rx, Rd, nc * 8);
    memcpy(Rx + nc, xd, nc * 8);
    struct rms_ctx kw = { N, C, wd, Rx, 1e-6 };
    ct_fd_grad(gw, rms_loss_w, &kw, wd, C, FD_EPS);
    snprintf(name, sizeof name, "rmsnorm backward N=%d C=%d: dweight = central differences", N, C);
    ct_close(name, dw, gw, C, 1e-5, 1e-4);
    free(x); free(w); free(R); free(o); free(r); free(xd); free(wd); free(Rd); free(od); free(rd);
    free(di); free(dw); free(g); free(gw); free(Rx);
}

static void test_rmsnorm_threads(void) {
    int N = 257, C = 768;
    size_t nc = (size_t)N * C;
    float *x = ct_rand(nc, -2, 2), *w = ct_rand(C, 0.5f, 1.5f), *d = ct_rand(nc, -1, 1);
    float *o[3], *r[3], *di[3], *dw[3];
    for (int t = 0; t < 3; t++) {
        o[t] = ct_alloc(nc * 4); r[t] = ct_alloc(N * 4); di[t] = ct_alloc(nc * 4); dw[t] = ct_alloc(C * 4);
        omp_set_num_threads(t + 1);
        zk_rmsnorm_forward(o[t], r[t], x, w, 1e-5f, N, C);
        zk_rmsnorm_backward(di[t], dw[t], d, x, w, r[t], N, C);
    }
    omp_set_num_threads(2);
    int same = 1;
    for (int t = 1; t < 3; t++)
        same &= !memcmp(o[t], o[0], nc * 4) && !memcmp(r[t], r[0], N * 4) &&
                !memcmp(di[t], di[0], nc * 4) && !memcmp(dw[t], dw[0], C * 4);
    ct_check(same, "rmsnorm forward/backward same bits on 1/2/3 threads", "differ");
    /* split: dinp alone, dweight alone */
    float *di2 = ct_alloc(nc * 4), *dw2 = ct_alloc(C * 4);
    zk_rmsnorm_backward(di2, NULL, d, x, w, r[0], N, C);
    zk_rmsnorm_backward(NULL, dw2, d, x, w, r[0], N, C);
    ct_same_bits("rmsnorm split backward: dinp alone has the fused call's bits", di2, di[0], nc * 4);
    ct_same_bits("rmsnorm split backward: dweight alone has the fused call's bits", dw2, dw[0], C * 4);
    for (int t = 0; t < 3; t++) { free(o[t]); free(r[t]); free(di[t]); free(dw[t]); }
    free(x); free(w); free(d); free(di2); free(dw2);
}

/* ---- RoPE --------------------------------------------------------------- */

/* transformers' _compute_llama3_parameters, written out in double */
static double llama3_inv_freq(double f, const zk_rope_scaling *s) {
    double low_wl = s->original_max_positions / s->low_freq_factor;
    double high_wl = s->original_max_positions / s->high_freq_factor;
    double wl = 2 * M_PI / f;
    double llama = wl > low_wl ? f / s->factor : f;
    double smooth = (s->original_max_positions / wl - s->low_freq_factor) /
                    (s->high_freq_factor - s->low_freq_factor);
    double smoothed = (1 - smooth) * llama / s->factor + smooth * llama;
    int medium = !(wl < high_wl) && !(wl > low_wl);
    return medium ? smoothed : llama;
}

static void test_rope_table(void) {
    int P = 8192, hs = 128, h2 = hs / 2;
    float *c = ct_alloc((size_t)P * h2 * 4), *s = ct_alloc((size_t)P * h2 * 4);
    zk_rope_table(c, s, P, hs, 10000.0, NULL);
    double worst_lo = 0, worst_hi = 0;
    for (int p = 0; p < P; p++)
        for (int i = 0; i < h2; i++) {
            double a = p * pow(10000.0, -2.0 * i / hs);
            double e = fmax(fabs(c[(size_t)p * h2 + i] - cos(a)), fabs(s[(size_t)p * h2 + i] - sin(a)));
            if (p < 16) worst_lo = fmax(worst_lo, e); else worst_hi = fmax(worst_hi, e);
        }
    /* the angle is a float product: its ulp at p = 8191 is 2^-11 rad */
    ct_check(worst_lo < 1e-6 && worst_hi < 6e-4, "rope table theta 1e4: cos/sin of p theta^(-2i/hs) "
             "within 1e-6 (p < 16), within the float angle's rounding (5e-4) to p = 8191",
             "%.3g, %.3g", worst_lo, worst_hi);
    ct_check(c[0] == 1.0f && s[0] == 0.0f, "rope table: position 0 is no turn", "%g %g", c[0], s[0]);
    /* Llama 3.1's scaling: factor 8, low 1, high 4, 8192 original positions */
    zk_rope_scaling sc = { 8.0, 1.0, 4.0, 8192.0 };
    zk_rope_table(c, s, 2, hs, 500000.0, &sc);
    int lo = 0, mid = 0, hi = 0, bad = -1;
    for (int i = 0; i < h2; i++) {
        double f = (float)pow(500000.0, -2.0 * i / hs), want = llama3_inv_freq(f, &sc);
        double wl = 2 * M_PI / f;
        if (wl < 2048) hi++; else if (wl > 8192) lo++; else mid++;
        double got = atan2(s[h2 + i], c[h2 + i]);     /* position 1: the angle is inv_freq */
        if (fabs(got - want) > 1e-6 * want + 1e-12 && bad < 0) bad = i;
    }
    ct_check(bad < 0 && lo > 0 && mid > 0 && hi > 0, "rope table llama3 scaling: position 1's angle is "
             "transformers' scaled inv_freq (high, medium and low frequencies all present)",
             "first bad i %d; %d low, %d medium, %d high", bad, lo, mid, hi);
    free(c); free(s);
}

static void rope_ref(double *x, int N, int T, int ld, int nh, int hs, double theta, int pos0,
                     int dir) {
    int h2 = hs / 2;
    for (int r = 0; r < N; r++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < h2; i++) {
                float f = (float)(1.0 / pow(theta, (double)(2 * i) / hs));
                double a = (double)(f * (float)(pos0 + r % T)) * dir;
                double *p = x + (size_t)r * ld + h * hs, x1 = p[i], x2 = p[i + h2];
                p[i] = x1 * cos(a) - x2 * sin(a);
                p[i + h2] = x2 * cos(a) + x1 * sin(a);
            }
}

static void test_rope(void) {
    /* (B=3, T=5) rows of q (4 heads) | k (2 heads) | v (2 heads), hs 16 */
    int B = 3, T = 5, N = B * T, hs = 16, nq = 4, nkv = 2, ld = (nq + 2 * nkv) * hs;
    int P = 64, h2 = hs / 2;
    size_t n = (size_t)N * ld;
    float *c = ct_alloc((size_t)P * h2 * 4), *s = ct_alloc((size_t)P * h2 * 4);
    zk_rope_table(c, s, P, hs, 10000.0, NULL);
    float *x = ct_rand(n, -2, 2), *y = malloc(n * 4);
    memcpy(y, x, n * 4);
    zk_rope_forward(y, N, T, ld, nq, hs, c, s, 0);                  /* q heads */
    zk_rope_forward(y + nq * hs, N, T, ld, nkv, hs, c, s, 0);       /* k heads */
    double *ref = ct_to_double(x, n);
    rope_ref(ref, N, T, ld, nq, hs, 10000.0, 0, 1);
    rope_ref(ref + nq * hs, N, T, ld, nkv, hs, 10000.0, 0, 1);
    ct_close("rope forward on q and k heads of a (B,T,q|k|v) row: the rotation in double",
             y, ref, n, 1e-6, 1e-6);
    int v_same = 1;
    for (int r = 0; r < N; r++)
        v_same &= !memcmp(y + (size_t)r * ld + (nq + nkv) * hs, x + (size_t)r * ld + (nq + nkv) * hs,
                          (size_t)nkv * hs * 4);
    ct_check(v_same, "rope forward leaves the v columns as they were", "v changed");
    /* backward is the adjoint: <R, rope(x)> = <rope^T(R), x> */
    float *R = ct_rand(n, -1, 1), *Rt = malloc(n * 4);
    memcpy(Rt, R, n * 4);
    zk_rope_backward(Rt, N, T, ld, nq, hs, c, s, 0);
    zk_rope_backward(Rt + nq * hs, N, T, ld, nkv, hs, c, s, 0);
    double a = 0, b = 0, m = 0;
    for (size_t i = 0; i < n; i++) { a += (double)R[i] * y[i]; b += (double)Rt[i] * x[i]; m += fabs((double)R[i] * y[i]); }
    ct_check(fabs(a - b) <= 1e-6 * m, "rope backward is the forward's adjoint: <R, rope(x)> = <rope^T R, x>",
             "%.9g vs %.9g", a, b);
    /* backward undoes forward */
    zk_rope_backward(y, N, T, ld, nq, hs, c, s, 0);
    zk_rope_backward(y + nq * hs, N, T, ld, nkv, hs, c, s, 0);
    ct_close_f("rope backward after forward gives x back (within 1e-6)", y, x, n, 1e-6, 1e-6);
    /* a decode step: row t alone at pos0 = t has the full sequence's bits */
    float *full = malloc(n * 4), *one = malloc((size_t)ld * 4);
    memcpy(full, x, n * 4);
    zk_rope_forward(full, N, T, ld, nq, hs, c, s, 0);
    int same = 1;
    for (int r = 0; r < N; r++) {
        memcpy(one, x + (size_t)r * ld, (size_t)ld * 4);
        zk_rope_forward(one, 1, 1, ld, nq, hs, c, s, r % T);
        same &= !memcmp(one, full + (size_t)r * ld, (size_t)ld * 4);
    }
    ct_check(same, "rope forward of one row at pos0 = t: the full sequence's row t, bit for bit", "differ");
    free(c); free(s); free(x); free(y); free(ref); free(R); free(Rt); free(full); free(one);
}

static void test_rope_threads(void) {
    int N = 512, T = 256, hs = 64, nh = 12, ld = 3 * nh * hs, P = 256;
    size_t n = (size_t)N * ld;
    float *c = ct_alloc((size_t)P * hs / 2 * 4), *s = ct_alloc((size_t)P * hs / 2 * 4);
    zk_rope_table(c, s, P, hs, 10000.0, NULL);
    float *x = ct_rand(n, -1, 1), *y[3];
    for (int t = 0; t < 3; t++) {
        y[t] = malloc(n * 4);
        memcpy(y[t], x, n * 4);
        omp_set_num_threads(t + 1);
        zk_rope_forward(y[t], N, T, ld, 2 * nh, hs, c, s, 0);
        zk_rope_backward(y[t], N, T, ld, nh, hs, c, s, 0);
    }
    omp_set_num_threads(2);
    ct_check(!memcmp(y[1], y[0], n * 4) && !memcmp(y[2], y[0], n * 4),
             "rope forward/backward same bits on 1/2/3 threads", "differ");
    for (int t = 0; t < 3; t++) free(y[t]);
    free(c); free(s); free(x);
}

/* ---- SwiGLU ------------------------------------------------------------- */

static double silu_d(double x) { return x / (1.0 + exp(-x)); }

static void test_swiglu(int N, int F) {
    char name[128];
    size_t nf = (size_t)N * F;
    float *gu = ct_rand(2 * nf, -6, 6), *o = ct_alloc(nf * 4), *d = ct_rand(nf, -1, 1);
    float *dgu = ct_alloc(2 * nf * 4);
    zk_swiglu_forward(o, gu, N, F);
    zk_swiglu_backward(dgu, d, gu, N, F);
    double *ro = ct_alloc(nf * 8), *rd = ct_alloc(2 * nf * 8);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < F; i++) {
            double g = gu[(size_t)n * 2 * F + i], u = gu[(size_t)n * 2 * F + F + i], dd = d[(size_t)n * F + i];
            double sg = 1.0 / (1.0 + exp(-g));
            ro[(size_t)n * F + i] = silu_d(g) * u;
            rd[(size_t)n * 2 * F + i] = dd * u * sg * (1 + g * (1 - sg));
            rd[(size_t)n * 2 * F + F + i] = dd * silu_d(g);
        }
    snprintf(name, sizeof name, "swiglu forward N=%d F=%d: silu(gate) * up within 1e-6 of double", N, F);
    ct_close(name, o, ro, nf, 1e-7, 1e-6);
    snprintf(name, sizeof name, "swiglu backward N=%d F=%d: dgate, dup within 1e-6 of double", N, F);
    ct_close(name, dgu, rd, 2 * nf, 1e-7, 1e-6);
    /* the analytic double gradient against central differences of silu(g) u */
    double worst = 0;
    for (size_t k = 0; k < nf; k += 7) {
        size_t n = k / F, i = k % F;
        double g = gu[n * 2 * F + i], u = gu[n * 2 * F + F + i], dd = d[k];
        double fd = dd * u * (silu_d(g + FD_EPS) - silu_d(g - FD_EPS)) / (2 * FD_EPS);
        worst = fmax(worst, fabs(fd - rd[n * 2 * F + i]) / (1e-6 + fabs(fd)));
    }
    ct_check(worst < 1e-5, "swiglu: the double dgate reference = central differences", "%.3g", worst);
    free(gu); free(o); free(d); free(dgu); free(ro); free(rd);
}

static void test_swiglu_edges(void) {
    float gu[8] = { -100.0f, 100.0f, -1e30f, 0.0f, 2.0f, 3.0f, 4.0f, 5.0f }, o[4], d[4] = { 1, 1, 1, 1 }, dgu[8];
    zk_swiglu_forward(o, gu, 1, 4);
    zk_swiglu_backward(dgu, d, gu, 1, 4);
    int finite = 1;
    for (int i = 0; i < 4; i++) finite &= isfinite(o[i]) && isfinite(dgu[i]) && isfinite(dgu[4 + i]);
    ct_check(finite && o[1] == 100.0f * 3.0f && o[3] == 0.0f && fabsf(o[0]) < 1e-30f,
             "swiglu at gates -100, 100, -1e30, 0: finite, silu(100) = 100, silu(0) = 0",
             "%g %g %g %g", o[0], o[1], o[2], o[3]);
}

static void test_swiglu_threads(void) {
    int N = 300, F = 1024;
    size_t nf = (size_t)N * F;
    float *gu = ct_rand(2 * nf, -5, 5), *d = ct_rand(nf, -1, 1), *o[3], *g[3];
    for (int t = 0; t < 3; t++) {
        o[t] = malloc(nf * 4); g[t] = malloc(2 * nf * 4);
        omp_set_num_threads(t + 1);
        zk_swiglu_forward(o[t], gu, N, F);
        zk_swiglu_backward(g[t], d, gu, N, F);
    }
    omp_set_num_threads(2);
    int same = 1;
    for (int t = 1; t < 3; t++) same &= !memcmp(o[t], o[0], nf * 4) && !memcmp(g[t], g[0], 2 * nf * 4);
    ct_check(same, "swiglu forward/backward same bits on 1/2/3 threads", "differ");
    for (int t = 0; t < 3; t++) { free(o[t]); free(g[t]); }
    free(gu); free(d);
}

/* ---- bf16 activations: each _b16/_bb kernel = its f32 kernel on the
 * widened input, rounded once (zk_cast_*: an independent rounding), bit for
 * bit, at widths past the kernels' float tiles (rows of 1024 + 37, heads of
 * 2 x 256 + 6 pairs, F of 512 + 88) ---- */
static uint16_t *to16(const float *x, size_t n) {
    uint16_t *h = malloc(n * 2);
    zk_cast_f32_bf16(h, x, n);
    return h;
}
static float *widen(const uint16_t *h, size_t n) {
    float *x = malloc(n * 4);
    zk_cast_bf16_f32(x, h, n);
    return x;
}

static void test_bf16_kernels(void) {
    char name[160];
    /* RMS norm: out16 and dinp16 */
    int N = 5, C = 1061;
    size_t nc = (size_t)N * C;
    float *x = ct_rand(nc, -2, 2), *w = ct_rand(C, 0.5f, 1.5f), *d = ct_rand(nc, -1, 1);
    float *o = malloc(nc * 4), *r = malloc(N * 4), *r16 = malloc(N * 4);
    uint16_t *o16 = malloc(nc * 2), *di16 = malloc(nc * 2);
    float *di = ct_rand(nc, -1, 1), *di2 = malloc(nc * 4);
    memcpy(di2, di, nc * 4);
    zk_rmsnorm_forward(o, r, x, w, 1e-5f, N, C);
    zk_rmsnorm_forward_b16(o16, r16, x, w, 1e-5f, N, C);
    uint16_t *want = to16(o, nc);
    snprintf(name, sizeof name, "rmsnorm forward bf16 out (N=%d C=%d): the f32 out rounded, rstd equal", N, C);
    ct_check(!memcmp(o16, want, nc * 2) && !memcmp(r, r16, N * 4), name, "differ");
    zk_rmsnorm_backward(di, NULL, d, x, w, r, N, C);
    zk_rmsnorm_backward_b16(di2, di16, NULL, d, x, w, r, N, C);
    free(want); want = to16(di, nc);
    ct_check(!memcmp(di, di2, nc * 4) && !memcmp(di16, want, nc * 2),
             "rmsnorm backward dinp16: the accumulated dinp rounded, dinp unchanged", "differ");
    free(want); free(x); free(w); free(d); free(o); free(r); free(r16); free(o16); free(di16);
    free(di); free(di2);

    /* RoPE on bf16 rows: q (3 heads) | k (1) of hs 524 in rows of ld 2200 */
    int B = 2, T = 3, hs = 524, nh = 4, ld = 2200, h2 = hs / 2;
    N = B * T;
    size_t n = (size_t)N * ld;
    float *c = malloc((size_t)(T + 7) * h2 * 4), *sn = malloc((size_t)(T + 7) * h2 * 4);
    zk_rope_table(c, sn, T + 7, hs, 10000.0, NULL);
    float *xr = ct_rand(n, -2, 2);
    uint16_t *x16 = to16(xr, n);
    for (int dir = 1; dir >= -1; dir -= 2) {
        float *ref = widen(x16, n);
        uint16_t *got = malloc(n * 2);
        memcpy(got, x16, n * 2);
        if (dir > 0) {
            zk_rope_forward(ref + 3, N, T, ld, nh, hs, c, sn, 7);
            zk_rope_forward_b16(got + 3, N, T, ld, nh, hs, c, sn, 7);
        } else {
            zk_rope_backward(ref + 3, N, T, ld, nh, hs, c, sn, 7);
            zk_rope_backward_b16(got + 3, N, T, ld, nh, hs, c, sn, 7);
        }
        uint16_t *w16 = to16(ref, n);
        snprintf(name, sizeof name, "rope %s on bf16 rows (hs %d, column 3, pos0 7): the f32 turn "
                 "of the widened rows, rounded; the rest untouched", dir > 0 ? "forward" : "backward", hs);
        ct_check(!memcmp(got, w16, n * 2), name, "differ");
        free(ref); free(got); free(w16);
    }
    free(c); free(sn); free(xr); free(x16);

    /* SwiGLU on a bf16 gu */
    int F = 600;
    N = 3;
    size_t nf = (size_t)N * F;
    float *gu = ct_rand(2 * nf, -8, 8), *dd0 = ct_rand(nf, -1, 1);
    uint16_t *gu16 = to16(gu, 2 * nf), *dd16 = to16(dd0, nf);    /* dout bf16 too */
    float *dd = widen(dd16, nf);
    float *guw = widen(gu16, 2 * nf), *of = malloc(nf * 4), *gf = malloc(2 * nf * 4);
    uint16_t *ob = malloc(nf * 2), *gb = malloc(2 * nf * 2);
    zk_swiglu_forward(of, guw, N, F);
    zk_swiglu_backward(gf, dd, guw, N, F);
    zk_swiglu_forward_bb(ob, gu16, N, F);
    zk_swiglu_backward_bb(gb, dd16, gu16, N, F);
    uint16_t *wo = to16(of, nf), *wg = to16(gf, 2 * nf);
    ct_check(!memcmp(ob, wo, nf * 2), "swiglu forward bf16 gu/out (F=600): the f32 out of the "
             "widened gu, rounded", "differ");
    ct_check(!memcmp(gb, wg, 2 * nf * 2), "swiglu backward bf16 gu/dout/dgu (F=600): the f32 dgu "
             "of the widened gu and dout, rounded", "differ");
    free(dd0); free(dd16);
    free(gu); free(dd); free(gu16); free(guw); free(of); free(gf); free(ob); free(gb); free(wo);
    free(wg);
}

int main(void) {
    ct_seed(33);
    test_bf16_kernels();
    test_rmsnorm_small(3, 37);
    test_rmsnorm_small(2, 16);
    test_rmsnorm_threads();
    test_rope_table();
    test_rope();
    test_rope_threads();
    test_swiglu(4, 33);
    test_swiglu_edges();
    test_swiglu_threads();
    return ct_summary();
}
