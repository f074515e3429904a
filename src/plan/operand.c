/* operand.c — bytes per element of a recipe's quantised GEMM operands and of their block
 * scales, for the planner's memory and time formulas (docs/planner.md). */
#include "plan/operand.h"

double dw_plan_operand_bytes(dw_recipe p) {
    return p == DW_RECIPE_BF16 ? 2.0 : p == DW_RECIPE_NVFP4 ? 0.5 : 1.0;
}

double dw_plan_act_scale_bytes(dw_recipe p) {
    switch (p) {
    case DW_RECIPE_FP8_BLOCK: return 4.0 / 128; /* FP32 per 1x128 */
    case DW_RECIPE_MXFP8: return 1.0 / 32;      /* UE8M0 per 1x32 */
    case DW_RECIPE_NVFP4: return 1.0 / 16;      /* UE4M3 per 1x16 */
    default: return 0;
    }
}

double dw_plan_weight_scale_bytes(dw_recipe p) {
    return p == DW_RECIPE_FP8_BLOCK ? 4.0 / (128 * 128) : dw_plan_act_scale_bytes(p);
}
