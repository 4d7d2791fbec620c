/*
 * zt_interrupt.h -- interrupts: the stop-request counter and its grace.
 * Part of the public API: include ztrain.h (conventions there); the FFI
 * reads every part in ztrain.h's order.
 */
#ifndef ZTRAIN_INTERRUPT_H
#define ZTRAIN_INTERRUPT_H


/* ---- interrupts (interrupt.c) --------------------------------------------
 * A process-wide counter that the installed signal handler increments (and
 * nothing else: it is async-signal-safe). Long loops poll it at boundaries
 * where stopping is safe; what an interrupt means is the caller's choice. */
/* Handle signal `sig` (SIGINT 2, SIGTERM 15, SIGUSR1 10) by counting it;
 * without SA_RESTART, so a blocking read returns EINTR. */
int zt_interrupt_install(int sig);
/* Give `sig` its default action back. */
int zt_interrupt_restore(int sig);
/* Signals counted since the last clear. */
int zt_interrupt_count(void);
void zt_interrupt_clear(void);
/* Count one as a signal would (tests, a caller forwarding an interrupt). */
void zt_interrupt_raise(void);
/* n > 0: the n-th signal received (counting from the start, cleared or not)
 * takes its default action at once instead of being counted: a graceful
 * stop's "second signal stops now". 0 = never. */
void zt_interrupt_hard(int n);
/* With zt_interrupt_hard set: the first signal leaves `seconds` to reach a
 * safe stop (the end of the step in flight), after which the process says
 * so and ends with 128 + that signal (a rank stuck in a collective with a
 * dead peer). zt_interrupt_grace_done() when the stop point was reached. */
void zt_interrupt_grace(int seconds);
void zt_interrupt_grace_done(void);

#endif
