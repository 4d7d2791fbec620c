/*
 * test_streams.c -- streams, events and asynchronous copies on the CPU
 * backend: order within a stream, events across streams, waits on
 * communication requests, errors kept by a stream, freeing with work in
 * flight, the current stream, and zt_copy_async's checks.
 *
 * A copy stream runs on a worker thread, so "not done yet" is only
 * observable if the test controls when the worker may go on. The gate is a
 * communication request the test completes itself: a zt_comm_req whose
 * `done` flag it sets (zt_comm_test reads nothing else), built from the
 * private comm.h. A stream told to wait on it stops there, deterministically.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "ctest.h"
#include "comm.h"

static zt_comm_req *gate_new(void) { return ct_alloc(sizeof(zt_comm_req)); }
static void gate_open(zt_comm_req *g) { __atomic_store_n(&g->done, 1, __ATOMIC_RELEASE); }

/* Open a gate from another thread after ms milliseconds. */
typedef struct { zt_comm_req *gate; int ms; } opener_arg;
static void *opener(void *p) {
    opener_arg *a = p;
    struct timespec ts = { a->ms / 1000, (long)(a->ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
    gate_open(a->gate);
    return NULL;
}
static pthread_t open_later(opener_arg *a) {
    pthread_t th;
    pthread_create(&th, NULL, opener, a);
    return th;
}

static zt_tensor *tensor(int tier, int dtype, int64_t n) {
    zt_tensor *t = NULL;
    int rc = zt_tensor_new(&t, tier, ZT_CAT_OTHER, dtype, 1, &n);
    if (rc != ZT_OK) { printf("tensor_new: %s\n", zt_last_error()); exit(2); }
    return t;
}

static void pattern(zt_tensor *t, float base) {
    float *buf = ct_alloc((size_t)t->numel * 4);
    for (int64_t i = 0; i < t->numel; i++) buf[i] = base + (float)(i % 1000);
    zt_tensor_write(t, buf, (size_t)t->numel * 4);
    free(buf);
}

/* 1 if t holds pattern(base) (read through the runtime, not t->data) */
static int has_pattern(const zt_tensor *t, float base) {
    float *buf = ct_alloc((size_t)t->numel * 4);
    zt_tensor_read(t, buf, (size_t)t->numel * 4);
    int ok = 1;
    for (int64_t i = 0; i < t->numel && ok; i++) ok = buf[i] == base + (float)(i % 1000);
    free(buf);
    return ok;
}

static int all_zero(const zt_tensor *t) {
    float *buf = ct_alloc((size_t)t->numel * 4);
    zt_tensor_read(t, buf, (size_t)t->numel * 4);
    int ok = 1;
    for (int64_t i = 0; i < t->numel && ok; i++) ok = buf[i] == 0.0f;
    free(buf);
    return ok;
}

#define N_BIG ((int64_t)1 << 22)   /* 16 MiB of f32 */

/* A copy queued behind a closed gate has not happened; the event after it
 * is not done; opening the gate completes both, in order. */
static void test_order(void) {
    zt_stream *cs = NULL;
    zt_event *e = NULL;
    ct_check(zt_stream_new(&cs, ZT_STREAM_COPY) == ZT_OK && cs, "new copy stream", "%s",
             zt_last_error());
    zt_event_new(&e);
    zt_tensor *src = tensor(ZT_TIER_DEVICE, ZT_F32, N_BIG), *dst = tensor(ZT_TIER_HOST, ZT_F32, N_BIG);
    pattern(src, 1.0f);
    zt_comm_req *gate = gate_new();
    int rc = zt_stream_wait_comm(cs, gate);
    rc |= zt_copy_async(dst, src, cs);
    rc |= zt_event_record(e, cs);
    ct_check(rc == ZT_OK, "queue wait, copy (device -> host), record", "%s", zt_last_error());
    struct timespec ts = { 0, 20000000L };
    nanosleep(&ts, NULL);
    int done = -1;
    zt_event_query(e, &done);
    ct_check(done == 0, "event behind a closed gate is not done", "done %d", done);
    ct_check(all_zero(dst), "copy behind a closed gate has not run (the worker waits)", "dst written");
    gate_open(gate);
    rc = zt_event_sync(e);
    zt_event_query(e, &done);
    ct_check(rc == ZT_OK && done == 1, "event completes after the gate opens", "rc %d done %d", rc, done);
    ct_check(has_pattern(dst, 1.0f), "copy done when the event after it is", "dst differs");

    /* host -> device back, then an event: the round trip is exact */
    zt_tensor *back = tensor(ZT_TIER_DEVICE, ZT_F32, N_BIG);
    zt_copy_async(back, dst, cs);
    zt_event_record(e, cs);
    zt_event_sync(e);
    ct_check(has_pattern(back, 1.0f), "host -> device copy on the copy stream", "differs");

    /* many copies in a row run in issue order: the last write wins */
    zt_tensor *a = tensor(ZT_TIER_HOST, ZT_F32, 4096), *b = tensor(ZT_TIER_HOST, ZT_F32, 4096);
    zt_tensor *t = tensor(ZT_TIER_DEVICE, ZT_F32, 4096);
    pattern(a, 10.0f);
    pattern(b, 20.0f);
    for (int i = 0; i < 50; i++) zt_copy_async(t, (i % 2) ? b : a, cs);
    zt_copy_async(t, a, cs);
    ct_check(zt_stream_sync(cs) == ZT_OK && has_pattern(t, 10.0f),
             "copies on one stream run in issue order (last one wins)", "differs");
    zt_tensor_release(a); zt_tensor_release(b); zt_tensor_release(t);
    zt_tensor_release(back); zt_tensor_release(src); zt_tensor_release(dst);
    zt_event_free(e);
    zt_stream_free(cs);
    free(gate);
}

static void test_events(void) {
    zt_event *e = NULL;
    int done = -1;
    ct_check(zt_event_new(&e) == ZT_OK && zt_event_query(e, &done) == ZT_OK && done == 1,
             "an event never recorded is done", "done %d", done);
    ct_check(zt_event_record(e, NULL) == ZT_OK && zt_event_query(e, &done) == ZT_OK && done == 1,
             "recorded on the compute stream: done at once", "done %d", done);

    /* stream B waits for an event of stream A: B's copy sees A's result */
    zt_stream *A = NULL, *B = NULL;
    zt_stream_new(&A, ZT_STREAM_COPY);
    zt_stream_new(&B, ZT_STREAM_COMM);
    zt_tensor *src = tensor(ZT_TIER_HOST, ZT_F32, N_BIG), *mid = tensor(ZT_TIER_DEVICE, ZT_F32, N_BIG);
    zt_tensor *out = tensor(ZT_TIER_HOST, ZT_F32, N_BIG);
    pattern(src, 5.0f);
    zt_comm_req *gate = gate_new();
    zt_stream_wait_comm(A, gate);
    zt_copy_async(mid, src, A);
    zt_event_record(e, A);
    zt_stream_wait_event(B, e);
    zt_event *eb = NULL;
    zt_event_new(&eb);
    zt_copy_async(out, mid, B);
    zt_event_record(eb, B);
    struct timespec ts = { 0, 20000000L };
    nanosleep(&ts, NULL);
    zt_event_query(eb, &done);
    ct_check(done == 0 && all_zero(out), "a stream waiting on another's event waits", "done %d", done);
    gate_open(gate);
    zt_event_sync(eb);
    ct_check(has_pattern(out, 5.0f), "cross-stream order: B's copy after A's (via the event)",
             "out differs");

    /* re-recording moves the event: behind a new gate it is not done */
    zt_comm_req *gate2 = gate_new();
    zt_stream_wait_comm(A, gate2);
    zt_event_record(e, A);
    zt_event_query(e, &done);
    ct_check(done == 0, "re-recorded event waits for its new point", "done %d", done);
    /* the compute stream waiting on it blocks the host until it completes */
    opener_arg oa = { gate2, 60 };
    pthread_t th = open_later(&oa);
    int rc = zt_stream_wait_event(NULL, e);
    int opened = __atomic_load_n(&gate2->done, __ATOMIC_ACQUIRE);  /* at once: no time bound */
    pthread_join(th, NULL);
    zt_event_query(e, &done);
    ct_check(rc == ZT_OK && done == 1 && opened,
             "compute stream waiting on an event blocks the host until it completes",
             "rc %d done %d; the gate was %s when the wait returned", rc, done,
             opened ? "open" : "still closed");

    /* an event freed while a stream still holds it stays valid for the stream */
    zt_comm_req *gate3 = gate_new();
    zt_event *tmp = NULL;
    zt_event_new(&tmp);
    zt_stream_wait_comm(A, gate3);
    zt_event_record(tmp, A);
    zt_stream_wait_event(B, tmp);
    zt_event_free(tmp);
    gate_open(gate3);
    ct_check(zt_stream_sync(A) == ZT_OK && zt_stream_sync(B) == ZT_OK,
             "an event freed with records and waits queued", "%s", zt_last_error());

    zt_tensor_release(src); zt_tensor_release(mid); zt_tensor_release(out);
    zt_event_free(e); zt_event_free(eb);
    zt_stream_free(A); zt_stream_free(B);
    free(gate); free(gate2); free(gate3);
}

static void test_wait_comm(void) {
    /* compute stream: the host blocks until the request completes */
    zt_comm_req *gate = gate_new();
    opener_arg oa = { gate, 60 };
    pthread_t th = open_later(&oa);
    int rc = zt_stream_wait_comm(NULL, gate);
    int opened = __atomic_load_n(&gate->done, __ATOMIC_ACQUIRE);   /* at once: no time bound */
    pthread_join(th, NULL);
    ct_check(rc == ZT_OK && opened, "compute stream waiting on a request blocks the host",
             "rc %d; the request was %s when the wait returned", rc, opened ? "complete" : "not complete");
    rc = zt_stream_wait_comm(NULL, NULL);
    ct_check(rc == ZT_EINVAL && strstr(zt_last_error(), "already waited"),
             "wait on a NULL request is an error", "rc %d %s", rc, zt_last_error());

    /* a real request (local transport): the stream passes it, then it is waited */
    zt_comm *w = NULL;
    if (zt_comm_world(&w) == ZT_OK && zt_comm_size(w) == 1) {
        zt_stream *cs = NULL;
        zt_stream_new(&cs, ZT_STREAM_COMM);
        zt_tensor *x = tensor(ZT_TIER_DEVICE, ZT_F32, 1000), *h = tensor(ZT_TIER_HOST, ZT_F32, 1000);
        pattern(x, 3.0f);
        zt_comm_req *r = NULL;
        rc = zt_all_reduce(w, x, &r);
        rc |= zt_stream_wait_comm(cs, r);
        rc |= zt_copy_async(h, x, cs);
        rc |= zt_stream_sync(cs);
        rc |= zt_comm_wait(r);      /* after the stream passed it */
        ct_check(rc == ZT_OK && has_pattern(h, 3.0f),
                 "copy after an all-reduce on a comm stream, request waited afterwards", "%s",
                 zt_last_error());
        zt_tensor_release(x); zt_tensor_release(h);
        zt_stream_free(cs);
    }
    free(gate);
}

static void test_errors(void) {
    zt_stream *cs = NULL, *B = NULL;
    zt_stream_new(&cs, ZT_STREAM_COPY);
    zt_stream_new(&B, ZT_STREAM_COPY);
    zt_event *e = NULL;
    zt_event_new(&e);
    zt_tensor *src = tensor(ZT_TIER_DEVICE, ZT_F32, 4096), *dst = tensor(ZT_TIER_HOST, ZT_F32, 4096);
    zt_tensor *dst2 = tensor(ZT_TIER_HOST, ZT_F32, 4096);
    pattern(src, 7.0f);
    zt_stream_inject_error(cs, ZT_EIO, "simulated device fault");
    zt_copy_async(dst, src, cs);
    zt_event_record(e, cs);
    zt_stream_wait_event(B, e);
    zt_copy_async(dst2, src, B);
    int rc = zt_event_sync(e);
    ct_check(rc == ZT_EIO && strstr(zt_last_error(), "simulated device fault") &&
             strstr(zt_last_error(), "copy stream"),
             "an event recorded after a failure returns the error with its message",
             "rc %d msg %s", rc, zt_last_error());
    ct_check(all_zero(dst), "work after a failure is skipped", "dst was written");
    rc = zt_stream_sync(B);
    ct_check(rc == ZT_EIO && strstr(zt_last_error(), "waited on an event whose stream failed") &&
             strstr(zt_last_error(), "simulated device fault") && all_zero(dst2),
             "a stream waiting on a failed event fails and skips its work", "rc %d msg %s", rc,
             zt_last_error());
    rc = zt_stream_sync(cs);
    ct_check(rc == ZT_EIO && strstr(zt_last_error(), "simulated device fault"),
             "the next sync returns the kept error", "rc %d msg %s", rc, zt_last_error());
    rc = zt_stream_sync(cs);
    ct_check(rc == ZT_OK, "reported once: the stream is usable again", "rc %d %s", rc, zt_last_error());
    zt_copy_async(dst, src, cs);
    ct_check(zt_stream_sync(cs) == ZT_OK && has_pattern(dst, 7.0f), "copies run again after the error",
             "%s", zt_last_error());

    /* an op issued while a failed copy stream is current returns its error */
    zt_stream_inject_error(cs, ZT_EIO, "second fault");
    zt_stream_set_current(cs);
    rc = zt_fill(dst, 1.0f);
    zt_stream_set_current(NULL);
    ct_check(rc == ZT_EIO && strstr(zt_last_error(), "second fault") && has_pattern(dst, 7.0f),
             "an op drains the current stream and returns its error without running",
             "rc %d msg %s", rc, zt_last_error());

    zt_tensor_release(src); zt_tensor_release(dst); zt_tensor_release(dst2);
    zt_event_free(e);
    zt_stream_free(cs); zt_stream_free(B);
}

/* zt_stream_free waits for queued work; tensors released meanwhile stay
 * alive (and accounted) until their copy is done. */
static void test_free_in_flight(void) {
    size_t before = zt_mem_current(ZT_TIER_DEVICE, -1);
    zt_stream *cs = NULL;
    zt_stream_new(&cs, ZT_STREAM_COPY);
    zt_tensor *src = tensor(ZT_TIER_DEVICE, ZT_F32, N_BIG), *dst = tensor(ZT_TIER_HOST, ZT_F32, N_BIG);
    pattern(src, 9.0f);
    zt_comm_req *gate = gate_new();
    zt_stream_wait_comm(cs, gate);
    zt_copy_async(dst, src, cs);
    zt_event *e = NULL;
    zt_event_new(&e);
    zt_event_record(e, cs);
    zt_event_free(e);                   /* the queue still holds it */
    zt_tensor_release(src);             /* the queue still holds it */
    ct_check(zt_mem_current(ZT_TIER_DEVICE, -1) == before + (size_t)N_BIG * 4,
             "a released source stays allocated while its copy is queued", "current %zu",
             zt_mem_current(ZT_TIER_DEVICE, -1));
    opener_arg oa = { gate, 50 };
    pthread_t th = open_later(&oa);
    zt_stream_free(cs);
    int opened = __atomic_load_n(&gate->done, __ATOMIC_ACQUIRE);   /* at once: no time bound */
    int copied = has_pattern(dst, 9.0f);
    pthread_join(th, NULL);
    ct_check(opened && copied, "stream_free waits for its queued work",
             "returned with the gate %s, the copy %s", opened ? "open" : "closed",
             copied ? "done" : "not done");
    ct_check(zt_mem_current(ZT_TIER_DEVICE, -1) == before, "the source is freed after its copy",
             "current %zu before %zu", zt_mem_current(ZT_TIER_DEVICE, -1), before);
    zt_tensor_release(dst);
    free(gate);
}

static void test_current(void) {
    ct_check(zt_stream_current() == zt_stream_default(), "default is current", "differs");
    zt_stream *cs = NULL;
    zt_stream_new(&cs, ZT_STREAM_COPY);
    zt_stream_set_current(cs);
    ct_check(zt_stream_current() == cs, "set_current", "differs");
    /* an op issued with a copy stream current runs after the stream's queued copy */
    zt_tensor *src = tensor(ZT_TIER_DEVICE, ZT_F32, N_BIG), *y = tensor(ZT_TIER_DEVICE, ZT_F32, N_BIG);
    pattern(src, 2.0f);
    zt_comm_req *gate = gate_new();
    zt_stream_wait_comm(NULL, gate);    /* NULL: the current stream, cs */
    zt_copy_async(y, src, NULL);
    opener_arg oa = { gate, 30 };
    pthread_t th = open_later(&oa);
    int rc = zt_scale(y, 2.0f);         /* waits for the copy, then doubles it */
    pthread_join(th, NULL);
    ct_check(rc == ZT_OK, "op after a queued copy", "rc %d %s", rc, zt_last_error());
    float v[3];
    zt_tensor *head = NULL;
    int64_t three = 3;
    zt_tensor_view(&head, y, 0, 1, &three);
    zt_tensor_read(head, v, sizeof v);
    ct_check(v[0] == 4.0f && v[1] == 6.0f && v[2] == 8.0f,
             "the op saw the copied values (stream order)", "got %g %g %g", v[0], v[1], v[2]);
    zt_tensor_release(head);
    zt_stream_free(cs);
    ct_check(zt_stream_current() == zt_stream_default(), "freeing the current stream restores the default",
             "differs");
    zt_stream_set_current(NULL);
    /* compute stream: copy_async is synchronous */
    zt_tensor *h = tensor(ZT_TIER_HOST, ZT_F32, N_BIG);
    rc = zt_copy_async(h, src, zt_stream_default());
    ct_check(rc == ZT_OK && has_pattern(h, 2.0f), "copy_async on the compute stream is done on return",
             "rc %d", rc);
    zt_stream *comp = NULL;
    zt_stream_new(&comp, ZT_STREAM_COMPUTE);
    zt_tensor_release(h);
    h = tensor(ZT_TIER_HOST, ZT_F32, N_BIG);
    rc = zt_copy_async(h, src, comp);
    ct_check(rc == ZT_OK && has_pattern(h, 2.0f), "a new compute stream runs on the caller too",
             "rc %d", rc);
    zt_stream_free(comp);
    zt_stream_free(zt_stream_default());   /* ignored */
    zt_tensor_release(src); zt_tensor_release(y); zt_tensor_release(h);
    free(gate);
}

static void test_validation(void) {
    zt_tensor *a = tensor(ZT_TIER_DEVICE, ZT_F32, 100), *b = tensor(ZT_TIER_HOST, ZT_F32, 99);
    zt_tensor *c = tensor(ZT_TIER_HOST, ZT_BF16, 100);
    int rc = zt_copy_async(b, a, NULL);
    ct_check(rc == ZT_EINVAL && strstr(zt_last_error(), "same dtype and numel") &&
             strstr(zt_last_error(), "f32 [99] on host") && strstr(zt_last_error(), "f32 [100] on device"),
             "copy_async rejects unequal numel, naming both tensors and tiers", "rc %d %s", rc,
             zt_last_error());
    rc = zt_copy_async(c, a, NULL);
    ct_check(rc == ZT_EINVAL && strstr(zt_last_error(), "zt_cast"), "copy_async rejects unequal dtypes",
             "rc %d %s", rc, zt_last_error());
    zt_tensor *v1 = NULL, *v2 = NULL;
    int64_t n60 = 60;
    zt_tensor_view(&v1, a, 0, 1, &n60);
    zt_tensor_view(&v2, a, 40, 1, &n60);
    rc = zt_copy_async(v2, v1, NULL);
    ct_check(rc == ZT_EINVAL && strstr(zt_last_error(), "overlap"), "copy_async rejects overlap",
             "rc %d %s", rc, zt_last_error());
    rc = zt_copy_async(NULL, a, NULL);
    ct_check(rc == ZT_EINVAL, "copy_async rejects NULL", "rc %d", rc);
    b->storage->tier = ZT_TIER_NVME;   /* pretend: refused before any byte moves */
    zt_tensor *d = tensor(ZT_TIER_DEVICE, ZT_F32, 99);
    rc = zt_copy_async(d, b, NULL);
    int rc2 = zt_copy_async(b, d, NULL);
    b->storage->tier = ZT_TIER_HOST;
    ct_check(rc == ZT_EINVAL && rc2 == ZT_EINVAL && strstr(zt_last_error(), "host tensor"),
             "copy_async rejects nvme <-> device (through a host tensor)", "rc %d %d %s", rc,
             rc2, zt_last_error());
    zt_stream *s = NULL;
    rc = zt_stream_new(&s, 7);
    ct_check(rc == ZT_EINVAL && s == NULL && strstr(zt_last_error(), "ZT_STREAM_COPY"),
             "unknown stream kind", "rc %d %s", rc, zt_last_error());
    rc = zt_event_sync(NULL);
    ct_check(rc == ZT_EINVAL, "event_sync(NULL) is an error", "rc %d", rc);
    zt_tensor_release(v1); zt_tensor_release(v2);
    zt_tensor_release(a); zt_tensor_release(b); zt_tensor_release(c); zt_tensor_release(d);
}

int main(void) {
    test_order();
    test_events();
    test_wait_comm();
    test_errors();
    test_free_in_flight();
    test_current();
    test_validation();
    zt_comm_finalize();
    return ct_summary();
}
