/*
 * aio_threads.c -- the aio engine's thread-pool backend: blocking
 * pread/pwrite on libuv's thread pool (aio_impl.h's table; the fallback
 * where io_uring is missing or refused, and ZTRAIN_AIO_ENGINE=threads).
 *
 * Up to queue_depth runners (uv_queue_work jobs on libuv's pool) take blocks
 * in submission order and do their transfers, each going straight on to
 * the next block, so queue_depth blocks are in flight; the engine's loop
 * thread (uv_run) only starts runners when blocks are waiting and none is
 * free, and its callbacks stay in C.
 *
 *   caller thread          loop thread (uv_run)       libuv pool threads
 *   zt_aio_write --queue--> wake: start runners -----> runner: take block,
 *   zt_aio_wait  <--cv---------------------------------  pwrite, complete, next
 *                           runner_done: restart <---- (no block left)
 *
 * Handing every block back through the loop thread cost two thread
 * wake-ups per block, which on a loaded machine held the engine to about
 * 80% of fio's bandwidth; a runner's next block costs a lock.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "aio_impl.h"

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static int pool_threads;        /* libuv's pool size (fixed at its first use) */

/* pread/pwrite all of the slot's transfer in hand: EINTR and short
 * transfers retried; a failure is aio_rw_fail's message. */
static int rw_full(slot *sl)
{
    aio_op *o = &sl->op;
    size_t at;                  /* the transfer's offset in its stripe's file */
    int fd = aio_stripe(sl->a, sl->req->f, o->off, &at, NULL);
    size_t got = 0;
    while (got < o->len) {
        int fault = aio_fault(sl->a, ZT_AIO_FAULT_COMPLETE);
        ssize_t r = fault ? (errno = fault, -1)
                  : o->write ? pwrite(fd, o->buf + got, o->len - got, (off_t)(at + got))
                             : pread(fd, o->buf + got, o->len - got, (off_t)(at + got));
        if (r < 0 && errno == EINTR) continue;
        if (r > 0) { got += (size_t)r; continue; }
        return aio_rw_fail(sl, o->write, o->off, o->len, got, r < 0 ? errno : 0);
    }
    return ZT_OK;
}

/* Do slot sl's block (pool thread, engine lock not held). */
static void block_work(slot *sl)
{
    aio_block_begin(sl);
    while (aio_block_next(sl))
        if ((sl->err = rw_full(sl)) != ZT_OK) break;
}

static void runner_done(uv_work_t *w, int status);

/* A runner (pool thread): takes blocks and does them until none is left.
 * Up to queue_depth runners run at once, so that many blocks are in flight;
 * a runner goes straight from one block to the next, without a trip
 * through the loop thread, which only starts runners. */
static void runner_work(uv_work_t *w)
{
    slot *sl = w->data;
    zt_aio *a = sl->a;
    pthread_mutex_lock(&a->lock);
    while (aio_take_block(a, sl)) {
        pthread_mutex_unlock(&a->lock);
        block_work(sl);
        pthread_mutex_lock(&a->lock);
        aio_finish_block(a, sl);
    }
    pthread_mutex_unlock(&a->lock);
}

/* Start runners for blocks waiting, up to queue_depth (loop thread). */
static void issue(zt_aio *a)
{
    pthread_mutex_lock(&a->lock);
    size_t want = a->unissued;
    for (int i = 0; i < a->depth && a->busy < a->depth && want > 0; i++) {
        slot *sl = &a->slots[i];
        if (sl->active) continue;
        sl->active = 1;
        a->busy++;
        want--;
        uv_queue_work(&a->loop, &sl->work, runner_work, runner_done);
    }
    pthread_mutex_unlock(&a->lock);
}

/* Closing, and nothing left in flight: uv_run may return (loop thread). */
static void maybe_quit(zt_aio *a)
{
    pthread_mutex_lock(&a->lock);
    int quit = a->stopping && !a->pending && a->busy == 0;
    pthread_mutex_unlock(&a->lock);
    if (quit) aio_quit(a);
}

static void runner_done(uv_work_t *w, int status)
{
    slot *sl = w->data;
    zt_aio *a = sl->a;
    (void)status;               /* never cancelled: the engine does not call uv_cancel */
    pthread_mutex_lock(&a->lock);
    sl->active = 0;
    a->busy--;
    pthread_mutex_unlock(&a->lock);
    issue(a);                   /* blocks queued while this runner was leaving */
    maybe_quit(a);
}

static void on_wake(zt_aio *a)
{
    issue(a);
    maybe_quit(a);
}

/* libuv sizes its one process-wide pool from UV_THREADPOOL_SIZE at its
 * first use; a pool smaller than the queue depth would cap it. */
static int init(zt_aio *a, char *why, size_t nwhy)
{
    (void)why; (void)nwhy;
    pthread_mutex_lock(&pool_lock);
    if (!pool_threads) {
        const char *env = getenv("UV_THREADPOOL_SIZE");
        if (env && atoi(env) > 0) {
            pool_threads = atoi(env);
        } else {
            char v[16];
            pool_threads = a->depth > 8 ? a->depth : 8;
            snprintf(v, sizeof v, "%d", pool_threads);
            setenv("UV_THREADPOOL_SIZE", v, 1);
        }
        if (pool_threads > 1024) pool_threads = 1024;
    }
    int threads = pool_threads;
    pthread_mutex_unlock(&pool_lock);
    if (a->depth > threads) {
        size_t l = strlen(a->mode);
        snprintf(a->mode + l, sizeof a->mode - l, "; queue depth %d exceeds libuv's pool of %d "
                 "threads (set UV_THREADPOOL_SIZE before the first engine opens)",
                 a->depth, threads);
    }
    return ZT_OK;
}

static void fini(zt_aio *a) { (void)a; }

const aio_backend aio_threads_backend = {
    .name = "threads",
    .init = init,
    .on_wake = on_wake,
    .fini = fini,
};
