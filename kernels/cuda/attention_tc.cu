/* attention_tc.cu -- causal self-attention on bf16 tensor cores with fp32
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

typedef __nv_bfloat16 bf16;

/* DQA's atomics add into fp32 dQ: an fp32 dqkv only (the launcher refuses
 * an io16 backward in that build) */
template <class IO> struct dq_atomic { enum { on = 0 }; };
template <> struct dq_atomic<float> { enum { on = DQA }; };

/* a call: T, C = NH hs (out's row), NH query heads over NKV kv heads
 * (G = NH / NKV a group), qkv rows of R = C + 2 NKV hs (q | k | v) */
struct tcp { int T, C, NH, NKV, G, W; size_t R; float scale; };

/* a sliding window W > 0 (query i sees keys (i - W, i]): the first key
 * tile (a multiple of n) that queries from q on need */
__device__ __forceinline__ int win_start(const tcp &a, int q, int n)
{
    return a.W > 0 && q - a.W + 1 > 0 ? (q - a.W + 1) / n * n : 0;
}

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
        const S *p = src + (size_t)(t0 + r) * stride + c;     /* read only below T */
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

/* The forward's warps a block: 8 (128 query rows) at head size 64, so that
 * a K, V tile read from L2 serves twice the rows (64 FLOP a byte of fp32
 * K, V); 4 at 128 (its registers) */
template <int HD> struct fwd_cfg { enum { NWF = HD == 64 ? 8 : 4, BRF = NWF * 16, MINB = HD == 64 ? 2 : 3 }; };
/* Head size 128 wide (zkc_attention_tc_fwd_wide(1), off by default until a
 * GPU has timed it): 8 warps, 128 rows a block as at 64 (a K, V tile read
 * from L2 serves twice the rows: 64 FLOP a byte of bf16 K, V, not 32), Q
 * in registers, the next tile prefetched; 1 block an SM (its registers) */
template <int HD, int NWF> struct fwd_minb { enum { v = NWF == fwd_cfg<HD>::NWF ? fwd_cfg<HD>::MINB : 1 }; };

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
    const IO *base = qkv + (size_t)b * T * st + (size_t)h * HD;         /* q of (b, 0, h) */
    const IO *kb = qkv + (size_t)b * T * st + a.C + (size_t)(h / a.G) * HD;   /* its kv head's k */
    const IO *vb = kb + (size_t)a.NKV * HD;
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
    const IO *base = qkv + (size_t)b * T * st + (size_t)h * HD;         /* q of (b, 0, h) */
    const IO *kb = qkv + (size_t)b * T * st + a.C + (size_t)(h / a.G) * HD;   /* its kv head's k */
    const IO *vb = kb + (size_t)a.NKV * HD;
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

/* Head size 128's wide dK/dV (zkc_attention_tc_bwd_wide(1), off by default
 * until a GPU has timed it). The narrow kernel above gives each warp 16
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
 * (64 queries x 128, bf16(dS) K over the block's 128 keys; a warp 32 x 32)
 * added as there, in key tiles of 128. */
struct bw_cfg {
    enum { HD = 128, NTH = 256, BN = 128, CH = 64, LD = HD + 8, LQ = CH + 8,
           SMEM = (2 * BN * LD + 4 * CH * LD + 2 * BN * LQ) * 2 + 4 * CH * 4 };
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

template <class IO, bool WIN, bool ORD>
__global__ static void __launch_bounds__(bw_cfg::NTH, 1)
k_tc_dkv_wide(IO *dqkv, const IO *dout, const IO *qkv, const float *lse, const float *D, float *acc,
              int *cnt, tcp a)
{
    enum { HD = 128, NTH = bw_cfg::NTH, BN = bw_cfg::BN, CH = bw_cfg::CH, LD = bw_cfg::LD,
           LQ = bw_cfg::LQ, KS = HD / 16 };
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
    float dk[2][8][4], dv[2][8][4];              /* keys 32 wm + 16 mt.., columns 64 wn + 8 n.. */
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int n = 0; n < 8; n++)
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
        /* dV += bf16(P^T) dO, dK += bf16(dS^T) Q: keys 32 wm.., columns 64 wn.. */
#pragma unroll
        for (int kk = 0; kk < CH / 16; kk++) {
            uint32_t fp[2][4], fd[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                frag_a<LQ>(fp[mt], pp, 32 * wm + 16 * mt, kk * 16);
                frag_a<LQ>(fd[mt], dsp, 32 * wm + 16 * mt, kk * 16);
            }
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t bf[4];
                frag_b_kn<LD>(bf, gp + lo.kn, kk * 16, 64 * wn + 16 * np);
                mma_2x2(dv, fp, bf, 2 * np);
                frag_b_kn<LD>(bf, qp + lo.kn, kk * 16, 64 * wn + 16 * np);
                mma_2x2(dk, fd, bf, 2 * np);
            }
        }
        if (it + 1 < nit && threadIdx.x < 2 * CH)   /* the other buffer: last read before this */
            lsd[((it + 1) & 1) * 2 * CH + threadIdx.x] = nx;   /* chunk's first barrier */
        if constexpr (DQP) {                     /* dQ[chunk] += bf16(dS) K: queries 32 qh.., columns 32 d4.. */
            const int qh = w >> 2, d4 = w & 3;
            const zkc_sptr sp = zkc_sptr_of(dss) + a_trans_offset<LQ>(lane);
            float dq[2][4][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int n = 0; n < 4; n++) dq[mt][n][0] = dq[mt][n][1] = dq[mt][n][2] = dq[mt][n][3] = 0.0f;
#pragma unroll 1                                /* (as product_32x32's) */
            for (int kk = 0; kk < BN / 16; kk++) {
                uint32_t fa[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) frag_a_km<LQ>(fa[mt], sp, 32 * qh + 16 * mt, kk * 16);
#pragma unroll
                for (int np = 0; np < 2; np++) {
                    uint32_t bf[4];
                    frag_b_kn<LD>(bf, kp + lo.kn, kk * 16, 32 * d4 + 16 * np);
                    mma_2x2(dq, fa, bf, 2 * np);
                }
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const int qi[2] = { qc + 32 * qh + 16 * mt + g, qc + 32 * qh + 16 * mt + g + 8 };
                if constexpr (ATOM) atomic_add_part<HD, 4>(dqkv, dq[mt], a, b, h, qi, 4 * d4);
                else ordered_add<HD, 4>(dqkv, acc, dq[mt], a, b, h, oa, qi, 4 * d4);
            }
        }
    }
    if (ORD) {                                   /* the last chunk's dQ part stored */
        __syncthreads();
        if (threadIdx.x == 0) zkc_post_count(count_of(nit - 1));
    }
    IO *drow = dqkv + (size_t)b * T * st + a.C + (size_t)kh * HD + 64 * wn + 2 * t;   /* dk of kv head kh */
    const size_t dvo = (size_t)a.NKV * HD;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = k0 + 32 * wm + 16 * mt + g + 8 * r;
            if (row >= T) continue;
#pragma unroll
            for (int n = 0; n < 8; n++) {
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
static int tc_params(tcp *a, int B, int T, int C, int NH, int NKV, int W)
{
    if (B < 0 || T < 0 || NH <= 0 || C % NH || (C / NH != 64 && C / NH != 128) || W < 0 ||
        NKV <= 0 || NH % NKV || (size_t)B * NH > 65535 || (size_t)B * NH * T > (size_t)INT_MAX)
        return (int)cudaErrorInvalidValue;
    a->T = T; a->C = C; a->NH = NH; a->NKV = NKV; a->G = NH / NKV; a->W = W;
    a->R = (size_t)C + 2 * (size_t)NKV * (C / NH);
    a->scale = 1.0f / sqrtf((float)(C / NH));
    return 0;
}

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

static int tc_aligned(const void *p) { return ((uintptr_t)p & 15) == 0; }

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
 * sizes, over fwd_wide_on), taken only where the current GPU grants its
 * shared memory (else the setting stays 0); -1 asks. Read at each launch. */
static int fwd_pair_on = 0;
static bool smem_fits(int bytes)
{
    int dev = 0, v = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
           v >= bytes;
}
static bool pair128_ok;                          /* the GPU is sm_90 or later (ZKC_PAIR128) */
extern "C" int zkc_attention_tc_fwd_pair(int on)
{
    if (on == 0 || (on == 1 && smem_fits((int)fwdp_cfg<128>::SMEM))) fwd_pair_on = on;
    if (on == 1 && fwd_pair_on) {
        int dev = 0, major = 0;
        pair128_ok = cudaGetDevice(&dev) == cudaSuccess &&
                     cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                     major >= 9;
    }
    return fwd_pair_on;
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

/* whether the current GPU grants k_tc_dkv_wide's shared memory a block
 * (the opt-in, and the ticket's static int beside it) */
static bool wide_fits(void) { return smem_fits((int)bw_cfg::SMEM + 16); }

/* Head size 128's backward dK/dV (kernels.cuh): 0 the narrow kernel (the
 * default), 1 the wide one, taken only where the current GPU grants its
 * shared memory (else the setting stays 0); -1 asks. Read at each launch. */
static int bwd_wide_on = 0;
extern "C" int zkc_attention_tc_bwd_wide(int on)
{
    if (on == 0 || (on == 1 && wide_fits())) bwd_wide_on = on;
    return bwd_wide_on;
}

/* a kernel's dynamic shared memory above 48 KB, opted into before its
 * launch; a refusal returned here, not left for the next launch */
template <class K>
static int opt_in(K kernel, int smem)
{
    int e = (int)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e) (void)cudaGetLastError();
    return e;
}

/* the dK/dV kernel of a backward: the wide one at head size 128 when asked
 * (its shared memory opted into first), else k_tc_dkv */
template <int HD, class IO, bool ORD>
static int launch_dkv(cudaStream_t s, bool wide, IO *dqkv, const IO *dout, const IO *qkv,
                      const float *lse, const float *D, float *acc, int *cnt, int B, tcp a)
{
    if constexpr (HD == 128) {
        if (wide) {
            dim3 g((unsigned)((a.T + bw_cfg::BN - 1) / bw_cfg::BN), (unsigned)(B * a.NKV));
            const int smem = (int)bw_cfg::SMEM;
            int e = a.W > 0 ? opt_in(k_tc_dkv_wide<IO, true, ORD>, smem) : opt_in(k_tc_dkv_wide<IO, false, ORD>, smem);
            if (e) return e;
            if (a.W > 0)
                k_tc_dkv_wide<IO, true, ORD><<<g, bw_cfg::NTH, smem, s>>>(dqkv, dout, qkv, lse, D, acc, cnt, a);
            else
                k_tc_dkv_wide<IO, false, ORD><<<g, bw_cfg::NTH, smem, s>>>(dqkv, dout, qkv, lse, D, acc, cnt, a);
            return ZKC_LAUNCHED();
        }
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

template <int HD, class IO>
static int tc_backward(cudaStream_t s, IO *dqkv, const IO *dout, const IO *qkv,
                       const IO *out, const float *lse, int B, tcp a, float *scratch)
{
    int e, rows = B * a.NH * a.T;
    dim3 gq((unsigned)((a.T + dq_cfg<HD>::NWQ * 16 - 1) / (dq_cfg<HD>::NWQ * 16)), (unsigned)(B * a.NH));
    const unsigned gD = (unsigned)((rows + NW - 1) / NW);
    const bool wide = HD == 128 && bwd_wide_on;
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
static int tc_forward_io(cudaStream_t s, IO *out, float *lse, const IO *qkv, int B, tcp a)
{
    return a.C / a.NH == 64 ? tc_forward<64>(s, out, lse, qkv, B, a) : tc_forward<128>(s, out, lse, qkv, B, a);
}

template <class IO>
static int tc_backward_io(cudaStream_t s, IO *dqkv, const IO *dout, const IO *qkv,
                          const IO *out, const float *lse, int B, tcp a, float *scratch)
{
    return a.C / a.NH == 64 ? tc_backward<64>(s, dqkv, dout, qkv, out, lse, B, a, scratch)
                            : tc_backward<128>(s, dqkv, dout, qkv, out, lse, B, a, scratch);
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

extern "C" int zkc_attention_forward_tc(cudaStream_t s, void *out, float *lse, const void *qkv,
                                        int io16, int B, int T, int C, int NH)
{
    return zkc_attention_forward_tc_gqa(s, out, lse, qkv, io16, B, T, C, NH, NH, 0);
}

extern "C" int zkc_attention_backward_tc(cudaStream_t s, void *dqkv, const void *dout,
                                         const void *qkv, const void *out, const float *lse,
                                         int io16, int B, int T, int C, int NH, float *scratch)
{
    return zkc_attention_backward_tc_gqa(s, dqkv, dout, qkv, out, lse, io16, B, T, C, NH, NH, 0,
                                         scratch);
}
