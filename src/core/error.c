/* error.c — status names, per-context and thread-local error messages, DW_ASSERT's hook. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "core/error.h"

static _Thread_local char tls_errmsg[DW_ERRMSG_CAP];

static const char *const status_names[DW_STATUS_COUNT] = {
    "DW_OK",           "DW_ERR_INVALID", "DW_ERR_NOMEM", "DW_ERR_IO",
    "DW_ERR_FORMAT",   "DW_ERR_UNSUPPORTED", "DW_ERR_CUDA", "DW_ERR_NUMERIC",
};
_Static_assert(sizeof(status_names) / sizeof(status_names[0]) == DW_STATUS_COUNT,
               "status_names must cover every dw_status");

const char *dw_status_name(dw_status s) {
    if ((int)s < 0 || s >= DW_STATUS_COUNT) return "DW_ERR_UNKNOWN";
    return status_names[s];
}

static char *errbuf(dw_ctx *ctx) { return ctx ? ctx->errmsg : tls_errmsg; }

dw_status dw_set_error(dw_ctx *ctx, dw_status status, const char *fmt, ...) {
    char *buf = errbuf(ctx);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, DW_ERRMSG_CAP, fmt, ap);
    va_end(ap);
    if (ctx) ctx->last_status = status;
    return status;
}

dw_status dw_prefix_error(dw_ctx *ctx, dw_status status, const char *fmt, ...) {
    char *buf = errbuf(ctx);
    char old[DW_ERRMSG_CAP];
    memcpy(old, buf, DW_ERRMSG_CAP);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, DW_ERRMSG_CAP, fmt, ap);
    va_end(ap);
    if (n >= 0 && n < DW_ERRMSG_CAP - 2) {
        size_t used = (size_t)n;
        buf[used++] = ':';
        buf[used++] = ' ';
        size_t room = DW_ERRMSG_CAP - used - 1, len = strnlen(old, DW_ERRMSG_CAP - 1);
        if (len > room) len = room;
        memcpy(buf + used, old, len);
        buf[used + len] = '\0';
    }
    if (ctx) ctx->last_status = status;
    return status;
}

void dw_clear_error(dw_ctx *ctx) {
    errbuf(ctx)[0] = '\0';
    if (ctx) ctx->last_status = DW_OK;
}

const char *dw_errmsg(const dw_ctx *ctx) { return ctx ? ctx->errmsg : tls_errmsg; }

static void default_assert_handler(const char *expr, const char *file, int line, const char *msg) {
    fprintf(stderr, "deepwell: assertion failed at %s:%d: %s%s%s\n", file, line, expr,
            msg ? " — " : "", msg ? msg : "");
    fflush(stderr);
    abort();
}

static dw_assert_handler assert_handler = default_assert_handler;

dw_assert_handler dw_set_assert_handler(dw_assert_handler handler) {
    dw_assert_handler old = assert_handler;
    assert_handler = handler ? handler : default_assert_handler;
    return old;
}

void dw_assert_fail(const char *expr, const char *file, int line, const char *msg) {
    assert_handler(expr, file, line, msg);
    abort(); /* a handler that returns must not let execution continue past a broken invariant */
}

void dw_free_string(char *s) { free(s); }
