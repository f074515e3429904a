/* moe_fp8.c — the MoE linear layer's pieces both backends share (moe_fp8.h): a pass's grouped
 * GEMM arguments in the bound recipe, and the workspace slots of its fp8_block operands. */
#include "runtime/moe_fp8.h"

#include "core/error.h"
#include "runtime/exec.h"

dw_grouped_args dw_moe_linear_args(const dw_op_call *c, int pass, dw_device_kind device) {
    const dw_ir_tensor *wt = &c->x->g->tensors[c->n->in[1]];
    const dw_compiled *p = c->x->p;
    const dw_node_binding *b = &p->node[c->node].bind;
    return (dw_grouped_args){.pass = pass, .recipe = b->quantised[pass] ? DW_RECIPE_FP8_BLOCK : DW_RECIPE_BF16,
                             .rows = dw_exec_rows(c->x, c->n->in[0]), .experts = wt->shape[0], .m = wt->shape[1],
                             .k = wt->shape[2], .offsets = (const int32_t *)c->in[2],
                             .backend = p->target.device == (int)device ? b->kernel[pass] : NULL};
}

dw_moe_fp8_slot dw_moe_fp8_at(const dw_exec *x, const dw_qslot_layout *l) {
    return (dw_moe_fp8_slot){.codes = (uint8_t *)(x->work + l->off), .scales = (float *)(x->work + l->off + l->scales)};
}

dw_status dw_moe_fp8_check_rows(dw_ctx *ctx, const dw_op_call *c, int64_t R) {
    const int64_t cap = c->x->p->tensor[c->n->in[0]].rows_cap;
    if (R <= cap) return DW_OK;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "node '%s': %lld rows exceed the fp8_block operand slots' %lld "
                        "(fp8_block experts under expert parallelism are not supported yet; keep them BF16 with the "
                        "policy rule {\"op\": \"moe_linear\", \"recipe\": \"bf16\"})", c->n->name, (long long)R,
                        (long long)cap);
}

bool dw_moe_fp8_weight_job_of(const dw_exec *x, int node, dw_moe_fp8_weight_job *j) {
    const dw_prog_node *pn = &x->p->node[node];
    if (pn->wq[0].off < 0) return false;
    const int wt = x->g->nodes[node].in[1];
    const int64_t *sh = x->g->tensors[wt].shape; /* [E, M, K] */
    *j = (dw_moe_fp8_weight_job){.w = x->w + x->p->param_off[x->p->tensor[wt].param], .experts = sh[0], .m = sh[1],
                                 .k = sh[2], .q = dw_moe_fp8_at(x, &pn->wq[0]), .qt = dw_moe_fp8_at(x, &pn->wq[1])};
    return true;
}

void dw_moe_fp8_cached_weight(const dw_op_call *c, int t, dw_grouped_args *a) {
    const dw_moe_fp8_slot s = dw_moe_fp8_at(c->x, &c->x->p->node[c->node].wq[t]);
    a->w = s.codes, a->w_scales = s.scales;
}
