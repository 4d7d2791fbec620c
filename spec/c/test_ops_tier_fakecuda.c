/*
 * test_ops_tier_fakecuda.c -- which device table an op runs on, on the CPU,
 * against a fake CUDA device: this file's device table (named "cuda") is
 * made the active device with zt_device_install, as the CUDA table is after
 * zt_device_init("cuda"), and the test links the CPU build's library as it
 * is (its memory.c allocates every tier as ordinary memory: the fake's
 * alloc is the CPU device's, and it has no execution table, so streams keep
 * stream.c's CPU model).
 *
 * The fake's ops count their calls and compute through the CPU kernels, but
 * refuse host-tier bytes (the tensors this test made on ZT_TIER_HOST): a
 * GPU kernel launched on pinned host pointers. Each op kind runs on host
 * tensors, then on device tensors, checking:
 *   host:   the CPU kernel's numbers, the fake's op not called, no host
 *           pointer reached the fake, the fake's stream waited for (sync)
 *           before the op (a copy into its operands may still be queued);
 *   device: the same numbers, the fake's op called once, no wait.
 * Mixed tiers are refused with ready()'s message, and zt_tensor_read/write
 * move host-tier bytes by the CPU copy. It does not check CUDA, the CUDA
 * kernels or real asynchrony (spec/c/test_cuda*.c do, on a GPU).
 */
#include "ctest.h"
#include "internal.h"
#include "kernels.h"

/* ---- the fake device --------------------------------------------------------- */
static zt_device_ops fake_table;

enum { F_SYNC, F_COPY, F_FILL, F_ADD, F_SCALE, F_CAST, F_ADAMW, F_MATMUL_FWD, F_MATMUL_BWD,
       F_GELU, F_SUMSQ, F_SUM, F_RANDN, F_N };
static const char *f_names[F_N] = { "sync", "copy", "fill", "add", "scale", "cast", "adamw",
                                    "matmul_forward", "matmul_backward", "gelu_forward",
                                    "sumsq_blocks", "sum", "randn" };
static int calls[F_N], host_ptrs;

/* the host-tier bytes this test made, since the last forget_hosts() (called
 * when all of them are freed: the allocator may hand their bytes out again) */
static struct { const char *p; size_t n; } hosts[64];
static int nhosts;
static void forget_hosts(void) { nhosts = 0; }

static int is_host(const void *p)
{
    for (int i = 0; i < nhosts; i++)
        if ((const char *)p >= hosts[i].p && (const char *)p < hosts[i].p + hosts[i].n) return 1;
    return 0;
}

/* Count a call of op k with its n pointers; 0 (refuse: compute nothing) if
 * any is host-tier memory. */
static int seen(int k, int n, ...)
{
    calls[k]++;
    va_list ap;
    va_start(ap, n);
    int host = 0;
    for (int i = 0; i < n; i++) {
        const void *p = va_arg(ap, const void *);
        if (p && is_host(p)) host = 1;
    }
    va_end(ap);
    host_ptrs += host;
    return !host;
}

static const zt_device_ops *C = &zt_cpu_device;
static int f_sync(void) { calls[F_SYNC]++; return ZT_OK; }
static void f_copy(void *d, const void *s, size_t n)
{ if (seen(F_COPY, 2, d, s)) C->copy(d, s, n); }
static void f_fill(float *x, float v, size_t n) { if (seen(F_FILL, 1, x)) C->fill(x, v, n); }
static void f_add(float *y, const void *x, int xd, size_t n)
{ if (seen(F_ADD, 2, y, x)) C->add(y, x, xd, n); }
static void f_scale(float *x, float a, size_t n) { if (seen(F_SCALE, 1, x)) C->scale(x, a, n); }
static void f_cast(void *d, int dd, const void *s, int sd, size_t n)
{ if (seen(F_CAST, 2, d, s)) C->cast(d, dd, s, sd, n); }
static void f_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                    float b2, float eps, float wd, float gs, int t)
{ if (seen(F_ADAMW, 4, p, g, m, v)) C->adamw(p, g, m, v, n, lr, b1, b2, eps, wd, gs, t); }
static int f_matmul_fwd(float *o, const float *i, const float *w, const float *b, int N, int Ci,
                        int OC, int ld)
{ return seen(F_MATMUL_FWD, 4, o, i, w, b) ? C->matmul_forward(o, i, w, b, N, Ci, OC, ld) : 0; }
static int f_matmul_bwd(float *di, float *dw, float *db, const float *dout, const float *i,
                        const float *w, int N, int Ci, int OC, int ld)
{
    return seen(F_MATMUL_BWD, 6, di, dw, db, dout, i, w)
        ? C->matmul_backward(di, dw, db, dout, i, w, N, Ci, OC, ld) : 0;
}
static void f_gelu(void *o, int o16, const void *i, int i16, size_t n)
{ if (seen(F_GELU, 2, o, i)) C->gelu_forward(o, o16, i, i16, n); }
static void f_sumsq(double *part, const void *x, int xd, size_t n)
{ if (seen(F_SUMSQ, 1, x)) C->sumsq_blocks(part, x, xd, n); }
static double f_sum(const float *x, size_t n) { return seen(F_SUM, 1, x) ? C->sum(x, n) : -1.0; }
static void f_randn(float *x, size_t n, uint64_t seed, uint64_t st, float mean, float sd)
{ if (seen(F_RANDN, 1, x)) C->randn(x, n, seed, st, mean, sd); }

static void reset(void) { memset(calls, 0, sizeof calls); host_ptrs = 0; }
/* the counts right after the op (before the test reads its results back) */
static int at[F_N], at_host;
static void mark(void) { memcpy(at, calls, sizeof at); at_host = host_ptrs; }

/* ---- tensors ----------------------------------------------------------------- */
static zt_tensor *mk(int tier, int dtype, int ndim, const int64_t *shape)
{
    zt_tensor *t = NULL;
    if (zt_tensor_new(&t, tier, ZT_CAT_OTHER, dtype, ndim, shape) != ZT_OK) {
        printf("FAIL zt_tensor_new: %s\n", zt_last_error());
        exit(1);
    }
    if (tier == ZT_TIER_HOST && nhosts < 64) {
        hosts[nhosts].p = t->storage->data;
        hosts[nhosts].n = t->storage->nbytes;
        nhosts++;
    }
    return t;
}
static zt_tensor *mk1(int tier, int dtype, int64_t n) { return mk(tier, dtype, 1, &n); }
static zt_tensor *mk2(int tier, int64_t a, int64_t b)
{
    int64_t s[2] = { a, b };
    return mk(tier, ZT_F32, 2, s);
}

/* a tensor holding x (f32, n elements), written through zt_tensor_write */
static zt_tensor *put(zt_tensor *t, const float *x)
{
    if (zt_tensor_write(t, x, (size_t)t->numel * sizeof(float)) != ZT_OK) {
        printf("FAIL zt_tensor_write: %s\n", zt_last_error());
        exit(1);
    }
    return t;
}
static float *get(const zt_tensor *t)
{
    size_t nb = (size_t)t->numel * zt_dtype_size(t->dtype);
    float *h = ct_alloc(nb);
    if (zt_tensor_read(t, h, nb) != ZT_OK) {
        printf("FAIL zt_tensor_read: %s\n", zt_last_error());
        exit(1);
    }
    return h;
}
static void drop(zt_tensor **ts, int n) { for (int i = 0; i < n; i++) zt_tensor_release(ts[i]); }

/* ---- the op kinds: each sets up on tier, reset()s, runs the op once, and
 * compares with the CPU kernel on plain arrays (bit for bit) -------------------- */
typedef struct { int rc, same; } result;
static int bits_eq(const void *a, const void *b, size_t nb) { return memcmp(a, b, nb) == 0; }

static result op_add(int tier)
{
    enum { n = 1000 };
    float *y0 = ct_rand(n, -1, 1), *x0 = ct_rand(n, -1, 1);
    zt_tensor *y = put(mk1(tier, ZT_F32, n), y0), *x = put(mk1(tier, ZT_F32, n), x0);
    reset();
    result r = { zt_add(y, x), 0 };
    mark();
    float *got = get(y);
    C->add(y0, x0, ZT_F32, n);
    r.same = bits_eq(got, y0, n * sizeof(float));
    free(y0); free(x0); free(got);
    drop((zt_tensor *[]){ y, x }, 2);
    return r;
}

static result op_cast(int tier)
{
    enum { n = 513 };
    float *x0 = ct_rand(n, -3, 3);
    uint16_t want[n];
    zt_tensor *x = put(mk1(tier, ZT_F32, n), x0), *d = mk1(tier, ZT_BF16, n);
    reset();
    result r = { zt_cast(d, x), 0 };
    mark();
    uint16_t *got = (uint16_t *)get(d);
    C->cast(want, ZT_BF16, x0, ZT_F32, n);
    r.same = bits_eq(got, want, sizeof want);
    free(x0); free(got);
    drop((zt_tensor *[]){ x, d }, 2);
    return r;
}

static result op_copy(int tier)
{
    enum { n = 300 };
    float *x0 = ct_rand(n, -1, 1);
    zt_tensor *x = put(mk1(tier, ZT_F32, n), x0), *d = mk1(tier, ZT_F32, n);
    reset();
    result r = { zt_copy(d, x), 0 };
    mark();
    float *got = get(d);
    r.same = bits_eq(got, x0, n * sizeof(float));
    free(x0); free(got);
    drop((zt_tensor *[]){ x, d }, 2);
    return r;
}

static result op_adamw(int tier)
{
    enum { n = 777 };
    float *p0 = ct_rand(n, -1, 1), *g0 = ct_rand(n, -1, 1), *m0 = ct_rand(n, -.1f, .1f),
          *v0 = ct_rand(n, 0, .1f);
    zt_tensor *p = put(mk1(tier, ZT_F32, n), p0), *g = put(mk1(tier, ZT_F32, n), g0),
              *m = put(mk1(tier, ZT_F32, n), m0), *v = put(mk1(tier, ZT_F32, n), v0);
    reset();
    result r = { zt_adamw(p, g, m, v, 1e-3f, .9f, .95f, 1e-8f, .1f, .5f, 3), 0 };
    mark();
    float *gp = get(p), *gm = get(m), *gv = get(v);
    C->adamw(p0, g0, m0, v0, n, 1e-3f, .9f, .95f, 1e-8f, .1f, .5f, 3);
    r.same = bits_eq(gp, p0, n * 4) && bits_eq(gm, m0, n * 4) && bits_eq(gv, v0, n * 4);
    free(p0); free(g0); free(m0); free(v0); free(gp); free(gm); free(gv);
    drop((zt_tensor *[]){ p, g, m, v }, 4);
    return r;
}

enum { MN = 8, MC = 16, MOC = 12 };
static result op_matmul_fwd(int tier)
{
    float *i0 = ct_rand(MN * MC, -1, 1), *w0 = ct_rand(MOC * MC, -1, 1),
          *b0 = ct_rand(MOC, -1, 1), want[MN * MOC];
    zt_tensor *in = put(mk2(tier, MN, MC), i0), *w = put(mk2(tier, MOC, MC), w0),
              *b = put(mk1(tier, ZT_F32, MOC), b0), *o = mk2(tier, MN, MOC);
    reset();
    result r = { zt_matmul_forward(o, in, w, b), 0 };
    mark();
    float *got = get(o);
    C->matmul_forward(want, i0, w0, b0, MN, MC, MOC, MOC);
    r.same = bits_eq(got, want, sizeof want);
    free(i0); free(w0); free(b0); free(got);
    drop((zt_tensor *[]){ in, w, b, o }, 4);
    return r;
}

static result op_matmul_bwd(int tier)
{
    float *i0 = ct_rand(MN * MC, -1, 1), *w0 = ct_rand(MOC * MC, -1, 1),
          *d0 = ct_rand(MN * MOC, -1, 1);
    float *di = ct_alloc(MN * MC * 4), *dw = ct_alloc(MOC * MC * 4), *db = ct_alloc(MOC * 4);
    zt_tensor *in = put(mk2(tier, MN, MC), i0), *w = put(mk2(tier, MOC, MC), w0),
              *dout = put(mk2(tier, MN, MOC), d0), *tdi = mk2(tier, MN, MC),
              *tdw = mk2(tier, MOC, MC), *tdb = mk1(tier, ZT_F32, MOC);
    reset();
    result r = { zt_matmul_backward(tdi, tdw, tdb, dout, in, w), 0 };
    mark();
    float *gi = get(tdi), *gw = get(tdw), *gb = get(tdb);
    C->matmul_backward(di, dw, db, d0, i0, w0, MN, MC, MOC, MOC);
    r.same = bits_eq(gi, di, MN * MC * 4) && bits_eq(gw, dw, MOC * MC * 4) &&
             bits_eq(gb, db, MOC * 4);
    free(i0); free(w0); free(d0); free(di); free(dw); free(db); free(gi); free(gw); free(gb);
    drop((zt_tensor *[]){ in, w, dout, tdi, tdw, tdb }, 6);
    return r;
}

static result op_gelu(int tier)
{
    enum { n = 333 };
    float *x0 = ct_rand(n, -4, 4), want[n];
    zt_tensor *x = put(mk1(tier, ZT_F32, n), x0), *o = mk1(tier, ZT_F32, n);
    reset();
    result r = { zt_gelu_forward(o, x), 0 };
    mark();
    float *got = get(o);
    C->gelu_forward(want, 0, x0, 0, n);
    r.same = bits_eq(got, want, sizeof want);
    free(x0); free(got);
    drop((zt_tensor *[]){ x, o }, 2);
    return r;
}

static result op_sumsq(int tier)
{
    enum { n = 2 * ZK_SUM_BLOCK + 77, nb = 3 };
    float *x0 = ct_rand(n, -1, 1);
    double got[nb] = { 0 }, want[nb];
    zt_tensor *x = put(mk1(tier, ZT_F32, n), x0);
    reset();
    result r = { zt_sumsq_blocks(got, x), 0 };
    mark();
    C->sumsq_blocks(want, x0, ZT_F32, n);
    r.same = bits_eq(got, want, sizeof want);
    free(x0);
    zt_tensor_release(x);
    return r;
}

static result op_sum(int tier)
{
    enum { n = 5000 };
    float *x0 = ct_rand(n, -1, 1);
    double got = 0;
    zt_tensor *x = put(mk1(tier, ZT_F32, n), x0);
    reset();
    result r = { zt_sum(&got, x), 0 };
    mark();
    double want = C->sum(x0, n);
    r.same = bits_eq(&got, &want, sizeof want);
    free(x0);
    zt_tensor_release(x);
    return r;
}

static result op_randn(int tier)
{
    enum { n = 257 };
    float want[n];
    zt_tensor *x = mk1(tier, ZT_F32, n);
    reset();
    result r = { zt_randn(x, 42, 7, .5f, 2.f), 0 };
    mark();
    float *got = get(x);
    C->randn(want, n, 42, 7, .5f, 2.f);
    r.same = bits_eq(got, want, sizeof want);
    free(got);
    zt_tensor_release(x);
    return r;
}

static const struct { const char *name; int op; result (*run)(int tier); } kinds[] = {
    { "zt_add", F_ADD, op_add },
    { "zt_cast f32->bf16", F_CAST, op_cast },
    { "zt_copy", F_COPY, op_copy },
    { "zt_adamw", F_ADAMW, op_adamw },
    { "zt_matmul_forward", F_MATMUL_FWD, op_matmul_fwd },
    { "zt_matmul_backward", F_MATMUL_BWD, op_matmul_bwd },
    { "zt_gelu_forward", F_GELU, op_gelu },
    { "zt_sumsq_blocks", F_SUMSQ, op_sumsq },
    { "zt_sum", F_SUM, op_sum },
    { "zt_randn", F_RANDN, op_randn },
};

static int fake_ops_in(const int *c)
{
    int n = 0;
    for (int k = 0; k < F_N; k++) if (k != F_SYNC) n += c[k];
    return n;
}
static int fake_ops_called(void) { return fake_ops_in(calls); }

static void t_kinds(void)
{
    char name[160];
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        int k = kinds[i].op;
        /* host tier: the CPU kernels, after a wait for the device's stream */
        forget_hosts();
        result r = kinds[i].run(ZT_TIER_HOST);
        snprintf(name, sizeof name, "%s on host tensors: the CPU kernel, not the active (fake "
                 "cuda) device's", kinds[i].name);
        ct_check(r.rc == ZT_OK && r.same && fake_ops_in(at) == 0 && at_host == 0, name,
                 "rc %d (%s), same as the CPU kernel %d, fake ops called %d (%s %d), host "
                 "pointers given to the fake %d", r.rc, r.rc ? zt_last_error() : "", r.same,
                 fake_ops_in(at), f_names[k], at[k], at_host);
        snprintf(name, sizeof name, "%s on host tensors: waits for the device's stream first",
                 kinds[i].name);
        ct_check(at[F_SYNC] == 1, name, "fake sync called %d times", at[F_SYNC]);

        /* device tier: the active device, no wait */
        forget_hosts();
        r = kinds[i].run(ZT_TIER_DEVICE);
        snprintf(name, sizeof name, "%s on device tensors: the active (fake cuda) device's %s",
                 kinds[i].name, f_names[k]);
        ct_check(r.rc == ZT_OK && r.same && at[k] == 1 && fake_ops_in(at) == 1 && at_host == 0 &&
                 at[F_SYNC] == 0, name,
                 "rc %d (%s), same %d, %s called %d, fake ops %d, host pointers %d, syncs %d",
                 r.rc, r.rc ? zt_last_error() : "", r.same, f_names[k], at[k], fake_ops_in(at),
                 at_host, at[F_SYNC]);
    }
}

/* mixed tiers: refused with ready()'s message, nothing issued */
static void t_mixed(void)
{
    enum { n = 64 };
    forget_hosts();
    float *y0 = ct_rand(n, -1, 1), *x0 = ct_rand(n, -1, 1);
    zt_tensor *yh = put(mk1(ZT_TIER_HOST, ZT_F32, n), y0);
    zt_tensor *xd = put(mk1(ZT_TIER_DEVICE, ZT_F32, n), x0);
    zt_tensor *p = mk1(ZT_TIER_DEVICE, ZT_F32, n), *m = mk1(ZT_TIER_DEVICE, ZT_F32, n);
    float *before = get(yh);
    reset();
    int rc = zt_add(yh, xd);
    const char *e = zt_last_error();
    ct_check(rc == ZT_EINVAL && strstr(e, "zt_add: y (") && strstr(e, "on host) and x (") &&
             strstr(e, "on device) are on different tiers") && fake_ops_called() == 0 &&
             calls[F_SYNC] == 0, "zt_add on host y and device x: refused, nothing issued",
             "rc %d: %s; fake ops %d, syncs %d", rc, e, fake_ops_called(), calls[F_SYNC]);
    reset();
    rc = zt_adamw(p, yh, m, xd, 1e-3f, .9f, .95f, 1e-8f, 0, 1, 1);
    e = zt_last_error();
    ct_check(rc == ZT_EINVAL && strstr(e, "zt_adamw: param (") &&
             strstr(e, "and grad (") && strstr(e, "are on different tiers") &&
             fake_ops_called() == 0, "zt_adamw with a host grad among device tensors: refused",
             "rc %d: %s; fake ops %d", rc, e, fake_ops_called());
    float *got = get(yh);
    ct_check(bits_eq(got, before, n * 4), "a refused op leaves its operands alone", "y changed");
    free(y0); free(x0); free(got); free(before);
    drop((zt_tensor *[]){ yh, xd, p, m }, 4);
}

/* zt_tensor_write/read (tensor.c): host-tier bytes by the CPU copy after the
 * wait; device-tier bytes by the device's copy */
static void t_read_write(void)
{
    enum { n = 100 };
    float *x0 = ct_rand(n, -1, 1);
    for (int tier = ZT_TIER_DEVICE; tier <= ZT_TIER_HOST; tier++) {
        forget_hosts();
        zt_tensor *t = mk1(tier, ZT_F32, n);
        reset();
        put(t, x0);
        float *got = get(t);
        int host = tier == ZT_TIER_HOST;
        char name[128];
        snprintf(name, sizeof name, "zt_tensor_write/read on a %s tensor: %s", zt_tier_name(tier),
                 host ? "the CPU copy after a wait for the device's stream" :
                 "the active device's copy");
        ct_check(bits_eq(got, x0, n * 4) && host_ptrs == 0 &&
                 (host ? calls[F_COPY] == 0 && calls[F_SYNC] == 2
                       : calls[F_COPY] == 2 && calls[F_SYNC] == 0), name,
                 "bytes %s, fake copies %d, syncs %d, host pointers given to the fake %d",
                 bits_eq(got, x0, n * 4) ? "same" : "differ", calls[F_COPY], calls[F_SYNC],
                 host_ptrs);
        free(got);
        zt_tensor_release(t);
    }
    free(x0);
}

int main(void)
{
    fake_table = zt_cpu_device;
    fake_table.name = "cuda";
    fake_table.sync = f_sync;
    fake_table.copy = f_copy;
    fake_table.fill = f_fill;
    fake_table.add = f_add;
    fake_table.scale = f_scale;
    fake_table.cast = f_cast;
    fake_table.adamw = f_adamw;
    fake_table.matmul_forward = f_matmul_fwd;
    fake_table.matmul_backward = f_matmul_bwd;
    fake_table.gelu_forward = f_gelu;
    fake_table.sumsq_blocks = f_sumsq;
    fake_table.sum = f_sum;
    fake_table.randn = f_randn;
    zt_device_install(&fake_table);
    ct_check(zt_dev() == &fake_table && !strcmp(zt_device_name(), "cuda") && zt_exec() == NULL,
             "zt_device_install: the fake is the active device", "active %s", zt_device_name());
    ct_seed(11);
    t_kinds();
    t_mixed();
    t_read_write();
    return ct_summary();
}
