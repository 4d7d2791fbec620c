/*
 * test_comm_local.c -- the world of a process started without an MPI
 * launcher: one rank, backend "local", MPI never initialised; every
 * collective is an identity or a copy, requests complete at once. (How
 * long the world takes to start is measured by tools/bench_comm_stats.c,
 * not asserted here: that it never starts MPI is.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <mpi.h>
#include "internal.h"     /* white-box: reads zt_tensor's fields */
#include "mpi_ctest.h"  /* CHECK (one process: R = P = 0), the tensors, the summary */

static zt_tensor *mk(int dtype, int64_t n, float base)
{
    zt_tensor *t = mt_tensor(ZT_TIER_DEVICE, ZT_CAT_ACTIVATIONS, dtype, n);
    if (dtype == ZT_F32)
        for (int64_t i = 0; i < n; i++) ((float *)t->data)[i] = base + (float)i * 0.37f;
    return t;
}

/* zt_comm_launched reads the environment the way zt_comm_world decides. */
static void test_launched(void)
{
    CHECK("no launcher: local", zt_comm_launched() == 0, "%d", zt_comm_launched());
    setenv("PMI_RANK", "0", 1);
    CHECK("PMI_RANK alone is not a launcher", zt_comm_launched() == 0, "%d", zt_comm_launched());
    setenv("PMI_SIZE", "2", 1);
    CHECK("PMI_RANK + PMI_SIZE: MPI", zt_comm_launched() == 1, "%d", zt_comm_launched());
    setenv("ZTRAIN_COMM", "local", 1);
    CHECK("ZTRAIN_COMM=local wins", zt_comm_launched() == 0, "%d", zt_comm_launched());
    setenv("ZTRAIN_COMM", "mpii", 1);
    CHECK("a bad ZTRAIN_COMM is -1", zt_comm_launched() == -1, "%d", zt_comm_launched());
    zt_comm *w = NULL;
    int rc = zt_comm_world(&w);
    CHECK("and zt_comm_world names it", rc == ZT_EINVAL && strstr(zt_last_error(), "'mpii'"),
          "rc %d: %s", rc, zt_last_error());
    unsetenv("ZTRAIN_COMM"); unsetenv("PMI_RANK"); unsetenv("PMI_SIZE");
}

int main(void)
{
    test_launched();
    zt_comm *w = NULL;
    size_t comm0 = zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_COMM);
    int rc = zt_comm_world(&w);
    CHECK("world without a launcher", rc == ZT_OK && w != NULL, "rc %d (%s)", rc, zt_last_error());
    if (rc != ZT_OK) return mt_report(passed, failed);
    CHECK("backend local, size 1, rank 0", strcmp(zt_comm_backend(w), "local") == 0 &&
          zt_comm_size(w) == 1 && zt_comm_rank(w) == 0, "backend %s size %d rank %d",
          zt_comm_backend(w), zt_comm_size(w), zt_comm_rank(w));
    int inited0 = 1;
    MPI_Initialized(&inited0);
    CHECK("the local world starts without MPI", inited0 == 0, "MPI_Initialized says %d", inited0);

    /* identities */
    zt_tensor *x = mk(ZT_F32, 1001, 1.25f), *ref = mk(ZT_F32, 1001, 1.25f);
    rc = zt_all_reduce(w, x, NULL);
    CHECK("all_reduce is the identity", rc == ZT_OK && memcmp(x->data, ref->data, 1001 * 4) == 0,
          "rc %d", rc);
    rc = zt_broadcast(w, x, 0, NULL);
    CHECK("broadcast from root 0 is the identity",
          rc == ZT_OK && memcmp(x->data, ref->data, 1001 * 4) == 0, "rc %d", rc);
    CHECK("barrier", zt_barrier(w, NULL) == ZT_OK, "%s", zt_last_error());
    zt_comm_stats st0, st1;
    zt_comm_stats_get(w, &st0);
    zt_comm_req *qf = NULL;
    rc = zt_comm_fence(w, NULL) | zt_comm_fence(w, &qf);
    rc |= qf ? zt_comm_wait(qf) : ZT_EIO;
    zt_comm_stats_get(w, &st1);
    CHECK("a fence on one rank succeeds, blocking or not, and is not counted",
          rc == ZT_OK && st1.calls == st0.calls, "rc %d (%s), calls %llu -> %llu", rc, zt_last_error(),
          (unsigned long long)st0.calls, (unsigned long long)st1.calls);

    /* copies */
    zt_tensor *out = mk(ZT_F32, 1001, 0);
    rc = zt_reduce_scatter(w, out, x, NULL);
    CHECK("reduce_scatter copies in to out", rc == ZT_OK &&
          memcmp(out->data, ref->data, 1001 * 4) == 0, "rc %d", rc);
    rc = zt_reduce_scatter(w, x, x, NULL);
    CHECK("reduce_scatter in place", rc == ZT_OK && memcmp(x->data, ref->data, 1001 * 4) == 0,
          "rc %d (%s)", rc, zt_last_error());
    zt_tensor *gi = mk(ZT_BF16, 77, 0), *go = mk(ZT_BF16, 77, 0);
    for (int i = 0; i < 77; i++) ((uint16_t *)gi->data)[i] = (uint16_t)(i * 31 + 5);
    rc = zt_all_gather(w, go, gi, NULL);
    CHECK("all_gather copies (bf16)", rc == ZT_OK && memcmp(go->data, gi->data, 77 * 2) == 0,
          "rc %d", rc);

    /* async */
    zt_comm_req *q1 = NULL, *q2 = NULL, *q3 = NULL;
    zt_tensor *o2 = mk(ZT_F32, 1001, 0);
    rc = zt_all_reduce(w, x, &q1) | zt_all_gather(w, o2, x, &q2) | zt_barrier(w, &q3);
    int d1 = 0, d2 = 0, d3 = 0;
    int trc = zt_comm_test(q1, &d1) | zt_comm_test(q2, &d2) | zt_comm_test(q3, &d3);
    CHECK("async requests are complete at once", rc == 0 && trc == 0 && d1 && d2 && d3 &&
          q1 && q2 && q3, "rc %d test %d done %d %d %d", rc, trc, d1, d2, d3);
    int w3 = zt_comm_wait(q3), w1 = zt_comm_wait(q1), w2 = zt_comm_wait(q2);
    CHECK("wait in another order", w1 == 0 && w2 == 0 && w3 == 0 &&
          memcmp(o2->data, ref->data, 1001 * 4) == 0, "waits %d %d %d", w1, w2, w3);

    /* groups */
    zt_comm *g = NULL;
    rc = zt_comm_split(&g, w, 5, 0);
    CHECK("split gives a one-rank group", rc == ZT_OK && g && g != w && zt_comm_size(g) == 1 &&
          zt_comm_rank(g) == 0 && strcmp(zt_comm_backend(g), "local") == 0, "rc %d", rc);
    rc = zt_all_reduce(g, x, NULL);
    CHECK("all_reduce on the group", rc == ZT_OK && memcmp(x->data, ref->data, 1001 * 4) == 0,
          "rc %d", rc);
    zt_comm_free(g);
    zt_comm_free(w);
    CHECK("world survives zt_comm_free(world)", zt_barrier(w, NULL) == ZT_OK, "%s",
          zt_last_error());

    /* host variants */
    double me = 2.5, all = 0;
    rc = zt_comm_all_gather_host(w, &all, &me, sizeof me);
    CHECK("all_gather_host copies", rc == ZT_OK && all == 2.5, "rc %d", rc);
    char buf[8] = "abc";
    rc = zt_comm_broadcast_host(w, buf, sizeof buf, 0);
    CHECK("broadcast_host is the identity", rc == ZT_OK && strcmp(buf, "abc") == 0, "rc %d", rc);

    /* errors */
    zt_tensor *small = mk(ZT_F32, 10, 0), *h = mk(ZT_BF16, 1001, 0);
    rc = zt_reduce_scatter(w, small, x, NULL);
    CHECK("reduce_scatter size mismatch is EINVAL", rc == ZT_EINVAL && has("size x numel(out)"),
          "rc %d %s", rc, zt_last_error());
    rc = zt_all_reduce(w, h, NULL);
    CHECK("all_reduce of bf16 is EINVAL", rc == ZT_EINVAL && has("f32"), "rc %d %s", rc,
          zt_last_error());
    rc = zt_broadcast(w, x, 1, NULL);
    CHECK("broadcast root 1 is EINVAL", rc == ZT_EINVAL && has("root 1"), "rc %d %s", rc,
          zt_last_error());
    rc = zt_send(w, x, 0, 0, NULL);
    CHECK("send in a one-rank world is EINVAL", rc == ZT_EINVAL && has("itself"), "rc %d %s",
          rc, zt_last_error());
    zt_comm_req *q = NULL;
    rc = zt_recv(w, x, 1, 0, &q);
    CHECK("recv from a missing peer is EINVAL, no request", rc == ZT_EINVAL && q == NULL &&
          has("peer 1"), "rc %d %s", rc, zt_last_error());
    /* NCCL on the CPU device (or a build without it): the message names the
     * call and C things, no recipe key (the trainer's error adds
     * comm.backend=nccl: lua/ztrain/core/comm.lua use_nccl) */
    rc = zt_comm_use_nccl(w, 1);
    CHECK("zt_comm_use_nccl off the GPU is EINVAL naming the call, no recipe key",
          rc == ZT_EINVAL && strncmp(zt_last_error(), "zt_comm_use_nccl: ", 18) == 0 &&
          !has("comm.backend") && !has("device.backend"), "rc %d %s", rc, zt_last_error());
    /* the watchdog's names for its settings: the caller's, within bounds */
    char longname[80];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    rc = zt_comm_watch_names(longname, NULL);
    CHECK("zt_comm_watch_names refuses a name too long, naming the call",
          rc == ZT_EINVAL && has("zt_comm_watch_names: "), "rc %d %s", rc, zt_last_error());
    CHECK("zt_comm_watch_names: a caller's names, then the defaults back",
          zt_comm_watch_names("my.timeout", "my.check") == ZT_OK && zt_comm_watch_names("", "") == ZT_OK,
          "%s", zt_last_error());

    CHECK("no comm memory held", zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_COMM) == comm0,
          "%zu", zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_COMM));
    int inited = 1;
    MPI_Initialized(&inited);
    CHECK("MPI was never initialised", inited == 0, "MPI_Initialized says %d", inited);

    /* shutdown; a local world can be made again */
    CHECK("finalize", zt_comm_finalize() == ZT_OK, "%s", zt_last_error());
    zt_comm *wb = NULL;
    rc = zt_comm_world(&wb);
    CHECK("world again after finalize (local)", rc == ZT_OK && zt_comm_size(wb) == 1,
          "rc %d %s", rc, zt_last_error());
    zt_comm_finalize();
    setenv("ZTRAIN_COMM", "bogus", 1);
    rc = zt_comm_world(&wb);
    CHECK("ZTRAIN_COMM=bogus is EINVAL", rc == ZT_EINVAL && has("ZTRAIN_COMM") && wb == NULL,
          "rc %d %s", rc, zt_last_error());
    setenv("ZTRAIN_COMM", "local", 1);
    rc = zt_comm_world(&wb);
    CHECK("ZTRAIN_COMM=local", rc == ZT_OK && strcmp(zt_comm_backend(wb), "local") == 0,
          "rc %d %s", rc, zt_last_error());
    unsetenv("ZTRAIN_COMM");

    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        /* the test's tensors first: under valgrind (make valgrind) the
         * child's leak check would otherwise replace the exit code */
        zt_tensor_release(x); zt_tensor_release(ref); zt_tensor_release(out);
        zt_tensor_release(gi); zt_tensor_release(go); zt_tensor_release(o2);
        zt_tensor_release(small); zt_tensor_release(h);
        zt_comm_abort(7);
        _exit(99);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK("zt_comm_abort in a local world exits with the code", WIFEXITED(st) &&
          WEXITSTATUS(st) == 7, "status %d", st);

    zt_tensor_release(x); zt_tensor_release(ref); zt_tensor_release(out);
    zt_tensor_release(gi); zt_tensor_release(go); zt_tensor_release(o2);
    zt_tensor_release(small); zt_tensor_release(h);
    return mt_report(passed, failed);
}
