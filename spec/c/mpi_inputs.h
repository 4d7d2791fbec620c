/*
 * mpi_inputs.h -- the inputs the MPI tests feed their collectives: floats
 * that differ by rank and index, with varied exponents, so a wrong order of
 * summation shows in the bits.
 */
#ifndef ZT_MPI_INPUTS_H
#define ZT_MPI_INPUTS_H
#include <stdint.h>

static inline uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A float of rank r at index i: sign, 24 random mantissa bits, exponent -8..8. */
static inline float val(uint32_t seed, int r, int64_t i)
{
    uint64_t z = mix(mix(((uint64_t)seed << 40) ^ ((uint64_t)r << 32)) ^ (uint64_t)i);
    float m = (float)((z >> 40) & 0xFFFFFF) * (1.0f / 16777216.0f) + 0.5f;
    int e = (int)((z >> 8) % 17) - 8;
    float v = m * (float)(1 << (e + 8)) * (1.0f / 256.0f);
    return (z & 1) ? -v : v;
}

#endif
