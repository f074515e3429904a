/* params.c — the parameter pools: every parameter at a 64-float (256-byte) aligned offset shared
 * by the FP32 master, gradient, AdamW m and v (weight-decay parameters first, so AdamW treats one
 * prefix as decayed), and, in BF16 mode, which parameters keep a standing BF16 working copy and
 * the runs of floats that copy refreshes after each update. */
#include <stdlib.h>
#include <string.h>

#include "compile/passes.h"
#include "core/error.h"

dw_status dw_compile_params(dw_ctx *ctx, dw_compiled *c) {
    const dw_graph *g = c->g;
    for (int i = 0; i < g->n_tensors; i++) {
        c->tensor[i].param = -1;
        if (g->tensors[i].kind == DW_TENSOR_PARAM) c->n_params++;
    }
    size_t np = (size_t)(c->n_params ? c->n_params : 1);
    c->param_tensor = malloc(np * sizeof *c->param_tensor);
    c->param_off = malloc(np * sizeof *c->param_off);
    if (!c->param_tensor || !c->param_off) return dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
    int p = 0;
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].kind == DW_TENSOR_PARAM) c->tensor[i].param = p, c->param_tensor[p++] = i;
    int64_t off = 0;
    for (int pass = 0; pass < 2; pass++) { /* decay parameters first, then the rest */
        for (p = 0; p < c->n_params; p++) {
            const dw_ir_tensor *t = &g->tensors[c->param_tensor[p]];
            if (t->decay != (pass == 0)) continue;
            c->param_off[p] = off;
            off = dw_align_up(off + dw_ir_numel(t), 64);
        }
        if (pass == 0) c->decay_floats = off;
    }
    c->param_floats = off > 0 ? off : 64;
    return DW_OK;
}

static int by_begin(const void *a, const void *b) {
    int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
    return x < y ? -1 : x > y;
}

/* Which parameters keep a standing BF16 copy (BF16 mode): only linear layers and MoE experts read
 * it (the other ops read the FP32 masters), so every parameter but the weight of a quantised layer
 * whose fprop and dgrad both run quantised at the planned shape (those are converted on use; MoE
 * experts' passes never fall back at run time). llama-1b under
 * fp8_block: no weight matrix at all, 1.2e9 floats not converted per update. Runs: consecutive
 * kept parameters merged (the padding between them, < 64 floats, converted along). */
dw_status dw_compile_bf16_copies(dw_ctx *ctx, dw_compiled *c) {
    const dw_graph *g = c->g;
    const int np = c->n_params;
    c->bf16_lazy = calloc((size_t)(np ? np : 1), sizeof *c->bf16_lazy);
    c->bf16_runs = malloc((size_t)(np ? np : 1) * sizeof *c->bf16_runs);
    if (!c->bf16_lazy || !c->bf16_runs) return dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
    c->n_bf16_runs = 0;
    if (!c->bf16) return DW_OK;
    for (int i = 0; i < g->n_nodes; i++) { /* a weight read by another node than quantised linears stays */
        const dw_ir_node *n = &g->nodes[i];
        const dw_node_binding *b = &c->node[i].bind; /* MoE experts too: their passes are decided once */
        if ((!DW_OP_IS(n, DW_OPF_GEMM) && n->op != DW_OP_MOE_LINEAR) || !dw_compile_quant_recipe(b->recipe)) continue;
        if (b->quantised[DW_QPASS_FPROP] && b->quantised[DW_QPASS_DGRAD])
            c->bf16_lazy[c->tensor[n->in[1]].param] = true;
    }
    for (int i = 0; i < g->n_nodes; i++) { /* ... unless a BF16 linear layer reads it too */
        const dw_ir_node *n = &g->nodes[i];
        if (DW_OP_IS(n, DW_OPF_GEMM) && !dw_compile_quant_recipe(c->node[i].bind.recipe))
            c->bf16_lazy[c->tensor[n->in[1]].param] = false;
    }
    int n = 0;
    for (int p = 0; p < np; p++)
        if (!c->bf16_lazy[p]) {
            const int64_t numel = dw_ir_numel(&g->tensors[c->param_tensor[p]]);
            c->bf16_runs[n][0] = c->param_off[p], c->bf16_runs[n++][1] = c->param_off[p] + numel;
        }
    qsort(c->bf16_runs, (size_t)n, sizeof *c->bf16_runs, by_begin);
    for (int r = 0; r < n; r++) {
        int64_t *last = c->n_bf16_runs ? c->bf16_runs[c->n_bf16_runs - 1] : NULL;
        if (last && c->bf16_runs[r][0] - last[1] < 64) last[1] = c->bf16_runs[r][1];
        else memmove(c->bf16_runs[c->n_bf16_runs++], c->bf16_runs[r], sizeof *c->bf16_runs);
    }
    return DW_OK;
}
