/* operand.h — private to src/plan: bytes per element of a recipe's quantised GEMM operands and
 * of their scales (operand.c). */
#ifndef DW_PLAN_OPERAND_H
#define DW_PLAN_OPERAND_H

#include "plan/plan.h"

/* Bytes per element of quantised GEMM operands: 2 (bf16), 1 (fp8), 0.5 (fp4). */
double dw_plan_operand_bytes(dw_recipe p);
/* Scale bytes per quantised element: activations/gradients (1-D blocks), weights. */
double dw_plan_act_scale_bytes(dw_recipe p);
double dw_plan_weight_scale_bytes(dw_recipe p);

#endif
