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
