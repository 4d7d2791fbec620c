/*
 * cuda_stream.h -- the CUDA device's streams, events and pinned host memory
 * (runtime/device_cuda.c; exists only in a `make CUDA=1` build). The Seams
 * issue's zt_stream_* / zt_event_* / zt_copy_async map onto these when the
 * CUDA device is active; stream.c keeps its worker-thread model for the CPU.
 *
 * Handles are opaque: a stream is a cudaStream_t, an event a cudaEvent_t.
 * A NULL stream means the calling thread's current stream (see
 * zt_cuda_set_stream), which is the device's compute stream until set.
 * Every call returns 0 or an error code with a zt_error message naming the
 * CUDA call, file and line; nothing here exits.
 */
#ifndef ZT_CUDA_STREAM_H
#define ZT_CUDA_STREAM_H
#include <stddef.h>

int zt_cuda_init(void);
/* The current GPU's name ("NVIDIA H200"), "" before zt_cuda_init. */
const char *zt_cuda_model(void);

/* A non-blocking stream (no implicit sync with the legacy stream 0). kind:
 * ZT_STREAM_COMPUTE | ZT_STREAM_COPY | ZT_STREAM_COMM; comm streams get the
 * device's highest priority, so a collective's kernels are not queued
 * behind a step's GEMMs. free waits for the stream's work. */
int zt_cuda_stream_new(void **out, int kind);
void zt_cuda_stream_free(void *s);
/* The host waits for everything issued to s so far; then reports the
 * first kept error of a void op, if any. */
int zt_cuda_stream_sync(void *s);
/* Ops (the device table) called by this thread launch on s from now on,
 * cuBLAS included; NULL: back to the compute stream. Per thread, like
 * stream.c's current stream. */
void zt_cuda_set_stream(void *s);
void *zt_cuda_get_stream(void);
/* The device's compute stream (what NULL means on a thread that set none). */
void *zt_cuda_compute_stream(void);
/* CUDA's current device is per thread: a thread other than the one that
 * called zt_device_init (stream workers, the communication thread) calls
 * this before its first CUDA call, so it works on the process's GPU. */
int zt_cuda_bind_thread(void);

/* Events: timing disabled unless timing != 0 (cheaper record and wait). */
int zt_cuda_event_new(void **out, int timing);
void zt_cuda_event_free(void *e);
int zt_cuda_event_record(void *e, void *s);       /* at this point of s's work */
int zt_cuda_stream_wait_event(void *s, void *e);  /* s's later work waits (host does not) */
int zt_cuda_event_sync(void *e);                  /* the host waits */
int zt_cuda_event_query(void *e, int *done);      /* never blocks; a never-recorded event is done */

/* nbytes from src to dst on s (cudaMemcpyDefault: device or host on either
 * side), asynchronous: the host must not touch host bytes of the copy
 * before an event or sync after it. From pageable host memory CUDA stages
 * the bytes, so the call returns late (device->host: when done) and
 * nothing overlaps; from pinned memory (zt_cuda_host_alloc) it overlaps
 * compute on other streams. */
int zt_cuda_copy_async(void *dst, const void *src, size_t nbytes, void *s);

/* Pinned (page-locked, portable) host memory: page aligned, so it also
 * serves O_DIRECT. ZT_ENOMEM without a message when CUDA has none. */
int zt_cuda_host_alloc(void **out, size_t nbytes);
void zt_cuda_host_free(void *p);
/* 1 if p is host memory CUDA pinned (zt_cuda_host_alloc), else 0; never fails. */
int zt_cuda_is_pinned(const void *p);

/* Attention kernels, process-wide: mode 0 "exact" (the plain fp32 kernels,
 * the default), 1 "bf16" (kernels/cuda/attention_tc_*.cu, bf16 tensor cores
 * with fp32 accumulation, where the head size is 64; the plain kernels
 * otherwise), -1 only asks. Returns the mode in force (ZT_EINVAL for an
 * unknown mode). zt_device_attention("exact"|"bf16") (ztrain.h, the recipe
 * key device.attention) sets it.
 * Decode stays on the plain kernel in both modes, so in bf16 mode a decode
 * row no longer has the bits of the forward's row (it is the exact kernel's
 * row, ~2^-9 relative from the bf16 one). Change it only while no attention
 * op runs; needs no initialised device. */
int zt_cuda_attention_mode(int mode);

/* Which library runs the matmuls (kernels/cuda/matmul.cu): 0 cuBLAS
 * (cublasSgemm / cublasGemmEx, the bias a kernel after the GEMM); 1
 * cuBLASLt for every matmul (one plan per shape, the bias in its epilogue);
 * 2 cuBLASLt for bf16 operands, cuBLAS for fp32 (the default: an H200 ran
 * the bf16 qkv forward at 469 TFLOP/s through cuBLASLt, 232 through
 * cublasGemmEx); -1 only asks. Returns the setting in force. Process-wide;
 * change it while no matmul runs. */
int zt_cuda_matmul_epilogue(int on);
/* 1 (the default): a bf16 matmul with more than 8192 output columns not a
 * multiple of 128 (the LM head's V = 50257) runs as two GEMMs, the columns
 * up to the last multiple of 128 and the rest (kernels/cuda/matmul.cu); 0
 * as one; -1 only asks. Returns the setting in force. Process-wide. */
int zt_cuda_matmul_split(int on);
/* The tensor-core attention backward's dQ (attention_tc_bwd.cu): 0 its own
 * pass (the default), 1 in the dK/dV kernel with the key tiles' parts added
 * in a fixed order (ZTRAIN_ATTN_DQ at init); -1 queries. Both give the same
 * bits run to run; not each other's (dk, dv: the same). Process-wide: change
 * it while no attention backward runs (its scratch is sized by the mode). */
int zt_cuda_attention_dq(int on);
/* The tensor-core forward at head size 128: 0 blocks of 64 query rows (the
 * default), 1 of 128 with the next tile prefetched (ZTRAIN_ATTN_FWD128=wide
 * at init); -1 queries. The same bits either way. */
int zt_cuda_attention_fwd_wide(int on);
/* The tensor-core forward's warps, head sizes 64 and 128: 0 16 query rows
 * a warp (the default), 1 a pair of m-tiles, 32 rows, 4 warps a block, the
 * next K, V tile staged by cp.async, where the GPU grants its 54 KB of
 * shared memory (ZTRAIN_ATTN_FWD=pair at init; over zt_cuda_attention_
 * fwd_wide; head size 128 with bf16 I/O, 102 KB and sm_90 code only, else
 * the default blocks); -1 queries. The same bits either way. */
int zt_cuda_attention_fwd_pair(int on);
/* The tensor-core backward's dK/dV at head size 128: 0 blocks of 64 keys
 * (the default), 1 of 128 keys, 8 warps, 173 KB of shared memory, where
 * the GPU grants it (ZTRAIN_ATTN_BWD128=wide at init); -1 queries. dk, dv
 * the same bits either way; dq too with its own pass, other bits (the
 * same run to run) with the ordered dQ. */
int zt_cuda_attention_bwd_wide(int on);
/* The same at head size 64 (ZTRAIN_ATTN_BWD64=wide at init; 111 KB of
 * shared memory): the same bits contract. */
int zt_cuda_attention_bwd_wide64(int on);

#endif
