/* dp_buckets.c — the buckets data parallelism reduces the gradient pool in (dp.h): cut every
 * DW_DP_BUCKET_FLOATS floats from the pool's end, each with the program step after which its
 * gradients are final (the last forward-or-backward step writing a parameter that overlaps it), in
 * the order they start. Decides only: dp_overlap.c starts them. */
#include <stdlib.h>
#include <string.h>

#include "compile/program.h"
#include "core/env.h"
#include "core/error.h"
#include "train/dp.h"

enum { BUCKET_ALIGN = 64 }; /* floats: 256-byte boundaries, as the pools' parameters */

dw_status dw_dp_bucket_floats(dw_ctx *ctx, int64_t *out) {
    *out = (int64_t)4 << 20; /* 16 MiB */
    const char *v = dw_env("DW_DP_BUCKET_FLOATS");
    if (!v) return DW_OK;
    char *end = NULL;
    const long long n = strtoll(v, &end, 10);
    if (end == v || *end || n < 1)
        return dw_set_error(ctx, DW_ERR_INVALID, "DW_DP_BUCKET_FLOATS=%s: a gradient bucket is a positive number of "
                            "floats (default 4194304, 16 MiB)", v);
    *out = n;
    return DW_OK;
}

/* The step a parameter's gradient is last written at, per parameter (-1: never): the backward steps
 * of the nodes reading it, and the forward steps of ops that do their backward there. A parameter
 * read by a node that has no such step (fused into another node's step, which the graph does not
 * show reading it) is taken as final only after the last backward step. */
static dw_status last_writers(dw_ctx *ctx, const dw_compiled *p, int *last) {
    const dw_graph *g = p->g;
    int *writes = malloc((size_t)(g->n_nodes ? g->n_nodes : 1) * sizeof *writes); /* each node's step, -1 */
    if (!writes) return dw_set_error(ctx, DW_ERR_NOMEM, "data parallel: out of memory");
    for (int i = 0; i < g->n_nodes; i++) writes[i] = -1;
    for (int s = p->phase[DW_PHASE_FORWARD][0]; s < p->phase[DW_PHASE_BACKWARD][1]; s++) {
        const dw_step *st = &p->steps[s];
        if (st->kind == DW_STEP_BWD ||
            (st->kind == DW_STEP_FWD && st->arg == 0 && (dw_op_flags(g->nodes[st->node].op) & DW_OPF_BWD_IN_FWD)))
            writes[st->node] = s;
    }
    for (int k = 0; k < p->n_params; k++) last[k] = -1;
    for (int i = 0; i < g->n_nodes; i++)
        for (int s = 0; s < g->nodes[i].n_in; s++) {
            const int t = g->nodes[i].in[s];
            if (g->tensors[t].kind != DW_TENSOR_PARAM) continue;
            const int w = writes[i] >= 0 ? writes[i] : p->phase[DW_PHASE_BACKWARD][1] - 1;
            int *l = &last[p->tensor[t].param];
            if (w > *l) *l = w;
        }
    free(writes);
    return DW_OK;
}

/* Starting order: the step they become ready at, then from the last floats to the first. */
static int by_start(const void *a, const void *b) {
    const dw_dp_bucket *x = a, *y = b;
    if (x->ready != y->ready) return x->ready < y->ready ? -1 : 1;
    return (x->begin < y->begin) - (x->begin > y->begin);
}

dw_status dw_dp_buckets_plan(dw_ctx *ctx, const dw_compiled *p, int64_t bucket_floats, dw_dp_buckets *out) {
    memset(out, 0, sizeof *out);
    DW_ASSERT(bucket_floats > 0);
    const int64_t floats = p->param_floats, size = (bucket_floats + BUCKET_ALIGN - 1) / BUCKET_ALIGN * BUCKET_ALIGN;
    const int n = (int)((floats + size - 1) / size);
    int *last = malloc((size_t)(p->n_params ? p->n_params : 1) * sizeof *last);
    out->b = calloc((size_t)(n ? n : 1), sizeof *out->b);
    if (!last || !out->b) {
        free(last);
        dw_dp_buckets_free(out);
        return dw_set_error(ctx, DW_ERR_NOMEM, "data parallel: out of memory");
    }
    dw_status st = last_writers(ctx, p, last);
    if (st != DW_OK) {
        free(last);
        dw_dp_buckets_free(out);
        return st;
    }
    for (int i = 0; i < n; i++) {
        dw_dp_bucket *b = &out->b[i];
        b->end = floats - (int64_t)i * size;
        b->begin = b->end > size ? b->end - size : 0;
        b->ready = -1;
        for (int k = 0; k < p->n_params; k++) {
            const int64_t lo = p->param_off[k], hi = lo + dw_ir_numel(&p->g->tensors[p->param_tensor[k]]);
            if (lo < b->end && hi > b->begin && last[k] > b->ready) b->ready = last[k];
        }
    }
    free(last);
    out->n = n;
    qsort(out->b, (size_t)n, sizeof *out->b, by_start);
    return DW_OK;
}

void dw_dp_buckets_free(dw_dp_buckets *b) {
    free(b->b);
    b->b = NULL;
    b->n = 0;
}
