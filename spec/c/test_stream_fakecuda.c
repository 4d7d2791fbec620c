/*
 * test_stream_fakecuda.c -- stream.c's routing through a device's execution
 * table (internal.h's zt_exec_ops), on the CPU, against a fake CUDA: this
 * file's device table (named "cuda") with an execution table of its own,
 * made the active device with zt_device_install; the library is the CPU
 * build's, unchanged. A fake stream is a queue that runs nothing until the
 * host forces it (a stream or event sync, a stream waiting on its event, or
 * the device's copy, sync or free on the stream), so "the copy was only
 * queued" and "the work ran in the wrong order" both show as wrong bytes,
 * deterministically. The device's fill is queued on the issuing thread's
 * current fake stream (a kernel); its copy (zt_tensor_read/write) and sync
 * run that stream dry first, its free every stream (cudaFree); the other
 * ops are the CPU device's, at once. Host memory comes from the execution
 * table's host_alloc (pinned).
 *
 * It checks what a GPU run cannot check here: copies go to the device's
 * queue (not done on return), events and waits order two streams, a copy on
 * a copy stream runs after the work issued before it on the issuing
 * thread's compute stream (stream.c's order_after; with
 * ZTRAIN_UNORDERED_COPIES=1, in a child process, it does not), an nvme copy
 * waits for the device -> host copy before it on its stream (the worker
 * syncs the device stream), items behind a comm wait reach the device only
 * through the worker, tensors of a queued copy stay alive until it ran,
 * set_current picks the device stream, host tensors are the device's pinned
 * memory. It does not check CUDA itself (test_cuda_seams does, on a GPU).
 */
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>
#include "ctest.h"
#include "fake_pinned.h"
#include "internal.h"
#include "comm.h"

/* ---- the fake device's execution table ----------------------------------------- */
enum { F_COPY, F_FILL, F_RECORD, F_WAIT };
typedef struct fitem { int kind; void *dst; const void *src; size_t n; float v; struct fev *ev;
                       int seq; struct fitem *next; } fitem;
typedef struct fstream { fitem *head, *tail; } fstream;
typedef struct fev { fstream *st; int seq, done_seq; } fev;   /* seq: latest record */

static pthread_mutex_t fk = PTHREAD_MUTEX_INITIALIZER;
static fstream compute_fs;
static _Thread_local fstream *cur_fs;   /* NULL: compute_fs */
static fstream *last_new;               /* the fake stream stream_new made last */
static fstream *made[256];              /* every fake stream (free runs them dry) */
static int copies_off_main, streams_made, events_made;
static pthread_t main_thread;

/* every fake stream and event, freed at the end of main: queue items may
 * name an event after its free (as CUDA allows), or a freed stream */
static void **all_objs;
static size_t n_objs;
static void *keep(size_t n)
{
    void *p = ct_alloc(n);
    void **grown = realloc(all_objs, (n_objs + 1) * sizeof *all_objs);
    if (!grown) { fprintf(stderr, "out of memory\n"); exit(2); }
    all_objs = grown;
    all_objs[n_objs++] = p;
    return p;
}

static fstream *fs_of(void *s) { return s ? s : cur_fs ? cur_fs : &compute_fs; }

static void push(fstream *s, fitem *it)
{
    it->next = NULL;
    if (s->tail) s->tail->next = it; else s->head = it;
    s->tail = it;
}

/* Run s's queue to its end, or until record seq of e (fk held). */
static void run_until(fstream *s, fev *e, int seq)
{
    while (s->head) {
        fitem *it = s->head;
        s->head = it->next;
        if (!s->head) s->tail = NULL;
        if (it->kind == F_COPY) memcpy(it->dst, it->src, it->n);
        else if (it->kind == F_FILL) zt_cpu_device.fill(it->dst, it->v, it->n);
        else if (it->kind == F_WAIT) { if (it->ev->st) run_until(it->ev->st, it->ev, it->seq); }
        else if (it->kind == F_RECORD && it->seq > it->ev->done_seq) it->ev->done_seq = it->seq;
        int stop = it->kind == F_RECORD && it->ev == e && it->seq >= seq;
        free(it);
        if (stop) return;
    }
}

static void run_dry(fstream *s)
{
    pthread_mutex_lock(&fk);
    run_until(s, NULL, 0);
    pthread_mutex_unlock(&fk);
}

static int x_stream_new(void **out, int kind)
{
    (void)kind;
    fstream *s = keep(sizeof(fstream));
    pthread_mutex_lock(&fk);
    last_new = s;
    if (streams_made < 256) made[streams_made] = s;
    streams_made++;
    pthread_mutex_unlock(&fk);
    *out = s;
    return ZT_OK;
}
static void x_stream_free(void *s)
{
    run_dry(s);                 /* its work first; the struct stays (events may name it) */
    if (cur_fs == s) cur_fs = NULL;
}
static int x_stream_sync(void *s) { run_dry(fs_of(s)); return ZT_OK; }
static void x_set_stream(void *s) { cur_fs = s == &compute_fs ? NULL : s; }
static void *x_compute_stream(void) { return &compute_fs; }
static int x_bind_thread(void) { return ZT_OK; }
static int x_event_new(void **out)
{
    *out = keep(sizeof(fev));
    __atomic_add_fetch(&events_made, 1, __ATOMIC_RELAXED);
    return ZT_OK;
}
/* a real event is destroyed once it completes; queue items keep pointing at
 * the fake's, so the fake frees them all at the end */
static void x_event_free(void *e) { (void)e; }
static int x_event_record(void *e, void *s)
{
    fev *ev = e;
    fitem *it = ct_alloc(sizeof *it);
    pthread_mutex_lock(&fk);
    ev->st = fs_of(s);
    it->kind = F_RECORD; it->ev = ev; it->seq = ++ev->seq;
    push(ev->st, it);
    pthread_mutex_unlock(&fk);
    return ZT_OK;
}
static int x_stream_wait_event(void *s, void *e)
{
    fev *ev = e;
    fitem *it = ct_alloc(sizeof *it);
    pthread_mutex_lock(&fk);
    it->kind = F_WAIT; it->ev = ev; it->seq = ev->seq;
    push(fs_of(s), it);
    pthread_mutex_unlock(&fk);
    return ZT_OK;
}
static int x_event_sync(void *e)
{
    fev *ev = e;
    pthread_mutex_lock(&fk);
    if (ev->st && ev->done_seq < ev->seq) run_until(ev->st, ev, ev->seq);
    pthread_mutex_unlock(&fk);
    return ZT_OK;
}
static int x_event_query(void *e, int *done)     /* never runs anything */
{
    fev *ev = e;
    pthread_mutex_lock(&fk);
    *done = ev->done_seq >= ev->seq;
    pthread_mutex_unlock(&fk);
    return ZT_OK;
}
static int x_copy_async(void *dst, const void *src, size_t n, void *s)
{
    fitem *it = ct_alloc(sizeof *it);
    it->kind = F_COPY; it->dst = dst; it->src = src; it->n = n;
    if (!pthread_equal(pthread_self(), main_thread)) __atomic_add_fetch(&copies_off_main, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&fk);
    push(fs_of(s), it);
    pthread_mutex_unlock(&fk);
    return ZT_OK;
}
static int x_copy_blocking(void *dst, const void *src, size_t n)
{
    pthread_mutex_lock(&fk);
    memcpy(dst, src, n);
    pthread_mutex_unlock(&fk);
    return ZT_OK;
}


static const zt_exec_ops fake_exec = {
    .stream_new = x_stream_new, .stream_free = x_stream_free, .stream_sync = x_stream_sync,
    .set_stream = x_set_stream, .compute_stream = x_compute_stream, .bind_thread = x_bind_thread,
    .event_new = x_event_new, .event_free = x_event_free, .event_record = x_event_record,
    .stream_wait_event = x_stream_wait_event, .event_sync = x_event_sync,
    .event_query = x_event_query, .copy_async = x_copy_async, .copy_blocking = x_copy_blocking,
    .host_alloc = fake_host_alloc, .host_free = fake_host_free, .is_pinned = fake_is_pinned,
};

/* ---- the fake device's ops: fill queued, copy and sync after the current
 * stream, free after every stream; the rest the CPU device's -------------------- */
static zt_device_ops fake_table;

static void f_fill(float *x, float v, size_t n)
{
    fitem *it = ct_alloc(sizeof *it);
    it->kind = F_FILL; it->dst = x; it->v = v; it->n = n;
    pthread_mutex_lock(&fk);
    push(fs_of(NULL), it);
    pthread_mutex_unlock(&fk);
}
static void f_copy(void *dst, const void *src, size_t n)
{
    pthread_mutex_lock(&fk);
    run_until(fs_of(NULL), NULL, 0);
    memcpy(dst, src, n);
    pthread_mutex_unlock(&fk);
}
static int f_sync(void) { run_dry(fs_of(NULL)); return ZT_OK; }
static void f_free(void *p)
{
    pthread_mutex_lock(&fk);
    run_until(&compute_fs, NULL, 0);
    for (int i = 0; i < streams_made && i < 256; i++) run_until(made[i], NULL, 0);
    pthread_mutex_unlock(&fk);
    zt_cpu_device.free(p);
}

static void install(void)
{
    fake_table = zt_cpu_device;
    fake_table.name = "cuda";
    fake_table.exec = &fake_exec;
    fake_table.fill = f_fill;
    fake_table.copy = f_copy;
    fake_table.sync = f_sync;
    fake_table.free = f_free;
    zt_device_install(&fake_table);
}

/* ---- helpers ----------------------------------------------------------------- */
static zt_tensor *tensor(int tier, int64_t n, float v)
{
    zt_tensor *t = NULL;
    if (zt_tensor_new(&t, tier, ZT_CAT_OTHER, ZT_F32, 1, &n) != ZT_OK) {
        printf("FAIL tensor_new: %s\n", zt_last_error());
        exit(1);
    }
    if (tier != ZT_TIER_NVME) zt_fill(t, v);
    return t;
}

/* every element of t (read now, through the device's copy) equals want */
static int all(const zt_tensor *t, float want)
{
    float *h = ct_alloc((size_t)t->numel * 4);
    zt_tensor_read(t, h, (size_t)t->numel * 4);
    int ok = 1;
    for (int64_t i = 0; i < t->numel; i++) ok &= h[i] == want;
    free(h);
    return ok;
}

/* ---- tests ------------------------------------------------------------------- */
static void t_copy_is_queued(void)
{
    zt_tensor *h = tensor(ZT_TIER_HOST, 1000, 3.0f), *d = tensor(ZT_TIER_DEVICE, 1000, 0.0f);
    zt_stream *cs = NULL;
    zt_event *ev = NULL;
    int s0 = streams_made, e0 = events_made;
    zt_stream_new(&cs, ZT_STREAM_COPY);
    zt_event_new(&ev);
    ct_check(streams_made == s0 + 1 && events_made == e0 + 1, "stream and event are the device's "
             "(exec stream_new, event_new)", "streams made %d, events made %d",
             streams_made - s0, events_made - e0);
    int rc = zt_copy_async(d, h, cs);
    zt_event_record(ev, cs);
    int done = 1;
    zt_event_query(ev, &done);
    ct_check(rc == 0 && done == 0 && all(d, 0.0f), "copy_async goes to the device's queue (not "
             "run on return)", "rc %d done %d", rc, done);
    zt_event_sync(ev);
    ct_check(all(d, 3.0f), "event sync: the copy ran", "d not 3");
    zt_event_free(ev);
    zt_stream_free(cs);
    zt_tensor_release(h);
    zt_tensor_release(d);
}

static void t_wait_orders_streams(void)
{
    zt_tensor *h = tensor(ZT_TIER_HOST, 500, 5.0f), *d = tensor(ZT_TIER_DEVICE, 500, 0.0f);
    zt_tensor *d2 = tensor(ZT_TIER_DEVICE, 500, 0.0f);
    zt_stream *a = NULL, *b = NULL;
    zt_event *ev = NULL;
    zt_stream_new(&a, ZT_STREAM_COPY);
    zt_stream_new(&b, ZT_STREAM_COPY);
    zt_event_new(&ev);
    zt_copy_async(d, h, a);
    zt_event_record(ev, a);
    zt_stream_wait_event(b, ev);
    zt_copy_async(d2, d, b);            /* reads what a writes */
    zt_stream_sync(b);                  /* runs b only -- and, through the wait, a up to ev */
    ct_check(all(d2, 5.0f), "stream b waits for a's event on the device (wait_event routed)",
             "d2 did not see a's copy");
    zt_event_free(ev);
    zt_stream_free(a);
    zt_stream_free(b);
    zt_tensor_release(h); zt_tensor_release(d); zt_tensor_release(d2);
}

/* A fill (a kernel) queued on the compute stream, then a copy of its output
 * on a copy stream, then only the copy stream synced: the copy must have
 * read the filled bytes (4), not the earlier ones (1). Returns what the
 * copy read (the host tensor, after the sync of the copy stream alone). */
static float copy_after_fill(void)
{
    zt_tensor *d = tensor(ZT_TIER_DEVICE, 256, 1.0f), *h = tensor(ZT_TIER_HOST, 256, 0.0f);
    zt_stream *cs = NULL;
    zt_stream_sync(NULL);               /* d = 1 */
    zt_stream_new(&cs, ZT_STREAM_COPY);
    zt_fill(d, 4.0f);                   /* queued on the compute stream */
    zt_copy_async(h, d, cs);
    zt_stream_sync(cs);
    float got = ((const float *)h->data)[255];   /* host bytes, read without a wait */
    zt_stream_free(cs);
    zt_stream_sync(NULL);
    zt_tensor_release(d);
    zt_tensor_release(h);
    return got;
}

/* the same in a child process with ZTRAIN_UNORDERED_COPIES=1 (stream.c reads
 * it at the first copy, so before any): what its copy read, through a pipe */
static float unordered_child(void)
{
    int fd[2];
    float got = -1.0f;
    if (pipe(fd) != 0) return got;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        setenv("ZTRAIN_UNORDERED_COPIES", "1", 1);
        main_thread = pthread_self();
        install();
        float v = copy_after_fill();
        ssize_t w = write(fd[1], &v, sizeof v);
        _exit(w == (ssize_t)sizeof v ? 0 : 1);
    }
    close(fd[1]);
    if (pid > 0) {
        if (read(fd[0], &got, sizeof got) != (ssize_t)sizeof got) got = -1.0f;
        waitpid(pid, NULL, 0);
    }
    close(fd[0]);
    return got;
}

static void t_copy_after_compute(float unordered)
{
    float got = copy_after_fill();
    ct_check(got == 4.0f, "a copy on a copy stream runs after the compute stream's earlier work "
             "(zt_copy_async orders after the issuing thread's current stream)",
             "the copy read %g, the bytes before the fill queued ahead of it (want 4)", got);
    ct_check(unordered == 1.0f, "with ZTRAIN_UNORDERED_COPIES=1 the same copy reads the old "
             "bytes (the fake sees the race the ordering prevents)",
             "the child's copy read %g (want 1; -1: the child failed)", unordered);
}

static void t_held_until_done(void)
{
    zt_tensor *h = tensor(ZT_TIER_HOST, 1 << 16, 1.0f), *d = tensor(ZT_TIER_DEVICE, 1 << 16, 0.0f);
    zt_stream *cs = NULL;
    zt_stream_new(&cs, ZT_STREAM_COPY);
    size_t before = zt_mem_current(ZT_TIER_HOST, -1);
    zt_copy_async(d, h, cs);
    zt_tensor_release(h);               /* its owner lets go; the queued copy still reads it */
    ct_check(zt_mem_current(ZT_TIER_HOST, -1) == before, "a queued copy's source stays alive",
             "host bytes %zu -> %zu", before, zt_mem_current(ZT_TIER_HOST, -1));
    zt_stream_sync(cs);
    ct_check(zt_mem_current(ZT_TIER_HOST, -1) == before - (1 << 16) * 4 && all(d, 1.0f),
             "after the sync: copied, and the source freed", "host bytes %zu",
             zt_mem_current(ZT_TIER_HOST, -1));
    zt_stream_free(cs);
    zt_tensor_release(d);
}

static void t_comm_wait_then_copy(void)
{
    zt_tensor *h = tensor(ZT_TIER_HOST, 256, 7.0f), *d = tensor(ZT_TIER_DEVICE, 256, 0.0f);
    zt_comm_req *gate = ct_alloc(sizeof *gate);
    zt_stream *cs = NULL;
    zt_event *ev = NULL;
    zt_stream_new(&cs, ZT_STREAM_COPY);
    zt_event_new(&ev);
    int off0 = __atomic_load_n(&copies_off_main, __ATOMIC_RELAXED);
    zt_stream_wait_comm(cs, gate);
    zt_copy_async(d, h, cs);
    zt_event_record(ev, cs);
    usleep(20000);
    int done = 1;
    zt_event_query(ev, &done);
    ct_check(done == 0 && __atomic_load_n(&copies_off_main, __ATOMIC_RELAXED) == off0,
             "items behind a comm wait do not reach the device before it", "done %d", done);
    __atomic_store_n(&gate->done, 1, __ATOMIC_RELEASE);
    zt_event_sync(ev);
    ct_check(all(d, 7.0f) && __atomic_load_n(&copies_off_main, __ATOMIC_RELAXED) == off0 + 1,
             "then the worker issues them to the device, in order", "copies by the worker: %d",
             __atomic_load_n(&copies_off_main, __ATOMIC_RELAXED) - off0);
    zt_stream_sync(cs);
    zt_event_free(ev);
    zt_stream_free(cs);
    free(gate);
    zt_tensor_release(h); zt_tensor_release(d);
}

static void t_nvme_after_d2h(void)
{
    char dir[] = "/tmp/zt_fakecuda_XXXXXX";
    if (!mkdtemp(dir) || zt_nvme_configure(dir, 0, 0, 0) != ZT_OK) {
        ct_fail("nvme tier", "%s", zt_last_error());
        return;
    }
    const int64_t n = 4096;
    zt_tensor *d = tensor(ZT_TIER_DEVICE, n, 9.0f), *h = tensor(ZT_TIER_HOST, n, 0.0f);
    zt_tensor *f = tensor(ZT_TIER_NVME, n, 0), *h2 = tensor(ZT_TIER_HOST, n, 0.0f);
    zt_stream *cs = NULL;
    zt_stream_new(&cs, ZT_STREAM_COPY);
    int rc = zt_copy_async(h, d, cs);   /* queued on the device stream */
    if (!rc) rc = zt_copy_async(f, h, cs);  /* the worker: must sync the device stream first */
    if (!rc) rc = zt_copy_async(h2, f, cs);
    if (!rc) rc = zt_stream_sync(cs);
    ct_check(rc == 0 && all(h2, 9.0f), "an nvme copy waits for the device -> host copy before it",
             "rc %d (%s); the swap file got the host bytes before the device wrote them", rc,
             rc ? zt_last_error() : "");
    zt_stream_free(cs);
    zt_tensor *ts[] = { d, h, f, h2 };
    for (int i = 0; i < 4; i++) zt_tensor_release(ts[i]);
    zt_nvme_shutdown();
    rmdir(dir);
}

static void t_current(void)
{
    zt_stream *cs = NULL;
    zt_stream_new(&cs, ZT_STREAM_COPY);
    fstream *mine = last_new;
    zt_stream_set_current(cs);
    int on = fs_of(NULL) == mine;
    zt_stream_set_current(NULL);
    ct_check(on && fs_of(NULL) == &compute_fs, "set_current picks the device stream, "
             "NULL the compute stream", "on %d", on);
    zt_stream_free(cs);
}

/* memory.c: host tensors are the device's pinned memory while it is active */
static void t_pinned(void)
{
    long made = fake_pinned_made, live = fake_pinned_live;
    zt_tensor *h = tensor(ZT_TIER_HOST, 100, 1.0f);
    int pin = fake_is_pinned(h->data);
    zt_tensor_release(h);
    ct_check(pin && fake_pinned_made == made + 1 && fake_pinned_live == live, "host tensors come "
             "from exec->host_alloc and go back through exec->host_free", "pinned %d, allocations "
             "%ld, live %ld -> %ld", pin, fake_pinned_made - made, live, fake_pinned_live);
}

int main(void)
{
    main_thread = pthread_self();
    float unordered = unordered_child();    /* before any copy of this process */
    install();
    ct_check(zt_dev() == &fake_table && zt_exec() == &fake_exec, "zt_device_install: the fake "
             "device and its execution table are active", "active %s", zt_device_name());
    t_copy_is_queued();
    t_wait_orders_streams();
    t_copy_after_compute(unordered);
    t_held_until_done();
    t_comm_wait_then_copy();
    t_nvme_after_d2h();
    t_current();
    t_pinned();
    zt_stream_sync(NULL);
    run_dry(&compute_fs);
    for (size_t i = 0; i < n_objs; i++) free(all_objs[i]);
    free(all_objs);
    return ct_summary();
}
