/*
 * ops_tensors.h -- helpers for tests of runtime/ops.c's ops on device-tier
 * tensors (test_stream16.c, test_grads16.c): a tensor made from floats, the
 * bitwise comparison of two, what a refused call said. Include after
 * ctest.h, kernels.h and ztrain.h.
 */
#ifndef ZT_OPS_TENSORS_H
#define ZT_OPS_TENSORS_H

/* a tensor of the given dtype and shape on the device tier, filled from
 * floats (rounded to nearest even when bf16), or zeroed when f is NULL */
static zt_tensor *tensor(int dtype, int nd, const int64_t *shape, const float *f) {
    zt_tensor *t = NULL;
    if (zt_tensor_new(&t, ZT_TIER_DEVICE, ZT_CAT_OTHER, dtype, nd, shape) != 0) abort();
    size_t n = 1;
    for (int i = 0; i < nd; i++) n *= (size_t)shape[i];
    if (f && dtype == ZT_BF16) {
        uint16_t *h = ct_alloc(n * 2);
        zk_cast_f32_bf16(h, f, n);
        zt_tensor_write(t, h, n * 2);
        free(h);
    } else if (f) {
        zt_tensor_write(t, f, n * 4);
    }
    return t;
}

/* a and b (same dtype and size) hold the same bytes */
static void same_tensor(const char *name, zt_tensor *a, zt_tensor *b) {
    size_t n = (size_t)zt_tensor_numel(a) * zt_dtype_size(zt_tensor_dtype(a));
    unsigned char *x = ct_alloc(n), *y = ct_alloc(n);
    zt_tensor_read(a, x, n);
    zt_tensor_read(b, y, n);
    ct_same_bits(name, x, y, n);
    free(x); free(y);
}

/* rc is an error whose message holds needle */
static int refused(int rc, const char *needle) {
    return rc != 0 && strstr(zt_last_error(), needle) != NULL;
}

#endif
