/*
 * test_cuda_seams.c -- the Seams API (zt_stream_*, zt_event_*, zt_copy_async,
 * the host tier) on the CUDA device, through the whole library: stream.c
 * routed to CUDA streams and events, memory.c's pinned host tier, nvme
 * copies on a CUDA copy stream (the worker thread staged through pinned
 * host tensors). Built and run by `make test-cuda` (it links the full
 * build-cuda library); where no GPU is visible it prints one skip line and
 * exits 0.
 *
 * Each ordering check makes the stream that must be waited for slow (4000
 * queued axpys, tens of ms on a GPU), so a missing wait gives a wrong value,
 * not a lucky one. The gate (a comm request the test completes itself, as
 * in test_streams.c) holds a stream's worker so items queue behind it.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "ctest.h"
#include "comm.h"
#include "cuda_stream.h"

enum { SLOW = 4000 };

static zt_tensor *tensor(int tier, int64_t n)
{
    zt_tensor *t = NULL;
    if (zt_tensor_new(&t, tier, ZT_CAT_OTHER, ZT_F32, 1, &n) != ZT_OK) {
        printf("FAIL tensor_new: %s\n", zt_last_error());
        exit(1);
    }
    return t;
}

/* every element of t (read through the runtime) equals want */
static void all_equal(const char *name, const zt_tensor *t, float want)
{
    size_t n = (size_t)t->numel;
    float *h = ct_alloc(n * 4);
    int rc = zt_tensor_read(t, h, n * 4);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += h[i] != want;
    ct_check(rc == ZT_OK && bad == 0, name, "rc %d (%s), %zu of %zu differ (h[0] = %g, want %g)",
             rc, rc ? zt_last_error() : "", bad, n, h[0], want);
    free(h);
}

/* y += ones, SLOW times, on the current stream */
static void slow_work(zt_tensor *y, zt_tensor *ones)
{
    for (int i = 0; i < SLOW; i++) zt_axpy(y, 1.0f, ones);
}

/* ops on a copy stream, its event, the compute stream waiting for it */
static void t_event_orders_streams(void)
{
    /* 4000 axpys of 48 MB each, ~13 us apiece on an H200: the GPU's queue
     * outlasts the host's launches (at 1 << 20 elements an H200 finished
     * them as fast as they were launched, and the event was done) */
    const int64_t n = 1 << 22;
    zt_tensor *y = tensor(ZT_TIER_DEVICE, n), *ones = tensor(ZT_TIER_DEVICE, n);
    zt_fill(y, 0.0f);
    zt_fill(ones, 1.0f);
    zt_device_sync();
    zt_stream *cs = NULL;
    zt_event *ev = NULL;
    int rc = zt_stream_new(&cs, ZT_STREAM_COPY);
    if (!rc) rc = zt_event_new(&ev);
    ct_check(rc == ZT_OK, "cuda stream and event", "%s", zt_last_error());
    zt_stream_set_current(cs);
    ct_check(zt_cuda_get_stream() != zt_cuda_compute_stream(), "set_current routes ops to the "
             "stream's CUDA stream", "ops still launch on the compute stream");
    slow_work(y, ones);
    zt_event_record(ev, NULL);
    zt_stream_set_current(NULL);
    int done = 1;
    rc = zt_event_query(ev, &done);
    ct_check(rc == ZT_OK && done == 0, "an event after slow GPU work is not done at once",
             "rc %d done %d: the record did not go to the GPU's queue", rc, done);
    zt_stream_wait_event(NULL, ev);     /* the compute stream, not the host, waits */
    zt_scale(y, 2.0f);
    all_equal("compute waits for the copy stream's event", y, 2.0f * SLOW);
    rc = zt_event_query(ev, &done);
    ct_check(rc == ZT_OK && done == 1, "the event is done afterwards", "rc %d done %d", rc, done);
    zt_event_free(ev);
    zt_stream_free(cs);
    zt_tensor_release(y);
    zt_tensor_release(ones);
}

/* the host tier is pinned and page aligned; D2H on a copy stream overlaps */
static void t_pinned_copy(void)
{
    const int64_t n = 1 << 22;
    zt_tensor *h = tensor(ZT_TIER_HOST, n), *d = tensor(ZT_TIER_DEVICE, n);
    zt_tensor *ones = tensor(ZT_TIER_DEVICE, n);
    ct_check(zt_cuda_is_pinned(h->data) && ((uintptr_t)h->data & 4095) == 0,
             "the host tier is pinned, page aligned", "pinned %d, address %p",
             zt_cuda_is_pinned(h->data), h->data);
    zt_fill(d, 0.0f);
    zt_fill(ones, 1.0f);
    zt_stream *cs = NULL;
    zt_event *ev = NULL;
    zt_stream_new(&cs, ZT_STREAM_COPY);
    zt_event_new(&ev);
    zt_stream_set_current(cs);
    slow_work(d, ones);
    zt_stream_set_current(NULL);
    size_t before = zt_mem_current(ZT_TIER_HOST, -1);
    int rc = zt_copy_async(h, d, cs);   /* behind the slow work on cs */
    zt_event_record(ev, cs);
    zt_tensor_release(h);               /* held by the copy until it is done */
    ct_check(rc == ZT_OK && zt_mem_current(ZT_TIER_HOST, -1) == before,
             "a released host tensor stays while its copy is in flight",
             "rc %d, host bytes %zu -> %zu", rc, before, zt_mem_current(ZT_TIER_HOST, -1));
    int done = 1;
    zt_event_query(ev, &done);
    ct_check(done == 0, "copy_async from pinned memory returns before the copy", "done at once");
    rc = zt_stream_sync(cs);
    ct_check(rc == ZT_OK && zt_mem_current(ZT_TIER_HOST, -1) == before - (size_t)n * 4,
             "after sync the held tensor is freed", "rc %d, host bytes %zu (was %zu)", rc,
             zt_mem_current(ZT_TIER_HOST, -1), before);
    zt_event_free(ev);
    zt_stream_free(cs);
    zt_tensor_release(d);
    zt_tensor_release(ones);
}

/* A comm wait holds the worker: a device copy queued behind it must not
 * reach CUDA before the gate opens (the stream's order across the two). */
static void t_worker_then_cuda(void)
{
    const int64_t n = 1 << 16;
    zt_tensor *h = tensor(ZT_TIER_HOST, n), *d = tensor(ZT_TIER_DEVICE, n);
    zt_fill(d, 0.0f);
    float *buf = ct_alloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) buf[i] = 7.0f;
    zt_tensor_write(h, buf, (size_t)n * 4);
    zt_comm_req *gate = ct_alloc(sizeof *gate);
    zt_stream *cs = NULL;
    zt_event *ev = NULL;
    zt_stream_new(&cs, ZT_STREAM_COPY);
    zt_event_new(&ev);
    zt_stream_wait_comm(cs, gate);
    zt_copy_async(d, h, cs);
    zt_event_record(ev, cs);
    usleep(20000);
    int done = 1;
    zt_event_query(ev, &done);
    ct_check(done == 0, "items behind a comm wait wait for it", "the event is done");
    all_equal("the device copy has not run behind the closed gate", d, 0.0f);
    __atomic_store_n(&gate->done, 1, __ATOMIC_RELEASE);
    int rc = zt_event_sync(ev);
    ct_check(rc == ZT_OK, "event after the gate", "%s", zt_last_error());
    all_equal("then the copy ran", d, 7.0f);
    zt_stream_sync(cs);
    zt_event_free(ev);
    zt_stream_free(cs);
    free(gate);
    free(buf);
    zt_tensor_release(h);
    zt_tensor_release(d);
}

/* device -> pinned host -> nvme -> host -> device, all on one copy stream
 * behind slow GPU work: the worker's nvme write must wait for the D2H. */
static void t_nvme_on_cuda_stream(void)
{
    char dir[] = "/tmp/zt_cuda_nvme_XXXXXX";
    if (!mkdtemp(dir) || zt_nvme_configure(dir, 0, 0, 0) != ZT_OK) {
        ct_fail("nvme tier", "%s", zt_last_error());
        return;
    }
    const int64_t n = 1 << 20;
    zt_tensor *d = tensor(ZT_TIER_DEVICE, n), *ones = tensor(ZT_TIER_DEVICE, n);
    zt_tensor *h = tensor(ZT_TIER_HOST, n), *h2 = tensor(ZT_TIER_HOST, n);
    zt_tensor *f = tensor(ZT_TIER_NVME, n), *d2 = tensor(ZT_TIER_DEVICE, n);
    zt_fill(d, 0.0f);
    zt_fill(ones, 1.0f);
    zt_fill(d2, -1.0f);
    zt_stream *cs = NULL;
    zt_stream_new(&cs, ZT_STREAM_COPY);
    zt_stream_set_current(cs);
    slow_work(d, ones);
    zt_stream_set_current(NULL);
    int rc = zt_copy_async(h, d, cs);
    if (!rc) rc = zt_copy_async(f, h, cs);
    if (!rc) rc = zt_copy_async(h2, f, cs);
    if (!rc) rc = zt_copy_async(d2, h2, cs);
    if (!rc) rc = zt_stream_sync(cs);
    ct_check(rc == ZT_OK, "device -> host -> nvme -> host -> device on a copy stream", "%s",
             zt_last_error());
    all_equal("the nvme round trip carries the GPU's result", d2, (float)SLOW);
    zt_stream_free(cs);
    zt_tensor *all[] = { d, ones, h, h2, f, d2 };
    for (int i = 0; i < 6; i++) zt_tensor_release(all[i]);
    zt_nvme_shutdown();
    rmdir(dir);
}

static void (*const tests[])(void) = {
    t_event_orders_streams, t_pinned_copy, t_worker_then_cuda, t_nvme_on_cuda_stream,
};
#define NTESTS ((int)(sizeof tests / sizeof tests[0]))

int main(void)
{
    if (zt_device_init("cuda") != ZT_OK) {
        printf("cuda seams: no GPU here, %d tests skipped (%s)\n", NTESTS, zt_last_error());
        return 0;
    }
    for (int i = 0; i < NTESTS; i++) tests[i]();
    return ct_summary();
}
