/* plan_explain.c — what `deepwell plan --explain` reads of a plan beyond its totals: the step
 * split into terms that add up to it, memory per pipeline rank, the layer layout stage by stage
 * (deepwell.h: dw_plan_get_time_split, dw_plan_get_rank_memory, dw_plan_get_stage), and of a
 * search each family's account (dw_plan_set_get_family). The same terms feed the JSON
 * document's "explain" (plan_json.c). */
#include <stdlib.h>

#include "core/error.h"
#include "core/sized.h"
#include "plan/layout.h"
#include "plan/plan_handle.h"

const char *const dw_plan_time_term_names[DW_PLAN_TIME_TERMS] = {
    "compute_s", "tp_exposed_s", "cp_exposed_s", "ep_exposed_s", "recompute_s", "bubble_s", "dp_exposed_s",
    "optimizer_s"};

void dw_plan_time_terms(const dw_plan_entry *e, double t[DW_PLAN_TIME_TERMS]) {
    const dw_cost *c = &e->cost;
    t[1] = c->tp_comm, t[2] = c->cp_comm, t[3] = c->ep_comm, t[4] = e->x.recompute;
    t[0] = c->compute - t[1] - t[2] - t[3] - t[4];
    t[5] = c->pipeline - c->compute, t[6] = c->dp_exposed, t[7] = c->optimizer;
}

int64_t dw_plan_vstage_first_layer(const dw_plan_in *in, int pp, int v, int vs) {
    int64_t first = 0;
    for (int k = 0; k < vs; k++) {
        dw_vstage st;
        if (dw_plan_vstage(in, pp, v, k, &st)) first += st.layers;
    }
    return first;
}

static dw_status write_result(const char *fn, void *out, const void *full, size_t n) {
    if (!dw_sized_write(out, full, n))
        return dw_set_error(NULL, DW_ERR_INVALID, "%s: out->size is 0 (set it to sizeof the struct)", fn);
    return DW_OK;
}

dw_status dw_plan_get_time_split(const dw_plan *p, dw_plan_time_split *out) {
    if (!out) return dw_set_error(NULL, DW_ERR_INVALID, "dw_plan_get_time_split: NULL out");
    dw_sized_clear(out);
    DW_TRY(dw_plan_predicted("dw_plan_get_time_split", p));
    double t[DW_PLAN_TIME_TERMS];
    dw_plan_time_terms(&p->e, t);
    dw_plan_time_split s = {.size = sizeof s, .compute = t[0], .tp_exposed = t[1], .cp_exposed = t[2],
                            .ep_exposed = t[3], .recompute = t[4], .bubble = t[5], .dp_exposed = t[6],
                            .optimizer = t[7], .ep_hidden = p->e.x.ep_hidden};
    return write_result("dw_plan_get_time_split", out, &s, sizeof s);
}

dw_status dw_plan_get_rank_memory(const dw_plan *p, int rank, dw_plan_mem *out) {
    if (!out) return dw_set_error(NULL, DW_ERR_INVALID, "dw_plan_get_rank_memory: NULL out");
    dw_sized_clear(out);
    DW_TRY(dw_plan_predicted("dw_plan_get_rank_memory", p));
    if (rank < 0 || rank >= p->par.pp)
        return dw_set_error(NULL, DW_ERR_INVALID, "dw_plan_get_rank_memory: rank %d is outside [0, pp %d)", rank,
                            p->par.pp);
    dw_mem *m = calloc((size_t)p->par.pp, sizeof *m);
    if (!m) return dw_set_error(NULL, DW_ERR_NOMEM, "dw_plan_get_rank_memory: out of memory");
    dw_plan_memory_ranks(&p->env.in, &p->par, m);
    dw_plan_mem r = m[rank];
    free(m);
    r.size = sizeof r;
    return write_result("dw_plan_get_rank_memory", out, &r, sizeof r);
}

int dw_plan_stage_count(const dw_plan *p) { return p && p->bound ? p->par.pp * p->par.vpp : 0; }

dw_status dw_plan_get_stage(const dw_plan *p, int i, dw_plan_stage *out) {
    if (!out) return dw_set_error(NULL, DW_ERR_INVALID, "dw_plan_get_stage: NULL out");
    dw_sized_clear(out);
    int n = dw_plan_stage_count(p);
    if (i < 0 || i >= n)
        return dw_set_error(NULL, DW_ERR_INVALID, "dw_plan_get_stage: stage %d is outside [0, %d)%s", i, n,
                            p && !p->bound ? " (the plan has no model: dw_plan_single)" : "");
    const dw_par *q = &p->par;
    dw_vstage st;
    if (!dw_plan_vstage(&p->env.in, q->pp, q->vpp, i, &st))
        return dw_set_error(NULL, DW_ERR_INVALID, "dw_plan_get_stage: the layers admit no layout over pp %d x v %d",
                            q->pp, q->vpp);
    dw_plan_stage s = {.size = sizeof s, .first_layer = dw_plan_vstage_first_layer(&p->env.in, q->pp, q->vpp, i),
                       .layers = st.layers, .dense_layers = st.layers - st.moe_layers, .moe_layers = st.moe_layers,
                       .mtp = st.mtp, .embedding = st.embed, .lm_head = st.head};
    bool found = false; /* the first rank and chunk that hold model stage i (DualPipe: chunk 0) */
    for (int ch = 0; ch < dw_plan_chunks(q) && !found; ch++)
        for (int r = 0; r < q->pp && !found; r++)
            if (dw_plan_chunk_stage(q, r, ch) == i) s.rank = r, s.chunk = ch, found = true;
    return write_result("dw_plan_get_stage", out, &s, sizeof s);
}

int dw_plan_families(void) { return DW_FAMILY_COUNT; }

void dw_family_info(const dw_plan_result *r, int family, dw_plan_family_info *out) {
    const dw_family_stats *st = &r->fam[family];
    dw_plan_family_info f = {.size = sizeof f, .name = dw_family_name((dw_family)family), .feasible = st->feasible,
                             .main_reason = -1, .kept = -1, .simulated = st->simulated,
                             .best_step = st->simulated ? st->best.cost.step : 0,
                             .best_summary = st->simulated ? st->best_summary : "", .lower_bound = st->lower_bound,
                             .largest_term = -1};
    for (int k = 0; k < DW_REJECT_COUNT; k++) {
        if (k == DW_REJECT_DOMINATED) continue; /* feasible, counted above */
        f.rejected += st->rejected[k];
        if (st->rejected[k] > f.main_reason_count) f.main_reason = k, f.main_reason_count = st->rejected[k];
    }
    for (int i = 0; i < r->n_plans && f.kept < 0; i++)
        if (dw_family_mask(&r->plans[i].par) >> family & 1) f.kept = i;
    if (st->simulated && r->n_plans > 0) {
        double a[DW_PLAN_TIME_TERMS], b[DW_PLAN_TIME_TERMS];
        dw_plan_time_terms(&r->plans[0], a);
        dw_plan_time_terms(&st->best, b);
        f.largest_term = 0;
        for (int k = 1; k < DW_PLAN_TIME_TERMS; k++)
            if (b[k] - a[k] > b[f.largest_term] - a[f.largest_term]) f.largest_term = k;
        f.largest_excess = b[f.largest_term] - a[f.largest_term];
    }
    *out = f;
}

dw_status dw_plan_set_get_family(const dw_plan_set *s, int family, dw_plan_family_info *out) {
    if (!s || !out) return dw_set_error(NULL, DW_ERR_INVALID, "dw_plan_set_get_family: NULL argument");
    dw_sized_clear(out);
    if (family < 0 || family >= DW_FAMILY_COUNT)
        return dw_set_error(NULL, DW_ERR_INVALID, "dw_plan_set_get_family: family %d is outside [0, %d)", family,
                            DW_FAMILY_COUNT);
    dw_plan_family_info f;
    dw_family_info(&s->r, family, &f);
    return write_result("dw_plan_set_get_family", out, &f, sizeof f);
}
