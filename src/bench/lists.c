/* lists.c — the benchmarks' comma lists (lists.h). */
#include <string.h>

#include "bench/lists.h"
#include "core/error.h"

bool dw_bench_list_has(const char *list, const char *word) {
    if (!list) return true;
    size_t n = strlen(word);
    for (const char *p = list; (p = strstr(p, word)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == 0)) return true;
    return false;
}

dw_status dw_bench_list_check(dw_ctx *ctx, const char *what, const char *list, const char *const *words, int nw) {
    for (const char *p = list; p && *p;) {
        size_t len = strcspn(p, ",");
        bool found = false;
        for (int i = 0; i < nw; i++) found |= strlen(words[i]) == len && !strncmp(p, words[i], len);
        if (!found && len)
            return dw_set_error(ctx, DW_ERR_INVALID, "%sunknown name '%.*s' in '%s'", what, (int)len, p, list);
        p += len + (p[len] == ',');
    }
    return DW_OK;
}
