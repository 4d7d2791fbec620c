/*
 * ztrain.h -- the public C API of the ztrain runtime.
 *
 * This header is the single source of truth for the LuaJIT FFI: lua/ztrain/core/ffi.lua
 * reads it, drops preprocessor lines and comments, and passes the rest to
 * ffi.cdef. So: no macros in declarations, plain C types only, and every
 * constant an enum.
 *
 * Conventions (libuv style):
 *  - Functions return 0 (ZT_OK) or a negative error code; on error
 *    zt_last_error() holds a message naming what was wrong and what to do.
 *    The message is per thread. It names C things -- the call and its
 *    arguments, zt_device_init("cuda"): ... -- never a setting of a program
 *    built on the library: a caller that passed a recipe key's value names
 *    the key (lua/ztrain/core/ffi.lua check_key; spec/unit/c_messages_spec.lua). Nothing in the library calls exit(). Three
 *    paths end the process, each off until the host program turns it on:
 *    the collective watchdog (zt_comm_watch with timeout_s > 0: from the
 *    communication thread, after printing its diagnosis, zt_comm_abort(5)),
 *    a stop request's grace period running out (zt_interrupt_grace:
 *    _exit(128 + the signal) from the alarm handler), and the "second
 *    signal" of zt_interrupt_hard (the signal's default action).
 *  - Functions validate all arguments before acquiring anything, so a failed
 *    call leaves no resource held and no state half-changed.
 *  - Tensors are refcounted: zt_tensor_new/zt_tensor_view return a tensor with
 *    one reference; zt_tensor_release drops it. A view keeps its base's
 *    storage alive.
 */
#ifndef ZTRAIN_H
#define ZTRAIN_H

/* The API by subsystem, in dependency order (lua/ztrain/core/ffi.lua reads
 * these includes in this order): */
#include "zt_core.h"
#include "zt_device.h"
#include "zt_ops.h"
#include "zt_comm.h"
#include "zt_stream.h"
#include "zt_aio.h"
#include "zt_interrupt.h"

#endif
