/* log.c — levelled logging to stderr. The level comes from DW_LOG on first use. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "core/log.h"

static int current_level = -1; /* -1: not read from the environment yet */
static char rank_tag[32];      /* " rank R/N" in a job of several processes (comm/), else "" */

void dw_log_set_rank(int rank, int world) {
    if (world > 1) snprintf(rank_tag, sizeof rank_tag, " rank %d/%d", rank, world);
    else rank_tag[0] = '\0';
}

bool dw_log_parse_level(const char *name, dw_log_level *out) {
    static const char *const names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i <= DW_LOG_OFF; i++) {
        if (name && strcmp(name, names[i]) == 0) {
            *out = (dw_log_level)i;
            return true;
        }
    }
    return false;
}

dw_log_level dw_log_get_level(void) {
    if (current_level < 0) {
        dw_log_level level = DW_LOG_INFO;
        const char *env = dw_env("DW_LOG");
        if (env && !dw_log_parse_level(env, &level)) {
            fprintf(stderr, "deepwell: warning: DW_LOG=%s is not one of debug|info|warn|error|off; "
                            "using info\n", env);
        }
        current_level = (int)level;
    }
    return (dw_log_level)current_level;
}

void dw_log_set_level(dw_log_level level) { current_level = (int)level; }

void dw_log(dw_log_level level, const char *fmt, ...) {
    if (level < dw_log_get_level()) return;
    static const char *const tags[] = {"debug", "info", "warn", "error"};
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[deepwell %s%s] %s\n", tags[level], rank_tag, line);
}
