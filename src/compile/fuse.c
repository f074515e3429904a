/* fuse.c — the compile pass that moves GELU into the GEMM epilogues around it: its forward into
 * the producing linear's fprop (GELU_AUX; for a quantised linear the engine uses the epilogue when
 * a kernel of the recipe has it and runs the GELU right after the GEMM otherwise), its backward
 * into the consuming BF16 linear's dgrad (DGELU). Decides only; the memory plan (compile.c) and
 * the engine read the result. */
#include <stdlib.h>
#include <string.h>

#include "compile/compile.h"
#include "core/error.h"

static int64_t width(const dw_graph *g, int t) { return g->tensors[t].shape[g->tensors[t].ndim - 1]; }

/* The one node reading tensor t (slot *slot), or -1 when none or several read it. */
static int sole_consumer(const dw_graph *g, int t, int *slot) {
    int found = -1;
    for (int i = 0; i < g->n_nodes; i++)
        for (int s = 0; s < g->nodes[i].n_in; s++)
            if (g->nodes[i].in[s] == t) {
                if (found >= 0) return -1;
                found = i, *slot = s;
            }
    return found;
}

static bool bf16_linear(const dw_compiled *c, int i) {
    return i >= 0 && c->g->nodes[i].op == DW_OP_LINEAR && c->bind[i].recipe == DW_RECIPE_BF16;
}
static bool any_linear(const dw_compiled *c, int i) { return i >= 0 && c->g->nodes[i].op == DW_OP_LINEAR; }

dw_status dw_compile_fuse(dw_ctx *ctx, dw_compiled *c) {
    const dw_graph *g = c->g;
    const int nn = g->n_nodes;
    c->fused = calloc((size_t)(nn ? nn : 1), sizeof *c->fused);
    c->gelu_producer = malloc((size_t)(nn ? nn : 1) * sizeof *c->gelu_producer);
    c->gelu_consumer = malloc((size_t)(nn ? nn : 1) * sizeof *c->gelu_consumer);
    if (!c->fused || !c->gelu_producer || !c->gelu_consumer)
        return dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
    const char *env = getenv("DW_FUSE");
    const bool on = c->bf16 && !(env && !strcmp(env, "0"));
    for (int i = 0; i < nn; i++) {
        c->gelu_producer[i] = c->gelu_consumer[i] = -1;
        const dw_ir_node *n = &g->nodes[i];
        if (!on || n->op != DW_OP_GELU) continue;
        const int in = n->in[0];
        const int L = g->tensors[in].producer;
        if (any_linear(c, L) && width(g, in) % 8 == 0) { /* quantised too: fused or GELU after, per kernel */
            c->fused[i] |= DW_FUSED_FWD;
            c->gelu_producer[i] = L;
        }
        int slot = -1, P = sole_consumer(g, n->out, &slot);
        if (bf16_linear(c, P) && slot == 0 && c->grad_mode[P][0] == DW_GRAD_WRITE &&
            c->grad_mode[i][0] == DW_GRAD_WRITE && width(g, in) % 8 == 0) {
            c->fused[i] |= DW_FUSED_BWD;
            c->gelu_consumer[i] = P;
        }
    }
    return DW_OK;
}

int dw_compile_fused_gelu_fwd(const dw_compiled *c, int linear) {
    for (int i = 0; c->fused && i < c->g->n_nodes; i++)
        if ((c->fused[i] & DW_FUSED_FWD) && c->gelu_producer[i] == linear) return i;
    return -1;
}

int dw_compile_fused_gelu_bwd(const dw_compiled *c, int linear) {
    for (int i = 0; c->fused && i < c->g->n_nodes; i++)
        if ((c->fused[i] & DW_FUSED_BWD) && c->gelu_consumer[i] == linear) return i;
    return -1;
}
