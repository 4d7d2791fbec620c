/*
 * device_fakegpu_async.c -- fakegpu with a GPU's asynchrony, for tests: a
 * missing wait between streams gives wrong bits on the CPU.
 *
 * `device.backend = "fakegpu-async"` (or "fakegpu-async:SEED"). The
 * memory and the arithmetic are fakegpu's (device_fakegpu.c: tagged
 * pointers the host cannot dereference, the CPU kernels), but no op runs
 * when it is issued: each stream is a queue, and queued work runs only
 * when the host waits for something (a stream or event sync, an op that
 * returns a value to the host, a copy to or from pageable memory, a free),
 * and a few steps at random after each issue, in an order a real GPU
 * permits and a seeded generator picks: at each step, one stream whose
 * head may run (a wait item whose event has been reached, or any other
 * item) runs its head. Work on one stream runs in
 * issue order; two streams interleave in any order unless an event orders
 * them. So a copy stream that does not wait for the kernel writing its
 * source may copy the old bytes, a host read of a buffer before the copy
 * into it was waited for sees the old bytes, and a copy issued before the
 * host wrote its source may send the old ones -- wrong bits, where a CPU
 * run would never notice. One seed gives one schedule for one issuing
 * thread; where stream workers or the communication thread issue and wait
 * too (offload, MPI staging), thread timing enters as well, so a seed may
 * not replay a failure exactly: run several.
 *
 * The execution table (internal.h's zt_exec_ops) is CUDA's contract:
 * stream.c maps zt_stream / zt_event onto it exactly as on a GPU, and
 * comm_stage.c stages MPI's device tensors through copy_blocking after an
 * event. An event is a point of one stream (stream, position); a wait
 * item is met once that stream has done that many items. A free runs
 * every stream dry first (cudaFree synchronises the device). Host memory
 * is never pinned here, but every copy reads and writes host bytes when it
 * runs, the strictest reading of pinned memory.
 *
 * Threads: the caller, stream workers and the communication thread issue
 * and wait; one lock guards the queues, and work runs under it (the CPU
 * kernels keep their OpenMP threads). Errors of queued ops (a matmul's)
 * are kept and returned by the next sync or value-returning op, as CUDA's.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"

#define FG zt_fakegpu_device
#define TAG ((uintptr_t)1 << 62)        /* device_fakegpu.c's device-pointer tag */

typedef struct sim_stream sim_stream;

enum { K_OP, K_WAIT };

typedef struct item {
    int kind;
    struct item *next;
    void (*run)(struct item *);     /* K_OP */
    sim_stream *wst;                /* K_WAIT: met once wst->done >= wpos */
    uint64_t wpos;
    void *p[7];                     /* an op's arguments */
    size_t n;
    float f[7];
    int i[8];
    uint64_t u[2];
    int keep;                       /* the issuer frees it (it reads the result) */
    double d;
} item;

struct sim_stream {
    item *head, *tail;
    uint64_t issued, done;
    uint64_t seen;                  /* issued at the host's last wait (host_waits) */
    int dead;                       /* freed by its user; kept, since events may name it */
    sim_stream *next;
};

typedef struct { sim_stream *st; uint64_t pos; } sim_event;   /* st NULL: never recorded */

static pthread_mutex_t sim_lock = PTHREAD_MUTEX_INITIALIZER;
static sim_stream compute;
static sim_stream *streams = &compute;      /* every stream ever made (compute first) */
static _Thread_local sim_stream *cur;       /* NULL: compute */
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static int pending;                         /* first error of queued work */
static char pending_msg[1024];

int zt_fakegpu_async_seed(uint64_t seed)
{
    pthread_mutex_lock(&sim_lock);
    rng = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    if (!rng) rng = 1;
    pthread_mutex_unlock(&sim_lock);
    return ZT_OK;
}

static uint64_t next_rand(void)            /* xorshift64* */
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}

static sim_stream *stream_of(void *s) { return s ? (sim_stream *)s : cur ? cur : &compute; }

static int is_dev(const void *p) { return ((uintptr_t)p & TAG) != 0; }

/* ---- the scheduler (sim_lock held) ------------------------------------------ */

static int runnable(const sim_stream *s)
{
    const item *it = s->head;
    if (!it) return 0;
    return it->kind != K_WAIT || it->wst->done >= it->wpos;
}

/* sim_lock held; note_error() takes it */
static void keep_error(int rc)
{
    if (rc != ZT_OK && pending == ZT_OK) {
        pending = rc;
        snprintf(pending_msg, sizeof pending_msg, "%s", zt_last_error());
    }
}

static void note_error(int rc)
{
    if (rc == ZT_OK) return;
    pthread_mutex_lock(&sim_lock);
    keep_error(rc);
    pthread_mutex_unlock(&sim_lock);
}

/* Run the head of one runnable stream, picked at random (uniformly among
 * all of them: reservoir sampling); 0 if none can run. */
static int step(void)
{
    sim_stream *s = NULL;
    uint64_t n = 0;
    for (sim_stream *c = streams; c; c = c->next)
        if (runnable(c) && next_rand() % ++n == 0) s = c;
    if (!s) return 0;
    item *it = s->head;
    s->head = it->next;
    if (!s->head) s->tail = NULL;
    if (it->kind == K_OP) it->run(it);
    s->done++;
    if (!it->keep) free(it);
    return 1;
}

/* Run work until stream st has done `pos` items. Work on other streams may
 * run meanwhile (it may on a GPU too). A wait that can never be met would
 * be a bug here: every wait names a point already issued. */
static int run_until(sim_stream *st, uint64_t pos)
{
    while (st->done < pos)
        if (!step())
            return zt_error(ZT_ESTATE, "fakegpu-async: no stream can run, yet a wait is not met "
                            "(an internal bug)");
    return ZT_OK;
}

/* zt_device_count("host_waits"): the times the host waited for device
 * work issued since its last wait on that stream (a sync, a value-returning
 * op, a copy with host memory, a free) -- what a GPU's step must keep out
 * of its forward and backward. A wait with nothing new to wait for (a
 * stream already waited for: a GPU answers it at once) is not counted, so
 * the count is the program's, whatever the seed ran early. sim_lock held. */
static int64_t host_waits;
static int64_t fa_host_waits(void) { return __atomic_load_n(&host_waits, __ATOMIC_RELAXED); }
static int waited(sim_stream *s)
{
    int fresh = s->issued > s->seen;
    s->seen = s->issued;
    return fresh;
}
static void count_wait(int fresh) { if (fresh) __atomic_add_fetch(&host_waits, 1, __ATOMIC_RELAXED); }

/* zt_device_count("host_wait_us"): the time the host spent in those waits,
 * here running the queued work it waits for (a GPU's time in them) */
static int64_t host_wait_ns;
static int64_t fa_host_wait_ns(void) { return __atomic_load_n(&host_wait_ns, __ATOMIC_RELAXED); }
static int wait_run(sim_stream *s, uint64_t pos)
{
    uint64_t t0 = zt_stats_now_ns();
    int rc = run_until(s, pos);
    __atomic_add_fetch(&host_wait_ns, (int64_t)(zt_stats_now_ns() - t0), __ATOMIC_RELAXED);
    return rc;
}

static int drain_all(void)
{
    int fresh = 0;
    for (sim_stream *s = streams; s; s = s->next) fresh |= waited(s);
    count_wait(fresh);
    for (sim_stream *s = streams; s; s = s->next) ZT_TRY(wait_run(s, s->issued));
    return ZT_OK;
}

static void push(sim_stream *s, item *it)
{
    it->next = NULL;
    if (s->tail) s->tail->next = it; else s->head = it;
    s->tail = it;
    s->issued++;
}

/* After an issue, 0 to 2 steps at random: work may also run early, as on
 * a GPU that starts a kernel at once, so a consumer issued before its
 * input was written (by the host, or by another thread's copy) reads the
 * old bytes on some seeds, as a late one reads overwritten bytes on others. */
static void run_early(void)
{
    for (uint64_t k = next_rand() % 3; k > 0 && step(); k--) {}
}

/* ---- issuing ops ------------------------------------------------------------ */

static item *new_op(void (*run)(item *))
{
    item *it = calloc(1, sizeof *it);
    if (!it) { note_error(zt_error(ZT_ENOMEM, "fakegpu-async: out of memory for a queued op")); return NULL; }
    it->kind = K_OP;
    it->run = run;
    return it;
}

/* Queue it on the current stream. */
static void issue(item *it)
{
    pthread_mutex_lock(&sim_lock);
    push(stream_of(NULL), it);
    run_early();
    pthread_mutex_unlock(&sim_lock);
}

/* Queue it and wait for it (an op whose result the host needs): its rc. */
static int issue_sync(item *it, double *d)
{
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = stream_of(NULL);
    it->keep = 1;               /* step() leaves it: the result is read here */
    push(s, it);
    count_wait(waited(s));
    int rc = wait_run(s, s->issued);
    if (rc != ZT_OK) {          /* still queued (an internal bug): step() frees it */
        it->keep = 0;
        pthread_mutex_unlock(&sim_lock);
        return rc;
    }
    pthread_mutex_unlock(&sim_lock);
    if (d) *d = it->d;
    free(it);
    return ZT_OK;
}

#define OP0(it, fn) item *it = new_op(fn); if (!it) return
#define OPV(it, fn, v) item *it = new_op(fn); if (!it) return v

/* ---- the device ops --------------------------------------------------------- */

static int take_pending(void)
{
    pthread_mutex_lock(&sim_lock);
    int p = pending;
    char msg[1024];
    if (p) snprintf(msg, sizeof msg, "%s", pending_msg);
    pending = ZT_OK;
    pthread_mutex_unlock(&sim_lock);
    return p ? zt_error(p, "%s", msg) : ZT_OK;
}

static int fx_stream_sync(void *p);
/* the current stream's work, then a kept error (CUDA's cudaStreamSynchronize) */
static int fa_sync(void) { return fx_stream_sync(NULL); }

static int fa_alloc(void **out, size_t nbytes) { return FG.alloc(out, nbytes); }

/* cudaFree waits for the device: every stream runs dry, then the bytes go */
static void fa_free(void *p)
{
    pthread_mutex_lock(&sim_lock);
    int rc = drain_all();
    if (rc) keep_error(rc);
    pthread_mutex_unlock(&sim_lock);
    FG.free(p);
}

static void r_zero(item *it) { FG.zero(it->p[0], it->n); }
static void fa_zero(void *p, size_t n) { OP0(it, r_zero); it->p[0] = p; it->n = n; issue(it); }

static void r_fill(item *it) { FG.fill(it->p[0], it->f[0], it->n); }
static void fa_fill(float *x, float v, size_t n)
{
    OP0(it, r_fill); it->p[0] = x; it->f[0] = v; it->n = n; issue(it);
}

/* device to device: queued; host memory on either side: queued, then
 * waited for (CUDA's cuda_copy: the caller reuses host bytes at once) */
static void r_copy(item *it) { FG.copy(it->p[0], it->p[1], it->n); }
static void fa_copy(void *dst, const void *src, size_t n)
{
    OP0(it, r_copy);
    it->p[0] = dst; it->p[1] = (void *)src; it->n = n;
    if (is_dev(dst) && is_dev(src)) issue(it);
    else note_error(issue_sync(it, NULL));
}

/* an upload: the host bytes taken now (CUDA's pinned slot), the device
 * write queued like a kernel; the snapshot freed when it has run */
static void r_upload(item *it) { FG.copy(it->p[0], it->p[1], it->n); free(it->p[1]); }
static int fa_upload(void *dst, const void *src, size_t n)
{
    ZT_TRY(take_pending());
    if (n == 0) return ZT_OK;
    if (!is_dev(dst)) { fa_copy(dst, src, n); return take_pending(); }
    void *snap = malloc(n);
    if (!snap) return zt_error(ZT_ENOMEM, "fakegpu-async: %zu bytes for an upload", n);
    memcpy(snap, src, n);
    item *it = new_op(r_upload);
    if (!it) { free(snap); return take_pending(); }
    it->p[0] = dst; it->p[1] = snap; it->n = n;
    issue(it);
    return ZT_OK;
}

static void r_scale(item *it) { FG.scale(it->p[0], it->f[0], it->n); }
static void fa_scale(float *x, float a, size_t n)
{
    OP0(it, r_scale); it->p[0] = x; it->f[0] = a; it->n = n; issue(it);
}

static void r_axpy(item *it) { FG.axpy(it->p[0], it->f[0], it->p[1], it->n); }
static void fa_axpy(float *y, float a, const float *x, size_t n)
{
    OP0(it, r_axpy); it->p[0] = y; it->f[0] = a; it->p[1] = (void *)x; it->n = n; issue(it);
}

static void r_add(item *it) { FG.add(it->p[0], it->p[1], it->i[0], it->n); }
static void fa_add(float *y, const void *x, int x_dtype, size_t n)
{
    OP0(it, r_add); it->p[0] = y; it->p[1] = (void *)x; it->i[0] = x_dtype; it->n = n; issue(it);
}

static void r_add3(item *it) { FG.add3(it->p[0], it->p[1], it->p[2], it->i[0], it->n); }
static void fa_add3(void *o, const void *a, const void *b, int r16, size_t n)
{
    OP0(it, r_add3); it->p[0] = o; it->p[1] = (void *)a; it->p[2] = (void *)b; it->n = n;
    it->i[0] = r16;
    issue(it);
}

static void r_cast(item *it) { FG.cast(it->p[0], it->i[0], it->p[1], it->i[1], it->n); }
static void fa_cast(void *dst, int dt, const void *src, int st, size_t n)
{
    if (dt == st) { fa_copy(dst, src, n * zt_dtype_size(dt)); return; }
    OP0(it, r_cast);
    it->p[0] = dst; it->i[0] = dt; it->p[1] = (void *)src; it->i[1] = st; it->n = n;
    issue(it);
}

/* Ops that count bad token ids: queued like the rest (the GPU's count is
 * read at its next sync, device_cuda.c): a count is kept as the error the
 * next op or sync reports (zt_bad_tokens_error, deferred). sim_lock held. */
static void keep_bad(const char *op, const char *what, int bad, int64_t n, int V)
{
    if (bad < 0) keep_error(bad);      /* the device's error (its message set) */
    else if (bad > 0) keep_error(zt_bad_tokens_error(op, what, bad, n, V, 1));
}
static void r_encf(item *it)
{
    keep_bad("zt_encoder_forward", "tokens",
             FG.encoder_forward(it->p[0], it->i[5], it->p[1], it->p[2], it->p[3], it->i[4], it->i[0],
                                it->i[1], it->i[2], it->i[3]), (int64_t)it->i[0] * it->i[1],
             it->i[3]);
}
static int fa_encoder_forward(void *out, int out16, const int32_t *tok, const void *wte,
                              const void *wpe, int w16, int B, int T, int C, int V)
{
    ZT_TRY(take_pending());
    OPV(it, r_encf, ZT_ENOMEM);
    it->p[0] = out; it->p[1] = (void *)tok; it->p[2] = (void *)wte; it->p[3] = (void *)wpe;
    it->i[0] = B; it->i[1] = T; it->i[2] = C; it->i[3] = V; it->i[4] = w16; it->i[5] = out16;
    issue(it);
    return 0;
}

static void r_encb(item *it)
{
    keep_bad("zt_encoder_backward", "tokens",
             FG.encoder_backward(it->p[0], it->p[1], it->i[5], it->p[2], it->i[4], it->p[3], it->i[0],
                                 it->i[1], it->i[2], it->i[3]), (int64_t)it->i[0] * it->i[1],
             it->i[3]);
}
static int fa_encoder_backward(void *dwte, void *dwpe, int g16, const void *dout, int dout16,
                               const int32_t *tok, int B, int T, int C, int V)
{
    ZT_TRY(take_pending());
    OPV(it, r_encb, ZT_ENOMEM);
    it->p[0] = dwte; it->p[1] = dwpe; it->p[2] = (void *)dout; it->p[3] = (void *)tok;
    it->i[0] = B; it->i[1] = T; it->i[2] = C; it->i[3] = V; it->i[4] = dout16; it->i[5] = g16;
    issue(it);
    return 0;
}

static void r_lnf(item *it)
{
    FG.layernorm_forward(it->p[0], it->i[2], it->p[1], it->p[2], it->p[3], it->i[3], it->p[4],
                         it->p[5], it->i[4], it->i[0], it->i[1]);
}
static void fa_layernorm_forward(void *out, int out16, float *mean, float *rstd, const void *inp,
                                 int in16, const void *w, const void *b, int p16, int N, int C)
{
    OP0(it, r_lnf);
    it->p[0] = out; it->p[1] = mean; it->p[2] = rstd; it->p[3] = (void *)inp;
    it->p[4] = (void *)w; it->p[5] = (void *)b; it->i[0] = N; it->i[1] = C; it->i[2] = out16;
    it->i[3] = in16; it->i[4] = p16;
    issue(it);
}

/* ten pointers: two ride in u[] */
static void r_lnb(item *it)
{
    FG.layernorm_backward(it->p[0], it->p[6], it->p[1], it->p[2], it->i[4], it->p[3], it->p[4],
                          it->i[2],
                          it->p[5], it->i[3], (const float *)(uintptr_t)it->u[0],
                          (const float *)(uintptr_t)it->u[1], it->i[0], it->i[1]);
}
static void fa_layernorm_backward(void *dinp, uint16_t *dinp16, void *dw, void *db, int g16,
                                  const void *dout, const void *inp, int r16, const void *w,
                                  int p16, const float *mean, const float *rstd, int N, int C)
{
    OP0(it, r_lnb);
    it->p[0] = dinp; it->p[1] = dw; it->p[2] = db; it->p[3] = (void *)dout;
    it->p[4] = (void *)inp; it->p[5] = (void *)w;
    it->p[6] = dinp16;
    it->u[0] = (uintptr_t)mean; it->u[1] = (uintptr_t)rstd; it->i[0] = N; it->i[1] = C;
    it->i[2] = r16; it->i[3] = p16; it->i[4] = g16;
    issue(it);
}

/* matmuls: queued; an error (OpenBLAS's thread check) is kept for later */
static void r_mmf(item *it)
{
    int rc = it->i[3] ? FG.matmul_bf16_forward(it->p[0], it->i[5], it->p[1], it->p[2], it->p[3],
                                               it->i[6], it->i[0], it->i[1], it->i[2], it->i[4])
                      : FG.matmul_forward(it->p[0], it->p[1], it->p[2], it->p[3], it->i[0], it->i[1],
                                          it->i[2], it->i[4]);
    keep_error(rc);
}
static int mm_forward(void *out, int out_bf16, const void *inp, const void *w, const void *b,
                      int b16, int N, int C, int OC, int ldo, int bf16)
{
    ZT_TRY(take_pending());
    OPV(it, r_mmf, ZT_ENOMEM);
    it->p[0] = out; it->p[1] = (void *)inp; it->p[2] = (void *)w; it->p[3] = (void *)b;
    it->i[0] = N; it->i[1] = C; it->i[2] = OC; it->i[3] = bf16; it->i[4] = ldo;
    it->i[5] = out_bf16; it->i[6] = b16;
    issue(it);
    return ZT_OK;
}
static int fa_matmul_forward(float *out, const float *inp, const float *w, const float *b,
                             int N, int C, int OC, int ldo)
{
    return mm_forward(out, 0, inp, w, b, 0, N, C, OC, ldo, 0);
}
static int fa_matmul_bf16_forward(void *out, int out_bf16, const uint16_t *inp,
                                  const uint16_t *w, const void *b, int b16, int N, int C, int OC,
                                  int ldo)
{
    return mm_forward(out, out_bf16, inp, w, b, b16, N, C, OC, ldo, 1);
}

static void r_mmb(item *it)
{
    int rc = it->i[3]
        ? FG.matmul_bf16_backward(it->p[0], it->i[5], it->p[1], it->p[2], it->i[6], it->p[3], it->p[4],
                                  it->p[5], it->i[0], it->i[1], it->i[2], it->i[4])
        : FG.matmul_backward(it->p[0], it->p[1], it->p[2], it->p[3], it->p[4], it->p[5],
                             it->i[0], it->i[1], it->i[2], it->i[4]);
    keep_error(rc);
}
static int mm_backward(void *dinp, int dinp16, void *dw, void *db, int g16, const void *dout,
                       const void *inp, const void *w, int N, int C, int OC, int ldo, int bf16)
{
    ZT_TRY(take_pending());
    OPV(it, r_mmb, ZT_ENOMEM);
    it->p[0] = dinp; it->p[1] = dw; it->p[2] = db; it->p[3] = (void *)dout;
    it->p[4] = (void *)inp; it->p[5] = (void *)w;
    it->i[0] = N; it->i[1] = C; it->i[2] = OC; it->i[3] = bf16; it->i[4] = ldo;
    it->i[5] = dinp16; it->i[6] = g16;
    issue(it);
    return ZT_OK;
}
static int fa_matmul_backward(float *dinp, float *dw, float *db, const float *dout,
                              const float *inp, const float *w, int N, int C, int OC, int ldo)
{
    return mm_backward(dinp, 0, dw, db, 0, dout, inp, w, N, C, OC, ldo, 0);
}
static int fa_matmul_bf16_backward(void *dinp, int dinp16, void *dw, void *db, int g16,
                                   const uint16_t *dout, const uint16_t *inp, const uint16_t *w,
                                   int N, int C, int OC, int ldo)
{
    return mm_backward(dinp, dinp16, dw, db, g16, dout, inp, w, N, C, OC, ldo, 1);
}

/* attention: queued; an error (the CPU bf16 kernel's tiles) is kept for later */
static void r_attf(item *it)
{
    keep_error(FG.attention_forward(it->p[0], it->p[1], it->p[2], it->i[4], it->i[0], it->i[1],
                                    it->i[2], it->i[3], it->i[5], it->i[6]));
}
static int fa_attention_forward(void *out, float *lse, const void *qkv, int io16,
                                int B, int T, int C, int NH, int NKV, int W)
{
    ZT_TRY(take_pending());
    OPV(it, r_attf, ZT_ENOMEM);
    it->p[0] = out; it->p[1] = lse; it->p[2] = (void *)qkv;
    it->i[0] = B; it->i[1] = T; it->i[2] = C; it->i[3] = NH; it->i[4] = io16;
    it->i[5] = NKV; it->i[6] = W;
    issue(it);
    return ZT_OK;
}

static void r_attb(item *it)
{
    keep_error(FG.attention_backward(it->p[0], it->p[1], it->p[2], it->p[3], it->p[4], it->i[4],
                                     it->i[0], it->i[1], it->i[2], it->i[3], it->i[5], it->i[6]));
}
static int fa_attention_backward(void *dqkv, const void *dout, const void *qkv, const void *out,
                                 const float *lse, int io16, int B, int T, int C, int NH,
                                 int NKV, int W)
{
    ZT_TRY(take_pending());
    OPV(it, r_attb, ZT_ENOMEM);
    it->p[0] = dqkv; it->p[1] = (void *)dout; it->p[2] = (void *)qkv; it->p[3] = (void *)out;
    it->p[4] = (void *)lse; it->i[0] = B; it->i[1] = T; it->i[2] = C; it->i[3] = NH;
    it->i[4] = io16; it->i[5] = NKV; it->i[6] = W;
    issue(it);
    return ZT_OK;
}

static void r_attd(item *it)
{
    FG.attention_decode(it->p[0], it->p[1], it->p[2], it->p[3], it->i[0], it->i[1], it->i[2],
                        it->i[3], it->i[6], it->i[7], it->i[4], it->i[5]);
}
static void fa_attention_decode(float *out, float *kc, float *vc, const float *qkv,
                                int B, int T, int C, int NH, int NKV, int W, int maxT, int pos)
{
    OP0(it, r_attd);
    it->p[0] = out; it->p[1] = kc; it->p[2] = vc; it->p[3] = (void *)qkv;
    it->i[0] = B; it->i[1] = T; it->i[2] = C; it->i[3] = NH; it->i[4] = maxT; it->i[5] = pos;
    it->i[6] = NKV; it->i[7] = W;
    issue(it);
}

static void r_lnrf(item *it)
{
    FG.layernorm_residual_forward(it->p[0], it->p[1], it->i[2], it->p[2], it->p[3], it->p[4],
                                  it->p[5], it->i[3], (const void *)(uintptr_t)it->u[0],
                                  (const void *)(uintptr_t)it->u[1], it->i[4], it->i[0], it->i[1]);
}
static void fa_layernorm_residual_forward(void *resid, void *out, int out16, float *mean,
                                          float *rstd, const void *a, const void *b, int r16,
                                          const void *w, const void *bias, int p16, int N, int C)
{
    OP0(it, r_lnrf);
    it->p[0] = resid; it->p[1] = out; it->p[2] = mean; it->p[3] = rstd;
    it->p[4] = (void *)a; it->p[5] = (void *)b;
    it->u[0] = (uintptr_t)w; it->u[1] = (uintptr_t)bias;
    it->i[0] = N; it->i[1] = C; it->i[2] = out16; it->i[3] = r16; it->i[4] = p16;
    issue(it);
}

static void r_geluf(item *it) { FG.gelu_forward(it->p[0], it->i[0], it->p[1], it->i[1], it->n); }
static void fa_gelu_forward(void *out, int out16, const void *inp, int in16, size_t n)
{
    OP0(it, r_geluf); it->p[0] = out; it->p[1] = (void *)inp; it->n = n; it->i[0] = out16; it->i[1] = in16; issue(it);
}

static void r_gelub(item *it) { FG.gelu_backward(it->p[0], it->i[0], it->p[1], it->i[1], it->p[2], it->n); }
static void fa_gelu_backward(void *dinp, int out16, const void *inp, int in16, const float *dout,
                             size_t n)
{
    OP0(it, r_gelub);
    it->p[0] = dinp; it->p[1] = (void *)inp; it->p[2] = (void *)dout; it->n = n; it->i[0] = out16;
    it->i[1] = in16;
    issue(it);
}

static void r_xent(item *it)
{
    keep_bad("zt_crossentropy", "targets",
             FG.crossentropy(it->p[0], it->p[1], it->p[2], it->p[3], it->i[0], it->i[1],
                             it->i[2], it->i[3], it->f[0]), it->i[0], it->i[1]);
}
static int fa_crossentropy(float *losses, void *dlogits, const void *logits,
                           const int32_t *targets, int N, int V, int ld, int bf16, float dscale)
{
    ZT_TRY(take_pending());
    OPV(it, r_xent, ZT_ENOMEM);
    it->p[0] = losses; it->p[1] = dlogits; it->p[2] = (void *)logits; it->p[3] = (void *)targets;
    it->i[0] = N; it->i[1] = V; it->i[2] = ld; it->i[3] = bf16; it->f[0] = dscale;
    issue(it);
    return 0;
}

static void r_adamw(item *it)
{
    if (it->i[1] == ZT_F32) {
        FG.adamw(it->p[0], it->p[1], it->p[2], it->p[3], it->n, it->f[0], it->f[1], it->f[2],
                 it->f[3], it->f[4], it->f[5], it->i[0]);
        return;
    }
    /* a 2-byte gradient: one segment of the device's own segments op */
    zt_adamw_segs sg = { .n = 1 };
    sg.off[0] = 0; sg.len[0] = (int64_t)it->n; sg.wd[0] = it->f[4];
    FG.adamw_segments(it->p[0], it->p[1], it->i[1], it->p[2], it->p[3], NULL, -1, &sg, it->f[0],
                      it->f[1], it->f[2], it->f[3], it->f[5], it->i[0]);
}
/* g_dtype: f32, or a 2-byte gradient (the segments op's) */
static void adamw_g(float *p, const void *g, int g_dtype, float *m, float *v, size_t n, float lr,
                    float b1, float b2, float eps, float wd, float gscale, int t)
{
    OP0(it, r_adamw);
    it->p[0] = p; it->p[1] = (void *)g; it->p[2] = m; it->p[3] = v; it->n = n;
    it->f[0] = lr; it->f[1] = b1; it->f[2] = b2; it->f[3] = eps; it->f[4] = wd; it->f[5] = gscale;
    it->i[0] = t; it->i[1] = g_dtype;
    issue(it);
}
static void fa_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                     float b2, float eps, float wd, float gscale, int t)
{
    adamw_g(p, g, ZT_F32, m, v, n, lr, b1, b2, eps, wd, gscale, t);
}
/* one queued op a segment (the segments' table is the caller's, gone by
 * the time a queue runs): the same bits as one launch */
static void fa_cast(void *dst, int dt, const void *src, int st, size_t n);
static void fa_adamw_segments(float *p, const void *g, int g_dtype, float *m, float *v, void *lp,
                              int lp_dtype, const zt_adamw_segs *sg, float lr, float b1,
                              float b2, float eps, float gscale, int t)
{
    size_t gsz = g_dtype == ZT_F32 ? 4 : 2;
    for (int s = 0; s < sg->n; s++) {
        int64_t o = sg->off[s];
        adamw_g(p + o, (const char *)g + (size_t)o * gsz, g_dtype, m + o, v + o,
                (size_t)sg->len[s], lr, b1, b2, eps, sg->wd[s], gscale, t);
        if (lp) fa_cast((uint16_t *)lp + o, lp_dtype, p + o, ZT_F32, (size_t)sg->len[s]);
    }
}
static void fa_adamw_multi(const zt_adamw_item *it, int n, int g_dtype, int lp_dtype, float lr,
                           float b1, float b2, float eps, float gscale, int t)
{
    for (int k = 0; k < n; k++) {
        adamw_g(it[k].p, it[k].g, g_dtype, it[k].m, it[k].v, (size_t)it[k].n, lr, b1, b2, eps,
                it[k].wd, gscale, t);
        if (it[k].lp) fa_cast(it[k].lp, lp_dtype, it[k].p, ZT_F32, (size_t)it[k].n);
    }
}

/* partials are a host array: written when the op runs, so it is waited for */
static void r_sumsq(item *it) { FG.sumsq_blocks(it->p[0], it->p[1], it->i[0], it->n); }
static void fa_sumsq_blocks(double *partials, const void *x, int x_dtype, size_t n)
{
    OP0(it, r_sumsq);
    it->p[0] = partials; it->p[1] = (void *)x; it->i[0] = x_dtype; it->n = n;
    note_error(issue_sync(it, NULL));
}
/* each tensor's partials as its own op, queued; the host waits once, for
 * the last (CUDA's one copy and one wait) */
static void fa_sumsq_blocks_many(double *partials, const void *const *x, int x_dtype,
                                 const size_t *n, int count)
{
    for (int i = 0; i < count; i++) {
        OP0(it, r_sumsq);
        it->p[0] = partials; it->p[1] = (void *)x[i]; it->i[0] = x_dtype; it->n = n[i];
        if (i < count - 1) issue(it);
        else note_error(issue_sync(it, NULL));
        partials += (n[i] + (size_t)zt_sum_block() - 1) / (size_t)zt_sum_block();
    }
}

static void r_sum(item *it) { it->d = FG.sum(it->p[0], it->n); }
static double fa_sum(const float *x, size_t n)
{
    OPV(it, r_sum, 0.0);
    it->p[0] = (void *)x; it->n = n;
    double d = 0.0;
    issue_sync(it, &d);
    return d;
}

static void r_randn(item *it) { FG.randn(it->p[0], it->n, it->u[0], it->u[1], it->f[0], it->f[1]); }
static void fa_randn(float *x, size_t n, uint64_t seed, uint64_t stream, float mean, float std)
{
    OP0(it, r_randn);
    it->p[0] = x; it->n = n; it->u[0] = seed; it->u[1] = stream; it->f[0] = mean; it->f[1] = std;
    issue(it);
}

/* ---- the execution table ---------------------------------------------------- */

static int fx_stream_new(void **out, int kind)
{
    (void)kind;
    sim_stream *s = calloc(1, sizeof *s);
    if (!s) return zt_error(ZT_ENOMEM, "fakegpu-async: out of memory for a stream");
    pthread_mutex_lock(&sim_lock);
    s->next = compute.next;             /* compute stays first */
    compute.next = s;
    pthread_mutex_unlock(&sim_lock);
    *out = s;
    return ZT_OK;
}

/* Its work runs first; the struct stays (an event may still name it). */
static void fx_stream_free(void *p)
{
    sim_stream *s = p;
    if (!s || s == &compute) return;
    if (cur == s) cur = NULL;
    pthread_mutex_lock(&sim_lock);
    int rc = run_until(s, s->issued);
    if (rc) keep_error(rc);
    s->dead = 1;
    pthread_mutex_unlock(&sim_lock);
}

static int fx_stream_sync(void *p)
{
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = stream_of(p);
    count_wait(waited(s));
    int rc = wait_run(s, s->issued);
    pthread_mutex_unlock(&sim_lock);
    return rc ? rc : take_pending();
}

static void fx_set_stream(void *s) { cur = s == &compute ? NULL : s; }
static void *fx_compute_stream(void) { return &compute; }
static int fx_bind_thread(void) { return ZT_OK; }

static int fx_event_new(void **out)
{
    sim_event *e = calloc(1, sizeof *e);
    if (!e) return zt_error(ZT_ENOMEM, "fakegpu-async: out of memory for an event");
    *out = e;
    return ZT_OK;
}

static void fx_event_free(void *e) { free(e); }   /* waits copied its point */

static int fx_event_record(void *ev, void *s)
{
    sim_event *e = ev;
    pthread_mutex_lock(&sim_lock);
    e->st = stream_of(s);
    e->pos = e->st->issued;
    pthread_mutex_unlock(&sim_lock);
    return ZT_OK;
}

static int fx_stream_wait_event(void *s, void *ev)
{
    sim_event *e = ev;
    pthread_mutex_lock(&sim_lock);
    sim_stream *st = stream_of(s);
    if (e->st && e->st != st && e->st->done < e->pos) {
        item *it = calloc(1, sizeof *it);
        if (!it) {
            pthread_mutex_unlock(&sim_lock);
            return zt_error(ZT_ENOMEM, "fakegpu-async: out of memory for a wait");
        }
        it->kind = K_WAIT;
        it->wst = e->st;
        it->wpos = e->pos;
        push(st, it);
    }
    pthread_mutex_unlock(&sim_lock);
    return ZT_OK;
}

static int fx_event_sync(void *ev)
{
    sim_event *e = ev;
    pthread_mutex_lock(&sim_lock);
    if (e->st && e->st->seen < e->pos) { count_wait(1); e->st->seen = e->pos; }
    int rc = e->st ? wait_run(e->st, e->pos) : ZT_OK;
    pthread_mutex_unlock(&sim_lock);
    /* a kept op error stays for the issuing thread's next sync or op, as
     * CUDA's zt_cuda_event_sync leaves it: taken here, on the communication
     * thread staging a send, it failed the send unposted and the peer's
     * receive waited for comm.timeout with the real error lost */
    return rc;
}

/* Never blocks, but lets one step of work run, so a poller makes progress. */
static int fx_event_query(void *ev, int *done)
{
    sim_event *e = ev;
    pthread_mutex_lock(&sim_lock);
    if (e->st && e->st->done < e->pos) (void)step();
    *done = !e->st || e->st->done >= e->pos;
    pthread_mutex_unlock(&sim_lock);
    return ZT_OK;
}

static int fx_copy_async(void *dst, const void *src, size_t nbytes, void *s)
{
    if (nbytes == 0) return ZT_OK;
    item *it = new_op(r_copy);
    if (!it) return take_pending();
    it->p[0] = dst; it->p[1] = (void *)src; it->n = nbytes;
    pthread_mutex_lock(&sim_lock);
    push(stream_of(s), it);
    run_early();
    pthread_mutex_unlock(&sim_lock);
    return ZT_OK;
}

/* now, ordered with no stream (the legacy stream beside non-blocking ones) */
static int fx_copy_blocking(void *dst, const void *src, size_t nbytes)
{
    pthread_mutex_lock(&sim_lock);
    FG.copy(dst, src, nbytes);
    pthread_mutex_unlock(&sim_lock);
    return ZT_OK;
}

static const zt_exec_ops fakegpu_async_exec = {
    .stream_new = fx_stream_new, .stream_free = fx_stream_free, .stream_sync = fx_stream_sync,
    .set_stream = fx_set_stream, .compute_stream = fx_compute_stream,
    .bind_thread = fx_bind_thread, .event_new = fx_event_new, .event_free = fx_event_free,
    .event_record = fx_event_record, .stream_wait_event = fx_stream_wait_event,
    .event_sync = fx_event_sync, .event_query = fx_event_query,
    .copy_async = fx_copy_async, .copy_blocking = fx_copy_blocking,
    /* host memory: plain (host_alloc NULL); copies treat it as pinned */
};

/* Llama's ops, queued as the others */
static void r_rmsf(item *it)
{
    FG.rmsnorm_forward(it->p[0], it->i[2], it->p[1], it->p[2], it->i[3], it->p[3], it->i[4],
                       it->f[0], it->i[0], it->i[1]);
}
static void fa_rmsnorm_forward(void *out, int out16, float *rstd, const void *inp, int in16,
                               const void *w, int p16, float eps, int N, int C)
{
    OP0(it, r_rmsf);
    it->p[0] = out; it->p[1] = rstd; it->p[2] = (void *)inp; it->p[3] = (void *)w;
    it->f[0] = eps; it->i[0] = N; it->i[1] = C; it->i[2] = out16; it->i[3] = in16;
    it->i[4] = p16;
    issue(it);
}
static void r_rmsb(item *it)
{
    FG.rmsnorm_backward(it->p[0], it->p[6], it->p[1], it->i[4], it->p[2], it->p[3], it->i[2], it->p[4],
                        it->i[3], it->p[5], it->i[0], it->i[1]);
}
static void fa_rmsnorm_backward(void *dinp, uint16_t *dinp16, void *dw, int g16,
                                const void *dout, const void *inp, int r16, const void *w,
                                int p16, const float *rstd, int N, int C)
{
    OP0(it, r_rmsb);
    it->p[0] = dinp; it->p[1] = dw; it->p[2] = (void *)dout; it->p[3] = (void *)inp;
    it->p[4] = (void *)w; it->p[5] = (void *)rstd; it->p[6] = dinp16;
    it->i[0] = N; it->i[1] = C; it->i[2] = r16; it->i[3] = p16; it->i[4] = g16;
    issue(it);
}
static void r_rope(item *it)
{
    FG.rope(it->p[0], it->i[6], it->i[0], it->i[1], it->i[2], it->i[3], it->i[4], it->p[1],
            it->p[2], (int)it->u[0], it->i[5]);
}
static void fa_rope(void *x, int x16, int N, int T, int ld, int nh, int hs, const float *cos_t,
                    const float *sin_t, int pos0, int dir)
{
    OP0(it, r_rope);
    it->p[0] = x; it->p[1] = (void *)cos_t; it->p[2] = (void *)sin_t;
    it->i[0] = N; it->i[1] = T; it->i[2] = ld; it->i[3] = nh; it->i[4] = hs; it->i[5] = dir;
    it->i[6] = x16; it->u[0] = (uint64_t)pos0;
    issue(it);
}
static void r_sgf(item *it) { FG.swiglu_forward(it->p[0], it->p[1], it->i[2], it->i[0], it->i[1]); }
static void fa_swiglu_forward(void *out, const void *gu, int io16, int N, int F)
{
    OP0(it, r_sgf);
    it->p[0] = out; it->p[1] = (void *)gu; it->i[0] = N; it->i[1] = F; it->i[2] = io16;
    issue(it);
}
static void r_sgb(item *it)
{
    FG.swiglu_backward(it->p[0], it->p[1], it->p[2], it->i[2], it->i[0], it->i[1]);
}
static void fa_swiglu_backward(void *dgu, const void *dout, const void *gu, int io16, int N,
                               int F)
{
    OP0(it, r_sgb);
    it->p[0] = dgu; it->p[1] = (void *)dout; it->p[2] = (void *)gu; it->i[0] = N; it->i[1] = F;
    it->i[2] = io16;
    issue(it);
}

const zt_device_ops zt_fakegpu_async_device = {
    .name = "fakegpu-async",
    .exec = &fakegpu_async_exec,
    .sync = fa_sync, .alloc = fa_alloc, .free = fa_free, .zero = fa_zero, .fill = fa_fill,
    .copy = fa_copy, .scale = fa_scale, .axpy = fa_axpy, .add = fa_add, .add3 = fa_add3,
    .cast = fa_cast,
    .encoder_forward = fa_encoder_forward, .encoder_backward = fa_encoder_backward,
    .layernorm_forward = fa_layernorm_forward, .layernorm_backward = fa_layernorm_backward,
    .layernorm_residual_forward = fa_layernorm_residual_forward,
    .matmul_forward = fa_matmul_forward, .matmul_backward = fa_matmul_backward,
    .matmul_bf16_forward = fa_matmul_bf16_forward, .matmul_bf16_backward = fa_matmul_bf16_backward,
    .attention_forward = fa_attention_forward, .attention_backward = fa_attention_backward,
    .attention_decode = fa_attention_decode,
    .gelu_forward = fa_gelu_forward, .gelu_backward = fa_gelu_backward,
    .rmsnorm_forward = fa_rmsnorm_forward, .rmsnorm_backward = fa_rmsnorm_backward,
    .rope = fa_rope, .swiglu_forward = fa_swiglu_forward, .swiglu_backward = fa_swiglu_backward,
    .crossentropy = fa_crossentropy, .adamw = fa_adamw, .adamw_segments = fa_adamw_segments,
    .adamw_multi = fa_adamw_multi,
    .sumsq_blocks = fa_sumsq_blocks, .sumsq_blocks_many = fa_sumsq_blocks_many,
    .sum = fa_sum, .randn = fa_randn, .upload = fa_upload,
    .host_waits = fa_host_waits,
    .host_wait_ns = fa_host_wait_ns,
};
