/* elementwise.cu -- fill, scale, axpy, add, add3, casts (kernels.cuh). */
#include <cuda_fp16.h>
#include "common.cuh"

__global__ static void k_fill(float *x, float v, size_t n) { ZKC_FOR(i, n) x[i] = v; }
__global__ static void k_scale(float *x, float a, size_t n) { ZKC_FOR(i, n) x[i] = x[i] * a; }
/* y += a*x as the CPU writes it: one multiply, one add, each rounded */
__global__ static void k_axpy(float *y, float a, const float *x, size_t n)
{
    ZKC_FOR(i, n) y[i] = __fadd_rn(y[i], __fmul_rn(a, x[i]));
}
/* y += x, x fp32 or a 2-byte x widened exactly (X uint16_t: bf16 bits,
 * __half: fp16; zkc_get, common.cuh): the casts' widening then the one
 * fp32 add, so the bits of a cast then zkc_add */
template <class X>
__global__ static void k_add(float *y, const X *x, size_t n) { ZKC_FOR(i, n) y[i] = y[i] + zkc_get(x + i); }
__global__ static void k_add3(float *o, const float *a, const float *b, size_t n)
{
    ZKC_FOR(i, n) o[i] = a[i] + b[i];
}
/* the bf16 residual stream's add: widen, one fp32 add, round once
 * (zkc_bf16); o may alias a or b (each thread reads its elements before
 * it writes them) */
__global__ static void k_add3_b16(uint16_t *o, const uint16_t *a, const uint16_t *b, size_t n)
{
    ZKC_FOR(i, n) o[i] = zkc_bf16(zkc_get(a + i) + zkc_get(b + i));
}
/* one register's two bf16 added as above, the sums packed the same way */
__device__ __forceinline__ uint32_t add2_b16(uint32_t x, uint32_t y)
{
    float lo = __uint_as_float(x << 16) + __uint_as_float(y << 16);
    float hi = __uint_as_float(x & 0xffff0000u) + __uint_as_float(y & 0xffff0000u);
    return (uint32_t)zkc_bf16(lo) | (uint32_t)zkc_bf16(hi) << 16;
}
/* 8 elements a thread by 16-byte loads and stores where the three
 * pointers are on 16 bytes, the tail (n mod 8) by block 0: the bits of
 * k_add3_b16 */
__global__ static void k_add3_b16_8(uint16_t *o, const uint16_t *a, const uint16_t *b, size_t n)
{
    size_t n8 = n / 8;
    ZKC_FOR(i, n8) {
        uint4 x = ((const uint4 *)a)[i], y = ((const uint4 *)b)[i], r;
        r.x = add2_b16(x.x, y.x);
        r.y = add2_b16(x.y, y.y);
        r.z = add2_b16(x.z, y.z);
        r.w = add2_b16(x.w, y.w);
        ((uint4 *)o)[i] = r;
    }
    size_t t = n8 * 8 + threadIdx.x;
    if (blockIdx.x == 0 && t < n) o[t] = zkc_bf16(zkc_get(a + t) + zkc_get(b + t));
}

/* bf16 = the high half of a float, rounded to nearest even; a NaN keeps
 * its sign and top payload bits, made quiet */
__global__ static void k_f32_bf16(uint16_t *d, const float *s, size_t n)
{
    ZKC_FOR(i, n) {
        uint32_t u = __float_as_uint(s[i]);
        if ((u & 0x7fffffffu) > 0x7f800000u) d[i] = (uint16_t)((u >> 16) | 0x0040u);
        else d[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}
__global__ static void k_bf16_f32(float *d, const uint16_t *s, size_t n)
{
    ZKC_FOR(i, n) d[i] = __uint_as_float((uint32_t)s[i] << 16);
}
/* the two bf16 casts 8 elements a thread by 16-byte loads and stores where
 * both pointers are on 16 bytes, the tail (n mod 8) by block 0: the bits
 * above (an H200 ran the scalar ones at 0.34-1.26 TB/s in a step) */
__global__ static void k_f32_bf16_8(uint16_t *d, const float *s, size_t n)
{
    size_t n8 = n / 8;
    ZKC_FOR(i, n8) {
        float4 a = ((const float4 *)s)[2 * i], b = ((const float4 *)s)[2 * i + 1];
        uint4 o;
        o.x = (uint32_t)zkc_bf16(a.x) | (uint32_t)zkc_bf16(a.y) << 16;
        o.y = (uint32_t)zkc_bf16(a.z) | (uint32_t)zkc_bf16(a.w) << 16;
        o.z = (uint32_t)zkc_bf16(b.x) | (uint32_t)zkc_bf16(b.y) << 16;
        o.w = (uint32_t)zkc_bf16(b.z) | (uint32_t)zkc_bf16(b.w) << 16;
        ((uint4 *)d)[i] = o;
    }
    size_t t = n8 * 8 + threadIdx.x;
    if (blockIdx.x == 0 && t < n) d[t] = zkc_bf16(s[t]);
}
__global__ static void k_bf16_f32_8(float *d, const uint16_t *s, size_t n)
{
    size_t n8 = n / 8;
    ZKC_FOR(i, n8) {
        uint4 v = ((const uint4 *)s)[i];
        ((float4 *)d)[2 * i] = make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
                                           __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u));
        ((float4 *)d)[2 * i + 1] = make_float4(__uint_as_float(v.z << 16), __uint_as_float(v.z & 0xffff0000u),
                                               __uint_as_float(v.w << 16), __uint_as_float(v.w & 0xffff0000u));
    }
    size_t t = n8 * 8 + threadIdx.x;
    if (blockIdx.x == 0 && t < n) d[t] = __uint_as_float((uint32_t)s[t] << 16);
}

__global__ static void k_f32_f16(uint16_t *d, const float *s, size_t n)
{
    ZKC_FOR(i, n) d[i] = __half_as_ushort(__float2half_rn(s[i]));
}
__global__ static void k_f16_f32(float *d, const uint16_t *s, size_t n)
{
    ZKC_FOR(i, n) d[i] = __half2float(__ushort_as_half(s[i]));
}

#define LAUNCH(k, n, ...) \
    do { if ((n) == 0) return 0; k<<<zkc_grid(n, 256), 256, 0, s>>>(__VA_ARGS__); \
         return ZKC_LAUNCHED(); } while (0)

extern "C" {
int zkc_fill(cudaStream_t s, float *x, float v, size_t n) { LAUNCH(k_fill, n, x, v, n); }
int zkc_scale(cudaStream_t s, float *x, float a, size_t n) { LAUNCH(k_scale, n, x, a, n); }
int zkc_axpy(cudaStream_t s, float *y, float a, const float *x, size_t n) { LAUNCH(k_axpy, n, y, a, x, n); }
int zkc_add(cudaStream_t s, float *y, const float *x, size_t n) { LAUNCH(k_add<float>, n, y, x, n); }
int zkc_add_bf16(cudaStream_t s, float *y, const uint16_t *x, size_t n) { LAUNCH(k_add<uint16_t>, n, y, x, n); }
int zkc_add_f16(cudaStream_t s, float *y, const uint16_t *x, size_t n)
{
    LAUNCH(k_add<__half>, n, y, (const __half *)x, n);
}
int zkc_add3(cudaStream_t s, float *o, const float *a, const float *b, size_t n) { LAUNCH(k_add3, n, o, a, b, n); }
int zkc_add3_b16(cudaStream_t s, uint16_t *o, const uint16_t *a, const uint16_t *b, size_t n)
{
    if (n >= 64 && zkc_aligned16(o, a, b)) LAUNCH(k_add3_b16_8, n / 8 + 1, o, a, b, n);
    LAUNCH(k_add3_b16, n, o, a, b, n);
}
int zkc_cast_f32_bf16(cudaStream_t s, uint16_t *d, const float *x, size_t n)
{
    if (n >= 64 && zkc_aligned16(d, x, NULL)) LAUNCH(k_f32_bf16_8, n / 8 + 1, d, x, n);
    LAUNCH(k_f32_bf16, n, d, x, n);
}
int zkc_cast_bf16_f32(cudaStream_t s, float *d, const uint16_t *x, size_t n)
{
    if (n >= 64 && zkc_aligned16(d, x, NULL)) LAUNCH(k_bf16_f32_8, n / 8 + 1, d, x, n);
    LAUNCH(k_bf16_f32, n, d, x, n);
}
int zkc_cast_f32_f16(cudaStream_t s, uint16_t *d, const float *x, size_t n) { LAUNCH(k_f32_f16, n, d, x, n); }
int zkc_cast_f16_f32(cudaStream_t s, float *d, const uint16_t *x, size_t n) { LAUNCH(k_f16_f32, n, d, x, n); }
}
