/* nvfp4_recipe.h — private: a policy's NVFP4 training recipe (NVIDIA's NVFP4 pretraining paper,
 * 2025), each piece a switch: 16x16 random Hadamard transforms on the wgrad GEMMs' inputs, 16x16
 * block scales for weights, stochastic rounding of gradients, and the last ~15% of blocks plus
 * the LM head kept in BF16. JSON (policy field "nvfp4", every key optional, defaults shown):
 *   {"rht": true, "weight_2d": true, "stochastic_rounding": true,
 *    "bf16_last_blocks": 0.15, "bf16_head": true, "seed": 0}
 * The quantisation arithmetic is formats/nvfp4_rules.h; FP32 tensor scales are FORMATS.md's. */
#ifndef DW_PRECISION_NVFP4_RECIPE_H
#define DW_PRECISION_NVFP4_RECIPE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/json.h"
#include "deepwell.h"

typedef struct {
    bool rht;                /* Hadamard transform of dy^T and x^T (blocks along the tokens) in wgrad */
    bool weight_2d;          /* W and W^T quantised in 16x16 blocks: the same values both ways */
    bool sr;                 /* dy (dgrad) and dy^T (wgrad) rounded stochastically */
    double bf16_last_blocks; /* fraction of the blocks, counted from the last, kept in BF16 */
    bool bf16_head;          /* the LM head (lm_head) kept in BF16 */
    uint64_t seed;           /* the transform's signs and the rounding's Philox key */
} dw_nvfp4_recipe;

/* Every piece on, 15% of the blocks and the head in BF16, seed 0. */
dw_nvfp4_recipe dw_nvfp4_recipe_default(void);

/* Parses the "nvfp4" field's value (NULL: absent, defaults kept) into r; DW_ERR_FORMAT naming
 * path, the key and what is wrong (unknown key, wrong type, a fraction outside [0, 1]). */
dw_status dw_nvfp4_recipe_parse(dw_ctx *ctx, const json_t *v, const char *path, dw_nvfp4_recipe *r);
/* The recipe as a JSON object with every key. */
json_t *dw_nvfp4_recipe_json(const dw_nvfp4_recipe *r);

/* How many blocks, counted from the last, stay in BF16 for a model of n_layers: the fraction of
 * n_layers rounded to the nearest whole block (0.15: none below 4 blocks, 1 of 8, 2 of 12). */
int64_t dw_nvfp4_bf16_tail(const dw_nvfp4_recipe *r, int64_t n_layers);
/* Whether a node that would get nvfp4 by default stays BF16: the LM head (bf16_head), or a node of
 * block `layer` (-1: outside the blocks) among the last dw_nvfp4_bf16_tail ones. */
bool dw_nvfp4_keeps_bf16(const dw_nvfp4_recipe *r, const char *node_name, long layer, int64_t n_layers);

#endif /* DW_PRECISION_NVFP4_RECIPE_H */
