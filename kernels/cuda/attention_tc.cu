/* attention_tc.cu -- causal self-attention on bf16 tensor cores with fp32
 * accumulation (FlashAttention-2 style), head size 64 only (kernels.cuh:
 * zkc_attention_forward_tc / zkc_attention_backward_tc). Layouts and the
 * WRITTEN contract of zk_attention_* (kernels/cpu/kernels.h).
 *
 * The products use WMMA (nvcuda::wmma, 16x16x16 bf16 fragments, fp32
 * accumulators). A fragment's element layout is unspecified, so every
 * accumulator that needs per-row or per-column work (scale, mask, softmax,
 * rescale) is stored to shared memory and handled there in SIMT code.
 *
 * Forward, one block of 4 warps per (64 query rows, b, h); each warp owns
 * 16 rows. For key tiles kt = 0 .. the diagonal (64 keys each; tiles wholly
 * above the diagonal are skipped): S = Q K^T (fp32), s = S * scale, keys
 * after the row masked to -inf, then per row m' = max(m, max s),
 * c = exp(m - m'), p = exp(s - m'), l = l c + sum p (p in fp32), O = c O +
 * bf16(p) V. At the end out = O / l, lse = m + log l. No (T,T) buffer.
 *
 * Backward: D = rowsum(dout * out) (fp32, k_tc_D); then one block per 64
 * keys computing dK, dV over query chunks of 32 at or after the tile's first
 * key, and one block per 64 queries computing dQ over key chunks of 32 up to
 * the block's last row. Both recompute p = exp(S * scale - lse) in fp32 and
 * dS = p (dP - D) scale with dP = dout V^T; dV += bf16(p)^T dout,
 * dK += bf16(dS)^T Q, dQ += bf16(dS) K.
 *
 * Rounded to bf16 (RNE, __float2bfloat16_rn) on the way into shared memory:
 * q, k, v, dout, and p, dS where they enter a product. In fp32: the scores,
 * softmax statistics, lse, D and every accumulation.
 *
 * Deterministic (the same bits run to run): no atomics; every output element
 * has one owner (a warp of one block) that sums its terms in a fixed order
 * (a fixed loop over tiles; mma_sync is a fixed function of its inputs).
 *
 * spec/c/test_attention_tiles.c mirrors this recurrence on the CPU (tile
 * sizes, masking, rescale order, rounding points): change it with this file.
 * tools/emu_kernel.sh attention_tc runs this file's own source on the CPU (spec/emu/
 * cuda_emu.h: threads, barriers, WMMA by its documented meaning).
 *
 * Resources (ptxas, sm_90): forward 168 registers, 45056 B static shared;
 * dK/dV 168 and dQ 164 registers, 37888 B; no spills. Under 48 KiB, so no
 * opt-in to more shared memory.
 */
#include <limits.h>
#include <cuda_bf16.h>
#include <mma.h>
#include "common.cuh"

using namespace nvcuda;

#define HD 64              /* head size */
#define WR 16              /* rows per warp: one fragment high */
#define NW 4               /* warps per block */
#define BR (NW * WR)       /* a block's rows: queries (forward, dQ) or keys (dK, dV) */
#define BC 32              /* backward inner chunk: queries (dK, dV) or keys (dQ) */
#define LDH (HD + 8)       /* bf16 stride of a 64-wide tile: 144 B rows (16-row steps stay 32 B aligned) */
#define LDF (HD + 4)       /* fp32 stride of a 64-wide tile */
#define LDH2 (BC + 8)      /* bf16 stride of a 32-wide tile */
#define LDF2 (BC + 4)      /* fp32 stride of a 32-wide tile */

typedef __nv_bfloat16 bf16;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_br;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_bc;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

struct tcp { int T, C, NH; float scale; };

/* acc += A . B over NK 16-wide steps: A a warp's 16 rows (bf16, stride lda),
 * B 16 * NK rows of a 64-wide tile from its column block (bf16, stride
 * LDH). O += P V, dV += P^T dout, dK += dS^T Q, dQ += dS K. */
template <int NK>
__device__ __forceinline__ void tile_acc(frag_c &acc, const bf16 *A, int lda, const bf16 *B)
{
#pragma unroll
    for (int kk = 0; kk < NK; kk++) {
        frag_a af;
        frag_br bf;
        wmma::load_matrix_sync(af, A + kk * 16, lda);
        wmma::load_matrix_sync(bf, B + kk * 16 * LDH, LDH);
        wmma::mma_sync(acc, af, bf, acc);
    }
}

/* rows [t0, t0+n) of a (T, stride) matrix's 64 columns at src -> bf16 dst
 * (stride LDH); rows at or past T read as zero. All threads of the block. */
__device__ static void load_rows(bf16 *dst, const float *src, size_t stride, int t0, int n, int T)
{
    for (int x = threadIdx.x; x < n * HD; x += blockDim.x) {
        int r = x / HD, d = x % HD, t = t0 + r;
        dst[r * LDH + d] = __float2bfloat16_rn(t < T ? src[(size_t)t * stride + d] : 0.0f);
    }
}

/* 16 rows x 64 of fp32 at src (stride LDF) -> rows [r0, r0+16) of dst
 * (stride ld) that are below T. One warp. */
__device__ static void put_rows(float *dst, size_t ld, const float *src, int r0, int T, int lane)
{
    for (int r = 0; r < WR && r0 + r < T; r++) {
        dst[(size_t)(r0 + r) * ld + lane] = src[r * LDF + lane];
        dst[(size_t)(r0 + r) * ld + lane + 32] = src[r * LDF + lane + 32];
    }
}

/* Online softmax over one 64-key tile for this warp's 16 rows: sw holds
 * S = Q K^T (fp32), pw gets bf16(p); m, l updated, c = exp(m_old - m_new). */
__device__ __forceinline__ void softmax_tile(const float *sw, bf16 *pw, float *m, float *l, float *c,
                                             int i0, int k0, float scale, int lane)
{
#pragma unroll
    for (int r = 0; r < WR; r++) {
        const int i = i0 + r;
        float s0 = sw[r * LDF + lane] * scale, s1 = sw[r * LDF + lane + 32] * scale;
        if (k0 + lane > i) s0 = -INFINITY;          /* causal: key after the row */
        if (k0 + lane + 32 > i) s1 = -INFINITY;
        /* key k0 <= i is never masked, so mn is finite */
        float mn = fmaxf(m[r], zkc_warp_max(fmaxf(s0, s1)));
        float p0 = expf(s0 - mn), p1 = expf(s1 - mn);
        c[r] = expf(m[r] - mn);                      /* 0 on the first tile (m = -inf) */
        l[r] = l[r] * c[r] + zkc_warp_sum(p0 + p1);  /* xor butterfly: every lane the same bits */
        m[r] = mn;
        pw[r * LDH + lane] = __float2bfloat16_rn(p0);
        pw[r * LDH + lane + 32] = __float2bfloat16_rn(p1);
    }
}

#define FWD_SMEM (3 * BR * LDH * 2 + BR * LDF * 4)     /* 45056 B */

__global__ static void __launch_bounds__(NW * 32)
k_tc_fwd(float *out, float *lse, const float *qkv, tcp a)
{
    __shared__ __align__(128) unsigned char sm[FWD_SMEM];
    bf16 *ks = (bf16 *)sm, *vs = ks + BR * LDH, *ps = vs + BR * LDH;   /* (64, LDH) each */
    float *ss = (float *)(ps + BR * LDH);        /* (64, LDF): Q staging, then S / O per warp */
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, T = a.T;
    const int qt = gridDim.x - 1 - blockIdx.x;   /* the longest rows first */
    const int b = blockIdx.y / a.NH, h = blockIdx.y % a.NH, q0 = qt * BR, i0 = q0 + w * WR;
    const size_t st = 3 * (size_t)a.C;
    const float *base = qkv + (size_t)b * T * st + (size_t)h * HD;      /* q of (b, 0, h) */
    float *sw = ss + w * WR * LDF;
    bf16 *pw = ps + w * WR * LDH;

    frag_a qf[HD / 16];
    load_rows((bf16 *)ss, base, st, q0, BR, T);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        wmma::load_matrix_sync(qf[kk], (bf16 *)ss + w * WR * LDH + kk * 16, LDH);
    frag_c of[HD / 16];
#pragma unroll
    for (int j = 0; j < HD / 16; j++) wmma::fill_fragment(of[j], 0.0f);
    float m[WR], l[WR], c[WR];
#pragma unroll
    for (int r = 0; r < WR; r++) { m[r] = -INFINITY; l[r] = 0.0f; }

    for (int kt = 0; kt <= qt; kt++) {            /* causal: tiles past the diagonal skipped */
        const int k0 = kt * BR;
        __syncthreads();                          /* Q staging read; last K, V and ss done */
        load_rows(ks, base + a.C, st, k0, BR, T);
        load_rows(vs, base + 2 * a.C, st, k0, BR, T);
        __syncthreads();
#pragma unroll
        for (int j = 0; j < BR / 16; j++) {       /* S = Q K^T: (16, 64) */
            frag_c sf;
            wmma::fill_fragment(sf, 0.0f);
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                frag_bc kf;
                wmma::load_matrix_sync(kf, ks + j * 16 * LDH + kk * 16, LDH);
                wmma::mma_sync(sf, qf[kk], kf, sf);
            }
            wmma::store_matrix_sync(sw + j * 16, sf, LDF, wmma::mem_row_major);
        }
        __syncwarp();
        softmax_tile(sw, pw, m, l, c, i0, k0, a.scale, lane);
        __syncwarp();                             /* S read, P written */
        /* O = diag(c) O, through shared memory (fragment layout unknown) */
#pragma unroll
        for (int j = 0; j < HD / 16; j++)
            wmma::store_matrix_sync(sw + j * 16, of[j], LDF, wmma::mem_row_major);
        __syncwarp();
#pragma unroll
        for (int r = 0; r < WR; r++) { sw[r * LDF + lane] *= c[r]; sw[r * LDF + lane + 32] *= c[r]; }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < HD / 16; j++) {       /* O += bf16(P) V */
            wmma::load_matrix_sync(of[j], sw + j * 16, LDF, wmma::mem_row_major);
            tile_acc<BR / 16>(of[j], pw, LDH, vs + j * 16);
        }
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < HD / 16; j++) wmma::store_matrix_sync(sw + j * 16, of[j], LDF, wmma::mem_row_major);
    __syncwarp();
#pragma unroll
    for (int r = 0; r < WR; r++) {
        if (i0 + r >= T) break;
        sw[r * LDF + lane] /= l[r];
        sw[r * LDF + lane + 32] /= l[r];
        if (lane == 0) lse[(size_t)blockIdx.y * T + i0 + r] = m[r] + logf(l[r]);  /* (B,NH,T) */
    }
    __syncwarp();
    put_rows(out + (size_t)b * T * a.C + (size_t)h * HD, a.C, sw, i0, T, lane);
}

/* D[(b*NH + h)*T + i] = sum over the head's 64 of dout * out (fp32), a warp per row */
__global__ static void k_tc_D(float *D, const float *dout, const float *out, tcp a, int rows)
{
    int row = blockIdx.x * NW + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    int i = row % a.T, h = (row / a.T) % a.NH, b = row / (a.T * a.NH);
    size_t off = ((size_t)b * a.T + i) * a.C + (size_t)h * HD;
    float s = dout[off + lane] * out[off + lane] + dout[off + lane + 32] * out[off + lane + 32];
    s = zkc_warp_sum(s);
    if (lane == 0) D[row] = s;
}

/* per warp in the backward kernels: two fp32 (16, LDF2) tiles and two
 * bf16 (16, LDH2) tiles; also holds a (16, LDF) fp32 tile at the end */
#define WBYTES (2 * WR * LDF2 * 4 + 2 * WR * LDH2 * 2)    /* 7168 B */
#define DKV_SMEM (2 * BC * LDH * 2 + NW * WBYTES)          /* 38144 B */
#define DQ_SMEM (2 * BC * LDH * 2 + NW * WBYTES)

/* p and dS of a (16, 32) tile: rows ri[r], columns ci[c] pair (query, key);
 * fp32 S, dP in s, dp (stride LDF2) -> bf16(p), bf16(dS) (stride LDH2).
 * ok: row/column pair is causal (key <= query < T); L, Dv: lse, D of it. */
__device__ __forceinline__ void grad_elem(const float *s, const float *dp, bf16 *pb, bf16 *db,
                                          int idx_f, int idx_h, bool ok, float L, float Dv,
                                          float scale)
{
    float p = ok ? expf(s[idx_f] * scale - L) : 0.0f;
    float ds = p * (dp[idx_f] - Dv) * scale;
    if (pb) pb[idx_h] = __float2bfloat16_rn(p);
    db[idx_h] = __float2bfloat16_rn(ds);
}

/* The backward's two products of a chunk, one warp: o1 = A1 B1^T and
 * o2 = A2 B2^T, (16, BC) fp32 at stride LDF2, where A1, A2 are the warp's
 * 16 rows as fragments over the head and B1, B2 the chunk's BC rows (bf16,
 * stride LDH) in shared memory. dK/dV: (K, V) against (Q, dout); dQ:
 * (Q, dout) against (K, V). */
__device__ __forceinline__ void chunk_products(float *o1, float *o2, const frag_a *a1,
                                               const frag_a *a2, const bf16 *b1, const bf16 *b2)
{
#pragma unroll
    for (int j = 0; j < BC / 16; j++) {
        frag_c f1, f2;
        wmma::fill_fragment(f1, 0.0f);
        wmma::fill_fragment(f2, 0.0f);
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            frag_bc x1, x2;
            wmma::load_matrix_sync(x1, b1 + j * 16 * LDH + kk * 16, LDH);
            wmma::load_matrix_sync(x2, b2 + j * 16 * LDH + kk * 16, LDH);
            wmma::mma_sync(f1, a1[kk], x1, f1);
            wmma::mma_sync(f2, a2[kk], x2, f2);
        }
        wmma::store_matrix_sync(o1 + j * 16, f1, LDF2, wmma::mem_row_major);
        wmma::store_matrix_sync(o2 + j * 16, f2, LDF2, wmma::mem_row_major);
    }
}

__global__ static void __launch_bounds__(NW * 32)
k_tc_dkv(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *D, tcp a)
{
    __shared__ __align__(128) unsigned char sm[DKV_SMEM];
    bf16 *qs = (bf16 *)sm, *gs = qs + BC * LDH;  /* (32, LDH): a chunk of Q and dout */
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, T = a.T;
    const int kt = blockIdx.x;                   /* tile 0 has the most queries: first */
    const int b = blockIdx.y / a.NH, h = blockIdx.y % a.NH, k0 = kt * BR, j0 = k0 + w * WR;
    const size_t st = 3 * (size_t)a.C;
    const float *base = qkv + (size_t)b * T * st + (size_t)h * HD;
    const float *gbase = dout + (size_t)b * T * a.C + (size_t)h * HD;
    const float *L = lse + (size_t)blockIdx.y * T, *Dr = D + (size_t)blockIdx.y * T;
    unsigned char *wb = sm + 2 * BC * LDH * 2;
    float *sT = (float *)(wb + w * WBYTES), *dpT = sT + WR * LDF2;   /* (16 keys, 32 queries) */
    bf16 *pT = (bf16 *)(dpT + WR * LDF2), *dsT = pT + WR * LDH2;

    frag_a kf[HD / 16], vf[HD / 16];              /* this warp's 16 keys and values */
    load_rows((bf16 *)wb, base + a.C, st, k0, BR, T);            /* staged in the warp areas */
    load_rows((bf16 *)wb + BR * LDH, base + 2 * a.C, st, k0, BR, T);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        wmma::load_matrix_sync(kf[kk], (bf16 *)wb + w * WR * LDH + kk * 16, LDH);
        wmma::load_matrix_sync(vf[kk], (bf16 *)wb + BR * LDH + w * WR * LDH + kk * 16, LDH);
    }
    frag_c dk[HD / 16], dv[HD / 16];
#pragma unroll
    for (int j = 0; j < HD / 16; j++) { wmma::fill_fragment(dk[j], 0.0f); wmma::fill_fragment(dv[j], 0.0f); }

    for (int qc = k0; qc < T; qc += BC) {         /* queries before k0 see none of these keys */
        __syncthreads();                          /* staging read; last chunk's Q, dout done */
        load_rows(qs, base, st, qc, BC, T);
        load_rows(gs, gbase, a.C, qc, BC, T);
        __syncthreads();
        chunk_products(sT, dpT, kf, vf, qs, gs);  /* S^T = K Q^T, dP^T = V dout^T: (16, 32) */
        __syncwarp();
        const int i = qc + lane;                  /* lane = query column */
        const float Li = i < T ? L[i] : 0.0f, Di = i < T ? Dr[i] : 0.0f;
#pragma unroll
        for (int r = 0; r < WR; r++)
            grad_elem(sT, dpT, pT, dsT, r * LDF2 + lane, r * LDH2 + lane,
                      i < T && i >= j0 + r, Li, Di, a.scale);
        __syncwarp();
#pragma unroll
        for (int j = 0; j < HD / 16; j++) {       /* dV += P^T dout, dK += dS^T Q: (16, 64) */
            tile_acc<BC / 16>(dv[j], pT, LDH2, gs + j * 16);
            tile_acc<BC / 16>(dk[j], dsT, LDH2, qs + j * 16);
        }
    }
    float *o = (float *)(wb + w * WBYTES);        /* (16, LDF) fits in the warp's area */
    float *drow = dqkv + (size_t)b * T * st + (size_t)h * HD;
    __syncwarp();
#pragma unroll
    for (int j = 0; j < HD / 16; j++) wmma::store_matrix_sync(o + j * 16, dk[j], LDF, wmma::mem_row_major);
    __syncwarp();
    put_rows(drow + a.C, st, o, j0, T, lane);
    __syncwarp();
#pragma unroll
    for (int j = 0; j < HD / 16; j++) wmma::store_matrix_sync(o + j * 16, dv[j], LDF, wmma::mem_row_major);
    __syncwarp();
    put_rows(drow + 2 * a.C, st, o, j0, T, lane);
}

__global__ static void __launch_bounds__(NW * 32)
k_tc_dq(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *D, tcp a)
{
    __shared__ __align__(128) unsigned char sm[DQ_SMEM];
    bf16 *ks = (bf16 *)sm, *vs = ks + BC * LDH;  /* (32, LDH): a chunk of K and V */
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, T = a.T;
    const int qt = gridDim.x - 1 - blockIdx.x;   /* the longest rows first */
    const int b = blockIdx.y / a.NH, h = blockIdx.y % a.NH, q0 = qt * BR, i0 = q0 + w * WR;
    const size_t st = 3 * (size_t)a.C;
    const float *base = qkv + (size_t)b * T * st + (size_t)h * HD;
    const float *gbase = dout + (size_t)b * T * a.C + (size_t)h * HD;
    unsigned char *wb = sm + 2 * BC * LDH * 2;
    float *sw = (float *)(wb + w * WBYTES), *dpw = sw + WR * LDF2;     /* (16 queries, 32 keys) */
    bf16 *dsw = (bf16 *)(dpw + WR * LDF2);

    frag_a qf[HD / 16], gf[HD / 16];              /* this warp's 16 queries and dout rows */
    load_rows((bf16 *)wb, base, st, q0, BR, T);
    load_rows((bf16 *)wb + BR * LDH, gbase, a.C, q0, BR, T);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        wmma::load_matrix_sync(qf[kk], (bf16 *)wb + w * WR * LDH + kk * 16, LDH);
        wmma::load_matrix_sync(gf[kk], (bf16 *)wb + BR * LDH + w * WR * LDH + kk * 16, LDH);
    }
    float Lr[WR], Dv[WR];                         /* lse, D of this warp's rows */
#pragma unroll
    for (int r = 0; r < WR; r++) {
        int i = i0 + r;
        Lr[r] = i < T ? lse[(size_t)blockIdx.y * T + i] : 0.0f;
        Dv[r] = i < T ? D[(size_t)blockIdx.y * T + i] : 0.0f;
    }
    frag_c dq[HD / 16];
#pragma unroll
    for (int j = 0; j < HD / 16; j++) wmma::fill_fragment(dq[j], 0.0f);

    const int kend = min(q0 + BR, T);             /* keys after the block's last row: none */
    for (int kc = 0; kc < kend; kc += BC) {
        __syncthreads();                          /* staging read; last chunk's K, V done */
        load_rows(ks, base + a.C, st, kc, BC, T);
        load_rows(vs, base + 2 * a.C, st, kc, BC, T);
        __syncthreads();
        chunk_products(sw, dpw, qf, gf, ks, vs);  /* S = Q K^T, dP = dout V^T: (16, 32) */
        __syncwarp();
        const int jk = kc + lane;                 /* lane = key column */
#pragma unroll
        for (int r = 0; r < WR; r++)
            grad_elem(sw, dpw, NULL, dsw, r * LDF2 + lane, r * LDH2 + lane,
                      jk <= i0 + r && i0 + r < T, Lr[r], Dv[r], a.scale);
        __syncwarp();
#pragma unroll
        for (int j = 0; j < HD / 16; j++)         /* dQ += dS K: (16, 64) */
            tile_acc<BC / 16>(dq[j], dsw, LDH2, ks + j * 16);
    }
    float *o = (float *)(wb + w * WBYTES);
    __syncwarp();
#pragma unroll
    for (int j = 0; j < HD / 16; j++) wmma::store_matrix_sync(o + j * 16, dq[j], LDF, wmma::mem_row_major);
    __syncwarp();
    put_rows(dqkv + (size_t)b * T * st + (size_t)h * HD, st, o, i0, T, lane);
}

/* hs = C/NH must be 64 (C == 64 NH); B*NH is the grid's y (<= 65535);
 * B*NH*T rows indexed by int */
static int tc_params(tcp *a, int B, int T, int C, int NH)
{
    if (B < 0 || T < 0 || NH <= 0 || C != HD * NH || (size_t)B * NH > 65535 ||
        (size_t)B * NH * T > (size_t)INT_MAX)
        return (int)cudaErrorInvalidValue;
    a->T = T; a->C = C; a->NH = NH;
    a->scale = 1.0f / sqrtf((float)HD);
    return 0;
}

extern "C" int zkc_attention_forward_tc(cudaStream_t s, float *out, float *lse, const float *qkv,
                                        int B, int T, int C, int NH)
{
    tcp a;
    int e = tc_params(&a, B, T, C, NH);
    if (e || B == 0 || T == 0) return e;
    dim3 g((unsigned)((T + BR - 1) / BR), (unsigned)(B * NH));
    k_tc_fwd<<<g, NW * 32, 0, s>>>(out, lse, qkv, a);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_attention_backward_tc(cudaStream_t s, float *dqkv, const float *dout,
                                         const float *qkv, const float *out, const float *lse,
                                         int B, int T, int C, int NH, float *scratch)
{
    tcp a;
    int e = tc_params(&a, B, T, C, NH);
    if (e || B == 0 || T == 0) return e;
    int rows = B * NH * T;
    k_tc_D<<<(unsigned)((rows + NW - 1) / NW), NW * 32, 0, s>>>(scratch, dout, out, a, rows);
    if ((e = ZKC_LAUNCHED())) return e;
    dim3 g((unsigned)((T + BR - 1) / BR), (unsigned)(B * NH));
    k_tc_dkv<<<g, NW * 32, 0, s>>>(dqkv, dout, qkv, lse, scratch, a);
    if ((e = ZKC_LAUNCHED())) return e;
    k_tc_dq<<<g, NW * 32, 0, s>>>(dqkv, dout, qkv, lse, scratch, a);
    return ZKC_LAUNCHED();
}
