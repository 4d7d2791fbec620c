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
__global__ static void k_add(float *y, const float *x, size_t n) { ZKC_FOR(i, n) y[i] = y[i] + x[i]; }
__global__ static void k_add3(float *o, const float *a, const float *b, size_t n)
{
    ZKC_FOR(i, n) o[i] = a[i] + b[i];
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
int zkc_add(cudaStream_t s, float *y, const float *x, size_t n) { LAUNCH(k_add, n, y, x, n); }
int zkc_add3(cudaStream_t s, float *o, const float *a, const float *b, size_t n) { LAUNCH(k_add3, n, o, a, b, n); }
int zkc_cast_f32_bf16(cudaStream_t s, uint16_t *d, const float *x, size_t n) { LAUNCH(k_f32_bf16, n, d, x, n); }
int zkc_cast_bf16_f32(cudaStream_t s, float *d, const uint16_t *x, size_t n) { LAUNCH(k_bf16_f32, n, d, x, n); }
int zkc_cast_f32_f16(cudaStream_t s, uint16_t *d, const float *x, size_t n) { LAUNCH(k_f32_f16, n, d, x, n); }
int zkc_cast_f16_f32(cudaStream_t s, float *d, const uint16_t *x, size_t n) { LAUNCH(k_f16_f32, n, d, x, n); }
}
