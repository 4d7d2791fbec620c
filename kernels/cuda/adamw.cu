/* adamw.cu -- AdamW, kernels/cpu/adamw.c's scalar loop: the coefficients
 * computed on the host in double exactly as the CPU does, and each
 * operation rounded on its own (explicit _rn intrinsics: nvcc would
 * otherwise contract a*b+c into an FMA), so the bits equal zk_adamw's. */
#include <math.h>
#include <string.h>
#include "common.cuh"           /* cuda_fp16.h too */

struct adam_coef { float decay, b1, b2, omb1, omb2, step, bc2_sqrt, eps, gscale; };

/* One element of every AdamW kernel here (the decay an argument): from
 * p0, m0, v0 and g0 (the gradient element, a 2-byte one widened exactly)
 * the new p, m, v; the kernels write the stored low-precision parameter
 * from the new p. One copy, so the three kernels cannot drift apart. */
struct adam_out { float p, m, v; };
__device__ __forceinline__ static adam_out adam_step(float p0, float g0, float m0, float v0,
                                                     float decay, const adam_coef &k)
{
    float g = __fmul_rn(g0, k.gscale);
    float p = __fmul_rn(p0, decay);
    float mi = __fadd_rn(__fmul_rn(k.b1, m0), __fmul_rn(k.omb1, g));
    float vi = __fadd_rn(__fmul_rn(k.b2, v0), __fmul_rn(k.omb2, __fmul_rn(g, g)));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2_sqrt), k.eps);
    adam_out o;
    o.p = __fsub_rn(p, __fmul_rn(k.step, __fdiv_rn(mi, denom)));
    o.m = mi;
    o.v = vi;
    return o;
}

__global__ static void k_adamw(float *param, const float *grad, float *m, float *v,
                               size_t n, adam_coef k)
{
    ZKC_FOR(i, n) {
        adam_out o = adam_step(param[i], grad[i], m[i], v[i], k.decay, k);
        m[i] = o.m;
        v[i] = o.v;
        param[i] = o.p;
    }
}

static adam_coef coef(float lr, float b1, float b2, float eps, float wd, float gscale, int t)
{
    adam_coef c;
    c.decay = (float)(1.0 - (double)lr * (double)wd);
    c.b1 = b1;
    c.b2 = b2;
    c.omb1 = (float)(1.0 - (double)b1);
    c.omb2 = (float)(1.0 - (double)b2);
    c.step = (float)((double)lr / (1.0 - pow((double)b1, t)));
    c.bc2_sqrt = (float)sqrt(1.0 - pow((double)b2, t));
    c.eps = eps;
    c.gscale = gscale;
    return c;
}

extern "C" int zkc_adamw(cudaStream_t s, float *p, const float *g, float *m, float *v,
                         size_t n, float lr, float b1, float b2, float eps, float wd,
                         float gscale, int t)
{
    adam_coef c = coef(lr, b1, b2, eps, wd, gscale, t);
    if (n == 0) return 0;
    k_adamw<<<zkc_grid(n, 256), 256, 0, s>>>(p, g, m, v, n, c);
    return ZKC_LAUNCHED();
}

/* Many tensors in one launch (a unit's 12, ~150 launches a step before):
 * the segments' bounds and decays by value in the kernel's arguments; a
 * thread finds its element's segment by a scan of at most 16 bounds.
 * The gradient's type G: float, or a mixed-precision step's stored 2-byte
 * gradient (uint16_t: bf16 bits, __half: fp16) read as it is, each element
 * widened exactly (zkc_get) and from there the f32 arithmetic: the bits of
 * G float on an f32 copy of the widened values, with no fp32 accumulator
 * to fill when the step accumulates nothing. */
#define ADAM_SEGS 16

__device__ __forceinline__ static void adam_lp(uint16_t *lp, size_t i, int lp_kind, float np)
{
    if (lp_kind == 1) lp[i] = zkc_bf16(np);
    else if (lp_kind == 2) lp[i] = __half_as_ushort(__float2half_rn(np));
}
struct adam_segs { int n; long long off[ADAM_SEGS], end[ADAM_SEGS]; float decay[ADAM_SEGS]; };

template <class G>
__global__ static void k_adamw_segs(float *param, const G *grad, float *m, float *v,
                                    uint16_t *lp, int lp_kind, adam_segs sg, adam_coef k)
{
    size_t lo = (size_t)sg.off[0], n = (size_t)sg.end[sg.n - 1] - lo;
    ZKC_FOR(j, n) {
        size_t i = lo + j;
        int s = 0;
        while (s + 1 < sg.n && (long long)i >= sg.off[s + 1]) s++;
        if ((long long)i >= sg.end[s]) continue;        /* between segments: left alone */
        adam_out o = adam_step(param[i], zkc_get(grad + i), m[i], v[i], sg.decay[s], k);
        m[i] = o.m;
        v[i] = o.v;
        param[i] = o.p;
        adam_lp(lp, i, lp_kind, o.p);
    }
}

template <class G>
static int adamw_segs(cudaStream_t s, float *p, const G *g, float *m, float *v, void *lp,
                      int lp_kind, const adam_segs &sg, adam_coef c)
{
    size_t n = (size_t)(sg.end[sg.n - 1] - sg.off[0]);
    k_adamw_segs<G><<<zkc_grid(n, 256), 256, 0, s>>>(p, g, m, v, (uint16_t *)lp, lp_kind, sg, c);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_adamw_segments(cudaStream_t s, float *p, const void *g, int g_kind, float *m,
                                  float *v, void *lp, int lp_kind, int nseg, const int64_t *off,
                                  const int64_t *len, const float *wd, float lr, float b1,
                                  float b2, float eps, float gscale, int t)
{
    if (nseg < 1 || nseg > ADAM_SEGS || g_kind < 0 || g_kind > 2) return (int)cudaErrorInvalidValue;
    adam_coef c = coef(lr, b1, b2, eps, 0.0f, gscale, t);
    adam_segs sg;
    sg.n = nseg;
    for (int i = 0; i < nseg; i++) {
        sg.off[i] = off[i];
        sg.end[i] = off[i] + len[i];
        sg.decay[i] = coef(lr, b1, b2, eps, wd[i], gscale, t).decay;
    }
    if (g_kind == 1) return adamw_segs(s, p, (const uint16_t *)g, m, v, lp, lp_kind, sg, c);
    if (g_kind == 2) return adamw_segs(s, p, (const __half *)g, m, v, lp, lp_kind, sg, c);
    return adamw_segs(s, p, (const float *)g, m, v, lp, lp_kind, sg, c);
}

/* ---- zkc_adamw_multi: a whole step's update (GPT-2 124M: 148 tensors'
 * segments; Llama-8B ~290) in one launch, not one a unit or a tensor. The
 * items by value in the kernel's parameters (CUDA
 * 12.1+ takes up to 32764 bytes of them on sm_70 and later; this table is
 * ~31 KB): each item's five pointers, its decay, and the prefix sums of the
 * lengths, start[k] .. start[k+1] being item k's elements in the launch's
 * one index space. A block takes the contiguous tile [b*TILE, (b+1)*TILE)
 * of that space (ADAM_MT threads, ADAM_MR elements a thread, thread t the
 * elements t, t + ADAM_MT, ...: each pass of the block's threads reads
 * consecutive elements of an item, coalesced), finds the tile's first item
 * by a binary search over start (once a block; every thread the same
 * search, uniform constant-bank reads), and each thread walks forward
 * across item boundaries from there: the work is balanced over the items
 * whatever their sizes (a tile can hold many small items or a piece of a
 * large one). A thread loads its ADAM_MR elements' p, g, m, v first (all in
 * flight together: no store between them), then updates and stores. More
 * items than one table holds: launches of ADAM_ITEMS each, in order on s
 * (the items do not overlap: zt_adamw_multi checks, so the order is
 * immaterial to the bits). Each element's arithmetic is adam_step and
 * adam_lp, k_adamw_segs' own: the bits of adamw_segments over the same
 * elements, the CPU's. ---- */
#define ADAM_ITEMS 600
#define ADAM_MT 256
#define ADAM_MR 4
#define ADAM_TILE (ADAM_MT * ADAM_MR)
struct adam_items {
    long long start[ADAM_ITEMS + 1];
    float *p[ADAM_ITEMS], *m[ADAM_ITEMS], *v[ADAM_ITEMS];
    const void *g[ADAM_ITEMS];
    uint16_t *lp[ADAM_ITEMS];
    float decay[ADAM_ITEMS];
    int n;
};
/* the table, the lp kind and the coefficients within the 32764 bytes */
static_assert(sizeof(adam_items) + sizeof(int) + sizeof(adam_coef) + 16 <= 32764,
              "adam_items: over the kernel parameter limit");

template <class G>
__global__ static void __launch_bounds__(ADAM_MT) k_adamw_multi(adam_items t, int lp_kind, adam_coef k)
{
    const long long total = t.start[t.n];
    const long long base = (long long)blockIdx.x * ADAM_TILE;
    int lo = 0, hi = t.n - 1;             /* the item of base: the last k with start[k] <= base */
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (t.start[mid] <= base) lo = mid;
        else hi = mid - 1;
    }
    int it[ADAM_MR];                      /* each element's item, -1 past the end */
    float p[ADAM_MR], g[ADAM_MR], m[ADAM_MR], v[ADAM_MR];
    int s = lo;
#pragma unroll
    for (int r = 0; r < ADAM_MR; r++) {
        long long i = base + r * ADAM_MT + (long long)threadIdx.x;
        it[r] = -1;
        p[r] = g[r] = m[r] = v[r] = 0.0f;
        if (i < total) {
            while (i >= t.start[s + 1]) s++;  /* forward only: i grows with r (empty items skipped) */
            long long j = i - t.start[s];
            it[r] = s;
            p[r] = t.p[s][j];
            g[r] = zkc_get((const G *)t.g[s] + j);
            m[r] = t.m[s][j];
            v[r] = t.v[s][j];
        }
    }
    /* the offsets again from the item (a constant-bank read), not kept:
     * fewer registers live across the divisions' slow-path calls */
#pragma unroll
    for (int r = 0; r < ADAM_MR; r++) {
        if (it[r] < 0) continue;
        int q = it[r];
        long long j = base + r * ADAM_MT + (long long)threadIdx.x - t.start[q];
        adam_out o = adam_step(p[r], g[r], m[r], v[r], t.decay[q], k);
        t.m[q][j] = o.m;
        t.v[q][j] = o.v;
        t.p[q][j] = o.p;
        adam_lp(t.lp[q], (size_t)j, lp_kind, o.p);
    }
}

template <class G>
static int adamw_multi_launch(cudaStream_t s, const adam_items &tab, unsigned blocks, int lp_kind,
                              adam_coef c)
{
    k_adamw_multi<G><<<blocks, ADAM_MT, 0, s>>>(tab, lp_kind, c);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_adamw_multi(cudaStream_t s, int n, float *const *p, const void *const *g,
                               float *const *m, float *const *v, void *const *lp,
                               const int64_t *len, const float *wd, int g_kind, int lp_kind,
                               float lr, float b1, float b2, float eps, float gscale, int t)
{
    if (n < 1 || !p || !g || !m || !v || !len || !wd || g_kind < 0 || g_kind > 2 ||
        lp_kind < 0 || lp_kind > 2 || (lp_kind && !lp))
        return (int)cudaErrorInvalidValue;
    for (int k = 0; k < n; k++)
        if (len[k] < 0) return (int)cudaErrorInvalidValue;
    adam_coef c = coef(lr, b1, b2, eps, 0.0f, gscale, t);
    adam_items tab;
    for (int k0 = 0; k0 < n; k0 += ADAM_ITEMS) {
        int kn = n - k0 < ADAM_ITEMS ? n - k0 : ADAM_ITEMS;
        memset(&tab, 0, sizeof tab);      /* unused slots zero: no stale bytes passed */
        long long total = 0;
        for (int j = 0; j < kn; j++) {
            int k = k0 + j;
            tab.start[j] = total;
            tab.p[j] = p[k];
            tab.g[j] = g[k];
            tab.m[j] = m[k];
            tab.v[j] = v[k];
            tab.lp[j] = lp_kind ? (uint16_t *)lp[k] : NULL;
            tab.decay[j] = coef(lr, b1, b2, eps, wd[k], gscale, t).decay;
            total += (long long)len[k];
        }
        tab.start[kn] = total;
        tab.n = kn;
        if (total == 0) continue;
        long long nb = (total + ADAM_TILE - 1) / ADAM_TILE;
        if (nb > 0x7fffffffLL) return (int)cudaErrorInvalidValue;
        int e = g_kind == 1 ? adamw_multi_launch<uint16_t>(s, tab, (unsigned)nb, lp_kind, c)
              : g_kind == 2 ? adamw_multi_launch<__half>(s, tab, (unsigned)nb, lp_kind, c)
                            : adamw_multi_launch<float>(s, tab, (unsigned)nb, lp_kind, c);
        if (e) return e;
    }
    return 0;
}
