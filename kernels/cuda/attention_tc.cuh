#ifndef ZKC_ATTENTION_TC_CUH
#define ZKC_ATTENTION_TC_CUH
/* attention_tc.cuh -- causal self-attention on bf16 tensor cores with fp32
 * accumulation (FlashAttention-2 style), head sizes 64 and 128 (kernels.cuh:
 * zkc_attention_forward_tc / zkc_attention_backward_tc; another head size,
 * or a qkv, dout, out or dqkv not 16-byte aligned, returns
 * cudaErrorInvalidValue and launches nothing). Layouts and the WRITTEN
 * contract of zk_attention_* (kernels/cpu/kernels.h).
 *
 * Grouped-query heads and a sliding window (zkc_attention_*_tc_gqa;
 * zk_attention_*_gqa's layout): qkv rows of R = C + 2 NKV hs; the forward's and
 * dQ's blocks (b, query head h) load the K, V tiles of kv head h / G; a
 * k_tc_dkv block is (key tile, b, kv head) and runs its G query heads
 * ascending, each over its query chunks, dK and dV staying in registers:
 * one order, no atomics. A window W > 0 (query i sees keys (i - W, i]):
 * tiles and chunks wholly outside every row's window are skipped, the
 * rest masked like the diagonal; in the forward a row with no key yet in
 * an active tile keeps p = 0 and c = 0 (its max taken as 0), not NaN. The
 * windowed kernels are their own instantiations (template WIN), bounded
 * at 1 block an SM so their extra registers do not spill at head size 64
 * (their speed unmeasured: no GPU yet); W = 0 compiles the kernels of
 * before, and NKV = NH, W = 0 gives their bits.
 *
 * Instructions (mma.cuh): mma.sync.aligned.m16n8k16 bf16 -> fp32 and
 * ldmatrix.x4 (.trans for a B operand stored k by n) on the PTX ISA's
 * documented fragment layouts, so scores, the online softmax, P and every
 * accumulator stay in registers: the C layout of two n-tiles of S is the A
 * layout of one k-step of P (no shared-memory round trip), a row's
 * statistics are reduced over the 4 lanes that hold it (xor 1, 2).
 * Tiles: shared memory bf16 at stride HD + 8 (conflict-free ldmatrix),
 * filled from the fp32 rows by 16-byte loads converted once (bf16 rows,
 * io16, dout's included: 16-byte loads stored as they are), two matrices'
 * loads in flight together (load_tiles). exp2 by ex2.approx.ftz.
 *
 * I/O (io16, kernels.cuh): every kernel is a template on the element of
 * qkv, out, dqkv and the backward's dout, float or uint16_t (bf16 bits);
 * lse and D stay fp32. A bf16 q, k, v or dout enters its tile
 * unconverted (chunk<uint16_t>: the same 16-byte loads and stores as
 * q, k, v): the fp32 path's RNE of the widened value is exact, so the
 * operands have the same bits (no fp32 arithmetic precedes that rounding:
 * the scale is folded into the exponent, not into Q). D = rowsum(dout *
 * out) reads a bf16 dout and out widened (zkc_get); out and dqkv are the
 * fp32 results rounded once (zkc_bf16). So io16 is round(fp32 kernel(
 * widen(x))) bit for bit (spec/emu/test_attention_tc_emu.c checks it); the
 * fp32 variants' SASS is unchanged by the template (nvdisasm, sm_80 and
 * sm_90).
 *
 * Forward (k_tc_fwd): a block per (128 query rows at head size 64: 8
 * warps; 64 rows at 128: 4 warps, b, h), each warp 16 rows; a 64-key
 * K, V tile read from L2 (fp32) serves the block's rows (at head size 64
 * 128 rows: 64 FLOP a byte). For key tiles up to the block's last row (a
 * warp skips tiles wholly after its rows; the mask only where a tile
 * reaches past the warp's first row): S = Q K^T (fp32; Q's fragments read
 * from shared memory each tile at 64, held in registers at 128), per row
 * m' = max(m, max S) (raw scores), c = 2^((m - m') scale log2 e),
 * p = 2^(fma(S, scale log2 e, -m' scale log2 e)), l = l c + sum p (p in
 * fp32, each lane its part of the row), O = c O + bf16(p) V. At the end
 * out = O (1 / l), lse = m scale + log l. No (T,T) buffer. 2
 * matmul-equivalents (Q K^T, P V).
 *
 * Backward: k_tc_dq first, one block per 128 queries at head size 64 (8
 * warps), 64 at 128 (4), a warp's 16 each: D = rowsum(dout * out) of its
 * rows (fp32, written to the scratch for k_tc_dkv), then over chunks of
 * keys (32 at head size 64, 16 at 128; a warp skips chunks after its rows)
 * up to its last row: S = Q K^T, dP = dout V^T, p = 2^(fma(S, scale
 * log2 e, -lse log2 e)), dS = p (dP - D) scale, dQ += bf16(dS) K: 3
 * matmul-equivalents. Then k_tc_dkv, one block per 64 keys (a warp's 16,
 * dK and dV in registers) over chunks of CH queries (64 at head size 64,
 * 16 at 128) from the block's first key: S^T = K Q^T, dP^T = V dout^T, p and dS as above, dV +=
 * bf16(p)^T dout, dK += bf16(dS)^T Q: 4 more, 7 in all against
 * FlashAttention-2's 5.
 * Why a second pass for dQ: FA2 adds each key block's dQ part into fp32 dQ
 * with atomics, in an order that varies run to run. Without atomics the
 * parts need an owner: per-key-block partials summed in a fixed order
 * need T/64 copies of dQ (at GPT-2 124M, B=16, T=1024: 16 x 50 MB a
 * layer) where the contract's scratch is B*NH*T floats (D); ordering the
 * adds needs counts between blocks (below, the ordered dQ, not yet the
 * default). The dQ pass instead costs 3
 * of the 7 matmul-equivalents' FLOPs, 2 of them recomputation: at that
 * shape 3 x 2 x (T^2/2) x 64 x 192 heads = 39 GFLOP a layer (26 of them
 * recomputed), ~0.13 ms at 300 TFLOP/s; FA2's atomics move instead 136 key
 * x query block pairs x 16 KiB of fp32 dQ x 192 heads = 430 MB a layer
 * through L2 (~0.1 ms at L2 atomic rates), overlapped with its products.
 * The way to 5 without atomics (zkc_attention_tc_ordered_dq(1), off by
 * default until a GPU has timed it; ZTRAIN_ATTN_DQ=ordered at device init):
 * k_tc_D writes D and zeroes the counts, then k_tc_dkv<ORD> also makes
 * each chunk's dQ part (bf16(dS)^T K over its 64 keys, dS staged in shared
 * memory as the DQA variant does) and adds it into an fp32 sum (dqkv's q
 * part itself for fp32 I/O, the scratch's (B, T, C) for bf16) in one order:
 * a query chunk's own key tile J first (it writes), then J-1 down to the
 * lowest tile that reaches it (0, or the window's: that one writes the
 * result in dqkv's type). A tile waits on a count per (b, h, chunk) until
 * the J - kt tiles above it have added theirs (ordered_at: thread 0 waits
 * before the barrier that publishes the staged dS, so the wait costs no
 * barrier of its own; ordered_add). Causal work
 * makes that order free of stalls when blocks keep pace: tile kt reaches
 * chunk c one chunk after tile kt+1 did. Deadlock-free whatever the GPU's
 * dispatch order: a block's work is its ticket (taken when it starts; a
 * (b, kv head)'s tiles last to first), and it waits only on blocks with
 * smaller tickets, which have started. The price: the scratch grows by a
 * count per 64 (16 at head size 128) queries and, for bf16, B T C floats;
 * the dK/dV kernel holds 2 blocks an SM, not 3 (its registers), and the
 * last head's tile 0 (the longest) starts last. The emulator runs the
 * blocks one at a time in either order and aborts a wait that no earlier
 * block can end. Its atomic twin, -DZKC_ATTN_TC_DQ_ATOMIC (below), is the
 * same kernel adding by fp32 atomics: built only to price the order
 * (tools/bench_cuda.c's bench_cuda_dqatomic; dK/dV then 238 / 240
 * registers at 2 blocks an SM, 46592 / 46720 B at head size 64 / 128, no
 * spills on sm_90).
 *
 * Rounded to bf16 (RNE) on the way into shared memory: q, k, v, dout
 * (io16: already bf16); in registers: p, dS where they enter a product. In
 * fp32: the scores, softmax statistics, lse, D and every accumulation (the
 * order inside an mma is the hardware's).
 *
 * Deterministic (the same bits run to run): no atomics; every output element
 * has one owner (a lane of one warp of one block) that sums its terms in a
 * fixed order (a fixed loop over tiles and chunks; an mma is a fixed
 * function of its inputs; the 4-lane xor reductions give every lane the
 * same bits).
 *
 * spec/c/test_attention_tiles.c mirrors this recurrence on the CPU (tile
 * sizes, masking, rescale order, rounding points): change it with this file.
 * tools/emu_kernel.sh attention_tc runs this file's own source on the CPU
 * (spec/emu/cuda_emu.h: threads, barriers, mma.sync and ldmatrix with each
 * lane holding only its own registers by the documented layouts).
 *
 * The forward is attention_tc_fwd.cu, the backward attention_tc_bwd.cu;
 * this header holds what both use: the call's shape, the tile loads and
 * the fragment helpers.
 *
 * Resources (ptxas, sm_90, static shared memory, no spills; launch bounds
 * cap the registers so that the blocks an SM holds are as listed):
 *   head size 64:  forward 256 threads, 128 registers, 36864 B (2 a SM);
 *                  dQ 256, 127, 46080 B (2); dK/dV 128, 168, 37376 B (3);
 *                  dK/dV with the ordered dQ 128, 239, 46608 B (2)
 *   head size 128: forward 128 threads, 168 registers, 34816 B (3);
 *                  dQ 128, 152, 43520 B (3); dK/dV 128, 224, 43648 B (2);
 *                  dK/dV with the ordered dQ 128, 238, 46736 B (2);
 *                  forward wide (8 warps, 128 rows, prefetching) 256, 252,
 *                  34816 B (1)
 *   the pair forward (4 warps of 32 rows, the next K, V tile by cp.async;
 *   dynamic shared memory, opted into): head size 64 128 threads, 240-244
 *   registers, 55296 B (2 a SM); 128 (bf16 I/O only) 248-250, 104448 B (2)
 * io16 (dout bf16 too) the same threads and shared memory; registers:
 * forward 124 / 168, dQ 127 / 158, dK/dV 168 / 214 (head size 64 / 128;
 * dK/dV's Q, dO loads 2 a thread and matrix per batch, not 4: 4 spilled
 * at head size 64).
 * All under 48 KiB but the pair forward and the wide backward (those opt
 * in to more shared memory). The forward at
 * head size 64 prefetches: the next tile's K loads (16 registers a
 * thread) fly during this tile's S and softmax, its V loads during P V
 * (3 barriers a tile). Elsewhere a tile's (chunk's) loads and its products
 * alternate, fenced by __syncthreads, and the SM's other blocks hide the
 * loads.
 */
#include <limits.h>
#include <stdint.h>
#include <cuda_bf16.h>
#include "mma.cuh"
#include "common.cuh"

#define NW 4               /* warps of a dK/dV block (and of the forward and dQ
                              at head size 128); a warp owns 16 rows (one m16 tile) */
#define BR (NW * 16)       /* a dK/dV block's keys; load_tile's default threads NW * 32 */
#define LOG2E 1.4426950408889634f

typedef __nv_bfloat16 bf16;

/* a call: T, C = NH hs (out's row), NH query heads over NKV kv heads
 * (G = NH / NKV a group), qkv rows of R = C + 2 NKV hs (q | k | v) */
struct tcp { int T, C, NH, NKV, G, W; size_t R; float scale; };

/* a sliding window W > 0 (query i sees keys (i - W, i]): the first key
 * tile (a multiple of n) that queries from q on need */
__device__ __forceinline__ int win_start(const tcp &a, int q, int n)
{
    return a.W > 0 && q - a.W + 1 > 0 ? (q - a.W + 1) / n * n : 0;
}

/* A source row's 16-byte chunk, by the source's element S: 4 fp32 (a
 * float4) rounded to bf16 (RNE) into the tile by an 8-byte store, or 8
 * bf16 (a uint4, io16) stored as they are by a 16-byte one (the same bits:
 * rounding a widened bf16 is exact) */
template <class S> struct chunk;
template <> struct chunk<float> {
    typedef float4 V;
    enum { E = 4 };
    __device__ static __forceinline__ V zero() { const float4 z = { 0.0f, 0.0f, 0.0f, 0.0f }; return z; }
    __device__ static __forceinline__ V ld(const float *p) { return zkc_ldg4(p); }
    __device__ static __forceinline__ void st(bf16 *d, const V &x)
    {
        zkc_sts2(d, zkc_pack_bf16(x.x, x.y), zkc_pack_bf16(x.z, x.w));
    }
};
template <> struct chunk<uint16_t> {
    typedef uint4 V;
    enum { E = 8 };
    __device__ static __forceinline__ V zero() { const uint4 z = { 0u, 0u, 0u, 0u }; return z; }
    __device__ static __forceinline__ V ld(const uint16_t *p) { return zkc_ldg8h(p); }
    __device__ static __forceinline__ void st(bf16 *d, const V &x) { zkc_sts4(d, x); }
};

/* rows [t0, t0+R) of two (T, stride) matrices' HD columns (K and V, or Q
 * and dout) of one element S, fp32 or bf16 -> bf16 rows of their tiles at
 * stride HD + 8 (144 or 272 B: the 8 rows an ldmatrix reads fall in 8
 * different 16-byte bank groups); rows at or past T are zero. Every thread
 * of the block: 16-byte loads in batches of LB (<= LBM) per thread and
 * matrix (2 LB loads in flight, then their stores; one batch at a time
 * keeps the staging to 8 LB registers).
 * A bf16 source could be a cp.async of 16 bytes per chunk here. */
template <int R, int HD, int NTH, int LBM = 4, class S>
__device__ __forceinline__ void load_tiles(bf16 *d1, const S *s1, size_t st1, bf16 *d2,
                                           const S *s2, size_t st2, int t0, int T)
{
    typedef chunk<S> C;
    constexpr int V = HD / C::E, N = R * V / NTH, LB = N < LBM ? N : LBM;
    static_assert(R * V % NTH == 0 && N % LB == 0, "tile not a multiple of the block");
#pragma unroll 1
    for (int n0 = 0; n0 < N; n0 += LB) {
        typename C::V x[2][LB];
#pragma unroll
        for (int n = 0; n < LB; n++) {
            const int idx = threadIdx.x + (n0 + n) * NTH, r = idx / V, c = idx % V * C::E;
            x[0][n] = t0 + r < T ? C::ld(s1 + (size_t)(t0 + r) * st1 + c) : C::zero();
            x[1][n] = t0 + r < T ? C::ld(s2 + (size_t)(t0 + r) * st2 + c) : C::zero();
        }
#pragma unroll
        for (int n = 0; n < LB; n++) {
            const int idx = threadIdx.x + (n0 + n) * NTH, r = idx / V, c = idx % V * C::E;
            C::st(d1 + r * (HD + 8) + c, x[0][n]);
            C::st(d2 + r * (HD + 8) + c, x[1][n]);
        }
    }
}

/* one matrix: the same, rows [t0, t0+R) of src -> dst */
template <int R, int HD, int NTH = NW * 32, class S>
__device__ __forceinline__ void load_tile(bf16 *dst, const S *src, size_t stride, int t0, int T)
{
    typedef chunk<S> C;
    constexpr int V = HD / C::E, N = R * V / NTH, LB = N < 4 ? N : 4;
    static_assert(R * V % NTH == 0 && N % LB == 0, "tile not a multiple of the block");
#pragma unroll 1
    for (int n0 = 0; n0 < N; n0 += LB) {
        typename C::V x[LB];
#pragma unroll
        for (int n = 0; n < LB; n++) {
            const int idx = threadIdx.x + (n0 + n) * NTH, r = idx / V, c = idx % V * C::E;
            x[n] = t0 + r < T ? C::ld(src + (size_t)(t0 + r) * stride + c) : C::zero();
        }
#pragma unroll
        for (int n = 0; n < LB; n++) {
            const int idx = threadIdx.x + (n0 + n) * NTH, r = idx / V, c = idx % V * C::E;
            C::st(dst + r * (HD + 8) + c, x[n]);
        }
    }
}

/* The same split in two for a prefetch: a thread's N = R HD / (E NTH)
 * 16-byte loads of rows [t0, t0+R) into registers (zero past T), later
 * their stores into the tile */
template <int R, int HD, int NTH, class S>
__device__ __forceinline__ void ldg_rows(typename chunk<S>::V *x, const S *src, size_t stride,
                                         int t0, int T)
{
    typedef chunk<S> C;
    constexpr int V = HD / C::E, N = R * V / NTH;
#pragma unroll
    for (int n = 0; n < N; n++) {
        const int idx = threadIdx.x + n * NTH, r = idx / V, c = idx % V * C::E;
        x[n] = t0 + r < T ? C::ld(src + (size_t)(t0 + r) * stride + c) : C::zero();
    }
}
template <int R, int HD, int NTH, class S>
__device__ __forceinline__ void sts_rows(bf16 *dst, const typename chunk<S>::V *x)
{
    typedef chunk<S> C;
    constexpr int V = HD / C::E, N = R * V / NTH;
#pragma unroll
    for (int n = 0; n < N; n++) {
        const int idx = threadIdx.x + n * NTH, r = idx / V, c = idx % V * C::E;
        C::st(dst + r * (HD + 8) + c, x[n]);
    }
}

/* rows [t0, t0+R) of src into a tile (stride HD + 8) for a next
 * chunk or tile (the wide backward, the pair forward): io16 16-byte cp.async (zero past T; the caller
 * commits), fp32 loaded and rounded now (load_tile) */
template <int R, int HD, int NTH, class S>
__device__ __forceinline__ void stage_rows(bf16 *dst, const S *src, size_t stride, int t0, int T)
{
    if constexpr (sizeof(S) == 2) {
        /* a thread's chunks: column c of rows r, r + RS, ...; one pointer
         * stepped (per-chunk offsets, hoisted out of a caller's loop, cost
         * the pair forward 32 registers and spilled it) */
        constexpr int V = HD / 8, N = R * V / NTH, RS = NTH / V;
        static_assert(NTH % V == 0 && R % RS == 0, "tile not a multiple of the block");
        const int r = threadIdx.x / V, c = threadIdx.x % V * 8;
        /* read only below T; for rows past it p points past the tensor, never
         * dereferenced (an offset or an integer address instead changed the
         * pair forward's register allocation at head size 128 into spills) */
        const S *p = src + (size_t)(t0 + r) * stride + c;
        const size_t step = (size_t)RS * stride;
#pragma unroll
        for (int n = 0; n < N; n++, p += step) {
            const bool ok = t0 + r + n * RS < T;
            zkc_cp_async16(dst + (r + n * RS) * (HD + 8) + c, ok ? p : src + c, ok);
        }
    } else {                                      /* load_tile's, one pointer stepped */
        typedef chunk<S> C;
        constexpr int V = HD / C::E, N = R * V / NTH, RS = NTH / V, LB = N < 4 ? N : 4;
        static_assert(NTH % V == 0 && R % RS == 0 && N % LB == 0, "tile not a multiple of the block");
        const int r = threadIdx.x / V, c = threadIdx.x % V * C::E;
        const S *p = src + (size_t)(t0 + r) * stride + c;
        const size_t step = (size_t)RS * stride;
#pragma unroll 1
        for (int n0 = 0; n0 < N; n0 += LB, p += LB * step) {
            typename C::V x[LB];
#pragma unroll
            for (int n = 0; n < LB; n++)
                x[n] = t0 + r + (n0 + n) * RS < T ? C::ld(p + n * step) : C::zero();
#pragma unroll
            for (int n = 0; n < LB; n++) C::st(dst + (r + (n0 + n) * RS) * (HD + 8) + c, x[n]);
        }
    }
}

/* two adjacent outputs of a row: fp32 as computed (8 bytes), or io16 each
 * rounded once to nearest even (zkc_bf16, the casts' bits; 4 bytes) */
__device__ __forceinline__ void stg_pair(float *p, float x, float y) { zkc_stg2(p, x, y); }
__device__ __forceinline__ void stg_pair(uint16_t *p, float x, float y)
{
    zkc_stg2h(p, (uint32_t)zkc_bf16(x) | (uint32_t)zkc_bf16(y) << 16);
}

/* ldmatrix row addresses: a lane's byte offset into a bf16 tile at stride
 * LD, computed once (then every fragment is the tile's address plus the
 * lane's offset plus a constant):
 *  A (16 x 16 at rows r0, columns k0): lanes 0-15 rows 0-15 at column 0,
 *    lanes 16-31 rows 0-15 at column 8 -> a[0..3] as mma.cuh's layout;
 *  B of two n-tiles (n0, n0 + 8) at k-step k0, from a tile stored n by k
 *    (row n holds B(., n)): lanes 0-7 rows n0.. at k0, 8-15 at k0 + 8,
 *    16-31 the same for n0 + 8 -> b[0..1] n-tile n0, b[2..3] n0 + 8;
 *  the same from a tile stored k by n (row k holds B(k, .)), .trans:
 *    lanes 0-7 rows k0.., 8-15 rows k0 + 8.., 16-31 the same at n0 + 8. */
struct lane_offs { uint32_t a, nk, kn; };
template <int LD>
__device__ __forceinline__ lane_offs lane_offsets(int lane)
{
    lane_offs o;
    o.a = (uint32_t)(((lane & 15) * LD + (lane >> 4) * 8) * 2);
    o.nk = (uint32_t)((((lane & 7) + (lane >> 4) * 8) * LD + ((lane >> 3) & 1) * 8) * 2);
    o.kn = (uint32_t)((((lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8) * 2);
    return o;
}

/* p: the tile's address plus the lane's offset of the kind */
template <int LD>
__device__ __forceinline__ void frag_a(uint32_t a[4], zkc_sptr p, int r0, int k0)
{
    zkc_ldmatrix_x4(a, p + (uint32_t)(r0 * LD + k0) * 2);
}
template <int LD>
__device__ __forceinline__ void frag_b_nk(uint32_t b[4], zkc_sptr p, int n0, int k0)
{
    zkc_ldmatrix_x4(b, p + (uint32_t)(n0 * LD + k0) * 2);
}
template <int LD>
__device__ __forceinline__ void frag_b_kn(uint32_t b[4], zkc_sptr p, int k0, int n0)
{
    zkc_ldmatrix_x4_trans(b, p + (uint32_t)(k0 * LD + n0) * 2);
}

/* A (16 x 16 at rows r0, columns k0) from a tile stored k by m (row k
 * holds A(., k)), .trans: lanes 0-7 rows k0.. at column r0, 8-15 rows
 * k0.. at r0 + 8, 16-23 rows k0 + 8.. at r0, 24-31 rows k0 + 8.. at
 * r0 + 8; p: the tile's address plus this lane's offset (a_trans_offset) */
template <int LD>
__device__ __forceinline__ uint32_t a_trans_offset(int lane)
{
    return (uint32_t)((((lane & 7) + ((lane >> 4) & 1) * 8) * LD + ((lane >> 3) & 1) * 8) * 2);
}
template <int LD>
__device__ __forceinline__ void frag_a_km(uint32_t a[4], zkc_sptr p, int r0, int k0)
{
    zkc_ldmatrix_x4_trans(a, p + (uint32_t)(k0 * LD + r0) * 2);
}

/* The backward's two score-shaped products of a warp's 16 rows (r0) over
 * NC n-tiles and KS k-steps, from zero: s = A1 B1^T and dp = A2 B2^T, the
 * B tiles stored n by k (dK/dV: S^T = K Q^T, dP^T = V dO^T; dQ: S = Q K^T,
 * dP = dO V^T). a1, a2: tile addresses plus the lane's a offset; b1, b2
 * plus its nk offset. */
template <int NC, int KS, int LD>
__device__ __forceinline__ void two_products(float (*s)[4], float (*dp)[4], zkc_sptr a1, zkc_sptr a2,
                                             zkc_sptr b1, zkc_sptr b2, int r0)
{
#pragma unroll
    for (int n = 0; n < NC; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        uint32_t f1[4], f2[4];
        frag_a<LD>(f1, a1, r0, kk * 16);
        frag_a<LD>(f2, a2, r0, kk * 16);
#pragma unroll
        for (int np = 0; np < NC / 2; np++) {
            uint32_t bf[4];
            frag_b_nk<LD>(bf, b1, np * 16, kk * 16);
            zkc_mma_bf16_16816(s[2 * np], f1, bf);
            zkc_mma_bf16_16816(s[2 * np + 1], f1, bf + 2);
            frag_b_nk<LD>(bf, b2, np * 16, kk * 16);
            zkc_mma_bf16_16816(dp[2 * np], f2, bf);
            zkc_mma_bf16_16816(dp[2 * np + 1], f2, bf + 2);
        }
    }
}

/* acc (16 x 8 NT, fp32) += A (16 x 16 KS from registers) B (16 KS x 8 NT,
 * a tile stored k by n; p its address plus the lane's kn offset) */
template <int KS, int NT, int LD>
__device__ __forceinline__ void mma_reg_kn(float (*acc)[4], const uint32_t (*a)[4], zkc_sptr p)
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++)
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            uint32_t bf[4];
            frag_b_kn<LD>(bf, p, kk * 16, np * 16);
            zkc_mma_bf16_16816(acc[2 * np], a[kk], bf);
            zkc_mma_bf16_16816(acc[2 * np + 1], a[kk], bf + 2);
        }
}

/* An fp32 accumulator (16 x 16 KS, C layout) as bf16 A fragments: the
 * C layout of n-tiles 2kk, 2kk+1 is the A layout of k-step kk */
template <int KS>
__device__ __forceinline__ void c_to_a(uint32_t (*a)[4], const float (*c)[4])
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        a[kk][0] = zkc_pack_bf16(c[2 * kk][0], c[2 * kk][1]);
        a[kk][1] = zkc_pack_bf16(c[2 * kk][2], c[2 * kk][3]);
        a[kk][2] = zkc_pack_bf16(c[2 * kk + 1][0], c[2 * kk + 1][1]);
        a[kk][3] = zkc_pack_bf16(c[2 * kk + 1][2], c[2 * kk + 1][3]);
    }
}

/* acc[mt][n], acc[mt][n + 1] += a[mt] b for a warp's two m-tiles (the
 * wide backward, the pair forward; b: the B fragments of n-tiles n, n + 1) */
template <int N>
__device__ __forceinline__ void mma_2x2(float (*acc)[N][4], const uint32_t (*a)[4], const uint32_t b[4], int n)
{
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
        zkc_mma_bf16_16816(acc[mt][n], a[mt], b);
        zkc_mma_bf16_16816(acc[mt][n + 1], a[mt], b + 2);
    }
}

/* the 4 lanes of a row group (lane ^ 1, lane ^ 2): every lane the same bits */
__device__ __forceinline__ float quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* ---- host helpers of both launchers ---- */

static inline int tc_params(tcp *a, int B, int T, int C, int NH, int NKV, int W)
{
    if (B < 0 || T < 0 || NH <= 0 || C % NH || (C / NH != 64 && C / NH != 128) || W < 0 ||
        NKV <= 0 || NH % NKV || (size_t)B * NH > 65535 || (size_t)B * NH * T > (size_t)INT_MAX)
        return (int)cudaErrorInvalidValue;
    a->T = T; a->C = C; a->NH = NH; a->NKV = NKV; a->G = NH / NKV; a->W = W;
    a->R = (size_t)C + 2 * (size_t)NKV * (C / NH);
    a->scale = 1.0f / sqrtf((float)(C / NH));
    return 0;
}

static inline int tc_aligned(const void *p) { return ((uintptr_t)p & 15) == 0; }

static inline bool smem_fits(int bytes)
{
    int dev = 0, v = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
           v >= bytes;
}
/* a kernel's dynamic shared memory above 48 KB, opted into before its
 * launch; a refusal returned here, not left for the next launch */
template <class K>
static inline int opt_in(K kernel, int smem)
{
    int e = (int)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e) (void)cudaGetLastError();
    return e;
}

#endif
