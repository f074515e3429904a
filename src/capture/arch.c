/* arch.c — the architecture table (archs.def) and the checkpoint-name rules of each row. */
#include <stdio.h>
#include <string.h>

#include "capture/arch.h"

static const dw_hf_arch table[DW_ARCH_COUNT] = {
#define DW_ARCH(ID, type, cls, fam, reads_config, trains, prefix, ignorable, experts, fused)                      \
    {DW_ARCH_##ID, type, cls, #fam, reads_config, trains, prefix, ignorable, experts, fused},
#include "capture/archs.def"
#undef DW_ARCH
};

const dw_hf_arch *dw_hf_arch_get(dw_arch a) { return (unsigned)a < DW_ARCH_COUNT ? &table[a] : NULL; }

const dw_hf_arch *dw_hf_arch_find(const char *model_type) {
    for (int i = 0; model_type && i < DW_ARCH_COUNT; i++)
        if (!strcmp(table[i].model_type, model_type)) return &table[i];
    return NULL;
}

void dw_hf_arch_list(char *buf, size_t n) {
    size_t used = 0;
    if (n) buf[0] = '\0';
    for (int i = 0; i < DW_ARCH_COUNT; i++) {
        if (!table[i].reads_config) continue;
        int w = snprintf(buf + used, n - used, "%s%s", used ? ", " : "", table[i].model_type);
        if (w < 0 || (size_t)w >= n - used) return;
        used += (size_t)w;
    }
}

bool dw_hf_ignorable(const dw_hf_arch *a, const char *stored, bool tied_embeddings) {
    if (tied_embeddings && !strcmp(stored, "lm_head.weight")) return true;
    size_t len = strlen(stored);
    for (const char *s = a->ignorable; *s;) {
        const char *bar = strchr(s, '|');
        size_t k = bar ? (size_t)(bar - s) : strlen(s);
        if (k && k <= len && !memcmp(stored + len - k, s, k)) return true;
        s += k + (bar ? 1 : 0);
    }
    return false;
}
