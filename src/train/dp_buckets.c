/* dp_buckets.c — the buckets data parallelism reduces the gradient pool in (dp.h): cut every
 * DW_DP_BUCKET_FLOATS floats from the pool's end, each with the program step after which its
 * gradients are final (the last forward-or-backward step writing a parameter that overlaps it), in
 * the order they start. Decides only: dp_overlap.c starts them. */
#include <stdlib.h>
#include <string.h>

#include "compile/grad_stage.h"
#include "compile/program.h"
#include "core/env.h"
#include "core/error.h"
#include "train/dp.h"

enum { BUCKET_ALIGN = 64 }; /* floats: 256-byte boundaries, as the pools' parameters */

dw_status dw_dp_bucket_floats(dw_ctx *ctx, int zero, int64_t *out) {
    *out = dw_grad_bucket_default(zero); /* compile/grad_stage.h: the planner's too */
    const char *v = dw_env("DW_DP_BUCKET_FLOATS");
    if (!v) return DW_OK;
    char *end = NULL;
    const long long n = strtoll(v, &end, 10);
    if (end == v || *end || n < 1)
        return dw_set_error(ctx, DW_ERR_INVALID, "DW_DP_BUCKET_FLOATS=%s: a gradient bucket is a positive number of "
                            "floats (default 67108864, 256 MiB; 4194304, 16 MiB, under ZeRO-2/3)", v);
    *out = n;
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
    int *first = malloc((size_t)(p->n_params ? p->n_params : 1) * sizeof *first);
    int *last = malloc((size_t)(p->n_params ? p->n_params : 1) * sizeof *last);
    out->b = calloc((size_t)(n ? n : 1), sizeof *out->b);
    if (!first || !last || !out->b) {
        free(first), free(last);
        dw_dp_buckets_free(out);
        return dw_set_error(ctx, DW_ERR_NOMEM, "data parallel: out of memory");
    }
    dw_status st = dw_grad_writers(ctx, p, first, last); /* compile/grad_stage.h */
    free(first);
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
