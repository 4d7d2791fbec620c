/*
 * cuda_emu.h -- just enough of CUDA to run kernels/cuda/attention_tc_*.cu's
 * source (and layernorm.cu's, xent.cu's, colsum.cu's, embedding.cu's,
 * reduce.cu's, adamw.cu's) on the CPU (tools/emu_kernel.sh),
 * where no GPU is lent.
 *
 * A block's threads are fibers on the calling thread (on x86-64 switched
 * by emu_ctx_switch below, elsewhere by ucontext), run
 * round-robin: each runs until it waits at a barrier (__syncthreads, and
 * __syncwarp for its warp), then the next; a barrier releases when its
 * last thread arrives. Deterministic, and a missing barrier shows at once
 * (a thread runs ahead of the rest until its next barrier, reading what
 * the others have not written yet; passes alternate the thread order, so
 * a read of a lower or a higher thread's data both show); a barrier some
 * thread never reaches aborts with a message instead of spinning. Real threads cost this machine
 * minutes of futex traffic a run; fibers a context switch a wait.
 * __shfl_xor_sync goes through a per-warp array; blocks run one after
 * another, so a __shared__ array (a static) is the block's. mma.sync m16n8k16 bf16 and ldmatrix (kernels/cuda/mma.cuh's
 * functions) by the PTX ISA's per-lane register layouts: below, before
 * WMMA. WMMA (no kernel uses it now) by its documented meaning, not the hardware's register
 * layout: every lane holds the whole 16x16 tile, load/mma are computed by
 * each lane, store writes each element from one lane (element e from lane
 * e % 32); none of them synchronises the warp, so a missing __syncwarp
 * around a store shows as a lane reading what the others have not written.
 * Pointers of load/store must be 32-byte aligned and ldm a multiple of 8
 * (16-bit) or 4 (float), as CUDA requires: checked, abort on a violation.
 * Products are summed in k order in fp32 (tensor cores: another order).
 */
#ifndef ZT_CUDA_EMU_H
#define ZT_CUDA_EMU_H
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
using std::min;

struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
static dim3 threadIdx, blockIdx;          /* the running fiber's (emu_launch sets them) */
static dim3 gridDim, blockDim;
typedef void *cudaStream_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
static inline int cudaGetLastError(void) { return 0; }
/* the device the emulator stands for: an sm_90's shared memory a block
 * (227 KB with the opt-in); a kernel's opt-in above it is refused */
enum { EMU_SMEM_OPTIN = 232448 };
enum { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97, cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
static inline int cudaGetDevice(int *d) { *d = 0; return 0; }
static inline int cudaDeviceGetAttribute(int *v, int attr, int)
{
    if (attr != cudaDevAttrMaxSharedMemoryPerBlockOptin) return cudaErrorInvalidValue;
    *v = EMU_SMEM_OPTIN;
    return 0;
}
/* the code a kernel runs: the emulator's is the source, as built for sm_90 */
struct cudaFuncAttributes { int ptxVersion, binaryVersion; };
template <class K> static inline int cudaFuncGetAttributes(cudaFuncAttributes *fa, K)
{
    fa->ptxVersion = fa->binaryVersion = 90;
    return 0;
}
static int emu_optin;                         /* the last opt-in granted (any kernel's) */
template <class K> static inline int cudaFuncSetAttribute(K, int attr, int v)
{
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || v < 0 || v > EMU_SMEM_OPTIN)
        return cudaErrorInvalidValue;
    emu_optin = v;
    return 0;
}
#define ZKC_LAUNCHED() ((int)cudaGetLastError())

/* The fibers of the block running: their contexts, the scheduler's, and
 * which one runs. A barrier counts arrivals; the last to arrive starts its
 * next generation, and the others, resumed in turn, see it and go on. */
struct emu_fiber { ucontext_t ctx; void *sp; dim3 tid; bool done; };
static std::vector<emu_fiber> emu_fibers;
static std::vector<char *> emu_stacks;
[[maybe_unused]] static ucontext_t emu_sched;   /* (the ucontext switch) */
static int emu_cur;
enum { EMU_STACK = 256 << 10 };
struct emu_bar { int expected, arrived; unsigned gen; };
static emu_bar emu_block_bar, emu_warp_bar[32];
#if defined(__x86_64__)
/* A switch on x86-64: push the callee-saved registers, keep the stack
 * pointer in *from, take to's, pop its registers and return into it (a new
 * fiber's stack is laid out so that this returns into emu_entry).
 * swapcontext also saves and sets the signal mask, a system call a switch:
 * a third of the emulator's time. The x87 and SSE control words are not
 * switched: no kernel here changes them. */
extern "C" void emu_ctx_switch(void **from, void *to);
asm(".text\n.type emu_ctx_switch,@function\nemu_ctx_switch:\n"
    "\tpushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n"
    "\tmovq %rsp, (%rdi)\n\tmovq %rsi, %rsp\n"
    "\tpopq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n\tret\n"
    ".size emu_ctx_switch, .-emu_ctx_switch\n");
static void *emu_sched_sp;
static inline void emu_yield(void) { emu_ctx_switch(&emu_fibers[(size_t)emu_cur].sp, emu_sched_sp); }
#else
static inline void emu_yield(void) { swapcontext(&emu_fibers[(size_t)emu_cur].ctx, &emu_sched); }
#endif
static unsigned long emu_progress;            /* arrivals and finished threads: the scheduler's pulse */
/* the generation of the block barrier each thread waits at (-1: none; the
 * warp-major schedule below) */
static long emu_at_block[1024];
static inline void emu_wait(emu_bar *b)
{
    unsigned g = b->gen;
    emu_progress++;
    if (++b->arrived == b->expected) { b->arrived = 0; b->gen++; return; }
    if (b == &emu_block_bar) emu_at_block[threadIdx.x] = g;
    while (b->gen == g) emu_yield();
    emu_at_block[threadIdx.x] = -1;
}
static float emu_xchg[32][32];
/* cp.async (mma.cuh): each thread's copies not yet waited for, with the
 * group they belong to (its commits so far), and those waited for, which
 * land as the thread arrives at its next __syncthreads: the pattern is
 * wait, barrier, read, and a wait placed after the barrier leaves the
 * others' reads with the old bytes (a thread reading its own copies
 * before a barrier is not modelled: it would read the old bytes too) */
struct emu_cp { void *dst; const void *src; bool full; unsigned grp; };
static std::vector<emu_cp> emu_cps[1024], emu_cps_done[1024];
static unsigned emu_cp_grp[1024];
static inline void emu_cp_land(int t)
{
    for (const emu_cp &c : emu_cps_done[t]) {
        if (c.full) memcpy(c.dst, c.src, 16);
        else memset(c.dst, 0, 16);
    }
    emu_cps_done[t].clear();
}
static inline void __syncthreads(void) { emu_cp_land((int)threadIdx.x); emu_wait(&emu_block_bar); }
static inline void __syncwarp(void) { emu_wait(&emu_warp_bar[threadIdx.x / 32]); }
static inline float __shfl_xor_sync(unsigned, float v, int o)
{
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    __syncwarp();
    emu_xchg[w][l] = v;
    __syncwarp();
    float r = emu_xchg[w][l ^ o];
    __syncwarp();
    return r;
}
static inline float zkc_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static inline float zkc_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* a memset on the "stream" (kernels/cuda/colsum.cu's empty sums) */
static inline int cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t) { memset(p, v, n); return 0; }

/* bit casts and an int atomicAdd (kernels/cuda/xent.cu) */
static inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
/* fp32 atomicAdd (attention_tc_bwd.cu's -DZKC_ATTN_TC_DQ_ATOMIC variant): a CAS loop */
static inline float atomicAdd(float *p, float v)
{
    uint32_t *u = (uint32_t *)p, old = __atomic_load_n(u, __ATOMIC_SEQ_CST), nu;
    do {
        float f;
        memcpy(&f, &old, 4);
        f += v;
        memcpy(&nu, &f, 4);
    } while (!__atomic_compare_exchange_n(u, &old, nu, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    float r;
    memcpy(&r, &old, 4);
    return r;
}

/* the kernels' own helpers (grid-stride loops, bf16 outputs): the same
 * file nvcc compiles, now that the names it uses are defined above */
#include "../../kernels/cuda/portable.cuh"

/* warp votes and int shuffles (kernels/cuda/embedding.cu's compaction and
 * stable sort): full-warp masks only, every lane calls (as CUDA requires of
 * a full mask). Each goes through a per-warp array, two in turn: one
 * barrier a call (a lane's next write to an array is past the barrier of
 * the call between, which every lane reaches after its read). */
static uint32_t emu_xchg_u[2][32][32];
static int emu_xchg_ph[1024];                 /* each thread's phase (emu_launch zeroes them) */
static int emu_rec_ph[1024];                  /* mma.sync's records' (below) */
static inline uint32_t *emu_warp_put(uint32_t v)
{
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    int ph = emu_xchg_ph[threadIdx.x] ^= 1;
    emu_xchg_u[ph][w][l] = v;
    __syncwarp();
    return emu_xchg_u[ph][w];
}
static inline uint32_t emu_warp_xchg(uint32_t v, int src)
{
    uint32_t *a = emu_warp_put(v);
    return src >= 0 && src < 32 ? a[src] : v;
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline unsigned __ballot_sync(unsigned, int p)
{
    uint32_t *a = emu_warp_put(p != 0);
    unsigned m = 0;
    for (int i = 0; i < 32; i++) m |= a[i] << i;
    return m;
}
static inline unsigned __match_any_sync(unsigned, int v)
{
    uint32_t *a = emu_warp_put((uint32_t)v);
    unsigned m = 0;
    for (int i = 0; i < 32; i++) m |= (unsigned)(a[i] == (uint32_t)v) << i;
    return m;
}
static inline int __shfl_sync(unsigned, int v, int src) { return (int)emu_warp_xchg((uint32_t)v, src & 31); }
static inline int __shfl_up_sync(unsigned, int v, unsigned d)
{
    int l = threadIdx.x % 32;
    return (int)emu_warp_xchg((uint32_t)v, l >= (int)d ? l - (int)d : l);
}
/* fp32 add rounded to nearest, never contracted (g++ -O2 rounds a + b so) */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }

/* f() on every thread of every block of grid g, blocks in turn; a
 * block's threads as fibers (above), each on its own stack */
static void *emu_fn;
static void (*emu_call)(void *);
/* the order emu_launch runs a grid's blocks: 0 linear (x fastest), 1 its
 * reverse; a test sets it through emu_set_block_order (C linkage: the
 * test's C file calls it) */
static int emu_block_order;
extern "C" void emu_set_block_order(int o) { emu_block_order = o; }
static int emu_warp_major;                    /* emu_launch's schedule (below) */
extern "C" void emu_set_warp_major(int on) { emu_warp_major = on; }
/* A launch's dynamic shared memory (its third argument): its bytes end at
 * a page no one may touch (a read or write past the size asked for
 * faults), and a block finds them all 0xff (NaN as bf16 or fp32: a read of
 * a byte no thread wrote shows). */
static unsigned char *emu_dyn;
static inline unsigned char *zkc_dyn_smem(void) { return emu_dyn; }
static inline void __trap(void) { fprintf(stderr, "emu: __trap\n"); abort(); }
template <class F> static void emu_call_as(void *f) { (*(F *)f)(); }
static void emu_entry(void)
{
    emu_call(emu_fn);
    emu_fibers[(size_t)emu_cur].done = true;
    emu_progress++;
#if defined(__x86_64__)
    emu_yield();                                  /* back to the scheduler, never resumed */
    abort();
#endif
}
/* fiber t ready to start on its stack st */
static void emu_fiber_start(int t, char *st)
{
    emu_fiber &fb = emu_fibers[(size_t)t];
#if defined(__x86_64__)
    void **p = (void **)(((uintptr_t)(st + EMU_STACK)) & ~(uintptr_t)15);
    *--p = NULL;                                  /* emu_entry's return slot: the ABI's alignment at entry */
    *--p = (void *)emu_entry;                     /* emu_ctx_switch returns here */
    for (int i = 0; i < 6; i++) *--p = NULL;      /* rbp, rbx, r12-r15 */
    fb.sp = p;
#else
    getcontext(&fb.ctx);
    fb.ctx.uc_stack.ss_sp = st;
    fb.ctx.uc_stack.ss_size = EMU_STACK;
    fb.ctx.uc_link = &emu_sched;
    makecontext(&fb.ctx, emu_entry, 0);
#endif
}
/* run fiber t until it waits or ends */
static void emu_run_fiber(int t)
{
#if defined(__x86_64__)
    emu_ctx_switch(&emu_sched_sp, emu_fibers[(size_t)t].sp);
#else
    swapcontext(&emu_sched, &emu_fibers[(size_t)t].ctx);
#endif
}

/* a pass in which no thread arrived anywhere or finished: a barrier some
 * thread never reaches (said, and aborted, instead of spinning) */
static void emu_deadlock(unsigned bx, unsigned by, int live)
{
    fprintf(stderr, "emu: block (%u,%u): %d threads wait at barriers no other thread "
            "reaches (a __syncthreads or __syncwarp behind a branch?)\n", bx, by, live);
    abort();
}

template <class F> static void emu_launch(dim3 g, int threads, F f, size_t dyn = 0)
{
    if (threads % 32 || threads > 1024) { fprintf(stderr, "emu: %d threads\n", threads); abort(); }
    if (dyn > (size_t)48 * 1024 && dyn > (size_t)emu_optin) {
        fprintf(stderr, "emu: %zu bytes of dynamic shared memory, %d opted into\n", dyn, emu_optin);
        abort();
    }
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), span = (dyn + pg - 1) / pg * pg;
    unsigned char *map = NULL;
    if (dyn) {
        map = (unsigned char *)mmap(NULL, span + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map == MAP_FAILED || mprotect(map + span, pg, PROT_NONE)) { perror("emu: dynamic shared memory"); abort(); }
        emu_dyn = map + span - dyn;               /* dyn: a multiple of 16 (aligned as the GPU's) */
    }
    gridDim = g;
    blockDim = dim3((unsigned)threads);
    emu_fn = &f;
    emu_call = emu_call_as<F>;
    emu_fibers.resize((size_t)threads);
    while (emu_stacks.size() < (size_t)threads) {
        char *st = (char *)malloc(EMU_STACK);
        if (!st) { fprintf(stderr, "emu: no memory for a fiber's stack\n"); abort(); }
        emu_stacks.push_back(st);
    }
    for (unsigned blk = 0; blk < g.x * g.y; blk++) {
            /* the blocks in linear order, or (emu_block_order 1) its
             * reverse: a kernel whose blocks pass work by tickets
             * (mma.cuh) must give the same bits either way */
            const unsigned lin = emu_block_order ? g.x * g.y - 1 - blk : blk, bx = lin % g.x, by = lin / g.x;
            blockIdx = dim3(bx, by);
            emu_block_bar = emu_bar{ threads, 0, 0 };
            for (int w = 0; w < threads / 32; w++) emu_warp_bar[w] = emu_bar{ 32, 0, 0 };
            memset(emu_xchg_ph, 0, sizeof emu_xchg_ph);
            memset(emu_rec_ph, 0, sizeof emu_rec_ph);
            if (dyn) memset(emu_dyn, 0xff, dyn);
            for (int t = 0; t < threads; t++) {
                emu_fiber &fb = emu_fibers[(size_t)t];
                fb.tid = dim3((unsigned)t);
                fb.done = false;
                emu_fiber_start(t, emu_stacks[(size_t)t]);
            }
            /* passes alternate ascending and descending thread order, so a
             * missing barrier shows whichever neighbour a thread reads; a
             * pass in which no thread arrived anywhere or finished is a
             * deadlock (a barrier some thread never reaches): said, and
             * aborted, instead of spinning */
            for (int t = 0; t < threads; t++) emu_at_block[t] = -1;
            /* emu_set_warp_major(1): a warp runs (its lanes in turn, through
             * its warp-wide operations) until every lane waits at a
             * __syncthreads or ends, then the next warp: warps as far apart
             * as a GPU may put them between two barriers, so a write into a
             * buffer another warp has still to read shows (the round-robin
             * below keeps warps within one warp-wide operation of each
             * other) */
            while (emu_warp_major) {
                unsigned long before = emu_progress;
                int live = 0;
                for (int w = 0; w < threads / 32; w++)
                    for (bool ran = true; ran;) {
                        ran = false;
                        for (int t = w * 32; t < w * 32 + 32; t++) {
                            if (emu_fibers[(size_t)t].done ||
                                emu_at_block[t] == (long)emu_block_bar.gen) continue;
                            unsigned long p0 = emu_progress;
                            emu_cur = t;
                            threadIdx = emu_fibers[(size_t)t].tid;
                            emu_run_fiber(t);
                            ran |= emu_progress != p0 || emu_fibers[(size_t)t].done;
                        }
                    }
                for (int t = 0; t < threads; t++) live += !emu_fibers[(size_t)t].done;
                if (live == 0) break;
                if (emu_progress == before) {
                    emu_deadlock(bx, by, live);
                }
            }
            for (int live = emu_warp_major ? 0 : threads, pass = 0; live > 0; pass++) {
                unsigned long before = emu_progress;
                live = 0;
                for (int k = 0; k < threads; k++) {
                    int t = pass % 2 ? threads - 1 - k : k;
                    if (emu_fibers[(size_t)t].done) continue;
                    emu_cur = t;
                    threadIdx = emu_fibers[(size_t)t].tid;
                    emu_run_fiber(t);
                    if (!emu_fibers[(size_t)t].done) live++;
                }
                if (live > 0 && emu_progress == before) {
                    emu_deadlock(bx, by, live);
                }
            }
            for (int t = 0; t < threads; t++) {
                if (!emu_cps[t].empty() || !emu_cps_done[t].empty()) {
                    fprintf(stderr, "emu: block (%u,%u) thread %d ends with %zu cp.async copies never "
                            "waited for, %zu waited for with no __syncthreads after\n", bx, by, t,
                            emu_cps[t].size(), emu_cps_done[t].size());
                    abort();
                }
                emu_cp_grp[t] = 0;
            }
        }
    if (map) munmap(map, span + pg);
    emu_dyn = NULL;
}

struct __nv_bfloat16 { uint16_t x; };
static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 b = { (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) };
    return b;
}
static inline float emu_f(__nv_bfloat16 b) { uint32_t u = (uint32_t)b.x << 16; float f; memcpy(&f, &u, 4); return f; }
static inline float emu_f(float f) { return f; }

/* ---- mma.sync / ldmatrix by the PTX ISA's per-lane layouts (the functions
 * of kernels/cuda/mma.cuh, whose asm cannot run here). Each lane holds only
 * its own registers: a call posts them to a per-warp record (two records in
 * turn, one barrier a call, as emu_warp_put) and each lane computes its own
 * results from the other lanes' posted registers by the documented maps, so
 * a fragment built with a wrong index gives wrong numbers. All 32 lanes
 * must call (.sync.aligned). g = lane / 4, t = lane % 4. */
struct emu_lane_rec { const void *p; uint32_t u[10]; };
static emu_lane_rec emu_recs[2][32][32];
static inline emu_lane_rec *emu_post(const emu_lane_rec &r)
{
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    int ph = emu_rec_ph[threadIdx.x] ^= 1;
    emu_recs[ph][w][l] = r;
    __syncwarp();
    return emu_recs[ph][w];
}
static inline uint16_t emu_half(uint32_t r, int hi) { return (uint16_t)(hi ? r >> 16 : r & 0xffffu); }
static inline float emu_bf(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }

/* ldmatrix .m8n8 .x{n} (.trans): lanes 8i .. 8i+7 give matrix i's rows
 * (16 bytes each, 16-byte aligned: checked); lane l gets r[i] =
 * M_i[l/4][2(l%4), +1], or with trans (M_i[2(l%4)][l/4], M_i[2(l%4)+1][l/4]) */
static inline void emu_ldmatrix(uint32_t *r, int n, const __nv_bfloat16 *p, bool trans)
{
    emu_lane_rec me = {};
    me.p = p;
    emu_lane_rec *all = emu_post(me);
    const int l = threadIdx.x % 32;
    for (int i = 0; i < n; i++) {
        uint16_t h[2];
        for (int e = 0; e < 2; e++) {
            int row = trans ? 2 * (l % 4) + e : l / 4, col = trans ? l / 4 : 2 * (l % 4) + e;
            const __nv_bfloat16 *rp = (const __nv_bfloat16 *)all[8 * i + row].p;
            if ((uintptr_t)rp % 16) {
                fprintf(stderr, "emu: ldmatrix row address %p of lane %d not 16-byte aligned\n",
                        (const void *)rp, 8 * i + row);
                abort();
            }
            h[e] = rp[col].x;
        }
        r[i] = (uint32_t)h[0] | (uint32_t)h[1] << 16;
    }
}
/* mma.cuh's shared address: here the pointer's value */
typedef uintptr_t zkc_sptr;
static inline zkc_sptr zkc_sptr_of(const void *p) { return (zkc_sptr)p; }
#define EMU_LDSM(n) static inline void zkc_ldmatrix_x##n(uint32_t r[n], zkc_sptr p) \
    { emu_ldmatrix(r, n, (const __nv_bfloat16 *)p, false); } \
    static inline void zkc_ldmatrix_x##n##_trans(uint32_t r[n], zkc_sptr p) \
    { emu_ldmatrix(r, n, (const __nv_bfloat16 *)p, true); }
EMU_LDSM(1)
EMU_LDSM(2)
EMU_LDSM(4)

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, d += a b: A(r, k) is
 * in lane (r%8)*4 + (k%8)/2, register (r >= 8) + 2 (k >= 8), half k & 1;
 * B(k, n) in lane n*4 + (k%8)/2, register (k >= 8), half k & 1; lane's
 * d[i] is D(g + 8 (i >= 2), 2t + (i & 1)). Summed in k order in fp32 (each
 * product exact; the tensor cores' order and rounding differ). */
static inline void zkc_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    emu_lane_rec me = {};
    for (int i = 0; i < 4; i++) me.u[i] = a[i];
    me.u[4] = b[0]; me.u[5] = b[1];
    emu_lane_rec *all = emu_post(me);
    const int l = threadIdx.x % 32, g = l / 4, t = l % 4;
    for (int i = 0; i < 4; i++) {
        const int r = g + 8 * (i >= 2), n = 2 * t + (i & 1);
        float s = d[i];
        for (int k = 0; k < 16; k++) {
            float av = emu_bf(emu_half(all[(r % 8) * 4 + (k % 8) / 2].u[(r >= 8) + 2 * (k >= 8)], k & 1));
            float bv = emu_bf(emu_half(all[n * 4 + (k % 8) / 2].u[4 + (k >= 8)], k & 1));
            s += av * bv;
        }
        d[i] = s;
    }
}
/* ex2.approx.ftz: exp2f here (the SFU's approximation differs by ~2^-22) */
static inline float zkc_exp2(float x) { return exp2f(x); }
static inline uint32_t zkc_pack_bf16(float lo, float hi)
{
    return (uint32_t)__float2bfloat16_rn(lo).x | (uint32_t)__float2bfloat16_rn(hi).x << 16;
}

/* mma.cuh's global loads and stores and shared stores (zkc_ldg4,
 * zkc_ldg8h, zkc_sts2, zkc_sts4, zkc_stg2, zkc_stg2h, zkc_stg4, zkc_stg4h):
 * alignment checked,
 * as the hardware faults */
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
struct uint4 { uint32_t x, y, z, w; };
static inline void emu_aligned(const void *p, unsigned n, const char *what)
{
    if ((uintptr_t)p % n) { fprintf(stderr, "emu: %u-byte %s at %p\n", n, what, p); abort(); }
}
static inline float4 zkc_ldg4(const float *p)
{
    emu_aligned(p, 16, "load");
    float4 v;
    memcpy(&v, p, 16);
    return v;
}
static inline uint4 zkc_ldg8h(const uint16_t *p)
{
    emu_aligned(p, 16, "load");
    uint4 v;
    memcpy(&v, p, 16);
    return v;
}
/* common.cuh's 8-byte load of 4 two-byte elements, and its fp16 element
 * widened exactly (the IEEE half's value: subnormals by ldexp, exact) */
struct uint2 { uint32_t x, y; };
template <class X> static inline uint2 zkc_ldg4h(const X *p)
{
    static_assert(sizeof(X) == 2, "zkc_ldg4h: 2-byte elements");
    emu_aligned(p, 8, "load");
    uint2 v;
    memcpy(&v, p, 8);
    return v;
}
struct __half { uint16_t x; };
static inline float __half2float(__half h)
{
    uint32_t e = (h.x >> 10) & 31u, m = h.x & 0x3ffu, s = (uint32_t)(h.x & 0x8000u) << 16;
    if (e == 0) { float f = ldexpf((float)m, -24); return s ? -f : f; }
    return __uint_as_float(s | (e == 31 ? 0x7f800000u : (e + 112u) << 23) | m << 13);
}
static inline float zkc_get(const __half *p) { return __half2float(*p); }
/* kernels/cuda/adamw.cu's: a correctly rounded fp32 divide and square
 * root (IEEE / and sqrtf are), and fp32 -> IEEE half to nearest even (the
 * CPU cast's algorithm, kernels/cpu/elementwise.c; a NaN becomes CUDA's
 * 0x7fff) with its bits */
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline __half __float2half_rn(float f)
{
    uint32_t u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, h;
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) { __half n = { 0x7fffu }; return n; }
    if (u >= 0x477ff000u) h = 0x7c00u;                          /* inf */
    else if (u < 0x38800000u)                                   /* subnormal: the FPU rounds */
        h = __float_as_uint(__uint_as_float(u) + 0.5f) - 0x3f000000u;
    else h = (u + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((u >> 13) & 1u)) >> 13;
    __half r = { (uint16_t)(sign | h) };
    return r;
}
static inline uint16_t __half_as_ushort(__half h) { return h.x; }
static inline void zkc_sts2(void *p, uint32_t lo, uint32_t hi)
{
    emu_aligned(p, 8, "store");
    uint32_t v[2] = { lo, hi };
    memcpy(p, v, 8);
}
static inline void zkc_sts4(void *p, uint4 v)
{
    emu_aligned(p, 16, "store");
    memcpy(p, &v, 16);
}
static inline void zkc_stg2(float *p, float x, float y)
{
    emu_aligned(p, 8, "store");
    p[0] = x; p[1] = y;
}
static inline void zkc_stg2h(uint16_t *p, uint32_t v)
{
    emu_aligned(p, 4, "store");
    memcpy(p, &v, 4);
}
static inline void zkc_stg4(float *p, float4 v)
{
    emu_aligned(p, 16, "store");
    memcpy(p, &v, 16);
}
static inline void zkc_stg4h(uint16_t *p, uint32_t lo, uint32_t hi)
{
    emu_aligned(p, 8, "store");
    uint32_t v[2] = { lo, hi };
    memcpy(p, v, 8);
}

/* mma.cuh's ordered accumulation between blocks. The emulator runs a
 * grid's blocks one at a time (emu_launch, in the order emu_block_order
 * picks), so a block's ticket is its place in that order and every block
 * it may wait on has finished: a count that does not already hold the
 * value waited for is a wait no earlier block can end, a deadlock on a
 * GPU: said and aborted, never spun on. */
/* cp.async: queued; the thread's wait for its committed groups passes
 * them to its next __syncthreads, which copies them (or writes 16 zero
 * bytes, full 0); both addresses 16-byte aligned. That is the latest a
 * copy may land; emu_set_cp_early(1) (a test's C code calls it) lands
 * each at issue instead, the earliest: a copy issued into a buffer other
 * threads still read then overwrites it before they do. A kernel must
 * give the same bits either way. */
static int emu_cp_early;
extern "C" void emu_set_cp_early(int on) { emu_cp_early = on; }
static inline void zkc_cp_async16(void *dst, const void *src, bool full)
{
    emu_aligned(dst, 16, "cp.async destination");
    emu_aligned(src, 16, "cp.async source");
    if (emu_cp_early) {
        if (full) memcpy(dst, src, 16);
        else memset(dst, 0, 16);
        return;
    }
    emu_cps[threadIdx.x].push_back(emu_cp{ dst, src, full, emu_cp_grp[threadIdx.x] });
}
static inline void zkc_cp_async_commit(void) { emu_cp_grp[threadIdx.x]++; }
static inline void zkc_cp_async_wait_all(void)
{
    std::vector<emu_cp> &q = emu_cps[threadIdx.x], left;
    for (const emu_cp &c : q)                     /* committed: land at the next barrier */
        (c.grp < emu_cp_grp[threadIdx.x] ? emu_cps_done[threadIdx.x] : left).push_back(c);
    q.swap(left);
}

static inline float2 make_float2(float x, float y) { float2 v = { x, y }; return v; }
static inline int zkc_ticket(int *p) { return atomicAdd(p, 1); }
static inline void zkc_wait_count(const int *p, int v)
{
    if (*p != v) {
        fprintf(stderr, "emu: block (%u,%u) waits for a count of %d at %p that holds %d: no block "
                "started before it can bring it there (a deadlock on a GPU)\n",
                blockIdx.x, blockIdx.y, v, (const void *)p, *p);
        abort();
    }
}
static inline void zkc_post_count(int *p) { atomicAdd(p, 1); }
static inline float2 zkc_ldcg2(const float *p)
{
    emu_aligned(p, 8, "load");
    float2 v = { p[0], p[1] };
    return v;
}
static inline void zkc_stcg2(float *p, float x, float y)
{
    emu_aligned(p, 8, "store");
    p[0] = x; p[1] = y;
}

namespace nvcuda { namespace wmma {
struct row_major {}; struct col_major {};
struct matrix_a {}; struct matrix_b {}; struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class L = void> struct fragment { float x[256]; };

static inline void emu_check(const void *p, unsigned ldm, unsigned mult)
{
    if ((uintptr_t)p % 32 || ldm % mult) {
        fprintf(stderr, "emu: wmma pointer %p (mod 32: %u) or ldm %u (not a multiple of %u)\n",
                p, (unsigned)((uintptr_t)p % 32), ldm, mult);
        abort();
    }
}
template <class Use, class T, class L>
static void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ldm)
{
    emu_check(p, ldm, 8);
    const bool col = std::is_same<L, col_major>::value;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r * 16 + c] = emu_f(col ? p[c * ldm + r] : p[r * ldm + c]);
}
static void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                             unsigned ldm, layout_t l)
{
    emu_check(p, ldm, 4);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r * 16 + c] = l == mem_col_major ? p[c * ldm + r] : p[r * ldm + c];
}
static void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ldm, layout_t l)
{
    emu_check(p, ldm, 4);
    for (int e = threadIdx.x % 32; e < 256; e += 32) {
        int r = e / 16, c = e % 16;
        (l == mem_col_major ? p[c * ldm + r] : p[r * ldm + c]) = f.x[e];
    }
}
template <class Use, class T, class L>
static void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, float v)
{
    for (int e = 0; e < 256; e++) f.x[e] = v;
}
template <class T, class LA, class LB>
static void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c)
{
    float t[256];
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float s = c.x[r * 16 + n];
            for (int k = 0; k < 16; k++) s += a.x[r * 16 + k] * b.x[k * 16 + n];
            t[r * 16 + n] = s;
        }
    memcpy(d.x, t, sizeof t);
}
} }
#endif
