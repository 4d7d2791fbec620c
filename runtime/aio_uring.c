/*
 * aio_uring.c -- the aio engine's io_uring backend (aio_impl.h's table).
 * Built only where liburing is installed (the Makefile's probe); aio.c
 * reaches aio_uring_backend through a weak reference, NULL without it.
 *
 * One ring per engine, owned by the engine's loop thread: it takes blocks
 * in submission order into free queue slots (up to queue_depth in
 * flight), puts each block's transfer in hand on the ring
 * (aio_block_begin/next plan them: the caller's bytes straight, or the
 * slot's bounce buffer, which is registered with the ring as a fixed
 * buffer), and submits them together. The ring signals completions on an
 * eventfd watched by uv_poll on the same loop, so the completions are
 * reaped on the loop thread, in C, and the engine's contract holds:
 * callers poll or wait on requests, nothing calls back into Lua.
 *
 *   caller thread          loop thread (uv_run)              kernel
 *   zt_aio_write --queue--> wake: take blocks, prep SQEs, ---> io_uring
 *                           io_uring_submit                    (O_DIRECT)
 *   zt_aio_wait  <--cv----- eventfd readable: reap CQEs <----- CQE + eventfd
 *                           short: resubmit the rest; next transfer; done
 *
 * Errors: a CQE's negative res is the transfer's errno (aio_rw_fail names
 * the file, operation and offset); a short transfer is resubmitted for
 * the rest (0 bytes: the file ended); io_uring_submit's EAGAIN/EBUSY/EINTR
 * are retried; any other submission error fails the blocks it held, with
 * the file, operation and offset named, and turns their entries into
 * no-ops, so the engine stays usable.
 */
#include <errno.h>
#include <liburing.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>
#include "aio_impl.h"

typedef struct uring {
    struct io_uring ring;
    unsigned entries;
    int efd;                    /* the ring's completion eventfd, under uv_poll */
    int fixed;                  /* the bounce buffers are registered (buffer 0) */
    uv_poll_t poll;
    int polling;                /* the poll handle is open */
    slot **unsub;               /* slots whose entries the kernel has not taken, in order */
    struct io_uring_sqe **unsub_sqe;
    int nunsub;
    int submit_fault;           /* tests: the next submission fails with this errno */
    int kernel;                 /* entries the kernel took whose completion has not come */
    int nregions;               /* zt_aio_register's regions (fixed buffers 1..) */
} uring;

static const char *op_name(int write) { return write ? "write to" : "read of"; }

/* Slot sl's block is finished (loop thread). */
static void block_done(zt_aio *a, slot *sl)
{
    pthread_mutex_lock(&a->lock);
    aio_finish_block(a, sl);
    sl->active = 0;
    a->busy--;
    pthread_mutex_unlock(&a->lock);
}

/* A submission that failed with errno e: the message of sl's transfer. */
static void submit_error(slot *sl, int e)
{
    aio_op *o = &sl->op;
    size_t at;
    int s;
    char path[PATH_MAX + 48];
    aio_stripe(sl->a, sl->req->f, o->off + sl->op_done, &at, &s);
    aio_stripe_path(sl->req->f, s, path, sizeof path);
    snprintf(sl->msg, sizeof sl->msg,
             "aio %s %.500s at offset %zu (%zu bytes) failed: io_uring could not take the "
             "request (io_uring_submit: %s); the engine stays usable; if this repeats, use the "
             "thread-pool engine (ZTRAIN_AIO_ENGINE=threads, or ZT_AIO_THREADS to "
             "zt_aio_open) (swap directory %.400s)", op_name(o->write), path,
             at, o->len - sl->op_done, strerror(e), sl->a->dir);
    sl->err = ZT_EIO;
}

/* Put the rest of sl's transfer in hand on the ring (not yet submitted). */
static void prep(zt_aio *a, uring *u, slot *sl)
{
    int fe = aio_fault(a, ZT_AIO_FAULT_SUBMIT);
    if (fe && !u->submit_fault) u->submit_fault = fe;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    if (!sqe) {                 /* full (no-ops of a failed submission): make room */
        io_uring_submit(&u->ring);
        sqe = io_uring_get_sqe(&u->ring);
    }
    if (!sqe) {
        submit_error(sl, EBUSY);
        block_done(a, sl);
        return;
    }
    aio_op *o = &sl->op;
    char *buf = o->buf + sl->op_done;
    unsigned len = (unsigned)(o->len - sl->op_done);
    size_t at;                  /* the offset in its stripe's file */
    int fd = aio_stripe(a, sl->req->f, o->off + sl->op_done, &at, NULL);
    __u64 off = at;
    int index = -1;             /* a fixed buffer: the bounce buffers (0), or registered memory */
    if (o->bounce) {
        if (u->fixed) index = 0;
    } else if (u->nregions) {
        pthread_mutex_lock(&a->lock);
        for (int i = 0; i < ZT_AIO_MAX_REGISTERED && index < 0; i++) {
            aio_region *g = &a->regions[i];
            if (g->buf && buf >= g->buf && buf + len <= g->buf + g->n) index = 1 + i;
        }
        pthread_mutex_unlock(&a->lock);
    }
    if (index >= 1) sl->registered = 1;
    if (index >= 0) {
        if (o->write) io_uring_prep_write_fixed(sqe, fd, buf, len, off, index);
        else io_uring_prep_read_fixed(sqe, fd, buf, len, off, index);
    } else {
        if (o->write) io_uring_prep_write(sqe, fd, buf, len, off);
        else io_uring_prep_read(sqe, fd, buf, len, off);
    }
    io_uring_sqe_set_data(sqe, sl);
    u->unsub[u->nunsub] = sl;
    u->unsub_sqe[u->nunsub++] = sqe;
}

/* Submit what is on the ring (loop thread). */
static void submit(zt_aio *a, uring *u)
{
    int tries = 0;
    while (u->nunsub > 0) {
        int ret;
        if (u->submit_fault) {  /* tests: as if io_uring_submit had failed */
            ret = -u->submit_fault;
            u->submit_fault = 0;
        } else {
            ret = io_uring_submit(&u->ring);
        }
        if (ret >= 0) {
            int took = ret < u->nunsub ? ret : u->nunsub;
            u->kernel += took;
            u->nunsub -= took;
            memmove(u->unsub, u->unsub + took, (size_t)u->nunsub * sizeof *u->unsub);
            memmove(u->unsub_sqe, u->unsub_sqe + took, (size_t)u->nunsub * sizeof *u->unsub_sqe);
            if (took > 0) continue;
            if (++tries > 1000) ret = -EBUSY;   /* the kernel keeps taking nothing */
            else { sched_yield(); continue; }
        }
        int e = -ret;
        if ((e == EAGAIN || e == EBUSY || e == EINTR) && tries < 1000) {
            if (u->kernel > 0) return;      /* a completion brings us back to try again */
            tries++;
            sched_yield();
            continue;
        }
        /* The kernel took none of these entries: make them no-ops (it
         * reads an entry only when it takes it) and fail their blocks. */
        int n = u->nunsub;
        u->nunsub = 0;
        for (int i = 0; i < n; i++) {
            io_uring_prep_nop(u->unsub_sqe[i]);
            io_uring_sqe_set_data(u->unsub_sqe[i], NULL);
            submit_error(u->unsub[i], e);
            block_done(a, u->unsub[i]);
        }
        return;
    }
}

/* Take waiting blocks into free slots and put their first transfer on the
 * ring (loop thread). */
static void issue(zt_aio *a, uring *u)
{
    for (;;) {
        slot *sl = NULL;
        pthread_mutex_lock(&a->lock);
        if (a->pending && a->busy < a->depth) {
            for (int i = 0; i < a->depth && !sl; i++)
                if (!a->slots[i].active) sl = &a->slots[i];
            if (sl && aio_take_block(a, sl)) {
                sl->active = 1;
                a->busy++;
            } else {
                sl = NULL;
            }
        }
        pthread_mutex_unlock(&a->lock);
        if (!sl) return;
        aio_block_begin(sl);
        aio_block_next(sl);         /* a block has at least one transfer */
        prep(a, u, sl);
    }
}

/* A completion of sl's transfer in hand with result res. */
static void completed(zt_aio *a, uring *u, slot *sl, int res)
{
    int fault = aio_fault(a, ZT_AIO_FAULT_COMPLETE);
    if (fault) res = -fault;
    aio_op *o = &sl->op;
    if (res == -EINTR || res == -EAGAIN) { prep(a, u, sl); return; }
    if (res > 0) {
        sl->op_done += (size_t)res;
        if (sl->op_done < o->len) { prep(a, u, sl); return; }     /* short: the rest */
        if (aio_block_next(sl)) { prep(a, u, sl); return; }       /* the block's next transfer */
    } else {
        sl->err = aio_rw_fail(sl, o->write, o->off, o->len, sl->op_done, res < 0 ? -res : 0);
    }
    block_done(a, sl);
}

static void maybe_quit(zt_aio *a, uring *u)
{
    pthread_mutex_lock(&a->lock);
    int quit = a->stopping && !a->pending && a->busy == 0;
    pthread_mutex_unlock(&a->lock);
    if (!quit || u->kernel > 0) return;
    if (u->polling) {
        u->polling = 0;
        uv_close((uv_handle_t *)&u->poll, NULL);
    }
    aio_quit(a);
}

static void on_wake(zt_aio *a)
{
    uring *u = a->be_state;
    issue(a, u);
    submit(a, u);
    maybe_quit(a, u);
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    zt_aio *a = h->data;
    uring *u = a->be_state;
    (void)status; (void)events;
    uint64_t v;
    if (read(u->efd, &v, sizeof v) < 0) { /* EAGAIN: nothing new */ }
    struct io_uring_cqe *cqe;
    while (io_uring_peek_cqe(&u->ring, &cqe) == 0) {
        slot *sl = io_uring_cqe_get_data(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&u->ring, cqe);
        if (!sl) continue;          /* a no-op left by a failed submission */
        u->kernel--;
        completed(a, u, sl, res);
    }
    issue(a, u);
    submit(a, u);
    maybe_quit(a, u);
}

static void release(uring *u)
{
    if (u->efd >= 0) close(u->efd);
    free(u->unsub);
    free(u->unsub_sqe);
    free(u);
}

static int init(zt_aio *a, char *why, size_t nwhy)
{
    uring *u = calloc(1, sizeof *u);
    unsigned entries = 4;
    while (entries < 2u * (unsigned)a->depth) entries *= 2;
    if (u) {
        u->efd = -1;
        u->unsub = calloc(entries, sizeof *u->unsub);
        u->unsub_sqe = calloc(entries, sizeof *u->unsub_sqe);
    }
    if (!u || !u->unsub || !u->unsub_sqe) {
        if (u) release(u);
        snprintf(why, nwhy, "out of memory");
        return ZT_ENOMEM;
    }
    u->entries = entries;
    int rc = io_uring_queue_init(entries, &u->ring, 0);
    if (rc < 0) {
        snprintf(why, nwhy, "io_uring_queue_init refused: %s%s", strerror(-rc),
                 rc == -EPERM ? " (a seccomp filter, the container's policy, or sysctl "
                                "kernel.io_uring_disabled)" :
                 rc == -ENOSYS ? " (a kernel without io_uring)" : "");
        release(u);
        return ZT_EIO;
    }
    u->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (u->efd < 0 || io_uring_register_eventfd(&u->ring, u->efd) != 0) {
        snprintf(why, nwhy, "cannot attach an eventfd to the ring (%s)", strerror(errno));
        io_uring_queue_exit(&u->ring);
        release(u);
        return ZT_EIO;
    }
    /* fixed buffers: 0 the bounce buffers (their pages stay pinned, the
     * kernel does not map them for every transfer), 1.. zt_aio_register's */
    struct iovec iov = { .iov_base = a->bounce, .iov_len = a->block * (size_t)a->depth };
    if (io_uring_register_buffers_sparse(&u->ring, 1 + ZT_AIO_MAX_REGISTERED) == 0)
        u->fixed = io_uring_register_buffers_update_tag(&u->ring, 0, &iov, NULL, 1) == 1;
    int uvrc = uv_poll_init(&a->loop, &u->poll, u->efd);
    if (uvrc == 0) {
        u->polling = 1;
        u->poll.data = a;
        uvrc = uv_poll_start(&u->poll, UV_READABLE, on_poll);
    }
    if (uvrc != 0) {
        if (u->polling) {
            uv_close((uv_handle_t *)&u->poll, NULL);
            uv_run(&a->loop, UV_RUN_NOWAIT);
        }
        snprintf(why, nwhy, "cannot watch the ring's eventfd (%s)", uv_strerror(uvrc));
        io_uring_queue_exit(&u->ring);
        release(u);
        return ZT_EIO;
    }
    a->be_state = u;
    if (!u->fixed)
        snprintf(a->be_note, sizeof a->be_note, "; its bounce buffers not registered (RLIMIT_MEMLOCK?)");
    return ZT_OK;
}

static void fini(zt_aio *a)
{
    uring *u = a->be_state;
    if (!u) return;
    if (u->polling) {           /* the loop never ran (its thread did not start) */
        u->polling = 0;
        uv_close((uv_handle_t *)&u->poll, NULL);
        uv_run(&a->loop, UV_RUN_NOWAIT);
    }
    io_uring_queue_exit(&u->ring);
    release(u);
    a->be_state = NULL;
}

/* Fixed buffer 1 + index: the region, or an empty slot (engine lock held). */
static int reg(zt_aio *a, int index, void *buf, size_t n, char *why, size_t nwhy)
{
    uring *u = a->be_state;
    struct iovec iov = { .iov_base = buf, .iov_len = buf ? n : 0 };
    int rc = io_uring_register_buffers_update_tag(&u->ring, 1 + (unsigned)index, &iov, NULL, 1);
    if (rc != 1) {
        if (why) snprintf(why, nwhy, "io_uring refused to register it (%s; RLIMIT_MEMLOCK?)",
                          strerror(rc < 0 ? -rc : EINVAL));
        return ZT_ELIMIT;
    }
    u->nregions += buf ? 1 : -1;
    return ZT_OK;
}

const aio_backend aio_uring_backend = {
    .name = "io_uring",
    .init = init,
    .on_wake = on_wake,
    .fini = fini,
    .reg = reg,
};
