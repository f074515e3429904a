/* moe_fp8.c — the MoE linear layer's pieces both backends share (moe_fp8.h): a pass's grouped
 * GEMM arguments in the bound recipe, the workspace slots of its quantised operands (fp8_block or
 * mxfp8; the program's, or expert parallelism's sized for a group's rows) and what a weight-cache
 * refresh covers (every expert, or under expert parallelism the rank's own). */
#include "runtime/moe_fp8.h"

#include "core/error.h"
#include "formats/formats.h"
#include "gemm/grouped_fp8.h"
#include "gemm/grouped_mxfp8.h"
#include "runtime/exec.h"

static int64_t align256(int64_t v) { return (v + 255) / 256 * 256; }

dw_recipe dw_moe_quant_recipe(const dw_compiled *p, int node) {
    return dw_compile_quant_act_recipe(p->node[node].bind.recipe);
}

dw_grouped_args dw_moe_linear_args(const dw_op_call *c, int pass, dw_device_kind device) {
    const dw_ir_tensor *wt = &c->x->g->tensors[c->n->in[1]];
    const dw_compiled *p = c->x->p;
    const dw_node_binding *b = &p->node[c->node].bind;
    return (dw_grouped_args){.pass = pass, .recipe = b->quantised[pass] ? dw_moe_quant_recipe(p, c->node) : DW_RECIPE_BF16,
                             .rows = dw_exec_rows(c->x, c->n->in[0]), .experts = wt->shape[0], .m = wt->shape[1],
                             .k = wt->shape[2], .offsets = (const int32_t *)c->in[2],
                             .backend = p->target.device == (int)device ? b->kernel[pass] : NULL};
}

dw_moe_fp8_slot dw_moe_fp8_at(const dw_exec *x, const dw_qslot_layout *l) {
    uint8_t *codes = l->codes_act >= 0 ? (uint8_t *)x->act + l->codes_act : (uint8_t *)(x->work + l->off); /* wcache_arena */
    return (dw_moe_fp8_slot){.codes = codes, .scales = (float *)(x->work + l->off + l->scales)};
}

/* Bytes of operand `role` in recipe r for R rows of width C (rows) or C rows of R's padded
 * columns (dy^T, x^T). */
static void operand_bytes(dw_recipe r, dw_moe_fp8_role role, int64_t R, int64_t C, int64_t E, int64_t *codes,
                          int64_t *scales) {
    const int64_t P = r == DW_RECIPE_MXFP8 ? dw_grouped_mxfp8_wgrad_cols(R, E) : dw_grouped_fp8_wgrad_cols(R, E);
    const int64_t rows = role == DW_MOE_FP8_ROWS ? R : C, cols = role == DW_MOE_FP8_ROWS ? C : P;
    *codes = rows * dw_quant_row_bytes(r, cols);
    *scales = (int64_t)dw_quant_scales_bytes(r, rows, cols);
}

static void fit(dw_moe_fp8_ep *ep, dw_recipe r, dw_moe_fp8_role role, int64_t R, int64_t C, int64_t E) {
    int64_t codes, scales;
    operand_bytes(r, role, R, C, E, &codes, &scales);
    if (codes > ep->codes[role]) ep->codes[role] = codes;
    if (scales > ep->scales[role]) ep->scales[role] = scales;
}

void dw_moe_fp8_ep_fit(const dw_compiled *p, int node, int64_t R, dw_moe_fp8_ep *ep) {
    const dw_node_binding *b = &p->node[node].bind;
    const int64_t *sh = p->g->tensors[p->g->nodes[node].in[1]].shape; /* [E, M, K] */
    const dw_recipe r = dw_moe_quant_recipe(p, node);
    if (b->quantised[DW_QPASS_FPROP] || b->quantised[DW_QPASS_DGRAD]) {
        fit(ep, r, DW_MOE_FP8_ROWS, R, sh[2], sh[0]); /* x [R, K] */
        fit(ep, r, DW_MOE_FP8_ROWS, R, sh[1], sh[0]); /* dy [R, M] */
    }
    if (b->quantised[DW_QPASS_WGRAD]) {
        fit(ep, r, DW_MOE_FP8_DYT, R, sh[1], sh[0]); /* dy^T [M, P] */
        fit(ep, r, DW_MOE_FP8_XT, R, sh[2], sh[0]);  /* x^T [K, P] */
    }
}

int64_t dw_moe_fp8_ep_bytes(const dw_moe_fp8_ep *ep) {
    int64_t n = 0;
    for (int r = 0; r < DW_MOE_FP8_ROLES; r++) n += align256(ep->codes[r]) + align256(ep->scales[r]);
    return n;
}

void dw_moe_fp8_ep_place(dw_moe_fp8_ep *ep, char *base) {
    for (int r = 0; r < DW_MOE_FP8_ROLES; r++) {
        ep->slot[r].codes = (uint8_t *)base, base += align256(ep->codes[r]);
        ep->slot[r].scales = (float *)base, base += align256(ep->scales[r]);
    }
}

dw_status dw_moe_fp8_operand(dw_ctx *ctx, const dw_op_call *c, dw_moe_fp8_role role, int64_t R, int64_t C,
                             dw_moe_fp8_slot *out) {
    const dw_exec *x = c->x;
    const dw_moe_fp8_ep *ep = x->moe_ep;
    if (ep) {
        int64_t codes, scales;
        const dw_recipe r = dw_moe_quant_recipe(x->p, c->node);
        operand_bytes(r, role, R, C, x->g->tensors[c->n->in[1]].shape[0], &codes, &scales);
        if (codes > ep->codes[role] || scales > ep->scales[role])
            return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "node '%s': %lld rows exceed the expert-parallel %s "
                                "operand slots", c->n->name, (long long)R, dw_recipe_name(r));
        *out = ep->slot[role];
        return DW_OK;
    }
    const int64_t cap = x->p->tensor[c->n->in[0]].rows_cap;
    if (R > cap)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "node '%s': %lld rows exceed the %s operand slots' %lld",
                            c->n->name, (long long)R, dw_recipe_name(dw_moe_quant_recipe(x->p, c->node)),
                            (long long)cap);
    const dw_work_layout *w = &x->p->work;
    *out = dw_moe_fp8_at(x, role == DW_MOE_FP8_ROWS ? &w->q_rows : role == DW_MOE_FP8_DYT ? &w->q_dyt : &w->q_xt);
    return DW_OK;
}

bool dw_moe_fp8_weight_job_of(const dw_exec *x, int node, dw_moe_fp8_weight_job *j) {
    const dw_prog_node *pn = &x->p->node[node];
    if (pn->wq[0].off < 0) return false;
    const int wt = x->g->nodes[node].in[1];
    const int64_t *sh = x->g->tensors[wt].shape; /* [E, M, K] */
    *j = (dw_moe_fp8_weight_job){.recipe = dw_moe_quant_recipe(x->p, node), .w = x->w + x->p->param_off[x->p->tensor[wt].param], .experts = sh[0], .m = sh[1],
                                 .k = sh[2], .q = dw_moe_fp8_at(x, &pn->wq[0]), .qt = dw_moe_fp8_at(x, &pn->wq[1])};
    const dw_moe_fp8_ep *ep = x->moe_ep;
    if (ep) { /* the rank's experts: each expert's codes (M K) and scales (128x128 FP32; 1x32 bytes) are its own */
        const int64_t f = ep->first, codes = sh[1] * sh[2];
        const int64_t scales = j->recipe == DW_RECIPE_MXFP8 ? codes / 32 : (sh[1] / 128) * (sh[2] / 128) * 4; /* bytes */
        j->w += f * codes, j->experts = ep->count;
        j->q.codes += f * codes, j->q.scales = (float *)(void *)((char *)j->q.scales + f * scales);
        j->qt.codes += f * codes, j->qt.scales = (float *)(void *)((char *)j->qt.scales + f * scales);
    }
    return true;
}

void dw_moe_fp8_cached_weight(const dw_op_call *c, int t, dw_grouped_args *a) {
    const dw_moe_fp8_slot s = dw_moe_fp8_at(c->x, &c->x->p->node[c->node].wq[t]);
    a->w = s.codes, a->w_scales = s.scales;
}
