/* engine_moe_bias.h — private: the MoE routers' selection bias in an engine's workspace
 * (DeepSeek-V3's auxiliary-loss-free load balancing; compile/program.h, work.moe_bias). While it
 * is switched on, each router chooses its top k by score + bias and weights them by the unbiased
 * scores; while off (a new engine) by the logits alone, as without it. The values and their
 * updates are the trainer's (train/moe_bias.c); this only puts them where the kernels read them,
 * between steps (the switch is device memory, so a recorded step replays either way). A weights
 * file may hold the values as tensors (DeepSeek-V3's NAME.e_score_correction_bias [E], FP32): the
 * engine then loads them with the weights, switched on, and saves them with the weights
 * (runtime/weights.c). */
#ifndef DW_RUNTIME_ENGINE_MOE_BIAS_H
#define DW_RUNTIME_ENGINE_MOE_BIAS_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "deepwell.h"

/* The routers (a bias row each, in graph order) and the experts per row; 0 layers: no router. */
void dw_engine_moe_bias_shape(const dw_engine *e, int64_t *layers, int64_t *experts);
/* bias (layers x experts FP32, as shaped above) uploaded and switched on; NULL: switched off
 * (the values stay). DW_ERR_UNSUPPORTED when the model has no router. */
dw_status dw_engine_moe_bias_set(dw_engine *e, const float *bias);
/* The values (layers x experts; may be NULL) and whether they are on (may be NULL). Waits for
 * the device. */
dw_status dw_engine_moe_bias_get(dw_engine *e, float *bias, bool *on);

/* ---- the bias as a weights tensor ---------------------------------------------------------------- */
#define DW_MOE_BIAS_TENSOR "e_score_correction_bias" /* the suffix of its name in a weights file */

/* Whether a weights file's tensor name is a router's selection bias (NAME.e_score_correction_bias). */
static inline bool dw_moe_bias_tensor_name(const char *name) {
    const size_t n = strlen(name), k = sizeof DW_MOE_BIAS_TENSOR - 1;
    return n > k && name[n - k - 1] == '.' && !strcmp(name + n - k, DW_MOE_BIAS_TENSOR);
}
/* Router row's tensor name: its gate's weight name with the last component replaced
 * ("model.layers.3.mlp.gate.e_score_correction_bias"); free(). NULL: out of memory. */
char *dw_engine_moe_bias_name(const dw_engine *e, int64_t row);
/* The router row whose tensor `name` is, or -1. */
int64_t dw_engine_moe_bias_row(const dw_engine *e, const char *name);
/* Whether the bias is a tensor of the model's weights: loaded with them, saved with them. */
bool dw_engine_moe_bias_is_tensor(const dw_engine *e);
/* From a weights file: rows (layers x experts) set, switched on and marked a tensor; NULL: the
 * file had none (unmarked; the switch and values stay). */
dw_status dw_engine_moe_bias_load(dw_engine *e, const float *rows);

#endif /* DW_RUNTIME_ENGINE_MOE_BIAS_H */
