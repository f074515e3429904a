/* guard_counts.c — the quantisers' per-step counters for the guard (guard.h): the counter block
 * (precision/quant_counts.h) allocated in the engine's backend memory and attached to its
 * executor, read back and zeroed once per optimizer step (one small copy after the step's
 * loss read-back; no sync inside the step), its totals over layers and ranks for metrics.jsonl,
 * and per layer summed until the guard writes them to quant_stats.jsonl:
 *   {"step", "layer", "counts": "x"|"w"|"dy", "overflow", "underflow", "elements", "steps"}
 * ("steps": the optimizer steps summed, the last one `step`). Where siblings reuse one quantisation
 * of x (GPU), each layer's x counts take those of the copies it reused at the read: the layer
 * that quantised a copy counted it into its own pair, and dw_qcounts.from says whose pair each
 * layer's copies are (precision/quant_counts.h). Also the dy statistics' host accumulators of a
 * check step (sampled past the guard's cap, quant_stats.h). Not the decisions (guard_quant.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/program.h"
#include "core/error.h"
#include "precision/quant_counts.h"
#include "runtime/engine.h"
#include "train/guard.h"

static const char *const KIND[DW_QC_KINDS] = {"x", "w", "dy"};

struct dw_qcounter {
    dw_ctx *ctx;
    dw_engine *e;
    dw_qcounts c;
    const int *nodes;  /* (c.n_layers) the counted nodes, in the guard's order */
    uint64_t *read;    /* (n_layers, KINDS, WORDS) this step's read-back, then (n_layers, 2, WORDS)
                          the own pairs of x copies (quant_counts.h) */
    int64_t *sum;      /* (n_layers, KINDS, WORDS) summed since the last write (this rank, then all) */
    int64_t steps;     /* steps summed */
    int64_t cap;       /* the dy statistics' sample cap (quant_stats.h) */
};

static size_t words(const dw_qcounter *q) { return (size_t)q->c.n_layers * DW_QC_KINDS * DW_QC_WORDS; }
/* The counters and the own pairs after them: what one read copies back and zeroes. */
static size_t block_words(const dw_qcounter *q) { return words(q) + (size_t)q->c.n_layers * 2 * DW_QC_WORDS; }

dw_status dw_qcounter_open(dw_ctx *ctx, dw_engine *e, const int *nodes, int n, int64_t cap, dw_qcounter **out) {
    *out = NULL;
    dw_qcounter *q = calloc(1, sizeof *q);
    const int n_nodes = e->g->n_nodes;
    if (!q || !(q->c.slot = malloc((size_t)n_nodes * sizeof *q->c.slot)) || !(q->c.dy = calloc((size_t)n * 2, sizeof *q->c.dy)) ||
        !(q->read = calloc((size_t)n * (DW_QC_KINDS + 2) * DW_QC_WORDS, sizeof *q->read)) ||
        !(q->c.from = malloc((size_t)n * 2 * sizeof *q->c.from)) ||
        !(q->sum = calloc((size_t)n * DW_QC_KINDS * DW_QC_WORDS, sizeof *q->sum))) {
        dw_qcounter_free(q);
        return dw_set_error(ctx, DW_ERR_NOMEM, "quant counters: out of memory");
    }
    q->ctx = ctx, q->e = e, q->nodes = nodes, q->c.n_layers = n, q->cap = cap;
    for (int i = 0; i < n_nodes; i++) q->c.slot[i] = -1;
    for (int i = 0; i < n; i++) q->c.slot[nodes[i]] = i;
    for (int i = 0; i < 2 * n; i++) q->c.from[i] = -1;
    q->c.src[0] = q->c.src[1] = -1;
    void *mem = NULL;
    const size_t bytes = block_words(q) * sizeof(uint64_t);
    dw_status st = e->be->i->alloc(e->be, (int64_t)bytes, &mem);
    q->c.dev = mem;
    if (st == DW_OK) q->c.own = q->c.dev + words(q), st = e->be->i->zero(e->be, mem, bytes);
    if (st != DW_OK) {
        dw_qcounter_free(q);
        return st;
    }
    e->x->qcounts = &q->c;
    *out = q;
    return DW_OK;
}

void dw_qcounter_free(dw_qcounter *q) {
    if (!q) return;
    if (q->e && q->e->x->qcounts == &q->c) q->e->x->qcounts = NULL;
    if (q->c.dev) q->e->be->i->release(q->e->be, q->c.dev);
    free(q->c.slot);
    free(q->c.from);
    free(q->c.dy);
    free(q->read);
    free(q->sum);
    free(q);
}

dw_qcounts *dw_qcounter_counts(dw_qcounter *q) { return q ? &q->c : NULL; }

/* Each layer's x counts plus the own pairs of the copies it reused (or quantised itself). */
static void fold(dw_qcounter *q) {
    const uint64_t *own = q->read + words(q);
    for (int i = 0; i < q->c.n_layers; i++)
        for (int k = 0; k < 2; k++) {
            const int f = q->c.from[2 * i + k];
            if (f < 0) continue;
            uint64_t *x = q->read + ((size_t)i * DW_QC_KINDS + DW_QC_X) * DW_QC_WORDS;
            for (int w = 0; w < DW_QC_WORDS; w++) x[w] += own[((size_t)f * 2 + k) * DW_QC_WORDS + w];
        }
}

dw_status dw_qcounter_read(dw_qcounter *q, dw_comm *host, int64_t *overflow, int64_t *underflow) {
    dw_backend *be = q->e->be;
    DW_TRY(be->i->download(be, q->read, q->c.dev, block_words(q) * sizeof(uint64_t)));
    DW_TRY(be->i->zero(be, q->c.dev, block_words(q) * sizeof(uint64_t)));
    fold(q);
    int64_t tot[DW_QC_WORDS] = {0};
    for (size_t k = 0; k < words(q); k++) {
        q->sum[k] += (int64_t)q->read[k];
        tot[k % DW_QC_WORDS] += (int64_t)q->read[k];
    }
    q->steps++;
    DW_TRY(dw_comm_all_reduce(q->ctx, host, tot, DW_QC_WORDS, DW_COMM_I64, DW_COMM_SUM));
    *overflow = tot[DW_QC_OVER], *underflow = tot[DW_QC_UNDER];
    return DW_OK;
}

dw_status dw_qcounter_step_all(dw_qcounter *q, dw_comm *host, int64_t *out) {
    for (size_t k = 0; k < words(q); k++) out[k] = (int64_t)q->read[k];
    return dw_comm_all_reduce(q->ctx, host, out, (int64_t)words(q), DW_COMM_I64, DW_COMM_SUM);
}

dw_status dw_qcounter_write(dw_qcounter *q, dw_comm *host, FILE *f, int64_t step, const bool *skip) {
    DW_TRY(dw_comm_all_reduce(q->ctx, host, q->sum, (int64_t)words(q), DW_COMM_I64, DW_COMM_SUM));
    for (int i = 0; f && i < q->c.n_layers; i++) {
        const int64_t *s = q->sum + (size_t)i * DW_QC_KINDS * DW_QC_WORDS;
        bool any = false;
        for (int k = 0; k < DW_QC_KINDS * DW_QC_WORDS; k++) any |= s[k] != 0;
        if (skip && skip[i] && !any) continue;
        for (int k = 0; k < DW_QC_KINDS; k++)
            if (fprintf(f, "{\"step\": %lld, \"layer\": \"%s\", \"counts\": \"%s\", \"overflow\": %lld, \"underflow\": %lld, "
                           "\"elements\": %lld, \"steps\": %lld}\n",
                        (long long)step, q->e->g->nodes[q->nodes[i]].name, KIND[k],
                        (long long)s[k * DW_QC_WORDS + DW_QC_OVER], (long long)s[k * DW_QC_WORDS + DW_QC_UNDER],
                        (long long)s[k * DW_QC_WORDS + DW_QC_N], (long long)q->steps) < 0)
                return dw_set_error(q->ctx, DW_ERR_IO, "quant_stats.jsonl: write failed");
    }
    if (f && fflush(f) != 0) return dw_set_error(q->ctx, DW_ERR_IO, "quant_stats.jsonl: write failed");
    dw_qcounter_reset(q);
    return DW_OK;
}

void dw_qcounter_reset(dw_qcounter *q) {
    memset(q->sum, 0, words(q) * sizeof *q->sum);
    q->steps = 0;
}

dw_status dw_qcounter_discard(dw_qcounter *q) {
    dw_qcounter_reset(q);
    return q->e->be->i->zero(q->e->be, q->c.dev, block_words(q) * sizeof(uint64_t));
}

void dw_qcounter_forget(dw_qcounter *q, int layer) { q->c.from[2 * layer] = q->c.from[2 * layer + 1] = -1; }

void dw_qcounter_arm_dy(dw_qcounter *q, bool on) {
    q->c.measure_dy = on;
    for (int i = 0; i < 2 * q->c.n_layers; i++) q->c.dy[i] = dw_qstats_zero(), q->c.dy[i].cap = q->cap;
}
