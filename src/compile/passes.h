/* passes.h — private to compile/: the passes dw_compile runs, in order, each filling part of the
 * program (program.h). bind.c: recipe and kernels per node; grads.c: how gradients are delivered
 * and shared; fuse.c: GELU into GEMM epilogues; params.c: parameter pools and BF16 copies;
 * op_parts.c: per-op saved and temporary sizes; recompute.c: the logical times (which forwards
 * run again before their block's backward); arena.c: the activation arena; workspace.c: the
 * workspace pool; steps.c: the step list. Callers outside compile/ read program.h. */
#ifndef DW_COMPILE_PASSES_H
#define DW_COMPILE_PASSES_H

#include "compile/program.h"
#include "deepwell.h"

dw_status dw_compile_bind(dw_ctx *ctx, dw_compiled *c, const dw_policy *policy);
dw_status dw_compile_times(dw_ctx *ctx, dw_compiled *c, int recompute, int recompute_blocks);
dw_status dw_compile_grad_modes(dw_ctx *ctx, dw_compiled *c);
dw_status dw_compile_fuse(dw_ctx *ctx, dw_compiled *c);
dw_status dw_compile_grad_alias(dw_ctx *ctx, dw_compiled *c);
dw_status dw_compile_params(dw_ctx *ctx, dw_compiled *c);
dw_status dw_compile_bf16_copies(dw_ctx *ctx, dw_compiled *c);
dw_status dw_compile_arena(dw_ctx *ctx, dw_compiled *c);
/* grad_arena.c: each parameter's first gradient writer (c->grad_first); its slice's fixed arena
 * item (grad_arena programs). */
dw_status dw_compile_grad_first(dw_ctx *ctx, dw_compiled *c);
void dw_compile_grad_slice_item(const dw_compiled *c, int k, dw_mem_item *it);
/* bf16_arena: the gradients' and the BF16 copies' bases in the arena (grad_base, bf16_base), and
 * parameter k's BF16 copy as a fixed item (false: it has none there, read by no step). */
dw_status dw_compile_arena_bases(dw_ctx *ctx, dw_compiled *c);
bool dw_compile_bf16_item(const dw_compiled *c, int k, dw_mem_item *it);
dw_status dw_compile_workspace(dw_ctx *ctx, dw_compiled *c);
dw_status dw_compile_steps(dw_ctx *ctx, dw_compiled *c);

/* Bytes of node i's saved (aux) and temporary parts at capacity, from its op's parts_<name>
 * rule (op_parts.c) plus the ACC temporaries its gradient modes need. */
void dw_compile_node_parts(const dw_compiled *c, int i, int64_t aux[DW_AUX_COUNT], int64_t tmp[DW_TMP_COUNT]);

static inline int64_t dw_align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

/* Whether tensor t can have a gradient: floating point (indices, counts and tokens have none). */
static inline bool dw_compile_has_grad(const dw_graph *g, int t) { return g->tensors[t].dtype != DW_IR_I32; }

/* Bytes of one element of activation t in program c: int32 data 4, floating point the program's
 * activation size (FP32 or BF16). */
static inline int64_t dw_compile_elem_bytes(const dw_compiled *c, int t) {
    return c->g->tensors[t].dtype == DW_IR_I32 ? 4 : c->act_size;
}

/* MoE rows under a capacity factor below 1: the dispatch's rows and every tensor computed row by
 * row from them (expert GEMM outputs, their activation) hold the capacity's rows, not N K
 * (moe_rows.c; sets the tensors' rows_cap and moe_* fields). */
void dw_compile_moe_rows(dw_compiled *c);

/* Elements the program holds for activation t: its rows at capacity times its width for MoE rows
 * under a capacity, else the graph's shape. */
static inline int64_t dw_compile_act_numel(const dw_compiled *c, int t) {
    return c->tensor[t].moe_factor > 0 ? c->tensor[t].rows_cap * c->tensor[t].width : dw_ir_numel(&c->g->tensors[t]);
}

#endif /* DW_COMPILE_PASSES_H */
