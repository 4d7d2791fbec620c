/* embedding.cu -- token + position embedding (kernels.cuh). The bf16
 * residual stream's variants are the same kernels instantiated on the
 * out's type (forward: uint16_t, the float rounded once, zkc_put) and on
 * dout's (backward: uint16_t, each element widened exactly as it is
 * loaded, zkc_get): every float operation the fp32 kernels'. */
#include "common.cuh"

/* out (B,T,C) = wte[tok] + wpe[t] (wpe NULL: wte[tok] alone); a bad id gives
 * wpe[t] alone (0 without wpe), counted once per position (by its c == 0
 * thread) */
/* an element of the tables: fp32, or bf16 widened exactly */
__device__ __forceinline__ float enc_w(const float *w, size_t i) { return w[i]; }
__device__ __forceinline__ float enc_w(const uint16_t *w, size_t i)
{
    return __uint_as_float((unsigned)w[i] << 16);
}

/* O: out's type, float or uint16_t (bf16, each element rounded once) */
template <class W, class O>
__global__ static void k_enc_fwd(O *out, const int32_t *tok, const W *wte,
                                 const W *wpe, int BT, int T, int C, int V, int *bad)
{
    ZKC_FOR(i, (size_t)BT * C) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T), id = tok[bt];
        float p = wpe ? enc_w(wpe, (size_t)t * C + c) : 0.0f;
        if (id < 0 || id >= V) { zkc_put(out + i, p); if (c == 0) atomicAdd(bad, 1); continue; }
        float e = enc_w(wte, (size_t)id * C + c);
        zkc_put(out + i, wpe ? e + p : e);
    }
}

/* dwte (V,C) += dout (N,C) rows by tok (N), N = B*T: each row sums its
 * occurrences in (b,t) order, one fp32 add at a time into the existing
 * value, ((w + d_first) + d_2) + ..., zk_encoder_backward's order and so
 * its bits (__fadd_rn: adds only, nothing to contract, and nvcc does not
 * reassociate). No atomics on dwte; the split depends on V and C only,
 * never on the GPU.
 *
 * Before, thread (c, id % 32) walked all N positions: 2.0 ms on an H100 at
 * GPT-2 124M (B=16, T=1024: N = 16384, C = 768, V = 50257), latency-bound
 * serial loops. Now NB = 2^lg blocks (NB * 256 >= V: 256 at GPT-2) of 256
 * threads; block b owns the ids with id % NB == b, key r = id / NB < 256:
 * strided, not contiguous, so the frequent tokens (BPE's low ids) land in
 * different blocks. A block:
 *  1. scans all N ids, rounds of 2048 (8 loads a thread issued together,
 *     coalesced, from L2), and appends its positions in (b,t) order to a
 *     shared list: a ballot per warp and sub-round, an exclusive scan of
 *     the 64 (sub-round, warp) counts;
 *  2. flushes the list when the next round would overflow it (EB_CAP) and
 *     at the end: counts per key, a stable counting sort by key (warp 0,
 *     __match_any_sync ranks 32 entries at a time), so each id's positions
 *     form a run, still in (b,t) order; then units (window of EB_U sorted
 *     entries x 64 columns, 2 a lane) go to whichever warp is free: a unit
 *     owns the runs STARTING in its window (its last run may go past it),
 *     loads each run's dwte value and its first dout rows together, the
 *     rest of a long run EB_UL rows at a time, adds in order in registers
 *     and stores once per run and flush. A row whose occurrences span
 *     flushes is stored and reloaded (flushes in position order, a
 *     __syncthreads between).
 * 23.3 KB shared; 2 blocks an SM (__launch_bounds__: <= 128 registers).
 * Roofline at 124M: dout read once, N*C*4 = 50 MB; the touched dwte rows
 * read and written (~6-8K distinct ids in 16K real tokens: ~40 MB; all
 * distinct: 100 MB); the ids, 256 blocks x 64 KB = 17 MB from L2. ~27 us
 * at 3.35 TB/s (~45 us all distinct). Scan: 8 rounds, a few us a block.
 * A run is a serial chain: the commonest token (~3-4% of real text, ~600
 * rows) is 19 batches of 32 rows in each of its 12 units, on 8 warps (two
 * waves): ~40 memory latencies, ~20-30 us, beside the rest. Worst case,
 * every position one id: one block streams 50 MB through 8 warps, 8
 * flushes: ~0.5-0.8 ms. Not yet timed on a GPU; checked on the CPU under
 * spec/emu (sh tools/emu_kernel.sh embedding). Ids outside [0,V): counted
 * once each by block 0, added to no row. D: dout's type, float or
 * uint16_t (bf16 widened as loaded; the loads 2 bytes a lane, a warp's 64
 * contiguous bytes, half the f32 kernel's bytes).
 *
 * A bf16 run's gradients ("g16", zkc_encoder_backward_g16): dwte and dwpe
 * bf16, written by the op with no fp32 image of them and no cast after
 * (G, the gradients' type: float, or uint16_t). Each dwte element must be
 * round(widen(dwte) + the f32 kernel's adds in the f32 kernel's order),
 * ONE rounding: a row is widened at its run's first load, carried in fp32
 * and rounded at its last store. The f32 kernel's store and reload of a
 * row between flushes would round it once per flush, so the bf16 kernel
 * (k_enc_bwd_wte16) plans its flushes so that no row spans two but a
 * giant one: it first counts each key's positions (one more scan of the
 * ids), then takes the keys in ranges [k0, k1) of at most EB_CAP
 * positions, one scan and one flush each (a list never overflows), and a
 * key with more than EB_CAP positions alone, over several flushes, its
 * fp32 row carried between them in the block's spill row (C floats of
 * global scratch a block: one such key at a time) instead of dwte. The
 * adds are the f32 kernel's, in the same order, on the same values: the
 * f32 kernel's dwte on widen(dwte), rounded once, bit for bit. Cost: a
 * counting scan, and a scan of the ids per range -- one range for a block
 * holding <= EB_CAP positions (all of GPT-2's at B*T = 16K but the blocks
 * of the commonest tokens). The f32 instantiations (G = float) are the
 * kernel of before: every g16 branch is compiled out. dwpe: the f32 sum
 * over b, rounded once. */
#define EB_THREADS 256                 /* 8 warps */
#define EB_WARPS (EB_THREADS / 32)
#define EB_TPT 8                       /* ids per thread per scan round */
#define EB_CAP (EB_TPT * EB_THREADS)   /* list entries (a round fits) */
#define EB_KEYS 256                    /* ids per block at most (key: u8) */
#define EB_U 8                         /* sorted entries per window/batch */
#define EB_UL 32                       /* dout rows per batch in a long run */
#define EB_COLS 64                     /* columns per unit: 2 a lane */

struct eb_list {
    int pos[EB_CAP];                   /* gathered positions, (b,t) order */
    int spos[EB_CAP];                  /* the same sorted by key, stably */
    unsigned char key[EB_CAP], skey[EB_CAP];
    int cnt[EB_KEYS], start[EB_KEYS], cur[EB_KEYS];   /* per key: run size, start */
    int wofs[EB_TPT * EB_WARPS];       /* per (sub-round, warp): offset */
    int total, next;
};

/* g16's state beside the list (G = uint16_t; unused, compiled out, for
 * float): each key's positions in the block (tot) and those flushed so far
 * in its range (seen), in shared memory; the block's spill row (C floats)
 * holding the one key whose run spans flushes, between them */
struct eb_carry {
    const int *tot;
    int *seen;
    float *spill;
};

/* runs [gs, ge) of the sorted list, columns c0 = s*64 + lane and c0 + 32:
 * each run's dwte value once, its dout rows in order, stored once. G16: a
 * run continuing an earlier flush's (seen) starts from the spill row, one
 * continued in a later flush (seen + cnt < tot) ends in it: only the last
 * flush's store rounds (zkc_put), the first flush's load widens (zkc_get) */
template <class D, class G>
__device__ __forceinline__ void eb_unit(G *dwte, const D *dout, const eb_list &L,
                                        int C, int b, int lg, int gs, int ge, int c0,
                                        eb_carry cy)
{
    const bool G16 = sizeof(G) == 2;
    int c1 = c0 + 32;
    bool ok0 = c0 < C, ok1 = c1 < C;
    float a0 = 0.0f, a1 = 0.0f;                     /* the current run's value */
    int j = gs;
    while (j < ge) {
        int r = L.skey[j], e = L.start[r] + L.cnt[r];
        if (e - j > EB_U) {
            /* long run [j, e): its dout rows EB_UL at a time, the dwte
             * value (if j starts it) loaded with the first batch; the
             * positions read from shared first, then every load issued */
            bool fst = j == L.start[r];
            G *wr = dwte + (size_t)(b + (r << lg)) * C;
            float w0 = 0.0f, w1 = 0.0f;
            if (G16 && fst && cy.seen[r] > 0) {
                if (ok0) w0 = cy.spill[c0];
                if (ok1) w1 = cy.spill[c1];
            } else if (fst) {
                if (ok0) w0 = zkc_get(wr + c0);
                if (ok1) w1 = zkc_get(wr + c1);
            }
            for (; j < e; j += EB_UL) {
                int p[EB_UL];
                float d0[EB_UL], d1[EB_UL];
#pragma unroll
                for (int k = 0; k < EB_UL; k++) p[k] = L.spos[min(j + k, e - 1)];
#pragma unroll
                for (int k = 0; k < EB_UL; k++) {
                    d0[k] = d1[k] = 0.0f;
                    if (j + k < e) {
                        const D *dr = dout + (size_t)p[k] * C;
                        if (ok0) d0[k] = zkc_get(dr + c0);
                        if (ok1) d1[k] = zkc_get(dr + c1);
                    }
                }
#pragma unroll
                for (int k = 0; k < EB_UL; k++) {
                    if (j + k >= e) break;
                    if (fst && k == 0) { a0 = __fadd_rn(w0, d0[0]); a1 = __fadd_rn(w1, d1[0]); }
                    else { a0 = __fadd_rn(a0, d0[k]); a1 = __fadd_rn(a1, d1[k]); }
                }
                fst = false;
            }
            if (G16 && cy.seen[r] + L.cnt[r] < cy.tot[r]) {
                if (ok0) cy.spill[c0] = a0;
                if (ok1) cy.spill[c1] = a1;
            } else {
                if (ok0) zkc_put(wr + c0, a0);
                if (ok1) zkc_put(wr + c1, a1);
            }
            j = e;
            continue;
        }
        /* a batch of up to EB_U entries, several runs: keys, positions and
         * run bounds from shared first, then all loads, then the adds */
        int n = min(EB_U, ge - j), rk[EB_U], p[EB_U];
        unsigned fm = 0, lm = 0;                    /* bit k: entry j+k starts, ends a run */
#pragma unroll
        for (int k = 0; k < EB_U; k++) {
            int jj = min(j + k, ge - 1);
            rk[k] = L.skey[jj];
            p[k] = L.spos[jj];
        }
#pragma unroll
        for (int k = 0; k < EB_U; k++) {
            int s0 = L.start[rk[k]];
            if (j + k == s0) fm |= 1u << k;
            if (j + k == s0 + L.cnt[rk[k]] - 1) lm |= 1u << k;
        }
        float d0[EB_U], d1[EB_U], w0[EB_U], w1[EB_U];
#pragma unroll
        for (int k = 0; k < EB_U; k++) {
            d0[k] = d1[k] = w0[k] = w1[k] = 0.0f;
            if (k < n) {
                const D *dr = dout + (size_t)p[k] * C;
                if (ok0) d0[k] = zkc_get(dr + c0);
                if (ok1) d1[k] = zkc_get(dr + c1);
                if (G16 && (fm >> k & 1u) && cy.seen[rk[k]] > 0) {
                    if (ok0) w0[k] = cy.spill[c0];
                    if (ok1) w1[k] = cy.spill[c1];
                } else if (fm >> k & 1u) {
                    const G *wr = dwte + (size_t)(b + (rk[k] << lg)) * C;
                    if (ok0) w0[k] = zkc_get(wr + c0);
                    if (ok1) w1[k] = zkc_get(wr + c1);
                }
            }
        }
#pragma unroll
        for (int k = 0; k < EB_U; k++) {
            if (k >= n) break;
            if (fm >> k & 1u) { a0 = __fadd_rn(w0[k], d0[k]); a1 = __fadd_rn(w1[k], d1[k]); }
            else { a0 = __fadd_rn(a0, d0[k]); a1 = __fadd_rn(a1, d1[k]); }
            if (G16 && (lm >> k & 1u) && cy.seen[rk[k]] + L.cnt[rk[k]] < cy.tot[rk[k]]) {
                if (ok0) cy.spill[c0] = a0;
                if (ok1) cy.spill[c1] = a1;
            } else if (lm >> k & 1u) {
                G *wr = dwte + (size_t)(b + (rk[k] << lg)) * C;
                if (ok0) zkc_put(wr + c0, a0);
                if (ok1) zkc_put(wr + c1, a1);
            }
        }
        j += n;
    }
}

/* the list's n entries into dwte: sort by key (stable), then the units;
 * G16: then each key's flushed positions counted into cy.seen */
template <class D, class G>
__device__ static void eb_flush(G *dwte, const D *dout, eb_list &L, int n, int C,
                                int b, int lg, eb_carry cy)
{
    int tid = threadIdx.x, lane = tid % 32, w = tid / 32;
    unsigned lt = (1u << lane) - 1u;
    __syncthreads();                                /* the list complete */
    for (int r = tid; r < EB_KEYS; r += EB_THREADS) L.cnt[r] = 0;
    if (tid == 0) L.next = 0;
    __syncthreads();
    /* counts per key: one shared atomic per distinct key in 32 entries */
    for (int j0 = w * 32; j0 < n; j0 += EB_THREADS) {
        int j = j0 + lane, k = j < n ? L.key[j] : -1;
        unsigned m = __match_any_sync(0xffffffffu, k);
        if (k >= 0 && !(m & lt)) atomicAdd(&L.cnt[k], __popc(m));
    }
    __syncthreads();
    if (w == 0) {
        /* start = exclusive scan of cnt (8 keys a lane), then a stable
         * scatter 32 entries at a time: rank among equal keys by lane */
        int base = lane * (EB_KEYS / 32), s = 0;
        for (int i = 0; i < EB_KEYS / 32; i++) s += L.cnt[base + i];
        int inc = s;
        for (int o = 1; o < 32; o <<= 1) {
            int v = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += v;
        }
        int run = inc - s;
        for (int i = 0; i < EB_KEYS / 32; i++) {
            L.start[base + i] = L.cur[base + i] = run;
            run += L.cnt[base + i];
        }
        __syncwarp();
        for (int j0 = 0; j0 < n; j0 += 32) {
            int j = j0 + lane, k = j < n ? L.key[j] : -1;
            unsigned m = __match_any_sync(0xffffffffu, k);
            int d = k >= 0 ? L.cur[k] + __popc(m & lt) : 0;
            if (k >= 0) { L.spos[d] = L.pos[j]; L.skey[d] = (unsigned char)k; }
            __syncwarp();
            if (k >= 0 && !(m & lt)) L.cur[k] += __popc(m);
            __syncwarp();
        }
    }
    __syncthreads();
    /* units (window, 64 columns), taken in turn by whichever warp is free:
     * each writes elements no other unit touches, so the order they run in
     * changes nothing */
    int S = (C + EB_COLS - 1) / EB_COLS, nu = (n + EB_U - 1) / EB_U * S;
    for (;;) {
        int u = 0;
        if (lane == 0) u = atomicAdd(&L.next, 1);
        u = __shfl_sync(0xffffffffu, u, 0);
        if (u >= nu) break;
        int j0 = u / S * EB_U, jl = min(j0 + EB_U, n) - 1;
        int r0 = L.skey[j0], gs = j0 == L.start[r0] ? j0 : L.start[r0] + L.cnt[r0];
        if (gs > jl) continue;                      /* no run starts here */
        int rl = L.skey[jl];
        eb_unit(dwte, dout, L, C, b, lg, gs, L.start[rl] + L.cnt[rl], u % S * EB_COLS + lane, cy);
    }
    __syncthreads();                                /* dwte rows stored */
    if (sizeof(G) == 2)                             /* read after the next flush's barriers */
        for (int r = tid; r < EB_KEYS; r += EB_THREADS) cy.seen[r] += L.cnt[r];
}

/* A round's ids, positions base + k EB_THREADS + tid (all loads first;
 * N >= 1: positions past N read the last id, ignored by eb_owned) */
__device__ __forceinline__ void eb_load(int (&key)[EB_TPT], const int32_t *tok, int base, int N)
{
#pragma unroll
    for (int k = 0; k < EB_TPT; k++) key[k] = tok[min(base + k * EB_THREADS + (int)threadIdx.x, N - 1)];
}

/* Position e's id: its key (id >> lg) if it is a position (e < N), a good
 * id (0 <= id < V) and this block's (id mod 2^lg = b), else -1; a bad id
 * counted in *nbad by block 0 (the scan that counts them) */
__device__ __forceinline__ int eb_owned(int e, int id, int N, int V, int lg, int *nbad)
{
    bool in = e < N && id >= 0 && id < V;
    if (nbad && e < N && !in && blockIdx.x == 0) (*nbad)++;
    return in && ((unsigned)id & ((1u << lg) - 1u)) == blockIdx.x ? id >> lg : -1;
}

/* One scan of the N ids, rounds of EB_CAP: the block's positions (RANGED:
 * only those whose key is in [k0, k1)) appended to the list in (b,t)
 * order, the list flushed when the next round would overflow it, and at
 * the end. Returns the bad ids seen by block 0 (!RANGED: the scan that
 * counts them). */
template <class D, class G, bool RANGED>
__device__ __forceinline__ int eb_scan(G *dwte, const D *dout, const int32_t *tok, eb_list &L,
                                       int N, int C, int V, int lg, int k0, int k1, eb_carry cy)
{
    int tid = threadIdx.x, lane = tid % 32, w = tid / 32, b = blockIdx.x, nbad = 0, n = 0;
    unsigned lt = (1u << lane) - 1u;
    for (int base = 0; base < N; base += EB_CAP) {
        int key[EB_TPT];
        unsigned m[EB_TPT];
        eb_load(key, tok, base, N);
#pragma unroll
        for (int k = 0; k < EB_TPT; k++) {
            int kk = eb_owned(base + k * EB_THREADS + tid, key[k], N, V, lg, RANGED ? nullptr : &nbad);
            bool in = kk >= 0 && (!RANGED || (unsigned)(kk - k0) < (unsigned)(k1 - k0));
            key[k] = in ? kk : -1;
            m[k] = __ballot_sync(0xffffffffu, in);
            if (lane == 0) L.wofs[k * EB_WARPS + w] = __popc(m[k]);
        }
        __syncthreads();
        if (w == 0) {                               /* 64 counts, 2 a lane */
            int c0 = L.wofs[2 * lane], c1 = L.wofs[2 * lane + 1], inc = c0 + c1;
            for (int o = 1; o < 32; o <<= 1) {
                int v = __shfl_up_sync(0xffffffffu, inc, o);
                if (lane >= o) inc += v;
            }
            __syncwarp();
            L.wofs[2 * lane] = inc - c0 - c1;
            L.wofs[2 * lane + 1] = inc - c1;
            if (lane == 31) L.total = inc;
        }
        __syncthreads();
        int total = L.total;
        if (n + total > EB_CAP) { eb_flush(dwte, dout, L, n, C, b, lg, cy); n = 0; }
#pragma unroll
        for (int k = 0; k < EB_TPT; k++)
            if (key[k] >= 0) {
                int d = n + L.wofs[k * EB_WARPS + w] + __popc(m[k] & lt);
                L.pos[d] = base + k * EB_THREADS + tid;
                L.key[d] = (unsigned char)key[k];
            }
        n += total;
    }
    if (n > 0) eb_flush(dwte, dout, L, n, C, b, lg, cy);
    return nbad;
}

/* grid NB = 2^lg blocks; block b: the ids b + r * NB, r < EB_KEYS */
template <class D>
__global__ static void __launch_bounds__(EB_THREADS, 2)
k_enc_bwd_wte(float *dwte, const D *dout, const int32_t *tok, int N, int C, int V, int lg,
              int *bad)
{
    __shared__ eb_list L;
    int nbad = eb_scan<D, float, false>(dwte, dout, tok, L, N, C, V, lg, 0, EB_KEYS, eb_carry{});
    if (nbad) atomicAdd(bad, nbad);
}

/* The same into a bf16 dwte (g16, the header's plan): count each key's
 * positions (the bad ids too, block 0), then ranges [k0, k1) of keys, one
 * scan each: at most EB_CAP positions (one flush), or one key alone (its
 * row carried in spill, this block's C floats, across the flushes) */
template <class D>
__global__ static void __launch_bounds__(EB_THREADS, 2)
k_enc_bwd_wte16(uint16_t *dwte, const D *dout, const int32_t *tok, int N, int C, int V, int lg,
                int *bad, float *spill)
{
    __shared__ eb_list L;
    __shared__ int tot[EB_KEYS], seen[EB_KEYS], rng[2];
    int tid = threadIdx.x, lane = tid % 32, b = blockIdx.x, nbad = 0;
    unsigned lt = (1u << lane) - 1u;
    for (int r = tid; r < EB_KEYS; r += EB_THREADS) tot[r] = seen[r] = 0;
    __syncthreads();
    for (int base = 0; base < N; base += EB_CAP) {
        int key[EB_TPT];
        eb_load(key, tok, base, N);
#pragma unroll
        for (int k = 0; k < EB_TPT; k++) {
            int kk = eb_owned(base + k * EB_THREADS + tid, key[k], N, V, lg, &nbad);
            unsigned mm = __match_any_sync(0xffffffffu, kk);  /* one shared atomic a key */
            if (kk >= 0 && !(mm & lt)) atomicAdd(&tot[kk], __popc(mm));
        }
    }
    __syncthreads();
    eb_carry cy = { tot, seen, spill + (size_t)b * C };
    for (int k0 = 0;;) {
        if (tid == 0) {                             /* the next range: keys with positions */
            while (k0 < EB_KEYS && tot[k0] == 0) k0++;
            int k1 = k0, sum = 0;
            while (k1 < EB_KEYS && (k1 == k0 || sum + tot[k1] <= EB_CAP)) sum += tot[k1++];
            rng[0] = k0;
            rng[1] = k1;
        }
        __syncthreads();
        k0 = rng[0];
        int k1 = rng[1];
        __syncthreads();                            /* read before thread 0's next write */
        if (k0 >= EB_KEYS) break;
        eb_scan<D, uint16_t, true>(dwte, dout, tok, L, N, C, V, lg, k0, k1, cy);
        k0 = k1;
    }
    if (nbad) atomicAdd(bad, nbad);
}

/* dwpe rows [0,T) = sum over b in order; G uint16_t (g16): rounded once */
template <class D, class G>
__global__ static void k_enc_bwd_wpe(G *dwpe, const D *dout, int B, int T, int C)
{
    ZKC_FOR(i, (size_t)T * C) {
        float s = 0.0f;
        for (int b = 0; b < B; b++) s += zkc_get(dout + (size_t)b * T * C + i);
        zkc_put(dwpe + i, s);
    }
}

template <class O>
static int enc_fwd(cudaStream_t s, O *out, const int32_t *tok, const void *wte, const void *wpe,
                   int w16, int B, int T, int C, int V, int *dbad)
{
    size_t n = (size_t)B * T * C;
    if (n == 0) return 0;
    const uint16_t *te = (const uint16_t *)wte, *pe = (const uint16_t *)wpe;
    const float *tf = (const float *)wte, *pf = (const float *)wpe;
    unsigned g = zkc_grid(n, 256);
    if (w16) k_enc_fwd<<<g, 256, 0, s>>>(out, tok, te, pe, B * T, T, C, V, dbad);
    else k_enc_fwd<<<g, 256, 0, s>>>(out, tok, tf, pf, B * T, T, C, V, dbad);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_encoder_forward(cudaStream_t s, float *out, const int32_t *tok,
                                   const void *wte, const void *wpe, int w16, int B, int T,
                                   int C, int V, int *dbad)
{
    return enc_fwd(s, out, tok, wte, wpe, w16, B, T, C, V, dbad);
}

extern "C" int zkc_encoder_forward_o16(cudaStream_t s, uint16_t *out, const int32_t *tok,
                                       const void *wte, const void *wpe, int w16, int B, int T,
                                       int C, int V, int *dbad)
{
    return enc_fwd(s, out, tok, wte, wpe, w16, B, T, C, V, dbad);
}

/* NB = 2^lg blocks, NB * EB_KEYS >= V */
static int enc_bwd_lg(int V)
{
    int lg = 0;
    while (((int64_t)EB_KEYS << lg) < (int64_t)V) lg++;
    return lg;
}

/* G: dwte's and dwpe's type (uint16_t: g16, spill the scratch's NB x C
 * floats) */
template <class D, class G>
static int enc_bwd(cudaStream_t s, G *dwte, G *dwpe, const D *dout, const int32_t *tok,
                   int B, int T, int C, int V, int *dbad, float *spill)
{
    if ((size_t)B * T * C == 0) return 0;
    int lg = enc_bwd_lg(V);
    unsigned nb = 1u << lg;
    if (sizeof(G) == 2) k_enc_bwd_wte16<D><<<nb, EB_THREADS, 0, s>>>((uint16_t *)dwte, dout, tok, B * T, C, V, lg, dbad, spill);
    else k_enc_bwd_wte<D><<<nb, EB_THREADS, 0, s>>>((float *)dwte, dout, tok, B * T, C, V, lg, dbad);
    int e = ZKC_LAUNCHED();
    if (e) return e;
    if (!dwpe) return 0;                            /* no positions (Llama's) */
    k_enc_bwd_wpe<D, G><<<zkc_grid((size_t)T * C, 256), 256, 0, s>>>(dwpe, dout, B, T, C);
    return ZKC_LAUNCHED();
}

extern "C" int zkc_encoder_backward(cudaStream_t s, float *dwte, float *dwpe, const float *dout,
                                    const int32_t *tok, int B, int T, int C, int V, int *dbad)
{
    return enc_bwd(s, dwte, dwpe, dout, tok, B, T, C, V, dbad, (float *)NULL);
}

extern "C" int zkc_encoder_backward_b16(cudaStream_t s, float *dwte, float *dwpe,
                                        const uint16_t *dout, const int32_t *tok, int B, int T,
                                        int C, int V, int *dbad)
{
    return enc_bwd(s, dwte, dwpe, dout, tok, B, T, C, V, dbad, (float *)NULL);
}

extern "C" size_t zkc_encoder_backward_g16_scratch(int C, int V)
{
    return C > 0 ? ((size_t)1 << enc_bwd_lg(V)) * (size_t)C : 0;
}

extern "C" int zkc_encoder_backward_g16(cudaStream_t s, uint16_t *dwte, uint16_t *dwpe,
                                        const void *dout, int d16, const int32_t *tok, int B,
                                        int T, int C, int V, int *dbad, float *scratch)
{
    if ((size_t)B * T * C != 0 && !scratch) return (int)cudaErrorInvalidValue;
    if (d16) return enc_bwd(s, dwte, dwpe, (const uint16_t *)dout, tok, B, T, C, V, dbad, scratch);
    return enc_bwd(s, dwte, dwpe, (const float *)dout, tok, B, T, C, V, dbad, scratch);
}
