/* engine.h — private: an executable model (the CPU reference engine now; the compiled GPU
 * engine later implements the same functions). Holds parameters (FP32 master weights), their
 * gradients and the activations of one forward pass for backward.
 * CONTRACT HEADER: implemented by runtime/ (CPU engine), used by the trainer, eval, sample. */
#ifndef DW_RUNTIME_ENGINE_H
#define DW_RUNTIME_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "capture/model_config.h"
#include "deepwell.h"

typedef struct {
    const char *name; /* Hugging Face weight name, e.g. "model.layers.0.self_attn.q_proj.weight" */
    int ndim;
    int64_t shape[4]; /* in Deepwell's layout (torch.nn.Linear: out x in) */
    int64_t numel;
    float *data;      /* FP32 master weights; host memory for the CPU engine */
    float *grad;      /* same shape; accumulated by forward_backward */
    bool decay;       /* weight decay applies: matrices yes; norms, biases, (gpt2) no */
} dw_param;

typedef struct dw_engine dw_engine;

/* Builds a CPU engine for the model (graph captured from cfg) with room for batches up to
 * B x T tokens. Parameters are allocated but not initialised. */
dw_status dw_engine_create_cpu(dw_ctx *ctx, const dw_model_config *cfg, int64_t B, int64_t T,
                               dw_engine **out);
void dw_engine_free(dw_engine *e);
const dw_model_config *dw_engine_config(const dw_engine *e);

int dw_engine_param_count(const dw_engine *e);
dw_param *dw_engine_param(dw_engine *e, int i);
int64_t dw_engine_param_numel(const dw_engine *e); /* total; tied weights counted once */

/* Initialise as the architecture's reference implementation does (normal(0, init_std), GPT-2's
 * scaled residual projections, ones/zeros for norms and biases), deterministically from seed. */
dw_status dw_engine_init_weights(dw_engine *e, uint64_t seed);
/* Load/save Hugging Face safetensors (names and layouts: GPT-2's Conv1D transposed on the way).
 * path: a .safetensors file, a model dir with model.safetensors or a sharded index. */
dw_status dw_engine_load_weights(dw_engine *e, const char *path);
dw_status dw_engine_save_weights(dw_engine *e, const char *path);

void dw_engine_zero_grad(dw_engine *e);
/* tokens, targets (B,T) int32; targets < 0 are ignored. Accumulates gradients (+=) of
 * loss * grad_scale (grad_scale = 1/accumulation_steps). *loss = mean cross-entropy. */
dw_status dw_engine_forward_backward(dw_engine *e, const int32_t *tokens, const int32_t *targets,
                                     int64_t B, int64_t T, double grad_scale, double *loss);
/* Forward only. logits (B,T,V) may be NULL; targets may be NULL (then loss is not computed). */
dw_status dw_engine_forward(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B,
                            int64_t T, float *logits, double *loss);

#endif /* DW_RUNTIME_ENGINE_H */
