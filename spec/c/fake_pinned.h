/*
 * fake_pinned.h -- a fake device's pinned host memory for the C tests that
 * install a device with an execution table (zt_exec_ops in
 * runtime/internal.h): page-aligned host memory remembered until freed, so
 * a test sees which host buffers came from exec->host_alloc and that they
 * went back through exec->host_free. Point the table's host_alloc,
 * host_free and is_pinned at fake_host_alloc, fake_host_free and
 * fake_is_pinned; fake_pinned_made and fake_pinned_live count them.
 */
#ifndef ZT_FAKE_PINNED_H
#define ZT_FAKE_PINNED_H
#include <pthread.h>
#include <stdlib.h>
#include "ztrain.h"

enum { FAKE_MAXPIN = 1024 };
static void *fake_pinned[FAKE_MAXPIN];
static long fake_pinned_made, fake_pinned_live;
static pthread_mutex_t fake_pin_lock = PTHREAD_MUTEX_INITIALIZER;

static int fake_pin_slot(const void *p)     /* fake_pin_lock held */
{
    for (int i = 0; i < FAKE_MAXPIN; i++) if (fake_pinned[i] && fake_pinned[i] == p) return i;
    return -1;
}

static int fake_host_alloc(void **out, size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, n)) return ZT_ENOMEM;
    pthread_mutex_lock(&fake_pin_lock);
    int i = 0;
    while (i < FAKE_MAXPIN && fake_pinned[i]) i++;
    if (i == FAKE_MAXPIN) i = -1;
    else { fake_pinned[i] = p; fake_pinned_live++; fake_pinned_made++; }
    pthread_mutex_unlock(&fake_pin_lock);
    if (i < 0) { free(p); return ZT_ENOMEM; }
    *out = p;
    return ZT_OK;
}

static int fake_is_pinned(const void *p)
{
    pthread_mutex_lock(&fake_pin_lock);
    int r = p && fake_pin_slot(p) >= 0;
    pthread_mutex_unlock(&fake_pin_lock);
    return r;
}

static void fake_host_free(void *p)
{
    pthread_mutex_lock(&fake_pin_lock);
    int i = p ? fake_pin_slot(p) : -1;
    if (i >= 0) { fake_pinned[i] = NULL; fake_pinned_live--; }
    pthread_mutex_unlock(&fake_pin_lock);
    free(p);
}
#endif
