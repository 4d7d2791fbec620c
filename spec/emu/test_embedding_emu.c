/*
 * test_embedding_emu.c -- kernels/cuda/embedding.cu's backward run on the
 * CPU under spec/emu/cuda_emu.h, against the CPU twin zk_encoder_backward:
 * dwte ACCUMULATED onto random values, each row summing its occurrences in
 * (b,t) order one fp32 add at a time, so the same bits; dwpe rows [0,T)
 * WRITTEN (the sum over b in order: the same bits), rows [T,maxT) left
 * alone; ids outside [0,V) counted once each into *dbad (added to) and
 * added to no row. Shapes: C off the 64-column unit, one id repeated
 * thousands of times across the kernel's 2048-entry list flushes (its long
 * run path), runs crossing the 16-entry windows, ids 0 and V-1, GPT-2's
 * V = 50257 (256 blocks) with few positions, all ids bad; and a second run
 * gives the same bits. The bf16 residual stream's variants too: the
 * forward's bf16 out (the fp32 kernel's rounded once, the CPU twin's bits)
 * and the backward from a bf16 dout (the fp32 kernel's bits on it widened,
 * the CPU twin's). A bf16 run's gradients (zkc_encoder_backward_g16: dwte
 * and dwpe bf16, dout fp32 or bf16): the fp32 kernel's on the widened
 * dwte rounded once, and the CPU twin's (zk_encoder_backward_g16), bit for
 * bit -- ids spread, in runs, one id over several flushes (its fp32 row
 * carried in the scratch), a block's ids in ranges beside a giant one.
 * Run: sh tools/emu_kernel.sh embedding.
 */
#include <limits.h>
#include <string.h>
#include "ctest.h"
#include "kernels.h"

int zkc_encoder_backward(void *s, float *dwte, float *dwpe, const float *dout,
                         const int32_t *tok, int B, int T, int C, int V, int *dbad);
int zkc_encoder_forward(void *s, float *out, const int32_t *tok, const void *wte,
                        const void *wpe, int w16, int B, int T, int C, int V, int *dbad);
int zkc_encoder_forward_o16(void *s, uint16_t *out, const int32_t *tok, const void *wte,
                            const void *wpe, int w16, int B, int T, int C, int V, int *dbad);
int zkc_encoder_backward_b16(void *s, float *dwte, float *dwpe, const uint16_t *dout,
                             const int32_t *tok, int B, int T, int C, int V, int *dbad);
int zkc_encoder_backward_g16(void *s, uint16_t *dwte, uint16_t *dwpe, const void *dout, int d16,
                             const int32_t *tok, int B, int T, int C, int V, int *dbad,
                             float *scratch);
size_t zkc_encoder_backward_g16_scratch(int C, int V);

/* no positions (Llama's embedding: wpe and dwpe NULL): the forward's rows
 * are wte's (zeros for bad ids), the backward's dwte the CPU's bits */
static void no_positions(void)
{
    int B = 3, T = 11, C = 40, V = 50, N = B * T;
    int32_t *tok = malloc((size_t)N * 4);
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(ct_u64() % (uint64_t)V);
    tok[4] = -3;
    float *wte = ct_rand((size_t)V * C, -2, 2), *dout = ct_rand((size_t)N * C, -1, 1);
    float *want = malloc((size_t)N * C * 4), *got = malloc((size_t)N * C * 4);
    int cbad = zk_encoder_forward(want, tok, wte, NULL, B, T, C, V), dbad = 0;
    int rc = zkc_encoder_forward(NULL, got, tok, wte, NULL, 0, B, T, C, V, &dbad);
    int rows = 1;
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++)
            rows &= want[(size_t)i * C + c] == (i == 4 ? 0.0f : wte[(size_t)tok[i] * C + c]);
    ct_check(rc == 0 && rows && cbad == 1 && dbad == 1 && !memcmp(got, want, (size_t)N * C * 4),
             "emu encoder forward without wpe: wte's rows (zeros for a bad id), the CPU's bits",
             "rc %d, rows %d, bad %d/%d", rc, rows, cbad, dbad);
    float *w1 = ct_rand((size_t)V * C, -1, 1), *w2 = malloc((size_t)V * C * 4);
    memcpy(w2, w1, (size_t)V * C * 4);
    zk_encoder_backward(w1, NULL, dout, tok, B, T, C, V);
    rc = zkc_encoder_backward(NULL, w2, NULL, dout, tok, B, T, C, V, &dbad);
    ct_check(rc == 0 && !memcmp(w1, w2, (size_t)V * C * 4),
             "emu encoder backward without dwpe: dwte the CPU's bits", "rc %d", rc);
    free(tok); free(wte); free(dout); free(want); free(got); free(w1); free(w2);
}

/* bf16 tables (a bf16 run's stored wte and wpe): the CPU's bf16 twin's
 * bits, which are the fp32 kernel's on the widened tables; with and
 * without positions, a bad id among them */
static void bf16_tables(void)
{
    int B = 2, T = 9, C = 48, V = 37, N = B * T;
    int32_t *tok = malloc((size_t)N * 4);
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(ct_u64() % (uint64_t)V);
    tok[5] = V;
    float *wte = ct_rand((size_t)V * C, -2, 2), *wpe = ct_rand((size_t)T * C, -1, 1);
    uint16_t *te = malloc((size_t)V * C * 2), *pe = malloc((size_t)T * C * 2);
    float *wtw = malloc((size_t)V * C * 4), *wpw = malloc((size_t)T * C * 4);
    zk_cast_f32_bf16(te, wte, (size_t)V * C); zk_cast_bf16_f32(wtw, te, (size_t)V * C);
    zk_cast_f32_bf16(pe, wpe, (size_t)T * C); zk_cast_bf16_f32(wpw, pe, (size_t)T * C);
    float *want = malloc((size_t)N * C * 4), *cpu = malloc((size_t)N * C * 4), *got = malloc((size_t)N * C * 4);
    for (int pos = 0; pos <= 1; pos++) {
        int wbad = zk_encoder_forward(want, tok, wtw, pos ? wpw : NULL, B, T, C, V);
        int cbad = zk_encoder_forward_b16(cpu, tok, te, pos ? pe : NULL, B, T, C, V), dbad = 0;
        int rc = zkc_encoder_forward(NULL, got, tok, te, pos ? pe : NULL, 1, B, T, C, V, &dbad);
        char name[128];
        snprintf(name, sizeof name, "emu encoder forward from bf16 tables%s: the fp32 kernel's bits on them "
                 "widened (CPU twin and kernel)", pos ? " with positions" : "");
        ct_check(rc == 0 && wbad == 1 && cbad == 1 && dbad == 1 && !memcmp(cpu, want, (size_t)N * C * 4) &&
                 !memcmp(got, want, (size_t)N * C * 4), name, "rc %d, bad %d/%d/%d, cpu %s, kernel %s", rc,
                 wbad, cbad, dbad, memcmp(cpu, want, (size_t)N * C * 4) ? "differs" : "same",
                 memcmp(got, want, (size_t)N * C * 4) ? "differs" : "same");
    }
    free(tok); free(wte); free(wpe); free(te); free(pe); free(wtw); free(wpw); free(want); free(cpu); free(got);
}

enum { ID_UNIFORM, ID_ONE, ID_HEAVY, ID_RUNS, ID_BAD };

/* ids of one kind, with 0, V-1 and bad ids (-1, V, INT_MIN, INT_MAX) placed
 * when nbad > 0; returns how many are bad */
static int make_ids(int32_t *tok, int N, int V, int kind, int nbad)
{
    for (int i = 0; i < N; i++) {
        uint64_t u = ct_u64();
        switch (kind) {
        case ID_UNIFORM: tok[i] = (int32_t)(u % (uint64_t)V); break;
        case ID_ONE: tok[i] = V / 2; break;
        case ID_HEAVY:      /* 60% one id, 20% a few, the rest anywhere */
            tok[i] = u % 10 < 6 ? 7 % V : u % 10 < 8 ? (int32_t)((u >> 8) % 5) : (int32_t)((u >> 8) % (uint64_t)V);
            break;
        case ID_RUNS:       /* 12 ids, skewed: runs of ~1 to ~150 */
            tok[i] = (int32_t)(((u % 12) * (u % 12) * 37) % (uint64_t)V);
            break;
        case ID_BAD: tok[i] = (int32_t)(u % 2 ? -1 - (int32_t)(u % 1000) : V + (int32_t)(u % 1000)); break;
        }
    }
    if (kind == ID_BAD) return N;
    if (N > 2) { tok[0] = 0; tok[N - 1] = V - 1; tok[N / 2] = V - 1; }
    int bad = 0;
    const int32_t bads[4] = { -1, V, INT_MIN, INT_MAX };
    for (int k = 0; k < nbad && N > 3; k++) { tok[1 + (int)(ct_u64() % (uint64_t)(N - 2))] = bads[k % 4]; }
    for (int i = 0; i < N; i++) bad += tok[i] < 0 || tok[i] >= V;
    return bad;
}

static void one(const char *what, int B, int T, int C, int V, int kind, int nbad, int twice)
{
    char name[200];
    int N = B * T, maxT = T + 3;
    int32_t *tok = malloc((size_t)N * 4);
    int bad = make_ids(tok, N, V, kind, nbad);
    float *dout = ct_rand((size_t)N * C, -1, 1);
    float *w0 = ct_rand((size_t)V * C, -2, 2);                /* ACCUMULATED onto */
    float *want = malloc((size_t)V * C * 4), *got = malloc((size_t)V * C * 4);
    float *pwant = malloc((size_t)maxT * C * 4), *pgot = malloc((size_t)maxT * C * 4);
    memcpy(want, w0, (size_t)V * C * 4);
    memcpy(got, w0, (size_t)V * C * 4);
    for (size_t i = 0; i < (size_t)maxT * C; i++) pwant[i] = pgot[i] = -7.25f;   /* rows >= T: kept */
    int cbad = zk_encoder_backward(want, pwant, dout, tok, B, T, C, V);
    int dbad = 5;                                              /* added to */
    int rc = zkc_encoder_backward(NULL, got, pgot, dout, tok, B, T, C, V, &dbad);
    snprintf(name, sizeof name, "emu encoder backward %s B=%d T=%d C=%d V=%d: dwte the CPU's bits",
             what, B, T, C, V);
    size_t nd = 0, first = 0;
    for (size_t i = (size_t)V * C; i-- > 0;)
        if (memcmp(&got[i], &want[i], 4)) { nd++; first = i; }
    ct_check(rc == 0 && nd == 0, name, "rc %d, %zu elements differ, first row %zu col %zu: %.9g vs %.9g",
             rc, nd, first / C, first % C, nd ? got[first] : 0.0, nd ? want[first] : 0.0);
    snprintf(name, sizeof name, "emu encoder backward %s: %d bad ids counted once each, added to *dbad",
             what, bad);
    ct_check(cbad == bad && dbad == 5 + bad, name, "cpu %d, gpu %d (want %d)", cbad, dbad - 5, bad);
    snprintf(name, sizeof name, "emu encoder backward %s: dwpe rows [0,T) the CPU's bits, rows [T,maxT) untouched",
             what);
    int prow = memcmp(pgot, pwant, (size_t)T * C * 4) != 0, ptail = 0;
    for (size_t i = (size_t)T * C; i < (size_t)maxT * C; i++) ptail += pgot[i] != -7.25f;
    ct_check(prow == 0 && ptail == 0, name, "rows [0,T) %s, %d tail elements changed", prow ? "differ" : "same",
             ptail);
    if (twice) {
        float *again = malloc((size_t)V * C * 4);
        memcpy(again, w0, (size_t)V * C * 4);
        dbad = 0;
        rc = zkc_encoder_backward(NULL, again, pgot, dout, tok, B, T, C, V, &dbad);
        snprintf(name, sizeof name, "emu encoder backward %s: run twice, the same bits", what);
        ct_check(rc == 0 && dbad == bad && !memcmp(again, got, (size_t)V * C * 4), name, "differ");
        free(again);
    }
    free(tok); free(dout); free(w0); free(want); free(got); free(pwant); free(pgot);
}

/* the bf16 residual stream's first rows: a bf16 out (zkc_encoder_forward_o16),
 * from fp32 or bf16 tables, with and without positions, two bad ids among
 * the tokens: each element the fp32 kernel's rounded once, and the CPU
 * twin's (zk_encoder_forward_o16) bits */
static void forward_o16(int B, int T, int C, int V)
{
    char name[200];
    int N = B * T;
    size_t nc = (size_t)N * C;
    int32_t *tok = malloc((size_t)N * 4);
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(ct_u64() % (uint64_t)V);
    tok[1] = V; tok[N - 1] = -3;
    float *wte = ct_rand((size_t)V * C, -2, 2), *wpe = ct_rand((size_t)T * C, -1, 1);
    uint16_t *te = malloc((size_t)V * C * 2), *pe = malloc((size_t)T * C * 2);
    zk_cast_f32_bf16(te, wte, (size_t)V * C); zk_cast_f32_bf16(pe, wpe, (size_t)T * C);
    float *f32 = malloc(nc * 4);
    uint16_t *got = malloc(nc * 2), *rounded = malloc(nc * 2), *cpu = malloc(nc * 2);
    for (int k = 0; k < 4; k++) {
        int w16 = k & 1, pos = k >> 1, dbad = 0, fbad = 0;
        const void *tt = w16 ? (const void *)te : (const void *)wte;
        const void *pp = !pos ? NULL : w16 ? (const void *)pe : (const void *)wpe;
        for (size_t i = 0; i < nc; i++) got[i] = 0x7fc1;
        int rc = zkc_encoder_forward_o16(NULL, got, tok, tt, pp, w16, B, T, C, V, &dbad);
        int rc2 = zkc_encoder_forward(NULL, f32, tok, tt, pp, w16, B, T, C, V, &fbad);
        zk_cast_f32_bf16(rounded, f32, nc);
        snprintf(name, sizeof name, "emu encoder forward o16 B=%d T=%d C=%d, %s tables%s: the fp32 kernel's "
                 "out rounded once, 2 bad ids counted", B, T, C, w16 ? "bf16" : "fp32",
                 pos ? " with positions" : ", no positions");
        ct_check(rc == 0 && rc2 == 0 && dbad == 2 && fbad == 2 && !memcmp(got, rounded, nc * 2), name,
                 "rc %d/%d, bad %d/%d, out %s", rc, rc2, dbad, fbad,
                 memcmp(got, rounded, nc * 2) ? "differs" : "same");
        int cbad = zk_encoder_forward_o16(cpu, tok, tt, pp, w16, B, T, C, V);
        snprintf(name, sizeof name, "emu encoder forward o16 B=%d T=%d C=%d, %s tables%s: the CPU twin's bits",
                 B, T, C, w16 ? "bf16" : "fp32", pos ? " with positions" : ", no positions");
        ct_check(cbad == 2 && !memcmp(got, cpu, nc * 2), name, "cpu bad %d, out %s", cbad,
                 memcmp(got, cpu, nc * 2) ? "differs" : "same");
    }
    free(tok); free(wte); free(wpe); free(te); free(pe); free(f32); free(got); free(rounded); free(cpu);
}

/* the backward from a bf16 dout (zkc_encoder_backward_b16, the residual
 * stream's gradient), each element widened exactly as loaded: dwte
 * (ACCUMULATED onto random values) and dwpe rows [0,T) (WRITTEN; rows
 * [T,maxT) left alone) the fp32 kernel's bits on the widened dout, and the
 * CPU twin's (zk_encoder_backward_b16); bad ids counted once each. pos 0:
 * no dwpe (Llama's). */
static void backward_b16(const char *what, int B, int T, int C, int V, int kind, int nbad, int pos)
{
    char name[220];
    int N = B * T, maxT = T + 3;
    size_t nc = (size_t)N * C, vc = (size_t)V * C, tc = (size_t)maxT * C;
    int32_t *tok = malloc((size_t)N * 4);
    int bad = make_ids(tok, N, V, kind, nbad);
    float *df = ct_rand(nc, -1, 1), *dw = malloc(nc * 4), *w0 = ct_rand(vc, -2, 2);
    uint16_t *d16 = malloc(nc * 2);
    zk_cast_f32_bf16(d16, df, nc); zk_cast_bf16_f32(dw, d16, nc);      /* dw: dout widened */
    float *got = malloc(vc * 4), *ref = malloc(vc * 4), *cpu = malloc(vc * 4);
    float *pgot = malloc(tc * 4), *pref = malloc(tc * 4), *pcpu = malloc(tc * 4);
    memcpy(got, w0, vc * 4); memcpy(ref, w0, vc * 4); memcpy(cpu, w0, vc * 4);
    for (size_t i = 0; i < tc; i++) pgot[i] = pref[i] = pcpu[i] = -7.25f;   /* rows >= T: kept */
    int dbad = 5, fbad = 0;                                                /* added to */
    int rc = zkc_encoder_backward_b16(NULL, got, pos ? pgot : NULL, d16, tok, B, T, C, V, &dbad);
    int rc2 = zkc_encoder_backward(NULL, ref, pos ? pref : NULL, dw, tok, B, T, C, V, &fbad);
    int cbad = zk_encoder_backward_b16(cpu, pos ? pcpu : NULL, d16, tok, B, T, C, V);
    size_t nd = 0, first = 0;
    for (size_t i = vc; i-- > 0;)
        if (memcmp(&got[i], &ref[i], 4)) { nd++; first = i; }
    snprintf(name, sizeof name, "emu encoder backward b16 %s B=%d T=%d C=%d V=%d: dwte the fp32 kernel's "
             "bits on the widened dout", what, B, T, C, V);
    ct_check(rc == 0 && rc2 == 0 && nd == 0, name, "rc %d/%d, %zu elements differ, first row %zu col %zu: "
             "%.9g vs %.9g", rc, rc2, nd, first / C, first % C, nd ? got[first] : 0.0, nd ? ref[first] : 0.0);
    snprintf(name, sizeof name, "emu encoder backward b16 %s: dwte the CPU twin's bits", what);
    ct_check(!memcmp(got, cpu, vc * 4), name, "differ");
    snprintf(name, sizeof name, "emu encoder backward b16 %s: %d bad ids counted once each, added to *dbad",
             what, bad);
    ct_check(cbad == bad && fbad == bad && dbad == 5 + bad, name, "cpu %d, fp32 kernel %d, b16 kernel %d "
             "(want %d)", cbad, fbad, dbad - 5, bad);
    if (pos) {
        int pf = memcmp(pgot, pref, (size_t)T * C * 4) != 0, pc = memcmp(pgot, pcpu, (size_t)T * C * 4) != 0;
        int ptail = 0;
        for (size_t i = (size_t)T * C; i < tc; i++) ptail += pgot[i] != -7.25f;
        snprintf(name, sizeof name, "emu encoder backward b16 %s: dwpe rows [0,T) the fp32 kernel's and the "
                 "CPU twin's bits, rows [T,maxT) untouched", what);
        ct_check(!pf && !pc && ptail == 0, name, "fp32 kernel %s, cpu %s, %d tail elements changed",
                 pf ? "differs" : "same", pc ? "differs" : "same", ptail);
    }
    free(tok); free(df); free(dw); free(w0); free(d16); free(got); free(ref); free(cpu);
    free(pgot); free(pref); free(pcpu);
}

/* the backward into bf16 dwte (ACCUMULATED onto random bf16 values) and
 * dwpe (rows [0,T) WRITTEN, the rest left alone), dout fp32 or (d16)
 * bf16: the fp32 kernel's dwte and dwpe on the widened values, rounded
 * once (zk_cast_f32_bf16), and the CPU twin zk_encoder_backward_g16's
 * bits; bad ids counted once each, added to *dbad; a second run from the
 * same values, the same bits. pos 0: no dwpe. */
static void backward_g16(const char *what, int B, int T, int C, int V, int kind, int nbad, int pos,
                         int d16)
{
    char name[240];
    int N = B * T, maxT = T + 3;
    size_t nc = (size_t)N * C, vc = (size_t)V * C, tc = (size_t)maxT * C;
    int32_t *tok = malloc((size_t)N * 4);
    int bad = make_ids(tok, N, V, kind, nbad);
    float *df = ct_rand(nc, -1, 1), *dw = malloc(nc * 4);
    uint16_t *d16v = malloc(nc * 2);
    zk_cast_f32_bf16(d16v, df, nc); zk_cast_bf16_f32(dw, d16v, nc);    /* bf16 values either way */
    const void *dout = d16 ? (const void *)d16v : (const void *)dw;
    float *w0 = ct_rand(vc, -2, 2), *p0 = ct_rand(tc, -2, 2);
    uint16_t *te = malloc(vc * 2), *pe = malloc(tc * 2);
    zk_cast_f32_bf16(te, w0, vc); zk_cast_bf16_f32(w0, te, vc);        /* w0: te widened */
    zk_cast_f32_bf16(pe, p0, tc); zk_cast_bf16_f32(p0, pe, tc);
    uint16_t *got = malloc(vc * 2), *pgot = malloc(tc * 2), *cpu = malloc(vc * 2), *pcpu = malloc(tc * 2);
    uint16_t *again = malloc(vc * 2), *want = malloc(vc * 2), *pwant = malloc(tc * 2);
    memcpy(got, te, vc * 2); memcpy(pgot, pe, tc * 2); memcpy(cpu, te, vc * 2); memcpy(pcpu, pe, tc * 2);
    memcpy(again, te, vc * 2);
    size_t ns = zkc_encoder_backward_g16_scratch(C, V);
    float *scratch = malloc((ns ? ns : 1) * 4);
    for (size_t i = 0; i < ns; i++) scratch[i] = NAN;
    int dbad = 5, fbad = 0, abad = 0;                                   /* added to */
    int rc = zkc_encoder_backward_g16(NULL, got, pos ? pgot : NULL, dout, d16, tok, B, T, C, V, &dbad,
                                      scratch);
    int rc2 = zkc_encoder_backward(NULL, w0, pos ? p0 : NULL, dw, tok, B, T, C, V, &fbad);
    int cbad = zk_encoder_backward_g16(cpu, pos ? pcpu : NULL, dout, d16, tok, B, T, C, V);
    zk_cast_f32_bf16(want, w0, vc); zk_cast_f32_bf16(pwant, p0, tc);
    size_t nd = 0, first = 0;
    for (size_t i = vc; i-- > 0;)
        if (got[i] != want[i]) { nd++; first = i; }
    snprintf(name, sizeof name, "emu encoder backward g16 %s %s dout B=%d T=%d C=%d V=%d: dwte the fp32 "
             "kernel's on the widened dwte, rounded once", what, d16 ? "bf16" : "fp32", B, T, C, V);
    ct_check(rc == 0 && rc2 == 0 && nd == 0, name, "rc %d/%d, %zu elements differ, first row %zu col %zu: "
             "%04x vs %04x", rc, rc2, nd, first / C, first % C, nd ? got[first] : 0, nd ? want[first] : 0);
    snprintf(name, sizeof name, "emu encoder backward g16 %s: dwte%s the CPU twin's bits", what,
             pos ? ", dwpe" : "");
    ct_check(!memcmp(got, cpu, vc * 2) && !memcmp(pgot, pcpu, tc * 2), name, "dwte %s, dwpe %s",
             memcmp(got, cpu, vc * 2) ? "differs" : "same", memcmp(pgot, pcpu, tc * 2) ? "differs" : "same");
    snprintf(name, sizeof name, "emu encoder backward g16 %s: %s", what,
             pos ? "dwpe rows [0,T) the fp32 kernel's rounded once, rows [T,maxT) untouched"
                 : "no dwpe: nothing else written");
    ct_check(!memcmp(pgot, pos ? pwant : pe, tc * 2), name, "differ");
    snprintf(name, sizeof name, "emu encoder backward g16 %s: %d bad ids counted once each, added to *dbad",
             what, bad);
    ct_check(cbad == bad && fbad == bad && dbad == 5 + bad, name, "cpu %d, fp32 kernel %d, g16 kernel %d "
             "(want %d)", cbad, fbad, dbad - 5, bad);
    for (size_t i = 0; i < ns; i++) scratch[i] = NAN;
    rc = zkc_encoder_backward_g16(NULL, again, NULL, dout, d16, tok, B, T, C, V, &abad, scratch);
    snprintf(name, sizeof name, "emu encoder backward g16 %s: run twice, the same bits", what);
    ct_check(rc == 0 && abad == bad && !memcmp(again, got, vc * 2), name, "differ");
    free(tok); free(df); free(dw); free(d16v); free(w0); free(p0); free(te); free(pe); free(got);
    free(pgot); free(cpu); free(pcpu); free(again); free(want); free(pwant); free(scratch);
}

int main(void)
{
    ct_seed(17);
    bf16_tables();
    one("uniform ids", 10, 30, 100, 500, ID_UNIFORM, 4, 1);       /* 2 blocks, C off 64 */
    one("skewed runs", 20, 30, 130, 300, ID_RUNS, 2, 1);          /* runs across windows */
    one("one id 5000 times", 250, 20, 70, 3, ID_ONE, 0, 0);       /* 1 block, 3 flushes */
    one("60% one id", 250, 20, 130, 700, ID_HEAVY, 3, 1);         /* 4 blocks, long runs */
    one("GPT-2 vocabulary", 10, 4, 64, 50257, ID_UNIFORM, 4, 0);  /* 256 blocks */
    one("all ids bad", 4, 16, 40, 100, ID_BAD, 0, 0);
    no_positions();
    forward_o16(3, 37, 97, 50);                                   /* C off 64, bad ids */
    backward_b16("uniform ids", 3, 37, 97, 50, ID_UNIFORM, 2, 1); /* 2 units a row, the second 33 columns */
    backward_b16("skewed runs", 8, 30, 70, 300, ID_RUNS, 2, 1);   /* 2 blocks, runs past a window */
    backward_b16("one id 2400 times", 40, 60, 40, 3, ID_ONE, 0, 0);   /* long runs, 2 flushes, no dwpe */
    for (int d16 = 0; d16 <= 1; d16++) {
        backward_g16("uniform ids", 3, 37, 97, 50, ID_UNIFORM, 2, 1, d16);    /* C off 64 */
        backward_g16("skewed runs", 8, 30, 70, 300, ID_RUNS, 2, 1, d16);      /* 2 blocks */
        backward_g16("one id 5000 times", 250, 20, 70, 3, ID_ONE, 0, 1, d16); /* 3 flushes carried */
        /* 4 blocks; block 3: id 7 60% (a range alone, 2 flushes) beside ranges of the rest */
        backward_g16("60% one id", 250, 20, 130, 700, ID_HEAVY, 3, 0, d16);
        /* one block: 5000 positions over 200 ids, ranges of keys */
        backward_g16("one block, 200 ids", 50, 100, 40, 200, ID_UNIFORM, 1, 1, d16);
    }
    backward_g16("GPT-2 vocabulary", 10, 4, 64, 50257, ID_UNIFORM, 4, 1, 0);  /* 256 blocks */
    backward_g16("all ids bad", 4, 16, 40, 100, ID_BAD, 0, 1, 0);
    return ct_summary();
}
