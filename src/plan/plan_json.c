/* plan_json.c — plans to JSON (the `deepwell plan --json` document) and back to parallel
 * settings (for `deepwell dryrun --plan`). Schema in docs/planner.md. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "plan/layout.h"

static void set_num(json_t *o, const char *k, double v) { json_object_set_new(o, k, json_real(v)); }
static void set_int(json_t *o, const char *k, long long v) { json_object_set_new(o, k, json_integer(v)); }

json_t *dw_par_json(const dw_par *p) {
    json_t *o = json_object(), *par = json_object();
    char buf[200];
    dw_par_format(p, buf, sizeof buf);
    json_object_set_new(o, "summary", json_string(buf));
    set_int(par, "dp", p->dp), set_int(par, "tp", p->tp), set_int(par, "pp", p->pp);
    set_int(par, "ep", p->ep), set_int(par, "cp", p->cp);
    json_object_set_new(o, "parallel", par);
    set_int(o, "virtual_stages", p->vpp);
    set_int(o, "expert_tp", dw_par_etp(p));
    json_object_set_new(o, "schedule", json_string(dw_sched_name(p->sched)));
    json_object_set_new(o, "a2a_overlap", json_boolean(p->a2a_overlap));
    set_int(o, "micro_batch", p->micro_batch);
    set_int(o, "grad_accum", p->grad_accum);
    json_object_set_new(o, "recompute", json_string(dw_recompute_name(p->recompute)));
    set_int(o, "zero", p->zero);
    json_object_set_new(o, "offload", json_boolean(p->offload));
    return o;
}

void dw_plan_entry_add_predictions(json_t *o, const dw_plan_entry *e) {
    json_t *mem = json_object(), *t = json_object();
    set_num(o, "step_time_s", e->cost.step);
    set_num(o, "tokens_per_s", e->cost.tokens_per_s);
    set_num(o, "mfu", e->cost.mfu);
    set_num(o, "hfu", e->cost.hfu);
    set_int(o, "peak_memory_bytes", (long long)e->mem.total);
    set_int(mem, "weights_bytes", (long long)e->mem.weights);
    set_int(mem, "grads_bytes", (long long)e->mem.grads);
    set_int(mem, "optimizer_bytes", (long long)e->mem.optimizer);
    set_int(mem, "activations_bytes", (long long)e->mem.activations);
    set_int(mem, "workspace_bytes", (long long)e->mem.workspace);
    set_int(mem, "scales_bytes", (long long)e->mem.scales);
    set_int(mem, "ep_buffers_bytes", (long long)e->mem.ep_buffers);
    set_int(mem, "total_bytes", (long long)e->mem.total);
    set_int(mem, "hbm_bytes", (long long)e->mem.hbm);
    set_int(mem, "limit_bytes", (long long)e->mem.limit);
    set_int(mem, "worst_stage", e->mem.worst_stage);
    set_num(mem, "inflight_microbatches", e->mem.inflight);
    json_object_set_new(o, "memory", mem);
    set_num(t, "pipeline_s", e->cost.pipeline);
    set_num(t, "compute_s", e->cost.compute);
    set_num(t, "bubble_fraction", e->cost.bubble_frac);
    set_num(t, "tp_comm_s", e->cost.tp_comm);
    set_num(t, "cp_comm_s", e->cost.cp_comm);
    set_num(t, "ep_comm_s", e->cost.ep_comm);
    set_num(t, "ep_hidden_s", e->x.ep_hidden);
    set_num(t, "recompute_s", e->x.recompute);
    set_num(t, "pp_p2p_s", e->cost.pp_comm);
    set_num(t, "dp_comm_s", e->cost.dp_comm);
    set_num(t, "dp_exposed_s", e->cost.dp_exposed);
    set_num(t, "optimizer_s", e->cost.optimizer);
    json_object_set_new(o, "time", t);
}

json_t *dw_plan_entry_json(const dw_plan_in *in, const dw_plan_entry *e) {
    json_t *o = dw_par_json(&e->par);
    dw_plan_entry_add_predictions(o, e);
    /* the layer layout: blocks (of them dense) per pipeline rank and chunk */
    json_t *lay = json_array();
    for (int s = 0; s < e->par.pp; s++) {
        json_t *rank = json_array();
        for (int ch = 0; ch < dw_plan_chunks(&e->par); ch++) {
            dw_vstage st;
            if (!dw_plan_vstage(in, e->par.pp, e->par.vpp, dw_plan_chunk_stage(&e->par, s, ch), &st)) continue;
            int vs = dw_plan_chunk_stage(&e->par, s, ch);
            json_array_append_new(rank, json_pack("{s:I,s:I,s:I,s:I,s:b,s:b,s:I}", "stage", (json_int_t)vs,
                                                  "first_layer",
                                                  (json_int_t)dw_plan_vstage_first_layer(in, e->par.pp, e->par.vpp, vs),
                                                  "layers", (json_int_t)st.layers, "dense",
                                                  (json_int_t)(st.layers - st.moe_layers), "embedding", st.embed,
                                                  "lm_head", st.head, "mtp", (json_int_t)st.mtp));
        }
        json_array_append_new(lay, rank);
    }
    json_object_set_new(o, "layout", lay);
    return o;
}

/* The best plan's time split and memory per pipeline rank (`deepwell plan --json`'s "explain"). */
static json_t *explain_best(const dw_plan_in *in, const dw_plan_entry *e) {
    json_t *o = json_object(), *t = json_object(), *ranks = json_array();
    double v[DW_PLAN_TIME_TERMS];
    dw_plan_time_terms(e, v);
    for (int k = 0; k < DW_PLAN_TIME_TERMS; k++) set_num(t, dw_plan_time_term_names[k], v[k]);
    set_num(t, "ep_hidden_s", e->x.ep_hidden);
    set_num(t, "step_s", e->cost.step);
    json_object_set_new(o, "time", t);
    dw_mem *m = calloc((size_t)e->par.pp, sizeof *m);
    if (m) {
        dw_plan_memory_ranks(in, &e->par, m);
        for (int s = 0; s < e->par.pp; s++)
            json_array_append_new(ranks, json_pack("{s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "rank", s, "weights_bytes",
                                                   (json_int_t)m[s].weights, "grads_bytes", (json_int_t)m[s].grads,
                                                   "optimizer_bytes", (json_int_t)m[s].optimizer, "activations_bytes",
                                                   (json_int_t)m[s].activations, "other_bytes",
                                                   (json_int_t)(m[s].workspace + m[s].scales), "ep_buffers_bytes",
                                                   (json_int_t)m[s].ep_buffers, "total_bytes",
                                                   (json_int_t)m[s].total));
        free(m);
    }
    json_object_set_new(o, "memory_per_rank", ranks);
    return o;
}

/* Why an alternative lost to the best: each term's excess over the best's, and the largest. */
static json_t *versus_best(const dw_plan_entry *best, const dw_plan_entry *e) {
    json_t *o = json_object();
    double a[DW_PLAN_TIME_TERMS], b[DW_PLAN_TIME_TERMS];
    dw_plan_time_terms(best, a);
    dw_plan_time_terms(e, b);
    int worst = 0;
    for (int k = 0; k < DW_PLAN_TIME_TERMS; k++) {
        set_num(o, dw_plan_time_term_names[k], b[k] - a[k]);
        if (b[k] - a[k] > b[worst] - a[worst]) worst = k;
    }
    set_num(o, "step_s", e->cost.step - best->cost.step);
    json_object_set_new(o, "largest", json_string(dw_plan_time_term_names[worst]));
    return o;
}

json_t *dw_plan_result_json(const dw_plan_in *in, const dw_plan_result *r) {
    json_t *o = json_object(), *job = json_object(), *alts = json_array(), *rej = json_array();
    json_t *model = json_object(), *hw = json_object();
    dw_param_counts pc;
    dw_plan_params(in, &pc);
    json_object_set_new(model, "model_type", json_string(in->cfg->model_type));
    set_num(model, "params", pc.total);
    set_num(model, "model_flops_per_token", dw_plan_model_flops_per_token(in));
    set_int(model, "experts", in->experts);
    set_int(model, "top_k", in->experts ? in->top_k : 0);
    json_object_set_new(o, "model", model);
    json_object_set_new(hw, "gpu", json_string(in->hw->gpus[0].name));
    set_int(hw, "nodes", in->hw->nodes);
    set_int(hw, "gpus", in->n_gpus);
    set_int(hw, "nvlink_domain", in->hw->nvlink_domain);
    json_object_set_new(hw, "source", json_string(in->hw->source));
    json_object_set_new(o, "hardware", hw);
    set_int(job, "seq", in->job.seq);
    set_int(job, "global_batch", in->job.global_batch);
    json_object_set_new(job, "precision", json_string(dw_recipe_name(in->job.recipe)));
    set_num(job, "memory_headroom", in->job.mem_headroom);
    if (in->experts) set_num(job, "moe_capacity", in->capacity);
    json_object_set_new(o, "job", job);
    json_t *best = r->n_plans ? dw_plan_entry_json(in, &r->plans[0]) : json_null();
    if (r->n_plans) json_object_set_new(best, "explain", explain_best(in, &r->plans[0]));
    json_object_set_new(o, "best", best);
    for (int i = 1; i < r->n_plans; i++) {
        json_t *alt = dw_plan_entry_json(in, &r->plans[i]);
        json_object_set_new(alt, "vs_best", versus_best(&r->plans[0], &r->plans[i]));
        json_array_append_new(alts, alt);
    }
    json_object_set_new(o, "alternatives", alts);
    for (int k = 0; k < DW_REJECT_COUNT; k++) {
        if (!r->rej.count[k]) continue;
        json_t *e = json_object();
        json_object_set_new(e, "reason", json_string(dw_reject_name((dw_reject)k)));
        set_int(e, "count", r->rej.count[k]);
        json_object_set_new(e, "example", json_string(r->rej.example[k][0]));
        json_t *ex = json_array();
        for (int i = 0; i < r->rej.n_examples[k]; i++) json_array_append_new(ex, json_string(r->rej.example[k][i]));
        json_object_set_new(e, "examples", ex);
        json_array_append_new(rej, e);
    }
    json_object_set_new(o, "rejected", rej);
    json_t *fams = json_array();
    for (int k = 0; k < DW_FAMILY_COUNT; k++) {
        dw_plan_family_info f;
        dw_family_info(r, k, &f);
        json_t *e = json_object(), *why = json_object();
        json_object_set_new(e, "family", json_string(f.name));
        set_int(e, "feasible", f.feasible);
        for (int q = 0; q < DW_REJECT_COUNT; q++)
            if (q != DW_REJECT_DOMINATED && r->fam[k].rejected[q]) set_int(why, dw_reject_name((dw_reject)q), r->fam[k].rejected[q]);
        json_object_set_new(e, "rejected", why);
        set_int(e, "kept", f.kept);
        if (f.simulated) {
            json_object_set_new(e, "fastest", json_string(f.best_summary));
            set_num(e, "fastest_step_s", f.best_step);
            if (f.largest_term >= 0) {
                json_object_set_new(e, "largest", json_string(dw_plan_time_term_names[f.largest_term]));
                set_num(e, "largest_excess_s", f.largest_excess);
            }
        }
        if (f.lower_bound > 0) set_num(e, "lower_bound_s", f.lower_bound);
        json_array_append_new(fams, e);
    }
    json_object_set_new(o, "families", fams);
    set_int(o, "evaluated", r->evaluated);
    set_int(o, "feasible", r->feasible);
    json_object_set_new(o, "mfu_basis",
                        json_string("model FLOPs (6 x active matmul params + 6 L H (dqk + dv) s attention, "
                                    "non-causal) / (step time x GPUs x dense datasheet peak of the recipe's GEMMs: BF16 for bf16, "
                                    "FP8 for fp8_block and mxfp8, FP4 for nvfp4 (FP8 where FP4 is emulated)); hfu: executed "
                                    "FLOPs (causal attention, recompute) on the same basis"));
    return o;
}

static dw_status get_opt_int(dw_ctx *ctx, const json_t *o, const char *k, const char *what, long long lo,
                             long long hi, int64_t *out) {
    long long v = *out;
    DW_TRY(dw_json_get_int_opt(ctx, o, k, what, &v));
    if (v < lo || v > hi)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field '%s' = %lld is outside [%lld, %lld]", what, k, v,
                            lo, hi);
    *out = v;
    return DW_OK;
}

dw_status dw_par_from_json(dw_ctx *ctx, const json_t *j, const char *what, dw_par *out) {
    memset(out, 0, sizeof *out);
    const json_t *best = json_object_get(j, "best");
    if (best) {
        if (!json_is_object(best))
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'best' is not a plan object (no feasible plan?)",
                                what);
        j = best;
    }
    if (!json_is_object(j)) return dw_set_error(ctx, DW_ERR_FORMAT, "%s: expected a JSON object", what);
    const json_t *par = json_object_get(j, "parallel");
    if (!json_is_object(par))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: missing object field 'parallel' {dp,tp,pp,ep,cp}", what);
    char pw[128];
    snprintf(pw, sizeof pw, "%s: parallel", what);
    int64_t v[5];
    static const char *const keys[5] = {"dp", "tp", "pp", "ep", "cp"};
    for (int i = 0; i < 5; i++) {
        long long x = 0;
        DW_TRY(dw_json_get_int(ctx, par, keys[i], pw, &x));
        if (x < 1 || x > 10000000)
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field '%s' = %lld must be in [1, 10000000]", pw,
                                keys[i], x);
        v[i] = x;
    }
    out->dp = (int)v[0], out->tp = (int)v[1], out->pp = (int)v[2], out->ep = (int)v[3], out->cp = (int)v[4];
    int64_t vpp = 1, mb = 1, ga = 0, zero = 0;
    DW_TRY(get_opt_int(ctx, j, "virtual_stages", what, 1, 1024, &vpp));
    DW_TRY(get_opt_int(ctx, j, "micro_batch", what, 1, 1LL << 40, &mb));
    DW_TRY(get_opt_int(ctx, j, "grad_accum", what, 0, 1LL << 40, &ga));
    DW_TRY(get_opt_int(ctx, j, "zero", what, 0, 3, &zero));
    out->vpp = (int)vpp, out->micro_batch = mb, out->grad_accum = ga, out->zero = (int)zero;
    out->sched = vpp > 1 ? DW_SCHED_INTERLEAVED : DW_SCHED_1F1B;
    const char *sched = NULL;
    DW_TRY(dw_json_get_str_opt(ctx, j, "schedule", what, &sched));
    if (sched && strcmp(sched, dw_sched_name(out->sched))) {
        if (strcmp(sched, "dualpipe") || vpp != 1)
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'schedule' = '%s' does not match virtual_stages %lld "
                                "(expected 1f1b, interleaved_1f1b with v > 1, or dualpipe with v 1)", what, sched,
                                (long long)vpp);
        out->sched = DW_SCHED_DUALPIPE;
    }
    DW_TRY(dw_json_get_bool_opt(ctx, j, "a2a_overlap", what, &out->a2a_overlap));
    int64_t etp = 0;
    DW_TRY(get_opt_int(ctx, j, "expert_tp", what, 0, 10000000, &etp));
    out->etp = (int)etp;
    const char *rc = NULL;
    DW_TRY(dw_json_get_str_opt(ctx, j, "recompute", what, &rc));
    out->recompute = DW_RECOMPUTE_NONE;
    if (rc) {
        int k = 0;
        while (k < DW_RECOMPUTE_COUNT && strcmp(rc, dw_recompute_name((dw_recompute)k))) k++;
        if (k == DW_RECOMPUTE_COUNT)
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'recompute' = '%s' (expected none, selective, full)",
                                what, rc);
        out->recompute = (dw_recompute)k;
    }
    DW_TRY(dw_json_get_bool_opt(ctx, j, "offload", what, &out->offload));
    return DW_OK;
}
