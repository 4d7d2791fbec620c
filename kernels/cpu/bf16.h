/*
 * bf16.h -- private to kernels/cpu: fp32 -> bf16 rounding, shared by the
 * cast kernel (elementwise.c) and the bf16 GEMMs that read fp32 operands
 * (matmul_bf16.c), so a GEMM that rounds as it reads gives the very bits
 * of a cast followed by the GEMM.
 */
#ifndef ZT_KERNELS_BF16_H
#define ZT_KERNELS_BF16_H

#include <stdint.h>
#include <string.h>

/* Round to nearest even, branch-free (loops calling it vectorize):
 * + 0x7fff + lsb sends ties to the even result; an overflow carries into
 * the exponent and lands on inf, as it should. Denormals round like any
 * other value (no flush). NaN keeps its sign and top payload with the
 * quiet bit forced, so the payload cannot round away into an infinity. */
static inline uint16_t zk_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t nan = (u >> 16) | 0x0040u;
    uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t m = -(uint32_t)((u & 0x7fffffffu) > 0x7f800000u);   /* NaN: all ones */
    return (uint16_t)((nan & m) | (rne & ~m));
}

#endif
