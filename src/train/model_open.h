/* model_open.h — private: the one place that picks an engine for the context's device (the CPU
 * reference engine or the CUDA engine with a precision policy), and opening a model for
 * inference from a checkpoint, a run directory, a Hugging Face model directory or a preset. */
#ifndef DW_TRAIN_MODEL_OPEN_H
#define DW_TRAIN_MODEL_OPEN_H

#include <stdint.h>

#include "capture/model_config.h"
#include "deepwell.h"
#include "runtime/engine.h"
#include "train/sample.h"

/* An engine for batches up to B x T on dw_ctx_device(ctx): the CPU reference engine, or the
 * CUDA engine compiled with `policy` (NULL: the BF16 policy). A policy on a CPU context is
 * refused (DW_ERR_INVALID: the CPU engine is FP32 only). */
dw_status dw_train_engine_create_policy(dw_ctx *ctx, const dw_model_config *cfg, int64_t B, int64_t T,
                                        const dw_policy *policy, dw_engine **out);
/* The same with policy NULL. */
dw_status dw_train_engine_create(dw_ctx *ctx, const dw_model_config *cfg, int64_t B, int64_t T,
                           dw_engine **out);
/* A context for --device cpu|cuda|auto: cuda needs a CUDA build and a usable GPU (else
 * DW_ERR_UNSUPPORTED naming why); auto is cuda when a GPU is usable, else cpu. *out is NULL on
 * error (the message is then in dw_errmsg(NULL)). */
dw_status dw_train_ctx_create(const char *device, dw_ctx **out);
/* The precision a checkpoint records: "fp32-cpu" on the CPU; on CUDA the policy's default
 * recipe ("bf16" when policy is NULL, "policy" for a policy with rules). */
const char *dw_train_precision_name(dw_ctx *ctx, const dw_policy *policy);

typedef struct {
    dw_engine *engine;
    dw_tokenizer tokenizer; /* checkpoint: as trained; else bytes when vocab_size == 256 */
    int64_t T;              /* context the engine was created for */
    bool trained;           /* false: a preset with freshly initialised weights */
} dw_opened_model;

/* `what`: a checkpoint or run directory (validated before loading), a model directory
 * (config.json + model.safetensors) or a preset name (weights initialised from seed). The engine
 * is created for B = 1 and T = min(max_T, the model's max_seq). */
dw_status dw_model_open(dw_ctx *ctx, const char *what, int64_t max_T, uint64_t seed,
                        dw_opened_model *out);

#endif /* DW_TRAIN_MODEL_OPEN_H */
