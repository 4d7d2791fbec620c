/*
 * bench_aio.c -- sequential write and read bandwidth of the aio engine
 * (runtime/aio.c) beside fio run with the same block size, queue depth, file
 * and O_DIRECT setting (fio's libaio engine: the kernel's own asynchronous
 * I/O, the usual yardstick). `make bench` runs it; alone:
 *
 *   make build/bench_aio && build/bench_aio [--dir DIR] [--size 1GiB]
 *        [--block 1MiB] [--depth 8] [--repeat 5] [--buffered]
 *
 * One swap file of --size is made by the engine in DIR (default build/, the
 * tree's disk); it is written once to lay it out, then the engine and fio
 * take turns on that same file, --repeat times each way, and the best run
 * of each is reported (turns share whatever else the disk is doing), with
 * the median ratio of each engine run to the fio run right after it. The
 * engine is handed the file as requests of depth x block bytes, all from
 * one buffer of that size (fio's footprint: iodepth buffers of bs) and all
 * queued at once, so it keeps --depth blocks in flight from start to end,
 * as fio --iodepth does. Without fio the engine column is printed alone.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ztrain.h"

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

/* fio's bandwidth in bytes per second, or -1 (the reason in why). */
static double fio_pass(const char *path, int write, size_t size, size_t block, int depth,
                       int direct, char *why, size_t nwhy)
{
    char cmd[4600];
    snprintf(cmd, sizeof cmd, "fio --name=zt --filename=%s --size=%zu --bs=%zu --iodepth=%d "
             "--ioengine=libaio --direct=%d --rw=%s --output-format=terse --terse-version=3 "
             "2>&1", path, size, block, depth, direct, write ? "write" : "read");
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
        snprintf(why, nwhy, "unexpected fio output: %.200s", line);
        return -1;
    }
    return atof(s) * 1024.0;
}

static int cmp(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv)
{
    const char *dir = "build";
    size_t size = (size_t)1 << 30, block = (size_t)1 << 20;
    int depth = 8, repeat = 5, flags = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--buffered")) { flags |= ZT_AIO_BUFFERED; continue; }
        if (!v) { fprintf(stderr, "bench_aio: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--dir")) dir = v;
        else if (!strcmp(a, "--size")) size = parse_size(v);
        else if (!strcmp(a, "--block")) block = parse_size(v);
        else if (!strcmp(a, "--depth")) depth = atoi(v);
        else if (!strcmp(a, "--repeat")) repeat = atoi(v);
        else { fprintf(stderr, "bench_aio: unknown option %s (--dir --size --block --depth "
                       "--repeat --buffered)\n", a); return 2; }
        i++;
    }
    if (repeat < 1 || repeat > 50) repeat = 5;
    size = size / block * block;
    if (size == 0) { fprintf(stderr, "bench_aio: --size below one block\n"); return 2; }

    zt_aio *a = NULL;
    int f;
    if (zt_aio_open(&a, dir, block, depth, flags)) die("open");
    if (zt_aio_file_new(a, size, &f)) die("file");
    const char *path = zt_aio_file_path(a, f);
    /* fio cycles iodepth buffers of bs bytes; the engine gets the same
     * footprint (a larger one is slower on a VM's disk: the host copies into
     * guest memory, and 64 MiB of it cost about 20% against 8 MiB) */
    size_t chunk = block * (size_t)depth;
    if (chunk > size) chunk = size;
    char *buf = NULL;
    if (posix_memalign((void **)&buf, ZT_AIO_PAGE, chunk)) { fprintf(stderr, "no memory\n"); return 1; }
    for (size_t i = 0; i < chunk; i++) buf[i] = (char)(i * 131 + 7);

    char fstype[64] = "?", cmd[4200];
    snprintf(cmd, sizeof cmd, "stat -f -c %%T '%s' 2>/dev/null", dir);
    FILE *p = popen(cmd, "r");
    if (p) { if (fgets(fstype, sizeof fstype, p)) fstype[strcspn(fstype, "\n")] = 0; pclose(p); }
    int have_fio = system("command -v fio >/dev/null 2>&1") == 0;

    printf("aio engine vs fio: %.2f GiB file in %s (%s), %zu KiB blocks, queue depth %d, %s, "
           "best of %d\n", (double)size / 1073741824.0, dir, fstype, block >> 10, depth,
           zt_aio_direct(a) ? "O_DIRECT" : "buffered", repeat);
    if (!zt_aio_direct(a)) printf("  engine mode: %s\n", zt_aio_mode(a));
    engine_pass(a, f, 1, size, buf, chunk);    /* lay the file out (unwritten extents) */

    double eng[2][50], fio[2][50];
    char why[300] = "fio is not installed (make deps installs it)";
    for (int r = 0; r < repeat; r++)
        for (int w = 1; w >= 0; w--) {
            eng[w][r] = engine_pass(a, f, w, size, buf, chunk);
            fio[w][r] = have_fio ? fio_pass(path, w, size, block, depth, zt_aio_direct(a), why,
                                            sizeof why) : -1;
            if (fio[w][r] < 0) have_fio = 0;
        }
    printf("  %-6s %12s %14s %11s %12s\n", "", "engine", "fio (libaio)", "engine/fio",
           "pair median");
    int ok = 1;
    if (getenv("ZT_BENCH_AIO_RUNS"))
        for (int r = 0; r < repeat; r++)
            printf("  run %d: write %.2f / %.2f, read %.2f / %.2f GB/s (engine / fio)\n", r,
                   eng[1][r] / 1e9, fio[1][r] / 1e9, eng[0][r] / 1e9, fio[0][r] / 1e9);
    for (int w = 1; w >= 0; w--) {
        /* each engine run beside the fio run right after it: the disk and
         * the CPUs were in about the same state */
        double ratio[50];
        for (int r = 0; r < repeat; r++) ratio[r] = have_fio ? eng[w][r] / fio[w][r] : 0;
        qsort(ratio, (size_t)repeat, sizeof(double), cmp);
        qsort(eng[w], (size_t)repeat, sizeof(double), cmp);
        double e = eng[w][repeat - 1];
        if (have_fio) {
            qsort(fio[w], (size_t)repeat, sizeof(double), cmp);
            double fb = fio[w][repeat - 1];
            printf("  %-6s %9.2f GB/s %9.2f GB/s %10.0f%% %11.0f%%\n", w ? "write" : "read",
                   e / 1e9, fb / 1e9, 100.0 * e / fb, 100.0 * ratio[repeat / 2]);
            ok &= e >= 0.9 * fb;
        } else {
            printf("  %-6s %9.2f GB/s %14s %11s %12s\n", w ? "write" : "read", e / 1e9, "-", "-",
                   "-");
        }
    }
    if (have_fio)
        printf("  target: engine >= 90%% of fio for read and write: %s\n", ok ? "met" : "NOT met");
    else
        printf("  fio column skipped: %s\n", why);
    zt_aio_stats st;
    zt_aio_get_stats(a, &st);
    printf("  engine: %llu requests, %llu blocks (%llu bounced), %llu errors\n",
           (unsigned long long)st.requests, (unsigned long long)st.blocks,
           (unsigned long long)st.bounced, (unsigned long long)st.errors);
    free(buf);
    zt_aio_close(a);
    return 0;
}
