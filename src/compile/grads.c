/* grads.c — how gradients of activations travel in backward: which node writes a tensor's
 * gradient first and which add into it (the op itself when its ops.def row can, else through an
 * ACC temporary the executor adds in), and which gradient buffers are shared through residual
 * adds. Decides only; the arena (arena.c) and the executor read the result. */
#include <stdlib.h>

#include "compile/passes.h"
#include "core/error.h"

/* The first backward step to reach a tensor writes its gradient, later ones add. */
dw_status dw_compile_grad_modes(dw_ctx *ctx, dw_compiled *c) {
    const dw_graph *g = c->g;
    bool *written = calloc((size_t)(g->n_tensors ? g->n_tensors : 1), sizeof *written);
    if (!written) return dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        const dw_ir_node *n = &g->nodes[i];
        const unsigned flags = dw_op_flags(n->op);
        for (int s = 0; s < n->n_in; s++) {
            int t = n->in[s];
            if (g->tensors[t].kind != DW_TENSOR_ACT || !dw_compile_has_grad(g, t)) continue;
            c->node[i].grad_mode[s] = !written[t]                   ? DW_GRAD_WRITE
                                      : (flags & DW_OPF_ACC_IN(s)) ? DW_GRAD_ACCUM
                                                                    : DW_GRAD_ACCUM_TMP;
            written[t] = true;
        }
    }
    free(written);
    return DW_OK;
}

/* The root of t's alias chain. */
static int grad_root(const dw_compiled *c, int t) {
    while (c->tensor[t].grad_alias != t) t = c->tensor[t].grad_alias;
    return t;
}

/* Gradient buffers shared through residual adds (BF16 and FP32 modes alike). For y = a + b, an
 * input whose gradient the add writes first (DW_GRAD_WRITE) can take y's gradient buffer: y's
 * gradient is read by the add's backward alone, so it is dead afterwards and the input's gradient
 * starts as the same values. Input a (slot 0) always may. Input b (slot 1) may too when the add is
 * b's only reader (nothing else ever writes b's gradient) and, if a shares the buffer as well,
 * every other reader of a comes before b's producer in the graph: their backward steps, which
 * accumulate into a's gradient, run after b's producer has read b's gradient. Adds are visited
 * from the last, so a residual stream's gradient is one buffer from the loss to the embedding. */
dw_status dw_compile_grad_alias(dw_ctx *ctx, dw_compiled *c) {
    (void)ctx;
    const dw_graph *g = c->g;
    for (int t = 0; t < g->n_tensors; t++) c->tensor[t].grad_alias = t;
    for (int p = g->n_nodes - 1; p >= 0; p--) {
        const dw_ir_node *n = &g->nodes[p];
        if (!DW_OP_IS(n, DW_OPF_GRAD_COPY) || n->n_in != 2 || n->out[0] == g->logits) continue;
        const int a = n->in[0], b = n->in[1];
        if (a == b || g->tensors[a].kind != DW_TENSOR_ACT || g->tensors[b].kind != DW_TENSOR_ACT) continue;
        const bool wa = c->node[p].grad_mode[0] == DW_GRAD_WRITE, wb = c->node[p].grad_mode[1] == DW_GRAD_WRITE;
        bool share_b = wb;
        for (int i = 0; share_b && i < g->n_nodes; i++) { /* b read by this add alone */
            const dw_ir_node *m = &g->nodes[i];
            for (int s = 0; s < m->n_in; s++)
                if (m->in[s] == b && i != p) share_b = false;
        }
        const int pb = g->tensors[b].producer;
        for (int i = 0; share_b && wa && i < g->n_nodes; i++) { /* a's other readers before b's producer */
            const dw_ir_node *m = &g->nodes[i];
            for (int s = 0; s < m->n_in; s++)
                if (m->in[s] == a && i != p && i >= pb) share_b = false;
        }
        const int root = grad_root(c, n->out[0]);
        if (wa) c->tensor[a].grad_alias = root;
        if (share_b) c->tensor[b].grad_alias = root;
    }
    return DW_OK;
}
