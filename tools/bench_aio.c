/*
 * bench_aio.c -- sequential write and read bandwidth of the aio engine
 * (runtime/aio.c) beside fio run with the same block size, queue depth, file
 * and O_DIRECT setting: fio's libaio engine at --iodepth (the kernel's own
 * asynchronous I/O, the usual yardstick and the target's), and fio's psync
 * engine with one job per queue slot (blocking preads/pwrites from that many
 * threads: the engine's own I/O model). `make bench` runs it; alone:
 *
 *   make build/bench_aio && build/bench_aio [--dir DIR] [--size 1GiB]
 *        [--block 1MiB] [--depth 8] [--repeat 6] [--psync-jobs DEPTH]
 *        [--buffered]          (ZT_BENCH_AIO_RUNS=1 prints every round)
 *
 * One swap file of --size is made by the engine in DIR (default build/, the
 * tree's disk) and written once to lay it out; then --repeat rounds each
 * write it once with every contender and read it once with every
 * contender, the order rotated from round to round. Printed: each side's
 * median and best, and the median (and range) of the per-round ratios
 * engine / fio libaio, on which the 90% target is judged. The engine is
 * handed the file as requests of depth x block bytes, all from one buffer
 * of that size (fio's footprint: iodepth buffers of bs) and all queued at
 * once, so it keeps --depth blocks in flight from start to end, as fio
 * --iodepth does. Without fio the engine column is printed alone.
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

/* fio's bandwidth in bytes per second, or -1 (the reason in why). jobs 0:
 * one job of the libaio engine at iodepth depth (the kernel's asynchronous
 * I/O); jobs N: N jobs of blocking pread/pwrite (psync), each over its own
 * contiguous 1/N of the file -- what the engine's N pool threads do. */
static double fio_pass(const char *path, int write, size_t size, size_t block, int depth,
                       int jobs, int direct, char *why, size_t nwhy)
{
    char cmd[4600], eng[160];
    if (jobs)
        snprintf(eng, sizeof eng, "--ioengine=psync --numjobs=%d --size=%zu "
                 "--offset_increment=%zu --group_reporting", jobs, size / (size_t)jobs,
                 size / (size_t)jobs);
    else
        snprintf(eng, sizeof eng, "--ioengine=libaio --iodepth=%d --size=%zu", depth, size);
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

/* Sorts v[0..n) in place; its median (the mean of the middle two for even n). */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
    const char *dir = "build";
    size_t size = (size_t)1 << 30, block = (size_t)1 << 20;
    int depth = 8, repeat = 6, flags = 0, jobs = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--buffered")) { flags |= ZT_AIO_BUFFERED; continue; }
        if (!v) { fprintf(stderr, "bench_aio: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--dir")) dir = v;
        else if (!strcmp(a, "--size")) size = parse_size(v);
        else if (!strcmp(a, "--block")) block = parse_size(v);
        else if (!strcmp(a, "--depth")) depth = atoi(v);
        else if (!strcmp(a, "--repeat")) repeat = atoi(v);
        else if (!strcmp(a, "--psync-jobs")) jobs = atoi(v);
        else { fprintf(stderr, "bench_aio: unknown option %s (--dir --size --block --depth "
                       "--repeat --psync-jobs --buffered)\n", a); return 2; }
        i++;
    }
    if (repeat < 1 || repeat > 50) repeat = 6;
    if (jobs < 0) jobs = depth;                 /* the engine's runners: one per queue slot */
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
           "%d rounds\n", (double)size / 1073741824.0, dir, fstype, block >> 10, depth,
           zt_aio_direct(a) ? "O_DIRECT" : "buffered", repeat);
    /* buffered fallback, or a libuv pool smaller than the queue depth */
    if (strcmp(zt_aio_mode(a), "O_DIRECT")) printf("  engine mode: %s\n", zt_aio_mode(a));
    engine_pass(a, f, 1, size, buf, chunk);    /* lay the file out (unwritten extents) */

    /* Contenders: 0 the engine, 1 fio libaio, 2 fio psync x jobs (skipped
     * with --psync-jobs 0). A round writes the file once with each, then
     * reads it once with each. The order rotates every round: a pass can
     * leave the host's cache of a virtual disk (and the disk's own state)
     * warm for whoever comes next, so a fixed order -- fio's read always
     * right after the engine's -- may favour one side; rotated, each
     * contender sits in each place equally often (use a multiple of the
     * contender count for --repeat). */
    int nc = jobs ? 3 : 2;
    double bw[3][2][50];
    char why[300] = "fio is not installed (make deps installs it)";
    for (int r = 0; r < repeat; r++)
        for (int w = 1; w >= 0; w--)
            for (int k = 0; k < nc; k++) {
                int c = (r + k) % nc;
                if (c == 0)
                    bw[0][w][r] = engine_pass(a, f, w, size, buf, chunk);
                else if (have_fio)
                    bw[c][w][r] = fio_pass(path, w, size, block, depth, c == 2 ? jobs : 0,
                                           zt_aio_direct(a), why, sizeof why);
                else
                    bw[c][w][r] = -1;
                if (c && bw[c][w][r] < 0) have_fio = 0;
            }
    if (getenv("ZT_BENCH_AIO_RUNS"))
        for (int r = 0; r < repeat; r++)
            printf("  round %d: write %.2f / %.2f / %.2f, read %.2f / %.2f / %.2f GB/s (engine / "
                   "libaio / psync)\n", r, bw[0][1][r] / 1e9, bw[1][1][r] / 1e9,
                   nc > 2 ? bw[2][1][r] / 1e9 : 0, bw[0][0][r] / 1e9, bw[1][0][r] / 1e9,
                   nc > 2 ? bw[2][0][r] / 1e9 : 0);
    /* The target is judged on the median of the per-round ratios engine /
     * fio libaio: both ran in the same round, on a disk and CPUs in about
     * the same state, and one lucky or unlucky pass (this VM's disk varies
     * by 1.5x from pass to pass) cannot move a median. Best-of-N is shown
     * too, but it compares one side's luckiest pass with the other's. */
    /* columns of 14: " median  best " per contender, then the ratios */
    int cols = have_fio ? nc : 1;
    char pname[32];
    snprintf(pname, sizeof pname, "fio psync x%d", jobs);
    const char *names[3] = { "engine", "fio libaio", pname };
    printf("  %-6s", "GB/s");
    for (int c = 0; c < cols; c++) printf(" %-13s", names[c]);
    if (have_fio) printf(" engine/libaio: median of rounds (range), best/best");
    printf("\n  %-6s", "");
    for (int c = 0; c < cols; c++) printf(" %6s %5s ", "median", "best");
    printf("\n");
    int ok = 1;
    for (int w = 1; w >= 0; w--) {
        double ratio[50], ratio2[50];
        for (int r = 0; r < repeat; r++) {
            ratio[r] = have_fio ? bw[0][w][r] / bw[1][w][r] : 0;
            ratio2[r] = have_fio && nc > 2 ? bw[0][w][r] / bw[2][w][r] : 0;
        }
        double rm = median(ratio, repeat), lo = ratio[0], hi = ratio[repeat - 1];
        double r2 = median(ratio2, repeat);
        double em = median(bw[0][w], repeat), eb = bw[0][w][repeat - 1];
        printf("  %-6s %6.2f %5.2f ", w ? "write" : "read", em / 1e9, eb / 1e9);
        if (have_fio) {
            double fm = median(bw[1][w], repeat), fb = bw[1][w][repeat - 1];
            printf(" %6.2f %5.2f ", fm / 1e9, fb / 1e9);
            if (nc > 2) {
                double pm = median(bw[2][w], repeat), pb = bw[2][w][repeat - 1];
                printf(" %6.2f %5.2f ", pm / 1e9, pb / 1e9);
            }
            printf(" %12.0f%% (%.0f%%..%.0f%%), %.0f%%", 100.0 * rm, 100.0 * lo, 100.0 * hi,
                   100.0 * eb / fb);
            if (nc > 2) printf("; engine/psync %.0f%%", 100.0 * r2);
            ok &= rm >= 0.9;
        }
        printf("\n");
    }
    if (have_fio)
        printf("  target: engine >= 90%% of fio libaio (median of rounds) for read and write: %s\n",
               ok ? "met" : "NOT met");
    else
        printf("  fio columns skipped: %s\n", why);
    zt_aio_stats st;
    zt_aio_get_stats(a, &st);
    printf("  engine: %llu requests, %llu blocks (%llu bounced), %llu errors, at most %llu "
           "blocks in flight\n", (unsigned long long)st.requests, (unsigned long long)st.blocks,
           (unsigned long long)st.bounced, (unsigned long long)st.errors,
           (unsigned long long)st.peak_inflight);
    free(buf);
    zt_aio_close(a);
    return 0;
}
