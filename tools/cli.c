/* cli.c — shared helpers for `deepwell` subcommands. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

void cli_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "deepwell %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int cli_exit_for(dw_status s) {
    switch (s) {
    case DW_OK: return DW_EXIT_OK;
    case DW_ERR_INVALID:
    case DW_ERR_FORMAT:
    case DW_ERR_IO: return DW_EXIT_USAGE;
    default: return DW_EXIT_FAIL;
    }
}

int cli_fail(const char *cmd, const dw_ctx *ctx, dw_status s) {
    cli_error(cmd, "%s", dw_errmsg(ctx));
    return cli_exit_for(s);
}

bool cli_parse_int(const char *cmd, const char *flag, const char *text, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    long v = text ? strtol(text, &end, 10) : 0;
    if (!text || !*text || *end || errno || v < lo || v > hi) {
        cli_error(cmd, "%s expects an integer in [%ld, %ld], got '%s'", flag, lo, hi,
                  text ? text : "");
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_double(const char *cmd, const char *flag, const char *text, double *out) {
    char *end = NULL;
    errno = 0;
    double v = text ? strtod(text, &end) : 0;
    if (!text || !*text || *end || errno || !isfinite(v)) {
        cli_error(cmd, "%s expects a number, got '%s'", flag, text ? text : "");
        return false;
    }
    *out = v;
    return true;
}

int cli_usage_error(const char *cmd) {
    fprintf(stderr, "Try 'deepwell %s --help'.\n", cmd);
    return DW_EXIT_USAGE;
}
