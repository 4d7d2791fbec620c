/*
 * test_adamw_multi.c -- zt_adamw_multi: many tensors' segments in one op
 * (a step's whole update, one launch on a GPU). Each part's elements must
 * be the bits of zt_adamw_segments on its own tensors and segment (the
 * update is elementwise), with its weight decay, lp rounded in the same
 * pass, f32 and 2-byte gradients; elements outside the parts untouched.
 * Then what it refuses -- two parts writing one element, mixed gradient
 * dtypes, an lp in some parts only, a segment outside its tensor -- with
 * nothing written.
 */
#include "ctest.h"
#include "../../kernels/cpu/kernels.h"
#include "../../runtime/ztrain.h"

enum { NA = 5000, NB = 3000, NC = 7 };

typedef struct { zt_tensor *p, *g, *m, *v, *lp; int64_t n; } set;

static zt_tensor *mk(int dtype, int64_t n) {
    zt_tensor *t = NULL;
    if (zt_tensor_new(&t, ZT_TIER_DEVICE, ZT_CAT_OTHER, dtype, 1, &n) != 0) abort();
    return t;
}

/* random p, g, v > 0, m; g in gd (f32 or a 2-byte dtype), lp bf16 (or none) */
static set mkset(int64_t n, int gd, int with_lp, uint64_t seed) {
    set s = { mk(ZT_F32, n), mk(gd, n), mk(ZT_F32, n), mk(ZT_F32, n), with_lp ? mk(ZT_BF16, n) : NULL, n };
    zt_randn(s.p, seed, 1, 0.0f, 1.0f);
    zt_randn(s.m, seed, 2, 0.0f, 0.1f);
    zt_randn(s.v, seed, 3, 1.0f, 0.1f);
    zt_tensor *g = mk(ZT_F32, n);
    zt_randn(g, seed, 4, 0.0f, 1.0f);
    if (gd == ZT_F32) zt_copy(s.g, g); else zt_cast(s.g, g);
    zt_tensor_release(g);
    if (s.lp) {
        uint16_t *l = zt_tensor_data(s.lp);
        for (int64_t i = 0; i < n; i++) l[i] = 0x7fc1;   /* a NaN: written or not, it shows */
    }
    return s;
}

static set copyset(set a, int gd) {
    set s = mkset(a.n, gd, a.lp != NULL, 99);
    zt_copy(s.p, a.p); zt_copy(s.g, a.g); zt_copy(s.m, a.m); zt_copy(s.v, a.v);
    if (a.lp) zt_copy(s.lp, a.lp);
    return s;
}

static void freeset(set s) {
    zt_tensor_release(s.p); zt_tensor_release(s.g); zt_tensor_release(s.m);
    zt_tensor_release(s.v); if (s.lp) zt_tensor_release(s.lp);
}

static int same_set(set a, set b) {
    size_t n = (size_t)a.n;
    int ok = !memcmp(zt_tensor_data(a.p), zt_tensor_data(b.p), 4 * n) &&
             !memcmp(zt_tensor_data(a.m), zt_tensor_data(b.m), 4 * n) &&
             !memcmp(zt_tensor_data(a.v), zt_tensor_data(b.v), 4 * n);
    if (a.lp) ok = ok && !memcmp(zt_tensor_data(a.lp), zt_tensor_data(b.lp), 2 * n);
    return ok;
}

static zt_adamw_part part(set s, int64_t off, int64_t len, float wd) {
    return (zt_adamw_part){ s.p, s.g, s.m, s.v, s.lp, off, len, wd };
}

static void test_bits(int gd, int with_lp) {
    set a = mkset(NA, gd, with_lp, 1), b = mkset(NB, gd, with_lp, 2), c = mkset(NC, gd, with_lp, 3);
    set ra = copyset(a, gd), rb = copyset(b, gd), rc = copyset(c, gd);
    /* two parts of a (a gap between, a tail after), one of b, all of c */
    zt_adamw_part parts[4] = { part(a, 0, 1000, 0.1f), part(b, 10, 2980, 0.3f),
                               part(a, 1001, 2000, 0.0f), part(c, 0, NC, 0.1f) };
    int r = zt_adamw_multi(parts, 4, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.5f, 7);
    char name[160];
    snprintf(name, sizeof name, "adamw_multi runs (%s grads%s)", zt_dtype_name(gd),
             with_lp ? ", bf16 lp" : "");
    ct_check(r == 0, name, "%s", zt_last_error());
    /* the reference: zt_adamw_segments, one tensor set at a time */
    int64_t aoff[2] = { 0, 1001 }, alen[2] = { 1000, 2000 }, boff[1] = { 10 }, blen[1] = { 2980 },
            coff[1] = { 0 }, clen[1] = { NC };
    float awd[2] = { 0.1f, 0.0f }, bwd[1] = { 0.3f }, cwd[1] = { 0.1f };
    int e = zt_adamw_segments(ra.p, ra.g, ra.m, ra.v, ra.lp, 2, aoff, alen, awd, 1e-3f, 0.9f, 0.95f,
                              1e-8f, 0.5f, 7) ||
            zt_adamw_segments(rb.p, rb.g, rb.m, rb.v, rb.lp, 1, boff, blen, bwd, 1e-3f, 0.9f, 0.95f,
                              1e-8f, 0.5f, 7) ||
            zt_adamw_segments(rc.p, rc.g, rc.m, rc.v, rc.lp, 1, coff, clen, cwd, 1e-3f, 0.9f, 0.95f,
                              1e-8f, 0.5f, 7);
    if (e) ct_fail("the reference runs", "%s", zt_last_error());
    snprintf(name, sizeof name, "adamw_multi (%s grads%s): param, m, v%s the bits of "
             "adamw_segments on each part's own tensors; gaps and tails untouched",
             zt_dtype_name(gd), with_lp ? ", bf16 lp" : "", with_lp ? ", lp" : "");
    ct_check(same_set(a, ra) && same_set(b, rb) && same_set(c, rc), name, "differ");
    freeset(a); freeset(b); freeset(c); freeset(ra); freeset(rb); freeset(rc);
}

static int refused(int r, const char *needle) {
    return r != 0 && strstr(zt_last_error(), needle) != NULL;
}

static void test_refusals(void) {
    set a = mkset(NA, ZT_F32, 0, 5), b = mkset(NB, ZT_BF16, 0, 6), c = mkset(NB, ZT_F32, 1, 7);
    set ra = copyset(a, ZT_F32);
    zt_adamw_part over[2] = { part(a, 0, 1000, 0.1f), part(a, 999, 10, 0.1f) };
    /* (param, m and v all overlap here: whichever pair lies lowest in
     * memory is named) */
    ct_check(refused(zt_adamw_multi(over, 2, 1e-3f, 0.9f, 0.95f, 1e-8f, 1.0f, 3), "overlap") &&
                 strstr(zt_last_error(), "part 0's") && strstr(zt_last_error(), "part 1's"),
             "adamw_multi refuses two parts writing one element, naming them", "%s",
             zt_last_error());
    /* across kinds: one part's m is another's param; one part's grad is
     * what another writes (a read racing a write on a GPU) */
    set d = mkset(NA, ZT_F32, 0, 8);
    zt_adamw_part cross[2] = { part(a, 0, 10, 0.1f), { d.p, d.g, a.p, d.v, NULL, 5, 10, 0.1f } };
    ct_check(refused(zt_adamw_multi(cross, 2, 1e-3f, 0.9f, 0.95f, 1e-8f, 1.0f, 3), "overlap"),
             "adamw_multi refuses a part's m over another part's param", "%s", zt_last_error());
    zt_adamw_part rw[2] = { part(a, 0, 10, 0.1f), { d.p, a.p, d.m, d.v, NULL, 0, 10, 0.1f } };
    ct_check(refused(zt_adamw_multi(rw, 2, 1e-3f, 0.9f, 0.95f, 1e-8f, 1.0f, 3),
                     "part 1's grad overlaps part 0's param"),
             "adamw_multi refuses a grad another part writes, naming both", "%s", zt_last_error());
    zt_adamw_part mixed[2] = { part(a, 0, 10, 0.1f), part(b, 0, 10, 0.1f) };
    ct_check(refused(zt_adamw_multi(mixed, 2, 1e-3f, 0.9f, 0.95f, 1e-8f, 1.0f, 3), "part 1's grad"),
             "adamw_multi refuses a part whose grad has another dtype, naming it", "%s",
             zt_last_error());
    zt_adamw_part some[2] = { part(a, 0, 10, 0.1f), part(c, 0, 10, 0.1f) };
    ct_check(refused(zt_adamw_multi(some, 2, 1e-3f, 0.9f, 0.95f, 1e-8f, 1.0f, 3), "all parts or none"),
             "adamw_multi refuses an lp in some parts only", "%s", zt_last_error());
    zt_adamw_part past[1] = { part(a, NA - 5, 6, 0.1f) };
    ct_check(refused(zt_adamw_multi(past, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 1.0f, 3), "part 0's segment"),
             "adamw_multi refuses a segment past its tensor's end", "%s", zt_last_error());
    ct_check(refused(zt_adamw_multi(past, 0, 1e-3f, 0.9f, 0.95f, 1e-8f, 1.0f, 3), "1 to"),
             "adamw_multi refuses 0 parts", "%s", zt_last_error());
    ct_check(same_set(a, ra), "refused adamw_multi ops wrote nothing", "changed");
    freeset(a); freeset(b); freeset(c); freeset(d); freeset(ra);
}

int main(void) {
    ct_seed(7);
    for (int lp = 0; lp <= 1; lp++) {
        test_bits(ZT_F32, lp);
        test_bits(ZT_BF16, lp);
        test_bits(ZT_F16, lp);
    }
    test_refusals();
    return ct_summary();
}
