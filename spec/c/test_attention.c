/*
 * test_attention.c -- causal self-attention against a naive double
 * reference (full score rows, no tiling), its backward against central
 * differences of that reference and against the analytic double backward,
 * and bit-identity under 1/2/3 OpenMP threads; the KV-cache kernel fed a
 * sequence in chunks and one-token steps against the forward's rows (bit
 * for bit) and the reference. Sizes straddle the kernel's
 * tiles (T not a multiple of 32 or 64) and head sizes 3, 5, 16, 64 and 80
 * (above the 64-wide head-dim chunk). The bf16-I/O kernels against the
 * f32 ones on widened inputs, rounded: bit for bit.
 */
#include "ctest.h"
#include "kernels.h"

typedef struct { int B, T, C, NH; const double *R; } at_ctx;

/* out (B,T,C), lse (B,NH,T) from qkv (B,T,3C), all double. */
static void attn_ref(double *out, double *lse, const double *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    double *s = ct_alloc(T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double m = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
                    double d = 0;
                    for (int i = 0; i < hs; i++) d += q[i] * k[i];
                    s[j] = d * scale;
                    if (s[j] > m) m = s[j];
                }
                for (int j = 0; j <= t; j++) sum += exp(s[j] - m);
                double L = m + log(sum);
                double *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) o[i] = 0;
                for (int j = 0; j <= t; j++) {
                    const double *v = qkv + ((size_t)b * T + j) * 3 * C + 2 * C + h * hs;
                    double p = exp(s[j] - L);
                    for (int i = 0; i < hs; i++) o[i] += p * v[i];
                }
                if (lse) lse[((size_t)b * NH + h) * T + t] = L;
            }
    free(s);
}

/* dqkv (B,T,3C) from dout, the textbook way: P, dP = dO V^T, dS = P (dP - D). */
static void attn_ref_backward(double *dqkv, const double *dout, const double *qkv,
                              int B, int T, int C, int NH) {
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    double *p = ct_alloc(T * sizeof(double)), *dp = ct_alloc(T * sizeof(double));
    memset(dqkv, 0, (size_t)B * T * 3 * C * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                size_t qo = ((size_t)b * T + t) * 3 * C + h * hs;
                const double *q = qkv + qo, *dO = dout + ((size_t)b * T + t) * C + h * hs;
                double m = -INFINITY, sum = 0, D = 0;
                for (int j = 0; j <= t; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
                    double d = 0;
                    for (int i = 0; i < hs; i++) d += q[i] * k[i];
                    p[j] = d * scale;
                    if (p[j] > m) m = p[j];
                }
                for (int j = 0; j <= t; j++) sum += exp(p[j] - m);
                for (int j = 0; j <= t; j++) {
                    const double *v = qkv + ((size_t)b * T + j) * 3 * C + 2 * C + h * hs;
                    p[j] = exp(p[j] - m) / sum;
                    dp[j] = 0;
                    for (int i = 0; i < hs; i++) dp[j] += dO[i] * v[i];
                    D += p[j] * dp[j];
                }
                for (int j = 0; j <= t; j++) {
                    size_t ko = ((size_t)b * T + j) * 3 * C + h * hs;
                    double ds = p[j] * (dp[j] - D) * scale;
                    for (int i = 0; i < hs; i++) {
                        dqkv[qo + i] += ds * qkv[ko + C + i];
                        dqkv[ko + C + i] += ds * q[i];
                        dqkv[ko + 2 * C + i] += p[j] * dO[i];
                    }
                }
            }
    free(p); free(dp);
}

static double attn_loss(void *pc, const double *qkv) {
    at_ctx *c = pc;
    size_t n = (size_t)c->B * c->T * c->C;
    double *out = ct_alloc(n * sizeof(double)), L = 0;
    attn_ref(out, NULL, qkv, c->B, c->T, c->C, c->NH);
    for (size_t i = 0; i < n; i++) L += out[i] * c->R[i];
    free(out);
    return L;
}

static void test_case(int B, int T, int C, int NH, int fd) {
    char name[160], tag[64];
    snprintf(tag, sizeof tag, "B=%d T=%d C=%d NH=%d hs=%d", B, T, C, NH, C / NH);
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = ct_rand(nq, -1.5f, 1.5f);
    float *out = ct_rand(no, 9, 10), *lse = ct_rand(nl, 9, 10);
    zk_attention_forward(out, lse, qkv, B, T, C, NH);
    double *qd = ct_to_double(qkv, nq), *ro = ct_alloc(no * 8), *rl = ct_alloc(nl * 8);
    attn_ref(ro, rl, qd, B, T, C, NH);
    snprintf(name, sizeof name, "attention forward %s out", tag);
    ct_close(name, out, ro, no, 2e-6, 1e-5);
    snprintf(name, sizeof name, "attention forward %s lse", tag);
    ct_close(name, lse, rl, nl, 2e-6, 1e-5);

    float *R = ct_rand(no, -1, 1), *dqkv = ct_rand(nq, 9, 10);
    zk_attention_backward(dqkv, R, qkv, out, lse, B, T, C, NH);
    double *g = ct_alloc(nq * 8), *Rd = ct_to_double(R, no);
    if (fd) {
        at_ctx ctx = {B, T, C, NH, Rd};
        ct_fd_grad(g, attn_loss, &ctx, qd, nq, 1e-5);
    } else {
        attn_ref_backward(g, Rd, qd, B, T, C, NH);
    }
    snprintf(name, sizeof name, "attention backward %s dqkv vs %s", tag,
             fd ? "finite differences" : "double analytic");
    ct_close(name, dqkv, g, nq, 1e-5, 1e-4);
    if (fd) {   /* the analytic reference used for the big cases, checked too */
        double *a = ct_alloc(nq * 8);
        attn_ref_backward(a, Rd, qd, B, T, C, NH);
        float *af = ct_alloc(nq * 4);
        for (size_t i = 0; i < nq; i++) af[i] = (float)a[i];
        snprintf(name, sizeof name, "attention reference backward %s vs finite differences", tag);
        ct_close(name, af, g, nq, 1e-6, 1e-5);
        free(a); free(af);
    }
    free(qkv); free(out); free(lse); free(qd); free(ro); free(rl); free(R); free(dqkv);
    free(g); free(Rd);
}

static void test_threads(int B, int T, int C, int NH) {
    char name[128];
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = ct_rand(nq, -2, 2), *R = ct_rand(no, -1, 1);
    float *o[3], *l[3], *d[3];
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        o[t] = ct_alloc(no * 4); l[t] = ct_alloc(nl * 4); d[t] = ct_alloc(nq * 4);
        zk_attention_forward(o[t], l[t], qkv, B, T, C, NH);
        zk_attention_backward(d[t], R, qkv, o[t], l[t], B, T, C, NH);
    }
    int same = 1;
    for (int t = 1; t < 3; t++)
        same &= !memcmp(o[0], o[t], no * 4) && !memcmp(l[0], l[t], nl * 4) &&
                !memcmp(d[0], d[t], nq * 4);
    snprintf(name, sizeof name, "attention B=%d T=%d C=%d NH=%d same bits on 1/2/3 threads",
             B, T, C, NH);
    ct_check(same, name, "outputs differ across thread counts");
    for (int t = 0; t < 3; t++) { free(o[t]); free(l[t]); free(d[t]); }
    free(qkv); free(R);
    omp_set_num_threads(2);
}

/* The AVX-512 products (where the CPU has them) against the AVX2 path that
 * zk_force_scalar selects: the same bits, forward and backward. */
static void test_paths(int B, int T, int C, int NH) {
    char name[160];
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = ct_rand(nq, -2, 2), *R = ct_rand(no, -1, 1);
    float *o[2], *l[2], *d[2];
    for (int p = 0; p < 2; p++) {
        zk_force_scalar(p);
        o[p] = ct_alloc(no * 4); l[p] = ct_alloc(nl * 4); d[p] = ct_alloc(nq * 4);
        zk_attention_forward(o[p], l[p], qkv, B, T, C, NH);
        zk_attention_backward(d[p], R, qkv, o[p], l[p], B, T, C, NH);
    }
    zk_force_scalar(0);
    snprintf(name, sizeof name, "attention B=%d T=%d C=%d NH=%d hs=%d: %s path = AVX2 path, bits",
             B, T, C, NH, C / NH,
             __builtin_cpu_supports("avx512f") ? "AVX-512" : "(no AVX-512 here) default");
    ct_check(!memcmp(o[0], o[1], no * 4) && !memcmp(l[0], l[1], nl * 4) &&
             !memcmp(d[0], d[1], nq * 4), name, "outputs differ between the paths");
    for (int p = 0; p < 2; p++) { free(o[p]); free(l[p]); free(d[p]); }
    free(qkv); free(R);
}

/* Large scores (|s| up to ~250): most exps underflow, one key dominates a
 * row; nothing may overflow or NaN. Float scores of that size carry
 * ~1e-5 absolute error, hence the looser tolerance. */
static void test_peaked(void) {
    int B = 1, T = 40, C = 16, NH = 1;
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = ct_rand(nq, -8, 8);
    float *out = ct_alloc(no * 4), *lse = ct_alloc(nl * 4);
    zk_attention_forward(out, lse, qkv, B, T, C, NH);
    double *qd = ct_to_double(qkv, nq), *ro = ct_alloc(no * 8), *rl = ct_alloc(nl * 8);
    attn_ref(ro, rl, qd, B, T, C, NH);
    ct_close("attention forward peaked scores out", out, ro, no, 2e-4, 1e-4);
    ct_close("attention forward peaked scores lse", lse, rl, nl, 1e-4, 1e-5);
    free(qkv); free(out); free(lse); free(qd); free(ro); free(rl);
}

/* The KV-cache kernel over a sequence of Ttot positions fed in chunks
 * (chunk[0] the prefill, then the rest in turn; a chunk of 1 is a decode
 * step): every out row has the bits of that row of the full forward, lies
 * within rounding of the naive double reference, and the caches hold each
 * position's key and value in (B,NH,maxT,hs) order. */
static void test_decode(int B, int Ttot, int C, int NH, int maxT, const int *chunks, int nchunk,
                        int threads) {
    char name[192], tag[96];
    int hs = C / NH;
    snprintf(tag, sizeof tag, "B=%d T=%d C=%d NH=%d hs=%d maxT=%d chunks from %d, %d threads",
             B, Ttot, C, NH, hs, maxT, chunks[0], threads);
    omp_set_num_threads(threads);
    size_t nq = (size_t)B * Ttot * 3 * C, no = (size_t)B * Ttot * C, nl = (size_t)B * NH * Ttot;
    size_t nc = (size_t)B * NH * maxT * hs;
    float *qkv = ct_rand(nq, -1.5f, 1.5f);
    float *full = ct_alloc(no * 4), *lse = ct_alloc(nl * 4), *got = ct_rand(no, 9, 10);
    float *kc = ct_rand(nc, 9, 10), *vc = ct_rand(nc, 9, 10);   /* stale rows must not leak in */
    zk_attention_forward(full, lse, qkv, B, Ttot, C, NH);
    int pos = 0;
    for (int c = 0; pos < Ttot; c++) {
        int T = c < nchunk ? chunks[c] : chunks[nchunk - 1];
        if (pos + T > Ttot) T = Ttot - pos;
        float *q = ct_alloc((size_t)B * T * 3 * C * 4), *o = ct_rand((size_t)B * T * C, 9, 10);
        for (int b = 0; b < B; b++)   /* this chunk's rows of the sequence */
            memcpy(q + (size_t)b * T * 3 * C, qkv + ((size_t)b * Ttot + pos) * 3 * C,
                   (size_t)T * 3 * C * 4);
        zk_attention_decode(o, kc, vc, q, B, T, C, NH, maxT, pos);
        for (int b = 0; b < B; b++)
            memcpy(got + ((size_t)b * Ttot + pos) * C, o + (size_t)b * T * C, (size_t)T * C * 4);
        free(q); free(o);
        pos += T;
    }
    snprintf(name, sizeof name, "attention decode %s: same bits as the full forward's rows", tag);
    ct_same_bits(name, got, full, no * 4);
    double *qd = ct_to_double(qkv, nq), *ro = ct_alloc(no * 8);
    attn_ref(ro, NULL, qd, B, Ttot, C, NH);
    snprintf(name, sizeof name, "attention decode %s: vs the double reference", tag);
    ct_close(name, got, ro, no, 2e-6, 1e-5);
    int cache_ok = 1;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < Ttot; t++) {
                const float *src = qkv + ((size_t)b * Ttot + t) * 3 * C + h * hs;
                size_t at = (((size_t)b * NH + h) * maxT + t) * hs;
                cache_ok &= !memcmp(kc + at, src + C, hs * 4) && !memcmp(vc + at, src + 2 * C, hs * 4);
            }
    snprintf(name, sizeof name, "attention decode %s: caches hold every position's k and v", tag);
    ct_check(cache_ok, name, "a cache row differs from its qkv key/value");
    free(qkv); free(full); free(lse); free(got); free(kc); free(vc); free(qd); free(ro);
    omp_set_num_threads(2);
}

/* The bf16-I/O kernels (bf16 activations): out, lse and dqkv have the
 * bits of the f32 kernels run on the widened qkv (and out), out and dqkv
 * rounded once; on every thread count. The outputs start as garbage, so
 * an element the kernel leaves unwritten fails too. */
static void test_bf16_io(int B, int T, int C, int NH, int threads) {
    char name[192];
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    omp_set_num_threads(threads);
    float *x = ct_rand(nq, -2, 2), *R = ct_rand(no, -1, 1);
    uint16_t *q16 = ct_alloc(nq * 2), *o16 = ct_alloc(no * 2), *d16 = ct_alloc(nq * 2);
    uint16_t *want_o = ct_alloc(no * 2), *want_d = ct_alloc(nq * 2);
    float *qw = ct_alloc(nq * 4), *of = ct_alloc(no * 4), *ow = ct_alloc(no * 4);
    float *lf = ct_alloc(nl * 4), *l16 = ct_rand(nl, 9, 10), *df = ct_alloc(nq * 4);
    zk_cast_f32_bf16(q16, x, nq);
    zk_cast_bf16_f32(qw, q16, nq);
    uint16_t *R16 = ct_alloc(no * 2);                           /* dout bf16, R its widening */
    zk_cast_f32_bf16(R16, R, no);
    zk_cast_bf16_f32(R, R16, no);
    for (size_t i = 0; i < no; i++) o16[i] = 0x7fc1;            /* NaN: must be overwritten */
    for (size_t i = 0; i < nq; i++) d16[i] = 0x7fc1;
    zk_attention_forward(of, lf, qw, B, T, C, NH);
    zk_cast_f32_bf16(want_o, of, no);
    int rf = zk_attention_forward_bb(o16, l16, q16, B, T, C, NH);
    zk_cast_bf16_f32(ow, o16, no);
    zk_attention_backward(df, R, qw, ow, lf, B, T, C, NH);
    zk_cast_f32_bf16(want_d, df, nq);
    int rb = zk_attention_backward_bb(d16, R16, q16, o16, l16, B, T, C, NH);
    snprintf(name, sizeof name, "attention bf16 I/O B=%d T=%d C=%d NH=%d hs=%d, %d threads: "
             "forward = round(f32 forward(widened qkv)), bits", B, T, C, NH, C / NH, threads);
    ct_check(rf == 0 && !memcmp(o16, want_o, no * 2) && !memcmp(l16, lf, nl * 4), name,
             "rc %d; out or lse differs", rf);
    snprintf(name, sizeof name, "attention bf16 I/O B=%d T=%d C=%d NH=%d hs=%d, %d threads: "
             "backward = round(f32 backward(widened)), bits", B, T, C, NH, C / NH, threads);
    ct_check(rb == 0 && !memcmp(d16, want_d, nq * 2), name, "rc %d; dqkv differs", rb);
    free(x); free(R); free(R16); free(q16); free(o16); free(d16); free(want_o); free(want_d);
    free(qw); free(of); free(ow); free(lf); free(l16); free(df);
    omp_set_num_threads(2);
}

int main(void) {
    ct_seed(3);
    omp_set_num_threads(2);
    test_case(1, 7, 15, 3, 1);      /* hs=5, one tile */
    test_case(2, 70, 6, 2, 1);      /* hs=3, crosses query and key tiles */
    test_case(1, 9, 32, 2, 1);      /* hs=16 */
    test_case(2, 130, 128, 2, 0);   /* hs=64, GPT-2's head size */
    test_case(1, 97, 48, 3, 0);     /* hs=16, T odd */
    test_case(1, 70, 160, 2, 0);    /* hs=80 > the 64-wide chunk */
    test_case(1, 200, 15, 3, 0);    /* hs=5, long T */
    test_peaked();
    test_threads(2, 100, 128, 2);
    test_threads(3, 67, 48, 3);
    test_paths(2, 130, 128, 2);     /* hs=64: 64-wide blocks only */
    test_paths(1, 100, 160, 2);     /* hs=80: a 64-wide block and a 16-wide rest */
    test_paths(1, 70, 432, 3);      /* hs=144: two blocks, rest to the 8-wide path */
    test_paths(2, 67, 15, 3);       /* hs=5: no 64-wide block at all */
    {   /* decode: one-token steps across key tiles (AK = 64), chunked prefills */
        int one[] = {1}, pre[] = {5, 1}, big[] = {70, 1}, mixed[] = {33, 2, 40, 1, 7};
        test_decode(1, 150, 128, 2, 160, one, 1, 2);      /* hs=64 */
        test_decode(2, 140, 15, 3, 140, pre, 2, 1);       /* hs=5, cache exactly full */
        test_decode(1, 131, 160, 2, 200, big, 2, 3);      /* hs=80 > the head-dim chunk */
        test_decode(2, 150, 48, 3, 256, mixed, 5, 2);     /* hs=16, chunks of several sizes */
        test_decode(1, 9, 64, 1, 9, one, 1, 2);           /* hs=64, one head, short */
    }
    test_bf16_io(2, 130, 128, 2, 2);   /* hs=64, query and key tiles straddled */
    test_bf16_io(1, 257, 256, 2, 3);   /* hs=128, T one past a tile */
    test_bf16_io(2, 70, 15, 3, 1);     /* hs=5: the scalar tails */
    test_bf16_io(1, 70, 160, 2, 2);    /* hs=80 > the head-dim chunk */
    return ct_summary();
}
