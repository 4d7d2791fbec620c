/*
 * test_grads16.c -- a bf16 run's parameter gradients written by the ops
 * themselves (runtime/ops.c: dweight / dbias / dwte / dwpe bf16): each
 * element must be the f32 op's, rounded once to nearest even (the bits of
 * an fp32 work buffer and a cast after, which is what the precision policy
 * did before). Bit for bit, through the ops on the CPU device, on every
 * bf16 GEMM path of this CPU (portable, AVX512_BF16, AMX: its block
 * scratch, at its own and at tiny blockings), on 1-3 OpenMP threads, at
 * shapes with partial tiles and several K blocks. The embedding's dwte is
 * ACCUMULATED: widen(dwte) + the f32 additions, rounded once. Then what
 * the ops refuse.
 */
#include <omp.h>
#include "ctest.h"
#include "../../kernels/cpu/kernels.h"
#include "../../runtime/ztrain.h"
#include "ops_tensors.h"

/* g (bf16) must hold f (f32) rounded once */
static void rounded(const char *name, zt_tensor *f, zt_tensor *g) {
    size_t n = (size_t)zt_tensor_numel(f);
    float *x = ct_alloc(n * 4);
    uint16_t *want = ct_alloc(n * 2), *got = ct_alloc(n * 2);
    zt_tensor_read(f, x, n * 4);
    zk_cast_f32_bf16(want, x, n);
    zt_tensor_read(g, got, n * 2);
    ct_same_bits(name, want, got, n * 2);
    free(x); free(want); free(got);
}

static void ran(int rc, const char *what) {
    if (rc != 0) ct_fail(what, "%s", zt_last_error());
}

static void release(zt_tensor **t, int n) {
    for (int i = 0; i < n; i++) zt_tensor_release(t[i]);
}

/* the bf16 GEMM's backward (and the GEMM+dGELU op's, which is the same
 * GEMM on the CPU devices): dweight and dbias bf16 beside the f32 ones,
 * dinp f32 (or bf16) the same either way, fused and split */
static void test_matmul(int N, int C, int OC, const char *how) {
    int64_t sx[2] = { N, C }, sw[2] = { OC, C }, so[2] = { N, OC }, sb[1] = { OC };
    float *fx = ct_rand((size_t)N * C, -1, 1), *fw = ct_rand((size_t)OC * C, -0.5f, 0.5f);
    float *fd = ct_rand((size_t)N * OC, -1, 1);
    zt_tensor *x = tensor(ZT_BF16, 2, sx, fx), *w = tensor(ZT_BF16, 2, sw, fw);
    zt_tensor *d = tensor(ZT_BF16, 2, so, fd);
    zt_tensor *di32 = tensor(ZT_F32, 2, sx, NULL), *di16 = tensor(ZT_F32, 2, sx, NULL);
    zt_tensor *dw32 = tensor(ZT_F32, 2, sw, NULL), *db32 = tensor(ZT_F32, 1, sb, NULL);
    zt_tensor *dw16 = tensor(ZT_BF16, 2, sw, NULL), *db16 = tensor(ZT_BF16, 1, sb, NULL);
    zt_tensor *sw16 = tensor(ZT_BF16, 2, sw, NULL), *sb16 = tensor(ZT_BF16, 1, sb, NULL);
    char name[200];
    ran(zt_matmul_bf16_backward(di32, dw32, db32, d, x, w), "matmul_bf16_backward f32 grads");
    ran(zt_matmul_bf16_backward(di16, dw16, db16, d, x, w), "matmul_bf16_backward bf16 grads");
    ran(zt_matmul_bf16_backward(NULL, sw16, sb16, d, x, w), "matmul_bf16_backward W only");
    snprintf(name, sizeof name, "matmul_bf16_backward %dx%dx%d, %s: bf16 dweight = the f32 one "
             "rounded once", N, C, OC, how);
    rounded(name, dw32, dw16);
    snprintf(name, sizeof name, "matmul_bf16_backward %dx%dx%d, %s: bf16 dbias = the f32 one "
             "rounded once", N, C, OC, how);
    rounded(name, db32, db16);
    snprintf(name, sizeof name, "matmul_bf16_backward %dx%dx%d, %s: dinp unchanged beside bf16 "
             "gradients; the W-only pass the fused one's bits", N, C, OC, how);
    same_tensor(name, di32, di16);
    same_tensor(name, dw16, sw16);
    same_tensor(name, db16, sb16);
    /* the GEMM+dGELU op (its weight half is this GEMM's) with bf16 grads */
    if (OC == C) {
        zt_tensor *pre = tensor(ZT_BF16, 2, sx, fx), *o16 = tensor(ZT_BF16, 2, sx, NULL);
        zt_tensor *s32 = tensor(ZT_F32, 2, sx, NULL), *gw = tensor(ZT_BF16, 2, sw, NULL);
        zt_tensor *gb = tensor(ZT_BF16, 1, sb, NULL);
        ran(zt_matmul_bf16_backward_dgelu(o16, gw, gb, d, x, w, pre, s32), "backward_dgelu bf16");
        snprintf(name, sizeof name, "matmul_bf16_backward_dgelu %dx%dx%d, %s: bf16 dweight, dbias "
                 "= the f32 ones rounded once", N, C, OC, how);
        rounded(name, dw32, gw);
        rounded(name, db32, gb);
        zt_tensor *t[] = { pre, o16, s32, gw, gb };
        release(t, 5);
    }
    zt_tensor *t[] = { x, w, d, di32, di16, dw32, db32, dw16, db16, sw16, sb16 };
    release(t, 11);
    free(fx); free(fw); free(fd);
}

/* the norms' weight gradients, on an f32 and a bf16 stream */
static void test_norms(int N, int C) {
    int64_t sx[2] = { N, C }, sc[1] = { C }, sn[1] = { N };
    float *fx = ct_rand((size_t)N * C, -2, 2), *fy = ct_rand((size_t)N * C, -1, 1);
    float *fw = ct_rand(C, 0.5f, 1.5f), *fb = ct_rand(C, -0.5f, 0.5f);
    char name[200];
    for (int r16 = 0; r16 <= 1; r16++) {
        int dt = r16 ? ZT_BF16 : ZT_F32;
        const char *st = r16 ? "bf16 stream" : "f32 stream";
        zt_tensor *x = tensor(dt, 2, sx, fx), *y = tensor(dt, 2, sx, fy);
        zt_tensor *w = tensor(ZT_BF16, 1, sc, fw), *b = tensor(ZT_BF16, 1, sc, fb);
        zt_tensor *o = tensor(dt, 2, sx, NULL), *m = tensor(ZT_F32, 1, sn, NULL);
        zt_tensor *r = tensor(ZT_F32, 1, sn, NULL);
        zt_tensor *di[2] = { tensor(dt, 2, sx, NULL), tensor(dt, 2, sx, NULL) };
        zt_tensor *dw32 = tensor(ZT_F32, 1, sc, NULL), *db32 = tensor(ZT_F32, 1, sc, NULL);
        zt_tensor *dw16 = tensor(ZT_BF16, 1, sc, NULL), *db16 = tensor(ZT_BF16, 1, sc, NULL);
        ran(zt_layernorm_forward(o, m, r, x, w, b), "layernorm forward");
        ran(zt_layernorm_backward(di[0], dw32, db32, y, x, w, m, r), "layernorm backward f32");
        ran(zt_layernorm_backward(di[1], dw16, db16, y, x, w, m, r), "layernorm backward bf16");
        snprintf(name, sizeof name, "layernorm backward %dx%d, %s: bf16 dweight, dbias = the "
                 "f32 ones rounded once; dinp unchanged", N, C, st);
        rounded(name, dw32, dw16);
        rounded(name, db32, db16);
        same_tensor(name, di[0], di[1]);
        ran(zt_layernorm_backward(NULL, dw16, db16, y, x, dw16, m, r), "layernorm W only bf16");
        snprintf(name, sizeof name, "layernorm backward %dx%d, %s: the W-only pass, its bf16 "
                 "gradient standing in for the weight", N, C, st);
        rounded(name, dw32, dw16);
        ran(zt_rmsnorm_forward(o, r, x, w, 1e-5f), "rmsnorm forward");
        ran(zt_rmsnorm_backward(di[0], dw32, y, x, w, r), "rmsnorm backward f32");
        ran(zt_rmsnorm_backward(di[1], dw16, y, x, w, r), "rmsnorm backward bf16");
        snprintf(name, sizeof name, "rmsnorm backward %dx%d, %s: bf16 dweight = the f32 one "
                 "rounded once; dinp unchanged", N, C, st);
        rounded(name, dw32, dw16);
        same_tensor(name, di[0], di[1]);
        zt_tensor *t[] = { x, y, w, b, o, m, r, di[0], di[1], dw32, db32, dw16, db16 };
        release(t, 13);
    }
    free(fx); free(fy); free(fw); free(fb);
}

/* the embedding: dwte ACCUMULATED onto what it holds (repeated tokens,
 * rows never touched), dwpe written; dout f32 and bf16 */
static void test_encoder(int B, int T, int C, int V, int maxT) {
    int64_t st[2] = { B, T }, se[2] = { V, C }, sp[2] = { maxT, C }, sd[3] = { B, T, C };
    int32_t *tok = ct_alloc((size_t)B * T * 4);
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(ct_u64() % (uint64_t)(V / 3 + 1));
    zt_tensor *tokens = NULL;
    if (zt_tensor_new(&tokens, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_I32, 2, st) != 0) abort();
    zt_tensor_write(tokens, tok, (size_t)B * T * 4);
    float *fe = ct_rand((size_t)V * C, -0.1f, 0.1f), *fp = ct_rand((size_t)maxT * C, -1, 1);
    float *fd = ct_rand((size_t)B * T * C, -1, 1);
    /* dwte starts on the bf16 grid: its f32 image holds the same values */
    uint16_t *h = ct_alloc((size_t)V * C * 2);
    zk_cast_f32_bf16(h, fe, (size_t)V * C);
    zk_cast_bf16_f32(fe, h, (size_t)V * C);
    free(h);
    char name[200];
    for (int d16 = 0; d16 <= 1; d16++) {
        zt_tensor *d = tensor(d16 ? ZT_BF16 : ZT_F32, 3, sd, fd);
        zt_tensor *e32 = tensor(ZT_F32, 2, se, fe), *p32 = tensor(ZT_F32, 2, sp, fp);
        zt_tensor *e16 = tensor(ZT_BF16, 2, se, fe), *p16 = tensor(ZT_BF16, 2, sp, fp);
        ran(zt_encoder_backward(e32, p32, d, tokens), "encoder backward f32");
        ran(zt_encoder_backward(e16, p16, d, tokens), "encoder backward bf16");
        snprintf(name, sizeof name, "encoder backward B=%d T=%d C=%d V=%d, %s dout: bf16 dwte = "
                 "round(widen(dwte) + the f32 additions), dwpe rounded once", B, T, C, V,
                 d16 ? "bf16" : "f32");
        rounded(name, e32, e16);
        /* rows [T, maxT) of dwpe are not written: they keep their bits */
        rounded(name, p32, p16);
        zt_tensor *t[] = { d, e32, p32, e16, p16 };
        release(t, 5);
    }
    zt_tensor_release(tokens);
    free(tok); free(fe); free(fp); free(fd);
}

static void test_refusals(void) {
    int64_t sx[2] = { 4, 8 }, sw[2] = { 6, 8 }, so[2] = { 4, 6 }, sb[1] = { 6 };
    zt_tensor *x = tensor(ZT_BF16, 2, sx, NULL), *w = tensor(ZT_BF16, 2, sw, NULL);
    zt_tensor *d = tensor(ZT_BF16, 2, so, NULL), *dw16 = tensor(ZT_BF16, 2, sw, NULL);
    zt_tensor *db32 = tensor(ZT_F32, 1, sb, NULL), *dw_h = tensor(ZT_F16, 2, sw, NULL);
    ct_check(refused(zt_matmul_bf16_backward(NULL, dw16, db32, d, x, w), "one dtype"),
             "matmul_bf16_backward refuses a bf16 dweight beside an f32 dbias", "%s",
             zt_last_error());
    ct_check(refused(zt_matmul_bf16_backward(NULL, dw_h, NULL, d, x, w), "dweight"),
             "matmul_bf16_backward refuses an f16 dweight, naming it", "%s", zt_last_error());
    int64_t big[2] = { 1, 16385 }, sc[1] = { 16385 }, s1[1] = { 1 };
    zt_tensor *xb = tensor(ZT_F32, 2, big, NULL), *wb = tensor(ZT_F32, 1, sc, NULL);
    zt_tensor *gb = tensor(ZT_BF16, 1, sc, NULL), *r = tensor(ZT_F32, 1, s1, NULL);
    ct_check(refused(zt_rmsnorm_backward(NULL, gb, xb, xb, wb, r), "16384"),
             "rmsnorm backward refuses a bf16 dweight past 16384 channels, naming the bound",
             "%s", zt_last_error());
    zt_tensor *t[] = { x, w, d, dw16, db32, dw_h, xb, wb, gb, r };
    release(t, 10);
}

int main(void) {
    ct_seed(32);
    static const char *path_name[3] = { "portable", "AVX512_BF16", "AMX" };
    int had = zk_bf16_simd(-1);
    for (int want = 0; want <= 2; want++) {
        int path = zk_bf16_simd(want);
        if (path != want) continue;          /* this CPU lacks it */
        for (int th = 1; th <= 3; th++) {
            omp_set_num_threads(th);
            char how[80];
            snprintf(how, sizeof how, "%s, %d thread%s", path_name[path], th, th > 1 ? "s" : "");
            test_matmul(5, 40, 24, how);
            test_matmul(67, 64, 64, how);           /* the dGELU op too */
            if (path == 0 && th > 1) continue;      /* the portable path is slow */
            test_matmul(300, 800, 200, how);        /* several K blocks, tasks, partial tiles */
        }
        omp_set_num_threads(2);
        if (path == 2 && zk_amx_set_blocking(32, 32, 32) == 0) {   /* many tiny blocks */
            test_matmul(300, 800, 200, "AMX, 32x32x32 blocks, 2 threads");
            zk_amx_set_blocking(0, 0, 0);
        }
    }
    zk_bf16_simd(had);
    test_norms(5, 7);
    test_norms(67, 768);
    test_encoder(2, 9, 70, 50, 12);
    test_encoder(4, 64, 256, 97, 64);     /* parallel: B T C >= 65536 */
    test_refusals();
    return ct_summary();
}
