/*
 * test_matmul_bf16.c -- zk_matmul_bf16_forward/backward against
 *  - a naive loop of the defining chain (matmul_bf16.c's header), written
 *    here independently: each step's exact value a*b + c in __float128,
 *    rounded by hand (DAZ, FTZ with tininess after rounding), bit for bit;
 *  - the other path: AVX512_BF16 (the instruction itself) against the
 *    portable C path, bit for bit, on random data and on special values
 *    (NaN payloads, infinities, denormals, results on the FTZ boundary);
 *  - a double-precision reference within a bound derived from K: the
 *    products of bf16 values are exact in fp32, so a sequential fp32 chain
 *    of K' = K rounded up to even steps (plus the bias add) errs by at most
 *    (K'+1) u sum|a b| + u|bias|, u = 2^-24 (ignoring flushed tinies,
 *    absent at these magnitudes); against the fp32 data BEFORE rounding to
 *    bf16 add 2 u_bf16 + u_bf16^2 of sum|a b|, u_bf16 = 2^-8;
 *  - itself on 1, 2 and 3 OpenMP threads; split backward against fused.
 * The AMX path (where this CPU and kernel allow it) has its own bits
 * (kernels.h): it is checked against its own model written here (two lanes
 * of 16 steps per 32-deep chunk, then ADD(acc, ADD(e, o))), bit for bit,
 * on the same shapes, specials and FTZ boundary; against double within
 * (ceil(K/32) + 18) u sum|ab| (a product meets at most 16 lane steps, two
 * adds in its chunk and one add per later chunk, plus the bias add); and
 * for the invariances its thread-invariance rests on: 1/2/3 threads,
 * several task and K-block sizes (zk_amx_set_blocking), and the same
 * elements computed at other places in the tiles (shifted rows, cropped
 * columns).
 * Odd shapes (N, C, OC not multiples of 12/16/32, C = 1, OC = 1, K odd and
 * beyond one 128-wide K block), bias NULL.
 */
#include "ctest.h"
#include "kernels.h"
#include "ztrain.h"

typedef __float128 quad;

static float u2f(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static uint32_t f2u(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float bf(uint16_t h) { return u2f((uint32_t)h << 16); }
static int isnan_u(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

/* round to nearest even bf16 (ties away never happen in the data below) */
static uint16_t to_bf16(float x) {
    uint32_t u = f2u(x);
    if (isnan_u(u)) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* ---- the defining step, from its statement ------------------------------- */
static float daz(float x) { return fabsf(x) < 0x1p-126f ? copysignf(0.0f, x) : x; }

static float ref_step(float c, float a, float b) {
    if (isnan(a)) return u2f(f2u(a) | 0x00400000u);
    if (isnan(b)) return u2f(f2u(b) | 0x00400000u);
    if (isnan(c)) return u2f(f2u(c) | 0x00400000u);
    a = daz(a); b = daz(b); c = daz(c);
    int inf_ab = isinf(a) || isinf(b);
    if (inf_ab && (a == 0 || b == 0)) return u2f(0xffc00000u);          /* inf * 0 */
    if (inf_ab || isinf(c)) {
        float p = inf_ab ? copysignf(INFINITY, a) * copysignf(1.0f, b) : 0.0f;
        if (inf_ab && isinf(c) && (p > 0) != (c > 0)) return u2f(0xffc00000u); /* inf - inf */
        return inf_ab ? p : c;
    }
    /* exact enough in quad: a*b has 16 bits; where the sum needs more than
     * 113 bits the smaller term is far below half an ulp of the larger */
    quad v = (quad)a * (quad)b + (quad)c;
    if (v == 0) {   /* an exact zero: +0 unless both terms are -0 (x86 RNE) */
        float p = a * b;      /* exact sign of the product's zero or value */
        return (signbit(p) && signbit(c) && p == 0 && c == 0) ? -0.0f : 0.0f;
    }
    quad av = v < 0 ? -v : v;
    /* tiny after rounding to 24 bits with an unbounded exponent */
    if (av < (quad)0x1p-126 - (quad)0x1p-151) return v < 0 ? -0.0f : 0.0f;
    return (float)v;          /* normal range: round to nearest even (or inf) */
}

static float ref_add_bias(float acc, float b) {
    if (isnan(acc)) return acc;
    if (isnan(b)) return u2f(f2u(b) | 0x00400000u);
    float r = acc + b;
    return isnan(r) ? u2f(0xffc00000u) : r;
}

/* the chain: K padded with +0 to even; per pair the odd element first */
static float ref_dot(const uint16_t *a, long as, const uint16_t *b, long bs, int K) {
    float acc = 0.0f;
    for (int p = 0; p < (K + 1) / 2; p++) {
        float ah = 2 * p + 1 < K ? bf(a[(2 * p + 1) * as]) : 0.0f;
        float bh = 2 * p + 1 < K ? bf(b[(2 * p + 1) * bs]) : 0.0f;
        acc = ref_step(acc, ah, bh);
        acc = ref_step(acc, bf(a[2 * p * as]), bf(b[2 * p * bs]));
    }
    return acc;
}

/* AMX's: an fp32 add, DAZ, FTZ, the first operand's NaN first */
static float ref_add(float x, float y) {
    if (isnan(x)) return u2f(f2u(x) | 0x00400000u);
    if (isnan(y)) return u2f(f2u(y) | 0x00400000u);
    x = daz(x); y = daz(y);
    float r = x + y;              /* a tiny sum of normals is exact: flush it */
    if (isnan(r)) return u2f(0xffc00000u);
    return fabsf(r) < 0x1p-126f ? copysignf(0.0f, r) : r;
}

/* K padded with +0 to a multiple of 32; per chunk an even and an odd lane
 * of ref_step from +0, then acc = acc + (e + o) */
static float ref_dot_amx(const uint16_t *a, long as, const uint16_t *b, long bs, int K) {
    float acc = 0.0f;
    for (int c0 = 0; c0 < K; c0 += 32) {
        float e = 0.0f, o = 0.0f;
        for (int p = 0; p < 16; p++) {
            int k = c0 + 2 * p;
            e = ref_step(e, k < K ? bf(a[k * as]) : 0.0f, k < K ? bf(b[k * bs]) : 0.0f);
            o = ref_step(o, k + 1 < K ? bf(a[(k + 1) * as]) : 0.0f,
                         k + 1 < K ? bf(b[(k + 1) * bs]) : 0.0f);
        }
        acc = ref_add(acc, ref_add(e, o));
    }
    return acc;
}

static const char *path_name(int path) {
    return path == 2 ? "amx" : path == 1 ? "avx512_bf16" : "portable";
}

/* ---- data ----------------------------------------------------------------- */
static uint16_t *rand_bf16(size_t n, float lo, float hi, float **orig) {
    uint16_t *x = ct_alloc(n * 2);
    float *o = ct_alloc(n * 4);
    for (size_t i = 0; i < n; i++) { o[i] = ct_unif(lo, hi); x[i] = to_bf16(o[i]); }
    if (orig) *orig = o; else free(o);
    return x;
}

typedef struct {
    int N, C, OC;
    uint16_t *inp, *w, *dout;     /* bf16 */
    float *inp32, *w32, *dout32;  /* the fp32 values before rounding */
    float *bias;
} prob;

static prob make(int N, int C, int OC) {
    prob p = {N, C, OC, 0, 0, 0, 0, 0, 0, 0};
    p.inp = rand_bf16((size_t)N * C, -1, 1, &p.inp32);
    p.w = rand_bf16((size_t)OC * C, -1, 1, &p.w32);
    p.dout = rand_bf16((size_t)N * OC, -1, 1, &p.dout32);
    p.bias = ct_rand(OC, -1, 1);
    return p;
}

static void unmake(prob *p) {
    free(p->inp); free(p->w); free(p->dout);
    free(p->inp32); free(p->w32); free(p->dout32); free(p->bias);
}

typedef struct { float *out, *dinp, *dw, *db; } outs;

static outs run(const prob *p, int with_bias) {
    outs o;
    o.out = ct_alloc((size_t)p->N * p->OC * 4);
    o.dinp = ct_alloc((size_t)p->N * p->C * 4);
    o.dw = ct_alloc((size_t)p->OC * p->C * 4);
    o.db = ct_alloc((size_t)p->OC * 4);
    /* poison the outputs: everything must be WRITTEN */
    memset(o.out, 0xff, (size_t)p->N * p->OC * 4);
    memset(o.dinp, 0xff, (size_t)p->N * p->C * 4);
    memset(o.dw, 0xff, (size_t)p->OC * p->C * 4);
    zk_matmul_bf16_forward(o.out, p->inp, p->w, with_bias ? p->bias : NULL, p->N, p->C, p->OC, p->OC);
    zk_matmul_bf16_backward(o.dinp, o.dw, o.db, p->dout, p->inp, p->w, p->N, p->C, p->OC, p->OC);
    return o;
}

static void unrun(outs *o) { free(o->out); free(o->dinp); free(o->dw); free(o->db); }

static int same_outs(const prob *p, const outs *a, const outs *b) {
    return !memcmp(a->out, b->out, (size_t)p->N * p->OC * 4) &&
           !memcmp(a->dinp, b->dinp, (size_t)p->N * p->C * 4) &&
           !memcmp(a->dw, b->dw, (size_t)p->OC * p->C * 4) &&
           !memcmp(a->db, b->db, (size_t)p->OC * 4);
}

/* ---- checks --------------------------------------------------------------- */

/* every output against ref_dot (bit for bit) and against double within the
 * stated bound, both on the bf16 values and on the fp32 originals */
static void check_against_refs(const prob *p, const outs *o, int with_bias, int path) {
    const char *tag = path_name(path);
    int N = p->N, C = p->C, OC = p->OC;
    long bad_bits = 0, bad_bound = 0, bad_orig = 0;
    double worst = 0, worst_orig = 0;
    const double u = 0x1p-24, ub = 0x1p-8;
    /* three GEMMs as (M, Nn, K, A(m,k), B(k,n), C) */
    for (int g = 0; g < 3; g++) {
        int M = g == 0 ? N : g == 1 ? N : OC;
        int Nn = g == 0 ? OC : C;
        int K = g == 0 ? C : g == 1 ? OC : N;
        const float *got = g == 0 ? o->out : g == 1 ? o->dinp : o->dw;
        for (int m = 0; m < M; m++)
            for (int n = 0; n < Nn; n++) {
                const uint16_t *a, *b; long as, bs;
                const float *a32, *b32;
                if (g == 0) { a = p->inp + (long)m * C; as = 1; b = p->w + (long)n * C; bs = 1;
                              a32 = p->inp32 + (long)m * C; b32 = p->w32 + (long)n * C; }
                else if (g == 1) { a = p->dout + (long)m * OC; as = 1; b = p->w + n; bs = C;
                                   a32 = p->dout32 + (long)m * OC; b32 = p->w32 + n; }
                else { a = p->dout + m; as = OC; b = p->inp + n; bs = C;
                       a32 = p->dout32 + m; b32 = p->inp32 + n; }
                float r = path == 2 ? ref_dot_amx(a, as, b, bs, K) : ref_dot(a, as, b, bs, K);
                float bias = (g == 0 && with_bias) ? p->bias[n] : 0.0f;
                if (g == 0 && with_bias) r = ref_add_bias(r, bias);
                float x = got[(long)m * Nn + n];
                if (f2u(r) != f2u(x)) bad_bits++;
                double exact = bias, exact_orig = bias, mag = 0;
                for (int k = 0; k < K; k++) {
                    double ab = (double)bf(a[k * as]) * bf(b[k * bs]);
                    exact += ab; mag += fabs(ab);
                    exact_orig += (double)a32[k * as] * b32[k * bs];
                }
                int K2 = K + (K & 1);   /* roundings a product meets, + the bias add */
                double h = path == 2 ? (K + 31) / 32 + 18 : K2 + 1;
                double bound = h * u * mag + u * fabs(bias) + 1e-30;
                double e = fabs(x - exact) / bound;
                if (e > worst) worst = e;
                if (e > 1) bad_bound++;
                double bound_o = bound + (2 * ub + ub * ub) * mag;
                double eo = fabs(x - exact_orig) / bound_o;
                if (eo > worst_orig) worst_orig = eo;
                if (eo > 1) bad_orig++;
            }
    }
    /* dbias: column sums of dout in double, rows in order */
    for (int j = 0; j < OC; j++) {
        double s = 0;
        for (int n = 0; n < N; n++) s += bf(p->dout[(long)n * OC + j]);
        if (f2u((float)s) != f2u(o->db[j])) bad_bits++;
    }
    char name[160];
    snprintf(name, sizeof name, "%s: N=%d C=%d OC=%d%s equals %s bit for bit", tag, N, C, OC,
             with_bias ? "" : " (bias NULL)", path == 2 ? "the AMX model" : "the defining chain");
    ct_check(bad_bits == 0, name, "%ld elements differ", bad_bits);
    snprintf(name, sizeof name, "%s: N=%d C=%d OC=%d within %s u sum|ab| of double "
             "(worst %.3f of the bound)", tag, N, C, OC, path == 2 ? "(K/32+18)" : "(K'+1)", worst);
    ct_check(bad_bound == 0, name, "%ld elements outside", bad_bound);
    snprintf(name, sizeof name, "%s: N=%d C=%d OC=%d within the bf16-rounding bound of the fp32 "
             "data (worst %.3f)", tag, N, C, OC, worst_orig);
    ct_check(bad_orig == 0, name, "%ld elements outside", bad_orig);
}

/* on the path in use (main runs it on each): the chain's shapes, and shapes
 * that cross AMX's 32-row/column blocks, 16-wide tiles and 32-deep chunks */
static void test_shapes(void) {
    static const int shapes[][3] = {
        {1, 1, 1}, {3, 1, 5}, {5, 7, 1}, {1, 64, 1}, {13, 33, 47}, {12, 32, 32},
        {17, 257, 31}, {25, 300, 70}, {7, 513, 3}, {100, 96, 33}, {31, 2, 529},
        {32, 32, 32}, {33, 31, 65}, {64, 800, 48}, {70, 129, 97},
    };
    int path = zk_bf16_simd(-1);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        prob p = make(shapes[s][0], shapes[s][1], shapes[s][2]);
        for (int wb = 1; wb >= 0; wb--) {
            outs o = run(&p, wb);
            check_against_refs(&p, &o, wb, path);
            unrun(&o);
        }
        unmake(&p);
    }
}

/* the portable path against the selected one (AVX512_BF16 where present) */
static void test_paths_agree(void) {
    int simd = zk_bf16_simd(1);
    if (!simd) { ct_ok("portable vs AVX512_BF16: this CPU has no AVX512_BF16 (skipped)"); return; }
    static const int shapes[][3] = {{1, 1, 1}, {13, 33, 47}, {200, 601, 1100}, {97, 1000, 31}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        prob p = make(shapes[s][0], shapes[s][1], shapes[s][2]);
        zk_bf16_simd(1);
        outs a = run(&p, 1);
        zk_bf16_simd(0);
        outs b = run(&p, 1);
        zk_bf16_simd(1);
        char name[128];
        snprintf(name, sizeof name, "portable path equals AVX512_BF16 bit for bit, N=%d C=%d OC=%d",
                 p.N, p.C, p.OC);
        ct_check(same_outs(&p, &a, &b), name, "outputs differ");
        unrun(&a); unrun(&b); unmake(&p);
    }
}

/* special operands: every pair of a small set of bf16 specials at each
 * position of a K=3 dot (odd: the pad step too), and accumulators that hit
 * NaN, inf and the FTZ boundary; both paths against the defining chain */
static void test_specials(void) {
    static const uint16_t sp[] = {
        0x0000, 0x8000, 0x3f80, 0xbf80, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0xff82,
        0x0001, 0x807f, 0x0080, 0x7f7f, 0xff7f, 0x2000, 0xa000, 0x1f80,
    };
    const int ns = sizeof sp / sizeof sp[0];
    /* forward with N = ns*ns rows, C = 3, OC = ns*ns/2: rows and columns run
     * through all (x, y) pairs of specials at two of the three positions */
    int N = ns * ns, C = 3, OC = ns * ns;
    uint16_t *inp = ct_alloc((size_t)N * C * 2), *w = ct_alloc((size_t)OC * C * 2);
    for (int i = 0; i < N; i++) {
        inp[i * C + 0] = sp[i % ns]; inp[i * C + 1] = sp[i / ns]; inp[i * C + 2] = 0x3f80;
    }
    for (int j = 0; j < OC; j++) {
        w[j * C + 0] = sp[j / ns]; w[j * C + 1] = sp[j % ns]; w[j * C + 2] = sp[(j * 7) % ns];
    }
    float *bias = ct_alloc(OC * 4);
    for (int j = 0; j < OC; j++) bias[j] = bf(sp[(j * 5) % ns]);
    float *o1 = ct_alloc((size_t)N * OC * 4), *o0 = ct_alloc((size_t)N * OC * 4);
    float *o2 = ct_alloc((size_t)N * OC * 4);
    int amx = zk_bf16_simd(2) == 2;
    zk_matmul_bf16_forward(o2, inp, w, bias, N, C, OC, OC);
    zk_bf16_simd(1);
    zk_matmul_bf16_forward(o1, inp, w, bias, N, C, OC, OC);
    zk_bf16_simd(0);
    zk_matmul_bf16_forward(o0, inp, w, bias, N, C, OC, OC);
    zk_bf16_simd(1);
    long bad1 = 0, bad0 = 0, bad2 = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < OC; j++) {
            float r = ref_add_bias(ref_dot(inp + i * C, 1, w + j * C, 1, C), bias[j]);
            if (f2u(r) != f2u(o1[(long)i * OC + j])) bad1++;
            if (f2u(r) != f2u(o0[(long)i * OC + j])) bad0++;
            if (!amx) continue;
            r = ref_add_bias(ref_dot_amx(inp + i * C, 1, w + j * C, 1, C), bias[j]);
            if (f2u(r) != f2u(o2[(long)i * OC + j])) bad2++;
        }
    ct_check(bad1 == 0, "specials (NaN payloads, inf, denormals, huge): AVX512_BF16 path equals "
             "the defining chain", "%ld of %d differ", bad1, N * OC);
    ct_check(bad0 == 0, "specials: portable path equals the defining chain",
             "%ld of %d differ", bad0, N * OC);
    if (amx)
        ct_check(bad2 == 0, "specials: AMX path equals the AMX model",
                 "%ld of %d differ", bad2, N * OC);

    /* the FTZ boundary: the last step's exact value lies in [2^-126 - 2^-150,
     * 2^-126 - 2^-151), where fmaf + flush keeps 2^-126 but the instruction
     * (tininess after rounding with an unbounded exponent) gives 0. Row i is
     * x = [T2, T1, a_i, T3] * 2^60, y = [2^-60, 2^-60, b, 2^-60]: the chain
     * (x1y1, x0y0, x3y3, x2y2) builds T = T1 + T2 + T3 exactly (three 8-bit
     * pieces of a 24-bit float), then adds p = a_i b, negative and fine. */
    int n2 = 0, cap = 4000, flushed = 0;
    uint16_t *x = ct_alloc((size_t)cap * 4 * 2), y[4];
    float *ob1 = ct_alloc((size_t)cap * 4), *ob0 = ct_alloc((size_t)cap * 4);
    uint16_t b = to_bf16(-0x1.37p-80f);
    y[0] = y[1] = y[3] = to_bf16(0x1p-60f);
    y[2] = b;
    const double lo = 0x1p-126 - 0x1p-150, hi = 0x1p-126 - 0x1p-151;
    for (int tries = 0; n2 < cap && tries < 100 * cap; tries++) {
        uint64_t r = ct_u64();
        uint16_t a = (uint16_t)((127 - 55 - (int)(r % 4)) << 7 | (r >> 8 & 0x7f));
        double pr = (double)bf(a) * bf(b);                 /* < 0, |p| ~ 2^-137 */
        float T = (float)(0x1p-126 - pr - 0.75 * 0x1p-150);
        int found = 0;
        for (int d = -2; d <= 2 && !found; d++) {
            float Td = u2f(f2u(T) + d);
            double v = (double)Td + pr;                      /* exact */
            if (v >= lo && v < hi) { T = Td; found = 1; }
        }
        if (!found) continue;
        float T1 = u2f(f2u(T) & 0xffff0000u), R1 = T - T1;
        float T2 = u2f(f2u(R1) & 0xffff0000u), T3 = R1 - T2;
        uint16_t *xi = x + (size_t)n2 * 4;
        xi[0] = to_bf16(T2 * 0x1p60f); xi[1] = to_bf16(T1 * 0x1p60f);
        xi[2] = a; xi[3] = to_bf16(T3 * 0x1p60f);
        if (bf(xi[0]) != T2 * 0x1p60f || bf(xi[1]) != T1 * 0x1p60f || bf(xi[3]) != T3 * 0x1p60f)
            continue;                                      /* a piece not 8 bits: skip */
        n2++;
    }
    zk_bf16_simd(1);
    zk_matmul_bf16_forward(ob1, x, y, NULL, n2, 4, 1, 1);
    zk_bf16_simd(0);
    zk_matmul_bf16_forward(ob0, x, y, NULL, n2, 4, 1, 1);
    zk_bf16_simd(1);
    bad1 = bad0 = 0;
    for (int i = 0; i < n2; i++) {
        float r = ref_dot(x + i * 4, 1, y, 1, 4);
        if (r == 0) flushed++;
        if (f2u(r) != f2u(ob1[i])) bad1++;
        if (f2u(r) != f2u(ob0[i])) bad0++;
    }
    ct_check(n2 >= 1000 && flushed == n2 && bad1 == 0 && bad0 == 0,
             "FTZ boundary (tininess after rounding): both paths flush, as the chain does",
             "%d cases, %d flushed by the reference; AVX512_BF16 path %ld differ, portable %ld",
             n2, flushed, bad1, bad0);
    if (amx) {  /* the same sums in AMX's even lane: x2 = [T2, 0, T1, 0, T3, 0, a_i, 0] */
        uint16_t *x2 = ct_alloc((size_t)n2 * 8 * 2), y2[8] = {y[1], 0, y[0], 0, y[3], 0, y[2], 0};
        for (int i = 0; i < n2; i++) {
            x2[i * 8 + 0] = x[i * 4 + 1]; x2[i * 8 + 2] = x[i * 4 + 0];
            x2[i * 8 + 4] = x[i * 4 + 3]; x2[i * 8 + 6] = x[i * 4 + 2];
        }
        zk_bf16_simd(2);
        zk_matmul_bf16_forward(ob1, x2, y2, NULL, n2, 8, 1, 1);
        zk_bf16_simd(1);
        long bad = 0, fl = 0;
        for (int i = 0; i < n2; i++) {
            float r = ref_dot_amx(x2 + i * 8, 1, y2, 1, 8);
            if (r == 0) fl++;
            if (f2u(r) != f2u(ob1[i])) bad++;
        }
        ct_check(fl == n2 && bad == 0, "FTZ boundary: AMX flushes in its lanes as the AMX model does",
                 "%d cases, %ld flushed by the model, %ld differ", n2, fl, bad);
        free(x2);
    }
    free(inp); free(w); free(bias); free(o1); free(o0); free(o2); free(x); free(ob1); free(ob0);
}

/* on the path in use */
static void test_threads(void) {
    const char *tag = path_name(zk_bf16_simd(-1));
    char name[160];
    prob p = make(200, 601, 1100);      /* 2 x 2 tasks, 5 K blocks, odd K */
    outs r[3];
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        r[t] = run(&p, 1);
    }
    omp_set_num_threads(1);
    snprintf(name, sizeof name, "%s: 1, 2 and 3 OpenMP threads give the same bits "
             "(N=200 C=601 OC=1100)", tag);
    ct_check(same_outs(&p, &r[0], &r[1]) && same_outs(&p, &r[0], &r[2]), name, "differ");
    /* split backward */
    float *dinp = ct_alloc((size_t)p.N * p.C * 4), *dw = ct_alloc((size_t)p.OC * p.C * 4);
    float *db = ct_alloc((size_t)p.OC * 4);
    zk_matmul_bf16_backward(dinp, NULL, NULL, p.dout, p.inp, p.w, p.N, p.C, p.OC, p.OC);
    zk_matmul_bf16_backward(NULL, dw, db, p.dout, p.inp, p.w, p.N, p.C, p.OC, p.OC);
    snprintf(name, sizeof name, "%s: split backward (dinp alone, then dweight + dbias) equals "
             "the fused call", tag);
    ct_check(!memcmp(dinp, r[0].dinp, (size_t)p.N * p.C * 4) &&
             !memcmp(dw, r[0].dw, (size_t)p.OC * p.C * 4) && !memcmp(db, r[0].db, p.OC * 4),
             name, "differ");
    free(dinp); free(dw); free(db);
    for (int t = 0; t < 3; t++) unrun(&r[t]);
    unmake(&p);
}

/* AMX: the invariances its bits rest on. An element's TDPBF16PS result
 * depends only on its accumulator, its A row and its B column, and every
 * element runs the same 32-deep chunks from k = 0, so neither the task and
 * K-block sizes nor the place in a tile where an element falls may change
 * a bit: computed with other blockings, and as part of problems whose rows
 * are shifted and columns cropped (the same element lands elsewhere in its
 * tile and block, edges and scratch blocks move), every element is equal. */
static void test_amx_invariance(void) {
    if (zk_bf16_simd(2) != 2) {
        ct_ok("AMX invariances: AMX is not usable here (skipped)");
        return;
    }
    int N = 200, C = 601, OC = 1100;
    prob p = make(N, C, OC);
    outs ref = run(&p, 1);
    static const int bl[][3] = {{32, 32, 32}, {64, 96, 64}, {96, 64, 160}, {160, 224, 96}};
    for (size_t b = 0; b < sizeof bl / sizeof bl[0]; b++) {
        char name[160];
        int rc = zk_amx_set_blocking(bl[b][0], bl[b][1], bl[b][2]);
        outs o = run(&p, 1);
        snprintf(name, sizeof name, "amx: task %d x %d, K block %d gives the default blocking's bits "
                 "(forward, dinp, dweight; N=%d C=%d OC=%d)", bl[b][0], bl[b][1], bl[b][2], N, C, OC);
        ct_check(rc == 0 && same_outs(&p, &o, &ref), name, rc ? "blocking refused" : "differ");
        unrun(&o);
    }
    ct_check(zk_amx_set_blocking(512, 128, 1024) == -1 && zk_amx_set_blocking(48, 0, 0) == -1,
             "amx: zk_amx_set_blocking refuses sizes its buffers cannot hold or not multiples of 32",
             "accepted");
    zk_amx_set_blocking(0, 0, 0);

    static const int sh[][2] = {{1, 0}, {7, 3}, {16, 17}, {33, 40}, {0, 95}};
    long bad_f = 0, bad_i = 0, bad_w = 0;
    for (size_t t = 0; t < sizeof sh / sizeof sh[0]; t++) {
        int r0 = sh[t][0], j0 = sh[t][1], c0 = sh[t][1] / 2;
        int N2 = N - r0, OC2 = OC - j0, C2 = C - c0;
        /* forward: rows r0.. of inp, rows j0.. of weight (columns of out) */
        float *out = ct_alloc((size_t)N2 * OC2 * 4);
        zk_matmul_bf16_forward(out, p.inp + (long)r0 * C, p.w + (long)j0 * C, p.bias + j0, N2, C, OC2, OC2);
        for (int i = 0; i < N2; i++)
            for (int j = 0; j < OC2; j++)
                bad_f += f2u(out[(long)i * OC2 + j]) != f2u(ref.out[(long)(r0 + i) * OC + j0 + j]);
        /* dinp: rows r0.. of dout; columns c0.. of weight (columns of dinp) */
        uint16_t *w2 = ct_alloc((size_t)OC * C2 * 2), *inp2 = ct_alloc((size_t)N * C2 * 2);
        uint16_t *dout2 = ct_alloc((size_t)N * OC2 * 2);
        for (int o = 0; o < OC; o++) memcpy(w2 + (long)o * C2, p.w + (long)o * C + c0, C2 * 2);
        float *dinp = ct_alloc((size_t)N2 * C2 * 4);
        zk_matmul_bf16_backward(dinp, NULL, NULL, p.dout + (long)r0 * OC, p.inp, w2, N2, C2, OC, OC);
        for (int i = 0; i < N2; i++)
            for (int c = 0; c < C2; c++)
                bad_i += f2u(dinp[(long)i * C2 + c]) != f2u(ref.dinp[(long)(r0 + i) * C + c0 + c]);
        /* dweight: columns j0.. of dout (rows of dw), columns c0.. of inp */
        for (int n = 0; n < N; n++) {
            memcpy(dout2 + (long)n * OC2, p.dout + (long)n * OC + j0, OC2 * 2);
            memcpy(inp2 + (long)n * C2, p.inp + (long)n * C + c0, C2 * 2);
        }
        float *dw = ct_alloc((size_t)OC2 * C2 * 4);
        zk_matmul_bf16_backward(NULL, dw, NULL, dout2, inp2, p.w, N, C2, OC2, OC2);
        for (int o = 0; o < OC2; o++)
            for (int c = 0; c < C2; c++)
                bad_w += f2u(dw[(long)o * C2 + c]) != f2u(ref.dw[(long)(j0 + o) * C + c0 + c]);
        free(out); free(w2); free(inp2); free(dout2); free(dinp); free(dw);
    }
    ct_check(bad_f == 0 && bad_i == 0 && bad_w == 0,
             "amx: shifted rows and cropped columns give each element the same bits (forward, dinp, "
             "dweight)", "%ld, %ld, %ld elements differ", bad_f, bad_i, bad_w);
    unrun(&ref);
    unmake(&p);
}

/* the path is chosen once: AMX where usable, and zk_bf16_info says which
 * (and why not AMX) */
static void test_path_choice(int def) {
    const char *info = zk_bf16_info(), *env = getenv("ZTRAIN_BF16_GEMM");
    int amx = zk_bf16_simd(2) == 2;
    zk_bf16_simd(def);
    char name[400];
    snprintf(name, sizeof name, "path %s, said as \"%s\"", path_name(def), info);
    if (env && *env)
        ct_ok("path choice: ZTRAIN_BF16_GEMM is set (default not checked)");
    else if (amx)
        ct_check(def == 2 && !strncmp(info, "AMX", 3), name, "AMX is usable but not the default");
    else
        ct_check(def < 2 && strstr(info, "AMX not used: ") != NULL, name, "no reason for not AMX");
}

/* dbias sums rows in order in double: rows 0 and 1 hold +-2^60, the rest
 * values in [-1, 1]; in row order the big pair cancels first and the small
 * sum survives, in reverse order it is lost (ulp(2^60) = 256) */
static void test_dbias_order(void) {
    int N = 301, OC = 70, C = 3;
    uint16_t *dout = ct_alloc((size_t)N * OC * 2), *inp = ct_alloc((size_t)N * C * 2);
    uint16_t *w = ct_alloc((size_t)OC * C * 2);
    for (long i = 0; i < (long)N * OC; i++) dout[i] = to_bf16(ct_unif(-1, 1));
    for (int j = 0; j < OC; j++) {
        dout[j] = to_bf16(0x1p60f);
        dout[OC + j] = to_bf16(-0x1p60f);
    }
    float *db = ct_alloc(OC * 4);
    zk_matmul_bf16_backward(NULL, NULL, db, dout, inp, w, N, C, OC, OC);
    long bad = 0, order_matters = 0;
    for (int j = 0; j < OC; j++) {
        double s = 0, rs = 0;
        for (int n = 0; n < N; n++) s += bf(dout[(long)n * OC + j]);
        for (int n = N - 1; n >= 0; n--) rs += bf(dout[(long)n * OC + j]);
        if (f2u((float)s) != f2u(db[j])) bad++;
        if (f2u((float)s) != f2u((float)rs)) order_matters++;
    }
    ct_check(bad == 0 && order_matters > 0, "dbias: column sums in double, rows in order",
             "%ld of %d differ (the order matters in %ld columns)", bad, OC, order_matters);
    free(dout); free(inp); free(w); free(db);
}

/* ---- the runtime ops: validation before anything, then the kernel's bits -- */
/* padded rows and a bf16 out, on the path in use: the forward's out with
 * rows ldo > OC apart has the contiguous out's bits and leaves the pad
 * alone; the bf16 out is the fp32 out rounded once (to_bf16, RNE); the
 * backward reads a padded dout (pad poisoned with NaN) for the same bits. */
static void test_padded_and_b16(int path) {
    static const int shapes[][3] = {{37, 45, 29}, {200, 64, 130}, {5, 3, 1}, {97, 130, 257}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int N = shapes[si][0], C = shapes[si][1], OC = shapes[si][2], ld = (OC + 127) / 128 * 128;
        if (ld == OC) ld += 128;
        prob p = make(N, C, OC);
        outs k = run(&p, 1);
        float *po = ct_alloc((size_t)N * ld * 4);
        uint16_t *ob = ct_alloc((size_t)N * ld * 2), *pd = ct_alloc((size_t)N * ld * 2);
        for (size_t i = 0; i < (size_t)N * ld; i++) { po[i] = 7.0f; ob[i] = 0x7fc1; pd[i] = 0x7fc1; }
        zk_matmul_bf16_forward(po, p.inp, p.w, p.bias, N, C, OC, ld);
        zk_matmul_bf16_forward_b16(ob, p.inp, p.w, p.bias, N, C, OC, ld);
        long bad_f = 0, bad_b = 0, pad = 0;
        for (int n = 0; n < N; n++)
            for (int j = 0; j < ld; j++) {
                size_t i = (size_t)n * ld + j;
                if (j >= OC) { pad += po[i] != 7.0f || ob[i] != 0x7fc1; continue; }
                float want = k.out[(size_t)n * OC + j];
                bad_f += f2u(po[i]) != f2u(want);
                bad_b += ob[i] != to_bf16(want);
            }
        for (int n = 0; n < N; n++) memcpy(pd + (size_t)n * ld, p.dout + (size_t)n * OC, (size_t)OC * 2);
        float *dinp = ct_alloc((size_t)N * C * 4), *dw = ct_alloc((size_t)OC * C * 4);
        float *db = ct_alloc((size_t)OC * 4);
        zk_matmul_bf16_backward(dinp, dw, db, pd, p.inp, p.w, N, C, OC, ld);
        int same_b = !memcmp(dinp, k.dinp, (size_t)N * C * 4) && !memcmp(dw, k.dw, (size_t)OC * C * 4) &&
                     !memcmp(db, k.db, (size_t)OC * 4);
        ct_check(bad_f == 0 && bad_b == 0 && pad == 0 && same_b, "bf16 GEMM padded rows and bf16 out",
                 "%s N=%d C=%d OC=%d ld=%d: %ld fp32 and %ld bf16 outs differ, %ld pad elements "
                 "written, backward %s", path_name(path), N, C, OC, ld, bad_f, bad_b, pad,
                 same_b ? "same" : "differs");
        free(po); free(ob); free(pd); free(dinp); free(dw); free(db);
        unrun(&k);
        unmake(&p);
    }
}

static zt_tensor *tnew(int tier, int dtype, int ndim, int64_t a, int64_t b) {
    zt_tensor *t = NULL;
    int64_t shape[2] = {a, b};
    if (zt_tensor_new(&t, tier, ZT_CAT_OTHER, dtype, ndim, shape) != ZT_OK) {
        printf("tensor_new: %s\n", zt_last_error());
        exit(2);
    }
    return t;
}

static int err_has(int rc, const char *s) {
    return rc == ZT_EINVAL && strstr(zt_last_error(), s) != NULL;
}

static void test_ops(void) {
    const int D = ZT_TIER_DEVICE, H = ZT_TIER_HOST;
    int N = 37, C = 45, OC = 29;
    prob p = make(N, C, OC);
    zt_tensor *inp = tnew(D, ZT_BF16, 2, N, C), *w = tnew(D, ZT_BF16, 2, OC, C);
    zt_tensor *dout = tnew(D, ZT_BF16, 2, N, OC), *b = tnew(D, ZT_F32, 1, OC, 0);
    zt_tensor *out = tnew(D, ZT_F32, 2, N, OC), *dinp = tnew(D, ZT_F32, 2, N, C);
    zt_tensor *dw = tnew(D, ZT_F32, 2, OC, C), *db = tnew(D, ZT_F32, 1, OC, 0);
    zt_tensor_write(inp, p.inp, (size_t)N * C * 2);
    zt_tensor_write(w, p.w, (size_t)OC * C * 2);
    zt_tensor_write(dout, p.dout, (size_t)N * OC * 2);
    zt_tensor_write(b, p.bias, (size_t)OC * 4);

    int rc = zt_matmul_bf16_forward(out, inp, w, b);
    ct_check(rc == ZT_OK, "zt_matmul_bf16_forward runs", "rc %d: %s", rc, zt_last_error());
    rc = zt_matmul_bf16_backward(dinp, dw, db, dout, inp, w);
    ct_check(rc == ZT_OK, "zt_matmul_bf16_backward runs", "rc %d: %s", rc, zt_last_error());
    outs k = run(&p, 1);
    float *got = ct_alloc((size_t)N * OC * 4 + (size_t)N * C * 4 + (size_t)OC * C * 4 + OC * 4);
    float *g_out = got, *g_dinp = g_out + N * OC, *g_dw = g_dinp + N * C, *g_db = g_dw + OC * C;
    zt_tensor_read(out, g_out, (size_t)N * OC * 4);
    zt_tensor_read(dinp, g_dinp, (size_t)N * C * 4);
    zt_tensor_read(dw, g_dw, (size_t)OC * C * 4);
    zt_tensor_read(db, g_db, (size_t)OC * 4);
    ct_check(!memcmp(g_out, k.out, (size_t)N * OC * 4) && !memcmp(g_dinp, k.dinp, (size_t)N * C * 4) &&
             !memcmp(g_dw, k.dw, (size_t)OC * C * 4) && !memcmp(g_db, k.db, (size_t)OC * 4),
             "the ops give the kernels' bits (forward with bias, fused backward)", "differ");
    /* (B,T,C) activations are accepted as (N,C) */
    zt_tensor *inp3 = NULL;
    int64_t s3[3] = {1, N, C};
    zt_tensor_view(&inp3, inp, 0, 3, s3);
    ct_check(zt_matmul_bf16_forward(out, inp3, w, NULL) == ZT_OK, "a (B,T,C) inp is accepted",
             "%s", zt_last_error());

    /* bad calls: each refused with a message naming the operand, nothing written */
    zt_tensor *f32in = tnew(D, ZT_F32, 2, N, C), *w1 = tnew(D, ZT_BF16, 1, OC * C, 0);
    zt_tensor *wbad = tnew(D, ZT_BF16, 2, OC, C + 1), *outbf = tnew(D, ZT_BF16, 2, N, OC);
    zt_tensor *outsmall = tnew(D, ZT_F32, 2, N, OC - 1), *bbf = tnew(D, ZT_BF16, 1, OC - 1, 0);
    zt_tensor *hout = tnew(H, ZT_F32, 2, N, OC), *f32dout = tnew(D, ZT_F32, 2, N, OC);
    zt_fill(out, 7.0f);
    rc = zt_matmul_bf16_forward(out, f32in, w, b);
    ct_check(err_has(rc, "inp must be bf16"), "forward refuses an f32 inp", "%s", zt_last_error());
    rc = zt_matmul_bf16_forward(out, inp, w1, b);
    ct_check(err_has(rc, "2-D (OC,C)"), "forward refuses a 1-D weight", "%s", zt_last_error());
    rc = zt_matmul_bf16_forward(out, inp, wbad, b);
    ct_check(err_has(rc, "does not match weight"), "forward refuses C mismatch", "%s",
             zt_last_error());
    rc = zt_matmul_bf16_forward(outbf, inp, w, b);
    uint16_t *g_bf = ct_alloc((size_t)N * OC * 2);
    zt_tensor_read(outbf, g_bf, (size_t)N * OC * 2);
    long off = 0;
    for (int i = 0; i < N * OC; i++) off += g_bf[i] != to_bf16(k.out[i]);
    ct_check(rc == ZT_OK && off == 0, "a bf16 out is the f32 out rounded once", "rc %d, %ld "
             "differ: %s", rc, off, zt_last_error());
    free(g_bf);
    rc = zt_matmul_bf16_forward(outsmall, inp, w, b);
    ct_check(err_has(rc, "out must be (N,OC)"), "forward refuses a wrong-size out", "%s",
             zt_last_error());
    rc = zt_matmul_bf16_forward(out, inp, w, bbf);
    ct_check(err_has(rc, "elements (OC) f32 or bf16"), "forward refuses a bias of OC - 1, "
             "naming its shape (a bf16 bias of OC is taken: test_stream16)", "%s", zt_last_error());
    rc = zt_matmul_bf16_forward(hout, inp, w, b);
    ct_check(err_has(rc, "different tiers"), "forward refuses operands on two tiers", "%s",
             zt_last_error());
    rc = zt_matmul_bf16_forward(out, NULL, w, b);
    ct_check(err_has(rc, "inp is NULL"), "forward refuses a NULL inp", "%s", zt_last_error());
    zt_tensor_read(out, g_out, (size_t)N * OC * 4);
    long changed = 0;
    for (int i = 0; i < N * OC; i++) changed += g_out[i] != 7.0f;
    ct_check(changed == 0, "refused forwards wrote nothing", "%ld elements changed", changed);
    rc = zt_matmul_bf16_backward(dinp, dw, db, f32dout, inp, w);
    ct_check(err_has(rc, "dout must be bf16"), "backward refuses an f32 dout", "%s",
             zt_last_error());
    rc = zt_matmul_bf16_backward(dinp, NULL, db, dout, inp, w);
    ct_check(err_has(rc, "dbias without dweight"), "backward refuses dbias without dweight", "%s",
             zt_last_error());
    rc = zt_matmul_bf16_backward(NULL, NULL, NULL, dout, inp, w);
    ct_check(err_has(rc, "nothing to compute"), "backward refuses nothing to compute", "%s",
             zt_last_error());
    /* a bf16 dweight is a bf16 run's stored gradient (test_grads16.c); of
     * another shape than (OC,C) it is refused, naming it */
    rc = zt_matmul_bf16_backward(dinp, outbf, NULL, dout, inp, w);
    ct_check(err_has(rc, "dweight must hold"), "backward refuses a bf16 dweight of the out's shape",
             "%s", zt_last_error());
    printf("   (bf16 path: %s; zt_matmul_bf16_info: %s)\n", zk_bf16_info(), zt_matmul_bf16_info());

    zt_tensor *all[] = {inp, w, dout, b, out, dinp, dw, db, inp3, f32in, w1, wbad, outbf,
                        outsmall, bbf, hout, f32dout};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) zt_tensor_release(all[i]);
    free(got);
    unrun(&k);
    unmake(&p);
}

int main(void) {
    ct_seed(7);
    omp_set_num_threads(2);
    int def = zk_bf16_simd(-1);
    printf("bf16 GEMM path: %s\n", zk_bf16_info());
    test_path_choice(def);
    for (int path = 2; path >= 0; path--) {         /* each path this CPU has */
        if (zk_bf16_simd(path) != path) {
            printf("   (no %s path here)\n", path_name(path));
            continue;
        }
        test_shapes();
        test_padded_and_b16(path);
    }
    zk_bf16_simd(1);
    test_paths_agree();
    test_specials();
    for (int path = 2; path >= 1; path--)
        if (zk_bf16_simd(path) == path) test_threads();
    omp_set_num_threads(2);
    test_amx_invariance();
    zk_bf16_simd(def);
    test_dbias_order();
    test_ops();
    return ct_summary();
}
