/*
 * aio.c -- asynchronous file I/O, and the nvme tier over it (contracts in
 * ztrain.h, "nvme tier / aio"). This file is the engine's generic part:
 * files, requests cut into blocks, the plan of each block's transfers
 * (direct or through a bounce buffer, checksums), ownership of the swap
 * directory, and the nvme tier. The I/O itself is a backend's, each a
 * whole file behind the aio_backend table (aio_impl.h): aio_uring.c
 * (io_uring; linked where liburing was found at build time) and
 * aio_threads.c (pread/pwrite on libuv's thread pool). zt_aio_open picks
 * one (flags, then ZTRAIN_AIO_ENGINE, then auto: io_uring if its ring
 * opens, else the thread pool) and says which in zt_aio_engine_note.
 *
 * An engine owns one directory, DIR/ztrain-aio.HOST.PID.N, and the swap
 * files in it. A request (a read or write of a host buffer at a file offset)
 * is cut into blocks at multiples of block_bytes in the file; the backend
 * keeps up to queue_depth blocks in flight, taken in submission order, on
 * the engine's own loop thread (uv_run) and, for the thread pool, libuv's
 * pool threads. Callbacks stay in C. A request completes when its last
 * block does, under the engine lock: callers poll (zt_aio_test) or block
 * (zt_aio_wait). Nothing calls back into Lua.
 *
 * O_DIRECT needs the buffer, offset and length aligned to the device's
 * logical block: 4096 covers every device. A block that is aligned goes
 * straight from the caller's buffer; any other block goes through its
 * slot's bounce buffer (one per queue slot), whole pages at a time, reading a
 * partial first or last page before writing it (read-modify-write) so the
 * neighbouring bytes survive. A file system that refuses O_DIRECT (ramfs,
 * tmpfs before Linux 6.6, some FUSE mounts: EINVAL) gets buffered I/O,
 * said once in zt_aio_mode().
 *
 * Checksum mode keeps a 32-bit hash per 4096-byte page of every file (in
 * host memory), set on write and verified on every read, so a swap file
 * changed underneath is an error, never silent corruption. Pages never
 * written hash as zeros (a new file reads as zeros).
 *
 * Ownership: the engine directory holds an `owner` file, flock()ed for the
 * engine's life (the kernel drops the lock when the process dies, however it
 * dies). zt_aio_open scans DIR for ztrain-aio.* directories of this host
 * whose owner file it can lock: their runs are dead, and it removes the swap
 * files they made (named swap.N) and nothing else. Live runs' directories
 * and anything without ztrain's owner file are left alone and noted
 * (zt_aio_notes). An engine removes its files at zt_aio_close and, for an
 * engine still open, when the process exits (atexit).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>
#include "aio_impl.h"

enum { PAGE = ZT_AIO_PAGE, MAX_DEPTH = 256 };
#define MAX_BLOCK ((size_t)256 << 20)

/* ---- page hashes ---------------------------------------------------------------- */

/* xxHash64-style: four independent lanes (fast: about one cycle per 8 bytes),
 * each round a bijection of its lane, so a changed word always changes its
 * lane; folded to 32 bits. An error detector, not a cryptographic hash. */
static const uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full,
                      P3 = 0x165667B19E3779F9ull;
static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint32_t page_hash(const void *page)
{
    const uint64_t *w = page;
    uint64_t a = P1 + P2, b = P2, c = 0, d = (uint64_t)0 - P1;
    for (int i = 0; i < PAGE / 8; i += 4) {
        a = rotl(a + w[i] * P2, 31) * P1;
        b = rotl(b + w[i + 1] * P2, 31) * P1;
        c = rotl(c + w[i + 2] * P2, 31) * P1;
        d = rotl(d + w[i + 3] * P2, 31) * P1;
    }
    uint64_t h = rotl(a, 1) + rotl(b, 7) + rotl(c, 12) + rotl(d, 18);
    h ^= h >> 33; h *= P2; h ^= h >> 29; h *= P3; h ^= h >> 32;
    return (uint32_t)h ^ (uint32_t)(h >> 32);
}

static uint32_t zero_page_hash;

/* Open engines, for the exit-time cleanup. */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static zt_aio *open_engines;
static unsigned engine_seq;

static const char *op_name(int write) { return write ? "write to" : "read of"; }

/* Format the message of an I/O failure with errno e, naming the file, the
 * operation, the range and what to do. */
static int io_error(char *msg, size_t n, int write, const char *path, size_t off, size_t len,
                    int e, const char *dir)
{
    const char *what;
    switch (e) {
    case ENOSPC: case EDQUOT:
        what = "no space left on the device (ENOSPC); free space there or point "
               "the swap directory at a larger disk"; break;
    case EIO:
        what = "the device reported an I/O error (EIO); check the disk (dmesg) or move "
               "the swap directory to another device"; break;
    case EROFS:
        what = "the file system is read-only (EROFS); point the swap directory at a "
               "writable directory"; break;
    default: what = NULL;
    }
    if (what)
        snprintf(msg, n, "aio %s %.400s at offset %zu (%zu bytes) failed: %s (swap "
                 "directory %.400s)", op_name(write), path, off, len, what, dir);
    else
        snprintf(msg, n, "aio %s %.400s at offset %zu (%zu bytes) failed: %s (swap "
                 "directory %.400s)", op_name(write), path, off, len, strerror(e), dir);
    return ZT_EIO;
}

/* ---- a block's transfers (any backend) ------------------------------------------------ */

void aio_stripe_path(const aio_file *f, int s, char *out, size_t n)
{
    if (s == 0) snprintf(out, n, "%s", f->path);
    else snprintf(out, n, "%s.%d", f->path, s);
}

/* Bytes of stripe s of a storage of `reserved` bytes striped over n files
 * in blocks of b (aio_stripe's layout). */
static size_t stripe_bytes(size_t reserved, size_t b, int n, int s)
{
    size_t nb = (reserved + b - 1) / b;            /* blocks, the last maybe short */
    if ((size_t)s >= nb) return 0;
    size_t k = (nb - 1 - (size_t)s) / (size_t)n;   /* this stripe's last block: s + k n */
    size_t last = (size_t)s + k * (size_t)n;
    return k * b + (last == nb - 1 ? reserved - last * b : b);
}

/* off: the transfer's offset in the storage; the messages name the file
 * (the stripe's) and the offset in it. */
int aio_rw_fail(slot *sl, int write, size_t off, size_t len, size_t got, int e)
{
    aio_file *f = sl->req->f;
    size_t at;
    int s;
    int fd = aio_stripe(sl->a, f, off, &at, &s);
    char path[PATH_MAX + 48];
    aio_stripe_path(f, s, path, sizeof path);
    if (e == 0 || (e == EINVAL && got > 0)) {
        /* 0: end of file. EINVAL after a partial O_DIRECT transfer: the
         * retry is misaligned because the file ended mid-page. */
        struct stat st;
        long long size = fstat(fd, &st) == 0 ? (long long)st.st_size : -1;
        size_t should = f->stripes > 1 ? stripe_bytes(f->reserved, sl->a->block, f->stripes, s) : f->reserved;
        if (!write) {
            snprintf(sl->msg, sizeof sl->msg,
                     "aio read of %.500s at offset %zu (%zu bytes): short read: the file ends "
                     "at %lld bytes, it should hold %zu (truncated or replaced underneath?); "
                     "its data is lost: restart from a checkpoint, and keep other "
                     "programs out of %.400s", path, at, len, size, should,
                     sl->a->dir);
            return ZT_EIO;
        }
        snprintf(sl->msg, sizeof sl->msg,
                 "aio write to %.500s at offset %zu (%zu bytes): the device accepted only "
                 "%zu bytes (file now %lld bytes); check free space and the device under %.400s",
                 path, at, len, got, size, sl->a->dir);
        return ZT_EIO;
    }
    return io_error(sl->msg, sizeof sl->msg, write, path, at + got, len - got, e,
                    sl->a->dir);
}

/* Verify the pages of p (file offset off, whole pages) against the file's sums. */
static int verify(slot *sl, aio_file *f, const char *p, size_t off, size_t len)
{
    for (size_t i = 0; i < len; i += PAGE) {
        if (page_hash(p + i) != f->sums[(off + i) / PAGE]) {
            size_t at;                  /* the page's file (a stripe's) and offset there */
            int s;
            char path[PATH_MAX + 48];
            aio_stripe(sl->a, f, off + i, &at, &s);
            aio_stripe_path(f, s, path, sizeof path);
            snprintf(sl->msg, sizeof sl->msg,
                     "aio read of %.500s: checksum mismatch in the %d-byte page at offset %zu "
                     "(reading %zu bytes at offset %zu): the swap file changed underneath; "
                     "its data is lost: restart from a checkpoint, and keep other programs "
                     "out of %.400s", path, PAGE, at, sl->n, sl->off, sl->a->dir);
            return ZT_EIO;
        }
    }
    return ZT_OK;
}

static void hash_pages(uint32_t *out, const char *p, size_t len)
{
    for (size_t i = 0; i < len; i += PAGE) out[i / PAGE] = page_hash(p + i);
}

/* A block's plan. Direct: one transfer from or into the caller's bytes.
 * Bounced read: the whole pages into the bounce buffer, then copied out.
 * Bounced write: the partial first page read (HEAD), the partial last page
 * read (TAIL), the caller's bytes copied over them, the whole pages written. */
enum { ST_START, ST_DIRECT, ST_BREAD, ST_HEAD, ST_TAIL, ST_BWRITE, ST_DONE };

void aio_block_begin(slot *sl)
{
    zt_aio_req *r = sl->req;
    aio_file *f = r->f;
    size_t off = sl->off, n = sl->n;
    int aligned = off % PAGE == 0 && n % PAGE == 0 && (uintptr_t)sl->ubuf % PAGE == 0;
    sl->err = ZT_OK;
    sl->registered = 0;
    sl->stage = ST_START;
    sl->op_done = 0;
    /* buffered I/O takes any range straight, unless checksums need whole pages */
    sl->bounced = !(aligned || (!sl->a->direct && !f->sums));
    /* a direct write's hashes are of the bytes written: taken first,
     * published after the write */
    if (!sl->bounced && r->write && f->sums) hash_pages(sl->hash, sl->ubuf, n);
}

static int op(slot *sl, int stage, int write, char *buf, size_t off, size_t len)
{
    sl->stage = stage;
    sl->op = (aio_op){ .write = write, .buf = buf, .off = off, .len = len,
                       .bounce = buf != sl->ubuf };
    sl->op_done = 0;
    return 1;
}

int aio_block_next(slot *sl)
{
    zt_aio_req *r = sl->req;
    aio_file *f = r->f;
    int sums = f->sums != NULL;
    size_t off = sl->off, n = sl->n;
    size_t a0 = off / PAGE * PAGE, a1 = (off + n + PAGE - 1) / PAGE * PAGE, span = a1 - a0;
    char *b = sl->bounce;
    /* does the write's last page need reading first? (not when it is the
     * first page, already read) */
    int tail = off + n != a1 && (a1 - PAGE != a0 || off == a0);
    switch (sl->stage) {
    case ST_START:
        if (!sl->bounced) return op(sl, ST_DIRECT, r->write, sl->ubuf, off, n);
        if (!r->write) return op(sl, ST_BREAD, 0, b, a0, span);
        if (off != a0) return op(sl, ST_HEAD, 0, b, a0, PAGE);
        if (tail) return op(sl, ST_TAIL, 0, b + span - PAGE, a1 - PAGE, PAGE);
        memcpy(b, sl->ubuf, n);
        return op(sl, ST_BWRITE, 1, b, a0, span);
    case ST_DIRECT:
        if (r->write && sums) memcpy(f->sums + off / PAGE, sl->hash, n / PAGE * sizeof *sl->hash);
        else if (sums) sl->err = verify(sl, f, sl->ubuf, off, n);
        break;
    case ST_BREAD:
        if (sums) sl->err = verify(sl, f, b, a0, span);
        if (!sl->err) memcpy(sl->ubuf, b + (off - a0), n);
        break;
    case ST_HEAD:
        if (sums && (sl->err = verify(sl, f, b, a0, PAGE))) break;
        if (tail) return op(sl, ST_TAIL, 0, b + span - PAGE, a1 - PAGE, PAGE);
        memcpy(b + (off - a0), sl->ubuf, n);
        return op(sl, ST_BWRITE, 1, b, a0, span);
    case ST_TAIL:
        if (sums && (sl->err = verify(sl, f, b + span - PAGE, a1 - PAGE, PAGE))) break;
        memcpy(b + (off - a0), sl->ubuf, n);
        return op(sl, ST_BWRITE, 1, b, a0, span);
    case ST_BWRITE:
        if (sums) hash_pages(f->sums + a0 / PAGE, b, span);
        break;
    default:
        break;
    }
    sl->stage = ST_DONE;
    return 0;
}

int aio_fault(zt_aio *a, int where)
{
    if (!__atomic_load_n(&a->fault_err, __ATOMIC_ACQUIRE) || a->fault_where != where) return 0;
    if (__atomic_sub_fetch(&a->fault_countdown, 1, __ATOMIC_ACQ_REL) != 0) return 0;
    return __atomic_exchange_n(&a->fault_err, 0, __ATOMIC_ACQ_REL);
}

void zt_aio_inject_fault(zt_aio *a, int where, int err, int nth)
{
    if (!a) return;
    __atomic_store_n(&a->fault_err, 0, __ATOMIC_RELEASE);
    a->fault_where = where;
    __atomic_store_n(&a->fault_countdown, (long)(nth > 0 ? nth : 1), __ATOMIC_RELEASE);
    __atomic_store_n(&a->fault_err, err, __ATOMIC_RELEASE);
}

/* ---- blocks in and out of the queue (engine lock held) ------------------------------ */

/* Mark r complete (engine lock held). */
static void complete(zt_aio *a, zt_aio_req *r)
{
    r->done = 1;
    r->f->inflight--;
    a->stats.requests++;
    if (r->err) a->stats.errors++;
    else if (r->write) a->stats.bytes_written += r->n;
    else a->stats.bytes_read += r->n;
    pthread_cond_broadcast(&a->cv);
}

static void pop_pending(zt_aio *a)
{
    zt_aio_req *r = a->pending;
    a->pending = r->next_pending;
    if (!a->pending) a->pending_tail = NULL;
    r->queued = 0;
}

/* Blocks of [off, end) cut at multiples of b. */
static size_t nblocks(size_t off, size_t end, size_t b)
{
    return end == off ? 0 : (end - 1) / b - off / b + 1;
}

/* Account the time since blocks_inflight last changed in busy_ns and
 * depth_ns (engine lock held): before every change, and for a snapshot. */
static void account_depth(zt_aio *a)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t t = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    if (a->blocks_inflight > 0 && t > a->depth_since) {
        a->stats.busy_ns += t - a->depth_since;
        a->stats.depth_ns += (t - a->depth_since) * (uint64_t)a->blocks_inflight;
    }
    a->depth_since = t;
}

/* Hand the next block to slot sl (engine lock held): 1, or 0 if none.
 * Blocks go in submission order; only the head request is partly issued. */
int aio_take_block(zt_aio *a, slot *sl)
{
    if (!a->pending) return 0;
    zt_aio_req *r = a->pending;
    size_t off = r->off + r->next;
    size_t end = (off / a->block + 1) * a->block;   /* the next block boundary */
    size_t len = end - off < r->n - r->next ? end - off : r->n - r->next;
    sl->req = r;
    sl->off = off;
    sl->n = len;
    sl->ubuf = r->buf + r->next;
    r->next += len;
    r->inflight++;
    a->unissued--;
    a->stats.blocks++;
    account_depth(a);
    if ((uint64_t)++a->blocks_inflight > a->stats.peak_inflight)
        a->stats.peak_inflight = (uint64_t)a->blocks_inflight;
    if (r->next == r->n) pop_pending(a);
    return 1;
}

/* Account slot sl's finished block (engine lock held). */
void aio_finish_block(zt_aio *a, slot *sl)
{
    zt_aio_req *r = sl->req;
    if (sl->bounced) a->stats.bounced++;
    if (sl->registered) a->stats.registered++;
    if (sl->err && !r->err) {
        r->err = sl->err;
        snprintf(r->msg, sizeof r->msg, "%s", sl->msg);
        if (r->queued) {                /* the head: issue no more of it */
            a->unissued -= nblocks(r->off + r->next, r->off + r->n, a->block);
            pop_pending(a);
        }
    }
    sl->req = NULL;
    account_depth(a);
    a->blocks_inflight--;
    r->inflight--;
    if (r->inflight == 0 && !r->queued) complete(a, r);
}

/* ---- the loop thread ------------------------------------------------------------------ */

static void on_wake(uv_async_t *h)
{
    zt_aio *a = h->data;
    a->be->on_wake(a);
}

void aio_quit(zt_aio *a)
{
    if (a->quit_sent) return;
    a->quit_sent = 1;
    uv_close((uv_handle_t *)&a->wake, NULL);
}

static void loop_main(void *arg)
{
    zt_aio *a = arg;
    uv_run(&a->loop, UV_RUN_DEFAULT);
}

/* ---- directories and ownership ------------------------------------------------------- */

static void note(zt_aio *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(zt_aio *a, const char *fmt, ...)
{
    size_t len = strlen(a->notes);
    if (len + 2 >= sizeof a->notes) return;
    if (len) { a->notes[len++] = '\n'; a->notes[len] = 0; }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->notes + len, sizeof a->notes - len, fmt, ap);
    va_end(ap);
}

static const char OWNER_MAGIC[] = "ztrain-aio owner 1\n";

/* swap.ID, or a stripe's swap.ID.S */
static int is_swap_name(const char *s)
{
    if (strncmp(s, "swap.", 5) != 0 || !s[5]) return 0;
    int dots = 0;
    for (s += 5; *s; s++) {
        if (*s == '.' && dots == 0 && s[1] && s[-1] != '.') { dots++; continue; }
        if (*s < '0' || *s > '9') return 0;
    }
    return 1;
}

/* One ztrain-aio.* directory of DIR: remove a dead run's swap files. */
static void clean_one(zt_aio *a, const char *host, const char *name)
{
    char d[PATH_MAX + 512], owner[PATH_MAX + 528];
    snprintf(d, sizeof d, "%s/%.500s", a->parent, name);
    snprintf(owner, sizeof owner, "%s/owner", d);
    int fd = open(owner, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    char buf[512] = { 0 };
    ssize_t got = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd < 0 || got < (ssize_t)strlen(OWNER_MAGIC) ||
        strncmp(buf, OWNER_MAGIC, strlen(OWNER_MAGIC)) != 0) {
        if (fd >= 0) close(fd);
        note(a, "left %s alone: it has no ztrain owner file (not made by ztrain, or a run "
             "just starting)", d);
        return;
    }
    long pid = -1;
    char ohost[256] = "";
    const char *p = strstr(buf, "pid ");
    if (p) pid = strtol(p + 4, NULL, 10);
    p = strstr(buf, "host ");
    if (p) sscanf(p + 5, "%255s", ohost);
    if (strcmp(ohost, host) != 0) {
        close(fd);
        note(a, "left %s alone: it belongs to a run on host %s (cannot tell from here "
             "whether it is alive)", d, ohost);
        return;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        note(a, "left %s alone: its run (pid %ld) is alive", d, pid);
        return;
    }
    /* The owner's lock is gone: its process died without closing. */
    DIR *dp = opendir(d);
    int removed = 0, foreign = 0;
    unsigned long long bytes = 0;
    if (dp) {
        struct dirent *e;
        while ((e = readdir(dp)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
                !strcmp(e->d_name, "owner"))
                continue;
            char fp[PATH_MAX * 2];
            snprintf(fp, sizeof fp, "%s/%s", d, e->d_name);
            struct stat st;
            if ((is_swap_name(e->d_name) || !strcmp(e->d_name, ".probe")) &&
                lstat(fp, &st) == 0 && S_ISREG(st.st_mode) && unlink(fp) == 0) {
                removed += e->d_name[0] != '.';
                bytes += (unsigned long long)st.st_blocks * 512;
            } else {
                foreign++;
            }
        }
        closedir(dp);
    }
    if (foreign) {
        note(a, "removed %d swap files (%.1f MiB) left in %s by a dead run (pid %ld); left "
             "the directory and %d file(s) ztrain did not create in it", removed,
             bytes / 1048576.0, d, pid, foreign);
    } else {
        unlink(owner);
        rmdir(d);
        note(a, "removed %d swap files (%.1f MiB) left in %s by a dead run (pid %ld)",
             removed, bytes / 1048576.0, d, pid);
    }
    close(fd);
}

static void clean_dead_runs(zt_aio *a, const char *host)
{
    DIR *dp = opendir(a->parent);
    if (!dp) return;
    struct dirent *e;
    char names[64][256];
    int n = 0;
    const char *own = strrchr(a->dir, '/') + 1;
    while ((e = readdir(dp)) != NULL && n < 64)   /* collect first: cleaning edits DIR */
        if (!strncmp(e->d_name, "ztrain-aio.", 11) && strcmp(e->d_name, own))
            snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    closedir(dp);
    for (int i = 0; i < n; i++) clean_one(a, host, names[i]);
}

/* Is O_DIRECT accepted in a->dir? A real aligned write and read, not just
 * the open: some file systems accept the flag and refuse the I/O. */
static int probe_direct(zt_aio *a, char *why, size_t n)
{
    char p[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/.probe", a->dir);
    int fd = open(p, O_CREAT | O_EXCL | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    int ok = 0;
    if (fd < 0) {
        snprintf(why, n, "%s at open", strerror(errno));
    } else {
        void *buf = NULL;
        if (posix_memalign(&buf, PAGE, PAGE) == 0) {
            memset(buf, 0x5a, PAGE);
            if (pwrite(fd, buf, PAGE, 0) != PAGE) snprintf(why, n, "%s at write", strerror(errno));
            else if (pread(fd, buf, PAGE, 0) != PAGE) snprintf(why, n, "%s at read", strerror(errno));
            else ok = 1;
            free(buf);
        } else {
            snprintf(why, n, "no memory for the probe");
        }
        close(fd);
    }
    unlink(p);
    return ok;
}

/* Check `dir` (create it if its parent exists), then make the engine's own
 * directory with its locked owner file. Fills a->parent, a->dir. */
static int make_dirs(zt_aio *a, const char *dir, const char *host)
{
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT)
            return zt_error(ZT_EINVAL, "aio: cannot use swap directory %s: %s; point "
                            "the swap directory at a writable one", dir, strerror(errno));
        /* Create the last component only: a mistyped mount point must not
         * silently put swap files on the root disk. */
        if (mkdir(dir, 0700) != 0)
            return zt_error(ZT_EINVAL, "aio: swap directory %s does not exist and cannot be "
                            "created (%s); create it (on a fast disk) or point "
                            "the swap directory elsewhere", dir, strerror(errno));
    } else if (!S_ISDIR(st.st_mode)) {
        return zt_error(ZT_EINVAL, "aio: swap directory %s is not a directory; point "
                        "the swap directory at a directory", dir);
    }
    if (!realpath(dir, a->parent))
        return zt_error(ZT_EINVAL, "aio: cannot resolve swap directory %s: %s", dir,
                        strerror(errno));
    pthread_mutex_lock(&open_lock);
    unsigned n = engine_seq++;
    pthread_mutex_unlock(&open_lock);
    int w = snprintf(a->dir, sizeof a->dir, "%s/ztrain-aio.%s.%ld.%u", a->parent, host,
                     (long)getpid(), n);
    if (w < 0 || (size_t)w >= sizeof a->dir - 32)
        return zt_error(ZT_EINVAL, "aio: swap directory path %s is too long", a->parent);
    if (mkdir(a->dir, 0700) != 0)
        return zt_error(ZT_EINVAL, "aio: swap directory %s is not writable (%s creating %s); "
                        "fix its permissions or point the swap directory at a writable "
                        "directory", a->parent, strerror(errno), a->dir);
    char owner[PATH_MAX + 16];
    snprintf(owner, sizeof owner, "%s/owner", a->dir);
    a->owner_fd = open(owner, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    int fail = a->owner_fd < 0 || flock(a->owner_fd, LOCK_EX) != 0;
    if (!fail) {
        char body[512];
        int len = snprintf(body, sizeof body, "%spid %ld\nhost %s\n", OWNER_MAGIC,
                           (long)getpid(), host);
        fail = write(a->owner_fd, body, (size_t)len) != len;
    }
    if (fail) {
        int e = errno;
        if (a->owner_fd >= 0) close(a->owner_fd);
        a->owner_fd = -1;
        unlink(owner);
        rmdir(a->dir);
        return zt_error(ZT_EIO, "aio: cannot write the owner file in %s (%s); point "
                        "the swap directory at a writable one with free space",
                        a->dir, strerror(e));
    }
    return ZT_OK;
}

/* Remove every file the engine made and its directory. */
static void remove_files(zt_aio *a)
{
    char path[PATH_MAX + 48];
    for (int i = 0; i < a->nfiles; i++)
        for (int s = 0; a->files[i] && s < a->files[i]->stripes; s++) {
            aio_stripe_path(a->files[i], s, path, sizeof path);
            unlink(path);
        }
    char owner[PATH_MAX + 16];
    snprintf(owner, sizeof owner, "%s/owner", a->dir);
    unlink(owner);
    rmdir(a->dir);
}

void zt_aio_remove_files(void)
{
    pthread_mutex_lock(&open_lock);
    for (zt_aio *a = open_engines; a; a = a->next_open) remove_files(a);
    pthread_mutex_unlock(&open_lock);
}

static void at_exit_cleanup(void) { zt_aio_remove_files(); }

static void init_once(void)
{
    static char zero[PAGE] __attribute__((aligned(64)));
    zero_page_hash = page_hash(zero);
    atexit(at_exit_cleanup);
}

/* ---- the engine ----------------------------------------------------------------------- */

/* The engine's bounce buffers (queue_depth x block_bytes): host memory
 * accounted as "other", or for ZT_AIO_UNACCOUNTED (the disk probe's
 * short-lived engines) plain page-aligned memory outside the accounting. */
static int bounce_alloc(zt_aio *a)
{
    size_t n = a->block * (size_t)a->depth;
    if (!(a->flags & ZT_AIO_UNACCOUNTED))
        return zt_mem_alloc((void **)&a->bounce, n, ZT_TIER_HOST, ZT_CAT_OTHER,
                            "aio bounce buffers (queue_depth x block_bytes)");
    void *p = NULL;
    if (posix_memalign(&p, PAGE, n)) return zt_error(ZT_ENOMEM, "zt_aio_open: no memory for %zu bytes "
                                                     "of bounce buffers", n);
    a->bounce = p;
    return ZT_OK;
}

static void bounce_free(zt_aio *a)
{
    if (a->flags & ZT_AIO_UNACCOUNTED) free(a->bounce);
    else zt_mem_free(a->bounce, a->block * (size_t)a->depth, ZT_TIER_HOST, ZT_CAT_OTHER);
    a->bounce = NULL;
}

int zt_aio_open(zt_aio **out, const char *dir, size_t block_bytes, int queue_depth, int flags)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    ZT_CHECK(out != NULL, "zt_aio_open: out is NULL");
    *out = NULL;
    ZT_CHECK(dir != NULL && dir[0], "zt_aio_open: no swap directory given");
    ZT_CHECK(strlen(dir) < PATH_MAX - 128, "zt_aio_open: swap directory path too long");
    if (block_bytes == 0) block_bytes = ZT_AIO_DEFAULT_BLOCK;
    if (queue_depth == 0) queue_depth = ZT_AIO_DEFAULT_DEPTH;
    ZT_CHECK(block_bytes % PAGE == 0 && block_bytes <= MAX_BLOCK,
             "zt_aio_open: block size %zu must be a multiple of %d bytes, at most %zu "
             "(default 1 MiB)", block_bytes, PAGE, MAX_BLOCK);
    ZT_CHECK(queue_depth >= 1 && queue_depth <= MAX_DEPTH,
             "zt_aio_open: queue depth %d must be in 1..%d (default 8)", queue_depth, MAX_DEPTH);
    ZT_CHECK((flags & ~(ZT_AIO_CHECKSUM | ZT_AIO_BUFFERED | ZT_AIO_SPARSE | ZT_AIO_URING |
                        ZT_AIO_THREADS | ZT_AIO_UNACCOUNTED)) == 0,
             "zt_aio_open: unknown flags 0x%x (known: ZT_AIO_CHECKSUM, ZT_AIO_BUFFERED, "
             "ZT_AIO_SPARSE, ZT_AIO_URING, ZT_AIO_THREADS, ZT_AIO_UNACCOUNTED)", (unsigned)flags);
    ZT_CHECK((flags & (ZT_AIO_URING | ZT_AIO_THREADS)) != (ZT_AIO_URING | ZT_AIO_THREADS),
             "zt_aio_open: flags ZT_AIO_URING and ZT_AIO_THREADS together (pick one engine, "
             "or neither for ZTRAIN_AIO_ENGINE / auto)");
    /* the engine: the flags, else the environment, else auto */
    const char *asked = NULL;       /* who chose, for the engine note */
    int want = 0;                   /* 0 auto, 1 io_uring, 2 threads */
    if (flags & ZT_AIO_URING) { want = 1; asked = "asked for"; }
    else if (flags & ZT_AIO_THREADS) { want = 2; asked = "asked for"; }
    else {
        const char *env = getenv("ZTRAIN_AIO_ENGINE");
        if (env && *env && strcmp(env, "auto") != 0) {
            if (!strcmp(env, "uring") || !strcmp(env, "io_uring")) want = 1;
            else if (!strcmp(env, "threads")) want = 2;
            else return zt_error(ZT_EINVAL, "zt_aio_open: ZTRAIN_AIO_ENGINE=%.100s is not an "
                                 "engine: use auto, uring or threads (or unset it)", env);
            asked = "ZTRAIN_AIO_ENGINE";
        }
    }
    pthread_once(&once, init_once);

    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    for (char *c = host; *c; c++) if (*c == '/' || *c == '.') *c = '_';

    zt_aio *a = calloc(1, sizeof *a);
    slot *slots = calloc((size_t)queue_depth, sizeof *slots);
    if (!a || !slots) {
        free(a); free(slots);
        return zt_error(ZT_ENOMEM, "zt_aio_open: out of memory");
    }
    a->block = block_bytes;
    a->depth = queue_depth;
    a->stripes = 1;
    a->flags = flags;
    a->owner_fd = -1;
    a->slots = slots;
    int rc = make_dirs(a, dir, host);
    if (rc) { free(slots); free(a); return rc; }
    clean_dead_runs(a, host);

    char why[256] = "";
    if (flags & ZT_AIO_BUFFERED) {
        snprintf(a->mode, sizeof a->mode, "buffered (ZT_AIO_BUFFERED asked for it)");
    } else if (probe_direct(a, why, sizeof why)) {
        a->direct = 1;
        snprintf(a->mode, sizeof a->mode, "O_DIRECT");
    } else {
        snprintf(a->mode, sizeof a->mode, "buffered: %s refuses O_DIRECT (%s: ramfs, tmpfs "
                 "before Linux 6.6, some FUSE or overlay mounts); I/O goes through the page "
                 "cache", a->parent, why);
    }
    rc = bounce_alloc(a);
    if (rc) { remove_files(a); close(a->owner_fd); free(slots); free(a); return rc; }
    a->stats.host_bytes = block_bytes * (size_t)queue_depth;
    for (int i = 0; i < queue_depth; i++) {
        slots[i].a = a;
        slots[i].index = i;
        slots[i].bounce = a->bounce + (size_t)i * block_bytes;
        slots[i].work.data = &slots[i];
        /* checksum mode: a direct write's page hashes (4 bytes per 4 KiB) */
        if ((flags & ZT_AIO_CHECKSUM) &&
            !(slots[i].hash = malloc(block_bytes / PAGE * sizeof *slots[i].hash))) rc = ZT_ENOMEM;
    }
    if (rc) {
        bounce_free(a);
        remove_files(a); close(a->owner_fd);
        for (int i = 0; i < queue_depth; i++) free(slots[i].hash);
        free(slots); free(a);
        return zt_error(ZT_ENOMEM, "zt_aio_open: out of memory for checksums");
    }
    pthread_mutex_init(&a->lock, NULL);
    pthread_cond_init(&a->cv, NULL);
    int uvrc = uv_loop_init(&a->loop);
    if (uvrc == 0) {
        uvrc = uv_async_init(&a->loop, &a->wake, on_wake);
        a->wake.data = a;
        if (uvrc != 0) uv_loop_close(&a->loop);
    }
    if (uvrc != 0) {
        bounce_free(a);
        remove_files(a);
        close(a->owner_fd);
        pthread_cond_destroy(&a->cv);
        pthread_mutex_destroy(&a->lock);
        free(slots); free(a);
        return zt_error(ZT_ENOMEM, "zt_aio_open: cannot start the aio loop (%s)",
                        uv_strerror(uvrc));
    }

    /* The backend: io_uring unless the threads were asked for; the thread
     * pool if io_uring was not asked for by name and cannot start. */
    const aio_backend *uring = &aio_uring_backend;    /* NULL: built without liburing */
    char uwhy[300] = "";
    rc = ZT_EINVAL;
    if (want != 2) {
        if (!uring) {
            snprintf(uwhy, sizeof uwhy, "this build has no io_uring (liburing was not found "
                     "when it was compiled: make deps, then rebuild)");
        } else {
            a->be = uring;
            rc = uring->init(a, uwhy, sizeof uwhy);
        }
        if (rc == ZT_OK)
            snprintf(a->engine_note, sizeof a->engine_note, "io_uring (%s)%s",
                     asked ? (want == 1 && asked[0] == 'Z' ? "ZTRAIN_AIO_ENGINE=uring"
                                                           : "asked for") : "auto", a->be_note);
    }
    char twhy[300] = "";
    if (rc != ZT_OK && want != 1) {
        a->be = &aio_threads_backend;
        rc = aio_threads_backend.init(a, twhy, sizeof twhy);
        if (rc == ZT_OK && want == 2)
            snprintf(a->engine_note, sizeof a->engine_note, "threads (%s)",
                     asked[0] == 'Z' ? "ZTRAIN_AIO_ENGINE=threads" : "asked for");
        else if (rc == ZT_OK)
            snprintf(a->engine_note, sizeof a->engine_note, "threads: io_uring unavailable: "
                     "%.300s", uwhy);
    }
    if (rc == ZT_OK) {
        uvrc = uv_thread_create(&a->thread, loop_main, a);
        if (uvrc != 0) {
            a->be->fini(a);
            snprintf(twhy, sizeof twhy, "cannot start the aio loop thread (%s)", uv_strerror(uvrc));
            rc = ZT_ENOMEM;
        }
    }
    if (rc != ZT_OK) {
        uv_close((uv_handle_t *)&a->wake, NULL);
        uv_run(&a->loop, UV_RUN_DEFAULT);
        uv_loop_close(&a->loop);
        bounce_free(a);
        remove_files(a);
        close(a->owner_fd);
        pthread_cond_destroy(&a->cv);
        pthread_mutex_destroy(&a->lock);
        for (int i = 0; i < queue_depth; i++) free(slots[i].hash);
        free(slots); free(a);
        if (want == 1)
            return zt_error(ZT_EINVAL, "zt_aio_open: the io_uring engine was asked for (%s) but "
                            "%s; use the thread pool (ZTRAIN_AIO_ENGINE=threads, or "
                            "ZT_AIO_THREADS; auto picks it by itself)",
                            asked[0] == 'Z' ? "ZTRAIN_AIO_ENGINE=uring" : "ZT_AIO_URING", uwhy);
        return zt_error(rc, "zt_aio_open: %s", twhy);
    }
    pthread_mutex_lock(&open_lock);
    a->next_open = open_engines;
    open_engines = a;
    pthread_mutex_unlock(&open_lock);
    *out = a;
    return ZT_OK;
}

/* Close and remove f's files (those opened: fd >= 0). */
static void file_unlink(aio_file *f)
{
    char path[PATH_MAX + 48];
    for (int s = 0; s < f->stripes; s++) {
        if (f->fd[s] < 0) continue;
        close(f->fd[s]);
        f->fd[s] = -1;
        aio_stripe_path(f, s, path, sizeof path);
        unlink(path);
    }
}

static void file_destroy(zt_aio *a, aio_file *f)
{
    file_unlink(f);
    if (f->sums) zt_mem_free(f->sums, f->sums_bytes, ZT_TIER_HOST, ZT_CAT_OTHER);
    (void)a;
    free(f);
}

void zt_aio_close(zt_aio *a)
{
    if (!a) return;
    pthread_mutex_lock(&open_lock);
    for (zt_aio **p = &open_engines; *p; p = &(*p)->next_open)
        if (*p == a) { *p = a->next_open; break; }
    pthread_mutex_unlock(&open_lock);

    pthread_mutex_lock(&a->lock);
    a->stopping = 1;
    pthread_mutex_unlock(&a->lock);
    uv_async_send(&a->wake);    /* the loop drains its work, then closes the handle */
    uv_thread_join(&a->thread);
    uv_loop_close(&a->loop);
    a->be->fini(a);

    while (a->live) {           /* requests never waited: their handles die here */
        zt_aio_req *r = a->live;
        a->live = r->next_live;
        free(r);
    }
    for (int i = 0; i < a->nfiles; i++)
        if (a->files[i]) file_destroy(a, a->files[i]);
    char owner[PATH_MAX + 16];
    snprintf(owner, sizeof owner, "%s/owner", a->dir);
    unlink(owner);
    rmdir(a->dir);
    close(a->owner_fd);
    bounce_free(a);
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->lock);
    free(a->files);
    for (int i = 0; i < a->depth; i++) free(a->slots[i].hash);
    free(a->slots);
    free(a);
}

const char *zt_aio_mode(const zt_aio *a) { return a ? a->mode : ""; }
const char *zt_aio_dir(const zt_aio *a) { return a ? a->dir : ""; }
const char *zt_aio_notes(const zt_aio *a) { return a ? a->notes : ""; }
size_t zt_aio_block_bytes(const zt_aio *a) { return a ? a->block : 0; }
int zt_aio_queue_depth(const zt_aio *a) { return a ? a->depth : 0; }
int zt_aio_stripes(const zt_aio *a) { return a ? a->stripes : 0; }

int zt_aio_set_stripes(zt_aio *a, int n)
{
    ZT_CHECK(a != NULL, "zt_aio_set_stripes: engine is NULL");
    ZT_CHECK(n >= 1 && n <= ZT_AIO_MAX_STRIPES,
             "zt_aio_set_stripes: %d files a storage is out of range (1..%d)", n, ZT_AIO_MAX_STRIPES);
    pthread_mutex_lock(&a->lock);
    a->stripes = n;
    pthread_mutex_unlock(&a->lock);
    return ZT_OK;
}
int zt_aio_flags(const zt_aio *a) { return a ? a->flags : 0; }
int zt_aio_direct(const zt_aio *a) { return a ? a->direct : 0; }
const char *zt_aio_engine(const zt_aio *a) { return a && a->be ? a->be->name : ""; }
const char *zt_aio_engine_note(const zt_aio *a) { return a ? a->engine_note : ""; }

int zt_aio_get_stats(zt_aio *a, zt_aio_stats *out)
{
    ZT_CHECK(a != NULL && out != NULL, "zt_aio_get_stats: engine or out is NULL");
    pthread_mutex_lock(&a->lock);
    account_depth(a);
    *out = a->stats;
    pthread_mutex_unlock(&a->lock);
    return ZT_OK;
}

/* ---- files ------------------------------------------------------------------------------ */

/* Make stripe s of f (f->path, or f->path.S) and reserve its bytes:
 * ZT_OK, or an error with its message in msg. */
static int stripe_open(zt_aio *a, aio_file *f, int s, char *msg, size_t nmsg)
{
    char path[PATH_MAX + 48];
    aio_stripe_path(f, s, path, sizeof path);
    size_t bytes = f->stripes > 1 ? stripe_bytes(f->reserved, a->block, f->stripes, s) : f->reserved;
    f->fd[s] = open(path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | (a->direct ? O_DIRECT : 0), 0600);
    if (f->fd[s] < 0) return io_error(msg, nmsg, 1, path, 0, bytes, errno, a->parent);
    if (bytes == 0) return ZT_OK;
    if (!(a->flags & ZT_AIO_SPARSE)) {
        /* Reserve the space now: a full disk is an error at allocation, not
         * in the middle of a step. Unwritten extents read as zeros. */
        int e = fallocate(f->fd[s], 0, 0, (off_t)bytes) == 0 ? 0 : errno;
        if (e == EOPNOTSUPP || e == ENOSYS)   /* no fallocate (ramfs): a sparse file */
            e = ftruncate(f->fd[s], (off_t)bytes) == 0 ? 0 : errno;
        if (e) return io_error(msg, nmsg, 1, path, 0, bytes, e, a->parent);
    } else if (ftruncate(f->fd[s], (off_t)bytes) != 0) {
        return io_error(msg, nmsg, 1, path, 0, bytes, errno, a->parent);
    }
    return ZT_OK;
}

int zt_aio_file_new(zt_aio *a, size_t nbytes, int *id)
{
    ZT_CHECK(a != NULL && id != NULL, "zt_aio_file_new: engine or id is NULL");
    *id = -1;
    ZT_CHECK(nbytes >= 1 && nbytes <= (size_t)INT64_MAX - PAGE,
             "zt_aio_file_new: size %zu out of range (at least 1 byte)", nbytes);
    size_t reserved = (nbytes + PAGE - 1) / PAGE * PAGE;
    aio_file *f = calloc(1, sizeof *f);
    if (!f) return zt_error(ZT_ENOMEM, "zt_aio_file_new: out of memory");
    if (a->flags & ZT_AIO_CHECKSUM) {
        f->sums_bytes = reserved / PAGE * sizeof(uint32_t);
        int rc = zt_mem_alloc((void **)&f->sums, f->sums_bytes, ZT_TIER_HOST, ZT_CAT_OTHER,
                              "aio page checksums (4 bytes per 4 KiB of swap file)");
        if (rc) { free(f); return rc; }
        for (size_t i = 0; i < reserved / PAGE; i++) f->sums[i] = zero_page_hash;
    }
    pthread_mutex_lock(&a->lock);
    f->id = (int)a->seq++;
    pthread_mutex_unlock(&a->lock);
    snprintf(f->path, sizeof f->path, "%s/swap.%d", a->dir, f->id);
    f->size = nbytes;
    f->reserved = reserved;
    pthread_mutex_lock(&a->lock);
    f->stripes = a->stripes;
    pthread_mutex_unlock(&a->lock);
    for (int s = 0; s < ZT_AIO_MAX_STRIPES; s++) f->fd[s] = -1;
    int rc = ZT_OK;
    char msg[2048];
    for (int s = 0; s < f->stripes && rc == ZT_OK; s++)
        rc = stripe_open(a, f, s, msg, sizeof msg);
    if (rc) {
        file_unlink(f);
        if (f->sums) zt_mem_free(f->sums, f->sums_bytes, ZT_TIER_HOST, ZT_CAT_OTHER);
        free(f);
        return zt_error(rc, "%s (reserving a %zu-byte swap file)", msg, reserved);
    }
    pthread_mutex_lock(&a->lock);
    if (a->nfiles == a->cap) {
        int cap = a->cap ? a->cap * 2 : 16;
        aio_file **nf = realloc(a->files, (size_t)cap * sizeof *nf);
        if (!nf) {
            pthread_mutex_unlock(&a->lock);
            file_destroy(a, f);
            return zt_error(ZT_ENOMEM, "zt_aio_file_new: out of memory");
        }
        a->files = nf;
        a->cap = cap;
    }
    /* Kept sorted by id (ids are never reused; two threads may get here out
     * of order). */
    int at = a->nfiles;
    while (at > 0 && a->files[at - 1]->id > f->id) at--;
    memmove(a->files + at + 1, a->files + at, (size_t)(a->nfiles - at) * sizeof *a->files);
    a->files[at] = f;
    a->nfiles++;
    a->stats.host_bytes += f->sums_bytes;
    pthread_mutex_unlock(&a->lock);
    *id = f->id;
    return ZT_OK;
}

/* The file with id (engine lock held), or NULL: a binary search of the
 * table, sorted by id. */
static aio_file *find_file(zt_aio *a, int id, int *index)
{
    int lo = 0, hi = a->nfiles - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        aio_file *f = a->files[mid];
        if (f->id == id) { if (index) *index = mid; return f; }
        if (f->id < id) lo = mid + 1; else hi = mid - 1;
    }
    return NULL;
}

int zt_aio_file_free(zt_aio *a, int id)
{
    ZT_CHECK(a != NULL, "zt_aio_file_free: engine is NULL");
    pthread_mutex_lock(&a->lock);
    int at;
    aio_file *f = find_file(a, id, &at);
    if (!f) {
        pthread_mutex_unlock(&a->lock);
        return zt_error(ZT_EINVAL, "zt_aio_file_free: no file %d in %s (freed already?)", id,
                        a->dir);
    }
    if (f->inflight) {
        int n = f->inflight;
        pthread_mutex_unlock(&a->lock);
        return zt_error(ZT_ESTATE, "zt_aio_file_free: %s has %d request(s) in flight; wait "
                        "for them first", f->path, n);
    }
    memmove(a->files + at, a->files + at + 1, (size_t)(a->nfiles - at - 1) * sizeof *a->files);
    a->nfiles--;
    a->stats.host_bytes -= f->sums_bytes;
    pthread_mutex_unlock(&a->lock);
    file_destroy(a, f);
    return ZT_OK;
}

const char *zt_aio_file_path(zt_aio *a, int id)
{
    if (!a) return NULL;
    pthread_mutex_lock(&a->lock);
    aio_file *f = find_file(a, id, NULL);
    pthread_mutex_unlock(&a->lock);
    return f ? f->path : NULL;
}

/* ---- requests ----------------------------------------------------------------------------- */

static int submit(const char *fn, zt_aio *a, int write, int file, size_t offset, char *buf,
                  size_t nbytes, zt_aio_req **req)
{
    if (req) *req = NULL;
    ZT_CHECK(a != NULL, "%s: engine is NULL (closed?)", fn);
    ZT_CHECK(buf != NULL || nbytes == 0, "%s: buffer is NULL", fn);
    zt_aio_req *r = calloc(1, sizeof *r);
    if (!r) return zt_error(ZT_ENOMEM, "%s: out of memory for a request", fn);
    pthread_mutex_lock(&a->lock);
    aio_file *f = find_file(a, file, NULL);
    const char *bad = NULL;
    char why[PATH_MAX + 256];
    if (a->stopping) bad = "the engine is closing";
    else if (!f) bad = "no such file (freed, or from another engine?)";
    else if (offset > f->size || nbytes > f->size - offset) {
        snprintf(why, sizeof why, "bytes [%zu, %zu) are outside %s (%zu bytes)", offset,
                 offset + nbytes, f->path, f->size);
        bad = why;
    }
    if (bad) {
        pthread_mutex_unlock(&a->lock);
        free(r);
        return zt_error(ZT_EINVAL, "%s: file %d: %s", fn, file, bad);
    }
    *r = (zt_aio_req){ .a = a, .f = f, .write = write, .buf = buf, .off = offset, .n = nbytes };
    f->inflight++;
    r->next_live = a->live;
    if (a->live) a->live->prev_live = r;
    a->live = r;
    if (nbytes == 0) {
        complete(a, r);
    } else {
        r->queued = 1;
        if (a->pending_tail) a->pending_tail->next_pending = r; else a->pending = r;
        a->pending_tail = r;
        a->unissued += nblocks(offset, offset + nbytes, a->block);
    }
    pthread_mutex_unlock(&a->lock);
    if (nbytes) uv_async_send(&a->wake);
    if (req) { *req = r; return ZT_OK; }
    return zt_aio_wait(r);
}

int zt_aio_write(zt_aio *a, int file, size_t offset, const void *buf, size_t nbytes,
                 zt_aio_req **req)
{
    return submit("zt_aio_write", a, 1, file, offset, (char *)buf, nbytes, req);
}

int zt_aio_read(zt_aio *a, int file, size_t offset, void *buf, size_t nbytes, zt_aio_req **req)
{
    return submit("zt_aio_read", a, 0, file, offset, buf, nbytes, req);
}

/* ZT_AIO_REG_FRESH: drop the whole pages of [buf, buf+n) if they hold only
 * zeros and are plain memory (not a device's pinned host memory), so the
 * registration's pinning faults them in anew. */
static void drop_fresh_pages(char *buf, size_t n)
{
    const zt_exec_ops *x = zt_exec();
    if (x && x->is_pinned && x->is_pinned(buf)) return;
    uintptr_t lo = ((uintptr_t)buf + PAGE - 1) / PAGE * PAGE;
    uintptr_t hi = ((uintptr_t)buf + n) / PAGE * PAGE;
    if (hi <= lo) return;
    const uint64_t *w = (const uint64_t *)lo;
    uint64_t any = 0;
    for (size_t i = 0; i < (hi - lo) / 8; i++) any |= w[i];
    if (!any) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

int zt_aio_register(zt_aio *a, void *buf, size_t nbytes, int flags, int *handle)
{
    ZT_CHECK(a != NULL && handle != NULL, "zt_aio_register: engine or handle is NULL");
    *handle = -1;
    ZT_CHECK(buf != NULL && nbytes >= 1 && nbytes <= ((size_t)1 << 30),
             "zt_aio_register: region of %zu bytes at %p: give 1 byte..1 GiB of host memory",
             nbytes, buf);
    ZT_CHECK((flags & ~ZT_AIO_REG_FRESH) == 0,
             "zt_aio_register: unknown flags 0x%x (known: ZT_AIO_REG_FRESH)", (unsigned)flags);
    if ((flags & ZT_AIO_REG_FRESH) && a->be->reg) drop_fresh_pages(buf, nbytes);
    pthread_mutex_lock(&a->lock);
    int at = -1;
    for (int i = 0; i < ZT_AIO_MAX_REGISTERED && at < 0; i++)
        if (!a->regions[i].buf) at = i;
    if (at < 0) {
        pthread_mutex_unlock(&a->lock);
        return zt_error(ZT_ELIMIT, "zt_aio_register: %d regions registered already (the most); "
                        "unregister one first (requests on unregistered memory still work)",
                        ZT_AIO_MAX_REGISTERED);
    }
    char why[300] = "";
    int rc = a->be->reg ? a->be->reg(a, at, buf, nbytes, why, sizeof why) : ZT_OK;
    if (rc == ZT_OK) a->regions[at] = (aio_region){ buf, nbytes };
    pthread_mutex_unlock(&a->lock);
    if (rc) return zt_error(rc, "zt_aio_register: %zu bytes at %p: %s (requests on it still "
                            "work, unregistered)", nbytes, buf, why);
    *handle = at;
    return ZT_OK;
}

int zt_aio_unregister(zt_aio *a, int handle)
{
    ZT_CHECK(a != NULL, "zt_aio_unregister: engine is NULL");
    ZT_CHECK(handle >= 0 && handle < ZT_AIO_MAX_REGISTERED,
             "zt_aio_unregister: handle %d is not one of zt_aio_register's", handle);
    pthread_mutex_lock(&a->lock);
    if (!a->regions[handle].buf) {
        pthread_mutex_unlock(&a->lock);
        return zt_error(ZT_EINVAL, "zt_aio_unregister: handle %d is not registered (twice?)", handle);
    }
    if (a->be->reg) a->be->reg(a, handle, NULL, 0, NULL, 0);
    a->regions[handle] = (aio_region){ NULL, 0 };
    pthread_mutex_unlock(&a->lock);
    return ZT_OK;
}

int zt_aio_test(zt_aio_req *r, int *done)
{
    ZT_CHECK(r != NULL && done != NULL, "zt_aio_test: request or done is NULL (waited already?)");
    pthread_mutex_lock(&r->a->lock);
    *done = r->done;
    pthread_mutex_unlock(&r->a->lock);
    return ZT_OK;
}

int zt_aio_wait(zt_aio_req *r)
{
    ZT_CHECK(r != NULL, "zt_aio_wait: request is NULL (waited already?)");
    zt_aio *a = r->a;
    pthread_mutex_lock(&a->lock);
    while (!r->done) pthread_cond_wait(&a->cv, &a->lock);
    if (r->prev_live) r->prev_live->next_live = r->next_live; else a->live = r->next_live;
    if (r->next_live) r->next_live->prev_live = r->prev_live;
    pthread_mutex_unlock(&a->lock);
    int err = r->err;
    if (err) zt_error(err, "%s", r->msg);
    free(r);
    return err;
}

/* ---- the nvme tier --------------------------------------------------------------------------- */

/* One engine serves the tier; each nvme storage is one swap file. */
static pthread_mutex_t nvme_lock = PTHREAD_MUTEX_INITIALIZER;
static zt_aio *nvme;
static int nvme_regions;

typedef struct nvme_region {
    zt_aio *a;
    int file;
} nvme_region;

int zt_nvme_configure(const char *dir, size_t block_bytes, int queue_depth, int flags)
{
    pthread_mutex_lock(&nvme_lock);
    if (nvme_regions) {
        int n = nvme_regions;
        pthread_mutex_unlock(&nvme_lock);
        return zt_error(ZT_ESTATE, "zt_nvme_configure: %d nvme tensor storage(s) still exist "
                        "in %s; free them before moving the nvme tier", n, zt_aio_dir(nvme));
    }
    zt_aio *a = NULL;
    int rc = zt_aio_open(&a, dir, block_bytes, queue_depth, flags);
    if (rc) { pthread_mutex_unlock(&nvme_lock); return rc; }
    zt_aio *old = nvme;
    nvme = a;
    pthread_mutex_unlock(&nvme_lock);
    zt_aio_close(old);
    return ZT_OK;
}

zt_aio *zt_nvme_engine(void)
{
    pthread_mutex_lock(&nvme_lock);
    zt_aio *a = nvme;
    pthread_mutex_unlock(&nvme_lock);
    return a;
}

int zt_nvme_shutdown(void)
{
    pthread_mutex_lock(&nvme_lock);
    if (nvme_regions) {
        int n = nvme_regions;
        pthread_mutex_unlock(&nvme_lock);
        return zt_error(ZT_ESTATE, "zt_nvme_shutdown: %d nvme tensor storage(s) still exist; "
                        "free them first", n);
    }
    zt_aio *a = nvme;
    nvme = NULL;
    pthread_mutex_unlock(&nvme_lock);
    zt_aio_close(a);
    return ZT_OK;
}

int zt_nvme_alloc(void **out, size_t nbytes)
{
    pthread_mutex_lock(&nvme_lock);
    zt_aio *a = nvme;
    if (!a) {
        pthread_mutex_unlock(&nvme_lock);
        return zt_error(ZT_EINVAL, "the nvme tier has no allocator until it is configured "
                        "with a swap directory: call zt_nvme_configure(dir, ...) first (Lua: "
                        "aio.configure{path = ...}), or place the "
                        "tensor on host or device");
    }
    nvme_region *g = malloc(sizeof *g);
    int rc = g ? zt_aio_file_new(a, nbytes ? nbytes : 1, &g->file)
               : zt_error(ZT_ENOMEM, "out of memory for an nvme region");
    if (rc == ZT_OK) {
        g->a = a;
        nvme_regions++;
        *out = g;
    } else {
        free(g);
    }
    pthread_mutex_unlock(&nvme_lock);
    return rc;
}

void zt_nvme_free(void *p)
{
    nvme_region *g = p;
    zt_aio_file_free(g->a, g->file);   /* cannot fail: copies retain their tensors */
    pthread_mutex_lock(&nvme_lock);
    nvme_regions--;
    pthread_mutex_unlock(&nvme_lock);
    free(g);
}

int zt_nvme_submit(int write, const zt_tensor *t, void *buf, size_t nbytes, zt_aio_req **req)
{
    nvme_region *g = t->storage->data;
    size_t off = (size_t)t->offset * zt_dtype_size(t->dtype);
    return write ? zt_aio_write(g->a, g->file, off, buf, nbytes, req)
                 : zt_aio_read(g->a, g->file, off, buf, nbytes, req);
}

int zt_nvme_rw(int write, const zt_tensor *t, void *buf, size_t nbytes)
{
    return zt_nvme_submit(write, t, buf, nbytes, NULL);
}

const char *zt_nvme_path(const zt_tensor *t, size_t *offset)
{
    if (!t || t->storage->tier != ZT_TIER_NVME) return NULL;
    nvme_region *g = t->storage->data;
    if (offset) *offset = (size_t)t->offset * zt_dtype_size(t->dtype);
    return zt_aio_file_path(g->a, g->file);
}
