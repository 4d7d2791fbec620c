/*
 * bench_comm_stats.c -- `make bench`: what the communication layer's
 * bookkeeping costs, measured rather than asserted (the C tests check what
 * it does; wall-clock bounds there fail on a loaded machine).
 *
 *  - the world's start: zt_comm_world, local (no launcher: no MPI at all)
 *    or MPI under mpirun;
 *  - the counters' hot path (comm_stats.c): zt_stats_issue + zt_stats_start
 *    + zt_stats_end per operation, a few relaxed atomic adds and two clock
 *    reads (docs/architecture.md "Communication"); target: well under a
 *    microsecond;
 *  - a barrier on the world, for scale.
 *
 *   build/bench_comm_stats                            one local rank
 *   mpirun --oversubscribe -np 2 build/bench_comm_stats   two MPI ranks
 *
 * Rank 0 prints one line per measurement. Exit status 1 only when the
 * library fails, never for a slow number.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "internal.h"     /* white-box: zt_comm_req, for the hot path */
#include "comm.h"         /* zt_stats_* */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 1000000;
    if (iters < 1) { fprintf(stderr, "bench_comm_stats: iterations must be >= 1\n"); return 1; }
    zt_comm *w = NULL;
    double t0 = now();
    if (zt_comm_world(&w) != ZT_OK) {
        fprintf(stderr, "bench_comm_stats: zt_comm_world: %s\n", zt_last_error());
        return 1;
    }
    double start = now() - t0;
    int R = zt_comm_rank(w), P = zt_comm_size(w);

    zt_comm_req op;
    memset(&op, 0, sizeof op);
    op.kind = ZT_OP_ALL_REDUCE;
    op.comm = w;
    op.count = 1 << 20;
    op.esize = 4;
    t0 = now();
    for (int i = 0; i < iters; i++) {
        zt_stats_issue(&op);
        zt_stats_start();
        zt_stats_end();
    }
    double per = (now() - t0) / iters * 1e9;
    zt_comm_stats_reset();

    int rc = zt_barrier(w, NULL);
    t0 = now();
    for (int i = 0; i < 200 && rc == ZT_OK; i++) rc = zt_barrier(w, NULL);
    double bar = (now() - t0) / 200 * 1e6;
    if (rc != ZT_OK) {
        fprintf(stderr, "bench_comm_stats: zt_barrier: %s\n", zt_last_error());
        zt_comm_abort(1);
    }
    if (R == 0) {
        printf("comm (%s, %d rank%s):\n", zt_comm_backend(w), P, P == 1 ? "" : "s");
        printf("  zt_comm_world          %8.2f ms\n", start * 1e3);
        printf("  counters per operation %8.0f ns   (issue + start + end, %d iterations; "
               "target well under 1000 ns)\n", per, iters);
        printf("  barrier                %8.1f us\n", bar);
    }
    zt_comm_finalize();
    return 0;
}
