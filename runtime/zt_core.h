/*
 * zt_core.h -- errors, memory tiers and categories, tensors, SHA-256, the clock and version.
 * Part of the public API: include ztrain.h (conventions there); the FFI
 * reads every part in ztrain.h's order.
 */
#ifndef ZTRAIN_CORE_H
#define ZTRAIN_CORE_H

#include <stddef.h>
#include <stdint.h>

/* ---- errors ------------------------------------------------------------ */
enum {
    ZT_OK = 0,
    ZT_EINVAL = -1,   /* bad argument: shape, dtype, range */
    ZT_ENOMEM = -2,   /* the system allocator failed */
    ZT_ELIMIT = -3,   /* a tier's memory limit would be exceeded */
    ZT_EIO = -4,      /* file or device I/O failed */
    ZT_ESTATE = -5    /* call not valid in the current state */
};
/* Message of the last failing call on this thread ("" if none). */
const char *zt_last_error(void);
/* Short name of an error code ("EINVAL", ...). */
const char *zt_strerror(int code);

/* ---- memory tiers and categories --------------------------------------- */
typedef enum { ZT_F32 = 0, ZT_BF16 = 1, ZT_F16 = 2, ZT_I32 = 3, ZT_U16 = 4, ZT_NDTYPES = 5 } zt_dtype;
typedef enum { ZT_TIER_DEVICE = 0, ZT_TIER_HOST = 1, ZT_TIER_NVME = 2, ZT_NTIERS = 3 } zt_tier;
typedef enum {
    ZT_CAT_PARAMS = 0, ZT_CAT_GRADS = 1, ZT_CAT_OPTIM = 2,
    ZT_CAT_ACTIVATIONS = 3, ZT_CAT_COMM = 4, ZT_CAT_OTHER = 5, ZT_NCATS = 6
} zt_category;

const char *zt_dtype_name(int dtype);
size_t zt_dtype_size(int dtype);
const char *zt_tier_name(int tier);
const char *zt_category_name(int category);

/* Current and peak bytes allocated on a tier in a category (category -1: all). */
size_t zt_mem_current(int tier, int category);
size_t zt_mem_peak(int tier, int category);
/* Peak of the tier total (not the sum of per-category peaks). */
size_t zt_mem_peak_total(int tier);
/* Set peaks to the current values (start of a measured region). */
void zt_mem_reset_peak(void);
/* Limit a tier's total bytes; 0 = no limit. Allocations beyond it fail with
 * ZT_ELIMIT and a message naming the request, the use by category and the
 * limit. Fails with ZT_EINVAL if the tier already holds more than the limit. */
int zt_mem_set_limit(int tier, size_t bytes);
size_t zt_mem_limit(int tier);

/* ---- tensors ----------------------------------------------------------- */
/* Opaque: what a tensor is, the runtime keeps (internal.h); callers ask
 * the accessors below, so no binding can write a refcount or a shape. */
typedef struct zt_storage zt_storage;
typedef struct zt_tensor zt_tensor;

/* A tensor's first element (storage data + offset; an nvme tensor's is an
 * opaque handle), element count, dimensions, dim i (0 <= i < ndim, else
 * 0), dtype (ZT_F32 ...), its storage's tier and category, and its offset
 * in elements into the storage (views share one). NULL or 0 for NULL. */
void *zt_tensor_data(const zt_tensor *t);
int64_t zt_tensor_numel(const zt_tensor *t);
int zt_tensor_ndim(const zt_tensor *t);
int64_t zt_tensor_dim(const zt_tensor *t, int i);
int zt_tensor_dtype(const zt_tensor *t);
int zt_tensor_tier(const zt_tensor *t);
int zt_tensor_category(const zt_tensor *t);
int64_t zt_tensor_offset(const zt_tensor *t);

/* New contiguous tensor on a tier, tagged with a category, zero-filled (by
 * the tier's owner: the device zeroes device memory; a new swap file reads
 * as zeros). ndim in 1..4, every dim >= 1. Host storage is ZT_AIO_PAGE
 * (4096) aligned. The nvme tier needs zt_nvme_configure first (see "nvme
 * tier / aio"); its tensors have data NULL. */
int zt_tensor_new(zt_tensor **out, int tier, int category, int dtype,
                  int ndim, const int64_t *shape);
/* A view of numel(shape) elements of base's storage starting at element
 * offset (relative to base), same dtype. Must lie inside base. */
int zt_tensor_view(zt_tensor **out, zt_tensor *base, int64_t offset,
                   int ndim, const int64_t *shape);
void zt_tensor_retain(zt_tensor *t);
/* Drop one reference; frees the tensor (and its storage with the last
 * reference to it). NULL is ignored. */
void zt_tensor_release(zt_tensor *t);
/* The explicit synchronous copies between host memory and a tensor on any
 * tier (the device's copy; on nvme a blocking aio request): the only way
 * host code reads or writes device-tier bytes. nbytes must equal numel *
 * dtype size. The calling thread's current stream finishes its earlier work
 * first. */
int zt_tensor_write(zt_tensor *t, const void *src, size_t nbytes);
int zt_tensor_read(const zt_tensor *t, void *dst, size_t nbytes);
/* zt_tensor_write ordered like an op instead: on a GPU the bytes are taken
 * now (src may be reused on return) and reach a device-tier tensor in the
 * current stream's order, with no host wait (a micro-batch's tokens: the
 * host does not wait for the previous micro-batch's kernels). Other tiers,
 * and devices without an asynchronous path: zt_tensor_write. */
int zt_tensor_upload(zt_tensor *t, const void *src, size_t nbytes);

/* ---- SHA-256 (for parameter digests) ------------------------------------ */
typedef struct zt_sha256 {
    uint32_t h[8];
    uint64_t nbytes;
    uint8_t buf[64];
    uint32_t nbuf;
} zt_sha256;
void zt_sha256_init(zt_sha256 *s);
void zt_sha256_update(zt_sha256 *s, const void *data, size_t n);
/* Writes 65 bytes: 64 lowercase hex digits and a NUL. */
void zt_sha256_hex(zt_sha256 *s, char *hex65);

/* ---- misc ---------------------------------------------------------------- */
/* Monotonic clock in seconds. */
double zt_now(void);
/* Runtime version string. */
const char *zt_version(void);

#endif
