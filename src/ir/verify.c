/* verify.c — whole-graph verification: indices, names, topological order, every node's stored
 * outputs against their inference (op_infer.c), and the tokens/targets/logits/loss roles (a
 * feed-forward graph's input/output: float_graph.c). */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "ir/float_graph.h"
#include "ir/ir.h"

#define IN(i) (&g->tensors[n->in[(i)]])

dw_status dw_graph_verify(dw_ctx *ctx, const dw_graph *g) {
    for (int i = 0; i < g->n_tensors; i++) {
        const dw_ir_tensor *t = &g->tensors[i];
        if (!t->name || !*t->name) return dw_set_error(ctx, DW_ERR_FORMAT, "tensor %d has no name", i);
        if (t->kind != DW_TENSOR_ACT && t->producer != -1)
            return dw_set_error(ctx, DW_ERR_FORMAT, "tensor '%s': %s tensors have no producer",
                                t->name, dw_tensor_kind_name(t->kind));
        bool produced = false;
        for (int k = 0; t->producer >= 0 && t->producer < g->n_nodes && k < g->nodes[t->producer].n_out; k++)
            produced |= g->nodes[t->producer].out[k] == i;
        if (t->kind == DW_TENSOR_ACT && !produced)
            return dw_set_error(ctx, DW_ERR_FORMAT, "tensor '%s': activation without a producing node",
                                t->name);
        for (int j = 0; j < i; j++)
            if (!strcmp(g->tensors[j].name, t->name))
                return dw_set_error(ctx, DW_ERR_FORMAT, "tensor name '%s' is used twice", t->name);
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const dw_ir_node *n = &g->nodes[i];
        if (!n->name || !*n->name) return dw_set_error(ctx, DW_ERR_FORMAT, "node %d has no name", i);
        for (int j = 0; j < i; j++)
            if (!strcmp(g->nodes[j].name, n->name))
                return dw_ir_node_error(ctx, n, "node name used twice (nodes %d and %d)", j, i);
        dw_ir_tensor t[DW_IR_MAX_OUTPUTS];
        if (n->n_out != dw_op_outputs(n->op))
            return dw_ir_node_error(ctx, n, "has %d outputs; the op has %d", n->n_out, dw_op_outputs(n->op));
        DW_TRY(dw_ir_infer(ctx, g, n, t));
        for (int k = 0; k < n->n_in; k++) {
            const dw_ir_tensor *x = IN(k);
            if (x->kind == DW_TENSOR_ACT && x->producer >= i)
                return dw_ir_node_error(ctx, n, "input '%s' is computed later (not in topological order)", x->name);
        }
        for (int k = 0; k < n->n_out; k++) {
            if (n->out[k] < 0 || n->out[k] >= g->n_tensors || g->tensors[n->out[k]].producer != i)
                return dw_ir_node_error(ctx, n, "output %d (tensor %d) is not this node's", k, n->out[k]);
            const dw_ir_tensor *o = &g->tensors[n->out[k]];
            bool same = o->ndim == t[k].ndim && o->dtype == t[k].dtype;
            for (int d = 0; same && d < t[k].ndim; d++) same = o->shape[d] == t[k].shape[d];
            if (!same) {
                char so[96], st[96];
                dw_ir_shape_str(o, so, sizeof so);
                dw_ir_shape_str(&t[k], st, sizeof st);
                return dw_ir_node_error(ctx, n, "output '%s' is %s %s; its inputs give %s %s", o->name,
                                        dw_ir_dtype_name(o->dtype), so, dw_ir_dtype_name(t[k].dtype), st);
            }
        }
    }
    if (dw_graph_float_input(g)) return dw_graph_verify_float_roles(ctx, g);
    const struct {
        const char *what;
        int idx;
        dw_tensor_kind kind;
    } roles[] = {{"tokens", g->tokens, DW_TENSOR_INPUT}, {"targets", g->targets, DW_TENSOR_INPUT},
                 {"logits", g->logits, DW_TENSOR_ACT},   {"loss", g->loss, DW_TENSOR_ACT}};
    for (size_t r = 0; r < sizeof roles / sizeof roles[0]; r++)
        if (roles[r].idx < 0 || roles[r].idx >= g->n_tensors ||
            g->tensors[roles[r].idx].kind != roles[r].kind)
            return dw_set_error(ctx, DW_ERR_FORMAT, "graph: no %s tensor '%s'", roles[r].what,
                                roles[r].what);
    return DW_OK;
}
