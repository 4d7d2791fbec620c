/* colsum.cu -- column sums of an (N,OC) array, rows ld apart, fp32 or bf16,
 * into fp32 (or bf16, out16: rounded once at the end): the matmuls' bias
 * gradients (kernels.cuh). Two passes over a
 * partition fixed by the shape (never by the GPU), layernorm.cu's weight
 * gradients' scheme: a thread per column and chunk of zkc_colsum_rows(N)
 * rows sums its rows in order in double into the scratch, then a thread per
 * column sums the chunks in order. The CPU twin (zk_matmul_backward's
 * dbias) sums all rows in order in double: the same terms, another grouping
 * of double additions, so the float results differ from the CPU's by far
 * less than an ulp and almost always not at all.
 * Before, one thread per column walked all N rows (matmul.cu's k_colsum):
 * 768 threads for GPT-2's 768-wide biases, 6 of an H100's 132 SMs busy,
 * 48 calls a step. The chunks give N/64 times the parallelism: at B=16,
 * T=1024 a 768-wide call is 6 x 256 blocks of 128 threads, each reading
 * 64 rows of 128 adjacent columns (coalesced). Roofline: N*OC elements read
 * once. Checked on the CPU under spec/emu (sh tools/emu_kernel.sh colsum);
 * not yet timed on a GPU. */
#include "common.cuh"

#define CS_THREADS 128

/* rows per chunk: 64, more for N > 64 * 65535 (a grid's y dimension) */
static inline int zkc_colsum_rows(int N)
{
    int r = 64;
    while ((N + r - 1) / r > 65535) r *= 2;
    return r;
}

extern "C" size_t zkc_colsum_scratch(int N, int OC)
{
    return N <= 0 ? 0 : (size_t)((N + zkc_colsum_rows(N) - 1) / zkc_colsum_rows(N)) * (size_t)OC;
}

__device__ __forceinline__ float cs_f(float v) { return v; }
__device__ __forceinline__ float cs_f(uint16_t v) { return __uint_as_float((uint32_t)v << 16); }

/* part (nk, OC): chunk k's sum of column c, rows [k R, k R + R) in order */
template <class T>
__device__ __forceinline__ void cs_part(double *part, const T *x, int N, int OC, int ld, int R)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, k = blockIdx.y;
    if (c >= OC) return;
    int n0 = k * R, n1 = min(N, n0 + R);
    double s = 0.0;
    for (int n = n0; n < n1; n++) s += (double)cs_f(x[(size_t)n * ld + c]);
    part[(size_t)k * OC + c] = s;
}
__global__ static void k_colsum_part(double *part, const float *x, int N, int OC, int ld, int R)
{ cs_part<float>(part, x, N, OC, ld, R); }
__global__ static void k_colsum_part_bf16(double *part, const uint16_t *x, int N, int OC, int ld, int R)
{ cs_part<uint16_t>(part, x, N, OC, ld, R); }

/* out[c] = the chunks' sums of column c, in chunk order; O: out's type,
 * float, or uint16_t (out16: a bf16 run's stored bias gradient, written
 * by the op with no fp32 image and no cast after): the double sum rounded
 * to float, then to bf16 once (zkc_put: nearest even), so the bits of the
 * fp32 out cast by zkc_cast_f32_bf16 */
template <class O>
__global__ static void k_colsum_sum(O *out, const double *part, int nk, int OC)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= OC) return;
    double s = 0.0;
    for (int k = 0; k < nk; k++) s += part[(size_t)k * OC + c];
    zkc_put(out + c, (float)s);
}

/* launches each on one line: spec/emu rewrites them */
static int colsum(cudaStream_t s, void *out, int out16, const void *x, int bf16, int N, int OC,
                  int ld, double *scratch)
{
    if (OC <= 0) return 0;
    if (N <= 0) return (int)cudaMemsetAsync(out, 0, (size_t)OC * (out16 ? 2 : sizeof(float)), s);
    int R = zkc_colsum_rows(N), nk = (N + R - 1) / R;
    dim3 g((unsigned)((OC + CS_THREADS - 1) / CS_THREADS), (unsigned)nk);
    if (bf16) k_colsum_part_bf16<<<g, CS_THREADS, 0, s>>>(scratch, (const uint16_t *)x, N, OC, ld, R);
    else k_colsum_part<<<g, CS_THREADS, 0, s>>>(scratch, (const float *)x, N, OC, ld, R);
    int e = ZKC_LAUNCHED();
    if (e) return e;
    unsigned gs = (unsigned)((OC + CS_THREADS - 1) / CS_THREADS);
    if (out16) k_colsum_sum<uint16_t><<<gs, CS_THREADS, 0, s>>>((uint16_t *)out, scratch, nk, OC);
    else k_colsum_sum<float><<<gs, CS_THREADS, 0, s>>>((float *)out, scratch, nk, OC);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_colsum(cudaStream_t s, void *out, int out16, const float *x, int N, int OC,
                          int ld, double *scratch)
{
    return colsum(s, out, out16, x, 0, N, OC, ld, scratch);
}

extern "C" int zkc_colsum_bf16(cudaStream_t s, void *out, int out16, const uint16_t *x, int N,
                               int OC, int ld, double *scratch)
{
    return colsum(s, out, out16, x, 1, N, OC, ld, scratch);
}
