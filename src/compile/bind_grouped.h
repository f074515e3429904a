/* bind_grouped.h — private to compile/: the grouped GEMM decisions of MoE linear layers
 * (bind_grouped.c), made by bind.c and told by the report and dw_compiled_explain. */
#ifndef DW_COMPILE_BIND_GROUPED_H
#define DW_COMPILE_BIND_GROUPED_H

#include <stdio.h>

#include "compile/program.h"

/* The recipe moe_linear node i asks of the grouped registry: fp8_block for a node whose policy
 * recipe is fp8_block or fp8_block2d (x, dy 1x128; W, W^T 128x128 per expert), mxfp8 for mxfp8
 * (every operand 1x32), the node's recipe for another quantised one (BF16 fallback), BF16 otherwise (a BF16
 * node, FP32 mode). Whether each pass runs in it is the binding's quantised[]. */
dw_recipe dw_compile_moe_recipe(const dw_compiled *c, int i);
/* Node i (a moe_linear): the registry's grouped kernel per pass for the target, into its
 * binding's kernel[] (DW_QPASS_* order). DW_ERR_UNSUPPORTED when a pass has none, with every
 * candidate's reason; DW_ERR_INVALID for a DW_MOE_GEMM value it does not know. */
dw_status dw_compile_bind_grouped(dw_ctx *ctx, dw_compiled *c, int i);
/* Node i's three selections written to f: every registered grouped kernel, eligible or why not,
 * and the one bound. */
void dw_compile_explain_grouped(const dw_compiled *c, int i, FILE *f);

#endif /* DW_COMPILE_BIND_GROUPED_H */
