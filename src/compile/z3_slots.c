/* z3_slots.c — ZeRO-3's gather-block items over the parameters' forward and backward lifetimes
 * (z3_slots.h), each from the event step where its gathers start. Pure: reads the program's
 * steps. */
#include <stdlib.h>

#include "compile/z3_slots.h"
#include "core/error.h"

static int64_t align256(int64_t v) { return (v + 255) / 256 * 256; }

bool dw_z3_has_bf16(const dw_compiled *p, int k) { return p->bf16 && !p->bf16_lazy[k]; }

int64_t dw_z3_slot_bytes(const dw_compiled *p, int k) {
    const int64_t numel = dw_ir_numel(&p->g->tensors[p->param_tensor[k]]);
    return align256(numel * 4) + (dw_z3_has_bf16(p, k) ? numel * 2 : 0); /* FP32, then BF16 */
}

/* Parameter k's readers among steps [s0, s1): the first and last (-1, -1: none). */
static void readers(const dw_compiled *p, int k, int s0, int s1, int *first, int *last) {
    *first = *last = -1;
    const int t = p->param_tensor[k];
    for (int s = s0; s < s1; s++) {
        const dw_step *st = &p->steps[s];
        if (st->kind != DW_STEP_FWD && st->kind != DW_STEP_BWD) continue;
        const dw_ir_node *n = dw_compile_node(p, st->node);
        bool reads = false;
        for (int i = 0; i < n->n_in && !reads; i++) reads = n->in[i] == t;
        if (!reads) continue;
        if (*first < 0) *first = s;
        *last = s;
    }
}

/* The event step before s among the sweep's first readers (first[j] over every parameter, j of
 * one sweep), where the gathers of s are started (train/dp_zero3_gather.c); s itself when none. */
static int started_at(const dw_compiled *p, const int *first, int j, int s) {
    int at = s;
    for (int k = 0; k < p->n_params; k++) {
        const int f = first[2 * k + j];
        if (f >= 0 && f < s && (at == s || f > at)) at = f;
    }
    return at;
}

int dw_z3_slot_items(const dw_compiled *p, dw_mem_item *items, int *item_of, int *first) {
    const int f0 = p->phase[DW_PHASE_FORWARD][0], f1 = p->phase[DW_PHASE_FORWARD][1];
    const int b0 = p->phase[DW_PHASE_BACKWARD][0], b1 = p->phase[DW_PHASE_BACKWARD][1];
    int *last = malloc((size_t)(2 * p->n_params + 1) * sizeof *last);
    DW_ASSERT(last);
    for (int k = 0; k < p->n_params; k++) {
        readers(p, k, f0, f1, &first[2 * k], &last[2 * k]);
        readers(p, k, b0, b1, &first[2 * k + 1], &last[2 * k + 1]);
    }
    int n = 0;
    for (int k = 0; k < p->n_params; k++) {
        const int ff = first[2 * k], fl = last[2 * k], bf = first[2 * k + 1], bl = last[2 * k + 1];
        item_of[k] = -1;
        if (ff < 0 && bf < 0) continue; /* read by no step (fused away): never gathered */
        /* live from where its gathers start (the event before its first reader: the prefetch) */
        const int fs = ff >= 0 ? started_at(p, first, 0, ff) : -1, bs = bf >= 0 ? started_at(p, first, 1, bf) : -1;
        dw_mem_item *it = &items[n];
        *it = (dw_mem_item){.size = dw_z3_slot_bytes(p, k), .align = 256};
        if (ff >= 0 && bf >= 0) it->first = fs, it->last = fl, it->first2 = bs, it->last2 = bl;
        else if (ff >= 0) it->first = fs, it->last = fl;
        else it->first = bs, it->last = bl;
        item_of[k] = n++;
    }
    free(last);
    return n;
}
