/*
 * comm.c -- the communication engine: the world and its groups, requests,
 * and the communication thread with one queue per communicator. The
 * collectives' API and argument checks are in comm_ops.c.
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
 * MPI transport: one communication thread -- the engine -- owns MPI. It
 * calls MPI_Init_thread, then serves every communicator side by side, so an
 * operation on one group is never queued behind a long collective on
 * another (a pipeline send is not stuck behind a data-parallel all-reduce,
 * and two groups' operations issued in opposite orders on two ranks do not
 * deadlock):
 *  - each communicator has its own FIFO queue. Its operations start in issue
 *    order; a collective holds its communicator until it completes, so one
 *    communicator's collectives reach MPI one after another, in issue order,
 *    on every rank (what MPI requires). A send or receive holds nothing once
 *    started (MPI_Isend/Irecv), so a send followed by a receive never
 *    deadlocks, whatever the message size.
 *  - nothing the engine does waits: every operation is a state machine over
 *    nonblocking MPI (comm_mpi.c) that the engine starts, then tests
 *    together with every other operation in flight, taking its next step
 *    (sum a round, post the next request) as each request completes.
 *    Reductions keep their rounds and rank-order sums, so the bits are those
 *    of a blocking run whatever the timing.
 *  - the engine waits gently (nap_ns): it polls briefly after progress, then
 *    sleeps between polls, backing off, so it does not steal the compute
 *    cores; a new operation wakes it at once, and idle it sleeps on a
 *    condition variable.
 * The caller's thread never touches MPI (zt_comm_abort excepted).
 * zt_comm_wait sleeps on a condition variable until the engine publishes the
 * result (with its own copy of the error message); zt_comm_test reads it.
 * A group freed with operations in flight is released when its queue
 * reaches the free (after its last collective); transfers still in flight
 * on it finish on their own.
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
#include "kernels.h"

/* ---- state ---------------------------------------------------------------
 * world_state and the tuning knobs are touched by the API (main) thread only;
 * the communicators' queues and the ready list, the requests' results and
 * the thread's start/stop handshake are under q_lock. */
enum { WORLD_NONE, WORLD_UP, WORLD_DOWN /* MPI finalized or failed: final */ };

static zt_comm world;
static int world_state = WORLD_NONE;
static char world_down_why[256];

static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cv = PTHREAD_COND_INITIALIZER;      /* work for the thread */
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;   /* a result published */
static zt_comm *ready;          /* communicators with queued operations */
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

int64_t zt_comm_round_elems(const zt_comm_req *op, int p, int64_t chunk)
{
    size_t budget = op->scratch_bytes;
    if (budget == 0) {
        budget = (size_t)p * ZT_COMM_AUTO_SLICE;
        if (budget < ZT_COMM_AUTO_SCRATCH) budget = ZT_COMM_AUTO_SCRATCH;
    }
    int64_t s = (int64_t)(budget / (4 * (size_t)p));
    int64_t m = (int64_t)(op->msg_bytes / 4);
    if (s > m) s = m;
    if (s > chunk) s = chunk;
    return s < 1 ? 1 : s;
}

/* ---- rank-ordered sum ------------------------------------------------------ */
void zt_comm_sum_ranks(float *dst, const float *src, int nsrc, size_t n)
{
    zk_sum_ranks(dst, src, nsrc, n);    /* kernels/cpu: the CUDA twin has its bits */
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

/* Point-to-point operations only occupy their communicator while they are
 * started: later operations start behind them at once, and a send followed
 * by a receive never deadlocks. Every other operation holds its
 * communicator until it completes, so one communicator's collectives reach
 * MPI one after another, in issue order, on every rank. */
static int is_p2p(const zt_comm_req *op) { return op->kind == ZT_OP_SEND || op->kind == ZT_OP_RECV; }

static double now_s(void);

/* Publish an operation's result (any thread) and let its communicator's
 * next operation start. The caller's error message, if rc != OK, is the
 * current thread's last error: the request keeps its own copy. */
static void complete(zt_comm_req *op, int rc)
{
    if (rc != ZT_OK) snprintf(op->msg, sizeof op->msg, "%s", zt_last_error());
    if (op->check_of) {             /* a signature exchange: judge its operation */
        op->rc = rc;
        zt_watch_compare(op);
    } else if (rc == ZT_OK) {
        zt_watch_done(op, now_s());
        if (op->kind == ZT_OP_SPLIT && op->split_out && *op->split_out)
            zt_watch_register(*op->split_out, op->comm, op->seq, op->color);
    }
    if (op->stats_running) zt_stats_end();
    zt_tensor_release(op->hold[0]);
    zt_tensor_release(op->hold[1]);
    op->hold[0] = op->hold[1] = NULL;
    free(op->pending);
    op->pending = NULL;
    pthread_mutex_lock(&q_lock);
    /* op->comm is only read for an operation that held it: a transfer's
     * communicator may have been freed while the transfer was in flight. */
    if (!is_p2p(op) && op->comm && op->comm->busy == op) op->comm->busy = NULL;
    if (op->detached) {
        pthread_mutex_unlock(&q_lock);
        free(op);
        return;
    }
    op->rc = rc;
    op->done_ns = zt_stats_now_ns();
    __atomic_store_n(&op->done, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&done_cv);
    pthread_mutex_unlock(&q_lock);
}

/* Run one operation on the current thread (transport start, or the
 * communicator bookkeeping of FREE). */
static int run_op(zt_comm_req *op)
{
    /* op->tp: the communicator's transport when issued (NCCL's attach runs
     * NCCL's start on an MPI communicator) */
    const zt_transport *tp = op->tp;
    if (op->kind == ZT_OP_FENCE) return ZT_OK;     /* its signature exchange was the work */
    if (op->kind == ZT_OP_FREE) {
        zt_watch_unregister(op->comm);
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

/* Under q_lock: move every operation that may start now to *tail, in issue
 * order per communicator -- a communicator's queue up to and including the
 * next operation that holds it (which makes it busy). A communicator leaves
 * the ready list when its queue is empty. */
static void take_startable(zt_comm_req ***tail)
{
    zt_comm **pc = &ready;
    while (*pc) {
        zt_comm *c = *pc;
        while (c->q_head && !c->busy) {
            zt_comm_req *op = c->q_head;
            c->q_head = op->next;
            if (!c->q_head) c->q_tail = NULL;
            op->next = NULL;
            if (!is_p2p(op)) c->busy = op;
            **tail = op;
            *tail = &op->next;
        }
        if (!c->q_head) {
            *pc = c->next_ready;
            c->next_ready = NULL;
            c->in_ready = 0;
        } else {
            pc = &c->next_ready;
        }
    }
}

/* The engine's waiting, gentle on the compute cores: while operations are
 * in flight it polls MPI (which progresses only inside MPI calls), and
 * between polls it may sleep this long. A new operation wakes it at once.
 *  - collectives: poll for WAIT_SPIN_S after the last completed step, then
 *    sleep 10 us, doubling to WAIT_MAX_NS. While the peers are still
 *    computing (the backward of the next unit), polling would take their
 *    cores: measured on 2 cores with 2 ranks, step times varied by 50% under
 *    blocking collectives.
 *  - transfers: poll (yielding) for 2 ms after the last completed one
 *    (latency), then sleep 50 us, and longer the longer nothing happens (a
 *    stage waiting long on its peer should not burn a core).
 * With both kinds in flight the shorter sleep wins. Returns 0 to poll again
 * at once; *yield = 1 when the thread should yield the core before it does
 * (the transfers' long window; a collective's short spin does not yield:
 * on a loaded machine a yield can cost a whole time slice). */
#define WAIT_SPIN_S 30e-6
#define WAIT_MAX_NS 200000L
#define P2P_SPIN_S  2e-3
typedef struct {
    double last_p2p, last_coll;     /* when the last step of each kind completed */
    int coll_naps;                  /* sleeps since then (collectives' backoff) */
} pace;

static long nap_ns(const zt_comm_req *fly, pace *pc, double t, int *yield)
{
    int p2p = 0, coll = 0;
    *yield = 0;
    for (const zt_comm_req *f = fly; f; f = f->next) {
        if (is_p2p(f)) p2p = 1; else coll = 1;
    }
    long ns = -1;
    if (p2p) {
        double idle = t - pc->last_p2p;
        ns = idle <= P2P_SPIN_S ? 0 : idle > 0.1 ? 1000000L : idle > 0.02 ? 200000L : 50000L;
        *yield = ns == 0;
    }
    if (coll) {
        long c = 0;
        if (t - pc->last_coll >= WAIT_SPIN_S) {
            c = 10000L << (pc->coll_naps < 5 ? pc->coll_naps : 5);
            if (c > WAIT_MAX_NS) c = WAIT_MAX_NS;
        }
        if (ns < 0 || c < ns) {
            ns = c;
            if (c) pc->coll_naps++;
        }
        if (c == 0) *yield = 0;
    }
    return ns < 0 ? 0 : ns;
}

static void moved(pace *pc, const zt_comm_req *op, double t)
{
    if (is_p2p(op)) {
        pc->last_p2p = t;
    } else {
        pc->last_coll = t;
        pc->coll_naps = 0;
    }
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
    zt_watch_register(w, NULL, 0, 0);

    zt_comm_req *fly = NULL;        /* started, not finished; in start order */
    pace pc = { now_s(), now_s(), 0 };
    for (;;) {
        zt_comm_req *todo = NULL, **tt = &todo;
        long nap = 0;
        int yield = 0;
        pthread_mutex_lock(&q_lock);
        take_startable(&tt);
        if (!todo && !fly) {
            if (q_stop && !ready) { pthread_mutex_unlock(&q_lock); break; }
            if (zt_watch_timeout() > 0 && w->tp->side_poll) {
                /* the watchdog's peers may ask where this rank is: look every 100 ms */
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 100000000L;
                if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
                pthread_cond_timedwait(&q_cv, &q_lock, &ts);
                pthread_mutex_unlock(&q_lock);
                zt_watch_serve(w, NULL);
            } else {
                pthread_cond_wait(&q_cv, &q_lock);
                pthread_mutex_unlock(&q_lock);
            }
            continue;
        }
        if (!todo) {
            nap = nap_ns(fly, &pc, now_s(), &yield);
            if (nap) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += nap;
                if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
                pthread_cond_timedwait(&q_cv, &q_lock, &ts);
                take_startable(&tt);
            }
        }
        pthread_mutex_unlock(&q_lock);

        /* Start what may start, in issue order per communicator. */
        zt_comm_req **fly_tail = &fly;
        while (*fly_tail) fly_tail = &(*fly_tail)->next;
        int any = todo != NULL;
        while (todo) {
            zt_comm_req *op = todo;
            todo = op->next;
            op->next = NULL;
            op->t_start = now_s();
            if (op->pre_rc) {
                /* its signature check failed on every rank alike: fail it, do not run it */
                zt_error(op->pre_rc, "%s", op->pre_msg);
                complete(op, op->pre_rc);
                continue;
            }
            zt_clear_error();
            rc = run_op(op);
            if (rc == ZT_OK && op->inflight) {
                moved(&pc, op, now_s());
                *fly_tail = op;
                fly_tail = &op->next;
            } else {
                complete(op, rc);
            }
        }
        /* Progress everything in flight, every communicator's. */
        for (zt_comm_req **pp = &fly; *pp;) {
            zt_comm_req *f = *pp;
            int done = 0;
            f->moved = 0;
            zt_clear_error();
            rc = f->tp->progress(f, &done);
            if (rc != ZT_OK || done || f->moved) {
                moved(&pc, f, now_s());
                any = 1;
            }
            if (rc != ZT_OK || done) {
                *pp = f->next;
                f->next = NULL;
                complete(f, rc);
            } else {
                pp = &f->next;
            }
        }
        double timeout = zt_watch_timeout();
        if (timeout > 0 && w->tp->side_poll) {
            zt_watch_serve(w, fly);
            double t = now_s();
            for (zt_comm_req *f = fly; f; f = f->next)
                if (!f->watched && t - f->t_start > timeout) zt_watch_stuck(w, f, fly, t - f->t_start);
        }
        if (!any && yield) sched_yield();
    }
    zt_clear_error();
    rc = w->tp->finalize(w);
    pthread_mutex_lock(&q_lock);
    fin_rc = rc;
    if (rc != ZT_OK) snprintf(fin_msg, sizeof fin_msg, "%s", zt_last_error());
    pthread_mutex_unlock(&q_lock);
    return NULL;
}

/* Append to the operation's communicator's queue. */
static void enqueue(zt_comm_req *op)
{
    zt_comm *c = op->comm;
    zt_watch_stamp(op);
    pthread_mutex_lock(&q_lock);
    if (!is_p2p(op) && op->kind != ZT_OP_FREE) {
        op->seq = ++c->seq;             /* the same number on every member */
        zt_comm_req *sig = zt_watch_signature_op(op);
        if (sig) {
            if (c->q_tail) c->q_tail->next = sig; else c->q_head = sig;
            c->q_tail = sig;
        }
    }
    if (c->q_tail) c->q_tail->next = op; else c->q_head = op;
    c->q_tail = op;
    if (!c->in_ready) {
        c->in_ready = 1;
        c->next_ready = ready;
        ready = c;
    }
    pthread_cond_signal(&q_cv);
    pthread_mutex_unlock(&q_lock);
}

/* Hand a validated operation to its transport. req == NULL: wait for it. */
int zt_comm_submit(zt_comm_req *op, zt_comm_req **req)
{
    if (op->tp->issue) {
        int rc = op->tp->issue(op);
        if (rc != ZT_OK) {
            zt_tensor_release(op->hold[0]);
            zt_tensor_release(op->hold[1]);
            free(op);
            return rc;
        }
    }
    /* counted from issue to completion: queued behind its communicator's
     * earlier collectives is in flight too (comm_stats.c) */
    zt_stats_issue(op);
    zt_stats_start();
    if (!op->comm->tp->threaded) {
        int rc = run_op(op);
        zt_stats_end();
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
    op->stats_running = 1;
    enqueue(op);
    if (req) { *req = op; return ZT_OK; }
    return zt_comm_wait(op);
}

int zt_comm_wait(zt_comm_req *op)
{
    ZT_CHECK(op != NULL, "zt_comm_wait: req is NULL (already waited on?)");
    if (!__atomic_load_n(&op->done, __ATOMIC_ACQUIRE)) {
        uint64_t t0 = zt_stats_now_ns();    /* exposed: the caller is blocked */
        pthread_mutex_lock(&q_lock);
        while (!op->done) pthread_cond_wait(&done_cv, &q_lock);
        pthread_mutex_unlock(&q_lock);
        /* until the operation ended, not until this thread woke: the wake-up's
         * scheduling delay (ms on a loaded machine) is not communication, and
         * counted it put exposed past busy (test_mpi_comm_stats, CI under load) */
        zt_stats_exposed(op->done_ns > t0 ? op->done_ns - t0 : 0);
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
    ready = NULL;
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

/* A build without NCCL: this weak definition answers; a CUDA build links
 * comm_nccl.c, whose definition replaces it (no #ifdef here). */
__attribute__((weak)) int zt_comm_use_nccl(zt_comm *c, int deterministic)
{
    (void)c;
    (void)deterministic;
    return zt_error(ZT_EINVAL, "zt_comm_use_nccl: built without CUDA (NCCL); rebuild with "
                    "make CUDA=1, or keep the MPI transport");
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
    /* the job ends without exit handlers: take the nvme tier's swap files
     * with it (MPI_Abort kills every rank; each aborting one cleans up) */
    zt_aio_remove_files();
    if (world.tp && world.tp->threaded) world.tp->abort(code);   /* MPI_Abort if up */
    _exit(code);
}
