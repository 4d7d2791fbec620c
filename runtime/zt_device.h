/*
 * zt_device.h -- the active device: backends, sync, attention mode, counters.
 * Part of the public API: include ztrain.h (conventions there); the FFI
 * reads every part in ztrain.h's order.
 */
#ifndef ZTRAIN_DEVICE_H
#define ZTRAIN_DEVICE_H

#include "zt_core.h"

/* ---- device ------------------------------------------------------------ */
/* Select the compute backend: "cpu" (always) or "cuda" (when built with it).
 * Ops are issued to it; on the CPU they complete before returning. */
int zt_device_init(const char *backend);
const char *zt_device_name(void);
/* The hardware under the active device: the GPU's name for "cuda" ("NVIDIA
 * H200"), "" for the others (the CPU's model is in /proc/cpuinfo). */
const char *zt_device_model(void);
/* Wait for every op the calling thread issued so far on its current
 * stream (the default compute stream unless zt_stream_set_current chose
 * another; other streams: zt_stream_sync), and return a kept error of the
 * device's asynchronous ops, if any. */
int zt_device_sync(void);
/* The attention kernels of the active device (recipe key device.attention):
 * "exact" (the plain fp32 kernels; every device) or "bf16" (CUDA only: the
 * tensor-core kernels of kernels/cuda/attention_tc_*.cu where the head size is
 * 64, bf16 operands with fp32 accumulation; other head sizes stay exact).
 * ZT_EINVAL for an unknown mode, or "bf16" on a device without it. Call it
 * after zt_device_init, while no attention op runs; zt_device_init leaves
 * the mode as it was (a process-wide setting of the CUDA device). */
int zt_device_attention(const char *mode);
/* How many times the active device took a kernel path since the process
 * started, for tests that must see a path run: "attention_tc" (the
 * tensor-core attention's forward and backward calls; 0 on a device
 * without it), "host_waits" (the times the host waited for queued device
 * work: syncs, value-returning ops, copies with host memory, frees;
 * fakegpu-async counts a wait only where work was issued since the last,
 * CUDA every wait it makes; 0 elsewhere). ZT_EINVAL for a name not
 * counted. */
int64_t zt_device_count(const char *what);
/* Threads used by the kernels (the OpenMP pool); n >= 1. OpenBLAS runs one
 * thread per call for the whole process (set once when the library loads):
 * the GEMMs spread fixed blocks over OpenMP, which keeps their bits the same
 * on any thread count. Code that changes openblas_set_num_threads for its
 * own sgemm must set it back to 1; a GEMM op fails with ZT_ESTATE until then. */
int zt_set_threads(int n);
int zt_get_threads(void);
/* The OpenBLAS core in use and its build config (for benchmark reports). */
const char *zt_blas_info(void);
/* The bf16 GEMMs' path, fixed for the process: "AMX (tdpbf16ps)",
 * "AVX512_BF16 (vdpbf16ps)" or "portable C (...)", with the reason AMX is not
 * used where it is not (ZTRAIN_BF16_GEMM=amx|avx512_bf16|portable picks one).
 * AMX's bits differ from the other two paths' (kernels.h). */
const char *zt_matmul_bf16_info(void);

#endif
