/* common.cuh -- launch helpers shared by the kernels/cuda .cu files */
#ifndef ZT_KCUDA_COMMON_H
#define ZT_KCUDA_COMMON_H
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include "kernels.cuh"
#include "portable.cuh"

#define ZKC_LAUNCHED() ((int)cudaGetLastError())

/* an fp16 input element widened exactly (__half2float is exact), beside
 * portable.cuh's float and bf16 (uint16_t) ones: a kernel templated on its
 * input type reads f32, bf16 and f16 through zkc_get alike
 * (spec/emu/cuda_emu.h has the emulator's twin) */
__device__ __forceinline__ float zkc_get(const __half *p) { return __half2float(*p); }
/* 8-byte global load of 4 neighbouring 2-byte elements (p on 8 bytes): a
 * 2-byte tensor's step of the 4 elements an f32 one loads by zkc_ldg4 */
template <class X>
__device__ __forceinline__ uint2 zkc_ldg4h(const X *p)
{
    static_assert(sizeof(X) == 2, "zkc_ldg4h: 2-byte elements");
    return *(const uint2 *)p;
}

__device__ __forceinline__ float zkc_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double zkc_warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float zkc_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
#endif
