/*
 * bench_aio.c -- sequential write and read bandwidth of the aio engine
 * (runtime/aio.c, on the backend it picks: io_uring or the thread pool)
 * beside fio with the same file, block size, queue depth and O_DIRECT
 * setting, on both of fio's asynchronous engines: libaio (the kernel's
 * native AIO) and io_uring, the latter also with --fixedbufs (its buffers
 * registered, as the engine registers its buffer by default: the
 * optimizer's staging slots are registered the same way). `make bench`
 * runs the short default; alone:
 *
 *   make build/bench_aio && build/bench_aio [--dir DIR] [--size 512MiB]
 *        [--block 1MiB] [--depth 8,32] [--repeat 5] [--engine auto|uring|threads|both]
 *        [--register 1|0|both] [--psync-jobs N] [--buffered] [--sweep] [--stripes N]
 *        (ZT_BENCH_AIO_RUNS=1 prints every round)
 *
 * For each queue depth (default 8 and 32), the engine makes a file of
 * --size in DIR (default build/, the tree's disk) and writes it once to lay
 * it out; then --repeat rounds each write the file once with every
 * contender and read it once with every contender, the order rotated from
 * round to round (a pass can leave the disk and the host's cache of a
 * virtual disk warm for whoever comes next). Printed per depth: each
 * contender's median and best, the engine's median over the best of fio's
 * three medians, and the median (and range) of the per-round ratios engine /
 * the round's best fio pass. The target (issue 31): the engine's median
 * >= 95% of the best fio engine's median, for read and write, at every
 * depth. The engine gets requests of depth x block bytes from one buffer of
 * that size, all queued at once, so it keeps `depth` blocks in flight from
 * start to end, as fio --iodepth does with iodepth buffers of bs.
 *
 * --sweep: queue depth 1..64 at --block, then block size 256 KiB..8 MiB at
 * depth 8, the engine beside both fio engines (one table, medians of
 * --repeat rounds; 2 unless given). --engine both adds the other engine as
 * a column, --register both the engine without registering its buffer;
 * --psync-jobs N adds fio's psync with N jobs (the thread pool's own
 * pattern). Without fio the engine's columns are printed alone.
 *
 * --stripes N: the engine's file striped over N files (zt_aio_set_stripes);
 * fio then runs on the first of them only, so the fio columns are left out.
 *
 * Both end with the nvme tier's short probe of DIR (zt_aio_probe: what
 * offload.queue_depth / offload.block_size = "auto" would pick, measured
 * afresh), its candidates and its pick.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "ztrain.h"

enum { MAXR = 50, MAXC = 8 };

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (!strcasecmp(end, "k") || !strcasecmp(end, "kib")) v *= 1024.0;
    else if (!strcasecmp(end, "m") || !strcasecmp(end, "mib")) v *= 1048576.0;
    else if (!strcasecmp(end, "g") || !strcasecmp(end, "gib")) v *= 1073741824.0;
    else if (*end) { fprintf(stderr, "bench_aio: cannot read size %s (use 64MiB, 1GiB)\n", s); exit(2); }
    return (size_t)v;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_aio: %s: %s\n", what, zt_last_error());
    exit(1);
}

/* Bytes per second of one sequential pass of the engine over the file. */
static double engine_pass(zt_aio *a, int f, int write, size_t size, char *buf, size_t chunk)
{
    size_t n = (size + chunk - 1) / chunk;
    zt_aio_req **reqs = calloc(n, sizeof *reqs);
    double t0 = zt_now();
    for (size_t i = 0; i < n; i++) {
        size_t off = i * chunk, len = size - off < chunk ? size - off : chunk;
        int rc = write ? zt_aio_write(a, f, off, buf, len, &reqs[i])
                       : zt_aio_read(a, f, off, buf, len, &reqs[i]);
        if (rc) die(write ? "write" : "read");
    }
    for (size_t i = 0; i < n; i++)
        if (zt_aio_wait(reqs[i])) die(write ? "write" : "read");
    double dt = zt_now() - t0;
    free(reqs);
    return (double)size / dt;
}

/* fio's bandwidth in bytes per second, or -1 (the reason in why). engine
 * "libaio" or "io_uring" at iodepth depth, one job; "psync": jobs jobs of
 * blocking pread/pwrite, each over its own contiguous 1/jobs of the file. */
static double fio_pass(const char *path, const char *engine, int write, size_t size, size_t block,
                       int depth, int jobs, int direct, char *why, size_t nwhy)
{
    char cmd[4600], eng[200];
    if (!strcmp(engine, "io_uring+fixedbufs"))
        snprintf(eng, sizeof eng, "--ioengine=io_uring --fixedbufs=1 --iodepth=%d --size=%zu", depth, size);
    else if (!strcmp(engine, "psync"))
        snprintf(eng, sizeof eng, "--ioengine=psync --numjobs=%d --size=%zu "
                 "--offset_increment=%zu --group_reporting", jobs, size / (size_t)jobs,
                 size / (size_t)jobs);
    else
        snprintf(eng, sizeof eng, "--ioengine=%s --iodepth=%d --size=%zu", engine, depth, size);
    snprintf(cmd, sizeof cmd, "fio --name=zt --filename=%s --bs=%zu %s --direct=%d --rw=%s "
             "--output-format=terse --terse-version=3 2>&1", path, block, eng, direct,
             write ? "write" : "read");
    FILE *p = popen(cmd, "r");
    char line[8192] = "";
    if (!p || !fgets(line, sizeof line, p)) {
        snprintf(why, nwhy, "fio printed nothing");
        if (p) pclose(p);
        return -1;
    }
    pclose(p);
    /* terse v3: field 7 is read bandwidth (KiB/s), field 48 write bandwidth */
    int want = write ? 48 : 7, field = 1;
    char *s = line;
    while (field < want && (s = strchr(s, ';')) != NULL) { s++; field++; }
    if (strncmp(line, "3;", 2) != 0 || !s) {
        line[strcspn(line, "\n")] = 0;
        snprintf(why, nwhy, "fio %s: unexpected output: %.200s", engine, line);
        return -1;
    }
    return atof(s) * 1024.0;
}

static int cmp(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The median of v[0..n) (the mean of the middle two for even n); v is
 * left unchanged. */
static double median(const double *v, int n)
{
    double t[MAXR];
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static double best(const double *v, int n)
{
    double b = v[0];
    for (int i = 1; i < n; i++) if (v[i] > b) b = v[i];
    return b;
}

/* ---- one configuration: every contender, rounds, rotated order ---------------------- */

typedef struct bench {
    const char *dir;
    size_t size;
    int repeat, flags, psync, have_fio, nengines;
    int engine_flags[4];           /* the engines measured (0: auto) */
    int engine_reg[4];             /* ... with the buffer registered (zt_aio_register) */
    char engine_name[4][64];
    char engine_note[4][600];
    const char *mode;
    char why[300];
    int quiet;                     /* sweep: no per-config detail lines */
    int huge;                      /* --huge: the buffer 2 MiB-aligned, MADV_HUGEPAGE */
    int stripes;                   /* --stripes: files the engine's file is striped over */
} bench;

/* Contenders: engines 0..nengines-1, then fio libaio, fio io_uring, fio
 * io_uring with fixed buffers, [psync]. */
typedef struct result {
    int nc;
    char name[MAXC][64];
    int is_fio[MAXC];
    double bw[MAXC][2][MAXR];      /* [contender][write][round] */
    char stats[400];               /* the first engine's counters */
} result;

static void measure(bench *b, size_t block, int depth, result *res)
{
    zt_aio *a[4] = { NULL, NULL, NULL, NULL };
    int f[4];
    size_t size = b->size / block * block;
    if (size == 0) { fprintf(stderr, "bench_aio: --size below one block\n"); exit(2); }
    size_t chunk = block * (size_t)depth;
    if (chunk > size) chunk = size;
    char *buf = NULL;
    size_t align = b->huge ? ((size_t)2 << 20) : ZT_AIO_PAGE;
    if (posix_memalign((void **)&buf, align, (chunk + align - 1) / align * align)) { fprintf(stderr, "no memory\n"); exit(1); }
    if (b->huge) madvise(buf, (chunk + align - 1) / align * align, MADV_HUGEPAGE);
    /* registered as fio --fixedbufs registers its buffers: before their
     * first touch (the pinning faults the pages in; ZT_AIO_REG_FRESH does
     * the same for memory already touched) -- then filled */
    for (int e = 0; e < b->nengines; e++) {
        if (zt_aio_open(&a[e], b->dir, block, depth, b->flags | b->engine_flags[e])) die("open");
        if (zt_aio_set_stripes(a[e], b->stripes)) die("stripes");
        if (zt_aio_file_new(a[e], size, &f[e])) die("file");
        int h;
        if (b->engine_reg[e] && zt_aio_register(a[e], buf, chunk, ZT_AIO_REG_FRESH, &h)) die("register");
        if (e == 0) for (size_t i = 0; i < chunk; i++) buf[i] = (char)(i * 131 + 7);
        snprintf(b->engine_name[e], sizeof b->engine_name[e], "%s%s", zt_aio_engine(a[e]),
                 b->engine_reg[e] || strcmp(zt_aio_engine(a[e]), "io_uring") ? "" : " unreg.");
        snprintf(b->engine_note[e], sizeof b->engine_note[e], "%s", zt_aio_engine_note(a[e]));
        engine_pass(a[e], f[e], 1, size, buf, chunk);  /* lay the file out (unwritten extents) */
    }
    b->mode = zt_aio_mode(a[0]);
    const char *path = zt_aio_file_path(a[0], f[0]);
    int direct = zt_aio_direct(a[0]);

    res->nc = 0;
    for (int e = 0; e < b->nengines; e++) {
        snprintf(res->name[res->nc], sizeof res->name[0], "engine %s", b->engine_name[e]);
        res->is_fio[res->nc++] = 0;
    }
    const char *fios[4] = { "libaio", "io_uring", "io_uring+fixedbufs", "psync" };
    int nfio = b->have_fio ? (b->psync ? 4 : 3) : 0;
    for (int k = 0; k < nfio; k++) {
        if (k == 3) snprintf(res->name[res->nc], sizeof res->name[0], "fio psync x%d", b->psync);
        else if (k == 2) snprintf(res->name[res->nc], sizeof res->name[0], "fio io_uring fixed");
        else snprintf(res->name[res->nc], sizeof res->name[0], "fio %s", fios[k]);
        res->is_fio[res->nc++] = 1;
    }
    for (int r = 0; r < b->repeat; r++)
        for (int w = 1; w >= 0; w--)
            for (int k = 0; k < res->nc; k++) {
                int c = (r + k) % res->nc;
                if (c < b->nengines) {
                    res->bw[c][w][r] = engine_pass(a[c], f[c], w, size, buf, chunk);
                } else {
                    res->bw[c][w][r] = fio_pass(path, fios[c - b->nengines], w, size, block, depth,
                                                b->psync, direct, b->why, sizeof b->why);
                    if (res->bw[c][w][r] < 0) { fprintf(stderr, "bench_aio: %s\n", b->why); exit(1); }
                }
            }
    if (getenv("ZT_BENCH_AIO_RUNS"))
        for (int r = 0; r < b->repeat; r++) {
            printf("  qd %d, %zu KiB, round %d:", depth, block >> 10, r);
            for (int c = 0; c < res->nc; c++)
                printf(" %s %.2f/%.2f", res->name[c], res->bw[c][1][r] / 1e9, res->bw[c][0][r] / 1e9);
            printf(" (write/read GB/s)\n");
        }
    zt_aio_stats st;
    zt_aio_get_stats(a[0], &st);
    snprintf(res->stats, sizeof res->stats, "(qd %d: engine %s did %llu requests, %llu blocks "
             "(%llu registered, %llu bounced), %llu errors, at most %llu blocks in flight)", depth,
             b->engine_name[0], (unsigned long long)st.requests, (unsigned long long)st.blocks,
             (unsigned long long)st.registered, (unsigned long long)st.bounced,
             (unsigned long long)st.errors, (unsigned long long)st.peak_inflight);
    for (int e = 0; e < b->nengines; e++) zt_aio_close(a[e]);
    free(buf);
}

/* The engine's standing against fio contenders [c0, c1) for one direction:
 * the engine's median over the best of their medians, and the median and
 * range of the per-round ratios engine / that round's best of them. */
static void versus_of(const bench *b, const result *res, int e, int w, int c0, int c1,
                      double *of_medians, double *rmed, double *rlo, double *rhi)
{
    double fbest = 0, ratio[MAXR];
    for (int c = c0; c < c1 && c < res->nc; c++) {
        double m = median(res->bw[c][w], b->repeat);
        if (m > fbest) fbest = m;
    }
    *of_medians = fbest > 0 ? median(res->bw[e][w], b->repeat) / fbest : 0;
    for (int r = 0; r < b->repeat; r++) {
        double fr = 0;
        for (int c = c0; c < c1 && c < res->nc; c++)
            if (res->bw[c][w][r] > fr) fr = res->bw[c][w][r];
        ratio[r] = fr > 0 ? res->bw[e][w][r] / fr : 0;
    }
    *rmed = median(ratio, b->repeat);
    qsort(ratio, (size_t)b->repeat, sizeof *ratio, cmp);
    *rlo = ratio[0];
    *rhi = ratio[b->repeat - 1];
}

/* Against the target's fio engines: libaio and io_uring, as fio runs them
 * by default (without --fixedbufs). */
static void versus(const bench *b, const result *res, int e, int w, double *of_medians,
                   double *rmed, double *rlo, double *rhi)
{
    versus_of(b, res, e, w, b->nengines, b->nengines + 2, of_medians, rmed, rlo, rhi);
}

/* The short probe the nvme tier runs for offload.queue_depth / block_size
 * "auto" (zt_aio_probe, measured afresh, not cached): its candidates and
 * pick, beside the bench's longer figures. */
static void print_probe(const bench *b)
{
    zt_aio_probe_result r;
    if (zt_aio_probe(b->dir, b->engine_flags[0], NULL, &r)) {
        printf("  probe: %s\n", zt_last_error());
        return;
    }
    if (r.note[0]) { printf("  probe: %s\n", r.note); return; }
    printf("  probe (offload.queue_depth/block_size/stripes = auto; %s, %d rounds of 64 MiB, %.1f s): pick %d x "
           "%zu KiB over %d file(s);", r.engine, r.rounds, r.seconds, r.queue_depth, r.block_bytes >> 10, r.stripes);
    for (int c = 0; c < r.candidates; c++)
        printf(" %dx%zuKi %.2f|%.2f", r.cand_depth[c], r.cand_block[c] >> 10, r.cand_write_gbs[c],
               r.cand_read_gbs[c]);
    printf(";");
    for (int c = 0; c < 3; c++)
        printf(" %d file(s) %.2f|%.2f", r.stripe_n[c], r.stripe_write_gbs[c], r.stripe_read_gbs[c]);
    printf(" (GB/s write|read)\n");
}

int main(int argc, char **argv)
{
    bench b = { .dir = "build", .size = (size_t)512 << 20, .repeat = 0, .nengines = 1, .stripes = 1 };
    size_t block = (size_t)1 << 20;
    int depths[16] = { 8, 32 }, ndepth = 2, sweep = 0;
    const char *engine = "auto", *reg = "1";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--buffered")) { b.flags |= ZT_AIO_BUFFERED; continue; }
        if (!strcmp(a, "--sweep")) { sweep = 1; continue; }
        if (!strcmp(a, "--huge")) { b.huge = 1; continue; }
        if (!v) { fprintf(stderr, "bench_aio: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--dir")) b.dir = v;
        else if (!strcmp(a, "--size")) b.size = parse_size(v);
        else if (!strcmp(a, "--block")) block = parse_size(v);
        else if (!strcmp(a, "--depth")) {
            ndepth = 0;
            for (char *s = (char *)v; *s && ndepth < 16; s += *s == ',') depths[ndepth++] = (int)strtol(s, &s, 10);
        }
        else if (!strcmp(a, "--repeat")) b.repeat = atoi(v);
        else if (!strcmp(a, "--engine")) engine = v;
        else if (!strcmp(a, "--register")) reg = v;
        else if (!strcmp(a, "--psync-jobs")) b.psync = atoi(v);
        else if (!strcmp(a, "--stripes")) b.stripes = atoi(v);
        else { fprintf(stderr, "bench_aio: unknown option %s (--dir --size --block --depth "
                       "--repeat --engine --psync-jobs --buffered --sweep --stripes)\n", a); return 2; }
        i++;
    }
    if (b.repeat < 1 || b.repeat > MAXR) b.repeat = sweep ? 2 : 5;
    if (!strcmp(engine, "uring")) b.engine_flags[0] = ZT_AIO_URING;
    else if (!strcmp(engine, "threads")) b.engine_flags[0] = ZT_AIO_THREADS;
    else if (!strcmp(engine, "both")) {
        b.engine_flags[0] = ZT_AIO_URING;
        b.engine_flags[1] = ZT_AIO_THREADS;
        b.nengines = 2;
    } else if (strcmp(engine, "auto")) {
        fprintf(stderr, "bench_aio: --engine %s: use auto, uring, threads or both\n", engine);
        return 2;
    }
    /* --register 1 (the default: as the optimizer's staging slots are), 0, or
     * both: the first engine again without registering its buffer */
    b.engine_reg[0] = b.engine_reg[1] = strcmp(reg, "0") != 0;
    if (!strcmp(reg, "both")) {
        b.engine_flags[b.nengines] = b.engine_flags[0];
        b.engine_reg[b.nengines++] = 0;
    }
    b.have_fio = system("command -v fio >/dev/null 2>&1") == 0;
    snprintf(b.why, sizeof b.why, "fio is not installed (make deps installs it)");
    if (b.stripes > 1 && b.have_fio) {   /* fio would see the first stripe only */
        b.have_fio = 0;
        snprintf(b.why, sizeof b.why, "--stripes %d: fio would see one of the files", b.stripes);
    }

    char fstype[64] = "?", cmd[4200];
    snprintf(cmd, sizeof cmd, "stat -f -c %%T '%s' 2>/dev/null", b.dir);
    FILE *p = popen(cmd, "r");
    if (p) { if (fgets(fstype, sizeof fstype, p)) fstype[strcspn(fstype, "\n")] = 0; pclose(p); }

    if (sweep) {
        /* queue depth 1..64 at --block, then block 256 KiB..8 MiB at depth 8 */
        int sd[] = { 1, 2, 4, 8, 16, 32, 64 };
        size_t sb[] = { 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20 };
        b.quiet = 1;
        printf("aio engine vs fio, sweep: %.2f GiB file in %s (%s), medians of %d rounds, GB/s "
               "write | read\n", (double)b.size / 1073741824.0, b.dir, fstype, b.repeat);
        int printed = 0;
        for (int i = 0; i < 7 + 6; i++) {
            int depth = i < 7 ? sd[i] : 8;
            size_t blk = i < 7 ? block : sb[i - 7];
            if (i >= 7 && blk == block) continue;    /* measured in the depth sweep */
            result res;
            measure(&b, blk, depth, &res);
            if (!printed++) {
                printf("  engine: %s, %s\n", b.engine_note[0], b.mode);
                printf("  %3s %6s ", "qd", "block");
                for (int c = 0; c < res.nc; c++) printf(" %-16s", res.name[c]);
                printf(" engine / best of fio libaio, io_uring\n");
            }
            printf("  %3d %4zuKi ", depth, blk >> 10);
            for (int c = 0; c < res.nc; c++)
                printf(" %6.2f | %6.2f  ", median(res.bw[c][1], b.repeat) / 1e9,
                       median(res.bw[c][0], b.repeat) / 1e9);
            if (b.have_fio) {
                double om[2], rm, lo, hi;
                versus(&b, &res, 0, 1, &om[1], &rm, &lo, &hi);
                versus(&b, &res, 0, 0, &om[0], &rm, &lo, &hi);
                printf(" %3.0f%% | %3.0f%%", 100 * om[1], 100 * om[0]);
            }
            printf("\n");
            fflush(stdout);
        }
        print_probe(&b);
        return 0;
    }

    printf("aio engine vs fio: %.2f GiB file in %s (%s), %zu KiB blocks, queue depth", (double)b.size /
           1073741824.0, b.dir, fstype, block >> 10);
    for (int d = 0; d < ndepth; d++) printf("%s %d", d ? "," : "", depths[d]);
    printf(", %d rounds in rotated order\n", b.repeat);
    int ok = 1, judged = 0;
    for (int d = 0; d < ndepth; d++) {
        result res;
        measure(&b, block, depths[d], &res);
        if (d == 0) {
            for (int e = 0; e < b.nengines; e++)
                printf("  engine %s: %s, %s\n", b.engine_name[e], b.engine_note[e], b.mode);
            printf("  %-3s %-6s", "qd", "GB/s");
            for (int c = 0; c < res.nc; c++) printf(" %-16s", res.name[c]);
            if (b.have_fio) printf(" engine / best of fio libaio, io_uring: of medians; per round "
                                   "median (range); engine / fio io_uring fixed: of medians");
            printf("\n  %-3s %-6s", "", "");
            for (int c = 0; c < res.nc; c++) printf(" %7s %6s  ", "median", "best");
            printf("\n");
        }
        for (int w = 1; w >= 0; w--) {
            printf("  %-3d %-6s", depths[d], w ? "write" : "read");
            for (int c = 0; c < res.nc; c++)
                printf(" %7.2f %6.2f  ", median(res.bw[c][w], b.repeat) / 1e9,
                       best(res.bw[c][w], b.repeat) / 1e9);
            if (b.have_fio) {
                for (int e = 0; e < b.nengines; e++) {
                    double om, rm, lo, hi;
                    versus(&b, &res, e, w, &om, &rm, &lo, &hi);
                    printf("%s%4.0f%%; %.0f%% (%.0f%%..%.0f%%)", e ? "  |  " : " ", 100 * om,
                           100 * rm, 100 * lo, 100 * hi);
                    double fm, frm, flo, fhi;
                    versus_of(&b, &res, e, w, b.nengines + 2, b.nengines + 3, &fm, &frm, &flo, &fhi);
                    printf("; %.0f%%", 100 * fm);
                    if (e == 0) { ok &= om >= 0.95; judged++; }
                }
            }
            printf("\n");
        }
        printf("      %s\n", res.stats);
        fflush(stdout);
    }
    if (b.have_fio && judged)
        printf("  target (issue 31): engine %s >= 95%% of the best median of fio libaio and fio "
               "io_uring, read and write, at each depth: %s\n", b.engine_name[0], ok ? "met" : "NOT met");
    else if (!b.have_fio)
        printf("  fio columns skipped: %s\n", b.why);
    print_probe(&b);
    return 0;
}
