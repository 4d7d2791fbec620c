/*
 * tensor.c -- refcounted tensors over storages on a memory tier.
 *
 * A storage is one accounted allocation; a tensor is a typed, shaped window
 * (offset + numel) into it. Views share the storage: this is how a unit's
 * parameters are tensors inside one flat buffer that sharding can slice.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"

static const char *dtype_names[ZT_NDTYPES] = { "f32", "bf16", "f16", "i32", "u16" };
static const size_t dtype_sizes[ZT_NDTYPES] = { 4, 2, 2, 4, 2 };

const char *zt_dtype_name(int d) { return (d >= 0 && d < ZT_NDTYPES) ? dtype_names[d] : "?"; }
size_t zt_dtype_size(int d) { return (d >= 0 && d < ZT_NDTYPES) ? dtype_sizes[d] : 0; }

/* Validate a shape; on success *numel is the element count. */
static int check_shape(const char *fn, int ndim, const int64_t *shape, int64_t *numel)
{
    ZT_CHECK(ndim >= 1 && ndim <= 4, "%s: ndim %d out of range (1..4)", fn, ndim);
    ZT_CHECK(shape != NULL, "%s: shape is NULL", fn);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        ZT_CHECK(shape[i] >= 1, "%s: dimension %d is %lld; every dimension must be >= 1",
                 fn, i, (long long)shape[i]);
        ZT_CHECK(n <= INT64_MAX / shape[i], "%s: shape overflows", fn);
        n *= shape[i];
    }
    *numel = n;
    return ZT_OK;
}

const char *zt_describe_shape(char *buf, size_t n, int dtype, int ndim, const int64_t *shape)
{
    size_t off = (size_t)snprintf(buf, n, "%s [", zt_dtype_name(dtype));
    for (int i = 0; i < ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (off < n) snprintf(buf + off, n - off, "]");
    return buf;
}

const char *zt_describe(const zt_tensor *t, char *buf, size_t n)
{
    return zt_describe_shape(buf, n, t->dtype, t->ndim, t->shape);
}

int zt_tensor_new(zt_tensor **out, int tier, int category, int dtype, int ndim,
                  const int64_t *shape)
{
    int64_t numel;
    ZT_CHECK(out != NULL, "zt_tensor_new: out is NULL");
    *out = NULL;
    ZT_CHECK(dtype >= 0 && dtype < ZT_NDTYPES, "zt_tensor_new: unknown dtype %d", dtype);
    ZT_CHECK(tier >= 0 && tier < ZT_NTIERS, "zt_tensor_new: unknown tier %d", tier);
    ZT_CHECK(category >= 0 && category < ZT_NCATS, "zt_tensor_new: unknown category %d",
             category);
    ZT_TRY(check_shape("zt_tensor_new", ndim, shape, &numel));
    ZT_CHECK((uint64_t)numel <= (uint64_t)(SIZE_MAX / 2) / dtype_sizes[dtype],
             "zt_tensor_new: %lld elements of %s do not fit in memory", (long long)numel,
             dtype_names[dtype]);

    size_t nbytes = (size_t)numel * dtype_sizes[dtype];
    char what[96];
    zt_describe_shape(what, sizeof what, dtype, ndim, shape);
    zt_tensor *t = calloc(1, sizeof *t);
    zt_storage *s = calloc(1, sizeof *s);
    if (!t || !s) {
        free(t); free(s);
        return zt_error(ZT_ENOMEM, "zt_tensor_new: out of memory for a tensor header");
    }
    void *data;
    int rc = zt_mem_alloc(&data, nbytes, tier, category, what);
    if (rc != ZT_OK) { free(t); free(s); return rc; }
    zt_mem_zero(data, nbytes, tier);   /* by the tier's owner: the host never writes device bytes */
    *s = (zt_storage){ .data = data, .nbytes = nbytes, .tier = tier,
                       .category = category, .refcount = 1 };
    t->data = tier == ZT_TIER_NVME ? NULL : data;   /* nvme: a handle, not bytes */
    t->storage = s;
    t->offset = 0;
    t->numel = numel;
    t->ndim = ndim;
    t->dtype = dtype;
    t->refcount = 1;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    *out = t;
    return ZT_OK;
}

int zt_tensor_view(zt_tensor **out, zt_tensor *base, int64_t offset, int ndim,
                   const int64_t *shape)
{
    int64_t numel;
    ZT_CHECK(out != NULL, "zt_tensor_view: out is NULL");
    *out = NULL;
    ZT_CHECK(base != NULL, "zt_tensor_view: base tensor is NULL (freed?)");
    ZT_TRY(check_shape("zt_tensor_view", ndim, shape, &numel));
    ZT_CHECK(offset >= 0 && offset <= base->numel && numel <= base->numel - offset,
             "zt_tensor_view: elements [%lld, %lld) are outside the base tensor of %lld elements",
             (long long)offset, (long long)(offset + numel), (long long)base->numel);
    zt_tensor *t = calloc(1, sizeof *t);
    if (!t) return zt_error(ZT_ENOMEM, "zt_tensor_view: out of memory for a tensor header");
    __atomic_add_fetch(&base->storage->refcount, 1, __ATOMIC_RELAXED);
    t->storage = base->storage;
    t->offset = base->offset + offset;
    t->data = base->storage->tier == ZT_TIER_NVME ? NULL
            : (char *)base->storage->data + (size_t)t->offset * dtype_sizes[base->dtype];
    t->numel = numel;
    t->ndim = ndim;
    t->dtype = base->dtype;
    t->refcount = 1;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    *out = t;
    return ZT_OK;
}

void *zt_tensor_data(const zt_tensor *t) { return t ? t->data : NULL; }
int64_t zt_tensor_numel(const zt_tensor *t) { return t ? t->numel : 0; }
int zt_tensor_ndim(const zt_tensor *t) { return t ? t->ndim : 0; }
int64_t zt_tensor_dim(const zt_tensor *t, int i) { return t && i >= 0 && i < t->ndim ? t->shape[i] : 0; }
int zt_tensor_dtype(const zt_tensor *t) { return t ? t->dtype : 0; }
int zt_tensor_tier(const zt_tensor *t) { return t ? t->storage->tier : 0; }
int zt_tensor_category(const zt_tensor *t) { return t ? t->storage->category : 0; }
int64_t zt_tensor_offset(const zt_tensor *t) { return t ? t->offset : 0; }

void zt_tensor_retain(zt_tensor *t)
{
    if (t) __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
}

void zt_tensor_release(zt_tensor *t)
{
    if (!t) return;
    if (__atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
    zt_storage *s = t->storage;
    free(t);
    if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
    zt_mem_free(s->data, s->nbytes, s->tier, s->category);
    free(s);
}

/* The explicit synchronous copies between host memory and a tensor (the
 * device copies device bytes; the host never reads them itself; host-tier
 * bytes are the CPU device's copy, after the stream's device work
 * (zt_tier_enter); nvme bytes move by a blocking aio request). */
static int tensor_write(const char *op, int ordered, zt_tensor *t, const void *src, size_t nbytes)
{
    ZT_CHECK(t != NULL && src != NULL, "%s: NULL tensor or source", op);
    size_t want = (size_t)t->numel * dtype_sizes[t->dtype];
    ZT_CHECK(nbytes == want, "%s: %zu bytes given, the tensor holds %zu", op, nbytes, want);
    const zt_device_ops *dev;
    ZT_TRY(zt_tier_enter(t->storage->tier, &dev));
    if (t->storage->tier == ZT_TIER_NVME) return zt_nvme_rw(1, t, (void *)src, nbytes);
    if (ordered && t->storage->tier == ZT_TIER_DEVICE && dev->upload)
        return dev->upload(t->data, src, nbytes);
    dev->copy(t->data, src, nbytes);
    return ZT_OK;
}

int zt_tensor_write(zt_tensor *t, const void *src, size_t nbytes)
{
    return tensor_write("zt_tensor_write", 0, t, src, nbytes);
}

/* zt_tensor_write in stream order: the device's upload (no host wait;
 * src reusable on return), else its copy */
int zt_tensor_upload(zt_tensor *t, const void *src, size_t nbytes)
{
    return tensor_write("zt_tensor_upload", 1, t, src, nbytes);
}

int zt_tensor_read(const zt_tensor *t, void *dst, size_t nbytes)
{
    ZT_CHECK(t != NULL && dst != NULL, "zt_tensor_read: NULL tensor or destination");
    size_t want = (size_t)t->numel * dtype_sizes[t->dtype];
    ZT_CHECK(nbytes == want, "zt_tensor_read: %zu bytes asked, the tensor holds %zu",
             nbytes, want);
    const zt_device_ops *dev;
    ZT_TRY(zt_tier_enter(t->storage->tier, &dev));
    if (t->storage->tier == ZT_TIER_NVME) return zt_nvme_rw(0, t, dst, nbytes);
    dev->copy(dst, t->data, nbytes);
    return ZT_OK;
}
