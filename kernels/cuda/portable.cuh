/* portable.cuh -- the device helpers that need nothing but CUDA's names:
 * common.cuh includes them for nvcc, spec/emu/cuda_emu.h for the CPU
 * emulator (after defining those names), so a kernel and its emulated run
 * share one copy. */
#ifndef ZT_KCUDA_PORTABLE_H
#define ZT_KCUDA_PORTABLE_H
#include <stddef.h>
#include <stdint.h>

/* grid for n elements at `threads` a block, grid-stride loops cover the rest */
static inline unsigned zkc_grid(size_t n, unsigned threads)
{
    size_t g = (n + threads - 1) / threads;
    if (g > 65535u * 16u) g = 65535u * 16u;
    return g ? (unsigned)g : 1u;
}
#define ZKC_FOR(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)blockDim.x * gridDim.x)

/* every pointer on 16 bytes (NULL counts as aligned): the 8-wide kernels' and
 * layernorm's vector path's
 * 16-byte loads and stores */
static inline int zkc_aligned16(const void *a, const void *b, const void *c)
{
    return !(((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15);
}

#ifndef __CUDACC__
/* the emulator's fp64 adds and products, each rounded once (C++17 without
 * -ffp-contract=fast and without -mfma: never contracted); nvcc has its own */
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
#endif

/* fp32 -> bf16 bits, nearest even; a NaN stays a quiet NaN of its sign
 * (zk_cast_f32_bf16's bits) */
__device__ __forceinline__ uint16_t zkc_bf16(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/* a kernel's input element as fp32: itself, or bf16 bits widened exactly */
__device__ __forceinline__ float zkc_get(const float *p) { return *p; }
__device__ __forceinline__ float zkc_get(const uint16_t *p) { return __uint_as_float((uint32_t)*p << 16); }
/* a kernel's output element: fp32 as computed, or bf16 rounded once */
__device__ __forceinline__ void zkc_put(float *p, float v) { *p = v; }
__device__ __forceinline__ void zkc_put(uint16_t *p, float v) { *p = zkc_bf16(v); }
#endif
