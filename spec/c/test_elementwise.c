/*
 * test_elementwise.c -- fill/copy/scale/axpy/add/add3, the four casts, add
 * of a bf16 or f16 x,
 * the fp64 block sums and AdamW, each against a plain loop written here,
 * plus bit-identity under 1, 2 and 3 OpenMP threads. AdamW is also checked
 * against a reference that rounds every operation on its own (random inputs,
 * every tail length, unaligned starts) and on a second thread beside another
 * OpenMP team.
 */
#include <pthread.h>
#include "ctest.h"
#include "kernels.h"

static const size_t SIZES[] = {1, 7, 4096, 4096 * 3 + 13, 100003};
#define NSIZES (sizeof(SIZES) / sizeof(SIZES[0]))

/* ---- small elementwise ops ----------------------------------------------- */

enum { OP_FILL, OP_COPY, OP_SCALE, OP_AXPY, OP_ADD, OP_ADD3, NOPS };
static const char *OP_NAME[NOPS] = {"fill", "copy", "scale", "axpy", "add", "add3"};

static void run_op(int op, float *y, const float *x, const float *z, size_t n) {
    switch (op) {
    case OP_FILL: zk_fill(y, 0.375f, n); break;
    case OP_COPY: zk_copy(y, x, n); break;
    case OP_SCALE: zk_scale(y, -1.7f, n); break;
    case OP_AXPY: zk_axpy(y, 0.3f, x, n); break;
    case OP_ADD: zk_add(y, x, n); break;
    case OP_ADD3: zk_add3(y, x, z, n); break;
    }
}

static void ref_op(int op, float *y, const float *x, const float *z, size_t n) {
    for (size_t i = 0; i < n; i++) {
        switch (op) {
        case OP_FILL: y[i] = 0.375f; break;
        case OP_COPY: y[i] = x[i]; break;
        case OP_SCALE: y[i] = y[i] * -1.7f; break;
        case OP_AXPY: y[i] = y[i] + 0.3f * x[i]; break;
        case OP_ADD: y[i] = y[i] + x[i]; break;
        case OP_ADD3: y[i] = x[i] + z[i]; break;
        }
    }
}

static void test_small_ops(void) {
    char name[96];
    for (int op = 0; op < NOPS; op++) {
        for (size_t s = 0; s < NSIZES; s++) {
            size_t n = SIZES[s];
            float *x = ct_rand(n, -2, 2), *z = ct_rand(n, -2, 2), *y0 = ct_rand(n, -2, 2);
            float *ref = ct_alloc(n * 4), *got[3];
            memcpy(ref, y0, n * 4);
            ref_op(op, ref, x, z, n);
            for (int t = 0; t < 3; t++) {
                omp_set_num_threads(t + 1);
                got[t] = ct_alloc(n * 4);
                memcpy(got[t], y0, n * 4);
                run_op(op, got[t], x, z, n);
            }
            snprintf(name, sizeof name, "%s n=%zu matches plain loop", OP_NAME[op], n);
            ct_same_bits(name, got[0], ref, n * 4);
            snprintf(name, sizeof name, "%s n=%zu same bits on 1/2/3 threads", OP_NAME[op], n);
            ct_check(!memcmp(got[0], got[1], n * 4) && !memcmp(got[0], got[2], n * 4), name,
                     "outputs differ across thread counts");
            /* in-place forms the runtime relies on: out aliases an input */
            if (op == OP_ADD3 || op == OP_ADD) {
                float *a = ct_alloc(n * 4), *r = ct_alloc(n * 4);
                memcpy(a, x, n * 4);
                for (size_t i = 0; i < n; i++) r[i] = x[i] + x[i];
                if (op == OP_ADD3) zk_add3(a, a, a, n); else zk_add(a, a, n);
                snprintf(name, sizeof name, "%s n=%zu fully aliased", OP_NAME[op], n);
                ct_same_bits(name, a, r, n * 4);
                free(a); free(r);
            }
            free(x); free(z); free(y0); free(ref);
            for (int t = 0; t < 3; t++) free(got[t]);
        }
    }
    omp_set_num_threads(2);
}

/* ---- casts ----------------------------------------------------------------- */

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Decode a binary format with E exponent and M mantissa bits, plainly. */
static double ref_decode(uint32_t h, int E, int M) {
    int bias = (1 << (E - 1)) - 1;
    uint32_t sign = (h >> (E + M)) & 1, ex = (h >> M) & ((1u << E) - 1), man = h & ((1u << M) - 1);
    double v;
    if (ex == (1u << E) - 1) v = man ? NAN : INFINITY;
    else if (ex == 0) v = ldexp((double)man, 1 - bias - M);
    else v = ldexp((double)(man + (1u << M)), (int)ex - bias - M);
    return sign ? -v : v;
}

/* Encode a float to E/M bits with round-to-nearest-even, via double math. */
static uint32_t ref_encode(float f, int E, int M) {
    int bias = (1 << (E - 1)) - 1, emin = 1 - bias;
    uint32_t sign = fbits(f) >> 31 << (E + M), inf = ((1u << E) - 1) << M;
    double a = fabs((double)f);
    if (isnan(f)) return sign | inf | (1u << (M - 1));
    /* halfway between the largest finite value and 2^(bias+1) goes to inf */
    if (a >= ldexp(2.0 - ldexp(1.0, -(M + 1)), bias)) return sign | inf;
    if (a == 0) return sign;
    int ex;
    frexp(a, &ex);
    int e = ex - 1 < emin ? emin : ex - 1;
    double m = rint(ldexp(a, M - e));          /* default rounding: to even */
    if (m >= ldexp(1.0, M + 1)) { m /= 2; e++; }
    if (m < ldexp(1.0, M)) return sign | (uint32_t)m;          /* subnormal */
    return sign | ((uint32_t)(e + bias) << M) | ((uint32_t)m - (1u << M));
}

static int is_nan16(uint16_t h, int E, int M) {
    return ((h >> M) & ((1u << E) - 1)) == (1u << E) - 1 && (h & ((1u << M) - 1)) != 0;
}

static void test_cast_decode(void) {
    static uint16_t all[65536];
    static float got[65536];
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    const char *names[2] = {"bf16->f32 all 65536 patterns", "f16->f32 all 65536 patterns"};
    for (int k = 0; k < 2; k++) {
        int E = k ? 5 : 8, M = k ? 10 : 7;
        if (k) zk_cast_f16_f32(got, all, 65536); else zk_cast_bf16_f32(got, all, 65536);
        int bad = -1;
        for (int i = 0; i < 65536 && bad < 0; i++) {
            double r = ref_decode(all[i], E, M);
            if (isnan(r) ? !isnan(got[i]) || (fbits(got[i]) >> 31) != (uint32_t)(i >> 15)
                         : fbits(got[i]) != fbits((float)r))
                bad = i;
        }
        ct_check(bad < 0, names[k], "pattern 0x%04x decoded to %.9g (bits 0x%08x)",
                 bad, bad < 0 ? 0.0 : got[bad], bad < 0 ? 0u : fbits(got[bad]));
    }
}

/* y += x for every 2-byte pattern x (NaN, inf, subnormal halves among
 * them) onto random y: the bits of the decode (checked above against the
 * reference) then the f32 add, on 1, 2 and 3 threads (mixed precision's
 * gradient accumulation, no f32 copy of x) */
static void test_add_lp(void) {
    enum { N = 65536 * 2 };
    static uint16_t x[N];
    static float y0[N], want[N], got[N], wide[N];
    for (int i = 0; i < N; i++) x[i] = (uint16_t)(i * 40503u);   /* every pattern, twice */
    float *r = ct_rand(N, -4, 4);
    memcpy(y0, r, sizeof y0);
    free(r);
    for (int k = 0; k < 2; k++) {
        if (k) zk_cast_f16_f32(wide, x, N); else zk_cast_bf16_f32(wide, x, N);
        memcpy(want, y0, sizeof want);
        zk_add(want, wide, N);
        for (int t = 1; t <= 3; t++) {
            omp_set_num_threads(t);
            memcpy(got, y0, sizeof got);
            if (k) zk_add_f16(got, x, N); else zk_add_bf16(got, x, N);
            char name[96];
            snprintf(name, sizeof name, "add %s: the widened x's f32 add, every pattern, %d threads",
                     k ? "f16" : "bf16", t);
            ct_same_bits(name, got, want, sizeof got);
        }
    }
    omp_set_num_threads(2);
}

/* Encode every x in xs with the kernel and the reference; NaNs must stay NaN
 * with their sign, everything else must match bit for bit. */
static void check_encode(const char *name, const float *xs, size_t n, int E, int M) {
    uint16_t *got = ct_alloc(n * 2);
    if (E == 5) zk_cast_f32_f16(got, xs, n); else zk_cast_f32_bf16(got, xs, n);
    for (size_t i = 0; i < n; i++) {
        uint32_t want = ref_encode(xs[i], E, M);
        int ok = isnan(xs[i]) ? is_nan16(got[i], E, M) && (got[i] >> 15) == (fbits(xs[i]) >> 31)
                              : got[i] == want;
        if (!ok) {
            ct_fail(name, "x=%.9g (0x%08x) -> 0x%04x, want 0x%04x", xs[i], fbits(xs[i]),
                    got[i], want);
            free(got);
            return;
        }
    }
    ct_ok(name);
    free(got);
}

static void test_cast_encode(void) {
    for (int k = 0; k < 2; k++) {
        int E = k ? 5 : 8, M = k ? 10 : 7;
        const char *fmt = k ? "f16" : "bf16";
        char name[96];
        float special[] = {0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, NAN, -NAN,
                           bitsf(0x7f800001u), bitsf(0xffc00001u), bitsf(0x7fbfffffu),
                           1e-45f, -1e-45f, 1.17549435e-38f, 1.1754942e-38f, 3.4028235e38f,
                           -3.4028235e38f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 65536.0f,
                           1e5f, 6.1035156e-05f, 6.0975552e-05f, 5.9604645e-08f, 2.9802322e-08f,
                           2.9802326e-08f, 8.9406967e-08f, 1.0009765625f, 1.00048828125f,
                           1.00146484375f, 1.00390625f, 1.005859375f, 1.0078125f, 3.3895314e38f,
                           3.3961776e38f, 0.33333334f, -2.7182817f};
        snprintf(name, sizeof name, "f32->%s special values (0, -0, subnormal, max, inf, NaN, ties)", fmt);
        check_encode(name, special, sizeof special / sizeof special[0], E, M);
        /* every representable value, the midpoint to its successor (a tie)
         * and the floats just either side of that midpoint */
        float *xs = ct_alloc(65536 * 5 * sizeof(float));
        size_t n = 0;
        for (uint32_t h = 0; h < 65536; h++) {
            double v = ref_decode(h, E, M), w = ref_decode(h + 1 <= 0xffff ? h + 1 : h, E, M);
            if (isnan(v) || isinf(v)) continue;
            xs[n++] = (float)v;
            if ((h & 0x7fffu) == (uint32_t)(((1u << E) - 1) << M) - 1) /* largest finite */
                w = (h >> 15 ? -1 : 1) * ldexp(1.0, (1 << (E - 1)));
            if (isnan(w) || (h & 0x7fffu) == 0x7fffu) continue;
            float mid = (float)((v + w) / 2);                           /* exact */
            xs[n++] = mid;
            xs[n++] = nextafterf(mid, INFINITY);
            xs[n++] = nextafterf(mid, -INFINITY);
        }
        snprintf(name, sizeof name, "f32->%s every value, tie and tie+-1ulp (%zu inputs)", fmt, n);
        check_encode(name, xs, n, E, M);
        free(xs);
        /* random bit patterns over the whole float range */
        size_t nr = 1 << 20;
        float *r = ct_alloc(nr * sizeof(float));
        for (size_t i = 0; i < nr; i++) r[i] = bitsf((uint32_t)ct_u64());
        snprintf(name, sizeof name, "f32->%s %zu random bit patterns", fmt, nr);
        check_encode(name, r, nr, E, M);
        /* round trip and thread bits on the random inputs */
        uint16_t *h[3];
        for (int t = 0; t < 3; t++) {
            omp_set_num_threads(t + 1);
            h[t] = ct_alloc(nr * 2);
            if (k) zk_cast_f32_f16(h[t], r, nr); else zk_cast_f32_bf16(h[t], r, nr);
        }
        snprintf(name, sizeof name, "f32->%s same bits on 1/2/3 threads", fmt);
        ct_check(!memcmp(h[0], h[1], nr * 2) && !memcmp(h[0], h[2], nr * 2), name, "differ");
        float *back = ct_alloc(nr * 4);
        uint16_t *again = ct_alloc(nr * 2);
        if (k) zk_cast_f16_f32(back, h[0], nr); else zk_cast_bf16_f32(back, h[0], nr);
        if (k) zk_cast_f32_f16(again, back, nr); else zk_cast_f32_bf16(again, back, nr);
        size_t bad = nr;
        for (size_t i = 0; i < nr && bad == nr; i++)
            if (!is_nan16(h[0][i], E, M) && again[i] != h[0][i]) bad = i;
        snprintf(name, sizeof name, "%s -> f32 -> %s round trip is the identity", fmt, fmt);
        ct_check(bad == nr, name, "0x%04x came back 0x%04x", bad < nr ? h[0][bad] : 0,
                 bad < nr ? again[bad] : 0);
        for (int t = 0; t < 3; t++) free(h[t]);
        free(back); free(again); free(r);
        omp_set_num_threads(2);
    }
}

/* ---- fp64 block sums -------------------------------------------------------- */

static void test_sums(void) {
    const size_t ns[] = {0, 5, ZK_SUM_BLOCK, 3 * ZK_SUM_BLOCK + 123, 4 * ZK_SUM_BLOCK,
                         9 * ZK_SUM_BLOCK + 7, 1100 * (size_t)ZK_SUM_BLOCK + 17};
    char name[96];
    for (size_t s = 0; s < sizeof ns / sizeof ns[0]; s++) {
        size_t n = ns[s], nb = (n + ZK_SUM_BLOCK - 1) / ZK_SUM_BLOCK;
        float *x = ct_rand(n, -3, 3);
        double *ref = ct_alloc((nb + 1) * sizeof(double)), total = 0;
        for (size_t b = 0; b < nb; b++) {   /* the lane scheme of kernels.h, written plainly */
            double lq[ZK_SUM_LANES] = { 0 }, l1[ZK_SUM_LANES] = { 0 }, acc = 0, acc1 = 0;
            for (size_t i = b * ZK_SUM_BLOCK; i < n && i < (b + 1) * ZK_SUM_BLOCK; i++) {
                size_t k = (i - b * ZK_SUM_BLOCK) % ZK_SUM_LANES;
                lq[k] += (double)x[i] * (double)x[i];
                l1[k] += (double)x[i];
            }
            for (int k = 0; k < ZK_SUM_LANES; k++) { acc += lq[k]; acc1 += l1[k]; }
            ref[b] = acc;
            total += acc1;
        }
        for (int path = 0; path < 2; path++) {   /* the vector path, then the plain loop */
            const char *pn = path ? "scalar" : "vector";
            zk_force_scalar(path);
            double *got[3], sums[3];
            for (int t = 0; t < 3; t++) {
                omp_set_num_threads(t + 1);
                got[t] = ct_alloc((nb + 1) * sizeof(double));
                zk_sumsq_blocks(got[t], x, n);
                sums[t] = zk_sum_f64(x, n);
            }
            snprintf(name, sizeof name, "sumsq_blocks (%s) n=%zu equals plain double loop", pn, n);
            ct_same_bits(name, got[0], ref, nb * sizeof(double));
            snprintf(name, sizeof name, "sum_f64 (%s) n=%zu equals plain blocked double loop", pn, n);
            ct_check(sums[0] == total, name, "got %.17g want %.17g", sums[0], total);
            snprintf(name, sizeof name, "sumsq_blocks/sum_f64 (%s) n=%zu same bits on 1/2/3 threads",
                     pn, n);
            ct_check(!memcmp(got[0], got[1], nb * 8) && !memcmp(got[0], got[2], nb * 8) &&
                     sums[0] == sums[1] && sums[0] == sums[2], name, "differ");
            for (int t = 0; t < 3; t++) free(got[t]);
        }
        zk_force_scalar(0);
        free(x); free(ref);
    }
    omp_set_num_threads(2);
}

/* ---- AdamW ------------------------------------------------------------------ */

/* The header's formula, written plainly (scalars in double, rounded once). */
static void ref_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr,
                      float b1, float b2, float eps, float wd, float gs, int t) {
    float decay = (float)(1.0 - (double)lr * wd);
    float step = (float)(lr / (1.0 - pow(b1, t)));
    float bc2 = (float)sqrt(1.0 - pow(b2, t));
    float omb1 = (float)(1.0 - b1), omb2 = (float)(1.0 - b2);
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gs;
        p[i] = p[i] * decay;
        m[i] = b1 * m[i] + omb1 * gi;
        v[i] = b2 * v[i] + omb2 * (gi * gi);
        p[i] = p[i] - step * (m[i] / (sqrtf(v[i]) / bc2 + eps));
    }
}

/* zk_adamw_lp: zk_adamw's param, m and v, and lp the cast of the updated
 * param (bf16 and half), every element written, on 1-3 threads */
static void test_adamw_lp(void) {
    char name[128];
    const size_t ns[] = {7, 4096 * 9 + 5};
    for (size_t s = 0; s < 2; s++) {
        size_t n = ns[s];
        float *p0 = ct_rand(n, -1, 1), *g = ct_rand(n, -0.1f, 0.1f);
        for (int f16 = 0; f16 <= 1; f16++)
            for (int t = 1; t <= 3; t++) {
                omp_set_num_threads(t);
                float *pa = ct_alloc(n * 4), *ma = ct_alloc(n * 4), *va = ct_alloc(n * 4);
                float *pb = ct_alloc(n * 4), *mb = ct_alloc(n * 4), *vb = ct_alloc(n * 4);
                uint16_t *la = ct_alloc(n * 2), *lb = ct_alloc(n * 2);
                memcpy(pa, p0, n * 4); memcpy(pb, p0, n * 4);
                for (size_t i = 0; i < n; i++) lb[i] = 0x7fc1;
                for (int step = 1; step <= 3; step++) {
                    zk_adamw(pa, g, ma, va, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, step);
                    if (f16) zk_cast_f32_f16(la, pa, n); else zk_cast_f32_bf16(la, pa, n);
                    zk_adamw_lp(pb, g, mb, vb, lb, f16, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, step);
                }
                snprintf(name, sizeof name, "adamw_lp n=%zu %s %d thread(s): adamw's bits, lp its cast",
                         n, f16 ? "f16" : "bf16", t);
                ct_check(!memcmp(pa, pb, n * 4) && !memcmp(ma, mb, n * 4) && !memcmp(va, vb, n * 4) &&
                         !memcmp(la, lb, n * 2), name, "param %s, lp %s",
                         memcmp(pa, pb, n * 4) ? "differs" : "same", memcmp(la, lb, n * 2) ? "differs" : "same");
                free(pa); free(ma); free(va); free(pb); free(mb); free(vb); free(la); free(lb);
            }
        free(p0); free(g);
    }
    omp_set_num_threads(2);
}

/* the 2-byte gradient's AdamW (with and without lp) and sums of squares:
 * the f32 kernels' bits on the widened gradient, bf16 and f16, blocks and
 * tails, 1-3 threads */
static void test_grad16(void) {
    char name[128];
    const size_t ns[] = {7, 1024, 4096 * 9 + 5, 100003};
    for (size_t s = 0; s < 4; s++) {
        size_t n = ns[s];
        float *p0 = ct_rand(n, -1, 1), *gf = ct_rand(n, -0.1f, 0.1f), *gw = ct_alloc(n * 4);
        uint16_t *g16 = ct_alloc(n * 2);
        for (int f16 = 0; f16 <= 1; f16++) {
            if (f16) { zk_cast_f32_f16(g16, gf, n); zk_cast_f16_f32(gw, g16, n); }
            else { zk_cast_f32_bf16(g16, gf, n); zk_cast_bf16_f32(gw, g16, n); }
            size_t nb = (n + ZK_SUM_BLOCK - 1) / ZK_SUM_BLOCK;
            double *want = ct_alloc(nb * 8), *got = ct_alloc(nb * 8);
            zk_sumsq_blocks(want, gw, n);
            for (int t = 1; t <= 3; t++) {
                omp_set_num_threads(t);
                memset(got, 0xff, nb * 8);
                zk_sumsq_blocks_16(got, g16, f16, n);
                snprintf(name, sizeof name, "sumsq_blocks_16 n=%zu %s %d thread(s): the widened "
                         "copy's partials", n, f16 ? "f16" : "bf16", t);
                ct_same_bits(name, got, want, nb * 8);
                for (int lp = 0; lp <= 1; lp++) {
                    float *pa = ct_alloc(n * 4), *ma = ct_alloc(n * 4), *va = ct_alloc(n * 4);
                    float *pb = ct_alloc(n * 4), *mb = ct_alloc(n * 4), *vb = ct_alloc(n * 4);
                    uint16_t *la = ct_alloc(n * 2), *lb = ct_alloc(n * 2);
                    memcpy(pa, p0, n * 4); memcpy(pb, p0, n * 4);
                    for (int step = 1; step <= 2; step++) {
                        zk_adamw_lp(pa, gw, ma, va, la, 0, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
                                    0.7f, step);
                        zk_adamw_g16(pb, g16, f16, mb, vb, lp ? lb : NULL, 0, n, 6e-4f, 0.9f,
                                     0.95f, 1e-8f, 0.1f, 0.7f, step);
                    }
                    snprintf(name, sizeof name, "adamw_g16 n=%zu %s %s %d thread(s): the widened "
                             "gradient's bits", n, f16 ? "f16" : "bf16", lp ? "lp" : "no lp", t);
                    ct_check(!memcmp(pa, pb, n * 4) && !memcmp(ma, mb, n * 4) &&
                             !memcmp(va, vb, n * 4) && (!lp || !memcmp(la, lb, n * 2)), name,
                             "param/m/v/lp differ");
                    free(pa); free(ma); free(va); free(pb); free(mb); free(vb); free(la); free(lb);
                }
            }
            free(want); free(got);
        }
        free(p0); free(gf); free(gw); free(g16);
    }
    omp_set_num_threads(2);
}

static void test_adamw(void) {
    char name[96];
    const size_t ns[] = {7, 100003};
    for (size_t s = 0; s < 2; s++) {
        size_t n = ns[s];
        float *p0 = ct_rand(n, -1, 1), *g = ct_rand(n, -0.1f, 0.1f);
        float *pr = ct_alloc(n * 4), *mr = ct_alloc(n * 4), *vr = ct_alloc(n * 4);
        float *pk[3], *mk[3], *vk[3];
        memcpy(pr, p0, n * 4);
        for (int t = 0; t < 3; t++) {
            pk[t] = ct_alloc(n * 4); mk[t] = ct_alloc(n * 4); vk[t] = ct_alloc(n * 4);
            memcpy(pk[t], p0, n * 4);
        }
        for (int step = 1; step <= 5; step++) {
            ref_adamw(pr, g, mr, vr, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, step);
            for (int t = 0; t < 3; t++) {
                omp_set_num_threads(t + 1);
                zk_adamw(pk[t], g, mk[t], vk[t], n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, step);
            }
        }
        int maxulp = 0;
        for (size_t i = 0; i < n; i++) {
            int d = abs((int)(fbits(pk[0][i]) - fbits(pr[i])));
            if (d > maxulp) maxulp = d;
        }
        snprintf(name, sizeof name, "adamw n=%zu 5 steps bit-exact vs plain formula", n);
        ct_check(maxulp == 0 && !memcmp(mk[0], mr, n * 4) && !memcmp(vk[0], vr, n * 4), name,
                 "param differs by up to %d ulp (or m/v differ)", maxulp);
        snprintf(name, sizeof name, "adamw n=%zu same bits on 1/2/3 threads", n);
        ct_check(!memcmp(pk[0], pk[1], n * 4) && !memcmp(pk[0], pk[2], n * 4) &&
                 !memcmp(vk[0], vk[2], n * 4), name, "differ");
        for (int t = 0; t < 3; t++) { free(pk[t]); free(mk[t]); free(vk[t]); }
        free(p0); free(g); free(pr); free(mr); free(vr);
    }
    /* one step by hand: t=1 with zero state is a sign step of size lr */
    float p = 1.0f, g = 0.5f, m = 0, v = 0;
    zk_adamw(&p, &g, &m, &v, 1, 0.1f, 0.9f, 0.999f, 0.0f, 0.0f, 1.0f, 1);
    ct_check(fabsf(p - 0.9f) < 1e-6f, "adamw first step moves by lr against the gradient",
             "param %.9g, want 0.9", p);
    omp_set_num_threads(2);
}

/* A second reference that does not trust the compiler: every operation's
 * result goes through a volatile float, so it is rounded to float on its
 * own and can never be fused into a multiply-add, whatever -std or
 * -ffp-contract this file is built with. The scalars are computed as the
 * header says (in double, rounded once). */
static float rnd1(float x) { volatile float y = x; return y; }

typedef struct { float lr, b1, b2, eps, wd, gs; int t; } adam_hp;

static void ref_adamw_rounded(float *p, const float *g, float *m, float *v, size_t n,
                              const adam_hp *h) {
    float decay = (float)(1.0 - (double)h->lr * (double)h->wd);
    float step = (float)((double)h->lr / (1.0 - pow((double)h->b1, h->t)));
    float bc2 = (float)sqrt(1.0 - pow((double)h->b2, h->t));
    float omb1 = (float)(1.0 - (double)h->b1), omb2 = (float)(1.0 - (double)h->b2);
    for (size_t i = 0; i < n; i++) {
        float gi = rnd1(g[i] * h->gs);
        float pd = rnd1(p[i] * decay);
        float mi = rnd1(rnd1(h->b1 * m[i]) + rnd1(omb1 * gi));
        float vi = rnd1(rnd1(h->b2 * v[i]) + rnd1(omb2 * rnd1(gi * gi)));
        float denom = rnd1(rnd1(rnd1(sqrtf(vi)) / bc2) + h->eps);
        m[i] = mi;
        v[i] = vi;
        p[i] = rnd1(pd - rnd1(step * rnd1(mi / denom)));
    }
}

/* a float of random sign and magnitude 10^[lo, hi), or an exact zero now and then */
static float rand_mag(float lo, float hi) {
    if (ct_u64() % 61 == 0) return 0.0f;
    float x = powf(10.0f, ct_unif(lo, hi));
    return ct_u64() & 1 ? -x : x;
}

/* the first element where two float arrays differ, or -1 */
static long first_diff(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (fbits(a[i]) != fbits(b[i])) return (long)i;
    return -1;
}

/* The kernel (vector body, scalar tails, OpenMP blocks) against the rounded
 * reference, bit for bit, on random inputs and hyperparameters: every size
 * 0..40 (tails of every length), sizes around the 4096 block and the 8-block
 * parallel threshold, odd offsets (unaligned vectors), 1, 2 and 3 threads. */
static void test_adamw_random(void) {
    static const size_t big[] = {63, 64, 65, 4095, 4096, 4097, 8 * 4096 - 1, 8 * 4096,
                                 8 * 4096 + 9, 13 * 4096 + 3, 100003};
    const size_t nbig = sizeof big / sizeof big[0], nmax = 100003 + 8;
    float *g = ct_alloc(nmax * 4), *p0 = ct_alloc(nmax * 4), *m0 = ct_alloc(nmax * 4);
    float *v0 = ct_alloc(nmax * 4), *pr = ct_alloc(nmax * 4), *mr = ct_alloc(nmax * 4);
    float *vr = ct_alloc(nmax * 4), *pk = ct_alloc(nmax * 4), *mk = ct_alloc(nmax * 4);
    float *vk = ct_alloc(nmax * 4);
    int cases = 0, bad = 0;
    char detail[256] = "";
    for (size_t s = 0; s < 41 + nbig; s++) {
        size_t n = s < 41 ? s : big[s - 41];
        size_t off = ct_u64() % 8;                  /* element offset: unaligned starts */
        adam_hp h = {powf(10.0f, ct_unif(-5, -1)), ct_unif(0.8f, 0.99f), ct_unif(0.9f, 0.9999f),
                     powf(10.0f, ct_unif(-10, -6)), ct_unif(0, 0.2f), ct_unif(0.05f, 1.0f),
                     1 + (int)(ct_u64() % 2000)};
        float gmag = ct_unif(-6, 0);                /* gradients of one scale per case */
        for (size_t i = 0; i < n; i++) {
            g[off + i] = rand_mag(gmag - 2, gmag + 1);
            p0[off + i] = rand_mag(-4, 1);
            m0[off + i] = rand_mag(gmag - 2, gmag);
            v0[off + i] = fabsf(rand_mag(2 * gmag - 3, 2 * gmag));
        }
        memcpy(pr, p0, nmax * 4); memcpy(mr, m0, nmax * 4); memcpy(vr, v0, nmax * 4);
        ref_adamw_rounded(pr + off, g + off, mr + off, vr + off, n, &h);
        for (int t = 1; t <= 3; t++) {
            memcpy(pk, p0, nmax * 4); memcpy(mk, m0, nmax * 4); memcpy(vk, v0, nmax * 4);
            omp_set_num_threads(t);
            zk_adamw(pk + off, g + off, mk + off, vk + off, n, h.lr, h.b1, h.b2, h.eps, h.wd,
                     h.gs, h.t);
            cases++;
            /* whole buffers: also nothing written outside [off, off + n) */
            long dp = first_diff(pk, pr, nmax), dm = first_diff(mk, mr, nmax);
            long dv = first_diff(vk, vr, nmax);
            if ((dp >= 0 || dm >= 0 || dv >= 0) && !bad++) {
                long at = dp >= 0 ? dp : dm >= 0 ? dm : dv;
                const float *got = dp >= 0 ? pk : dm >= 0 ? mk : vk;
                const float *want = dp >= 0 ? pr : dm >= 0 ? mr : vr;
                snprintf(detail, sizeof detail,
                         "n=%zu off=%zu threads=%d t=%d: %s[%ld] = %.9g (0x%08x), want %.9g (0x%08x)",
                         n, off, t, h.t, dp >= 0 ? "param" : dm >= 0 ? "m" : "v", at - (long)off,
                         got[at], fbits(got[at]), want[at], fbits(want[at]));
            }
        }
    }
    omp_set_num_threads(2);
    ct_check(!bad, "adamw random inputs, sizes 0..40 and block edges, offsets, 1/2/3 threads: "
             "bit-exact vs per-op-rounded formula", "%d of %d cases differ; first: %s", bad,
             cases, detail);
    free(g); free(p0); free(m0); free(v0); free(pr); free(mr); free(vr);
    free(pk); free(mk); free(vk);
}

/* The offload strategy may run AdamW on host tensors from a copy-stream
 * worker while the compute thread runs its own OpenMP kernels: two teams at
 * once must not disturb each other's results. */
typedef struct { float *p, *g, *m, *v; size_t n; int threads; } adam_job;

static void *adam_thread(void *arg) {
    adam_job *j = arg;
    omp_set_num_threads(j->threads);            /* this thread's own team size */
    for (int step = 1; step <= 4; step++)
        zk_adamw(j->p, j->g, j->m, j->v, j->n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step);
    return NULL;
}

static void test_adamw_second_thread(void) {
    const size_t n = 1 << 20;
    adam_job job[2];
    float *want[2][3];
    for (int k = 0; k < 2; k++) {
        job[k] = (adam_job){ct_rand(n, -1, 1), ct_rand(n, -1e-2f, 1e-2f), ct_alloc(n * 4),
                            ct_alloc(n * 4), n, 2};
        for (int a = 0; a < 3; a++) want[k][a] = ct_alloc(n * 4);
        memcpy(want[k][0], job[k].p, n * 4);
        adam_hp h = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 0};
        for (h.t = 1; h.t <= 4; h.t++)
            ref_adamw_rounded(want[k][0], job[k].g, want[k][1], want[k][2], n, &h);
    }
    pthread_t th;
    int rc = pthread_create(&th, NULL, adam_thread, &job[1]);
    omp_set_num_threads(2);
    adam_thread(&job[0]);                       /* the "compute" team, concurrently */
    if (rc == 0) pthread_join(th, NULL);
    int ok = rc == 0;
    for (int k = 0; k < 2; k++)
        ok = ok && !memcmp(job[k].p, want[k][0], n * 4) && !memcmp(job[k].m, want[k][1], n * 4) &&
             !memcmp(job[k].v, want[k][2], n * 4);
    ct_check(ok, "adamw on a second thread while another OpenMP team runs: both bit-exact",
             "pthread_create %d; results differ from the formula", rc);
    for (int k = 0; k < 2; k++) {
        free(job[k].p); free(job[k].g); free(job[k].m); free(job[k].v);
        for (int a = 0; a < 3; a++) free(want[k][a]);
    }
}

int main(void) {
    ct_seed(1);
    test_small_ops();
    test_cast_decode();
    test_cast_encode();
    test_add_lp();
    test_sums();
    test_adamw();
    test_adamw_lp();
    test_grad16();
    test_adamw_random();
    test_adamw_second_thread();
    return ct_summary();
}
