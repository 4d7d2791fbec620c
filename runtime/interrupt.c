/*
 * interrupt.c -- a process-wide interrupt counter that signals increment.
 *
 * The handler does one thing: an atomic increment (async-signal-safe; no
 * locks, no allocation, no exit). Whoever runs long loops -- the trainer
 * between steps, data loading, the REPL -- polls zt_interrupt_count() at a
 * boundary where stopping is safe and decides there what an interrupt means
 * (the REPL: a Lua error "interrupted"; a graceful stop: finish the step,
 * checkpoint, exit). A count rather than a flag, so a caller can tell a
 * second signal from the first ("stop now").
 */
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include "internal.h"

static atomic_int interrupt_count;
static atomic_int received;          /* every signal since start: never cleared */
static atomic_int hard_after;        /* 0, or the signal that kills at once */

static void on_signal(int sig)
{
    atomic_fetch_add_explicit(&interrupt_count, 1, memory_order_relaxed);
    int n = atomic_fetch_add_explicit(&received, 1, memory_order_relaxed) + 1;
    int h = atomic_load_explicit(&hard_after, memory_order_relaxed);
    if (h > 0 && n >= h) {
        /* "a second Ctrl-C stops at once": the signal's own default action
         * (sigaction and raise are async-signal-safe) */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = SIG_DFL;
        sigemptyset(&sa.sa_mask);
        sigaction(sig, &sa, NULL);
        raise(sig);
    }
}

void zt_interrupt_hard(int n)
{
    atomic_store_explicit(&hard_after, n > 0 ? n : 0, memory_order_relaxed);
}

int zt_interrupt_install(int sig)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    /* no SA_RESTART: a blocking read or poll returns EINTR, so a prompt
     * waiting for input notices the signal at once */
    sa.sa_flags = 0;
    if (sigaction(sig, &sa, NULL) != 0)
        return zt_error(ZT_EINVAL, "cannot install a handler for signal %d", sig);
    return ZT_OK;
}

int zt_interrupt_restore(int sig)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, NULL) != 0)
        return zt_error(ZT_EINVAL, "cannot restore the default action of signal %d", sig);
    return ZT_OK;
}

int zt_interrupt_count(void)
{
    return atomic_load_explicit(&interrupt_count, memory_order_relaxed);
}

void zt_interrupt_clear(void)
{
    atomic_store_explicit(&interrupt_count, 0, memory_order_relaxed);
}

void zt_interrupt_raise(void)
{
    atomic_fetch_add_explicit(&interrupt_count, 1, memory_order_relaxed);
}
