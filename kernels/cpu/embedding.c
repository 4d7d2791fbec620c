/*
 * embedding.c -- token + position embedding (GPT-2's encoder).
 */
#include <stdlib.h>
#include <string.h>
#include "kernels.h"

/* channels per task in the backward: one owner per (row, channel) element */
#define ENC_CHUNK 64

/* out (B,T,C) = wte[tokens[b,t]] + wpe[t] (wpe NULL: wte[tokens[b,t]]
 * alone, Llama's embedding). A token outside [0,V) is not looked up: its
 * row gets wpe[t] alone (zeros without wpe). Returns how many there were. */
int zk_encoder_forward(float *out, const int32_t *tokens, const float *wte,
                       const float *wpe, int B, int T, int C, int V) {
    int bad = 0;
    #pragma omp parallel for schedule(static) reduction(+:bad) if ((long)B * T * C >= 65536)
    for (int bt = 0; bt < B * T; bt++) {
        int t = bt % T, tok = tokens[bt];
        float *restrict o = out + (size_t)bt * C;            // (C)
        const float *restrict p = wpe ? wpe + (size_t)t * C : NULL;
        if (tok < 0 || tok >= V) {
            bad++;
            for (int c = 0; c < C; c++) o[c] = p ? p[c] : 0.0f;
            continue;
        }
        const float *restrict e = wte + (size_t)tok * C;
        if (!p) { memcpy(o, e, (size_t)C * sizeof(float)); continue; }
        for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
    return bad;
}

static inline float widen16(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }

int zk_encoder_forward_b16(float *out, const int32_t *tokens, const uint16_t *wte,
                           const uint16_t *wpe, int B, int T, int C, int V) {
    int bad = 0;
    #pragma omp parallel for schedule(static) reduction(+:bad) if ((long)B * T * C >= 65536)
    for (int bt = 0; bt < B * T; bt++) {
        int t = bt % T, tok = tokens[bt];
        float *restrict o = out + (size_t)bt * C;            // (C)
        const uint16_t *restrict p = wpe ? wpe + (size_t)t * C : NULL;
        if (tok < 0 || tok >= V) {
            bad++;
            for (int c = 0; c < C; c++) o[c] = p ? widen16(p[c]) : 0.0f;
            continue;
        }
        const uint16_t *restrict e = wte + (size_t)tok * C;
        if (!p) { for (int c = 0; c < C; c++) o[c] = widen16(e[c]); continue; }
        for (int c = 0; c < C; c++) o[c] = widen16(e[c]) + widen16(p[c]);
    }
    return bad;
}

/* bf16 out: each row's floats as zk_encoder_forward(_b16) makes them (the
 * same adds), in chunks on the stack, rounded once */
#define ENC_OCHUNK 256
int zk_encoder_forward_o16(uint16_t *out, const int32_t *tokens, const void *wte,
                           const void *wpe, int w16, int B, int T, int C, int V) {
    int bad = 0;
    #pragma omp parallel for schedule(static) reduction(+:bad) if ((long)B * T * C >= 65536)
    for (int bt = 0; bt < B * T; bt++) {
        int t = bt % T, tok = tokens[bt], ok = tok >= 0 && tok < V;
        bad += !ok;
        size_t e0 = ok ? (size_t)tok * C : 0, p0 = (size_t)t * C;
        for (int c0 = 0; c0 < C; c0 += ENC_OCHUNK) {
            int n = C - c0 < ENC_OCHUNK ? C - c0 : ENC_OCHUNK;
            float o[ENC_OCHUNK];
            for (int j = 0; j < n; j++) {
                size_t c = (size_t)c0 + j;
                float p = !wpe ? 0.0f : w16 ? widen16(((const uint16_t *)wpe)[p0 + c])
                                            : ((const float *)wpe)[p0 + c];
                if (!ok) { o[j] = p; continue; }
                float e = w16 ? widen16(((const uint16_t *)wte)[e0 + c])
                              : ((const float *)wte)[e0 + c];
                o[j] = wpe ? e + p : e;
            }
            zk_cast_f32_bf16(out + (size_t)bt * C + c0, o, (size_t)n);
        }
    }
    return bad;
}

/* dwte (V,C) ACCUMULATED; dwpe rows [0,T) WRITTEN (NULL: none).
 * Tasks split the channels, never the rows: a task walks every (b,t) in
 * order for its channel slice, so each dwte element receives its additions
 * in (b,t) order -- the sequential loop's bits -- and no two tasks touch the
 * same element even when a token repeats. A token outside [0,V) adds to no
 * row (dwpe still gets its dout); the count of them is returned. */
/* dout's element i, widened when bf16 (exactly: the same floats) */
#define DOUT(i) (d16 ? widen16(((const uint16_t *)dout)[i]) : ((const float *)dout)[i])
static inline __attribute__((always_inline))
int enc_backward(float *dwte, float *dwpe, const void *dout, int d16,
                 const int32_t *tokens, int B, int T, int C, int V) {
    int nchunk = (C + ENC_CHUNK - 1) / ENC_CHUNK, bad = 0;
    #pragma omp parallel for schedule(static) reduction(+:bad) if ((long)B * T * C >= 65536)
    for (int k = 0; k < nchunk; k++) {
        int c0 = k * ENC_CHUNK, c1 = c0 + ENC_CHUNK < C ? c0 + ENC_CHUNK : C;
        for (int t = 0; t < T && dwpe; t++) {
            float *restrict p = dwpe + (size_t)t * C;
            for (int c = c0; c < c1; c++) p[c] = 0.0f;
            for (int b = 0; b < B; b++) {
                size_t r = ((size_t)b * T + t) * C;
                for (int c = c0; c < c1; c++) p[c] += DOUT(r + c);
            }
        }
        for (int bt = 0; bt < B * T; bt++) {
            int tok = tokens[bt];
            if (tok < 0 || tok >= V) { bad += k == 0; continue; }   /* counted once */
            size_t r = (size_t)bt * C;
            float *restrict w = dwte + (size_t)tok * C;
            for (int c = c0; c < c1; c++) w[c] += DOUT(r + c);
        }
    }
    return bad;
}
#undef DOUT

/* dout's element i, widened when bf16 (exactly: the same floats) */
#define DOUT(i) (d16 ? widen16(((const uint16_t *)dout)[i]) : ((const float *)dout)[i])
int zk_encoder_backward_g16(uint16_t *dwte, uint16_t *dwpe, const void *dout, int d16,
                            const int32_t *tokens, int B, int T, int C, int V) {
    int n = B * T, nd = 0, bad = 0;
    /* the distinct tokens in first-seen order, and each one's fp32 row */
    int32_t *slot = malloc((size_t)(V > 0 ? V : 1) * sizeof *slot);
    int32_t *rows = malloc((size_t)(n > 0 ? n : 1) * sizeof *rows);
    float *acc = NULL;
    if (slot && rows) {
        memset(slot, 0xff, (size_t)V * sizeof *slot);          /* -1: not seen */
        for (int bt = 0; bt < n; bt++) {
            int tok = tokens[bt];
            if (tok < 0 || tok >= V) { bad++; continue; }
            if (slot[tok] < 0) { slot[tok] = nd; rows[nd++] = tok; }
        }
        acc = malloc((size_t)(nd > 0 ? nd : 1) * C * sizeof *acc);
    }
    if (!acc) { free(slot); free(rows); return -1; }
    int nchunk = (C + ENC_CHUNK - 1) / ENC_CHUNK;
    #pragma omp parallel for schedule(static) if ((long)n * C >= 65536)
    for (int k = 0; k < nchunk; k++) {
        int c0 = k * ENC_CHUNK, c1 = c0 + ENC_CHUNK < C ? c0 + ENC_CHUNK : C;
        float p[ENC_CHUNK];
        for (int t = 0; t < T && dwpe; t++) {
            for (int c = c0; c < c1; c++) p[c - c0] = 0.0f;
            for (int b = 0; b < B; b++) {
                size_t r = ((size_t)b * T + t) * C;
                for (int c = c0; c < c1; c++) p[c - c0] += DOUT(r + c);
            }
            zk_cast_f32_bf16(dwpe + (size_t)t * C + c0, p, (size_t)(c1 - c0));
        }
        for (int i = 0; i < nd; i++)
            for (int c = c0; c < c1; c++) acc[(size_t)i * C + c] = widen16(dwte[(size_t)rows[i] * C + c]);
        for (int bt = 0; bt < n; bt++) {
            int tok = tokens[bt];
            if (tok < 0 || tok >= V) continue;
            size_t r = (size_t)bt * C;
            float *restrict w = acc + (size_t)slot[tok] * C;
            for (int c = c0; c < c1; c++) w[c] += DOUT(r + c);
        }
        for (int i = 0; i < nd; i++)
            zk_cast_f32_bf16(dwte + (size_t)rows[i] * C + c0, acc + (size_t)i * C + c0,
                             (size_t)(c1 - c0));
    }
    free(acc); free(slot); free(rows);
    return bad;
}
#undef DOUT

int zk_encoder_backward(float *dwte, float *dwpe, const float *dout,
                        const int32_t *tokens, int B, int T, int C, int V) {
    return enc_backward(dwte, dwpe, dout, 0, tokens, B, T, C, V);
}

int zk_encoder_backward_b16(float *dwte, float *dwpe, const uint16_t *dout,
                            const int32_t *tokens, int B, int T, int C, int V) {
    return enc_backward(dwte, dwpe, dout, 1, tokens, B, T, C, V);
}
