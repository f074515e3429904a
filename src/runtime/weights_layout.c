/* weights_layout.c — the Hugging Face pieces of each parameter (weights_layout.h): one piece under
 * the parameter's own name, a block of rows of Phi-3's fused qkv_proj / gate_up_proj, or the expert
 * weights and router of a mixture-of-experts layer in the fused or the per-expert layout. Names
 * only: no file is read here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/weights_layout.h"

/* Whether s ends with suffix; then *stem_len is the length before it. */
static bool ends_with(const char *s, const char *suffix, size_t *stem_len) {
    const size_t n = strlen(s), k = strlen(suffix);
    if (n < k || strcmp(s + n - k, suffix)) return false;
    *stem_len = n - k;
    return true;
}

static char *name_of(const char *stem, size_t stem_len, const char *rest) {
    const size_t n = stem_len + strlen(rest) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%.*s%s", (int)stem_len, stem, rest);
    return s;
}

void dw_hf_pieces_free(dw_hf_piece *pc, int n) {
    for (int i = 0; pc && i < n; i++) free(pc[i].stored);
    free(pc);
}

bool dw_hf_per_expert_name(const char *stored) {
    for (const char *s = strstr(stored, ".experts."); s; s = strstr(s + 1, ".experts."))
        if (s[9] >= '0' && s[9] <= '9') return true;
    return false;
}

bool dw_hf_fused_expert_name(const char *stored) {
    size_t stem;
    return ends_with(stored, ".experts.gate_up_proj", &stem) || ends_with(stored, ".experts.down_proj", &stem);
}

/* The architecture's per-expert names: module, and the gate, up, down weights ("|"-separated in
 * archs.def); Mixtral's when the architecture has none. */
static void expert_names(const dw_hf_arch *a, char names[4][32]) {
    const char *src = a && *a->experts ? a->experts : "block_sparse_moe|w1|w3|w2";
    for (int k = 0; k < 4; k++) {
        const char *bar = strchr(src, '|');
        const size_t len = bar ? (size_t)(bar - src) : strlen(src);
        snprintf(names[k], sizeof names[k], "%.*s", (int)len, src);
        src = bar ? bar + 1 : src + len;
    }
}

/* Phi-3's fused projections (archs.def's fused column): each stored tensor, then the parameters
 * whose rows it concatenates, in order. */
static const char *const fused_groups[2][4] = {
    {".self_attn.qkv_proj.weight", ".self_attn.q_proj.weight", ".self_attn.k_proj.weight", ".self_attn.v_proj.weight"},
    {".mlp.gate_up_proj.weight", ".mlp.gate_proj.weight", ".mlp.up_proj.weight", NULL}};

/* When p is one part of a fused tensor: its one piece in *pc (rows after the parts before it in the
 * graph's order of the group) and true; false when p is no part (*pc untouched). *pc NULL with true:
 * out of memory, or a sibling missing from the graph. */
static bool fused_part(const dw_graph *g, const dw_ir_tensor *p, dw_hf_piece **pc) {
    for (int gi = 0; gi < 2; gi++)
        for (int k = 1; k < 4 && fused_groups[gi][k]; k++) {
            size_t stem;
            if (p->ndim != 2 || !ends_with(p->name, fused_groups[gi][k], &stem)) continue;
            int64_t before = 0, rows = 0;
            *pc = NULL;
            for (int m = 1; m < 4 && fused_groups[gi][m]; m++) {
                char *name = name_of(p->name, stem, fused_groups[gi][m]);
                const int t = name ? dw_graph_find_tensor(g, name) : -1;
                free(name);
                if (t < 0 || g->tensors[t].ndim != 2 || g->tensors[t].shape[1] != p->shape[1]) return true;
                before += m < k ? g->tensors[t].shape[0] : 0;
                rows += g->tensors[t].shape[0];
            }
            dw_hf_piece *q = calloc(1, sizeof *q);
            if (q && !(q->stored = name_of(p->name, stem, fused_groups[gi][0]))) free(q), q = NULL;
            if (!q) return true;
            q->ndim = 2, q->shape[0] = rows, q->shape[1] = p->shape[1];
            q->stored_off = before * p->shape[1], q->count = dw_ir_numel(p);
            *pc = q;
            return true;
        }
    return false;
}

/* Expert weight kinds: gate (w1), up (w3), down (w2). */
enum { GATE = 0, UP, DOWN };

dw_hf_piece *dw_hf_pieces(const dw_graph *g, const dw_ir_tensor *p, dw_weights_layout layout, const dw_hf_arch *a,
                          int *n) {
    dw_hf_piece *fp;
    if (a && a->fused && fused_part(g, p, &fp)) {
        *n = 1;
        return fp;
    }
    char en[4][32]; /* module, gate, up, down */
    expert_names(a, en);
    size_t stem = 0;
    int kind = -1;
    if (p->ndim == 3 && ends_with(p->name, ".mlp.experts.gate_proj", &stem)) kind = GATE;
    else if (p->ndim == 3 && ends_with(p->name, ".mlp.experts.up_proj", &stem)) kind = UP;
    else if (p->ndim == 3 && ends_with(p->name, ".mlp.experts.down_proj", &stem)) kind = DOWN;
    const bool router = p->ndim == 2 && ends_with(p->name, ".mlp.gate.weight", &stem);
    const bool per_expert = layout == DW_WEIGHTS_LAYOUT_PER_EXPERT;
    const int64_t E = p->ndim == 3 ? p->shape[0] : 1, block = p->ndim == 3 ? p->shape[1] * p->shape[2] : 0;
    *n = kind < 0 || (kind == DOWN && !per_expert) ? 1 : (int)E;
    dw_hf_piece *pc = calloc((size_t)*n, sizeof *pc);
    if (!pc) return NULL;
    bool ok = true;
    if (*n == 1 && kind < 0) { /* one piece: the parameter itself, renamed for a per-expert router */
        char rest[64];
        snprintf(rest, sizeof rest, ".%s.gate.weight", en[0]);
        pc->stored = router && per_expert ? name_of(p->name, stem, rest) : strdup(p->name);
        pc->ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) pc->shape[d] = p->shape[d];
        if (p->hf_transposed) pc->shape[0] = p->shape[1], pc->shape[1] = p->shape[0], pc->transposed = true;
        pc->count = dw_ir_numel(p);
        ok = pc->stored != NULL;
    } else if (*n == 1) { /* fused down_proj: Deepwell's (E,C,F) as it is */
        pc->stored = strdup(p->name);
        pc->ndim = 3;
        for (int d = 0; d < 3; d++) pc->shape[d] = p->shape[d];
        pc->count = dw_ir_numel(p);
        ok = pc->stored != NULL;
    } else {
        for (int64_t e = 0; ok && e < E; e++) {
            dw_hf_piece *q = &pc[e];
            q->param_off = e * block, q->count = block;
            if (per_expert) { /* one 2-D tensor per expert */
                char rest[96];
                snprintf(rest, sizeof rest, ".%s.experts.%lld.%s.weight", en[0], (long long)e, en[1 + kind]);
                q->stored = name_of(p->name, stem, rest);
                q->ndim = 2, q->shape[0] = p->shape[1], q->shape[1] = p->shape[2];
            } else { /* gate or up: half of each expert's fused gate_up rows */
                q->stored = name_of(p->name, stem, ".mlp.experts.gate_up_proj");
                q->ndim = 3, q->shape[0] = E, q->shape[1] = 2 * p->shape[1], q->shape[2] = p->shape[2];
                q->stored_off = e * 2 * block + (kind == UP ? block : 0);
            }
            ok = q->stored != NULL;
        }
    }
    if (!ok) {
        dw_hf_pieces_free(pc, *n);
        return NULL;
    }
    return pc;
}
