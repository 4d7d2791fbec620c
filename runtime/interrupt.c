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
#include <unistd.h>
#include "internal.h"

static atomic_int interrupt_count;
static atomic_int received;          /* every signal since start: never cleared */
static atomic_int hard_after;        /* 0, or the signal that kills at once */
static atomic_int grace_s;           /* seconds the first signal leaves to stop */
static atomic_int first_sig;

/* The first stop request's grace ran out (a rank stuck in a collective with
 * a dead peer never reaches the end of its step): say so, end with the
 * request's own status. write and _exit are async-signal-safe. */
static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "ztrain: the step in flight did not end within its grace period after the "
                              "stop request (a peer gone?); stopping now\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(128 + atomic_load_explicit(&first_sig, memory_order_relaxed));
}

static void on_signal(int sig)
{
    atomic_fetch_add_explicit(&interrupt_count, 1, memory_order_relaxed);
    int n = atomic_fetch_add_explicit(&received, 1, memory_order_relaxed) + 1;
    int h = atomic_load_explicit(&hard_after, memory_order_relaxed);
    int g = atomic_load_explicit(&grace_s, memory_order_relaxed);
    if (n == 1 && h > 0 && g > 0) {
        atomic_store_explicit(&first_sig, sig, memory_order_relaxed);
        alarm((unsigned)g);
    }
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

void zt_interrupt_grace(int seconds)
{
    if (seconds > 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_alarm;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGALRM, &sa, NULL);
    }
    atomic_store_explicit(&grace_s, seconds > 0 ? seconds : 0, memory_order_relaxed);
}

void zt_interrupt_grace_done(void) { alarm(0); }

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
