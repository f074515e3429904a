/* fuse.c — the compile pass that moves GELU into the GEMM epilogues around it: its forward into
 * the producing linear's fprop (GELU_AUX; for a quantised linear the backends use the epilogue
 * when a kernel of the recipe has it and run the GELU right after the GEMM otherwise), its
 * backward into the consuming linear's dgrad (DGELU) where that dgrad runs BF16 (a BF16 linear,
 * or a quantised one whose policy rule keeps its dgrad BF16); and, with fused_head, the LM head
 * linear and the cross-entropy into one head_xent op over chunks of rows (Liger-Kernel's fused
 * linear cross-entropy). Decides only (program.h: fused, partner_fwd, partner_bwd, head_*); the
 * arena, the steps and the backends read the result. Also which fp8_block linear layer a SwiGLU
 * can quantise its output for (dw_compile_swiglu_quant_reader), and whether its backward can write
 * its gradients as the gate and up layers' fp8_block dy (dw_compile_swiglu_bwd_quant), or, for a
 * MoE layer's experts, their dgrad's fp8_block rows beside the BF16 gradients
 * (dw_compile_swiglu_bwd_moe_rows), and the combine's backward the down layer's
 * (dw_compile_combine_bwd_moe_rows); and which linear layers' fp8_block rows a norm or a GELU
 * run after its linear layer can write (dw_compile_norm_quant_reader, dw_compile_gelu_quant_reader). */
#include <stdlib.h>
#include <string.h>

#include "compile/head_chunk.h"
#include "compile/passes.h"
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

static bool any_linear(const dw_compiled *c, int i) { return i >= 0 && DW_OP_IS(&c->g->nodes[i], DW_OPF_GEMM); }
/* Whether linear node i's dgrad runs BF16 at every batch: its recipe is BF16, or its policy rule
 * keeps the dgrad BF16 (bind.bf16_passes; a registry fallback may depend on the rows, this not). */
static bool dgrad_bf16(const dw_compiled *c, int i) {
    if (!any_linear(c, i)) return false;
    const dw_node_binding *b = &c->node[i].bind;
    return b->recipe == DW_RECIPE_BF16 || dw_policy_keeps_bf16(b->bf16_passes, b->rule, DW_QPASS_DGRAD, NULL, 0);
}

/* Whether a head in recipe r computes each chunk of rows as the whole does: BF16, or a recipe
 * without a scale over the whole tensor, whose x and dy blocks lie in one row (1x128, 1x32) and
 * whose dy^T and x^T blocks span at most 128 tokens, which chunks of a multiple of 128 rows never
 * split. Not fp8_tensor, fp8_row (dy^T's scale over all the tokens) or nvfp4 (its tensor scale). */
static bool head_chunks_exact(dw_recipe r) {
    return r == DW_RECIPE_BF16 || r == DW_RECIPE_FP8_BLOCK || r == DW_RECIPE_FP8_BLOCK2D || r == DW_RECIPE_MXFP8 ||
           r == DW_RECIPE_MXFP8_E5M2 || r == DW_RECIPE_MXFP4;
}

/* The LM head into the loss: the loss node L (cross-entropy of the graph's logits) and the linear H
 * producing them become one head_xent node when the logits have no other reader, H has no bias
 * and runs in BF16 or a block-scaled recipe that chunks exactly (any recipe in an FP32 program),
 * and H's backward is the first to write x's gradient (head_xent writes it in the forward, before
 * every other backward adds in). A quantised head's chunks are rounded up to a multiple of 128
 * rows. A soft-cap or anything else between the head and the loss leaves them apart. */
static void fuse_head(dw_compiled *c) {
    const dw_graph *g = c->g;
    if (g->loss < 0) return; /* a feed-forward graph: no loss */
    const int L = g->tensors[g->loss].producer, H = g->tensors[g->logits].producer;
    int slot = -1;
    if (L < 0 || H < 0 || g->nodes[L].op != DW_OP_CROSS_ENTROPY || g->nodes[L].in[0] != g->logits) return;
    if (g->nodes[H].op != DW_OP_LINEAR || g->nodes[H].n_in != 2 || sole_consumer(g, g->logits, &slot) != L) return;
    const dw_recipe r = c->node[H].bind.recipe;
    if (c->bf16 && !head_chunks_exact(r)) return;
    const int x = g->nodes[H].in[0];
    if (g->tensors[x].kind != DW_TENSOR_ACT || c->node[H].grad_mode[0] != DW_GRAD_WRITE) return;
    c->head_xent = L, c->head_linear = H;
    c->node[L].fused |= DW_FUSED_HEAD;
    c->node[H].fused |= DW_FUSED_HEAD;
    dw_ir_node *n = &c->head_node;
    *n = g->nodes[L]; /* the loss node's name, block and output */
    n->op = DW_OP_HEAD_XENT;
    n->n_in = 3;
    n->in[0] = x, n->in[1] = g->nodes[H].in[1], n->in[2] = g->targets;
    c->node[L].grad_mode[0] = DW_GRAD_WRITE; /* x's gradient, as the head's backward would */
    c->node[L].grad_mode[1] = c->node[L].grad_mode[2] = DW_GRAD_NONE;
    c->node[H].grad_mode[0] = DW_GRAD_NONE;
    const int64_t N = g->batch * g->seq;
    c->head_chunk = dw_head_chunk_rows(N, width(g, x), width(g, g->logits), c->head_chunk_want);
    if (c->bf16 && r != DW_RECIPE_BF16 && c->head_chunk < N) c->head_chunk = (c->head_chunk + 127) / 128 * 128;
    if (c->head_chunk > N) c->head_chunk = N;
}

dw_status dw_compile_fuse(dw_ctx *ctx, dw_compiled *c) {
    (void)ctx;
    const dw_graph *g = c->g;
    if (c->fused_head) fuse_head(c);
    const bool on = c->bf16 && c->fuse;
    for (int i = 0; i < g->n_nodes; i++) c->node[i].partner_fwd = c->node[i].partner_bwd = -1;
    for (int i = 0; on && i < g->n_nodes; i++) {
        const dw_ir_node *n = &g->nodes[i];
        if (!DW_OP_IS(n, DW_OPF_EPILOGUE)) continue;
        const int in = n->in[0];
        const int L = g->tensors[in].producer;
        if (any_linear(c, L) && width(g, in) % 8 == 0) { /* quantised too: fused or GELU after, per kernel */
            c->node[i].fused |= DW_FUSED_FWD;
            c->node[i].partner_fwd = L;
            c->node[L].partner_fwd = i;
        }
        int slot = -1, P = sole_consumer(g, n->out[0], &slot);
        if (dgrad_bf16(c, P) && slot == 0 && c->node[P].grad_mode[0] == DW_GRAD_WRITE &&
            c->node[i].grad_mode[0] == DW_GRAD_WRITE && width(g, in) % 8 == 0) {
            c->node[i].fused |= DW_FUSED_BWD;
            c->node[i].partner_bwd = P;
            c->node[P].partner_bwd = i;
        }
    }
    return DW_OK;
}

int dw_compile_swiglu_quant_reader(const dw_compiled *c, int i, int64_t rows) {
    const dw_graph *g = c->g;
    if (!c->bf16 || c->target.device != DW_DEVICE_CUDA || g->nodes[i].op != DW_OP_SWIGLU) return -1;
    const int h = g->nodes[i].out[0];
    int slot = -1;
    const int L = sole_consumer(g, h, &slot);
    if (L < 0 || slot != 0 || width(g, h) % 128) return -1;
    const dw_node_binding *b = &c->node[L].bind;
    if (dw_compile_quant_act_recipe(b->recipe) != DW_RECIPE_FP8_BLOCK) return -1;
    if (g->nodes[L].op == DW_OP_MOE_LINEAR) return b->quantised[DW_QPASS_FPROP] ? L : -1;
    return g->nodes[L].op == DW_OP_LINEAR && dw_compile_linear_quantised(c, L, DW_QPASS_FPROP, rows, NULL, NULL, 0)
               ? L
               : -1;
}

/* The first (in node order) of the linear layers reading tensor y, each as its x with its fprop
 * quantised in fp8_block at `rows` tokens, or -1 when another node reads y or none does. */
static int first_fp8_reader(const dw_compiled *c, int y, int64_t rows) {
    const dw_graph *g = c->g;
    int first = -1;
    for (int j = 0; j < g->n_nodes; j++)
        for (int s = 0; s < g->nodes[j].n_in; s++) {
            if (g->nodes[j].in[s] != y) continue;
            if (s != 0 || g->nodes[j].op != DW_OP_LINEAR || j == c->head_linear || /* its chunks quantise x */
                dw_compile_quant_act_recipe(c->node[j].bind.recipe) != DW_RECIPE_FP8_BLOCK ||
                !dw_compile_linear_quantised(c, j, DW_QPASS_FPROP, rows, NULL, NULL, 0))
                return -1;
            if (first < 0) first = j;
        }
    return first;
}

int dw_compile_norm_quant_reader(const dw_compiled *c, int i, int64_t rows) {
    const dw_graph *g = c->g;
    if (!c->bf16 || c->target.device != DW_DEVICE_CUDA) return -1;
    if (g->nodes[i].op != DW_OP_RMSNORM && g->nodes[i].op != DW_OP_LAYERNORM) return -1;
    const int y = g->nodes[i].out[0];
    if (width(g, y) % 128 || width(g, y) > 8192) return -1; /* the kernel's rows: ops_cuda.h */
    return first_fp8_reader(c, y, rows);
}

int dw_compile_gelu_quant_reader(const dw_compiled *c, int i, int64_t rows) {
    const dw_graph *g = c->g;
    if (!c->bf16 || c->target.device != DW_DEVICE_CUDA || g->nodes[i].op != DW_OP_GELU) return -1;
    const int L = c->node[i].partner_fwd; /* run by the linear layer before it (dw_compile_fuse) */
    if (L < 0 || !(c->node[i].fused & DW_FUSED_FWD) || width(g, g->nodes[i].out[0]) % 128) return -1;
    return first_fp8_reader(c, g->nodes[i].out[0], rows);
}

bool dw_compile_swiglu_bwd_quant(const dw_compiled *c, int i, int64_t rows, int layers[2]) {
    const dw_graph *g = c->g;
    if (!c->bf16 || c->target.device != DW_DEVICE_CUDA || g->nodes[i].op != DW_OP_SWIGLU) return false;
    if (rows <= 0 || rows % 128 || width(g, g->nodes[i].out[0]) % 128) return false;
    for (int k = 0; k < 2; k++) {
        const int t = g->nodes[i].in[k], P = g->tensors[t].producer;
        int slot = -1;
        if (P < 0 || g->nodes[P].op != DW_OP_LINEAR || g->nodes[P].n_in != 2 || sole_consumer(g, t, &slot) != i ||
            slot != k)
            return false;
        /* the SwiGLU writes t's own gradient buffer, P's dy, and P's backward makes dx */
        if (c->node[i].grad_mode[k] != DW_GRAD_WRITE || c->tensor[t].grad_alias != t ||
            c->node[P].grad_mode[0] == DW_GRAD_NONE)
            return false;
        if (dw_compile_quant_act_recipe(c->node[P].bind.recipe) != DW_RECIPE_FP8_BLOCK ||
            !dw_compile_linear_quantised(c, P, DW_QPASS_DGRAD, rows, NULL, NULL, 0) ||
            !dw_compile_linear_quantised(c, P, DW_QPASS_WGRAD, rows, NULL, NULL, 0))
            return false;
        layers[k] = P;
    }
    return true;
}

/* The MoE experts' layer whose dy node i's backward can write as fp8_block rows through input k,
 * or -1: a moe_linear layer makes that input (width a multiple of 128) and i alone reads it, in
 * slot k; i writes its gradient into the input's own buffer; the layer makes a dx and runs its
 * dgrad in fp8_block. */
static int moe_dgrad_rows_layer(const dw_compiled *c, int i, int k) {
    const dw_graph *g = c->g;
    const int t = g->nodes[i].in[k], P = g->tensors[t].producer;
    int slot = -1;
    if (P < 0 || g->nodes[P].op != DW_OP_MOE_LINEAR || sole_consumer(g, t, &slot) != i || slot != k) return -1;
    if (width(g, t) % 128 || c->node[i].grad_mode[k] != DW_GRAD_WRITE || c->tensor[t].grad_alias != t ||
        c->node[P].grad_mode[0] == DW_GRAD_NONE)
        return -1;
    const dw_node_binding *b = &c->node[P].bind;
    return dw_compile_quant_act_recipe(b->recipe) == DW_RECIPE_FP8_BLOCK && b->quantised[DW_QPASS_DGRAD] ? P : -1;
}

bool dw_compile_swiglu_bwd_moe_rows(const dw_compiled *c, int i, int layers[2]) {
    const dw_graph *g = c->g;
    if (!c->bf16 || c->target.device != DW_DEVICE_CUDA || g->nodes[i].op != DW_OP_SWIGLU) return false;
    for (int k = 0; k < 2; k++)
        if ((layers[k] = moe_dgrad_rows_layer(c, i, k)) < 0) return false;
    return c->tensor[g->nodes[i].in[0]].rows_cap == c->tensor[g->nodes[i].in[1]].rows_cap;
}

int dw_compile_combine_bwd_moe_rows(const dw_compiled *c, int i) {
    const dw_graph *g = c->g;
    if (!c->bf16 || c->target.device != DW_DEVICE_CUDA || g->nodes[i].op != DW_OP_MOE_COMBINE) return -1;
    const int d = g->tensors[g->nodes[i].in[2]].producer; /* dropless: every row one assignment's */
    if (d < 0 || g->nodes[d].op != DW_OP_MOE_DISPATCH || g->nodes[d].attrs.capacity_factor > 0) return -1;
    return moe_dgrad_rows_layer(c, i, 0);
}

int dw_compile_fused_gelu_fwd(const dw_compiled *c, int linear) {
    return any_linear(c, linear) ? c->node[linear].partner_fwd : -1;
}

int dw_compile_fused_gelu_bwd(const dw_compiled *c, int linear) {
    return any_linear(c, linear) ? c->node[linear].partner_bwd : -1;
}
