/*
 * kernels.h -- the CPU math of GPT-2 training.
 *
 * Raw-pointer kernels, llm.c style: every array is contiguous, row-major,
 * float32 unless said otherwise. Shapes are in the comments: (B, T, C) means
 * B*T*C floats with C fastest. N is a row count (usually B*T).
 *
 * Contracts every kernel keeps:
 *  - Bit-identical results whatever the OpenMP thread count: a reduction runs
 *    over a fixed partition of its input (fixed blocks, or one owner per output
 *    element looping in index order), never one partial per thread.
 *  - No heap allocation inside a kernel (the runtime accounts all memory);
 *    small per-thread tiles on the stack (<= 64 KiB) are fine.
 *  - Gradient semantics are stated per kernel: "written" means the output is
 *    overwritten (=), "accumulated" means the kernel adds into it (+=).
 *  - Kernels know nothing of tensors, devices, comm or Lua. They cannot fail:
 *    the runtime validates shapes and dtypes before calling them. Data is
 *    not validated on the host (on a GPU the host cannot read it): a kernel
 *    that indexes by a token id skips an id outside [0,V) (memory-safe: it
 *    reads and writes nothing through it), counts it and returns the count,
 *    which the runtime turns into an error. Check tokens where they are made
 *    (the data loader's vocab_size).
 *  - Split backward: where a backward kernel takes several outputs and
 *    accepts NULL for some, each output it computes has the same bits
 *    whether computed in one call with the others or in a call of its own
 *    (no output's arithmetic depends on which others were asked for).
 *  - OpenBLAS runs one thread for the whole process (matmul.c sets it once
 *    at load): sgemm is called inside OpenMP blocks. Never change it around
 *    a call; a caller that wants a threaded sgemm of its own puts 1 back.
 */
#ifndef ZT_KERNELS_CPU_H
#define ZT_KERNELS_CPU_H

#include <stddef.h>
#include <stdint.h>

/* ---- small elementwise ops (n elements) -------------------------------- */
void zk_fill(float *x, float value, size_t n);
void zk_copy(float *dst, const float *src, size_t n);
void zk_scale(float *x, float a, size_t n);                 /* x *= a          */
void zk_axpy(float *y, float a, const float *x, size_t n);  /* y += a * x      */
void zk_add(float *y, const float *x, size_t n);            /* y += x          */
/* y += x for a 2-byte x (a bf16 or fp16 run's stored gradient), each element
 * widened exactly: zk_cast_*_f32 then zk_add, the same bits, one pass and
 * no f32 copy of x (mixed precision's fp32 gradient accumulation) */
void zk_add_bf16(float *y, const uint16_t *x, size_t n);
void zk_add_f16(float *y, const uint16_t *x, size_t n);
void zk_add3(float *out, const float *a, const float *b, size_t n); /* out = a + b (residual) */
/* The bf16 residual stream (bf16 activations end to end): out = a + b on
 * the widened values, rounded once to nearest even. out may alias a or b. */
void zk_add3_b16(uint16_t *out, const uint16_t *a, const uint16_t *b, size_t n);

/* ---- casts (round to nearest even; NaN stays NaN) ---------------------- */
void zk_cast_f32_bf16(uint16_t *dst, const float *src, size_t n);
void zk_cast_bf16_f32(float *dst, const uint16_t *src, size_t n);
void zk_cast_f32_f16(uint16_t *dst, const float *src, size_t n);  /* IEEE binary16 */
void zk_cast_f16_f32(float *dst, const uint16_t *src, size_t n);

/* ---- embedding: token + position --------------------------------------- */
/* out (B,T,C) = wte[tokens[b,t]] + wpe[t];  tokens (B,T) int32, wte (V,C).
 * wpe NULL: no positions (Llama's), out = wte[tokens[b,t]].
 * Returns the number of tokens outside [0,V) (their rows get wpe[t] alone,
 * zeros without wpe). */
int zk_encoder_forward(float *out, const int32_t *tokens, const float *wte,
                       const float *wpe, int B, int T, int C, int V);
/* The same from bf16 wte and wpe (the stored parameters of a bf16 run),
 * widened exactly: zk_encoder_forward's bits on the widened tables. */
int zk_encoder_forward_b16(float *out, const int32_t *tokens, const uint16_t *wte,
                           const uint16_t *wpe, int B, int T, int C, int V);
/* bf16 out (the residual stream's first rows): zk_encoder_forward's (w16
 * 0: f32 tables) or zk_encoder_forward_b16's (w16 1) floats, rounded once. */
int zk_encoder_forward_o16(uint16_t *out, const int32_t *tokens, const void *wte,
                           const void *wpe, int w16, int B, int T, int C, int V);
/* dwte (V,C) ACCUMULATED (+=) (the tied LM head wrote it first);
 * dwpe (maxT,C) rows [0,T) WRITTEN = sum over b of dout[b,t,:] (NULL: none).
 * Deterministic: each dwte row sums its occurrences in (b,t) order.
 * Returns the number of tokens outside [0,V) (they add to no dwte row). */
int zk_encoder_backward(float *dwte, float *dwpe, const float *dout,
                        const int32_t *tokens, int B, int T, int C, int V);
/* The same from a bf16 dout, widened exactly: zk_encoder_backward's bits
 * on the widened rows. */
int zk_encoder_backward_b16(float *dwte, float *dwpe, const uint16_t *dout,
                            const int32_t *tokens, int B, int T, int C, int V);
/* The same into bf16 dwte and dwpe (a bf16 run's stored gradients; dout
 * f32, or bf16 when d16): each dwte row a token touches is widened into an
 * fp32 row, takes the same additions in (b,t) order and is rounded once;
 * dwpe rows [0,T) are the f32 ones rounded once. So each element is
 * zk_encoder_backward's on widen(dwte), rounded: the bits of an fp32 image
 * and a cast after, with fp32 rows only for the distinct tokens (at most
 * B*T*C floats, not V*C). Returns the bad-token count, or -1 when those
 * rows could not be allocated (nothing written then). */
int zk_encoder_backward_g16(uint16_t *dwte, uint16_t *dwpe, const void *dout, int d16,
                            const int32_t *tokens, int B, int T, int C, int V);

/* ---- layer norm (eps = 1e-5, biased variance, as PyTorch) -------------- */
/* out (N,C); mean, rstd (N) saved for backward. */
void zk_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C);
/* bf16 out (a bf16 GEMM's input): each element the fp32 forward's, rounded
 * once to nearest even (zk_cast_f32_bf16's bits); mean, rstd as above. */
void zk_layernorm_forward_b16(uint16_t *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int N, int C);
/* The residual add fused with the layer norm that reads it: resid (N,C)
 * WRITTEN = a + b (zk_add3's bits), out = layernorm(resid) into out (fp32)
 * or out16 (bf16; exactly one not NULL), mean, rstd: the bits of zk_add3
 * followed by zk_layernorm_forward(_b16). resid aliases neither a nor b. */
void zk_layernorm_residual_forward(float *resid, float *out, uint16_t *out16, float *mean,
                                   float *rstd, const float *a, const float *b,
                                   const float *weight, const float *bias, int N, int C);
/* dinp (N,C) ACCUMULATED (+=: it is the residual stream's gradient);
 * dweight, dbias (C) WRITTEN (sum over the N rows in row order).
 * Split backward: dinp NULL computes the weights only; dweight and dbias
 * both NULL compute dinp only. Same bits as the fused call either way. */
void zk_layernorm_backward(float *dinp, float *dweight, float *dbias,
                           const float *dout, const float *inp,
                           const float *weight, const float *mean,
                           const float *rstd, int N, int C);
/* The same, and dinp16 (N,C) WRITTEN (when not NULL; only with dinp) =
 * the accumulated dinp rounded once (zk_cast_f32_bf16's bits): the residual
 * gradient as the next bf16 GEMM reads it, without a cast pass. */
void zk_layernorm_backward_b16(float *dinp, uint16_t *dinp16, float *dweight, float *dbias,
                               const float *dout, const float *inp,
                               const float *weight, const float *mean,
                               const float *rstd, int N, int C);

/* The bf16 residual stream ("_r16": the stream's rows, and its gradient,
 * stored bf16). Each is the f32 kernel above on the widened rows:
 * forward: bf16 inp -> bf16 out (the f32 out rounded once), mean, rstd;
 * residual forward: resid = zk_add3_b16(a, b), then the forward on the
 * stored (rounded) resid; backward: dout bf16 too (a bf16 GEMM's input
 * gradient, zk_matmul_bf16_backward_b16's), dinp (N,C) bf16 ACCUMULATED,
 * each element round(widen(dinp) + the f32 kernel's term on the widened
 * dout), one rounding; dweight, dbias the f32 kernel's on the widened inp
 * and dout. */
void zk_layernorm_forward_r16(uint16_t *out, float *mean, float *rstd, const uint16_t *inp,
                              const float *weight, const float *bias, int N, int C);
void zk_layernorm_residual_forward_r16(uint16_t *resid, uint16_t *out, float *mean,
                                       float *rstd, const uint16_t *a, const uint16_t *b,
                                       const float *weight, const float *bias, int N, int C);
void zk_layernorm_backward_r16(uint16_t *dinp, float *dweight, float *dbias,
                               const uint16_t *dout, const uint16_t *inp,
                               const float *weight, const float *mean,
                               const float *rstd, int N, int C);

/* ---- RMS norm (Llama, Qwen 2.5, Mistral) -------------------------------- */
/* out (N,C) = weight * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps), in that
 * order (transformers' LlamaRMSNorm); rstd (N) saved for backward. */
void zk_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                        float eps, int N, int C);
/* dinp (N,C) ACCUMULATED (the residual stream's gradient); dweight (C)
 * WRITTEN (sum over the N rows in row order, in double). Split backward:
 * dinp NULL computes dweight only, dweight NULL dinp only; same bits. */
void zk_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, const float *rstd, int N, int C);
/* bf16 out (a bf16 GEMM's input): each element the fp32 forward's, rounded
 * once to nearest even (zk_cast_f32_bf16's bits); rstd as above. */
void zk_rmsnorm_forward_b16(uint16_t *out, float *rstd, const float *inp, const float *weight,
                            float eps, int N, int C);
/* dinp16: NULL, or (with dinp) the accumulated dinp rounded once -- the
 * residual gradient as the next bf16 GEMM reads it, without a cast pass. */
void zk_rmsnorm_backward_b16(float *dinp, uint16_t *dinp16, float *dweight, const float *dout,
                             const float *inp, const float *weight, const float *rstd, int N,
                             int C);
/* The bf16 residual stream, as zk_layernorm_*_r16: bf16 inp -> bf16 out;
 * backward from a bf16 dout, dinp bf16 accumulated, each element rounded
 * once. */
void zk_rmsnorm_forward_r16(uint16_t *out, float *rstd, const uint16_t *inp,
                            const float *weight, float eps, int N, int C);
void zk_rmsnorm_backward_r16(uint16_t *dinp, float *dweight, const uint16_t *dout,
                             const uint16_t *inp, const float *weight, const float *rstd,
                             int N, int C);

/* ---- rotary position embedding (transformers' rotate_half layout) -------- */
/* Llama 3's frequency scaling (rope_scaling rope_type "llama3"); factor <= 0
 * (or the pointer NULL): none. */
typedef struct zk_rope_scaling {
    double factor, low_freq_factor, high_freq_factor, original_max_positions;
} zk_rope_scaling;
/* cos_t, sin_t (P, hs/2) WRITTEN for positions 0..P-1: angle = inv_freq[i] * p
 * as a float product, inv_freq[i] = theta^(-2i/hs) as a float (scaled when
 * sc says so), cos/sin of the float angle rounded once. hs even. */
void zk_rope_table(float *cos_t, float *sin_t, int P, int hs, double theta,
                   const zk_rope_scaling *sc);
/* x: N rows ld floats apart (a (B,T,...) activation, N = B*T); the nh heads
 * of hs floats at the start of each row turned IN PLACE by the angles of
 * position pos0 + r % T (row r); element i pairs with i + hs/2. The table
 * covers positions up to pos0 + T - 1. Backward: the gradient turned back
 * (the transpose), in place. Elementwise per pair: any threads, same bits. */
void zk_rope_forward(float *x, int N, int T, int ld, int nh, int hs, const float *cos_t,
                     const float *sin_t, int pos0);
void zk_rope_backward(float *dx, int N, int T, int ld, int nh, int hs, const float *cos_t,
                      const float *sin_t, int pos0);
/* The same on bf16 rows (bf16 activations: qkv and dqkv): each pair
 * widened exactly, turned by the fp32 kernel's arithmetic, rounded once to
 * nearest even -- round(zk_rope_*(widen(x))) bit for bit. */
void zk_rope_forward_b16(uint16_t *x, int N, int T, int ld, int nh, int hs, const float *cos_t,
                         const float *sin_t, int pos0);
void zk_rope_backward_b16(uint16_t *dx, int N, int T, int ld, int nh, int hs,
                          const float *cos_t, const float *sin_t, int pos0);

/* ---- SwiGLU (the gated MLP's activation) --------------------------------- */
/* gu (N, 2F): each row [gate (F) | up (F)]; out (N,F) WRITTEN =
 * silu(gate) * up, silu(x) = x sigmoid(x). */
void zk_swiglu_forward(float *out, const float *gu, int N, int F);
/* dgu (N, 2F) WRITTEN: [dout * up * silu'(gate) | dout * silu(gate)]. */
void zk_swiglu_backward(float *dgu, const float *dout, const float *gu, int N, int F);
/* bf16 gu (the gate/up GEMM's bf16 out) and, backward, dout (the down
 * GEMM's bf16 input gradient), widened exactly; out / dgu bf16, the fp32
 * kernels' floats rounded once. */
void zk_swiglu_forward_bb(uint16_t *out, const uint16_t *gu, int N, int F);
void zk_swiglu_backward_bb(uint16_t *dgu, const uint16_t *dout, const uint16_t *gu, int N, int F);

/* ---- matmul with bias (OpenBLAS sgemm) ---------------------------------- */
/* Padded rows: out (forward) and dout (backward) are (N,OC) with rows ldo
 * apart, ldo >= OC (ldo = OC: contiguous). The LM head's logits use
 * zk_padded_cols(V), so that a GPU's GEMMs get 16-byte aligned rows; columns
 * [OC,ldo) are neither read nor written, and the bits do not depend on ldo. */
#define ZK_COL_PAD 128
static inline int zk_padded_cols(int n) { return (n + ZK_COL_PAD - 1) / ZK_COL_PAD * ZK_COL_PAD; }
/* out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be NULL. */
void zk_matmul_forward(float *out, const float *inp, const float *weight,
                       const float *bias, int N, int C, int OC, int ldo);
/* dinp (N,C) = dout @ weight, WRITTEN (skipped when NULL);
 * dweight (OC,C) = dout^T @ inp, WRITTEN (sgemm beta = 0; skipped when NULL);
 * dbias (OC) = column sums of dout, WRITTEN (skipped when NULL).
 * Split backward: (dinp, NULL, NULL) then (NULL, dweight, dbias) gives the
 * same bits as one call with all three. */
void zk_matmul_backward(float *dinp, float *dweight, float *dbias,
                        const float *dout, const float *inp,
                        const float *weight, int N, int C, int OC, int ldo);
/* The fp32 GEMMs above cut their output into fixed blocks, each one
 * single-threaded sgemm call, spread over OpenMP (matmul.c says why). The
 * plan depends on the shape and the sgemm core (OpenBLAS's corename), never
 * on the thread count; on every core it gives the bits of the longer
 * dimension cut in blocks of 256. zk_gemm_blocked runs C (M,N) = op(A)
 * op(B) (row-major, beta = 0) with any cut; the bench and the tests use it
 * to compare cuts (time, and bits against the plan's). */
typedef struct { int by_cols, block; } zk_gemm_cut;   /* columns or rows; block <= 0: one call */
zk_gemm_cut zk_gemm_plan(int M, int N, int K);
void zk_gemm_blocked(int transA, int transB, int M, int N, int K,
                     const float *A, int lda, const float *B, int ldb,
                     float *C, int ldc, zk_gemm_cut cut);

/* ---- matmul on bf16 operands, fp32 accumulation (matmul_bf16.c) --------- */
/* bf16 arrays are uint16_t (the high half of a float32). Each output element
 * is a fixed sum over k, then + bias in one fp32 add (a NaN sum stays
 * itself), by one of three paths, chosen once per process (zk_bf16_simd):
 *  - AMX (matmul_amx.c), where the CPU has AMX-BF16 and the kernel grants
 *    the tile state: K padded with +0 to a multiple of 32; acc = +0; per
 *    chunk of 32 k in order: e = o = +0, e = S(e, a[2p], b[2p]) and
 *    o = S(o, a[2p+1], b[2p+1]) for p = 0..15 (k within the chunk), then
 *    acc = ADD(acc, ADD(e, o)). TDPBF16PS's arithmetic as measured on this
 *    CPU kind (not its older SDM pseudo-code); its bits differ from the
 *    other two paths' and only AMX CPUs that pass the same self-test
 *    reproduce them.
 *  - AVX512_BF16 and portable C (same bits): VDPBF16PS's one chain, pairs
 *    of k with the odd one first, acc = S(S(acc, a[2p+1], b[2p+1]), a[2p],
 *    b[2p]); K padded with +0 to even.
 * S(c, a, b) = a*b + c as one fp32 FMA rounded to nearest even, denormal
 * inputs read as zero, results tiny after rounding flushed (matmul_bf16.c
 * defines it exactly, NaN order too); ADD is an fp32 add with the same
 * DAZ/FTZ, the first operand's NaN first. On each path the bits are the
 * same on any thread count and any blocking. The layouts are zk_matmul_*'s.
 * out (N,OC) fp32 = inp (N,C) bf16 @ weight (OC,C)^T bf16 + bias (OC) fp32;
 * bias may be NULL. Rows ldo apart as zk_matmul_*. */
void zk_matmul_bf16_forward(float *out, const uint16_t *inp, const uint16_t *weight,
                            const float *bias, int N, int C, int OC, int ldo);
/* The same with a bf16 out: each element the fp32 forward's (bias added),
 * rounded once to nearest even (zk_cast_f32_bf16's bits). */
void zk_matmul_bf16_forward_b16(uint16_t *out, const uint16_t *inp, const uint16_t *weight,
                                const float *bias, int N, int C, int OC, int ldo);
/* dinp (N,C) fp32 = dout (N,OC) bf16 @ weight (OC,C) bf16, WRITTEN (skipped
 * when NULL); dweight (OC,C) fp32 = dout^T @ inp (N,C) bf16, WRITTEN (k runs
 * over the N rows; skipped when NULL); dbias (OC) fp32 = column sums of
 * dout, WRITTEN (in double, rows in order, on every path; skipped when
 * NULL). Each output is computed alone, so split backward gives the same
 * bits. */
void zk_matmul_bf16_backward(float *dinp, float *dweight, float *dbias,
                             const uint16_t *dout, const uint16_t *inp,
                             const uint16_t *weight, int N, int C, int OC, int ldo);
/* The same with dinp bf16 (bf16 activations: an activation's gradient),
 * each element the f32 dinp's chain rounded once (zk_cast_f32_bf16's bits);
 * dweight, dbias as above. */
void zk_matmul_bf16_backward_b16(uint16_t *dinp, float *dweight, float *dbias,
                                 const uint16_t *dout, const uint16_t *inp,
                                 const uint16_t *weight, int N, int C, int OC, int ldo);
/* dweight (OC,C) bf16 WRITTEN: zk_matmul_bf16_backward's dweight, each
 * element rounded once to nearest even (a bf16 run's stored weight
 * gradient, written without an fp32 image). Returns 0, or -1 when the
 * AMX path could not allocate its scratch (the out is undefined then). */
int zk_matmul_bf16_dweight_b16(uint16_t *dweight, const uint16_t *dout, const uint16_t *inp,
                               int N, int C, int OC, int ldo);
/* Which path the bf16 GEMMs take. mode -1 asks, deciding on first use:
 * AMX where usable, else AVX512_BF16 where the CPU has it, else portable;
 * the environment variable ZTRAIN_BF16_GEMM = amx | avx512_bf16 | portable
 * picks another (read once). mode 0 forces portable, 1 AVX512_BF16 (where
 * present), 2 AMX (where usable), each falling back down that list; for
 * tests and benchmarks: the choice is process-wide, so change it only
 * between GEMMs. Returns 2 for AMX, 1 for AVX512_BF16, 0 for portable. */
int zk_bf16_simd(int mode);
/* The path in use as a line of text, and why AMX is not used where it is
 * not (no CPU support, the kernel refused the tile state, self-test). */
const char *zk_bf16_info(void);

/* matmul_amx.c's side of the dispatch (used by matmul_bf16.c and tests). */
/* 1 if this process may use AMX (asks the kernel for the tile state once,
 * runs a self-test); else 0, with the reason in why. */
int zk_amx_enable(char *why, size_t n);
/* C (M,N) fp32, rows ldc apart, WRITTEN = A (M,K) B (K,N) (+ bias (N)) with
 * AMX's arithmetic above; A element (m,k) at a[m*a_rs + k*a_ks], B^T
 * element (n,k) at bt[n*bt_rs + k*bt_ks], each with a stride of 1 along one
 * of its axes; K >= 1. Only after zk_amx_enable said 1. */
void zk_amx_gemm(float *C, long ldc, const uint16_t *a, long a_rs, long a_ks,
                 const uint16_t *bt, long bt_rs, long bt_ks, const float *bias,
                 int M, int N, int K);
/* The same into a bf16 C16 (rows ldc apart), each element the fp32 out's
 * rounded once to nearest even (zk_cast_f32_bf16's bits), the fp32 sums
 * kept in a per-thread block scratch (<= 512 KiB) instead of memory.
 * Returns 0, or -1 when a scratch could not be allocated. */
int zk_amx_gemm_b16(uint16_t *C16, long ldc, const uint16_t *a, long a_rs, long a_ks,
                    const uint16_t *bt, long bt_rs, long bt_ks, const float *bias,
                    int M, int N, int K);
/* Tests: the AMX path's task and K-block sizes (multiples of 32; 0 = the
 * default). Returns -1 (and changes nothing) for sizes its buffers cannot
 * hold. Changes no bits -- which is what the test checks. */
int zk_amx_set_blocking(int mc, int nc, int kc);

/* ---- causal multi-head self-attention ----------------------------------- */
/* qkv (B,T,3C) holds q | k | v along the last dim, heads of size C/NH inside
 * each; out (B,T,C); lse (B,NH,T) = log-sum-exp of each scaled score row,
 * saved for backward. Scale 1/sqrt(C/NH). Tiled: no (T,T) buffer per batch. */
void zk_attention_forward(float *out, float *lse, const float *qkv,
                          int B, int T, int C, int NH);
/* Generation with a KV cache. kcache, vcache (B,NH,maxT,hs), hs = C/NH: row
 * p of head h holds the key (value) of position p. qkv (B,T,3C) holds the T
 * new positions [pos, pos+T) of each sequence, pos + T <= maxT. Writes their
 * k and v into cache rows [pos, pos+T) (WRITTEN), then out (B,T,C) (WRITTEN)
 * = attention of new query i over cache rows [0, pos+i] (causal by
 * construction; rows [0,pos) must hold earlier calls' keys and values).
 * Row i of out has the bits of row pos+i of zk_attention_forward over the
 * whole sequence (the same row arithmetic and key tiles), on any thread
 * count. pos = 0 with T tokens is a prefill; T = 1 a decode step, O(pos). */
void zk_attention_decode(float *out, float *kcache, float *vcache, const float *qkv,
                         int B, int T, int C, int NH, int maxT, int pos);
/* dqkv (B,T,3C) WRITTEN, from dout (B,T,C) and the forward's qkv, out, lse. */
void zk_attention_backward(float *dqkv, const float *dout, const float *qkv,
                           const float *out, const float *lse,
                           int B, int T, int C, int NH);
/* bf16 I/O (bf16 activations): qkv, out, dqkv and dout bf16; lse f32.
 * The bits of the f32 kernels above on the widened qkv, out and dout, their
 * out (dqkv) rounded once to nearest even (zk_cast_f32_bf16's bits): the
 * rows are widened tile by tile into f32 tiles each thread allocates
 * (forward (2 AQ + 2 AK) hs floats; backward (4 AQ + 2 AK) hs and a head's
 * dK and dV, 2 T hs). 0, or -1 where that allocation failed (outputs then
 * partial). */
int zk_attention_forward_bb(uint16_t *out, float *lse, const uint16_t *qkv,
                            int B, int T, int C, int NH);
int zk_attention_backward_bb(uint16_t *dqkv, const uint16_t *dout, const uint16_t *qkv,
                             const uint16_t *out, const float *lse,
                             int B, int T, int C, int NH);

/* Grouped-query attention with an optional sliding window (Llama, Mistral).
 * qkv rows (B,T,R), R = C + 2 NKV hs, hs = C/NH: q (NH heads, C = NH hs) |
 * k (NKV heads) | v (NKV heads); NH % NKV == 0 and query head h reads kv
 * head h / (NH/NKV). out (B,T,C), lse (B,NH,T) as above; dqkv (B,T,R)
 * WRITTEN, the dk, dv of a kv head summed over its query heads in one
 * fixed order (query heads ascending), no atomics. Window W >= 0: 0 plain
 * causal; W > 0 query i sees keys j with i - W < j <= i (Hugging Face's
 * sliding_window). kcache, vcache (B,NKV,maxT,hs); decode's rows have the
 * bits of the full forward's rows, as above. NKV = NH, W = 0 is exactly
 * the kernels above (which call these). The _bb kernels as above. */
void zk_attention_forward_gqa(float *out, float *lse, const float *qkv,
                              int B, int T, int C, int NH, int NKV, int W);
void zk_attention_backward_gqa(float *dqkv, const float *dout, const float *qkv,
                               const float *out, const float *lse,
                               int B, int T, int C, int NH, int NKV, int W);
void zk_attention_decode_gqa(float *out, float *kcache, float *vcache, const float *qkv,
                             int B, int T, int C, int NH, int NKV, int W, int maxT, int pos);
int zk_attention_forward_gqa_bb(uint16_t *out, float *lse, const uint16_t *qkv,
                                int B, int T, int C, int NH, int NKV, int W);
int zk_attention_backward_gqa_bb(uint16_t *dqkv, const uint16_t *dout, const uint16_t *qkv,
                                 const uint16_t *out, const float *lse,
                                 int B, int T, int C, int NH, int NKV, int W);

/* ---- GELU, tanh approximation ------------------------------------------ */
void zk_gelu_forward(float *out, const float *inp, size_t n);
/* dinp = dout * gelu'(inp), WRITTEN; dinp may alias dout. */
void zk_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
/* bf16 out / dinp (a bf16 GEMM's input): the fp32 kernels' floats rounded
 * once to nearest even. dinp does not alias dout here. */
void zk_gelu_forward_b16(uint16_t *out, const float *inp, size_t n);
void zk_gelu_backward_b16(uint16_t *dinp, const float *inp, const float *dout, size_t n);
/* The same with a bf16 inp (the c_fc GEMM's bf16 out): widened exactly,
 * so the bits of the _b16 kernels on the cast input. */
void zk_gelu_forward_bb(uint16_t *out, const uint16_t *inp, size_t n);
void zk_gelu_backward_bb(uint16_t *dinp, const uint16_t *inp, const float *dout, size_t n);

/* ---- softmax cross-entropy, fused with its backward -------------------- */
/* logits (N,V) in rows ld apart (ld >= V: the LM head pads GPT-2's 50257 to
 * 50304, zk_padded_cols); targets (N) int32 in [0,V). losses (N) WRITTEN
 * with -log softmax(logits)[target]. If dlogits is not NULL it is WRITTEN
 * with (softmax - onehot(target)) * dscale in columns [0,V) and 0 in
 * [V,ld); dlogits may alias logits. Columns [V,ld) of logits are not read.
 * Returns the number of targets outside [0,V) (loss and dlogits row 0). */
int zk_crossentropy(float *losses, float *dlogits, const float *logits,
                    const int32_t *targets, int N, int V, int ld, float dscale);
/* bf16 logits and dlogits (losses fp32): zk_crossentropy's arithmetic on
 * the widened row, dlogits rounded once to bf16 -- the bits of
 * zk_crossentropy on the fp32 image, then zk_cast_f32_bf16. */
int zk_crossentropy_bf16(float *losses, uint16_t *dlogits, const uint16_t *logits,
                         const int32_t *targets, int N, int V, int ld, float dscale);

/* ---- AdamW (decoupled weight decay), PyTorch's formula ------------------ */
/* g = grad * grad_scale (clip coefficient);
 * param *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
 * param -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
 * t is the 1-based step count. Elementwise, each operation rounded to float
 * on its own (no fused multiply-add): the same bits on any partition, thread
 * count or CPU (AVX2 body, scalar fallback), and as a plain loop of the formula
 * (under the calling thread's default rounding, no flush-to-zero).
 * Memory-bound: 28 bytes per element; make bench prints its GB/s.
 * Threads: runs an OpenMP team of the CALLING thread's size. That count is
 * per thread (a stream worker sets 1 for itself and updates alone; a fresh
 * pthread gets OMP_NUM_THREADS or all cores, not zt_set_threads' count).
 * It touches no process-wide state -- no OpenBLAS call, no thread-count
 * setting, no floating-point environment change -- so it may run on host
 * tensors from a second thread while compute kernels run on another team;
 * no other thread may touch param, m, v (or write grad) until it returns. */
void zk_adamw(float *param, const float *grad, float *m, float *v, size_t n,
              float lr, float beta1, float beta2, float eps, float wd,
              float grad_scale, int t);
/* zk_adamw, and the updated param rounded into lp (n elements, WRITTEN;
 * lp_f16: IEEE half, else bf16) in the same pass, a block at a time while
 * it is in cache: the bits of zk_adamw then zk_cast_f32_bf16 (or _f16), 6
 * bytes an element fewer than the two passes (param is not read again) */
void zk_adamw_lp(float *param, const float *grad, float *m, float *v, uint16_t *lp, int lp_f16,
                 size_t n, float lr, float beta1, float beta2, float eps, float wd,
                 float grad_scale, int t);
/* zk_adamw_lp (lp NULL: zk_adamw) on a 2-byte gradient (g_f16: IEEE half,
 * else bf16) widened exactly as read: the bits of an f32 copy of it (a
 * mixed-precision step without accumulation needs no fp32 gradient) */
void zk_adamw_g16(float *param, const uint16_t *grad, int g_f16, float *m, float *v,
                  uint16_t *lp, int lp_f16, size_t n, float lr, float beta1, float beta2,
                  float eps, float wd, float grad_scale, int t);

/* ---- sums in fp64 over a fixed block partition -------------------------- */
#define ZK_SUM_BLOCK 1024
#define ZK_SUM_LANES 8
/* partials[i] = sum of x[j]^2 (in double) over block i = [i*ZK_SUM_BLOCK,
 * min(n, (i+1)*ZK_SUM_BLOCK)): element j of the block is added to lane
 * j % ZK_SUM_LANES in index order, then the lanes in lane order. Writes
 * ceil(n / ZK_SUM_BLOCK) partials. The caller adds partials in block order:
 * that is how the global gradient norm stays the same under any sharding. */
void zk_sumsq_blocks(double *partials, const float *x, size_t n);
/* the same on a 2-byte x (x_f16: IEEE half, else bf16) widened exactly: the
 * partials of an f32 copy of it, bit for bit */
void zk_sumsq_blocks_16(double *partials, const uint16_t *x, int x_f16, size_t n);
/* sum of x in double over the same fixed blocks, blocks added in order. */
double zk_sum_f64(const float *x, size_t n);

/* Tests and benches only: on != 0 makes the kernels that have a faster path
 * take their plain one instead -- the reference the fast path matches bit
 * for bit -- so both can be compared and timed in one process: the sums
 * above (scalar loop), cross-entropy (each exp twice), attention and GELU
 * (AVX2 instead of AVX-512). Process-wide; change it only while no kernel runs. */
void zk_force_scalar(int on);
int zk_scalar_forced(void);
/* The communicators' rank-order sum: dst[i] = ((src0[i] + src1[i]) + src2[i])
 * + ... in fp32, where srcj = src + j * n (the chunks of nsrc ranks after an
 * all-to-all, in rank order); nsrc == 1 copies. Every element has exactly
 * this association on every backend (kernels/cuda: zkc_sum_ranks), so a
 * reduction's bits depend on neither the transport nor the world's
 * partition into rounds. dst must not overlap src. */
void zk_sum_ranks(float *dst, const float *src, int nsrc, size_t n);

/* ---- deterministic random init ----------------------------------------- */
/* x[i] = mean + std * N(0,1), where the normal deviate of element i depends
 * only on (seed, stream, i): a counter-based generator (splitmix64 + Box-Muller),
 * so the result is the same on any thread count or partition. */
void zk_randn(float *x, size_t n, uint64_t seed, uint64_t stream, float mean, float std);

#endif
