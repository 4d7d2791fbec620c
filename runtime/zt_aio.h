/*
 * zt_aio.h -- the nvme tier and its asynchronous I/O engine.
 * Part of the public API: include ztrain.h (conventions there); the FFI
 * reads every part in ztrain.h's order.
 */
#ifndef ZTRAIN_AIO_H
#define ZTRAIN_AIO_H

#include "zt_core.h"

/* ---- nvme tier / aio ----------------------------------------------------------
 * An aio engine does asynchronous reads and writes of host buffers at
 * offsets of swap files it owns, with io_uring where the kernel (and the
 * build: liburing) has it and on libuv's thread pool elsewhere (the engine
 * is chosen at open: flags ZT_AIO_URING / ZT_AIO_THREADS, else the
 * environment's ZTRAIN_AIO_ENGINE=auto|uring|threads, else auto: io_uring
 * if io_uring_queue_init works, the thread pool if it fails -- ENOSYS, or
 * EPERM under a seccomp filter or kernel.io_uring_disabled; zt_aio_engine()
 * names the engine and zt_aio_engine_note() why). A request is cut
 * into blocks of block_bytes (at multiples of block_bytes in the file) and
 * the engine keeps up to queue_depth blocks in flight, over all its
 * requests, in submission order. Completion is polled (zt_aio_test) or
 * waited for (zt_aio_wait); libuv's callbacks (the thread pool's, or the
 * io_uring completions' eventfd under uv_poll) run on the engine's own
 * loop thread, in C: nothing ever calls back into Lua.
 *
 * Files are opened with O_DIRECT where the file system accepts it (probed
 * with a real write at open); elsewhere (ramfs, tmpfs before Linux 6.6, some
 * FUSE mounts) the engine uses buffered I/O and zt_aio_mode() says so, once,
 * for the caller to print. A block whose buffer, offset and length are
 * multiples of ZT_AIO_PAGE goes straight from the caller's buffer; any other
 * goes through a bounce buffer (one per queue slot), reading the partial
 * first and last pages before writing them, so bytes around the range are
 * kept. Host tensors are ZT_AIO_PAGE-aligned, so whole tensors take the
 * direct path; views at other offsets are bounced (correct, slower).
 *
 * Flags: ZT_AIO_CHECKSUM keeps a 32-bit hash per 4 KiB page of every file
 * (4 bytes of host memory per 4 KiB on disk), set by writes and verified by
 * every read: a mismatch is an error naming the file and offset.
 * ZT_AIO_BUFFERED never uses O_DIRECT. ZT_AIO_SPARSE does not reserve a
 * file's space when it is made (a full disk then fails a write instead of
 * zt_aio_file_new).
 *
 * Ownership: the engine makes DIR/ztrain-aio.HOST.PID.N with a locked
 * `owner` file and its swap files (swap.N) in it, and removes them at
 * zt_aio_close and at process exit. zt_aio_open removes the swap files left
 * by a dead run of ztrain on this host (its owner lock is free: the kernel
 * drops it when a process dies, even by SIGKILL); it leaves alone live
 * runs' directories, other hosts', and anything without ztrain's owner
 * file, and says what it did in zt_aio_notes().
 *
 * Errors of a request (ZT_EIO: short reads past the end of a file, ENOSPC,
 * EIO, checksum mismatches) are copied into the request and returned by
 * zt_aio_wait with a message naming the file, the operation, the offset and
 * sizes, and what to do. The engine stays usable after a failed request.
 *
 * Concurrency: any thread may submit, test and wait. Requests in flight at
 * the same time must not touch the same ZT_AIO_PAGE-byte page of a file if
 * either writes (a partial page is read-modify-written). The caller's buffer
 * must stay alive and untouched until the request completes. */
typedef struct zt_aio zt_aio;
typedef struct zt_aio_req zt_aio_req;
enum {
    ZT_AIO_CHECKSUM = 1,            /* flag: verify every read against page hashes */
    ZT_AIO_BUFFERED = 2,            /* flag: never O_DIRECT */
    ZT_AIO_SPARSE = 4,              /* flag: do not reserve file space at creation */
    ZT_AIO_URING = 8,               /* flag: io_uring, an error where it is missing or refused */
    ZT_AIO_THREADS = 16,            /* flag: libuv's thread pool (pread/pwrite) */
    ZT_AIO_UNACCOUNTED = 32,        /* flag: bounce buffers outside the memory accounting
                                       (the disk probe's short-lived engines) */
    ZT_AIO_PAGE = 4096,             /* O_DIRECT alignment: buffers, offsets, lengths */
    ZT_AIO_MAX_REGISTERED = 16,     /* regions zt_aio_register holds at once */
    ZT_AIO_MAX_STRIPES = 8,         /* files a storage is striped over, at most */
    ZT_AIO_DEFAULT_BLOCK = 1048576, /* block_bytes 0 means this (DeepSpeed's default) */
    ZT_AIO_DEFAULT_DEPTH = 8        /* queue_depth 0 means this */
};
typedef struct zt_aio_stats {
    uint64_t bytes_read, bytes_written;   /* of completed, successful requests */
    uint64_t requests, blocks;            /* completed requests; blocks issued */
    uint64_t bounced;                     /* blocks that went through a bounce buffer */
    uint64_t errors;                      /* failed requests */
    uint64_t host_bytes;                  /* host memory held: bounce buffers + page hashes */
    uint64_t peak_inflight;               /* most blocks in flight at once (<= queue_depth) */
    uint64_t registered;                  /* blocks moved from or into zt_aio_register'ed memory
                                             as io_uring fixed buffers */
    uint64_t busy_ns;                     /* time with at least one block in flight */
    uint64_t depth_ns;                    /* blocks in flight integrated over time (block-ns):
                                             depth_ns / busy_ns is the mean depth while busy */
} zt_aio_stats;

/* Open an engine over swap directory dir (made if missing when its parent
 * exists; an error if it is not a directory or not writable). block_bytes:
 * a multiple of ZT_AIO_PAGE up to 256 MiB (0: 1 MiB); queue_depth 1..256
 * (0: 8). Holds queue_depth * block_bytes of host memory (accounted: host,
 * other). libuv's thread pool is process-wide and sized once, at the first
 * open, to max(8, queue_depth) unless UV_THREADPOOL_SIZE is set. */
int zt_aio_open(zt_aio **out, const char *dir, size_t block_bytes, int queue_depth, int flags);
/* Finish every request in flight, then remove the engine's files and
 * directory. Requests not yet waited are freed (their handles die). NULL
 * is ignored. */
void zt_aio_close(zt_aio *a);
/* Remove every open engine's swap files and directories now, without
 * closing anything: for a process about to die without exit handlers
 * (before zt_comm_abort). The engines are unusable afterwards. */
void zt_aio_remove_files(void);
/* "O_DIRECT", or "buffered: DIR refuses O_DIRECT (...)", or "buffered (...)". */
const char *zt_aio_mode(const zt_aio *a);
/* The engine's own directory (DIR/ztrain-aio.HOST.PID.N). */
const char *zt_aio_dir(const zt_aio *a);
/* What opening cleaned up or left alone in DIR, one line each ("" if nothing). */
const char *zt_aio_notes(const zt_aio *a);
size_t zt_aio_block_bytes(const zt_aio *a);
int zt_aio_queue_depth(const zt_aio *a);
int zt_aio_flags(const zt_aio *a);
/* 1 if files use O_DIRECT. */
int zt_aio_direct(const zt_aio *a);
/* The engine doing the I/O: "io_uring" or "threads". */
const char *zt_aio_engine(const zt_aio *a);
/* How it was chosen, one line: "io_uring (auto)", "threads (ZTRAIN_AIO_ENGINE
 * =threads)", "threads: io_uring refused (io_uring_queue_init: Operation not
 * permitted: a seccomp filter or kernel.io_uring_disabled)", ... */
const char *zt_aio_engine_note(const zt_aio *a);
int zt_aio_get_stats(zt_aio *a, zt_aio_stats *out);

/* A new swap file of nbytes (>= 1), zero-filled, its space reserved
 * (rounded up to ZT_AIO_PAGE) unless ZT_AIO_SPARSE: a full disk is an error
 * here (ZT_EIO, naming the path). *id names it in requests. */
int zt_aio_file_new(zt_aio *a, size_t nbytes, int *id);
/* Remove a file. ZT_ESTATE while requests on it are in flight. */
int zt_aio_file_free(zt_aio *a, int id);
/* The file's path (valid until it is freed), NULL if unknown. */
const char *zt_aio_file_path(zt_aio *a, int id);
/* Files made from now on are striped over n files (1..ZT_AIO_MAX_STRIPES; 1,
 * the default: one file a storage): block k of a storage (cut at multiples
 * of block_bytes) lives in its file k % n, at offset (k / n) x block_bytes,
 * so the blocks in flight spread over n files. Files made before keep
 * their count. zt_aio_file_path names the first (swap.ID); the others are
 * swap.ID.1 .. swap.ID.(n-1); errors name the file and offset the disk saw. */
int zt_aio_set_stripes(zt_aio *a, int n);
int zt_aio_stripes(const zt_aio *a);

/* Write nbytes from buf to file at offset / read them into buf. Any offset,
 * length and buffer alignment; [offset, offset+nbytes) must lie inside the
 * file's size. With req, the call queues the request and returns; the
 * request must be waited exactly once (zt_aio_wait frees it). req NULL:
 * blocking. */
int zt_aio_write(zt_aio *a, int file, size_t offset, const void *buf, size_t nbytes,
                 zt_aio_req **req);
int zt_aio_read(zt_aio *a, int file, size_t offset, void *buf, size_t nbytes, zt_aio_req **req);
/* Register host memory [buf, buf+nbytes) that many requests will use (a
 * staging pool): with io_uring its pages are pinned once and transfers from
 * or into it skip the kernel's mapping of the caller's pages on every
 * request (fixed buffers); with the thread pool it is recorded and changes
 * nothing. Up to ZT_AIO_MAX_REGISTERED regions of at most 1 GiB each.
 * ZT_ELIMIT when the table is full or the kernel refuses (RLIMIT_MEMLOCK):
 * requests on the memory still work, unregistered. *handle goes to
 * zt_aio_unregister, which must come after the last request on the memory
 * completed and before the memory is freed.
 * flags ZT_AIO_REG_FRESH, for memory just allocated (as a new host tensor,
 * all zeros): if its whole pages hold only zeros and are not a device's
 * pinned memory, they are dropped (MADV_DONTNEED: they read back as zeros)
 * so that the pinning faults them in anew, together -- on this machine's
 * virtio disk that made a 1 MiB transfer's pages physically contiguous
 * (fewer segments per request) and reads at queue depth 32 2x faster. The
 * bytes are the same either way. */
enum { ZT_AIO_REG_FRESH = 1 };
int zt_aio_register(zt_aio *a, void *buf, size_t nbytes, int flags, int *handle);
int zt_aio_unregister(zt_aio *a, int handle);
/* Block until the request is done, free it, return its result. */
int zt_aio_wait(zt_aio_req *r);
/* *done = 1 if finished (never blocks; the request must still be waited). */
int zt_aio_test(zt_aio_req *r, int *done);

/* A short probe of dir's disk (about 1.5 s; runtime/aio_probe.c): a 64 MiB
 * scratch file written and read back by the engine flags choose, at queue
 * depth 8, 16, 32 x 1 MiB blocks and 4, 8 x 4 MiB, rounds in rotated order;
 * the pick is the least median write + read time (a smaller depth x block
 * within 5% wins); then at the pick, storages striped over 1, 2 and 4 files
 * (the fewest within 10% of the fastest wins; about 1 s more). With cache_dir (made if its parent exists; NULL or "":
 * none) the pick is kept per device and engine in
 * cache_dir/aio-probe.MAJ-MIN.ENGINE and read back next time without
 * measuring (cached = 1); concurrent probes of one device take turns. A
 * directory that refuses O_DIRECT is not measured (the page cache would be):
 * the defaults (8 x 1 MiB) come back with note saying so. */
typedef struct zt_aio_probe_result {
    int queue_depth;                      /* the pick */
    size_t block_bytes;
    double write_gbs, read_gbs;           /* the pick's, GB/s (medians) */
    double default_write_gbs, default_read_gbs;   /* depth 8 x 1 MiB's, beside it */
    int rounds, candidates;               /* 0 when cached */
    int cand_depth[8];                    /* each candidate's depth, block and medians */
    size_t cand_block[8];
    double cand_write_gbs[8], cand_read_gbs[8];
    int cached;                           /* 1: read from cache_path, nothing measured */
    double seconds;                       /* what the call took */
    char device[64];                      /* the block device's name ("vda"), or "MAJ:MIN" */
    char engine[16];                      /* "io_uring" or "threads" */
    char cache_path[4096];                /* where the pick is kept ("" if nowhere) */
    char note[256];                       /* why nothing was measured ("" if it was) */
    int stripes;                          /* the pick's files a storage is striped over */
    int stripe_n[3];                      /* at the pick's depth and block: 1, 2, 4 files */
    double stripe_write_gbs[3], stripe_read_gbs[3];   /* their medians (0 when cached) */
} zt_aio_probe_result;
int zt_aio_probe(const char *dir, int flags, const char *cache_dir, zt_aio_probe_result *res);
/* The pick kept in cache_dir for dir's device and engine ("io_uring" or
 * "threads"), nothing measured or written: res->cached = 1, or
 * queue_depth 0 where none is kept (or dir does not exist). */
int zt_aio_probe_cached(const char *dir, const char *engine, const char *cache_dir, zt_aio_probe_result *res);

/* The nvme tier: one engine for the process, configured by the run. Each
 * nvme storage is one swap file; tensors are accounted on tier nvme like
 * any other tier (current/peak bytes, limit). An nvme tensor's bytes are
 * not addressable (tensor->data is NULL; storage->data is an opaque
 * handle): ops refuse it; bytes move with zt_copy_async between an nvme
 * tensor and a host tensor, or with zt_tensor_read/write (synchronous).
 * Until configured, allocating on nvme fails with ZT_EINVAL saying so.
 * Configuring again moves the tier (ZT_ESTATE while nvme tensors exist). */
int zt_nvme_configure(const char *dir, size_t block_bytes, int queue_depth, int flags);
/* The tier's engine (mode, notes, stats), NULL if not configured. */
zt_aio *zt_nvme_engine(void);
/* Close the tier's engine and remove its files (ZT_ESTATE while nvme
 * tensors exist). Harmless when not configured. */
int zt_nvme_shutdown(void);
/* The swap file holding an nvme tensor's storage, and the tensor's byte
 * offset in it (for messages, reports and tests); NULL if t is not on nvme.
 * A striped storage: its first file, and the offset in the storage. */
const char *zt_nvme_path(const zt_tensor *t, size_t *offset);

#endif
