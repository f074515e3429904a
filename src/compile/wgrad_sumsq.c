/* wgrad_sumsq.c — which MoE linear layers' wgrads write their share of the gradient norm, where
 * their partials lie in the workspace, and the pool ranges left to the norm step (wgrad_sumsq.h):
 * decided once, with the workspace's layout; the runtime reads what is stored. */
#include "compile/wgrad_sumsq.h"

#include "compile/passes.h"
#include "kernels/cuda/ops_cuda.h" /* dw_moe_sumsq_parts (plain C) */

/* The one eligibility rule, without the count cap. */
static bool eligible(const dw_compiled *c, int i) {
    const dw_ir_node *n = &c->g->nodes[i];
    if (c->target.device != DW_DEVICE_CUDA || !c->grad_arena || !c->bf16 || !c->grad_first) return false;
    if (n->op != DW_OP_MOE_LINEAR || !(c->node[i].pgrad_set >> 1 & 1u) || c->node[i].bind.quantised[DW_QPASS_WGRAD])
        return false;
    const int k = c->tensor[n->in[1]].param;
    if (k < 0 || c->grad_first[k] != i) return false;
    for (int j = 0; j < c->g->n_nodes; j++) /* the layer is the weight's only reader, so its only writer */
        for (int s = 0; s < c->g->nodes[j].n_in; s++)
            if (c->tensor[c->g->nodes[j].in[s]].param == k && (j != i || s != 1)) return false;
    return true;
}

void dw_compile_wsumsq_layout(dw_compiled *c, int64_t *o) {
    dw_work_layout *w = &c->work;
    int64_t cov[DW_COMPILE_NORM_SEGS][2]; /* the covered weights' pool ranges, sorted by offset */
    int nc = 0;
    w->wsumsq_parts = 0;
    for (int i = 0; i < c->g->n_nodes; i++) {
        c->node[i].wsumsq_off = -1;
        if (nc == DW_COMPILE_NORM_SEGS - 1 || !eligible(c, i)) continue; /* n covered ranges leave n + 1 */
        const dw_ir_tensor *wt = &c->g->tensors[c->g->nodes[i].in[1]]; /* W [E, M, K] */
        c->node[i].wsumsq_off = w->wsumsq_parts * 8; /* relative until the region is placed */
        w->wsumsq_parts += dw_moe_sumsq_parts(wt->shape[0], wt->shape[1], wt->shape[2]);
        const int k = c->tensor[c->g->nodes[i].in[1]].param;
        const int64_t lo = c->param_off[k], hi = lo + dw_ir_numel(wt);
        int j = nc++;
        for (; j > 0 && cov[j - 1][0] > lo; j--) cov[j][0] = cov[j - 1][0], cov[j][1] = cov[j - 1][1];
        cov[j][0] = lo, cov[j][1] = hi;
    }
    w->wsumsq = w->wsumsq_parts ? *o : -1, *o = dw_align_up(*o + w->wsumsq_parts * 8, 256);
    for (int i = 0; w->wsumsq >= 0 && i < c->g->n_nodes; i++)
        if (c->node[i].wsumsq_off >= 0) c->node[i].wsumsq_off += w->wsumsq;
    w->n_norm_segs = 0;
    int64_t at = 0;
    for (int j = 0; j <= nc; j++) { /* the gaps between the covered ranges */
        const int64_t end = j < nc ? cov[j][0] : c->param_floats;
        if (end > at) w->norm_segs[w->n_norm_segs][0] = at, w->norm_segs[w->n_norm_segs][1] = end, w->n_norm_segs++;
        if (j < nc) at = cov[j][1];
    }
}

bool dw_compile_wsumsq_node(const dw_compiled *c, int i) {
    return c->work.wsumsq_parts > 0 && c->node[i].wsumsq_off >= 0;
}

int64_t dw_compile_wsumsq_of(const dw_compiled *c, int node) {
    return dw_compile_wsumsq_node(c, node) ? c->node[node].wsumsq_off : -1;
}

int dw_compile_norm_segments(const dw_compiled *c, int64_t (*segs)[2], int cap) {
    if (c->work.wsumsq_parts <= 0) { /* no partials: the whole pool */
        if (cap < 1) return 0;
        segs[0][0] = 0, segs[0][1] = c->param_floats;
        return 1;
    }
    const int n = c->work.n_norm_segs < cap ? c->work.n_norm_segs : cap;
    for (int s = 0; s < n; s++) segs[s][0] = c->work.norm_segs[s][0], segs[s][1] = c->work.norm_segs[s][1];
    return n;
}

int64_t dw_compile_wsumsq_floats(const dw_compiled *c) {
    int64_t segs[DW_COMPILE_NORM_SEGS][2], left = 0;
    const int n = dw_compile_norm_segments(c, segs, DW_COMPILE_NORM_SEGS);
    for (int s = 0; s < n; s++) left += segs[s][1] - segs[s][0];
    return c->param_floats - left;
}
