/* workspace.c — the workspace pool: the step's inputs (tokens, targets), the loss, the optimizer's
 * reductions and arguments (with the experts' wgrad share of the norm), the BF16 wgrad's
 * bias-gradient row, and for quantised linear layers the per-step operand slots (x, dy; dy^T;
 * x^T), the quantiser's scratch and each node's cached W and W^T; the MoE layers' routing
 * counters. Sizes at capacity; byte offsets 256-aligned. */
#include "compile/passes.h"
#include "compile/wgrad_sumsq.h"
#include "core/error.h"
#include "gemm/grouped_fp8.h"
#include "gemm/grouped_mxfp8.h"
#include "ir/float_graph.h"
#include "kernels/cuda/nvfp4_cuda.h" /* DW_NVFP4_CUDA_WORKSPACE_BYTES (plain C) */
#include "kernels/cuda/ops_cuda.h"   /* DW_MOE_AUX_PART_BYTES */

/* Sizes of a quantised slot: the largest codes and scales of the operands it holds. */
typedef struct {
    int64_t codes, scales;
} qsize;

static void qsize_fit(qsize *s, dw_recipe r, int64_t R, int64_t C) {
    int64_t cb = R * dw_quant_row_bytes(r, C), sb = (int64_t)dw_quant_scales_bytes(r, R, C);
    if (cb > s->codes) s->codes = cb;
    if (sb > s->scales) s->scales = sb;
}

/* Places a slot of size s at *o (codes, scales, then the NVFP4 tensor scale); off -1 when empty. */
static dw_qslot_layout qslot_place(qsize s, int64_t *o) {
    dw_qslot_layout l = {.off = -1, .scales = 0, .tscale = 0, .bytes = 0};
    if (s.codes == 0) return l;
    l.off = *o, l.codes_act = -1;
    l.scales = dw_align_up(s.codes, 256);
    l.tscale = l.scales + dw_align_up(s.scales, 256);
    l.bytes = l.tscale + 256;
    *o += l.bytes;
    return l;
}

static bool quantised_linear(const dw_compiled *c, int i) {
    return DW_OP_IS(&c->g->nodes[i], DW_OPF_GEMM) && c->bf16 && dw_compile_quant_recipe(c->node[i].bind.recipe);
}

/* wcache_arena: the byte in the activation pool of the BF16 copy's room of MoE node i's weight,
 * whose 2 bytes an element hold the cache's W and W^T codes, where the weight keeps no copy
 * (bf16_lazy: fprop and dgrad quantised) yet has the room (live to its readers' last pass:
 * grad_arena.c); -1 otherwise. */
static int64_t wcache_room(const dw_compiled *c, int i) {
    const int k = c->tensor[c->g->nodes[i].in[1]].param;
    dw_mem_item it;
    if (!c->wcache_arena || k < 0 || !c->bf16_lazy[k] || !dw_compile_bf16_item(c, k, &it)) return -1;
    return it.size == 2 * dw_ir_numel(&c->g->tensors[c->param_tensor[k]]) && it.offset % 128 == 0 ? it.offset : -1;
}

/* A MoE linear layer (bind_grouped.c) with a pass in fp8_block: x [R,K] and dy [R,M] 1x128 along
 * their rows in the rows slot (fprop, dgrad); an fp8_block wgrad's dy^T [M,P] and x^T [K,P] in the
 * dy^T and x^T slots, each expert's rows padded to 128 (P: grouped_fp8.h); its cached W [E,M,K]
 * and W^T [E,K,M] codes with their 128x128 scales per expert (E M/128 K/128 floats). In mxfp8 the
 * same slots with 1x32 UE8M0 blocks: groups padded to 32 (grouped_mxfp8.h), E M K/32 scale bytes
 * for W and for W^T. Under wcache_arena the codes in the weight's BF16 room instead. */
static void layout_moe_fp8(dw_compiled *c, int i, qsize *rows, qsize *dyt, qsize *xt, int64_t *o) {
    const dw_node_binding *b = &c->node[i].bind;
    if (!b->quantised[DW_QPASS_FPROP] && !b->quantised[DW_QPASS_DGRAD] && !b->quantised[DW_QPASS_WGRAD]) return;
    const dw_ir_tensor *w = &c->g->tensors[c->g->nodes[i].in[1]];
    const int64_t R = c->tensor[c->g->nodes[i].in[0]].rows_cap, E = w->shape[0], M = w->shape[1], K = w->shape[2];
    const dw_recipe r = dw_compile_quant_act_recipe(b->recipe); /* fp8_block or mxfp8 */
    const bool mx = r == DW_RECIPE_MXFP8;
    if (b->quantised[DW_QPASS_FPROP] || b->quantised[DW_QPASS_DGRAD]) {
        qsize_fit(rows, r, R, K);
        qsize_fit(rows, r, R, M);
    }
    if (b->quantised[DW_QPASS_WGRAD]) {
        const int64_t P = mx ? dw_grouped_mxfp8_wgrad_cols(R, E) : dw_grouped_fp8_wgrad_cols(R, E);
        qsize_fit(dyt, r, M, P);
        qsize_fit(xt, r, K, P);
    }
    if (!b->quantised[DW_QPASS_FPROP] && !b->quantised[DW_QPASS_DGRAD]) return; /* no weight read quantised */
    const qsize wsz = {E * M * K, mx ? E * M * K / 32 : E * (M / 128) * (K / 128) * 4};
    int64_t room;
    if ((room = wcache_room(c, i)) >= 0) { /* the codes in the copy's room, the scales here */
        const qsize scales = {wsz.scales, 0};
        for (int t = 0; t < 2; t++) {
            c->node[i].wq[t] = qslot_place(scales, o);
            c->node[i].wq[t].scales = 0, c->node[i].wq[t].codes_act = room + t * E * M * K;
        }
        return;
    }
    c->node[i].wq[0] = qslot_place(wsz, o);
    c->node[i].wq[1] = qslot_place(wsz, o);
}

/* The per-step operand slots (x, dy; dy^T; x^T), the quantiser's scratch, and each quantised
 * node's cached W and W^T (dense linear layers and fp8_block MoE experts alike). */
static void layout_quant(dw_compiled *c, int64_t *o) {
    const dw_graph *g = c->g;
    dw_work_layout *w = &c->work;
    qsize rows = {0, 0}, dyt = {0, 0}, xt = {0, 0};
    int64_t ws = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        c->node[i].wq[0].off = c->node[i].wq[1].off = c->node[i].wq[0].codes_act = c->node[i].wq[1].codes_act = -1;
        if (c->g->nodes[i].op == DW_OP_MOE_LINEAR) layout_moe_fp8(c, i, &rows, &dyt, &xt, o);
        if (!quantised_linear(c, i)) continue;
        int64_t N, K, M;
        dw_compile_linear_dims(c, i, &N, &K, &M);
        if (i == c->head_linear) N = c->head_chunk; /* a fused head quantises a chunk of rows at a time */
        const dw_recipe r = c->node[i].bind.recipe;
        const dw_recipe rw = dw_compile_quant_weight_recipe(r), ra = dw_compile_quant_act_recipe(r); /* W's; x's, dy's */
        qsize_fit(&rows, ra, N, K);
        qsize_fit(&rows, ra, N, M);
        qsize_fit(&dyt, ra, M, N);
        qsize_fit(&xt, ra, K, N);
        qsize wsz = {0, 0}, wtsz = {0, 0};
        qsize_fit(&wsz, rw, M, K);
        qsize_fit(&wtsz, rw, K, M);
        c->node[i].wq[0] = qslot_place(wsz, o);
        c->node[i].wq[1] = qslot_place(wtsz, o);
        const int64_t dims[6][2] = {{N, K}, {K, N}, {M, K}, {K, M}, {N, M}, {M, N}};
        for (int d = 0; d < 6; d++) { /* the quantiser's amax scratch: at most fp8_row's (1 + R + C) words */
            int64_t b = (1 + dims[d][0] + dims[d][1]) * 4;
            if (b > ws) ws = b;
        }
        if (r == DW_RECIPE_NVFP4 && ws < DW_NVFP4_CUDA_WORKSPACE_BYTES) ws = DW_NVFP4_CUDA_WORKSPACE_BYTES; /* recipe quantiser */
    }
    w->q_rows = qslot_place(rows, o);
    w->q_dyt = qslot_place(dyt, o);
    w->q_xt = qslot_place(xt, o);
    w->quant_ws = ws ? *o : -1, w->quant_ws_bytes = dw_align_up(ws, 256), *o += w->quant_ws_bytes;
    int64_t glu = 0; /* SwiGLU backwards writing fp8_block gradients: their four scale arrays */
    const int64_t N = g->batch * g->seq;
    for (int i = 0; i < g->n_nodes; i++) {
        int layers[2];
        if (!dw_compile_swiglu_bwd_quant(c, i, N, layers)) continue;
        const dw_ir_tensor *h = &g->tensors[g->nodes[i].out[0]];
        const int64_t bytes = 4 * (N / 128 * h->shape[h->ndim - 1]) * 4;
        if (bytes > glu) glu = bytes;
    }
    w->glu_scales = glu ? *o : -1, w->glu_scales_bytes = dw_align_up(glu, 256), *o += w->glu_scales_bytes;
    int64_t glu_rows = 0; /* expert SwiGLU (combine) backwards writing their gradients' (their dy's) fp8_block rows */
    for (int i = 0; i < g->n_nodes; i++) {
        if (dw_compile_combine_bwd_moe_rows(c, i) >= 0) {
            const dw_ir_tensor *ys = &g->tensors[g->nodes[i].in[0]];
            int64_t codes, scales; /* the down layer's dy rows */
            dw_compile_glu_rows_piece(c->tensor[g->nodes[i].in[0]].rows_cap, ys->shape[ys->ndim - 1], &codes, &scales);
            if (codes + scales > glu_rows) glu_rows = codes + scales;
        }
        int layers[2];
        if (!dw_compile_swiglu_bwd_moe_rows(c, i, layers)) continue;
        const dw_ir_tensor *h = &g->tensors[g->nodes[i].out[0]];
        int64_t codes, scales; /* dgate's and dup's rows */
        dw_compile_glu_rows_piece(c->tensor[g->nodes[i].in[0]].rows_cap, h->shape[h->ndim - 1], &codes, &scales);
        if (2 * (codes + scales) > glu_rows) glu_rows = 2 * (codes + scales);
    }
    w->glu_rows = glu_rows ? *o : -1, w->glu_rows_bytes = glu_rows, *o += w->glu_rows_bytes;
}

dw_status dw_compile_workspace(dw_ctx *ctx, dw_compiled *c) {
    (void)ctx;
    const int64_t N = c->g->batch * c->g->seq;
    dw_work_layout *w = &c->work;
    int64_t o = 0;
    /* tokens (N) int32, or a feed-forward graph's input (N, C_in) in the activations' dtype */
    const int64_t in_bytes = dw_graph_float_input(c->g) ? N * dw_graph_input_width(c->g) * c->act_size : N * 4;
    w->tokens = o, o = dw_align_up(o + in_bytes, 256);
    w->targets = o, o = dw_align_up(o + N * 4, 256);
    w->loss = o, o = dw_align_up(o + 4, 256);
    w->moe_aux = -1, w->moe_experts = 0;
    for (int i = 0; i < c->g->n_nodes; i++) /* the load-balancing loss: at most one node */
        if (DW_OP_IS(&c->g->nodes[i], DW_OPF_SIDE_LOSS)) {
            w->moe_experts = c->g->tensors[c->g->nodes[i].in[1]].shape[0];
            w->moe_aux = o, o = dw_align_up(o + 8 + 4 * w->moe_experts, 256);
        }
    int64_t aux_e = 0; /* the router-loss statistics' scratch: the widest of their nodes, shared (one runs at a time) */
    for (int i = 0; i < c->g->n_nodes; i++)
        if (c->g->nodes[i].op == DW_OP_MOE_AUX_STATS) {
            const dw_ir_tensor *z = &c->g->tensors[c->g->nodes[i].in[0]];
            if (z->shape[z->ndim - 1] > aux_e) aux_e = z->shape[z->ndim - 1];
        }
    w->moe_aux_part = aux_e ? o : -1;
    if (aux_e) o = dw_align_up(o + DW_MOE_AUX_PART_BYTES(aux_e), 256);
    w->moe_layers = w->moe_count_experts = 0;
    for (int i = 0; i < c->g->n_nodes; i++)
        if (c->g->nodes[i].op == DW_OP_MOE_DISPATCH) {
            w->moe_layers++;
            if (c->g->nodes[i].attrs.experts > w->moe_count_experts) w->moe_count_experts = c->g->nodes[i].attrs.experts;
        }
    w->moe_counts = w->moe_layers ? o : -1;
    o = dw_align_up(o + w->moe_layers * (DW_MOE_COUNT_LOAD + w->moe_count_experts) * 8, 256);
    w->moe_bias_layers = w->moe_bias_experts = 0; /* the routers' selection bias (off until set) */
    for (int i = 0; i < c->g->n_nodes; i++)
        if (c->g->nodes[i].op == DW_OP_MOE_ROUTER) {
            const dw_ir_tensor *z = &c->g->tensors[c->g->nodes[i].in[0]];
            w->moe_bias_layers++;
            if (z->shape[z->ndim - 1] > w->moe_bias_experts) w->moe_bias_experts = z->shape[z->ndim - 1];
        }
    w->moe_bias = w->moe_bias_layers ? o : -1;
    if (w->moe_bias_layers) o = dw_align_up(o + DW_MOE_BIAS_ROWS + w->moe_bias_layers * w->moe_bias_experts * 4, 256);
    w->norm = o, o = dw_align_up(o + 8, 256);
    w->partials = o, o = dw_align_up(o + DW_COMPILE_NORM_BLOCKS * 8, 256);
    w->adamw_args = o, o = dw_align_up(o + DW_COMPILE_ADAMW_ARGS_BYTES, 256);
    dw_compile_wsumsq_layout(c, &o); /* the experts' wgrad share of the norm (wgrad_sumsq.h) */
    int64_t widest = 0; /* biased linear layers' output width */
    for (int i = 0; c->bf16 && i < c->g->n_nodes; i++) {
        const dw_ir_node *n = &c->g->nodes[i];
        const dw_ir_tensor *y = &c->g->tensors[n->out[0]];
        if (DW_OP_IS(n, DW_OPF_GEMM) && n->n_in == 3 && y->shape[y->ndim - 1] > widest) widest = y->shape[y->ndim - 1];
    }
    w->bgrad = widest ? o : -1, o = dw_align_up(o + widest * 4, 256);
    layout_quant(c, &o);
    w->bytes = o;
    return DW_OK;
}

int64_t dw_compile_moe_counts_of(const dw_compiled *c, int node) {
    if (c->work.moe_counts < 0 || c->g->nodes[node].op != DW_OP_MOE_DISPATCH) return -1;
    int64_t j = 0; /* the dispatch nodes before this one */
    for (int i = 0; i < node; i++) j += c->g->nodes[i].op == DW_OP_MOE_DISPATCH;
    return c->work.moe_counts + j * (DW_MOE_COUNT_LOAD + c->work.moe_count_experts) * 8;
}

int64_t dw_compile_moe_bias_of(const dw_compiled *c, int node) {
    if (c->work.moe_bias < 0 || c->g->nodes[node].op != DW_OP_MOE_ROUTER) return -1;
    int64_t j = 0; /* the router nodes before this one */
    for (int i = 0; i < node; i++) j += c->g->nodes[i].op == DW_OP_MOE_ROUTER;
    return c->work.moe_bias + DW_MOE_BIAS_ROWS + j * c->work.moe_bias_experts * 4;
}
