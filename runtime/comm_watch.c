/*
 * comm_watch.c -- the collective watchdog and checked collectives.
 *
 * A hung collective is the worst failure of a distributed job: nothing is
 * printed, nothing ends. Two tools against it, both on the engine (comm.c):
 *
 *  - The watchdog (zt_comm_watch(timeout, ...)): every operation records
 *    its communicator's collective number (seq) and when it started. One in
 *    flight longer than the timeout makes its rank ask every member of the
 *    group, over a side channel of the transport, where they are; each
 *    engine answers from its own thread (even while its program computes):
 *    "arrived", or its last completed operation on that group and what it is
 *    in now. A rank that does not answer within a grace period is stopped
 *    (SIGSTOP), dead, or stuck outside the engine. The rank prints the
 *    verdict, one line per rank, and ends the job with exit status
 *    ZT_EXIT_COMM.
 *  - Checked collectives (zt_comm_watch(..., check = 1)): before each
 *    collective the ranks of its group all-gather a signature (operation,
 *    dtype, count, root, seq, the caller's call site) and, where any differs,
 *    every rank fails that collective with the same message naming both call
 *    sites -- instead of a hang or a reduction of mismatched buffers.
 *
 * Questions and answers are 256-byte messages; the engine serves them
 * between its polls (and every 100 ms when idle, while the watchdog is on).
 *
 * The report and the check's errors name the two settings as the caller
 * calls them (zt_comm_watch_names: a recipe's keys); by default as C does,
 * "zt_comm_watch timeout" and "zt_comm_watch check".
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "comm.h"

static double watch_timeout;         /* seconds; 0 = off (API thread writes, engine reads) */
static int watch_check;
#define NAME_TIMEOUT "zt_comm_watch timeout"
#define NAME_CHECK "zt_comm_watch check"
static char name_timeout[64] = NAME_TIMEOUT, name_check[64] = NAME_CHECK;
static __thread char thread_site[96];
static zt_comm *registry;            /* live communicators (engine thread) */

#define GRACE_S 2.0                  /* how long a stuck rank waits for answers */

int zt_comm_watch(double timeout_s, int check)
{
    ZT_CHECK(timeout_s >= 0 && timeout_s == timeout_s, "zt_comm_watch: timeout %g s must be >= 0 "
             "(0 = off)", timeout_s);
    __atomic_store(&watch_timeout, &timeout_s, __ATOMIC_RELAXED);
    __atomic_store_n(&watch_check, check != 0, __ATOMIC_RELAXED);
    return ZT_OK;
}

int zt_comm_watch_names(const char *timeout_name, const char *check_name)
{
    ZT_CHECK((!timeout_name || strlen(timeout_name) < sizeof name_timeout) &&
             (!check_name || strlen(check_name) < sizeof name_check),
             "zt_comm_watch_names: a name of %zu characters or more", sizeof name_timeout);
    if (timeout_name)
        snprintf(name_timeout, sizeof name_timeout, "%s", *timeout_name ? timeout_name : NAME_TIMEOUT);
    if (check_name)
        snprintf(name_check, sizeof name_check, "%s", *check_name ? check_name : NAME_CHECK);
    return ZT_OK;
}

void zt_comm_set_site(const char *site)
{
    snprintf(thread_site, sizeof thread_site, "%s", site ? site : "");
}

double zt_watch_timeout(void)
{
    double t;
    __atomic_load(&watch_timeout, &t, __ATOMIC_RELAXED);
    return t;
}

int zt_watch_check(void) { return __atomic_load_n(&watch_check, __ATOMIC_RELAXED); }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *kind_name(int kind)
{
    switch (kind) {
    case ZT_OP_ALL_REDUCE: return "all_reduce";
    case ZT_OP_REDUCE_SCATTER: return "reduce_scatter";
    case ZT_OP_ALL_GATHER: return "all_gather";
    case ZT_OP_BROADCAST: return "broadcast";
    case ZT_OP_SEND: return "send";
    case ZT_OP_RECV: return "recv";
    case ZT_OP_BARRIER: return "barrier";
    case ZT_OP_SPLIT: return "split";
    case ZT_OP_FREE: return "free";
    case ZT_OP_ALL_GATHER_HOST: return "all_gather (host)";
    case ZT_OP_BROADCAST_HOST: return "broadcast (host)";
    case ZT_OP_FENCE: return "fence";
    default: return "?";
    }
}

static const char *dtype_name(int dtype)
{
    switch (dtype) {
    case ZT_F32: return "f32";
    case ZT_BF16: return "bf16";
    case ZT_F16: return "f16";
    case ZT_I32: return "i32";
    case ZT_U16: return "u16";
    default: return "bytes";
    }
}

/* ---- registry ---------------------------------------------------------------- */
static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdULL;
}

void zt_watch_register(zt_comm *c, const zt_comm *parent, uint64_t split_seq, int color)
{
    c->gid = parent ? mix(mix(parent->gid, split_seq), (uint64_t)color) : 1;
    c->all_next = registry;
    registry = c;
}

void zt_watch_unregister(zt_comm *c)
{
    for (zt_comm **pp = &registry; *pp; pp = &(*pp)->all_next)
        if (*pp == c) { *pp = c->all_next; return; }
}

static zt_comm *find(uint64_t gid)
{
    for (zt_comm *c = registry; c; c = c->all_next)
        if (c->gid == gid) return c;
    return NULL;
}

void zt_watch_done(zt_comm_req *op, double t)
{
    if (op->seq == 0 || !op->comm || op->check_of) return;
    op->comm->done_seq = op->seq;
    op->comm->done_kind = op->kind;
    op->comm->done_t = t;
}

static void group_name(const zt_comm *c, char *buf, size_t n)
{
    if (c->is_world) snprintf(buf, n, "the world (%d ranks)", c->size);
    else snprintf(buf, n, "group %04" PRIx64 " (%d ranks)", c->gid & 0xffff, c->size);
}

/* ---- checked collectives --------------------------------------------------------- */
typedef struct {
    int32_t kind, dtype;
    int64_t count;
    int32_t root, size;
    uint64_t seq;
    char site[96];
} sig_t;                              /* 128 bytes, the same on every rank */

void zt_watch_stamp(zt_comm_req *op)
{
    if (zt_watch_check()) snprintf(op->site, sizeof op->site, "%s", thread_site);
}

zt_comm_req *zt_watch_signature_op(zt_comm_req *op)
{
    if (!zt_watch_check() || op->kind == ZT_OP_SEND || op->kind == ZT_OP_RECV ||
        op->kind == ZT_OP_FREE || op->comm->size < 2)
        return NULL;
    zt_comm_req *s = calloc(1, sizeof *s);
    char *buf = calloc((size_t)op->comm->size + 1, sizeof(sig_t));
    if (!s || !buf) { free(s); free(buf); return NULL; }
    sig_t *mine = (sig_t *)(buf + (size_t)op->comm->size * sizeof(sig_t));
    mine->kind = op->kind;
    mine->dtype = op->dtype;
    mine->count = op->kind == ZT_OP_BARRIER || op->kind == ZT_OP_SPLIT || op->kind == ZT_OP_FENCE ?
                  0 : op->count;
    mine->root = op->kind == ZT_OP_BROADCAST || op->kind == ZT_OP_BROADCAST_HOST ? op->root : -1;
    mine->size = op->comm->size;
    mine->seq = op->seq;
    snprintf(mine->site, sizeof mine->site, "%s", op->site);
    s->kind = ZT_OP_ALL_GATHER_HOST;
    s->fn = name_check;
    s->comm = op->comm;
    s->tp = op->tp;
    s->dtype = -1;
    s->esize = 1;
    s->tier = ZT_TIER_HOST;
    s->scratch_bytes = op->scratch_bytes;
    s->msg_bytes = op->msg_bytes;
    s->out = buf;
    s->in = mine;
    s->count = (int64_t)sizeof(sig_t);
    s->check_of = op;
    s->seq = op->seq;                 /* stuck in it = stuck at op, for the watchdog */
    s->detached = 1;                  /* nobody waits: complete() frees it */
    return s;
}

static void describe_sig(const sig_t *g, char *buf, size_t n)
{
    char extra[48] = "";
    if (g->kind == ZT_OP_FENCE) {     /* no payload: where it stands says it all */
        snprintf(buf, n, "a fence at %s", g->site[0] ? g->site : "an unknown call site");
        return;
    }
    if (g->root >= 0) snprintf(extra, sizeof extra, ", root %d", g->root);
    snprintf(buf, n, "%s (%s, %" PRId64 " elements%s) at %s", kind_name(g->kind), dtype_name(g->dtype),
             g->count, extra, g->site[0] ? g->site : "an unknown call site");
}

void zt_watch_compare(zt_comm_req *sig)
{
    zt_comm_req *op = sig->check_of;
    const sig_t *all = sig->out;
    if (sig->rc != ZT_OK || !all) {
        op->pre_rc = sig->rc != ZT_OK ? sig->rc : ZT_EIO;
        snprintf(op->pre_msg, sizeof op->pre_msg, "%s: exchanging signatures failed: %s",
                 name_check, sig->msg);
    } else {
        for (int r = 1; r < sig->comm->size; r++) {
            const sig_t *a = &all[0], *b = &all[r];
            if (a->kind == b->kind && a->dtype == b->dtype && a->count == b->count &&
                a->root == b->root && a->seq == b->seq)
                continue;
            char da[200], db[200], g[64];
            describe_sig(a, da, sizeof da);
            describe_sig(b, db, sizeof db);
            group_name(sig->comm, g, sizeof g);
            op->pre_rc = ZT_EINVAL;
            snprintf(op->pre_msg, sizeof op->pre_msg, "%s: collective #%" PRIu64 " on %s "
                     "differs between ranks: rank 0 calls %s; rank %d calls %s", name_check, a->seq, g,
                     da, r, db);
            break;
        }
    }
    free(sig->out);
    sig->out = NULL;
    sig->in = NULL;
}

/* ---- the watchdog ----------------------------------------------------------------- */
enum { Q_ASK = 1, Q_ANSWER = 2 };
typedef struct {
    int32_t type, from;
    uint64_t gid, seq;
    char text[232];
} wd_msg;                             /* 256 bytes */

/* This rank's answer to "are you in collective #seq on group gid?" */
static void answer(const zt_comm *world, zt_comm_req *fly, const wd_msg *q, wd_msg *a)
{
    memset(a, 0, sizeof *a);
    a->type = Q_ANSWER;
    a->from = world->rank;
    a->gid = q->gid;
    a->seq = q->seq;
    double t = now_s();
    const zt_comm *c = find(q->gid);
    if (!c) { snprintf(a->text, sizeof a->text, "N is not a member of that group (yet)"); return; }
    for (zt_comm_req *f = fly; f; f = f->next)
        if (f->comm == c && f->seq == q->seq) {
            snprintf(a->text, sizeof a->text, "A");
            return;
        }
    char now[120] = "not in any collective (computing, or waiting elsewhere)";
    for (zt_comm_req *f = fly; f; f = f->next) {
        if (f->seq == 0) continue;
        char g[64];
        group_name(f->comm, g, sizeof g);
        snprintf(now, sizeof now, "in %s #%" PRIu64 " on %s for %.1f s", kind_name(f->check_of ?
                 f->check_of->kind : f->kind), f->seq, g,
                 t - f->t_start);
        break;
    }
    if (c->done_seq)
        snprintf(a->text, sizeof a->text, "N last completed %s #%" PRIu64 " on that group %.1f s ago; now %s",
                 kind_name(c->done_kind), c->done_seq, t - c->done_t, now);
    else
        snprintf(a->text, sizeof a->text, "N completed nothing on that group yet; now %s", now);
}

/* Answer one pending question, if any; returns the answer received (type
 * Q_ANSWER) into *got, or 0 when nothing came. */
static int serve_one(zt_comm *world, zt_comm_req *fly, wd_msg *got)
{
    const zt_transport *tp = world->tp;
    wd_msg m;
    int from = -1;
    if (!tp->side_poll || tp->side_poll(&m, (int)sizeof m, &from) != 1) return 0;
    if (m.type == Q_ASK) {
        wd_msg a;
        answer(world, fly, &m, &a);
        tp->side_send(from, &a, (int)sizeof a);
        return -1;                    /* served; look again */
    }
    if (m.type == Q_ANSWER && got) { *got = m; return 1; }
    return -1;
}

void zt_watch_serve(zt_comm *world, zt_comm_req *fly)
{
    for (int i = 0; i < 64 && serve_one(world, fly, NULL) != 0; i++) {}
}

void zt_watch_stuck(zt_comm *world, zt_comm_req *op, zt_comm_req *fly, double waited)
{
    const zt_transport *tp = world->tp;
    zt_comm *c = op->comm;
    int p = c->size;
    int *ranks = calloc((size_t)p, sizeof *ranks);
    char (*said)[232] = calloc((size_t)p, sizeof *said);
    op->watched = 1;
    if (!ranks || !said || !tp->world_ranks || tp->world_ranks(c, ranks) != ZT_OK) {
        fprintf(stderr, "ztrain: rank %d: %s: %s has waited %.1f s; ending the job\n",
                world->rank, name_timeout, kind_name(op->kind), waited);
        zt_comm_abort(ZT_EXIT_COMM);
    }
    wd_msg q = { .type = Q_ASK, .from = world->rank, .gid = c->gid, .seq = op->seq };
    for (int r = 0; r < p; r++)
        if (ranks[r] != world->rank) tp->side_send(ranks[r], &q, (int)sizeof q);
    snprintf(said[c->rank], sizeof said[0], "A");
    int missing = p - 1;
    double t0 = now_s();
    while (missing > 0 && now_s() - t0 < GRACE_S) {
        wd_msg a;
        int got = serve_one(world, fly, &a);
        if (got == 1 && a.gid == c->gid && a.seq == op->seq) {
            for (int r = 0; r < p; r++)
                if (ranks[r] == a.from && !said[r][0]) {
                    snprintf(said[r], sizeof said[r], "%s", a.text);
                    missing--;
                }
        } else if (got == 0) {
            struct timespec ts = { 0, 2000000 };
            nanosleep(&ts, NULL);
        }
    }
    char g[64];
    group_name(c, g, sizeof g);
    const zt_comm_req *u = op->check_of ? op->check_of : op;     /* the user's operation */
    double bytes = (double)u->count * (double)u->esize;
    char size[32];
    if (bytes >= 1048576.0) snprintf(size, sizeof size, "%.2f MiB", bytes / 1048576.0);
    else snprintf(size, sizeof size, "%.0f bytes", bytes);
    fprintf(stderr, "ztrain: rank %d: %s: %s #%" PRIu64 " on %s, %s, has waited %.1f s "
            "for its peers (%s = %g s):\n", world->rank, name_timeout, kind_name(u->kind), op->seq, g,
            size, waited, name_timeout, zt_watch_timeout());
    for (int r = 0; r < p; r++) {
        const char *s = said[r];
        fprintf(stderr, "  rank %d%s: %s\n", ranks[r], ranks[r] == world->rank ? " (this rank)" : "",
                !s[0] ? "no answer: stopped (SIGSTOP), dead, or stuck outside ztrain's engine"
                : s[0] == 'A' ? "arrived" : s + 2);
    }
    fprintf(stderr, "ztrain: ending the job (exit status %d)\n", ZT_EXIT_COMM);
    fflush(stderr);
    free(ranks);
    free(said);
    zt_comm_abort(ZT_EXIT_COMM);
}
