/* float_graph.h — private: feed-forward graphs, whose input is a float activation tensor (B,T,C_in)
 * instead of token ids and whose output is a float activation (B,T,C_out), with no targets and no
 * loss (dw.optimize of an nn.Sequential; dw_engine_forward_float). The roles sit in the graph's
 * tokens (the input) and logits (the output) slots; targets and loss stay -1. Not the LM graphs. */
#ifndef DW_IR_FLOAT_GRAPH_H
#define DW_IR_FLOAT_GRAPH_H

#include <stdbool.h>

#include "ir/ir.h"

/* Whether g is a feed-forward graph: its input role is an FP32 tensor (token graphs: int32). */
bool dw_graph_float_input(const dw_graph *g);
/* Checks a feed-forward graph's roles: input an FP32 (B,T,C_in) input tensor, output an FP32
 * activation of the same B,T; no targets, no loss. Errors name the tensor. */
dw_status dw_graph_verify_float_roles(dw_ctx *ctx, const dw_graph *g);

#endif /* DW_IR_FLOAT_GRAPH_H */
