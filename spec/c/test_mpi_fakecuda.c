/*
 * test_mpi_fakecuda.c -- the MPI transport's staging of device tensors
 * (runtime/comm_stage.c, and comm_mpi.c's hooks) on the CPU, under mpirun,
 * through a device's execution table (internal.h's zt_exec_ops): this
 * file's device, named "cuda" and made the active one with
 * zt_device_install, whose memory the host cannot read directly -- its
 * bytes are stored XOR-ed with a mask, and only the device's copy and the
 * execution table's copy_blocking translate. MPI handed a device pointer
 * (no staging) would therefore move masked bytes: wrong results. Its fill
 * (a kernel) is queued on a fake compute stream and runs only when the host
 * waits (the device's copy, sync or free, or an event's sync up to where it
 * was recorded); copy_blocking is ordered after nothing, as cudaMemcpy
 * beside non-blocking streams, so staging that does not wait for the
 * issue event copies the bytes from before the fill. Host memory comes
 * from the table's host_alloc (pinned). The library is the CPU build's,
 * but for comm_nccl.c (CUDA-only: the Makefile compiles it here; it calls
 * cuda_stream.h's zt_cuda_* functions and the CUDA runtime, faked below).
 *
 * Every collective on device tensors, in place and not, with rounds (small
 * scratch), against the rank-order sums every rank computes itself (bits),
 * and the staging buffers accounted on the host tier and freed after; a
 * collective issued right after a queued fill reduces the filled values.
 * Then the same through comm_nccl.c (zt_comm_use_nccl on the world)
 * against a fake NCCL that moves the masked bytes over MPI: the
 * deterministic all-to-all + ordered-sum algorithm gives the rank-order
 * bits, its receive buffer kept by the communicator (reused, nothing else
 * allocated) and freed with it; splits, NCCL's native reductions, and an
 * NCCL error's message.
 * Rank 0 prints "N passed, N failed" over all ranks.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include "comm.h"
#include "kernels.h"
#include "fake_pinned.h"
#include "mpi_ctest.h" /* CHECK, the tensors, the summary; the inputs */

/* ---- the fake device: masked memory ------------------------------------------ */
#define MASK 0xA5u
enum { MAXA = 256 };
static struct { char *p; size_t n; } allocs[MAXA];
static pthread_mutex_t fk = PTHREAD_MUTEX_INITIALIZER;
static zt_device_ops fake_table;
static long d2h, h2d;           /* copy_blocking calls by direction */
static pthread_t main_thread;

static int is_dev(const void *p)
{
    int r = 0;
    pthread_mutex_lock(&fk);
    for (int i = 0; i < MAXA && !r; i++)
        r = allocs[i].p && (const char *)p >= allocs[i].p && (const char *)p < allocs[i].p + allocs[i].n;
    pthread_mutex_unlock(&fk);
    return r;
}
static void xcopy(void *dst, const void *src, size_t n)
{
    int dd = is_dev(dst), sd = is_dev(src);
    unsigned char *d = dst;
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++) d[i] = (unsigned char)(s[i] ^ (dd != sd ? MASK : 0));
}

/* The fake compute stream: queued fills, run in order when the host waits.
 * An event is a position in it (the number of fills issued when recorded). */
typedef struct qfill { float *x; float v; size_t n; struct qfill *next; } qfill;
typedef struct { long pos; } fev;
static pthread_mutex_t qk = PTHREAD_MUTEX_INITIALIZER;
static qfill *qhead, *qtail;
static long q_issued, q_done;

static void q_run_to(long pos)          /* qk held */
{
    while (q_done < pos && qhead) {
        qfill *f = qhead;
        qhead = f->next;
        if (!qhead) qtail = NULL;
        union { float f; unsigned char b[4]; } u = { .f = f->v };
        unsigned char *d = (unsigned char *)f->x;
        for (size_t i = 0; i < f->n * 4; i++) d[i] = (unsigned char)(u.b[i % 4] ^ MASK);
        free(f);
        q_done++;
    }
}
static void q_run(long pos) { pthread_mutex_lock(&qk); q_run_to(pos); pthread_mutex_unlock(&qk); }
static void q_drain(void) { q_run(__atomic_load_n(&q_issued, __ATOMIC_RELAXED)); }
static long q_pos(void) { pthread_mutex_lock(&qk); long p = q_issued; pthread_mutex_unlock(&qk); return p; }

static int f_alloc(void **out, size_t n)
{
    char *p = malloc(n ? n : 64);
    if (!p) return ZT_ENOMEM;
    pthread_mutex_lock(&fk);
    for (int i = 0; i < MAXA; i++) if (!allocs[i].p) { allocs[i].p = p; allocs[i].n = n; break; }
    pthread_mutex_unlock(&fk);
    *out = p;
    return ZT_OK;
}
static void f_free(void *p)             /* cudaFree: the device's work first */
{
    q_drain();
    pthread_mutex_lock(&fk);
    for (int i = 0; i < MAXA; i++) if (allocs[i].p == p) allocs[i].p = NULL;
    pthread_mutex_unlock(&fk);
    free(p);
}
static void f_zero(void *p, size_t n) { q_drain(); memset(p, MASK, n); }
static int f_sync(void) { q_drain(); return ZT_OK; }
static void f_copy(void *dst, const void *src, size_t n) { q_drain(); xcopy(dst, src, n); }
static void f_fill(float *x, float v, size_t n)
{
    qfill *f = malloc(sizeof *f);
    if (!f) { fprintf(stderr, "out of memory\n"); exit(2); }
    *f = (qfill){ x, v, n, NULL };
    pthread_mutex_lock(&qk);
    if (qtail) qtail->next = f; else qhead = f;
    qtail = f;
    q_issued++;
    pthread_mutex_unlock(&qk);
}

/* ---- the fake device's execution table (what comm_stage.c and memory.c call) --- */
static long events_live, binds_off_main;
static int x_event_new(void **out)
{
    fev *e = calloc(1, sizeof *e);
    if (!e) return ZT_ENOMEM;
    __atomic_add_fetch(&events_live, 1, __ATOMIC_RELAXED);
    *out = e;
    return ZT_OK;
}
static void x_event_free(void *e)
{
    if (!e) return;
    __atomic_sub_fetch(&events_live, 1, __ATOMIC_RELAXED);
    free(e);
}
static int x_event_record(void *e, void *s) { (void)s; ((fev *)e)->pos = q_pos(); return ZT_OK; }
static int x_event_sync(void *e) { q_run(((fev *)e)->pos); return ZT_OK; }
static int x_event_query(void *e, int *done)
{
    pthread_mutex_lock(&qk);
    *done = q_done >= ((fev *)e)->pos;
    pthread_mutex_unlock(&qk);
    return ZT_OK;
}
static int x_stream_wait_event(void *s, void *e) { (void)s; (void)e; return ZT_OK; }
static int x_bind_thread(void)
{
    if (!pthread_equal(pthread_self(), main_thread)) __atomic_add_fetch(&binds_off_main, 1, __ATOMIC_RELAXED);
    return ZT_OK;
}
/* ordered after nothing (CUDA's cudaMemcpy beside non-blocking streams) */
static int x_copy_blocking(void *dst, const void *src, size_t n)
{
    int dd = is_dev(dst), sd = is_dev(src);
    if (sd && !dd) __atomic_add_fetch(&d2h, 1, __ATOMIC_RELAXED);
    if (dd && !sd) __atomic_add_fetch(&h2d, 1, __ATOMIC_RELAXED);
    xcopy(dst, src, n);
    return ZT_OK;
}
/* one stream, the compute stream (this test makes no zt_stream) */
static int x_stream_new(void **out, int kind) { (void)kind; *out = &qhead; return ZT_OK; }
static void x_stream_free(void *s) { (void)s; q_drain(); }
static int x_stream_sync(void *s) { (void)s; q_drain(); return ZT_OK; }
static void x_set_stream(void *s) { (void)s; }
static void *x_compute_stream(void) { return &qhead; }
static int x_copy_async(void *dst, const void *src, size_t n, void *s)
{
    (void)s;
    q_drain();
    xcopy(dst, src, n);
    return ZT_OK;
}

static const zt_exec_ops fake_exec = {
    .stream_new = x_stream_new, .stream_free = x_stream_free, .stream_sync = x_stream_sync,
    .set_stream = x_set_stream, .compute_stream = x_compute_stream, .bind_thread = x_bind_thread,
    .event_new = x_event_new, .event_free = x_event_free, .event_record = x_event_record,
    .stream_wait_event = x_stream_wait_event, .event_sync = x_event_sync,
    .event_query = x_event_query, .copy_async = x_copy_async, .copy_blocking = x_copy_blocking,
    .host_alloc = fake_host_alloc, .host_free = fake_host_free, .is_pinned = fake_is_pinned,
};

/* ---- the CUDA calls comm_nccl.c makes outside NCCL (cuda_stream.h's, and the
 * runtime's): its events are the fake's, positions in the fake compute stream */
int zt_cuda_event_new(void **out, int timing) { (void)timing; return x_event_new(out); }
int zt_cuda_event_record(void *e, void *s) { return x_event_record(e, s); }
void zt_cuda_event_free(void *e) { x_event_free(e); }
int zt_cuda_bind_thread(void) { return x_bind_thread(); }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { x_event_sync(e); return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { x_event_free(e); return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorName(cudaError_t e) { (void)e; return "fake"; }
const char *cudaGetErrorString(cudaError_t e) { (void)e; return "fake"; }

/* ---- the fake CUDA and NCCL comm_nccl.c calls --------------------------------------
 * Every call completes at once on the calling (communication) thread; NCCL
 * transfers are MPI messages on MPI_COMM_WORLD (or its split) with their own
 * tag, reading and writing device memory through the mask (so a device op
 * that reached MPI directly instead would move masked bytes). */
enum { NTAG = 31000 };
struct ncclComm { MPI_Comm mpi; };
static long nccl_calls;
static int in_group;
typedef struct { int send; void *dev; size_t n; int peer; MPI_Comm c; char *tmp; } pend;
static pend group[64];
static int ngroup;

static char *dec(const void *dev, size_t n) { char *t = malloc(n + 1); xcopy(t, dev, n); return t; }

cudaError_t cudaDeviceGetStreamPriorityRange(int *lo, int *hi) { *lo = 0; *hi = -1; return cudaSuccess; }
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned f, int p)
{ (void)f; (void)p; *s = (cudaStream_t)malloc(1); return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t s) { free(s); return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t s) { (void)s; return cudaSuccess; }
/* the NCCL stream runs at once: its wait runs the compute stream up to the event */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned f) { (void)s; (void)f; x_event_sync(e); return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f) { (void)f; x_event_new((void **)e); return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { (void)s; ((fev *)e)->pos = 0; return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t e) { (void)e; return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void *d, const void *src, size_t n, enum cudaMemcpyKind k, cudaStream_t s)
{ (void)k; (void)s; xcopy(d, src, n); return cudaSuccess; }
int zkc_sum_ranks(cudaStream_t s, float *dst, const float *src, int nsrc, size_t n)
{
    (void)s;
    float *in = (float *)dec(src, (size_t)nsrc * n * 4), *out = malloc(n * 4 + 1);
    zk_sum_ranks(out, in, nsrc, n);
    xcopy(dst, out, n * 4);     /* host -> device: masked */
    free(in); free(out);
    return 0;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) { memset(id, 7, sizeof *id); return ncclSuccess; }
ncclResult_t ncclCommInitRank(ncclComm_t *c, int n, ncclUniqueId id, int r)
{
    (void)n; (void)id; (void)r;
    *c = calloc(1, sizeof **c);
    MPI_Comm_dup(MPI_COMM_WORLD, &(*c)->mpi);   /* the test attaches world-ordered groups */
    return ncclSuccess;
}
ncclResult_t ncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t *out, ncclConfig_t *cfg)
{
    (void)cfg;
    *out = calloc(1, sizeof **out);
    MPI_Comm_split(c->mpi, color, key, &(*out)->mpi);
    return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t c) { MPI_Comm_free(&c->mpi); free(c); return ncclSuccess; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *e) { (void)c; *e = ncclSuccess; return ncclSuccess; }
const char *ncclGetErrorString(ncclResult_t r) { (void)r; return "fake"; }
const char *ncclGetLastError(ncclComm_t c) { (void)c; return ""; }
static void flush_group(void)
{
    MPI_Request rq[64];
    for (int i = 0; i < ngroup; i++) {
        pend *g = &group[i];
        if (g->send) {
            g->tmp = dec(g->dev, g->n);
            MPI_Isend(g->tmp, (int)g->n, MPI_BYTE, g->peer, NTAG, g->c, &rq[i]);
        } else {
            g->tmp = malloc(g->n + 1);
            MPI_Irecv(g->tmp, (int)g->n, MPI_BYTE, g->peer, NTAG, g->c, &rq[i]);
        }
    }
    MPI_Waitall(ngroup, rq, MPI_STATUSES_IGNORE);
    for (int i = 0; i < ngroup; i++) {
        if (!group[i].send) xcopy(group[i].dev, group[i].tmp, group[i].n);
        free(group[i].tmp);
    }
    ngroup = 0;
}
ncclResult_t ncclGroupStart(void) { in_group = 1; return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { in_group = 0; flush_group(); return ncclSuccess; }
static size_t tsize(ncclDataType_t t) { return t == ncclFloat ? 4 : 1; }
static ncclResult_t p2p(int send, const void *buf, size_t cnt, ncclDataType_t t, int peer, ncclComm_t c)
{
    __atomic_add_fetch(&nccl_calls, 1, __ATOMIC_RELAXED);
    if (ngroup == 64) return ncclInternalError;
    group[ngroup++] = (pend){ send, (void *)buf, cnt * tsize(t), peer, c->mpi, NULL };
    if (!in_group) flush_group();
    return ncclSuccess;
}
ncclResult_t ncclSend(const void *b, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s)
{ (void)s; return p2p(1, b, n, t, peer, c); }
ncclResult_t ncclRecv(void *b, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s)
{ (void)s; return p2p(0, b, n, t, peer, c); }
ncclResult_t ncclAllReduce(const void *sb, void *rb, size_t n, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t c, cudaStream_t s)
{
    (void)t; (void)op; (void)s;
    __atomic_add_fetch(&nccl_calls, 1, __ATOMIC_RELAXED);
    float *in = (float *)dec(sb, n * 4), *out = malloc(n * 4 + 1);
    MPI_Allreduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, c->mpi);     /* MPI's order: not the bits */
    xcopy(rb, out, n * 4);
    free(in); free(out);
    return ncclSuccess;
}
ncclResult_t ncclReduceScatter(const void *sb, void *rb, size_t n, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t c, cudaStream_t s)
{ (void)sb; (void)rb; (void)n; (void)t; (void)op; (void)c; (void)s; return ncclInvalidUsage; }
ncclResult_t ncclAllGather(const void *sb, void *rb, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t s)
{
    (void)s;
    __atomic_add_fetch(&nccl_calls, 1, __ATOMIC_RELAXED);
    int p = 0;
    MPI_Comm_size(c->mpi, &p);
    size_t b = n * tsize(t);
    char *in = dec(sb, b), *out = malloc(b * (size_t)p + 1);
    MPI_Allgather(in, (int)b, MPI_BYTE, out, (int)b, MPI_BYTE, c->mpi);
    xcopy(rb, out, b * (size_t)p);
    free(in); free(out);
    return ncclSuccess;
}
ncclResult_t ncclBroadcast(const void *sb, void *rb, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t s)
{
    (void)s;
    __atomic_add_fetch(&nccl_calls, 1, __ATOMIC_RELAXED);
    size_t b = n * tsize(t);
    char *buf = dec(sb, b);
    MPI_Bcast(buf, (int)b, MPI_BYTE, root, c->mpi);
    xcopy(rb, buf, b);
    free(buf);
    return ncclSuccess;
}

/* ---- checks -------------------------------------------------------------------- */
static int NCCL;                /* 0: the staged MPI checks; 1: W runs NCCL */
static char nm[160];
/* a check's name, prefixed by the path under test */
static const char *N(const char *fmt, ...)
{
    va_list ap;
    int k = snprintf(nm, sizeof nm, "%s ", NCCL ? "nccl:" : "staged mpi:");
    va_start(ap, fmt);
    vsnprintf(nm + k, sizeof nm - (size_t)k, fmt, ap);
    va_end(ap);
    return nm;
}
static zt_tensor *dev(int64_t n) { return mt_tensor(ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, n); }
static int64_t diff_bits(const float *g, const float *w, int64_t n)
{
    int64_t b = 0;
    for (int64_t i = 0; i < n; i++) b += memcmp(&g[i], &w[i], 4) != 0;
    return b;
}

static void t_all_reduce(int64_t n, size_t scratch)
{
    zt_comm_tune(scratch, 0);
    zt_tensor *x = dev(n);
    mt_put(x, 3, R, 0);
    zt_mem_reset_peak();
    size_t host0 = zt_mem_current(ZT_TIER_HOST, ZT_CAT_COMM);
    long pm0 = fake_pinned_made, pl0 = fake_pinned_live;
    int rc = zt_all_reduce(W, x, NULL);
    if (!NCCL)
        CHECK("staging buffers are the device's pinned memory (exec->host_alloc), given back "
              "(exec->host_free)", fake_pinned_made > pm0 && fake_pinned_live == pl0,
              "pinned allocations %ld, live %ld -> %ld", fake_pinned_made - pm0, pl0, fake_pinned_live);
    float *g = mt_get(x), *w = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) w[i] = mt_rank_sum(3, i);
    CHECK(N("device all_reduce n=%lld scratch=%zu: rank-order bits", (long long)n, scratch), rc == 0 && diff_bits(g, w, n) == 0, "rc %d (%s), %lld differ", rc,
          rc ? zt_last_error() : "", (long long)diff_bits(g, w, n));
    /* staged: every buffer freed after the operation; NCCL: the receive
     * buffer stays with the communicator (comm_nccl.c's receive_buffer):
     * no other device bytes at the operation's peak, none left on the host */
    size_t dcur = zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_COMM);
    CHECK(N(NCCL ? "comm buffers: the receive buffer kept, nothing else" : "comm buffers freed after the operation"),
          zt_mem_current(ZT_TIER_HOST, ZT_CAT_COMM) == host0 &&
          (NCCL ? dcur == zt_mem_peak(ZT_TIER_DEVICE, ZT_CAT_COMM) : dcur == 0),
          "host comm bytes %zu -> %zu, device %zu (peak %zu)", host0,
          zt_mem_current(ZT_TIER_HOST, ZT_CAT_COMM), dcur, zt_mem_peak(ZT_TIER_DEVICE, ZT_CAT_COMM));
    if (NCCL) {                     /* the same operation again: the kept buffer serves it */
        zt_mem_reset_peak();
        rc = zt_all_reduce(W, x, NULL);
        CHECK(N("device all_reduce n=%lld again: its receive buffer reused, no allocation", (long long)n),
              rc == 0 && zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_COMM) == dcur &&
              zt_mem_peak(ZT_TIER_DEVICE, ZT_CAT_COMM) == dcur, "rc %d, device comm %zu -> %zu, peak %zu",
              rc, dcur, zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_COMM), zt_mem_peak(ZT_TIER_DEVICE, ZT_CAT_COMM));
    }
    /* staged: MPI's receive scratch must be host memory (MPI cannot write a
     * GPU's); NCCL: the ordered sum's scratch is device memory, none on the host */
    size_t dpk = zt_mem_peak(ZT_TIER_DEVICE, ZT_CAT_COMM), hpk = zt_mem_peak(ZT_TIER_HOST, ZT_CAT_COMM);
    CHECK(N("comm scratch on the %s tier", NCCL ? "device" : "host"),
          NCCL ? (n < P || dpk > 0) && hpk == host0 : dpk == 0, "device comm peak %zu, host %zu",
          dpk, hpk);
    free(g); free(w);
    zt_tensor_release(x);
    zt_comm_tune(0, 0);
}

/* in place: out is rank R's chunk of in */
static void t_reduce_scatter(int inplace)
{
    const int64_t m = 3001;
    zt_tensor *in = dev(m * P), *out = NULL;
    mt_put(in, 5, R, 0);
    if (inplace) zt_tensor_view(&out, in, R * m, 1, (int64_t[]){ m });
    else out = dev(m);
    zt_mem_reset_peak();
    size_t c0 = zt_mem_current(ZT_TIER_HOST, ZT_CAT_COMM);
    int rc = zt_reduce_scatter(W, out, in, NULL);
    /* staging: in's bytes, plus out's unless out lies inside in; and MPI's
     * receive scratch (P x m floats: one round at the default budget) */
    size_t want = (size_t)(m * P + (inplace ? 0 : m)) * 4 + (size_t)(P * m) * 4;
    size_t peak = zt_mem_peak(ZT_TIER_HOST, ZT_CAT_COMM) - c0;
    if (!NCCL)
        CHECK(inplace ? "in place: one staging buffer, scratch on the host"
                      : "not in place: two staging buffers, scratch on the host",
              peak == want, "host comm peak %zu bytes, expected %zu", peak, want);
    float *g = mt_get(out), *w = malloc((size_t)m * 4);
    for (int64_t i = 0; i < m; i++) w[i] = mt_rank_sum(5, R * m + i);
    CHECK(N(inplace ? "device reduce_scatter in place: bits" : "device reduce_scatter: bits"),
          rc == 0 && diff_bits(g, w, m) == 0, "rc %d (%s), %lld differ", rc,
          rc ? zt_last_error() : "", (long long)diff_bits(g, w, m));
    free(g); free(w);
    zt_tensor_release(out);
    zt_tensor_release(in);
}

static void t_all_gather(int inplace)
{
    const int64_t m = 1000;
    zt_tensor *out = dev(m * P), *in = NULL;
    if (inplace) zt_tensor_view(&in, out, R * m, 1, (int64_t[]){ m });
    else in = dev(m);
    mt_put(in, 7, R, 0);
    int rc = zt_all_gather(W, out, in, NULL);
    float *g = mt_get(out);
    int64_t bad = 0;
    for (int r = 0; r < P; r++)
        for (int64_t i = 0; i < m; i++) bad += g[r * m + i] != val(7, r, i);
    CHECK(N(inplace ? "device all_gather in place" : "device all_gather"), rc == 0 && bad == 0,
          "rc %d (%s), %lld differ", rc, rc ? zt_last_error() : "", (long long)bad);
    free(g);
    zt_tensor_release(in);
    zt_tensor_release(out);
}

static void t_bcast_p2p(void)
{
    const int64_t n = 777;
    zt_tensor *x = dev(n);
    mt_put(x, 9, R, 0);
    int rc = zt_broadcast(W, x, P - 1, NULL);
    float *g = mt_get(x);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += g[i] != val(9, P - 1, i);
    CHECK(N("device broadcast"), rc == 0 && bad == 0, "rc %d, %lld differ", rc, (long long)bad);
    free(g);
    if (R < 2) {
        mt_put(x, 11, R, 0);
        rc = R == 0 ? zt_send(W, x, 1, 5, NULL) : zt_recv(W, x, 0, 5, NULL);
        g = mt_get(x);
        bad = 0;
        for (int64_t i = 0; i < n; i++) bad += g[i] != val(11, 0, i);
        CHECK(N("device send/recv"), rc == 0 && bad == 0, "rc %d, %lld differ", rc, (long long)bad);
        free(g);
    }
    zt_tensor_release(x);
}

/* A collective issued right after a fill still queued on the compute
 * stream reduces the filled values: the operation waits for the event
 * recorded at its issue (staged: comm_stage.c's event_sync before its
 * copy_blocking, which is ordered after nothing; NCCL: the NCCL stream waits
 * for it). Unordered, the collective would reduce the bytes from before the
 * fill, and the fill would then overwrite its result. */
static void t_after_fill(void)
{
    const int64_t n = 4097;
    zt_tensor *x = dev(n);
    mt_put(x, 17, R, 0);
    zt_fill(x, (float)(R + 1));
    int rc = zt_all_reduce(W, x, NULL);
    float *g = mt_get(x);
    float want = (float)P * (float)(P + 1) / 2;     /* small integers: exact in any order */
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += g[i] != want;
    CHECK(N("device all_reduce right after a queued fill reduces the filled values (ordered by "
            "the event recorded at its issue)"), rc == 0 && bad == 0,
          "rc %d (%s), %lld of %lld differ (element 0: %g, want %g)", rc,
          rc ? zt_last_error() : "", (long long)bad, (long long)n, g[0], want);
    free(g);
    zt_tensor_release(x);
}

static void run_all(void)
{
    t_after_fill();
    t_all_reduce(100003, 0);
    t_all_reduce(1001, 256);    /* rounds */
    t_all_reduce(1, 0);
    t_reduce_scatter(0);
    t_reduce_scatter(1);
    t_all_gather(0);
    t_all_gather(1);
    t_bcast_p2p();
}

/* a group split from the NCCL world: NCCL (ncclCommSplit), its rank order */
static void t_split_nccl(void)
{
    zt_comm *g = NULL;
    int rc = zt_comm_split(&g, W, 0, P - 1 - R);
    CHECK("nccl: a split group is nccl", rc == 0 && !strcmp(zt_comm_backend(g), "nccl"),
          "rc %d (%s)", rc, rc ? zt_last_error() : "");
    if (rc) return;
    size_t d0 = zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_COMM);
    int64_t bad = mt_all_reduce_reversed(g, 13, 4099, &rc);
    CHECK("nccl: all_reduce over the split group sums in its rank order", rc == 0 && bad == 0,
          "rc %d, %lld differ", rc, (long long)bad);
    size_t d1 = zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_COMM);
    zt_comm_free(g);                /* queued to the communication thread: nobody waits */
    for (int k = 0; k < 10000 && zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_COMM) != d0; k++) {
        struct timespec ms = { 0, 1000000 };
        nanosleep(&ms, NULL);
    }
    CHECK("nccl: a group's receive buffer kept while it lives, freed with it",
          d1 > d0 && zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_COMM) == d0,
          "device comm bytes %zu, with the group's %zu, after its free %zu", d0, d1,
          zt_mem_current(ZT_TIER_DEVICE, ZT_CAT_COMM));
}

/* deterministic = 0: NCCL's own reductions (the fake: MPI_Allreduce), and an
 * NCCL failure reported with file:line (the fake's ncclReduceScatter fails) */
static void t_native(zt_comm *g)
{
    const int64_t n = 5003;
    zt_tensor *x = dev(n), *big = dev(n * P);
    mt_put(x, 15, R, 0);
    int rc = zt_all_reduce(g, x, NULL);
    float *h = mt_get(x);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double ex = 0, mag = 0;
        for (int r = 0; r < P; r++) { ex += val(15, r, i); mag += fabs(val(15, r, i)); }
        bad += fabs(h[i] - ex) > P * ldexp(1.0, -24) * mag;
    }
    CHECK("nccl native: all_reduce by ncclAllReduce, within the fp32 bound", rc == 0 && bad == 0,
          "rc %d, %lld outside", rc, (long long)bad);
    free(h);
    rc = zt_reduce_scatter(g, x, big, NULL);
    const char *e = zt_last_error();
    CHECK("nccl native: a failing NCCL call is an error naming it, file:line",
          rc == ZT_EIO && strstr(e, "comm_nccl.c:") && strstr(e, "ncclReduceScatter") &&
          strstr(e, "nccl: "), "rc %d: %s", rc, e);
    rc = zt_comm_use_nccl(g, 1);
    CHECK("nccl: a group's deterministic flag cannot change", rc == ZT_EINVAL, "rc %d", rc);
    zt_tensor_release(x);
    zt_tensor_release(big);
}

int main(void)
{
    main_thread = pthread_self();
    fake_table = zt_cpu_device;
    fake_table.name = "cuda";
    fake_table.exec = &fake_exec;
    fake_table.alloc = f_alloc;
    fake_table.free = f_free;
    fake_table.zero = f_zero;
    fake_table.copy = f_copy;
    fake_table.fill = f_fill;
    fake_table.sync = f_sync;
    zt_device_install(&fake_table);
    if (mt_init(1)) return 1;
    run_all();
    CHECK("the fake saw the copies (staging ran through exec->copy_blocking)", d2h > 0 && h2d > 0,
          "d2h %ld h2d %ld", d2h, h2d);
    CHECK("the communication thread bound itself to the device (exec->bind_thread) and every "
          "issue event was freed", binds_off_main > 0 && events_live == 0,
          "binds off the main thread %ld, events live %ld", binds_off_main, events_live);

    /* NCCL: a group with NCCL's own all-reduce, then the world, deterministic */
    zt_comm *native = NULL;
    int rc = zt_comm_split(&native, W, 0, R);
    if (!rc) rc = zt_comm_use_nccl(native, 0);
    if (!rc) rc = zt_comm_use_nccl(W, 1);
    CHECK("world and a group join NCCL", rc == 0 && !strcmp(zt_comm_backend(W), "nccl") &&
          !strcmp(zt_comm_backend(native), "nccl"), "rc %d (%s)", rc, rc ? zt_last_error() : "");
    if (rc) zt_comm_abort(1);
    NCCL = 1;
    long d0 = d2h, c0 = nccl_calls;
    run_all();
    CHECK("nccl: device operations went to NCCL, not to MPI staging", d2h == d0 && nccl_calls > c0,
          "staging copies %ld, nccl calls %ld", d2h - d0, nccl_calls - c0);
    t_split_nccl();
    t_native(native);
    zt_comm_free(native);
    return mt_finish();
}
