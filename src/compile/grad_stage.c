/* grad_stage.c — ZeRO-2/3's gradient staging plan (grad_stage.h): which steps write each
 * parameter's gradient, the buckets cut on parameter boundaries from the pool's end, and the
 * staging slot of each bucket. Decides only: train/dp_stage.c allocates and runs it. */
#include <stdlib.h>
#include <string.h>

#include "compile/grad_stage.h"
#include "core/error.h"

enum { STAGE_ALIGN = 64 }; /* floats: slots start on 256-byte boundaries, as the pools' parameters */

dw_status dw_grad_writers(dw_ctx *ctx, const dw_compiled *p, int *first, int *last) {
    const dw_graph *g = p->g;
    const size_t nn = (size_t)(g->n_nodes ? g->n_nodes : 1);
    int *wf = malloc(nn * sizeof *wf), *wl = malloc(nn * sizeof *wl); /* each node's first and last step, -1 */
    if (!wf || !wl) {
        free(wf), free(wl);
        return dw_set_error(ctx, DW_ERR_NOMEM, "gradient staging: out of memory");
    }
    for (int i = 0; i < g->n_nodes; i++) wf[i] = wl[i] = -1;
    for (int s = p->phase[DW_PHASE_FORWARD][0]; s < p->phase[DW_PHASE_BACKWARD][1]; s++) {
        const dw_step *st = &p->steps[s];
        if (st->kind == DW_STEP_BWD ||
            (st->kind == DW_STEP_FWD && st->arg == 0 && (dw_op_flags(g->nodes[st->node].op) & DW_OPF_BWD_IN_FWD))) {
            if (wf[st->node] < 0) wf[st->node] = s;
            wl[st->node] = s;
        }
    }
    for (int k = 0; k < p->n_params; k++) first[k] = last[k] = -1;
    for (int i = 0; i < g->n_nodes; i++)
        for (int s = 0; s < g->nodes[i].n_in; s++) {
            const int t = g->nodes[i].in[s];
            if (g->tensors[t].kind != DW_TENSOR_PARAM) continue;
            const int lw = wl[i] >= 0 ? wl[i] : p->phase[DW_PHASE_BACKWARD][1] - 1;
            const int fw = wf[i] >= 0 ? wf[i] : p->phase[DW_PHASE_FORWARD][0];
            int *l = &last[p->tensor[t].param], *f = &first[p->tensor[t].param];
            if (lw > *l) *l = lw;
            if (*f < 0 || fw < *f) *f = fw;
        }
    free(wf), free(wl);
    return DW_OK;
}

/* (offset, parameter) pairs by offset. */
static int by_offset(const void *a, const void *b) {
    const int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
    return (x > y) - (x < y);
}

/* Starting order: the step they become final at, then from the last floats to the first. */
static int by_start(const void *a, const void *b) {
    const dw_stage_bucket *x = a, *y = b;
    if (x->ready != y->ready) return x->ready < y->ready ? -1 : 1;
    return (x->begin < y->begin) - (x->begin > y->begin);
}

/* Slots: buckets by their first write; each takes the slot whose bucket was final earliest, when
 * that was before its first write (the wait for its reduction then falls between steps). */
static dw_status assign_slots(dw_ctx *ctx, dw_grad_stage *s, bool reuse) {
    int *order = malloc((size_t)(s->n ? s->n : 1) * sizeof *order);
    int *free_at = malloc((size_t)(s->n ? s->n : 1) * sizeof *free_at); /* each slot's last bucket's ready */
    if (!order || !free_at) {
        free(order), free(free_at);
        return dw_set_error(ctx, DW_ERR_NOMEM, "gradient staging: out of memory");
    }
    for (int i = 0; i < s->n; i++) order[i] = i;
    for (int i = 1; i < s->n; i++) /* insertion sort by first write, stable */
        for (int j = i; j > 0 && s->b[order[j - 1]].first > s->b[order[j]].first; j--) {
            const int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    s->n_slots = 0;
    for (int i = 0; i < s->n; i++) {
        dw_stage_bucket *b = &s->b[order[i]];
        int best = -1;
        for (int k = 0; reuse && k < s->n_slots; k++)
            if (free_at[k] < b->first && (best < 0 || free_at[k] < free_at[best])) best = k;
        if (best < 0) best = s->n_slots++;
        b->slot = best;
        free_at[best] = b->ready > b->first ? b->ready : b->first;
    }
    free(order), free(free_at);
    return DW_OK;
}

dw_status dw_grad_stage_plan(dw_ctx *ctx, const dw_compiled *p, int64_t bucket_floats, bool reuse,
                             dw_grad_stage *out) {
    memset(out, 0, sizeof *out);
    DW_ASSERT(bucket_floats > 0);
    const int np = p->n_params;
    int *first = malloc((size_t)(np ? np : 1) * sizeof *first), *last = malloc((size_t)(np ? np : 1) * sizeof *last);
    int64_t *by_off = malloc(2 * (size_t)(np ? np : 1) * sizeof *by_off); /* (np, 2): offset, parameter */
    out->b = calloc((size_t)(np ? np : 1), sizeof *out->b);
    dw_status st = first && last && by_off && out->b ? dw_grad_writers(ctx, p, first, last)
                                                    : dw_set_error(ctx, DW_ERR_NOMEM, "gradient staging: out of memory");
    if (st == DW_OK) {
        for (int k = 0; k < np; k++) by_off[2 * k] = p->param_off[k], by_off[2 * k + 1] = k;
        qsort(by_off, (size_t)np, 2 * sizeof *by_off, by_offset);
        dw_stage_bucket *b = NULL;
        for (int i = np - 1; i >= 0; i--) { /* from the pool's end: a bucket grows down while it fits */
            const int k = (int)by_off[2 * i + 1];
            const int64_t off = i ? by_off[2 * i] : 0; /* the first bucket reaches the pool's start */
            if (!b || b->end - off > bucket_floats) {
                const int64_t end = b ? b->begin : p->param_floats;
                b = &out->b[out->n++];
                *b = (dw_stage_bucket){.begin = end, .end = end, .first = -1, .ready = -1};
            }
            b->begin = off;
            if (first[k] >= 0 && (b->first < 0 || first[k] < b->first)) b->first = first[k];
            if (last[k] > b->ready) b->ready = last[k];
        }
        for (int i = 0; i < out->n; i++) {
            dw_stage_bucket *c = &out->b[i];
            if (c->first < 0) c->first = p->phase[DW_PHASE_FORWARD][0]; /* never written: zero from the start */
            const int64_t n = (c->end - c->begin + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN;
            if (n > out->slot_floats) out->slot_floats = n;
        }
        qsort(out->b, (size_t)out->n, sizeof *out->b, by_start);
        st = assign_slots(ctx, out, reuse);
    }
    free(first), free(last), free(by_off);
    if (st != DW_OK) dw_grad_stage_free(out);
    return st;
}

void dw_grad_stage_free(dw_grad_stage *s) {
    free(s->b);
    memset(s, 0, sizeof *s);
}

int64_t dw_grad_stage_bytes(const dw_grad_stage *s) { return (int64_t)s->n_slots * s->slot_floats * 4; }
