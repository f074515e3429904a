/* dp_stage.c — ZeRO-2/3's gradient staging (dp.h) for an engine that holds only its shard of the
 * gradients (dw_engine_opts.zero): the backward writes each parameter's gradient into its bucket's
 * staging slot (the executor's grad_at, compile/grad_stage.h's plan); once the bucket is final its
 * reduce to each rank of that rank's part starts (dp_overlap.c), and before a later bucket reuses
 * the slot the reduction is waited for and this rank's part added into its shard's accumulator
 * (the engine's gradient pool). After backward the rest is waited for and added. Not the
 * collectives' order or timing (dp_overlap.c). */
#include <stdlib.h>
#include <string.h>

#include "compile/grad_stage.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/engine.h"
#include "train/dp.h"

static float *slot_of(const dw_dp *d, int i) { return d->stage_mem + (int64_t)d->stage.b[i].slot * d->stage.slot_floats; }

float *dw_dp_grad_at(const dw_dp *d, int i, int64_t lo) {
    if (!d->stage_mem) return d->eng->x->grad + lo;
    return slot_of(d, i) + (lo - d->stage.b[i].begin);
}

dw_status dw_dp_stage_init(dw_dp *d, int64_t bucket_floats) {
    dw_exec *x = d->eng->x;
    const dw_compiled *p = d->eng->p;
    dw_backend *be = d->eng->be;
    DW_TRY(dw_grad_stage_plan(d->ctx, p, bucket_floats, d->overlap, &d->stage));
    const int n = d->stage.n, np = p->n_params;
    const int64_t bytes = dw_grad_stage_bytes(&d->stage);
    d->grad_at = calloc((size_t)(np ? np : 1), sizeof *d->grad_at);
    d->stage_prev = malloc((size_t)(n ? n : 1) * sizeof *d->stage_prev);
    d->stage_async = malloc(2 * (size_t)(n ? n : 1) * sizeof *d->stage_async);
    d->stage_done = calloc((size_t)(n ? n : 1), sizeof *d->stage_done);
    dw_dp_buckets_free(&d->buckets);
    d->buckets.b = calloc((size_t)(n ? n : 1), sizeof *d->buckets.b);
    if (!d->grad_at || !d->stage_prev || !d->stage_async || !d->stage_done || !d->buckets.b)
        return dw_set_error(d->ctx, DW_ERR_NOMEM, "gradient staging: out of memory");
    void *mem = NULL;
    dw_status st = be->i->alloc(be, bytes > 0 ? bytes : 256, &mem);
    if (st == DW_OK) st = be->i->zero(be, mem, (size_t)bytes); /* zero at the start of every micro-batch */
    if (st != DW_OK) {
        if (mem) be->i->release(be, mem);
        return dw_prefix_error(d->ctx, st, "%s backend: the gradient staging (%lld bytes)", be->i->name,
                               (long long)bytes);
    }
    d->stage_mem = mem;
    d->buckets.n = n;
    for (int i = 0; i < n; i++) { /* the buckets the reductions run over: the staging's */
        const dw_stage_bucket *b = &d->stage.b[i];
        d->buckets.b[i] = (dw_dp_bucket){.begin = b->begin, .end = b->end, .ready = b->ready};
        d->stage_prev[i] = -1; /* the bucket whose slot this one takes over: the latest one before it */
        for (int j = 0; j < n; j++)
            if (j != i && d->stage.b[j].slot == b->slot && d->stage.b[j].first < b->first &&
                (d->stage_prev[i] < 0 || d->stage.b[j].first > d->stage.b[d->stage_prev[i]].first))
                d->stage_prev[i] = j;
        for (int k = 0; k < np; k++) {
            const int64_t off = p->param_off[k];
            if (off >= b->begin && off < b->end) d->grad_at[k] = slot_of(d, i) + (off - b->begin);
        }
    }
    x->grad_at = d->grad_at;
    const int64_t shard = 4 * (x->grad_hi - x->grad_lo);
    DW_LOGI("ZeRO-%d: gradients of floats [%lld, %lld): %lld bytes on this rank + staging of %d slot%s x %lld floats "
            "(%lld bytes) for %d buckets (%lld whole)%s", d->zero, (long long)x->grad_lo, (long long)x->grad_hi,
            (long long)shard, d->stage.n_slots, d->stage.n_slots == 1 ? "" : "s", (long long)d->stage.slot_floats,
            (long long)bytes, n, (long long)p->pool_bytes[DW_POOL_GRADS],
            d->overlap ? "" : "; without overlap every bucket keeps its slot until backward ends");
    return DW_OK;
}

void dw_dp_stage_free(dw_dp *d) {
    if (d->eng && d->eng->x && d->eng->x->grad_at == d->grad_at) d->eng->x->grad_at = NULL;
    if (d->stage_mem) d->eng->be->i->release(d->eng->be, d->stage_mem);
    dw_grad_stage_free(&d->stage);
    free(d->grad_at), free(d->stage_prev), free(d->stage_async), free(d->stage_done);
    d->stage_mem = NULL, d->grad_at = NULL, d->stage_prev = NULL, d->stage_async = NULL, d->stage_done = NULL;
}

/* Bucket i's reduction waited for and this rank's part of it added into the shard's accumulator. */
static dw_status finish(dw_dp *d, int i) {
    if (d->stage_done[i]) return DW_OK;
    for (int a = d->stage_async[2 * i]; a < d->stage_async[2 * i + 1]; a++)
        DW_TRY(dw_comm_wait(d->ctx, d->comm, &d->async[a]));
    dw_exec *x = d->eng->x;
    const dw_stage_bucket *b = &d->stage.b[i];
    const int64_t lo = b->begin > x->grad_lo ? b->begin : x->grad_lo, hi = b->end < x->grad_hi ? b->end : x->grad_hi;
    d->stage_done[i] = true;
    if (hi <= lo) return DW_OK;
    dw_backend *be = d->eng->be;
    return be->i->add(be, DW_DT_ACT_F32, x->grad + (lo - x->grad_lo), slot_of(d, i) + (lo - b->begin), hi - lo);
}

dw_status dw_dp_stage_next(dw_dp *d, int step) {
    if (!d->stage_mem) return DW_OK;
    dw_backend *be = d->eng->be;
    for (int i = 0; i < d->stage.n; i++) {
        const int j = d->stage_prev[i];
        if (d->stage.b[i].first != step || j < 0) continue;
        DW_ASSERT(j < d->started); /* final before this step: its reduction started */
        DW_TRY(finish(d, j));
        DW_TRY(be->i->zero(be, slot_of(d, i), (size_t)d->stage.slot_floats * sizeof(float)));
    }
    return DW_OK;
}

dw_status dw_dp_stage_end(dw_dp *d) {
    if (!d->stage_mem) return DW_OK;
    for (int i = 0; i < d->stage.n; i++) DW_TRY(finish(d, i));
    memset(d->stage_done, 0, (size_t)d->stage.n * sizeof *d->stage_done);
    dw_backend *be = d->eng->be; /* zero again for the next micro-batch's first buckets */
    return be->i->zero(be, d->stage_mem, (size_t)dw_grad_stage_bytes(&d->stage));
}
