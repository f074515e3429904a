/* recompute.c — the logical times of the memory plan, and which forwards run twice. Without
 * recompute a node's forward is at time i and its backward at 2n-1-i. Under DW_RECOMPUTE_FULL
 * every transformer block keeps only what crosses its boundary (the residual stream, read by the
 * next block's norm in its backward, lives as before); its inner activations and saved parts are
 * written by the forward, dropped once the block's forward has read them, and written again —
 * the same values, to the same places — by the block's forwards run again just before the
 * block's backward. The arena (arena.c) gives such buffers two live intervals, so every block's
 * inner activations share the memory of one. recompute_blocks limits it to the first N blocks
 * (Megatron's "block" method: the memory of the rest at less extra compute). */
#include <stdlib.h>

#include "compile/passes.h"
#include "core/error.h"

bool dw_compile_recomputed(const dw_compiled *c, int i) {
    const dw_ir_node *n = &c->g->nodes[i];
    /* a forward that adds to the loss (the MoE auxiliary loss) or does its own backward (the
     * cross-entropy) must run once; a GELU in its linear's epilogue is run by that linear */
    const unsigned once = DW_OPF_SIDE_LOSS | DW_OPF_BWD_IN_FWD;
    return c->recompute == DW_RECOMPUTE_FULL && n->block >= 0 && n->block < c->recompute_blocks &&
           !(c->node[i].fused & DW_FUSED_FWD) &&
           !(dw_op_flags(n->op) & once);
}

dw_status dw_compile_times(dw_ctx *ctx, dw_compiled *c, int recompute, int recompute_blocks) {
    const dw_graph *g = c->g;
    const int nn = g->n_nodes;
    if (recompute != DW_RECOMPUTE_NONE && recompute != DW_RECOMPUTE_FULL)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "compile: recompute '%s' is not built; the executor runs "
                            "none or full (every block's activations recomputed from its input before its "
                            "backward)", dw_recompute_name((dw_recompute)recompute));
    if (recompute_blocks < 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "compile: recompute_blocks %d is negative (0: every block)",
                            recompute_blocks);
    c->recompute = recompute;
    c->recompute_blocks = recompute_blocks > 0 && recompute_blocks < g->model.n_blocks ? recompute_blocks
                                                                                        : (int)g->model.n_blocks;
    const size_t cap = (size_t)(nn ? nn : 1);
    c->bwd_t = malloc(cap * sizeof *c->bwd_t);
    c->rc_t = malloc(cap * sizeof *c->rc_t);
    c->sweep = malloc(2 * cap * sizeof *c->sweep);
    if (!c->bwd_t || !c->rc_t || !c->sweep) return dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
    int t = nn, k = 0;
    for (int i = 0; i < nn; i++) c->rc_t[i] = -1;
    for (int i = nn - 1; i >= 0; i--) {
        const int b = g->nodes[i].block;
        if (recompute == DW_RECOMPUTE_FULL && b >= 0 && b < c->recompute_blocks &&
            (i == nn - 1 || g->nodes[i + 1].block != b)) {
            int first = i; /* the block's nodes are consecutive: its forwards again, in order */
            while (first > 0 && g->nodes[first - 1].block == b) first--;
            for (int j = first; j <= i; j++)
                if (dw_compile_recomputed(c, j)) c->rc_t[j] = t++, c->sweep[k++] = -(j + 1);
        }
        c->bwd_t[i] = t++;
        c->sweep[k++] = i;
    }
    c->n_times = t;
    return DW_OK;
}
