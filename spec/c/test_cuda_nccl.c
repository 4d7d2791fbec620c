/*
 * test_cuda_nccl.c -- collectives on CUDA device tensors, run under
 * `mpirun -np 2` (or more) by `make test-cuda`, in two modes:
 *   test_cuda_nccl nccl  the NCCL communicator (runtime/comm_nccl.c), one GPU
 *                        per rank; skips with fewer GPUs than ranks (NCCL
 *                        refuses two ranks on one GPU);
 *   test_cuda_nccl mpi   the MPI communicator staging device tensors through
 *                        pinned host buffers (runtime/comm_stage.c): ranks
 *                        may share one GPU.
 * Skips with one line (rank 0) where there is no launcher or no CUDA GPU.
 * Under `mpirun -np 1` (tools/test_cuda.sh runs nccl so too) NCCL runs on
 * one GPU: the transport, its kept receive buffer and every collective with
 * one rank, what a one-GPU machine can check of comm_nccl.c.
 *
 * Inputs are mpi_inputs.h's (sign, mantissa and exponent vary by rank and
 * index), so every rank computes each reduction's expected result itself:
 * the f32 sum in rank order, compared bit for bit with the deterministic
 * NCCL path (and with the MPI transport on host tensors: the same bits);
 * NCCL's own all-reduce (deterministic = 0) within the fp32 bound of any
 * order. Small scratch budgets (zt_comm_tune) force several rounds.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "ztrain.h"
#include "comm.h"
#include "mpi_ctest.h" /* CHECK, the tensors, the summary; the inputs */

static const char *MODE = "nccl";   /* or "mpi": device tensors staged through pinned memory */

static zt_tensor *tensor(int tier, int64_t n) { return mt_tensor(tier, ZT_CAT_OTHER, ZT_F32, n); }

/* all_reduce on a device tensor over NCCL (deterministic) and on a host
 * tensor over MPI: both the rank-order bits */
static void t_all_reduce(int64_t n, size_t scratch)
{
    char name[128];
    zt_comm_tune(scratch, 0);
    zt_tensor *d = tensor(ZT_TIER_DEVICE, n), *h = tensor(ZT_TIER_HOST, n);
    mt_put(d, 7, R, 0);
    mt_put(h, 7, R, 0);
    int rc = zt_all_reduce(W, d, NULL);
    int rh = zt_all_reduce(W, h, NULL);
    float *gd = mt_get(d), *gh = mt_get(h);
    int64_t bad = 0, badh = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        float want = mt_rank_sum(7, i);
        if (memcmp(&gd[i], &want, 4)) { bad++; if (first < 0) first = i; }
        badh += memcmp(&gh[i], &want, 4) != 0;
    }
    snprintf(name, sizeof name, "device all_reduce n=%lld scratch=%zu: rank-order bits",
             (long long)n, scratch);
    CHECK(name, rc == 0 && bad == 0, "rc %d (%s), %lld differ, first %lld", rc,
          rc ? zt_last_error() : "", (long long)bad, (long long)first);
    snprintf(name, sizeof name, "mpi all_reduce on the host, n=%lld: the same bits", (long long)n);
    CHECK(name, rh == 0 && badh == 0, "rc %d, %lld differ", rh, (long long)badh);
    free(gd); free(gh);
    zt_tensor_release(d); zt_tensor_release(h);
    zt_comm_tune(0, 0);
}

static void t_reduce_scatter(int64_t m)
{
    zt_comm_tune(4096, 0);          /* rounds of 4096 / (4 P) elements */
    zt_tensor *in = tensor(ZT_TIER_DEVICE, m * P), *out = tensor(ZT_TIER_DEVICE, m);
    mt_put(in, 9, R, 0);
    int rc = zt_reduce_scatter(W, out, in, NULL);
    float *g = mt_get(out);
    int64_t bad = 0;
    for (int64_t i = 0; i < m; i++) {
        float want = mt_rank_sum(9, R * m + i);
        bad += memcmp(&g[i], &want, 4) != 0;
    }
    CHECK("device reduce_scatter: rank-order bits", rc == 0 && bad == 0, "rc %d (%s), %lld differ",
          rc, rc ? zt_last_error() : "", (long long)bad);
    free(g);
    zt_tensor_release(in); zt_tensor_release(out);
    zt_comm_tune(0, 0);
}

/* The reduction reads what the compute stream wrote: SLOW queued axpys
 * before an asynchronous all_reduce, no host sync in between. */
static void t_ordered_after_compute(void)
{
    const int64_t n = 1 << 20;
    const int SLOW = 2000;
    zt_tensor *x = tensor(ZT_TIER_DEVICE, n), *ones = tensor(ZT_TIER_DEVICE, n);
    zt_fill(x, 0.0f);
    zt_fill(ones, 1.0f);
    for (int i = 0; i < SLOW; i++) zt_axpy(x, 1.0f, ones);
    zt_comm_req *req = NULL;
    int rc = zt_all_reduce(W, x, &req);
    if (rc == 0) rc = zt_comm_wait(req);
    float *g = mt_get(x);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += g[i] != (float)(SLOW * P);
    CHECK("device all_reduce waits for the issuing stream's kernels", rc == 0 && bad == 0,
          "rc %d, %lld of %lld not %d (g[0] = %g)", rc, (long long)bad, (long long)n, SLOW * P,
          g[0]);
    free(g);
    zt_tensor_release(x); zt_tensor_release(ones);
}

static void t_moves(void)
{
    const int64_t m = 100003;
    zt_tensor *in = tensor(ZT_TIER_DEVICE, m), *out = tensor(ZT_TIER_DEVICE, m * P);
    mt_put(in, 11, R, 0);
    int rc = zt_all_gather(W, out, in, NULL);
    float *g = mt_get(out);
    int64_t bad = 0;
    for (int r = 0; r < P; r++)
        for (int64_t i = 0; i < m; i++) bad += g[r * m + i] != val(11, r, i);
    CHECK("device all_gather", rc == 0 && bad == 0, "rc %d, %lld differ", rc, (long long)bad);
    free(g);
    mt_put(in, 13, R, 0);
    rc = zt_broadcast(W, in, P - 1, NULL);
    g = mt_get(in);
    bad = 0;
    for (int64_t i = 0; i < m; i++) bad += g[i] != val(13, P - 1, i);
    CHECK("device broadcast from the last rank", rc == 0 && bad == 0, "rc %d, %lld differ", rc,
          (long long)bad);
    free(g);
    if (P >= 2 && R < 2) {          /* rank 0 -> rank 1 */
        mt_put(in, 15, R, 0);
        rc = R == 0 ? zt_send(W, in, 1, 3, NULL) : zt_recv(W, in, 0, 3, NULL);
        g = mt_get(in);
        bad = 0;
        for (int64_t i = 0; i < m; i++) bad += g[i] != val(15, 0, i);
        CHECK("device send/recv", rc == 0 && bad == 0, "rc %d, %lld differ", rc, (long long)bad);
        free(g);
    }
    zt_tensor_release(in); zt_tensor_release(out);
}

/* A group split from the world keeps its transport (NCCL: ncclCommSplit). */
static void t_split(void)
{
    zt_comm *g = NULL;
    int rc = zt_comm_split(&g, W, 0, P - 1 - R);     /* everyone, reversed order */
    CHECK("a split group keeps the world's transport", rc == 0 && strcmp(zt_comm_backend(g), MODE) == 0,
          "rc %d (%s), backend %s", rc, rc ? zt_last_error() : "", rc ? "-" : zt_comm_backend(g));
    if (rc) return;
    int64_t bad = mt_all_reduce_reversed(g, 17, 4099, &rc);
    CHECK("all_reduce over the split group: its rank order", rc == 0 && bad == 0,
          "rc %d, %lld differ", rc, (long long)bad);
    zt_comm_free(g);
}

/* NCCL's own all-reduce (deterministic = 0) on g: within the fp32 bound
 * of a sum in any order, |err| <= (P - 1) 2^-24 sum |v| (here, not the bits). */
static void t_native(zt_comm *g)
{
    const int64_t n = 300007;
    zt_tensor *d = tensor(ZT_TIER_DEVICE, n);
    mt_put(d, 19, R, 0);
    int rc = zt_all_reduce(g, d, NULL);
    float *h = mt_get(d);
    int64_t bad = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double ex = 0, mag = 0;
        for (int r = 0; r < P; r++) { ex += val(19, r, i); mag += fabs(val(19, r, i)); }
        if (fabs(h[i] - ex) > (P - 1) * ldexp(1.0, -24) * mag + 1e-30) { bad++; worst = i; }
    }
    CHECK("nccl native all_reduce (deterministic = 0): within the fp32 bound", rc == 0 && bad == 0,
          "rc %d (%s), %lld outside, e.g. element %lld", rc, rc ? zt_last_error() : "",
          (long long)bad, (long long)worst);
    free(h);
    zt_tensor_release(d);
    rc = zt_comm_use_nccl(g, 1);
    CHECK("use_nccl(deterministic = 1) on a native nccl group is refused", rc == ZT_EINVAL,
          "rc %d", rc);
}

int main(int argc, char **argv)
{
    if (argc > 1) MODE = argv[1];
    if (strcmp(MODE, "nccl") != 0 && strcmp(MODE, "mpi") != 0) {
        printf("usage: test_cuda_nccl nccl|mpi\n");
        return 2;
    }
    const int nccl = strcmp(MODE, "nccl") == 0;
    const char *wr = getenv("OMPI_COMM_WORLD_RANK");
    int quiet = wr && atoi(wr) != 0;
    if (!zt_comm_launched()) {
        printf("cuda %s: not under an MPI launcher, skipped (make test-cuda runs it under "
               "mpirun -np 2)\n", MODE);
        return 0;
    }
    int ngpu = 0;
    if (zt_device_init("cuda") != ZT_OK || cudaGetDeviceCount(&ngpu) != cudaSuccess) {
        if (!quiet) printf("cuda %s: no GPU here, skipped (%s)\n", MODE, zt_last_error());
        return 0;
    }
    if (mt_init(1)) return 1;
    if (nccl && ngpu < P) {         /* the same answer on every rank of one node */
        if (R == 0) printf("cuda nccl: %d GPU(s) for %d ranks, skipped (NCCL needs one GPU "
                           "per rank)\n", ngpu, P);
        zt_comm_finalize();
        return 0;
    }
    if (R == 0) printf("== %s: %d ranks, %d GPU(s)\n", MODE, P, ngpu);
    zt_comm *native = NULL;         /* split while MPI: then NCCL without the rank order */
    if (nccl) {
        int rc = zt_comm_split(&native, W, 0, R);
        if (rc == 0) rc = zt_comm_use_nccl(native, 0);
        CHECK("a group joins NCCL with deterministic = 0", rc == 0, "rc %d (%s)", rc,
              rc ? zt_last_error() : "");
        if (rc) zt_comm_abort(1);
        rc = zt_comm_use_nccl(W, 1);
        CHECK("world joins NCCL", rc == 0 && strcmp(zt_comm_backend(W), "nccl") == 0,
              "rc %d (%s)", rc, rc ? zt_last_error() : "");
        if (rc) zt_comm_abort(1);
    }
    t_all_reduce(1000003, 0);
    t_all_reduce(10007, 4096);      /* many rounds */
    t_all_reduce(1, 0);             /* fewer elements than ranks */
    t_reduce_scatter(50001);
    t_ordered_after_compute();
    t_moves();
    t_split();
    if (nccl) {
        t_native(native);
        zt_comm_free(native);
    }
    return mt_finish();
}
