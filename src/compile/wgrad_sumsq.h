/* wgrad_sumsq.h — the experts' wgrad takes its share of the gradient norm (CUDA programs with
 * grad_arena). A MoE linear layer whose grouped wgrad writes its experts' gradient dW [E, M, K]
 * over the slice (pgrad_set) and is that gradient's only writer also writes, from the values it
 * stores, the sum of squares of every 64 x 128 block of dW in double (kernels/cuda/ops_cuda.h's
 * dw_moe_sumsq_parts layout), into the workspace (work.wsumsq).
 * The norm step then reads only the rest of the gradient pool (the segments) and adds those
 * partials, instead of reading the experts' gradients again (89% of moe-e64's pool). The runtime
 * turns it on (runtime/exec.h dw_exec_wsumsq_on); this file decides which layers and where. */
#ifndef DW_COMPILE_WGRAD_SUMSQ_H
#define DW_COMPILE_WGRAD_SUMSQ_H

#include <stdbool.h>
#include <stdint.h>

#include "compile/program.h"

/* With the workspace's layout (workspace.c, at byte *o, which it advances): which layers write
 * partials — a CUDA target, grad_arena, a BF16 program, a MoE linear layer whose wgrad runs BF16
 * and writes its experts' gradient over (pgrad_set), no other node reading that weight, among the
 * first DW_COMPILE_NORM_SEGS - 1 such layers (needs c->grad_first, grad_arena.c) — their
 * partials' offsets (node[].wsumsq_off; blocks as kernels/cuda/ops_cuda.h's dw_moe_sumsq_parts)
 * and the pool ranges they leave to the norm (work.norm_segs). */
void dw_compile_wsumsq_layout(dw_compiled *c, int64_t *o);

/* Whether node i's wgrad writes the partials. */
bool dw_compile_wsumsq_node(const dw_compiled *c, int i);

/* Byte offset in the workspace of node's partials (-1: it writes none). */
int64_t dw_compile_wsumsq_of(const dw_compiled *c, int node);

/* The gradient pool's floats the partials do not cover, as ascending disjoint [lo, hi) ranges into
 * segs (cap of them; DW_COMPILE_NORM_SEGS always suffices); returns how many. Without partials: the
 * whole pool, one range. */
int dw_compile_norm_segments(const dw_compiled *c, int64_t (*segs)[2], int cap);
/* The pool floats whose squares the partials carry (the planner's saving: param_floats less the
 * segments'). */
int64_t dw_compile_wsumsq_floats(const dw_compiled *c);

#endif /* DW_COMPILE_WGRAD_SUMSQ_H */
