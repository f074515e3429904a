/* nvfp4_operand.h — private to runtime/: which pieces of the policy's NVFP4 training recipe
 * (precision/nvfp4_recipe.h) apply to each operand of a quantised linear layer, the same answer
 * for the CPU and CUDA backends: W and W^T in 16x16 blocks (weight_2d); dy for dgrad rounded
 * stochastically (sr); dy^T and x^T for wgrad, blocks along the tokens, through the random
 * Hadamard transform (rht), dy^T also stochastically rounded; fprop's x as FORMATS.md's nvfp4.
 * The SR step word is the bits of the operand's own tensor scale (step_from_scale): fresh every
 * training step, the same on a resumed run, on both backends, with no state to keep. */
#ifndef DW_RUNTIME_NVFP4_OPERAND_H
#define DW_RUNTIME_NVFP4_OPERAND_H

#include <stdbool.h>

#include "compile/program.h"
#include "formats/nvfp4_rules.h"

typedef enum { DW_NVOP_W = 0, DW_NVOP_WT, DW_NVOP_X, DW_NVOP_DY, DW_NVOP_DYT, DW_NVOP_XT } dw_nvfp4_operand;

/* Whether node's operand `role` (recipe r) is quantised by the recipe's quantiser, and its options.
 * false: FORMATS.md's plain nvfp4 (or
 * another recipe), for the backend's usual quantiser. */
static inline bool dw_nvfp4_operand_opts(const dw_compiled *p, int node, dw_recipe r, dw_nvfp4_operand role,
                                         dw_nvfp4_qopts *o) {
    if (r != DW_RECIPE_NVFP4) return false;
    const dw_nvfp4_recipe *nv = &p->nvfp4;
    *o = (dw_nvfp4_qopts){.trans = role == DW_NVOP_WT || role == DW_NVOP_DYT || role == DW_NVOP_XT,
                          .block2d = (role == DW_NVOP_W || role == DW_NVOP_WT) && nv->weight_2d,
                          .rht = (role == DW_NVOP_DYT || role == DW_NVOP_XT) && nv->rht,
                          .sr = (role == DW_NVOP_DY || role == DW_NVOP_DYT) && nv->sr,
                          .seed = nv->seed,
                          .stream = (uint32_t)node * 8u + (uint32_t)role,
                          .step_from_scale = true};
    return o->block2d || o->rht || o->sr;
}

#endif /* DW_RUNTIME_NVFP4_OPERAND_H */
