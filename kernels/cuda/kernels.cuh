/*
 * kernels.cuh -- the CUDA math of GPT-2 training: kernels/cpu/kernels.h's
 * ops on device pointers, launched on a stream.
 *
 * Same layouts and WRITTEN/ACCUMULATED semantics as kernels.h (read the
 * contracts there; only the differences are stated here). C-callable, so
 * runtime/device_cuda.c (plain C) can call them.
 *
 * Every launcher returns a cudaError_t as int: cudaGetLastError() after its
 * launches (0 = cudaSuccess). Launch errors only; a fault inside a kernel
 * surfaces at the next synchronizing call. Kernels know nothing of the
 * runtime: the caller turns codes into messages.
 *
 * Arithmetic: fp32 unless said otherwise, reductions over fixed partitions
 * (deterministic run to run on one GPU), but not the CPU's bits: the order
 * of sums and the exp/tanh differ. adamw, casts, sumsq/sum are the
 * exceptions (stated at each).
 */
#ifndef ZT_KERNELS_CUDA_H
#define ZT_KERNELS_CUDA_H
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
#include <cublas_v2.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- elementwise.cu ---- */
int zkc_fill(cudaStream_t s, float *x, float v, size_t n);
int zkc_scale(cudaStream_t s, float *x, float a, size_t n);
int zkc_axpy(cudaStream_t s, float *y, float a, const float *x, size_t n);
int zkc_add(cudaStream_t s, float *y, const float *x, size_t n);
/* y += x for a 2-byte x (bf16, fp16), each element widened exactly: the
 * bits of the cast below then zkc_add (kernels.h zk_add_bf16, zk_add_f16) */
int zkc_add_bf16(cudaStream_t s, float *y, const uint16_t *x, size_t n);
int zkc_add_f16(cudaStream_t s, float *y, const uint16_t *x, size_t n);
int zkc_add3(cudaStream_t s, float *out, const float *a, const float *b, size_t n);
/* the bf16 residual stream (kernels.h zk_add3_b16): out = a + b on the
 * widened values, rounded once (zkc_bf16); the CPU's bits. out may alias a
 * or b. 16-byte loads and stores (8 elements a thread) where the three
 * pointers are on 16 bytes. */
int zkc_add3_b16(cudaStream_t s, uint16_t *out, const uint16_t *a, const uint16_t *b, size_t n);
/* Round to nearest even, NaN stays NaN: the same bits as the CPU casts
 * for every non-NaN value. */
int zkc_cast_f32_bf16(cudaStream_t s, uint16_t *dst, const float *src, size_t n);
int zkc_cast_bf16_f32(cudaStream_t s, float *dst, const uint16_t *src, size_t n);
int zkc_cast_f32_f16(cudaStream_t s, uint16_t *dst, const float *src, size_t n);
int zkc_cast_f16_f32(cudaStream_t s, float *dst, const uint16_t *src, size_t n);

/* ---- gelu.cu (tanhf, not the CPU's tanh_fast: ~1e-7 apart); out16: out
 * (dinp) bf16, the fp32 value rounded once (zkc_bf16); in16: inp bf16 (the
 * c_fc GEMM's bf16 out), widened exactly; then out is bf16 too ---- */
int zkc_gelu_forward(cudaStream_t s, void *out, int out16, const void *inp, int in16, size_t n);
int zkc_gelu_backward(cudaStream_t s, void *dinp, int out16, const void *inp, int in16,
                      const float *dout, size_t n);

/* ---- layernorm.cu ---- */
/* out16: out bf16, each element rounded once (a bf16 GEMM's input). p16
 * (every entry point below): the parameters w and b (the RMS norm's w)
 * bf16 (uint16_t bits, a bf16 run's stored ones), each widened exactly as
 * it is read, and every float operation the f32 parameters' on the
 * widened values: the same bits as p16 0 on an f32 copy of them, on the
 * same path (the vector path takes bf16 parameters on 8 bytes, f32 ones
 * on 16); else (p16 0) fp32 as before. */
int zkc_layernorm_forward(cudaStream_t s, void *out, int out16, float *mean, float *rstd,
                          const float *inp, const void *w, const void *b, int p16, int N,
                          int C);
/* resid (N,C) WRITTEN = a + b, then zkc_layernorm_forward on resid: one
 * launch, the row read back from cache (the bits of add3 then the forward) */
int zkc_layernorm_residual_forward(cudaStream_t s, float *resid, void *out, int out16,
                                   float *mean, float *rstd, const float *a, const float *b2,
                                   const void *w, const void *b, int p16, int N, int C);
/* dinp ACCUMULATED (skipped when NULL); dw, db WRITTEN (skipped unless
 * both given): chunks of rows in order in double, the chunks' sums in a
 * grouping fixed by (N, C); dinp's bits do not depend on whether dw, db
 * are asked for;
 * scratch: zkc_layernorm_scratch(N, C) doubles of device memory, only
 * touched on s (the caller orders its other users). dinp16: NULL, or with
 * dinp the accumulated dinp rounded once (zkc_bf16). g16 (every norm
 * backward below): dw and db bf16 (uint16_t bits, a bf16 run's stored
 * gradients), each the fp32 value rounded once (zkc_bf16: the fp32
 * call's dw, db cast by zkc_cast_f32_bf16, bit for bit); 0: fp32. */
int zkc_layernorm_backward(cudaStream_t s, float *dinp, uint16_t *dinp16, void *dw, void *db,
                           int g16, const float *dout, const float *inp, const void *w, int p16,
                           const float *mean, const float *rstd, int N, int C,
                           double *scratch);
size_t zkc_layernorm_scratch(int N, int C);
/* RMS norm (Llama's; kernels.h zk_rmsnorm_*): out = w * (x * rstd), out16
 * as the layer norm's; rstd (N) WRITTEN. The layer norm's paths with the
 * mean 0 and no bias. */
int zkc_rmsnorm_forward(cudaStream_t s, void *out, int out16, float *rstd, const float *inp,
                        const void *w, int p16, float eps, int N, int C);
/* dinp ACCUMULATED (NULL: skipped), dinp16 as the layer norm's; dw WRITTEN
 * (NULL: skipped), g16 as the layer norm's; scratch: zkc_rmsnorm_scratch(N,
 * C) doubles */
int zkc_rmsnorm_backward(cudaStream_t s, float *dinp, uint16_t *dinp16, void *dw, int g16,
                         const float *dout, const float *inp, const void *w, int p16,
                         const float *rstd, int N, int C, double *scratch);
size_t zkc_rmsnorm_scratch(int N, int C);
/* The bf16 residual stream (kernels.h's _r16 twins): the rows (inp;
 * resid, a, b2; the backward's inp, dout and dinp) bf16, widened exactly
 * on load, each stored element rounded once (zkc_bf16); every float
 * operation the fp32 kernels' above on the widened rows, on the same
 * paths (the vector one with bf16 rows on 8 bytes). So: out = the fp32
 * forward's out on the widened inp, rounded; the residual forward's resid
 * = zkc_add3_b16's bits, its norm on the stored (rounded) resid; dinp
 * ACCUMULATED, each element round(widen(dinp) + the fp32 kernel's term);
 * mean, rstd, dw, db as the fp32 kernels' on the widened rows. NULL
 * dinp, dw (db) as above; scratch the same sizes; p16, g16 as above. */
int zkc_layernorm_forward_r16(cudaStream_t s, uint16_t *out, float *mean, float *rstd,
                              const uint16_t *inp, const void *w, const void *b, int p16, int N,
                              int C);
int zkc_layernorm_residual_forward_r16(cudaStream_t s, uint16_t *resid, uint16_t *out,
                                       float *mean, float *rstd, const uint16_t *a,
                                       const uint16_t *b2, const void *w, const void *b, int p16,
                                       int N, int C);
int zkc_layernorm_backward_r16(cudaStream_t s, uint16_t *dinp, void *dw, void *db, int g16,
                               const uint16_t *dout, const uint16_t *inp, const void *w, int p16,
                               const float *mean, const float *rstd, int N, int C,
                               double *scratch);
int zkc_rmsnorm_forward_r16(cudaStream_t s, uint16_t *out, float *rstd, const uint16_t *inp,
                            const void *w, int p16, float eps, int N, int C);
int zkc_rmsnorm_backward_r16(cudaStream_t s, uint16_t *dinp, void *dw, int g16,
                             const uint16_t *dout, const uint16_t *inp, const void *w, int p16,
                             const float *rstd, int N, int C, double *scratch);

/* ---- rope.cu, swiglu.cu (Llama's; kernels.h zk_rope_*, zk_swiglu_*): the
 * same layouts; cos_t, sin_t device copies of zk_rope_table's. RoPE: the
 * CPU's bits (each product rounded); SwiGLU: expf, within ~2 ulps ---- */
int zkc_rope_forward(cudaStream_t s, float *x, int N, int T, int ld, int nh, int hs,
                     const float *cos_t, const float *sin_t, int pos0);
int zkc_rope_backward(cudaStream_t s, float *dx, int N, int T, int ld, int nh, int hs,
                      const float *cos_t, const float *sin_t, int pos0);
int zkc_swiglu_forward(cudaStream_t s, float *out, const float *gu, int N, int F);
int zkc_swiglu_backward(cudaStream_t s, float *dgu, const float *dout, const float *gu, int N,
                        int F);
/* bf16 activations (kernels.h zk_rope_*_b16, zk_swiglu_*_bb): bf16 rows
 * (the swiglu backward's dout too) widened exactly, the f32 arithmetic
 * above, each result rounded once (zkc_bf16): RoPE the CPU's bits; SwiGLU
 * within the f32 kernels' ulps before the rounding */
int zkc_rope_forward_b16(cudaStream_t s, uint16_t *x, int N, int T, int ld, int nh, int hs,
                         const float *cos_t, const float *sin_t, int pos0);
int zkc_rope_backward_b16(cudaStream_t s, uint16_t *dx, int N, int T, int ld, int nh, int hs,
                          const float *cos_t, const float *sin_t, int pos0);
int zkc_swiglu_forward_bb(cudaStream_t s, uint16_t *out, const uint16_t *gu, int N, int F);
int zkc_swiglu_backward_bb(cudaStream_t s, uint16_t *dgu, const uint16_t *dout,
                           const uint16_t *gu, int N, int F);

/* ---- embedding.cu: bad counts go to *dbad (device int, ADDED to) ---- */
/* w16: wte and wpe bf16 (a bf16 run's stored parameters), widened exactly */
int zkc_encoder_forward(cudaStream_t s, float *out, const int32_t *tok, const void *wte,
                        const void *wpe, int w16, int B, int T, int C, int V, int *dbad);
/* dwte ACCUMULATED, each row summing its occurrences in (b,t) order (no
 * atomics: deterministic); dwpe rows [0,T) WRITTEN. */
int zkc_encoder_backward(cudaStream_t s, float *dwte, float *dwpe, const float *dout,
                         const int32_t *tok, int B, int T, int C, int V, int *dbad);
/* The bf16 residual stream (kernels.h zk_encoder_forward_o16,
 * zk_encoder_backward_b16): out bf16, zkc_encoder_forward's floats rounded
 * once; dout bf16, widened exactly, the rest zkc_encoder_backward's (the
 * CPU's bits on the widened rows) */
int zkc_encoder_forward_o16(cudaStream_t s, uint16_t *out, const int32_t *tok, const void *wte,
                            const void *wpe, int w16, int B, int T, int C, int V, int *dbad);
int zkc_encoder_backward_b16(cudaStream_t s, float *dwte, float *dwpe, const uint16_t *dout,
                             const int32_t *tok, int B, int T, int C, int V, int *dbad);
/* A bf16 run's gradients (kernels.h zk_encoder_backward_g16): dwte and
 * dwpe bf16, written by the op (no fp32 image, no cast after); dout fp32,
 * or (d16) bf16 widened exactly. dwte ACCUMULATED, each element
 * round(widen(dwte) + zkc_encoder_backward's adds, in its order, in fp32):
 * one rounding, the fp32 kernel's dwte on the widened values rounded, bit
 * for bit; dwpe rows [0,T) WRITTEN, the fp32 sums rounded once. scratch:
 * zkc_encoder_backward_g16_scratch(C, V) floats of device memory (a fp32
 * row a block, carrying a token with more positions than one flush holds:
 * embedding.cu), touched on s only; NULL: cudaErrorInvalidValue. */
int zkc_encoder_backward_g16(cudaStream_t s, uint16_t *dwte, uint16_t *dwpe, const void *dout,
                             int d16, const int32_t *tok, int B, int T, int C, int V, int *dbad,
                             float *scratch);
size_t zkc_encoder_backward_g16_scratch(int C, int V);

/* ---- xent.cu: the fused classifier. logits (N,V) in rows ld apart (ld >=
 * V: the LM head's padded rows), fp32 or bf16; losses (N) fp32 WRITTEN;
 * dlogits (N,ld) WRITTEN when not NULL (may alias logits): columns [0,V) =
 * (softmax - onehot) * dscale, [V,ld) = 0. One block per row, online
 * softmax: one read pass keeps a running (max, sum) per thread over a fixed
 * partition of the row, merged in a fixed order (deterministic, the same
 * bits on any GPU); a second pass writes dlogits (rounded once for bf16).
 * fp32 sums: not the CPU's bits (its double lanes), within ~1e-6. A target
 * outside [0,V): loss 0, dlogits row 0, *dbad += 1. ---- */
int zkc_crossentropy(cudaStream_t s, float *losses, float *dlogits, const float *logits,
                     const int32_t *targets, int N, int V, int ld, float dscale, int *dbad);
int zkc_crossentropy_bf16(cudaStream_t s, float *losses, uint16_t *dlogits,
                          const uint16_t *logits, const int32_t *targets, int N, int V,
                          int ld, float dscale, int *dbad);

/* ---- adamw.cu: the CPU's coefficients (computed on the host the same way)
 * and the same per-operation rounding (no FMA contraction): the same bits
 * as zk_adamw. ---- */
int zkc_adamw(cudaStream_t s, float *p, const float *g, float *m, float *v, size_t n,
              float lr, float b1, float b2, float eps, float wd, float gscale, int t);
/* the same over nseg (<= 16) segments [off, off + len) of p, g, m, v, each
 * with its weight decay, in one launch (zt_adamw_segments' contract); lp
 * kind 1 (bf16) or 2 (f16): each updated p also written there rounded (the
 * casts' bits), 0: lp NULL. g kind 0: f32; 1 (bf16) or 2 (f16): a
 * mixed-precision step's stored gradient read as it is, each element
 * widened exactly -- the bits of g kind 0 on an f32 copy of the widened
 * values (no fp32 accumulator needed). Another kind: cudaErrorInvalidValue.
 * (Kinds: zt_dtype's numbers, ZT_F32 0, ZT_BF16 1, ZT_F16 2.) */
int zkc_adamw_segments(cudaStream_t s, float *p, const void *g, int g_kind, float *m, float *v,
                       void *lp, int lp_kind, int nseg, const int64_t *off, const int64_t *len,
                       const float *wd, float lr, float b1, float b2, float eps, float gscale,
                       int t);
/* The same over many tensors' segments at once (zt_adamw_multi: a step's
 * whole update in one launch, or one per 600 items): item k is len[k] >= 0
 * elements at p[k], g[k] (g_kind, as above, one for all items), m[k],
 * v[k] and (lp_kind 1 or 2, as above; 0: lp unused, may be NULL) lp[k],
 * each pointer at the item's first element, with weight decay wd[k]. The
 * items must not overlap (zt_adamw_multi checks). Every element the bits
 * of zkc_adamw_segments over it (the same per-element code: the CPU's).
 * The host arrays are read before the call returns. n < 1, a negative
 * len, another kind: cudaErrorInvalidValue, nothing launched. */
int zkc_adamw_multi(cudaStream_t s, int n, float *const *p, const void *const *g,
                    float *const *m, float *const *v, void *const *lp, const int64_t *len,
                    const float *wd, int g_kind, int lp_kind, float lr, float b1, float b2,
                    float eps, float gscale, int t);

/* ---- reduce.cu: zk_sumsq_blocks' / zk_sum_f64's block partials, same
 * lanes and order in double: the same bits. partials is a device array of
 * ceil(n / 1024) doubles. zkc_sumsq_blocks' x kind as adamw's g kind: 0
 * f32, 1 bf16, 2 f16 widened exactly (the partials of an f32 copy, bit
 * for bit), another: cudaErrorInvalidValue. ---- */
int zkc_sumsq_blocks(cudaStream_t s, double *partials, const void *x, int x_kind, size_t n);
int zkc_sum_blocks(cudaStream_t s, double *partials, const float *x, size_t n);

/* ---- matmul.cu: cuBLAS fp32 GEMMs (fp32 compute, no TF32: the handle's
 * math mode is the caller's, device_cuda.c sets CUBLAS_DEFAULT_MATH), bias
 * as a kernel; layouts of zk_matmul_*. Returns a cublasStatus_t (nonzero)
 * from cuBLAS, or cudaError_t + 1000 from a launch. ---- */
int zkc_matmul_forward(cublasHandle_t h, cudaStream_t s, float *out, const float *inp,
                       const float *w, const float *b, int N, int C, int OC, int ldo);
/* db (when not NULL) through zkc_colsum: scratch holds
 * zkc_colsum_scratch(N, OC) doubles of device memory, used on s only. */
int zkc_matmul_backward(cublasHandle_t h, cudaStream_t s, float *dinp, float *dw, float *db,
                        const float *dout, const float *inp, const float *w,
                        int N, int C, int OC, int ldo, double *scratch);
/* bf16 operands, fp32 accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F), out
 * fp32 or (out_bf16) bf16: not zk_matmul_bf16's bits (cuBLAS's k order).
 * ldo: out's (dout's) row stride in elements, >= OC (kernels.h). b (NULL:
 * none) fp32, or (b16) bf16 (a bf16 run's stored bias, any alignment):
 * the bits of an fp32 b holding its widened values (the same path: the
 * bias's type and alignment never choose it). */
int zkc_matmul_bf16_forward(cublasHandle_t h, cudaStream_t s, void *out, int out_bf16,
                            const uint16_t *inp, const uint16_t *w, const void *b, int b16,
                            int N, int C, int OC, int ldo);
/* dinp16: dinp (N,C) bf16, the fp32 dinp rounded once (RNE): one GEMM with
 * a bf16 D (cuBLASLt's plan without split-K partials, or cublasGemmEx with
 * a bf16 C), or, where OC is split (zkc_matmul_split: dinp's k = OC in two
 * partial sums, not to be added in bf16), the fp32 products into scratch
 * and zkc_cast_f32_bf16 from there -- the fp32 call's dinp bits rounded.
 * dinp16 0: dinp fp32 as before. scratch: zkc_matmul_bf16_backward_scratch
 * doubles (db's colsum, and the split's fp32 dinp: the larger, the two
 * used one after the other on s); NULL where that is 0.
 * g16: dw (OC,C) and db (OC) bf16 (a bf16 run's stored gradients, written
 * by the op: no fp32 image in the caller's memory); 0: fp32. dw, where
 * zkc_matmul_g16_dw_f32(N, C, OC) (a small output: fewer 128x128 tiles
 * than the device's SMs, where a bf16 D's plan, without split-K, would
 * leave most of the GPU idle): the fp32 call's GEMMs into scratch and
 * zkc_cast_f32_bf16 -- the fp32 call's dw rounded, bit for bit; else one
 * GEMM with a bf16 D (k = N is never split), the fp32 accumulator rounded
 * once by cuBLAS(Lt), its algorithm pinned per shape and D type like
 * every plan: within the fp32 GEMM's bound plus half a bf16 ulp (the
 * bf16-D plan may take another algorithm than the fp32-D one: not
 * necessarily the fp32 call's dw rounded); db: colsum's, rounded once --
 * the fp32 call's db rounded, bit for bit. The same scratch, sized by
 * zkc_matmul_bf16_backward_scratch (g16dw: g16 with a dw; then OC*C floats
 * more where the shape takes the fp32 path), its users one after another
 * on s (dinp16's split, dw's fp32 image, db's colsum). */
int zkc_matmul_bf16_backward(cublasHandle_t h, cudaStream_t s, void *dinp, int dinp16,
                             void *dw, void *db, int g16, const uint16_t *dout,
                             const uint16_t *inp, const uint16_t *w, int N, int C, int OC,
                             int ldo, double *scratch);
size_t zkc_matmul_bf16_backward_scratch(int N, int C, int OC, int db, int dinp16, int g16dw);
/* 1 where a g16 dw of this shape takes the fp32 path and the cast (above)
 * on the current device, 0 where one GEMM with a bf16 D. */
int zkc_matmul_g16_dw_f32(int N, int C, int OC);
/* 1 (the default): that rule; 0: a g16 dw always one bf16-D GEMM (tests
 * and benches compare); -1 only asks. Returns the setting in force.
 * Process-wide; change it while no matmul runs. */
int zkc_matmul_g16_hybrid(int on);

/* ---- colsum.cu: out (OC) fp32, or (out16) bf16 rounded once, WRITTEN =
 * column sums of x (N,OC), rows ld
 * apart, fp32 or bf16: the bias gradients. Chunks of 64 rows each summed
 * in order in double (a thread per column and chunk), then the chunks in
 * order: deterministic, the same bits on any GPU; the CPU's grouping of
 * double sums differs (a float ulp at most). out16: out bf16 (a bf16 run's
 * stored bias gradient), the fp32 result rounded once (zkc_bf16: the
 * fp32 out cast, bit for bit). scratch: zkc_colsum_scratch(N, OC) doubles
 * of device memory, touched on s only. ---- */
size_t zkc_colsum_scratch(int N, int OC);
int zkc_colsum(cudaStream_t s, void *out, int out16, const float *x, int N, int OC, int ld,
               double *scratch);
int zkc_colsum_bf16(cudaStream_t s, void *out, int out16, const uint16_t *x, int N, int OC,
                    int ld, double *scratch);
/* Which library runs the matmuls: 0 cuBLAS, 1 cuBLASLt (the forward's bias
 * in its epilogue), 2 cuBLASLt for bf16 operands only (the default); -1
 * only asks. Returns the setting in force. Shapes, layouts and alignments
 * cuBLASLt has no algorithm for keep cuBLAS. */
int zkc_matmul_epilogue(int on);
/* 1 (the default): a bf16 GEMM with more than 8192 output columns, not a
 * multiple of 128 (the LM head's V), runs as two, the columns up to the
 * last multiple of 128 and the rest (matmul.cu, split_at); 0: as one. -1
 * only asks. Returns the setting in force. */
int zkc_matmul_split(int on);
/* The MLP's GEMMs with its GELU (internal.h's matmul_bf16_forward_gelu,
 * matmul_bf16_backward_dgelu), bf16 operands and activations, rows dense
 * (ld OC forward, C for dinp16 and pre backward; dout's ldo >= OC).
 * forward_gelu: pre (N,OC) = inp @ w^T + b and out (N,OC) = gelu(pre),
 * both bf16 (b fp32, bf16 (b16) or NULL, as zkc_matmul_bf16_forward's).
 * backward_dgelu: dinp16 (N,C) bf16 =
 * gelu'(pre) * (dout @ w), pre (N,C) bf16; dinp32 (N,C) fp32 scratch
 * (written only where the product is formed apart); dw, db (NULL:
 * skipped), g16 and scratch as zkc_matmul_bf16_backward's, the same bits
 * (scratch: zkc_matmul_bf16_backward_scratch(N, C, OC, db != NULL, 0,
 * g16 && dw)); dinp16 NULL: dw, db alone. Through cuBLASLt's GELU_AUX(_BIAS) / DGELU
 * epilogues where the shape has a plan (the GELU of the fp32 sum, by
 * cuBLASLt's arithmetic), else exactly the two ops apart:
 * zkc_matmul_bf16_forward into pre then zkc_gelu_forward (bf16 in and
 * out); zkc_matmul_bf16_backward into dinp32 then zkc_gelu_backward
 * (matmul.cu says which shapes fuse: functions of the shapes and
 * alignments only). Returns as the matmuls do. */
int zkc_matmul_bf16_forward_gelu(cublasHandle_t h, cudaStream_t s, uint16_t *out, uint16_t *pre,
                                 const uint16_t *inp, const uint16_t *w, const void *b, int b16,
                                 int N, int C, int OC);
int zkc_matmul_bf16_backward_dgelu(cublasHandle_t h, cudaStream_t s, uint16_t *dinp16,
                                   float *dinp32, void *dw, void *db, int g16,
                                   const uint16_t *dout, const uint16_t *inp, const uint16_t *w,
                                   const uint16_t *pre, int N, int C, int OC, int ldo,
                                   double *scratch);
/* 1 (the default): the two above fuse the GELU where they can; 0: always
 * the two ops apart (tests and benches compare). -1 only asks. Returns the
 * setting in force. Process-wide; change it while no matmul runs. */
int zkc_matmul_gelu_fusion(int on);
/* how many of those calls took a GELU epilogue so far (the process's
 * count): tests and benches tell the fused path from the two ops by it */
int64_t zkc_matmul_gelu_fused(void);
/* stream s is being destroyed (synced): its cuBLASLt workspace is freed */
void zkc_matmul_stream_gone(cudaStream_t s);
#define ZKC_LAUNCH_BASE 1000

/* ---- reduce.cu: the communicators' rank-order sum (zk_sum_ranks): dst[i] =
 * ((src0[i] + src1[i]) + src2[i]) + ..., srcj = src + j*n, each add rounded
 * in fp32: the CPU's bits. dst must not overlap src. ---- */
int zkc_sum_ranks(cudaStream_t s, float *dst, const float *src, int nsrc, size_t n);

/* ---- attention.cu: causal self-attention, layouts of zk_attention_*; head
 * size C/NH <= 256 (else cudaErrorInvalidValue). Online softmax, no (T,T)
 * buffer; backward deterministic (one owner per output row). scratch: a
 * device array of B*NH*T floats. Plain, not fast (see the file). io16
 * (internal.h's device-table contract): qkv, out, dqkv and (backward)
 * dout bf16 (uint16_t bits), else fp32; lse fp32 either way. A bf16 input is widened
 * exactly and the arithmetic is the fp32 kernel's, each output rounded
 * once to nearest even (zkc_bf16): round(fp32 kernel(widen(x))), bit for
 * bit, on any one GPU. ---- */
int zkc_attention_forward(cudaStream_t s, void *out, float *lse, const void *qkv, int io16,
                          int B, int T, int C, int NH);
int zkc_attention_backward(cudaStream_t s, void *dqkv, const void *dout, const void *qkv,
                           const void *out, const float *lse, int io16, int B, int T, int C,
                           int NH, float *scratch);
/* zk_attention_decode's contract (KV cache rows [pos, pos+T) WRITTEN, then
 * out), fp32 only; row i's output has the bits of row pos+i of the fp32
 * zkc_attention_forward over the whole sequence (the same row arithmetic),
 * not the CPU's. */
int zkc_attention_decode(cudaStream_t s, float *out, float *kcache, float *vcache,
                         const float *qkv, int B, int T, int C, int NH, int maxT, int pos);
/* Grouped-query heads and a sliding window, zk_attention_*_gqa's layouts
 * (qkv rows C + 2 NKV hs, caches (B,NKV,maxT,hs), window W >= 0); the three
 * above are NKV = NH, W = 0. NH % NKV != 0 or W < 0: cudaErrorInvalidValue.
 * dk, dv of a kv head summed over its query heads ascending by one warp a
 * key row (no atomics); scratch as above (B*NH*T floats). */
int zkc_attention_forward_gqa(cudaStream_t s, void *out, float *lse, const void *qkv, int io16,
                              int B, int T, int C, int NH, int NKV, int W);
int zkc_attention_backward_gqa(cudaStream_t s, void *dqkv, const void *dout, const void *qkv,
                               const void *out, const float *lse, int io16, int B, int T, int C,
                               int NH, int NKV, int W, float *scratch);
int zkc_attention_decode_gqa(cudaStream_t s, float *out, float *kcache, float *vcache,
                             const float *qkv, int B, int T, int C, int NH, int NKV, int W,
                             int maxT, int pos);

/* ---- attention_tc_*.cu: the same contracts on bf16 tensor cores
 * (mma.sync m16n8k16 + ldmatrix, kernels/cuda/mma.cuh), fp32 accumulation,
 * FlashAttention-2 style tiles; head size C/NH 64 or 128, and qkv, out,
 * dout, dqkv on 16 bytes (else cudaErrorInvalidValue, nothing launched).
 * q, k, v, dout and the probabilities / dS entering a product are rounded
 * to bf16 (RNE); scores, softmax statistics, lse, D and sums stay fp32.
 * Not the plain kernels' bits (about 2^-9 relative apart: see the file and
 * spec/c/attn_tc_check.h); deterministic run to run (no atomics in the
 * default build). dqkv WRITTEN; scratch: B*NH*T floats (D, written by the
 * dQ kernel), more with the ordered dQ (zkc_attention_backward_tc_scratch).
 * io16 as the plain kernels': bf16 q, k, v go into the tiles
 * as they are (the fp32 path's rounding of a widened bf16 is exact: the
 * same operand bits), a bf16 out is widened for D, out and dqkv are the
 * fp32 results rounded once; so again round(fp32 kernel(widen(x))) bit
 * for bit. A -DZKC_ATTN_TC_DQ_ATOMIC build refuses an io16 backward
 * (cudaErrorInvalidValue: its fp32 atomics need an fp32 dqkv). ---- */
int zkc_attention_forward_tc(cudaStream_t s, void *out, float *lse, const void *qkv, int io16,
                             int B, int T, int C, int NH);
int zkc_attention_backward_tc(cudaStream_t s, void *dqkv, const void *dout, const void *qkv,
                              const void *out, const float *lse, int io16, int B, int T, int C,
                              int NH, float *scratch);
/* Grouped-query heads and a sliding window W >= 0 (zk_attention_*_gqa's
 * layout): the two above are NKV = NH, W = 0. k_tc_dkv runs a block per
 * (key tile, b, kv head) over its query heads ascending: dk, dv in
 * registers, one order, no atomics. NH % NKV != 0 or W < 0:
 * cudaErrorInvalidValue. */
int zkc_attention_forward_tc_gqa(cudaStream_t s, void *out, float *lse, const void *qkv, int io16,
                                 int B, int T, int C, int NH, int NKV, int W);
int zkc_attention_backward_tc_gqa(cudaStream_t s, void *dqkv, const void *dout, const void *qkv,
                                  const void *out, const float *lse, int io16, int B, int T, int C,
                                  int NH, int NKV, int W, float *scratch);
/* The backward's dQ: 0 (the default) its own kernel after D, 3
 * matmul-equivalents of the 7; 1 in the dK/dV kernel (5 in all): each key
 * tile's part of a query chunk's dQ added into an fp32 sum in one fixed
 * order (the chunk's own tile first, then down), the blocks taking tickets
 * in the order they start and waiting on a count per (b, h, chunk): the
 * same bits run to run, whatever the dispatch order. -1 asks; returns the
 * mode (the -DZKC_ATTN_TC_DQ_ATOMIC build stays 0). Process-wide. */
int zkc_attention_tc_ordered_dq(int on);
/* Head size 128's forward: 0 (the default) blocks of 4 warps, 64 query rows;
 * 1 wide: 8 warps, 128 rows (a K, V tile read from L2 serves twice the
 * rows), the next tile prefetched, 1 block an SM. Every row the same tiles
 * in the same order: the same bits either way. -1 asks; returns the
 * setting. Process-wide. */
int zkc_attention_tc_fwd_wide(int on);
/* The forward's warps, both head sizes: 0 (the default) 16 query rows a
 * warp (head size 64: 8 warps, 128 rows a block; 128: as zkc_attention_
 * tc_fwd_wide says); 1 a pair: 4 warps of 32 rows (two m-tiles sharing
 * each K, V fragment), 128 rows a block, the next K, V tile staged while
 * this one computes, 54 / 102 KB of shared memory (on a GPU that grants
 * less than 54, 1 is not taken: the setting stays 0); over fwd_wide when
 * on. At head size 128 only with bf16 I/O, where 102 KB are granted and the
 * kernel's code is sm_90's or later (elsewhere the default blocks run). The same bits either way. -1 asks; returns the
 * setting. Process-wide. */
int zkc_attention_tc_fwd_pair(int on);
/* Head size 128's backward dK/dV: 0 (the default) blocks of 4 warps, 64
 * keys, chunks of 16 queries; 1 wide: 8 warps, 128 keys, chunks of 64,
 * the products tiled in two dimensions, the next chunk staged by
 * cp.async, 173 KB of shared memory (on a GPU that grants less, e.g. an
 * A100, 1 is not taken: the setting stays 0). dk and dv the same bits
 * either way; with the ordered dQ, dq is summed in key tiles of 128 (other
 * bits than the narrow kernel's, the same run to run). -1 asks; returns
 * the setting. Process-wide. */
int zkc_attention_tc_bwd_wide(int on);
/* Head size 64's backward dK/dV: 0 (the default) the narrow kernel (4
 * warps, 64 keys, chunks of 64 queries); 1 wide as at 128 (8 warps, 128
 * keys, a warp's products 32 x 32, 111 KB of shared memory; on a GPU that
 * grants less the setting stays 0). The same bits contract as there. -1
 * asks; returns the setting. Process-wide. */
int zkc_attention_tc_bwd_wide64(int on);
/* floats of scratch the backward needs in the current mode: B*NH*T (D) in
 * mode 0 and for other head sizes; in mode 1 also the counts and, for a
 * bf16 dqkv (io16), the fp32 sums (B*T*C) */
size_t zkc_attention_backward_tc_scratch(int io16, int B, int T, int C, int NH);

#ifdef __cplusplus
}
#endif
#endif
