/* embedding.cu -- token + position embedding (kernels.cuh). */
#include "common.cuh"

/* out (B,T,C) = wte[tok] + wpe[t]; a bad id gives wpe[t] alone, counted once
 * per position (by its c == 0 thread) */
__global__ static void k_enc_fwd(float *out, const int32_t *tok, const float *wte,
                                 const float *wpe, int BT, int T, int C, int V, int *bad)
{
    ZKC_FOR(i, (size_t)BT * C) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T), id = tok[bt];
        float p = wpe[(size_t)t * C + c];
        if (id < 0 || id >= V) { out[i] = p; if (c == 0) atomicAdd(bad, 1); continue; }
        out[i] = wte[(size_t)id * C + c] + p;
    }
}

/* dwte: thread (c, r) owns column c of the rows with id % R == r and walks
 * all positions in (b,t) order: no two threads write one element, and each
 * element sums its occurrences in order (deterministic, no atomics). */
#define ENC_R 32
__global__ static void k_enc_bwd_wte(float *dwte, const float *dout, const int32_t *tok,
                                     int BT, int C, int V, int *bad)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (c >= C) return;
    for (int bt = 0; bt < BT; bt++) {
        int id = tok[bt];
        if (id < 0 || id >= V) {
            if (c == 0 && r == 0) atomicAdd(bad, 1);
            continue;
        }
        if (id % ENC_R != r) continue;
        dwte[(size_t)id * C + c] += dout[(size_t)bt * C + c];
    }
}

/* dwpe rows [0,T) = sum over b in order */
__global__ static void k_enc_bwd_wpe(float *dwpe, const float *dout, int B, int T, int C)
{
    ZKC_FOR(i, (size_t)T * C) {
        float s = 0.0f;
        for (int b = 0; b < B; b++) s += dout[(size_t)b * T * C + i];
        dwpe[i] = s;
    }
}

extern "C" int zkc_encoder_forward(cudaStream_t s, float *out, const int32_t *tok,
                                   const float *wte, const float *wpe, int B, int T, int C,
                                   int V, int *dbad)
{
    size_t n = (size_t)B * T * C;
    if (n == 0) return 0;
    k_enc_fwd<<<zkc_grid(n, 256), 256, 0, s>>>(out, tok, wte, wpe, B * T, T, C, V, dbad);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_encoder_backward(cudaStream_t s, float *dwte, float *dwpe, const float *dout,
                                    const int32_t *tok, int B, int T, int C, int V, int *dbad)
{
    if ((size_t)B * T * C == 0) return 0;
    dim3 grid((C + 127) / 128, ENC_R);
    k_enc_bwd_wte<<<grid, 128, 0, s>>>(dwte, dout, tok, B * T, C, V, dbad);
    int e = ZKC_LAUNCHED();
    if (e) return e;
    k_enc_bwd_wpe<<<zkc_grid((size_t)T * C, 256), 256, 0, s>>>(dwpe, dout, B, T, C);
    return ZKC_LAUNCHED();
}
