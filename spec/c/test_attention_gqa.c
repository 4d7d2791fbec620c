/*
 * test_attention_gqa.c -- grouped-query attention with a sliding window
 * (zk_attention_*_gqa): qkv rows q (NH heads) | k (NKV) | v (NKV), query
 * head h reading kv head h / (NH/NKV); window W: query i sees keys
 * (i - W, i] (W = 0 plain causal). Against a naive double reference (full
 * score rows, the mask written out), the backward against central
 * differences of it (small cases) and its analytic double backward (the
 * others, itself checked against the differences); NKV in {1, 2, NH},
 * windows of 1, smaller than a key tile, straddling tiles, and larger than
 * T (then the bits of W = 0); the same bits on 1/2/3 threads and on the
 * AVX2 path; the KV cache fed in chunks and single steps giving the full
 * forward's rows bit for bit, caches (B,NKV,maxT,hs); the bf16-I/O kernels
 * = round(f32 kernels(widened)), bits.
 */
#include "ctest.h"
#include "kernels.h"

typedef struct { int B, T, NH, NKV, hs, W; } gq;

static size_t rw(gq s) { return (size_t)(s.NH + 2 * s.NKV) * s.hs; }
static size_t nqkv(gq s) { return (size_t)s.B * s.T * rw(s); }
static size_t nout(gq s) { return (size_t)s.B * s.T * s.NH * s.hs; }
static size_t nlse(gq s) { return (size_t)s.B * s.NH * s.T; }
static int seen(gq s, int i, int j) { return j <= i && (s.W == 0 || j > i - s.W); }
/* offsets in qkv of q head h (0), kv head g's k (1), v (2) at (b, t) */
static size_t at(gq s, int b, int t, int which, int h) {
    size_t o = ((size_t)b * s.T + t) * rw(s);
    return which == 0 ? o + (size_t)h * s.hs
                      : o + (size_t)s.NH * s.hs + ((size_t)(which - 1) * s.NKV + h) * s.hs;
}

/* the probabilities p[j] of row (b, h, t) and its lse, in double */
static double ref_row(gq s, const double *qkv, int b, int h, int t, double *p) {
    int g = h / (s.NH / s.NKV);
    double scale = 1.0 / sqrt((double)s.hs), m = -INFINITY, sum = 0;
    for (int j = 0; j <= t; j++) {
        if (!seen(s, t, j)) continue;
        double d = 0;
        for (int i = 0; i < s.hs; i++) d += qkv[at(s, b, t, 0, h) + i] * qkv[at(s, b, j, 1, g) + i];
        p[j] = d * scale;
        if (p[j] > m) m = p[j];
    }
    for (int j = 0; j <= t; j++) if (seen(s, t, j)) sum += exp(p[j] - m);
    double L = m + log(sum);
    for (int j = 0; j <= t; j++) p[j] = seen(s, t, j) ? exp(p[j] - L) : 0;
    return L;
}

static void ref_fwd(gq s, double *out, double *lse, const double *qkv) {
    double *p = ct_alloc(s.T * sizeof(double));
    int C = s.NH * s.hs;
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int t = 0; t < s.T; t++) {
                double L = ref_row(s, qkv, b, h, t, p);
                double *o = out + ((size_t)b * s.T + t) * C + h * s.hs;
                for (int i = 0; i < s.hs; i++) o[i] = 0;
                for (int j = 0; j <= t; j++)
                    for (int i = 0; i < s.hs; i++) o[i] += p[j] * qkv[at(s, b, j, 2, h / (s.NH / s.NKV)) + i];
                if (lse) lse[((size_t)b * s.NH + h) * s.T + t] = L;
            }
    free(p);
}

static void ref_bwd(gq s, double *dqkv, const double *dout, const double *qkv) {
    double *p = ct_alloc(s.T * sizeof(double)), *dp = ct_alloc(s.T * sizeof(double));
    double scale = 1.0 / sqrt((double)s.hs);
    int C = s.NH * s.hs;
    memset(dqkv, 0, nqkv(s) * sizeof(double));
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int t = 0; t < s.T; t++) {
                int g = h / (s.NH / s.NKV);
                const double *dO = dout + ((size_t)b * s.T + t) * C + h * s.hs;
                double D = 0;
                ref_row(s, qkv, b, h, t, p);
                for (int j = 0; j <= t; j++) {
                    dp[j] = 0;
                    for (int i = 0; i < s.hs; i++) dp[j] += dO[i] * qkv[at(s, b, j, 2, g) + i];
                    D += p[j] * dp[j];
                }
                for (int j = 0; j <= t; j++) {
                    double ds = p[j] * (dp[j] - D) * scale;
                    size_t qo = at(s, b, t, 0, h), ko = at(s, b, j, 1, g), vo = at(s, b, j, 2, g);
                    for (int i = 0; i < s.hs; i++) {
                        dqkv[qo + i] += ds * qkv[ko + i];
                        dqkv[ko + i] += ds * qkv[qo + i];
                        dqkv[vo + i] += p[j] * dO[i];
                    }
                }
            }
    free(p); free(dp);
}

typedef struct { gq s; const double *R; } fd_ctx;

static double loss(void *pc, const double *qkv) {
    fd_ctx *c = pc;
    size_t n = nout(c->s);
    double *out = ct_alloc(n * sizeof(double)), L = 0;
    ref_fwd(c->s, out, NULL, qkv);
    for (size_t i = 0; i < n; i++) L += out[i] * c->R[i];
    free(out);
    return L;
}

static void fwd(gq s, float *o, float *l, const float *q) {
    zk_attention_forward_gqa(o, l, q, s.B, s.T, s.NH * s.hs, s.NH, s.NKV, s.W);
}
static void bwd(gq s, float *d, const float *dy, const float *q, const float *o, const float *l) {
    zk_attention_backward_gqa(d, dy, q, o, l, s.B, s.T, s.NH * s.hs, s.NH, s.NKV, s.W);
}

static void tagof(char *tag, size_t n, gq s) {
    snprintf(tag, n, "B=%d T=%d NH=%d NKV=%d hs=%d W=%d", s.B, s.T, s.NH, s.NKV, s.hs, s.W);
}

static void test_case(gq s, int fd) {
    char name[192], tag[96];
    tagof(tag, sizeof tag, s);
    size_t nq = nqkv(s), no = nout(s), nl = nlse(s);
    float *qkv = ct_rand(nq, -1.5f, 1.5f), *out = ct_rand(no, 9, 10), *lse = ct_rand(nl, 9, 10);
    fwd(s, out, lse, qkv);
    double *qd = ct_to_double(qkv, nq), *ro = ct_alloc(no * 8), *rl = ct_alloc(nl * 8);
    ref_fwd(s, ro, rl, qd);
    snprintf(name, sizeof name, "gqa forward %s out", tag);
    ct_close(name, out, ro, no, 2e-6, 1e-5);
    snprintf(name, sizeof name, "gqa forward %s lse", tag);
    ct_close(name, lse, rl, nl, 2e-6, 1e-5);
    float *R = ct_rand(no, -1, 1), *dqkv = ct_rand(nq, 9, 10);   /* garbage: WRITTEN */
    bwd(s, dqkv, R, qkv, out, lse);
    double *g = ct_alloc(nq * 8), *Rd = ct_to_double(R, no), *a = ct_alloc(nq * 8);
    ref_bwd(s, a, Rd, qd);
    if (fd) {
        fd_ctx c = { s, Rd };
        ct_fd_grad(g, loss, &c, qd, nq, 1e-5);
        float *af = ct_alloc(nq * 4);
        for (size_t i = 0; i < nq; i++) af[i] = (float)a[i];
        snprintf(name, sizeof name, "gqa reference backward %s vs finite differences", tag);
        ct_close(name, af, g, nq, 1e-6, 1e-5);
        free(af);
    } else {
        memcpy(g, a, nq * 8);
    }
    snprintf(name, sizeof name, "gqa backward %s dqkv vs %s", tag,
             fd ? "finite differences" : "double analytic");
    ct_close(name, dqkv, g, nq, 1e-5, 1e-4);
    free(qkv); free(out); free(lse); free(qd); free(ro); free(rl); free(R); free(dqkv);
    free(g); free(Rd); free(a);
}

/* 1/2/3 threads and the AVX2 path (zk_force_scalar): the same bits */
static void test_threads(gq s) {
    char name[192], tag[96];
    tagof(tag, sizeof tag, s);
    size_t nq = nqkv(s), no = nout(s), nl = nlse(s);
    float *qkv = ct_rand(nq, -2, 2), *R = ct_rand(no, -1, 1), *o[4], *l[4], *d[4];
    for (int t = 0; t < 4; t++) {
        omp_set_num_threads(t < 3 ? t + 1 : 2);
        zk_force_scalar(t == 3);
        o[t] = ct_alloc(no * 4); l[t] = ct_alloc(nl * 4); d[t] = ct_alloc(nq * 4);
        fwd(s, o[t], l[t], qkv);
        bwd(s, d[t], R, qkv, o[t], l[t]);
    }
    zk_force_scalar(0);
    int same = 1;
    for (int t = 1; t < 4; t++)
        same &= !memcmp(o[0], o[t], no * 4) && !memcmp(l[0], l[t], nl * 4) &&
                !memcmp(d[0], d[t], nq * 4);
    snprintf(name, sizeof name, "gqa %s: same bits on 1/2/3 threads and the AVX2 path", tag);
    ct_check(same, name, "outputs differ");
    for (int t = 0; t < 4; t++) { free(o[t]); free(l[t]); free(d[t]); }
    free(qkv); free(R);
    omp_set_num_threads(2);
}

/* A window of T or more is plain causal: W = 0's bits */
static void test_wide_window(gq s) {
    char name[192], tag[96];
    tagof(tag, sizeof tag, s);
    size_t nq = nqkv(s), no = nout(s), nl = nlse(s);
    float *qkv = ct_rand(nq, -2, 2), *R = ct_rand(no, -1, 1);
    float *o0 = ct_alloc(no * 4), *l0 = ct_alloc(nl * 4), *d0 = ct_alloc(nq * 4);
    float *o1 = ct_alloc(no * 4), *l1 = ct_alloc(nl * 4), *d1 = ct_alloc(nq * 4);
    gq c = s;
    c.W = 0;
    fwd(c, o0, l0, qkv); bwd(c, d0, R, qkv, o0, l0);
    fwd(s, o1, l1, qkv); bwd(s, d1, R, qkv, o1, l1);
    snprintf(name, sizeof name, "gqa %s (window >= T): plain causal's bits", tag);
    ct_check(!memcmp(o0, o1, no * 4) && !memcmp(l0, l1, nl * 4) && !memcmp(d0, d1, nq * 4),
             name, "outputs differ from W=0");
    free(qkv); free(R); free(o0); free(l0); free(d0); free(o1); free(l1); free(d1);
}

/* The KV cache fed in chunks (a chunk of 1 is a decode step): the full
 * forward's rows bit for bit, and (B,NKV,maxT,hs) caches */
static void test_decode(gq s, int maxT, const int *chunks, int nchunk, int threads) {
    char name[224], tag[96];
    tagof(tag, sizeof tag, s);
    omp_set_num_threads(threads);
    int C = s.NH * s.hs, Ttot = s.T;
    size_t nq = nqkv(s), no = nout(s), nc = (size_t)s.B * s.NKV * maxT * s.hs;
    float *qkv = ct_rand(nq, -1.5f, 1.5f), *full = ct_alloc(no * 4), *lse = ct_alloc(nlse(s) * 4);
    float *got = ct_rand(no, 9, 10), *kc = ct_rand(nc, 9, 10), *vc = ct_rand(nc, 9, 10);
    fwd(s, full, lse, qkv);
    int pos = 0;
    for (int c = 0; pos < Ttot; c++) {
        int T = c < nchunk ? chunks[c] : chunks[nchunk - 1];
        if (pos + T > Ttot) T = Ttot - pos;
        float *q = ct_alloc((size_t)s.B * T * rw(s) * 4), *o = ct_rand((size_t)s.B * T * C, 9, 10);
        for (int b = 0; b < s.B; b++)
            memcpy(q + (size_t)b * T * rw(s), qkv + ((size_t)b * Ttot + pos) * rw(s), (size_t)T * rw(s) * 4);
        zk_attention_decode_gqa(o, kc, vc, q, s.B, T, C, s.NH, s.NKV, s.W, maxT, pos);
        for (int b = 0; b < s.B; b++)
            memcpy(got + ((size_t)b * Ttot + pos) * C, o + (size_t)b * T * C, (size_t)T * C * 4);
        free(q); free(o);
        pos += T;
    }
    snprintf(name, sizeof name, "gqa decode %s maxT=%d chunks from %d, %d threads: the full "
             "forward's rows, bits", tag, maxT, chunks[0], threads);
    ct_same_bits(name, got, full, no * 4);
    int ok = 1;
    for (int b = 0; b < s.B; b++)
        for (int g = 0; g < s.NKV; g++)
            for (int t = 0; t < Ttot; t++) {
                size_t c = (((size_t)b * s.NKV + g) * maxT + t) * s.hs;
                ok &= !memcmp(kc + c, qkv + at(s, b, t, 1, g), s.hs * 4) &&
                      !memcmp(vc + c, qkv + at(s, b, t, 2, g), s.hs * 4);
            }
    snprintf(name, sizeof name, "gqa decode %s: caches (B,NKV,maxT,hs) hold every k and v", tag);
    ct_check(ok, name, "a cache row differs");
    free(qkv); free(full); free(lse); free(got); free(kc); free(vc);
    omp_set_num_threads(2);
}

static void test_bf16_io(gq s, int threads) {
    char name[192], tag[96];
    tagof(tag, sizeof tag, s);
    omp_set_num_threads(threads);
    int C = s.NH * s.hs;
    size_t nq = nqkv(s), no = nout(s), nl = nlse(s);
    float *x = ct_rand(nq, -2, 2), *R = ct_rand(no, -1, 1);
    uint16_t *q16 = ct_alloc(nq * 2), *o16 = ct_alloc(no * 2), *d16 = ct_alloc(nq * 2);
    uint16_t *want_o = ct_alloc(no * 2), *want_d = ct_alloc(nq * 2);
    float *qw = ct_alloc(nq * 4), *of = ct_alloc(no * 4), *ow = ct_alloc(no * 4);
    float *lf = ct_alloc(nl * 4), *l16 = ct_rand(nl, 9, 10), *df = ct_alloc(nq * 4);
    zk_cast_f32_bf16(q16, x, nq);
    zk_cast_bf16_f32(qw, q16, nq);
    uint16_t *R16 = ct_alloc(no * 2);                /* dout bf16, R its widening */
    zk_cast_f32_bf16(R16, R, no);
    zk_cast_bf16_f32(R, R16, no);
    for (size_t i = 0; i < no; i++) o16[i] = 0x7fc1;
    for (size_t i = 0; i < nq; i++) d16[i] = 0x7fc1;
    fwd(s, of, lf, qw);
    zk_cast_f32_bf16(want_o, of, no);
    int rf = zk_attention_forward_gqa_bb(o16, l16, q16, s.B, s.T, C, s.NH, s.NKV, s.W);
    zk_cast_bf16_f32(ow, o16, no);
    bwd(s, df, R, qw, ow, lf);
    zk_cast_f32_bf16(want_d, df, nq);
    int rb = zk_attention_backward_gqa_bb(d16, R16, q16, o16, l16, s.B, s.T, C, s.NH, s.NKV, s.W);
    snprintf(name, sizeof name, "gqa bf16 I/O %s, %d threads: forward = round(f32(widened)), bits",
             tag, threads);
    ct_check(rf == 0 && !memcmp(o16, want_o, no * 2) && !memcmp(l16, lf, nl * 4), name,
             "rc %d; out or lse differs", rf);
    snprintf(name, sizeof name, "gqa bf16 I/O %s, %d threads: backward = round(f32(widened)), bits",
             tag, threads);
    ct_check(rb == 0 && !memcmp(d16, want_d, nq * 2), name, "rc %d; dqkv differs", rb);
    free(R16);
    free(x); free(R); free(q16); free(o16); free(d16); free(want_o); free(want_d);
    free(qw); free(of); free(ow); free(lf); free(l16); free(df);
    omp_set_num_threads(2);
}

int main(void) {
    ct_seed(33);
    omp_set_num_threads(2);
    /* B, T, NH, NKV, hs, W */
    test_case((gq){1, 9, 4, 2, 3, 0}, 1);       /* GQA, plain causal */
    test_case((gq){1, 9, 4, 1, 3, 3}, 1);       /* MQA, window 3 */
    test_case((gq){2, 8, 2, 2, 4, 1}, 1);       /* window 1: each query sees itself */
    test_case((gq){1, 11, 3, 3, 5, 4}, 1);      /* NKV = NH, window */
    test_case((gq){2, 150, 4, 2, 16, 0}, 0);    /* across query and key tiles */
    test_case((gq){2, 150, 4, 1, 16, 40}, 0);   /* window < a key tile */
    test_case((gq){1, 200, 6, 2, 64, 100}, 0);  /* window straddling key tiles, hs 64 */
    test_case((gq){1, 140, 4, 4, 80, 70}, 0);   /* hs 80 > the head-dim chunk */
    test_case((gq){1, 70, 8, 2, 5, 500}, 0);    /* window > T */
    test_threads((gq){2, 150, 4, 2, 64, 50});
    test_threads((gq){3, 100, 6, 3, 16, 0});
    test_threads((gq){1, 130, 4, 1, 80, 65});
    test_wide_window((gq){2, 130, 4, 2, 16, 130});
    test_wide_window((gq){1, 70, 2, 1, 64, 1000});
    {
        int one[] = {1}, pre[] = {5, 1}, mixed[] = {33, 2, 40, 1, 7};
        test_decode((gq){1, 150, 4, 2, 64, 0}, 160, one, 1, 2);
        test_decode((gq){2, 140, 6, 2, 16, 37}, 140, pre, 2, 1);
        test_decode((gq){2, 150, 4, 1, 16, 64}, 256, mixed, 5, 3);
        test_decode((gq){1, 131, 2, 2, 80, 100}, 200, mixed, 5, 2);
    }
    test_bf16_io((gq){2, 130, 4, 2, 64, 0}, 2);
    test_bf16_io((gq){1, 150, 6, 2, 16, 50}, 3);
    test_bf16_io((gq){2, 70, 3, 1, 5, 9}, 1);
    return ct_summary();
}
