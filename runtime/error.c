/* error.c -- per-thread error messages (libuv/SQLite style codes + text). */
#include <stdarg.h>
#include <stdio.h>
#include "internal.h"

static _Thread_local char last_error[1024];

int zt_error(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}

void zt_clear_error(void) { last_error[0] = '\0'; }

const char *zt_last_error(void) { return last_error; }

const char *zt_strerror(int code)
{
    switch (code) {
    case ZT_OK: return "OK";
    case ZT_EINVAL: return "EINVAL";
    case ZT_ENOMEM: return "ENOMEM";
    case ZT_ELIMIT: return "ELIMIT";
    case ZT_EIO: return "EIO";
    case ZT_ESTATE: return "ESTATE";
    default: return "EUNKNOWN";
    }
}

/* A kernel skipped `bad` token ids outside [0,V): a clear error, never a
 * wild read. The ids are not read on the host (they live on the device).
 * Here, not in ops.c: the CUDA device reports deferred counts with it, and
 * test_cuda links the device without the ops. */
int zt_bad_tokens_error(const char *op, const char *what, int64_t bad, int64_t n, int64_t V,
                        int deferred)
{
    return zt_error(ZT_EINVAL, "%s: %lld of %lld %s are outside the vocabulary [0,%lld) and were "
                    "skipped (the outputs are wrong for them)%s; the tokenizer and the model's "
                    "vocabulary size V disagree: check token ids against V where they are made",
                    op, (long long)bad, (long long)n, what, (long long)V,
                    deferred ? " -- counted on the device and read at its next sync, so the "
                    "count is over every call since the last one" : "");
}
