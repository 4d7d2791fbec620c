/*
 * test_stream16.c -- the bf16 residual stream's CPU kernels (kernels.h,
 * "_r16", zk_add3_b16, zk_encoder_forward_o16, zk_encoder_backward_b16)
 * against the f32 kernels they are defined by: each is the f32 kernel on
 * the widened bf16 values, its bf16 outputs rounded once. Bit for bit, on
 * 1, 2 and 3 OpenMP threads, at widths that are and are not multiples of
 * the kernels' lanes, and the split backward's parts apart. Then the ops
 * (runtime/ops.c): what each refuses, naming the operand, the MLP's
 * GEMM+GELU ops on the CPU device (the bits of the two ops apart), and the
 * ops reading a bf16 run's stored parameters (the widened ones' bits).
 */
#include "ctest.h"
#include "../../kernels/cpu/kernels.h"
#include "../../runtime/ztrain.h"
#include "ops_tensors.h"

/* n random values already on the bf16 grid: bf16 bits, and their widening */
static uint16_t *rand16(size_t n, float lo, float hi, float **wide) {
    float *x = ct_rand(n, lo, hi);
    uint16_t *h = ct_alloc(n * 2);
    zk_cast_f32_bf16(h, x, n);
    zk_cast_bf16_f32(x, h, n);
    *wide = x;
    return h;
}

static uint16_t *round16(const float *x, size_t n) {
    uint16_t *h = ct_alloc(n * 2);
    zk_cast_f32_bf16(h, x, n);
    return h;
}

static void test_add3(size_t n) {
    float *wa, *wb;
    uint16_t *a = rand16(n, -3, 3, &wa), *b = rand16(n, -3, 3, &wb);
    float *sum = ct_alloc(n * 4);
    zk_add3(sum, wa, wb, n);
    uint16_t *want = round16(sum, n), *got = ct_alloc(n * 2);
    char name[120];
    for (int t = 1; t <= 3; t++) {
        omp_set_num_threads(t);
        memset(got, 0xff, n * 2);
        zk_add3_b16(got, a, b, n);
        snprintf(name, sizeof name, "add3 bf16 n=%zu on %d threads: the f32 add's sum rounded once",
                 n, t);
        ct_same_bits(name, got, want, n * 2);
    }
    memcpy(got, a, n * 2);
    zk_add3_b16(got, got, b, n);               /* out aliases a: the stream's in-place add */
    snprintf(name, sizeof name, "add3 bf16 n=%zu in place (out = a)", n);
    ct_same_bits(name, got, want, n * 2);
    omp_set_num_threads(2);
    free(wa); free(wb); free(a); free(b); free(sum); free(want); free(got);
}

static void test_layernorm(int N, int C) {
    size_t nc = (size_t)N * C;
    float *wx, *wa, *wb;
    uint16_t *x = rand16(nc, -2, 2, &wx), *a = rand16(nc, -2, 2, &wa), *b = rand16(nc, -1, 1, &wb);
    float *w = ct_rand(C, 0.5f, 1.5f), *bias = ct_rand(C, -0.5f, 0.5f);
    char name[160];

    /* forward: bf16 in, bf16 out */
    uint16_t *want = ct_alloc(nc * 2), *got = ct_alloc(nc * 2);
    float *m0 = ct_alloc(N * 4), *r0 = ct_alloc(N * 4), *m1 = ct_alloc(N * 4), *r1 = ct_alloc(N * 4);
    zk_layernorm_forward_b16(want, m0, r0, wx, w, bias, N, C);
    for (int t = 1; t <= 3; t++) {
        omp_set_num_threads(t);
        zk_layernorm_forward_r16(got, m1, r1, x, w, bias, N, C);
        snprintf(name, sizeof name, "layernorm forward r16 N=%d C=%d, %d threads: the f32 "
                 "kernel's on the widened rows", N, C, t);
        ct_check(!memcmp(got, want, nc * 2) && !memcmp(m0, m1, N * 4) && !memcmp(r0, r1, N * 4),
                 name, "out, mean or rstd differ");
    }

    /* residual forward: resid = add3_b16(a, b), then the forward on it */
    uint16_t *rwant = ct_alloc(nc * 2), *rgot = ct_alloc(nc * 2);
    float *rw = ct_alloc(nc * 4);
    zk_add3_b16(rwant, a, b, nc);
    zk_cast_bf16_f32(rw, rwant, nc);
    zk_layernorm_forward_b16(want, m0, r0, rw, w, bias, N, C);
    for (int t = 1; t <= 3; t++) {
        omp_set_num_threads(t);
        zk_layernorm_residual_forward_r16(rgot, got, m1, r1, a, b, w, bias, N, C);
        snprintf(name, sizeof name, "layernorm residual forward r16 N=%d C=%d, %d threads: the "
                 "rounded sum, then the forward on it", N, C, t);
        ct_check(!memcmp(rgot, rwant, nc * 2) && !memcmp(got, want, nc * 2) &&
                 !memcmp(m0, m1, N * 4) && !memcmp(r0, r1, N * 4), name, "differ");
    }

    /* backward from a bf16 dout: dinp bf16 accumulated, rounded once; dw,
     * db the f32 kernel's on the widened dout */
    float *dout, *wd;
    uint16_t *do16 = rand16(nc, -1, 1, &dout), *d0 = rand16(nc, -0.5f, 0.5f, &wd);
    float *dw0 = ct_alloc(C * 4), *db0 = ct_alloc(C * 4), *dw1 = ct_alloc(C * 4),
          *db1 = ct_alloc(C * 4);
    zk_layernorm_forward(rw, m0, r0, wx, w, bias, N, C);     /* mean, rstd of x */
    zk_layernorm_backward(wd, dw0, db0, dout, wx, w, m0, r0, N, C);
    uint16_t *dwant = round16(wd, nc), *dgot = ct_alloc(nc * 2);
    for (int t = 1; t <= 3; t++) {
        omp_set_num_threads(t);
        memcpy(dgot, d0, nc * 2);
        zk_layernorm_backward_r16(dgot, dw1, db1, do16, x, w, m0, r0, N, C);
        snprintf(name, sizeof name, "layernorm backward r16 N=%d C=%d, %d threads: "
                 "round(dinp + the f32 term), dw and db the f32 kernel's", N, C, t);
        ct_check(!memcmp(dgot, dwant, nc * 2) && !memcmp(dw0, dw1, C * 4) &&
                 !memcmp(db0, db1, C * 4), name, "differ");
    }
    memcpy(dgot, d0, nc * 2);
    memset(dw1, 0, C * 4); memset(db1, 0, C * 4);
    zk_layernorm_backward_r16(dgot, NULL, NULL, do16, x, w, m0, r0, N, C);
    zk_layernorm_backward_r16(NULL, dw1, db1, do16, x, w, m0, r0, N, C);
    snprintf(name, sizeof name, "layernorm backward r16 N=%d C=%d split: dinp alone, then the "
             "weights alone, the fused call's bits", N, C);
    ct_check(!memcmp(dgot, dwant, nc * 2) && !memcmp(dw0, dw1, C * 4) && !memcmp(db0, db1, C * 4),
             name, "differ");
    omp_set_num_threads(2);
    free(wx); free(wa); free(wb); free(x); free(a); free(b); free(w); free(bias);
    free(want); free(got); free(m0); free(r0); free(m1); free(r1); free(rwant); free(rgot);
    free(rw); free(dout); free(do16); free(wd); free(d0); free(dw0); free(db0); free(dw1); free(db1);
    free(dwant); free(dgot);
}

static void test_rmsnorm(int N, int C) {
    size_t nc = (size_t)N * C;
    float *wx, *wd;
    uint16_t *x = rand16(nc, -2, 2, &wx), *d0 = rand16(nc, -0.5f, 0.5f, &wd);
    float *w = ct_rand(C, 0.5f, 1.5f), *dout;
    uint16_t *do16 = rand16(nc, -1, 1, &dout);
    float *r0 = ct_alloc(N * 4), *r1 = ct_alloc(N * 4), *dw0 = ct_alloc(C * 4),
          *dw1 = ct_alloc(C * 4);
    uint16_t *want = ct_alloc(nc * 2), *got = ct_alloc(nc * 2);
    char name[160];
    zk_rmsnorm_forward_b16(want, r0, wx, w, 1e-5f, N, C);
    zk_rmsnorm_backward(wd, dw0, dout, wx, w, r0, N, C);
    uint16_t *dwant = round16(wd, nc), *dgot = ct_alloc(nc * 2);
    for (int t = 1; t <= 3; t++) {
        omp_set_num_threads(t);
        zk_rmsnorm_forward_r16(got, r1, x, w, 1e-5f, N, C);
        memcpy(dgot, d0, nc * 2);
        zk_rmsnorm_backward_r16(dgot, dw1, do16, x, w, r0, N, C);
        snprintf(name, sizeof name, "rmsnorm r16 N=%d C=%d, %d threads: forward and backward "
                 "the f32 kernels' on the widened rows, rounded once", N, C, t);
        ct_check(!memcmp(got, want, nc * 2) && !memcmp(r0, r1, N * 4) &&
                 !memcmp(dgot, dwant, nc * 2) && !memcmp(dw0, dw1, C * 4), name, "differ");
    }
    memcpy(dgot, d0, nc * 2);
    memset(dw1, 0, C * 4);
    zk_rmsnorm_backward_r16(dgot, NULL, do16, x, w, r0, N, C);
    zk_rmsnorm_backward_r16(NULL, dw1, do16, x, w, r0, N, C);
    snprintf(name, sizeof name, "rmsnorm backward r16 N=%d C=%d split: the fused call's bits",
             N, C);
    ct_check(!memcmp(dgot, dwant, nc * 2) && !memcmp(dw0, dw1, C * 4), name, "differ");
    omp_set_num_threads(2);
    free(wx); free(wd); free(x); free(d0); free(w); free(dout); free(do16); free(r0); free(r1);
    free(dw0); free(dw1); free(want); free(got); free(dwant); free(dgot);
}

static void test_encoder(int B, int T, int C, int V, int with_wpe) {
    size_t n = (size_t)B * T * C;
    int32_t *tok = ct_alloc((size_t)B * T * 4);
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(ct_u64() % (uint64_t)V);
    tok[1] = V + 3;                                   /* one outside the vocabulary */
    float *wte, *wpe;
    uint16_t *te = rand16((size_t)V * C, -1, 1, &wte), *pe = rand16((size_t)T * C, -1, 1, &wpe);
    float *f = ct_alloc(n * 4);
    char name[160];
    for (int w16 = 0; w16 <= 1; w16++) {
        int bad0 = w16 ? zk_encoder_forward_b16(f, tok, te, with_wpe ? pe : NULL, B, T, C, V)
                       : zk_encoder_forward(f, tok, wte, with_wpe ? wpe : NULL, B, T, C, V);
        uint16_t *want = round16(f, n), *got = ct_alloc(n * 2);
        for (int t = 1; t <= 3; t += 2) {
            omp_set_num_threads(t);
            int bad1 = zk_encoder_forward_o16(got, tok, w16 ? (void *)te : (void *)wte,
                                              with_wpe ? (w16 ? (void *)pe : (void *)wpe) : NULL,
                                              w16, B, T, C, V);
            snprintf(name, sizeof name, "encoder forward bf16 out C=%d, %s tables%s, %d threads: "
                     "the f32 rows rounded once, bad ids counted", C, w16 ? "bf16" : "f32",
                     with_wpe ? "" : ", no wpe", t);
            ct_check(bad0 == 1 && bad1 == 1 && !memcmp(got, want, n * 2), name,
                     "bad %d/%d or rows differ", bad0, bad1);
        }
        free(want); free(got);
    }
    /* backward from a bf16 dout: the f32 kernel's bits on the widened rows */
    float *wd;
    uint16_t *d = rand16(n, -1, 1, &wd);
    float *g0 = ct_rand((size_t)V * C, -1, 1), *g1 = ct_alloc((size_t)V * C * 4);
    float *p0 = ct_alloc((size_t)T * C * 4), *p1 = ct_alloc((size_t)T * C * 4);
    memcpy(g1, g0, (size_t)V * C * 4);
    int bad0 = zk_encoder_backward(g0, with_wpe ? p0 : NULL, wd, tok, B, T, C, V);
    omp_set_num_threads(3);
    int bad1 = zk_encoder_backward_b16(g1, with_wpe ? p1 : NULL, d, tok, B, T, C, V);
    snprintf(name, sizeof name, "encoder backward from a bf16 dout C=%d%s: the f32 kernel's "
             "bits on the widened rows", C, with_wpe ? "" : ", no wpe");
    ct_check(bad0 == 1 && bad1 == 1 && !memcmp(g0, g1, (size_t)V * C * 4) &&
             !memcmp(p0, p1, (size_t)T * C * 4), name, "differ");
    omp_set_num_threads(2);
    free(tok); free(wte); free(wpe); free(te); free(pe); free(f); free(wd); free(d);
    free(g0); free(g1); free(p0); free(p1);
}

/* The GEMM's input gradient in bf16: the f32 dinp's chains rounded once,
 * on every path the CPU has (portable, AVX512_BF16, AMX where usable),
 * rows of dout padded (ldo > OC), 1 and 3 threads; dweight, dbias the f32
 * call's bits */
static void test_mm_dinp16(int N, int C, int OC, int ldo) {
    size_t nd = (size_t)N * ldo, ni = (size_t)N * C, nw = (size_t)OC * C;
    float *f;
    uint16_t *dout = rand16(nd, -1, 1, &f), *inp = NULL, *w = NULL;
    free(f);
    inp = rand16(ni, -1, 1, &f); free(f);
    w = rand16(nw, -0.5f, 0.5f, &f); free(f);
    float *d32 = ct_alloc(ni * 4), *dw0 = ct_alloc(nw * 4), *dw1 = ct_alloc(nw * 4);
    float *db0 = ct_alloc(OC * 4), *db1 = ct_alloc(OC * 4);
    uint16_t *want = ct_alloc(ni * 2), *got = ct_alloc(ni * 2);
    int was = zk_bf16_simd(-1);
    char name[160];
    for (int path = 0; path <= 2; path++) {
        if (zk_bf16_simd(path) != path) continue;            /* not on this CPU */
        zk_matmul_bf16_backward(d32, dw0, db0, dout, inp, w, N, C, OC, ldo);
        zk_cast_f32_bf16(want, d32, ni);
        for (int t = 1; t <= 3; t += 2) {
            omp_set_num_threads(t);
            memset(got, 0xff, ni * 2);
            zk_matmul_bf16_backward_b16(got, dw1, db1, dout, inp, w, N, C, OC, ldo);
            snprintf(name, sizeof name, "matmul bf16 backward, bf16 dinp %dx%dx%d ldo=%d, path %d, "
                     "%d threads: the f32 dinp rounded once, dw and db its bits", N, C, OC, ldo,
                     path, t);
            ct_check(!memcmp(got, want, ni * 2) && !memcmp(dw0, dw1, nw * 4) &&
                     !memcmp(db0, db1, OC * 4), name, "differ");
        }
    }
    zk_bf16_simd(was);
    omp_set_num_threads(2);
    free(dout); free(inp); free(w); free(d32); free(dw0); free(dw1); free(db0); free(db1);
    free(want); free(got);
}

static void test_ops_refuse(void) {
    int64_t s2[2] = { 4, 8 }, s1[1] = { 8 }, big[2] = { 1, 16385 }, big1[1] = { 16385 };
    zt_tensor *a16 = tensor(ZT_BF16, 2, s2, NULL), *b16 = tensor(ZT_BF16, 2, s2, NULL);
    zt_tensor *a32 = tensor(ZT_F32, 2, s2, NULL), *w = tensor(ZT_F32, 1, s1, NULL);
    zt_tensor *m = tensor(ZT_F32, 1, (int64_t[]){ 4 }, NULL), *r = tensor(ZT_F32, 1, (int64_t[]){ 4 }, NULL);
    ct_check(refused(zt_add3(a16, a16, a32), "b must be bf16"), "add3 refuses mixed dtypes, naming b",
             "%s", zt_last_error());
    ct_check(refused(zt_fill(a16, 1.0f), "filled with 0 only"), "fill refuses a non-zero bf16 fill",
             "%s", zt_last_error());
    ct_check(zt_fill(a16, 0.0f) == 0, "fill zeroes a bf16 tensor", "%s", zt_last_error());
    ct_check(refused(zt_layernorm_forward(a32, m, r, a16, w, w), "takes a bf16 out"),
             "layernorm forward refuses a bf16 stream into an f32 out", "%s", zt_last_error());
    ct_check(refused(zt_layernorm_backward_b16(a16, b16, NULL, NULL, a32, a16, w, m, r),
                     "pass no dinp16"), "layernorm backward refuses dinp16 on a bf16 stream",
             "%s", zt_last_error());
    ct_check(refused(zt_layernorm_backward(a32, NULL, NULL, a32, a16, w, m, r), "dinp must be bf16"),
             "layernorm backward refuses an f32 dinp for a bf16 inp", "%s", zt_last_error());
    ct_check(refused(zt_layernorm_residual_forward(a16, b16, m, r, a16, a32, w, w), "b must be bf16"),
             "residual layernorm refuses mixed a and b", "%s", zt_last_error());
    zt_tensor *x = tensor(ZT_BF16, 2, big, NULL), *o = tensor(ZT_BF16, 2, big, NULL);
    zt_tensor *wb = tensor(ZT_F32, 1, big1, NULL), *m1 = tensor(ZT_F32, 1, (int64_t[]){ 1 }, NULL);
    zt_tensor *r1 = tensor(ZT_F32, 1, (int64_t[]){ 1 }, NULL);
    ct_check(refused(zt_layernorm_forward(o, m1, r1, x, wb, wb), "16384"),
             "layernorm forward refuses a bf16 stream past 16384 channels, naming the bound",
             "%s", zt_last_error());
    ct_check(refused(zt_rmsnorm_forward(o, r1, x, wb, 1e-5f), "16384"),
             "rmsnorm forward refuses a bf16 stream past 16384 channels", "%s", zt_last_error());
    zt_tensor *all[] = { a16, b16, a32, w, m, r, x, o, wb, m1, r1 };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) zt_tensor_release(all[i]);
}

/* The MLP's GEMM+GELU ops on the CPU device: the bits of the GEMM and the
 * GELU issued apart, and their refusals */
static void test_gelu_ops(int N, int C, int OC) {
    int64_t si[2] = { N, C }, sw[2] = { OC, C }, so[2] = { N, OC }, sb[1] = { OC };
    float *fi = ct_rand((size_t)N * C, -1, 1), *fw = ct_rand((size_t)OC * C, -0.5f, 0.5f);
    float *fb = ct_rand(OC, -0.2f, 0.2f);
    zt_tensor *inp = tensor(ZT_BF16, 2, si, fi), *w = tensor(ZT_BF16, 2, sw, fw);
    zt_tensor *b = tensor(ZT_F32, 1, sb, fb);
    zt_tensor *out = tensor(ZT_BF16, 2, so, NULL), *pre = tensor(ZT_BF16, 2, so, NULL);
    zt_tensor *out2 = tensor(ZT_BF16, 2, so, NULL), *pre2 = tensor(ZT_BF16, 2, so, NULL);
    size_t no = (size_t)N * OC, ni = (size_t)N * C;
    uint16_t *h1 = ct_alloc(no * 2), *h2 = ct_alloc(no * 2), *p1 = ct_alloc(no * 2),
             *p2 = ct_alloc(no * 2);
    char name[160];
    int rc = zt_matmul_bf16_forward_gelu(out, inp, w, b, pre);
    int rc2 = zt_matmul_bf16_forward(pre2, inp, w, b);
    if (!rc2) rc2 = zt_gelu_forward(out2, pre2);
    zt_tensor_read(out, h1, no * 2); zt_tensor_read(out2, h2, no * 2);
    zt_tensor_read(pre, p1, no * 2); zt_tensor_read(pre2, p2, no * 2);
    snprintf(name, sizeof name, "matmul_bf16_forward_gelu %dx%dx%d on the CPU: the GEMM's and the "
             "GELU's bits", N, C, OC);
    ct_check(rc == 0 && rc2 == 0 && !memcmp(h1, h2, no * 2) && !memcmp(p1, p2, no * 2), name,
             "rc %d/%d, or out/pre differ", rc, rc2);
    /* backward: dout (N,OC) through w (OC,C) into the GELU's input gradient
     * (N,C), pre (N,C) its input */
    float *fd = ct_rand(no, -1, 1), *fp = ct_rand(ni, -2, 2);
    zt_tensor *dout = tensor(ZT_BF16, 2, so, fd), *pin = tensor(ZT_BF16, 2, si, fp);
    zt_tensor *d16 = tensor(ZT_BF16, 2, si, NULL), *d32 = tensor(ZT_F32, 2, si, NULL);
    zt_tensor *e16 = tensor(ZT_BF16, 2, si, NULL), *e32 = tensor(ZT_F32, 2, si, NULL);
    zt_tensor *dw = tensor(ZT_F32, 2, sw, NULL), *db = tensor(ZT_F32, 1, sb, NULL);
    zt_tensor *dw2 = tensor(ZT_F32, 2, sw, NULL), *db2 = tensor(ZT_F32, 1, sb, NULL);
    rc = zt_matmul_bf16_backward_dgelu(d16, dw, db, dout, inp, w, pin, d32);
    rc2 = zt_matmul_bf16_backward(e32, dw2, db2, dout, inp, w);
    if (!rc2) rc2 = zt_gelu_backward(e16, pin, e32);
    uint16_t *g1 = ct_alloc(ni * 2), *g2 = ct_alloc(ni * 2);
    float *w1 = ct_alloc((size_t)OC * C * 4), *w2 = ct_alloc((size_t)OC * C * 4);
    zt_tensor_read(d16, g1, ni * 2); zt_tensor_read(e16, g2, ni * 2);
    zt_tensor_read(dw, w1, (size_t)OC * C * 4); zt_tensor_read(dw2, w2, (size_t)OC * C * 4);
    snprintf(name, sizeof name, "matmul_bf16_backward_dgelu %dx%dx%d on the CPU: the GEMM's and "
             "the GELU backward's bits, dweight too", N, C, OC);
    ct_check(rc == 0 && rc2 == 0 && !memcmp(g1, g2, ni * 2) && !memcmp(w1, w2, (size_t)OC * C * 4),
             name, "rc %d/%d, or dinp16/dweight differ", rc, rc2);
    /* refusals: name the operand */
    ct_check(refused(zt_matmul_bf16_forward_gelu(out, inp, w, b, d32), "pre must be bf16"),
             "forward_gelu refuses an f32 pre, naming it", "%s", zt_last_error());
    ct_check(refused(zt_matmul_bf16_forward_gelu(out, inp, w, b, out), "apart"),
             "forward_gelu refuses pre overlapping out", "%s", zt_last_error());
    ct_check(refused(zt_matmul_bf16_backward_dgelu(d16, NULL, NULL, dout, inp, w, pin, NULL),
                     "dinp32"), "backward_dgelu refuses a missing f32 scratch, naming dinp32",
             "%s", zt_last_error());
    ct_check(zt_matmul_bf16_backward_dgelu(NULL, dw, db, dout, inp, w, NULL, NULL) == 0,
             "backward_dgelu's weight pass needs no pre or scratch", "%s", zt_last_error());
    zt_tensor *all[] = { inp, w, b, out, pre, out2, pre2, dout, pin, d16, d32, e16, e32, dw, db,
                         dw2, db2 };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) zt_tensor_release(all[i]);
    free(fi); free(fw); free(fb); free(fd); free(fp); free(h1); free(h2); free(p1); free(p2);
    free(g1); free(g2); free(w1); free(w2);
}

/* two tensors' bytes equal (both read back from the device) */
/* same_tensor over each pair (two runs' outputs, a zt_tensor *[2] each) */
static void same_pairs(const char *name, int n, ...) {
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        zt_tensor **p = va_arg(ap, zt_tensor **);
        same_tensor(name, p[0], p[1]);
    }
    va_end(ap);
}

/* A bf16 run's stored parameters read by the ops themselves (p16: a norm's
 * weight and bias; b16: a bf16 GEMM's bias), widened as read: the bits of
 * the same ops given the widened f32 parameters, on an f32 and a bf16
 * stream. Then what the ops refuse. */
static void test_params16(int N, int C, int OC) {
    int64_t sx[2] = { N, C }, sc[1] = { C }, sn[1] = { N }, sw[2] = { OC, C }, so[2] = { N, OC },
            sb[1] = { OC };
    float *fx = ct_rand((size_t)N * C, -2, 2), *fy = ct_rand((size_t)N * C, -1, 1);
    float *fw = ct_rand(C, 0.5f, 1.5f), *fb = ct_rand(C, -0.5f, 0.5f);
    float *fmw = ct_rand((size_t)OC * C, -0.5f, 0.5f), *fmb = ct_rand(OC, -0.2f, 0.2f);
    /* the parameters on the bf16 grid, so f32 and bf16 hold the same values */
    uint16_t *t16;
    t16 = round16(fw, C); zk_cast_bf16_f32(fw, t16, C); free(t16);
    t16 = round16(fb, C); zk_cast_bf16_f32(fb, t16, C); free(t16);
    t16 = round16(fmb, OC); zk_cast_bf16_f32(fmb, t16, OC); free(t16);
    zt_tensor *w32 = tensor(ZT_F32, 1, sc, fw), *b32 = tensor(ZT_F32, 1, sc, fb);
    zt_tensor *w16 = tensor(ZT_BF16, 1, sc, fw), *b16 = tensor(ZT_BF16, 1, sc, fb);
    char name[160];
    for (int r16 = 0; r16 <= 1; r16++) {
        int dt = r16 ? ZT_BF16 : ZT_F32;
        const char *st = r16 ? "bf16 stream" : "f32 stream";
        zt_tensor *x = tensor(dt, 2, sx, fx), *y = tensor(dt, 2, sx, fy), *o[2], *m[2], *r[2],
                  *res[2], *di[2], *dw[2], *db[2], *fo[2], *fm[2], *fr[2];
        for (int k = 0; k < 2; k++) {
            o[k] = tensor(r16 ? ZT_BF16 : ZT_F32, 2, sx, NULL);
            fo[k] = tensor(r16 ? ZT_BF16 : ZT_F32, 2, sx, NULL);
            fm[k] = tensor(ZT_F32, 1, sn, NULL); fr[k] = tensor(ZT_F32, 1, sn, NULL);
            res[k] = tensor(dt, 2, sx, NULL);
            di[k] = tensor(dt, 2, sx, NULL);
            m[k] = tensor(ZT_F32, 1, sn, NULL); r[k] = tensor(ZT_F32, 1, sn, NULL);
            dw[k] = tensor(ZT_F32, 1, sc, NULL); db[k] = tensor(ZT_F32, 1, sc, NULL);
            zt_tensor *w = k ? w16 : w32, *b = k ? b16 : b32;
            if (zt_layernorm_forward(fo[k], fm[k], fr[k], x, w, b) ||
                zt_layernorm_backward(di[k], dw[k], db[k], y, x, w, fm[k], fr[k]) ||
                zt_layernorm_residual_forward(res[k], o[k], m[k], r[k], x, y, w, b))
                ct_check(0, "layernorm ops with bf16 parameters run", "%s", zt_last_error());
        }
        snprintf(name, sizeof name, "layernorm %dx%d, %s, bf16 weight and bias: the f32 "
                 "parameters' bits (out, mean, rstd, dinp, dweight, dbias)", N, C, st);
        same_pairs(name, 6, fo, fm, fr, di, dw, db);
        snprintf(name, sizeof name, "residual layernorm %dx%d, %s, bf16 weight and bias: the f32 "
                 "parameters' bits (resid, out, rstd)", N, C, st);
        same_pairs(name, 3, res, o, r);
        for (int k = 0; k < 2; k++) {
            zt_tensor *w = k ? w16 : w32;
            if (zt_rmsnorm_forward(o[k], r[k], x, w, 1e-5f) ||
                zt_rmsnorm_backward(di[k], dw[k], y, x, w, r[k]))
                ct_check(0, "rmsnorm ops with a bf16 weight run", "%s", zt_last_error());
        }
        snprintf(name, sizeof name, "rmsnorm %dx%d, %s, bf16 weight: the f32 weight's bits (out, "
                 "dinp, dweight)", N, C, st);
        same_pairs(name, 3, o, di, dw);
        zt_tensor *all[] = { x, y, o[0], o[1], m[0], m[1], r[0], r[1], res[0], res[1], di[0],
                             di[1], dw[0], dw[1], db[0], db[1], fo[0], fo[1], fm[0], fm[1],
                             fr[0], fr[1] };
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) zt_tensor_release(all[i]);
    }
    /* the bf16 GEMM's bias, f32 and bf16 outs, and the GEMM+GELU op */
    zt_tensor *in = tensor(ZT_BF16, 2, sx, fx), *mw = tensor(ZT_BF16, 2, sw, fmw);
    zt_tensor *mb32 = tensor(ZT_F32, 1, sb, fmb), *mb16 = tensor(ZT_BF16, 1, sb, fmb);
    for (int out16 = 0; out16 <= 1; out16++) {
        zt_tensor *o0 = tensor(out16 ? ZT_BF16 : ZT_F32, 2, so, NULL);
        zt_tensor *o1 = tensor(out16 ? ZT_BF16 : ZT_F32, 2, so, NULL);
        int rc = zt_matmul_bf16_forward(o0, in, mw, mb32), rc2 = zt_matmul_bf16_forward(o1, in, mw, mb16);
        ct_check(rc == 0 && rc2 == 0, "matmul_bf16_forward with a bf16 bias runs", "%s", zt_last_error());
        snprintf(name, sizeof name, "matmul_bf16_forward %dx%dx%d, %s out, bf16 bias: the f32 "
                 "bias's bits", N, C, OC, out16 ? "bf16" : "f32");
        same_tensor(name, o0, o1);
        zt_tensor_release(o0); zt_tensor_release(o1);
    }
    zt_tensor *g[4];
    for (int k = 0; k < 4; k++) g[k] = tensor(ZT_BF16, 2, so, NULL);
    int rc = zt_matmul_bf16_forward_gelu(g[0], in, mw, mb32, g[1]);
    int rc2 = zt_matmul_bf16_forward_gelu(g[2], in, mw, mb16, g[3]);
    ct_check(rc == 0 && rc2 == 0, "forward_gelu with a bf16 bias runs", "%s", zt_last_error());
    snprintf(name, sizeof name, "matmul_bf16_forward_gelu %dx%dx%d, bf16 bias: the f32 bias's "
             "bits (out, pre)", N, C, OC);
    same_tensor(name, g[0], g[2]);
    same_tensor(name, g[1], g[3]);
    /* refusals */
    zt_tensor *x = tensor(ZT_F32, 2, sx, fx), *o = tensor(ZT_F32, 2, sx, NULL);
    zt_tensor *m = tensor(ZT_F32, 1, sn, NULL), *r = tensor(ZT_F32, 1, sn, NULL);
    ct_check(refused(zt_layernorm_forward(o, m, r, x, w16, b32), "bias must be bf16"),
             "layernorm refuses a bf16 weight with an f32 bias, naming the bias", "%s",
             zt_last_error());
    int64_t big[1] = { 16385 };
    zt_tensor *wbig = tensor(ZT_BF16, 1, big, NULL), *xbig = tensor(ZT_F32, 2, (int64_t[]){ 1, 16385 }, NULL);
    zt_tensor *obig = tensor(ZT_F32, 2, (int64_t[]){ 1, 16385 }, NULL);
    zt_tensor *m1 = tensor(ZT_F32, 1, (int64_t[]){ 1 }, NULL);
    ct_check(refused(zt_rmsnorm_forward(obig, m1, xbig, wbig, 1e-5f), "16384"),
             "rmsnorm refuses a bf16 weight past 16384 channels, naming the bound", "%s",
             zt_last_error());
    ct_check(refused(zt_matmul_bf16_forward(g[0], in, mw, b16), "bias"),
             "matmul_bf16_forward refuses a bias of the wrong length, naming it", "%s",
             zt_last_error());
    zt_tensor *all[] = { w32, b32, w16, b16, in, mw, mb32, mb16, g[0], g[1], g[2], g[3], x, o,
                         m, r, wbig, xbig, obig, m1 };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) zt_tensor_release(all[i]);
    free(fx); free(fy); free(fw); free(fb); free(fmw); free(fmb);
}

int main(void) {
    ct_seed(16);
    test_add3(7);
    test_add3(100003);               /* past one element block: the parallel loop */
    test_layernorm(5, 7);
    test_layernorm(67, 768);         /* the vector lanes and the threads' row split */
    test_layernorm(3, 1040);         /* past the forward's 1024-float chunk */
    test_rmsnorm(5, 7);
    test_rmsnorm(67, 768);
    test_encoder(2, 9, 70, 50, 1);
    test_encoder(4, 64, 256, 97, 1); /* parallel: B T C >= 65536 */
    test_encoder(2, 9, 70, 50, 0);
    test_mm_dinp16(5, 40, 24, 24);
    test_mm_dinp16(97, 130, 200, 256);   /* padded dout rows, tails past the tiles */
    test_ops_refuse();
    test_gelu_ops(6, 40, 24);
    test_gelu_ops(33, 64, 256);
    test_params16(5, 7, 24);
    test_params16(67, 768, 200);     /* the vector lanes, the threads' row split */
    return ct_summary();
}
