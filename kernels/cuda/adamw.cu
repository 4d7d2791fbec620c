/* adamw.cu -- AdamW, kernels/cpu/adamw.c's scalar loop: the coefficients
 * computed on the host in double exactly as the CPU does, and each
 * operation rounded on its own (explicit _rn intrinsics: nvcc would
 * otherwise contract a*b+c into an FMA), so the bits equal zk_adamw's. */
#include <math.h>
#include <cuda_fp16.h>
#include "common.cuh"

struct adam_coef { float decay, b1, b2, omb1, omb2, step, bc2_sqrt, eps, gscale; };

__global__ static void k_adamw(float *param, const float *grad, float *m, float *v,
                               size_t n, adam_coef k)
{
    ZKC_FOR(i, n) {
        float g = __fmul_rn(grad[i], k.gscale);
        float p = __fmul_rn(param[i], k.decay);
        float mi = __fadd_rn(__fmul_rn(k.b1, m[i]), __fmul_rn(k.omb1, g));
        float vi = __fadd_rn(__fmul_rn(k.b2, v[i]), __fmul_rn(k.omb2, __fmul_rn(g, g)));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2_sqrt), k.eps);
        m[i] = mi;
        v[i] = vi;
        param[i] = __fsub_rn(p, __fmul_rn(k.step, __fdiv_rn(mi, denom)));
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
        float g = __fmul_rn(zkc_get(grad + i), k.gscale);
        float p = __fmul_rn(param[i], sg.decay[s]);
        float mi = __fadd_rn(__fmul_rn(k.b1, m[i]), __fmul_rn(k.omb1, g));
        float vi = __fadd_rn(__fmul_rn(k.b2, v[i]), __fmul_rn(k.omb2, __fmul_rn(g, g)));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2_sqrt), k.eps);
        m[i] = mi;
        v[i] = vi;
        float np = __fsub_rn(p, __fmul_rn(k.step, __fdiv_rn(mi, denom)));
        param[i] = np;
        /* the stored low-precision parameter, the casts' bits */
        if (lp_kind == 1) lp[i] = zkc_bf16(np);
        else if (lp_kind == 2) lp[i] = __half_as_ushort(__float2half_rn(np));
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
