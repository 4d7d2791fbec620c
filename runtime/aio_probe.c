/*
 * aio_probe.c -- a short probe of a swap directory's disk: which queue
 * depth and block size the aio engine moves bytes fastest with there
 * (contracts in zt_aio.h, zt_aio_probe). The nvme tier takes its defaults
 * from it where the recipe leaves offload.queue_depth / offload.block_size
 * to "auto"; build/bench_aio prints it beside its sweep.
 *
 * Each candidate (depth, block) opens an engine of its own in the
 * directory (the engine that will run: io_uring or the thread pool, as
 * flags choose), writes a scratch file of PROBE_BYTES sequentially and reads
 * it back, every request depth x block bytes from one registered buffer
 * queued at once (so depth blocks stay in flight, as in bench_aio). Rounds
 * visit the candidates in rotated order while the time lasts (at least 2,
 * at most 4, stopping after about 1.5 s); a candidate's time is its median
 * write plus median read (the optimizer step moves as many bytes each way);
 * the pick is the fastest, or a smaller depth x block within 5% of it.
 * Then, at the pick's depth and block, storages striped over 1, 2 and 4
 * files (zt_aio_set_stripes), as many rounds in rotated order: the pick is
 * the fewest files within 10% of the fastest (more files must earn it past
 * a virtual disk's swings from pass to pass).
 * The probe's engines keep their bounce buffers (up to 32 MiB) outside the
 * memory accounting (ZT_AIO_UNACCOUNTED): they are gone before the run's
 * own engine opens, and a run's host peak stays what its plan predicts.
 *
 * The pick is cached per device and engine: CACHE_DIR/aio-probe.MAJ-MIN.ENGINE
 * (st_dev of the directory), a few "key value" lines; a later probe of a
 * directory on the same device reads it back without measuring. Ranks of
 * one host probing at once take an flock on CACHE_DIR/aio-probe.MAJ-MIN.lock,
 * so one measures and the others read its result.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include "internal.h"

enum { NCAND = 5, MIN_ROUNDS = 2, MAX_ROUNDS = 4, NSTRIPE = 3 };
static const int stripe_cand[NSTRIPE] = { 1, 2, 4 };
#define PROBE_BYTES ((size_t)64 << 20)
#define PROBE_SECONDS 1.5

static const struct { int depth; size_t block; } cand[NCAND] = {
    { 8, 1u << 20 }, { 16, 1u << 20 }, { 32, 1u << 20 }, { 4, 4u << 20 }, { 8, 4u << 20 },
};

static int by_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, by_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Seconds of one sequential pass over the file, depth x block a request. */
static int pass(zt_aio *a, int f, int write, char *buf, size_t chunk, double *secs)
{
    size_t n = (PROBE_BYTES + chunk - 1) / chunk;   /* chunk >= 4 MiB: at most 16 */
    zt_aio_req *reqs[64];
    if (n > 64) n = 64;
    double t0 = zt_now();
    int rc = ZT_OK;
    size_t issued = 0;
    for (; issued < n; issued++) {
        size_t off = issued * chunk, len = PROBE_BYTES - off < chunk ? PROBE_BYTES - off : chunk;
        rc = write ? zt_aio_write(a, f, off, buf, len, &reqs[issued])
                   : zt_aio_read(a, f, off, buf, len, &reqs[issued]);
        if (rc) break;
    }
    for (size_t i = 0; i < issued; i++) {
        int r = zt_aio_wait(reqs[i]);
        if (r && !rc) rc = r;
    }
    *secs = zt_now() - t0;
    return rc;
}

/* One round of candidate c over `stripes` files: its write and read seconds. */
static int measure(const char *dir, int flags, int c, int stripes, char *buf, double *w, double *r,
                   char *engine, size_t nengine)
{
    zt_aio *a = NULL;
    int rc = zt_aio_open(&a, dir, cand[c].block, cand[c].depth, flags | ZT_AIO_UNACCOUNTED);
    if (!rc) rc = zt_aio_set_stripes(a, stripes);
    if (rc) { zt_aio_close(a); return rc; }
    snprintf(engine, nengine, "%s", zt_aio_engine(a));
    size_t chunk = (size_t)cand[c].depth * cand[c].block;
    int h = -1, f = -1;
    if (zt_aio_register(a, buf, chunk, 0, &h) != ZT_OK) h = -1;   /* works unregistered too */
    rc = zt_aio_file_new(a, PROBE_BYTES, &f);
    if (!rc) rc = pass(a, f, 1, buf, chunk, w);
    if (!rc) rc = pass(a, f, 0, buf, chunk, r);
    if (h >= 0) zt_aio_unregister(a, h);
    zt_aio_close(a);                    /* removes the scratch file */
    return rc;
}

/* The block device's name for st_dev d ("vda", "nvme0n1p2"), or "MAJ:MIN". */
static void device_name(dev_t d, char *out, size_t n)
{
    char link[128], target[PATH_MAX];
    snprintf(link, sizeof link, "/sys/dev/block/%u:%u", major(d), minor(d));
    ssize_t k = readlink(link, target, sizeof target - 1);
    if (k > 0) {
        target[k] = 0;
        const char *b = strrchr(target, '/');
        snprintf(out, n, "%.60s", b ? b + 1 : target);
    } else {
        snprintf(out, n, "%u:%u", major(d), minor(d));
    }
}

static int read_cache(const char *path, zt_aio_probe_result *res)
{
    FILE *fp = fopen(path, "r");
    if (!fp) return 0;
    char key[64], val[256];
    int have = 0;                       /* a cache without stripes (older): measured again */
    while (fscanf(fp, "%63s %255s", key, val) == 2) {
        if (!strcmp(key, "queue_depth")) { res->queue_depth = atoi(val); have |= 1; }
        else if (!strcmp(key, "block_bytes")) { res->block_bytes = strtoull(val, NULL, 10); have |= 2; }
        else if (!strcmp(key, "stripes")) { res->stripes = atoi(val); have |= 4; }
        else if (!strcmp(key, "write_gbs")) res->write_gbs = strtod(val, NULL);
        else if (!strcmp(key, "read_gbs")) res->read_gbs = strtod(val, NULL);
        else if (!strcmp(key, "default_write_gbs")) res->default_write_gbs = strtod(val, NULL);
        else if (!strcmp(key, "default_read_gbs")) res->default_read_gbs = strtod(val, NULL);
    }
    fclose(fp);
    return have == 7 && res->stripes >= 1 && res->stripes <= ZT_AIO_MAX_STRIPES && res->queue_depth >= 1 && res->queue_depth <= 256 && res->block_bytes >= ZT_AIO_PAGE &&
           res->block_bytes % ZT_AIO_PAGE == 0 && res->block_bytes <= ((size_t)256 << 20);
}

static void write_cache(const char *path, const zt_aio_probe_result *res)
{
    char tmp[PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *fp = fopen(tmp, "w");
    if (!fp) return;                    /* a cache that cannot be written: probe again next time */
    fprintf(fp, "device %s\nengine %s\nqueue_depth %d\nblock_bytes %zu\nstripes %d\nwrite_gbs %.3f\n"
                "read_gbs %.3f\ndefault_write_gbs %.3f\ndefault_read_gbs %.3f\n",
            res->device, res->engine, res->queue_depth, res->block_bytes, res->stripes, res->write_gbs,
            res->read_gbs, res->default_write_gbs, res->default_read_gbs);
    if (fclose(fp) == 0) rename(tmp, path); else unlink(tmp);
}

/* At candidate pick's depth and block: 1, 2 and 4 files a storage, rounds
 * rounds in rotated order; res->stripes the fewest within 10% of the
 * fastest (median write + read), res->write_gbs/read_gbs its figures. */
static int probe_stripes(const char *dir, int flags, int pick, int rounds, char *buf, zt_aio_probe_result *res)
{
    double w[NSTRIPE][MAX_ROUNDS], r[NSTRIPE][MAX_ROUNDS], t[NSTRIPE];
    for (int round = 0; round < rounds; round++)
        for (int k = 0; k < NSTRIPE; k++) {
            int c = (k + round) % NSTRIPE;
            int rc = measure(dir, flags, pick, stripe_cand[c], buf, &w[c][round], &r[c][round], res->engine,
                             sizeof res->engine);
            if (rc) return rc;
        }
    int best = 0;
    for (int c = 0; c < NSTRIPE; c++) {
        double mw = median(w[c], rounds), mr = median(r[c], rounds);
        t[c] = mw + mr;
        res->stripe_n[c] = stripe_cand[c];
        res->stripe_write_gbs[c] = (double)PROBE_BYTES / mw / 1e9;
        res->stripe_read_gbs[c] = (double)PROBE_BYTES / mr / 1e9;
        if (t[c] < t[best]) best = c;
    }
    int pick_s = best;
    for (int c = NSTRIPE - 1; c >= 0; c--)   /* fewer files within 10% of the fastest */
        if (t[c] <= 1.10 * t[best] && stripe_cand[c] < stripe_cand[pick_s]) pick_s = c;
    res->stripes = stripe_cand[pick_s];
    res->write_gbs = res->stripe_write_gbs[pick_s];
    res->read_gbs = res->stripe_read_gbs[pick_s];
    return ZT_OK;
}

/* Measure every candidate, fill res with the pick. */
static int run_probe(const char *dir, int flags, zt_aio_probe_result *res)
{
    double w[NCAND][MAX_ROUNDS], r[NCAND][MAX_ROUNDS];
    size_t most = 0;
    for (int c = 0; c < NCAND; c++)
        if ((size_t)cand[c].depth * cand[c].block > most) most = (size_t)cand[c].depth * cand[c].block;
    char *buf = mmap(NULL, most, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return zt_error(ZT_ENOMEM, "zt_aio_probe: no memory for a %zu-byte buffer", most);
    double t0 = zt_now();
    int rounds = 0, rc = ZT_OK;
    while (rounds < MAX_ROUNDS && (rounds < MIN_ROUNDS || zt_now() - t0 < PROBE_SECONDS)) {
        for (int k = 0; k < NCAND && !rc; k++) {
            int c = (k + rounds) % NCAND;
            rc = measure(dir, flags, c, 1, buf, &w[c][rounds], &r[c][rounds], res->engine, sizeof res->engine);
        }
        if (rc) break;
        rounds++;
    }
    if (rc) { munmap(buf, most); return rc; }
    double best = 0, t[NCAND], gw[NCAND], gr[NCAND];
    int pick = 0;
    for (int c = 0; c < NCAND; c++) {
        double mw = median(w[c], rounds), mr = median(r[c], rounds);
        t[c] = mw + mr;
        gw[c] = (double)PROBE_BYTES / mw / 1e9;
        gr[c] = (double)PROBE_BYTES / mr / 1e9;
        res->cand_depth[c] = cand[c].depth;
        res->cand_block[c] = cand[c].block;
        res->cand_write_gbs[c] = gw[c];
        res->cand_read_gbs[c] = gr[c];
        if (c == 0 || t[c] < best) { best = t[c]; pick = c; }
    }
    for (int c = 0; c < NCAND; c++)     /* less memory within 5% of the fastest */
        if (t[c] <= 1.05 * best && (size_t)cand[c].depth * cand[c].block <
                                       (size_t)cand[pick].depth * cand[pick].block)
            pick = c;
    res->queue_depth = cand[pick].depth;
    res->block_bytes = cand[pick].block;
    res->write_gbs = gw[pick];
    res->read_gbs = gr[pick];
    res->default_write_gbs = gw[0];
    res->default_read_gbs = gr[0];
    res->rounds = rounds;
    res->candidates = NCAND;
    rc = probe_stripes(dir, flags, pick, rounds, buf, res);
    munmap(buf, most);
    return rc;
}

static void cache_file(char *out, size_t n, const char *cache_dir, dev_t d, const char *engine)
{
    snprintf(out, n, "%s/aio-probe.%u-%u.%s", cache_dir, major(d), minor(d), engine);
}

int zt_aio_probe_cached(const char *dir, const char *engine, const char *cache_dir, zt_aio_probe_result *res)
{
    ZT_CHECK(dir != NULL && engine != NULL && cache_dir != NULL && res != NULL,
             "zt_aio_probe_cached: dir, engine, cache_dir or res is NULL");
    memset(res, 0, sizeof *res);
    struct stat st;
    if (stat(dir, &st) != 0) return ZT_OK;
    device_name(st.st_dev, res->device, sizeof res->device);
    snprintf(res->engine, sizeof res->engine, "%s", engine);
    char path[PATH_MAX];
    cache_file(path, sizeof path, cache_dir, st.st_dev, engine);
    if (read_cache(path, res)) {
        res->cached = 1;
        snprintf(res->cache_path, sizeof res->cache_path, "%s", path);
    } else {
        res->queue_depth = 0;
        res->block_bytes = 0;
    }
    return ZT_OK;
}

int zt_aio_probe(const char *dir, int flags, const char *cache_dir, zt_aio_probe_result *res)
{
    ZT_CHECK(dir != NULL && res != NULL, "zt_aio_probe: dir or res is NULL");
    memset(res, 0, sizeof *res);
    struct stat st;
    if (stat(dir, &st) != 0)
        return zt_error(ZT_EINVAL, "zt_aio_probe: %s: %s (the swap directory to probe must exist)", dir,
                        strerror(errno));
    device_name(st.st_dev, res->device, sizeof res->device);
    double t0 = zt_now();
    char path[PATH_MAX], lockp[PATH_MAX];
    int lock = -1;
    /* the engine that will run names the cache file: open one to learn it */
    zt_aio *a = NULL;
    ZT_TRY(zt_aio_open(&a, dir, 0, 1, flags | ZT_AIO_UNACCOUNTED));
    snprintf(res->engine, sizeof res->engine, "%s", zt_aio_engine(a));
    int direct = zt_aio_direct(a);
    zt_aio_close(a);
    if (!direct) {                      /* buffered: the page cache's speed, not the disk's */
        res->queue_depth = ZT_AIO_DEFAULT_DEPTH;
        res->block_bytes = ZT_AIO_DEFAULT_BLOCK;
        res->stripes = 1;
        snprintf(res->note, sizeof res->note, "not probed: %.100s refuses O_DIRECT", dir);
        res->seconds = zt_now() - t0;
        return ZT_OK;
    }
    if (cache_dir && *cache_dir) {
        mkdir(cache_dir, 0755);         /* its parent must exist; else no cache */
        cache_file(path, sizeof path, cache_dir, st.st_dev, res->engine);
        snprintf(lockp, sizeof lockp, "%s/aio-probe.%u-%u.lock", cache_dir, major(st.st_dev),
                 minor(st.st_dev));
        lock = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (lock >= 0) while (flock(lock, LOCK_EX) != 0 && errno == EINTR) {}
        if (read_cache(path, res)) {
            res->cached = 1;
            snprintf(res->cache_path, sizeof res->cache_path, "%s", path);
            if (lock >= 0) close(lock);
            res->seconds = zt_now() - t0;
            return ZT_OK;
        }
    }
    int rc = run_probe(dir, flags, res);
    if (rc == ZT_OK && cache_dir && *cache_dir) {
        write_cache(path, res);
        snprintf(res->cache_path, sizeof res->cache_path, "%s", path);
    }
    if (lock >= 0) close(lock);
    res->seconds = zt_now() - t0;
    return rc;
}
