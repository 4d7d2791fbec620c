/*
 * comm.c -- the communication engine: the world and its groups, requests,
 * and the communication thread with its queue. The collectives' API and
 * argument checks are in comm_ops.c.
 *
 * The world is chosen once (zt_comm_world): under an MPI launcher it is the
 * MPI transport (comm_mpi.c), otherwise the local one-rank transport
 * (comm_local.c) and MPI is never initialised. ZTRAIN_COMM=local|mpi forces
 * the choice.
 *
 * Every call is validated (comm_ops.c), on the caller's thread, before anything is
 * acquired or enqueued: a bad call returns its error at once and never
 * reaches MPI (so it cannot hang a collective). A valid call becomes one
 * heap object, the request, which also describes the operation.
 *
 * MPI transport: one communication thread owns MPI. It calls MPI_Init_thread,
 * then takes operations from a FIFO queue and runs them one after another, in
 * issue order -- so the collectives of every rank reach MPI in the order the
 * ranks issued them, which is what MPI requires. Collectives run to completion
 * on the thread; point-to-point operations are started (MPI_Isend/Irecv) and
 * then progressed with MPI_Test between later operations, so a send followed
 * by a receive never deadlocks whatever the message size. Idle, the thread
 * sleeps on a condition variable. The caller's thread never touches MPI
 * (zt_comm_abort excepted). zt_comm_wait sleeps on a condition variable until
 * the thread publishes the result; zt_comm_test reads it.
 *
 * Local transport: operations complete on the caller at once (copies where
 * out != in); no thread.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "comm.h"

/* ---- state ---------------------------------------------------------------
 * world_state and the tuning knobs are touched by the API (main) thread only;
 * the queue, the requests' results and the thread's start/stop handshake are
 * under q_lock. */
enum { WORLD_NONE, WORLD_UP, WORLD_DOWN /* MPI finalized or failed: final */ };

static zt_comm world;
static int world_state = WORLD_NONE;
static char world_down_why[256];

static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cv = PTHREAD_COND_INITIALIZER;      /* work for the thread */
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;   /* a result published */
static zt_comm_req *q_head, *q_tail;
static int q_stop;
static pthread_t comm_thread;
static int init_done, init_rc, fin_rc;
static char init_msg[512], fin_msg[512];

static size_t tune_scratch = ZT_COMM_DEFAULT_SCRATCH;
static size_t tune_msg = ZT_COMM_DEFAULT_MSG;

void zt_comm_tune(size_t scratch_bytes, size_t msg_bytes)
{
    tune_scratch = scratch_bytes;       /* 0: auto */
    tune_msg = msg_bytes ? msg_bytes : ZT_COMM_DEFAULT_MSG;
}

/* ---- rank-ordered sum ------------------------------------------------------ */
void zt_comm_sum_ranks(float *restrict dst, const float *restrict src, int nsrc, size_t n)
{
    /* Blocks keep dst in cache across the sources; each element still gets
     * ((s0 + s1) + s2) + ... exactly. */
    const size_t B = 2048;
    for (size_t i0 = 0; i0 < n; i0 += B) {
        size_t m = n - i0 < B ? n - i0 : B;
        float *restrict d = dst + i0;
        const float *restrict s0 = src + i0;
        if (nsrc == 1) {
            for (size_t i = 0; i < m; i++) d[i] = s0[i];
            continue;
        }
        const float *restrict s1 = src + n + i0;
        for (size_t i = 0; i < m; i++) d[i] = s0[i] + s1[i];
        for (int j = 2; j < nsrc; j++) {
            const float *restrict sj = src + (size_t)j * n + i0;
            for (size_t i = 0; i < m; i++) d[i] += sj[i];
        }
    }
}

/* ---- requests ------------------------------------------------------------- */
int zt_comm_new_op(zt_comm_req **out, int kind, const char *fn, zt_comm *c)
{
    zt_comm_req *op = calloc(1, sizeof *op);
    if (!op) return zt_error(ZT_ENOMEM, "%s: out of memory for a request", fn);
    op->kind = kind;
    op->fn = fn;
    op->comm = c;
    op->tp = c->tp;
    op->dtype = -1;
    op->esize = 1;
    op->tier = ZT_TIER_HOST;
    op->scratch_bytes = tune_scratch;
    op->msg_bytes = tune_msg;
    *out = op;
    return ZT_OK;
}

void zt_comm_hold(zt_comm_req *op, const zt_tensor *a, const zt_tensor *b)
{
    /* Keep the tensors alive until the operation is over: a tensor released
     * by its owner while in flight must not be freed under MPI. */
    op->hold[0] = (zt_tensor *)a;
    op->hold[1] = (zt_tensor *)b;
    zt_tensor_retain(op->hold[0]);
    zt_tensor_retain(op->hold[1]);
}

/* Publish an operation's result (any thread). The caller's error message, if
 * rc != OK, is the current thread's last error. */
static void complete(zt_comm_req *op, int rc)
{
    if (rc != ZT_OK) snprintf(op->msg, sizeof op->msg, "%s", zt_last_error());
    zt_tensor_release(op->hold[0]);
    zt_tensor_release(op->hold[1]);
    op->hold[0] = op->hold[1] = NULL;
    free(op->pending);
    op->pending = NULL;
    if (op->detached) { free(op); return; }
    pthread_mutex_lock(&q_lock);
    op->rc = rc;
    __atomic_store_n(&op->done, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&done_cv);
    pthread_mutex_unlock(&q_lock);
}

/* Run one operation on the current thread (transport start, or the
 * communicator bookkeeping of FREE). */
static int run_op(zt_comm_req *op)
{
    const zt_transport *tp = op->comm->tp;
    if (op->kind == ZT_OP_FREE) {
        int rc = tp->free_comm(op->comm);
        free(op->comm);
        op->comm = NULL;
        return rc;
    }
    return tp->start(op);
}

/* ---- the communication thread ---------------------------------------------- */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *comm_main(void *arg)
{
    zt_comm *w = arg;
    int rc = w->tp->init(w);
    pthread_mutex_lock(&q_lock);
    init_rc = rc;
    if (rc != ZT_OK) snprintf(init_msg, sizeof init_msg, "%s", zt_last_error());
    init_done = 1;
    pthread_cond_broadcast(&done_cv);
    pthread_mutex_unlock(&q_lock);
    if (rc != ZT_OK) return NULL;

    /* Point-to-point operations in flight, in start order. */
    zt_comm_req *fly = NULL, **fly_tail = &fly;
    double last_progress = now_s();
    for (;;) {
        pthread_mutex_lock(&q_lock);
        while (!q_head && !q_stop && !fly) pthread_cond_wait(&q_cv, &q_lock);
        if (!q_head && fly) {
            /* Only transfers in flight: poll MPI, spinning for a short while
             * after the last progress (latency), then sleeping a little
             * longer each time (a stage waiting long on its peer should not
             * burn a core). A new operation wakes us at once. */
            double idle = now_s() - last_progress;
            if (idle > 2e-3) {
                long us = idle > 0.1 ? 1000 : idle > 0.02 ? 200 : 50;
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += us * 1000;
                if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
                pthread_cond_timedwait(&q_cv, &q_lock, &ts);
            }
        }
        zt_comm_req *op = q_head;
        if (op) {
            q_head = op->next;
            if (!q_head) q_tail = NULL;
            op->next = NULL;
        }
        int stop = q_stop && !q_head && !op;
        pthread_mutex_unlock(&q_lock);

        if (op) {
            last_progress = now_s();
            zt_clear_error();
            rc = run_op(op);
            if (rc == ZT_OK && op->inflight) {
                *fly_tail = op;
                fly_tail = &op->next;
            } else {
                complete(op, rc);
            }
        } else if (!fly) {
            if (stop) break;
            continue;
        }
        /* Progress the transfers in flight; complete the finished ones. */
        zt_comm_req **pp = &fly;
        while (*pp) {
            zt_comm_req *f = *pp;
            int done = 0;
            zt_clear_error();
            rc = f->tp->progress(f, &done);     /* f->comm may be freed by now */
            if (rc != ZT_OK || done) {
                *pp = f->next;
                f->next = NULL;
                complete(f, rc);
                last_progress = now_s();
            } else {
                pp = &f->next;
            }
        }
        fly_tail = &fly;
        while (*fly_tail) fly_tail = &(*fly_tail)->next;
        if (stop && !fly) break;
        if (!op && fly) sched_yield();
    }
    zt_clear_error();
    rc = w->tp->finalize(w);
    pthread_mutex_lock(&q_lock);
    fin_rc = rc;
    if (rc != ZT_OK) snprintf(fin_msg, sizeof fin_msg, "%s", zt_last_error());
    pthread_mutex_unlock(&q_lock);
    return NULL;
}

/* Append to the communication thread's queue. */
static void enqueue(zt_comm_req *op)
{
    pthread_mutex_lock(&q_lock);
    if (q_tail) q_tail->next = op; else q_head = op;
    q_tail = op;
    pthread_cond_signal(&q_cv);
    pthread_mutex_unlock(&q_lock);
}

/* Hand a validated operation to its transport. req == NULL: wait for it. */
int zt_comm_submit(zt_comm_req *op, zt_comm_req **req)
{
    if (!op->comm->tp->threaded) {
        int rc = run_op(op);
        if (!req) {
            /* The message, if any, is already this thread's last error. */
            zt_tensor_release(op->hold[0]);
            zt_tensor_release(op->hold[1]);
            free(op);
            return rc;
        }
        complete(op, rc);
        *req = op;
        return ZT_OK;
    }
    enqueue(op);
    if (req) { *req = op; return ZT_OK; }
    return zt_comm_wait(op);
}

int zt_comm_wait(zt_comm_req *op)
{
    ZT_CHECK(op != NULL, "zt_comm_wait: req is NULL (already waited on?)");
    if (!__atomic_load_n(&op->done, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&q_lock);
        while (!op->done) pthread_cond_wait(&done_cv, &q_lock);
        pthread_mutex_unlock(&q_lock);
    }
    int rc = op->rc;
    if (rc != ZT_OK) zt_error(rc, "%s", op->msg);
    free(op);
    return rc;
}

int zt_comm_test(zt_comm_req *op, int *done)
{
    ZT_CHECK(op != NULL && done != NULL, "zt_comm_test: req or done is NULL");
    *done = __atomic_load_n(&op->done, __ATOMIC_ACQUIRE);
    return ZT_OK;
}

/* ---- world, groups, shutdown --------------------------------------------- */
int zt_comm_launched(void)
{
    const char *force = getenv("ZTRAIN_COMM");
    if (force && *force) {
        if (strcmp(force, "local") == 0) return 0;
        if (strcmp(force, "mpi") == 0) return 1;
        return -1;
    }
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK")) return 1;
    if (getenv("PMI_RANK") && getenv("PMI_SIZE")) return 1;      /* Hydra, srun --mpi=pmi2 */
    if (getenv("SLURM_PROCID") && getenv("PMI_FD")) return 1;
    return 0;
}

int zt_comm_world(zt_comm **out)
{
    ZT_CHECK(out != NULL, "zt_comm_world: out is NULL");
    *out = NULL;
    if (world_state == WORLD_UP) { *out = &world; return ZT_OK; }
    if (world_state == WORLD_DOWN)
        return zt_error(ZT_ESTATE, "zt_comm_world: %s; MPI cannot be started twice in one "
                        "process: run a new process", world_down_why);
    int use_mpi = zt_comm_launched();
    const char *force = getenv("ZTRAIN_COMM");
    if (use_mpi < 0)
        return zt_error(ZT_EINVAL, "zt_comm_world: ZTRAIN_COMM is '%s'; use 'local' "
                        "(one rank, no MPI), 'mpi', or leave it unset (detect the "
                        "launcher)", force);
    memset(&world, 0, sizeof world);
    world.is_world = 1;
    world.rank = 0;
    world.size = 1;
    world.tp = use_mpi ? &zt_transport_mpi : &zt_transport_local;
    if (!world.tp->threaded) {
        ZT_TRY(world.tp->init(&world));
        world_state = WORLD_UP;
        *out = &world;
        return ZT_OK;
    }
    init_done = 0;
    q_stop = 0;
    q_head = q_tail = NULL;
    /* The thread takes no asynchronous signals (Ctrl-C and friends go to the
     * program's threads); faults still reach whoever faults. */
    sigset_t all, old;
    sigfillset(&all);
    sigdelset(&all, SIGSEGV); sigdelset(&all, SIGBUS); sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL); sigdelset(&all, SIGABRT); sigdelset(&all, SIGTRAP);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int err = pthread_create(&comm_thread, NULL, comm_main, &world);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err)
        return zt_error(ZT_ENOMEM, "zt_comm_world: cannot start the communication thread: %s",
                        strerror(err));
    pthread_mutex_lock(&q_lock);
    while (!init_done) pthread_cond_wait(&done_cv, &q_lock);
    int rc = init_rc;
    pthread_mutex_unlock(&q_lock);
    if (rc != ZT_OK) {
        pthread_join(comm_thread, NULL);
        world_state = WORLD_DOWN;
        snprintf(world_down_why, sizeof world_down_why, "starting MPI failed");
        return zt_error(rc, "%s", init_msg);
    }
    world_state = WORLD_UP;
    *out = &world;
    return ZT_OK;
}

int zt_comm_rank(const zt_comm *c) { return c ? c->rank : -1; }
int zt_comm_size(const zt_comm *c) { return c ? c->size : -1; }
const char *zt_comm_backend(const zt_comm *c) { return c && c->tp ? c->tp->name : "none"; }

/* The communicator is usable: not NULL, and its transport is still up. */
int zt_comm_usable(const char *fn, const zt_comm *c)
{
    ZT_CHECK(c != NULL, "%s: communicator is NULL (call zt_comm_world first)", fn);
    if (c->tp->threaded && world_state != WORLD_UP)
        return zt_error(ZT_ESTATE, "%s: communication is shut down (zt_comm_finalize was "
                        "called); no more collectives in this process", fn);
    return ZT_OK;
}

int zt_comm_split(zt_comm **out, zt_comm *parent, int color, int key)
{
    const char *fn = "zt_comm_split";
    ZT_CHECK(out != NULL, "%s: out is NULL", fn);
    *out = NULL;
    ZT_TRY(zt_comm_usable(fn, parent));
    ZT_CHECK(color >= 0, "%s: color %d is negative; colors must be >= 0 (ranks with equal "
             "color form one group)", fn, color);
    zt_comm_req *op = NULL;
    ZT_TRY(zt_comm_new_op(&op, ZT_OP_SPLIT, fn, parent));
    op->color = color;
    op->key = key;
    op->split_out = out;
    return zt_comm_submit(op, NULL);
}

void zt_comm_free(zt_comm *c)
{
    if (!c || c->is_world) return;
    if (c->tp->threaded && world_state != WORLD_UP) {
        /* MPI is gone and took the handle with it. */
        free(c->impl);
        free(c);
        return;
    }
    zt_comm_req *op = NULL;
    if (zt_comm_new_op(&op, ZT_OP_FREE, "zt_comm_free", c) != ZT_OK) return;
    /* Queued behind every operation already issued on c; nobody waits. */
    op->detached = 1;
    if (c->tp->threaded) enqueue(op);
    else zt_comm_submit(op, NULL);
}

int zt_comm_finalize(void)
{
    if (world_state != WORLD_UP) return ZT_OK;
    if (!world.tp->threaded) {
        int rc = world.tp->finalize(&world);
        world_state = WORLD_NONE;         /* a local world can be made again */
        return rc;
    }
    pthread_mutex_lock(&q_lock);
    q_stop = 1;
    pthread_cond_signal(&q_cv);
    pthread_mutex_unlock(&q_lock);
    pthread_join(comm_thread, NULL);
    world_state = WORLD_DOWN;
    snprintf(world_down_why, sizeof world_down_why, "MPI was finalized (zt_comm_finalize)");
    if (fin_rc != ZT_OK) return zt_error(fin_rc, "%s", fin_msg);
    return ZT_OK;
}

void zt_comm_abort(int code)
{
    fflush(NULL);
    if (world.tp && world.tp->threaded) world.tp->abort(code);   /* MPI_Abort if up */
    _exit(code);
}
