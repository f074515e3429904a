/* plan_explain.h — `deepwell plan --explain`: why the best plan won, printed from deepwell.h's
 * plan handles (time split, memory per rank, layer layout, rejection counts). */
#ifndef DW_TOOLS_PLAN_EXPLAIN_H
#define DW_TOOLS_PLAN_EXPLAIN_H

#include "deepwell.h"

/* Prints the explanation of a search's result to stdout; a status from the plan getters. */
dw_status plan_explain_print(dw_ctx *ctx, const dw_plan_set *set);

#endif /* DW_TOOLS_PLAN_EXPLAIN_H */
