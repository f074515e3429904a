/* engine_moe_bias.h — private: the MoE routers' selection bias in an engine's workspace
 * (DeepSeek-V3's auxiliary-loss-free load balancing; compile/program.h, work.moe_bias). While it
 * is switched on, each router chooses its top k by score + bias and weights them by the unbiased
 * scores; while off (a new engine) by the logits alone, as without it. The values and their
 * updates are the trainer's (train/moe_bias.c); this only puts them where the kernels read them,
 * between steps (the switch is device memory, so a recorded step replays either way). */
#ifndef DW_RUNTIME_ENGINE_MOE_BIAS_H
#define DW_RUNTIME_ENGINE_MOE_BIAS_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"

/* The routers (a bias row each, in graph order) and the experts per row; 0 layers: no router. */
void dw_engine_moe_bias_shape(const dw_engine *e, int64_t *layers, int64_t *experts);
/* bias (layers x experts FP32, as shaped above) uploaded and switched on; NULL: switched off
 * (the values stay). DW_ERR_UNSUPPORTED when the model has no router. */
dw_status dw_engine_moe_bias_set(dw_engine *e, const float *bias);
/* The values (layers x experts; may be NULL) and whether they are on (may be NULL). Waits for
 * the device. */
dw_status dw_engine_moe_bias_get(dw_engine *e, float *bias, bool *on);

#endif /* DW_RUNTIME_ENGINE_MOE_BIAS_H */
