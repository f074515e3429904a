/* recompute.c — the logical times of the memory plan, and which forwards run twice. Without
 * recompute a node's forward is at time i and its backward at 2n-1-i. Under DW_RECOMPUTE_FULL
 * every transformer block keeps only what crosses its boundary (the residual stream, read by the
 * next block's norm in its backward, lives as before); its inner activations and saved parts are
 * written by the forward, dropped once the block's forward has read them, and written again —
 * the same values, to the same places — by the block's forwards run again just before the
 * block's backward. The arena (arena.c) gives such buffers two live intervals, so every block's
 * inner activations share the memory of one. recompute_blocks limits it to the first N blocks
 * (Megatron's "block" method: the memory of the rest at less extra compute).
 * Rematerialisation of single nodes, outside the recomputed blocks (dw_compile_remat): a node's
 * main output is not kept from the forward to the backward; its forward runs again just before
 * the first backward that reads it, from what is kept anyway. Only memory-bound, deterministic
 * nodes qualify, so the same bits come back and no GEMM or attention runs twice:
 * - MoE (dw_compile_opts.moe_remat, on by default): a MoE layer's input norm output x (B,T,C),
 *   dispatched rows (B,T*K,C) and experts' SwiGLU output (B,T*K,F), run again before the up
 *   projection's and the down projection's backward (x before the rows), from the norm's input
 *   and rstd and the gate and up outputs, which their own backwards keep;
 * - DW_RECOMPUTE_SELECTIVE (the planner's "selective": the GEMM inputs re-derived, cost.c): every
 *   norm whose output a linear layer reads (x (B,T,C), from the residual stream) and every MLP
 *   activation of linear outputs that its linear's epilogue does not compute (SwiGLU, GeGLU, GELU,
 *   ReLU, SiLU: (B,T,F), from the activation's input). With moe_remat off it leaves the MoE
 *   layers' dispatches and expert SwiGLUs kept: their memory for less time, the dense part's
 *   memory for little. */
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

/* Whether tensor t is an input of a linear layer (a dense GEMM). */
static bool linear_reads(const dw_graph *g, int t) {
    for (int k = 0; k < g->n_nodes; k++)
        if (g->nodes[k].op == DW_OP_LINEAR && g->nodes[k].in[0] == t) return true;
    return false;
}

/* MoE rematerialisation: a dispatch, the RMSNorm whose output a dispatch reads, an expert SwiGLU. */
static bool moe_remat(const dw_graph *g, int i) {
    const dw_ir_node *n = &g->nodes[i];
    if (n->op == DW_OP_MOE_DISPATCH) return true;
    if (n->op == DW_OP_RMSNORM) { /* a MoE layer's input norm: a dispatch reads its output */
        for (int k = i + 1; k < g->n_nodes; k++)
            if (g->nodes[k].op == DW_OP_MOE_DISPATCH && g->nodes[k].in[0] == n->out[0]) return true;
        return false;
    }
    const int p = n->op == DW_OP_SWIGLU ? g->tensors[n->in[0]].producer : -1; /* the experts' activation */
    return p >= 0 && g->nodes[p].op == DW_OP_MOE_LINEAR;
}

/* Selective recompute: a norm that feeds a linear layer, an MLP activation of a linear's output. */
static bool selective_remat(const dw_compiled *c, int i) {
    const dw_graph *g = c->g;
    const dw_ir_node *n = &g->nodes[i];
    switch (n->op) {
    case DW_OP_RMSNORM: case DW_OP_LAYERNORM: return linear_reads(g, n->out[0]);
    case DW_OP_SWIGLU: case DW_OP_GEGLU: case DW_OP_GELU: case DW_OP_GELU_ERF: case DW_OP_RELU: case DW_OP_SILU: {
        const int p = g->tensors[n->in[0]].producer;
        return p >= 0 && g->nodes[p].op == DW_OP_LINEAR && !(c->node[i].fused & DW_FUSED_FWD);
    }
    default: return false;
    }
}

bool dw_compile_remat(const dw_compiled *c, int i) {
    if (dw_compile_recomputed(c, i)) return false; /* a recomputed block runs it again anyway */
    return (c->moe_remat && moe_remat(c->g, i)) || (c->recompute == DW_RECOMPUTE_SELECTIVE && selective_remat(c, i));
}

/* Whether node i's backward reads tensor t's value (ops.def: READS_IN of its slot, or READS_OUT). */
static bool bwd_reads(const dw_compiled *c, int i, int t) {
    const dw_ir_node *n = &c->g->nodes[i];
    const unsigned f = dw_op_flags(n->op);
    if ((f & DW_OPF_BWD_IN_FWD) || i == c->head_linear) return false; /* no backward of its own in the sweep */
    for (int s = 0; s < n->n_in; s++)
        if (n->in[s] == t && (f & DW_OPF_READS_IN(s))) return true;
    for (int k = 0; k < n->n_out && (f & DW_OPF_READS_OUT); k++)
        if (n->out[k] == t) return true;
    return false;
}

/* The node before whose backward rematerialised node j runs again: the first in the backward sweep
 * (the highest) whose backward reads j's main output, or before which a rematerialised consumer
 * of it runs again (then j runs first: reruns before one backward go in graph order). before[k]
 * for k > j already set; -1: nothing reads it again (dropped after the forward for good). */
static int rerun_before(const dw_compiled *c, int j, const int *before) {
    const dw_graph *g = c->g;
    const int t = g->nodes[j].out[0];
    int at = -1;
    for (int i = g->n_nodes - 1; i >= j && at < 0; i--)
        if (bwd_reads(c, i, t)) at = i;
    for (int k = j + 1; k < g->n_nodes; k++)
        for (int s = 0; s < g->nodes[k].n_in; s++)
            if (g->nodes[k].in[s] == t && before[k] > at) at = before[k];
    return at;
}

dw_status dw_compile_times(dw_ctx *ctx, dw_compiled *c, int recompute, int recompute_blocks) {
    const dw_graph *g = c->g;
    const int nn = g->n_nodes;
    if (recompute < DW_RECOMPUTE_NONE || recompute >= DW_RECOMPUTE_COUNT)
        return dw_set_error(ctx, DW_ERR_INVALID, "compile: recompute %d is not a dw_recompute (none %d, selective "
                            "%d, full %d)", recompute, DW_RECOMPUTE_NONE, DW_RECOMPUTE_SELECTIVE, DW_RECOMPUTE_FULL);
    if (recompute_blocks < 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "compile: recompute_blocks %d is negative (0: every block)",
                            recompute_blocks);
    if (recompute_blocks > 0 && recompute != DW_RECOMPUTE_FULL)
        return dw_set_error(ctx, DW_ERR_INVALID, "compile: recompute_blocks %d needs recompute full (it limits "
                            "full recompute to the first blocks); recompute is %s", recompute_blocks,
                            dw_recompute_name((dw_recompute)recompute));
    c->recompute = recompute;
    c->recompute_blocks = recompute_blocks > 0 && recompute_blocks < g->model.n_blocks ? recompute_blocks
                                                                                        : (int)g->model.n_blocks;
    const size_t cap = (size_t)(nn ? nn : 1);
    c->bwd_t = malloc(cap * sizeof *c->bwd_t);
    c->rc_t = malloc(cap * sizeof *c->rc_t);
    c->sweep = malloc(2 * cap * sizeof *c->sweep);
    if (!c->bwd_t || !c->rc_t || !c->sweep) return dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
    int *remat_before = malloc(cap * sizeof *remat_before); /* rematerialised node j: the node it precedes */
    if (!remat_before) return dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
    int t = nn, k = 0;
    for (int i = 0; i < nn; i++) c->rc_t[i] = -1;
    for (int j = nn - 1; j >= 0; j--) remat_before[j] = dw_compile_remat(c, j) ? rerun_before(c, j, remat_before) : -1;
    for (int i = nn - 1; i >= 0; i--) {
        const int b = g->nodes[i].block;
        if (recompute == DW_RECOMPUTE_FULL && b >= 0 && b < c->recompute_blocks &&
            (i == nn - 1 || g->nodes[i + 1].block != b)) {
            int first = i; /* the block's nodes are consecutive: its forwards again, in order */
            while (first > 0 && g->nodes[first - 1].block == b) first--;
            for (int j = first; j <= i; j++)
                if (dw_compile_recomputed(c, j)) c->rc_t[j] = t++, c->sweep[k++] = -(j + 1);
        }
        for (int j = 0; j <= i; j++) /* rematerialised outputs this backward reads, in graph order */
            if (remat_before[j] == i) c->rc_t[j] = t++, c->sweep[k++] = -(j + 1);
        c->bwd_t[i] = t++;
        c->sweep[k++] = i;
    }
    free(remat_before);
    c->n_times = t;
    return DW_OK;
}
