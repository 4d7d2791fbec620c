/*
 * memory.c -- every byte the runtime allocates, by tier and category.
 *
 * Current and peak bytes are kept per (tier, category) and per tier total;
 * a tier may have a limit. On the CPU backend the "device" tier is ordinary
 * memory that behaves like a GPU's: it is accounted and limited separately
 * from "host", so memory reports and ZeRO formulas mean the same thing on
 * both backends. The nvme tier's bytes are swap files of the aio engine
 * (aio.c): accounted here like any other tier.
 *
 * One allocator per tier (the table below): accounting and limits are the
 * same for all; where the bytes come from is the tier's business.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include <stdint.h>

/* ---- allocators ------------------------------------------------------------ */
typedef struct zt_allocator {
    const char *name;
    /* ZT_OK; ZT_ENOMEM without a message (written here); or another code
     * with its message set (nvme: not configured, a full disk). */
    int (*alloc)(void **out, size_t nbytes);
    void (*free)(void *p);
    void (*zero)(void *p, size_t nbytes);
} zt_allocator;

/* device: the active device backend's memory (zt_device_init happens before
 * any tensor exists, so a block is freed by the backend that allocated it). */
static int dev_alloc(void **out, size_t n) { return zt_dev()->alloc(out, n); }
static void dev_free(void *p) { zt_dev()->free(p); }
static void dev_zero(void *p, size_t n) { zt_dev()->zero(p, n); }

/* host: aligned memory; pinned (the device's exec->host_alloc: CUDA's
 * cudaHostAlloc) while such a device is active, so copies to and from the device are asynchronous and overlap
 * compute (from pageable memory CUDA stages them and the host waits: see
 * docs/gpu.md). Page-aligned (ZT_AIO_PAGE; cudaHostAlloc gives whole
 * pages) and page-rounded, so a whole host tensor goes to and from an
 * O_DIRECT swap file without a bounce copy. Freed by the device that
 * pinned it (is_pinned), else by free(): the device is chosen before any
 * tensor exists. */
/* the table whose host_alloc pinned host memory (the device may change
 * before a buffer is freed: free it through the table that pinned it) */
static const zt_exec_ops *pinned_by;

static int host_alloc(void **out, size_t n)
{
    size_t rounded = (n + ZT_AIO_PAGE - 1) & ~(size_t)(ZT_AIO_PAGE - 1);
    if (!rounded) rounded = ZT_AIO_PAGE;
    void *p = NULL;
    const zt_exec_ops *x = zt_exec();
    if (x && x->host_alloc) {
        int rc = x->host_alloc(&p, rounded);
        if (rc == ZT_OK && ((uintptr_t)p & (ZT_AIO_PAGE - 1))) {    /* O_DIRECT needs it */
            x->host_free(p);
            return zt_error(ZT_EIO, "the %s device's pinned host memory came at %p, not "
                            "%d-byte aligned: the nvme tier's O_DIRECT transfers need "
                            "page-aligned host memory", zt_dev()->name, p, ZT_AIO_PAGE);
        }
        if (rc == ZT_OK) { *out = p; pinned_by = x; }
        return rc;
    }
    if (posix_memalign(&p, ZT_AIO_PAGE, rounded) != 0) return ZT_ENOMEM;
    *out = p;
    return ZT_OK;
}
static void host_free(void *p)
{
    const zt_exec_ops *x = pinned_by;
    if (x && x->is_pinned && x->is_pinned(p)) { x->host_free(p); return; }
    free(p);
}
static void host_zero(void *p, size_t n) { memset(p, 0, n); }

/* nvme: a swap file per storage (aio.c); the pointer is a handle, not
 * bytes. A new swap file reads as zeros, so zeroing is free. */
static void nvme_zero(void *p, size_t n) { (void)p; (void)n; }

static const zt_allocator device_allocator = { "device", dev_alloc, dev_free, dev_zero };
static const zt_allocator host_allocator = { "host", host_alloc, host_free, host_zero };
static const zt_allocator nvme_allocator = { "nvme", zt_nvme_alloc, zt_nvme_free, nvme_zero };

static const zt_allocator *const allocators[ZT_NTIERS] = {
    [ZT_TIER_DEVICE] = &device_allocator,
    [ZT_TIER_HOST] = &host_allocator,
    [ZT_TIER_NVME] = &nvme_allocator,
};

static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static size_t cur[ZT_NTIERS][ZT_NCATS], peak[ZT_NTIERS][ZT_NCATS];
static size_t cur_total[ZT_NTIERS], peak_total[ZT_NTIERS];
static size_t limit[ZT_NTIERS];

static const char *tier_names[ZT_NTIERS] = { "device", "host", "nvme" };
static const char *cat_names[ZT_NCATS] = {
    "params", "grads", "optim", "activations", "comm", "other"
};

const char *zt_tier_name(int tier)
{
    return (tier >= 0 && tier < ZT_NTIERS) ? tier_names[tier] : "?";
}

const char *zt_category_name(int c)
{
    return (c >= 0 && c < ZT_NCATS) ? cat_names[c] : "?";
}

/* Human-readable bytes into buf (e.g. "1.50 GiB"). */
static const char *fmt_bytes(char *buf, size_t n, size_t bytes)
{
    const char *u[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    double v = (double)bytes;
    int i = 0;
    while (v >= 1024.0 && i < 4) { v /= 1024.0; i++; }
    if (i == 0) snprintf(buf, n, "%zu B", bytes);
    else snprintf(buf, n, "%.2f %s", v, u[i]);
    return buf;
}

int zt_mem_alloc(void **out, size_t nbytes, int tier, int category, const char *what)
{
    ZT_CHECK(tier >= 0 && tier < ZT_NTIERS, "zt_mem_alloc: tier %d out of range", tier);
    ZT_CHECK(category >= 0 && category < ZT_NCATS,
             "zt_mem_alloc: category %d out of range", category);
    const zt_allocator *a = allocators[tier];
    *out = NULL;
    pthread_mutex_lock(&mem_lock);
    if (limit[tier] && cur_total[tier] + nbytes > limit[tier]) {
        char req[32], used[32], lim[32], cats[512];
        size_t off = 0;
        for (int c = 0; c < ZT_NCATS; c++) {
            char b[32];
            off += (size_t)snprintf(cats + off, sizeof cats - off, "%s%s %s",
                                    c ? ", " : "", cat_names[c],
                                    fmt_bytes(b, sizeof b, cur[tier][c]));
        }
        fmt_bytes(req, sizeof req, nbytes);
        fmt_bytes(used, sizeof used, cur_total[tier]);
        fmt_bytes(lim, sizeof lim, limit[tier]);
        pthread_mutex_unlock(&mem_lock);
        return zt_error(ZT_ELIMIT,
                        "%s memory limit exceeded: requested %s for %s (%s); in use %s "
                        "of the %s limit (%s)",
                        tier_names[tier], req, cat_names[category], what, used, lim, cats);
    }
    /* Account first so concurrent allocators see the reservation. */
    cur[tier][category] += nbytes;
    cur_total[tier] += nbytes;
    pthread_mutex_unlock(&mem_lock);

    void *p = NULL;
    int rc = a->alloc(&p, nbytes);
    if (rc != ZT_OK || !p) {
        char req[32];
        pthread_mutex_lock(&mem_lock);
        cur[tier][category] -= nbytes;
        cur_total[tier] -= nbytes;
        pthread_mutex_unlock(&mem_lock);
        fmt_bytes(req, sizeof req, nbytes);
        if (rc != ZT_OK && rc != ZT_ENOMEM) {   /* the allocator said why */
            char why[1024];
            snprintf(why, sizeof why, "%s", zt_last_error());
            return zt_error(rc, "cannot allocate %s for %s (%s) on the %s tier: %s", req,
                            cat_names[category], what, tier_names[tier], why);
        }
        return zt_error(ZT_ENOMEM, "out of %s memory allocating %s for %s (%s)", a->name,
                        req, cat_names[category], what);
    }
    pthread_mutex_lock(&mem_lock);
    if (cur[tier][category] > peak[tier][category]) peak[tier][category] = cur[tier][category];
    if (cur_total[tier] > peak_total[tier]) peak_total[tier] = cur_total[tier];
    pthread_mutex_unlock(&mem_lock);
    *out = p;
    return ZT_OK;
}

void zt_mem_free(void *p, size_t nbytes, int tier, int category)
{
    if (!p) return;
    allocators[tier]->free(p);   /* p came from zt_mem_alloc: the tier has one */
    pthread_mutex_lock(&mem_lock);
    cur[tier][category] -= nbytes;
    cur_total[tier] -= nbytes;
    pthread_mutex_unlock(&mem_lock);
}

void zt_mem_zero(void *p, size_t nbytes, int tier)
{
    allocators[tier]->zero(p, nbytes);
}

size_t zt_mem_current(int tier, int category)
{
    if (tier < 0 || tier >= ZT_NTIERS || category >= ZT_NCATS) return 0;
    pthread_mutex_lock(&mem_lock);
    size_t v = category < 0 ? cur_total[tier] : cur[tier][category];
    pthread_mutex_unlock(&mem_lock);
    return v;
}

size_t zt_mem_peak(int tier, int category)
{
    if (tier < 0 || tier >= ZT_NTIERS || category >= ZT_NCATS) return 0;
    pthread_mutex_lock(&mem_lock);
    size_t v = category < 0 ? peak_total[tier] : peak[tier][category];
    pthread_mutex_unlock(&mem_lock);
    return v;
}

size_t zt_mem_peak_total(int tier) { return zt_mem_peak(tier, -1); }

void zt_mem_reset_peak(void)
{
    pthread_mutex_lock(&mem_lock);
    memcpy(peak, cur, sizeof peak);
    memcpy(peak_total, cur_total, sizeof peak_total);
    pthread_mutex_unlock(&mem_lock);
}

int zt_mem_set_limit(int tier, size_t bytes)
{
    ZT_CHECK(tier >= 0 && tier < ZT_NTIERS, "zt_mem_set_limit: tier %d out of range", tier);
    pthread_mutex_lock(&mem_lock);
    size_t used = cur_total[tier];
    if (bytes && used > bytes) {
        pthread_mutex_unlock(&mem_lock);
        char u[32], l[32];
        return zt_error(ZT_EINVAL, "%s memory limit %s is below the %s already in use; "
                        "set the limit before allocating or raise it",
                        tier_names[tier], fmt_bytes(l, sizeof l, bytes),
                        fmt_bytes(u, sizeof u, used));
    }
    limit[tier] = bytes;
    pthread_mutex_unlock(&mem_lock);
    return ZT_OK;
}

size_t zt_mem_limit(int tier)
{
    return (tier >= 0 && tier < ZT_NTIERS) ? limit[tier] : 0;
}
