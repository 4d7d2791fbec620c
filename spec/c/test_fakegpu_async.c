/*
 * test_fakegpu_async.c -- runtime/device_fakegpu_async.c through the public
 * API (zt_device_init("fakegpu-async:SEED"), tensors, ops, streams, events,
 * zt_copy_async): a device whose streams run later, in a seeded order a GPU
 * permits.
 *
 * Host-tier tensors are plain host memory, so the test reads their bytes
 * directly (h->data) to see what a queued copy into them has done so far
 * without waiting for anything; every other read goes through the API
 * (zt_tensor_read waits). Expectations are the contract's, not the
 * scheduler's: issued work may run early (soon after its issue) or late
 * (at a host wait), each on some seed, so a copy issued before the host
 * wrote its source is caught; a wait (host or stream) sees everything
 * before it; two streams with no event between
 * them race, and the race is lost for some seed of 1..20 (and won for
 * another); an event orders them for every seed; the same seed gives the
 * same bits. The seeds are fixed, so the outcome is the same on every run.
 *
 * ZTRAIN_UNORDERED_COPIES=1 (stream.c reads it at the first copy) runs in a
 * forked child before the parent makes any copy.
 */
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "ctest.h"
#include "internal.h"     /* white-box: reads zt_tensor's fields */

enum { N = 512, SEEDS = 20 };
static zt_stream *prod, *cs;            /* a second compute stream; a copy stream */

static void init(unsigned seed)
{
    char b[64];
    snprintf(b, sizeof b, "fakegpu-async:%u", seed);
    if (zt_device_init(b) != ZT_OK) {
        printf("FAIL zt_device_init(%s): %s\n", b, zt_last_error());
        exit(1);
    }
}

static zt_tensor *mk(int tier, int dtype, int64_t n)
{
    zt_tensor *t = NULL;
    if (zt_tensor_new(&t, tier, ZT_CAT_OTHER, dtype, 1, &n) != ZT_OK) {
        printf("FAIL zt_tensor_new: %s\n", zt_last_error());
        exit(1);
    }
    return t;
}
static zt_tensor *dev(float v) { zt_tensor *t = mk(ZT_TIER_DEVICE, ZT_F32, N); zt_fill(t, v); return t; }
static zt_tensor *host(float v) { zt_tensor *t = mk(ZT_TIER_HOST, ZT_F32, N); zt_fill(t, v); return t; }

/* the host tensor's bytes now, without a wait: v if every element is v, else NAN */
static float peek(const zt_tensor *h)
{
    const float *x = h->data;
    for (int i = 1; i < N; i++) if (x[i] != x[0]) return NAN;
    return x[0];
}

/* every element of device tensor t, read through the API (which waits) */
static float read_all(const zt_tensor *t)
{
    float *x = ct_alloc(N * sizeof(float));
    float v = zt_tensor_read(t, x, N * sizeof(float)) == ZT_OK ? x[0] : NAN;
    for (int i = 1; i < N; i++) if (x[i] != v) v = NAN;
    free(x);
    return v;
}

static void settle(void)                /* every stream dry (between scenarios) */
{
    zt_stream_sync(prod);
    zt_stream_sync(cs);
    zt_stream_sync(NULL);
}

/* ---- the race scenarios ----------------------------------------------------------
 * d holds 2 (synced). A producer writes 1 into d (then multiplies it by 3,
 * `extra` times); a copy on the copy stream cs copies d into h (-1). Only
 * cs is synced, then h is read without a wait: 2 is the old bytes (the
 * copy ran before the producer), 1 (or 3, 9, ...) the producer's.
 *   how = EVENT:    producer on prod, cs waits for an event recorded after it
 *   how = NONE:     producer on prod, nothing between the streams
 *   how = IMPLICIT: producer on the default stream, the copy issued from it
 *                   (zt_copy_async orders after the issuing thread's stream) */
enum { EVENT, NONE, IMPLICIT };
static float race(unsigned seed, int how, int extra)
{
    init(seed);
    zt_tensor *d = dev(2.0f), *h = host(-1.0f);
    zt_event *ev = NULL;
    zt_event_new(&ev);
    zt_stream_sync(NULL);
    if (how != IMPLICIT) zt_stream_set_current(prod);
    zt_fill(d, 1.0f);
    for (int i = 0; i < extra; i++) zt_scale(d, 3.0f);
    if (how == EVENT) zt_event_record(ev, NULL);
    zt_stream_set_current(NULL);
    if (how == EVENT) zt_stream_wait_event(cs, ev);
    zt_copy_async(h, d, cs);
    zt_stream_sync(cs);
    float got = peek(h);
    settle();
    zt_event_free(ev);
    zt_tensor_release(d);
    zt_tensor_release(h);
    return got;
}

/* seeds 1..SEEDS of a scenario: how many saw the old bytes (2), how many
 * the producer's final ones (1 * 3^extra), and the values in got[] */
static void sweep(int how, int extra, int *old, int *fresh, float *got)
{
    float want = 1.0f;
    for (int i = 0; i < extra; i++) want *= 3.0f;
    *old = *fresh = 0;
    for (unsigned s = 1; s <= SEEDS; s++) {
        float v = race(s, how, extra);
        if (got) got[s - 1] = v;
        *old += v == 2.0f;
        *fresh += v == want;
    }
}

static void make_streams(void)
{
    if (zt_stream_new(&prod, ZT_STREAM_COMPUTE) != ZT_OK || zt_stream_new(&cs, ZT_STREAM_COPY) != ZT_OK) {
        printf("FAIL zt_stream_new: %s\n", zt_last_error());
        exit(1);
    }
}

/* In a child process, before any copy of this one: the IMPLICIT scenario
 * with ZTRAIN_UNORDERED_COPIES=1; how many seeds saw the old bytes (-1:
 * the child failed). */
static int unordered_child(void)
{
    int fd[2], n = -1;
    if (pipe(fd) != 0) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        setenv("ZTRAIN_UNORDERED_COPIES", "1", 1);
        init(1);
        make_streams();
        int old, fresh;
        sweep(IMPLICIT, 0, &old, &fresh, NULL);
        ssize_t w = write(fd[1], &old, sizeof old);
        _exit(w == (ssize_t)sizeof old ? 0 : 1);
    }
    close(fd[1]);
    if (pid > 0) {
        if (read(fd[0], &n, sizeof n) != (ssize_t)sizeof n) n = -1;
        waitpid(pid, NULL, 0);
    }
    close(fd[0]);
    return n;
}

/* ---- tests ------------------------------------------------------------------------ */
static void t_early_or_late(void)
{
    int late = 0, early = 0, bad = 0, stale = 0;
    for (unsigned seed = 1; seed <= SEEDS; seed++) {
        init(seed);
        zt_tensor *d = dev(2.0f), *h = host(-1.0f);
        zt_stream_sync(NULL);
        zt_fill(d, 5.0f);
        zt_copy_async(h, d, NULL);      /* both on the default stream */
        float before = peek(h);
        int rc = zt_stream_sync(NULL);
        float after = peek(h);
        late += before == -1.0f;
        early += before == 5.0f;
        bad += rc != 0 || after != 5.0f || (before != -1.0f && before != 5.0f);
        /* a copy issued before the host wrote its source: the host's race */
        zt_tensor *src = host(1.0f), *dst = dev(0.0f);
        zt_stream_sync(NULL);
        zt_copy_async(dst, src, cs);
        float *x = src->data;
        for (int i = 0; i < N; i++) x[i] = 3.0f;
        zt_stream_sync(cs);
        stale += read_all(dst) == 1.0f;
        zt_tensor_release(src);
        zt_tensor_release(dst);
        zt_tensor_release(d);
        zt_tensor_release(h);
    }
    ct_check(late >= 1 && early >= 1 && bad == 0, "issued work runs late (at a host wait) on some "
             "seeds and early on others; a stream sync runs it in order", "late %d, early %d, "
             "wrong after the sync %d of %d seeds", late, early, bad, SEEDS);
    ct_check(stale >= 1 && stale < SEEDS, "a copy issued before the host wrote its source sends the "
             "old bytes on some seeds (the race is seen)", "old bytes on %d of %d seeds", stale, SEEDS);
    init(1);
    zt_tensor *d = dev(2.0f);
    zt_fill(d, 7.0f);
    float r = read_all(d);
    ct_check(r == 7.0f, "zt_tensor_read waits for the fill issued before it", "read %g, want 7", r);
    zt_tensor_release(d);
}

static void t_races(void)
{
    int old, fresh;
    sweep(EVENT, 0, &old, &fresh, NULL);
    ct_check(fresh == SEEDS, "a copy stream waiting on an event recorded after the producer "
             "(another stream) sees its bytes, every seed of 1..20", "%d of %d seeds saw the "
             "producer's bytes, %d the old ones", fresh, SEEDS, old);
    sweep(NONE, 0, &old, &fresh, NULL);
    ct_check(old >= 1 && fresh >= 1, "without the event the two streams race: the copy reads the "
             "old bytes for some seed and the new for another", "old bytes %d, new %d of %d "
             "seeds", old, fresh, SEEDS);
    sweep(IMPLICIT, 0, &old, &fresh, NULL);
    ct_check(fresh == SEEDS, "a copy issued after a fill on the issuing thread's stream reads "
             "the filled bytes, every seed (zt_copy_async orders after the current stream)",
             "%d of %d seeds saw the fill, %d the old bytes", fresh, SEEDS, old);
}

static void t_unordered(int child_old)
{
    ct_check(child_old >= 1, "with ZTRAIN_UNORDERED_COPIES=1 (a child process) the same copy "
             "reads the old bytes for some seed", "%d of %d seeds saw old bytes (-1: the child "
             "failed)", child_old, SEEDS);
}

static void t_same_seed(void)
{
    float a[SEEDS], b[SEEDS];
    int old, fresh;
    sweep(NONE, 3, &old, &fresh, a);
    sweep(NONE, 3, &old, &fresh, b);
    int distinct = 0, differ = 0;
    for (int i = 1; i < SEEDS; i++) distinct += memcmp(&a[i], &a[0], sizeof a[0]) != 0;
    for (int i = SEEDS - 1; i >= 0; i--) if (memcmp(&a[i], &b[i], sizeof a[i]) != 0) differ = i + 1;
    ct_check(differ == 0 && distinct > 0, "the same seed gives the same bits twice (and the seeds "
             "do not all agree)", "first seed whose runs differ: %d (%g, then %g); seeds unlike "
             "seed 1: %d", differ, differ ? a[differ - 1] : 0, differ ? b[differ - 1] : 0, distinct);
}

static void t_poll(void)
{
    init(1);
    zt_tensor *d = dev(0.0f);
    zt_event *ev = NULL, *never = NULL;
    zt_event_new(&ev);
    zt_event_new(&never);
    zt_stream_sync(NULL);
    zt_fill(d, 1.0f);
    for (int i = 0; i < 4; i++) zt_scale(d, 2.0f);
    zt_event_record(ev, NULL);
    int first = 1, done = 0, polls = 1, nd = 0;
    zt_event_query(ev, &first);
    done = first;
    while (!done && polls < 1000) { zt_event_query(ev, &done); polls++; }
    float v = read_all(d);
    zt_event_query(never, &nd);
    ct_check(first == 0 && done == 1 && polls < 1000 && v == 16.0f, "zt_event_query never blocks "
             "(5 ops queued: not done at the first query), yet a loop polling it ends",
             "first query done=%d, then done=%d after %d polls, d=%g (want 16)", first, done,
             polls, v);
    ct_check(nd == 1, "a never-recorded event is done", "done=%d", nd);
    zt_event_free(ev);
    zt_event_free(never);
    zt_tensor_release(d);
}

static void t_free_runs_pending(void)
{
    init(1);
    zt_tensor *d = dev(2.0f), *x = dev(0.0f), *h = host(-1.0f);
    zt_stream_sync(NULL);
    zt_fill(d, 6.0f);
    zt_copy_async(h, d, NULL);
    float before = peek(h);
    zt_tensor_release(x);               /* a device free: cudaFree waits for the device */
    float after = peek(h);
    ct_check(before == -1.0f && after == 6.0f, "freeing a device tensor runs the pending work "
             "first", "h before the free %g (want -1), after %g (want 6)", before, after);
    zt_stream_sync(NULL);
    zt_tensor_release(d);
    zt_tensor_release(h);
}

static void t_value_ops_wait(void)
{
    init(1);
    zt_tensor *d = dev(0.0f);
    zt_stream_sync(NULL);
    zt_fill(d, 2.0f);
    double s = -1;
    int rc = zt_sum(&s, d);
    ct_check(rc == 0 && s == 2.0 * N, "zt_sum waits for the fill issued before it", "rc %d, sum "
             "%g, want %d", rc, s, 2 * N);
    zt_tensor_release(d);

    enum { NT = 4, V = 8 };
    int32_t good[NT] = { 0, 1, 2, 3 }, bad[NT] = { 100, 200, 300, 400 };
    zt_tensor *logits = NULL, *losses = mk(ZT_TIER_DEVICE, ZT_F32, NT);
    if (zt_tensor_new(&logits, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 2, (int64_t[]){ NT, V })) {
        printf("FAIL zt_tensor_new: %s\n", zt_last_error());
        exit(1);
    }
    zt_tensor *tg = mk(ZT_TIER_DEVICE, ZT_I32, NT), *tb = mk(ZT_TIER_DEVICE, ZT_I32, NT);
    zt_tensor_write(tg, good, sizeof good);
    zt_tensor_write(tb, bad, sizeof bad);
    zt_stream_sync(NULL);
    zt_copy(tg, tb);                    /* queued: the targets become out of range */
    rc = zt_crossentropy(losses, NULL, logits, tg, 1.0f, 0);
    /* an event sync (the communication thread staging a send) leaves the
     * kept error to the issuing thread's next sync, as CUDA's does: taking
     * it there failed the send unposted and hung the peer */
    zt_event *ev = NULL;
    zt_event_new(&ev);
    zt_event_record(ev, NULL);
    int re = zt_event_sync(ev);
    zt_event_free(ev);
    ct_check(re == ZT_OK, "an event sync leaves a kept op error for the next sync", "event sync %d: %s",
             re, re ? zt_last_error() : "");
    /* counted on the device, reported at the next sync: no wait a call */
    int rs = zt_device_sync();
    const char *e = zt_last_error();
    ct_check(rc == ZT_OK && rs == ZT_EINVAL && strstr(e, "zt_crossentropy: 4 of 4 targets") != NULL &&
             strstr(e, "next sync") != NULL, "zt_crossentropy's bad targets (after the queued "
             "copy) reported at the next sync, not waited for", "rc %d, sync %d: %s", rc, rs, e);
    rs = zt_device_sync();
    ct_check(rs == ZT_OK, "the bad-target report is given once", "sync %d: %s", rs, zt_last_error());
    zt_tensor *ts[] = { logits, losses, tg, tb };
    for (int i = 0; i < 4; i++) zt_tensor_release(ts[i]);
}

/* zt_tensor_upload (a micro-batch's tokens): no host wait for the work
 * queued before it, unlike zt_tensor_write; the bytes taken at the call
 * (the caller may reuse src at once) and written in stream order */
static int upload_round(unsigned seed, int async, float *got)
{
    init(seed);
    zt_tensor *d = dev(2.0f), *t = dev(0.0f), *h = host(-1.0f);
    float *src = ct_alloc(N * sizeof(float));
    for (int i = 0; i < N; i++) src[i] = 9.0f;
    zt_stream_sync(NULL);
    zt_fill(d, 5.0f);
    zt_copy_async(h, d, NULL);          /* queued before the upload */
    zt_fill(t, 4.0f);                   /* the upload must land after this */
    int rc = async ? zt_tensor_upload(t, src, N * sizeof(float))
                   : zt_tensor_write(t, src, N * sizeof(float));
    int waited = peek(h) == 5.0f;
    for (int i = 0; i < N; i++) src[i] = 1.0f;     /* reused at once */
    *got = rc == ZT_OK ? read_all(t) : NAN;
    settle();
    free(src);
    zt_tensor_release(d);
    zt_tensor_release(t);
    zt_tensor_release(h);
    return waited;
}

static void t_upload(void)
{
    int waited = 0, wrong = 0, wrote_waited = 0;
    for (unsigned seed = 1; seed <= SEEDS; seed++) {
        float got;
        waited += upload_round(seed, 1, &got);
        wrong += got != 9.0f;
        wrote_waited += upload_round(seed, 0, &got);
        wrong += got != 9.0f;
    }
    ct_check(waited < SEEDS && wrote_waited == SEEDS, "zt_tensor_upload does not wait for the "
             "work queued before it (zt_tensor_write does)", "upload waited on %d of %d seeds, "
             "write on %d", waited, SEEDS, wrote_waited);
    ct_check(wrong == 0, "an upload's bytes are the source's at the call, after the fill queued "
             "before it", "%d of %d rounds read other bytes", wrong, 2 * SEEDS);
}

static void t_backend_names(void)
{
    zt_device_init("cpu");
    const char *bad[] = { "fakegpu-async:x", "fakegpu-async:", "fakegpu-async:12x" };
    for (int i = 0; i < 3; i++) {
        int rc = zt_device_init(bad[i]);
        const char *e = zt_last_error();
        char name[96];
        snprintf(name, sizeof name, "device.backend=%s is refused, naming the seed syntax", bad[i]);
        ct_check(rc == ZT_EINVAL && strstr(e, bad[i]) && strstr(e, "must be a whole number") &&
                 strstr(e, "fakegpu-async:7") && !strcmp(zt_device_name(), "cpu"), name,
                 "rc %d: %s; device now %s", rc, e, zt_device_name());
    }
    int rc = zt_device_init("fakegpu-async");
    ct_check(rc == 0 && !strcmp(zt_device_name(), "fakegpu-async"), "device.backend=fakegpu-async "
             "(no seed) is accepted", "rc %d: %s", rc, rc ? zt_last_error() : "");
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int child_old = unordered_child();  /* before this process makes any copy */
    init(1);
    make_streams();
    t_early_or_late();
    t_races();
    t_unordered(child_old);
    t_same_seed();
    t_poll();
    t_free_runs_pending();
    t_value_ops_wait();
    t_upload();
    t_backend_names();
    init(1);
    zt_stream_free(prod);
    zt_stream_free(cs);
    return ct_summary();
}
