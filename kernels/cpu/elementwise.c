/*
 * elementwise.c -- fill, copy, scale, axpy, adds and dtype casts.
 *
 * Every loop walks fixed blocks of EW_BLOCK elements and OpenMP hands out
 * whole blocks, so the code that touches index i (vector body or scalar
 * tail) is the same whatever the thread count. Inner loops carry
 * `omp simd`: these ops are per-index, so exact aliasing (y == x) is safe.
 */
#include <omp.h>
#include <string.h>
#include "kernels.h"

#define EW_BLOCK 4096
/* below this many blocks a parallel region costs more than it saves */
#define EW_PAR_BLOCKS 8

/* Small work, or a call from inside a parallel region (kernels round a row
 * or a tile at a time: attention, layernorm, GELU, the bf16 GEMM's
 * epilogue), enters no OpenMP construct at all: even an inactive region
 * costs a team set-up each call, which made the bf16 attention 5-10x the
 * f32 one. The same blocks either way, so the same bits. */
#define EW_FOR_BLOCKS(n, lo, hi, BODY)                                        \
    do {                                                                      \
        size_t nb_ = ((n) + EW_BLOCK - 1) / EW_BLOCK;                         \
        if (nb_ < EW_PAR_BLOCKS || omp_in_parallel()) {                       \
            for (size_t b_ = 0; b_ < nb_; b_++) {                             \
                size_t lo = b_ * EW_BLOCK;                                    \
                size_t hi = lo + EW_BLOCK < (n) ? lo + EW_BLOCK : (n);        \
                BODY                                                          \
            }                                                                 \
        } else {                                                              \
            _Pragma("omp parallel for schedule(static)")                      \
            for (size_t b_ = 0; b_ < nb_; b_++) {                             \
                size_t lo = b_ * EW_BLOCK;                                    \
                size_t hi = lo + EW_BLOCK < (n) ? lo + EW_BLOCK : (n);        \
                BODY                                                          \
            }                                                                 \
        }                                                                     \
    } while (0)

void zk_fill(float *x, float value, size_t n) {
    EW_FOR_BLOCKS(n, lo, hi, {
        _Pragma("omp simd")
        for (size_t i = lo; i < hi; i++) x[i] = value;
    });
}

void zk_copy(float *dst, const float *src, size_t n) {
    EW_FOR_BLOCKS(n, lo, hi, {
        memcpy(dst + lo, src + lo, (hi - lo) * sizeof(float));
    });
}

void zk_scale(float *x, float a, size_t n) {
    EW_FOR_BLOCKS(n, lo, hi, {
        _Pragma("omp simd")
        for (size_t i = lo; i < hi; i++) x[i] *= a;
    });
}

/* y += a * x: a product then a sum, two roundings (no fused multiply-add),
 * the same as PyTorch's y.add_(x, alpha=a) on CPU. */
void zk_axpy(float *y, float a, const float *x, size_t n) {
    EW_FOR_BLOCKS(n, lo, hi, {
        _Pragma("omp simd")
        for (size_t i = lo; i < hi; i++) y[i] += a * x[i];
    });
}

void zk_add(float *y, const float *x, size_t n) {
    EW_FOR_BLOCKS(n, lo, hi, {
        _Pragma("omp simd")
        for (size_t i = lo; i < hi; i++) y[i] += x[i];
    });
}

/* out may be a or b (the residual stream adds in place). */
void zk_add3(float *out, const float *a, const float *b, size_t n) {
    EW_FOR_BLOCKS(n, lo, hi, {
        _Pragma("omp simd")
        for (size_t i = lo; i < hi; i++) out[i] = a[i] + b[i];
    });
}

/* ---- casts --------------------------------------------------------------
 * Integer bit tricks, branch-free so the loops vectorize. The rounding
 * adds below implement round-to-nearest-even on the dropped bits. */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* c ? a : b on integers without a branch; a plain ?: whose operands involve
 * float math would be turned into control flow (trapping math) and the
 * loop would not vectorize. */
static inline uint32_t sel(int c, uint32_t a, uint32_t b) {
    uint32_t m = -(uint32_t)(c != 0);
    return (a & m) | (b & ~m);
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    /* NaN: keep sign and top payload, force the quiet bit so the payload
     * cannot round away into an infinity. */
    uint32_t nan = (u >> 16) | 0x0040u;
    /* + 0x7fff + lsb: ties go to the even result; overflow carries into
     * the exponent and lands on inf, as it should. */
    uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rne);
}

/* the bf16 residual stream's add: one fp32 add of the widened values,
 * rounded once (f32_to_bf16); out may alias a or b (elementwise) */
void zk_add3_b16(uint16_t *out, const uint16_t *a, const uint16_t *b, size_t n) {
    EW_FOR_BLOCKS(n, lo, hi, {
        _Pragma("omp simd")
        for (size_t i = lo; i < hi; i++)
            out[i] = f32_to_bf16(bits_f32((uint32_t)a[i] << 16) + bits_f32((uint32_t)b[i] << 16));
    });
}

void zk_cast_f32_bf16(uint16_t *dst, const float *src, size_t n) {
    EW_FOR_BLOCKS(n, lo, hi, {
        _Pragma("omp simd")
        for (size_t i = lo; i < hi; i++) dst[i] = f32_to_bf16(src[i]);
    });
}

void zk_cast_bf16_f32(float *dst, const uint16_t *src, size_t n) {
    EW_FOR_BLOCKS(n, lo, hi, {
        _Pragma("omp simd")
        for (size_t i = lo; i < hi; i++) dst[i] = bits_f32((uint32_t)src[i] << 16);
    });
}

/* f32 -> IEEE binary16, after F. Giesen's float_to_half_fast3_rtne. */
static inline uint16_t f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    u &= 0x7fffffffu;
    /* |f| >= 65520 rounds to inf (65504 is the largest half, odd mantissa);
     * NaN stays a quiet NaN with the top payload bits kept. */
    uint32_t big = u > 0x7f800000u ? (0x7e00u | ((u >> 13) & 0x3ffu)) : 0x7c00u;
    /* subnormal half (|f| < 2^-14): adding 0.5f aligns the 10 mantissa bits
     * at the bottom of the float and the FPU rounds them to nearest even. */
    const float denorm_magic = 0.5f;                   /* bits 0x3f000000 */
    uint32_t sub = f32_bits(bits_f32(u) + denorm_magic) - 0x3f000000u;
    /* normal half: rebias the exponent, round the 13 dropped bits to even;
     * a mantissa carry bumps the exponent (up to inf) correctly. */
    uint32_t nrm = (u + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((u >> 13) & 1u)) >> 13;
    uint32_t h = sel(u < 0x38800000u, sub, nrm);
    h = sel(u >= 0x477ff000u, big, h);
    return (uint16_t)(sign | h);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    /* inf/NaN: exponent all ones, payload moved to the top of the mantissa */
    uint32_t special = 0x7f800000u | ((em & 0x3ffu) << 13);
    uint32_t normal = (em << 13) + ((uint32_t)(127 - 15) << 23);
    /* subnormal: the mantissa times 2^-24 is exact in float */
    uint32_t subn = f32_bits((float)em * 0x1p-24f);
    uint32_t u = sel(em >= 0x0400u, normal, subn);
    u = sel(em >= 0x7c00u, special, u);
    return bits_f32(sign | u);
}

void zk_cast_f32_f16(uint16_t *dst, const float *src, size_t n) {
    EW_FOR_BLOCKS(n, lo, hi, {
        _Pragma("omp simd")
        for (size_t i = lo; i < hi; i++) dst[i] = f32_to_f16(src[i]);
    });
}

void zk_cast_f16_f32(float *dst, const uint16_t *src, size_t n) {
    EW_FOR_BLOCKS(n, lo, hi, {
        _Pragma("omp simd")
        for (size_t i = lo; i < hi; i++) dst[i] = f16_to_f32(src[i]);
    });
}

void zk_add_bf16(float *y, const uint16_t *x, size_t n) {
    EW_FOR_BLOCKS(n, lo, hi, {
        _Pragma("omp simd")
        for (size_t i = lo; i < hi; i++) y[i] += bits_f32((uint32_t)x[i] << 16);
    });
}

void zk_add_f16(float *y, const uint16_t *x, size_t n) {
    EW_FOR_BLOCKS(n, lo, hi, {
        _Pragma("omp simd")
        for (size_t i = lo; i < hi; i++) y[i] += f16_to_f32(x[i]);
    });
}
