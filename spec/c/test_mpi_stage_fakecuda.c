/*
 * test_mpi_stage_fakecuda.c -- the MPI transport's staging of CUDA device
 * tensors (runtime/comm_stage.c, and comm_mpi.c's hooks) on the CPU, under
 * mpirun, against a fake CUDA: memory.c, tensor.c, comm_mpi.c and
 * comm_stage.c are compiled for this test with ZT_CUDA and zt_dev() = this
 * file's device, named "cuda", whose memory the host cannot read directly
 * -- its bytes are stored XOR-ed with a mask, and only the device's copy and
 * the fake cudaMemcpy translate. MPI handed a device
 * pointer (no staging) would therefore move masked bytes: wrong results.
 *
 * Every collective on device tensors, in place and not, with rounds (small
 * scratch), against the rank-order sums every rank computes itself (bits),
 * and the staging buffers accounted on the host tier and freed after.
 * Rank 0 prints "N passed, N failed" over all ranks.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "comm.h"
#include "mpi_inputs.h"

/* The Makefile compiles memory.c, tensor.c, comm_mpi.c and comm_stage.c
 * for this test with -DZT_CUDA -Dzt_dev=fake_dev: they see this device. */
extern const zt_device_ops zt_cpu_device;
const zt_device_ops *fake_dev(void);

/* ---- the fake device: masked memory ------------------------------------------ */
#define MASK 0xA5u
enum { MAXA = 256 };
static struct { char *p; size_t n; } allocs[MAXA];
static pthread_mutex_t fk = PTHREAD_MUTEX_INITIALIZER;
static zt_device_ops fake_table;
const zt_device_ops *fake_dev(void) { return &fake_table; }
static long d2h, h2d;           /* cudaMemcpy calls by direction */

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
static void f_free(void *p)
{
    pthread_mutex_lock(&fk);
    for (int i = 0; i < MAXA; i++) if (allocs[i].p == p) allocs[i].p = NULL;
    pthread_mutex_unlock(&fk);
    free(p);
}
static void f_zero(void *p, size_t n) { memset(p, MASK, n); }
static int f_sync(void) { return ZT_OK; }

/* ---- the fake CUDA calls comm_stage.c and memory.c make ------------------------ */
int zt_cuda_host_alloc(void **out, size_t n) { return posix_memalign(out, 4096, n) ? ZT_ENOMEM : ZT_OK; }
void zt_cuda_host_free(void *p) { free(p); }
int zt_cuda_is_pinned(const void *p) { (void)p; return 0; }    /* host_free: free() */
int zt_cuda_event_new(void **out, int timing) { (void)timing; *out = malloc(1); return ZT_OK; }
int zt_cuda_event_record(void *e, void *s) { (void)e; (void)s; return ZT_OK; }
void zt_cuda_event_free(void *e) { free(e); }
int zt_cuda_bind_thread(void) { return ZT_OK; }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { (void)e; return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorName(cudaError_t e) { (void)e; return "fake"; }
const char *cudaGetErrorString(cudaError_t e) { (void)e; return "fake"; }
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k)
{
    if (k == cudaMemcpyDeviceToHost) __atomic_add_fetch(&d2h, 1, __ATOMIC_RELAXED);
    if (k == cudaMemcpyHostToDevice) __atomic_add_fetch(&h2d, 1, __ATOMIC_RELAXED);
    xcopy(dst, src, n);
    return cudaSuccess;
}

/* ---- checks -------------------------------------------------------------------- */
static int passed, failed, R, P;
static zt_comm *W;
#define CHECK(name, cond, ...) do { \
    if (cond) { passed++; if (R == 0) printf("ok %s\n", name); } \
    else { failed++; printf("rank %d: FAIL %s: ", R, name); printf(__VA_ARGS__); printf("\n"); } \
} while (0)

static zt_tensor *dev(int64_t n)
{
    zt_tensor *t = NULL;
    if (zt_tensor_new(&t, ZT_TIER_DEVICE, ZT_CAT_OTHER, ZT_F32, 1, &n)) {
        printf("tensor_new: %s\n", zt_last_error());
        zt_comm_abort(2);
    }
    return t;
}
static void put(zt_tensor *t, uint32_t seed, int r, int64_t lo)
{
    float *h = malloc((size_t)t->numel * 4);
    for (int64_t i = 0; i < t->numel; i++) h[i] = val(seed, r, lo + i);
    zt_tensor_write(t, h, (size_t)t->numel * 4);
    free(h);
}
static float *get(const zt_tensor *t)
{
    float *h = malloc((size_t)t->numel * 4);
    zt_tensor_read(t, h, (size_t)t->numel * 4);
    return h;
}
static float rsum(uint32_t seed, int64_t i)
{
    float s = val(seed, 0, i);
    for (int r = 1; r < P; r++) s += val(seed, r, i);
    return s;
}
static int64_t diff_bits(const float *g, const float *w, int64_t n)
{
    int64_t b = 0;
    for (int64_t i = 0; i < n; i++) b += memcmp(&g[i], &w[i], 4) != 0;
    return b;
}

static void t_all_reduce(int64_t n, size_t scratch)
{
    char name[96];
    zt_comm_tune(scratch, 0);
    zt_tensor *x = dev(n);
    put(x, 3, R, 0);
    zt_mem_reset_peak();
    size_t host0 = zt_mem_current(ZT_TIER_HOST, ZT_CAT_COMM);
    int rc = zt_all_reduce(W, x, NULL);
    float *g = get(x), *w = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) w[i] = rsum(3, i);
    snprintf(name, sizeof name, "staged all_reduce n=%lld scratch=%zu: rank-order bits",
             (long long)n, scratch);
    CHECK(name, rc == 0 && diff_bits(g, w, n) == 0, "rc %d (%s), %lld differ", rc,
          rc ? zt_last_error() : "", (long long)diff_bits(g, w, n));
    CHECK("staging buffers freed after the operation",
          zt_mem_current(ZT_TIER_HOST, ZT_CAT_COMM) == host0, "host comm bytes %zu -> %zu", host0,
          zt_mem_current(ZT_TIER_HOST, ZT_CAT_COMM));
    /* MPI's receive scratch too must be host memory (MPI cannot write a GPU's) */
    CHECK("no comm scratch on the device tier", zt_mem_peak(ZT_TIER_DEVICE, ZT_CAT_COMM) == 0,
          "device comm peak %zu bytes", zt_mem_peak(ZT_TIER_DEVICE, ZT_CAT_COMM));
    free(g); free(w);
    zt_tensor_release(x);
    zt_comm_tune(0, 0);
}

/* in place: out is rank R's chunk of in */
static void t_reduce_scatter(int inplace)
{
    const int64_t m = 3001;
    zt_tensor *in = dev(m * P), *out = NULL;
    put(in, 5, R, 0);
    if (inplace) zt_tensor_view(&out, in, R * m, 1, (int64_t[]){ m });
    else out = dev(m);
    zt_mem_reset_peak();
    size_t c0 = zt_mem_current(ZT_TIER_HOST, ZT_CAT_COMM);
    int rc = zt_reduce_scatter(W, out, in, NULL);
    /* staging: in's bytes, plus out's unless out lies inside in; and MPI's
     * receive scratch (P x m floats: one round at the default budget) */
    size_t want = (size_t)(m * P + (inplace ? 0 : m)) * 4 + (size_t)(P * m) * 4;
    size_t peak = zt_mem_peak(ZT_TIER_HOST, ZT_CAT_COMM) - c0;
    CHECK(inplace ? "in place: one staging buffer, scratch on the host"
                  : "not in place: two staging buffers, scratch on the host",
          peak == want, "host comm peak %zu bytes, expected %zu", peak, want);
    float *g = get(out), *w = malloc((size_t)m * 4);
    for (int64_t i = 0; i < m; i++) w[i] = rsum(5, R * m + i);
    CHECK(inplace ? "staged reduce_scatter in place: bits" : "staged reduce_scatter: bits",
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
    put(in, 7, R, 0);
    int rc = zt_all_gather(W, out, in, NULL);
    float *g = get(out);
    int64_t bad = 0;
    for (int r = 0; r < P; r++)
        for (int64_t i = 0; i < m; i++) bad += g[r * m + i] != val(7, r, i);
    CHECK(inplace ? "staged all_gather in place" : "staged all_gather", rc == 0 && bad == 0,
          "rc %d (%s), %lld differ", rc, rc ? zt_last_error() : "", (long long)bad);
    free(g);
    zt_tensor_release(in);
    zt_tensor_release(out);
}

static void t_bcast_p2p(void)
{
    const int64_t n = 777;
    zt_tensor *x = dev(n);
    put(x, 9, R, 0);
    int rc = zt_broadcast(W, x, P - 1, NULL);
    float *g = get(x);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += g[i] != val(9, P - 1, i);
    CHECK("staged broadcast", rc == 0 && bad == 0, "rc %d, %lld differ", rc, (long long)bad);
    free(g);
    if (R < 2) {
        put(x, 11, R, 0);
        rc = R == 0 ? zt_send(W, x, 1, 5, NULL) : zt_recv(W, x, 0, 5, NULL);
        g = get(x);
        bad = 0;
        for (int64_t i = 0; i < n; i++) bad += g[i] != val(11, 0, i);
        CHECK("staged send/recv", rc == 0 && bad == 0, "rc %d, %lld differ", rc, (long long)bad);
        free(g);
    }
    zt_tensor_release(x);
}

int main(void)
{
    fake_table = zt_cpu_device;
    fake_table.name = "cuda";
    fake_table.alloc = f_alloc;
    fake_table.free = f_free;
    fake_table.zero = f_zero;
    fake_table.copy = xcopy;
    fake_table.sync = f_sync;
    if (zt_comm_world(&W) != ZT_OK) { printf("world: %s\n", zt_last_error()); return 1; }
    R = zt_comm_rank(W);
    P = zt_comm_size(W);
    t_all_reduce(100003, 0);
    t_all_reduce(1001, 256);    /* rounds */
    t_all_reduce(1, 0);
    t_reduce_scatter(0);
    t_reduce_scatter(1);
    t_all_gather(0);
    t_all_gather(1);
    t_bcast_p2p();
    CHECK("the fake saw the copies (staging ran)", d2h > 0 && h2d > 0, "d2h %ld h2d %ld", d2h, h2d);
    int tot[2] = { passed, failed }, all[2 * 64] = { 0 };
    zt_comm_all_gather_host(W, all, tot, sizeof tot);
    if (R == 0) {
        int p = 0, f = 0;
        for (int r = 0; r < P; r++) { p += all[2 * r]; f += all[2 * r + 1]; }
        printf("%d passed, %d failed\n", p, f);
    }
    zt_comm_finalize();
    return failed ? 1 : 0;
}
