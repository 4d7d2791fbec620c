/*
 * comm.h -- private to runtime/comm*.c: communicators, operations (= requests)
 * and the transport interface.
 *
 * comm_ops.c validates every call on the caller's thread and turns it into a
 * zt_comm_req (one heap object: the operation and its result). A threaded
 * transport (MPI) runs the operations on the communication thread: each
 * communicator has its own queue, started in issue order, and every started
 * operation is progressed side by side with the other communicators' (see
 * comm.c); the local transport runs them at once on the caller.
 */
#ifndef ZT_COMM_H
#define ZT_COMM_H

#include "internal.h"

enum {
    ZT_OP_ALL_REDUCE, ZT_OP_REDUCE_SCATTER, ZT_OP_ALL_GATHER, ZT_OP_BROADCAST,
    ZT_OP_SEND, ZT_OP_RECV, ZT_OP_BARRIER, ZT_OP_SPLIT, ZT_OP_FREE,
    ZT_OP_ALL_GATHER_HOST, ZT_OP_BROADCAST_HOST,
    ZT_OP_NCCL_ATTACH,          /* comm_nccl.c: an MPI communicator joins NCCL */
    ZT_OP_FENCE                 /* zt_comm_fence: only its signature exchange moves bytes */
};

typedef struct zt_transport zt_transport;

struct zt_comm {
    const zt_transport *tp;
    int rank, size;
    int is_world;
    void *impl;                 /* transport's handle (MPI: an MPI_Comm) */
    /* The engine's (comm.c), under its lock: */
    zt_comm_req *q_head, *q_tail;   /* issued, not yet started; issue order */
    zt_comm_req *busy;          /* its collective in flight: later operations wait */
    zt_comm *next_ready;        /* link in the list of communicators with queued work */
    int in_ready;
    /* The watchdog's and checker's (comm_watch.c): */
    uint64_t gid;               /* equal on every member: the world 1, a split's from
                                 * its parent's gid, the split's sequence and color */
    uint64_t seq;               /* collectives issued on it (caller, under q_lock) */
    uint64_t done_seq;          /* last completed collective (engine thread) */
    int done_kind;
    double done_t;
    zt_comm *all_next;          /* registry of live communicators (engine thread) */
};

/* One operation; the public zt_comm_req is this object. */
struct zt_comm_req {
    int kind;
    const char *fn;             /* API function name, for messages */
    zt_comm *comm;
    const zt_transport *tp;     /* comm->tp, kept: a freed group's transfers still finish */
    /* data: out/x and in as raw pointers (tensors are retained in hold[]) */
    void *out;
    const void *in;
    int64_t count;              /* elements of `out`-side unit (see comm.c) */
    int dtype;                  /* ZT_F32 ... or -1 for raw bytes (host ops) */
    size_t esize;               /* bytes per element */
    int tier;                   /* tier for scratch buffers */
    int root, peer, tag;
    int color, key;
    zt_comm **split_out;
    size_t scratch_bytes;       /* per-op scratch budget, 0 = auto (captured at issue) */
    size_t msg_bytes;           /* largest single MPI message (captured at issue) */
    zt_tensor *hold[2];         /* references kept until completion */
    /* transport state for operations left in flight */
    void *pending;
    int inflight;               /* set by start(): complete later via progress() */
    int moved;                  /* set by progress() when a step completed */
    void *ready;                /* NCCL: event on the issuing stream (issue() to start()) */
    int on_nccl;                /* NCCL: start() enqueued it on NCCL (else MPI runs it) */
    int stats_running;          /* zt_stats_start counted it: complete() ends it */
    uint64_t done_ns;           /* when complete() ended it (zt_stats_now_ns): a waiter's
                                 * exposed time ends here, not at its own wake-up */
    void *staged;               /* MPI with CUDA device tensors: comm_stage.c's buffers */
    /* result, published under the queue lock */
    int done;
    int rc;
    int detached;               /* nobody waits: the runner frees it */
    char msg[512];
    struct zt_comm_req *next;
    /* The watchdog's and checker's (comm_watch.c): */
    uint64_t seq;               /* its communicator's collective number (1, 2, ...; 0 = p2p) */
    double t_start;             /* when the engine started it (monotonic seconds) */
    int watched;                /* the watchdog reported it */
    char site[96];              /* the caller's (Lua) call site, with comm.check on */
    struct zt_comm_req *check_of;   /* a signature exchange: the operation it checks */
    int pre_rc;                 /* the check failed: the operation fails with this */
    char pre_msg[640];
};

struct zt_transport {
    const char *name;
    int threaded;               /* operations run on the communication thread */
    /* On the caller's thread when an operation is submitted, before it is
     * queued (NULL: nothing to do). An error fails the call. */
    int (*issue)(zt_comm_req *op);
    /* On the communication thread: bring the transport up, fill world. */
    int (*init)(zt_comm *world);
    /* Run an operation. Returns its result; or sets op->inflight and returns
     * ZT_OK when it must be completed by progress(). Must not wait on other
     * ranks (a threaded transport's engine serves every communicator). */
    int (*start)(zt_comm_req *op);
    /* An in-flight operation, never waiting: *done = 1 once finished (result
     * returned; the transport has released what it held, op->pending aside);
     * op->moved = 1 when a step completed (the engine's waiting backs off
     * from the last one). */
    int (*progress)(zt_comm_req *op, int *done);
    /* Release a communicator's handle (not the world's). */
    int (*free_comm)(zt_comm *c);
    /* On the communication thread after the last operation. */
    int (*finalize)(zt_comm *world);
    /* Last resort; must not return. */
    void (*abort)(int code);
    /* The watchdog's side channel (engine thread; NULL where there are no
     * peers): a small message to a world rank, never waiting on it; a
     * received one (returns 1, 0 when none); a communicator's members as
     * world ranks. */
    int (*side_send)(int world_rank, const void *buf, int n);
    int (*side_poll)(void *buf, int n, int *from);
    int (*world_ranks)(zt_comm *c, int *out);
};

/* ---- watchdog and checked collectives (comm_watch.c) ----------------------
 * Called by the engine (comm.c). zt_watch_timeout() > 0 turns the watchdog
 * on; zt_watch_check() the signature exchange before each collective. */
double zt_watch_timeout(void);
int zt_watch_check(void);
/* Caller thread, at issue: the call site to carry (comm.check). */
void zt_watch_stamp(zt_comm_req *op);
/* Caller thread, under q_lock, before op is queued: a signature exchange to
 * queue first, or NULL (check off, p2p, or out of memory: then unchecked). */
zt_comm_req *zt_watch_signature_op(zt_comm_req *op);
/* Engine: a signature exchange completed; compare and mark its operation. */
void zt_watch_compare(zt_comm_req *sig);
/* Engine: answer peers' questions; report an operation stuck past the
 * timeout (which ends the job: does not return). */
void zt_watch_serve(zt_comm *world, zt_comm_req *fly);
void zt_watch_stuck(zt_comm *world, zt_comm_req *op, zt_comm_req *fly, double waited);
/* Engine: registry of communicators, and what completed. */
void zt_watch_register(zt_comm *c, const zt_comm *parent, uint64_t split_seq, int color);
void zt_watch_unregister(zt_comm *c);
void zt_watch_done(zt_comm_req *op, double t);
/* The exit status of a job ended by the watchdog or a failed check. */
#define ZT_EXIT_COMM 5

extern const zt_transport zt_transport_local;
extern const zt_transport zt_transport_mpi;
extern const zt_transport zt_transport_nccl;    /* comm_nccl.c (CUDA builds): MPI + NCCL */
/* comm_stage.c: the MPI transport's device tensors through host buffers
 * (pinned on CUDA) when the active device's memory is not the host's (CUDA,
 * fakegpu; on the CPU device these do nothing). issue: caller's thread
 * (CUDA: an event on its stream); stage_in before the MPI operation starts
 * (points op at the buffers); stage_out after it ends (copies back, frees;
 * returns rc or the copy's error). */
int zt_comm_stage_issue(zt_comm_req *op);
int zt_comm_stage_in(zt_comm_req *op);
int zt_comm_stage_out(zt_comm_req *op, int rc);

/* Element-wise rank-order sum: dst[i] = ((src0[i] + src1[i]) + src2[i]) + ...
 * where srcj = src + j * n. */
void zt_comm_sum_ranks(float *dst, const float *src, int nsrc, size_t n);

/* Chunking knobs (tests use them to exercise multi-round paths):
 * scratch_bytes bounds the receive buffer of one reduction round, msg_bytes
 * the size of one MPI message. 0 restores the default. Read when an
 * operation is issued. The default scratch budget (0 = auto) is
 * max(4 MiB, size x 256 KiB): small enough to stay in cache and in the
 * allocator's reusable heap (a fresh 32 MiB mapping per op, page faults
 * included, made a 64 MiB all_reduce 2x slower), large enough that a
 * round's messages are not latency-bound on many ranks. */
void zt_comm_tune(size_t scratch_bytes, size_t msg_bytes);
/* Elements per chunk and round of a reduction over p ranks, for every
 * transport (comm_mpi.c, comm_nccl.c): the scratch of a round (p x S
 * floats) fits op's budget, one message (S floats) stays within msg_bytes,
 * and 1 <= S <= chunk. The rounds cut where the sums are taken, never their
 * order, so the bits do not depend on it. */
int64_t zt_comm_round_elems(const zt_comm_req *op, int p, int64_t chunk);
#define ZT_COMM_DEFAULT_SCRATCH ((size_t)0)
#define ZT_COMM_AUTO_SCRATCH    ((size_t)4 << 20)
#define ZT_COMM_AUTO_SLICE      ((size_t)256 << 10)
#define ZT_COMM_DEFAULT_MSG     ((size_t)1 << 30)
/* Largest element count of one tensor in a collective (MPI counts and
 * displacements are int). */
#define ZT_COMM_MAX_ELEMS       ((int64_t)2147483647)

/* ---- counters (comm_stats.c; contract in ztrain.h) ------------------------
 * zt_stats_issue: caller thread, once per submitted operation (bytes and a
 * call by kind: comm_stats.c says what it counts). zt_stats_start / _end:
 * around each operation's run (engine, or the caller for the local
 * transport). zt_stats_exposed (internal.h): a waiter's blocked time. */
void zt_stats_issue(const zt_comm_req *op);
void zt_stats_start(void);
void zt_stats_end(void);

/* The engine (comm.c) as the collectives (comm_ops.c) use it. */
int zt_comm_usable(const char *fn, const zt_comm *c);
int zt_comm_new_op(zt_comm_req **out, int kind, const char *fn, zt_comm *c);
void zt_comm_hold(zt_comm_req *op, const zt_tensor *a, const zt_tensor *b);
int zt_comm_submit(zt_comm_req *op, zt_comm_req **req);

#endif
