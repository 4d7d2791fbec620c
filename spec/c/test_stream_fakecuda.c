/*
 * test_stream_fakecuda.c -- stream.c's CUDA routing, on the CPU, against a
 * fake CUDA: runtime/stream.c is compiled here with ZT_CUDA and a device
 * named "cuda", and the zt_cuda_* calls it makes (cuda_stream.h) are this
 * file's. A fake stream is a queue that runs nothing until the host forces
 * it (a stream or event sync, or a stream waiting on its event), so "the
 * copy was only queued" and "the work ran in the wrong order" both show as
 * wrong bytes, deterministically. The ops (zt_fill, ...) and tensor
 * reads/writes use the real CPU device, at once: the tests move bytes with
 * zt_copy_async only and read them with zt_tensor_read.
 *
 * It checks what a GPU run cannot check here: copies go to the CUDA queue
 * (not done on return), events and waits order two streams, an nvme copy
 * waits for the device -> host copy before it on its stream (the worker
 * syncs the CUDA stream), items behind a comm wait reach CUDA only through
 * the worker, tensors of a queued copy stay alive until it ran, set_current
 * picks the CUDA stream. It does not check CUDA itself (test_cuda_seams does,
 * on a GPU).
 */
#include <pthread.h>
#include <unistd.h>
#include "ctest.h"
#define ZT_CUDA 1
#define zt_dev fake_dev
#include "../../runtime/stream.c"
#undef zt_dev
#include "comm.h"

/* ---- the fake device and CUDA ----------------------------------------------- */
static zt_device_ops fake_table;
const zt_device_ops *fake_dev(void) { return &fake_table; }

enum { F_COPY, F_RECORD, F_WAIT };
typedef struct fitem { int kind; void *dst; const void *src; size_t n; struct fev *ev;
                       int seq; struct fitem *next; } fitem;
typedef struct fstream { fitem *head, *tail; int ran; } fstream;
typedef struct fev { fstream *st; int seq, done_seq; } fev;   /* seq: latest record */

static pthread_mutex_t fk = PTHREAD_MUTEX_INITIALIZER;
static fstream compute_fs;
static _Thread_local void *cur_fs;
static int copies_off_main, events_alive;
static pthread_t main_thread;

static void push(fstream *s, fitem *it)
{
    it->next = NULL;
    if (s->tail) s->tail->next = it; else s->head = it;
    s->tail = it;
}

static void run_until(fstream *s, fev *e, int seq);

/* Run s's queue to its end, or until record seq of e (fk held). */
static void run_until(fstream *s, fev *e, int seq)
{
    while (s->head) {
        fitem *it = s->head;
        s->head = it->next;
        if (!s->head) s->tail = NULL;
        if (it->kind == F_COPY) memcpy(it->dst, it->src, it->n);
        else if (it->kind == F_WAIT) { if (it->ev->st) run_until(it->ev->st, it->ev, it->seq); }
        else if (it->kind == F_RECORD && it->seq > it->ev->done_seq) it->ev->done_seq = it->seq;
        int stop = it->kind == F_RECORD && it->ev == e && it->seq >= seq;
        free(it);
        if (stop) return;
    }
}

int zt_cuda_stream_new(void **out, int kind) { (void)kind; *out = ct_alloc(sizeof(fstream)); return ZT_OK; }
void zt_cuda_stream_free(void *s)
{
    pthread_mutex_lock(&fk); run_until(s, NULL, 0); pthread_mutex_unlock(&fk);
    if (cur_fs == s) cur_fs = NULL;
    free(s);
}
int zt_cuda_stream_sync(void *s)
{
    pthread_mutex_lock(&fk); run_until(s ? s : (cur_fs ? cur_fs : &compute_fs), NULL, 0);
    pthread_mutex_unlock(&fk);
    return ZT_OK;
}
void zt_cuda_set_stream(void *s) { cur_fs = s == &compute_fs ? NULL : s; }
void *zt_cuda_get_stream(void) { return cur_fs ? cur_fs : &compute_fs; }
void *zt_cuda_compute_stream(void) { return &compute_fs; }
int zt_cuda_bind_thread(void) { return ZT_OK; }
/* every fake event, freed at the end of main (queue items may point at an
 * event after its free, as CUDA allows; see zt_cuda_event_free) */
static void **all_events;
static size_t n_events;

int zt_cuda_event_new(void **out, int timing)
{
    (void)timing;
    *out = ct_alloc(sizeof(fev));
    void **grown = realloc(all_events, (n_events + 1) * sizeof *all_events);
    if (!grown) { fprintf(stderr, "out of memory\n"); exit(2); }
    all_events = grown;
    all_events[n_events++] = *out;
    __atomic_add_fetch(&events_alive, 1, __ATOMIC_RELAXED);
    return ZT_OK;
}
void zt_cuda_event_free(void *e)
{
    if (!e) return;
    __atomic_sub_fetch(&events_alive, 1, __ATOMIC_RELAXED);
    /* a real CUDA event is destroyed once it completes; the fake's queue
     * items keep pointing at it, so the fake frees them all at the end */
}
int zt_cuda_event_record(void *e, void *s)
{
    fev *ev = e;
    fitem *it = ct_alloc(sizeof *it);
    pthread_mutex_lock(&fk);
    ev->st = s ? s : zt_cuda_get_stream();
    it->kind = F_RECORD; it->ev = ev; it->seq = ++ev->seq;
    push(ev->st, it);
    pthread_mutex_unlock(&fk);
    return ZT_OK;
}
int zt_cuda_stream_wait_event(void *s, void *e)
{
    fev *ev = e;
    fitem *it = ct_alloc(sizeof *it);
    pthread_mutex_lock(&fk);
    it->kind = F_WAIT; it->ev = ev; it->seq = ev->seq;
    push(s ? s : zt_cuda_get_stream(), it);
    pthread_mutex_unlock(&fk);
    return ZT_OK;
}
int zt_cuda_event_sync(void *e)
{
    fev *ev = e;
    pthread_mutex_lock(&fk);
    if (ev->st && ev->done_seq < ev->seq) run_until(ev->st, ev, ev->seq);
    pthread_mutex_unlock(&fk);
    return ZT_OK;
}
int zt_cuda_event_query(void *e, int *done)     /* never runs anything */
{
    fev *ev = e;
    pthread_mutex_lock(&fk);
    *done = ev->done_seq >= ev->seq;
    pthread_mutex_unlock(&fk);
    return ZT_OK;
}
int zt_cuda_copy_async(void *dst, const void *src, size_t n, void *s)
{
    fitem *it = ct_alloc(sizeof *it);
    it->kind = F_COPY; it->dst = dst; it->src = src; it->n = n;
    if (!pthread_equal(pthread_self(), main_thread)) __atomic_add_fetch(&copies_off_main, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&fk);
    push(s ? s : zt_cuda_get_stream(), it);
    pthread_mutex_unlock(&fk);
    return ZT_OK;
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

/* every element of t (read now, through the CPU device) equals want */
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
    zt_stream_new(&cs, ZT_STREAM_COPY);
    zt_event_new(&ev);
    ct_check(cs->cu != NULL && ev->cu != NULL, "stream and event hold CUDA handles", "cu %p %p",
             cs->cu, ev->cu);
    int rc = zt_copy_async(d, h, cs);
    zt_event_record(ev, cs);
    int done = 1;
    zt_event_query(ev, &done);
    ct_check(rc == 0 && done == 0 && all(d, 0.0f), "copy_async goes to the CUDA queue (not run "
             "on return)", "rc %d done %d", rc, done);
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
    ct_check(all(d2, 5.0f), "stream b waits for a's event on the GPU (wait_event routed)",
             "d2 did not see a's copy");
    zt_event_free(ev);
    zt_stream_free(a);
    zt_stream_free(b);
    zt_tensor_release(h); zt_tensor_release(d); zt_tensor_release(d2);
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
             "items behind a comm wait do not reach CUDA before it", "done %d", done);
    __atomic_store_n(&gate->done, 1, __ATOMIC_RELEASE);
    zt_event_sync(ev);
    ct_check(all(d, 7.0f) && __atomic_load_n(&copies_off_main, __ATOMIC_RELAXED) == off0 + 1,
             "then the worker issues them to CUDA, in order", "copies by the worker: %d",
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
    int rc = zt_copy_async(h, d, cs);   /* queued on the CUDA stream */
    if (!rc) rc = zt_copy_async(f, h, cs);  /* the worker: must sync the CUDA stream first */
    if (!rc) rc = zt_copy_async(h2, f, cs);
    if (!rc) rc = zt_stream_sync(cs);
    ct_check(rc == 0 && all(h2, 9.0f), "an nvme copy waits for the device -> host copy before it",
             "rc %d (%s); the swap file got the host bytes before the GPU wrote them", rc,
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
    zt_stream_set_current(cs);
    int on = zt_cuda_get_stream() == cs->cu;
    zt_stream_set_current(NULL);
    ct_check(on && zt_cuda_get_stream() == &compute_fs, "set_current picks the CUDA stream, "
             "NULL the compute stream", "on %d", on);
    zt_stream_free(cs);
}

int main(void)
{
    main_thread = pthread_self();
    fake_table = zt_cpu_device;
    fake_table.name = "cuda";           /* stream.c routes; ops stay on the CPU device */
    t_copy_is_queued();
    t_wait_orders_streams();
    t_held_until_done();
    t_comm_wait_then_copy();
    t_nvme_after_d2h();
    t_current();
    for (size_t i = 0; i < n_events; i++) free(all_events[i]);
    free(all_events);
    return ct_summary();
}
