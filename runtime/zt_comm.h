/*
 * zt_comm.h -- communication: worlds, groups, collectives, the watchdog.
 * Part of the public API: include ztrain.h (conventions there); the FFI
 * reads every part in ztrain.h's order.
 */
#ifndef ZTRAIN_COMM_H
#define ZTRAIN_COMM_H

#include "zt_core.h"

/* ---- communication ----------------------------------------------------------
 * A communicator is a group of ranks (the world, or a sub-group of it).
 * Under an MPI launcher (mpirun / srun: detected from the environment) the
 * world spans the job's processes over MPI; otherwise it is one rank and no
 * MPI is touched. Every MPI call runs on one communication thread owned by
 * the runtime, so collectives proceed while kernels run: an async call
 * enqueues the operation and returns a request to wait on or test (polling;
 * there are no callbacks).
 *
 * Reductions are deterministic: contributions are summed in rank order
 * (rank 0 + rank 1 + ...) whatever the world size or timing, in f32 as
 * ((x0 + x1) + x2) + ... Tensors in collectives must stay alive and
 * untouched until the request completes. f32 for reductions; any dtype
 * for gather / broadcast / send / recv (moved as bytes).
 * Passing req = NULL makes a call blocking. */
typedef struct zt_comm zt_comm;
typedef struct zt_comm_req zt_comm_req;

/* 1 if the world will be MPI (a launcher is in the environment, or
 * ZTRAIN_COMM=mpi), 0 if local (none, or ZTRAIN_COMM=local), -1 if
 * ZTRAIN_COMM holds anything else. Reads the environment only. */
int zt_comm_launched(void);
/* The world communicator (created on first call; the same one afterwards). */
int zt_comm_world(zt_comm **out);
int zt_comm_rank(const zt_comm *c);
int zt_comm_size(const zt_comm *c);
/* Collective over parent: ranks with equal color form a group, ordered by
 * key then parent rank (MPI_Comm_split). */
int zt_comm_split(zt_comm **out, zt_comm *parent, int color, int key);
void zt_comm_free(zt_comm *c);
/* Name of the transport: "mpi", "nccl" or "local" (one rank, no MPI). */
const char *zt_comm_backend(const zt_comm *c);
/* Collective over c (an MPI communicator, the CUDA device active): from now
 * on c's device-tier collectives and transfers run on NCCL (one GPU per
 * rank), host-tier ones stay on MPI; groups split from c later run NCCL
 * too. deterministic != 0: all_reduce / reduce_scatter keep the rank-order
 * sum (an all-to-all, then the ordered sum on the GPU: the MPI transport's
 * bits); 0: NCCL's own all-reduce / reduce-scatter. NCCL runs a
 * communicator's device operations in issue order on one stream, and a
 * send waits for its receive (no tags, no buffering): ranks must issue
 * transfers and collectives on c in orders that match, or they deadlock.
 * A one-rank (local) c is left as it is. Without CUDA: ZT_EINVAL. */
int zt_comm_use_nccl(zt_comm *c, int deterministic);
/* Shut the communication thread and MPI down (after all requests). */
int zt_comm_finalize(void);
/* The collective watchdog and checker (docs/cli.md "When a rank stalls").
 * timeout_s > 0: an operation in flight longer than that makes its rank ask
 * every member of the group where it is, print which ranks arrived and each
 * other's last completed operation, and end the job with exit status 5;
 * 0 = off. check != 0: before each collective the ranks exchange a signature
 * (operation, dtype, count, root, sequence number, call site) and every rank
 * fails that collective, naming both call sites, where they differ. */
int zt_comm_watch(double timeout_s, int check);
/* How the watchdog's report and the check's errors name the two settings:
 * as the caller calls them (a program's options, a recipe's keys:
 * "comm.timeout", "comm.check"); NULL keeps a name, "" restores the
 * default, "zt_comm_watch timeout" / "zt_comm_watch check". Call it before
 * the collectives whose messages should use them. */
int zt_comm_watch_names(const char *timeout_name, const char *check_name);
/* The calling thread's call site (e.g. "trainer.lua:120"), carried by the
 * collectives it issues next while checking is on. */
void zt_comm_set_site(const char *site);
/* A fence on c: where every rank of c says "I am here, in no collective".
 * With checked collectives on (zt_comm_watch check) the ranks exchange
 * signatures as before a collective: where one rank is in another
 * collective instead, that collective and the fence both fail on every
 * rank with the check's message ("... rank 0 calls all_reduce (...) at
 * SITE; rank 1 calls a fence at SITE"), and c's ranks stay in step (each
 * counted one collective), so a caller that fences again until a fence
 * succeeds finds the ranks level once the odd collectives are spent (the
 * multi-rank REPL at the end of each chunk). With checking off it moves
 * nothing and always succeeds. Not counted by zt_comm_stats_get. */
int zt_comm_fence(zt_comm *c, zt_comm_req **req);
/* The program's last resort when one rank fails: terminate every rank of
 * the job with this exit code (MPI_Abort where MPI is up, then _exit). The
 * library calls it itself only from the collective watchdog (zt_comm_watch
 * with timeout_s > 0), with ZT_EXIT_COMM (5): the stuck rank cannot return
 * from the collective it waits in. */
void zt_comm_abort(int code);

/* x (f32, same numel on every rank) = sum over ranks, in rank order. */
int zt_all_reduce(zt_comm *c, zt_tensor *x, zt_comm_req **req);
/* in (f32, numel = size * numel(out)) on every rank; out = this rank's
 * chunk [rank*n, (rank+1)*n) of the rank-ordered sum. */
int zt_reduce_scatter(zt_comm *c, zt_tensor *out, const zt_tensor *in, zt_comm_req **req);
/* out (numel = size * numel(in)) = concatenation of every rank's in, by rank. */
int zt_all_gather(zt_comm *c, zt_tensor *out, const zt_tensor *in, zt_comm_req **req);
int zt_broadcast(zt_comm *c, zt_tensor *x, int root, zt_comm_req **req);
int zt_send(zt_comm *c, const zt_tensor *x, int peer, int tag, zt_comm_req **req);
int zt_recv(zt_comm *c, zt_tensor *x, int peer, int tag, zt_comm_req **req);
int zt_barrier(zt_comm *c, zt_comm_req **req);
/* Wait for a request and free it. Returns the operation's result. */
int zt_comm_wait(zt_comm_req *req);
/* *done = 1 if finished (the request must still be passed to zt_comm_wait). */
int zt_comm_test(zt_comm_req *req, int *done);

/* Blocking collectives on host memory, for small metadata (losses, norm
 * partials, memory stats, recipe hashes). out holds size * nbytes. */
int zt_comm_all_gather_host(zt_comm *c, void *out, const void *in, size_t nbytes);
int zt_comm_broadcast_host(zt_comm *c, void *buf, size_t nbytes, int root);

/* Communication counters (runtime/comm_stats.c; docs/architecture.md
 * "Communication"): this rank's operations over every communicator, by
 * kind. Bytes are what the operation moves between this rank and its peers
 * as the transport runs it, each message counted once at its sender and
 * once at its receiver, a rank's own share not counted (nothing moves over
 * one rank): all_reduce of n elements of e bytes over p ranks, rank r's
 * chunk L_r = n/p rounded as the partition does: sent = recv =
 * e (n + (p-2) L_r) (an all-to-all of chunks, then an all-gather of the
 * sums; 2 e n (p-1)/p when p divides n); reduce_scatter and all_gather of
 * m elements per rank: e m (p-1) each way; broadcast of n: the root sends
 * e n (p-1), every other rank receives e n; send / recv: e n. Counted when
 * the operation is issued (so a step's traffic is the operations it
 * issued). The comm.check signature exchanges are not counted.
 * busy_s: wall time during which at least one operation of this rank was
 * in flight (issued, not finished: queued behind its communicator's earlier
 * collectives and waiting for a peer included); exposed_s: time callers spent blocked in zt_comm_wait and in a
 * compute stream's zt_stream_wait_comm for an operation not yet finished
 * (summed over threads). Cheap: a few atomic adds per operation. */
enum {
    ZT_COMM_KIND_ALL_REDUCE, ZT_COMM_KIND_REDUCE_SCATTER, ZT_COMM_KIND_ALL_GATHER,
    ZT_COMM_KIND_BROADCAST, ZT_COMM_KIND_SEND, ZT_COMM_KIND_RECV, ZT_COMM_KIND_BARRIER,
    ZT_COMM_KIND_HOST,          /* zt_comm_all_gather_host / broadcast_host (metadata) */
    ZT_COMM_KIND_OTHER,         /* split, NCCL attach: no payload */
    ZT_COMM_KINDS
};
typedef struct { uint64_t sent, recv, calls; } zt_comm_kind_stats;
typedef struct {
    zt_comm_kind_stats kind[ZT_COMM_KINDS];
    uint64_t sent, recv, calls;     /* over every kind */
    double busy_s, exposed_s;
} zt_comm_stats;
/* This rank's counters since the start (or the last reset). c: any
 * communicator of this process, or NULL (the counters are the rank's, over
 * all its communicators). */
int zt_comm_stats_get(const zt_comm *c, zt_comm_stats *out);
/* Zero the counters (operations in flight count their time from now). */
void zt_comm_stats_reset(void);
/* "all_reduce", "reduce_scatter", ..., "host", "other"; NULL out of range. */
const char *zt_comm_kind_name(int kind);

#endif
