/* quant_recipe.c — which recipes quantise, and a quantised layer's operand recipes (program.h):
 * read by the binding of dense and grouped layers (bind.c, bind_grouped.c), the workspace, the
 * parameter caches, the runtime's linear entries and the report, so it sits below all of them. */
#include "compile/program.h"

bool dw_compile_quant_recipe(dw_recipe r) { return r != DW_RECIPE_BF16 && (int)r >= 0 && r < DW_RECIPE_COUNT; }
dw_recipe dw_compile_quant_act_recipe(dw_recipe r) { return r == DW_RECIPE_FP8_BLOCK2D ? DW_RECIPE_FP8_BLOCK : r; }
dw_recipe dw_compile_quant_weight_recipe(dw_recipe r) { return r == DW_RECIPE_FP8_BLOCK ? DW_RECIPE_FP8_BLOCK2D : r; }
