/* grad_arena.c — gradients in the activation arena (dw_compile_opts.grad_arena; program.h): which
 * node's step writes each parameter's gradient first, and the arena items of the gradient slices:
 * the gradient pool's flat layout at a fixed place in the arena (so the norm, AdamW, data
 * parallelism's buckets and gradient reads see the pool they always saw), each parameter's slice
 * live from its first writer to the end of the sweep; with bf16_arena the BF16 working copies'
 * flat layout too, shifted against the gradients so that each copy, dead after its last reader,
 * lies where gradients born later go; and which first writers write their slice over instead
 * of adding into zeros (node[].pgrad_set). Decides only: arena.c places the items, steps.c zeroes
 * each slice (or its padding) before its first writer. */
#include <stdlib.h>

#include "compile/bind_grouped.h"
#include "compile/passes.h"
#include "core/error.h"

/* The logical time node i's step writes its parameters' gradients: its backward, or its forward
 * for an op doing its backward there (the fused LM head). */
static int write_time(const dw_compiled *c, int i) {
    return dw_op_flags(dw_compile_node(c, i)->op) & DW_OPF_BWD_IN_FWD ? dw_compile_fwd_time(c, i)
                                                                       : dw_compile_bwd_time(c, i);
}

/* Whether node i, parameter k's first writer, may write k's gradient over the slice (beta 0)
 * instead of adding into zeros: a BF16 program's linear layer with k as its weight (slot 1) and
 * in no other slot, whose wgrad (dw_gemm: BF16 or quantised, CPU and CUDA) writes all of W's
 * [M, K] floats, or MoE linear layer with k as its experts' weights W [E, M, K] (slot 1), whose
 * grouped wgrad (dw_grouped_args.overwrite) writes every expert's dW, zeros for an expert without
 * rows: BF16, fp8_block or mxfp8, CPU and CUDA (a wgrad bound to another recipe keeps the zeroing
 * until its kernels are shown to honour the flag). Writers after it add, in step order (one stream).
 * FP32 programs keep the zeroing (their reference wgrad kernels add), and so do the other ops
 * writing parameter gradients (norms, embeddings, biases, the fused head). */
static bool writes_over(const dw_compiled *c, int i, int k) {
    const dw_ir_node *n = dw_compile_node(c, i);
    if (!c->grad_arena || !c->bf16 || i == c->head_linear) return false;
    if (n->op == DW_OP_MOE_LINEAR && c->node[i].bind.quantised[DW_QPASS_WGRAD] &&
        dw_compile_moe_recipe(c, i) != DW_RECIPE_FP8_BLOCK && dw_compile_moe_recipe(c, i) != DW_RECIPE_MXFP8)
        return false;
    if (n->op != DW_OP_LINEAR && n->op != DW_OP_MOE_LINEAR) return false;
    for (int s = 0; s < n->n_in; s++)
        if ((c->tensor[n->in[s]].param == k) != (s == 1)) return false;
    return true;
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
    for (int k = 0; k < c->n_params; k++) {
        const int i = c->grad_first[k];
        if (i >= 0 && writes_over(c, i, k)) c->node[i].pgrad_set |= (uint8_t)(1u << 1);
    }
    return DW_OK;
}

int64_t dw_compile_grad_zero_from(const dw_compiled *c, int k) {
    const int i = c->grad_first[k];
    const bool over = i >= 0 && (c->node[i].pgrad_set >> 1 & 1u) && c->tensor[dw_compile_node(c, i)->in[1]].param == k;
    return c->param_off[k] + (over ? dw_ir_numel(&c->g->tensors[c->param_tensor[k]]) : 0);
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

/* ---- bf16_arena: the BF16 working copies beside the gradients --------------------------------- */
/* Whether node i reads its parameter inputs' BF16 working copies (the others read the masters). */
static bool reads_bf16(const dw_compiled *c, int i) {
    const dw_ir_node *n = dw_compile_node(c, i);
    return DW_OP_IS(n, DW_OPF_GEMM) || n->op == DW_OP_MOE_LINEAR || n->op == DW_OP_HEAD_XENT;
}

/* The last logical time parameter k's BF16 copy is read (a reader's forward, forward again or
 * backward), -1: never (its copy is written by the refresh and read by nothing). */
static int bf16_last(const dw_compiled *c, int k) {
    int last = -1;
    for (int i = 0; i < c->g->n_nodes; i++) {
        if (i == c->head_linear || !reads_bf16(c, i)) continue;
        const dw_ir_node *n = dw_compile_node(c, i);
        for (int s = 0; s < n->n_in; s++) {
            if (c->tensor[n->in[s]].param != k) continue;
            const int t[3] = {dw_compile_fwd_time(c, i), dw_compile_rc_time(c, i), dw_compile_bwd_time(c, i)};
            for (int q = 0; q < 3; q++) last = t[q] > last ? t[q] : last;
        }
    }
    return last;
}

bool dw_compile_bf16_item(const dw_compiled *c, int k, dw_mem_item *it) {
    const int last = c->bf16_arena ? bf16_last(c, k) : -1;
    if (last < 0) return false;
    const int64_t n = dw_ir_numel(&c->g->tensors[c->param_tensor[k]]);
    *it = (dw_mem_item){.size = 2 * n, .first = 0, .last = last, .align = 128, .fixed = true,
                        .offset = c->bf16_base + 2 * c->param_off[k]};
    return true;
}

bool dw_compile_wcache_below(const dw_compiled *c, int i) {
    const int64_t room = c->node[i].wq[0].codes_act; /* W and W^T codes: [room, room + 2 numel) */
    if (room < 0) return true;
    const int k = c->tensor[c->g->nodes[i].in[1]].param;
    return room + 2 * dw_ir_numel(&c->g->tensors[c->param_tensor[k]]) <= c->grad_base + 4 * c->param_off[k];
}

int dw_compile_wcache_layers(const dw_compiled *c) {
    int n = 0;
    for (int i = 0; c->node && i < c->g->n_nodes; i++) n += c->node[i].wq[0].codes_act >= 0;
    return n;
}

/* The first BF16 copy and gradient slice that share bytes while both live with the copies at
 * byte d past the gradients' base: the least shift above d that clears it, or -1 when none does. */
static int64_t next_shift(const dw_compiled *c, const int *last, int64_t d) {
    for (int k = 0; k < c->n_params; k++) {
        if (last[k] < 0) continue;
        const int64_t lo = d + 2 * c->param_off[k], hi = lo + 2 * dw_ir_numel(&c->g->tensors[c->param_tensor[k]]);
        for (int j = 0; j < c->n_params; j++) {
            const int64_t glo = 4 * c->param_off[j], ghi = 4 * dw_compile_grad_slice_end(c, j);
            if (hi <= glo || ghi <= lo || dw_compile_grad_birth(c, j) > last[k]) continue;
            return dw_align_up(d + (ghi - lo), 256); /* the copy moved just above that slice */
        }
    }
    return -1;
}

dw_status dw_compile_arena_bases(dw_ctx *ctx, dw_compiled *c) {
    c->grad_base = 0;
    if (!c->bf16_arena) return DW_OK;
    int *last = malloc((size_t)(c->n_params ? c->n_params : 1) * sizeof *last);
    if (!last) return dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
    for (int k = 0; k < c->n_params; k++) last[k] = bf16_last(c, k);
    /* the copies at the least shift d from the gradients where no copy meets a gradient slice
     * born before its last reader: a copy dies as the backward reaches its layer, when the
     * gradients of the layers before it (lower in the pool) are not born yet, so each copy sits
     * at or below its own gradient: from d = min(2 off - 2 numel), up; 4 param_floats always clears */
    int64_t d = 0, next;
    for (int k = 0; k < c->n_params; k++)
        if (last[k] >= 0) {
            const int64_t dk = 2 * c->param_off[k] - 2 * dw_ir_numel(&c->g->tensors[c->param_tensor[k]]);
            d = dk < d ? dk : d;
        }
    d = -dw_align_up(-d, 256);
    while (d < 4 * c->param_floats && (next = next_shift(c, last, d)) >= 0) d = next;
    free(last);
    c->grad_base = d < 0 ? -d : 0; /* the copies start at byte 0 then */
    c->bf16_base = c->grad_base + d;
    return DW_OK;
}
