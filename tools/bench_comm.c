/*
 * bench_comm.c -- latency and bandwidth of zt_all_reduce (deterministic,
 * rank-ordered) next to MPI_Allreduce (MPI's own order) on the same data.
 *
 * Build and run (not part of `make`):
 *   cc -O2 -Iruntime $(mpicc --showme:compile) tools/bench_comm.c -o build/bench_comm \
 *      -Lbuild -lztrain $(mpicc --showme:link) -Wl,-rpath,$PWD/build
 *   mpirun --oversubscribe --bind-to none -np 2 build/bench_comm [MiB ...]
 *
 * Prints, per size: median time per all_reduce, algorithm bandwidth
 * (bytes / time) and bus bandwidth (x 2(p-1)/p, what each rank moves).
 * Then the round trip of a small send/recv between ranks 0 and 1 on a group
 * of their own: alone, and while the largest all_reduce runs on the world
 * (the engine progresses every communicator side by side, so the round
 * trips are not queued behind the all_reduce).
 * ZT_BENCH_SCRATCH_MB sets the per-op scratch budget (comm.h's knob).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <mpi.h>
#include "internal.h"     /* white-box: reads zt_tensor's fields */
#include "comm.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One round trip of t between ranks 0 and 1 on g (others: nothing). */
static int round_trip(zt_comm *g, zt_tensor *t, int R)
{
    int rc = ZT_OK;
    if (R == 0) rc = zt_send(g, t, 1, 1, NULL) | zt_recv(g, t, 1, 2, NULL);
    if (R == 1) rc = zt_recv(g, t, 0, 1, NULL) | zt_send(g, t, 0, 2, NULL);
    if (rc != ZT_OK) { fprintf(stderr, "%s\n", zt_last_error()); exit(1); }
    return rc;
}

static void ping_pong(zt_comm *w, int R, double ar_mb)
{
    enum { N = 200 };
    zt_comm *g;
    int64_t n = 256, na = (int64_t)(ar_mb * (1 << 20) / 4);
    if (na < 1) na = 1;
    zt_tensor *t, *x;
    if (zt_comm_split(&g, w, 0, R) != ZT_OK ||
        zt_tensor_new(&t, ZT_TIER_DEVICE, ZT_CAT_COMM, ZT_F32, 1, &n) != ZT_OK ||
        zt_tensor_new(&x, ZT_TIER_DEVICE, ZT_CAT_GRADS, ZT_F32, 1, &na) != ZT_OK) {
        fprintf(stderr, "%s\n", zt_last_error());
        exit(1);
    }
    memset(t->data, 0, 1024);
    memset(x->data, 0, (size_t)na * 4);
    double rt[N], during[N];
    zt_barrier(w, NULL);
    for (int i = 0; i < N; i++) {
        double t0 = now();
        round_trip(g, t, R);
        rt[i] = now() - t0;
    }
    qsort(rt, N, sizeof *rt, cmp);
    /* Round trips while the all_reduce is in flight (at least one). */
    zt_barrier(w, NULL);
    zt_comm_req *q;
    double t0 = now();
    if (zt_all_reduce(w, x, &q) != ZT_OK) { fprintf(stderr, "%s\n", zt_last_error()); exit(1); }
    int k = 0, done = 0;
    while (k < N) {
        double t1 = now();
        round_trip(g, t, R);
        during[k++] = now() - t1;
        zt_comm_test(q, &done);
        int any = done;          /* stop together: rank 0 decides */
        zt_comm_broadcast_host(g, &any, sizeof any, 0);
        if (any) break;
    }
    zt_comm_wait(q);
    double ar = now() - t0, first = during[0];
    qsort(during, (size_t)k, sizeof *during, cmp);
    if (R == 0)
        printf("\nsend/recv round trip, 1 KiB, ranks 0 and 1 on their own group:\n"
               "  alone: median %.1f us\n"
               "  while a %.0f MiB all_reduce runs on the world (%.1f ms): %d round trips, "
               "median %.1f us, first %.1f us\n", rt[N / 2] * 1e6, ar_mb, ar * 1e3, k,
               during[k / 2] * 1e6, first * 1e6);
    zt_tensor_release(t);
    zt_tensor_release(x);
    zt_comm_free(g);
}

int main(int argc, char **argv)
{
    zt_comm *w;
    if (zt_comm_world(&w) != ZT_OK) { fprintf(stderr, "%s\n", zt_last_error()); return 1; }
    int R = zt_comm_rank(w), P = zt_comm_size(w);
    const char *sm = getenv("ZT_BENCH_SCRATCH_MB");
    if (sm) zt_comm_tune((size_t)(atof(sm) * (1 << 20)), 0);
    double sizes_mb[16] = { 4.0 / (1 << 20), 1, 64 };
    int ns = 3;
    if (argc > 1) {
        ns = 0;
        for (int i = 1; i < argc && ns < 16; i++) sizes_mb[ns++] = atof(argv[i]);
    }
    int mt = 0;
    MPI_Query_thread(&mt);       /* the native comparison calls MPI from this thread */
    if (R == 0)
        printf("all_reduce f32, %d ranks, backend %s, scratch budget %s MiB\n"
               "%10s %12s %12s %12s | %12s %12s\n", P, zt_comm_backend(w), sm ? sm : "default",
               "size", "zt median", "algbw GB/s", "busbw GB/s", "MPI median", "algbw GB/s");
    for (int s = 0; s < ns; s++) {
        int64_t n = (int64_t)(sizes_mb[s] * (1 << 20) / 4);
        if (n < 1) n = 1;
        zt_tensor *x;
        zt_tensor_new(&x, ZT_TIER_DEVICE, ZT_CAT_GRADS, ZT_F32, 1, &n);
        for (int64_t i = 0; i < n; i++) ((float *)x->data)[i] = (float)(i % 1000) * 1e-3f;
        double bytes = (double)n * 4;
        int iters = bytes < 1e5 ? 2000 : bytes < 4e6 ? 100 : 10;
        double t[2000], tm[2000];
        for (int i = -2; i < iters; i++) {
            zt_barrier(w, NULL);
            double t0 = now();
            if (zt_all_reduce(w, x, NULL) != ZT_OK) { fprintf(stderr, "%s\n", zt_last_error()); return 1; }
            if (i >= 0) t[i] = now() - t0;
        }
        int native = mt == MPI_THREAD_MULTIPLE;
        if (native) {
            for (int i = -2; i < iters; i++) {
                zt_barrier(w, NULL);
                double t0 = now();
                MPI_Allreduce(MPI_IN_PLACE, x->data, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                if (i >= 0) tm[i] = now() - t0;
            }
            qsort(tm, (size_t)iters, sizeof *tm, cmp);
        }
        qsort(t, (size_t)iters, sizeof *t, cmp);
        double med = t[iters / 2], mmed = native ? tm[iters / 2] : 0;
        if (R == 0) {
            char sz[32];
            if (bytes < 1 << 20) snprintf(sz, sizeof sz, "%.0f B", bytes);
            else snprintf(sz, sizeof sz, "%.0f MiB", bytes / (1 << 20));
            printf("%10s %9.1f us %12.2f %12.2f | %9.1f us %12.2f\n", sz, med * 1e6,
                   bytes / med / 1e9, bytes / med / 1e9 * 2.0 * (P - 1) / P, mmed * 1e6,
                   native ? bytes / mmed / 1e9 : 0);
        }
        zt_tensor_release(x);
    }
    if (P >= 2) ping_pong(w, R, sizes_mb[ns - 1]);
    zt_comm_finalize();
    return 0;
}
