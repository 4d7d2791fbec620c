/*
 * aio_impl.h -- the aio engine's insides, shared by the generic part
 * (aio.c: files, requests, blocks, checksums, ownership, the nvme tier) and
 * its backends, each a whole file behind an aio_backend table:
 *
 *   aio_threads.c   blocking pread/pwrite on libuv's thread pool (always built)
 *   aio_uring.c     io_uring (built where liburing is installed; its table
 *                   is a weak reference in aio.c, NULL in a build without it)
 *
 * Both run on the engine's own libuv loop thread; neither calls back into
 * Lua. A backend takes blocks with aio_take_block, does each block's
 * transfers as aio_block_begin / aio_block_next plan them, and hands the
 * block back with aio_block_done.
 */
#ifndef ZTRAIN_AIO_IMPL_H
#define ZTRAIN_AIO_IMPL_H

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <uv.h>
#include "internal.h"

#define AIO_HIDDEN __attribute__((visibility("hidden")))

enum { AIO_PAGE = ZT_AIO_PAGE };

typedef struct aio_file {
    int id;
    int stripes;                /* files it is striped over (aio_stripe) */
    int fd[ZT_AIO_MAX_STRIPES];
    size_t size;                /* logical bytes (requests stay inside) */
    size_t reserved;            /* on disk: size rounded up to PAGE */
    int inflight;               /* requests not yet complete (under the engine lock) */
    uint32_t *sums;             /* checksum mode: one hash per page */
    size_t sums_bytes;          /* accounted host bytes of sums */
    char path[PATH_MAX + 32];
} aio_file;

struct zt_aio_req {
    zt_aio *a;
    aio_file *f;
    int write;
    char *buf;
    size_t off, n;              /* file offset, bytes */
    size_t next;                /* bytes issued so far */
    int inflight;               /* blocks in flight */
    int queued;                 /* in the engine's pending list */
    int done;
    int err;
    char msg[2048];
    struct zt_aio_req *next_pending;
    struct zt_aio_req *prev_live, *next_live;   /* every request not yet waited */
};

/* One transfer of a block: pread/pwrite of len bytes at file offset off. */
typedef struct aio_op {
    int write;
    char *buf;
    size_t off, len;
    int bounce;                 /* buf lies in the slot's bounce buffer */
} aio_op;

/* A queue slot: one block in flight, its bounce buffer and its plan. */
typedef struct slot {
    zt_aio *a;
    int index;
    int active;                 /* the backend holds it (a runner queued, a block in flight) */
    zt_aio_req *req;            /* the block in hand, NULL between blocks */
    size_t off, n;              /* this block's file range */
    char *ubuf;                 /* caller's bytes for [off, off+n) */
    char *bounce;               /* block_bytes, PAGE-aligned */
    uint32_t *hash;             /* checksum mode: the hashes of a direct write's pages */
    int bounced;
    int registered;             /* io_uring: a transfer used a registered region */
    int stage;                  /* aio_block_next's place in the plan */
    aio_op op;                  /* the transfer in hand */
    size_t op_done;             /* bytes of it transferred (backends that split it) */
    int err;
    char msg[2048];
    uv_work_t work;             /* threads: the runner's job */
    void *sqe_tag;              /* io_uring: position among unsubmitted entries */
} slot;

typedef struct aio_backend {
    const char *name;           /* "io_uring", "threads" */
    /* Set the backend up (caller's thread, before the loop thread starts;
     * the loop and the wake handle exist). ZT_OK, or an error code with the
     * reason in why (the engine then tries the next backend or fails). */
    int (*init)(zt_aio *a, char *why, size_t nwhy);
    /* Loop thread: blocks were queued, or the engine is stopping (then,
     * once nothing is in flight, close the backend's handles and call
     * aio_quit). */
    void (*on_wake)(zt_aio *a);
    /* After the loop thread ended (or when init failed: undo it). */
    void (*fini)(zt_aio *a);
    /* Register region index (0-based) as [buf, buf+n), or clear it (buf
     * NULL); any thread, engine lock held. NULL: nothing to do. */
    int (*reg)(zt_aio *a, int index, void *buf, size_t n, char *why, size_t nwhy);
} aio_backend;

typedef struct aio_region { char *buf; size_t n; } aio_region;

struct zt_aio {
    size_t block;
    int depth;
    int stripes;                /* files a new storage is striped over */
    int flags;
    int direct;                 /* files opened with O_DIRECT */
    int owner_fd;
    unsigned seq;               /* file ids */
    char dir[PATH_MAX];         /* the engine's own directory */
    char parent[PATH_MAX];      /* the directory it was given */
    char mode[PATH_MAX + 256];
    char engine_note[512];      /* which backend and why */
    char be_note[160];          /* the backend's remark, appended to engine_note */
    char notes[4096];
    const aio_backend *be;
    void *be_state;             /* the backend's own */

    pthread_mutex_t lock;
    pthread_cond_t cv;          /* a request completed */
    aio_file **files;
    int nfiles, cap;
    zt_aio_req *pending, *pending_tail;
    zt_aio_req *live;
    slot *slots;
    int busy;                   /* slots the backend holds */
    size_t unissued;            /* blocks of pending requests not yet taken */
    int blocks_inflight;        /* blocks taken, not yet finished */
    uint64_t depth_since;       /* when blocks_inflight last changed (ns, monotonic) */
    int stopping;
    int quit_sent;              /* the wake handle is closing: uv_run returns */
    char *bounce;               /* depth * block, accounted on host */
    zt_aio_stats stats;
    aio_region regions[ZT_AIO_MAX_REGISTERED];   /* zt_aio_register's (under the lock) */
    int fault_where, fault_err; /* an injected fault (tests): zt_aio_inject_fault */
    long fault_countdown;

    uv_loop_t loop;
    uv_async_t wake;
    uv_thread_t thread;
    struct zt_aio *next_open;   /* the atexit list */
};

/* The stripe of f holding byte off of the storage: block k (cut at
 * multiples of a->block) is in stripe k % stripes at (k / stripes) x block.
 * Returns the stripe's fd, *local the offset in it. A block's transfers
 * stay inside the block, so each goes to one file. */
static inline int aio_stripe(const zt_aio *a, const aio_file *f, size_t off, size_t *local, int *which)
{
    size_t k = off / a->block, n = (size_t)f->stripes;
    *local = (k / n) * a->block + off % a->block;
    if (which) *which = (int)(k % n);
    return f->fd[k % n];
}
/* The path of stripe s of f (s 0: f->path). */
AIO_HIDDEN void aio_stripe_path(const aio_file *f, int s, char *out, size_t n);

/* Hand the next block to sl (engine lock held): 1, or 0 if none. */
AIO_HIDDEN int aio_take_block(zt_aio *a, slot *sl);
/* Account sl's finished block, complete its request if it was the last
 * (engine lock held). */
AIO_HIDDEN void aio_finish_block(zt_aio *a, slot *sl);
/* Plan sl's block (no lock): sets sl->bounced, hashes a checksummed direct
 * write. Then aio_block_next gives each transfer in turn. */
AIO_HIDDEN void aio_block_begin(slot *sl);
/* After the transfer in hand succeeded (or right after begin): checks what
 * it read, then fills sl->op with the next transfer and returns 1, or
 * returns 0 when the block is done (sl->err says how it went). */
AIO_HIDDEN int aio_block_next(slot *sl);
/* The message and code of a failed transfer of [off, off+len) after got
 * bytes: e = the errno, or 0 for a transfer of 0 bytes (the file ended).
 * Names the file, the operation, the offset and what to do. */
AIO_HIDDEN int aio_rw_fail(slot *sl, int write, size_t off, size_t len, size_t got, int e);
/* Tests' injected fault: the errno to fail this transfer with at `where`, or 0. */
AIO_HIDDEN int aio_fault(zt_aio *a, int where);
/* Loop thread: close the wake handle so uv_run returns (once). */
AIO_HIDDEN void aio_quit(zt_aio *a);

AIO_HIDDEN extern const aio_backend aio_threads_backend;
/* aio_uring.c, linked only where liburing was found at build time. */
AIO_HIDDEN extern const aio_backend aio_uring_backend __attribute__((weak));

#endif
