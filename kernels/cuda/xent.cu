/* xent.cu -- softmax cross-entropy fused with its backward (kernels.cuh).
 * One 256-thread block per row: max, then the sum of exp in double (a fixed
 * tree: deterministic), then dlogits. */
#include "common.cuh"

#define XT 256

__global__ static void k_xent(float *losses, float *dlogits, const float *logits,
                              const int32_t *targets, int N, int V, float dscale, int *bad)
{
    __shared__ float smax[XT / 32];
    __shared__ double ssum[XT / 32];
    int n = blockIdx.x, lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    const float *x = logits + (size_t)n * V;
    float *d = dlogits ? dlogits + (size_t)n * V : NULL;     /* may be x */
    int tgt = targets[n];
    if (tgt < 0 || tgt >= V) {
        if (threadIdx.x == 0) { losses[n] = 0.0f; atomicAdd(bad, 1); }
        if (d) for (int i = threadIdx.x; i < V; i += XT) d[i] = 0.0f;
        return;
    }
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += XT) mx = fmaxf(mx, x[i]);
    mx = zkc_warp_max(mx);
    if (lane == 0) smax[wid] = mx;
    __syncthreads();
    mx = smax[0];
    for (int w = 1; w < XT / 32; w++) mx = fmaxf(mx, smax[w]);
    double sum = 0.0;
    for (int i = threadIdx.x; i < V; i += XT) sum += (double)expf(x[i] - mx);
    sum = zkc_warp_sum_d(sum);
    if (lane == 0) ssum[wid] = sum;
    __syncthreads();
    sum = 0.0;
    for (int w = 0; w < XT / 32; w++) sum += ssum[w];
    float xt = x[tgt];
    __syncthreads();       /* every thread has read x[tgt] before d (maybe x) is written */
    if (threadIdx.x == 0) losses[n] = (float)((double)mx + log(sum) - (double)xt);
    if (!d) return;
    float fsum = (float)sum;
    for (int i = threadIdx.x; i < V; i += XT)
        d[i] = (i == tgt ? expf(xt - mx) / fsum - 1.0f : expf(x[i] - mx) / fsum) * dscale;
}

extern "C" int zkc_crossentropy(cudaStream_t s, float *losses, float *dlogits,
                                const float *logits, const int32_t *targets, int N, int V,
                                float dscale, int *dbad)
{
    if (N == 0) return 0;
    k_xent<<<N, XT, 0, s>>>(losses, dlogits, logits, targets, N, V, dscale, dbad);
    return ZKC_LAUNCHED();
}
