/*
 * stream.c -- streams, events and asynchronous copies (contracts in ztrain.h).
 *
 * A compute stream is the calling thread itself: ops run synchronously, an
 * event recorded on it is complete at once, a wait blocks the caller until
 * it is met. A copy or comm stream is real: one worker thread runs its queue
 * in issue order (copies through the device copy, waits, event records), so
 * a strategy that forgets to wait for a copy reads bytes that are still
 * being written -- the race it would have on a GPU, where a CUDA build maps
 * these objects to cudaStream_t and cudaEvent_t. A copy to or from the nvme
 * tier is a request to the aio engine; consecutive independent ones are in
 * flight together; an event record among them rides along (it completes
 * once the copies before it are done, and later copies go on starting),
 * and the stream's other items (device copies, waits) start once every
 * copy before them is done.
 *
 * Synchronisation: each stream has a lock and two condition variables
 * (work queued; work finished). Events share one lock and one condition
 * variable: completions are rare (a few per step) and waiters few. The
 * event lock may be taken inside a stream lock (a device record issued
 * directly), never the reverse; held_lock is innermost.
 *
 * Sequence numbers: a stream counts the items queued (issued) and done
 * (finished); zt_stream_sync waits for finished >= the issued count it saw,
 * so other threads queueing more work cannot starve it. An event counts its
 * records (recorded) and the highest record reached (completed); a wait
 * captures the record in effect when it is issued, as CUDA's does.
 *
 * A device with an execution table (internal.h's zt_exec_ops: CUDA;
 * fakegpu-async, its CPU stand-in whose streams run later), active when the
 * stream or event was made: a stream holds the device's stream handle and
 * an event the device's event (`cu`; cudaStream_t and cudaEvent_t on CUDA).
 * Records, waits, syncs, queries and device <-> host copies go to the
 * device, which orders them; the host does not wait. What the device
 * cannot run -- an nvme copy (file I/O on the host) and a wait for a comm
 * request (completed by the communication engine) -- goes to the stream's
 * worker thread, as on the CPU. While the worker holds queued items, the
 * stream's later items are queued too, and the worker issues them to the
 * device when it reaches them: the stream's order holds across the two.
 * The worker syncs the device stream before an nvme copy (the host bytes it
 * writes out may come from a device -> host copy queued before it). For
 * such an event, `completed` means "its record has reached the device"; the
 * device says when its work got there. A wait queued behind the worker
 * reaches the device when the worker gets there, and the device then waits
 * for the event's latest record: if the event was recorded again meanwhile,
 * the stream waits longer than asked (never less); order_after uses an
 * event of its own for such a stream. Tensors of a device copy are held
 * until an internal event after it completes (reaped by later calls).
 *
 * Ordering by construction (DESIGN.md "What a GPU changes"): a copy issued
 * on one stream follows the work issued before it on the issuing thread's
 * current stream (order_after), so no strategy relies on an op that
 * happens to synchronise. No file here tests for a particular device.
 */
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "internal.h"

enum { ITEM_COPY, ITEM_RECORD, ITEM_WAIT_EVENT, ITEM_WAIT_COMM, ITEM_FAIL };

typedef struct item {
    int kind;
    struct item *next;
    zt_tensor *dst, *src;       /* COPY: both retained until done */
    zt_event *ev;               /* RECORD, WAIT_EVENT: retained */
    uint64_t seq;               /* the record this item completes or waits for */
    zt_comm_req *req;           /* WAIT_COMM: not owned (see ztrain.h) */
    int code;                   /* FAIL */
    char msg[256];
} item;

struct zt_stream {
    int kind;
    int worker;                 /* 1: a worker thread runs the queue */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t queued, finished_cv;
    item *head, *tail;
    uint64_t issued, finished;
    int stop;
    int err;                    /* first error of the queued work, kept until reported */
    char msg[1024];
    void *cu;                   /* the device's stream (cudaStream_t; NULL: the CPU model) */
    const zt_exec_ops *x;       /* the execution table cu belongs to */
    struct held *held;          /* CUDA: copies' tensors until their event completes */
    zt_event *order;            /* recorded here when a copy on another stream must follow
                                   this stream's earlier work (zt_copy_async); lazily made */
};

/* A CUDA copy's tensors, released once ev (recorded after it) completes. */
typedef struct held {
    void *ev;
    const zt_exec_ops *x;       /* ev's table */
    zt_tensor *a, *b;
    struct held *next;
} held;

struct zt_event {
    int refs;                   /* the user's + one per queued item naming it */
    uint64_t recorded, completed;
    int err;                    /* the recording stream's kept error at completion */
    char msg[1024];
    void *cu;                   /* the device's event (cudaEvent_t; NULL: the CPU model) */
    const zt_exec_ops *x;       /* the execution table cu belongs to: kept, since the
                                   active device may change before the event is freed */
};

static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;   /* every stream's held list */
static pthread_cond_t ev_cv = PTHREAD_COND_INITIALIZER;

static zt_stream default_stream = { .kind = ZT_STREAM_COMPUTE, .worker = 0 };
static _Thread_local zt_stream *current;

static const char *kind_name(int kind)
{
    switch (kind) {
    case ZT_STREAM_COMPUTE: return "compute";
    case ZT_STREAM_COPY: return "copy";
    case ZT_STREAM_COMM: return "comm";
    default: return "?";
    }
}

/* The CUDA stream s's work goes to, or NULL for the CPU model: a stream
 * made while the CUDA device was active, or the default stream then (the
 * device's compute stream). */
/* The table s's device work goes to (the active device's for the default
 * stream; the one it was made under otherwise). */
static const zt_exec_ops *xs(const zt_stream *s) { return s->cu ? s->x : zt_exec(); }

static void *cu_of(const zt_stream *s)
{
    if (s->cu) return s->cu;
    return s == &default_stream && zt_exec() ? zt_exec()->compute_stream() : NULL;
}

/* Spin briefly (a copy or a small collective finishes in microseconds), then
 * sleep a little longer each round, up to 1 ms: a long wait must not burn a
 * core the compute stream or the communication thread needs. */
static void backoff(int *round)
{
    if (*round < 32) sched_yield();
    else {
        int sh = *round - 32 < 10 ? *round - 32 : 10;
        struct timespec ts = { 0, 1000L << sh };
        nanosleep(&ts, NULL);
    }
    (*round)++;
}

/* ---- events ------------------------------------------------------------------ */

static void event_release(zt_event *e)
{
    pthread_mutex_lock(&ev_lock);
    int last = --e->refs == 0;
    pthread_mutex_unlock(&ev_lock);
    if (last) {
        if (e->cu) e->x->event_free(e->cu);   /* the device destroys it once its record completes */
        free(e);
    }
}

int zt_event_new(zt_event **out)
{
    ZT_CHECK(out != NULL, "zt_event_new: out is NULL");
    *out = NULL;
    void *cu = NULL;
    const zt_exec_ops *x = zt_exec();
    if (x) ZT_TRY(x->event_new(&cu));
    zt_event *e = calloc(1, sizeof *e);
    if (!e) {
        if (cu) x->event_free(cu);
        return zt_error(ZT_ENOMEM, "zt_event_new: out of memory");
    }
    e->refs = 1;
    e->cu = cu;
    e->x = x;
    *out = e;
    return ZT_OK;
}

void zt_event_free(zt_event *e)
{
    if (e) event_release(e);
}

/* Mark record seq of e reached, carrying the recording stream's error. */
static void event_complete(zt_event *e, uint64_t seq, int err, const char *msg)
{
    pthread_mutex_lock(&ev_lock);
    if (seq > e->completed) {
        e->completed = seq;
        e->err = err;
        if (err) snprintf(e->msg, sizeof e->msg, "%s", msg);
    }
    pthread_cond_broadcast(&ev_cv);
    pthread_mutex_unlock(&ev_lock);
}

/* Block until record seq of e is reached; its error (code, message in msg). */
static int event_wait_seq(zt_event *e, uint64_t seq, char *msg, size_t n)
{
    pthread_mutex_lock(&ev_lock);
    while (e->completed < seq) pthread_cond_wait(&ev_cv, &ev_lock);
    int err = e->err;           /* of the latest record reached (errors are sticky) */
    if (err) snprintf(msg, n, "%s", e->msg);
    pthread_mutex_unlock(&ev_lock);
    return err;
}

int zt_event_sync(zt_event *e)
{
    ZT_CHECK(e != NULL, "zt_event_sync: event is NULL (freed?)");
    pthread_mutex_lock(&ev_lock);
    uint64_t seq = e->recorded;
    pthread_mutex_unlock(&ev_lock);
    char msg[1024];
    int err = event_wait_seq(e, seq, msg, sizeof msg);
    if (err) return zt_error(err, "%s", msg);
    return e->cu ? e->x->event_sync(e->cu) : ZT_OK;    /* then the GPU's part */
}

int zt_event_query(zt_event *e, int *done)
{
    ZT_CHECK(e != NULL && done != NULL, "zt_event_query: event or done is NULL");
    pthread_mutex_lock(&ev_lock);
    *done = e->completed >= e->recorded;
    int err = *done ? e->err : 0;
    char msg[1024];
    if (err) snprintf(msg, sizeof msg, "%s", e->msg);
    pthread_mutex_unlock(&ev_lock);
    if (err) return zt_error(err, "%s", msg);
    if (*done && e->cu) return e->x->event_query(e->cu, done);
    return ZT_OK;
}

/* An event about to be recorded on a CUDA stream gets its cudaEvent_t now
 * if it was made before the CUDA device was selected. */
static int event_cu(zt_event *e, const zt_exec_ops *x)
{
    pthread_mutex_lock(&ev_lock);
    int rc = e->cu ? ZT_OK : x->event_new(&e->cu);
    if (rc == ZT_OK && !e->x) e->x = x;
    pthread_mutex_unlock(&ev_lock);
    return rc;
}

static int event_reached(zt_event *e, uint64_t seq)
{
    pthread_mutex_lock(&ev_lock);
    int r = e->completed >= seq;
    pthread_mutex_unlock(&ev_lock);
    return r;
}

/* ---- CUDA: tensors of copies in flight ------------------------------------------
 * zt_copy_async keeps its tensors alive until the copy is done. On CUDA
 * the host does not see it end, so an internal event recorded after the
 * copy stands for it; later calls on the stream release what is done. */

/* Hold a and b until the work issued to cu so far (the copy) is done. */
static int hold(zt_stream *s, void *cu, zt_tensor *a, zt_tensor *b)
{
    const zt_exec_ops *x = xs(s);
    held *h = calloc(1, sizeof *h);
    int rc = h ? x->event_new(&h->ev)
               : zt_error(ZT_ENOMEM, "zt_copy_async: out of memory for a copy's record");
    if (rc == ZT_OK) rc = x->event_record(h->ev, cu);
    if (rc != ZT_OK) {          /* cannot track it: let the copy end before returning */
        if (h) x->event_free(h->ev);
        free(h);
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", zt_last_error());
        (void)x->stream_sync(cu);
        return zt_error(rc, "%s", msg);
    }
    zt_tensor_retain(a);
    zt_tensor_retain(b);
    h->x = x;
    h->a = a;
    h->b = b;
    pthread_mutex_lock(&held_lock);
    h->next = s->held;
    s->held = h;
    pthread_mutex_unlock(&held_lock);
    return ZT_OK;
}

/* Release s's held tensors whose copies are done (all: every one; after a
 * sync of the stream). A failed query releases too: the GPU is gone then
 * and its error reaches the caller through the stream's sync. */
static void reap(zt_stream *s, int all)
{
    held *done = NULL;
    pthread_mutex_lock(&held_lock);
    held **pp = &s->held;
    while (*pp) {
        held *h = *pp;
        int d = 1;
        if (!all && h->x->event_query(h->ev, &d) != ZT_OK) d = 1;
        if (d) { *pp = h->next; h->next = done; done = h; }
        else pp = &h->next;
    }
    pthread_mutex_unlock(&held_lock);
    while (done) {
        held *h = done;
        done = h->next;
        h->x->event_free(h->ev);
        zt_tensor_release(h->a);
        zt_tensor_release(h->b);
        free(h);
    }
}

/* The worker has queued items it has not finished. */
static int busy(zt_stream *s)
{
    pthread_mutex_lock(&s->lock);
    int b = s->issued != s->finished;
    pthread_mutex_unlock(&s->lock);
    return b;
}

/* A CUDA stream with a worker: returns 1 with s->lock held when the worker
 * has nothing queued (the caller issues to CUDA directly, then unlocks),
 * else 0 (unlocked: the item must be queued behind the worker's). */
static int idle_locked(zt_stream *s)
{
    pthread_mutex_lock(&s->lock);
    if (s->issued == s->finished) return 1;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

/* ---- the worker ---------------------------------------------------------------- */

/* Keep the first error of s's work (later ones follow from it). */
static void stream_fail(zt_stream *s, int code, const char *msg)
{
    pthread_mutex_lock(&s->lock);
    if (!s->err) {
        s->err = code;
        snprintf(s->msg, sizeof s->msg, "%s", msg);
    }
    pthread_mutex_unlock(&s->lock);
}

/* dst = src on s (checked by zt_copy_async): the device's copy, or an nvme
 * transfer through the engine, blocking this thread until every block is
 * done (the engine keeps its queue depth in flight meanwhile). On a CUDA
 * stream a device/host copy is queued to CUDA (its tensors held), and an
 * nvme copy first waits for the stream's GPU work. */
static int do_copy(zt_stream *s, zt_tensor *dst, const zt_tensor *src)
{
    size_t nbytes = (size_t)src->numel * zt_dtype_size(src->dtype);
    int nvme = dst->storage->tier == ZT_TIER_NVME || src->storage->tier == ZT_TIER_NVME;
    void *cu = cu_of(s);
    if (cu && nvme) ZT_TRY(xs(s)->stream_sync(cu));
    if (cu && !nvme) {
        ZT_TRY(xs(s)->copy_async(dst->data, src->data, nbytes, cu));
        return hold(s, cu, dst, (zt_tensor *)src);
    }
    if (dst->storage->tier == ZT_TIER_NVME) return zt_nvme_rw(1, dst, src->data, nbytes);
    if (src->storage->tier == ZT_TIER_NVME) return zt_nvme_rw(0, src, dst->data, nbytes);
    zt_dev()->copy(dst->data, src->data, nbytes);
    return ZT_OK;
}

static void run_item(zt_stream *s, item *it)
{
    pthread_mutex_lock(&s->lock);
    int err = s->err;
    char msg[1024];
    if (err) snprintf(msg, sizeof msg, "%s", s->msg);
    pthread_mutex_unlock(&s->lock);

    switch (it->kind) {
    case ITEM_COPY:
        if (!err) {   /* after a failure the stream skips its work until the error is seen */
            int rc = do_copy(s, it->dst, it->src);
            if (rc) stream_fail(s, rc, zt_last_error());   /* this worker's message */
        }
        zt_tensor_release(it->dst);
        zt_tensor_release(it->src);
        break;
    case ITEM_RECORD:
        if (!err && s->cu) {    /* CUDA: the record goes to the GPU's queue now */
            int rc = s->x->event_record(it->ev->cu, s->cu);
            if (rc) {
                stream_fail(s, rc, zt_last_error());
                err = rc;
                snprintf(msg, sizeof msg, "%s", zt_last_error());
            }
        }
        if (err) {
            char m[1024];
            snprintf(m, sizeof m, "work queued on the %s stream before this event failed: "
                     "%.900s", kind_name(s->kind), msg);
            event_complete(it->ev, it->seq, err, m);
        } else {
            event_complete(it->ev, it->seq, 0, "");
        }
        event_release(it->ev);
        break;
    case ITEM_WAIT_EVENT: {
        char emsg[1024];
        int eerr = event_wait_seq(it->ev, it->seq, emsg, sizeof emsg);
        if (eerr && !err) {
            char m[1024];
            snprintf(m, sizeof m, "waited on an event whose stream failed: %.900s", emsg);
            stream_fail(s, eerr, m);
        } else if (!eerr && !err && s->cu && it->ev->cu) {   /* CUDA: the GPU waits too */
            int rc = s->x->stream_wait_event(s->cu, it->ev->cu);
            if (rc) stream_fail(s, rc, zt_last_error());
        }
        event_release(it->ev);
        break;
    }
    case ITEM_WAIT_COMM: {
        int done = 0, round = 0;
        while (zt_comm_test(it->req, &done) == ZT_OK && !done) backoff(&round);
        break;
    }
    case ITEM_FAIL:
        if (!err) stream_fail(s, it->code, it->msg);
        break;
    }
}

/* ---- nvme copies in flight together ----
 * A copy to or from nvme is a request to the aio engine. Waiting for each
 * before the next would leave the engine's queue part empty whenever a copy
 * is shorter than queue_depth blocks (a chunk of a pipelined optimizer
 * step), so the worker starts consecutive nvme copies together while they
 * are independent, and completes them in issue order. An event record
 * while copies are in flight joins the flight as a marker (req NULL): it
 * is run when it reaches the front, i.e. once every copy before it is
 * done, and copies after it start meanwhile -- draining the flight at each
 * record emptied the disk's queue once per chunk of the optimizer step.
 * Anything else (a device copy, a wait) first finishes everything in
 * flight, so the stream's order holds for everything a caller can see. */
enum { MAX_FLIGHT = 32 };

typedef struct flight {
    item *it[MAX_FLIGHT];
    zt_aio_req *req[MAX_FLIGHT];
    int n;
} flight;

static int is_nvme_copy(const item *it)
{
    return it->kind == ITEM_COPY && (it->dst->storage->tier == ZT_TIER_NVME ||
                                     it->src->storage->tier == ZT_TIER_NVME);
}

/* Byte range of t in its storage; on nvme widened to whole 4 KiB pages (a
 * partial page is read-modify-written: two copies sharing a page conflict). */
static void span(const zt_tensor *t, size_t *lo, size_t *hi)
{
    size_t es = zt_dtype_size(t->dtype);
    *lo = (size_t)t->offset * es;
    *hi = *lo + (size_t)t->numel * es;
    if (t->storage->tier == ZT_TIER_NVME) {
        *lo = *lo / ZT_AIO_PAGE * ZT_AIO_PAGE;
        *hi = (*hi + ZT_AIO_PAGE - 1) / ZT_AIO_PAGE * ZT_AIO_PAGE;
    }
}

static int overlaps(const zt_tensor *a, const zt_tensor *b)
{
    if (a->storage != b->storage) return 0;
    size_t alo, ahi, blo, bhi;
    span(a, &alo, &ahi);
    span(b, &blo, &bhi);
    return alo < bhi && blo < ahi;
}

/* Would copy `it` touch bytes a copy in flight writes, or write bytes one reads? */
static int conflicts(const flight *f, const item *it)
{
    for (int i = 0; i < f->n; i++) {
        const item *o = f->it[i];
        if (o->kind != ITEM_COPY) continue;          /* a marker touches no bytes */
        if (overlaps(o->dst, it->dst) || overlaps(o->dst, it->src) || overlaps(o->src, it->dst))
            return 1;
    }
    return 0;
}

/* An item is over: count it finished (worker, stream lock not held). */
static void item_done(zt_stream *s, item *it)
{
    free(it);
    pthread_mutex_lock(&s->lock);
    s->finished++;
    pthread_cond_broadcast(&s->finished_cv);
    pthread_mutex_unlock(&s->lock);
}

/* An nvme copy is over (done or failed): drop its tensors, count it finished. */
static void copy_done(zt_stream *s, item *it)
{
    zt_tensor_release(it->dst);
    zt_tensor_release(it->src);
    item_done(s, it);
}

/* Finish the oldest copy in flight, or run the oldest marker (an event
 * record: everything before it is done) (worker, stream lock not held). */
static void finish_oldest(zt_stream *s, flight *f)
{
    item *it = f->it[0];
    zt_aio_req *r = f->req[0];
    memmove(f->it, f->it + 1, (size_t)(f->n - 1) * sizeof *f->it);
    memmove(f->req, f->req + 1, (size_t)(f->n - 1) * sizeof *f->req);
    f->n--;
    if (!r) {
        run_item(s, it);
        item_done(s, it);
        return;
    }
    int rc = zt_aio_wait(r);
    if (rc) stream_fail(s, rc, zt_last_error());   /* keeps the first error only */
    copy_done(s, it);
}

/* Start nvme copy `it` (worker, stream lock not held): 1 if it is in
 * flight, 0 if it failed to start (its error kept, the item done). */
static int start_copy(zt_stream *s, flight *f, item *it)
{
    const zt_tensor *d = it->dst, *src = it->src;
    size_t nbytes = (size_t)src->numel * zt_dtype_size(src->dtype);
    zt_aio_req *r = NULL;
    int rc = s->cu ? s->x->stream_sync(s->cu) : ZT_OK;    /* the host bytes are final */
    if (rc != ZT_OK) {
        stream_fail(s, rc, zt_last_error());
        copy_done(s, it);
        return 0;
    }
    rc = d->storage->tier == ZT_TIER_NVME ? zt_nvme_submit(1, d, src->data, nbytes, &r)
                                              : zt_nvme_submit(0, src, d->data, nbytes, &r);
    if (rc == ZT_OK) {
        f->it[f->n] = it;
        f->req[f->n] = r;
        f->n++;
        return 1;
    }
    stream_fail(s, rc, zt_last_error());
    copy_done(s, it);
    return 0;
}

static void *worker_main(void *arg)
{
    zt_stream *s = arg;
    flight f = { .n = 0 };
    /* One thread: a copy engine, not a second OpenMP team fighting the
     * compute stream's for the cores (device copies use OpenMP blocks). */
    omp_set_num_threads(1);
    if (s->cu) {                        /* its CUDA calls go to the process's GPU */
        int rc = s->x->bind_thread();
        if (rc) stream_fail(s, rc, zt_last_error());
    }
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->head && !s->stop && f.n == 0) pthread_cond_wait(&s->queued, &s->lock);
        item *it = s->head;
        if (!it && f.n == 0) break;     /* stop, and the queue is drained */
        /* nvme copies go into flight while they are independent (and the
         * stream has no error: after one it skips its work) */
        int async = it && is_nvme_copy(it) && !s->err && f.n < MAX_FLIGHT && !conflicts(&f, it);
        int marker = it && it->kind == ITEM_RECORD && f.n > 0 && f.n < MAX_FLIGHT;
        if (marker) {                   /* a record rides along: run when it reaches the front */
            s->head = it->next;
            if (!s->head) s->tail = NULL;
            f.it[f.n] = it;
            f.req[f.n] = NULL;
            f.n++;
            continue;
        }
        if (!async && f.n > 0) {        /* anything else: what is in flight finishes first */
            pthread_mutex_unlock(&s->lock);
            finish_oldest(s, &f);
            pthread_mutex_lock(&s->lock);
            continue;
        }
        s->head = it->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->lock);
        if (async) {
            start_copy(s, &f, it);
            pthread_mutex_lock(&s->lock);
            continue;
        }
        run_item(s, it);
        free(it);
        pthread_mutex_lock(&s->lock);
        s->finished++;
        pthread_cond_broadcast(&s->finished_cv);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static void enqueue(zt_stream *s, item *it)
{
    pthread_mutex_lock(&s->lock);
    it->next = NULL;
    if (s->tail) s->tail->next = it; else s->head = it;
    s->tail = it;
    s->issued++;
    pthread_cond_signal(&s->queued);
    pthread_mutex_unlock(&s->lock);
}

static item *new_item(const char *fn, int kind)
{
    item *it = calloc(1, sizeof *it);
    if (!it) zt_error(ZT_ENOMEM, "%s: out of memory for a stream item", fn);
    else it->kind = kind;
    return it;
}

/* ---- streams -------------------------------------------------------------------- */

zt_stream *zt_stream_default(void) { return &default_stream; }

zt_stream *zt_stream_current(void) { return current ? current : &default_stream; }

int zt_stream_set_current(zt_stream *s)
{
    current = s == &default_stream ? NULL : s;
    const zt_exec_ops *x = current && current->cu ? current->x : zt_exec();
    if (x) x->set_stream(current ? current->cu : NULL);   /* ops launch there */
    return ZT_OK;
}

static zt_stream *resolve(zt_stream *s) { return s ? s : zt_stream_current(); }

int zt_stream_new(zt_stream **out, int kind)
{
    ZT_CHECK(out != NULL, "zt_stream_new: out is NULL");
    *out = NULL;
    ZT_CHECK(kind == ZT_STREAM_COMPUTE || kind == ZT_STREAM_COPY || kind == ZT_STREAM_COMM,
             "zt_stream_new: unknown stream kind %d (known: ZT_STREAM_COMPUTE, "
             "ZT_STREAM_COPY, ZT_STREAM_COMM)", kind);
    void *cu = NULL;
    const zt_exec_ops *x = zt_exec();
    if (x) ZT_TRY(x->stream_new(&cu, kind));
    zt_stream *s = calloc(1, sizeof *s);
    if (!s) {
        if (cu) x->stream_free(cu);
        return zt_error(ZT_ENOMEM, "zt_stream_new: out of memory");
    }
    s->kind = kind;
    s->cu = cu;
    s->x = x;
    s->worker = kind != ZT_STREAM_COMPUTE;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->queued, NULL);
    pthread_cond_init(&s->finished_cv, NULL);
    if (s->worker) {
        int rc = pthread_create(&s->thread, NULL, worker_main, s);
        if (rc != 0) {
            pthread_cond_destroy(&s->queued);
            pthread_cond_destroy(&s->finished_cv);
            pthread_mutex_destroy(&s->lock);
            if (cu) x->stream_free(cu);
            free(s);
            return zt_error(ZT_ENOMEM, "zt_stream_new: cannot start the %s stream's thread "
                            "(%s)", kind_name(kind), strerror(rc));
        }
    }
    *out = s;
    return ZT_OK;
}

void zt_stream_free(zt_stream *s)
{
    if (s == NULL || s == &default_stream) return;
    if (current == s) current = NULL;
    if (s->worker) {
        pthread_mutex_lock(&s->lock);
        s->stop = 1;
        pthread_cond_signal(&s->queued);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->thread, NULL);      /* it drains the queue first */
    }
    if (s->cu) {
        s->x->stream_free(s->cu);              /* waits for its device work */
        reap(s, 1);
    }
    if (s->order) zt_event_free(s->order);
    pthread_cond_destroy(&s->queued);
    pthread_cond_destroy(&s->finished_cv);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* Wait for the worker's queue as it is now; its kept error (cleared). */
static int drain(zt_stream *s)
{
    pthread_mutex_lock(&s->lock);
    uint64_t target = s->issued;
    while (s->finished < target) pthread_cond_wait(&s->finished_cv, &s->lock);
    int err = s->err;
    char msg[1024];
    if (err) { snprintf(msg, sizeof msg, "%s", s->msg); s->err = 0; }
    pthread_mutex_unlock(&s->lock);
    return err ? zt_error(err, "work queued on the %s stream failed (its later work was "
                          "skipped): %s", kind_name(s->kind), msg) : ZT_OK;
}

int zt_stream_sync(zt_stream *s)
{
    s = resolve(s);
    void *cu = cu_of(s);
    if (!cu) return s->worker ? drain(s) : zt_dev()->sync();
    /* CUDA: the worker's queue reaches CUDA, then the GPU finishes it */
    int err = s->worker ? drain(s) : ZT_OK;
    char msg[1024];
    if (err) snprintf(msg, sizeof msg, "%s", zt_last_error());
    int rc = xs(s)->stream_sync(cu);
    reap(s, 1);
    if (err) return zt_error(err, "%s", msg);
    return rc;
}

int zt_stream_enter(void)
{
    zt_stream *s = current;
    if (!s || !s->worker) return ZT_OK;
    /* CUDA: ops launch on s->cu behind what the worker has issued there; the
     * host need not wait for the GPU. CPU: the copies themselves. */
    return s->cu ? drain(s) : zt_stream_sync(s);
}

int zt_stream_wait_event(zt_stream *s, zt_event *e)
{
    ZT_CHECK(e != NULL, "zt_stream_wait_event: event is NULL (freed?)");
    s = resolve(s);
    void *cu = cu_of(s);
    pthread_mutex_lock(&ev_lock);
    uint64_t seq = e->recorded;
    pthread_mutex_unlock(&ev_lock);
    /* On the caller: a compute stream, or (CUDA) a stream whose worker is
     * idle while the record has reached CUDA: the GPU does the waiting. */
    int direct = cu && s->worker && event_reached(e, seq) && idle_locked(s);
    if (!s->worker || direct) {
        char msg[1024];
        int err = event_wait_seq(e, seq, msg, sizeof msg);
        int rc = err ? zt_error(err, "%s", msg) : ZT_OK;
        if (!rc && cu && e->cu) rc = xs(s)->stream_wait_event(cu, e->cu);
        if (direct) pthread_mutex_unlock(&s->lock);
        return rc;
    }
    item *it = new_item("zt_stream_wait_event", ITEM_WAIT_EVENT);
    if (!it) return ZT_ENOMEM;
    pthread_mutex_lock(&ev_lock);
    e->refs++;
    pthread_mutex_unlock(&ev_lock);
    it->ev = e;
    it->seq = seq;
    enqueue(s, it);
    return ZT_OK;
}

int zt_stream_wait_comm(zt_stream *s, zt_comm_req *r)
{
    ZT_CHECK(r != NULL, "zt_stream_wait_comm: request is NULL (already waited on?)");
    s = resolve(s);
    if (!s->worker) {
        int done = 0, round = 0, rc;
        uint64_t t0 = 0;
        while ((rc = zt_comm_test(r, &done)) == ZT_OK && !done) {
            if (!t0) t0 = zt_stats_now_ns();    /* exposed: the caller is blocked */
            backoff(&round);
        }
        if (t0) zt_stats_exposed(zt_stats_now_ns() - t0);
        return rc;
    }
    item *it = new_item("zt_stream_wait_comm", ITEM_WAIT_COMM);
    if (!it) return ZT_ENOMEM;
    it->req = r;
    enqueue(s, it);
    return ZT_OK;
}

int zt_stream_inject_error(zt_stream *s, int code, const char *msg)
{
    ZT_CHECK(code < 0 && msg != NULL, "zt_stream_inject_error: need an error code and a message");
    s = resolve(s);
    ZT_CHECK(s->worker, "zt_stream_inject_error: a compute stream runs on the caller; "
             "its errors are returned at once");
    item *it = new_item("zt_stream_inject_error", ITEM_FAIL);
    if (!it) return ZT_ENOMEM;
    it->code = code;
    snprintf(it->msg, sizeof it->msg, "%s", msg);
    enqueue(s, it);
    return ZT_OK;
}

int zt_event_record(zt_event *e, zt_stream *s)
{
    ZT_CHECK(e != NULL, "zt_event_record: event is NULL (freed?)");
    s = resolve(s);
    void *cu = cu_of(s);
    if (cu) ZT_TRY(event_cu(e, xs(s)));
    int direct = cu && s->worker && idle_locked(s);
    if (!s->worker || direct) {
        /* CPU: everything issued to a compute stream is done. CUDA: the
         * record goes to the GPU's queue now ("completed" = reached CUDA). */
        pthread_mutex_lock(&ev_lock);
        uint64_t seq = ++e->recorded;
        pthread_mutex_unlock(&ev_lock);
        int rc = cu ? xs(s)->event_record(e->cu, cu) : ZT_OK;
        event_complete(e, seq, rc, rc ? zt_last_error() : "");
        if (direct) pthread_mutex_unlock(&s->lock);
        return rc;
    }
    item *it = new_item("zt_event_record", ITEM_RECORD);
    if (!it) return ZT_ENOMEM;
    pthread_mutex_lock(&ev_lock);
    it->seq = ++e->recorded;
    e->refs++;
    pthread_mutex_unlock(&ev_lock);
    it->ev = e;
    enqueue(s, it);
    return ZT_OK;
}

/* ---- copies ---------------------------------------------------------------------- */

/* Ordering by construction: a copy issued on stream s by a thread whose
 * current stream is `from` runs after the work issued to `from` before it,
 * as if both were one stream: an event recorded on `from`, waited for by s
 * (the source a kernel just wrote, or a buffer a kernel still reads that
 * the copy overwrites, need no wait of the caller's). Free where `from`'s
 * work is already done on return: a compute stream of the CPU model.
 * ZTRAIN_UNORDERED_COPIES=1 turns it off, so that spec/fakegpu_async_spec
 * can show the asynchronous fakegpu catches the races it prevents. */
static pthread_mutex_t order_lock = PTHREAD_MUTEX_INITIALIZER;

static int unordered = -1;      /* ZTRAIN_UNORDERED_COPIES=1: off (a test hook) */

static int order_after(zt_stream *s, zt_stream *from)
{
    if (unordered < 0) {        /* racy but idempotent: every thread reads the same */
        const char *e = getenv("ZTRAIN_UNORDERED_COPIES");
        unordered = e && strcmp(e, "1") == 0;
    }
    if (unordered || s == from || (!from->worker && !cu_of(from))) return ZT_OK;
    /* A wait queued behind s's worker reaches the device when the worker
     * gets there, and the device then waits for the event's latest record:
     * a shared event re-recorded meanwhile would order the copy after later
     * work too. So a busy worker stream gets an event of its own. */
    zt_event *ev = NULL;
    int own = s->worker && busy(s);
    int rc = ZT_OK;
    if (own) rc = zt_event_new(&ev);
    else {
        pthread_mutex_lock(&order_lock);
        rc = from->order ? ZT_OK : zt_event_new(&from->order);
        ev = from->order;
        pthread_mutex_unlock(&order_lock);
    }
    if (rc == ZT_OK) rc = zt_event_record(ev, from);
    if (rc == ZT_OK) rc = zt_stream_wait_event(s, ev);
    if (own && ev) zt_event_free(ev);       /* the queued wait holds its own reference */
    return rc;
}

int zt_copy_async(zt_tensor *dst, const zt_tensor *src, zt_stream *s)
{
    const char *fn = "zt_copy_async";
    char a[96], b[96];
    ZT_CHECK(dst != NULL && src != NULL, "%s: dst or src is NULL (freed tensor?)", fn);
    int dt = dst->storage->tier, st = src->storage->tier;
    ZT_CHECK(dst->dtype == src->dtype && dst->numel == src->numel,
             "%s: dst (%s on %s) and src (%s on %s) must have the same dtype and numel "
             "(a copy moves bytes; cast with zt_cast first)", fn, zt_describe(dst, a, sizeof a),
             zt_tier_name(dt), zt_describe(src, b, sizeof b), zt_tier_name(st));
    ZT_CHECK((dt != ZT_TIER_NVME && st != ZT_TIER_NVME) ||
             (dt == ZT_TIER_NVME && st == ZT_TIER_HOST) ||
             (dt == ZT_TIER_HOST && st == ZT_TIER_NVME),
             "%s: dst (%s on %s) and src (%s on %s): nvme bytes move to and from the host "
             "tier only (a device cannot read a file); copy through a host tensor", fn,
             zt_describe(dst, a, sizeof a), zt_tier_name(dt), zt_describe(src, b, sizeof b),
             zt_tier_name(st));
    ZT_CHECK(dst->storage != src->storage || dst->offset + dst->numel <= src->offset ||
             src->offset + src->numel <= dst->offset,
             "%s: dst and src overlap in one storage (elements [%lld,%lld) and [%lld,%lld)); "
             "copy through a separate buffer", fn, (long long)dst->offset,
             (long long)(dst->offset + dst->numel), (long long)src->offset,
             (long long)(src->offset + src->numel));
    s = resolve(s);
    ZT_TRY(order_after(s, zt_stream_current()));
    void *cu = cu_of(s);
    if (cu) reap(s, 0);
    if (!s->worker) return do_copy(s, dst, src);
    /* CUDA: a device/host copy goes to the GPU's queue now unless the
     * worker holds earlier items; an nvme copy always to the worker. */
    if (cu && dt != ZT_TIER_NVME && st != ZT_TIER_NVME && idle_locked(s)) {
        int rc = do_copy(s, dst, src);
        pthread_mutex_unlock(&s->lock);
        return rc;
    }
    item *it = new_item(fn, ITEM_COPY);
    if (!it) return ZT_ENOMEM;
    zt_tensor_retain(dst);
    zt_tensor_retain((zt_tensor *)src);   /* released by the worker; never written */
    it->dst = dst;
    it->src = (zt_tensor *)src;
    enqueue(s, it);
    return ZT_OK;
}
