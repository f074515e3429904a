/* dp_zero3.c — ZeRO-3 / FSDP (dp.h): each rank keeps the FP32 masters of its shard [lo, hi) of the
 * flat pools; a parameter is gathered (a broadcast from every rank whose shard holds part of it)
 * into a slot of a gather block before the first step of the forward that reads it, and again
 * before the first step of the backward sweep that reads it; its slot is another parameter's once
 * its last reader in that sweep has run (the slots placed by the static memory planner,
 * compile/memplan.h, over those two lifetimes, each from the event before its own, as the gathers
 * are prefetched one event step ahead: dp_zero3_gather.c). The gradients go as ZeRO-2's
 * (dp_overlap.c), the optimizer steps the shard (dp.c). A sample's forwards gather as training's
 * do, on every rank (dw_dp_z3_samples_everywhere; train/sample.c recomputes, no K/V cache). Whole
 * weights again (dw_dp_z3_whole) only when asked after training (--profile, or an engine not made
 * for ZeRO-3); sharded again before the next training step. A checkpoint's weights are gathered
 * parameter by parameter into rank 0's host memory instead (dw_dp_z3_checkpoint), the engine left
 * sharded. An engine made for ZeRO-3 (dw_engine_opts.zero) holds the shard's masters from its
 * creation, initialised or loaded there (runtime/weights.c), never the whole. A BF16 program's
 * working copy of a parameter is made in its slot after the gather (the backend's cast);
 * quantised weight caches are not gathered yet (refused). */
#include <stdlib.h>
#include <string.h>

#include "compile/memplan.h"
#include "compile/program.h"
#include "compile/shard.h"
#include "compile/z3_slots.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/engine.h"
#include "train/dp.h"

static int64_t align256(int64_t v) { return (v + 255) / 256 * 256; }

/* The slots (memplan over each parameter's forward and backward lifetimes) and the gathers due
 * before each step: z3_ev[z3_ev_at[s] .. z3_ev_at[s + 1]) are the parameters step s gathers. */
static dw_status plan(dw_dp *d) {
    const dw_compiled *p = d->eng->p;
    const int np = p->n_params, ns = p->n_steps;
    dw_mem_item *items = calloc((size_t)(np ? np : 1), sizeof *items);
    int *item_of = malloc((size_t)(np ? np : 1) * sizeof *item_of), *first = malloc((size_t)(2 * np + 1) * sizeof *first);
    d->z3_slot = malloc((size_t)(np ? np : 1) * sizeof *d->z3_slot);
    d->z3_slot16 = malloc((size_t)(np ? np : 1) * sizeof *d->z3_slot16);
    d->z3_ev_at = calloc((size_t)ns + 1, sizeof *d->z3_ev_at);
    d->z3_ev = malloc((size_t)(2 * np + 1) * sizeof *d->z3_ev);
    dw_status st = items && item_of && first && d->z3_slot && d->z3_slot16 && d->z3_ev_at && d->z3_ev
                       ? DW_OK
                       : dw_set_error(d->ctx, DW_ERR_NOMEM, "ZeRO-3: out of memory");
    int n = 0;
    if (st == DW_OK) n = dw_z3_slot_items(p, items, item_of, first); /* the rule the planner prices by */
    for (int k = 0; st == DW_OK && k < np; k++)
        for (int j = 0; j < 2; j++)
            if (item_of[k] >= 0 && first[2 * k + j] >= 0) d->z3_ev_at[first[2 * k + j] + 1]++;
    if (st == DW_OK) st = dw_memplan_assign(d->ctx, items, n, &d->z3_gather_bytes);
    if (st == DW_OK) {
        for (int s = 0; s < ns; s++) d->z3_ev_at[s + 1] += d->z3_ev_at[s];
        int *fill = calloc((size_t)ns + 1, sizeof *fill);
        if (!fill) st = dw_set_error(d->ctx, DW_ERR_NOMEM, "ZeRO-3: out of memory");
        for (int k = 0; st == DW_OK && k < np; k++) {
            d->z3_slot[k] = item_of[k] >= 0 ? items[item_of[k]].offset : -1;
            d->z3_slot16[k] = d->z3_slot[k] >= 0 && dw_z3_has_bf16(p, k)
                                  ? d->z3_slot[k] + align256(dw_ir_numel(&p->g->tensors[p->param_tensor[k]]) * 4)
                                  : -1;
            for (int j = 0; j < 2; j++)
                if (item_of[k] >= 0 && first[2 * k + j] >= 0) {
                    const int s = first[2 * k + j];
                    d->z3_ev[d->z3_ev_at[s] + fill[s]++] = k;
                }
        }
        free(fill);
    }
    free(items), free(item_of), free(first);
    return st;
}

/* The engine's weights pool now, into the largest seen (what dw_dp_z3_end reports). */
static void note_weights(dw_dp *d) {
    const int64_t b = d->eng->x->pool_bytes[DW_POOL_WEIGHTS];
    if (b > d->z3_peak_w) d->z3_peak_w = b;
}

/* The weights sharded: the masters of [lo, hi) kept, the gather block after them. */
static dw_status to_sharded(dw_dp *d) {
    dw_exec *x = d->eng->x;
    DW_TRY(dw_exec_shard_weights(x, d->lo, d->hi, d->z3_gather_bytes, d->z3_slot, d->z3_slot16));
    note_weights(d);
    if (!d->z3_logged) {
        d->z3_logged = true;
        DW_LOGI("ZeRO-3: weights of floats [%lld, %lld) plus %lld bytes gathered around their use: %lld bytes on this "
                "rank (%lld whole)", (long long)d->lo, (long long)d->hi, (long long)d->z3_gather_bytes,
                (long long)x->pool_bytes[DW_POOL_WEIGHTS], (long long)d->eng->p->pool_bytes[DW_POOL_WEIGHTS]);
    }
    d->z3_whole = false;
    return DW_OK;
}

/* The executor's hook (exec.h before_step): shard when training asks; gather what step reads first. */
static dw_status before_step(void *arg, dw_exec *x, int step) {
    (void)x;
    dw_dp *d = arg;
    if (d->z3_whole && d->z3_want) DW_TRY(to_sharded(d));
    if (d->z3_whole) return DW_OK;
    return dw_dp_z3_gathers(d, step); /* dp_zero3_gather.c: this step's, the next event's started */
}

dw_status dw_dp_z3_init(dw_dp *d) {
    dw_exec *x = d->eng->x;
    const dw_compiled *p = d->eng->p;
    bool lazy = false, cached = false; /* weights converted on use, or cached quantised by the refresh */
    for (int k = 0; k < p->n_params; k++) lazy = lazy || (p->bf16 && p->bf16_lazy[k]);
    for (int s = p->phase[DW_PHASE_REFRESH][0]; s < p->phase[DW_PHASE_REFRESH][1]; s++)
        cached = cached || p->steps[s].kind == DW_STEP_QUANT_W;
    if (lazy || cached)
        return dw_set_error(d->ctx, DW_ERR_UNSUPPORTED, "--zero 3 runs FP32 and BF16 programs: program '%s' quantises "
                            "linear layers, whose weight caches are not gathered yet; use --zero 1 or 2, or "
                            "--precision bf16", p->precision);
    DW_TRY(plan(d));
    DW_TRY(dw_dp_z3_prefetch_plan(d));
    d->z3_whole = true, d->z3_wholes = 0, d->z3_peak_w = 0;
    note_weights(d); /* whole, or the shard's masters alone (made for ZeRO-3) */
    dw_exec_stop_recording(x); /* the gathers run between the steps: a replayed step would skip them */
    x->before_step = before_step, x->before_user = d;
    if (x->w_hi - x->w_lo == p->param_floats) return DW_OK;
    d->z3_whole = false, d->z3_born = true; /* made for ZeRO-3 (dw_engine_opts.zero): the shard's masters alone */
    return to_sharded(d);
}

/* Every master to rank 0's host copy, one parameter at a time through its slot (the slots are
 * shared; the next sweep gathers again) or, for one no step reads, a buffer of its size. */
static dw_status host_masters(dw_dp *d) {
    dw_exec *x = d->eng->x;
    const dw_compiled *p = d->eng->p;
    dw_backend *be = d->eng->be;
    int64_t spare = 0; /* floats of the largest parameter without a slot */
    for (int k = 0; k < p->n_params; k++) {
        const int64_t n = dw_ir_numel(&p->g->tensors[p->param_tensor[k]]);
        if (!x->param_at[k] && n > spare) spare = n;
    }
    if (d->rank == 0 && !d->z3_host && !(d->z3_host = malloc((size_t)d->floats * sizeof *d->z3_host)))
        return dw_set_error(d->ctx, DW_ERR_NOMEM, "ZeRO-3: out of host memory for the checkpoint's weights "
                            "(%lld bytes)", (long long)d->floats * 4);
    DW_TRY(dw_dp_z3_settle(d)); /* a prefetch writes into the slots */
    void *tmp = NULL;
    dw_status st = spare ? be->i->alloc(be, spare * (int64_t)sizeof(float), &tmp) : DW_OK;
    for (int k = 0; st == DW_OK && k < p->n_params; k++) {
        const int64_t n = dw_ir_numel(&p->g->tensors[p->param_tensor[k]]);
        float *slot = x->param_at[k] ? x->param_at[k] : tmp;
        st = dw_dp_z3_gather_to(d, k, slot);
        if (st == DW_OK && d->rank == 0)
            st = be->i->download(be, d->z3_host + p->param_off[k], slot, (size_t)n * sizeof(float));
    }
    if (st == DW_OK) st = be->i->sync(be);
    if (tmp) be->i->release(be, tmp);
    return st;
}

dw_status dw_dp_z3_checkpoint(dw_dp *d) {
    if (d->zero != 3 || d->world == 1 || d->z3_whole) return DW_OK;
    free(d->z3_host);
    d->z3_host = NULL; /* the last checkpoint's, stale */
    DW_TRY(host_masters(d));
    if (d->rank == 0)
        DW_LOGI("ZeRO-3: the checkpoint's weights gathered into rank 0's host memory (%lld bytes), the engine's "
                "kept sharded", (long long)d->floats * 4);
    return DW_OK;
}

dw_status dw_dp_save_weights(dw_dp *d, const char *path) {
    if (d->z3_host && !d->z3_whole) return dw_engine_save_weights_host(d->eng, path, d->z3_host);
    return dw_engine_save_weights(d->eng, path);
}

bool dw_dp_z3_samples_everywhere(const dw_dp *d) { return d->zero == 3 && d->world > 1 && !d->z3_whole; }

dw_status dw_dp_z3_end(dw_dp *d, bool whole) {
    if (d->zero != 3 || d->world == 1) return DW_OK;
    DW_LOGI("ZeRO-3: this rank's weights pool at most %lld bytes (the whole weights %lld), made whole %d times",
            (long long)d->z3_peak_w, (long long)d->eng->p->pool_bytes[DW_POOL_WEIGHTS], d->z3_wholes);
    if (d->z3_whole) return DW_OK;
    if (!whole && d->z3_born) return DW_OK; /* made for ZeRO-3: whole would need the memory it was made to save */
    return dw_dp_z3_whole(d);
}

void dw_dp_z3_free(dw_dp *d) {
    dw_exec *x = d->eng ? d->eng->x : NULL;
    if (x && x->before_user == d) x->before_step = NULL, x->before_user = NULL;
    /* a run that ended sharded (an error: the other ranks may be gone) leaves the engine sharded,
     * its parameters where they were last gathered; its weight accessors say so
     * (dw_exec_weights_whole) */
    dw_dp_z3_prefetch_free(d);
    free(d->z3_slot), free(d->z3_slot16), free(d->z3_ev_at), free(d->z3_ev), free(d->z3_host);
    d->z3_slot = NULL, d->z3_slot16 = NULL, d->z3_ev_at = NULL, d->z3_ev = NULL, d->z3_host = NULL;
}

void dw_dp_z3_train(dw_dp *d) { d->z3_want = d->zero == 3; }

dw_status dw_dp_z3_whole(dw_dp *d) {
    if (d->zero != 3 || d->world == 1) return DW_OK;
    d->z3_want = false;
    if (d->z3_whole) return DW_OK;
    DW_TRY(dw_dp_z3_settle(d)); /* a prefetch writes into the block about to go */
    DW_TRY(dw_exec_unshard_weights(d->eng->x));
    d->z3_whole = true, d->z3_wholes++;
    note_weights(d);
    DW_LOGI("ZeRO-3: the whole weights on this rank again (%lld bytes), after training",
            (long long)d->eng->x->pool_bytes[DW_POOL_WEIGHTS]);
    DW_TRY(dw_dp_gather_pool(d, d->eng->x->w));
    return dw_engine_refresh(d->eng); /* the BF16 copies from the gathered masters */
}
