/*
 * test_layers.c -- encoder, layernorm, matmul, GELU and cross-entropy
 * against plain double-precision references written here; every backward
 * against central differences of the double forward on a scalar loss
 * L = sum(out * R); bit-identity under 1/2/3 OpenMP threads; split
 * backward (input gradient and weight gradient in separate calls) bit for
 * bit against the fused call; token ids outside the vocabulary skipped and
 * counted; OpenBLAS left at one thread (never flipped per call).
 */
#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#include "ctest.h"
#include "kernels.h"

/* Every call to openblas_set_num_threads in this process comes here first
 * (the executable's definition wins over the library's), so the test can
 * see whether a kernel touches the global OpenBLAS thread count. */
static int blas_set_calls;
void openblas_set_num_threads(int n) {
    static void (*real)(int);
    if (!real) real = (void (*)(int))dlsym(RTLD_NEXT, "openblas_set_num_threads");
    __atomic_add_fetch(&blas_set_calls, 1, __ATOMIC_RELAXED);
    real(n);
}

#define FD_EPS 1e-5

static uint32_t f2u_(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }

/* The fp32 GEMMs with padded rows (out, dout ld > OC apart): the
 * contiguous calls' bits, the pad neither written (forward) nor read
 * (backward: NaN there). */
static void test_matmul_padded(int N, int C, int OC) {
    char name[128];
    int ld = (OC + 127) / 128 * 128;
    if (ld == OC) ld += 128;
    float *x = ct_rand((size_t)N * C, -1, 1), *w = ct_rand((size_t)OC * C, -1, 1);
    float *b = ct_rand(OC, -1, 1), *R = ct_rand((size_t)N * OC, -1, 1);
    float *o = ct_alloc((size_t)N * OC * 4), *po = ct_alloc((size_t)N * ld * 4);
    float *pR = ct_alloc((size_t)N * ld * 4);
    for (size_t i = 0; i < (size_t)N * ld; i++) { po[i] = 7.0f; pR[i] = NAN; }
    for (int n = 0; n < N; n++) memcpy(pR + (size_t)n * ld, R + (size_t)n * OC, (size_t)OC * 4);
    zk_matmul_forward(o, x, w, b, N, C, OC, OC);
    zk_matmul_forward(po, x, w, b, N, C, OC, ld);
    long bad = 0, pad = 0;
    for (int n = 0; n < N; n++) {
        bad += memcmp(po + (size_t)n * ld, o + (size_t)n * OC, (size_t)OC * 4) != 0;
        for (int j = OC; j < ld; j++) pad += po[(size_t)n * ld + j] != 7.0f;
    }
    float *dx = ct_alloc((size_t)N * C * 4), *dw = ct_alloc((size_t)OC * C * 4), *db = ct_alloc(OC * 4);
    float *pdx = ct_alloc((size_t)N * C * 4), *pdw = ct_alloc((size_t)OC * C * 4), *pdb = ct_alloc(OC * 4);
    zk_matmul_backward(dx, dw, db, R, x, w, N, C, OC, OC);
    zk_matmul_backward(pdx, pdw, pdb, pR, x, w, N, C, OC, ld);
    int same_b = !memcmp(dx, pdx, (size_t)N * C * 4) && !memcmp(dw, pdw, (size_t)OC * C * 4) &&
                 !memcmp(db, pdb, OC * 4);
    snprintf(name, sizeof name, "matmul N=%d C=%d OC=%d rows padded to %d: same bits, pad untouched",
             N, C, OC, ld);
    ct_check(bad == 0 && pad == 0 && same_b, name, "%ld rows differ, %ld pad written, backward %s",
             bad, pad, same_b ? "same" : "differs");
    free(x); free(w); free(b); free(R); free(o); free(po); free(pR);
    free(dx); free(dw); free(db); free(pdx); free(pdw); free(pdb);
}

static float *dup_f(const float *x, size_t n) {
    float *y = ct_alloc(n * 4);
    memcpy(y, x, n * 4);
    return y;
}

static int same3(float *const r[3], size_t n) {
    return !memcmp(r[0], r[1], n * 4) && !memcmp(r[0], r[2], n * 4);
}

/* ---- encoder ------------------------------------------------------------- */

typedef struct { const int32_t *tok; const double *R; int B, T, C, V; } enc_ctx;

/* x = [wte (V,C) | wpe (T,C)] */
static double enc_loss(void *p, const double *x) {
    enc_ctx *c = p;
    const double *wte = x, *wpe = x + (size_t)c->V * c->C;
    double L = 0;
    for (int bt = 0; bt < c->B * c->T; bt++)
        for (int k = 0; k < c->C; k++)
            L += (wte[c->tok[bt] * c->C + k] + wpe[(bt % c->T) * c->C + k]) * c->R[bt * c->C + k];
    return L;
}

static void test_encoder(void) {
    /* small: exact against plain loops, gradients against differences */
    int B = 2, T = 5, C = 13, V = 11;
    int32_t tok[10] = {3, 7, 3, 0, 10, 7, 7, 1, 3, 0};
    float *wte = ct_rand(V * C, -1, 1), *wpe = ct_rand(T * C, -1, 1);
    float *out = ct_alloc(B * T * C * 4), *ref = ct_alloc(B * T * C * 4);
    ct_check(zk_encoder_forward(out, tok, wte, wpe, B, T, C, V) == 0,
             "encoder forward counts no bad tokens", "counted some");
    for (int bt = 0; bt < B * T; bt++)
        for (int k = 0; k < C; k++) ref[bt * C + k] = wte[tok[bt] * C + k] + wpe[(bt % T) * C + k];
    ct_same_bits("encoder forward B=2 T=5 C=13 equals plain loop", out, ref, B * T * C * 4);

    float *R = ct_rand(B * T * C, -1, 1);
    float *dwte0 = ct_rand(V * C, -1, 1), *dwte = dup_f(dwte0, V * C), *rwte = dup_f(dwte0, V * C);
    float *dwpe = ct_rand(T * C, 5, 6), *rwpe = ct_alloc(T * C * 4);
    zk_encoder_backward(dwte, dwpe, R, tok, B, T, C, V);
    for (int bt = 0; bt < B * T; bt++)
        for (int k = 0; k < C; k++) rwte[tok[bt] * C + k] += R[bt * C + k];
    for (int t = 0; t < T; t++)
        for (int k = 0; k < C; k++) {
            rwpe[t * C + k] = 0;
            for (int b = 0; b < B; b++) rwpe[t * C + k] += R[(b * T + t) * C + k];
        }
    ct_same_bits("encoder backward dwte accumulated in (b,t) order", dwte, rwte, V * C * 4);
    ct_same_bits("encoder backward dwpe written", dwpe, rwpe, T * C * 4);

    double *x = ct_alloc((V + T) * C * 8), *g = ct_alloc((V + T) * C * 8);
    for (int i = 0; i < V * C; i++) x[i] = wte[i];
    for (int i = 0; i < T * C; i++) x[V * C + i] = wpe[i];
    double *Rd = ct_to_double(R, B * T * C);
    enc_ctx ctx = {tok, Rd, B, T, C, V};
    ct_fd_grad(g, enc_loss, &ctx, x, (V + T) * C, FD_EPS);
    float *dz = ct_alloc(V * C * 4);
    zk_encoder_backward(dz, dwpe, R, tok, B, T, C, V);
    ct_close("encoder backward dwte vs finite differences", dz, g, V * C, 1e-6, 1e-5);
    ct_close("encoder backward dwpe vs finite differences", dwpe, g + V * C, T * C, 1e-6, 1e-5);
    free(wte); free(wpe); free(out); free(ref); free(R); free(dwte0); free(dwte); free(rwte);
    free(dwpe); free(rwpe); free(x); free(g); free(Rd); free(dz);

    /* threads: many repeated tokens, big enough to go parallel */
    B = 4; T = 128; C = 160; V = 20;
    int32_t *tk = ct_alloc(B * T * 4);
    for (int i = 0; i < B * T; i++) tk[i] = (int32_t)(ct_u64() % V);
    wte = ct_rand(V * C, -1, 1); wpe = ct_rand(T * C, -1, 1); R = ct_rand(B * T * C, -1, 1);
    float *o[3], *dw[3], *dp[3];
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        o[t] = ct_alloc(B * T * C * 4); dw[t] = dup_f(wte, V * C); dp[t] = ct_alloc(T * C * 4);
        zk_encoder_forward(o[t], tk, wte, wpe, B, T, C, V);
        zk_encoder_backward(dw[t], dp[t], R, tk, B, T, C, V);
    }
    ct_check(same3(o, B * T * C) && same3(dw, V * C) && same3(dp, T * C),
             "encoder forward/backward same bits on 1/2/3 threads", "differ");
    for (int t = 0; t < 3; t++) { free(o[t]); free(dw[t]); free(dp[t]); }

    /* ids outside [0,V): skipped (no read or write through them), counted
     * once, and the valid rows are exactly those of a run without them.
     * wte sits at the start of a larger buffer: a kernel reading row V+3
     * would read the canary rows and show up in out. */
    int32_t *bad = (int32_t *)dup_f((float *)tk, B * T);
    bad[5] = V + 3; bad[77] = -2; bad[300] = V;
    float *big = ct_rand((size_t)(V + 8) * C, 1000, 2000);   /* canary rows past V */
    memcpy(big, wte, (size_t)V * C * 4);
    float *ob = ct_alloc(B * T * C * 4), *ok = ct_alloc(B * T * C * 4);
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        int n = zk_encoder_forward(ob, bad, big, wpe, B, T, C, V);
        ct_check(n == 3, t ? "encoder forward counts bad tokens (2 threads)" :
                 "encoder forward counts bad tokens (1 thread)", "counted %d", n);
    }
    zk_encoder_forward(ok, tk, wte, wpe, B, T, C, V);
    int rows_ok = 1;
    for (int bt = 0; bt < B * T; bt++) {
        int skipped = bt == 5 || bt == 77 || bt == 300;
        for (int c = 0; c < C; c++) {
            float want = skipped ? wpe[(bt % T) * C + c] : ok[bt * C + c];
            if (ob[bt * C + c] != want) rows_ok = 0;
        }
    }
    ct_check(rows_ok, "encoder forward: valid rows unchanged, skipped rows get wpe alone", "differ");
    float *dwb = dup_f(big, (V + 8) * C), *dwr = dup_f(wte, V * C), *dpb = ct_alloc(T * C * 4);
    float *dpr = ct_alloc(T * C * 4);
    int nb = zk_encoder_backward(dwb, dpb, R, bad, B, T, C, V);
    /* reference: the same ids with the bad ones' dout zeroed */
    float *R0 = dup_f(R, B * T * C);
    int32_t *fixed = (int32_t *)dup_f((float *)bad, B * T);
    int idx[3] = {5, 77, 300};
    for (int k = 0; k < 3; k++) { fixed[idx[k]] = 0; memset(R0 + idx[k] * C, 0, C * 4); }
    zk_encoder_backward(dwr, dpr, R0, fixed, B, T, C, V);
    ct_check(nb == 3, "encoder backward counts bad tokens once", "counted %d", nb);
    ct_check(!memcmp(dwb, dwr, V * C * 4) && !memcmp(dwb + V * C, big + V * C, 8 * C * 4),
             "encoder backward: bad ids add to no row (canary rows untouched)", "differ");
    float *dpfull = ct_alloc(T * C * 4), *dwfull = dup_f(wte, V * C);
    zk_encoder_backward(dwfull, dpfull, R, tk, B, T, C, V);
    ct_same_bits("encoder backward: dwpe still gets every position's dout", dpb, dpfull, T * C * 4);
    free(bad); free(big); free(ob); free(ok); free(dwb); free(dwr); free(dpb); free(dpr);
    free(R0); free(fixed); free(dpfull); free(dwfull);
    free(tk); free(wte); free(wpe); free(R);
    omp_set_num_threads(2);
}

/* ---- layernorm ----------------------------------------------------------- */

static void ln_ref(double *out, double *mean, double *rstd, const double *x,
                   const double *w, const double *b, int N, int C) {
    for (int n = 0; n < N; n++) {
        const double *r = x + (size_t)n * C;
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) m += r[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (r[c] - m) * (r[c] - m);
        double s = 1.0 / sqrt(v / C + 1e-5);
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (r[c] - m) * s * w[c] + b[c];
        if (mean) { mean[n] = m; rstd[n] = s; }
    }
}

typedef struct { const double *R; int N, C; } ln_ctx;

/* x = [inp (N,C) | weight (C) | bias (C)] */
static double ln_loss(void *p, const double *x) {
    ln_ctx *c = p;
    size_t nc = (size_t)c->N * c->C;
    double *out = ct_alloc(nc * 8), L = 0;
    ln_ref(out, NULL, NULL, x, x + nc, x + nc + c->C, c->N, c->C);
    for (size_t i = 0; i < nc; i++) L += out[i] * c->R[i];
    free(out);
    return L;
}

static void test_layernorm_case(int N, int C, int fd) {
    char name[128];
    size_t nc = (size_t)N * C;
    float *x = ct_rand(nc, -2, 3), *w = ct_rand(C, 0.5f, 1.5f), *b = ct_rand(C, -0.5f, 0.5f);
    for (size_t i = 0; i < nc; i++) x[i] += 4.0f;      /* a mean far from 0 */
    float *out = ct_alloc(nc * 4), *mean = ct_alloc(N * 4), *rstd = ct_alloc(N * 4);
    zk_layernorm_forward(out, mean, rstd, x, w, b, N, C);
    double *xd = ct_alloc((nc + 2 * C) * 8);
    for (size_t i = 0; i < nc; i++) xd[i] = x[i];
    for (int c = 0; c < C; c++) { xd[nc + c] = w[c]; xd[nc + C + c] = b[c]; }
    double *ro = ct_alloc(nc * 8), *rm = ct_alloc(N * 8), *rs = ct_alloc(N * 8);
    ln_ref(ro, rm, rs, xd, xd + nc, xd + nc + C, N, C);
    snprintf(name, sizeof name, "layernorm forward N=%d C=%d out", N, C);
    ct_close(name, out, ro, nc, 1e-5, 1e-5);
    snprintf(name, sizeof name, "layernorm forward N=%d C=%d mean, rstd", N, C);
    ct_close(name, mean, rm, N, 1e-6, 1e-6);
    ct_close(name, rstd, rs, N, 1e-6, 1e-5);

    float *R = ct_rand(nc, -1, 1), *d0 = ct_rand(nc, -1, 1), *dinp = dup_f(d0, nc);
    float *dw = ct_rand(C, 9, 10), *db = ct_rand(C, 9, 10);
    zk_layernorm_backward(dinp, dw, db, R, x, w, mean, rstd, N, C);
    double *g = ct_alloc((nc + 2 * C) * 8);
    if (fd) {
        double *Rd = ct_to_double(R, nc);
        ln_ctx ctx = {Rd, N, C};
        ct_fd_grad(g, ln_loss, &ctx, xd, nc + 2 * C, FD_EPS);
        free(Rd);
    } else {   /* analytic gradient in double (the FD cases vouch for it) */
        for (int c = 0; c < 2 * C; c++) g[nc + c] = 0;
        for (int n = 0; n < N; n++) {
            double a = 0, bsum = 0;
            for (int c = 0; c < C; c++) {
                double nr = (xd[(size_t)n * C + c] - rm[n]) * rs[n], gg = w[c] * (double)R[(size_t)n * C + c];
                a += gg; bsum += gg * nr;
                g[nc + c] += nr * R[(size_t)n * C + c];
                g[nc + C + c] += R[(size_t)n * C + c];
            }
            for (int c = 0; c < C; c++) {
                double nr = (xd[(size_t)n * C + c] - rm[n]) * rs[n];
                g[(size_t)n * C + c] = (w[c] * (double)R[(size_t)n * C + c] - a / C - nr * bsum / C) * rs[n];
            }
        }
    }
    for (size_t i = 0; i < nc; i++) g[i] += d0[i];    /* dinp accumulates */
    const char *how = fd ? "finite differences" : "double analytic";
    snprintf(name, sizeof name, "layernorm backward N=%d C=%d dinp (+=) vs %s", N, C, how);
    ct_close(name, dinp, g, nc, 2e-5, 1e-4);
    snprintf(name, sizeof name, "layernorm backward N=%d C=%d dweight vs %s", N, C, how);
    ct_close(name, dw, g + nc, C, 2e-5, 1e-4);
    snprintf(name, sizeof name, "layernorm backward N=%d C=%d dbias vs %s", N, C, how);
    ct_close(name, db, g + nc + C, C, 2e-5, 1e-4);
    /* the plain lane loop (zk_force_scalar) gives the vector path's bits */
    float *dplain = dup_f(d0, nc);
    zk_force_scalar(1);
    zk_layernorm_backward(dplain, NULL, NULL, R, x, w, mean, rstd, N, C);
    zk_force_scalar(0);
    snprintf(name, sizeof name, "layernorm backward N=%d C=%d dinp plain path = vector path", N, C);
    ct_same_bits(name, dplain, dinp, nc * 4);
    free(dplain);
    free(x); free(w); free(b); free(out); free(mean); free(rstd); free(xd); free(ro);
    free(rm); free(rs); free(R); free(d0); free(dinp); free(dw); free(db); free(g);
}

static void test_layernorm(void) {
    test_layernorm_case(7, 13, 1);
    test_layernorm_case(3, 37, 1);
    test_layernorm_case(129, 768, 0);
    test_layernorm_case(33, 771, 0);   /* a tail of 3 after the 16 lanes */
    int N = 129, C = 771;
    float *x = ct_rand(N * C, -2, 2), *w = ct_rand(C, 0, 2), *b = ct_rand(C, -1, 1);
    float *R = ct_rand(N * C, -1, 1);
    float *o[3], *m[3], *s[3], *di[3], *dw[3], *db[3];
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        o[t] = ct_alloc(N * C * 4); m[t] = ct_alloc(N * 4); s[t] = ct_alloc(N * 4);
        di[t] = dup_f(x, N * C); dw[t] = ct_alloc(C * 4); db[t] = ct_alloc(C * 4);
        zk_layernorm_forward(o[t], m[t], s[t], x, w, b, N, C);
        zk_layernorm_backward(di[t], dw[t], db[t], R, x, w, m[t], s[t], N, C);
    }
    ct_check(same3(o, N * C) && same3(m, N) && same3(s, N) && same3(di, N * C) &&
             same3(dw, C) && same3(db, C), "layernorm forward/backward same bits on 1/2/3 threads",
             "differ");
    for (int t = 0; t < 3; t++) { free(o[t]); free(m[t]); free(s[t]); free(di[t]); free(dw[t]); free(db[t]); }
    free(x); free(w); free(b); free(R);
    omp_set_num_threads(2);
}

/* Split backward: dinp alone, then dweight/dbias alone, on 1/2/3 threads,
 * equal bit for bit to the fused call on 2 threads; and the NULL parts are
 * left untouched. */
static void test_layernorm_split_case(int N, int C) {
    char name[128];
    size_t nc = (size_t)N * C;
    float *x = ct_rand(nc, -2, 2), *w = ct_rand(C, 0, 2), *b = ct_rand(C, -1, 1);
    float *R = ct_rand(nc, -1, 1), *d0 = ct_rand(nc, -1, 1);
    float *out = ct_alloc(nc * 4), *m = ct_alloc(N * 4), *s = ct_alloc(N * 4);
    omp_set_num_threads(2);
    zk_layernorm_forward(out, m, s, x, w, b, N, C);
    float *fdi = dup_f(d0, nc), *fdw = ct_alloc(C * 4), *fdb = ct_alloc(C * 4);
    zk_layernorm_backward(fdi, fdw, fdb, R, x, w, m, s, N, C);
    int same = 1, untouched = 1;
    for (int t = 1; t <= 3; t++) {
        omp_set_num_threads(t);
        float *di = dup_f(d0, nc), *dw = ct_rand(C, 5, 6), *db = ct_rand(C, 5, 6);
        float *dw0 = dup_f(dw, C), *db0 = dup_f(db, C);
        zk_layernorm_backward(di, NULL, NULL, R, x, w, m, s, N, C);     /* I */
        untouched &= !memcmp(dw, dw0, C * 4) && !memcmp(db, db0, C * 4);
        float *di1 = dup_f(di, nc);
        zk_layernorm_backward(NULL, dw, db, R, x, w, m, s, N, C);       /* W */
        untouched &= !memcmp(di, di1, nc * 4);
        same &= !memcmp(di, fdi, nc * 4) && !memcmp(dw, fdw, C * 4) && !memcmp(db, fdb, C * 4);
        free(di); free(dw); free(db); free(dw0); free(db0); free(di1);
    }
    snprintf(name, sizeof name, "layernorm split backward N=%d C=%d: I then W = fused, bit for bit "
             "(1/2/3 threads)", N, C);
    ct_check(same, name, "differ");
    snprintf(name, sizeof name, "layernorm split backward N=%d C=%d: NULL parts untouched", N, C);
    ct_check(untouched, name, "written");
    free(x); free(w); free(b); free(R); free(d0); free(out); free(m); free(s);
    free(fdi); free(fdw); free(fdb);
    omp_set_num_threads(2);
}

/* ---- matmul --------------------------------------------------------------- */

static void mm_ref(double *out, const double *x, const double *w, const double *b,
                   int N, int C, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double acc = b ? b[o] : 0;
            for (int c = 0; c < C; c++) acc += x[(size_t)n * C + c] * w[(size_t)o * C + c];
            out[(size_t)n * OC + o] = acc;
        }
}

typedef struct { const double *R; int N, C, OC; } mm_ctx;

/* x = [inp (N,C) | weight (OC,C) | bias (OC)] */
static double mm_loss(void *p, const double *x) {
    mm_ctx *c = p;
    size_t no = (size_t)c->N * c->OC;
    double *out = ct_alloc(no * 8), L = 0;
    mm_ref(out, x, x + (size_t)c->N * c->C, x + (size_t)c->N * c->C + (size_t)c->OC * c->C,
           c->N, c->C, c->OC);
    for (size_t i = 0; i < no; i++) L += out[i] * c->R[i];
    free(out);
    return L;
}

static void test_matmul_case(int N, int C, int OC, int fd) {
    char name[128];
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC, nt = nx + nw + OC;
    float *x = ct_rand(nx, -1, 1), *w = ct_rand(nw, -1, 1), *b = ct_rand(OC, -1, 1);
    double *xd = ct_alloc(nt * 8);
    for (size_t i = 0; i < nx; i++) xd[i] = x[i];
    for (size_t i = 0; i < nw; i++) xd[nx + i] = w[i];
    for (int i = 0; i < OC; i++) xd[nx + nw + i] = b[i];
    float *out = ct_rand(no, 7, 8);
    double *ro = ct_alloc(no * 8);
    double tol = 2e-6 * sqrt((double)C);
    zk_matmul_forward(out, x, w, b, N, C, OC, OC);
    mm_ref(ro, xd, xd + nx, xd + nx + nw, N, C, OC);
    snprintf(name, sizeof name, "matmul forward N=%d C=%d OC=%d with bias", N, C, OC);
    ct_close(name, out, ro, no, tol, 1e-5);
    zk_matmul_forward(out, x, w, NULL, N, C, OC, OC);
    mm_ref(ro, xd, xd + nx, NULL, N, C, OC);
    snprintf(name, sizeof name, "matmul forward N=%d C=%d OC=%d bias NULL", N, C, OC);
    ct_close(name, out, ro, no, tol, 1e-5);
    /* the bias, added per block, is one fp32 add on the finished dot */
    float *ob = ct_rand(no, 7, 8);
    zk_matmul_forward(ob, x, w, b, N, C, OC, OC);
    for (size_t i = 0; i < no; i++) out[i] += b[i % OC];
    snprintf(name, sizeof name, "matmul forward N=%d C=%d OC=%d bias = GEMM then one add", N, C, OC);
    ct_same_bits(name, ob, out, no * 4);
    free(ob);

    float *R = ct_rand(no, -1, 1);
    float *dx = ct_rand(nx, 5, 6), *dw = ct_rand(nw, 5, 6), *db = ct_rand(OC, 5, 6);
    zk_matmul_backward(dx, dw, db, R, x, w, N, C, OC, OC);
    double *g = ct_alloc(nt * 8);
    if (fd) {
        double *Rd = ct_to_double(R, no);
        mm_ctx ctx = {Rd, N, C, OC};
        ct_fd_grad(g, mm_loss, &ctx, xd, nt, FD_EPS);
        free(Rd);
    } else {
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++) {
                double a = 0;
                for (int o = 0; o < OC; o++) a += (double)R[(size_t)n * OC + o] * w[(size_t)o * C + c];
                g[(size_t)n * C + c] = a;
            }
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int c = 0; c < C; c++) {
                double a = 0;
                for (int n = 0; n < N; n++) a += (double)R[(size_t)n * OC + o] * x[(size_t)n * C + c];
                g[nx + (size_t)o * C + c] = a;
            }
            for (int n = 0; n < N; n++) s += R[(size_t)n * OC + o];
            g[nx + nw + o] = s;
        }
    }
    const char *how = fd ? "finite differences" : "double reference";
    snprintf(name, sizeof name, "matmul backward N=%d C=%d OC=%d dinp vs %s", N, C, OC, how);
    ct_close(name, dx, g, nx, 2e-6 * sqrt((double)OC) + 1e-6, 1e-4);
    snprintf(name, sizeof name, "matmul backward N=%d C=%d OC=%d dweight vs %s", N, C, OC, how);
    ct_close(name, dw, g + nx, nw, 2e-6 * sqrt((double)N) + 1e-6, 1e-4);
    snprintf(name, sizeof name, "matmul backward N=%d C=%d OC=%d dbias vs %s", N, C, OC, how);
    ct_close(name, db, g + nx + nw, OC, 1e-6, 1e-5);
    /* NULL dinp / dbias are skipped and leave nothing behind */
    float *dw2 = ct_alloc(nw * 4);
    zk_matmul_backward(NULL, dw2, NULL, R, x, w, N, C, OC, OC);
    snprintf(name, sizeof name, "matmul backward N=%d C=%d OC=%d NULL dinp/dbias", N, C, OC);
    ct_same_bits(name, dw2, dw, nw * 4);
    free(x); free(w); free(b); free(xd); free(out); free(ro); free(R); free(dx); free(dw);
    free(db); free(g); free(dw2);
}

static void test_matmul(void) {
    test_matmul_case(7, 13, 5, 1);
    test_matmul_case(3, 17, 33, 1);
    test_matmul_case(257, 193, 321, 0);
    test_matmul_case(600, 40, 70, 0);      /* cut by rows */
    int N = 257, C = 193, OC = 321;
    float *x = ct_rand(N * C, -1, 1), *w = ct_rand(OC * C, -1, 1), *b = ct_rand(OC, -1, 1);
    float *R = ct_rand(N * OC, -1, 1);
    float *o[3], *dx[3], *dw[3], *db[3];
    int calls = __atomic_load_n(&blas_set_calls, __ATOMIC_RELAXED);
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        o[t] = ct_alloc(N * OC * 4); dx[t] = ct_alloc(N * C * 4);
        dw[t] = ct_alloc(OC * C * 4); db[t] = ct_alloc(OC * 4);
        zk_matmul_forward(o[t], x, w, b, N, C, OC, OC);
        zk_matmul_backward(dx[t], dw[t], db[t], R, x, w, N, C, OC, OC);
    }
    ct_check(same3(o, N * OC) && same3(dx, N * C) && same3(dw, OC * C) && same3(db, OC),
             "matmul forward/backward same bits on 1/2/3 OpenMP threads", "differ");
    ct_check(__atomic_load_n(&blas_set_calls, __ATOMIC_RELAXED) == calls,
             "matmul never calls openblas_set_num_threads (a global: racy per call)",
             "%d calls", __atomic_load_n(&blas_set_calls, __ATOMIC_RELAXED) - calls);
    for (int t = 0; t < 3; t++) { free(o[t]); free(dx[t]); free(dw[t]); free(db[t]); }
    free(x); free(w); free(b); free(R);
    omp_set_num_threads(2);
}

/* Split backward: (dinp) then (dweight, dbias) equal the fused call bit for
 * bit on 1/2/3 threads, and a NULL output is left untouched. */
static void test_matmul_split_case(int N, int C, int OC) {
    char name[160];
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *x = ct_rand(nx, -1, 1), *w = ct_rand(nw, -1, 1), *R = ct_rand(no, -1, 1);
    omp_set_num_threads(2);
    float *fdx = ct_alloc(nx * 4), *fdw = ct_alloc(nw * 4), *fdb = ct_alloc(OC * 4);
    zk_matmul_backward(fdx, fdw, fdb, R, x, w, N, C, OC, OC);
    int same = 1, untouched = 1;
    for (int t = 1; t <= 3; t++) {
        omp_set_num_threads(t);
        float *dx = ct_rand(nx, 5, 6), *dw = ct_rand(nw, 5, 6), *db = ct_rand(OC, 5, 6);
        float *dw0 = dup_f(dw, nw), *db0 = dup_f(db, OC);
        zk_matmul_backward(dx, NULL, NULL, R, x, w, N, C, OC, OC);          /* I */
        untouched &= !memcmp(dw, dw0, nw * 4) && !memcmp(db, db0, OC * 4);
        float *dx1 = dup_f(dx, nx);
        zk_matmul_backward(NULL, dw, db, R, x, w, N, C, OC, OC);            /* W */
        untouched &= !memcmp(dx, dx1, nx * 4);
        same &= !memcmp(dx, fdx, nx * 4) && !memcmp(dw, fdw, nw * 4) && !memcmp(db, fdb, OC * 4);
        free(dx); free(dw); free(db); free(dw0); free(db0); free(dx1);
    }
    snprintf(name, sizeof name, "matmul split backward N=%d C=%d OC=%d: I then W = fused, bit for bit "
             "(1/2/3 threads)", N, C, OC);
    ct_check(same, name, "differ");
    snprintf(name, sizeof name, "matmul split backward N=%d C=%d OC=%d: NULL parts untouched", N, C, OC);
    ct_check(untouched, name, "written");
    free(x); free(w); free(R); free(fdx); free(fdw); free(fdb);
    omp_set_num_threads(2);
}

/* Another thread running GEMMs at the same time (a copy worker, a CPU
 * optimizer) must not change this thread's bits. */
typedef struct { const float *x, *w; float *out; int N, C, OC, reps; } mm_job;
static void *mm_worker(void *p) {
    mm_job *j = p;
    omp_set_num_threads(2);
    for (int r = 0; r < j->reps; r++) zk_matmul_forward(j->out, j->x, j->w, NULL, j->N, j->C, j->OC, j->OC);
    return NULL;
}

static void test_matmul_concurrent(void) {
    int N = 512, C = 384, OC = 1152;
    float *x = ct_rand((size_t)N * C, -1, 1), *w = ct_rand((size_t)OC * C, -1, 1);
    float *ref = ct_alloc((size_t)N * OC * 4), *o1 = ct_alloc((size_t)N * OC * 4);
    float *o2 = ct_alloc((size_t)N * OC * 4);
    omp_set_num_threads(2);
    zk_matmul_forward(ref, x, w, NULL, N, C, OC, OC);
    mm_job a = {x, w, o1, N, C, OC, 8}, b = {x, w, o2, N, C, OC, 8};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, mm_worker, &a);
    pthread_create(&tb, NULL, mm_worker, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    ct_check(!memcmp(o1, ref, (size_t)N * OC * 4) && !memcmp(o2, ref, (size_t)N * OC * 4),
             "matmul bits unchanged with two threads running GEMMs at once", "differ");
    free(x); free(w); free(ref); free(o1); free(o2);
}

/* ---- GELU ------------------------------------------------------------------ */

static double gelu_ref(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

static double gelu_loss(void *p, const double *x) {
    const double *R = p;
    (void)R;
    return gelu_ref(x[0]);
}

static void test_gelu(void) {
    size_t n = 2003;
    float *x = ct_rand(n, -6, 6);
    const float special[] = {0.0f, -0.0f, 1e-8f, -1e-8f, 1e-3f, -1e-3f, 10.0f, -10.0f, 30.0f,
                             -30.0f, 100.0f, -100.0f, 0.5f, -0.5f};
    memcpy(x, special, sizeof special);
    float *out = ct_alloc(n * 4);
    double *ref = ct_alloc(n * 8);
    zk_gelu_forward(out, x, n);
    for (size_t i = 0; i < n; i++) ref[i] = gelu_ref(x[i]);
    ct_close("gelu forward vs double tanh formula", out, ref, n, 5e-7, 2e-6);
    /* the derivative, elementwise, by central differences in double */
    float *dout = ct_rand(n, -1, 1), *din = ct_rand(n, 3, 4);
    zk_gelu_backward(din, x, dout, n);
    for (size_t i = 0; i < n; i++) {
        double xi = x[i], gi;
        ct_fd_grad(&gi, gelu_loss, NULL, &xi, 1, FD_EPS);
        ref[i] = gi * dout[i];
    }
    ct_close("gelu backward vs finite differences", din, ref, n, 2e-6, 1e-5);
    float *al = dup_f(dout, n);
    zk_gelu_backward(al, x, al, n);
    ct_same_bits("gelu backward with dinp aliasing dout", al, din, n * 4);
    /* the AVX-512 twin (where the CPU has it) against the AVX2 one: same bits,
     * specials and the odd-length tail included */
    float *po = ct_alloc(n * 4), *pd = ct_alloc(n * 4);
    zk_force_scalar(1);
    zk_gelu_forward(po, x, n);
    zk_gelu_backward(pd, x, dout, n);
    zk_force_scalar(0);
    ct_same_bits("gelu forward: default path = AVX2 path", out, po, n * 4);
    ct_same_bits("gelu backward: default path = AVX2 path", din, pd, n * 4);
    free(po); free(pd);
    free(x); free(out); free(ref); free(dout); free(din); free(al);

    n = 100003;
    x = ct_rand(n, -8, 8);
    dout = ct_rand(n, -1, 1);
    float *o[3], *d[3];
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        o[t] = ct_alloc(n * 4); d[t] = ct_alloc(n * 4);
        zk_gelu_forward(o[t], x, n);
        zk_gelu_backward(d[t], x, dout, n);
    }
    ct_check(same3(o, n) && same3(d, n), "gelu forward/backward same bits on 1/2/3 threads", "differ");
    for (int t = 0; t < 3; t++) { free(o[t]); free(d[t]); }
    free(x); free(dout);
    omp_set_num_threads(2);
}

/* ---- cross-entropy ---------------------------------------------------------- */

static double xent_ref_row(const double *x, int V, int tgt) {
    double m = x[0], s = 0;
    for (int i = 1; i < V; i++) m = x[i] > m ? x[i] : m;
    for (int i = 0; i < V; i++) s += exp(x[i] - m);
    return m + log(s) - x[tgt];
}

typedef struct { const int32_t *tgt; int N, V; double dscale; } xe_ctx;

static double xent_loss(void *p, const double *x) {
    xe_ctx *c = p;
    double L = 0;
    for (int n = 0; n < c->N; n++) L += xent_ref_row(x + (size_t)n * c->V, c->V, c->tgt[n]);
    return L * c->dscale;
}

static void test_xent_case(int N, int V, float spread, float offset, int fd) {
    char name[128];
    size_t nv = (size_t)N * V;
    float *x = ct_rand(nv, -spread, spread);
    for (size_t i = 0; i < nv; i++) x[i] += offset;
    int32_t *tg = ct_alloc(N * 4);
    for (int n = 0; n < N; n++) tg[n] = (int32_t)(ct_u64() % V);
    tg[0] = V - 1;
    float *loss = ct_alloc(N * 4), *dl = ct_alloc(nv * 4), dscale = 1.0f / N;
    zk_crossentropy(loss, dl, x, tg, N, V, V, dscale);
    double *xd = ct_to_double(x, nv), *rl = ct_alloc(N * 8), *g = ct_alloc(nv * 8);
    for (int n = 0; n < N; n++) rl[n] = xent_ref_row(xd + (size_t)n * V, V, tg[n]);
    snprintf(name, sizeof name, "crossentropy N=%d V=%d range %g+-%g losses", N, V, offset, spread);
    ct_close(name, loss, rl, N, 1e-5, 1e-5);
    xe_ctx ctx = {tg, N, V, dscale};
    if (fd) {
        ct_fd_grad(g, xent_loss, &ctx, xd, nv, FD_EPS);
    } else {
        for (int n = 0; n < N; n++) {
            const double *r = xd + (size_t)n * V;
            double lse = rl[n] + r[tg[n]];
            for (int i = 0; i < V; i++) g[(size_t)n * V + i] = (exp(r[i] - lse) - (i == tg[n])) * dscale;
        }
    }
    snprintf(name, sizeof name, "crossentropy N=%d V=%d dlogits vs %s", N, V,
             fd ? "finite differences" : "double softmax");
    ct_close(name, dl, g, nv, 1e-6 * dscale + 1e-9, 1e-4);
    /* dlogits may alias logits; losses alone (dlogits NULL) are the same */
    float *al = dup_f(x, nv), *l2 = ct_alloc(N * 4);
    zk_crossentropy(l2, al, al, tg, N, V, V, dscale);
    snprintf(name, sizeof name, "crossentropy N=%d V=%d dlogits aliasing logits", N, V);
    ct_check(!memcmp(al, dl, nv * 4) && !memcmp(l2, loss, N * 4), name, "differ");
    zk_crossentropy(l2, NULL, x, tg, N, V, V, dscale);
    snprintf(name, sizeof name, "crossentropy N=%d V=%d dlogits NULL", N, V);
    ct_same_bits(name, l2, loss, N * 4);
    /* the plain path (each exp computed twice) gives the same bits */
    float *pd = ct_alloc(nv * 4);
    zk_force_scalar(1);
    zk_crossentropy(l2, pd, x, tg, N, V, V, dscale);
    zk_force_scalar(0);
    snprintf(name, sizeof name, "crossentropy N=%d V=%d one exp per logit = two (plain path)", N, V);
    ct_check(!memcmp(pd, dl, nv * 4) && !memcmp(l2, loss, N * 4), name, "differ");
    free(pd);
    free(x); free(tg); free(loss); free(dl); free(xd); free(rl); free(g); free(al); free(l2);
}

/* Padded rows (the LM head's logits): rows ld > V apart give each row the
 * contiguous call's bits; logits' pad is never read (NaN there), dlogits'
 * pad is written 0. The bf16 twin: zk_crossentropy on the widened row,
 * dlogits rounded once (zk_cast_f32_bf16), in place or not. */
static void test_xent_padded(int N, int V) {
    char name[128];
    int ld = (V + 127) / 128 * 128;
    if (ld == V) ld += 128;
    size_t nv = (size_t)N * V, nl = (size_t)N * ld;
    float *x = ct_rand(nv, -6, 6);
    int32_t *tg = ct_alloc(N * 4);
    for (int n = 0; n < N; n++) tg[n] = (int32_t)(ct_u64() % V);
    float *loss = ct_alloc(N * 4), *dl = ct_alloc(nv * 4);
    zk_crossentropy(loss, dl, x, tg, N, V, V, 0.5f);
    float *px = ct_alloc(nl * 4), *pdl = ct_alloc(nl * 4), *pl = ct_alloc(N * 4);
    for (size_t i = 0; i < nl; i++) { px[i] = NAN; pdl[i] = NAN; }
    for (int n = 0; n < N; n++) memcpy(px + (size_t)n * ld, x + (size_t)n * V, (size_t)V * 4);
    zk_crossentropy(pl, pdl, px, tg, N, V, ld, 0.5f);
    long bad = 0, pad = 0;
    for (int n = 0; n < N; n++) {
        bad += memcmp(pdl + (size_t)n * ld, dl + (size_t)n * V, (size_t)V * 4) != 0;
        for (int j = V; j < ld; j++) pad += f2u_(pdl[(size_t)n * ld + j]) != 0;
    }
    snprintf(name, sizeof name, "crossentropy N=%d V=%d rows padded to %d: same bits, pad 0", N, V, ld);
    ct_check(bad == 0 && pad == 0 && !memcmp(pl, loss, N * 4), name, "%ld rows differ, %ld pad "
             "elements not +0, losses %s", bad, pad, memcmp(pl, loss, N * 4) ? "differ" : "same");
    /* bf16: rows rounded to bf16, the fp32 kernel on their widened values */
    uint16_t *bx = ct_alloc(nl * 2), *bd = ct_alloc(nl * 2);
    float *wx = ct_alloc(nv * 4), *wl = ct_alloc(N * 4), *wd = ct_alloc(nv * 4), *bl = ct_alloc(N * 4);
    for (size_t i = 0; i < nl; i++) bx[i] = 0x7fc1;
    for (int n = 0; n < N; n++) zk_cast_f32_bf16(bx + (size_t)n * ld, x + (size_t)n * V, (size_t)V);
    for (int n = 0; n < N; n++) zk_cast_bf16_f32(wx + (size_t)n * V, bx + (size_t)n * ld, (size_t)V);
    zk_crossentropy(wl, wd, wx, tg, N, V, V, 0.5f);
    uint16_t *want = ct_alloc(nv * 2);
    zk_cast_f32_bf16(want, wd, nv);
    for (int inplace = 0; inplace <= 1; inplace++) {
        uint16_t *src = bx, *dst = bd;
        if (inplace) dst = src;     /* bx is overwritten: the last case */
        else for (size_t i = 0; i < nl; i++) bd[i] = 0x7fc1;
        zk_crossentropy_bf16(bl, dst, src, tg, N, V, ld, 0.5f);
        bad = 0; pad = 0;
        for (int n = 0; n < N; n++) {
            bad += memcmp(dst + (size_t)n * ld, want + (size_t)n * V, (size_t)V * 2) != 0;
            for (int j = V; j < ld; j++) pad += dst[(size_t)n * ld + j] != 0;
        }
        snprintf(name, sizeof name, "crossentropy bf16 N=%d V=%d ld=%d%s: the fp32 kernel's bits "
                 "on the widened rows, rounded once", N, V, ld, inplace ? " in place" : "");
        ct_check(bad == 0 && pad == 0 && !memcmp(bl, wl, N * 4), name, "%ld rows differ, %ld pad "
                 "not 0, losses %s", bad, pad, memcmp(bl, wl, N * 4) ? "differ" : "same");
    }
    free(x); free(tg); free(loss); free(dl); free(px); free(pdl); free(pl);
    free(bx); free(bd); free(wx); free(wl); free(wd); free(bl); free(want);
}

/* bf16 outputs (a bf16 GEMM's input): layernorm forward and GELU forward
 * and backward give the fp32 kernels' floats rounded once, bit for bit;
 * mean and rstd unchanged */
static void test_b16_outputs(int N, int C) {
    char name[128];
    size_t nc = (size_t)N * C;
    float *x = ct_rand(nc, -3, 3), *w = ct_rand(C, 0.5f, 1.5f), *b = ct_rand(C, -0.5f, 0.5f);
    float *d = ct_rand(nc, -1, 1), *o = ct_alloc(nc * 4), *m = ct_alloc(N * 4), *r = ct_alloc(N * 4);
    float *m2 = ct_alloc(N * 4), *r2 = ct_alloc(N * 4);
    uint16_t *o16 = ct_alloc(nc * 2), *want = ct_alloc(nc * 2);
    zk_layernorm_forward(o, m, r, x, w, b, N, C);
    zk_layernorm_forward_b16(o16, m2, r2, x, w, b, N, C);
    zk_cast_f32_bf16(want, o, nc);
    snprintf(name, sizeof name, "layernorm forward N=%d C=%d bf16 out = the fp32 out rounded once", N, C);
    ct_check(!memcmp(o16, want, nc * 2) && !memcmp(m, m2, N * 4) && !memcmp(r, r2, N * 4), name, "differ");
    /* GELU rounds in its own loop: on the AVX-512 twin and the plain path */
    for (int plain = 0; plain <= 1; plain++) {
        zk_force_scalar(plain);
        const char *path = plain ? " (plain path)" : "";
        zk_gelu_forward(o, x, nc);
        zk_gelu_forward_b16(o16, x, nc);
        zk_cast_f32_bf16(want, o, nc);
        snprintf(name, sizeof name, "gelu forward n=%zu bf16 out = the fp32 out rounded once%s", nc, path);
        ct_same_bits(name, o16, want, nc * 2);
        zk_gelu_backward(o, x, d, nc);
        zk_gelu_backward_b16(o16, x, d, nc);
        zk_cast_f32_bf16(want, o, nc);
        snprintf(name, sizeof name, "gelu backward n=%zu bf16 dinp = the fp32 dinp rounded once%s", nc, path);
        ct_same_bits(name, o16, want, nc * 2);
    }
    zk_force_scalar(0);
    /* the layer norm backward's rounded dinp: its dinp (unchanged), cast */
    {
        float *di1 = ct_alloc(nc * 4), *di2 = ct_alloc(nc * 4), *gw = ct_alloc(C * 4), *gb = ct_alloc(C * 4);
        float *gw2 = ct_alloc(C * 4), *gb2 = ct_alloc(C * 4);
        uint16_t *d16 = ct_alloc(nc * 2);
        for (size_t i = 0; i < nc; i++) di1[i] = di2[i] = 0.5f * (float)(i % 7);   /* ACCUMULATED */
        zk_layernorm_forward(o, m, r, x, w, b, N, C);
        zk_layernorm_backward(di1, gw, gb, d, x, w, m, r, N, C);
        zk_layernorm_backward_b16(di2, d16, gw2, gb2, d, x, w, m, r, N, C);
        zk_cast_f32_bf16(want, di1, nc);
        snprintf(name, sizeof name, "layernorm backward N=%d C=%d with dinp16: dinp, dw, db the same, "
                 "dinp16 = the accumulated dinp rounded once", N, C);
        ct_check(!memcmp(di1, di2, nc * 4) && !memcmp(gw, gw2, C * 4) && !memcmp(gb, gb2, C * 4) &&
                 !memcmp(d16, want, nc * 2), name, "differ");
        free(di1); free(di2); free(gw); free(gb); free(gw2); free(gb2); free(d16);
    }
    /* a bf16 inp (the c_fc GEMM's bf16 out): the _b16 kernels' bits on the
     * input widened, forward and backward */
    uint16_t *x16 = ct_alloc(nc * 2);
    float *xw = ct_alloc(nc * 4);
    zk_cast_f32_bf16(x16, x, nc);
    zk_cast_bf16_f32(xw, x16, nc);
    zk_gelu_forward_b16(want, xw, nc);
    zk_gelu_forward_bb(o16, x16, nc);
    snprintf(name, sizeof name, "gelu forward n=%zu bf16 inp = the bf16-out kernel on it widened", nc);
    ct_same_bits(name, o16, want, nc * 2);
    zk_gelu_backward_b16(want, xw, d, nc);
    zk_gelu_backward_bb(o16, x16, d, nc);
    snprintf(name, sizeof name, "gelu backward n=%zu bf16 inp = the bf16-out kernel on it widened", nc);
    ct_same_bits(name, o16, want, nc * 2);
    free(x16); free(xw);
    /* the residual add fused with the layer norm: add3 then the forward's bits */
    float *ra = ct_rand(nc, -2, 2), *rb = ct_rand(nc, -2, 2), *sum = ct_alloc(nc * 4), *res = ct_alloc(nc * 4);
    float *fo = ct_alloc(nc * 4);
    zk_add3(sum, ra, rb, nc);
    zk_layernorm_forward(o, m, r, sum, w, b, N, C);
    zk_layernorm_residual_forward(res, fo, NULL, m2, r2, ra, rb, w, b, N, C);
    snprintf(name, sizeof name, "layernorm fused with the residual N=%d C=%d: add3 then the forward's bits", N, C);
    ct_check(!memcmp(res, sum, nc * 4) && !memcmp(fo, o, nc * 4) && !memcmp(m, m2, N * 4) &&
             !memcmp(r, r2, N * 4), name, "differ");
    zk_cast_f32_bf16(want, o, nc);
    zk_layernorm_residual_forward(res, NULL, o16, m2, r2, ra, rb, w, b, N, C);
    snprintf(name, sizeof name, "layernorm fused with the residual N=%d C=%d, bf16 out", N, C);
    ct_same_bits(name, o16, want, nc * 2);
    free(ra); free(rb); free(sum); free(res); free(fo);
    free(x); free(w); free(b); free(d); free(o); free(m); free(r); free(m2); free(r2); free(o16); free(want);
}

static void test_xent(void) {
    test_xent_padded(3, 1000);
    test_xent_padded(2, 50257);
    test_xent_padded(4, 7);
    test_xent_case(5, 17, 3, 0, 1);
    test_xent_case(3, 9, 40, 0, 1);        /* one logit dominates; exp underflows */
    test_xent_case(4, 50257, 8, 0, 0);     /* GPT-2's vocabulary */
    test_xent_case(3, 1001, 5, 1000, 0);   /* large offset: needs the max shift */
    int N = 70, V = 1003;
    float *x = ct_rand(N * V, -5, 5);
    int32_t *tg = ct_alloc(N * 4);
    for (int n = 0; n < N; n++) tg[n] = (int32_t)(ct_u64() % V);
    float *l[3], *d[3];
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        l[t] = ct_alloc(N * 4); d[t] = ct_alloc(N * V * 4);
        zk_crossentropy(l[t], d[t], x, tg, N, V, V, 0.25f);
    }
    ct_check(same3(l, N) && same3(d, N * V), "crossentropy same bits on 1/2/3 threads", "differ");
    /* targets outside [0,V): skipped (loss and dlogits row 0), counted; the
     * other rows are unchanged */
    int32_t *bt = (int32_t *)dup_f((float *)tg, N);
    bt[3] = V; bt[40] = -7;
    float *lb = ct_alloc(N * 4), *db = ct_rand(N * V, 1, 2);
    int nbad = zk_crossentropy(lb, db, x, bt, N, V, V, 0.25f);
    int rows = 1;
    for (int n = 0; n < N; n++) {
        int skip = n == 3 || n == 40;
        if (skip) {
            rows &= lb[n] == 0.0f;
            for (int i = 0; i < V; i++) rows &= db[(size_t)n * V + i] == 0.0f;
        } else {
            rows &= lb[n] == l[1][n] && !memcmp(db + (size_t)n * V, d[1] + (size_t)n * V, V * 4);
        }
    }
    ct_check(nbad == 2, "crossentropy counts targets outside [0,V)", "counted %d", nbad);
    ct_check(rows, "crossentropy: bad rows zeroed, the others unchanged", "differ");
    ct_check(zk_crossentropy(lb, NULL, x, tg, N, V, V, 0.25f) == 0, "crossentropy counts no bad targets",
             "counted some");
    free(bt); free(lb); free(db);
    for (int t = 0; t < 3; t++) { free(l[t]); free(d[t]); }
    free(x); free(tg);
    omp_set_num_threads(2);
}

int main(void) {
    ct_seed(2);
    omp_set_num_threads(2);
    ct_check(openblas_get_num_threads() == 1, "OpenBLAS runs one thread from load (set once)",
             "%d", openblas_get_num_threads());
    test_encoder();
    test_layernorm();
    test_layernorm_split_case(7, 13);
    test_layernorm_split_case(129, 771);
    test_layernorm_split_case(1024, 768);
    test_matmul();
    test_matmul_split_case(7, 13, 5);
    test_matmul_split_case(257, 193, 321);
    test_matmul_split_case(1024, 768, 2304);
    test_matmul_concurrent();
    test_matmul_padded(300, 64, 1000);
    test_matmul_padded(65, 768, 2049);
    test_matmul_padded(7, 5, 3);
    test_gelu();
    test_xent();
    test_b16_outputs(33, 2500);     /* C over the 1024-float chunk, n over GELU's blocks */
    test_b16_outputs(1, 7);
    return ct_summary();
}
