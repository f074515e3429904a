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
/* Builds the CUDA engine (runtime/engine_cuda*.c) on ctx's GPU: compiles the graph
 * (compile/compile.h; policy NULL = FP32 activations and the FP32 reference GEMM, else BF16
 * activations and BF16 GEMMs; recipes it cannot run yet are refused with DW_ERR_UNSUPPORTED)
 * and allocates its pools once: weights (FP32 master + BF16 working copy), grads, AdamW m/v,
 * the activation arena, workspace. Nothing is allocated per step. dw_param.data/.grad are HOST
 * MIRRORS here: dw_engine_sync_to_host fills them, dw_engine_sync_to_device pushes edits;
 * init/load/save weights do this themselves. forward_backward syncs the host once, to read
 * the loss back (not at all when loss is NULL). DW_ERR_UNSUPPORTED in a build without CUDA. */
dw_status dw_engine_create_cuda(dw_ctx *ctx, const dw_model_config *cfg, int64_t B, int64_t T,
                                const dw_policy *policy, dw_engine **out);
bool dw_engine_on_device(const dw_engine *e);
/* CUDA engine: device weights (and gradients when grads) -> dw_param.data (.grad). CPU: no-op. */
dw_status dw_engine_sync_to_host(dw_engine *e, bool grads);
/* CUDA engine: dw_param.data -> device master weights (and the BF16 copy). CPU: no-op. */
dw_status dw_engine_sync_to_device(dw_engine *e);
/* One AdamW step t (1-based) over all parameters, on the engine's device, with the CPU
 * trainer's semantics (train/optim.h): norm = global L2 norm of the gradients; gradients are
 * scaled by clip / (norm + 1e-6) when clip > 0 and norm > clip; p -= lr*wd*p for decay
 * parameters; m, v updated; p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps). *grad_norm is the
 * norm before clipping. A non-finite norm leaves every parameter unchanged and returns
 * DW_ERR_NUMERIC. CPU engine: DW_ERR_UNSUPPORTED (the CPU trainer's optimizer is
 * train/optstate). */
dw_status dw_engine_adamw_step(dw_engine *e, double lr, double beta1, double beta2, double eps,
                               double weight_decay, double clip, int64_t step, double *grad_norm);
/* The AdamW moments of parameter i (numel floats each, its shape) for checkpoints: to_device
 * false copies the device's m, v into the host arrays, true copies them to the device. CPU
 * engine: DW_ERR_UNSUPPORTED (train/optstate holds them). */
dw_status dw_engine_adamw_moments(dw_engine *e, int i, float *m, float *v, bool to_device);
/* The CUDA engine's compiled plan (NULL for the CPU engine). */
const dw_compiled *dw_engine_compiled(const dw_engine *e);
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
