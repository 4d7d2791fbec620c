/* test_interrupt.c -- the interrupt counter: signals count, nothing else
 * happens (the process survives SIGINT and SIGTERM once installed), a
 * blocking read returns EINTR, restore gives the default action back. */
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include "ztrain.h"
#include "ctest.h"

int main(void)
{
    zt_interrupt_clear();
    ct_check(zt_interrupt_count() == 0, "interrupt.starts_clear", "count %d", zt_interrupt_count());
    ct_check(zt_interrupt_install(SIGINT) == 0 && zt_interrupt_install(SIGTERM) == 0,
             "interrupt.install", "%s", zt_last_error());
    raise(SIGINT);
    raise(SIGTERM);
    raise(SIGINT);
    ct_check(zt_interrupt_count() == 3, "interrupt.counts_signals", "count %d (want 3)", zt_interrupt_count());
    zt_interrupt_raise();
    ct_check(zt_interrupt_count() == 4, "interrupt.raise", "count %d", zt_interrupt_count());
    zt_interrupt_clear();
    ct_check(zt_interrupt_count() == 0, "interrupt.clear", "count %d", zt_interrupt_count());

    /* a read blocked on a pipe returns EINTR (no SA_RESTART) */
    int fds[2];
    if (pipe(fds) != 0) { ct_fail("interrupt.eintr", "pipe"); return ct_summary(); }
    pid_t parent = getpid();
    pid_t child = fork();
    if (child == 0) { usleep(100000); kill(parent, SIGINT); _exit(0); }
    char c;
    ssize_t n = read(fds[0], &c, 1);
    int err = errno;
    waitpid(child, NULL, 0);
    ct_check(n < 0 && err == EINTR && zt_interrupt_count() == 1, "interrupt.eintr",
             "read %zd errno %d count %d", n, err, zt_interrupt_count());

    /* restored: SIGINT ends a child as it would without the handler */
    ct_check(zt_interrupt_restore(SIGINT) == 0, "interrupt.restore", "%s", zt_last_error());
    child = fork();
    if (child == 0) { raise(SIGINT); _exit(0); }
    int st = 0;
    waitpid(child, &st, 0);
    ct_check(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT, "interrupt.restored_default", "status %d", st);
    return ct_summary();
}
