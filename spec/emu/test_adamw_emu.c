/*
 * test_adamw_emu.c -- kernels/cuda/adamw.cu's own source run on the CPU
 * under spec/emu/cuda_emu.h, against the CPU twin: zkc_adamw_multi (a
 * step's whole update, the items' table in the kernel's parameters, a
 * block a tile of the items' joined index space) must give every item the
 * bits of zk_adamw_g16 / zk_adamw_lp over it (the per-element arithmetic
 * is k_adamw_segs' own, the CPU's), and leave every element outside the
 * items alone. Items: several over four buffers at odd offsets with gaps
 * between them, of sizes around the kernel's tile (1024 elements: a tile
 * holding many items, one item spanning tiles, boundaries at a tile's edge
 * and inside it), one of length 0; f32, bf16 and f16 gradients, with no
 * lp, a bf16 and an f16 one; two steps (m, v non-zero). Then 1300 small
 * items (lengths 0..40), more than one launch's table (600): three
 * launches, the same bits. And zkc_adamw_segments over one buffer's
 * segments against the multi call on the same segments: the same bits.
 * Refused: n = 0, g kind 3, lp kind 3, a negative length, an lp kind
 * without lp: nothing written.
 * Run: sh tools/emu_kernel.sh adamw.
 */
#include <math.h>
#include <string.h>
#include "ctest.h"
#include "kernels.h"

int zkc_adamw_segments(void *s, float *p, const void *g, int g_kind, float *m, float *v,
                       void *lp, int lp_kind, int nseg, const int64_t *off, const int64_t *len,
                       const float *wd, float lr, float b1, float b2, float eps, float gscale,
                       int t);
int zkc_adamw_multi(void *s, int n, float *const *p, const void *const *g, float *const *m,
                    float *const *v, void *const *lp, const int64_t *len, const float *wd,
                    int g_kind, int lp_kind, float lr, float b1, float b2, float eps,
                    float gscale, int t);

#define NBUF 4
#define LR 6e-4f
#define B1 0.9f
#define B2 0.95f
#define EPS 1e-8f
#define GS 0.7f

/* one side's buffers: p, m, v f32, g f32 or 2-byte, lp 2-byte */
typedef struct side {
    float *p[NBUF], *m[NBUF], *v[NBUF];
    void *g[NBUF];
    uint16_t *lp[NBUF];
} side;

static size_t bufn[NBUF];

/* gradient-like values (a spread of binades), as the g kind stores them */
static void *grads(size_t n, int g_kind)
{
    float *w = ct_alloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) w[i] = ldexpf(ct_unif(-1, 1), (int)ct_unif(-12, 13));
    if (g_kind == 0) return w;
    uint16_t *h = ct_alloc(n * 2 + 2);
    if (g_kind == 1) zk_cast_f32_bf16(h, w, n);
    else zk_cast_f32_f16(h, w, n);
    free(w);
    return h;
}

static void make(side *a, side *b, int g_kind)
{
    for (int k = 0; k < NBUF; k++) {
        size_t n = bufn[k];
        a->p[k] = ct_rand(n, -1, 1);
        a->m[k] = ct_rand(n, -0.01f, 0.01f);
        a->v[k] = ct_rand(n, 0, 1e-4f);
        a->g[k] = grads(n, g_kind);
        a->lp[k] = ct_alloc(n * 2 + 2);
        for (size_t i = 0; i < n; i++) a->lp[k][i] = 0x7fc1;      /* a sentinel: written? */
        b->p[k] = malloc(n * 4); memcpy(b->p[k], a->p[k], n * 4);
        b->m[k] = malloc(n * 4); memcpy(b->m[k], a->m[k], n * 4);
        b->v[k] = malloc(n * 4); memcpy(b->v[k], a->v[k], n * 4);
        b->g[k] = a->g[k];                                         /* read only: shared */
        b->lp[k] = malloc(n * 2); memcpy(b->lp[k], a->lp[k], n * 2);
    }
}

static void drop(side *a, side *b)
{
    for (int k = 0; k < NBUF; k++) {
        free(a->p[k]); free(a->m[k]); free(a->v[k]); free(a->g[k]); free(a->lp[k]);
        free(b->p[k]); free(b->m[k]); free(b->v[k]); free(b->lp[k]);
    }
}

static int same(const side *a, const side *b, int lp_kind)
{
    for (int k = 0; k < NBUF; k++) {
        size_t n = bufn[k];
        if (memcmp(a->p[k], b->p[k], n * 4) || memcmp(a->m[k], b->m[k], n * 4) ||
            memcmp(a->v[k], b->v[k], n * 4))
            return 0;
        if (lp_kind && memcmp(a->lp[k], b->lp[k], n * 2)) return 0;
    }
    return 1;
}

/* the items: buffer, offset, length, decay */
typedef struct item { int buf; int64_t off, len; float wd; } item;

/* the multi call (emulated) on side a, the CPU twin item by item on side b */
static int run(side *a, side *b, const item *it, int n, int g_kind, int lp_kind, int t)
{
    float **p = malloc(n * sizeof *p), **m = malloc(n * sizeof *m), **v = malloc(n * sizeof *v);
    const void **g = malloc(n * sizeof *g);
    void **lp = malloc(n * sizeof *lp);
    int64_t *len = malloc(n * sizeof *len);
    float *wd = malloc(n * sizeof *wd);
    size_t gs = g_kind ? 2 : 4;
    for (int k = 0; k < n; k++) {
        int q = it[k].buf;
        int64_t o = it[k].off;
        p[k] = a->p[q] + o; m[k] = a->m[q] + o; v[k] = a->v[q] + o;
        g[k] = (const char *)a->g[q] + o * gs;
        lp[k] = a->lp[q] + o;
        len[k] = it[k].len; wd[k] = it[k].wd;
    }
    int rc = zkc_adamw_multi(NULL, n, p, g, m, v, lp_kind ? lp : NULL, len, wd, g_kind, lp_kind,
                             LR, B1, B2, EPS, GS, t);
    for (int k = 0; k < n; k++) {
        int q = it[k].buf;
        int64_t o = it[k].off;
        size_t ln = (size_t)it[k].len;
        if (ln == 0) continue;
        uint16_t *l = lp_kind ? b->lp[q] + o : NULL;
        if (g_kind == 0)
            zk_adamw_lp(b->p[q] + o, (const float *)b->g[q] + o, b->m[q] + o, b->v[q] + o, l,
                        lp_kind == 2, ln, LR, B1, B2, EPS, it[k].wd, GS, t);
        else
            zk_adamw_g16(b->p[q] + o, (const uint16_t *)b->g[q] + o, g_kind == 2, b->m[q] + o,
                         b->v[q] + o, l, lp_kind == 2, ln, LR, B1, B2, EPS, it[k].wd, GS, t);
    }
    free(p); free(m); free(v); free(g); free(lp); free(len); free(wd);
    return rc;
}

static const char *gname[3] = { "f32", "bf16", "f16" }, *lname[3] = { "no lp", "bf16 lp", "f16 lp" };

/* two steps of the items (bufn set) on both sides: the CPU's bits, every
 * element outside the items untouched (same compares whole buffers) */
static void check_items(const item *its, int n, int g_kind, int lp_kind, const char *what)
{
    side a, b;
    make(&a, &b, g_kind);
    int rc = 0;
    for (int t = 1; t <= 2 && !rc; t++) rc = run(&a, &b, its, n, g_kind, lp_kind, t);
    char name[200];
    snprintf(name, sizeof name, "emu adamw_multi %d %s, %s g, %s: the CPU's bits, the gaps untouched",
             n, what, gname[g_kind], lname[lp_kind]);
    ct_check(rc == 0 && same(&a, &b, lp_kind), name, "rc %d, differ", rc);
    drop(&a, &b);
}

/* items over four buffers, offsets odd, gaps between, sizes about the tile */
static void t_items(int g_kind, int lp_kind)
{
    static const item its[] = {
        { 0, 3, 1, 0.1f }, { 0, 5, 255, 0.0f }, { 0, 261, 1024, 0.1f }, { 0, 1290, 1025, 0.2f },
        { 1, 1, 70001, 0.1f }, { 1, 70010, 0, 0.1f }, { 1, 70011, 3, 0.0f },
        { 2, 7, 1023, 0.1f }, { 2, 1031, 4097, 0.0f }, { 2, 5129, 33, 0.3f },
        { 3, 0, 256, 0.1f }, { 3, 257, 5000, 0.1f },
    };
    bufn[0] = 2400; bufn[1] = 70020; bufn[2] = 5170; bufn[3] = 5300;
    check_items(its, (int)(sizeof its / sizeof *its), g_kind, lp_kind, "items");
}

/* more items than one launch's table: launches of 600 in order */
static void t_many(int g_kind, int lp_kind)
{
    int n = 1300;
    item *its = malloc(n * sizeof *its);
    int64_t at[NBUF] = { 0 };
    for (int k = 0; k < n; k++) {
        int q = k % NBUF;
        int64_t len = (int64_t)ct_unif(0, 41);
        if (len > 40) len = 40;
        at[q] += (int64_t)ct_unif(0, 3);          /* a gap of 0..2 */
        its[k] = (item){ q, at[q], len, (k % 3) * 0.1f };
        at[q] += len;
    }
    for (int q = 0; q < NBUF; q++) bufn[q] = (size_t)at[q] + 1;
    check_items(its, n, g_kind, lp_kind, "small items (3 launches)");
    free(its);
}

/* one buffer's segments: zkc_adamw_segments against the multi call */
static void t_segments(int g_kind, int lp_kind)
{
    bufn[0] = 200003; bufn[1] = bufn[2] = bufn[3] = 1;
    side a, b;
    make(&a, &b, g_kind);
    int64_t off[3] = { 0, 70001, 150000 }, len[3] = { 70000, 50000, 50003 };
    float wd[3] = { 0.1f, 0.0f, 0.2f };
    int rc = 0;
    for (int t = 1; t <= 2 && !rc; t++) {
        float *p = a.p[0], *m = a.m[0], *v = a.v[0];
        float *pp[3], *mm[3], *vv[3];
        const void *gg[3];
        void *ll[3];
        size_t gs = g_kind ? 2 : 4;
        for (int k = 0; k < 3; k++) {
            pp[k] = p + off[k]; mm[k] = m + off[k]; vv[k] = v + off[k];
            gg[k] = (const char *)a.g[0] + off[k] * gs; ll[k] = a.lp[0] + off[k];
        }
        rc = zkc_adamw_multi(NULL, 3, pp, gg, mm, vv, ll, len, wd, g_kind, lp_kind, LR, B1, B2,
                             EPS, GS, t);
        if (!rc)
            rc = zkc_adamw_segments(NULL, b.p[0], b.g[0], g_kind, b.m[0], b.v[0],
                                    lp_kind ? (void *)b.lp[0] : NULL, lp_kind, 3, off, len, wd, LR,
                                    B1, B2, EPS, GS, t);
    }
    char name[200];
    snprintf(name, sizeof name, "emu adamw_multi against adamw_segments (3 segments), %s g, %s: "
             "the same bits", gname[g_kind], lname[lp_kind]);
    ct_check(rc == 0 && same(&a, &b, lp_kind), name, "rc %d, differ", rc);
    drop(&a, &b);
}

static void t_refused(void)
{
    float p = 1.0f, m = 0.0f, v = 0.0f, g = 0.5f, wd = 0.0f;
    float *pp = &p, *mm = &m, *vv = &v;
    const void *gg = &g;
    int64_t len = 1, neg = -1;
    int r0 = zkc_adamw_multi(NULL, 0, &pp, &gg, &mm, &vv, NULL, &len, &wd, 0, 0, LR, B1, B2, EPS,
                             GS, 1);
    int r1 = zkc_adamw_multi(NULL, 1, &pp, &gg, &mm, &vv, NULL, &len, &wd, 3, 0, LR, B1, B2, EPS,
                             GS, 1);
    int r2 = zkc_adamw_multi(NULL, 1, &pp, &gg, &mm, &vv, NULL, &len, &wd, 0, 3, LR, B1, B2, EPS,
                             GS, 1);
    int r3 = zkc_adamw_multi(NULL, 1, &pp, &gg, &mm, &vv, NULL, &neg, &wd, 0, 0, LR, B1, B2, EPS,
                             GS, 1);
    int r4 = zkc_adamw_multi(NULL, 1, &pp, &gg, &mm, &vv, NULL, &len, &wd, 0, 1, LR, B1, B2, EPS,
                             GS, 1);                                 /* an lp kind, no lp */
    ct_check(r0 && r1 && r2 && r3 && r4 && p == 1.0f && m == 0.0f && v == 0.0f,
             "emu adamw_multi: n 0, g kind 3, lp kind 3, a negative length, lp kind without lp: "
             "refused, nothing written", "%d %d %d %d %d, p %g", r0, r1, r2, r3, r4, (double)p);
}

int main(void)
{
    ct_seed(77);
    for (int g = 0; g < 3; g++)
        for (int l = 0; l < 3; l++) t_items(g, l);
    t_many(0, 0);
    t_many(1, 1);
    t_many(2, 2);
    t_segments(0, 1);
    t_segments(1, 1);
    t_segments(2, 2);
    t_refused();
    return ct_summary();
}
