/* moe_rows.c — MoE rows under a capacity factor below 1 (passes.h): a dispatch keeps at most
 * E x capacity of its N K assignments, so its rows and every tensor computed row by row from them
 * (the expert GEMMs' outputs, their SwiGLU) are sized for those rows, not N K: the memory plan
 * allocates rows_cap of them and the executor hands the ops dw_moe_routed_rows of the call. The
 * combine reads them by row index, so its output is the tokens' again. */
#include "compile/passes.h"

void dw_compile_moe_rows(dw_compiled *c) {
    const dw_graph *g = c->g;
    for (int i = 0; i < g->n_nodes; i++) {
        const dw_ir_node *n = &g->nodes[i];
        const dw_prog_tensor *in0 = n->n_in > 0 ? &c->tensor[n->in[0]] : NULL;
        double f = 0;
        int64_t K = 0, E = 0;
        if (n->op == DW_OP_MOE_DISPATCH && n->attrs.capacity_factor > 0 && n->attrs.capacity_factor < 1) {
            const dw_ir_tensor *idx = &g->tensors[n->in[1]];
            f = n->attrs.capacity_factor, K = idx->shape[idx->ndim - 1], E = n->attrs.experts;
        } else if (in0 && in0->moe_factor > 0 && n->op != DW_OP_MOE_COMBINE) { /* row by row from MoE rows */
            f = in0->moe_factor, K = in0->moe_top_k, E = in0->moe_experts;
        }
        if (!(f > 0)) continue;
        dw_prog_tensor *o = &c->tensor[n->out[0]];
        o->moe_factor = f, o->moe_top_k = K, o->moe_experts = E;
        o->rows_cap = dw_moe_routed_rows(f, g->batch * g->seq, K, E);
    }
}
