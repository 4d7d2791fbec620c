/* attention_tc_bwd.cu -- the tensor-core attention's backward: dQ by its
 * own pass (k_tc_dq) or ordered in the dK/dV kernel (k_tc_dkv, head size
 * wide: k_tc_dkv_wide), D (k_tc_D), their switches and launch
 * (kernels.cuh). Built again with -DZKC_ATTN_TC_DQ_ATOMIC for
 * bench_cuda_dqatomic. The design, the numerics and the resources:
 * attention_tc.cuh. */
#include "attention_tc.cuh"

/* -DZKC_ATTN_TC_DQ_ATOMIC: the non-deterministic variant, built only to
 * price determinism on a GPU (not in any build by default): k_tc_dkv also
 * adds each chunk's dQ part (bf16(dS)^T K over its 64 keys) into dqkv with
 * fp32 atomicAdd (5 matmul-equivalents in all, FA2's scheme), after
 * k_tc_D has zeroed dQ and written D; no k_tc_dq. The ordered dQ is the
 * same kernel with the adds in a fixed order instead. */
#ifdef ZKC_ATTN_TC_DQ_ATOMIC
#define DQA 1
#else
#define DQA 0
#endif

/* DQA's atomics add into fp32 dQ: an fp32 dqkv only (the launcher refuses
 * an io16 backward in that build) */
template <class IO> struct dq_atomic { enum { on = 0 }; };
template <> struct dq_atomic<float> { enum { on = DQA }; };

/* The backward's inner chunk (queries for dK, dV; keys for dQ) */
template <int HD> struct tc_cfg {
    enum { CH = HD == 64 ? 64 : 16, LD = HD + 8,
           /* blocks an SM: register caps (a dK/dV kernel that also makes
            * the dQ parts, DQA's or the ordered one: at 3 blocks its head
            * size 64 spilled on sm_90) */
           MINB_DKV = HD == 64 && !DQA ? 3 : 2, MINB_ORD = 2 };
};
/* The dQ kernel: 128 query rows (8 warps) and key chunks of 32 at head size
 * 64, so that a K, V chunk read from L2 serves twice the rows; 64 rows and
 * chunks of 16 at 128 */
template <int HD> struct dq_cfg {
    enum { NWQ = HD == 64 ? 8 : 4, CH = HD == 64 ? 32 : 16, MINB = HD == 64 ? 2 : 3 };
};

/* a block's ticket (mma.cuh): thread 0 takes it, every thread returns it */
__device__ __forceinline__ int block_ticket(int *cnt)
{
    __shared__ int tick;
    if (threadIdx.x == 0) tick = zkc_ticket(cnt);
    __syncthreads();
    return tick;
}

/* DQA: the block's part of the chunk (this lane's rows qi, n-tiles n0 ..
 * n0 + NQ - 1) added into an fp32 dqkv by atomics, in whatever order */
template <int HD, int NQ, class IO>
__device__ __forceinline__ void atomic_add_part(IO *dqkv, const float (*dq)[4], const tcp &a, int b,
                                                int h, const int qi[2], int n0)
{
    const int t = threadIdx.x % 32 & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (qi[r] >= a.T) continue;
        float *q = (float *)dqkv + ((size_t)b * a.T + qi[r]) * a.R + (size_t)h * HD + 2 * t;
#pragma unroll
        for (int n = 0; n < NQ; n++) {
            atomicAdd(q + (n0 + n) * 8, dq[n][2 * r]);
            atomicAdd(q + (n0 + n) * 8 + 1, dq[n][2 * r + 1]);
        }
    }
}

/* ORD: where key tile kt stands in dQ chunk c's order (queries [c CH,
 * c CH + CH) of head h): the chunk's count, the value it holds once the
 * tiles before kt have added theirs (J - kt: the chunk's own tile J first,
 * then down to the lowest that reaches it, jlo: 0, or the window's), and
 * whether kt is the first (it writes the sum) or the last (it writes
 * dqkv in IO) */
struct ord_at { int *ct; int expect; bool first, last; };
__device__ __forceinline__ ord_at ordered_at(int *cnt, const tcp &a, int b, int h, int c, int nch,
                                            int kt, int CH, int BK = BR)
{
    const int qc = c * CH, J = qc / BK, lo = qc - (BK - 1) - a.W;   /* key tiles of BK */
    const int jlo = a.W > 0 && lo >= 0 ? lo / BK + 1 : 0;
    ord_at o = { cnt + 1 + ((size_t)b * a.NH + h) * nch + c, J - kt, kt == J, kt == jlo };
    return o;
}

/* ORD: the block's part of the chunk, this lane's rows qi and n-tiles n0 ..
 * n0 + NQ - 1, added once the count says so (the caller waited): acc holds
 * the running sum in fp32 (dqkv's q part itself when IO is fp32, the
 * scratch's (B, T, C) when bf16); the first tile writes it, the last writes
 * dqkv. The caller bumps the count once every thread's stores are done
 * (at its next barrier). */
template <int HD, int NQ, class IO>
__device__ __forceinline__ void ordered_add(IO *dqkv, float *acc, const float (*dq)[4],
                                            const tcp &a, int b, int h, const ord_at &oa,
                                            const int qi[2], int n0)
{
    const size_t ast = sizeof(IO) == 4 ? a.R : (size_t)a.C;
    const int t = threadIdx.x % 32 & 3;
    float *ap[2];
    float2 o[2][NQ];                              /* both rows' loads in flight, then the stores */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        ap[r] = acc + ((size_t)b * a.T + qi[r]) * ast + (size_t)h * HD + 2 * t + n0 * 8;
#pragma unroll
        for (int n = 0; n < NQ; n++)
            o[r][n] = oa.first || qi[r] >= a.T ? make_float2(0.0f, 0.0f) : zkc_ldcg2(ap[r] + n * 8);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (qi[r] >= a.T) continue;
        IO *dp = dqkv + ((size_t)b * a.T + qi[r]) * a.R + (size_t)h * HD + 2 * t + n0 * 8;
#pragma unroll
        for (int n = 0; n < NQ; n++) {
            const float x = oa.first ? dq[n][2 * r] : o[r][n].x + dq[n][2 * r];
            const float y = oa.first ? dq[n][2 * r + 1] : o[r][n].y + dq[n][2 * r + 1];
            if (oa.last) stg_pair(dp + n * 8, x, y);
            else zkc_stcg2(ap[r] + n * 8, x, y);
        }
    }
}

/* dK, dV of 64 keys (a warp's 16 keys each) over chunks of CH queries from
 * the block's first key to T. Per chunk and warp: S^T = K Q^T, dP^T = V
 * dO^T (16, CH); P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - D) scale;
 * dV += bf16(P^T) dO, dK += bf16(dS^T) Q (16, HD) in registers. */
template <int HD, class IO, bool WIN, bool ORD>
__global__ static void __launch_bounds__(NW * 32, WIN ? 1 : ORD ? tc_cfg<HD>::MINB_ORD : tc_cfg<HD>::MINB_DKV)
k_tc_dkv(IO *dqkv, const IO *dout, const IO *qkv, const float *lse, const float *D, float *acc,
         int *cnt, tcp a)
{
    enum { CH = tc_cfg<HD>::CH, LD = HD + 8, KS = HD / 16, NC = CH / 8, ND = HD / 8,
           /* Q, dO: 16-byte loads a thread and matrix per batch, fp32 4,
            * bf16 2 (io16: 16 staging registers; 4 spilled k_tc_dkv<64>
            * at its 168-register cap) */
           LBQ = sizeof(IO) == 2 ? 2 : 4 };
    constexpr bool ATOM = dq_atomic<IO>::on && !ORD, DQP = ATOM || ORD;   /* dQ parts made here */
    __shared__ __align__(16) bf16 ks[BR * LD], vs[BR * LD], qs[CH * LD], gs[CH * LD];
    __shared__ float ls[CH], dsm[CH];            /* the chunk's lse log2(e) and D */
    enum { LQ = CH + 8 };
    __shared__ __align__(16) bf16 dss[DQP ? BR * LQ : 8];  /* dQ parts: bf16(dS^T), keys x queries */
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3, T = a.T;
    /* the plain order: blockIdx, tile 0 (the most queries) first; ORD: the
     * order the blocks started, a (b, kv head)'s tiles last to first */
    const unsigned tk = ORD ? (unsigned)block_ticket(cnt) : 0u;   /* (unsigned: blockIdx's */
    const int kt = ORD ? gridDim.x - 1 - tk % gridDim.x : blockIdx.x;   /* division; a signed */
    const unsigned by = ORD ? tk / gridDim.x : blockIdx.y;         /* one spilled <64, bf16>) */
    const int b = by / a.NKV, kh = by % a.NKV, k0 = kt * BR;   /* kv head kh */
    const int j0 = k0 + w * 16 + g, j1 = j0 + 8;  /* this lane's two keys */
    const size_t st = a.R;
    const IO *kb = qkv + (size_t)b * T * st + a.C + (size_t)kh * HD, *vb = kb + (size_t)a.NKV * HD;
    const float sl2 = a.scale * LOG2E;
    const lane_offs lo = lane_offsets<LD>(lane);
    const zkc_sptr kp = zkc_sptr_of(ks), vp = zkc_sptr_of(vs), qp = zkc_sptr_of(qs), gp = zkc_sptr_of(gs);

    load_tiles<BR, HD, NW * 32>(ks, kb, st, vs, vb, st, k0, T);
    float dk[ND][4], dv[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;

    /* the kv head's query heads ascending (one for NKV = NH), each over its
     * chunks in order: dK, dV gather every term in one fixed order */
    /* a window: queries from k0 + BR - 1 + W on see none of these keys */
    const int qend = WIN && k0 + BR - 1 + a.W < T ? k0 + BR - 1 + a.W : T;
    const int nch = (T + CH - 1) / CH;           /* ORD: a head's counts, one a chunk */
    int *post = nullptr;                         /* ORD: the count to bump at the next barrier */
    for (int h = kh * a.G; h < (kh + 1) * a.G; h++) {
        const IO *base = qkv + (size_t)b * T * st + (size_t)h * HD;
        const IO *gbase = dout + (size_t)b * T * a.C + (size_t)h * HD;
        const size_t bh = (size_t)b * a.NH + h;
        const float *L = lse + bh * T, *Dr = D + bh * T;
        for (int qc = k0; qc < qend; qc += CH) {      /* queries before k0 see none of these keys */
            __syncthreads();                          /* the last chunk's Q, dO, ls, dsm read */
            if (ORD && post) {                        /* and its dQ part stored */
                if (threadIdx.x == 0) zkc_post_count(post);
                post = nullptr;
            }
            load_tiles<CH, HD, NW * 32, LBQ>(qs, base, st, gs, gbase, a.C, qc, T);
            if (threadIdx.x < CH) {
                const int i = qc + threadIdx.x;
                ls[threadIdx.x] = i < T ? L[i] * LOG2E : 0.0f;
                dsm[threadIdx.x] = i < T ? Dr[i] : 0.0f;
            }
            __syncthreads();
            float s[NC][4], dp[NC][4];
            two_products<NC, KS, LD>(s, dp, kp + lo.a, vp + lo.a, qp + lo.nk, gp + lo.nk, w * 16);  /* S^T, dP^T */
            const bool full = qc >= k0 + BR && qc + CH <= T &&   /* no masked pair in the chunk */
                              (!WIN || qc + CH - 1 < k0 + a.W);
#pragma unroll
            for (int n = 0; n < NC; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int col = n * 8 + 2 * t + (e & 1), i = qc + col;
                    const int j = e < 2 ? j0 : j1;
                    const bool ok = full || (i < T && i >= j && (!WIN || i < j + a.W));
                    const float p = ok ? zkc_exp2(fmaf(s[n][e], sl2, -ls[col])) : 0.0f;
                    s[n][e] = p;
                    dp[n][e] = p * (dp[n][e] - dsm[col]) * a.scale;
                }
            uint32_t af[NC / 2][4];
            c_to_a<NC / 2>(af, s);
            mma_reg_kn<NC / 2, ND, LD>(dv, af, gp + lo.kn);  /* dV += bf16(P^T) dO */
            c_to_a<NC / 2>(af, dp);
            mma_reg_kn<NC / 2, ND, LD>(dk, af, qp + lo.kn);  /* dK += bf16(dS^T) Q */
            if constexpr (DQP) {                      /* dQ[chunk] += bf16(dS) K */
                enum { QT = CH / 16, WPQ = NW / QT, NQ = ND / WPQ };   /* query tiles; warps, n-tiles each */
                uint32_t *dw = (uint32_t *)dss;
#pragma unroll
                for (int n = 0; n < NC; n++) {
                    dw[((w * 16 + g) * LQ + n * 8 + 2 * t) / 2] = af[n / 2][(n & 1) * 2];
                    dw[((w * 16 + g + 8) * LQ + n * 8 + 2 * t) / 2] = af[n / 2][(n & 1) * 2 + 1];
                }
                ord_at oa = {};                       /* ORD: thread 0 waits for the tiles above */
                if constexpr (ORD) {
                    oa = ordered_at(cnt, a, b, h, qc / CH, nch, kt, CH);
                    if (threadIdx.x == 0) zkc_wait_count(oa.ct, oa.expect);
                }
                __syncthreads();                      /* dS staged (ORD: and their parts added) */
                const int q16 = w / WPQ, n0 = (w % WPQ) * NQ;
                const zkc_sptr sp = zkc_sptr_of(dss) + a_trans_offset<LQ>(lane);
                float dq[NQ][4];
#pragma unroll
                for (int n = 0; n < NQ; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < BR / 16; kk++) {
                    uint32_t fa[4];
                    frag_a_km<LQ>(fa, sp, q16 * 16, kk * 16);
#pragma unroll
                    for (int np = 0; np < NQ / 2; np++) {
                        uint32_t bf[4];
                        frag_b_kn<LD>(bf, kp + lo.kn, kk * 16, (n0 + 2 * np) * 8);
                        zkc_mma_bf16_16816(dq[2 * np], fa, bf);
                        zkc_mma_bf16_16816(dq[2 * np + 1], fa, bf + 2);
                    }
                }
                const int qi[2] = { qc + q16 * 16 + g, qc + q16 * 16 + g + 8 };
                if constexpr (ATOM) {                 /* by atomics (DQA) */
                    atomic_add_part<HD, NQ>(dqkv, dq, a, b, h, qi, n0);
                } else {                              /* in the fixed order (ORD) */
                    ordered_add<HD, NQ>(dqkv, acc, dq, a, b, h, oa, qi, n0);
                    post = oa.ct;
                }
            }
        }
    }
    if (ORD && post) {                           /* the last chunk's dQ part stored */
        __syncthreads();
        if (threadIdx.x == 0) zkc_post_count(post);
    }
    const int rows[2] = { j0, j1 };
    IO *drow = dqkv + (size_t)b * T * st + a.C + (size_t)kh * HD + 2 * t;   /* dk of kv head kh */
    const size_t dvo = (size_t)a.NKV * HD;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (rows[r] >= T) continue;
#pragma unroll
        for (int n = 0; n < ND; n++) {
            stg_pair(drow + (size_t)rows[r] * st + n * 8, dk[n][2 * r], dk[n][2 * r + 1]);
            stg_pair(drow + (size_t)rows[r] * st + dvo + n * 8, dv[n][2 * r], dv[n][2 * r + 1]);
        }
    }
}

/* The wide dK/dV at head size 128 (zkc_attention_tc_bwd_wide(1)) and 64
 * (zkc_attention_tc_bwd_wide64(1), FA2's hdim-64 shape too), off by default
 * until a GPU has timed them. The narrow kernel above gives each warp 16
 * keys and every query of a 16-query chunk: an ldmatrix for every mma,
 * bound by shared memory's bandwidth (call 3: 1.79-2.0x FlashAttention-2's
 * backward at head size 128). Here 8 warps, 128 keys, chunks of 64
 * queries, the products tiled in two dimensions (FA2's hdim-128 shape):
 * S^T and dP^T a warp's 32 keys x 32 queries (0.5 ldmatrix an mma); P^T,
 * dS^T rounded to bf16 into shared memory; dV, dK a warp's 32 keys x 64
 * columns over the chunk's queries (0.375). The next chunk's Q and dO are
 * staged by cp.async while this one computes (io16; an fp32 source is
 * loaded and rounded in turn), its lse and D through registers. 173 KB of
 * shared memory (the dynamic opt-in: sm_90 has 227 KB, an A100 163, where
 * the launcher keeps the narrow kernel), 1 block (8 warps) an SM, as the
 * narrow kernel's 2 of 4. Each dK, dV element takes the same 16-query mma
 * steps in the same order as there (heads, then queries ascending; the
 * extra chunks below a key's diagonal or past its window add zeros), so
 * dk and dv keep the narrow kernel's bits. ORD, ATOM: each chunk's dQ part
 * (64 queries x HD, bf16(dS) K over the block's 128 keys; a warp 32 x HD /
 * 4) added as there, in key tiles of 128. At head size 64: a warp's dV, dK
 * 32 keys x 32 columns (0.5 ldmatrix an mma), 111 KB of shared memory. */
template <int HD> struct bw_cfg {
    enum { NTH = 256, BN = 128, CH = 64, LD = HD + 8, LQ = CH + 8,
           SMEM = (2 * BN * LD + 4 * CH * LD + 2 * BN * LQ) * 2 + 4 * CH * 4,
           NK = HD / 16,    /* dV, dK: a warp's n-tiles (HD / 2 columns) */
           NQ = HD / 32 };  /* the dQ part: a warp's n-tiles (HD / 4 columns) */
};

/* The wide backward's score-shaped products: a warp's 32 rows (r0..) x 32
 * columns (c0..) over HD, from zero, x = A B^T with A, B tiles stored row
 * by HD (K or V; Q or dO); a, b the tiles' addresses plus the lane's a, nk
 * offsets. 0.5 ldmatrix an mma. The k-steps not unrolled: unrolled,
 * ptxas hoists their fragments and k_tc_dkv_wide spills at 255 registers
 * (rolled: 235-255 on sm_90 and sm_80, none spilling; 8 warps an SM hide
 * a step's ldmatrix latency). */
template <int KS, int LD>
__device__ __forceinline__ void product_32x32(float (*x)[4][4], zkc_sptr a, zkc_sptr b, int r0, int c0)
{
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int n = 0; n < 4; n++) x[mt][n][0] = x[mt][n][1] = x[mt][n][2] = x[mt][n][3] = 0.0f;
#pragma unroll 1
    for (int kk = 0; kk < KS; kk++) {
        uint32_t fa[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++) frag_a<LD>(fa[mt], a, r0 + 16 * mt, kk * 16);
#pragma unroll
        for (int np = 0; np < 2; np++) {
            uint32_t bf[4];
            frag_b_nk<LD>(bf, b, c0 + 16 * np, kk * 16);
            mma_2x2(x, fa, bf, 2 * np);
        }
    }
}

template <int HD, class IO, bool WIN, bool ORD>
__global__ static void __launch_bounds__(bw_cfg<HD>::NTH, 1)
k_tc_dkv_wide(IO *dqkv, const IO *dout, const IO *qkv, const float *lse, const float *D, float *acc,
              int *cnt, tcp a)
{
    enum { NTH = bw_cfg<HD>::NTH, BN = bw_cfg<HD>::BN, CH = bw_cfg<HD>::CH, LD = bw_cfg<HD>::LD,
           LQ = bw_cfg<HD>::LQ, KS = HD / 16, NK = bw_cfg<HD>::NK, NQ = bw_cfg<HD>::NQ };
    constexpr bool ATOM = dq_atomic<IO>::on && !ORD, DQP = ATOM || ORD;
    /* shared: K, V (BN, LD); Q, dO of two chunks (CH, LD); P^T, dS^T (BN, LQ)
     * bf16; lse log2(e) and D of two chunks */
    bf16 *ks = (bf16 *)zkc_dyn_smem(), *vs = ks + BN * LD, *qd = vs + BN * LD;
    bf16 *pts = qd + 4 * CH * LD, *dss = pts + BN * LQ;
    float *lsd = (float *)(dss + BN * LQ);
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3, T = a.T;
    const int wm = w & 3, wn = w >> 2;           /* keys 32 wm..; queries (S^T) or columns (dV, dK) by wn */
    const unsigned tk = ORD ? (unsigned)block_ticket(cnt) : 0u;     /* as k_tc_dkv */
    const int kt = ORD ? gridDim.x - 1 - tk % gridDim.x : blockIdx.x;
    const unsigned by = ORD ? tk / gridDim.x : blockIdx.y;
    const int b = by / a.NKV, kh = by % a.NKV, k0 = kt * BN;
    const size_t st = a.R;
    const IO *kb = qkv + (size_t)b * T * st + a.C + (size_t)kh * HD, *vb = kb + (size_t)a.NKV * HD;
    const float sl2 = a.scale * LOG2E;
    const lane_offs lo = lane_offsets<LD>(lane), lq = lane_offsets<LQ>(lane);
    const zkc_sptr kp = zkc_sptr_of(ks), vp = zkc_sptr_of(vs);
    const zkc_sptr pp = zkc_sptr_of(pts) + lq.a, dsp = zkc_sptr_of(dss) + lq.a;

    /* the chunks: the kv head's query heads ascending, each over its chunks
     * from k0 to qend (as k_tc_dkv), it = head in group * nq + chunk */
    const int qend = WIN && k0 + BN - 1 + a.W < T ? k0 + BN - 1 + a.W : T;
    const int nq = (qend - k0 + CH - 1) / CH, nit = nq * a.G, nch = (T + CH - 1) / CH;
    /* chunk it's Q and dO into buffer it & 1 (then committed); its lse
     * log2(e) (threads < CH) or D (CH .. 2 CH - 1) for this thread */
    auto stage = [&](int it) {
        const int h = kh * a.G + it / nq, qc = k0 + it % nq * CH;
        bf16 *q = qd + (it & 1) * 2 * CH * LD;
        stage_rows<CH, HD, NTH>(q, qkv + (size_t)b * T * st + (size_t)h * HD, st, qc, T);
        stage_rows<CH, HD, NTH>(q + CH * LD, dout + (size_t)b * T * a.C + (size_t)h * HD, a.C, qc, T);
        zkc_cp_async_commit();
    };
    auto stat = [&](int it) -> float {
        const int h = kh * a.G + it / nq, i = k0 + it % nq * CH + threadIdx.x % CH;
        const size_t bh = (size_t)b * a.NH + h;
        if (threadIdx.x >= 2 * CH || i >= T) return 0.0f;
        return threadIdx.x < CH ? lse[bh * T + i] * LOG2E : D[bh * T + i];
    };
    stage(0);
    load_tiles<BN, HD, NTH>(ks, kb, st, vs, vb, st, k0, T);
    if (threadIdx.x < 2 * CH) lsd[threadIdx.x] = stat(0);
    float dk[2][NK][4], dv[2][NK][4];            /* keys 32 wm + 16 mt.., columns HD / 2 wn + 8 n.. */
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int n = 0; n < NK; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) dk[mt][n][e] = dv[mt][n][e] = 0.0f;
    /* ORD: chunk i's count (ordered_at's), bumped at the barrier after its part is stored */
    auto count_of = [&](int i) { return cnt + 1 + ((size_t)b * a.NH + kh * a.G + i / nq) * nch + k0 / CH + i % nq; };
    for (int it = 0; it < nit; it++) {
        const int h = kh * a.G + it / nq, qc = k0 + it % nq * CH;
        const bf16 *qs = qd + (it & 1) * 2 * CH * LD, *gs = qs + CH * LD;
        const float *ls = lsd + (it & 1) * 2 * CH, *dsm = ls + CH;
        const zkc_sptr qp = zkc_sptr_of(qs), gp = zkc_sptr_of(gs);
        zkc_cp_async_wait_all();
        __syncthreads();                         /* chunk it staged; chunk it - 1's reads done */
        if (ORD && it > 0 && threadIdx.x == 0)   /* and its dQ part stored */
            zkc_post_count(count_of(it - 1));
        if (it + 1 < nit) stage(it + 1);
        /* S^T = K Q^T, dP^T = V dO^T (keys 32 wm + 16 mt.., queries 32 wn +
         * 8 n..); P^T, dS^T as k_tc_dkv's, rounded to bf16 into pts, dss
         * (keys x queries) */
        const bool full = qc >= k0 + BN && qc + CH <= T && (!WIN || qc + CH - 1 < k0 + a.W);
        uint32_t *pw = (uint32_t *)pts, *dw = (uint32_t *)dss;
        float x[2][4][4], y[2][4][4];
        product_32x32<KS, LD>(x, kp + lo.a, qp + lo.nk, 32 * wm, 32 * wn);
        product_32x32<KS, LD>(y, vp + lo.a, gp + lo.nk, 32 * wm, 32 * wn);
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {  /* key g, then g + 8 */
                    const int r = 32 * wm + 16 * mt + g + 8 * hf, c = 32 * wn + n * 8 + 2 * t, j = k0 + r;
                    float p2[2], d2[2];
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int i = qc + c + e;
                        const bool ok = full || (i < T && i >= j && (!WIN || i < j + a.W));
                        p2[e] = ok ? zkc_exp2(fmaf(x[mt][n][2 * hf + e], sl2, -ls[c + e])) : 0.0f;
                        d2[e] = p2[e] * (y[mt][n][2 * hf + e] - dsm[c + e]) * a.scale;
                    }
                    pw[(r * LQ + c) / 2] = zkc_pack_bf16(p2[0], p2[1]);
                    dw[(r * LQ + c) / 2] = zkc_pack_bf16(d2[0], d2[1]);
                }
        /* the next chunk's lse or D, loaded now, stored after dV, dK (fewer live registers) */
        const float nx = it + 1 < nit ? stat(it + 1) : 0.0f;
        ord_at oa = {};                          /* ORD: thread 0 waits for the tiles above */
        if constexpr (ORD) {
            oa = ordered_at(cnt, a, b, h, qc / CH, nch, kt, CH, BN);
            if (threadIdx.x == 0) zkc_wait_count(oa.ct, oa.expect);
        }
        __syncthreads();                         /* P^T, dS^T staged (ORD: the parts above added) */
        /* dV += bf16(P^T) dO, dK += bf16(dS^T) Q: keys 32 wm.., columns HD / 2 wn.. */
#pragma unroll
        for (int kk = 0; kk < CH / 16; kk++) {
            uint32_t fp[2][4], fd[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                frag_a<LQ>(fp[mt], pp, 32 * wm + 16 * mt, kk * 16);
                frag_a<LQ>(fd[mt], dsp, 32 * wm + 16 * mt, kk * 16);
            }
#pragma unroll
            for (int np = 0; np < NK / 2; np++) {
                uint32_t bf[4];
                frag_b_kn<LD>(bf, gp + lo.kn, kk * 16, HD / 2 * wn + 16 * np);
                mma_2x2(dv, fp, bf, 2 * np);
                frag_b_kn<LD>(bf, qp + lo.kn, kk * 16, HD / 2 * wn + 16 * np);
                mma_2x2(dk, fd, bf, 2 * np);
            }
        }
        if (it + 1 < nit && threadIdx.x < 2 * CH)   /* the other buffer: last read before this */
            lsd[((it + 1) & 1) * 2 * CH + threadIdx.x] = nx;   /* chunk's first barrier */
        if constexpr (DQP) {                     /* dQ[chunk] += bf16(dS) K: queries 32 qh.., columns HD / 4 d4.. */
            const int qh = w >> 2, d4 = w & 3;
            const zkc_sptr sp = zkc_sptr_of(dss) + a_trans_offset<LQ>(lane);
            float dq[2][NQ][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int n = 0; n < NQ; n++) dq[mt][n][0] = dq[mt][n][1] = dq[mt][n][2] = dq[mt][n][3] = 0.0f;
#pragma unroll 1                                /* (as product_32x32's) */
            for (int kk = 0; kk < BN / 16; kk++) {
                uint32_t fa[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) frag_a_km<LQ>(fa[mt], sp, 32 * qh + 16 * mt, kk * 16);
#pragma unroll
                for (int np = 0; np < NQ / 2; np++) {
                    uint32_t bf[4];
                    frag_b_kn<LD>(bf, kp + lo.kn, kk * 16, HD / 4 * d4 + 16 * np);
                    mma_2x2(dq, fa, bf, 2 * np);
                }
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const int qi[2] = { qc + 32 * qh + 16 * mt + g, qc + 32 * qh + 16 * mt + g + 8 };
                if constexpr (ATOM) atomic_add_part<HD, NQ>(dqkv, dq[mt], a, b, h, qi, NQ * d4);
                else ordered_add<HD, NQ>(dqkv, acc, dq[mt], a, b, h, oa, qi, NQ * d4);
            }
        }
    }
    if (ORD) {                                   /* the last chunk's dQ part stored */
        __syncthreads();
        if (threadIdx.x == 0) zkc_post_count(count_of(nit - 1));
    }
    IO *drow = dqkv + (size_t)b * T * st + a.C + (size_t)kh * HD + HD / 2 * wn + 2 * t;   /* dk of kv head kh */
    const size_t dvo = (size_t)a.NKV * HD;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = k0 + 32 * wm + 16 * mt + g + 8 * r;
            if (row >= T) continue;
#pragma unroll
            for (int n = 0; n < NK; n++) {
                stg_pair(drow + (size_t)row * st + n * 8, dk[mt][n][2 * r], dk[mt][n][2 * r + 1]);
                stg_pair(drow + (size_t)row * st + dvo + n * 8, dv[mt][n][2 * r], dv[mt][n][2 * r + 1]);
            }
        }
}

/* dQ of 64 queries (a warp's 16 each) over chunks of CH keys up to the
 * block's last row: S = Q K^T, dP = dO V^T recomputed (16, CH), dS as in
 * k_tc_dkv, dQ += bf16(dS) K (16, HD) in registers. First D = rowsum(dout
 * * out) of the block's rows (fp32, dout and out widened where bf16: a
 * lane sums d = lane, lane + 32, ..., then an xor butterfly), kept in
 * registers and written to D[(b*NH + h)*T + i] for k_tc_dkv, which runs
 * after. */
template <int HD, class IO, bool WIN>
__global__ static void __launch_bounds__(dq_cfg<HD>::NWQ * 32, WIN ? 1 : dq_cfg<HD>::MINB)
k_tc_dq(IO *dqkv, float *D, const IO *dout, const IO *out, const IO *qkv, const float *lse, tcp a)
{
    enum { CH = dq_cfg<HD>::CH, LD = HD + 8, KS = HD / 16, NC = CH / 8, ND = HD / 8,
           NWQ = dq_cfg<HD>::NWQ, BRQ = NWQ * 16, NTH = NWQ * 32 };
    __shared__ __align__(16) bf16 qs[BRQ * LD], gs[BRQ * LD], ks[CH * LD], vs[CH * LD];
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3, T = a.T;
    const int qt = gridDim.x - 1 - blockIdx.x;   /* the longest rows first */
    const int b = blockIdx.y / a.NH, h = blockIdx.y % a.NH, q0 = qt * BRQ, r0 = q0 + w * 16;
    const int i0 = r0 + g, i1 = i0 + 8;
    const size_t st = a.R;
    const IO *base = qkv + (size_t)b * T * st + (size_t)h * HD;
    const IO *kb = qkv + (size_t)b * T * st + a.C + (size_t)(h / a.G) * HD;   /* its kv head's k */
    const IO *vb = kb + (size_t)a.NKV * HD;
    const IO *gbase = dout + (size_t)b * T * a.C + (size_t)h * HD;
    const float sl2 = a.scale * LOG2E;
    const lane_offs lo = lane_offsets<LD>(lane);
    const zkc_sptr kp = zkc_sptr_of(ks), vp = zkc_sptr_of(vs), qp = zkc_sptr_of(qs), gp = zkc_sptr_of(gs);
    const int rows[2] = { i0, i1 };
    float L2[2], Dv[2] = { 0.0f, 0.0f };          /* lse log2(e), D of this lane's rows */
#pragma unroll
    for (int r = 0; r < 2; r++) L2[r] = rows[r] < T ? lse[(size_t)blockIdx.y * T + rows[r]] * LOG2E : 0.0f;
    for (int r = 0; r < 16 && q0 + w * 16 + r < T; r++) {   /* D of the warp's rows, one at a time */
        const int i = q0 + w * 16 + r;
        const size_t off = ((size_t)b * T + i) * a.C + (size_t)h * HD;
        float d = 0.0f;
#pragma unroll
        for (int x = lane; x < HD; x += 32) d += zkc_get(dout + (off + x)) * zkc_get(out + (off + x));
        d = zkc_warp_sum(d);                      /* every lane the same bits */
        if (r == g) Dv[0] = d;
        if (r == g + 8) Dv[1] = d;
        if (lane == 0) D[(size_t)blockIdx.y * T + i] = d;
    }
    load_tiles<BRQ, HD, NTH>(qs, base, st, gs, gbase, a.C, q0, T);
    float dq[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

    const int kend = min(q0 + BRQ, T);            /* keys after the block's last row: none */
    for (int kc = WIN ? win_start(a, q0, CH) : 0; kc < kend; kc += CH) {
        __syncthreads();                          /* the last chunk's K, V read */
        load_tiles<CH, HD, NTH, 2>(ks, kb, st, vs, vb, st, kc, T);
        __syncthreads();
        if (kc > r0 + 15) continue;               /* every key after the warp's rows */
        if (WIN && kc + CH + a.W <= r0 + 1) continue;   /* every key before their windows */
        float s[NC][4], dp[NC][4];
        two_products<NC, KS, LD>(s, dp, qp + lo.a, gp + lo.a, kp + lo.nk, vp + lo.nk, w * 16);  /* S, dP */
        const bool full = kc + CH <= r0 + 1 && r0 + 16 <= T &&   /* every key <= every row < T */
                          (!WIN || kc + a.W > r0 + 15);           /* and in every row's window */
#pragma unroll
        for (int n = 0; n < NC; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = kc + n * 8 + 2 * t + (e & 1), i = rows[e >> 1];
                const bool ok = full || (i < T && j <= i && (!WIN || j + a.W > i));
                const float p = ok ? zkc_exp2(fmaf(s[n][e], sl2, -L2[e >> 1])) : 0.0f;
                dp[n][e] = p * (dp[n][e] - Dv[e >> 1]) * a.scale;
            }
        uint32_t af[NC / 2][4];
        c_to_a<NC / 2>(af, dp);
        mma_reg_kn<NC / 2, ND, LD>(dq, af, kp + lo.kn);  /* dQ += bf16(dS) K */
    }
    IO *drow = dqkv + (size_t)b * T * st + (size_t)h * HD + 2 * t;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (rows[r] >= T) continue;
#pragma unroll
        for (int n = 0; n < ND; n++)
            stg_pair(drow + (size_t)rows[r] * st + n * 8, dq[n][2 * r], dq[n][2 * r + 1]);
    }
}

/* hs = C/NH must be 64 or 128; B*NH is the grid's y (<= 65535); B*NH*T
 * rows indexed by int; p (16-byte loads) aligned */
/* The backwards that make dQ in the dK/dV kernel (DQA's, the ordered one):
 * D[(b*NH + h)*T + i] = sum over the head of dout * out (fp32, widened
 * where bf16, a warp per row: k_tc_dq's sum); DQA: the row's dQ zeroed;
 * cnt[0 .. ncnt) zeroed (the ordered dQ's ticket and counts) */
template <int HD, class IO>
__global__ static void k_tc_D(float *D, IO *dqkv, const IO *dout, const IO *out, int *cnt, int ncnt,
                              tcp a, int rows)
{
    const int gid = blockIdx.x * blockDim.x + threadIdx.x;
    for (int k = gid; k < ncnt; k += gridDim.x * blockDim.x) cnt[k] = 0;
    int row = blockIdx.x * NW + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    int i = row % a.T, h = (row / a.T) % a.NH, b = row / (a.T * a.NH);
    size_t off = ((size_t)b * a.T + i) * a.C + (size_t)h * HD;
    float s = 0.0f;
#pragma unroll
    for (int d = lane; d < HD; d += 32) {
        s += zkc_get(dout + (off + d)) * zkc_get(out + (off + d));
        if (dq_atomic<IO>::on && !cnt) dqkv[((size_t)b * a.T + i) * a.R + (size_t)h * HD + d] = 0.0f;
    }
    s = zkc_warp_sum(s);
    if (lane == 0) D[row] = s;
}

/* The ordered dQ's scratch after D (B*NH*T floats, padded to 16 bytes): the
 * ticket and a count per (b, h, query chunk) (ints, padded to 16 bytes),
 * then for a bf16 dqkv the fp32 running sums (B, T, C). Sized for the
 * narrow kernels' chunks (16 queries at head size 128: the wide one's 64
 * use the first quarter) */
static size_t tc_counts(int B, int T, int NH, int HD)
{
    const size_t ch = HD == 64 ? (size_t)tc_cfg<64>::CH : (size_t)tc_cfg<128>::CH;
    return (1 + (size_t)B * NH * ((T + ch - 1) / ch) + 3) / 4 * 4;
}

/* The backward's dQ (kernels.cuh): 0 its own pass (k_tc_dq, the default),
 * 1 ordered in the dK/dV kernel; -1 asks. Read at each launch: the
 * caller sizes the scratch by zkc_attention_backward_tc_scratch first, so
 * it is set while no attention backward runs (at init, or between calls on
 * one thread; like matmul.cu's switches). The DQA build has only its
 * atomics: it stays 0. */
static int ordered_dq_on = 0;
extern "C" int zkc_attention_tc_ordered_dq(int on)
{
    if ((on == 0 || on == 1) && !DQA) ordered_dq_on = on;
    return ordered_dq_on;
}

/* whether the current GPU grants k_tc_dkv_wide's shared memory a block at
 * head size HD (the opt-in, and the ticket's static int beside it) */
template <int HD> static bool wide_fits(void) { return smem_fits((int)bw_cfg<HD>::SMEM + 16); }

/* The backward's dK/dV at head size 128, and at 64 (kernels.cuh): 0 the
 * narrow kernel (the default), 1 the wide one, taken only where the
 * current GPU grants its shared memory (else the setting stays 0); -1
 * asks. Read at each launch. */
static int bwd_wide_on = 0, bwd_wide64_on = 0;
extern "C" int zkc_attention_tc_bwd_wide(int on)
{
    if (on == 0 || (on == 1 && wide_fits<128>())) bwd_wide_on = on;
    return bwd_wide_on;
}
extern "C" int zkc_attention_tc_bwd_wide64(int on)
{
    if (on == 0 || (on == 1 && wide_fits<64>())) bwd_wide64_on = on;
    return bwd_wide64_on;
}

/* the dK/dV kernel of a backward: the wide one when asked (its shared
 * memory opted into first), else k_tc_dkv */
template <int HD, class IO, bool ORD>
static int launch_dkv(cudaStream_t s, bool wide, IO *dqkv, const IO *dout, const IO *qkv,
                      const float *lse, const float *D, float *acc, int *cnt, int B, tcp a)
{
    if (wide) {
        typedef bw_cfg<HD> W;
        dim3 g((unsigned)((a.T + W::BN - 1) / W::BN), (unsigned)(B * a.NKV));
        const int smem = (int)W::SMEM;
        int e = a.W > 0 ? opt_in(k_tc_dkv_wide<HD, IO, true, ORD>, smem)
                        : opt_in(k_tc_dkv_wide<HD, IO, false, ORD>, smem);
        if (e) return e;
        if (a.W > 0)
            k_tc_dkv_wide<HD, IO, true, ORD><<<g, W::NTH, smem, s>>>(dqkv, dout, qkv, lse, D, acc, cnt, a);
        else
            k_tc_dkv_wide<HD, IO, false, ORD><<<g, W::NTH, smem, s>>>(dqkv, dout, qkv, lse, D, acc, cnt, a);
        return ZKC_LAUNCHED();
    }
    dim3 g((unsigned)((a.T + BR - 1) / BR), (unsigned)(B * a.NKV));   /* (key tile, b, kv head) */
    if (a.W > 0)
        k_tc_dkv<HD, IO, true, ORD><<<g, NW * 32, 0, s>>>(dqkv, dout, qkv, lse, D, acc, cnt, a);
    else
        k_tc_dkv<HD, IO, false, ORD><<<g, NW * 32, 0, s>>>(dqkv, dout, qkv, lse, D, acc, cnt, a);
    return ZKC_LAUNCHED();
}

extern "C" size_t zkc_attention_backward_tc_scratch(int io16, int B, int T, int C, int NH)
{
    size_t rows = (size_t)B * NH * T;
    if (!ordered_dq_on || DQA || NH <= 0 || C % NH || (C / NH != 64 && C / NH != 128)) return rows;
    return (rows + 3) / 4 * 4 + tc_counts(B, T, NH, C / NH) + (io16 ? (size_t)B * T * C : 0);
}

template <int HD, class IO>
static int tc_backward(cudaStream_t s, IO *dqkv, const IO *dout, const IO *qkv,
                       const IO *out, const float *lse, int B, tcp a, float *scratch)
{
    int e, rows = B * a.NH * a.T;
    dim3 gq((unsigned)((a.T + dq_cfg<HD>::NWQ * 16 - 1) / (dq_cfg<HD>::NWQ * 16)), (unsigned)(B * a.NH));
    const unsigned gD = (unsigned)((rows + NW - 1) / NW);
    const bool wide = HD == 128 ? bwd_wide_on : bwd_wide64_on;
    if (ordered_dq_on && !dq_atomic<IO>::on) {  /* D and the counts, then one kernel */
        const size_t nc = tc_counts(B, a.T, a.NH, HD);
        const size_t r4 = ((size_t)rows + 3) / 4 * 4;
        int *cnt = (int *)(scratch + r4);
        float *acc = sizeof(IO) == 4 ? (float *)dqkv : scratch + r4 + nc;
        k_tc_D<HD, IO><<<gD, NW * 32, 0, s>>>(scratch, dqkv, dout, out, cnt, (int)nc, a, rows);
        if ((e = ZKC_LAUNCHED())) return e;
        return launch_dkv<HD, IO, true>(s, wide, dqkv, dout, qkv, lse, scratch, acc, cnt, B, a);
    }
    if constexpr (dq_atomic<IO>::on)
        k_tc_D<HD, IO><<<gD, NW * 32, 0, s>>>(scratch, dqkv, dout, out, (int *)nullptr, 0, a, rows);
    else if (a.W > 0)
        k_tc_dq<HD, IO, true><<<gq, dq_cfg<HD>::NWQ * 32, 0, s>>>(dqkv, scratch, dout, out, qkv, lse, a);
    else
        k_tc_dq<HD, IO, false><<<gq, dq_cfg<HD>::NWQ * 32, 0, s>>>(dqkv, scratch, dout, out, qkv, lse, a);   /* and D */
    if ((e = ZKC_LAUNCHED())) return e;
    return launch_dkv<HD, IO, false>(s, wide, dqkv, dout, qkv, lse, scratch, (float *)nullptr, (int *)nullptr, B, a);
}

template <class IO>
static int tc_backward_io(cudaStream_t s, IO *dqkv, const IO *dout, const IO *qkv,
                          const IO *out, const float *lse, int B, tcp a, float *scratch)
{
    return a.C / a.NH == 64 ? tc_backward<64>(s, dqkv, dout, qkv, out, lse, B, a, scratch)
                            : tc_backward<128>(s, dqkv, dout, qkv, out, lse, B, a, scratch);
}

extern "C" int zkc_attention_backward_tc_gqa(cudaStream_t s, void *dqkv, const void *dout,
                                             const void *qkv, const void *out, const float *lse,
                                             int io16, int B, int T, int C, int NH, int NKV,
                                             int W, float *scratch)
{
    tcp a;
    int e = tc_params(&a, B, T, C, NH, NKV, W);
    if (e || B == 0 || T == 0) return e;
    if (!tc_aligned(dqkv) || !tc_aligned(dout) || !tc_aligned(qkv) || !tc_aligned(out) ||
        (io16 && DQA))
        return (int)cudaErrorInvalidValue;
    return io16 ? tc_backward_io(s, (uint16_t *)dqkv, (const uint16_t *)dout,
                                 (const uint16_t *)qkv, (const uint16_t *)out, lse, B, a, scratch)
                : tc_backward_io(s, (float *)dqkv, (const float *)dout, (const float *)qkv,
                                 (const float *)out, lse, B, a, scratch);
}

extern "C" int zkc_attention_backward_tc(cudaStream_t s, void *dqkv, const void *dout,
                                         const void *qkv, const void *out, const float *lse,
                                         int io16, int B, int T, int C, int NH, float *scratch)
{
    return zkc_attention_backward_tc_gqa(s, dqkv, dout, qkv, out, lse, io16, B, T, C, NH, NH, 0,
                                         scratch);
}
