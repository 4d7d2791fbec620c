/*
 * zt_stream.h -- streams and events.
 * Part of the public API: include ztrain.h (conventions there); the FFI
 * reads every part in ztrain.h's order.
 */
#ifndef ZTRAIN_STREAM_H
#define ZTRAIN_STREAM_H

#include "zt_core.h"
#include "zt_comm.h"          /* zt_stream_wait_comm waits on a zt_comm_req */

/* ---- streams and events -----------------------------------------------------
 * Work is issued to a stream; one stream's work runs in issue order, two
 * streams' work may overlap. A stream can wait on an event (recorded on
 * another stream) or on a communication request; the host waits only where
 * it asks (zt_stream_sync, zt_event_sync). Write strategies as if every copy
 * and collective were asynchronous: on a GPU they are.
 *
 * Kinds: COMPUTE (kernels), COPY (transfers between tiers), COMM (work that
 * follows collectives). Each thread has a current stream, the default
 * compute stream unless zt_stream_set_current chose another; ops, and
 * stream arguments given as NULL, use it.
 *
 * The CPU backend:
 *  - A compute stream is the calling thread: its work is done when the call
 *    returns, an event recorded on it completes at once, and a compute
 *    stream told to wait (event, comm request) blocks the caller until the
 *    wait is met.
 *  - A copy or comm stream is real: a worker thread of its own runs its
 *    queue in order (copies through the device copy, waits, event records);
 *    an event completes when the worker reaches it. Reading a tensor before
 *    the event after its copy has completed is a race, as on a GPU.
 *  - An op (zt_add, ...) or zt_tensor_read/write issued while a copy or comm
 *    stream is current first waits for that stream's queued work, then runs
 *    on the caller: the stream's order holds; only the queued work overlaps.
 *
 * Errors in queued work (a GPU's asynchronous faults; on the CPU only a
 * failure passed on through a waited-on event, or a test's injected one)
 * are kept by the stream, which skips its later work until the error is
 * reported: the next zt_stream_sync (or op drain, above) returns it with its
 * message and clears it. An event recorded after the failure carries it too: zt_event_sync and
 * zt_event_query return it.
 *
 * Lifetimes: tensors given to zt_copy_async are retained until the copy is
 * done (releasing them meanwhile is safe; the bytes stay accounted until
 * then); an event is kept alive by the streams that will record or wait on
 * it. Nothing else is allocated: memory accounting is unchanged. */
typedef struct zt_stream zt_stream;
typedef struct zt_event zt_event;
typedef enum { ZT_STREAM_COMPUTE = 0, ZT_STREAM_COPY = 1, ZT_STREAM_COMM = 2 } zt_stream_kind;

int zt_stream_new(zt_stream **out, int kind);
/* Wait for the stream's queued work, then free it. An error it still keeps
 * is dropped (sync first to see it). NULL and the default stream are
 * ignored. If it is the calling thread's current stream, the thread goes
 * back to the default; other threads must have stopped using it. */
void zt_stream_free(zt_stream *s);
/* The default compute stream (it is never freed). */
zt_stream *zt_stream_default(void);
/* Make s the calling thread's current stream (NULL: the default). */
int zt_stream_set_current(zt_stream *s);
zt_stream *zt_stream_current(void);
/* Block until all work issued to s (NULL: current) so far is done; returns
 * the error its work kept, if any. */
int zt_stream_sync(zt_stream *s);
/* Later work on s waits until e's latest record at the time of this call
 * has completed (an event never recorded is complete). */
int zt_stream_wait_event(zt_stream *s, zt_event *e);
/* Later work on s waits until the request r has completed. This does NOT
 * consume r: it must still be waited exactly once with zt_comm_wait (which
 * frees it), and not before s has passed this wait -- zt_stream_sync(s), or
 * an event recorded on s after this call has completed -- because s reads r
 * until then. The operation's own result is returned by zt_comm_wait. */
int zt_stream_wait_comm(zt_stream *s, zt_comm_req *r);

int zt_event_new(zt_event **out);
/* Drop the caller's reference (streams that will still record or wait on
 * it keep it alive). NULL is ignored. */
void zt_event_free(zt_event *e);
/* e completes when s (NULL: current) reaches this point: at once on a
 * compute stream. Recording again moves the event to the new point. */
int zt_event_record(zt_event *e, zt_stream *s);
/* Block until e's latest record has completed; the error it carries, if any. */
int zt_event_sync(zt_event *e);
/* *done = 1 if e's latest record has completed (never blocks); errors as
 * zt_event_sync once done. */
int zt_event_query(zt_event *e, int *done);

/* dst = src on stream s (NULL: current): same dtype and numel; device <->
 * host, within one of them, or nvme <-> host (a GPU cannot read a file:
 * nvme <-> device goes through a host tensor); dst and src must not overlap.
 * Asynchronous: the host must touch neither tensor (read, write, or use in
 * an op on another stream) until an event recorded on s after this call has
 * completed, or s was synced.
 * An nvme copy on a copy stream: the stream's worker issues the blocks
 * through the nvme engine (up to its queue depth in flight) and goes on
 * when all are done, so events recorded after it complete after the bytes
 * are on disk (or in memory); an I/O error becomes the stream's error. On a
 * compute stream it runs on the caller and returns the I/O error itself.
 * Two nvme copies in flight at once (on two streams) must not share a 4 KiB
 * page of one swap file if either writes it (see the aio section). */
int zt_copy_async(zt_tensor *dst, const zt_tensor *src, zt_stream *s);

#endif
