/* adamw.cu -- AdamW, kernels/cpu/adamw.c's scalar loop: the coefficients
 * computed on the host in double exactly as the CPU does, and each
 * operation rounded on its own (explicit _rn intrinsics: nvcc would
 * otherwise contract a*b+c into an FMA), so the bits equal zk_adamw's. */
#include <math.h>
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

extern "C" int zkc_adamw(cudaStream_t s, float *p, const float *g, float *m, float *v,
                         size_t n, float lr, float b1, float b2, float eps, float wd,
                         float gscale, int t)
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
    if (n == 0) return 0;
    k_adamw<<<zkc_grid(n, 256), 256, 0, s>>>(p, g, m, v, n, c);
    return ZKC_LAUNCHED();
}
