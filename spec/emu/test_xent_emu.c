/*
 * test_xent_emu.c -- kernels/cuda/xent.cu's own source run on the CPU
 * under spec/emu/cuda_emu.h, against the CPU twins (zk_crossentropy,
 * zk_crossentropy_bf16): losses within 1e-5, fp32 dlogits within 1e-6 *
 * dscale, bf16 dlogits within 1 bf16 ulp (the online softmax's fp32 sums
 * are not the CPU's double lanes). Rows ld apart with [V,ld) of logits
 * filled with NaN in one run and huge values in another: both runs must
 * give the same bits (not read; deterministic) and dlogits' [V,ld) +0.
 * Shapes on the 16-byte path (ld a multiple of 4 fp32 / 8 bf16) with and
 * without a tail, on the scalar path (ld not a multiple, or an unaligned
 * base), V below the 512 threads, GPT-2's 50257 in rows of 50304; in place
 * and into another buffer; dlogits NULL (nothing written); targets -1 and
 * V (loss 0, row 0, *dbad counted once a row). Elements around the rows
 * must stay untouched. Rows: uniform, a rising ramp (the running max grows
 * at every vector: the rescale), a confident spike on the target.
 * Run: sh tools/emu_kernel.sh xent.
 */
#include <math.h>
#include "ctest.h"
#include "kernels.h"

int zkc_crossentropy(void *s, float *losses, float *dlogits, const float *logits,
                     const int32_t *targets, int N, int V, int ld, float dscale, int *dbad);
int zkc_crossentropy_bf16(void *s, float *losses, uint16_t *dlogits, const uint16_t *logits,
                          const int32_t *targets, int N, int V, int ld, float dscale, int *dbad);

#define GUARD 8         /* elements after the last row, must stay untouched */

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bf16f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
/* bf16 bits in a monotonic order (+0 and -0 both 0) */
static int bf16ord(uint16_t b) { return b & 0x8000 ? -(int)(b & 0x7fff) : (int)b; }

/* element i of an fp32 or bf16 array, widened; and its bits */
static float elt(const void *a, int bf16, size_t i)
{
    return bf16 ? bf16f(((const uint16_t *)a)[i]) : ((const float *)a)[i];
}
static uint32_t ebits(const void *a, int bf16, size_t i)
{
    return bf16 ? ((const uint16_t *)a)[i] : fbits(((const float *)a)[i]);
}

static void fill_nan(void *a, int bf16, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (bf16) ((uint16_t *)a)[i] = 0x7fc0;
        else ((float *)a)[i] = NAN;
    }
}

/* the rows' columns [0,V): n % 3 == 0 uniform in [-4,4), 1 a rising ramp
 * from -6 to 6 (plus noise), 2 uniform with 12 at the target */
static void fill_rows(float *x, const int32_t *tg, int N, int V, int ld)
{
    for (int n = 0; n < N; n++)
        for (int i = 0; i < V; i++) {
            float u = ct_unif(-4, 4);
            float v = n % 3 == 1 ? -6.0f + 12.0f * i / V + 0.01f * u : u;
            if (n % 3 == 2 && i == tg[n]) v = 12.0f;
            x[(size_t)n * ld + i] = v;
        }
}

/* N rows of V in rows ld apart, fp32 or bf16; mis elements before row 0
 * (mis 1: an unaligned base, the scalar path); inplace: dlogits = logits;
 * withd 0: dlogits NULL; nbad rows with a bad target (row 1: -1, row N-1:
 * V; nbad 1 or 2, N >= 3) */
static void one(int bf16, int N, int V, int ld, int mis, int inplace, int withd, int nbad,
                float dscale)
{
    char name[256];
    size_t es = bf16 ? 2 : 4, rows = (size_t)N * ld, ne = mis + rows + GUARD;
    int32_t *tg = malloc(N * sizeof(int32_t));
    for (int n = 0; n < N; n++) tg[n] = (int32_t)(ct_u64() % (uint64_t)V);
    tg[0] = V - 1;                      /* the last column: the tail on the vector path */
    if (N > 2) tg[2] = tg[2] % 2 ? 0 : tg[2];
    if (nbad >= 1) tg[1] = -1;
    if (nbad >= 2) tg[N - 1] = V;
    float *xf = malloc(rows * 4);
    fill_rows(xf, tg, N, V, ld);
    /* two inputs: the same rows, [V,ld) and the edges NaN in in[0], huge in in[1] */
    void *in[2], *ref = malloc(rows * es);
    for (int r = 0; r < 2; r++) {
        in[r] = malloc(ne * es);
        for (size_t i = 0; i < ne; i++) {
            if (bf16) ((uint16_t *)in[r])[i] = r ? 0x7f7f : 0x7fc0;   /* max finite, NaN */
            else ((float *)in[r])[i] = r ? 3e38f : NAN;
        }
        for (int n = 0; n < N; n++) {
            size_t o = (size_t)n * ld;
            if (bf16) zk_cast_f32_bf16((uint16_t *)in[r] + mis + o, xf + o, (size_t)V);
            else memcpy((float *)in[r] + mis + o, xf + o, (size_t)V * 4);
        }
    }
    memcpy(ref, (char *)in[0] + mis * es, rows * es);

    /* the CPU twin, into its own buffer */
    float *lc = malloc(N * 4);
    void *dc = malloc(rows * es);
    fill_nan(dc, bf16, rows);
    int cbad = bf16 ? zk_crossentropy_bf16(lc, dc, ref, tg, N, V, ld, dscale)
                    : zk_crossentropy(lc, dc, ref, tg, N, V, ld, dscale);

    /* the kernel, twice */
    float *gl[2];
    void *buf[2], *out[2];
    int rc[2], bad[2];
    for (int r = 0; r < 2; r++) {
        buf[r] = malloc(ne * es);
        memcpy(buf[r], in[r], ne * es);
        if (inplace) out[r] = buf[r];
        else { out[r] = malloc(ne * es); fill_nan(out[r], bf16, ne); }
        gl[r] = malloc(N * 4);
        for (int n = 0; n < N; n++) gl[r][n] = NAN;
        bad[r] = 3;
        void *x = (char *)buf[r] + mis * es, *d = withd ? (char *)out[r] + mis * es : NULL;
        rc[r] = bf16 ? zkc_crossentropy_bf16(NULL, gl[r], d, x, tg, N, V, ld, dscale, &bad[r])
                     : zkc_crossentropy(NULL, gl[r], d, x, tg, N, V, ld, dscale, &bad[r]);
        bad[r] -= 3;
    }

    double el = 0, ed = 0;      /* losses: max |g - c| / max(1, |c|); fp32 dlogits: / dscale */
    int ulp = 0, badrow = 0, pad = 0, edges = 0, same = 1, untouched = 1;
    for (int n = 0; n < N; n++) {
        int isbad = tg[n] < 0 || tg[n] >= V;
        double e = fabs((double)gl[0][n] - lc[n]) / fmax(1.0, fabs(lc[n]));
        if (!(e <= el)) el = e;                                     /* NaN counts */
        if (isbad && fbits(gl[0][n]) != 0) badrow++;
        if (!withd) continue;
        const void *g = (const char *)out[0] + (mis + (size_t)n * ld) * es;
        const void *c = (const char *)dc + (size_t)n * ld * es;
        for (int i = 0; i < V; i++) {
            if (isbad) { if (ebits(g, bf16, i) != 0) badrow++; continue; }
            if (bf16) {
                uint16_t a = ((const uint16_t *)g)[i], b = ((const uint16_t *)c)[i];
                int u = abs(bf16ord(a) - bf16ord(b));
                if (isnan(bf16f(a)) || isnan(bf16f(b))) u = 1 << 20;
                if (u > ulp) ulp = u;
            } else {
                double d = fabs((double)elt(g, 0, i) - elt(c, 0, i)) / fabs(dscale);
                if (!(d <= ed)) ed = d;
            }
        }
        for (int i = V; i < ld; i++) if (ebits(g, bf16, i) != 0) pad++;
    }
    for (int r = 0; r < 2; r++) {
        /* the elements around the rows: as they were (buf), or the NaN fill */
        for (size_t i = 0; i < ne; i++) {
            if (i >= (size_t)mis && i < mis + rows) continue;
            uint32_t want = inplace ? ebits(in[r], bf16, i) : (bf16 ? 0x7fc0u : fbits(NAN));
            if (withd && ebits(out[r], bf16, i) != want) edges++;
            if (ebits(buf[r], bf16, i) != ebits(in[r], bf16, i)) edges++;
        }
        if (!withd) {       /* nothing written: logits as they were, out still NaN */
            if (memcmp(buf[r], in[r], ne * es)) untouched = 0;
            if (!inplace)
                for (size_t i = 0; i < ne; i++)
                    if (ebits(out[r], bf16, i) != (bf16 ? 0x7fc0u : fbits(NAN))) untouched = 0;
        }
    }
    if (memcmp(gl[0], gl[1], N * 4)) same = 0;
    if (withd && memcmp((char *)out[0] + mis * es, (char *)out[1] + mis * es, rows * es)) same = 0;

    snprintf(name, sizeof name, "emu xent %s N=%d V=%d ld=%d%s %s%s bad=%d dscale=%g",
             bf16 ? "bf16" : "fp32", N, V, ld, mis ? " unaligned" : "",
             inplace ? "in-place" : "separate", withd ? "" : " loss-only", nbad, dscale);
    int ok = rc[0] == 0 && rc[1] == 0 && bad[0] == nbad && bad[1] == nbad && cbad == nbad &&
             el < 1e-5 && ed < 1e-6 && ulp <= 1 && badrow == 0 && pad == 0 && edges == 0 &&
             same && untouched;
    ct_check(ok, name, "rc %d %d, dbad +%d +%d (cpu %d, want %d), loss %.3g, fp32 dlogits "
             "%.3g*dscale, bf16 %d ulp, bad-row nonzeros %d, padding nonzeros %d, edges "
             "touched %d, runs same %d, loss-only untouched %d", rc[0], rc[1], bad[0], bad[1],
             cbad, nbad, el, ed, ulp, badrow, pad, edges, same, untouched);
    if (getenv("XENT_VERBOSE"))
        printf("   loss %.3g, fp32 dlogits %.3g*dscale, bf16 %d ulp\n", el, ed, ulp);
    for (int r = 0; r < 2; r++) {
        free(in[r]); free(buf[r]); free(gl[r]);
        if (!inplace) free(out[r]);
    }
    free(tg); free(xf); free(ref); free(lc); free(dc);
}

int main(void)
{
    /* about 0.1 s a block (512 threads started) on a 2-core machine: few rows */
    for (int bf16 = 0; bf16 < 2; bf16++) {
        one(bf16, 3, 1000, 1024, 0, 0, 1, 0, 1.0f / 3); /* padded, 16-byte path */
        one(bf16, 3, 1000, 1024, 0, 1, 1, 2, 1.0f / 3); /* in place, bad targets */
        one(bf16, 3, 257, 384, 0, 1, 1, 1, 1.0f);       /* a 1-column tail */
        one(bf16, 3, 37, 40, 0, 0, 1, 2, 0.2f);         /* V < threads, tail 1 (fp32) / 5 (bf16) */
        one(bf16, 3, 5, 5, 0, 1, 1, 0, 1.0f / 3);       /* scalar: ld % 4 != 0 */
        one(bf16, 3, 1001, 1001, 0, 0, 1, 2, 0.25f);    /* scalar, ld == V */
        one(bf16, 3, 1000, 1004, 0, 1, 1, 0, 0.37f);    /* fp32 vectors, bf16 scalar */
        one(bf16, 3, 1000, 1024, 1, 0, 1, 1, 1.0f);     /* unaligned base: scalar */
        one(bf16, 3, 1000, 1024, 1, 1, 1, 0, 1.0f);
        one(bf16, 3, 1000, 1024, 0, 0, 0, 1, 0.25f);    /* loss only */
        one(bf16, 3, 1000, 1024, 0, 1, 0, 2, 0.25f);
        one(bf16, 4, 5000, 5000, 0, 0, 1, 2, 0.25f);
        one(bf16, 3, 4999, 5056, 0, 1, 1, 1, 1.0f);
        one(bf16, 2, 50257, 50304, 0, 1, 1, 0, 0.5f);  /* GPT-2's head */
        one(bf16, 3, 50257, 50304, 0, 0, 1, 1, 1.0f / 3);
    }
    return ct_summary();
}
