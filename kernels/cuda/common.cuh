/* common.cuh -- launch helpers shared by the kernels/cuda .cu files */
#ifndef ZT_KCUDA_COMMON_H
#define ZT_KCUDA_COMMON_H
#include <cuda_runtime.h>
#include "kernels.cuh"
#include "portable.cuh"

#define ZKC_LAUNCHED() ((int)cudaGetLastError())

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
