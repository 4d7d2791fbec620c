/*
 * test_attention_tiles.c -- the algorithm of kernels/cuda/attention_tc_*.cu
 * (bf16 tensor-core attention, head sizes 64 and 128) mirrored in plain
 * loops on the CPU and checked against zk_attention_forward/backward (fp32)
 * with the tolerances test_cuda.c applies to the GPU (spec/c/attn_tc_check.h).
 *
 * MIRRORS attention_tc_fwd.cu and _bwd.cu: change the two together. The same tiles (64
 * keys forward, tiles after a row's own skipped, the mask on the diagonal;
 * the kernel's blocks of 128 query rows at head size 64 give each row
 * this same sequence of tiles; 64 keys x CH-query chunks from the tile's
 * first key for dK, dV; 64 queries x CH-key chunks up to the block's last
 * row for dQ -- the kernel's dQ blocks of 128 rows and key chunks of 32 at
 * head size 64 sum each dQ element's terms in this same key order; CH = 64
 * for head size 64, 16 for 128), the same masks (key
 * after the query; rows at or past T), the same online softmax in base 2
 * with the scale folded (raw-score maximum m, c = 2^((m - m') scale
 * log2 e), p = 2^(fma(s, scale log2 e, -m' scale log2 e)), l = l c + sum p
 * with p unrounded, O = c O + bf16(p) V, out = O (1 / l), lse = m scale +
 * log l), the backward's p = 2^(fma(s, scale log2 e, -lse log2 e)), bf16
 * (RNE) at the same points (q, k, v, dout on load; p, dS before their
 * products), D = rowsum(dout * out) in fp32 first (the kernel: in k_tc_dq,
 * before k_tc_dkv). Not mirrored: the order
 * of the sums inside an m16n8k16 product (tensor cores) and of a row's
 * sum of p (the kernel: per lane, then its 4 lanes) -- this catches the
 * tiling's algebra, not the hardware.
 *
 * Each check must be able to fail: broken variants of the mirror (causal
 * mask, rescale, scale, D, dS's scale dropped) are run too, and each must
 * FAIL the tolerance check it targets.
 */
#include "ctest.h"
#include "kernels.h"
#include "attn_tc_check.h"

enum { BR = 64, MAXHD = 128 };
#define LOG2E 1.4426950408889634f
enum { BUG_NONE, BUG_MASK, BUG_RESCALE, BUG_SCALE, BUG_BWD_MASK, BUG_D, BUG_DS_SCALE };

typedef struct { int B, T, C, NH; } shape;

static int chunk(int hd) { return hd == 64 ? 64 : 16; }

/* rows [t0, t0+n) of a (T, stride) matrix's hd columns, bf16, zero past T */
static void load_rows(float *dst, const float *src, size_t stride, int t0, int n, int T, int hd)
{
    for (int r = 0; r < n; r++)
        for (int d = 0; d < hd; d++)
            dst[r * hd + d] = t0 + r < T ? tc_bf16(src[(size_t)(t0 + r) * stride + d]) : 0.0f;
}

static float dot(const float *a, const float *b, int hd)
{
    float s = 0.0f;
    for (int d = 0; d < hd; d++) s += a[d] * b[d];
    return s;
}

/* k_tc_fwd: one (query tile, b, h) at a time */
static void fwd(float *out, float *lse, const float *qkv, shape s, int bug)
{
    static float Q[BR * MAXHD], K[BR * MAXHD], V[BR * MAXHD], P[BR * BR], O[BR * MAXHD];
    float m[BR], l[BR], c[BR];
    const int T = s.T, C = s.C, hd = C / s.NH;
    const size_t st = 3 * (size_t)C;
    const float scale = bug == BUG_SCALE ? 1.0f : 1.0f / sqrtf((float)hd), sl2 = scale * LOG2E;
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int qt = 0; qt < (T + BR - 1) / BR; qt++) {
                const float *base = qkv + (size_t)b * T * st + (size_t)h * hd;
                const int q0 = qt * BR;
                load_rows(Q, base, st, q0, BR, T, hd);
                memset(O, 0, sizeof O);
                for (int r = 0; r < BR; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
                for (int kt = 0; kt <= qt; kt++) {
                    const int k0 = kt * BR;
                    load_rows(K, base + C, st, k0, BR, T, hd);
                    load_rows(V, base + 2 * C, st, k0, BR, T, hd);
                    for (int r = 0; r < BR; r++) {
                        float sr[BR], mn = m[r], sum = 0.0f;
                        for (int j = 0; j < BR; j++) {
                            sr[j] = dot(Q + r * hd, K + j * hd, hd);
                            if (kt == qt && k0 + j > q0 + r && bug != BUG_MASK) sr[j] = -INFINITY;
                            mn = fmaxf(mn, sr[j]);
                        }
                        for (int j = 0; j < BR; j++) {
                            float p = exp2f(fmaf(sr[j], sl2, -(mn * sl2)));
                            sum += p;
                            P[r * BR + j] = tc_bf16(p);
                        }
                        c[r] = exp2f((m[r] - mn) * sl2);
                        l[r] = l[r] * c[r] + sum;
                        m[r] = mn;
                    }
                    for (int r = 0; r < BR; r++)
                        for (int d = 0; d < hd; d++) {
                            float o = bug == BUG_RESCALE ? O[r * hd + d] : O[r * hd + d] * c[r];
                            for (int j = 0; j < BR; j++) o += P[r * BR + j] * V[j * hd + d];
                            O[r * hd + d] = o;
                        }
                }
                for (int r = 0; r < BR && q0 + r < T; r++) {
                    const float inv = 1.0f / l[r];
                    for (int d = 0; d < hd; d++)
                        out[((size_t)b * T + q0 + r) * C + (size_t)h * hd + d] = O[r * hd + d] * inv;
                    lse[((size_t)b * s.NH + h) * T + q0 + r] = m[r] * scale + logf(l[r]);
                }
            }
}

/* k_tc_dkv (keys) or k_tc_dq (queries): one block of 64 rows against
 * chunks of CH of the other side */
static void bwd_block(float *dqkv, const float *dout, const float *qkv, const float *lse,
                      const float *D, shape s, int b, int h, int t0, int keys, int bug)
{
    static float R1[BR * MAXHD], R2[BR * MAXHD], X1[BR * MAXHD], X2[BR * MAXHD];
    static float A1[BR * MAXHD], A2[BR * MAXHD];
    const int T = s.T, C = s.C, hd = C / s.NH, CH = chunk(hd);
    const size_t st = 3 * (size_t)C;
    const float scale = 1.0f / sqrtf((float)hd), dsc = bug == BUG_DS_SCALE ? 1.0f : scale;
    const float sl2 = scale * LOG2E;
    const float *base = qkv + (size_t)b * T * st + (size_t)h * hd;
    const float *gbase = dout + (size_t)b * T * C + (size_t)h * hd;
    const float *L = lse + ((size_t)b * s.NH + h) * T, *Dr = D + ((size_t)b * s.NH + h) * T;
    /* keys: R1 = K, R2 = V, chunks X1 = Q, X2 = dout; queries: R1 = Q, R2 = dout, X1 = K, X2 = V */
    load_rows(R1, keys ? base + C : base, st, t0, BR, T, hd);
    load_rows(R2, keys ? base + 2 * C : gbase, keys ? st : (size_t)C, t0, BR, T, hd);
    memset(A1, 0, sizeof A1);
    memset(A2, 0, sizeof A2);
    const int from = keys ? t0 : 0, to = keys ? T : (t0 + BR < T ? t0 + BR : T);
    for (int x0 = from; x0 < to; x0 += CH) {
        load_rows(X1, keys ? base : base + C, st, x0, CH, T, hd);
        load_rows(X2, keys ? gbase : base + 2 * C, keys ? (size_t)C : st, x0, CH, T, hd);
        for (int r = 0; r < BR; r++)
            for (int c = 0; c < CH; c++) {
                const int i = keys ? x0 + c : t0 + r, j = keys ? t0 + r : x0 + c;
                float S = dot(R1 + r * hd, X1 + c * hd, hd), dP = dot(R2 + r * hd, X2 + c * hd, hd);
                int ok = i < T && (i >= j || bug == BUG_BWD_MASK);
                float L2 = i < T ? L[i] * LOG2E : 0.0f, Di = i < T ? Dr[i] : 0.0f;
                float p = ok ? exp2f(fmaf(S, sl2, -L2)) : 0.0f, ds = p * (dP - Di) * dsc;
                float pb = tc_bf16(p), db = tc_bf16(ds);
                for (int d = 0; d < hd; d++) {
                    if (keys) {       /* dV += P^T dout, dK += dS^T Q */
                        A2[r * hd + d] += pb * X2[c * hd + d];
                        A1[r * hd + d] += db * X1[c * hd + d];
                    } else {          /* dQ += dS K */
                        A1[r * hd + d] += db * X1[c * hd + d];
                    }
                }
            }
    }
    float *drow = dqkv + (size_t)b * T * st + (size_t)h * hd;
    for (int r = 0; r < BR && t0 + r < T; r++)
        for (int d = 0; d < hd; d++) {
            if (keys) {
                drow[(size_t)(t0 + r) * st + C + d] = A1[r * hd + d];
                drow[(size_t)(t0 + r) * st + 2 * C + d] = A2[r * hd + d];
            } else {
                drow[(size_t)(t0 + r) * st + d] = A1[r * hd + d];
            }
        }
}

static void bwd(float *dqkv, const float *dout, const float *qkv, const float *out,
                const float *lse, shape s, int bug)
{
    const int T = s.T, C = s.C, hd = C / s.NH;
    float *D = malloc((size_t)s.B * s.NH * T * sizeof(float));
    for (int b = 0; b < s.B; b++)      /* k_tc_D: fp32, unrounded dout and out */
        for (int h = 0; h < s.NH; h++)
            for (int i = 0; i < T; i++) {
                size_t off = ((size_t)b * T + i) * C + (size_t)h * hd;
                D[((size_t)b * s.NH + h) * T + i] = bug == BUG_D ? 0.0f : dot(dout + off, out + off, hd);
            }
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int t0 = 0; t0 < T; t0 += BR) {
                bwd_block(dqkv, dout, qkv, lse, D, s, b, h, t0, 1, bug);
                bwd_block(dqkv, dout, qkv, lse, D, s, b, h, t0, 0, bug);
            }
    free(D);
}

typedef struct {
    shape s;
    float *qkv, *dy, *o, *l, *dq;     /* inputs (bf16 values) and the CPU twin's outputs */
    double *mo, *ml, *mdq;            /* tolerance magnitudes */
} problem;

static problem make(shape s)
{
    problem p;
    size_t nq = (size_t)s.B * s.T * 3 * s.C, no = (size_t)s.B * s.T * s.C, nl = (size_t)s.B * s.NH * s.T;
    p.s = s;
    p.qkv = ct_rand(nq, -2, 2); p.dy = ct_rand(no, -1, 1);
    tc_round_bf16(p.qkv, nq); tc_round_bf16(p.dy, no);
    p.o = malloc(no * 4); p.l = malloc(nl * 4); p.dq = malloc(nq * 4);
    zk_attention_forward(p.o, p.l, p.qkv, s.B, s.T, s.C, s.NH);
    zk_attention_backward(p.dq, p.dy, p.qkv, p.o, p.l, s.B, s.T, s.C, s.NH);
    p.mo = malloc(no * 8); p.ml = malloc(nl * 8); p.mdq = malloc(nq * 8);
    tc_mags(p.mo, p.ml, p.mdq, p.qkv, p.dy, s.B, s.T, s.C, s.NH);
    return p;
}

static void drop(problem *p)
{
    free(p->qkv); free(p->dy); free(p->o); free(p->l); free(p->dq);
    free(p->mo); free(p->ml); free(p->mdq);
}

/* worst excess of the mirror (with bug) over the tolerance: out, lse, dqkv */
static void run(const problem *p, int bug, double worst[3])
{
    shape s = p->s;
    size_t nq = (size_t)s.B * s.T * 3 * s.C, no = (size_t)s.B * s.T * s.C, nl = (size_t)s.B * s.NH * s.T;
    float *o = malloc(no * 4), *l = malloc(nl * 4), *dq = malloc(nq * 4);
    for (size_t i = 0; i < nq; i++) dq[i] = NAN;       /* WRITTEN: every element */
    fwd(o, l, p->qkv, s, bug);
    bwd(dq, p->dy, p->qkv, o, l, s, bug);
    size_t at;
    worst[0] = tc_worst(o, p->o, p->mo, no, TC_RHO, &at);
    worst[1] = tc_worst(l, p->l, p->ml, nl, 1.0, &at);
    worst[2] = tc_worst(dq, p->dq, p->mdq, nq, TC_RHO, &at);
    if (bug == BUG_NONE) {
        char name[128];
        snprintf(name, sizeof name, "tiles B=%d T=%d NH=%d hs=%d: out", s.B, s.T, s.NH, s.C / s.NH);
        tc_check(name, o, p->o, p->mo, no, TC_RHO);
        snprintf(name, sizeof name, "tiles B=%d T=%d NH=%d hs=%d: lse", s.B, s.T, s.NH, s.C / s.NH);
        tc_check(name, l, p->l, p->ml, nl, 1.0);
        snprintf(name, sizeof name, "tiles B=%d T=%d NH=%d hs=%d: dqkv", s.B, s.T, s.NH, s.C / s.NH);
        tc_check(name, dq, p->dq, p->mdq, nq, TC_RHO);
    }
    free(o); free(l); free(dq);
}

int main(void)
{
    const shape shapes[] = { {1, 1, 64, 1}, {2, 17, 128, 2}, {1, 64, 192, 3}, {2, 100, 128, 2},
                             {1, 256, 128, 2}, {1, 257, 64, 1},        /* head size 64 */
                             {1, 1, 128, 1}, {2, 33, 128, 1}, {1, 100, 256, 2}, {1, 193, 128, 1} };
    ct_seed(77);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        problem p = make(shapes[k]);
        double w[3];
        run(&p, BUG_NONE, w);
        printf("   (worst share of the tolerance: out %.3g, lse %.3g, dqkv %.3g)\n", w[0], w[1], w[2]);
        drop(&p);
    }
    /* the checks can fail: each broken variant must exceed its tolerance */
    static const struct { int bug, out; const char *what; } bugs[] = {
        { BUG_MASK, 0, "forward without the causal mask: out" },
        { BUG_RESCALE, 0, "forward without the O rescale: out" },
        { BUG_SCALE, 1, "forward without the 1/sqrt(hs) scale: lse" },
        { BUG_BWD_MASK, 2, "backward without the causal mask: dqkv" },
        { BUG_D, 2, "backward without D: dqkv" },
        { BUG_DS_SCALE, 2, "backward without dS's scale: dqkv" },
    };
    problem p = make((shape){ 2, 100, 128, 2 }), q = make((shape){ 1, 193, 128, 1 });  /* hs 64, 128 */
    for (size_t k = 0; k < sizeof bugs / sizeof bugs[0]; k++) {
        double w1[3], w2[3];
        char name[160];
        run(&p, bugs[k].bug, w1);
        run(&q, bugs[k].bug, w2);
        snprintf(name, sizeof name, "tolerance rejects %s", bugs[k].what);
        ct_check(w1[bugs[k].out] > 1.0 && w2[bugs[k].out] > 1.0, name,
                 "only %.3g and %.3g of the tolerance", w1[bugs[k].out], w2[bugs[k].out]);
    }
    drop(&p); drop(&q);
    return ct_summary();
}
