/* random.c -- counter-based normal deviates for deterministic initialisation. */
#include <math.h>
#include "kernels.h"

static inline uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Uniform in (0,1], 53 bits. */
static inline double u01(uint64_t bits) { return ((double)(bits >> 11) + 1.0) * 0x1.0p-53; }

void zk_randn(float *x, size_t n, uint64_t seed, uint64_t stream, float mean, float std)
{
    uint64_t key = splitmix64(seed ^ splitmix64(stream + 0x632be59bd9b4e019ULL));
    /* Element pairs (2i, 2i+1) share one Box-Muller draw keyed by i. */
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < (n + 1) / 2; i++) {
        uint64_t a = splitmix64(key + 2 * i), b = splitmix64(key + 2 * i + 1);
        double r = sqrt(-2.0 * log(u01(a))), th = 6.283185307179586 * u01(b);
        x[2 * i] = mean + std * (float)(r * cos(th));
        if (2 * i + 1 < n) x[2 * i + 1] = mean + std * (float)(r * sin(th));
    }
}
