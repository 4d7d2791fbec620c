/* mma.cuh -- the warp-level matrix instructions attention_tc_*.cu uses, each
 * behind a small inline function so that spec/emu/cuda_emu.h can give its
 * own definition (tools/emu_kernel.sh drops this include): the emulator
 * models each lane's registers by the PTX ISA's documented layouts
 * ("Matrix Fragments for mma.m16n8k16", "ldmatrix").
 *
 * Fragments of mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, with
 * g = lane / 4 (groupID) and t = lane % 4 (thread in group); a register
 * of two bf16 holds the lower column (or k) index in its low 16 bits:
 *   A (16x16, row major):  a[0] = A[g][2t, 2t+1]    a[1] = A[g+8][2t, 2t+1]
 *                          a[2] = A[g][2t+8, +9]    a[3] = A[g+8][2t+8, +9]
 *   B (16x8, k x n):       b[0] = B[2t, 2t+1][g]    b[1] = B[2t+8, 2t+9][g]
 *   C, D (16x8, fp32):     c[0], c[1] = C[g][2t, 2t+1]; c[2], c[3] = C[g+8][2t, 2t+1]
 * ldmatrix.sync.aligned.m8n8.x{1,2,4}.shared.b16 [.trans]: lanes 8i .. 8i+7
 * give the 16-byte row addresses of 8x8 matrix i (x1: i = 0, x2: i < 2,
 * x4: i < 4); lane l receives r[i] = M_i[l / 4][2 (l % 4), +1], or with
 * .trans r[i] = (M_i[2 (l % 4)][l / 4], M_i[2 (l % 4) + 1][l / 4]).
 */
#ifndef ZKC_MMA_CUH
#define ZKC_MMA_CUH
#include <stdint.h>
#include <cuda_bf16.h>

/* a shared-memory byte address: ldmatrix takes one (the emulator's is the
 * pointer's integer value); a tile's address once, then constant offsets */
typedef uint32_t zkc_sptr;
__device__ __forceinline__ zkc_sptr zkc_sptr_of(const void *p)
{
    return (zkc_sptr)__cvta_generic_to_shared(p);
}

/* x4: p is this lane's row address (lane 8i + r: row r of matrix i) */
__device__ __forceinline__ void zkc_ldmatrix_x4(uint32_t r[4], zkc_sptr p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(p));
}

__device__ __forceinline__ void zkc_ldmatrix_x4_trans(uint32_t r[4], zkc_sptr p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(p));
}

__device__ __forceinline__ void zkc_ldmatrix_x2(uint32_t r[2], zkc_sptr p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(p));
}

__device__ __forceinline__ void zkc_ldmatrix_x2_trans(uint32_t r[2], zkc_sptr p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(p));
}

/* d += a b (fp32 accumulators in place) */
__device__ __forceinline__ void zkc_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* 2^x by the SFU (ex2.approx.ftz: relative error ~2^-22, subnormal results
 * flushed to 0; exp2f adds a subnormal path around it) */
__device__ __forceinline__ float zkc_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* two fp32 -> one register of two bf16 (RNE), lo in the low half */
__device__ __forceinline__ uint32_t zkc_pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* 16-byte global loads (p 16-byte aligned) of 4 floats or 8 bf16, 8- and
 * 16-byte shared stores of two or four registers, 8-byte global store of
 * two floats and 4-byte of two bf16 (each aligned to its size) */
__device__ __forceinline__ float4 zkc_ldg4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ uint4 zkc_ldg8h(const uint16_t *p) { return *(const uint4 *)p; }
__device__ __forceinline__ void zkc_sts2(void *p, uint32_t lo, uint32_t hi) { *(uint2 *)p = make_uint2(lo, hi); }
__device__ __forceinline__ void zkc_sts4(void *p, uint4 v) { *(uint4 *)p = v; }
__device__ __forceinline__ void zkc_stg2(float *p, float x, float y) { *(float2 *)p = make_float2(x, y); }
__device__ __forceinline__ void zkc_stg2h(uint16_t *p, uint32_t v) { *(uint32_t *)p = v; }
/* 16-byte global store of 4 floats, 8-byte of 4 bf16 (layernorm.cu) */
__device__ __forceinline__ void zkc_stg4(float *p, float4 v) { *(float4 *)p = v; }
__device__ __forceinline__ void zkc_stg4h(uint16_t *p, uint32_t lo, uint32_t hi) { *(uint2 *)p = make_uint2(lo, hi); }
/* Ordered accumulation between the blocks of one grid (attention_tc_bwd.cu's
 * ordered dQ): a block takes a ticket (its place in the order the GPU
 * started the blocks), waits until a count reaches the number of blocks
 * before it in the sum's order, adds its part, and bumps the count. A block
 * waits only on blocks with smaller tickets, which have started, so the
 * wait ends whatever the dispatch order (no reliance on blockIdx order).
 * The count's wait is an acquire at GPU scope (thread 0, then the block's
 * barrier), its bump a release after the block's barrier (CUTLASS's
 * semaphore pattern); the parts move by ld.cg / st.cg (L2, never a stale
 * L1 line). spec/emu/cuda_emu.h's twins run blocks one at a time and
 * report a wait that no earlier block can satisfy (a deadlock on a GPU). */
__device__ __forceinline__ int zkc_ticket(int *p) { return atomicAdd(p, 1); }
/* A wait still unmet after ~20 s is a bug (a count that no block brings
 * there): it traps, the launch fails with an error, rather than hang. */
__device__ __forceinline__ void zkc_wait_count(const int *p, int v)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (unsigned n = 1;; n++) {
        int x;
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(x) : "l"(p) : "memory");
        if (x == v) break;
        __nanosleep(32);
        if ((n & 4095) == 0) {
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
            if (t - t0 > 20000000000ull) __trap();
        }
    }
}
__device__ __forceinline__ void zkc_post_count(int *p)
{
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" : : "l"(p) : "memory");
}
__device__ __forceinline__ float2 zkc_ldcg2(const float *p) { return __ldcg((const float2 *)p); }
__device__ __forceinline__ void zkc_stcg2(float *p, float x, float y) { __stcg((float2 *)p, make_float2(x, y)); }
/* Dynamic shared memory (the launch's third argument; above 48 KB the
 * kernel's cudaFuncAttributeMaxDynamicSharedMemorySize first): its base,
 * 16-byte aligned. spec/emu/cuda_emu.h's twin ends it at a guard page. */
__device__ __forceinline__ unsigned char *zkc_dyn_smem(void)
{
    extern __shared__ __align__(16) unsigned char zkc_dsm[];
    return zkc_dsm;
}
/* cp.async (sm_80+): 16 bytes global -> shared without registers, both
 * 16-byte aligned; full 0 writes 16 zero bytes and reads none (src-size
 * 0). A thread's copies since its last commit form a group; wait_all waits
 * for this thread's committed groups, then a barrier publishes them to the
 * block. The emulator's twins copy at the wait (a read before it sees the
 * old bytes) and abort a block that ends with copies never waited for. */
__device__ __forceinline__ void zkc_cp_async16(void *dst, const void *src, bool full)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 : : "r"(zkc_sptr_of(dst)), "l"(src), "r"(full ? 16 : 0) : "memory");
}
__device__ __forceinline__ void zkc_cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" : : : "memory"); }
__device__ __forceinline__ void zkc_cp_async_wait_all(void) { asm volatile("cp.async.wait_group 0;\n" : : : "memory"); }
#endif
