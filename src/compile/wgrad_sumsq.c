/* wgrad_sumsq.c — which MoE linear layers' wgrads write their share of the gradient norm, where
 * their partials lie in the workspace, and the pool ranges left to the norm step (wgrad_sumsq.h). */
#include "compile/wgrad_sumsq.h"

#include "compile/passes.h"

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

bool dw_compile_wsumsq_node(const dw_compiled *c, int i) {
    if (!eligible(c, i)) return false;
    int before = 0;
    for (int j = 0; j < i; j++) before += eligible(c, j);
    return before < DW_WSUMSQ_MAX_SEGS - 1;
}

static int64_t node_parts(const dw_compiled *c, int i) {
    const dw_ir_tensor *w = &c->g->tensors[c->g->nodes[i].in[1]]; /* W [E, M, K] */
    return dw_wsumsq_parts(w->shape[0], w->shape[1], w->shape[2]);
}

int64_t dw_compile_wsumsq_of(const dw_compiled *c, int node) {
    if (c->work.wsumsq < 0 || !dw_compile_wsumsq_node(c, node)) return -1;
    int64_t o = c->work.wsumsq;
    for (int i = 0; i < node; i++)
        if (dw_compile_wsumsq_node(c, i)) o += node_parts(c, i) * 8;
    return o;
}

int dw_compile_norm_segments(const dw_compiled *c, int64_t (*segs)[2], int cap) {
    int n = 0;
    int64_t at = 0; /* covered ranges come in pool order: sort the few there are by offset */
    int64_t cov[DW_WSUMSQ_MAX_SEGS][2];
    int nc = 0;
    for (int i = 0; c->work.wsumsq >= 0 && i < c->g->n_nodes && nc < DW_WSUMSQ_MAX_SEGS - 1; i++) {
        if (!dw_compile_wsumsq_node(c, i)) continue;
        const int k = c->tensor[c->g->nodes[i].in[1]].param;
        int64_t lo = c->param_off[k], hi = lo + dw_ir_numel(&c->g->tensors[c->param_tensor[k]]);
        int j = nc++;
        for (; j > 0 && cov[j - 1][0] > lo; j--) cov[j][0] = cov[j - 1][0], cov[j][1] = cov[j - 1][1];
        cov[j][0] = lo, cov[j][1] = hi;
    }
    for (int j = 0; j <= nc; j++) {
        const int64_t end = j < nc ? cov[j][0] : c->param_floats;
        if (end > at && n < cap) segs[n][0] = at, segs[n][1] = end, n++;
        if (j < nc) at = cov[j][1];
    }
    return n;
}

int64_t dw_compile_wsumsq_floats(const dw_compiled *c) {
    int64_t segs[DW_WSUMSQ_MAX_SEGS][2], left = 0;
    const int n = dw_compile_norm_segments(c, segs, DW_WSUMSQ_MAX_SEGS);
    for (int s = 0; s < n; s++) left += segs[s][1] - segs[s][0];
    return c->param_floats - left;
}
