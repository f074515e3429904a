/* steps.c — the program's step list and its phases: each node's forward in graph order (a GELU
 * done by its linear's epilogue has none), each node's backward in reverse (none where fused into
 * a dgrad or done by the forward, as the loss's; a fused LM head's linear has neither) — under recompute with each block's forwards run
 * again just before its backward; under grad_arena each parameter's gradient slice zeroed just
 * before its first writer, unless that writer writes it over (its padding then, if any) —, then
 * the optimizer (gradient norm, AdamW) and the refresh of what derives from the FP32 masters (BF16 copies, quantised weight caches). */
#include <stdlib.h>

#include "compile/passes.h"
#include "core/error.h"

const char *dw_step_kind_name(dw_step_kind k) {
    static const char *const names[DW_STEP_KIND_COUNT] = {"forward", "backward", "grad norm", "adamw",
                                                          "bf16 copy", "weight cache", "collective", "wait",
                                                          "zero grad"};
    return (unsigned)k < DW_STEP_KIND_COUNT ? names[k] : "?";
}

dw_status dw_compile_steps(dw_ctx *ctx, dw_compiled *c) {
    const dw_graph *g = c->g;
    const int nn = g->n_nodes;
    c->steps = malloc((size_t)(4 * nn + c->n_bf16_runs + c->n_params + 4) * sizeof *c->steps);
    if (!c->steps) return dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
    int n = 0;
#define STEP(k, nd, a) (c->steps[n++] = (dw_step){(uint8_t)(k), (nd), (a)})
/* grad_arena: the gradient slices node `writer` writes first (-1: those no step writes), zeroed
 * (a writer writing its slice over: the padding alone, where there is any) */
#define ZERO_GRADS(writer)                                                                               \
    for (int zk = 0; c->grad_arena && zk < c->n_params; zk++)                                          \
        if (c->grad_first[zk] == (writer) && dw_compile_grad_zero_from(c, zk) < dw_compile_grad_slice_end(c, zk)) \
            STEP(DW_STEP_ZERO_GRAD, (writer), zk);
    c->phase[DW_PHASE_FORWARD][0] = n;
    for (int i = 0; i < nn; i++) { /* a fused LM head's linear runs inside the loss's head_xent */
        if ((c->node[i].fused & DW_FUSED_FWD) || i == c->head_linear) continue;
        if (dw_op_flags(dw_compile_node(c, i)->op) & DW_OPF_BWD_IN_FWD) ZERO_GRADS(i);
        STEP(DW_STEP_FWD, i, 0);
    }
    c->phase[DW_PHASE_FORWARD][1] = c->phase[DW_PHASE_BACKWARD][0] = n;
    ZERO_GRADS(-1);
    for (int k = 0; k < c->n_times - nn; k++) { /* the backward sweep (recompute.c) */
        const int e = c->sweep[k], i = e < 0 ? -e - 1 : e;
        if (e < 0) {
            STEP(DW_STEP_FWD, i, 1); /* a recomputed block's forward, again */
            continue;
        }
        if (!(dw_op_flags(dw_compile_node(c, i)->op) & DW_OPF_BWD_IN_FWD)) ZERO_GRADS(i);
        if (!(c->node[i].fused & DW_FUSED_BWD) && !(dw_op_flags(g->nodes[i].op) & DW_OPF_BWD_IN_FWD) &&
            i != c->head_linear)
            STEP(DW_STEP_BWD, i, 0);
    }
#undef ZERO_GRADS
    c->phase[DW_PHASE_BACKWARD][1] = c->phase[DW_PHASE_OPTIMIZER][0] = n;
    STEP(DW_STEP_GRAD_NORM, -1, 0);
    STEP(DW_STEP_ADAMW, -1, 0);
    c->phase[DW_PHASE_REFRESH][0] = n;
    for (int r = 0; r < c->n_bf16_runs; r++) STEP(DW_STEP_CAST_BF16, -1, r);
    for (int i = 0; i < nn; i++)
        if (c->node[i].wq[0].off >= 0) STEP(DW_STEP_QUANT_W, i, 0);
    c->phase[DW_PHASE_REFRESH][1] = c->phase[DW_PHASE_OPTIMIZER][1] = n;
#undef STEP
    c->n_steps = n;
    return DW_OK;
}
