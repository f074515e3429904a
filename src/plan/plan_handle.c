/* plan_handle.c — a plan's layout as deepwell.h hands it out: the degrees, micro-batch and
 * memory options (dw_plan_get_layout), the GPUs it spans, its one-line summary. What dw_compile
 * reads of a plan, and whether it has a prediction to hand out (dw_plan_predicted); nothing here
 * predicts or checks (plan_api.c). */
#include "core/error.h"
#include "core/sized.h"
#include "plan/plan_handle.h"

dw_status dw_plan_get_layout(const dw_plan *p, dw_plan_layout *out) {
    if (!p || !out) return dw_set_error(NULL, DW_ERR_INVALID, "dw_plan_get_layout: NULL argument");
    const dw_par *q = &p->par;
    dw_plan_layout l = {.size = sizeof l, .dp = q->dp, .tp = q->tp, .pp = q->pp, .cp = q->cp, .ep = q->ep,
                        .vpp = q->vpp, .zero = q->zero, .recompute = (int)q->recompute, .offload = q->offload,
                        .micro_batch = q->micro_batch, .seq = p->seq, .global_batch = p->global_batch,
                        .recipe = (int32_t)p->recipe, .etp = dw_par_etp(q), .a2a_overlap = q->a2a_overlap,
                        .grad_accum = q->grad_accum};
    if (!dw_sized_write(out, &l, sizeof l))
        return dw_set_error(NULL, DW_ERR_INVALID, "dw_plan_get_layout: out->size is 0 (set it to sizeof the struct)");
    return DW_OK;
}

int dw_plan_world_size(const dw_plan *p) { return p ? p->par.dp * p->par.tp * p->par.pp * p->par.cp : 0; }

const char *dw_plan_summary(const dw_plan *p) { return p ? p->summary : ""; }

dw_status dw_plan_predicted(const char *fn, const dw_plan *p) {
    if (!p) return dw_set_error(NULL, DW_ERR_INVALID, "%s: NULL plan", fn);
    if (!p->bound)
        return dw_set_error(NULL, DW_ERR_INVALID, "%s: the plan has no model or machine (dw_plan_single)", fn);
    if (p->violations)
        return dw_set_error(NULL, DW_ERR_INVALID, "%s: the plan breaks %d constraint(s), so it has no prediction: %s",
                            fn, p->violations, p->why);
    return DW_OK;
}
