/* attention_tc_fwd.cu -- the tensor-core attention's forward: k_tc_fwd (16
 * query rows a warp; head size 128 wide: 8 warps) and k_tc_fwd_pair (32
 * rows a warp), their switches and launch (kernels.cuh). The design, the
 * numerics and the resources: attention_tc.cuh. */
#include "attention_tc.cuh"

/* The forward's warps a block: 8 (128 query rows) at head size 64, so that
 * a K, V tile read from L2 serves twice the rows (64 FLOP a byte of fp32
 * K, V); 4 at 128 (its registers) */
template <int HD> struct fwd_cfg { enum { NWF = HD == 64 ? 8 : 4, BRF = NWF * 16, MINB = HD == 64 ? 2 : 3 }; };
/* Head size 128 wide (zkc_attention_tc_fwd_wide(1), off by default until a
 * GPU has timed it): 8 warps, 128 rows a block as at 64 (a K, V tile read
 * from L2 serves twice the rows: 64 FLOP a byte of bf16 K, V, not 32), Q
 * in registers, the next tile prefetched; 1 block an SM (its registers) */
template <int HD, int NWF> struct fwd_minb { enum { v = NWF == fwd_cfg<HD>::NWF ? fwd_cfg<HD>::MINB : 1 }; };

/* a forward block's rows 0 of batch b: query head h's q, and k, v of its
 * kv head (h / G); row stride a.R */
template <int HD, class IO>
__device__ __forceinline__ void head_rows(const IO *qkv, const tcp &a, int b, int h, const IO *&q,
                                          const IO *&k, const IO *&v)
{
    q = qkv + (size_t)b * a.T * a.R + (size_t)h * HD;
    k = qkv + (size_t)b * a.T * a.R + a.C + (size_t)(h / a.G) * HD;
    v = k + (size_t)a.NKV * HD;
}

template <int HD, class IO, bool WIN, int NWF>
__global__ static void __launch_bounds__(NWF * 32, WIN ? 1 : fwd_minb<HD, NWF>::v)
k_tc_fwd(IO *out, float *lse, const IO *qkv, tcp a)
{
    enum { LD = HD + 8, KS = HD / 16, BC = 64, NS = BC / 8, ND = HD / 8, BRF = NWF * 16,
           NTH = NWF * 32 };
    enum { QREG = HD == 128 };                    /* Q fragments: registers, or read each tile */
    /* K and V tiles adjacent: QREG stages Q's BRF <= 128 rows across both */
    __shared__ __align__(16) bf16 qs[QREG ? 8 : BRF * LD], kvs[2 * BC * LD];
    bf16 *const ks = kvs, *const vs = kvs + BC * LD;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3, T = a.T;
    const int qt = gridDim.x - 1 - blockIdx.x;   /* the longest rows first */
    const int b = blockIdx.y / a.NH, h = blockIdx.y % a.NH, q0 = qt * BRF, r0 = q0 + w * 16;
    const int i0 = r0 + g, i1 = i0 + 8;          /* this lane's two rows */
    const size_t st = a.R;
    const IO *base, *kb, *vb;                    /* q of (b, 0, h); its kv head's k, v */
    head_rows<HD>(qkv, a, b, h, base, kb, vb);
    const float sl2 = a.scale * LOG2E;
    const lane_offs lo = lane_offsets<LD>(lane);
    const zkc_sptr qp = zkc_sptr_of(qs), kp = zkc_sptr_of(ks), vp = zkc_sptr_of(vs);

    uint32_t qr[QREG ? KS : 1][4];                /* the warp's 16 queries (QREG) */
    static_assert(!QREG || BRF <= 2 * BC, "Q's stage: the K and V tiles");
    if (QREG) {                                   /* staged in ks, vs */
        load_tile<BRF, HD, NTH>(ks, base, st, q0, T);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < (QREG ? KS : 1); kk++) frag_a<LD>(qr[kk], kp + lo.a, w * 16, kk * 16);
    } else {
        load_tile<BRF, HD, NTH>(qs, base, st, q0, T);
    }
    float o[ND][4], m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f };
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    /* PIPE (8 warps: head size 64, and 128 wide): the next tile's K loads fly during this tile's
     * S and softmax, its V loads during P V; 3 barriers a tile */
    enum { PIPE = NWF == 8, NP = PIPE ? BC * HD / chunk<IO>::E / NTH : 1 };
    if (QREG && PIPE) __syncthreads();            /* every warp's Q read from the stage */
    const int kend = min(q0 + BRF, T);            /* causal: keys after the block's last row skipped */
    const int kstart = WIN ? win_start(a, q0, BC) : 0;   /* a window: tiles before every row's skipped */
    if (PIPE) load_tiles<BC, HD, NTH>(ks, kb, st, vs, vb, st, kstart, T);
    for (int k0 = kstart; k0 < kend; k0 += BC) {
        /* active: keys <= a row of the warp (and inside a row's window) */
        const bool more = k0 + BC < kend,
                   active = k0 <= r0 + 15 && (!WIN || k0 + BC + a.W > r0 + 1);
        if (!PIPE) {
            __syncthreads();                      /* the last tile's K, V (or Q) read */
            load_tiles<BC, HD, NTH>(ks, kb, st, vs, vb, st, k0, T);
        }
        __syncthreads();                          /* this tile's K, V (and Q) stored */
        typename chunk<IO>::V pre[NP];            /* PIPE: the next tile's K, then V */
        if (PIPE && more) ldg_rows<BC, HD, NTH>(pre, kb, st, k0 + BC, T);
        uint32_t pf[NS / 2][4];                   /* bf16(p) as A fragments */
        if (active) {
            float s[NS][4];                       /* S = Q K^T: (16, 64), raw scores */
#pragma unroll
            for (int n = 0; n < NS; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                uint32_t qf[4];
                if (QREG) { qf[0] = qr[kk % (QREG ? KS : 1)][0]; qf[1] = qr[kk % (QREG ? KS : 1)][1];
                            qf[2] = qr[kk % (QREG ? KS : 1)][2]; qf[3] = qr[kk % (QREG ? KS : 1)][3]; }
                else frag_a<LD>(qf, qp + lo.a, w * 16, kk * 16);
#pragma unroll
                for (int np = 0; np < NS / 2; np++) {
                    uint32_t bf[4];
                    frag_b_nk<LD>(bf, kp + lo.nk, np * 16, kk * 16);
                    zkc_mma_bf16_16816(s[2 * np], qf, bf);
                    zkc_mma_bf16_16816(s[2 * np + 1], qf, bf + 2);
                }
            }
            if (k0 + BC - 1 > r0) {               /* the diagonal: key after the row */
#pragma unroll
                for (int n = 0; n < NS; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (k0 + n * 8 + 2 * t + (e & 1) > (e < 2 ? i0 : i1)) s[n][e] = -INFINITY;
            }
            if (WIN && k0 + a.W <= r0 + 15) {     /* keys at or before a row - W */
#pragma unroll
                for (int n = 0; n < NS; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (k0 + n * 8 + 2 * t + (e & 1) + a.W <= (e < 2 ? i0 : i1)) s[n][e] = -INFINITY;
            }
            float mx[2] = { m[0], m[1] }, c[2];
#pragma unroll
            for (int n = 0; n < NS; n++) {
                mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
                mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
            }
#pragma unroll
            for (int r = 0; r < 2; r++) {         /* no window: key k0 <= row on the first tile, finite */
                mx[r] = quad_max(mx[r]);
                /* a window: a row may have no key yet (m and mx -inf): then
                 * p = 0 and c = 0 (its o, l are 0), not NaN */
                const float mu = WIN && mx[r] == -INFINITY ? 0.0f : mx[r];
                c[r] = zkc_exp2((m[r] - mu) * sl2);   /* 0 on the first tile (m = -inf) */
                m[r] = mx[r];
                mx[r] = mu * sl2;
                l[r] *= c[r];
            }
#pragma unroll
            for (int n = 0; n < NS; n++)          /* p = exp(scale (s - m)), fp32 */
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[n][e] = zkc_exp2(fmaf(s[n][e], sl2, -mx[e >> 1]));
                    l[e >> 1] += s[n][e];         /* this lane's part of the row sum */
                }
#pragma unroll
            for (int n = 0; n < ND; n++) {
                o[n][0] *= c[0]; o[n][1] *= c[0]; o[n][2] *= c[1]; o[n][3] *= c[1];
            }
            c_to_a<NS / 2>(pf, s);
        }
        if (PIPE) {
            __syncthreads();                      /* every warp's S read K */
            if (more) {
                sts_rows<BC, HD, NTH, IO>(ks, pre);
                ldg_rows<BC, HD, NTH>(pre, vb, st, k0 + BC, T);
            }
        }
        if (active) mma_reg_kn<NS / 2, ND, LD>(o, pf, vp + lo.kn);   /* O += bf16(P) V */
        if (PIPE) {
            __syncthreads();                      /* every warp's P V read V */
            if (more) sts_rows<BC, HD, NTH, IO>(vs, pre);
        }
    }
    const float lt[2] = { quad_sum(l[0]), quad_sum(l[1]) };
    const int rows[2] = { i0, i1 };
    IO *ob = out + (size_t)b * T * a.C + (size_t)h * HD + 2 * t;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (rows[r] >= T) continue;
        const float inv = 1.0f / lt[r];
#pragma unroll
        for (int n = 0; n < ND; n++)
            stg_pair(ob + (size_t)rows[r] * a.C + n * 8, o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
        if (t == 0) lse[(size_t)blockIdx.y * T + rows[r]] = m[r] * a.scale + logf(lt[r]);  /* (B,NH,T) */
    }
}

/* The forward with a pair of m-tiles a warp (zkc_attention_tc_fwd_pair(1),
 * off by default until a GPU has timed it; FlashAttention-2's shape on an
 * H100): 4 warps of 32 query rows, 128 rows a block at head size 64 and
 * 128. A warp's K and V fragments serve both of its m-tiles, so a tile
 * takes 0.31 ldmatrix an mma (Q read from shared memory each tile) where
 * k_tc_fwd's 16 rows a warp take 0.5-0.56; each K, V tile read from L2
 * serves 128 rows. The next tile's K and V are staged into a second buffer
 * while this one computes (io16 by cp.async; fp32 loaded and rounded at
 * the stage): one barrier a tile. Shared memory: Q (128 rows) and two K, V
 * buffers, (128 + 4 x 64) (HD + 8) bf16: 54 KB at head size 64, 102 KB at
 * 128 (dynamic, opted into; 2 blocks an SM). Each m-tile takes the tiles
 * k_tc_fwd's warp of the same 16 rows takes (the same activity test), in
 * the same order, with the same operations, so out and lse keep its bits. */
template <int HD> struct fwdp_cfg {
    enum { NTH = 128, BRF = 128, BC = 64, LD = HD + 8, SMEM = (BRF + 4 * BC) * LD * 2 };
};

/* One key tile of the pair forward for the warp's first NM m-tiles (the
 * active ones: both, or with a window the first alone; each case its own
 * code, so that no mma sits under a per-m-tile branch, which made ptxas put
 * a WARPSYNC before each): S = Q K^T, the masks, the online softmax, O +=
 * bf16(P) V, each as k_tc_fwd's. qp, kp, vp: the tiles' addresses plus the
 * lane's a, nk and kn offsets. */
template <int NM, int HD, bool WIN>
__device__ __forceinline__ void pair_tile(float (&o)[2][HD / 8][4], float (&m)[2][2], float (&l)[2][2],
                                          zkc_sptr qp, zkc_sptr kp, zkc_sptr vp, const tcp &a,
                                          int k0, int r0, float sl2)
{
    enum { LD = HD + 8, KS = HD / 16, BC = 64, NS = BC / 8, ND = HD / 8,
           /* m-tiles a score pass: all at head size 64 (each K fragment
            * serves them); at 128 one at a time (S of both beside O, 192
            * registers, spilled) */
           MS = HD == 64 ? NM : 1 };
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane >> 2, t = lane & 3;
    uint32_t pf[NM][NS / 2][4];                   /* bf16(p) as A fragments */
#pragma unroll
    for (int ps = 0; ps < NM / MS; ps++) {
        float s[MS][NS][4];                       /* S = Q K^T: (16 MS, 64), raw scores */
#pragma unroll
        for (int j = 0; j < MS; j++)
#pragma unroll
            for (int n = 0; n < NS; n++) s[j][n][0] = s[j][n][1] = s[j][n][2] = s[j][n][3] = 0.0f;
#pragma unroll 1                                /* rolled: unrolled, ptxas hoists the fragments and spills */
        for (int kk = 0; kk < KS; kk++) {
            uint32_t qf[MS][4];
#pragma unroll
            for (int j = 0; j < MS; j++) frag_a<LD>(qf[j], qp, w * 32 + 16 * (ps * MS + j), kk * 16);
#pragma unroll
            for (int np = 0; np < NS / 2; np++) {
                uint32_t bf[4];
                frag_b_nk<LD>(bf, kp, np * 16, kk * 16);
#pragma unroll
                for (int j = 0; j < MS; j++) {
                    zkc_mma_bf16_16816(s[j][2 * np], qf[j], bf);
                    zkc_mma_bf16_16816(s[j][2 * np + 1], qf[j], bf + 2);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < MS; j++) {
            const int mt = ps * MS + j, rm = r0 + 16 * mt, i0 = rm + g, i1 = i0 + 8;
            if (k0 + BC - 1 > rm) {               /* the diagonal: key after the row */
#pragma unroll
                for (int n = 0; n < NS; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (k0 + n * 8 + 2 * t + (e & 1) > (e < 2 ? i0 : i1)) s[j][n][e] = -INFINITY;
            }
            if (WIN && k0 + a.W <= rm + 15) {     /* keys at or before a row - W */
#pragma unroll
                for (int n = 0; n < NS; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (k0 + n * 8 + 2 * t + (e & 1) + a.W <= (e < 2 ? i0 : i1)) s[j][n][e] = -INFINITY;
            }
            float mx[2] = { m[mt][0], m[mt][1] }, c[2];
#pragma unroll
            for (int n = 0; n < NS; n++) {
                mx[0] = fmaxf(mx[0], fmaxf(s[j][n][0], s[j][n][1]));
                mx[1] = fmaxf(mx[1], fmaxf(s[j][n][2], s[j][n][3]));
            }
#pragma unroll
            for (int r = 0; r < 2; r++) {         /* as k_tc_fwd */
                mx[r] = quad_max(mx[r]);
                const float mu = WIN && mx[r] == -INFINITY ? 0.0f : mx[r];
                c[r] = zkc_exp2((m[mt][r] - mu) * sl2);
                m[mt][r] = mx[r];
                mx[r] = mu * sl2;
                l[mt][r] *= c[r];
            }
#pragma unroll
            for (int n = 0; n < NS; n++)          /* p = exp(scale (s - m)), fp32 */
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[j][n][e] = zkc_exp2(fmaf(s[j][n][e], sl2, -mx[e >> 1]));
                    l[mt][e >> 1] += s[j][n][e];
                }
#pragma unroll
            for (int n = 0; n < ND; n++) {
                o[mt][n][0] *= c[0]; o[mt][n][1] *= c[0]; o[mt][n][2] *= c[1]; o[mt][n][3] *= c[1];
            }
            c_to_a<NS / 2>(pf[mt], s[j]);
        }
    }
    /* O += bf16(P) V: each V fragment for every m-tile */
#pragma unroll
    for (int kk = 0; kk < NS / 2; kk++)
#pragma unroll
        for (int np = 0; np < ND / 2; np++) {
            uint32_t bf[4];
            frag_b_kn<LD>(bf, vp, kk * 16, np * 16);
#pragma unroll
            for (int j = 0; j < NM; j++) {
                zkc_mma_bf16_16816(o[j][2 * np], pf[j][kk], bf);
                zkc_mma_bf16_16816(o[j][2 * np + 1], pf[j][kk], bf + 2);
            }
        }
}

/* Head size 128's pair is built for sm_90 (the H100 and H200 it is for):
 * on sm_80 ptxas spilled it at 255 registers. There its kernel traps, and
 * the launcher takes the default blocks (the same bits). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define ZKC_PAIR128 0
#else
#define ZKC_PAIR128 1
#endif

template <int HD, class IO, bool WIN>
__device__ __forceinline__ void fwd_pair(IO *out, float *lse, const IO *qkv, const tcp &a)
{
    enum { LD = HD + 8, BC = 64, ND = HD / 8, BRF = fwdp_cfg<HD>::BRF, NTH = fwdp_cfg<HD>::NTH };
    /* shared: Q (BRF, LD), then K, V of buffer 0, K, V of buffer 1 (BC, LD) */
    bf16 *const qs = (bf16 *)zkc_dyn_smem(), *const kv = qs + BRF * LD;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3, T = a.T;
    const int qt = gridDim.x - 1 - blockIdx.x;   /* the longest rows first */
    const int b = blockIdx.y / a.NH, h = blockIdx.y % a.NH, q0 = qt * BRF, r0 = q0 + w * 32;
    const size_t st = a.R;
    const IO *base, *kb, *vb;                    /* q of (b, 0, h); its kv head's k, v */
    head_rows<HD>(qkv, a, b, h, base, kb, vb);
    const float sl2 = a.scale * LOG2E;
    const lane_offs lo = lane_offsets<LD>(lane);
    const zkc_sptr qp = zkc_sptr_of(qs) + lo.a;

    float o[2][ND][4], m[2][2], l[2][2];         /* m-tile mt: rows r0 + 16 mt + g, + 8 */
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
        for (int n = 0; n < ND; n++) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
    }
    const int kend = min(q0 + BRF, T);            /* causal: keys after the block's last row skipped */
    const int kstart = WIN ? win_start(a, q0, BC) : 0;   /* a window: tiles before every row's skipped */
    auto stage = [&](int k0, int buf) {           /* tile k0's K, V into buffer buf */
        bf16 *ks = kv + buf * 2 * BC * LD;
        stage_rows<BC, HD, NTH>(ks, kb, st, k0, T);
        stage_rows<BC, HD, NTH>(ks + BC * LD, vb, st, k0, T);
    };
    stage_rows<BRF, HD, NTH>(qs, base, st, q0, T);
    stage(kstart, 0);
    zkc_cp_async_commit();
    for (int k0 = kstart, buf = 0; k0 < kend; k0 += BC, buf ^= 1) {
        zkc_cp_async_wait_all();
        __syncthreads();                          /* this tile (and Q) staged; the other buffer's last reads done */
        if (k0 + BC < kend) {
            stage(k0 + BC, buf ^ 1);
            zkc_cp_async_commit();
        }
        /* an m-tile is active where k_tc_fwd's warp of its rows is */
        bool act[2];
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            const int rm = r0 + 16 * mt;
            act[mt] = k0 <= rm + 15 && (!WIN || k0 + BC + a.W > rm + 1);
        }
        const zkc_sptr kp = zkc_sptr_of(kv + buf * 2 * BC * LD), vp = kp + BC * LD * 2;
        /* Without a window both m-tiles are active or neither (a tile starts
         * at a multiple of 64, a warp's rows at one of 32: no tile starts
         * inside a warp's rows after its first m-tile). With one, the second
         * m-tile's window starts later: it alone may be inactive. */
        if (act[0] && act[1])
            pair_tile<2, HD, WIN>(o, m, l, qp, kp + lo.nk, vp + lo.kn, a, k0, r0, sl2);
        else if (WIN && act[0])
            pair_tile<1, HD, WIN>(o, m, l, qp, kp + lo.nk, vp + lo.kn, a, k0, r0, sl2);
    }
    /* from blockIdx again: b, h kept across the loop spilled at head size 128 */
    IO *ob = out + (size_t)(blockIdx.y / a.NH) * T * a.C + (size_t)(blockIdx.y % a.NH) * HD + 2 * t;
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
        const float lt[2] = { quad_sum(l[mt][0]), quad_sum(l[mt][1]) };
        const int rows[2] = { r0 + 16 * mt + g, r0 + 16 * mt + g + 8 };
#pragma unroll
        for (int r = 0; r < 2; r++) {
            if (rows[r] >= T) continue;
            const float inv = 1.0f / lt[r];
#pragma unroll
            for (int n = 0; n < ND; n++)
                stg_pair(ob + (size_t)rows[r] * a.C + n * 8, o[mt][n][2 * r] * inv, o[mt][n][2 * r + 1] * inv);
            if (t == 0) lse[(size_t)blockIdx.y * T + rows[r]] = m[mt][r] * a.scale + logf(lt[r]);
        }
    }
}

template <int HD, class IO, bool WIN>
__global__ static void __launch_bounds__(fwdp_cfg<HD>::NTH, 2)
k_tc_fwd_pair(IO *out, float *lse, const IO *qkv, tcp a)
{
    if constexpr (HD == 128 && !ZKC_PAIR128) __trap();
    else fwd_pair<HD, IO, WIN>(out, lse, qkv, a);
}

/* Head size 128's forward (kernels.cuh): 0 4 warps, 64 rows a block (the
 * default), 1 wide (fwd_minb); -1 asks. Read at each launch. */
static int fwd_wide_on = 0;
extern "C" int zkc_attention_tc_fwd_wide(int on)
{
    if (on == 0 || on == 1) fwd_wide_on = on;
    return fwd_wide_on;
}

/* The forward's warps (kernels.cuh): 0 16 query rows a warp (k_tc_fwd,
 * the default), 1 a pair of m-tiles, 32 rows (k_tc_fwd_pair, both head
 * sizes, over fwd_wide_on), taken only where the current GPU grants head
 * size 64's shared memory (else the setting stays 0); -1 asks. Read at each
 * launch. Head size 128 takes it where its shared memory is granted too and
 * the code loaded for its kernel was compiled for sm_90 or later (the PTX
 * version, not the GPU's: an sm_80-only build JIT-compiled on an H100 has
 * the trapping kernel, ZKC_PAIR128); else the default blocks, the same bits. */
static int fwd_pair_on = 0;
static bool pair128_ok;
extern "C" int zkc_attention_tc_fwd_pair(int on)
{
    if (on == 0 || (on == 1 && smem_fits((int)fwdp_cfg<64>::SMEM))) fwd_pair_on = on;
    if (on == 1 && fwd_pair_on) {
        cudaFuncAttributes fa;
        pair128_ok = smem_fits((int)fwdp_cfg<128>::SMEM) &&
                     cudaFuncGetAttributes(&fa, k_tc_fwd_pair<128, uint16_t, false>) == cudaSuccess &&
                     fa.ptxVersion >= 90;
        (void)cudaGetLastError();
    }
    return fwd_pair_on;
}

template <int HD, class IO>
static int tc_forward(cudaStream_t s, IO *out, float *lse, const IO *qkv, int B, tcp a)
{
    /* the pair at head size 128 with bf16 I/O on sm_90 only (fp32's
     * staging registers, and sm_80, spilled it; the default blocks give the
     * same bits) */
    if constexpr (HD == 64 || sizeof(IO) == 2) if (fwd_pair_on && (HD == 64 || pair128_ok)) {
        enum { BRF = fwdp_cfg<HD>::BRF, SMEM = fwdp_cfg<HD>::SMEM };
        dim3 g((unsigned)((a.T + BRF - 1) / BRF), (unsigned)(B * a.NH));
        const int smem = (int)SMEM;
        int e = a.W > 0 ? opt_in(k_tc_fwd_pair<HD, IO, true>, smem) : opt_in(k_tc_fwd_pair<HD, IO, false>, smem);
        if (e) return e;
        if (a.W > 0)
            k_tc_fwd_pair<HD, IO, true><<<g, fwdp_cfg<HD>::NTH, smem, s>>>(out, lse, qkv, a);
        else
            k_tc_fwd_pair<HD, IO, false><<<g, fwdp_cfg<HD>::NTH, smem, s>>>(out, lse, qkv, a);
        return ZKC_LAUNCHED();
    }
    if constexpr (HD == 128) {
        if (fwd_wide_on) {
            dim3 g((unsigned)((a.T + 127) / 128), (unsigned)(B * a.NH));
            if (a.W > 0)
                k_tc_fwd<HD, IO, true, 8><<<g, 8 * 32, 0, s>>>(out, lse, qkv, a);
            else
                k_tc_fwd<HD, IO, false, 8><<<g, 8 * 32, 0, s>>>(out, lse, qkv, a);
            return ZKC_LAUNCHED();
        }
    }
    enum { NWF = fwd_cfg<HD>::NWF, BRF = fwd_cfg<HD>::BRF };
    dim3 g((unsigned)((a.T + BRF - 1) / BRF), (unsigned)(B * a.NH));
    if (a.W > 0)
        k_tc_fwd<HD, IO, true, NWF><<<g, NWF * 32, 0, s>>>(out, lse, qkv, a);
    else
        k_tc_fwd<HD, IO, false, NWF><<<g, NWF * 32, 0, s>>>(out, lse, qkv, a);
    return ZKC_LAUNCHED();
}

template <class IO>
static int tc_forward_io(cudaStream_t s, IO *out, float *lse, const IO *qkv, int B, tcp a)
{
    return a.C / a.NH == 64 ? tc_forward<64>(s, out, lse, qkv, B, a) : tc_forward<128>(s, out, lse, qkv, B, a);
}

/* grouped-query heads (NKV kv heads, NH % NKV == 0) and a sliding window
 * W >= 0 (0: plain causal) */
extern "C" int zkc_attention_forward_tc_gqa(cudaStream_t s, void *out, float *lse, const void *qkv,
                                            int io16, int B, int T, int C, int NH, int NKV, int W)
{
    tcp a;
    int e = tc_params(&a, B, T, C, NH, NKV, W);
    if (e || B == 0 || T == 0) return e;
    if (!tc_aligned(out) || !tc_aligned(qkv)) return (int)cudaErrorInvalidValue;
    return io16 ? tc_forward_io(s, (uint16_t *)out, lse, (const uint16_t *)qkv, B, a)
                : tc_forward_io(s, (float *)out, lse, (const float *)qkv, B, a);
}

extern "C" int zkc_attention_forward_tc(cudaStream_t s, void *out, float *lse, const void *qkv,
                                        int io16, int B, int T, int C, int NH)
{
    return zkc_attention_forward_tc_gqa(s, out, lse, qkv, io16, B, T, C, NH, NH, 0);
}

