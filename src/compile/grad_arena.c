/* grad_arena.c — gradients in the activation arena (dw_compile_opts.grad_arena; program.h): which
 * node's step writes each parameter's gradient first, and the arena items of the gradient slices:
 * the gradient pool's flat layout at a fixed place in the arena (so the norm, AdamW, data
 * parallelism's buckets and gradient reads see the pool they always saw), each parameter's slice
 * live from its first writer to the end of the sweep. Decides only: arena.c places the items,
 * steps.c zeroes each slice before its first writer. */
#include <stdlib.h>

#include "compile/passes.h"
#include "core/error.h"

/* The logical time node i's step writes its parameters' gradients: its backward, or its forward
 * for an op doing its backward there (the fused LM head). */
static int write_time(const dw_compiled *c, int i) {
    return dw_op_flags(dw_compile_node(c, i)->op) & DW_OPF_BWD_IN_FWD ? dw_compile_fwd_time(c, i)
                                                                       : dw_compile_bwd_time(c, i);
}

dw_status dw_compile_grad_first(dw_ctx *ctx, dw_compiled *c) {
    const dw_graph *g = c->g;
    c->grad_first = malloc((size_t)(c->n_params ? c->n_params : 1) * sizeof *c->grad_first);
    if (!c->grad_first) return dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
    for (int k = 0; k < c->n_params; k++) c->grad_first[k] = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        if (i == c->head_linear) continue; /* a fused LM head: its weight is the loss node's input */
        const dw_ir_node *n = dw_compile_node(c, i);
        for (int s = 0; s < n->n_in; s++) {
            const int k = c->tensor[n->in[s]].param;
            if (k < 0) continue;
            if (c->grad_first[k] < 0 || write_time(c, i) < write_time(c, c->grad_first[k])) c->grad_first[k] = i;
        }
    }
    return DW_OK;
}

int dw_compile_grad_birth(const dw_compiled *c, int k) {
    return c->grad_first[k] >= 0 ? write_time(c, c->grad_first[k]) : c->g->n_nodes; /* none: the sweep's start */
}

int64_t dw_compile_grad_slice_end(const dw_compiled *c, int k) {
    int64_t end = c->param_floats;
    for (int j = 0; j < c->n_params; j++)
        if (c->param_off[j] > c->param_off[k] && c->param_off[j] < end) end = c->param_off[j];
    return end;
}

void dw_compile_grad_slice_item(const dw_compiled *c, int k, dw_mem_item *it) {
    const int64_t off = c->param_off[k];
    *it = (dw_mem_item){.size = 4 * (dw_compile_grad_slice_end(c, k) - off), .first = dw_compile_grad_birth(c, k),
                        .last = c->n_times - 1, .align = 256, .fixed = true, .offset = c->grad_base + 4 * off};
}
