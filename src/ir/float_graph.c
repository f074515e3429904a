/* float_graph.c — feed-forward graphs (float_graph.h): recognising one, checking its input and
 * output roles, and the widths deepwell.h publishes (dw_graph_input_width, dw_graph_output_width). */
#include "ir/float_graph.h"

#include "core/error.h"

bool dw_graph_float_input(const dw_graph *g) {
    return g && g->tokens >= 0 && g->tokens < g->n_tensors && g->tensors[g->tokens].dtype == DW_IR_F32;
}

dw_status dw_graph_verify_float_roles(dw_ctx *ctx, const dw_graph *g) {
    const dw_ir_tensor *in = &g->tensors[g->tokens];
    if (in->kind != DW_TENSOR_INPUT || in->ndim != 3)
        return dw_set_error(ctx, DW_ERR_FORMAT, "graph: input '%s' must be an input tensor (B,T,C_in), not a %dD %s",
                            in->name, in->ndim, dw_tensor_kind_name(in->kind));
    if (in->shape[0] != g->batch || in->shape[1] != g->seq)
        return dw_set_error(ctx, DW_ERR_FORMAT, "graph: input '%s' is (%lld,%lld,...) but the graph is for %lld x %lld",
                            in->name, (long long)in->shape[0], (long long)in->shape[1], (long long)g->batch,
                            (long long)g->seq);
    if (g->logits < 0 || g->logits >= g->n_tensors)
        return dw_set_error(ctx, DW_ERR_FORMAT, "graph: no output tensor 'output'");
    const dw_ir_tensor *out = &g->tensors[g->logits];
    if (out->kind != DW_TENSOR_ACT || out->dtype != DW_IR_F32 || out->ndim != 3 || out->shape[0] != g->batch ||
        out->shape[1] != g->seq)
        return dw_set_error(ctx, DW_ERR_FORMAT, "graph: output '%s' must be an f32 activation (%lld,%lld,C_out)",
                            out->name, (long long)g->batch, (long long)g->seq);
    if (g->targets >= 0 || g->loss >= 0)
        return dw_set_error(ctx, DW_ERR_FORMAT, "graph: a float-input graph has no targets or loss");
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].kind == DW_TENSOR_INPUT && i != g->tokens)
            return dw_set_error(ctx, DW_ERR_FORMAT, "graph: input tensor '%s' besides the input '%s'",
                                g->tensors[i].name, in->name);
    return DW_OK;
}

int64_t dw_graph_input_width(const dw_graph *g) {
    return dw_graph_float_input(g) ? g->tensors[g->tokens].shape[2] : 0;
}

int64_t dw_graph_output_width(const dw_graph *g) {
    return dw_graph_float_input(g) && g->logits >= 0 ? g->tensors[g->logits].shape[2] : 0;
}
