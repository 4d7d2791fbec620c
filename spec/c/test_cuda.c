/*
 * test_cuda.c -- the CUDA device (runtime/device_cuda.c + kernels/cuda)
 * against its CPU twins (kernels/cpu) on random inputs. Built only by
 * `make test-cuda` / `make cuda-check` (CUDA=1). Where no GPU is visible it
 * prints "cuda: no GPU here, N tests skipped" and exits 0.
 *
 * Every op goes through the device table zt_cuda_device exactly as ops.c
 * calls it, with device memory from its own alloc and copies.
 *
 * Tolerances, by what the two sides compute:
 *  - exact bits: fill/scale/axpy/add/add3, all four casts, embedding
 *    forward, AdamW (the same per-operation rounding; adamw_multi's one
 *    launch over many tensors the bits of adamw_segments an item), the fp64 block sums,
 *    both also reading a bf16 or f16 gradient as stored (the bits of the
 *    f32 call on its widened copy, and the CPU's), randn (the CPU generator), the bad-id counts, the rank-order sum of
 *    the communicators (zkc_sum_ranks against zk_sum_ranks);
 *  - GEMMs (fp32 and bf16 operands, fp32 accumulation), checked against a
 *    double-precision loop, not the CPU GEMM: |err| <= K * 2^-23 * sum|a*b|
 *    per element (twice the classic gamma_K bound of an fp32 dot product of
 *    any order) -- TF32 would break it; a bf16 out (and the backward's bf16
 *    dinp, dinp16) that bound plus half a bf16 ulp (2^-8 |ref|), the CPU
 *    twin (zk_matmul_bf16_backward_b16) within the same and the two within
 *    both; dinp16's dw, db the fp32 call's bits; the LM head's split OC
 *    (fp32 partials in scratch) the fp32 call's dinp rounded, bit for bit;
 *  - GELU (tanhf against the CPU's tanh_fast, ~1e-7 absolute): forward
 *    1e-6 + 1e-5 |x|; backward 5e-6 + 1e-5 |x| (dout in [-1,1]): gelu' =
 *    left + right cancels near x = -0.75 and d(gelu')/d(tanh) reaches ~30
 *    on [-6,6], so tanh's 1e-7 shows as up to ~3e-6 absolute (1.1e-6 seen
 *    on an H200);
 *  - layernorm, cross-entropy (sums in another order; expf): 1e-5 + 1e-5 |x|,
 *    the weight gradients (N-row sums) 1e-5 + 1e-4 |x|;
 *  - embedding backward: 1e-6 + 1e-6 |x| (same order; exact in practice);
 *  - attention (online softmax over single keys against the CPU's key
 *    tiles, expf): out 1e-5 + 1e-4 |x|, lse 1e-5 + 1e-5 |x|, dqkv
 *    1e-5 + 1e-3 |x| (sums of T products with cancellation); decode (KV
 *    cache) as out against the CPU, and the GPU forward's bits exactly;
 *  - bf16 tensor-core attention (attention_tc_*.cu, zt_cuda_attention_mode(1)):
 *    on bf16-valued inputs against the CPU twin, per element within
 *    1e-6 + 4 * 2^-9 * (the sum of the absolute terms), lse within its fp32
 *    bound; derived in spec/c/attn_tc_check.h, which test_attention_tiles.c
 *    shares (there broken variants of the algorithm must fail it);
 *  - bf16 I/O attention (io16, plain and tensor-core kernels; the
 *    backward's dout bf16 too): exact bits against the fp32 call on this
 *    GPU with the widened inputs, its out and dqkv rounded to bf16
 *    (zk_cast_f32_bf16), lse the same bits;
 *  - the bf16 residual stream (r16: add3, encoder out16 / dout16, layer
 *    and RMS norm on bf16 rows, their backward's dout bf16 too; SwiGLU's
 *    bf16 dout) against the CPU's _r16/_b16/_o16/_bb twins:
 *    add3, the residual forward's resid and the embedding the CPU's bits
 *    (one fp32 add rounded once; the same adds); a bf16 norm output or
 *    dinp is the f32 value (within the f32 tolerance above of the CPU's)
 *    rounded once, so within 1e-5 + (1e-5 + 2^-7) |x| (the f32 gap plus
 *    a bf16 ulp, at most 2^-7 |x|); mean, rstd, dw, db the f32 tolerances;
 *    a split backward's parts the fused call's bits.
 *  - a bf16 run's parameters read as bf16 (p16: the norms' w and b; b16:
 *    the bf16 GEMMs' bias, the GELU call's too): exact bits against the
 *    same op on their widened fp32 copies, on every path (t_norm_p16,
 *    t_matmul_b16).
 *  - a bf16 run's gradients written bf16 by the ops (g16): the norms' dw,
 *    db, the bf16 GEMMs' db, the embedding's dwte (accumulated onto bf16
 *    values) and dwpe: exact bits against the same op's fp32 result (on
 *    the widened dwte) rounded once (zk_cast_f32_bf16); the bf16 GEMMs'
 *    dw on a small output (fewer 128x128 tiles than the GPU's SMs: the
 *    fp32 GEMMs into scratch, then the cast) the fp32 call's rounded,
 *    bit for bit; on a larger one (a GEMM with a bf16 D, maybe another
 *    cuBLASLt algorithm than the fp32 D's) the bf16-out GEMM tolerance
 *    above, and within both of the fp32 call's rounded (t_norm_g16,
 *    t_encoder_g16, t_matmul_g16).
 *  - the MLP's GEMM fused with its GELU (matmul_bf16_forward_gelu,
 *    matmul_bf16_backward_dgelu; cuBLASLt's GELU_AUX(_BIAS) / DGELU
 *    epilogues) against the CPU's two ops (zk_matmul_bf16_forward_b16 +
 *    zk_gelu_forward_bb; zk_matmul_bf16_backward + zk_gelu_backward_bb),
 *    bf16 operands and biases. The epilogue takes the GELU of the fp32
 *    sum (not of the rounded pre) by cuBLASLt's own tanh (or erf: 5e-4
 *    apart), so per element, with bnd the bf16 GEMM bound above of the
 *    sum, x the want's pre, y its out (dinp16), D the product:
 *      pre:    the bf16 GEMM check (bnd + half a bf16 ulp, 2^-8 |ref|);
 *      out:    1e-6 + 1.13 (2 bnd + 2^-7 |x|) + 2^-10 |x| + 2^-7 |y|
 *              (gelu's slope is within [-0.13, 1.13]: the two sums' gap
 *              and a bf16 ulp of pre carried through it; the GELUs'
 *              difference, tanh approximations or erf, under 2^-10 |x|;
 *              a bf16 ulp of out, the two roundings);
 *      dinp16: 1e-6 + 1.13 * 2 bnd + 2^-7 |D| + 2^-7 |y| (the products'
 *              gap through gelu'; gelu' evaluated apart, 2^-7 absolute:
 *              a hardware tanh's 2^-11 times d(gelu')/d(tanh) <= 10 on
 *              pre in [-4, 4], the inputs' range; a bf16 ulp of y).
 *    The same tolerances between the fused call and the two ops on the
 *    GPU (zkc_matmul_gelu_fusion(0)); exact bits: the fused call twice,
 *    dw and db against the unfused call (the same kernels), the unfused
 *    call against the table's matmul and gelu ops one after the other,
 *    and a shape or pointer cuBLASLt's epilogues cannot take (rows not a
 *    multiple of 16 bytes, pre 2 bytes off, cuBLAS mode) against the two
 *    ops, with the fused-call count unmoved.
 */
#include <cuda_runtime_api.h>
#include "ctest.h"
#include "internal.h"
#include "kernels.h"
#include "cuda_stream.h"
#include "../kernels/cuda/kernels.cuh"
#include "attn_tc_check.h"

extern const zt_device_ops zt_cuda_device;
static const zt_device_ops *dv = &zt_cuda_device;

/* ---- host <-> device ---- */
static void *up(const void *h, size_t nbytes)
{
    void *d = NULL;
    if (dv->alloc(&d, nbytes) != ZT_OK) { printf("FAIL alloc %zu bytes\n", nbytes); exit(1); }
    dv->copy(d, h, nbytes);
    return d;
}
static void *down(const void *d, size_t nbytes)
{
    void *h = malloc(nbytes + 1);
    dv->copy(h, d, nbytes);
    return h;
}
static int synced(const char *name)
{
    int rc = dv->sync();
    if (rc != ZT_OK) ct_fail(name, "device error: %s", zt_last_error());
    return rc == ZT_OK;
}

/* max over i of |got - want| / (atol + rtol |want|) <= 1 */
static void close_to(const char *name, const float *got, const float *want, size_t n,
                     double atol, double rtol)
{
    double worst = 0; size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]) / (atol + rtol * fabs((double)want[i]));
        if (!(e <= worst)) { worst = e; wi = i; }
        if (isnan(e)) { worst = INFINITY; wi = i; break; }
    }
    ct_check(worst <= 1.0, name, "element %zu: got %.9g want %.9g (%.3g of the tolerance)",
             wi, (double)got[wi], (double)want[wi], worst);
}
static void same_bits(const char *name, const void *got, const void *want, size_t nbytes)
{
    const unsigned char *g = got, *w = want;
    size_t i = 0;
    while (i < nbytes && g[i] == w[i]) i++;
    ct_check(i == nbytes, name, "first differing byte %zu of %zu", i, nbytes);
}

/* ---- tests ---- */
static void t_elementwise(void)
{
    size_t n = 100003;
    float *x = ct_rand(n, -2, 2), *y = ct_rand(n, -2, 2), *w = malloc(n * 4);
    float *dx = up(x, n * 4), *dy = up(y, n * 4), *dz = up(y, n * 4);
    dv->scale(dy, 0.37f, n); zk_scale(y, 0.37f, n);
    dv->axpy(dy, -1.3f, dx, n); zk_axpy(y, -1.3f, x, n);
    dv->add(dy, dx, ZT_F32, n); zk_add(y, x, n);
    dv->add3(dz, dy, dx, 0, n); zk_add3(w, y, x, n);
    if (!synced("elementwise")) return;
    float *gy = down(dy, n * 4), *gz = down(dz, n * 4);
    same_bits("scale, axpy, add: CPU bits", gy, y, n * 4);
    same_bits("add3: CPU bits", gz, w, n * 4);
    dv->fill(dz, 2.5f, n); zk_fill(w, 2.5f, n);
    float *gf = down(dz, n * 4);
    same_bits("fill", gf, w, n * 4);
    /* a 2-byte x (a bf16 or fp16 run's gradient), widened exactly: the
     * CPU's bits (zk_add_bf16, zk_add_f16: a cast then the fp32 add) */
    uint16_t *x16 = malloc(n * 2);
    for (int k = 0; k < 2; k++) {
        if (k) zk_cast_f32_f16(x16, x, n);
        else zk_cast_f32_bf16(x16, x, n);
        uint16_t *dx16 = up(x16, n * 2);
        dv->add(dy, dx16, k ? ZT_F16 : ZT_BF16, n);
        if (k) zk_add_f16(y, x16, n);
        else zk_add_bf16(y, x16, n);
        if (synced("add 2-byte x")) {
            float *g = down(dy, n * 4);
            same_bits(k ? "add, an fp16 x widened: CPU bits" : "add, a bf16 x widened: CPU bits", g, y,
                      n * 4);
            free(g);
        }
        dv->free(dx16);
    }
    free(x16);
    free(x); free(y); free(w); free(gy); free(gz); free(gf);
    dv->free(dx); dv->free(dy); dv->free(dz);
}

/* the bf16 residual stream's add (r16): the CPU's bits (one fp32 add,
 * rounded once), on the 8-wide path (16-byte aligned, n % 8 != 0: the
 * tail too), the scalar one (rows 2 bytes off), and out aliasing a; with
 * ties, overflow to inf, subnormals (no NaN: a NaN's payload is the
 * hardware's) */
static void t_add3_r16(void)
{
    size_t n = 100003;
    float *xf = ct_rand(n, -2, 2), *yf = ct_rand(n, -2, 2);
    uint16_t *a = malloc(n * 2), *b = malloc(n * 2), *want = malloc(n * 2);
    zk_cast_f32_bf16(a, xf, n); zk_cast_f32_bf16(b, yf, n);
    static const uint16_t sp[][2] = {
        { 0x3f80, 0x3b80 }, { 0x3f81, 0x3b80 }, { 0x7f7f, 0x7f7f }, { 0xff7f, 0xff7f },
        { 0x0001, 0x0001 }, { 0x8001, 0x0003 }, { 0x7f80, 0x3f80 }, { 0x4000, 0xc000 } };
    for (size_t k = 0; k < sizeof sp / sizeof sp[0]; k++) { a[k] = sp[k][0]; b[k] = sp[k][1]; }
    zk_add3_b16(want, a, b, n);
    uint16_t *da = NULL, *db = NULL, *dz = NULL;
    dv->alloc((void **)&da, n * 2 + 16); dv->alloc((void **)&db, n * 2 + 16);
    dv->alloc((void **)&dz, n * 2 + 16);
    for (int off = 0; off <= 1; off++) {
        dv->copy(da + off, a, n * 2); dv->copy(db + off, b, n * 2);
        dv->add3(dz + off, da + off, db + off, 1, n);
        dv->add3(da + off, da + off, db + off, 1, n);      /* out aliasing a */
        if (!synced("add3 r16")) break;
        uint16_t *g = down(dz + off, n * 2), *ga = down(da + off, n * 2);
        same_bits(off ? "add3 r16, rows 2 bytes off (scalar): CPU bits"
                      : "add3 r16 (16-byte vectors and the tail): CPU bits", g, want, n * 2);
        same_bits(off ? "add3 r16 in place (out = a), scalar: CPU bits"
                      : "add3 r16 in place (out = a): CPU bits", ga, want, n * 2);
        free(g); free(ga);
    }
    free(xf); free(yf); free(a); free(b); free(want);
    dv->free(da); dv->free(db); dv->free(dz);
}

static void t_casts(void)
{
    size_t n = 65536 + 13;
    float *x = ct_rand(n, -70000, 70000);
    /* rounding ties, denormals, f16 overflow and underflow, infinities */
    uint32_t sp[] = { 0x3f808000u, 0x3f818000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu,
                      0x7f800000u, 0xff800000u, 0x477ff000u, 0x33000001u, 0x38800000u };
    for (size_t k = 0; k < sizeof sp / 4; k++) memcpy(&x[k], &sp[k], 4);
    for (size_t i = 20; i < 4000; i++) x[i] *= 1e-8f;     /* small: f16 subnormals */
    uint16_t *hb = malloc(n * 2), *hh = malloc(n * 2);
    float *fb = malloc(n * 4), *fh = malloc(n * 4);
    zk_cast_f32_bf16(hb, x, n); zk_cast_bf16_f32(fb, hb, n);
    zk_cast_f32_f16(hh, x, n); zk_cast_f16_f32(fh, hh, n);
    float *dx = up(x, n * 4), *df = up(x, n * 4);
    uint16_t *db = up(hb, n * 2);
    dv->cast(db, ZT_BF16, dx, ZT_F32, n);
    uint16_t *gb = down(db, n * 2);
    same_bits("cast f32->bf16: CPU bits", gb, hb, n * 2);
    dv->cast(df, ZT_F32, db, ZT_BF16, n);
    float *gfb = down(df, n * 4);
    same_bits("cast bf16->f32: CPU bits", gfb, fb, n * 4);
    dv->cast(db, ZT_F16, dx, ZT_F32, n);
    uint16_t *gh = down(db, n * 2);
    same_bits("cast f32->f16: CPU bits", gh, hh, n * 2);
    dv->cast(df, ZT_F32, db, ZT_F16, n);
    float *gfh = down(df, n * 4);
    same_bits("cast f16->f32: CPU bits", gfh, fh, n * 4);
    synced("casts");
    free(x); free(hb); free(hh); free(fb); free(fh); free(gb); free(gfb); free(gh); free(gfh);
    dv->free(dx); dv->free(df); dv->free(db);
}

static void t_gelu(void)
{
    size_t n = 50001;
    float *x = ct_rand(n, -6, 6), *d = ct_rand(n, -1, 1), *o = malloc(n * 4), *g = malloc(n * 4);
    zk_gelu_forward(o, x, n); zk_gelu_backward(g, x, d, n);
    float *dx = up(x, n * 4), *dd = up(d, n * 4), *dout = up(x, n * 4);
    dv->gelu_forward(dout, 0, dx, 0, n);
    dv->gelu_backward(dd, 0, dx, 0, dd, n);       /* dinp aliases dout */
    if (!synced("gelu")) return;
    float *go = down(dout, n * 4), *gg = down(dd, n * 4);
    close_to("gelu forward (1e-6 + 1e-5|x|)", go, o, n, 1e-6, 1e-5);
    close_to("gelu backward, dinp aliasing dout", gg, g, n, 5e-6, 1e-5);
    /* bf16 outputs: the GPU's fp32 results rounded once (one bf16 ulp
     * allowed: nvcc may contract the two instantiations differently) */
    uint16_t *o16 = NULL, *g16 = NULL;
    float *dd2 = up(d, n * 4);
    dv->alloc((void **)&o16, n * 2); dv->alloc((void **)&g16, n * 2);
    dv->gelu_forward(o16, 1, dx, 0, n);
    dv->gelu_backward(g16, 1, dx, 0, dd2, n);
    if (!synced("gelu bf16")) return;
    uint16_t *h16 = down(o16, n * 2), *hg16 = down(g16, n * 2);
    float *w16 = malloc(n * 4), *wg16 = malloc(n * 4);
    zk_cast_bf16_f32(w16, h16, n); zk_cast_bf16_f32(wg16, hg16, n);
    close_to("gelu forward bf16 out (the fp32 out, one bf16 ulp)", w16, go, n, 1e-30, 1.0 / 128);
    float *gref = ct_rand(n, 0, 0);
    zk_gelu_backward(gref, x, d, n);
    close_to("gelu backward bf16 dinp (one bf16 ulp)", wg16, gref, n, 5e-6, 1.0 / 128);
    free(h16); free(hg16); free(w16); free(wg16); free(gref);
    /* a bf16 inp (the c_fc GEMM's bf16 out): the CPU's _bb kernels' values,
     * one bf16 ulp apart (tanhf against the CPU's tanh_fast), and 1e-6
     * absolute as the fp32 check: where tanh_fast saturates to -1 the CPU
     * gives -0 and the GPU's tanhf -1.5e-7 (x = -5.6, an H200) */
    uint16_t *x16 = malloc(n * 2), *c16 = malloc(n * 2), *cg16 = malloc(n * 2);
    zk_cast_f32_bf16(x16, x, n);
    zk_gelu_forward_bb(c16, x16, n);
    zk_gelu_backward_bb(cg16, x16, d, n);
    uint16_t *dx16 = up(x16, n * 2);
    float *dd3 = up(d, n * 4);
    dv->gelu_forward(o16, 1, dx16, 1, n);
    dv->gelu_backward(g16, 1, dx16, 1, dd3, n);
    if (synced("gelu bf16 inp")) {
        uint16_t *a16 = down(o16, n * 2), *ag16 = down(g16, n * 2);
        float *a = malloc(n * 4), *ag = malloc(n * 4), *c = malloc(n * 4), *cg = malloc(n * 4);
        zk_cast_bf16_f32(a, a16, n); zk_cast_bf16_f32(ag, ag16, n);
        zk_cast_bf16_f32(c, c16, n); zk_cast_bf16_f32(cg, cg16, n);
        close_to("gelu forward bf16 inp and out (1e-6 + one bf16 ulp)", a, c, n, 1e-6, 1.0 / 128);
        close_to("gelu backward bf16 inp and dinp (one bf16 ulp)", ag, cg, n, 5e-6, 1.0 / 128);
        free(a16); free(ag16); free(a); free(ag); free(c); free(cg);
    }
    free(x16); free(c16); free(cg16); dv->free(dx16); dv->free(dd3);
    dv->free(o16); dv->free(g16); dv->free(dd2);
    free(x); free(d); free(o); free(g); free(go); free(gg);
    dv->free(dx); dv->free(dd); dv->free(dout);
}

/* a check's name with the shape: "layernorm N=67 C=768: ..." */
static const char *ln_name(int N, int C, const char *what)
{
    static char buf[8][160];
    static int i;
    char *b = buf[i++ % 8];
    snprintf(b, 160, "layernorm N=%d C=%d: %s", N, C, what);
    return b;
}

/* C % 4 == 0 on 16-byte aligned rows takes layernorm.cu's vector path,
 * any other C the scalar one */
static void t_layernorm_at(int N, int C)
{
    size_t nc = (size_t)N * C;
    float *x = ct_rand(nc, -3, 3), *w = ct_rand(C, 0.5f, 1.5f), *b = ct_rand(C, -1, 1);
    for (size_t i = 0; i < nc; i++) x[i] += (float)(i / C) * 0.1f;   /* a mean per row */
    float *o = malloc(nc * 4), *m = malloc(N * 4), *r = malloc(N * 4);
    zk_layernorm_forward(o, m, r, x, w, b, N, C);
    float *dx = up(x, nc * 4), *dw = up(w, C * 4), *db = up(b, C * 4);
    float *dout = up(o, nc * 4), *dm = up(m, N * 4), *dr = up(r, N * 4);
    dv->layernorm_forward(dout, 0, dm, dr, dx, 0, dw, db, 0, N, C);
    if (!synced(ln_name(N, C, "forward"))) return;
    float *go = down(dout, nc * 4), *gm = down(dm, N * 4), *gr = down(dr, N * 4);
    close_to(ln_name(N, C, "forward out"), go, o, nc, 1e-5, 1e-5);
    close_to(ln_name(N, C, "forward mean"), gm, m, N, 1e-5, 1e-5);
    close_to(ln_name(N, C, "forward rstd"), gr, r, N, 1e-5, 1e-5);
    {   /* a bf16 out: the fp32 out rounded once (one bf16 ulp allowed) */
        uint16_t *o16 = NULL;
        dv->alloc((void **)&o16, nc * 2);
        dv->layernorm_forward(o16, 1, dm, dr, dx, 0, dw, db, 0, N, C);
        if (!synced(ln_name(N, C, "forward bf16"))) return;
        uint16_t *h16 = down(o16, nc * 2);
        float *w16 = malloc(nc * 4);
        zk_cast_bf16_f32(w16, h16, nc);
        close_to(ln_name(N, C, "forward bf16 out (the fp32 out, one bf16 ulp)"), w16, go, nc, 1e-30, 1.0 / 128);
        free(h16); free(w16); dv->free(o16);
    }
    /* backward: dinp accumulates onto what is there */
    float *dy = ct_rand(nc, -1, 1), *di = ct_rand(nc, -1, 1), *gwt = malloc(C * 4), *gbs = malloc(C * 4);
    float *d_dy = up(dy, nc * 4), *d_di = up(di, nc * 4), *d_di2 = up(di, nc * 4);
    float *d_gw = up(w, C * 4), *d_gb = up(b, C * 4);
    zk_layernorm_backward(di, gwt, gbs, dy, x, w, m, r, N, C);
    dv->layernorm_backward(d_di, NULL, d_gw, d_gb, 0, d_dy, dx, 0, dw, 0, dm, dr, N, C);
    uint16_t *d_d16 = NULL;
    dv->alloc((void **)&d_d16, nc * 2);
    dv->layernorm_backward(d_di2, d_d16, NULL, NULL, 0, d_dy, dx, 0, dw, 0, dm, dr, N, C);   /* + bf16 dinp */
    if (!synced(ln_name(N, C, "backward"))) return;
    float *g_di = down(d_di, nc * 4), *g_di2 = down(d_di2, nc * 4);
    float *g_gw = down(d_gw, C * 4), *g_gb = down(d_gb, C * 4);
    close_to(ln_name(N, C, "backward dinp (accumulated)"), g_di, di, nc, 1e-5, 1e-5);
    close_to(ln_name(N, C, "backward dweight"), g_gw, gwt, C, 1e-5, 1e-4);
    close_to(ln_name(N, C, "backward dbias"), g_gb, gbs, C, 1e-5, 1e-4);
    same_bits(ln_name(N, C, "split backward: dinp alone has the fused call's bits"), g_di2, g_di, nc * 4);
    {   /* the rounded dinp: the GPU's own dinp, rounded once */
        uint16_t *g16 = down(d_d16, nc * 2), *want16 = malloc(nc * 2);
        zk_cast_f32_bf16(want16, g_di2, nc);
        same_bits(ln_name(N, C, "backward bf16 dinp = its dinp rounded once"), g16, want16, nc * 2);
        free(g16); free(want16); dv->free(d_d16);
    }
    free(x); free(w); free(b); free(o); free(m); free(r); free(go); free(gm); free(gr);
    free(dy); free(di); free(gwt); free(gbs); free(g_di); free(g_di2); free(g_gw); free(g_gb);
    dv->free(dx); dv->free(dw); dv->free(db); dv->free(dout); dv->free(dm); dv->free(dr);
    dv->free(d_dy); dv->free(d_di); dv->free(d_di2); dv->free(d_gw); dv->free(d_gb);
}

static void t_layernorm(void)
{
    t_layernorm_at(67, 771);
    t_layernorm_at(67, 768);     /* GPT-2's C */
    t_layernorm_at(45, 1600);    /* GPT-2 XL's: 13 groups a lane forward */
}

/* ---- the bf16 residual stream (r16) on the norms ---- */
/* bf16 values of n uniform floats in [lo, hi] (+ row * step a row of C) */
static uint16_t *rand16(size_t n, float lo, float hi, int C, float step)
{
    float *f = ct_rand(n, lo, hi);
    for (size_t i = 0; i < n; i++) f[i] += (float)(i / (size_t)C) * step;
    uint16_t *h = malloc(n * 2);
    zk_cast_f32_bf16(h, f, n);
    free(f);
    return h;
}
/* device bf16 rows off elements past an allocation's start (*base: to
 * free): off 1 puts them 2 bytes off 8 (the scalar paths at any C) */
static uint16_t *up16(const uint16_t *h, size_t n, int off, uint16_t **base)
{
    *base = NULL;
    if (dv->alloc((void **)base, (n + 8) * 2) != ZT_OK) { printf("FAIL alloc\n"); exit(1); }
    if (h) dv->copy(*base + off, h, n * 2);
    return *base + off;
}
/* bf16 got against the CPU twin's bf16 want: the f32 tolerance (atol,
 * rtol) plus one bf16 ulp (2^-7 |x|) */
static void close16(const char *name, const uint16_t *got, const uint16_t *want, size_t n,
                    double atol, double rtol)
{
    float *g = malloc(n * 4 + 4), *w = malloc(n * 4 + 4);
    zk_cast_bf16_f32(g, got, n); zk_cast_bf16_f32(w, want, n);
    close_to(name, g, w, n, atol, rtol + 1.0 / 128);
    free(g); free(w);
}

/* the layer norm on bf16 rows (zk_layernorm_*_r16): the forward (bf16 in
 * and out), the residual forward (resid = zk_add3_b16's bits, the norm on
 * it), the backward on a bf16 dout with dinp bf16 accumulated, fused and
 * split (dinp alone, the weights alone: the fused call's bits). off: the
 * bf16 rows (dout's too) 1 element (2 bytes) past 8-byte alignment, the
 * scalar paths. */
static void t_layernorm_r16_at(int N, int C, int off)
{
    char nm[8][160];
    const char *what[8] = { "forward out", "forward mean, rstd", "residual forward resid: CPU bits",
                            "residual forward out, mean, rstd", "backward dinp (accumulated)",
                            "backward dweight, dbias", "split backward: dinp alone the fused bits",
                            "split backward: dw, db alone the fused bits" };
    for (int i = 0; i < 8; i++)
        snprintf(nm[i], 160, "layernorm r16 N=%d C=%d%s: %s", N, C, off ? " rows 2 bytes off" : "",
                 what[i]);
    size_t nc = (size_t)N * C;
    uint16_t *x = rand16(nc, -3, 3, C, 0.1f), *a = rand16(nc, -2, 2, C, 0.05f);
    uint16_t *b2 = rand16(nc, -1, 1, C, 0.05f), *di = rand16(nc, -1, 1, C, 0.0f);
    uint16_t *dy = rand16(nc, -1, 1, C, 0.0f);
    float *w = ct_rand(C, 0.5f, 1.5f), *b = ct_rand(C, -1, 1);
    uint16_t *o = malloc(nc * 2), *res = malloc(nc * 2), *o2 = malloc(nc * 2);
    float *m = malloc(N * 4), *r = malloc(N * 4), *m2 = malloc(N * 4), *r2 = malloc(N * 4);
    float *gw = malloc(C * 4), *gb = malloc(C * 4);
    zk_layernorm_forward_r16(o, m, r, x, w, b, N, C);
    zk_layernorm_residual_forward_r16(res, o2, m2, r2, a, b2, w, b, N, C);
    uint16_t *bx, *bo, *ba, *bb2, *bres, *bo2, *bdi, *bdi2, *bdy;
    uint16_t *d_x = up16(x, nc, off, &bx), *d_o = up16(NULL, nc, off, &bo);
    uint16_t *d_a = up16(a, nc, off, &ba), *d_b2 = up16(b2, nc, off, &bb2);
    uint16_t *d_res = up16(NULL, nc, off, &bres), *d_o2 = up16(NULL, nc, off, &bo2);
    uint16_t *d_di = up16(di, nc, off, &bdi), *d_di2 = up16(di, nc, off, &bdi2);
    uint16_t *d_dy = up16(dy, nc, off, &bdy);
    float *d_w = up(w, C * 4), *d_b = up(b, C * 4);
    float *d_m = up(m, N * 4), *d_r = up(r, N * 4), *d_m2 = up(m, N * 4), *d_r2 = up(r, N * 4);
    float *d_mc = up(m, N * 4), *d_rc = up(r, N * 4);       /* the CPU's, for the backward */
    float *d_gw = up(w, C * 4), *d_gb = up(b, C * 4), *d_gw2 = up(w, C * 4), *d_gb2 = up(b, C * 4);
    zk_layernorm_backward_r16(di, gw, gb, dy, x, w, m, r, N, C);
    dv->layernorm_forward(d_o, 1, d_m, d_r, d_x, 1, d_w, d_b, 0, N, C);
    dv->layernorm_residual_forward(d_res, d_o2, 1, d_m2, d_r2, d_a, d_b2, 1, d_w, d_b, 0, N, C);
    dv->layernorm_backward(d_di, NULL, d_gw, d_gb, 0, d_dy, d_x, 1, d_w, 0, d_mc, d_rc, N, C);
    dv->layernorm_backward(d_di2, NULL, NULL, NULL, 0, d_dy, d_x, 1, d_w, 0, d_mc, d_rc, N, C);
    dv->layernorm_backward(NULL, NULL, d_gw2, d_gb2, 0, d_dy, d_x, 1, d_w, 0, d_mc, d_rc, N, C);
    if (synced(nm[0])) {
        uint16_t *g_o = down(d_o, nc * 2), *g_res = down(d_res, nc * 2), *g_o2 = down(d_o2, nc * 2);
        uint16_t *g_di = down(d_di, nc * 2), *g_di2 = down(d_di2, nc * 2);
        float *g_m = down(d_m, N * 4), *g_r = down(d_r, N * 4), *g_m2 = down(d_m2, N * 4);
        float *g_r2 = down(d_r2, N * 4), *g_gw = down(d_gw, C * 4), *g_gb = down(d_gb, C * 4);
        float *g_gw2 = down(d_gw2, C * 4), *g_gb2 = down(d_gb2, C * 4);
        close16(nm[0], g_o, o, nc, 1e-5, 1e-5);
        close_to(nm[1], g_m, m, N, 1e-5, 1e-5);
        close_to(nm[1], g_r, r, N, 1e-5, 1e-5);
        same_bits(nm[2], g_res, res, nc * 2);
        close16(nm[3], g_o2, o2, nc, 1e-5, 1e-5);
        close_to(nm[3], g_m2, m2, N, 1e-5, 1e-5);
        close_to(nm[3], g_r2, r2, N, 1e-5, 1e-5);
        close16(nm[4], g_di, di, nc, 1e-5, 1e-5);
        close_to(nm[5], g_gw, gw, C, 1e-5, 1e-4);
        close_to(nm[5], g_gb, gb, C, 1e-5, 1e-4);
        same_bits(nm[6], g_di2, g_di, nc * 2);
        same_bits(nm[7], g_gw2, g_gw, C * 4);
        same_bits(nm[7], g_gb2, g_gb, C * 4);
        free(g_o); free(g_res); free(g_o2); free(g_di); free(g_di2); free(g_m); free(g_r);
        free(g_m2); free(g_r2); free(g_gw); free(g_gb); free(g_gw2); free(g_gb2);
    }
    free(x); free(a); free(b2); free(di); free(w); free(b); free(dy); free(o); free(res); free(o2);
    free(m); free(r); free(m2); free(r2); free(gw); free(gb);
    dv->free(bx); dv->free(bo); dv->free(ba); dv->free(bb2); dv->free(bres); dv->free(bo2);
    dv->free(bdi); dv->free(bdi2); dv->free(d_w); dv->free(d_b); dv->free(bdy); dv->free(d_m);
    dv->free(d_r); dv->free(d_m2); dv->free(d_r2); dv->free(d_mc); dv->free(d_rc);
    dv->free(d_gw); dv->free(d_gb); dv->free(d_gw2); dv->free(d_gb2);
}

/* the RMS norm on bf16 rows (zk_rmsnorm_*_r16) through the device table,
 * as the layer norm's above (no mean, no bias, no residual form; dout
 * bf16) */
static void t_rmsnorm_r16_at(int N, int C, int off)
{
    char nm[5][160];
    const char *what[5] = { "forward out, rstd", "backward dinp (accumulated)", "backward dweight",
                            "split backward: dinp alone the fused bits",
                            "split backward: dw alone the fused bits" };
    for (int i = 0; i < 5; i++)
        snprintf(nm[i], 160, "rmsnorm r16 N=%d C=%d%s: %s", N, C, off ? " rows 2 bytes off" : "",
                 what[i]);
    size_t nc = (size_t)N * C;
    uint16_t *x = rand16(nc, -3, 3, C, 0.1f), *di = rand16(nc, -1, 1, C, 0.0f);
    uint16_t *dy = rand16(nc, -1, 1, C, 0.0f);
    float *w = ct_rand(C, 0.5f, 1.5f);
    uint16_t *o = malloc(nc * 2);
    float *r = malloc(N * 4), *gw = malloc(C * 4);
    zk_rmsnorm_forward_r16(o, r, x, w, 1e-5f, N, C);
    zk_rmsnorm_backward_r16(di, gw, dy, x, w, r, N, C);
    uint16_t *bx, *bo, *bdi, *bdi2, *bdy;
    uint16_t *d_x = up16(x, nc, off, &bx), *d_o = up16(NULL, nc, off, &bo);
    uint16_t *d_di = up16(di, nc, off, &bdi), *d_di2 = up16(di, nc, off, &bdi2);
    uint16_t *d_dy = up16(dy, nc, off, &bdy);
    float *d_w = up(w, C * 4), *d_r = up(r, N * 4), *d_rc = up(r, N * 4);
    float *d_gw = up(w, C * 4), *d_gw2 = up(w, C * 4);
    /* the backward on the CPU's saved rstd (d_rc), as its twin's */
    dv->rmsnorm_forward(d_o, 1, d_r, d_x, 1, d_w, 0, 1e-5f, N, C);
    dv->rmsnorm_backward(d_di, NULL, d_gw, 0, d_dy, d_x, 1, d_w, 0, d_rc, N, C);
    dv->rmsnorm_backward(d_di2, NULL, NULL, 0, d_dy, d_x, 1, d_w, 0, d_rc, N, C);
    dv->rmsnorm_backward(NULL, NULL, d_gw2, 0, d_dy, d_x, 1, d_w, 0, d_rc, N, C);
    if (synced(nm[0])) {
        uint16_t *g_o = down(d_o, nc * 2), *g_di = down(d_di, nc * 2), *g_di2 = down(d_di2, nc * 2);
        float *g_r = down(d_r, N * 4), *g_gw = down(d_gw, C * 4), *g_gw2 = down(d_gw2, C * 4);
        close16(nm[0], g_o, o, nc, 1e-5, 1e-5);
        close_to(nm[0], g_r, r, N, 1e-5, 1e-5);
        close16(nm[1], g_di, di, nc, 1e-5, 1e-5);
        close_to(nm[2], g_gw, gw, C, 1e-5, 1e-4);
        same_bits(nm[3], g_di2, g_di, nc * 2);
        same_bits(nm[4], g_gw2, g_gw, C * 4);
        free(g_o); free(g_di); free(g_di2); free(g_r); free(g_gw); free(g_gw2);
    }
    free(x); free(di); free(w); free(dy); free(o); free(r); free(gw);
    dv->free(bx); dv->free(bo); dv->free(bdi); dv->free(bdi2); dv->free(d_w); dv->free(bdy);
    dv->free(d_r); dv->free(d_rc); dv->free(d_gw); dv->free(d_gw2);
}

/* shapes: C 771 the scalar paths; 768 (GPT-2) the vector ones; 1600 the
 * forward at 13 groups a lane; 2056 the scalar forward (C > 2048) beside
 * the vector backward at 2 groups a thread; 4100 both scalar (C > 4096);
 * 768 with rows 2 bytes off 8 the scalar ones. N = 67: chunks of 32 rows,
 * the last short. */
static void t_norm_r16(void)
{
    static const int sh[][3] = { { 67, 771, 0 }, { 67, 768, 0 }, { 45, 1600, 0 }, { 9, 2056, 0 },
                                 { 5, 4100, 0 }, { 67, 768, 1 } };
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
        t_layernorm_r16_at(sh[i][0], sh[i][1], sh[i][2]);
        t_rmsnorm_r16_at(sh[i][0], sh[i][1], sh[i][2]);
    }
}

/* ---- a bf16 run's parameters (p16) on the norms ---- */
/* n bytes on the device `off` bytes past an allocation's start (*base: to
 * free), from h (NULL: left as allocated) */
static void *up_at(const void *h, size_t n, size_t off, void **base)
{
    *base = NULL;
    if (dv->alloc(base, n + off + 16) != ZT_OK) { printf("FAIL alloc\n"); exit(1); }
    if (h) dv->copy((char *)*base + off, h, n);
    return (char *)*base + off;
}

/* Each norm op with bf16 parameters (p16 1: w and b bf16 bits) against the
 * same op on their widened f32 copies (p16 0), bit for bit -- the
 * contract: widened exactly as read, nothing else changes: the layer
 * norm's forward, residual forward and backward (dinp accumulated, dw,
 * db), the RMS norm's forward and backward, on f32 rows (out16 0 and 1)
 * or bf16 ones (r16). roff: the rows that many bytes past 16 (the scalar
 * paths where it breaks their vector access); poff: both parameter copies
 * that many elements past 16 bytes: 4, the bf16 ones on 8 bytes and the
 * f32 ones on 16 (the vector path either way), 1 neither (the scalar path
 * either way: a bf16 parameter counts as aligned where its f32 copy at the
 * same element offset would). */
static const char *gname(char (*buf)[384], int *i, const char *tag, const char *what);
static void t_norm_p16_at(int N, int C, int r16, int out16, int roff, int poff)
{
    char tag[120], nb[16][384];
    int ni = 0;
    snprintf(tag, sizeof tag, "norms p16 N=%d C=%d%s%s%s%s", N, C, r16 ? " r16" : "",
             out16 && !r16 ? " bf16 out" : "", roff ? ", rows off 16 bytes" : "",
             poff == 4 ? ", params 4 elements off 16 bytes" : poff ? ", params 1 element off" : "");
    size_t nc = (size_t)N * C, es = r16 ? 2 : 4, oes = out16 ? 2 : 4;
    /* rows: x, a, b2, dy (bf16 values, so either layout holds them), dinp's start */
    uint16_t *h16[5] = { rand16(nc, -3, 3, C, 0.1f), rand16(nc, -2, 2, C, 0.05f),
                         rand16(nc, -1, 1, C, 0.05f), rand16(nc, -1, 1, C, 0.0f),
                         rand16(nc, -1, 1, C, 0.0f) };
    void *hrow[5], *rows[5], *rbase[5];
    for (int k = 0; k < 5; k++) {
        hrow[k] = r16 ? (void *)h16[k] : malloc(nc * 4);
        if (!r16) zk_cast_bf16_f32(hrow[k], h16[k], nc);
        rows[k] = up_at(hrow[k], nc * es, (size_t)roff, &rbase[k]);
    }
    /* the parameters: bf16 bits, and their widened f32 copies */
    uint16_t *w16 = rand16(C, 0.5f, 1.5f, C, 0.0f), *b16 = rand16(C, -1, 1, C, 0.0f);
    float *wf = malloc(C * 4), *bf = malloc(C * 4);
    zk_cast_bf16_f32(wf, w16, C); zk_cast_bf16_f32(bf, b16, C);
    void *pbase[4], *par[2][2];         /* [p16][w, b] */
    par[1][0] = up_at(w16, C * 2, (size_t)poff * 2, &pbase[0]);
    par[1][1] = up_at(b16, C * 2, (size_t)poff * 2, &pbase[1]);
    par[0][0] = up_at(wf, C * 4, (size_t)poff * 4, &pbase[2]);
    par[0][1] = up_at(bf, C * 4, (size_t)poff * 4, &pbase[3]);
    /* outputs [p16]: out, resid, out2, dinp (LN), out3, dinp3 (RMS); mean,
     * rstd (forward), mean2, rstd2 (residual), rstd3 (RMS); dw, db, dw3 */
    void *ob[2][6], *o[2][6];
    float *st[2][5], *gw[2][3];
    size_t osz[6] = { nc * oes, nc * es, nc * oes, nc * es, nc * oes, nc * es };
    for (int p = 0; p < 2; p++) {
        for (int k = 0; k < 6; k++)     /* the dinps start at the fifth row set */
            o[p][k] = up_at(k == 3 || k == 5 ? hrow[4] : NULL, osz[k], (size_t)roff, &ob[p][k]);
        for (int k = 0; k < 5; k++) { st[p][k] = NULL; dv->alloc((void **)&st[p][k], N * 4); }
        for (int k = 0; k < 3; k++) { gw[p][k] = NULL; dv->alloc((void **)&gw[p][k], C * 4); }
    }
    for (int p = 0; p < 2; p++) {       /* the backward on p16 0's mean and rstd */
        const void *w = par[p][0], *b = par[p][1];
        dv->layernorm_forward(o[p][0], out16, st[p][0], st[p][1], rows[0], r16, w, b, p, N, C);
        dv->layernorm_residual_forward(o[p][1], o[p][2], out16, st[p][2], st[p][3], rows[1], rows[2],
                                       r16, w, b, p, N, C);
        dv->layernorm_backward(o[p][3], NULL, gw[p][0], gw[p][1], 0, rows[3], rows[0], r16, w, p,
                               st[0][0], st[0][1], N, C);
        dv->rmsnorm_forward(o[p][4], out16, st[p][4], rows[0], r16, w, p, 1e-5f, N, C);
        dv->rmsnorm_backward(o[p][5], NULL, gw[p][2], 0, rows[3], rows[0], r16, w, p, st[0][4], N, C);
    }
    if (synced(gname(nb, &ni, tag, "runs"))) {
        static const char *on[6] = { "layernorm out", "residual resid", "residual out",
                                     "layernorm dinp (accumulated)", "rmsnorm out",
                                     "rmsnorm dinp (accumulated)" };
        static const char *sn[5] = { "layernorm mean", "layernorm rstd", "residual mean",
                                     "residual rstd", "rmsnorm rstd" };
        static const char *wn[3] = { "layernorm dw", "layernorm db", "rmsnorm dw" };
        char what[160];
        for (int k = 0; k < 6; k++) {
            void *g0 = down(o[0][k], osz[k]), *g1 = down(o[1][k], osz[k]);
            snprintf(what, sizeof what, "%s: p16 the widened f32 parameters' bits", on[k]);
            same_bits(gname(nb, &ni, tag, what), g1, g0, osz[k]);
            free(g0); free(g1);
        }
        for (int k = 0; k < 5; k++) {
            float *g0 = down(st[0][k], N * 4), *g1 = down(st[1][k], N * 4);
            snprintf(what, sizeof what, "%s: p16 the same bits", sn[k]);
            same_bits(gname(nb, &ni, tag, what), g1, g0, N * 4);
            free(g0); free(g1);
        }
        for (int k = 0; k < 3; k++) {
            float *g0 = down(gw[0][k], C * 4), *g1 = down(gw[1][k], C * 4);
            snprintf(what, sizeof what, "%s: p16 the same bits", wn[k]);
            same_bits(gname(nb, &ni, tag, what), g1, g0, C * 4);
            free(g0); free(g1);
        }
    }
    for (int p = 0; p < 2; p++) {
        for (int k = 0; k < 6; k++) dv->free(ob[p][k]);
        for (int k = 0; k < 5; k++) dv->free(st[p][k]);
        for (int k = 0; k < 3; k++) dv->free(gw[p][k]);
    }
    for (int k = 0; k < 5; k++) {
        dv->free(rbase[k]);
        if (!r16) free(hrow[k]);
        free(h16[k]);
    }
    for (int k = 0; k < 4; k++) dv->free(pbase[k]);
    free(w16); free(b16); free(wf); free(bf);
}

/* t_norm_r16's shapes (the scalar and vector paths of each op), f32 rows
 * with an f32 and a bf16 out and bf16 rows; rows off their vector access
 * (the scalar paths); parameters 4 elements off 16 bytes (the vector
 * paths) and 1 (the scalar ones) */
static void t_norm_p16(void)
{
    static const int sh[][2] = { { 67, 771 }, { 67, 768 }, { 45, 1600 }, { 9, 2056 }, { 5, 4100 } };
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
        t_norm_p16_at(sh[i][0], sh[i][1], 0, 0, 0, 0);
        t_norm_p16_at(sh[i][0], sh[i][1], 0, 1, 0, 0);
        t_norm_p16_at(sh[i][0], sh[i][1], 1, 1, 0, 0);
    }
    t_norm_p16_at(67, 768, 0, 1, 4, 0);
    t_norm_p16_at(67, 768, 1, 1, 2, 0);
    t_norm_p16_at(67, 768, 0, 0, 0, 4);
    t_norm_p16_at(67, 768, 1, 1, 0, 4);
    t_norm_p16_at(67, 768, 0, 1, 0, 1);
    t_norm_p16_at(67, 768, 1, 1, 0, 1);
}

static void t_encoder(void)
{
    int B = 3, T = 37, C = 97, V = 50, maxT = 40;
    size_t bt = (size_t)B * T;
    int32_t *tok = malloc(bt * 4);
    for (size_t i = 0; i < bt; i++) tok[i] = (int32_t)(ct_u64() % 12);  /* repeats */
    tok[5] = V; tok[40] = -1;                                            /* two bad ids */
    float *wte = ct_rand((size_t)V * C, -1, 1), *wpe = ct_rand((size_t)maxT * C, -1, 1);
    float *o = malloc(bt * C * 4);
    int bad_c = zk_encoder_forward(o, tok, wte, wpe, B, T, C, V);
    int32_t *dtok = up(tok, bt * 4);
    float *dwte = up(wte, (size_t)V * C * 4), *dwpe = up(wpe, (size_t)maxT * C * 4);
    float *dout = up(o, bt * C * 4);
    int bad_g = dv->encoder_forward(dout, 0, dtok, dwte, dwpe, 0, B, T, C, V);
    /* the GPU's count is read at the next sync, not waited for a call */
    int rs = dv->sync();
    ct_check(bad_g == 0 && bad_c == 2 && rs == ZT_EINVAL &&
             strstr(zt_last_error(), "zt_encoder_forward: 2 of") != NULL,
             "encoder forward: bad ids counted on the GPU, reported at the next sync",
             "gpu %d, sync %d (%s), cpu %d", bad_g, rs, zt_last_error(), bad_c);
    float *go = down(dout, bt * C * 4);
    same_bits("encoder forward: CPU bits", go, o, bt * C * 4);
    float *dy = ct_rand(bt * C, -1, 1), *gte = ct_rand((size_t)V * C, -1, 1);
    float *gpe = ct_rand((size_t)maxT * C, -1, 1);
    float *d_dy = up(dy, bt * C * 4), *d_gte = up(gte, (size_t)V * C * 4), *d_gpe = up(gpe, (size_t)maxT * C * 4);
    bad_c = zk_encoder_backward(gte, gpe, dy, tok, B, T, C, V);
    bad_g = dv->encoder_backward(d_gte, d_gpe, 0, d_dy, 0, dtok, B, T, C, V);
    rs = dv->sync();
    ct_check(bad_g == 0 && bad_c == 2 && rs == ZT_EINVAL &&
             strstr(zt_last_error(), "zt_encoder_backward: 2 of") != NULL,
             "encoder backward: bad ids counted on the GPU, reported at the next sync",
             "gpu %d, sync %d (%s), cpu %d", bad_g, rs, zt_last_error(), bad_c);
    if (!synced("encoder (the counts reported once)")) return;
    float *h_gte = down(d_gte, (size_t)V * C * 4), *h_gpe = down(d_gpe, (size_t)maxT * C * 4);
    /* each dwte row adds its positions in (b,t) order, as the CPU: the bits */
    same_bits("encoder backward dwte (accumulated): CPU bits", h_gte, gte, (size_t)V * C * 4);
    same_bits("encoder backward dwpe (rows < T written, the rest kept): CPU bits", h_gpe, gpe,
              (size_t)maxT * C * 4);
    /* the bf16 residual stream: a bf16 out from f32 and bf16 tables (and
     * no wpe, Llama's), a bf16 dout (with and without dwpe): the CPU
     * twins' bits (the same adds, rounded once; dout widened exactly) */
    size_t nte = (size_t)V * C, npe = (size_t)maxT * C;
    uint16_t *te16 = malloc(nte * 2), *pe16 = malloc(npe * 2), *o16 = malloc(bt * C * 2);
    uint16_t *dy16 = malloc(bt * C * 2);
    zk_cast_f32_bf16(te16, wte, nte); zk_cast_f32_bf16(pe16, wpe, npe);
    zk_cast_f32_bf16(dy16, dy, bt * C);
    uint16_t *d_te16 = up(te16, nte * 2), *d_pe16 = up(pe16, npe * 2), *d_o16 = up(o16, bt * C * 2);
    uint16_t *d_dy16 = up(dy16, bt * C * 2);
    for (int k = 0; k < 3; k++) {                 /* w16 0, 1; 2: w16 0 without wpe */
        int w16 = k == 1;
        const void *hte = w16 ? (const void *)te16 : wte, *hpe = k == 2 ? NULL : w16 ? (const void *)pe16 : wpe;
        const void *dte = w16 ? (const void *)d_te16 : dwte;
        const void *dpe = k == 2 ? NULL : w16 ? (const void *)d_pe16 : dwpe;
        char nm[128];
        snprintf(nm, sizeof nm, "encoder forward bf16 out, %s tables%s: CPU bits", w16 ? "bf16" : "f32",
                 k == 2 ? ", no wpe" : "");
        bad_c = zk_encoder_forward_o16(o16, tok, hte, hpe, w16, B, T, C, V);
        bad_g = dv->encoder_forward(d_o16, 1, dtok, dte, dpe, w16, B, T, C, V);
        rs = dv->sync();
        ct_check(bad_g == 0 && bad_c == 2 && rs == ZT_EINVAL, nm, "bad ids: gpu %d, sync %d, cpu %d",
                 bad_g, rs, bad_c);
        uint16_t *g16 = down(d_o16, bt * C * 2);
        same_bits(nm, g16, o16, bt * C * 2);
        free(g16);
    }
    for (int k = 0; k < 2; k++) {                 /* 1: no dwpe (Llama's) */
        float *te = ct_rand(nte, -1, 1), *pe = ct_rand(npe, -1, 1);
        float *d_te = up(te, nte * 4), *d_pe = up(pe, npe * 4);
        bad_c = zk_encoder_backward_b16(te, k ? NULL : pe, dy16, tok, B, T, C, V);
        bad_g = dv->encoder_backward(d_te, k ? NULL : d_pe, 0, d_dy16, 1, dtok, B, T, C, V);
        rs = dv->sync();
        char nm[128];
        snprintf(nm, sizeof nm, "encoder backward bf16 dout%s: dwte (accumulated), dwpe CPU bits",
                 k ? ", no dwpe" : "");
        ct_check(bad_g == 0 && bad_c == 2 && rs == ZT_EINVAL, nm, "bad ids: gpu %d, sync %d, cpu %d",
                 bad_g, rs, bad_c);
        float *g_te = down(d_te, nte * 4), *g_pe = down(d_pe, npe * 4);
        same_bits(nm, g_te, te, nte * 4);
        same_bits(nm, g_pe, pe, npe * 4);
        free(te); free(pe); free(g_te); free(g_pe); dv->free(d_te); dv->free(d_pe);
    }
    synced("encoder r16 (the counts reported once)");
    free(te16); free(pe16); free(o16); free(dy16);
    dv->free(d_te16); dv->free(d_pe16); dv->free(d_o16); dv->free(d_dy16);
    free(tok); free(wte); free(wpe); free(o); free(go); free(dy); free(gte); free(gpe); free(h_gte); free(h_gpe);
    dv->free(dtok); dv->free(dwte); dv->free(dwpe); dv->free(dout); dv->free(d_dy); dv->free(d_gte); dv->free(d_gpe);
}

static void t_xent(void)
{
    int N = 33, V = 50257;
    size_t nv = (size_t)N * V;
    float *lg = ct_rand(nv, -8, 8);
    int32_t *tg = malloc(N * 4);
    for (int i = 0; i < N; i++) tg[i] = (int32_t)(ct_u64() % V);
    tg[7] = V + 3;                                 /* a bad target */
    float *loss = malloc(N * 4), *dl = malloc(nv * 4);
    int bad_c = zk_crossentropy(loss, dl, lg, tg, N, V, V, 1.0f / 33);
    float *dlg = up(lg, nv * 4), *dloss = up(loss, N * 4);
    int32_t *dtg = up(tg, N * 4);
    int bad_g = dv->crossentropy(dloss, dlg, dlg, dtg, N, V, V, 0, 1.0f / 33);   /* dlogits aliases logits */
    int rs = dv->sync();
    ct_check(bad_g == 0 && bad_c == 1 && rs == ZT_EINVAL &&
             strstr(zt_last_error(), "zt_crossentropy: 1 of 33 targets") != NULL,
             "crossentropy: bad targets counted on the GPU, reported at the next sync",
             "gpu %d, sync %d (%s), cpu %d", bad_g, rs, zt_last_error(), bad_c);
    if (!synced("crossentropy")) return;
    float *gl = down(dloss, N * 4), *gd = down(dlg, nv * 4);
    close_to("crossentropy losses", gl, loss, N, 1e-5, 1e-5);
    close_to("crossentropy dlogits, aliasing logits", gd, dl, nv, 1e-9, 1e-5);
    free(lg); free(tg); free(loss); free(dl); free(gl); free(gd);
    dv->free(dlg); dv->free(dloss); dv->free(dtg);
}

/* the LM head's layout: rows of V padded to Vp, fp32 and bf16, in place;
 * against the CPU twins (bf16: within one bf16 ulp), the pad written 0 and
 * never read (NaN in the logits' pad) */
static void t_xent_padded(int bf16)
{
    char name[128];
    int N = 17, V = 50257, ld = 50304;
    size_t nl = (size_t)N * ld;
    float *lg = ct_rand(nl, -8, 8);
    for (int n = 0; n < N; n++) for (int j = V; j < ld; j++) lg[(size_t)n * ld + j] = NAN;
    int32_t *tg = malloc(N * 4);
    for (int i = 0; i < N; i++) tg[i] = (int32_t)(ct_u64() % V);
    float *loss = malloc(N * 4), *dl = malloc(nl * 4);
    uint16_t *h16 = malloc(nl * 2), *d16 = malloc(nl * 2);
    if (bf16) {
        zk_cast_f32_bf16(h16, lg, nl);
        zk_crossentropy_bf16(loss, d16, h16, tg, N, V, ld, 1.0f / N);
        zk_cast_bf16_f32(dl, d16, nl);
    } else {
        zk_crossentropy(loss, dl, lg, tg, N, V, ld, 1.0f / N);
    }
    void *dlg = bf16 ? (void *)up(h16, nl * 2) : (void *)up(lg, nl * 4);
    float *dloss = up(loss, N * 4);
    int32_t *dtg = up(tg, N * 4);
    int bad = dv->crossentropy(dloss, dlg, dlg, dtg, N, V, ld, bf16, 1.0f / N);
    snprintf(name, sizeof name, "crossentropy %s rows of %d padded to %d", bf16 ? "bf16" : "f32", V, ld);
    ct_check(bad == 0, name, "counted %d bad targets", bad);
    if (!synced(name)) return;
    float *gl = down(dloss, N * 4), *gd = malloc(nl * 4);
    if (bf16) { uint16_t *g16 = down(dlg, nl * 2); zk_cast_bf16_f32(gd, g16, nl); free(g16); }
    else { float *g32 = down(dlg, nl * 4); memcpy(gd, g32, nl * 4); free(g32); }
    long pad = 0;
    for (int n = 0; n < N; n++) for (int j = V; j < ld; j++) pad += gd[(size_t)n * ld + j] != 0.0f;
    snprintf(name, sizeof name, "crossentropy %s padded: losses", bf16 ? "bf16" : "f32");
    close_to(name, gl, loss, N, 1e-5, 1e-5);
    for (int n = 0; n < N; n++) for (int j = V; j < ld; j++) { gd[(size_t)n * ld + j] = 0; dl[(size_t)n * ld + j] = 0; }
    snprintf(name, sizeof name, "crossentropy %s padded: dlogits (%s)", bf16 ? "bf16" : "f32",
             bf16 ? "one bf16 ulp" : "1e-5 relative");
    close_to(name, gd, dl, nl, 1e-9, bf16 ? 1.0 / 128 : 1e-5);
    snprintf(name, sizeof name, "crossentropy %s padded: the pad written 0", bf16 ? "bf16" : "f32");
    ct_check(pad == 0, name, "%ld pad elements not 0", pad);
    free(lg); free(tg); free(loss); free(dl); free(h16); free(d16); free(gl); free(gd);
    dv->free(dlg); dv->free(dloss); dv->free(dtg);
}

static void t_xent_padded_both(void) { t_xent_padded(0); t_xent_padded(1); }

static void t_adamw(void)
{
    size_t n = 200003;
    float *p = ct_rand(n, -1, 1), *g = ct_rand(n, -1, 1), *m = ct_alloc(n * 4), *v = ct_alloc(n * 4);
    float *dp = up(p, n * 4), *dg = up(g, n * 4), *dm = up(m, n * 4), *dvv = up(v, n * 4);
    for (int t = 1; t <= 3; t++) {
        zk_adamw(p, g, m, v, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, t);
        dv->adamw(dp, dg, dm, dvv, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, t);
    }
    if (!synced("adamw")) return;
    float *hp = down(dp, n * 4), *hm = down(dm, n * 4), *hv = down(dvv, n * 4);
    same_bits("adamw 3 steps: param has the CPU bits", hp, p, n * 4);
    same_bits("adamw 3 steps: m, v have the CPU bits", hm, m, n * 4);
    same_bits("adamw v", hv, v, n * 4);
    /* one launch over segments with their own decays: the CPU's bits a
     * segment, the gap between segments untouched */
    zt_adamw_segs sg = { 3, { 0, 70001, 150000 }, { 70000, 50000, 50003 }, { 0.1f, 0.0f, 0.2f } };
    for (int t = 4; t <= 5; t++) {
        for (int s = 0; s < 3; s++) {
            size_t o = (size_t)sg.off[s];
            zk_adamw(p + o, g + o, m + o, v + o, (size_t)sg.len[s], 6e-4f, 0.9f, 0.95f, 1e-8f,
                     sg.wd[s], 0.7f, t);
        }
        dv->adamw_segments(dp, dg, ZT_F32, dm, dvv, NULL, -1, &sg, 6e-4f, 0.9f, 0.95f, 1e-8f,
                           0.7f, t);
    }
    if (!synced("adamw segments")) return;
    free(hp); free(hm); free(hv);
    hp = down(dp, n * 4); hm = down(dm, n * 4); hv = down(dvv, n * 4);
    same_bits("adamw segments (one launch): param has the CPU bits", hp, p, n * 4);
    same_bits("adamw segments: m, v have the CPU bits", hm, m, n * 4);
    same_bits("adamw segments v", hv, v, n * 4);
    free(p); free(g); free(m); free(v); free(hp); free(hm); free(hv);
    dv->free(dp); dv->free(dg); dv->free(dm); dv->free(dvv);
}

static void t_sums(void)
{
    size_t n = 5 * ZK_SUM_BLOCK + 777, nb = 6;
    float *x = ct_rand(n, -3, 3);
    double pc[6], pg[6], sc, sg;
    zk_sumsq_blocks(pc, x, n);
    sc = zk_sum_f64(x, n);
    float *dx = up(x, n * 4);
    dv->sumsq_blocks(pg, dx, ZT_F32, n);
    sg = dv->sum(dx, n);
    if (!synced("sums")) return;
    same_bits("sumsq_blocks: CPU bits", pg, pc, nb * 8);
    same_bits("sum: CPU bits", &sg, &sc, 8);
    {   /* two tensors' partials in one call (one copy, one wait) */
        double pm[8] = { 0 };
        const void *xs[2] = { dx, dx + ZK_SUM_BLOCK };
        size_t ns[2] = { n, 777 };
        dv->sumsq_blocks_many(pm, xs, ZT_F32, ns, 2);
        double p2[1];
        zk_sumsq_blocks(p2, x + ZK_SUM_BLOCK, 777);
        if (!synced("sumsq_blocks_many")) return;
        same_bits("sumsq_blocks_many: the CPU bits of each tensor in turn", pm, pc, nb * 8);
        same_bits("sumsq_blocks_many: the second tensor's block", pm + nb, p2, 8);
    }
    free(x); dv->free(dx);
}

/* A mixed-precision step's stored 2-byte gradient (dtype ZT_BF16 or
 * ZT_F16) of n gradient-like values -- [-1, 1) times 2^-12 .. 2^12, so
 * their squares spread over binades and the fp64 chains round (2-byte
 * values of one binade would add exactly in any order and hide a lane
 * order broken) -- and w, its exact widening (the f32 copy the kernels
 * must match bit for bit) */
static uint16_t *grad16(float *w, size_t n, int dtype)
{
    uint16_t *h = malloc(n * 2 + 1);
    for (size_t i = 0; i < n; i++) w[i] = ldexpf(ct_unif(-1, 1), (int)ct_unif(-12, 13));
    if (dtype == ZT_BF16) { zk_cast_f32_bf16(h, w, n); zk_cast_bf16_f32(w, h, n); }
    else { zk_cast_f32_f16(h, w, n); zk_cast_f16_f32(w, h, n); }
    return h;
}

/* adamw_segments reading a 2-byte g as it is: p, m, v (and lp, lp_dtype
 * >= 0) the bits of the same call on an f32 g holding the widened values,
 * and the CPU's (zk_adamw a segment, lp its cast) */
static void t_adamw_g16_one(int g_dtype, int lp_dtype)
{
    char name[160], what[64];
    snprintf(what, sizeof what, "%s g, %s", g_dtype == ZT_BF16 ? "bf16" : "f16",
             lp_dtype == ZT_BF16 ? "bf16 lp" : lp_dtype == ZT_F16 ? "f16 lp" : "no lp");
    size_t n = 200003;
    float *g = ct_alloc(n * 4), *p = ct_rand(n, -1, 1), *m = ct_alloc(n * 4), *v = ct_alloc(n * 4);
    uint16_t *g16 = grad16(g, n, g_dtype), *lp = ct_alloc(n * 2);
    float *dp[2], *dm[2], *dvv[2];
    uint16_t *dlp[2] = { NULL, NULL };
    for (int k = 0; k < 2; k++) {        /* [0]: the f32 g, [1]: the 2-byte one */
        dp[k] = up(p, n * 4); dm[k] = up(m, n * 4); dvv[k] = up(v, n * 4);
        if (lp_dtype >= 0) dlp[k] = up(lp, n * 2);
    }
    void *dg = up(g, n * 4), *dg16 = up(g16, n * 2);
    zt_adamw_segs sg = { 3, { 0, 70001, 150000 }, { 70000, 50000, 50003 }, { 0.1f, 0.0f, 0.2f } };
    for (int t = 1; t <= 2; t++) {
        dv->adamw_segments(dp[0], dg, ZT_F32, dm[0], dvv[0], dlp[0], lp_dtype, &sg, 6e-4f, 0.9f,
                           0.95f, 1e-8f, 0.7f, t);
        dv->adamw_segments(dp[1], dg16, g_dtype, dm[1], dvv[1], dlp[1], lp_dtype, &sg, 6e-4f,
                           0.9f, 0.95f, 1e-8f, 0.7f, t);
        for (int s = 0; s < 3; s++) {
            size_t o = (size_t)sg.off[s];
            zk_adamw(p + o, g + o, m + o, v + o, (size_t)sg.len[s], 6e-4f, 0.9f, 0.95f, 1e-8f,
                     sg.wd[s], 0.7f, t);
        }
    }
    for (int s = 0; lp_dtype >= 0 && s < 3; s++) {
        size_t o = (size_t)sg.off[s];
        if (lp_dtype == ZT_BF16) zk_cast_f32_bf16(lp + o, p + o, (size_t)sg.len[s]);
        else zk_cast_f32_f16(lp + o, p + o, (size_t)sg.len[s]);
    }
    snprintf(name, sizeof name, "adamw segments, %s", what);
    if (!synced(name)) return;
    for (int k = 0; k < 2; k++) {
        const char *run = k ? "the 2-byte g" : "the f32 g";
        float *hp = down(dp[k], n * 4), *hm = down(dm[k], n * 4), *hv = down(dvv[k], n * 4);
        snprintf(name, sizeof name, "adamw segments, %s: %s's param, the CPU's bits on the widened g", what, run);
        same_bits(name, hp, p, n * 4);
        snprintf(name, sizeof name, "adamw segments, %s: %s's m, v", what, run);
        same_bits(name, hm, m, n * 4);
        same_bits(name, hv, v, n * 4);
        if (lp_dtype >= 0) {
            uint16_t *hl = down(dlp[k], n * 2);
            snprintf(name, sizeof name, "adamw segments, %s: %s's lp, the casts' bits", what, run);
            same_bits(name, hl, lp, n * 2);
            free(hl);
            dv->free(dlp[k]);
        }
        free(hp); free(hm); free(hv);
        dv->free(dp[k]); dv->free(dm[k]); dv->free(dvv[k]);
    }
    free(g); free(p); free(m); free(v); free(g16); free(lp);
    dv->free(dg); dv->free(dg16);
}

static void t_adamw_g16(void)
{
    t_adamw_g16_one(ZT_BF16, -1);
    t_adamw_g16_one(ZT_BF16, ZT_BF16);
    t_adamw_g16_one(ZT_F16, -1);
    t_adamw_g16_one(ZT_F16, ZT_F16);
    /* another g kind: refused before any launch */
    int64_t off = 0, len = 1;
    float wd = 0.0f;
    int e = zkc_adamw_segments(zt_cuda_compute_stream(), NULL, NULL, 3, NULL, NULL, NULL, 0, 1,
                               &off, &len, &wd, 1e-3f, 0.9f, 0.95f, 1e-8f, 1.0f, 1);
    ct_check(e == cudaErrorInvalidValue, "zkc_adamw_segments: g kind 3 refused", "returned %d", e);
}

/* adamw_multi (a step's whole update in one launch, zkc_adamw_multi):
 * items over four device buffers at odd offsets with gaps between them,
 * sizes about the kernel's 1024-element tile (many items in a tile, one
 * item across tiles), or (many) 1300 small items of 0..40 elements, more
 * than one launch's table of 600; two steps. Against adamw_segments on
 * copies, one call an item (one segment each): p, m, v and lp the same
 * bits, every element outside the items untouched on both. */
#define AM_BUFS 4
typedef struct am_item { int buf; int64_t off, len; float wd; } am_item;
static void t_adamw_multi_one(int g_dtype, int lp_dtype, int many)
{
    static const am_item fixed[] = {
        { 0, 3, 1, 0.1f }, { 0, 5, 255, 0.0f }, { 0, 261, 1024, 0.1f }, { 0, 1290, 1025, 0.2f },
        { 1, 1, 70001, 0.1f }, { 1, 70011, 3, 0.0f },
        { 2, 7, 1023, 0.1f }, { 2, 1031, 4097, 0.0f }, { 2, 5129, 33, 0.3f },
        { 3, 0, 256, 0.1f }, { 3, 257, 50000, 0.1f },
    };
    int n = many ? 1300 : (int)(sizeof fixed / sizeof *fixed);
    am_item *its = malloc((size_t)n * sizeof *its);
    size_t bn[AM_BUFS] = { 2400, 70020, 5170, 50300 };
    if (many) {
        int64_t at[AM_BUFS] = { 0 };
        for (int k = 0; k < n; k++) {
            int q = k % AM_BUFS;
            int64_t len = 1 + (int64_t)ct_unif(0, 40);
            if (len > 40) len = 40;
            at[q] += (int64_t)ct_unif(0, 3);           /* a gap of 0..2 */
            its[k] = (am_item){ q, at[q], len, (k % 3) * 0.1f };
            at[q] += len;
        }
        for (int q = 0; q < AM_BUFS; q++) bn[q] = (size_t)at[q] + 1;
    } else memcpy(its, fixed, sizeof fixed);
    char name[200], what[96];
    snprintf(what, sizeof what, "%d items, %s g, %s", n,
             g_dtype == ZT_BF16 ? "bf16" : g_dtype == ZT_F16 ? "f16" : "f32",
             lp_dtype == ZT_BF16 ? "bf16 lp" : lp_dtype == ZT_F16 ? "f16 lp" : "no lp");
    size_t gs = g_dtype == ZT_F32 ? 4 : 2;
    /* [0]: adamw_multi, [1]: adamw_segments an item */
    float *dp[2][AM_BUFS], *dm[2][AM_BUFS], *dvv[2][AM_BUFS];
    void *dg[AM_BUFS];
    uint16_t *dlp[2][AM_BUFS];
    for (int q = 0; q < AM_BUFS; q++) {
        size_t nq = bn[q];
        float *p = ct_rand(nq, -1, 1), *m = ct_rand(nq, -0.01f, 0.01f), *v = ct_rand(nq, 0, 1e-4f);
        float *gw = ct_alloc(nq * 4);
        uint16_t *lp = malloc(nq * 2 + 2), *g16 = NULL;
        for (size_t i = 0; i < nq; i++) lp[i] = 0x7fc1;               /* untouched outside */
        if (g_dtype == ZT_F32) for (size_t i = 0; i < nq; i++) gw[i] = ldexpf(ct_unif(-1, 1), (int)ct_unif(-12, 13));
        else g16 = grad16(gw, nq, g_dtype);
        dg[q] = g16 ? up(g16, nq * 2) : up(gw, nq * 4);
        for (int k = 0; k < 2; k++) {
            dp[k][q] = up(p, nq * 4); dm[k][q] = up(m, nq * 4); dvv[k][q] = up(v, nq * 4);
            dlp[k][q] = up(lp, nq * 2);
        }
        free(p); free(m); free(v); free(gw); free(lp); free(g16);
    }
    zt_adamw_item *it = malloc((size_t)n * sizeof *it);
    for (int k = 0; k < n; k++) {
        int q = its[k].buf;
        int64_t o = its[k].off;
        it[k] = (zt_adamw_item){ dp[0][q] + o, (const char *)dg[q] + o * gs, dm[0][q] + o,
                                 dvv[0][q] + o, lp_dtype >= 0 ? (void *)(dlp[0][q] + o) : NULL,
                                 its[k].len, its[k].wd };
    }
    for (int t = 1; t <= 2; t++) {
        dv->adamw_multi(it, n, g_dtype, lp_dtype, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.7f, t);
        for (int k = 0; k < n; k++) {
            int q = its[k].buf;
            zt_adamw_segs sg = { 1, { its[k].off }, { its[k].len }, { its[k].wd } };
            dv->adamw_segments(dp[1][q], dg[q], g_dtype, dm[1][q], dvv[1][q],
                               lp_dtype >= 0 ? dlp[1][q] : NULL, lp_dtype, &sg, 6e-4f, 0.9f,
                               0.95f, 1e-8f, 0.7f, t);
        }
    }
    snprintf(name, sizeof name, "adamw_multi, %s: runs", what);
    if (synced(name)) {
        int bad = 0;
        for (int q = 0; q < AM_BUFS; q++) {
            size_t nq = bn[q];
            float *a[3] = { down(dp[0][q], nq * 4), down(dm[0][q], nq * 4), down(dvv[0][q], nq * 4) };
            float *b[3] = { down(dp[1][q], nq * 4), down(dm[1][q], nq * 4), down(dvv[1][q], nq * 4) };
            uint16_t *la = down(dlp[0][q], nq * 2), *lb = down(dlp[1][q], nq * 2);
            for (int k = 0; k < 3; k++) { bad += memcmp(a[k], b[k], nq * 4) != 0; free(a[k]); free(b[k]); }
            bad += memcmp(la, lb, nq * 2) != 0;
            free(la); free(lb);
        }
        snprintf(name, sizeof name, "adamw_multi, %s: p, m, v, lp the bits of adamw_segments an "
                 "item (the gaps untouched)", what);
        ct_check(bad == 0, name, "%d of %d arrays differ", bad, 4 * AM_BUFS);
    }
    for (int q = 0; q < AM_BUFS; q++) {
        dv->free(dg[q]);
        for (int k = 0; k < 2; k++) {
            dv->free(dp[k][q]); dv->free(dm[k][q]); dv->free(dvv[k][q]); dv->free(dlp[k][q]);
        }
    }
    free(it); free(its);
}

static void t_adamw_multi(void)
{
    t_adamw_multi_one(ZT_F32, -1, 0);
    t_adamw_multi_one(ZT_F32, ZT_BF16, 0);
    t_adamw_multi_one(ZT_BF16, -1, 0);
    t_adamw_multi_one(ZT_BF16, ZT_BF16, 0);
    t_adamw_multi_one(ZT_F16, ZT_F16, 0);
    t_adamw_multi_one(ZT_BF16, ZT_BF16, 1);    /* three launches */
    t_adamw_multi_one(ZT_F32, -1, 1);
    /* refused before any launch: another g kind, an lp kind without lp */
    float *np = NULL;
    const void *ng = NULL;
    int64_t len = 1;
    float wd = 0.0f;
    int e0 = zkc_adamw_multi(zt_cuda_compute_stream(), 1, &np, &ng, &np, &np, NULL, &len, &wd, 3,
                             0, 1e-3f, 0.9f, 0.95f, 1e-8f, 1.0f, 1);
    int e1 = zkc_adamw_multi(zt_cuda_compute_stream(), 1, &np, &ng, &np, &np, NULL, &len, &wd, 0,
                             1, 1e-3f, 0.9f, 0.95f, 1e-8f, 1.0f, 1);
    int e2 = zkc_adamw_multi(zt_cuda_compute_stream(), 0, &np, &ng, &np, &np, NULL, &len, &wd, 0,
                             0, 1e-3f, 0.9f, 0.95f, 1e-8f, 1.0f, 1);
    ct_check(e0 == cudaErrorInvalidValue && e1 == cudaErrorInvalidValue &&
             e2 == cudaErrorInvalidValue, "zkc_adamw_multi: g kind 3, lp kind without lp, 0 "
             "items refused", "returned %d %d %d", e0, e1, e2);
}

/* The gradient norm's partials of a 2-byte x read as it is: the bits of
 * the f32 call on the widened copy at the same element offset and of
 * zk_sumsq_blocks on it -- offsets 0..4 from a 256-byte aligned start (0
 * and 4: the 8-byte loads of the two-thread path, as an f32 x takes 16;
 * 1..3: a thread a lane), whole blocks, tails, a short tensor; then
 * sumsq_blocks_many over 2-byte tensors at assorted offsets. */
static void t_sums16_one(int dtype)
{
    char name[160];
    const char *ty = dtype == ZT_BF16 ? "bf16" : "f16";
    size_t n = 5 * ZK_SUM_BLOCK + 777, room = n + 8, nb = 6;
    float *w = ct_alloc(room * 4);
    uint16_t *h = grad16(w, room, dtype);
    uint16_t *d16 = up(h, room * 2);
    float *d32 = up(w, room * 4);
    const size_t lens[] = { n, 3, ZK_SUM_BLOCK, ZK_SUM_BLOCK + 5 };
    for (int off = 0; off <= 4; off++)
        for (size_t j = 0; j < sizeof lens / sizeof *lens; j++) {
            size_t len = lens[j], lb = (len + ZK_SUM_BLOCK - 1) / ZK_SUM_BLOCK;
            double p16[6], p32[6], pc[6];
            dv->sumsq_blocks(p16, d16 + off, dtype, len);
            dv->sumsq_blocks(p32, d32 + off, ZT_F32, len);
            zk_sumsq_blocks(pc, w + off, len);
            snprintf(name, sizeof name, "sumsq_blocks %s x+%d n=%zu", ty, off, len);
            if (!synced(name)) return;
            snprintf(name, sizeof name, "sumsq_blocks %s x+%d n=%zu: the f32 copy's bits", ty, off, len);
            same_bits(name, p16, p32, lb * 8);
            snprintf(name, sizeof name, "sumsq_blocks %s x+%d n=%zu: the CPU's bits on the widened x", ty, off, len);
            same_bits(name, p16, pc, lb * 8);
        }
    {   /* several tensors, one call: each one's partials in turn */
        const void *xs[3] = { d16 + 1, d16 + 4, d16 };
        const void *xs32[3] = { d32 + 1, d32 + 4, d32 };
        size_t ns[3] = { 2000, n, 5 }, tot = 2 + nb + 1;
        double pm[9], pm32[9], pc[9];
        dv->sumsq_blocks_many(pm, xs, dtype, ns, 3);
        dv->sumsq_blocks_many(pm32, xs32, ZT_F32, ns, 3);
        zk_sumsq_blocks(pc, w + 1, 2000);
        zk_sumsq_blocks(pc + 2, w + 4, n);
        zk_sumsq_blocks(pc + 2 + nb, w, 5);
        snprintf(name, sizeof name, "sumsq_blocks_many %s", ty);
        if (!synced(name)) return;
        snprintf(name, sizeof name, "sumsq_blocks_many %s: the f32 copies' bits", ty);
        same_bits(name, pm, pm32, tot * 8);
        snprintf(name, sizeof name, "sumsq_blocks_many %s: the CPU's bits, each tensor in turn", ty);
        same_bits(name, pm, pc, tot * 8);
    }
    free(w); free(h);
    dv->free(d16); dv->free(d32);
}

static void t_sums16(void)
{
    t_sums16_one(ZT_BF16);
    t_sums16_one(ZT_F16);
    int e = zkc_sumsq_blocks(zt_cuda_compute_stream(), NULL, NULL, 3, 5);
    ct_check(e == cudaErrorInvalidValue, "zkc_sumsq_blocks: x kind 3 refused", "returned %d", e);
}

/* The communicators' rank-order sum: CUDA and CPU bits, for rank counts
 * where the order matters (values spread over 2^-20..2^20, so another
 * association rounds differently -- checked, or the test proves nothing). */
static void t_sum_ranks(void)
{
    const size_t n = 100003;
    const int ranks[] = { 1, 2, 3, 5, 8 };
    float *src = ct_alloc(8 * n * 4), *want = ct_alloc(n * 4), *rev = ct_alloc(n * 4);
    for (size_t i = 0; i < 8 * n; i++)
        src[i] = ct_unif(-1, 1) * ldexpf(1.0f, (int)(ct_unif(-20, 20)));
    float *dsrc = up(src, 8 * n * 4), *ddst = NULL;
    dv->alloc((void **)&ddst, n * 4);
    for (int k = 0; k < 5; k++) {
        int p = ranks[k];
        char name[96];
        zk_sum_ranks(want, src, p, n);
        int e = zkc_sum_ranks(zt_cuda_compute_stream(), ddst, dsrc, p, n);
        float *got = down(ddst, n * 4);
        snprintf(name, sizeof name, "sum_ranks over %d ranks: the CPU's bits", p);
        if (e) ct_fail(name, "launch: %s", cudaGetErrorString((cudaError_t)e));
        else if (synced(name)) same_bits(name, got, want, n * 4);
        free(got);
        if (p >= 3) {   /* the same sum in reverse rank order is another result */
            size_t diff = 0;
            for (size_t i = 0; i < n; i++) {
                float r = src[(size_t)(p - 1) * n + i];
                for (int j = p - 2; j >= 0; j--) r += src[(size_t)j * n + i];
                diff += memcmp(&r, &want[i], 4) != 0;
            }
            snprintf(name, sizeof name, "sum_ranks over %d ranks: the order shows", p);
            ct_check(diff > n / 100, name, "only %zu of %zu elements differ in reverse order",
                     diff, n);
        }
    }
    free(src); free(want); free(rev);
    dv->free(dsrc); dv->free(ddst);
}

/* Llama's kernels (rmsnorm, rope, swiglu) called directly, against the CPU
 * twins: RMS norm at the layer norm's tolerances (C 771: the scalar path,
 * 2048: the vector one), RoPE the CPU's bits, SwiGLU within 4e-7 */
static void t_llama_rmsnorm(int N, int C)
{
    char name[128];
    cudaStream_t s = zt_cuda_compute_stream();
    size_t nc = (size_t)N * C, ns = zkc_rmsnorm_scratch(N, C);
    float *x = ct_rand(nc, -3, 3), *w = ct_rand(C, 0.5f, 1.5f), *dy = ct_rand(nc, -1, 1);
    float *o = ct_alloc(nc * 4), *r = ct_alloc(N * 4), *di = ct_rand(nc, -1, 1), *dw = ct_alloc(C * 4);
    zk_rmsnorm_forward(o, r, x, w, 1e-5f, N, C);
    float *dx = up(x, nc * 4), *dwt = up(w, C * 4), *ddy = up(dy, nc * 4), *ddi = up(di, nc * 4);
    float *dout = NULL, *dr = NULL, *ddw = NULL;
    double *scr = NULL;
    dv->alloc((void **)&dout, nc * 4); dv->alloc((void **)&dr, N * 4); dv->alloc((void **)&ddw, C * 4);
    dv->alloc((void **)&scr, ns * 8);
    zk_rmsnorm_backward(di, dw, dy, x, w, r, N, C);
    int e = zkc_rmsnorm_forward(s, dout, 0, dr, dx, dwt, 0, 1e-5f, N, C);
    e = e ? e : zkc_rmsnorm_backward(s, ddi, NULL, ddw, 0, ddy, dx, dwt, 0, dr, N, C, scr);
    snprintf(name, sizeof name, "rmsnorm N=%d C=%d: launched", N, C);
    if (e) { ct_fail(name, "%s", cudaGetErrorString((cudaError_t)e)); return; }
    if (!synced(name)) return;
    float *go = down(dout, nc * 4), *gr = down(dr, N * 4), *gdi = down(ddi, nc * 4), *gdw = down(ddw, C * 4);
    snprintf(name, sizeof name, "rmsnorm N=%d C=%d: forward out", N, C);
    close_to(name, go, o, nc, 1e-5, 1e-5);
    snprintf(name, sizeof name, "rmsnorm N=%d C=%d: rstd", N, C);
    close_to(name, gr, r, N, 1e-5, 1e-5);
    snprintf(name, sizeof name, "rmsnorm N=%d C=%d: backward dinp (accumulated)", N, C);
    close_to(name, gdi, di, nc, 1e-5, 1e-5);
    snprintf(name, sizeof name, "rmsnorm N=%d C=%d: backward dweight", N, C);
    close_to(name, gdw, dw, C, 1e-5, 1e-4);
    free(x); free(w); free(dy); free(o); free(r); free(di); free(dw);
    free(go); free(gr); free(gdi); free(gdw);
    dv->free(dx); dv->free(dwt); dv->free(ddy); dv->free(ddi); dv->free(dout); dv->free(dr);
    dv->free(ddw); dv->free(scr);
}

static void t_llama_rope_swiglu(void)
{
    cudaStream_t s = zt_cuda_compute_stream();
    int B = 2, T = 129, hs = 128, nq = 4, nkv = 2, N = B * T, ld = (nq + 2 * nkv) * hs, h2 = hs / 2;
    size_t n = (size_t)N * ld;
    zk_rope_scaling l3 = { 8.0, 1.0, 4.0, 8192.0 };
    float *c = ct_alloc((size_t)T * h2 * 4), *sn = ct_alloc((size_t)T * h2 * 4);
    zk_rope_table(c, sn, T, hs, 500000.0, &l3);
    float *x = ct_rand(n, -2, 2), *want = malloc(n * 4);
    memcpy(want, x, n * 4);
    zk_rope_forward(want, N, T, ld, nq + nkv, hs, c, sn, 0);
    float *dx = up(x, n * 4), *dc = up(c, (size_t)T * h2 * 4), *ds = up(sn, (size_t)T * h2 * 4);
    int e = zkc_rope_forward(s, dx, N, T, ld, nq + nkv, hs, dc, ds, 0);
    if (e) ct_fail("rope forward: launched", "%s", cudaGetErrorString((cudaError_t)e));
    else if (synced("rope forward")) {
        float *got = down(dx, n * 4);
        same_bits("rope forward (Llama 3 table, q and k heads): the CPU's bits", got, want, n * 4);
        free(got);
    }
    zk_rope_backward(want, N, T, ld, nq + nkv, hs, c, sn, 0);
    e = zkc_rope_backward(s, dx, N, T, ld, nq + nkv, hs, dc, ds, 0);
    if (e) ct_fail("rope backward: launched", "%s", cudaGetErrorString((cudaError_t)e));
    else if (synced("rope backward")) {
        float *got = down(dx, n * 4);
        same_bits("rope backward: the CPU's bits", got, want, n * 4);
        free(got);
    }
    free(c); free(sn); free(x); free(want); dv->free(dx); dv->free(dc); dv->free(ds);
    int F = 1003;
    size_t nf = (size_t)N * F;
    float *gu = ct_rand(2 * nf, -20, 20), *d = ct_rand(nf, -1, 1), *o = ct_alloc(nf * 4), *g = ct_alloc(2 * nf * 4);
    zk_swiglu_forward(o, gu, N, F);
    zk_swiglu_backward(g, d, gu, N, F);
    float *dgu = up(gu, 2 * nf * 4), *dd = up(d, nf * 4), *dout = NULL, *dg = NULL;
    dv->alloc((void **)&dout, nf * 4); dv->alloc((void **)&dg, 2 * nf * 4);
    e = zkc_swiglu_forward(s, dout, dgu, N, F);
    e = e ? e : zkc_swiglu_backward(s, dg, dd, dgu, N, F);
    if (e) ct_fail("swiglu: launched", "%s", cudaGetErrorString((cudaError_t)e));
    else if (synced("swiglu")) {
        float *go = down(dout, nf * 4), *gg = down(dg, 2 * nf * 4);
        close_to("swiglu forward (within 4e-7 of the CPU)", go, o, nf, 1e-30, 4e-7);
        close_to("swiglu backward (within 4e-7 of the CPU)", gg, g, 2 * nf, 1e-30, 4e-7);
        free(go); free(gg);
    }
    free(gu); free(d); free(o); free(g); dv->free(dgu); dv->free(dd); dv->free(dout); dv->free(dg);
}

/* bf16 activations: RoPE on bf16 rows the CPU's bits; SwiGLU's bf16 out
 * and dgu (from a bf16 dout), the RMS norm's bf16 out and dinp16 within
 * one bf16 rounding of the CPU's (their f32 values agree to ~1e-6, then
 * each rounds once) */
static void t_llama_bf16(void)
{
    cudaStream_t s = zt_cuda_compute_stream();
    int B = 2, T = 65, hs = 64, nh = 6, N = B * T, ld = 8 * hs, h2 = hs / 2, F = 515, C = 768;
    size_t n = (size_t)N * ld, nf = (size_t)N * F, nc = (size_t)N * C;
    float *c = ct_alloc((size_t)T * h2 * 4), *sn = ct_alloc((size_t)T * h2 * 4);
    zk_rope_table(c, sn, T, hs, 10000.0, NULL);
    float *xf = ct_rand(n, -2, 2), *guf = ct_rand(2 * nf, -20, 20), *d = ct_rand(nf, -1, 1);
    uint16_t *x = malloc(n * 2), *gu = malloc(2 * nf * 2), *o = malloc(nf * 2), *g = malloc(2 * nf * 2);
    uint16_t *d16 = malloc(nf * 2);
    zk_cast_f32_bf16(x, xf, n); zk_cast_f32_bf16(gu, guf, 2 * nf); zk_cast_f32_bf16(d16, d, nf);
    uint16_t *dx = up(x, n * 2), *dgu = up(gu, 2 * nf * 2), *dout = NULL, *dg = NULL;
    uint16_t *dd = up(d16, nf * 2);
    float *dc = up(c, (size_t)T * h2 * 4), *ds = up(sn, (size_t)T * h2 * 4);
    dv->alloc((void **)&dout, nf * 2); dv->alloc((void **)&dg, 2 * nf * 2);
    zk_rope_forward_b16(x, N, T, ld, nh, hs, c, sn, 0);
    zk_rope_backward_b16(x, N, T, ld, 2, hs, c, sn, 0);
    zk_swiglu_forward_bb(o, gu, N, F);
    zk_swiglu_backward_bb(g, d16, gu, N, F);
    int e = zkc_rope_forward_b16(s, dx, N, T, ld, nh, hs, dc, ds, 0);
    e = e ? e : zkc_rope_backward_b16(s, dx, N, T, ld, 2, hs, dc, ds, 0);
    e = e ? e : zkc_swiglu_forward_bb(s, dout, dgu, N, F);
    e = e ? e : zkc_swiglu_backward_bb(s, dg, dd, dgu, N, F);
    /* the RMS norm: bf16 out, and dinp16 */
    float *xr = ct_rand(nc, -3, 3), *w = ct_rand(C, 0.5f, 1.5f), *dy = ct_rand(nc, -1, 1);
    float *r = ct_alloc(N * 4), *di = ct_rand(nc, -1, 1);
    uint16_t *ro = malloc(nc * 2), *ri = malloc(nc * 2), *dro = NULL, *dri = NULL;
    float *dxr = up(xr, nc * 4), *dw = up(w, C * 4), *ddy = up(dy, nc * 4), *ddi = up(di, nc * 4), *dr = NULL;
    dv->alloc((void **)&dro, nc * 2); dv->alloc((void **)&dri, nc * 2); dv->alloc((void **)&dr, N * 4);
    zk_rmsnorm_forward_b16(ro, r, xr, w, 1e-5f, N, C);
    zk_rmsnorm_backward_b16(di, ri, NULL, dy, xr, w, r, N, C);
    e = e ? e : zkc_rmsnorm_forward(s, dro, 1, dr, dxr, dw, 0, 1e-5f, N, C);
    e = e ? e : zkc_rmsnorm_backward(s, ddi, dri, NULL, 0, ddy, dxr, dw, 0, dr, N, C, NULL);
    if (e) ct_fail("llama bf16: launched", "%s", cudaGetErrorString((cudaError_t)e));
    else if (synced("llama bf16")) {
        uint16_t *gx = down(dx, n * 2), *go = down(dout, nf * 2), *gg = down(dg, 2 * nf * 2);
        uint16_t *gro = down(dro, nc * 2), *gri = down(dri, nc * 2);
        float *gdi = down(ddi, nc * 4);
        same_bits("rope forward + backward on bf16 rows: the CPU's bits", gx, x, n * 2);
        float *a = malloc(2 * nc * 4), *b = malloc(2 * nc * 4);
        struct { const char *name; uint16_t *got, *want; size_t n; } k[3] = {
            { "swiglu bf16 forward: within a bf16 rounding of the CPU's", go, o, nf },
            { "swiglu bf16 backward (bf16 dout): within a bf16 rounding of the CPU's", gg, g, 2 * nf },
            { "rmsnorm bf16 out: within a bf16 rounding of the CPU's", gro, ro, nc } };
        for (int i = 0; i < 3; i++) {
            zk_cast_bf16_f32(a, k[i].got, k[i].n); zk_cast_bf16_f32(b, k[i].want, k[i].n);
            close_to(k[i].name, a, b, k[i].n, 1e-30, 1.0 / 128);
        }
        /* dinp accumulates onto values near zero: its bf16 copy is checked as
         * the GPU's own dinp rounded (bits), dinp against the CPU's (the f32
         * test's tolerance) */
        close_to("rmsnorm backward with dinp16: dinp (accumulated)", gdi, di, nc, 1e-5, 1e-5);
        uint16_t *want16 = malloc(nc * 2);
        zk_cast_f32_bf16(want16, gdi, nc);
        same_bits("rmsnorm backward dinp16: the GPU's dinp rounded once", gri, want16, nc * 2);
        free(want16); free(gdi);
        free(a); free(b); free(gx); free(go); free(gg); free(gro); free(gri);
    }
    free(c); free(sn); free(xf); free(guf); free(d); free(d16); free(x); free(gu); free(o); free(g);
    free(xr); free(w); free(dy); free(r); free(di); free(ro); free(ri);
    dv->free(dx); dv->free(dgu); dv->free(dout); dv->free(dg); dv->free(dc); dv->free(ds); dv->free(dd);
    dv->free(dxr); dv->free(dw); dv->free(ddy); dv->free(ddi); dv->free(dro); dv->free(dri); dv->free(dr);
}

static void t_llama(void)
{
    t_llama_rmsnorm(67, 771);
    t_llama_rmsnorm(67, 2048);
    t_llama_rope_swiglu();
    t_llama_bf16();
}

static void t_randn(void)
{
    size_t n = 10007;
    float *h = malloc(n * 4);
    zk_randn(h, n, 42, 7, 0.0f, 0.02f);
    float *d = NULL; dv->alloc((void **)&d, n * 4);
    dv->randn(d, n, 42, 7, 0.0f, 0.02f);
    if (!synced("randn")) return;
    float *g = down(d, n * 4);
    same_bits("randn: the CPU generator's bits", g, h, n * 4);
    free(h); free(g); dv->free(d);
}

/* out (N,OC) = a (N,C) . w (OC,C)^T + b, and the gamma bound per element */
static void ref_gemm_nt(double *out, double *bound, const float *a, const float *w, const float *b,
                        int N, int C, int OC)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = 0, sa = 0;
            for (int c = 0; c < C; c++) {
                double p = (double)a[(size_t)n * C + c] * w[(size_t)o * C + c];
                s += p; sa += fabs(p);
            }
            out[(size_t)n * OC + o] = s + (b ? b[o] : 0);
            bound[(size_t)n * OC + o] = (C + 1) * 0x1p-23 * (sa + (b ? fabs(b[o]) : 0)) + 1e-30;
        }
}
static void check_gemm(const char *name, const float *got, const double *ref, const double *bound, size_t n)
{
    double worst = 0; size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(got[i] - ref[i]) / bound[i];
        if (!(e <= worst)) { worst = e; wi = i; if (isnan(e)) break; }
    }
    ct_check(worst <= 1.0, name, "element %zu: got %.9g want %.9g (%.3g of the bound)",
             wi, (double)got[wi], ref[wi], worst);
}
static float *transpose(const float *x, int R, int K)
{
    float *t = malloc((size_t)R * K * 4);
    for (int r = 0; r < R; r++) for (int k = 0; k < K; k++) t[(size_t)k * R + r] = x[(size_t)r * K + k];
    return t;
}
static void round_bf16(float *x, size_t n)
{
    uint16_t *h = malloc(n * 2); zk_cast_f32_bf16(h, x, n); zk_cast_bf16_f32(x, h, n); free(h);
}

static void t_matmul_ld(int bf16, int N, int C, int OC, int ld, int out16);
static void t_matmul(int bf16, int N, int C, int OC) { t_matmul_ld(bf16, N, C, OC, OC, 0); }

static void t_matmul_dinp16(int N, int C, int OC, int ld, const char *k, const uint16_t *ha,
                            const uint16_t *hw, const uint16_t *hd, void *da, void *dw, void *ddy,
                            const float *g32, const float *gw32, const float *gb32,
                            const double *ref, const double *bnd);

/* ld > OC: out (fp32, or bf16 with out16) and dout in rows ld apart, the
 * LM head's layout; the pad poisoned (NaN in dout), checked untouched in out.
 * bf16: the backward with a bf16 dinp too (t_matmul_dinp16) */
static void t_matmul_ld(int bf16, int N, int C, int OC, int ld, int out16)
{
    char name[160];
    int lt = zt_cuda_matmul_epilogue(-1);
    const char *k = lt == 1 || (lt == 2 && bf16)
                        ? (bf16 ? "matmul bf16 (cuBLASLt)" : "matmul fp32 (cuBLASLt)")
                        : (bf16 ? "matmul bf16" : "matmul fp32");
    float *a = ct_rand((size_t)N * C, -1, 1), *w = ct_rand((size_t)OC * C, -1, 1);
    float *b = ct_rand(OC, -1, 1), *dy = ct_rand((size_t)N * OC, -1, 1);
    if (bf16) { round_bf16(a, (size_t)N * C); round_bf16(w, (size_t)OC * C); round_bf16(dy, (size_t)N * OC); }
    float *dyp = malloc((size_t)N * ld * 4);      /* dy in rows ld apart, NaN pad */
    for (size_t i = 0; i < (size_t)N * ld; i++) dyp[i] = NAN;
    for (int n = 0; n < N; n++) memcpy(dyp + (size_t)n * ld, dy + (size_t)n * OC, (size_t)OC * 4);
    double *ref = malloc(sizeof(double) * ((size_t)N * OC + (size_t)N * C + (size_t)OC * C));
    double *bnd = malloc(sizeof(double) * ((size_t)N * OC + (size_t)N * C + (size_t)OC * C));
    /* device operands: fp32 or their bf16 bits */
    size_t es = bf16 ? 2 : 4;
    void *da, *dw, *ddy;
    uint16_t *ha = NULL, *hw = NULL, *hd = NULL;     /* bf16: the operands' bits, kept */
    if (bf16) {
        ha = malloc((size_t)N * C * 2); hw = malloc((size_t)OC * C * 2); hd = malloc((size_t)N * ld * 2);
        zk_cast_f32_bf16(ha, a, (size_t)N * C); zk_cast_f32_bf16(hw, w, (size_t)OC * C);
        zk_cast_f32_bf16(hd, dyp, (size_t)N * ld);
        da = up(ha, (size_t)N * C * es); dw = up(hw, (size_t)OC * C * es); ddy = up(hd, (size_t)N * ld * es);
    } else {
        da = up(a, (size_t)N * C * es); dw = up(w, (size_t)OC * C * es); ddy = up(dyp, (size_t)N * ld * es);
    }
    size_t oes = out16 ? 2 : 4;
    float *db = up(b, OC * 4), *dinp = NULL, *dwt = NULL, *dbias = NULL;
    void *dout = NULL;
    dv->alloc((void **)&dout, (size_t)N * ld * oes); dv->alloc((void **)&dinp, (size_t)N * C * 4);
    dv->alloc((void **)&dwt, (size_t)OC * C * 4); dv->alloc((void **)&dbias, OC * 4);
    dv->fill(dout, 7.0f, (size_t)N * ld * oes / 4);
    int rc = bf16 ? dv->matmul_bf16_forward(dout, out16, da, dw, db, 0, N, C, OC, ld)
                  : dv->matmul_forward(dout, da, dw, db, N, C, OC, ld);
    int rc2 = bf16 ? dv->matmul_bf16_backward(dinp, 0, dwt, dbias, 0, ddy, da, dw, N, C, OC, ld)
                   : dv->matmul_backward(dinp, dwt, dbias, ddy, da, dw, N, C, OC, ld);
    snprintf(name, sizeof name, "%s %dx%dx%d ld %d%s: calls succeed", k, N, C, OC, ld, out16 ? " bf16 out" : "");
    ct_check(rc == ZT_OK && rc2 == ZT_OK, name, "%d %d: %s", rc, rc2, zt_last_error());
    if (!synced(name)) return;
    float *gp = malloc((size_t)N * ld * 4), *g = malloc((size_t)N * OC * 4);
    unsigned char *raw = down(dout, (size_t)N * ld * oes), *fill = malloc((size_t)N * ld * oes);
    for (size_t i = 0; i < (size_t)N * ld * oes / 4; i++) memcpy(fill + 4 * i, &(float){7.0f}, 4);
    if (out16) zk_cast_bf16_f32(gp, (const uint16_t *)raw, (size_t)N * ld);
    else memcpy(gp, raw, (size_t)N * ld * 4);
    long pad = 0;
    for (int n = 0; n < N; n++) {
        memcpy(g + (size_t)n * OC, gp + (size_t)n * ld, (size_t)OC * 4);
        size_t o = ((size_t)n * ld + OC) * oes;
        pad += memcmp(raw + o, fill + o, (size_t)(ld - OC) * oes) != 0;
    }
    free(raw); free(fill);
    ref_gemm_nt(ref, bnd, a, w, b, N, C, OC);
    if (out16) for (size_t i = 0; i < (size_t)N * OC; i++) bnd[i] += fabs(ref[i]) * 0x1p-8;
    snprintf(name, sizeof name, "%s forward %dx%dx%d ld %d%s + bias (fp32 dot bound%s)", k, N, C, OC,
             ld, out16 ? " bf16 out" : "", out16 ? " + a bf16 rounding" : "");
    check_gemm(name, g, ref, bnd, (size_t)N * OC); free(g); free(gp);
    snprintf(name, sizeof name, "%s forward ld %d: the pad untouched", k, ld);
    ct_check(pad == 0, name, "%ld rows' pad written", pad);
    /* dinp (N,C) = dy (N,OC) . w (OC,C) = dy . (w^T)^T */
    float *wt = transpose(w, OC, C);
    float *g32 = down(dinp, (size_t)N * C * 4);
    ref_gemm_nt(ref, bnd, dy, wt, NULL, N, OC, C);
    snprintf(name, sizeof name, "%s backward dinp", k);
    check_gemm(name, g32, ref, bnd, (size_t)N * C);
    float *gw32 = down(dwt, (size_t)OC * C * 4), *gb32 = down(dbias, OC * 4);
    if (bf16) t_matmul_dinp16(N, C, OC, ld, k, ha, hw, hd, da, dw, ddy, g32, gw32, gb32, ref, bnd);
    free(g32); free(ha); free(hw); free(hd);
    /* dw (OC,C) = dy^T (OC,N) . a (N,C) = dy^T . (a^T)^T */
    float *dyt = transpose(dy, N, OC), *at = transpose(a, N, C);
    g = gw32;
    ref_gemm_nt(ref, bnd, dyt, at, NULL, OC, N, C);
    snprintf(name, sizeof name, "%s backward dweight", k);
    check_gemm(name, g, ref, bnd, (size_t)OC * C); free(g);
    float *ones = malloc(N * 4);
    for (int i = 0; i < N; i++) ones[i] = 1;
    g = gb32;
    ref_gemm_nt(ref, bnd, dyt, ones, NULL, OC, N, 1);
    snprintf(name, sizeof name, "%s backward dbias (double sum)", k);
    {
        float *r = malloc(OC * 4);
        for (int o = 0; o < OC; o++) r[o] = (float)ref[o];
        close_to(name, g, r, OC, 1e-6, 1e-6);
        free(r);
    }
    free(g); free(ones); free(wt); free(dyt); free(at);
    free(a); free(w); free(b); free(dy); free(dyp); free(ref); free(bnd);
    dv->free(da); dv->free(dw); dv->free(ddy); dv->free(db);
    dv->free(dout); dv->free(dinp); dv->free(dwt); dv->free(dbias);
}
/* The backward with a bf16 dinp (dinp16: the fp32 dinp rounded once),
 * beside t_matmul_ld's fp32 call (g32, gw32, gb32 its dinp, dw, db; ref,
 * bnd the double product and fp32 bound of dinp): dinp16 within the bf16
 * out GEMM tolerance (bnd + half a bf16 ulp, 2^-8 |ref|), as the CPU twin
 * zk_matmul_bf16_backward_b16's, the two within both; dw, db the fp32
 * call's bits (the same GEMMs and colsum); dinp16 alone (dw, db NULL) the
 * same bits; where OC is split (the LM head: OC > 8192, not a multiple of
 * 128), dinp16 is the fp32 call's dinp rounded once, bit for bit (its two
 * partial sums in fp32 scratch, then the cast). */
static void t_matmul_dinp16(int N, int C, int OC, int ld, const char *k, const uint16_t *ha,
                            const uint16_t *hw, const uint16_t *hd, void *da, void *dw, void *ddy,
                            const float *g32, const float *gw32, const float *gb32,
                            const double *ref, const double *bnd)
{
    char name[200];
    size_t nc = (size_t)N * C;
    int split = zt_cuda_matmul_split(-1) == 1 && OC > 8192 && OC % 128;
    snprintf(name, sizeof name, "%s %dx%dx%d ld %d bf16 dinp%s", k, N, C, OC, ld,
             split ? " (split OC: fp32 scratch, one rounding)" : "");
    uint16_t *nan16 = malloc(nc * 2), *c16 = malloc(nc * 2);
    for (size_t i = 0; i < nc; i++) nan16[i] = 0x7fc1;        /* WRITTEN */
    uint16_t *d16 = up(nan16, nc * 2), *d16b = up(nan16, nc * 2);
    float *dwt = NULL, *dbias = NULL;
    dv->alloc((void **)&dwt, (size_t)OC * C * 4); dv->alloc((void **)&dbias, OC * 4);
    dv->fill(dwt, NAN, (size_t)OC * C); dv->fill(dbias, NAN, OC);
    int rc = dv->matmul_bf16_backward(d16, 1, dwt, dbias, 0, ddy, da, dw, N, C, OC, ld);
    int rc2 = dv->matmul_bf16_backward(d16b, 1, NULL, NULL, 0, ddy, da, dw, N, C, OC, ld);
    zk_matmul_bf16_backward_b16(c16, NULL, NULL, hd, ha, hw, N, C, OC, ld);
    char nm[320];
    snprintf(nm, sizeof nm, "%s: calls succeed", name);
    ct_check(rc == ZT_OK && rc2 == ZT_OK, nm, "%d %d: %s", rc, rc2, zt_last_error());
    if (synced(nm)) {
        uint16_t *g16 = down(d16, nc * 2), *g16b = down(d16b, nc * 2);
        float *gw = down(dwt, (size_t)OC * C * 4), *gb = down(dbias, OC * 4);
        float *f = malloc(nc * 4), *fc = malloc(nc * 4);
        double *b16 = malloc(nc * sizeof(double));
        zk_cast_bf16_f32(f, g16, nc); zk_cast_bf16_f32(fc, c16, nc);
        for (size_t i = 0; i < nc; i++) b16[i] = bnd[i] + fabs(ref[i]) * 0x1p-8;
        snprintf(nm, sizeof nm, "%s: (fp32 dot bound + a bf16 rounding)", name);
        check_gemm(nm, f, ref, b16, nc);
        snprintf(nm, sizeof nm, "%s: the CPU twin's (zk_matmul_bf16_backward_b16) within the same", name);
        check_gemm(nm, fc, ref, b16, nc);
        {   /* GPU against the CPU twin: each within b16 of ref */
            double *r = malloc(nc * sizeof(double)), *b2 = malloc(nc * sizeof(double));
            for (size_t i = 0; i < nc; i++) { r[i] = fc[i]; b2[i] = 2 * b16[i]; }
            snprintf(nm, sizeof nm, "%s: against the CPU twin (within both bounds)", name);
            check_gemm(nm, f, r, b2, nc);
            free(r); free(b2);
        }
        snprintf(nm, sizeof nm, "%s: dinp16 alone the same bits", name);
        same_bits(nm, g16b, g16, nc * 2);
        snprintf(nm, sizeof nm, "%s: dweight the fp32 call's bits", name);
        same_bits(nm, gw, gw32, (size_t)OC * C * 4);
        snprintf(nm, sizeof nm, "%s: dbias the fp32 call's bits", name);
        same_bits(nm, gb, gb32, OC * 4);
        if (split) {
            uint16_t *want = malloc(nc * 2);
            zk_cast_f32_bf16(want, g32, nc);
            snprintf(nm, sizeof nm, "%s: the fp32 call's dinp rounded once", name);
            same_bits(nm, g16, want, nc * 2);
            free(want);
        }
        free(g16); free(g16b); free(gw); free(gb); free(f); free(fc); free(b16);
    }
    free(nan16); free(c16);
    dv->free(d16); dv->free(d16b); dv->free(dwt); dv->free(dbias);
}

static void t_matmul_all(void)
{
    t_matmul_ld(0, 67, 771, 130, 256, 0);        /* padded rows: the LM head's layout */
    t_matmul_ld(1, 67, 771, 130, 256, 0);
    t_matmul_ld(1, 67, 771, 130, 256, 1);        /* bf16 logits */
    t_matmul_ld(1, 16, 768, 50257, 50304, 1);
    t_matmul(0, 67, 771, 130);
    t_matmul(0, 128, 768, 2304);
    t_matmul(1, 67, 771, 130);
    t_matmul(1, 128, 768, 3072);
    int sp = zt_cuda_matmul_split(-1);
    zt_cuda_matmul_split(0);                     /* the LM head as one GEMM: a bf16 D over k = OC */
    t_matmul_ld(1, 16, 768, 50257, 50304, 1);
    zt_cuda_matmul_split(sp);
}

/* every matmul through cuBLASLt (zt_cuda_matmul_epilogue(1): the bias in
 * the epilogue, padded rows, bf16 out, both backward products, split-K's
 * fp32 partials): the same checks and shapes, odd leading dimensions (771,
 * which keep cuBLAS: not 16-byte rows) among them; then the default (2),
 * whose bf16 shapes take cuBLASLt, and a refused setting */
static void t_matmul_epilogue(void)
{
    int was = zt_cuda_matmul_epilogue(-1);
    zt_cuda_matmul_epilogue(1);
    t_matmul_all();
    t_matmul(1, 1024, 768, 768);                 /* k = N long: split-K's shape (dweight) */
    t_matmul_ld(1, 2048, 768, 2304, 2304, 1);   /* a bias on a bf16 out at the qkv GEMM's shape */
    zt_cuda_matmul_epilogue(2);
    t_matmul_ld(1, 16, 768, 50257, 50304, 1);
    t_matmul_ld(1, 2048, 768, 2304, 2304, 1);
    t_matmul(1, 128, 768, 3072);
    zt_cuda_matmul_epilogue(was);
    int bad = zt_cuda_matmul_epilogue(3);
    ct_check(bad == ZT_EINVAL && zt_cuda_matmul_epilogue(-1) == was, "matmul epilogue: 3 is refused",
             "rc %d, setting %d", bad, zt_cuda_matmul_epilogue(-1));
}

/* ---- the MLP's GEMMs with the GELU (the tolerance comment at the top) ---- */
static uint16_t *bf16_of(const float *x, size_t n)
{
    uint16_t *h = malloc(n * 2 + 2);
    zk_cast_f32_bf16(h, x, n);
    return h;
}
static float *f32_of(const uint16_t *h, size_t n)
{
    float *f = malloc(n * 4 + 4);
    zk_cast_bf16_f32(f, h, n);
    return f;
}
/* |got - want| <= tol[i] per element, both bf16 */
static void within16(const char *name, const uint16_t *got, const uint16_t *want,
                     const double *tol, size_t n)
{
    float *g = f32_of(got, n), *w = f32_of(want, n);
    double worst = 0; size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)g[i] - w[i]) / tol[i];
        if (!(e <= worst)) { worst = e; wi = i; if (isnan(e)) { worst = INFINITY; break; } }
    }
    ct_check(worst <= 1.0, name, "element %zu: got %.9g want %.9g (%.3g of the tolerance)",
             wi, n ? (double)g[wi] : 0.0, n ? (double)w[wi] : 0.0, worst);
    free(g); free(w);
}
/* the forward's out tolerance about a want (pre x, out y); bnd the sum's */
static double *gelu_fwd_tol(const uint16_t *x16, const uint16_t *y16, const double *bnd, size_t n)
{
    float *x = f32_of(x16, n), *y = f32_of(y16, n);
    double *t = malloc(n * sizeof(double) + 8);
    for (size_t i = 0; i < n; i++)
        t[i] = 1e-6 + 1.13 * (2 * bnd[i] + 0x1p-7 * fabs(x[i])) + 0x1p-10 * fabs(x[i]) +
               0x1p-7 * fabs(y[i]);
    free(x); free(y);
    return t;
}
/* the backward's dinp16 tolerance about a want y; D, bnd the product's */
static double *gelu_bwd_tol(const uint16_t *y16, const double *D, const double *bnd, size_t n)
{
    float *y = f32_of(y16, n);
    double *t = malloc(n * sizeof(double) + 8);
    for (size_t i = 0; i < n; i++)
        t[i] = 1e-6 + 1.13 * 2 * bnd[i] + 0x1p-7 * fabs(D[i]) + 0x1p-7 * fabs(y[i]);
    free(y);
    return t;
}
static const char *gname(char (*buf)[384], int *i, const char *tag, const char *what)
{
    char *b = buf[(*i)++ % 16];
    snprintf(b, 384, "%s: %s", tag, what);
    return b;
}

/* pre, out = the fused forward at N x C x OC (bias or not), pre's rows
 * `off` elements past 16 bytes (1: the epilogue's aux cannot take it);
 * two_ops: the shape must take the two ops (bits and count checked) */
static void t_mm_gelu_fwd(int N, int C, int OC, int bias, int off, int two_ops)
{
    char tag[120], nb[16][384];
    int ni = 0;
    snprintf(tag, sizeof tag, "matmul+gelu fwd %dx%dx%d%s%s%s", N, C, OC, bias ? " + bias" : "",
             off ? ", pre 2 bytes off" : "", zt_cuda_matmul_epilogue(-1) ? "" : " (cuBLAS mode)");
    size_t nc = (size_t)N * C, wc = (size_t)OC * C, no = (size_t)N * OC;
    float s = 3.0f / sqrtf((float)C);             /* pre about N(0, 1) + the bias */
    float *a = ct_rand(nc, -1, 1), *w = ct_rand(wc, -s, s), *b = bias ? ct_rand(OC, -1, 1) : NULL;
    round_bf16(a, nc); round_bf16(w, wc);
    if (b) round_bf16(b, OC);                     /* a bf16 model's biases */
    uint16_t *ha = bf16_of(a, nc), *hw = bf16_of(w, wc), *pc = malloc(no * 2), *oc = malloc(no * 2);
    zk_matmul_bf16_forward_b16(pc, ha, hw, b, N, C, OC, OC);
    zk_gelu_forward_bb(oc, pc, no);
    double *ref = malloc(no * sizeof(double)), *bnd = malloc(no * sizeof(double));
    ref_gemm_nt(ref, bnd, a, w, b, N, C, OC);
    uint16_t *da = up(ha, nc * 2), *dw = up(hw, wc * 2);
    float *db = b ? up(b, OC * 4) : NULL;
    /* 0, 1: fused twice; 2: fusion off; 3: the table's matmul then gelu */
    uint16_t *bp[4], *bo[4], *pre[4], *out[4];
    for (int k = 0; k < 4; k++) { pre[k] = up16(NULL, no, off, &bp[k]); out[k] = up16(NULL, no, 0, &bo[k]); }
    int was = zkc_matmul_gelu_fusion(-1), rc[4];
    zkc_matmul_gelu_fusion(1);
    int64_t f0 = zkc_matmul_gelu_fused();
    rc[0] = dv->matmul_bf16_forward_gelu(out[0], pre[0], da, dw, db, 0, N, C, OC);
    int64_t f1 = zkc_matmul_gelu_fused();
    rc[1] = dv->matmul_bf16_forward_gelu(out[1], pre[1], da, dw, db, 0, N, C, OC);
    int64_t f2 = zkc_matmul_gelu_fused();
    zkc_matmul_gelu_fusion(0);
    rc[2] = dv->matmul_bf16_forward_gelu(out[2], pre[2], da, dw, db, 0, N, C, OC);
    int64_t f3 = zkc_matmul_gelu_fused();
    zkc_matmul_gelu_fusion(was);
    rc[3] = dv->matmul_bf16_forward(pre[3], 1, da, dw, db, 0, N, C, OC, OC);
    dv->gelu_forward(out[3], 1, pre[3], 1, no);
    ct_check(rc[0] == ZT_OK && rc[1] == ZT_OK && rc[2] == ZT_OK && rc[3] == ZT_OK,
             gname(nb, &ni, tag, "calls succeed"), "%d %d %d %d: %s", rc[0], rc[1], rc[2], rc[3],
             zt_last_error());
    if (synced(gname(nb, &ni, tag, "runs"))) {
        int fused = f1 > f0;
        printf("  %s: %s\n", tag, fused ? "fused (cuBLASLt GELU epilogue)" : "two ops");
        ct_check(f2 - f1 == f1 - f0 && f3 == f2, gname(nb, &ni, tag, "the path a function of the "
                 "shape (the second call the first's; none with the fusion off)"),
                 "fused counts %lld, %lld, %lld", (long long)(f1 - f0), (long long)(f2 - f1),
                 (long long)(f3 - f2));
        uint16_t *g[4], *o[4];
        for (int k = 0; k < 4; k++) { g[k] = down(pre[k], no * 2); o[k] = down(out[k], no * 2); }
        float *gp = f32_of(g[0], no);
        for (size_t i = 0; i < no; i++) bnd[i] += fabs(ref[i]) * 0x1p-8;
        check_gemm(gname(nb, &ni, tag, "pre (fp32 dot bound + a bf16 rounding)"), gp, ref, bnd, no);
        for (size_t i = 0; i < no; i++) bnd[i] -= fabs(ref[i]) * 0x1p-8;
        double *t = gelu_fwd_tol(pc, oc, bnd, no);
        within16(gname(nb, &ni, tag, "out against the CPU's two ops"), o[0], oc, t, no);
        within16(gname(nb, &ni, tag, "out, fusion off, against the CPU's two ops"), o[2], oc, t, no);
        free(t);
        t = gelu_fwd_tol(g[2], o[2], bnd, no);
        within16(gname(nb, &ni, tag, "out against fusion off"), o[0], o[2], t, no);
        for (size_t i = 0; i < no; i++) t[i] = 2 * bnd[i] + 0x1p-7 * fabs(ref[i]) + 1e-30;
        within16(gname(nb, &ni, tag, "pre against fusion off (two sums, two roundings)"), g[0], g[2], t, no);
        free(t);
        same_bits(gname(nb, &ni, tag, "fused twice: pre the same bits"), g[1], g[0], no * 2);
        same_bits(gname(nb, &ni, tag, "fused twice: out the same bits"), o[1], o[0], no * 2);
        same_bits(gname(nb, &ni, tag, "fusion off: pre the matmul op's bits"), g[2], g[3], no * 2);
        same_bits(gname(nb, &ni, tag, "fusion off: out the gelu op's bits"), o[2], o[3], no * 2);
        if (two_ops) {
            ct_check(f1 == f0, gname(nb, &ni, tag, "takes the two ops"), "fused %lld calls",
                     (long long)(f2 - f0));
            same_bits(gname(nb, &ni, tag, "two ops: pre the unfused bits"), g[0], g[3], no * 2);
            same_bits(gname(nb, &ni, tag, "two ops: out the unfused bits"), o[0], o[3], no * 2);
        }
        for (int k = 0; k < 4; k++) { free(g[k]); free(o[k]); }
        free(gp);
    }
    for (int k = 0; k < 4; k++) { dv->free(bp[k]); dv->free(bo[k]); }
    dv->free(da); dv->free(dw); if (db) dv->free(db);
    free(a); free(w); free(b); free(ha); free(hw); free(pc); free(oc); free(ref); free(bnd);
}

/* dinp16 = the fused backward at N x C x OC (dout rows OC), pre and dinp16
 * `off` elements past 16 bytes; two_ops as the forward's */
static void t_mm_gelu_bwd(int N, int C, int OC, int off, int two_ops)
{
    char tag[120], nb[16][384];
    int ni = 0;
    snprintf(tag, sizeof tag, "matmul+dgelu bwd %dx%dx%d%s%s", N, C, OC,
             off ? ", pre and dinp16 2 bytes off" : "", zt_cuda_matmul_epilogue(-1) ? "" : " (cuBLAS mode)");
    size_t nc = (size_t)N * C, wc = (size_t)OC * C, no = (size_t)N * OC;
    float s = 3.0f / sqrtf((float)OC);            /* the product about N(0, 1/3) */
    float *dy = ct_rand(no, -1, 1), *w = ct_rand(wc, -s, s), *a = ct_rand(nc, -1, 1);
    float *p = ct_rand(nc, -4, 4);
    round_bf16(dy, no); round_bf16(w, wc); round_bf16(a, nc); round_bf16(p, nc);
    uint16_t *hdy = bf16_of(dy, no), *hw = bf16_of(w, wc), *ha = bf16_of(a, nc), *hp = bf16_of(p, nc);
    float *d32c = malloc(nc * 4), *dwc = malloc(wc * 4), *dbc = malloc(OC * 4);
    uint16_t *d16c = malloc(nc * 2);
    zk_matmul_bf16_backward(d32c, dwc, dbc, hdy, ha, hw, N, C, OC, OC);
    zk_gelu_backward_bb(d16c, hp, d32c, nc);
    double *ref = malloc(nc * sizeof(double)), *bnd = malloc(nc * sizeof(double));
    float *wt = transpose(w, OC, C);
    ref_gemm_nt(ref, bnd, dy, wt, NULL, N, OC, C);     /* D (N,C) = dy . w */
    uint16_t *ddy = up(hdy, no * 2), *dw = up(hw, wc * 2), *da = up(ha, nc * 2), *bpre;
    uint16_t *dpre = up16(hp, nc, off, &bpre);
    /* 0, 1: fused twice; 2: fusion off; 3: the table's matmul then gelu;
     * 4: fused, dinp16 NULL (dw, db alone) */
    uint16_t *bd[5], *d16[5];
    float *d32[5], *gw[5], *gb[5];
    for (int k = 0; k < 5; k++) {
        d16[k] = up16(NULL, nc, off, &bd[k]);
        d32[k] = up(d32c, nc * 4); gw[k] = up(dwc, wc * 4); gb[k] = up(dbc, OC * 4);
        dv->fill(d32[k], 7.0f, nc);                /* poisoned: the fused call leaves it */
        dv->fill(gw[k], NAN, wc); dv->fill(gb[k], NAN, OC);
    }
    int was = zkc_matmul_gelu_fusion(-1), rc[5];
    zkc_matmul_gelu_fusion(1);
    int64_t f0 = zkc_matmul_gelu_fused();
    rc[0] = dv->matmul_bf16_backward_dgelu(d16[0], d32[0], gw[0], gb[0], 0, ddy, da, dw, dpre, N, C, OC, OC);
    int64_t f1 = zkc_matmul_gelu_fused();
    rc[1] = dv->matmul_bf16_backward_dgelu(d16[1], d32[1], gw[1], gb[1], 0, ddy, da, dw, dpre, N, C, OC, OC);
    int64_t f2 = zkc_matmul_gelu_fused();
    rc[4] = dv->matmul_bf16_backward_dgelu(NULL, NULL, gw[4], gb[4], 0, ddy, da, dw, NULL, N, C, OC, OC);
    int64_t f3 = zkc_matmul_gelu_fused();
    zkc_matmul_gelu_fusion(0);
    rc[2] = dv->matmul_bf16_backward_dgelu(d16[2], d32[2], gw[2], gb[2], 0, ddy, da, dw, dpre, N, C, OC, OC);
    int64_t f4 = zkc_matmul_gelu_fused();
    zkc_matmul_gelu_fusion(was);
    rc[3] = dv->matmul_bf16_backward(d32[3], 0, gw[3], gb[3], 0, ddy, da, dw, N, C, OC, OC);
    dv->gelu_backward(d16[3], 1, dpre, 1, d32[3], nc);
    ct_check(rc[0] == ZT_OK && rc[1] == ZT_OK && rc[2] == ZT_OK && rc[3] == ZT_OK && rc[4] == ZT_OK,
             gname(nb, &ni, tag, "calls succeed"), "%d %d %d %d %d: %s", rc[0], rc[1], rc[2], rc[3],
             rc[4], zt_last_error());
    if (synced(gname(nb, &ni, tag, "runs"))) {
        int fused = f1 > f0;
        printf("  %s: %s\n", tag, fused ? "fused (cuBLASLt DGELU epilogue)" : "two ops");
        ct_check(f2 - f1 == f1 - f0 && f3 == f2 && f4 == f3, gname(nb, &ni, tag, "the path a function "
                 "of the shape (the second call the first's; none without dinp16 or the fusion)"),
                 "fused counts %lld, %lld, %lld, %lld", (long long)(f1 - f0), (long long)(f2 - f1),
                 (long long)(f3 - f2), (long long)(f4 - f3));
        uint16_t *g[5];
        float *h32[5], *hw_[5], *hb[5];
        for (int k = 0; k < 5; k++) {
            g[k] = down(d16[k], nc * 2); h32[k] = down(d32[k], nc * 4);
            hw_[k] = down(gw[k], wc * 4); hb[k] = down(gb[k], OC * 4);
        }
        double *t = gelu_bwd_tol(d16c, ref, bnd, nc);
        within16(gname(nb, &ni, tag, "dinp16 against the CPU's two ops"), g[0], d16c, t, nc);
        within16(gname(nb, &ni, tag, "dinp16, fusion off, against the CPU's two ops"), g[2], d16c, t, nc);
        free(t);
        t = gelu_bwd_tol(g[2], ref, bnd, nc);
        within16(gname(nb, &ni, tag, "dinp16 against fusion off"), g[0], g[2], t, nc);
        free(t);
        same_bits(gname(nb, &ni, tag, "fused twice: dinp16 the same bits"), g[1], g[0], nc * 2);
        for (int k = 1; k < 5; k++) {
            same_bits(gname(nb, &ni, tag, k == 4 ? "dw alone (dinp16 NULL): the unfused bits"
                                                 : "dw the unfused call's bits"), hw_[k], hw_[3], wc * 4);
            same_bits(gname(nb, &ni, tag, k == 4 ? "db alone (dinp16 NULL): the unfused bits"
                                                 : "db the unfused call's bits"), hb[k], hb[3], OC * 4);
        }
        same_bits(gname(nb, &ni, tag, "dw fused: the unfused call's bits"), hw_[0], hw_[3], wc * 4);
        same_bits(gname(nb, &ni, tag, "db fused: the unfused call's bits"), hb[0], hb[3], OC * 4);
        same_bits(gname(nb, &ni, tag, "fusion off: dinp32 the matmul op's bits"), h32[2], h32[3], nc * 4);
        same_bits(gname(nb, &ni, tag, "fusion off: dinp16 the gelu op's bits"), g[2], g[3], nc * 2);
        {   /* the product's bound on the f32 dinp of the two ops */
            float *r = malloc(nc * 4);
            check_gemm(gname(nb, &ni, tag, "fusion off: dinp32 (fp32 dot bound)"), h32[2], ref, bnd, nc);
            for (size_t i = 0; i < nc; i++) r[i] = 7.0f;
            if (fused) same_bits(gname(nb, &ni, tag, "fused: dinp32 untouched"), h32[0], r, nc * 4);
            free(r);
        }
        if (two_ops) {
            ct_check(f1 == f0, gname(nb, &ni, tag, "takes the two ops"), "fused %lld calls",
                     (long long)(f2 - f0));
            same_bits(gname(nb, &ni, tag, "two ops: dinp16 the unfused bits"), g[0], g[3], nc * 2);
            same_bits(gname(nb, &ni, tag, "two ops: dinp32 the unfused bits"), h32[0], h32[3], nc * 4);
        }
        for (int k = 0; k < 5; k++) { free(g[k]); free(h32[k]); free(hw_[k]); free(hb[k]); }
    }
    for (int k = 0; k < 5; k++) { dv->free(bd[k]); dv->free(d32[k]); dv->free(gw[k]); dv->free(gb[k]); }
    dv->free(ddy); dv->free(dw); dv->free(da); dv->free(bpre);
    free(dy); free(w); free(a); free(p); free(hdy); free(hw); free(ha); free(hp);
    free(d32c); free(dwc); free(dbc); free(d16c); free(ref); free(bnd); free(wt);
}

/* the fused MLP ops through cuBLASLt (mode 2, the default), small and at
 * GPT-2 124M's c_fc forward (768 -> 3072) and c_proj's dinp (3072 <- 768),
 * then shapes and pointers the epilogues cannot take, and cuBLAS mode */
static void t_matmul_gelu(void)
{
    int was = zt_cuda_matmul_epilogue(-1);
    zt_cuda_matmul_epilogue(2);
    t_mm_gelu_fwd(33, 128, 256, 1, 0, 0);
    t_mm_gelu_fwd(33, 128, 256, 0, 0, 0);         /* GELU_AUX: no bias */
    t_mm_gelu_fwd(64, 768, 3072, 1, 0, 0);
    t_mm_gelu_fwd(64, 768, 3072, 1, 1, 1);        /* pre 2 bytes off: no aux on 16 bytes */
    t_mm_gelu_fwd(33, 130, 200, 1, 0, 1);         /* rows of 260 bytes */
    t_mm_gelu_bwd(33, 256, 128, 0, 0);
    t_mm_gelu_bwd(64, 3072, 768, 0, 0);
    t_mm_gelu_bwd(64, 3072, 768, 1, 1);
    t_mm_gelu_bwd(33, 130, 128, 0, 1);            /* aux rows of 260 bytes */
    zt_cuda_matmul_epilogue(0);
    t_mm_gelu_fwd(33, 128, 256, 1, 0, 1);
    t_mm_gelu_bwd(33, 256, 128, 0, 1);
    zt_cuda_matmul_epilogue(was);
    const char *env = getenv("ZTRAIN_GELU_FUSION");
    int f = zkc_matmul_gelu_fusion(-1), want = !(env && !strcmp(env, "0"));
    ct_check(f == want && zkc_matmul_gelu_fusion(2) == f && zkc_matmul_gelu_fusion(-1) == f,
             "matmul gelu fusion: on unless ZTRAIN_GELU_FUSION=0, 2 leaves it", "setting %d, want %d",
             f, want);
}

/* ---- a bf16 run's biases (b16) ---- */
/* matmul_bf16_forward (fp32 and bf16 out) and matmul_bf16_forward_gelu
 * with a bf16 bias (b16 1) against the same calls on its widened fp32
 * copy (b16 0), bit for bit: the bf16 bias on 16 bytes (a bf16 D's
 * epilogue takes it as it is) and 2 bytes off (staged), and the fp32 copy
 * 4 bytes off too (staged: the bias's type and alignment never choose the
 * path); the GELU call fused exactly when the fp32 bias's is */
static void t_matmul_b16_at(int N, int C, int OC)
{
    char tag[120], nb[16][384], what[160];
    int ni = 0, lt = zt_cuda_matmul_epilogue(-1);
    snprintf(tag, sizeof tag, "matmul bf16 bias (b16) %dx%dx%d (%s)", N, C, OC,
             lt ? "cuBLASLt" : "cuBLAS");
    size_t nc = (size_t)N * C, wc = (size_t)OC * C, no = (size_t)N * OC;
    float s = 3.0f / sqrtf((float)C);
    float *a = ct_rand(nc, -1, 1), *w = ct_rand(wc, -s, s);
    uint16_t *ha = bf16_of(a, nc), *hw = bf16_of(w, wc), *hb = rand16(OC, -1, 1, OC, 0.0f);
    float *bf = f32_of(hb, OC);
    uint16_t *da = up(ha, nc * 2), *dw = up(hw, wc * 2);
    /* 0: the fp32 copy (the reference), 1: it 4 bytes off, 2: bf16 on 16
     * bytes, 3: bf16 2 bytes off */
    static const char *bn[4] = { "fp32 bias", "fp32 bias 4 bytes off", "bf16 bias",
                                 "bf16 bias 2 bytes off" };
    static const int b16[4] = { 0, 0, 1, 1 };
    void *bb[4];
    const void *bias[4] = { up_at(bf, OC * 4, 0, &bb[0]), up_at(bf, OC * 4, 4, &bb[1]),
                            up_at(hb, OC * 2, 0, &bb[2]), up_at(hb, OC * 2, 2, &bb[3]) };
    for (int out16 = 0; out16 <= 1; out16++) {
        size_t oes = out16 ? 2 : 4;
        void *out[4];
        int rc[4];
        for (int k = 0; k < 4; k++) {
            out[k] = NULL;
            dv->alloc(&out[k], no * oes);
            rc[k] = dv->matmul_bf16_forward(out[k], out16, da, dw, bias[k], b16[k], N, C, OC, OC);
        }
        snprintf(what, sizeof what, "forward%s: calls succeed", out16 ? " bf16 out" : "");
        ct_check(rc[0] == ZT_OK && rc[1] == ZT_OK && rc[2] == ZT_OK && rc[3] == ZT_OK,
                 gname(nb, &ni, tag, what), "%d %d %d %d: %s", rc[0], rc[1], rc[2], rc[3],
                 zt_last_error());
        if (synced(gname(nb, &ni, tag, "forward runs"))) {
            void *g0 = down(out[0], no * oes);
            for (int k = 1; k < 4; k++) {
                void *g = down(out[k], no * oes);
                snprintf(what, sizeof what, "forward%s, %s: the fp32 bias's bits",
                         out16 ? " bf16 out" : "", bn[k]);
                same_bits(gname(nb, &ni, tag, what), g, g0, no * oes);
                free(g);
            }
            free(g0);
        }
        for (int k = 0; k < 4; k++) dv->free(out[k]);
    }
    {   /* the MLP's GEMM with its GELU: pre and out, fused or the two ops */
        uint16_t *pre[4], *out[4];
        int rc[4];
        int64_t f[5];
        f[0] = zkc_matmul_gelu_fused();
        for (int k = 0; k < 4; k++) {
            pre[k] = out[k] = NULL;
            dv->alloc((void **)&pre[k], no * 2); dv->alloc((void **)&out[k], no * 2);
            rc[k] = dv->matmul_bf16_forward_gelu(out[k], pre[k], da, dw, bias[k], b16[k], N, C, OC);
            f[k + 1] = zkc_matmul_gelu_fused();
        }
        ct_check(rc[0] == ZT_OK && rc[1] == ZT_OK && rc[2] == ZT_OK && rc[3] == ZT_OK,
                 gname(nb, &ni, tag, "forward_gelu: calls succeed"), "%d %d %d %d: %s", rc[0],
                 rc[1], rc[2], rc[3], zt_last_error());
        ct_check(f[2] - f[1] == f[1] - f[0] && f[3] - f[2] == f[1] - f[0] && f[4] - f[3] == f[1] - f[0],
                 gname(nb, &ni, tag, "forward_gelu: fused exactly when the fp32 bias's call is"),
                 "fused counts %lld %lld %lld %lld", (long long)(f[1] - f[0]), (long long)(f[2] - f[1]),
                 (long long)(f[3] - f[2]), (long long)(f[4] - f[3]));
        if (synced(gname(nb, &ni, tag, "forward_gelu runs"))) {
            uint16_t *p0 = down(pre[0], no * 2), *o0 = down(out[0], no * 2);
            for (int k = 1; k < 4; k++) {
                uint16_t *p = down(pre[k], no * 2), *o = down(out[k], no * 2);
                snprintf(what, sizeof what, "forward_gelu%s, %s: pre the fp32 bias's bits",
                         f[1] > f[0] ? " (fused)" : "", bn[k]);
                same_bits(gname(nb, &ni, tag, what), p, p0, no * 2);
                snprintf(what, sizeof what, "forward_gelu%s, %s: out the fp32 bias's bits",
                         f[1] > f[0] ? " (fused)" : "", bn[k]);
                same_bits(gname(nb, &ni, tag, what), o, o0, no * 2);
                free(p); free(o);
            }
            free(p0); free(o0);
        }
        for (int k = 0; k < 4; k++) { dv->free(pre[k]); dv->free(out[k]); }
    }
    for (int k = 0; k < 4; k++) dv->free(bb[k]);
    dv->free(da); dv->free(dw);
    free(a); free(w); free(ha); free(hw); free(hb); free(bf);
}

/* cuBLASLt for bf16 (mode 2: the bias epilogues, GELU_AUX_BIAS) at a small
 * shape, GPT-2's qkv and c_fc, rows of 260 bytes (cuBLAS), and an OC split
 * in two (the second part's bias 8192 columns on); then cuBLAS (mode 0) */
static void t_matmul_b16(void)
{
    int was = zt_cuda_matmul_epilogue(-1);
    zt_cuda_matmul_epilogue(2);
    t_matmul_b16_at(33, 128, 256);
    t_matmul_b16_at(64, 768, 2304);
    t_matmul_b16_at(64, 768, 3072);
    t_matmul_b16_at(33, 130, 200);
    t_matmul_b16_at(16, 64, 8200);
    zt_cuda_matmul_epilogue(0);
    t_matmul_b16_at(33, 128, 256);
    t_matmul_b16_at(33, 130, 200);
    zt_cuda_matmul_epilogue(was);
}

/* ---- a bf16 run's gradients written by the ops (g16) ---- */
/* The norms' backward with g16 (dw, db bf16) against the same call with
 * fp32 dw, db: each the fp32 value rounded once (zk_cast_f32_bf16's bits),
 * dinp (accumulated) the same bits either way; the weights alone (dinp
 * NULL) the fused call's bits. Rows f32 or bf16 (r16), roff bytes past 16
 * (4 on f32 rows, 2 on bf16 ones: the scalar paths); the parameters fp32
 * or bf16 (p16); mean, rstd the CPU twins' on the widened values. */
static void t_norm_g16_at(int N, int C, int r16, int p16, int roff)
{
    char tag[120], nb[16][384];
    int ni = 0;
    snprintf(tag, sizeof tag, "norms g16 N=%d C=%d%s%s%s", N, C, r16 ? " r16" : "", p16 ? " p16" : "",
             roff ? ", rows off their vector access" : "");
    size_t nc = (size_t)N * C, es = r16 ? 2 : 4;
    /* rows: x, dy, dinp's start (bf16 values, so either layout holds them) */
    uint16_t *h16[3] = { rand16(nc, -3, 3, C, 0.1f), rand16(nc, -1, 1, C, 0.0f),
                         rand16(nc, -1, 1, C, 0.0f) };
    float *hf[3];
    void *rows[3], *rbase[3];
    for (int k = 0; k < 3; k++) {
        hf[k] = f32_of(h16[k], nc);
        rows[k] = up_at(r16 ? (void *)h16[k] : (void *)hf[k], nc * es, (size_t)roff, &rbase[k]);
    }
    uint16_t *w16 = rand16(C, 0.5f, 1.5f, C, 0.0f), *b16 = rand16(C, -1, 1, C, 0.0f);
    float *wf = f32_of(w16, C), *bf = f32_of(b16, C);
    float *o = malloc(nc * 4), *m = malloc(N * 4), *r = malloc(N * 4), *r3 = malloc(N * 4);
    zk_layernorm_forward(o, m, r, hf[0], wf, bf, N, C);
    zk_rmsnorm_forward(o, r3, hf[0], wf, 1e-5f, N, C);
    void *dwp = p16 ? up(w16, C * 2) : up(wf, C * 4);
    float *dm = up(m, N * 4), *dr = up(r, N * 4), *dr3 = up(r3, N * 4);
    /* [g16]: dinp (LN), dinp (RMS); dw, db (LN), dw (RMS); [2]: the g16
     * weights alone */
    void *di[2][2], *dib[2][2], *gw[3][3];
    for (int g = 0; g < 2; g++)
        for (int k = 0; k < 2; k++) di[g][k] = up_at(r16 ? (void *)h16[2] : (void *)hf[2], nc * es,
                                                     (size_t)roff, &dib[g][k]);
    for (int g = 0; g < 3; g++)
        for (int k = 0; k < 3; k++) {
            gw[g][k] = NULL;
            dv->alloc(&gw[g][k], C * 4);
            dv->fill(gw[g][k], NAN, C);            /* WRITTEN */
        }
    for (int g = 0; g < 2; g++) {
        dv->layernorm_backward(di[g][0], NULL, gw[g][0], gw[g][1], g, rows[1], rows[0], r16, dwp, p16,
                               dm, dr, N, C);
        dv->rmsnorm_backward(di[g][1], NULL, gw[g][2], g, rows[1], rows[0], r16, dwp, p16, dr3, N, C);
    }
    dv->layernorm_backward(NULL, NULL, gw[2][0], gw[2][1], 1, rows[1], rows[0], r16, dwp, p16, dm, dr,
                           N, C);
    dv->rmsnorm_backward(NULL, NULL, gw[2][2], 1, rows[1], rows[0], r16, dwp, p16, dr3, N, C);
    if (synced(gname(nb, &ni, tag, "runs"))) {
        static const char *dn[2] = { "layernorm dinp (accumulated)", "rmsnorm dinp (accumulated)" };
        static const char *wn[3] = { "layernorm dw", "layernorm db", "rmsnorm dw" };
        char what[200];
        for (int k = 0; k < 2; k++) {
            void *a = down(di[0][k], nc * es), *b = down(di[1][k], nc * es);
            snprintf(what, sizeof what, "%s: g16 the fp32 call's bits", dn[k]);
            same_bits(gname(nb, &ni, tag, what), b, a, nc * es);
            free(a); free(b);
        }
        for (int k = 0; k < 3; k++) {
            float *f = down(gw[0][k], C * 4);
            uint16_t *g = down(gw[1][k], C * 2), *alone = down(gw[2][k], C * 2), *want = malloc(C * 2);
            zk_cast_f32_bf16(want, f, C);
            snprintf(what, sizeof what, "%s bf16: the fp32 call's rounded once (RNE)", wn[k]);
            same_bits(gname(nb, &ni, tag, what), g, want, C * 2);
            snprintf(what, sizeof what, "%s bf16 alone (dinp NULL): the fused call's bits", wn[k]);
            same_bits(gname(nb, &ni, tag, what), alone, g, C * 2);
            free(f); free(g); free(alone); free(want);
        }
    }
    for (int g = 0; g < 2; g++) for (int k = 0; k < 2; k++) dv->free(dib[g][k]);
    for (int g = 0; g < 3; g++) for (int k = 0; k < 3; k++) dv->free(gw[g][k]);
    for (int k = 0; k < 3; k++) { dv->free(rbase[k]); free(h16[k]); free(hf[k]); }
    dv->free(dwp); dv->free(dm); dv->free(dr); dv->free(dr3);
    free(w16); free(b16); free(wf); free(bf); free(o); free(m); free(r); free(r3);
}

/* the scalar and vector paths (C 771 and 768; 2056: 2 groups a thread; 4100:
 * both scalar), f32 and bf16 rows, fp32 and bf16 parameters, rows off */
static void t_norm_g16(void)
{
    static const int sh[][2] = { { 67, 771 }, { 67, 768 }, { 9, 2056 }, { 5, 4100 } };
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++)
        for (int r16 = 0; r16 <= 1; r16++) t_norm_g16_at(sh[i][0], sh[i][1], r16, r16, 0);
    t_norm_g16_at(67, 768, 0, 1, 0);
    t_norm_g16_at(67, 768, 1, 0, 0);
    t_norm_g16_at(67, 768, 0, 0, 4);
    t_norm_g16_at(67, 768, 1, 1, 2);
    t_norm_g16_at(300, 768, 1, 1, 0);             /* 10 chunks of rows */
}

/* The embedding's backward into bf16 dwte, dwpe (g16) against the fp32
 * call on their widened values, its dwte and dwpe rounded once
 * (zk_cast_f32_bf16), bit for bit: dwte ACCUMULATED onto random bf16
 * values (ids not in tok untouched), dwpe rows [0,T) WRITTEN, [T,maxT)
 * untouched; dout fp32 or bf16 (d16); the bad ids counted once each,
 * reported at the next sync. kind 0: uniform ids; 1: one id (a run over
 * several 2048-entry flushes, carried in fp32 between them); 2: V <= 256
 * (one block holds every id: ranges of keys, one flush each), id 3 over
 * half the positions (a range of its own, over two flushes) between
 * ranges of ids 0-2 and of the rest */
static void t_encoder_g16_at(int B, int T, int C, int V, int kind, int d16, int pos)
{
    char tag[160], nb[16][384];
    int ni = 0, N = B * T, maxT = T + 3;
    static const char *kn[3] = { "uniform ids", "one id", "one block of ids" };
    snprintf(tag, sizeof tag, "encoder backward g16 B=%d T=%d C=%d V=%d, %s, %s dout%s", B, T, C, V,
             kn[kind], d16 ? "bf16" : "fp32", pos ? "" : ", no dwpe");
    size_t nc = (size_t)N * C, nte = (size_t)V * C, npe = (size_t)maxT * C;
    int32_t *tok = malloc((size_t)N * 4);
    for (int i = 0; i < N; i++) {
        uint64_t u = ct_u64();
        tok[i] = kind == 1 ? V / 2 : kind == 0 || i % 4 == 0 ? (int32_t)(u % (uint64_t)V)
                                   : i % 4 == 1 ? (int32_t)(u % 3) : 3;
    }
    tok[1] = V; tok[N - 2] = -1;                   /* two bad ids */
    float *dyf = ct_rand(nc, -1, 1);
    uint16_t *dy16 = bf16_of(dyf, nc), *te16 = rand16(nte, -1, 1, C, 0.0f), *pe16 = rand16(npe, -1, 1, C, 0.0f);
    float *te32 = f32_of(te16, nte), *pe32 = f32_of(pe16, npe);
    int32_t *dtok = up(tok, (size_t)N * 4);
    void *ddy = d16 ? up(dy16, nc * 2) : up(dyf, nc * 4);
    void *d_te32 = up(te32, nte * 4), *d_pe32 = up(pe32, npe * 4);
    void *d_te16 = up(te16, nte * 2), *d_pe16 = up(pe16, npe * 2);
    int b0 = dv->encoder_backward(d_te32, pos ? d_pe32 : NULL, 0, ddy, d16, dtok, B, T, C, V);
    int r0 = dv->sync();
    int b1 = dv->encoder_backward(d_te16, pos ? d_pe16 : NULL, 1, ddy, d16, dtok, B, T, C, V);
    int r1 = dv->sync();
    ct_check(b0 == 0 && b1 == 0 && r0 == ZT_EINVAL && r1 == ZT_EINVAL &&
             strstr(zt_last_error(), "zt_encoder_backward: 2 of") != NULL,
             gname(nb, &ni, tag, "2 bad ids counted, reported at the next sync"), "calls %d %d, syncs %d %d (%s)",
             b0, b1, r0, r1, zt_last_error());
    if (synced(gname(nb, &ni, tag, "runs"))) {
        float *g_te32 = down(d_te32, nte * 4), *g_pe32 = down(d_pe32, npe * 4);
        uint16_t *g_te16 = down(d_te16, nte * 2), *g_pe16 = down(d_pe16, npe * 2);
        uint16_t *wte = malloc(nte * 2), *wpe = malloc(npe * 2);
        zk_cast_f32_bf16(wte, g_te32, nte); zk_cast_f32_bf16(wpe, g_pe32, npe);
        same_bits(gname(nb, &ni, tag, "dwte (accumulated) bf16: the fp32 call's on the widened dwte, "
                  "rounded once"), g_te16, wte, nte * 2);
        same_bits(gname(nb, &ni, tag, pos ? "dwpe bf16 (rows < T written, the rest kept): the fp32 "
                  "call's rounded once" : "dwpe untouched"), g_pe16, pos ? wpe : pe16, npe * 2);
        free(g_te32); free(g_pe32); free(g_te16); free(g_pe16); free(wte); free(wpe);
    }
    free(tok); free(dyf); free(dy16); free(te16); free(pe16); free(te32); free(pe32);
    dv->free(dtok); dv->free(ddy); dv->free(d_te32); dv->free(d_pe32); dv->free(d_te16); dv->free(d_pe16);
}

static void t_encoder_g16(void)
{
    for (int d16 = 0; d16 <= 1; d16++) {
        t_encoder_g16_at(3, 37, 97, 50, 0, d16, 1);         /* C off the 64-column unit */
        t_encoder_g16_at(4, 64, 768, 50257, 0, d16, 1);     /* GPT-2's V: 256 blocks */
        t_encoder_g16_at(8, 640, 70, 300, 1, d16, 1);       /* one id 5120 times: 3 flushes */
        t_encoder_g16_at(10, 500, 130, 200, 2, d16, 1);     /* 5000 positions in one block */
    }
    t_encoder_g16_at(3, 37, 97, 50, 0, 1, 0);               /* no dwpe (Llama's) */
    t_encoder_g16_at(5, 1000, 40, 7, 1, 0, 0);
}

/* The bf16 GEMMs' backward with g16 (dw, db bf16) beside the fp32 call
 * (dw, db fp32) on the same bf16 operands, dout in rows ld apart (the pad
 * NaN): db the fp32 call's rounded once, bit for bit (colsum.cu); dw by
 * the shape's path (zkc_matmul_g16_dw_f32: fewer 128x128 output tiles
 * than the GPU's SMs): a small output the fp32 call's dw rounded once,
 * bit for bit (its GEMMs into scratch, then the cast); else one GEMM with
 * a bf16 D: within the fp32 dot bound plus half a bf16 ulp (2^-8 |ref|)
 * of the double product, within both of the fp32 call's dw rounded (the
 * bf16-D plan may be another algorithm; how many differ is printed);
 * dinp (fp32 or bf16) the g16 0 call's bits; dw, db the same bits with a
 * bf16 dinp, alone, again, and from the dgelu op (dinp16 NULL: bwd()
 * alone); N = 0 writes zeros. Returns the path taken (1 fp32 + cast). */
static int t_matmul_g16_at(int N, int C, int OC, int ld)
{
    char tag[160], nb[16][384];
    int ni = 0, lt = zt_cuda_matmul_epilogue(-1), via = zkc_matmul_g16_dw_f32(N, C, OC);
    snprintf(tag, sizeof tag, "matmul bf16 backward g16 %dx%dx%d ld %d (%s, dw %s)", N, C, OC, ld,
             lt ? "cuBLASLt" : "cuBLAS", via ? "fp32 + cast" : "bf16 D");
    size_t nc = (size_t)N * C, wc = (size_t)OC * C, nl = (size_t)N * ld;
    float *a = ct_rand(nc, -1, 1), *w = ct_rand(wc, -1, 1), *dy = ct_rand((size_t)N * OC, -1, 1);
    round_bf16(a, nc); round_bf16(w, wc); round_bf16(dy, (size_t)N * OC);
    uint16_t *ha = bf16_of(a, nc), *hw = bf16_of(w, wc), *hd = malloc(nl * 2);
    for (size_t i = 0; i < nl; i++) hd[i] = 0x7fc1;          /* the pad NaN */
    for (int n = 0; n < N; n++) zk_cast_f32_bf16(hd + (size_t)n * ld, dy + (size_t)n * OC, (size_t)OC);
    uint16_t *da = up(ha, nc * 2), *dw = up(hw, wc * 2), *ddy = up(hd, nl * 2);
    /* 0: fp32 dw, db; 1: g16; 2: g16 with a bf16 dinp; 3: g16 alone; 4:
     * g16 again; 5: the dgelu op's g16 weight pass */
    void *gw[6], *gb[6], *di[3];
    for (int k = 0; k < 6; k++) {
        gw[k] = gb[k] = NULL;
        dv->alloc(&gw[k], wc * 4); dv->alloc(&gb[k], OC * 4);
        dv->fill(gw[k], NAN, wc); dv->fill(gb[k], NAN, OC);    /* WRITTEN */
    }
    for (int k = 0; k < 3; k++) { di[k] = NULL; dv->alloc(&di[k], nc * 4); dv->fill(di[k], NAN, nc); }
    int rc[6];
    rc[0] = dv->matmul_bf16_backward(di[0], 0, gw[0], gb[0], 0, ddy, da, dw, N, C, OC, ld);
    rc[1] = dv->matmul_bf16_backward(di[1], 0, gw[1], gb[1], 1, ddy, da, dw, N, C, OC, ld);
    rc[2] = dv->matmul_bf16_backward(di[2], 1, gw[2], gb[2], 1, ddy, da, dw, N, C, OC, ld);
    rc[3] = dv->matmul_bf16_backward(NULL, 0, gw[3], gb[3], 1, ddy, da, dw, N, C, OC, ld);
    rc[4] = dv->matmul_bf16_backward(NULL, 0, gw[4], gb[4], 1, ddy, da, dw, N, C, OC, ld);
    rc[5] = dv->matmul_bf16_backward_dgelu(NULL, NULL, gw[5], gb[5], 1, ddy, da, dw, NULL, N, C, OC, ld);
    ct_check(rc[0] == ZT_OK && rc[1] == ZT_OK && rc[2] == ZT_OK && rc[3] == ZT_OK && rc[4] == ZT_OK &&
             rc[5] == ZT_OK, gname(nb, &ni, tag, "calls succeed"), "%d %d %d %d %d %d: %s", rc[0], rc[1],
             rc[2], rc[3], rc[4], rc[5], zt_last_error());
    if (synced(gname(nb, &ni, tag, "runs"))) {
        float *w32 = down(gw[0], wc * 4), *b32 = down(gb[0], OC * 4);
        uint16_t *w16[6], *b16[6], *wr = malloc(wc * 2), *br = malloc(OC * 2);
        for (int k = 1; k < 6; k++) { w16[k] = down(gw[k], wc * 2); b16[k] = down(gb[k], OC * 2); }
        zk_cast_f32_bf16(wr, w32, wc); zk_cast_f32_bf16(br, b32, OC);
        same_bits(gname(nb, &ni, tag, "db bf16: the fp32 call's rounded once (RNE)"), b16[1], br, OC * 2);
        if (via)                /* the fp32 GEMMs into scratch, then the cast */
            same_bits(gname(nb, &ni, tag, "dw bf16 (small output): the fp32 call's rounded once (RNE)"),
                      w16[1], wr, wc * 2);
        else {  /* dw (OC,C) = dy^T (OC,N) . a (N,C) in double, the fp32 bound + a bf16 rounding */
            float *dyt = transpose(dy, N, OC), *at = transpose(a, N, C);
            double *ref = malloc(wc * sizeof(double)), *bnd = malloc(wc * sizeof(double));
            ref_gemm_nt(ref, bnd, dyt, at, NULL, OC, N, C);
            for (size_t i = 0; i < wc; i++) bnd[i] += fabs(ref[i]) * 0x1p-8;
            float *f = f32_of(w16[1], wc), *fr = f32_of(wr, wc);
            check_gemm(gname(nb, &ni, tag, "dw bf16 (fp32 dot bound + a bf16 rounding)"), f, ref, bnd, wc);
            size_t nd = 0;
            for (size_t i = 0; i < wc; i++) { nd += w16[1][i] != wr[i]; ref[i] = fr[i]; bnd[i] *= 2; }
            check_gemm(gname(nb, &ni, tag, "dw bf16 against the fp32 call's rounded (within both)"), f, ref,
                       bnd, wc);
            printf("  %s: dw bf16 differs from the fp32 call's rounded in %zu of %zu elements\n", tag, nd, wc);
            free(dyt); free(at); free(ref); free(bnd); free(f); free(fr);
        }
        static const char *kn[6] = { "", "", "with a bf16 dinp", "alone (dinp NULL)", "again",
                                     "from matmul_bf16_backward_dgelu (dinp16 NULL)" };
        char what[200];
        for (int k = 2; k < 6; k++) {
            snprintf(what, sizeof what, "dw bf16 %s: the same bits", kn[k]);
            same_bits(gname(nb, &ni, tag, what), w16[k], w16[1], wc * 2);
            snprintf(what, sizeof what, "db bf16 %s: the same bits", kn[k]);
            same_bits(gname(nb, &ni, tag, what), b16[k], b16[1], OC * 2);
        }
        float *d0 = down(di[0], nc * 4), *d1 = down(di[1], nc * 4);
        uint16_t *d2 = down(di[2], nc * 2), *d0r = malloc(nc * 2);
        same_bits(gname(nb, &ni, tag, "dinp: the g16 0 call's bits"), d1, d0, nc * 4);
        if (zt_cuda_matmul_split(-1) == 1 && OC > 8192 && OC % 128) {   /* split: cast from fp32 */
            zk_cast_f32_bf16(d0r, d0, nc);
            same_bits(gname(nb, &ni, tag, "bf16 dinp (split OC): the fp32 dinp rounded once"), d2, d0r, nc * 2);
        }
        free(w32); free(b32); free(wr); free(br); free(d0); free(d1); free(d2); free(d0r);
        for (int k = 1; k < 6; k++) { free(w16[k]); free(b16[k]); }
    }
    if (N > 0 && N <= 128) {    /* N = 0: an empty sum, zeros */
        dv->fill(gw[1], NAN, wc / 2); dv->fill(gb[1], NAN, OC / 2);
        int e = dv->matmul_bf16_backward(NULL, 0, gw[1], gb[1], 1, ddy, da, dw, 0, C, OC, ld);
        ct_check(e == ZT_OK, gname(nb, &ni, tag, "N = 0: the call succeeds"), "%d: %s", e, zt_last_error());
        if (synced(gname(nb, &ni, tag, "N = 0 runs")) && e == ZT_OK) {
            uint16_t *z = calloc(wc, 2), *g = down(gw[1], wc * 2), *gz = down(gb[1], OC * 2);
            same_bits(gname(nb, &ni, tag, "N = 0: dw bf16 zeros"), g, z, wc * 2);
            same_bits(gname(nb, &ni, tag, "N = 0: db bf16 zeros"), gz, z, OC * 2);
            free(z); free(g); free(gz);
        }
    }
    for (int k = 0; k < 6; k++) { dv->free(gw[k]); dv->free(gb[k]); }
    for (int k = 0; k < 3; k++) dv->free(di[k]);
    dv->free(da); dv->free(dw); dv->free(ddy);
    free(a); free(w); free(dy); free(ha); free(hw); free(hd);
    return via;
}

/* cuBLASLt (mode 2, the default) and cuBLAS (0): rows of 1542 bytes (the
 * plain path either way), GPT-2's qkv, a long k = N (the fp32 dw's
 * split-K shape; attn.c_proj's dw), the MLP's fc (144 output tiles), the
 * LM head split at 50176 (dw's rows in two GEMMs). dw's two paths: the
 * first shape (14 tiles) takes the fp32 path and the cast on any GPU, the
 * LM head (2358 tiles) the bf16 D; the rest by the GPU's SM count (an
 * H100 or H200: qkv and c_proj the fp32 path, fc the bf16 D). Then a small
 * output with the rule off (zkc_matmul_g16_hybrid(0)): the bf16 D. */
static void t_matmul_g16(void)
{
    int was = zt_cuda_matmul_epilogue(-1), n[2] = { 0, 0 };
    for (int lt = 2; lt >= 0; lt -= 2) {
        zt_cuda_matmul_epilogue(lt);
        n[t_matmul_g16_at(67, 771, 130, 256)]++;
        n[t_matmul_g16_at(128, 768, 2304, 2304)]++;
        n[t_matmul_g16_at(1024, 768, 768, 768)]++;
        n[t_matmul_g16_at(256, 768, 3072, 3072)]++;
        n[t_matmul_g16_at(16, 768, 50257, 50304)]++;
    }
    zt_cuda_matmul_epilogue(was);
    ct_check(n[0] > 0 && n[1] > 0, "matmul bf16 backward g16: shapes of both dw paths tested",
             "%d bf16 D, %d fp32 + cast", n[0], n[1]);
    int hy = zkc_matmul_g16_hybrid(-1);    /* asks; then off */
    zkc_matmul_g16_hybrid(0);
    int off = zkc_matmul_g16_dw_f32(1024, 768, 768);
    ct_check(hy == 1 && off == 0, "zkc_matmul_g16_hybrid(0): a small output's dw the bf16 D",
             "hybrid was %d, dw_f32 %d", hy, off);
    t_matmul_g16_at(1024, 768, 768, 768);
    zkc_matmul_g16_hybrid(1);
}

static void t_attention(int B, int T, int C, int NH)
{
    char name[128];
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = ct_rand(nq, -2, 2), *dy = ct_rand(no, -1, 1);
    float *o = malloc(no * 4), *l = malloc(nl * 4), *dq = malloc(nq * 4);
    zk_attention_forward(o, l, qkv, B, T, C, NH);
    zk_attention_backward(dq, dy, qkv, o, l, B, T, C, NH);
    float *d_qkv = up(qkv, nq * 4), *d_dy = up(dy, no * 4), *d_o = NULL, *d_l = NULL, *d_dq = NULL;
    dv->alloc((void **)&d_o, no * 4); dv->alloc((void **)&d_l, nl * 4); dv->alloc((void **)&d_dq, nq * 4);
    dv->attention_forward(d_o, d_l, d_qkv, 0, B, T, C, NH, NH, 0);
    dv->attention_backward(d_dq, d_dy, d_qkv, d_o, d_l, 0, B, T, C, NH, NH, 0);
    snprintf(name, sizeof name, "attention B=%d T=%d C=%d NH=%d", B, T, C, NH);
    if (!synced(name)) return;
    float *go = down(d_o, no * 4), *gl = down(d_l, nl * 4), *gq = down(d_dq, nq * 4);
    snprintf(name, sizeof name, "attention forward out, T=%d hs=%d", T, C / NH);
    close_to(name, go, o, no, 1e-5, 1e-4);
    snprintf(name, sizeof name, "attention forward lse, T=%d", T);
    close_to(name, gl, l, nl, 1e-5, 1e-5);
    snprintf(name, sizeof name, "attention backward dqkv, T=%d", T);
    close_to(name, gq, dq, nq, 1e-5, 1e-3);
    free(qkv); free(dy); free(o); free(l); free(dq); free(go); free(gl); free(gq);
    dv->free(d_qkv); dv->free(d_dy); dv->free(d_o); dv->free(d_l); dv->free(d_dq);
}
/* KV-cache decode: a prefill of P positions, then a step of Tn more. The
 * step's rows against the CPU's full forward (attention's tolerance), and
 * against the GPU's own full forward, bit for bit (the same row arithmetic:
 * a cached position's output is that of the whole sequence). */
static void t_decode(int B, int P, int Tn, int C, int NH, int maxT)
{
    char name[128];
    const int L = P + Tn, hs = C / NH;
    size_t nq = (size_t)B * L * 3 * C, no = (size_t)B * L * C, nc = (size_t)B * NH * maxT * hs;
    float *qkv = ct_rand(nq, -2, 2), *o = malloc(no * 4), *l = malloc((size_t)B * NH * L * 4);
    zk_attention_forward(o, l, qkv, B, L, C, NH);
    /* the two calls' inputs: rows [0,P) and [P,L) of each sequence */
    float *q0 = malloc((size_t)B * P * 3 * C * 4), *q1 = malloc((size_t)B * Tn * 3 * C * 4);
    for (int b = 0; b < B; b++) {
        memcpy(q0 + (size_t)b * P * 3 * C, qkv + (size_t)b * L * 3 * C, (size_t)P * 3 * C * 4);
        memcpy(q1 + (size_t)b * Tn * 3 * C, qkv + ((size_t)b * L + P) * 3 * C,
               (size_t)Tn * 3 * C * 4);
    }
    float *d_q = up(qkv, nq * 4), *d_q0 = up(q0, (size_t)B * P * 3 * C * 4);
    float *d_q1 = up(q1, (size_t)B * Tn * 3 * C * 4);
    float *d_o = NULL, *d_l = NULL, *d_o0 = NULL, *d_o1 = NULL, *d_k = NULL, *d_v = NULL;
    dv->alloc((void **)&d_o, no * 4); dv->alloc((void **)&d_l, (size_t)B * NH * L * 4);
    dv->alloc((void **)&d_o0, (size_t)B * P * C * 4); dv->alloc((void **)&d_o1, (size_t)B * Tn * C * 4);
    dv->alloc((void **)&d_k, nc * 4); dv->alloc((void **)&d_v, nc * 4);
    dv->zero(d_k, nc * 4); dv->zero(d_v, nc * 4);
    dv->attention_forward(d_o, d_l, d_q, 0, B, L, C, NH, NH, 0);
    dv->attention_decode(d_o0, d_k, d_v, d_q0, B, P, C, NH, NH, 0, maxT, 0);
    dv->attention_decode(d_o1, d_k, d_v, d_q1, B, Tn, C, NH, NH, 0, maxT, P);
    snprintf(name, sizeof name, "attention decode B=%d P=%d T=%d hs=%d", B, P, Tn, hs);
    if (!synced(name)) return;
    float *go = down(d_o, no * 4), *g1 = down(d_o1, (size_t)B * Tn * C * 4);
    float *gk = down(d_k, nc * 4);
    float *want = malloc((size_t)B * Tn * C * 4), *gwant = malloc((size_t)B * Tn * C * 4);
    for (int b = 0; b < B; b++) {
        memcpy(want + (size_t)b * Tn * C, o + ((size_t)b * L + P) * C, (size_t)Tn * C * 4);
        memcpy(gwant + (size_t)b * Tn * C, go + ((size_t)b * L + P) * C, (size_t)Tn * C * 4);
    }
    snprintf(name, sizeof name, "attention decode step (pos %d, T %d, hs %d) vs CPU forward", P, Tn, hs);
    close_to(name, g1, want, (size_t)B * Tn * C, 1e-5, 1e-4);
    snprintf(name, sizeof name, "attention decode step (hs %d): the GPU forward's bits", hs);
    same_bits(name, g1, gwant, (size_t)B * Tn * C * 4);
    size_t bad = 0;     /* cache row p of (b, h) = key of position p */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int p = 0; p < L; p++)
                bad += memcmp(gk + (((size_t)b * NH + h) * maxT + p) * hs,
                              qkv + ((size_t)b * L + p) * 3 * C + C + (size_t)h * hs, hs * 4) != 0;
    snprintf(name, sizeof name, "attention decode: kcache rows [0,%d) hold the keys", L);
    ct_check(bad == 0, name, "%zu of %d rows differ", bad, B * NH * L);
    free(qkv); free(o); free(l); free(q0); free(q1); free(go); free(g1); free(gk);
    free(want); free(gwant);
    dv->free(d_q); dv->free(d_q0); dv->free(d_q1); dv->free(d_o); dv->free(d_l);
    dv->free(d_o0); dv->free(d_o1); dv->free(d_k); dv->free(d_v);
}

/* Grouped-query heads and a sliding window (zkc_attention_*_gqa through
 * the device table): forward and backward against the CPU twin, a
 * prefill of T - 1 and one decode step giving the GPU forward's last
 * rows bit for bit; in the tensor-core mode (hs 64, 128: attention_tc_*.cu;
 * else the plain kernel) the forward near the CPU's (a loose bound: the
 * emulator's test holds the tc kernels to attn_tc_check.h's). */
static void t_attention_gqa(int B, int T, int NH, int NKV, int hs, int W)
{
    char name[160];
    int C = NH * hs, R = (NH + 2 * NKV) * hs, P = T - 1;
    size_t nq = (size_t)B * T * R, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    size_t nc = (size_t)B * NKV * T * hs;
    float *qkv = ct_rand(nq, -2, 2), *dy = ct_rand(no, -1, 1);
    float *o = malloc(no * 4), *l = malloc(nl * 4), *dq = malloc(nq * 4);
    zk_attention_forward_gqa(o, l, qkv, B, T, C, NH, NKV, W);
    zk_attention_backward_gqa(dq, dy, qkv, o, l, B, T, C, NH, NKV, W);
    float *q0 = malloc((size_t)B * P * R * 4), *q1 = malloc((size_t)B * R * 4);
    for (int b = 0; b < B; b++) {
        memcpy(q0 + (size_t)b * P * R, qkv + (size_t)b * T * R, (size_t)P * R * 4);
        memcpy(q1 + (size_t)b * R, qkv + ((size_t)b * T + P) * R, (size_t)R * 4);
    }
    float *d_qkv = up(qkv, nq * 4), *d_dy = up(dy, no * 4), *d_o = NULL, *d_l = NULL, *d_dq = NULL;
    float *d_q0 = up(q0, (size_t)B * P * R * 4), *d_q1 = up(q1, (size_t)B * R * 4);
    float *d_o0 = NULL, *d_o1 = NULL, *d_k = NULL, *d_v = NULL;
    dv->alloc((void **)&d_o, no * 4); dv->alloc((void **)&d_l, nl * 4); dv->alloc((void **)&d_dq, nq * 4);
    dv->alloc((void **)&d_o0, (size_t)B * P * C * 4); dv->alloc((void **)&d_o1, (size_t)B * C * 4);
    dv->alloc((void **)&d_k, nc * 4); dv->alloc((void **)&d_v, nc * 4);
    int rf = dv->attention_forward(d_o, d_l, d_qkv, 0, B, T, C, NH, NKV, W);
    int rb = dv->attention_backward(d_dq, d_dy, d_qkv, d_o, d_l, 0, B, T, C, NH, NKV, W);
    dv->attention_decode(d_o0, d_k, d_v, d_q0, B, P, C, NH, NKV, W, T, 0);
    dv->attention_decode(d_o1, d_k, d_v, d_q1, B, 1, C, NH, NKV, W, T, P);
    snprintf(name, sizeof name, "attention gqa B=%d T=%d NH=%d NKV=%d hs=%d W=%d", B, T, NH, NKV, hs, W);
    if (!synced(name) || rf || rb) { ct_fail(name, "rc %d %d", rf, rb); return; }
    float *go = down(d_o, no * 4), *gl = down(d_l, nl * 4), *gq = down(d_dq, nq * 4);
    float *g1 = down(d_o1, (size_t)B * C * 4), *gw = malloc((size_t)B * C * 4);
    for (int b = 0; b < B; b++) memcpy(gw + (size_t)b * C, go + ((size_t)b * T + P) * C, (size_t)C * 4);
    snprintf(name, sizeof name, "attention gqa NKV=%d W=%d forward out vs the CPU", NKV, W);
    close_to(name, go, o, no, 1e-5, 1e-4);
    snprintf(name, sizeof name, "attention gqa NKV=%d W=%d forward lse vs the CPU", NKV, W);
    close_to(name, gl, l, nl, 1e-5, 1e-5);
    snprintf(name, sizeof name, "attention gqa NKV=%d W=%d backward dqkv vs the CPU", NKV, W);
    close_to(name, gq, dq, nq, 1e-5, 1e-3);
    snprintf(name, sizeof name, "attention gqa NKV=%d W=%d decode step: the GPU forward's bits", NKV, W);
    same_bits(name, g1, gw, (size_t)B * C * 4);
    int was = zt_cuda_attention_mode(-1);
    zt_cuda_attention_mode(1);
    int rt = dv->attention_forward(d_o, d_l, d_qkv, 0, B, T, C, NH, NKV, W);
    zt_cuda_attention_mode(was);
    if (synced("attention gqa tc") && rt == 0) {
        float *to = down(d_o, no * 4);
        snprintf(name, sizeof name, "attention gqa NKV=%d W=%d hs=%d: tensor-core forward vs the CPU",
                 NKV, W, hs);
        close_to(name, to, o, no, 2e-2, 2e-2);
        free(to);
    } else {
        ct_fail("attention gqa tc", "rc %d msg %s", rt, zt_last_error());
    }
    free(qkv); free(dy); free(o); free(l); free(dq); free(q0); free(q1);
    free(go); free(gl); free(gq); free(g1); free(gw);
    dv->free(d_qkv); dv->free(d_dy); dv->free(d_o); dv->free(d_l); dv->free(d_dq);
    dv->free(d_q0); dv->free(d_q1); dv->free(d_o0); dv->free(d_o1); dv->free(d_k); dv->free(d_v);
}

static void t_attention_all(void)
{
    t_attention_gqa(2, 67, 4, 2, 64, 0);     /* GQA, hs 64 */
    t_attention_gqa(1, 200, 4, 2, 64, 50);   /* GQA, a window, hs 64 (tc too) */
    t_attention_gqa(1, 130, 4, 1, 128, 70);  /* MQA, a window, hs 128 */
    t_attention_gqa(1, 130, 8, 1, 32, 40);   /* MQA, a window */
    t_attention_gqa(2, 33, 3, 3, 40, 500);   /* NKV = NH, window > T */
    t_decode(2, 37, 1, 96, 3, 64);      /* a decode step, hs 32 */
    t_decode(1, 70, 9, 120, 3, 100);    /* several new tokens, hs 40 */
    t_attention(2, 67, 96, 3);      /* hs 32 */
    t_attention(1, 130, 192, 3);    /* hs 64, T over a CPU key tile */
    t_attention(2, 33, 120, 3);     /* hs 40: lanes past the head */
}

/* the tests' names in the ordered-dQ and wide-forward passes */
static const char *dq_tag = "";

/* bf16 tensor-core attention through the device table in mode 1, twice:
 * against the CPU twin (attn_tc_check.h's tolerances), dqkv prefilled with
 * NaN (WRITTEN: every element), and the same bits both runs. */
static void t_attention_tc(int B, int T, int NH, int hs)
{
    enum { runs = 2 };
    char name[128];
    const int C = hs * NH;
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = ct_rand(nq, -2, 2), *dy = ct_rand(no, -1, 1), *nan = malloc(nq * 4);
    tc_round_bf16(qkv, nq);             /* bf16 values: both sides see the same inputs */
    tc_round_bf16(dy, no);
    for (size_t i = 0; i < nq; i++) nan[i] = NAN;
    float *o = malloc(no * 4), *l = malloc(nl * 4), *dq = malloc(nq * 4);
    double *mo = malloc(no * 8), *ml = malloc(nl * 8), *mdq = malloc(nq * 8);
    zk_attention_forward(o, l, qkv, B, T, C, NH);
    zk_attention_backward(dq, dy, qkv, o, l, B, T, C, NH);
    tc_mags(mo, ml, mdq, qkv, dy, B, T, C, NH);
    float *d_qkv = up(qkv, nq * 4), *d_dy = up(dy, no * 4), *d_o[runs], *d_l[runs], *d_dq[runs];
    int was = zt_cuda_attention_mode(-1);
    zt_cuda_attention_mode(1);
    for (int r = 0; r < runs; r++) {
        d_dq[r] = up(nan, nq * 4);
        dv->alloc((void **)&d_o[r], no * 4); dv->alloc((void **)&d_l[r], nl * 4);
        dv->attention_forward(d_o[r], d_l[r], d_qkv, 0, B, T, C, NH, NH, 0);
        dv->attention_backward(d_dq[r], d_dy, d_qkv, d_o[r], d_l[r], 0, B, T, C, NH, NH, 0);
    }
    zt_cuda_attention_mode(was);
    snprintf(name, sizeof name, "attention bf16%s B=%d T=%d NH=%d hs=%d", dq_tag, B, T, NH, hs);
    if (!synced(name)) return;
    float *go = down(d_o[0], no * 4), *gl = down(d_l[0], nl * 4), *gq = down(d_dq[0], nq * 4);
    snprintf(name, sizeof name, "attention bf16%s forward out, B=%d T=%d NH=%d", dq_tag, B, T, NH);
    tc_check(name, go, o, mo, no, TC_RHO);
    snprintf(name, sizeof name, "attention bf16%s forward lse, T=%d", dq_tag, T);
    tc_check(name, gl, l, ml, nl, 1.0);
    snprintf(name, sizeof name, "attention bf16%s backward dqkv (all written), T=%d", dq_tag, T);
    tc_check(name, gq, dq, mdq, nq, TC_RHO);
    for (int r = 1; r < runs; r++) {
        float *go2 = down(d_o[r], no * 4), *gl2 = down(d_l[r], nl * 4), *gq2 = down(d_dq[r], nq * 4);
        snprintf(name, sizeof name, "attention bf16%s T=%d: out the same bits, run %d", dq_tag, T, r + 1);
        same_bits(name, go2, go, no * 4);
        snprintf(name, sizeof name, "attention bf16%s T=%d: lse the same bits, run %d", dq_tag, T, r + 1);
        same_bits(name, gl2, gl, nl * 4);
        snprintf(name, sizeof name, "attention bf16%s T=%d: dqkv the same bits, run %d", dq_tag, T, r + 1);
        same_bits(name, gq2, gq, nq * 4);
        free(go2); free(gl2); free(gq2);
    }
    free(qkv); free(dy); free(nan); free(o); free(l); free(dq); free(mo); free(ml); free(mdq);
    free(go); free(gl); free(gq);
    dv->free(d_qkv); dv->free(d_dy);
    for (int r = 0; r < runs; r++) { dv->free(d_o[r]); dv->free(d_l[r]); dv->free(d_dq[r]); }
}

/* forward + backward of (B, T, C, NH) in the given mode: out and dqkv, host */
/* skew: qkv read from 4 bytes past an allocation's start (not 16-byte
 * aligned: the tensor-core kernels refuse it, the device routes it plain) */
static void attn_in_mode_at(int mode, float **out, float **dqkv, const float *qkv, const float *dy,
                            int B, int T, int C, int NH, int skew)
{
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
    float *d_buf = NULL, *d_dy = up(dy, no * 4), *d_o = NULL, *d_l = NULL, *d_dq = NULL;
    dv->alloc((void **)&d_buf, (nq + 4) * 4);
    float *d_qkv = d_buf + (skew ? 1 : 0);
    cudaMemcpy(d_qkv, qkv, nq * 4, cudaMemcpyHostToDevice);
    dv->alloc((void **)&d_o, no * 4); dv->alloc((void **)&d_l, (size_t)B * NH * T * 4);
    dv->alloc((void **)&d_dq, nq * 4);
    int was = zt_cuda_attention_mode(-1);
    zt_cuda_attention_mode(mode);
    dv->attention_forward(d_o, d_l, d_qkv, 0, B, T, C, NH, NH, 0);
    dv->attention_backward(d_dq, d_dy, d_qkv, d_o, d_l, 0, B, T, C, NH, NH, 0);
    zt_cuda_attention_mode(was);
    *out = down(d_o, no * 4);
    *dqkv = down(d_dq, nq * 4);
    dv->free(d_buf); dv->free(d_dy); dv->free(d_o); dv->free(d_l); dv->free(d_dq);
}
static void attn_in_mode(int mode, float **out, float **dqkv, const float *qkv, const float *dy,
                         int B, int T, int C, int NH)
{
    attn_in_mode_at(mode, out, dqkv, qkv, dy, B, T, C, NH, 0);
}

/* the mode switch, the routing it controls, and hs != 64 refused */
static void t_attention_tc_mode(void)
{
    int was = zt_cuda_attention_mode(-1);
    int a = zt_cuda_attention_mode(1), b = zt_cuda_attention_mode(-1);
    int c = zt_cuda_attention_mode(7), d = zt_cuda_attention_mode(-1);
    zt_cuda_attention_mode(was);
    ct_check(a == 1 && b == 1 && c == ZT_EINVAL && d == 1, "attention mode: set, query, 7 refused",
             "set %d, query %d, set 7 %d, query %d", a, b, c, d);
    float *qkv = ct_rand((size_t)100 * 3 * 128, -2, 2), *dy = ct_rand((size_t)100 * 128, -1, 1);
    float *o0, *o1, *g0, *g1;
    attn_in_mode(0, &o0, &g0, qkv, dy, 1, 100, 128, 2);           /* hs 64 */
    attn_in_mode(1, &o1, &g1, qkv, dy, 1, 100, 128, 2);
    ct_check(memcmp(o0, o1, (size_t)100 * 128 * 4) != 0 && memcmp(g0, g1, (size_t)300 * 128 * 4) != 0,
             "attention mode bf16 at hs 64 runs the tensor-core kernels (not the plain bits)",
             "out or dqkv has the plain kernel's bits");
    free(o0); free(o1); free(g0); free(g1);
    attn_in_mode(0, &o0, &g0, qkv, dy, 1, 100, 96, 3);            /* hs 32: plain in both */
    attn_in_mode(1, &o1, &g1, qkv, dy, 1, 100, 96, 3);
    same_bits("attention mode bf16 at hs 32: the plain kernel's out", o1, o0, (size_t)100 * 96 * 4);
    same_bits("attention mode bf16 at hs 32: the plain kernel's dqkv", g1, g0, (size_t)300 * 96 * 4);
    free(o0); free(o1); free(g0); free(g1);
    attn_in_mode_at(0, &o0, &g0, qkv, dy, 1, 100, 128, 2, 1);     /* hs 64, qkv off 16 bytes */
    attn_in_mode_at(1, &o1, &g1, qkv, dy, 1, 100, 128, 2, 1);
    same_bits("attention mode bf16, qkv not on 16 bytes: the plain kernel's out", o1, o0, (size_t)100 * 128 * 4);
    same_bits("attention mode bf16, qkv not on 16 bytes: the plain kernel's dqkv", g1, g0, (size_t)300 * 128 * 4);
    free(o0); free(o1); free(g0); free(g1); free(qkv); free(dy);
    cudaStream_t s = (cudaStream_t)zt_cuda_get_stream();
    int e1 = zkc_attention_forward_tc(s, NULL, NULL, NULL, 0, 1, 8, 96, 3);
    int e2 = zkc_attention_backward_tc(s, NULL, NULL, NULL, NULL, NULL, 1, 1, 8, 130, 2, NULL);
    ct_check(e1 == (int)cudaErrorInvalidValue && e2 == (int)cudaErrorInvalidValue,
             "attention tc: head size 32 or 65 is cudaErrorInvalidValue", "forward %d, backward %d", e1, e2);
}

/* bf16 I/O (io16) through the device table in the given mode: out and
 * lse against the fp32 call on the widened qkv, out = bf16(fp32 out) and
 * lse the same bits; dqkv (prefilled with a NaN: WRITTEN) from a bf16 dout
 * against the fp32 backward given the widened bf16 out and dout, dqkv =
 * bf16(fp32 dqkv): bit for bit
 * on this GPU, whichever kernel the routing picks (counted: tc expected or
 * not). skew: qkv (both calls') 2 or 4 bytes past a 16-byte boundary, so
 * mode 1 routes it plain. */
static void attn_io16(int mode, int B, int T, int NH, int hs, int skew, int want_tc)
{
    char name[160], at[96];
    const int C = hs * NH;
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = ct_rand(nq, -2, 2), *dy = ct_rand(no, -1, 1), *qw = malloc(nq * 4);
    uint16_t *q16 = malloc(nq * 2), *nan16 = malloc(nq * 2), *dy16 = malloc(no * 2);
    zk_cast_f32_bf16(q16, qkv, nq);
    zk_cast_f32_bf16(dy16, dy, no);
    zk_cast_bf16_f32(dy, dy16, no);                 /* the fp32 call's dout: the bf16 one widened */
    zk_cast_bf16_f32(qw, q16, nq);                  /* the widened bf16 qkv */
    for (size_t i = 0; i < nq; i++) nan16[i] = 0x7fc1;
    snprintf(at, sizeof at, "attention io16%s mode %d B=%d T=%d NH=%d hs=%d%s", dq_tag, mode, B, T,
             NH, hs, skew ? " qkv off 16 bytes" : "");
    float *d_bw = NULL, *d_ow = NULL, *d_lw = NULL, *d_dqw = NULL, *d_l16 = NULL;
    uint16_t *d_b16 = NULL, *d_o16 = NULL;
    float *d_dy = up(dy, no * 4);
    uint16_t *d_dy16 = up(dy16, no * 2), *d_dq16 = up(nan16, nq * 2);
    dv->alloc((void **)&d_bw, (nq + 4) * 4); dv->alloc((void **)&d_b16, (nq + 8) * 2);
    float *d_qw = d_bw + (skew ? 1 : 0);
    uint16_t *d_q16 = d_b16 + (skew ? 1 : 0);
    dv->copy(d_qw, qw, nq * 4); dv->copy(d_q16, q16, nq * 2);
    dv->alloc((void **)&d_ow, no * 4); dv->alloc((void **)&d_lw, nl * 4);
    dv->alloc((void **)&d_dqw, nq * 4); dv->alloc((void **)&d_l16, nl * 4);
    dv->alloc((void **)&d_o16, no * 2);
    int was = zt_cuda_attention_mode(-1);
    zt_cuda_attention_mode(mode);
    int rf = dv->attention_forward(d_ow, d_lw, d_qw, 0, B, T, C, NH, NH, 0);
    int64_t tc0 = dv->attention_tc_calls();
    int r16 = dv->attention_forward(d_o16, d_l16, d_q16, 1, B, T, C, NH, NH, 0);
    int64_t tc1 = dv->attention_tc_calls();
    snprintf(name, sizeof name, "%s: forward", at);
    if (!synced(name)) { zt_cuda_attention_mode(was); return; }
    uint16_t *o16 = down(d_o16, no * 2);
    float *ow = down(d_ow, no * 4), *lw = down(d_lw, nl * 4), *l16 = down(d_l16, nl * 4);
    float *o16w = malloc(no * 4);
    zk_cast_bf16_f32(o16w, o16, no);
    float *d_o16w = up(o16w, no * 4);           /* the fp32 backward reads the bf16 out widened */
    int rb = dv->attention_backward(d_dqw, d_dy, d_qw, d_o16w, d_l16, 0, B, T, C, NH, NH, 0);
    int64_t tc2 = dv->attention_tc_calls();
    int rb16 = dv->attention_backward(d_dq16, d_dy16, d_q16, d_o16, d_l16, 1, B, T, C, NH, NH, 0);
    int64_t tc3 = dv->attention_tc_calls();
    zt_cuda_attention_mode(was);
    snprintf(name, sizeof name, "%s: backward", at);
    if (!synced(name)) return;
    snprintf(name, sizeof name, "%s: calls return 0", at);
    ct_check(rf == 0 && r16 == 0 && rb == 0 && rb16 == 0, name, "forward %d / %d, backward %d / %d",
             rf, r16, rb, rb16);
    snprintf(name, sizeof name, "%s: %s kernels", at, want_tc ? "tensor-core" : "plain");
    ct_check(tc1 - tc0 == want_tc && tc3 - tc2 == want_tc, name, "tc calls forward %lld, backward %lld",
             (long long)(tc1 - tc0), (long long)(tc3 - tc2));
    uint16_t *want = malloc(nq * 2), *dq16 = down(d_dq16, nq * 2);
    float *dqw = down(d_dqw, nq * 4);
    zk_cast_f32_bf16(want, ow, no);
    snprintf(name, sizeof name, "%s: out = bf16(fp32 out)", at);
    same_bits(name, o16, want, no * 2);
    snprintf(name, sizeof name, "%s: lse the fp32 call's bits", at);
    same_bits(name, l16, lw, nl * 4);
    zk_cast_f32_bf16(want, dqw, nq);
    snprintf(name, sizeof name, "%s: dqkv = bf16(fp32 dqkv), all written", at);
    same_bits(name, dq16, want, nq * 2);
    free(qkv); free(dy); free(qw); free(q16); free(nan16); free(dy16); free(o16); free(ow); free(lw);
    free(l16); free(o16w); free(want); free(dq16); free(dqw);
    dv->free(d_bw); dv->free(d_b16); dv->free(d_dy); dv->free(d_dy16); dv->free(d_dq16); dv->free(d_ow); dv->free(d_lw);
    dv->free(d_dqw); dv->free(d_l16); dv->free(d_o16); dv->free(d_o16w);
}

static void t_attention_io16_all(void)
{
    attn_io16(0, 2, 257, 2, 64, 0, 0);      /* plain kernels */
    attn_io16(0, 1, 100, 3, 40, 0, 0);      /* plain, lanes past the head */
    attn_io16(1, 1, 1024, 12, 64, 0, 1);    /* GPT-2 124M's heads, tensor cores */
    attn_io16(1, 2, 257, 2, 64, 0, 1);      /* one key past a 128-row block */
    attn_io16(1, 1, 257, 3, 128, 0, 1);     /* head size 128 */
    attn_io16(1, 2, 33, 1, 128, 0, 1);      /* ragged chunks of 16 */
    attn_io16(1, 1, 1, 1, 64, 0, 1);        /* one key */
    attn_io16(1, 1, 100, 3, 32, 0, 0);      /* head size 32: plain in mode 1 */
    attn_io16(1, 1, 130, 2, 96, 0, 0);      /* head size 96: plain in mode 1 */
    attn_io16(1, 1, 100, 2, 64, 1, 0);      /* qkv off 16 bytes: plain in mode 1 */
}

static void t_attention_tc_all(void)
{
    t_attention_tc_mode();
    t_attention_tc(1, 1, 1, 64);        /* one key */
    t_attention_tc(2, 17, 2, 64);       /* under one tile, B*NH = 4 */
    t_attention_tc(1, 64, 3, 64);       /* exactly one tile */
    t_attention_tc(2, 100, 2, 64);      /* ragged second tile */
    t_attention_tc(1, 256, 2, 64);      /* four tiles: the rescale across tiles */
    t_attention_tc(1, 257, 2, 64);      /* one key past a 128-row block */
    t_attention_tc(2, 193, 12, 64);     /* GPT-2's 12 heads of 64 (C 768), ragged */
    t_attention_tc(1, 1, 1, 128);       /* head size 128 (Llama's) */
    t_attention_tc(2, 100, 2, 128);
    t_attention_tc(1, 257, 3, 128);
}

/* Ordered dQ at a shape with hundreds of dK/dV blocks in flight (B*NH*T/64):
 * three runs the same bits (the order must not depend on which block the
 * GPU starts first), and head (B-1, NH-1)'s q, k, v gradients against the
 * CPU twin run on that head alone (the whole problem's CPU magnitudes take
 * a minute at T = 2048) */
static void t_ordered_many(int B, int T, int NH, int hs)
{
    char name[160];
    const int C = NH * hs, b1 = B - 1, h1 = NH - 1;
    const char *wt = (hs == 128 ? zt_cuda_attention_bwd_wide(-1) : zt_cuda_attention_bwd_wide64(-1))
                     ? ", wide backward" : "";
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = ct_rand(nq, -2, 2), *dy = ct_rand(no, -1, 1), *nan = malloc(nq * 4);
    tc_round_bf16(qkv, nq);
    tc_round_bf16(dy, no);
    for (size_t i = 0; i < nq; i++) nan[i] = NAN;
    float *d_qkv = up(qkv, nq * 4), *d_dy = up(dy, no * 4), *d_o = NULL, *d_l = NULL, *d_dq[4];
    dv->alloc((void **)&d_o, no * 4); dv->alloc((void **)&d_l, nl * 4);
    int am = zt_cuda_attention_mode(-1), rc = 0;
    zt_cuda_attention_mode(1);
    rc |= dv->attention_forward(d_o, d_l, d_qkv, 0, B, T, C, NH, NH, 0);
    for (int r = 0; r < 4; r++) {                 /* three ordered, then dQ by its own pass */
        d_dq[r] = up(nan, nq * 4);
        zt_cuda_attention_dq(r < 3);
        rc |= dv->attention_backward(d_dq[r], d_dy, d_qkv, d_o, d_l, 0, B, T, C, NH, NH, 0);
    }
    zt_cuda_attention_dq(1);
    zt_cuda_attention_mode(am);
    snprintf(name, sizeof name, "attention ordered dQ%s B=%d T=%d NH=%d hs=%d", wt, B, T, NH, hs);
    if (!synced(name) || rc) { ct_fail(name, "rc %d", rc); return; }
    float *g[4];
    for (int r = 0; r < 4; r++) g[r] = down(d_dq[r], nq * 4);
    snprintf(name, sizeof name, "attention ordered dQ%s B=%d T=%d hs=%d: three runs the same bits", wt, B, T, hs);
    ct_check(!memcmp(g[0], g[1], nq * 4) && !memcmp(g[0], g[2], nq * 4), name, "dqkv differs");
    size_t bad = 0;
    while (bad < nq && isfinite(g[0][bad])) bad++;
    snprintf(name, sizeof name, "attention ordered dQ%s B=%d T=%d hs=%d: every element written", wt, B, T, hs);
    ct_check(bad == nq, name, "element %zu is %g", bad, bad < nq ? (double)g[0][bad] : 0.0);
    size_t row = 0;                               /* dk, dv: the same kernel code and D either way */
    while (row < (size_t)B * T && !memcmp(g[0] + row * 3 * C + C, g[3] + row * 3 * C + C, (size_t)C * 8)) row++;
    snprintf(name, sizeof name, "attention ordered dQ%s B=%d T=%d hs=%d: dk, dv the pass mode's bits", wt, B, T, hs);
    ct_check(row == (size_t)B * T, name, "row %zu differs", row);
    /* head (b1, h1) alone: qkv rows of 3 hs, its dy, and the GPU's dq, dk, dv */
    float *q1 = malloc((size_t)T * 3 * hs * 4), *y1 = malloc((size_t)T * hs * 4);
    float *got = malloc((size_t)T * 3 * hs * 4);
    for (int t = 0; t < T; t++)
        for (int p = 0; p < 3; p++) {
            size_t src = ((size_t)b1 * T + t) * 3 * C + (size_t)p * C + (size_t)h1 * hs;
            memcpy(q1 + ((size_t)t * 3 + p) * hs, qkv + src, (size_t)hs * 4);
            memcpy(got + ((size_t)t * 3 + p) * hs, g[0] + src, (size_t)hs * 4);
            if (p == 0) memcpy(y1 + (size_t)t * hs, dy + ((size_t)b1 * T + t) * C + (size_t)h1 * hs, (size_t)hs * 4);
        }
    float *o = malloc((size_t)T * hs * 4), *l = malloc((size_t)T * 4), *dq = malloc((size_t)T * 3 * hs * 4);
    double *mo = malloc((size_t)T * hs * 8), *ml = malloc((size_t)T * 8), *mdq = malloc((size_t)T * 3 * hs * 8);
    zk_attention_forward(o, l, q1, 1, T, hs, 1);
    zk_attention_backward(dq, y1, q1, o, l, 1, T, hs, 1);
    tc_mags(mo, ml, mdq, q1, y1, 1, T, hs, 1);
    snprintf(name, sizeof name, "attention ordered dQ%s B=%d T=%d hs=%d: head %d of batch %d's dq, dk, dv "
             "vs the CPU", wt, B, T, hs, h1, b1);
    tc_check(name, got, dq, mdq, (size_t)T * 3 * hs, TC_RHO);
    free(q1); free(y1); free(got); free(o); free(l); free(dq); free(mo); free(ml); free(mdq);
    free(qkv); free(dy); free(nan);
    for (int r = 0; r < 4; r++) { free(g[r]); dv->free(d_dq[r]); }
    dv->free(d_qkv); dv->free(d_dy); dv->free(d_o); dv->free(d_l);
}

/* Ordered dQ with grouped-query heads and windows (the windowed kernels
 * hold 1 block an SM): dqkv against the CPU twin (zk_attention_*_gqa,
 * attn_tc_check.h's magnitudes), every element written, the same bits
 * twice */
static void t_ordered_gqa(int B, int T, int NH, int NKV, int hs, int W)
{
    char name[192];
    const int C = NH * hs, R = (NH + 2 * NKV) * hs;
    const char *wt = (hs == 128 ? zt_cuda_attention_bwd_wide(-1) : zt_cuda_attention_bwd_wide64(-1))
                     ? ", wide backward" : "";
    size_t nq = (size_t)B * T * R, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = ct_rand(nq, -2, 2), *dy = ct_rand(no, -1, 1), *nan = malloc(nq * 4);
    tc_round_bf16(qkv, nq);
    tc_round_bf16(dy, no);
    for (size_t i = 0; i < nq; i++) nan[i] = NAN;
    float *o = malloc(no * 4), *l = malloc(nl * 4), *dq = malloc(nq * 4);
    double *mo = malloc(no * 8), *ml = malloc(nl * 8), *mq = malloc(nq * 8);
    zk_attention_forward_gqa(o, l, qkv, B, T, C, NH, NKV, W);
    zk_attention_backward_gqa(dq, dy, qkv, o, l, B, T, C, NH, NKV, W);
    tc_mags_gqa(mo, ml, mq, qkv, dy, B, T, C, NH, NKV, W);
    float *d_qkv = up(qkv, nq * 4), *d_dy = up(dy, no * 4), *d_o = NULL, *d_l = NULL, *d_dq[2];
    dv->alloc((void **)&d_o, no * 4); dv->alloc((void **)&d_l, nl * 4);
    int am = zt_cuda_attention_mode(-1), rc = 0;
    zt_cuda_attention_mode(1);
    rc |= dv->attention_forward(d_o, d_l, d_qkv, 0, B, T, C, NH, NKV, W);
    for (int r = 0; r < 2; r++) {
        d_dq[r] = up(nan, nq * 4);
        rc |= dv->attention_backward(d_dq[r], d_dy, d_qkv, d_o, d_l, 0, B, T, C, NH, NKV, W);
    }
    zt_cuda_attention_mode(am);
    snprintf(name, sizeof name, "attention ordered dQ%s gqa B=%d T=%d NH=%d NKV=%d hs=%d W=%d", wt, B, T, NH,
             NKV, hs, W);
    if (!synced(name) || rc) { ct_fail(name, "rc %d", rc); return; }
    float *g0 = down(d_dq[0], nq * 4), *g1 = down(d_dq[1], nq * 4);
    char what[240];
    snprintf(what, sizeof what, "%s: dqkv vs the CPU, all written", name);
    tc_check(what, g0, dq, mq, nq, TC_RHO);
    snprintf(what, sizeof what, "%s: the same bits twice", name);
    ct_check(!memcmp(g0, g1, nq * 4), what, "dqkv differs");
    free(qkv); free(dy); free(nan); free(o); free(l); free(dq); free(mo); free(ml); free(mq);
    free(g0); free(g1);
    for (int r = 0; r < 2; r++) dv->free(d_dq[r]);
    dv->free(d_qkv); dv->free(d_dy); dv->free(d_o); dv->free(d_l);
}

/* The tensor-core backward with the ordered dQ (zt_cuda_attention_dq(1):
 * dQ in the dK/dV kernel, each query chunk's key-tile parts added in one
 * order by blocks that wait on counts): the tensor-core checks above again
 * (against the CPU twin, every element written, the same bits twice; io16
 * = bf16(the fp32 call)), with grouped-query heads and windows, and at
 * shapes with hundreds of blocks in flight (t_ordered_many). A wait that
 * no block can end traps after ~20 s (mma.cuh): a failed launch, not a
 * hang. */
static void t_attention_dq_ordered(void)
{
    int was = zt_cuda_attention_dq(-1), on = zt_cuda_attention_dq(1), bad = zt_cuda_attention_dq(7);
    ct_check(on == 1 && bad == ZT_EINVAL && zt_cuda_attention_dq(-1) == 1,
             "attention ordered dQ: mode 1 set, 7 refused and the mode kept", "got %d, 7 %d", on, bad);
    dq_tag = " (ordered dQ)";
    t_attention_tc(1, 1, 1, 64);
    t_attention_tc(2, 100, 2, 64);
    t_attention_tc(1, 257, 2, 64);
    t_attention_tc(2, 193, 12, 64);
    t_attention_tc(1, 1, 1, 128);
    t_attention_tc(2, 100, 2, 128);
    t_attention_tc(1, 257, 3, 128);
    attn_io16(1, 1, 1024, 12, 64, 0, 1);
    attn_io16(1, 2, 257, 2, 64, 0, 1);
    attn_io16(1, 1, 257, 3, 128, 0, 1);
    attn_io16(1, 2, 33, 1, 128, 0, 1);
    t_ordered_gqa(1, 300, 4, 2, 64, 0);        /* GQA: a block's two query heads */
    t_ordered_gqa(2, 300, 4, 2, 64, 50);       /* and a window: 1 block an SM */
    t_ordered_gqa(2, 200, 4, 1, 128, 70);      /* MQA, hs 128, a window across chunks of 16 */
    t_ordered_many(2, 2048, 12, 64);           /* 768 dK/dV blocks, 264 an H100 holds */
    t_ordered_many(2, 2048, 8, 128);
    /* head size 128's wide backward with it: parts of 128 keys, 64-query chunks */
    int ww = zt_cuda_attention_bwd_wide(-1);
    if (zt_cuda_attention_bwd_wide(1) == 1) {    /* where the GPU grants its shared memory */
        dq_tag = " (ordered dQ, wide backward)";
        t_attention_tc(2, 100, 2, 128);
        t_attention_tc(1, 257, 3, 128);
        attn_io16(1, 1, 257, 3, 128, 0, 1);
        t_ordered_gqa(2, 300, 4, 1, 128, 70);  /* MQA, a window: a chunk's lowest tile not 0 */
        t_ordered_many(2, 2048, 8, 128);       /* 256 blocks of 128 keys, one an SM */
    }
    zt_cuda_attention_bwd_wide(ww);
    ww = zt_cuda_attention_bwd_wide64(-1);     /* and head size 64's */
    if (zt_cuda_attention_bwd_wide64(1) == 1) {
        dq_tag = " (ordered dQ, wide backward)";
        t_attention_tc(2, 100, 2, 64);
        t_attention_tc(2, 193, 12, 64);
        attn_io16(1, 1, 1024, 12, 64, 0, 1);
        t_ordered_gqa(2, 300, 4, 2, 64, 50);
        t_ordered_many(2, 2048, 12, 64);       /* 384 blocks of 128 keys */
    }
    zt_cuda_attention_bwd_wide64(ww);
    dq_tag = "";
    zt_cuda_attention_dq(was);
}

/* The forward's other block shapes against the default, each switched on
 * in turn: head size 128's wide forward (zt_cuda_attention_fwd_wide(1):
 * 128 query rows a block, prefetching) and the pair forward at head sizes
 * 64 and 128 (zt_cuda_attention_fwd_pair(1): 4 warps of 32 rows, the next
 * K, V tile staged by cp.async, 54 / 102 KB of shared memory). out and lse
 * the default blocks' bits (a row sees the same tiles in the same order),
 * fp32 and bf16 I/O, with a window and GQA too; then the tensor-core
 * checks with it (against the CPU twin, the same bits twice). The pair at
 * head size 128 runs with bf16 I/O on sm_90 code only: elsewhere (fp32 I/O,
 * an A100) those cases compare the default blocks with themselves. */
static void fwd_variant(const char *what, int (*set)(int), int hs)
{
    static const int shp[][5] = { { 1, 257, 3, 3, 0 }, { 2, 100, 4, 2, 0 }, { 1, 300, 2, 1, 70 },
                                  { 2, 2048, 8, 8, 0 } };
    int was = set(-1), am = zt_cuda_attention_mode(-1);
    int bad = set(2);
    char name[192];
    snprintf(name, sizeof name, "attention %s forward hs=%d: 2 refused, the setting kept", what, hs);
    ct_check(bad == ZT_EINVAL && set(-1) == was, name, "2 %d", bad);
    for (int k = 0; k < 4; k++) {
        int B = shp[k][0], T = shp[k][1], NH = shp[k][2], NKV = shp[k][3], W = shp[k][4];
        int C = NH * hs, R = (NH + 2 * NKV) * hs;
        size_t nq = (size_t)B * T * R, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
        float *qkv = ct_rand(nq, -2, 2);
        uint16_t *q16 = malloc(nq * 2);
        zk_cast_f32_bf16(q16, qkv, nq);
        float *nanf = malloc(no * 4);
        uint16_t *nanh = malloc(no * 2);
        for (size_t i = 0; i < no; i++) { nanf[i] = NAN; nanh[i] = 0x7fc1; }
        float *d_q = up(qkv, nq * 4), *d_o[2], *d_l[2], *d_hl[2];
        uint16_t *d_q16 = up(q16, nq * 2), *d_h[2];
        int rc = 0, ok = 1;
        zt_cuda_attention_mode(1);
        int64_t tc0 = dv->attention_tc_calls();
        for (int r = 0; r < 2; r++) {             /* the default, then the variant */
            d_o[r] = up(nanf, no * 4); d_h[r] = up(nanh, no * 2);
            dv->alloc((void **)&d_l[r], nl * 4); dv->alloc((void **)&d_hl[r], nl * 4);
            ok &= set(r) == r && set(-1) == r;
            rc |= dv->attention_forward(d_o[r], d_l[r], d_q, 0, B, T, C, NH, NKV, W);
            rc |= dv->attention_forward(d_h[r], d_hl[r], d_q16, 1, B, T, C, NH, NKV, W);
        }
        int64_t tcn = dv->attention_tc_calls() - tc0;
        free(nanf); free(nanh);
        set(was);
        zt_cuda_attention_mode(am);
        snprintf(name, sizeof name, "attention %s forward hs=%d B=%d T=%d NH=%d NKV=%d W=%d", what, hs, B, T,
                 NH, NKV, W);
        if (!synced(name) || rc) { ct_fail(name, "rc %d", rc); continue; }
        snprintf(name, sizeof name, "attention %s forward hs=%d B=%d T=%d NKV=%d W=%d: the switch set, four "
                 "tensor-core calls", what, hs, B, T, NKV, W);
        ct_check(ok && tcn == 4, name, "set %d, tc calls %lld", ok, (long long)tcn);
        float *o0 = down(d_o[0], no * 4), *o1 = down(d_o[1], no * 4);
        float *l0 = down(d_l[0], nl * 4), *l1 = down(d_l[1], nl * 4);
        float *hl0 = down(d_hl[0], nl * 4), *hl1 = down(d_hl[1], nl * 4);
        uint16_t *h0 = down(d_h[0], no * 2), *h1 = down(d_h[1], no * 2);
        size_t bad = 0;
        while (bad < no && isfinite(o1[bad])) bad++;
        snprintf(name, sizeof name, "attention %s forward hs=%d B=%d T=%d NKV=%d W=%d: every out written, "
                 "the default blocks' out and lse bits (fp32 I/O)", what, hs, B, T, NKV, W);
        ct_check(bad == no && !memcmp(o0, o1, no * 4) && !memcmp(l0, l1, nl * 4), name,
                 "unwritten from %zu of %zu, or differ", bad, no);
        snprintf(name, sizeof name, "attention %s forward hs=%d B=%d T=%d NKV=%d W=%d: the same, bf16 I/O",
                 what, hs, B, T, NKV, W);
        ct_check(!memcmp(h0, h1, no * 2) && !memcmp(hl0, hl1, nl * 4), name, "differ");
        free(qkv); free(q16); free(o0); free(o1); free(l0); free(l1); free(hl0); free(hl1);
        free(h0); free(h1);
        dv->free(d_q); dv->free(d_q16);
        for (int r = 0; r < 2; r++) { dv->free(d_o[r]); dv->free(d_l[r]); dv->free(d_h[r]); dv->free(d_hl[r]); }
    }
    set(1);
    dq_tag = !strcmp(what, "wide") ? " (wide forward)" : " (pair forward)";
    t_attention_tc(1, 1, 1, hs);
    t_attention_tc(2, 100, 2, hs);
    t_attention_tc(1, 257, 3, hs);
    dq_tag = "";
    set(was);
}
static void t_attention_fwd_wide(void) { fwd_variant("wide", zt_cuda_attention_fwd_wide, 128); }
static void t_attention_fwd_pair(void)
{
    fwd_variant("pair", zt_cuda_attention_fwd_pair, 64);
    fwd_variant("pair", zt_cuda_attention_fwd_pair, 128);
}

/* The wide backward at head size 128 and 64 (zt_cuda_attention_bwd_wide(1),
 * _wide64(1): dK/dV in blocks of 128 keys, 8 warps, chunks of 64 queries
 * staged by cp.async, 173 / 111 KB of shared memory). Each dK, dV element takes the narrow kernel's
 * mma steps in its order, and dQ is k_tc_dq's either way: the whole dqkv
 * the narrow kernels' bits, fp32 and bf16 I/O, every element written,
 * with GQA, a window, and hundreds of blocks; then the tensor-core checks
 * with it (against the CPU twin, the same bits twice). Its ordered dQ is
 * checked in t_attention_dq_ordered (last). */
static void bwd_wide_hs(int hs)
{
    int (*wide)(int) = hs == 128 ? zt_cuda_attention_bwd_wide : zt_cuda_attention_bwd_wide64;
    char name[192];
    static const int shp[][5] = { { 1, 257, 3, 3, 0 }, { 2, 300, 4, 2, 0 }, { 1, 300, 2, 1, 70 },
                                  { 2, 2048, 8, 8, 0 } };
    int was = wide(-1), am = zt_cuda_attention_mode(-1);
    int bad = wide(2);
    snprintf(name, sizeof name, "attention wide backward hs=%d: 2 refused, the setting kept", hs);
    ct_check(bad == ZT_EINVAL && wide(-1) == was, name, "2 %d", bad);
    if (wide(1) != 1) {     /* a GPU that grants less than 173 (111) KB a block */
        printf("attention wide backward hs=%d: not taken on this GPU (its shared memory), skipped\n", hs);
        wide(was);
        return;
    }
    wide(was);
    for (int k = 0; k < 4; k++) {
        int B = shp[k][0], T = shp[k][1], NH = shp[k][2], NKV = shp[k][3], W = shp[k][4];
        int C = NH * hs, R = (NH + 2 * NKV) * hs;
        size_t nq = (size_t)B * T * R, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
        float *qkv = ct_rand(nq, -2, 2), *dy = ct_rand(no, -1, 1);
        tc_round_bf16(qkv, nq);
        tc_round_bf16(dy, no);
        uint16_t *q16 = malloc(nq * 2), *y16 = malloc(no * 2), *nanh = malloc(nq * 2);
        zk_cast_f32_bf16(q16, qkv, nq);
        zk_cast_f32_bf16(y16, dy, no);
        float *nanf = malloc(nq * 4);
        for (size_t i = 0; i < nq; i++) { nanf[i] = NAN; nanh[i] = 0x7fc1; }
        float *d_q = up(qkv, nq * 4), *d_y = up(dy, no * 4), *d_o = NULL, *d_l = NULL, *d_l16 = NULL, *d_d[2];
        uint16_t *d_q16 = up(q16, nq * 2), *d_y16 = up(y16, no * 2), *d_o16 = NULL, *d_h[2];
        dv->alloc((void **)&d_o, no * 4); dv->alloc((void **)&d_l, nl * 4);
        dv->alloc((void **)&d_o16, no * 2); dv->alloc((void **)&d_l16, nl * 4);
        int rc = 0, set = 1;
        zt_cuda_attention_mode(1);
        rc |= dv->attention_forward(d_o, d_l, d_q, 0, B, T, C, NH, NKV, W);
        rc |= dv->attention_forward(d_o16, d_l16, d_q16, 1, B, T, C, NH, NKV, W);
        for (int r = 0; r < 2; r++) {             /* narrow, then wide */
            d_d[r] = up(nanf, nq * 4); d_h[r] = up(nanh, nq * 2);
            set &= wide(r) == r && wide(-1) == r;
            rc |= dv->attention_backward(d_d[r], d_y, d_q, d_o, d_l, 0, B, T, C, NH, NKV, W);
            rc |= dv->attention_backward(d_h[r], d_y16, d_q16, d_o16, d_l16, 1, B, T, C, NH, NKV, W);
        }
        wide(was);
        zt_cuda_attention_mode(am);
        free(nanf); free(nanh);
        snprintf(name, sizeof name, "attention wide backward hs=%d B=%d T=%d NH=%d NKV=%d W=%d", hs, B, T, NH,
                 NKV, W);
        if (!synced(name) || rc) { ct_fail(name, "rc %d", rc); continue; }
        snprintf(name, sizeof name, "attention wide backward hs=%d B=%d T=%d NKV=%d W=%d: the switch set",
                 hs, B, T, NKV, W);
        ct_check(set, name, "set %d", set);
        float *g0 = down(d_d[0], nq * 4), *g1 = down(d_d[1], nq * 4);
        uint16_t *h0 = down(d_h[0], nq * 2), *h1 = down(d_h[1], nq * 2);
        size_t nw = 0;
        while (nw < nq && isfinite(g1[nw])) nw++;
        snprintf(name, sizeof name, "attention wide backward hs=%d B=%d T=%d NKV=%d W=%d: every dqkv "
                 "element written, the narrow kernels' bits (fp32 I/O)", hs, B, T, NKV, W);
        ct_check(nw == nq && !memcmp(g0, g1, nq * 4), name, "unwritten from %zu of %zu, or differ", nw, nq);
        snprintf(name, sizeof name, "attention wide backward hs=%d B=%d T=%d NKV=%d W=%d: the same, bf16 I/O",
                 hs, B, T, NKV, W);
        ct_check(!memcmp(h0, h1, nq * 2), name, "differ");
        free(qkv); free(dy); free(q16); free(y16); free(g0); free(g1); free(h0); free(h1);
        dv->free(d_q); dv->free(d_y); dv->free(d_o); dv->free(d_l); dv->free(d_q16); dv->free(d_y16);
        dv->free(d_o16); dv->free(d_l16);
        for (int r = 0; r < 2; r++) { dv->free(d_d[r]); dv->free(d_h[r]); }
    }
    wide(1);
    dq_tag = " (wide backward)";
    t_attention_tc(1, 1, 1, hs);
    t_attention_tc(2, 100, 2, hs);
    t_attention_tc(1, 257, 3, hs);
    dq_tag = "";
    wide(was);
}
static void t_attention_bwd_wide(void)
{
    bwd_wide_hs(128);
    bwd_wide_hs(64);
}

/* errors come back as codes with file:line, never exit */
static void t_errors(void)
{
    void *p = NULL;
    int rc = dv->alloc(&p, (size_t)1 << 52);
    ct_check(rc == ZT_ENOMEM, "alloc of 4 PiB: ZT_ENOMEM", "rc %d", rc);
    dv->zero((void *)(uintptr_t)0x10, 64);             /* not a device pointer */
    rc = dv->sync();
    ct_check(rc == ZT_EIO && strstr(zt_last_error(), "device_cuda.c:") != NULL,
             "a failed CUDA call surfaces at sync with file:line", "rc %d: %s", rc, zt_last_error());
    rc = dv->sync();
    ct_check(rc == ZT_OK, "the kept error is reported once; the device still works", "rc %d: %s",
             rc, zt_last_error());
}

/* ---- streams and events (cuda_stream.h) ----
 * Each test makes the stream that must be waited for slow (R launches of
 * an axpy over a large buffer, tens of ms of GPU work queued in a few ms),
 * so a missing or misplaced wait gives a wrong result, not a lucky one. */
enum { BUSY_N = 1 << 22, BUSY_R = 4000 };

/* On the current stream: x[0..n) = R exactly (R adds of 1.0 from 0) */
static void busy_count(float *x, const float *ones, size_t n, int R)
{
    dv->fill(x, 0.0f, n);
    for (int r = 0; r < R; r++) dv->axpy(x, 1.0f, ones, n);
}

static float *dev_ones(size_t n)
{
    float *d = NULL;
    if (dv->alloc((void **)&d, n * 4) != ZT_OK) { printf("FAIL alloc\n"); exit(1); }
    dv->fill(d, 1.0f, n);
    return d;
}

static void all_equal(const char *name, const float *h, size_t n, float want)
{
    size_t i = 0;
    while (i < n && h[i] == want) i++;
    ct_check(i == n, name, "element %zu of %zu: got %.9g want %.9g", i, n,
                    i < n ? (double)h[i] : 0.0, (double)want);
}

#define OKC(call) do { int rc_ = (call); if (rc_ != ZT_OK) { \
    ct_fail(#call, "rc %d: %s", rc_, zt_last_error()); return; } } while (0)

/* host -> device on a copy stream, ordered before a compute op by an event */
static void t_copy_then_compute(void)
{
    size_t n = BUSY_N;
    float *h = NULL, *d = NULL, *ones = dev_ones(n), *junk = NULL;
    void *cs = NULL, *ev = NULL;
    OKC(zt_cuda_host_alloc((void **)&h, n * 4));
    for (size_t i = 0; i < n; i++) h[i] = (float)(i % 1000) * 0.5f;
    OKC(dv->alloc((void **)&d, n * 4));
    OKC(dv->alloc((void **)&junk, n * 4));
    dv->fill(d, 0.0f, n);
    OKC(zt_cuda_stream_sync(NULL));
    OKC(zt_cuda_stream_new(&cs, ZT_STREAM_COPY));
    OKC(zt_cuda_event_new(&ev, 0));
    zt_cuda_set_stream(cs);                 /* the copy stream is busy first */
    busy_count(junk, ones, n, BUSY_R);
    zt_cuda_set_stream(NULL);
    OKC(zt_cuda_copy_async(d, h, n * 4, cs));
    OKC(zt_cuda_event_record(ev, cs));
    OKC(zt_cuda_stream_wait_event(NULL, ev));   /* compute waits for the copy */
    dv->scale(d, 2.0f, n);                       /* on the compute stream */
    float *back = down(d, n * 4);
    size_t i = 0;
    while (i < n && back[i] == 2.0f * h[i]) i++;
    ct_check(i == n, "copy stream -> event -> compute: scale sees the copied bytes",
             "element %zu: got %g want %g", i, i < n ? (double)back[i] : 0.0,
             i < n ? 2.0 * h[i] : 0.0);
    /* and back: compute produces, the copy stream waits for it, device -> pinned host */
    busy_count(d, ones, n, BUSY_R);
    OKC(zt_cuda_event_record(ev, NULL));
    OKC(zt_cuda_stream_wait_event(cs, ev));
    OKC(zt_cuda_copy_async(h, d, n * 4, cs));
    OKC(zt_cuda_event_record(ev, cs));
    OKC(zt_cuda_event_sync(ev));
    all_equal("compute -> event -> copy stream -> host: the finished values", h, n, BUSY_R);
    free(back);
    zt_cuda_event_free(ev);
    zt_cuda_stream_free(cs);
    zt_cuda_host_free(h);
    dv->free(d); dv->free(junk); dv->free(ones);
    synced("copy/compute streams");
}

/* two streams, an event dependency; event query before and after */
static void t_two_streams(void)
{
    size_t n = BUSY_N;
    float *x = NULL, *y = NULL, *ones = dev_ones(n);
    void *a = NULL, *b = NULL, *ev = NULL;
    OKC(dv->alloc((void **)&x, n * 4));
    OKC(dv->alloc((void **)&y, n * 4));
    OKC(zt_cuda_stream_sync(NULL));
    OKC(zt_cuda_stream_new(&a, ZT_STREAM_COMPUTE));
    OKC(zt_cuda_stream_new(&b, ZT_STREAM_COMM));
    OKC(zt_cuda_event_new(&ev, 0));
    int done = -1;
    OKC(zt_cuda_event_query(ev, &done));
    ct_check(done == 1, "a never-recorded event is done", "done %d", done);
    zt_cuda_set_stream(a);
    ct_check(zt_cuda_get_stream() == a, "set_stream makes a the current stream", "got %p", zt_cuda_get_stream());
    busy_count(x, ones, n, BUSY_R);
    OKC(zt_cuda_event_record(ev, NULL));         /* NULL: the current stream, a */
    OKC(zt_cuda_event_query(ev, &done));
    ct_check(done == 0, "event query right after recording behind busy work: not done",
             "done %d", done);
    zt_cuda_set_stream(b);
    OKC(zt_cuda_stream_wait_event(NULL, ev));
    dv->add3(y, x, x, 0, n);                     /* on b, after a's count */
    OKC(zt_cuda_stream_sync(b));
    OKC(zt_cuda_event_query(ev, &done));
    ct_check(done == 1, "event query after the waiting stream finished: done", "done %d", done);
    float *h = down(y, n * 4);                   /* current is b: waits for b */
    all_equal("stream b waits for a's event: y = 2 * a's count", h, n, 2.0f * BUSY_R);
    zt_cuda_set_stream(NULL);
    ct_check(zt_cuda_get_stream() != a && zt_cuda_get_stream() != b,
             "set_stream(NULL): back to the compute stream", "%p", zt_cuda_get_stream());
    free(h);
    zt_cuda_event_free(ev);
    zt_cuda_stream_free(a);
    zt_cuda_stream_free(b);
    dv->free(x); dv->free(y); dv->free(ones);
    synced("two streams");
}

/* cuBLAS runs on the current stream: a GEMM on stream a reads inputs that
 * a's earlier (slow) work writes; on any other stream it would not wait */
static void t_blas_on_current_stream(void)
{
    int N = 65536, C = 64, OC = 32;
    size_t n = (size_t)N * C;
    float *inp = NULL, *w = NULL, *out = NULL, *ones = dev_ones(n);
    void *a = NULL;
    OKC(dv->alloc((void **)&inp, n * 4));
    OKC(dv->alloc((void **)&w, (size_t)OC * C * 4));
    OKC(dv->alloc((void **)&out, (size_t)N * OC * 4));
    OKC(zt_cuda_stream_sync(NULL));
    OKC(zt_cuda_stream_new(&a, ZT_STREAM_COMPUTE));
    zt_cuda_set_stream(a);
    dv->fill(w, 1.0f, (size_t)OC * C);
    busy_count(inp, ones, n, BUSY_R);
    int rc = dv->matmul_forward(out, inp, w, NULL, N, C, OC, OC);
    ct_check(rc == ZT_OK, "matmul on stream a", "rc %d: %s", rc, zt_last_error());
    float *h = down(out, (size_t)N * OC * 4);   /* waits for a */
    all_equal("cuBLAS on the current stream: out = C * count", h, (size_t)N * OC,
              (float)C * BUSY_R);
    zt_cuda_set_stream(NULL);
    free(h);
    zt_cuda_stream_free(a);
    dv->free(inp); dv->free(w); dv->free(out); dv->free(ones);
    synced("cuBLAS stream");
}

static void t_stream_errors(void)
{
    void *p = NULL;
    int rc = zt_cuda_stream_new(&p, 7);
    ct_check(rc == ZT_EINVAL && strstr(zt_last_error(), "unknown stream kind 7"),
             "stream_new: an unknown kind is named", "rc %d: %s", rc, zt_last_error());
    int done = 0;
    rc = zt_cuda_event_query(NULL, &done);
    ct_check(rc == ZT_EINVAL, "event_query(NULL): EINVAL", "rc %d", rc);
    rc = zt_cuda_copy_async(NULL, NULL, 4, NULL);
    ct_check(rc == ZT_EINVAL, "copy_async(NULL, NULL, 4): EINVAL", "rc %d", rc);
}

/* pinned host memory is whole pages at a page boundary at every size (the
 * nvme tier's O_DIRECT reads and writes host tensors in place; memory.c
 * refuses anything else): cudaHostAlloc gave 16 KiB at ...a04200 on an
 * H200, and every MPI-staged collective failed */
static void t_pinned_pages(void)
{
    static const size_t sizes[] = { 1, 100, 4096, 16384, 16484, 1 << 20 };
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        unsigned char *h = NULL;
        OKC(zt_cuda_host_alloc((void **)&h, sizes[k]));
        ct_check(((uintptr_t)h & 4095) == 0, "pinned host memory is page-aligned",
                 "%zu bytes at %p", sizes[k], (void *)h);
        ct_check(zt_cuda_is_pinned(h) && zt_cuda_is_pinned(h + sizes[k] - 1), "pinned host memory: is_pinned",
                 "%zu bytes at %p", sizes[k], (void *)h);
        memset(h, 0x5a, sizes[k]);
        float *d = NULL;
        OKC(dv->alloc((void **)&d, sizes[k]));
        OKC(zt_cuda_copy_async(d, h, sizes[k], NULL));
        OKC(zt_cuda_stream_sync(NULL));         /* from pinned memory the copy is asynchronous */
        memset(h, 0, sizes[k]);
        OKC(zt_cuda_copy_async(h, d, sizes[k], NULL));
        OKC(zt_cuda_stream_sync(NULL));
        size_t i = 0;
        while (i < sizes[k] && h[i] == 0x5a) i++;
        ct_check(i == sizes[k], "pinned host memory: to the device and back", "%zu bytes: byte %zu", sizes[k], i);
        dv->free(d);
        zt_cuda_host_free(h);
        ct_check(!zt_cuda_is_pinned(h), "pinned host memory: unpinned when freed", "%zu bytes", sizes[k]);
    }
}

static void (*const tests[])(void) = {
    t_elementwise, t_add3_r16, t_casts, t_gelu, t_layernorm, t_norm_r16, t_norm_p16, t_encoder, t_xent, t_xent_padded_both, t_adamw, t_adamw_g16, t_adamw_multi, t_sums, t_sums16,
    t_sum_ranks, t_llama, t_randn, t_matmul_all, t_matmul_epilogue, t_matmul_gelu, t_matmul_b16,
    t_norm_g16, t_encoder_g16, t_matmul_g16, t_attention_all, t_attention_tc_all,
    t_attention_io16_all, t_errors,
    t_pinned_pages, t_copy_then_compute, t_two_streams, t_blas_on_current_stream, t_stream_errors,
    /* kernels no GPU has run yet, late: a fault leaves the context unusable */
    t_attention_fwd_wide, t_attention_fwd_pair, t_attention_bwd_wide,
    t_attention_dq_ordered,     /* last: a wait that traps leaves the context unusable */
};
#define NTESTS (int)(sizeof tests / sizeof tests[0])

int main(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("cuda: no GPU here, %d tests skipped (%s)\n", NTESTS,
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 0;
    }
    if (zt_cuda_init() != ZT_OK) { printf("FAIL zt_cuda_init: %s\n", zt_last_error()); return 1; }
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        printf("cuda: %s, sm_%d%d\n", prop.name, prop.major, prop.minor);
    ct_seed(1234);
    zt_cuda_attention_mode(0);      /* the plain tests test the plain kernels */
    zt_cuda_matmul_epilogue(0);
    for (int i = 0; i < NTESTS; i++) tests[i]();
    return ct_summary();
}
