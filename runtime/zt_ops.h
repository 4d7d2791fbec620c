/*
 * zt_ops.h -- tensor-level ops (the kernels' contracts: kernels/cpu/kernels.h).
 * Part of the public API: include ztrain.h (conventions there); the FFI
 * reads every part in ztrain.h's order.
 */
#ifndef ZTRAIN_OPS_H
#define ZTRAIN_OPS_H

#include "zt_core.h"

/* ---- ops ---------------------------------------------------------------- */
/* Shapes: N = rows (B*T), C = channels, OC = out channels, V = vocab.
 * Activations may be given as (B,T,C) or (N,C): ops check numel. Gradient
 * outputs are WRITTEN unless marked ACCUMULATED. All f32 unless stated.
 *
 * Tiers: an op's tensors all live on one tier, device or host (nvme bytes
 * are not addressable); otherwise it fails with ZT_EINVAL naming both
 * tensors and tiers. Move bytes between tiers with zt_copy_async.
 * Streams: an op runs on the calling thread's current stream (see "streams
 * and events" below). */
int zt_fill(zt_tensor *x, float value);
int zt_copy(zt_tensor *dst, const zt_tensor *src);          /* same dtype, numel, tier */
int zt_scale(zt_tensor *x, float a);
int zt_axpy(zt_tensor *y, float a, const zt_tensor *x);      /* y += a*x */
/* y += x; y f32, x f32 or a 2-byte x (bf16, f16: a stored gradient into
 * its fp32 accumulator) widened as read, the bits of zt_cast then zt_add */
int zt_add(zt_tensor *y, const zt_tensor *x);
int zt_add3(zt_tensor *out, const zt_tensor *a, const zt_tensor *b); /* out = a+b */
/* dst and src of equal numel, f32 <-> bf16/f16 (or equal dtypes: a copy). */
int zt_cast(zt_tensor *dst, const zt_tensor *src);

/* tokens (B,T) i32; out (B,T,C); wte (V,C); wpe (maxT,C), T <= maxT, or
 * NULL: no position embedding (Llama's), out = wte[tokens].
 * Token ids are not read on the host: a kernel skips ids outside [0,V)
 * (memory-safe) and the op then fails with ZT_EINVAL saying how many (its
 * outputs are then wrong for them). Check tokens where they are made: the
 * data loader's vocab_size option. The same holds for zt_crossentropy's
 * targets. */
int zt_encoder_forward(zt_tensor *out, const zt_tensor *tokens,
                       const zt_tensor *wte, const zt_tensor *wpe);
/* dwte ACCUMULATED, dwpe rows [0,T) WRITTEN (NULL: no positions). Both
 * f32, or both bf16 (a bf16 run's stored gradients): each dwte element
 * then round(widen(dwte) + the f32 op's additions, in its order), each
 * dwpe element the f32 one rounded once -- the bits of an f32 image and a
 * cast after, without either (the same for every op's bf16 weight
 * gradients below). */
int zt_encoder_backward(zt_tensor *dwte, zt_tensor *dwpe, const zt_tensor *dout,
                        const zt_tensor *tokens);
/* out (N,C) f32, or bf16 (each element the f32 out's, rounded once: what a
 * bf16 GEMM reads, written so instead of cast after); mean, rstd (N).
 * weight and bias (C) f32, or both bf16 (a bf16 run's stored parameters,
 * widened exactly as read: the bits of f32 copies of them; C <= 16384).
 * The same for every layer and RMS norm op below. */
int zt_layernorm_forward(zt_tensor *out, zt_tensor *mean, zt_tensor *rstd,
                         const zt_tensor *inp, const zt_tensor *weight,
                         const zt_tensor *bias);
/* The residual add fused with the layer norm that reads it: resid (N,C) f32
 * WRITTEN = a + b, then out = layernorm(resid) (f32 or bf16), mean, rstd:
 * the bits of zt_add3 followed by zt_layernorm_forward, one pass. resid
 * may not alias a or b. */
int zt_layernorm_residual_forward(zt_tensor *resid, zt_tensor *out, zt_tensor *mean,
                                  zt_tensor *rstd, const zt_tensor *a, const zt_tensor *b,
                                  const zt_tensor *weight, const zt_tensor *bias);
/* dinp ACCUMULATED; dweight, dbias WRITTEN, f32 or both bf16 (each the
 * f32 value rounded once; C <= 16384). Split backward: dinp NULL
 * computes the weight gradients only; dweight and dbias both NULL the input
 * gradient only. Each output has the same bits as in the fused call. */
int zt_layernorm_backward(zt_tensor *dinp, zt_tensor *dweight, zt_tensor *dbias,
                          const zt_tensor *dout, const zt_tensor *inp,
                          const zt_tensor *weight, const zt_tensor *mean,
                          const zt_tensor *rstd);
/* The same, and dinp16 (bf16, (N,C), with dinp) WRITTEN = the accumulated
 * dinp rounded once (zt_cast's bits): the residual gradient as the next
 * bf16 GEMM reads it, without a cast pass. */
int zt_layernorm_backward_b16(zt_tensor *dinp, zt_tensor *dinp16, zt_tensor *dweight,
                              zt_tensor *dbias, const zt_tensor *dout, const zt_tensor *inp,
                              const zt_tensor *weight, const zt_tensor *mean,
                              const zt_tensor *rstd);
/* Padded rows: a matmul's out (forward) or dout (backward) and the
 * cross-entropy's logits may be (..., zt_padded_cols(OC)) instead of
 * (N,OC): each row then holds OC values and zt_padded_cols(OC) - OC
 * columns the GEMMs neither read nor write (the cross-entropy writes them
 * 0 in dlogits). GPT-2's LM head keeps its logits so (50257 in rows of
 * 50304): a GPU's GEMMs need rows on 16 bytes for their fast kernels. The
 * bits do not depend on the padding. */
int64_t zt_padded_cols(int64_t n);   /* n rounded up to a multiple of 128 */
/* out (N,OC) = inp (N,C) @ weight(OC,C)^T + bias(OC); bias may be NULL. */
int zt_matmul_forward(zt_tensor *out, const zt_tensor *inp,
                      const zt_tensor *weight, const zt_tensor *bias);
/* dinp, dbias may be NULL. Split backward: dweight NULL (then dbias NULL
 * too) computes dinp only. Each output has the same bits as in the fused call. */
int zt_matmul_backward(zt_tensor *dinp, zt_tensor *dweight, zt_tensor *dbias,
                       const zt_tensor *dout, const zt_tensor *inp,
                       const zt_tensor *weight);
/* The same on bf16 operands with fp32 accumulation (mixed precision):
 * inp (N,C), weight (OC,C), dout (N,OC) bf16; dweight, dbias f32, or both
 * bf16 (a bf16 run's stored gradients: each element the f32 one rounded
 * once, the GEMM's sums never stored in fp32 -- on the CPU devices; CUDA
 * writes a large dweight as a bf16 D, the fp32 sum of its own algorithm
 * rounded once: within the fp32 GEMM's bound, fixed for a shape on a
 * card); bias f32
 * or bf16 (widened exactly as read: an f32 copy's bits); dinp f32 or bf16;
 * out f32, or bf16 (each element the f32 out's, rounded once). Every output element is one fixed sequential chain over k with
 * VDPBF16PS's arithmetic (kernels/cpu/matmul_bf16.c states it exactly), so
 * the bits are the same on any thread count and any CPU (AVX512_BF16 where
 * present, a much slower portable path elsewhere: zt_matmul_bf16_info).
 * All outputs WRITTEN; NULLs and split backward as zt_matmul_backward. */
int zt_matmul_bf16_forward(zt_tensor *out, const zt_tensor *inp,
                           const zt_tensor *weight, const zt_tensor *bias);
int zt_matmul_bf16_backward(zt_tensor *dinp, zt_tensor *dweight, zt_tensor *dbias,
                            const zt_tensor *dout, const zt_tensor *inp,
                            const zt_tensor *weight);
/* The MLP's first GEMM and its GELU as one op (bf16 activations): pre
 * (N,OC) = inp @ weight^T + bias and out (N,OC) = gelu(pre), both bf16
 * (zt_matmul_bf16_forward's bf16 out, then zt_gelu_forward on it: those
 * bits on the CPU devices; a GPU may fuse the GELU into the GEMM's
 * epilogue, computing it from the fp32 sum). */
int zt_matmul_bf16_forward_gelu(zt_tensor *out, const zt_tensor *inp, const zt_tensor *weight,
                                const zt_tensor *bias, zt_tensor *pre);
/* The MLP's second GEMM's backward and the GELU's: dinp16 (N,C) bf16 =
 * gelu'(pre) * (dout @ weight) (zt_matmul_bf16_backward's dinp into the f32
 * dinp32, then zt_gelu_backward: those bits on the CPU devices), dweight,
 * dbias as zt_matmul_bf16_backward. dinp16 NULL: the weight gradient only
 * (pre and dinp32 may be NULL then). */
int zt_matmul_bf16_backward_dgelu(zt_tensor *dinp16, zt_tensor *dweight, zt_tensor *dbias,
                                  const zt_tensor *dout, const zt_tensor *inp,
                                  const zt_tensor *weight, const zt_tensor *pre,
                                  zt_tensor *dinp32);
/* qkv (B,T,3C) -> out (B,T,C), lse (B,NH,T). qkv and out f32, or both
 * bf16 (bf16 activations): then the bits of the f32 kernel on the widened
 * qkv, out rounded once; backward likewise with qkv, out and dqkv bf16
 * together, dout and lse f32 either way. Generation (decode) is f32. */
int zt_attention_forward(zt_tensor *out, zt_tensor *lse, const zt_tensor *qkv,
                         int NH);
int zt_attention_backward(zt_tensor *dqkv, const zt_tensor *dout,
                          const zt_tensor *qkv, const zt_tensor *out,
                          const zt_tensor *lse, int NH);
/* Generation with a KV cache: kcache, vcache (B,NH,maxT,C/NH) hold the keys
 * and values of positions [0,pos) of each sequence; qkv (B,T,3C) those of
 * the T new positions [pos, pos+T), pos + T <= maxT. Writes the new keys and
 * values into the caches, then out (B,T,C) = causal attention of each new
 * query over positions [0, its own]. Each out row has the bits of the same
 * row of zt_attention_forward over the whole sequence. A prefill is pos = 0
 * with the prompt; a decode step T = 1, costing O(pos). */
int zt_attention_decode(zt_tensor *out, zt_tensor *kcache, zt_tensor *vcache,
                        const zt_tensor *qkv, int NH, int pos);
/* Grouped-query attention with an optional sliding window (Llama,
 * Mistral): qkv rows (B,T,(NH+2*NKV)*hs) = q (NH heads) | k (NKV) | v (NKV),
 * NH a multiple of NKV, query head h reading kv head h / (NH/NKV); out
 * (B,T,NH*hs), lse (B,NH,T); dqkv like qkv, WRITTEN, the dk and dv of a kv
 * head summed over its query heads in a fixed order (ascending). window
 * >= 0: 0 plain causal, W > 0 query i sees keys (i - W, i] (Hugging Face's
 * sliding_window). Caches (B,NKV,maxT,hs). The calls above are NKV = NH,
 * window = 0, with the same bits. f32 or bf16 as above; on cuda both
 * kernel paths (zt_device_attention "exact" and "bf16") take them. */
int zt_attention_forward_gqa(zt_tensor *out, zt_tensor *lse, const zt_tensor *qkv, int NH,
                             int NKV, int window);
int zt_attention_backward_gqa(zt_tensor *dqkv, const zt_tensor *dout, const zt_tensor *qkv,
                              const zt_tensor *out, const zt_tensor *lse, int NH, int NKV,
                              int window);
int zt_attention_decode_gqa(zt_tensor *out, zt_tensor *kcache, zt_tensor *vcache,
                            const zt_tensor *qkv, int NH, int NKV, int window, int pos);
/* out (gelu_backward's dinp) f32 or bf16 (rounded once, as layernorm's);
 * inp f32, or bf16 (the c_fc GEMM's bf16 out, widened exactly: then out
 * is bf16 too); dout f32. */
int zt_gelu_forward(zt_tensor *out, const zt_tensor *inp);
int zt_gelu_backward(zt_tensor *dinp, const zt_tensor *inp, const zt_tensor *dout);

/* Llama's ops (kernels.h zk_rmsnorm_*, zk_rope_*, zk_swiglu_*; f32).
 * rmsnorm: out (N,C) = w * (x * rstd), rstd (N) saved; backward dinp
 * ACCUMULATED, dweight WRITTEN (f32, or bf16 rounded once: C <= 16384),
 * either NULL (not both). */
int zt_rmsnorm_forward(zt_tensor *out, zt_tensor *rstd, const zt_tensor *inp, const zt_tensor *w,
                       float eps);
int zt_rmsnorm_backward(zt_tensor *dinp, zt_tensor *dweight, const zt_tensor *dout,
                        const zt_tensor *inp, const zt_tensor *w, const zt_tensor *rstd);
/* bf16 activations: out may be bf16 (the f32 result rounded once); dinp16
 * NULL or (with dinp) bf16, the accumulated dinp rounded once. */
int zt_rmsnorm_backward_b16(zt_tensor *dinp, zt_tensor *dinp16, zt_tensor *dweight,
                            const zt_tensor *dout, const zt_tensor *inp, const zt_tensor *w,
                            const zt_tensor *rstd);
/* cos, sin (P, hs/2) WRITTEN: zk_rope_table's, computed on the host and
 * written; factor <= 0: no Llama 3 scaling (the other three then unused) */
int zt_rope_table(zt_tensor *cos, zt_tensor *sin, double theta, double factor,
                  double low_freq_factor, double high_freq_factor, double original_max_positions);
/* x: rows of its last dim; the nh heads of hs at column col0 of every row
 * turned in place by position pos0 + row % T (backward: turned back).
 * cos, sin from zt_rope_table, covering positions up to pos0 + T - 1.
 * x f32 or bf16 (bf16: each pair widened, turned, rounded once). */
int zt_rope_forward(zt_tensor *x, int64_t col0, int nh, int hs, int T, int pos0,
                    const zt_tensor *cos, const zt_tensor *sin);
int zt_rope_backward(zt_tensor *dx, int64_t col0, int nh, int hs, int T, int pos0,
                     const zt_tensor *cos, const zt_tensor *sin);
/* gu (N, 2F): rows [gate | up]; out (N,F) = silu(gate) * up; dgu WRITTEN.
 * gu f32, or bf16 with out and dgu bf16 (the f32 results rounded once);
 * dout f32. */
int zt_swiglu_forward(zt_tensor *out, const zt_tensor *gu);
int zt_swiglu_backward(zt_tensor *dgu, const zt_tensor *dout, const zt_tensor *gu);
/* Bad ids (zt_encoder_*, zt_crossentropy): the CPU fails the op at once; a
 * GPU (and fakegpu-async) counts them on the device and fails the next
 * zt_device_sync (or a later op) naming the op, so that no call waits:
 * sync before trusting outputs (the trainer does, once a step and after an
 * evaluation). */
/* logits (N,V) f32 or bf16, targets (N) i32, losses (N) f32; dlogits (the
 * logits' dtype) may be NULL or logits. V = 0: the logits' last dim; V > 0:
 * logits may also be (N, zt_padded_cols(V)) (padded rows, above). */
int zt_crossentropy(zt_tensor *losses, zt_tensor *dlogits,
                    const zt_tensor *logits, const zt_tensor *targets,
                    float dscale, int64_t V);
/* AdamW over equal-numel param, grad, m, v (see kernels.h for the formula).
 * zt_adamw_segments: the same over nseg (1..ZT_ADAMW_SEGS) segments of the
 * tensors, [offset[s], offset[s] + length[s]), in increasing order, not
 * overlapping, each with its weight decay; elements outside every segment
 * are left alone. One launch on a GPU (a unit's tensors at once), each
 * element the bits of zt_adamw on its segment. lp (NULL, or bf16 / f16 of
 * param's numel): the stored low-precision parameters, each updated
 * element also written there rounded (zt_cast's bits), in the same pass:
 * mixed precision's master -> stored parameters without a cast of its own
 * (elements outside the segments are not written). grad may be bf16 or f16
 * (a mixed-precision step's stored gradient, without accumulation), each
 * element widened exactly as read: the bits of an f32 copy of it. */
#define ZT_ADAMW_SEGS 16
int zt_adamw_segments(zt_tensor *param, const zt_tensor *grad, zt_tensor *m, zt_tensor *v,
                      zt_tensor *lp, int nseg, const int64_t *offset, const int64_t *length,
                      const float *weight_decay, float lr, float beta1, float beta2,
                      float eps, float grad_scale, int step);
int zt_adamw(zt_tensor *param, const zt_tensor *grad, zt_tensor *m,
             zt_tensor *v, float lr, float beta1, float beta2, float eps,
             float weight_decay, float grad_scale, int step);
/* Many tensors' segments at once (one launch on a GPU for a whole step's
 * update: every unit's tensors, where zt_adamw_segments takes one unit's):
 * part k updates [offset, offset + length) of its own param, grad, m, v
 * (and lp) with its weight decay, each element the bits of zt_adamw on its
 * segment (lp as zt_adamw_segments'). Every part's grad has one dtype
 * (f32, bf16 or f16), every lp one (or all NULL); no two parts may write
 * the same element; n in 1..ZT_ADAMW_PARTS. */
typedef struct zt_adamw_part {
    zt_tensor *param;
    const zt_tensor *grad;
    zt_tensor *m, *v, *lp;
    int64_t offset, length;
    float weight_decay;
} zt_adamw_part;
#define ZT_ADAMW_PARTS 4096
int zt_adamw_multi(const zt_adamw_part *parts, int n, float lr, float beta1, float beta2,
                   float eps, float grad_scale, int step);
/* Elements per block of the fixed-partition fp64 sums. */
int64_t zt_sum_block(void);
/* partials[i] = sum of squares of block i of x (f32, or bf16 / f16 widened
 * exactly as read: an f32 copy's bits); writes ceil(numel / zt_sum_block())
 * doubles. */
int zt_sumsq_blocks(double *partials, const zt_tensor *x);
/* zt_sumsq_blocks of n tensors (one dtype, one tier) in one call: partials holds
 * each one's ceil(numel / zt_sum_block()) block sums in turn, the bits of
 * n calls. On a GPU one copy to the host and one wait for all of them
 * (the gradient norm: a wait a step, not one a unit). */
int zt_sumsq_blocks_many(double *partials, const zt_tensor *const *xs, int n);
/* sum of x (f32) in fp64 over fixed blocks, in block order. */
int zt_sum(double *out, const zt_tensor *x);
/* zt_sum's value (the same fixed-block fp64 sum, the same bits) of n floats
 * of host memory, on the calling thread: no device, no wait, no error. */
double zt_host_sum(const float *x, size_t n);

/* x (f32) = mean + std * N(0,1), deterministic in (seed, stream, element index):
 * the same values on any thread count. Used for model initialisation. */
int zt_randn(zt_tensor *x, uint64_t seed, uint64_t stream, float mean, float std);

#endif
