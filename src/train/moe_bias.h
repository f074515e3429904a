/* moe_bias.h — private: auxiliary-loss-free load balancing (DeepSeek-V3): the trainer's per-expert
 * selection bias b (FP32, a row of E per MoE router). The routers choose their top k by
 * score + b and weight by the unbiased scores (runtime/engine_moe_bias.h); after each optimizer
 * step b_e += γ·sign(mean load − load_e) with the loads of the whole global batch (every
 * micro-batch, every rank: train/moe_routing.h), so every rank holds the same bits. The values
 * travel in state.json's "moe_bias" as hex floats (exact). Not the router kernels. */
#ifndef DW_TRAIN_MOE_BIAS_H
#define DW_TRAIN_MOE_BIAS_H

#include <stdint.h>

#include "deepwell.h"
#include "train/moe_routing.h"

typedef struct {
    int64_t layers, experts; /* 0 layers: off (every call a no-op) */
    float gamma;             /* γ, the update speed (each update adds exactly ±γ or 0 in FP32) */
    float *bias;             /* (layers x experts) */
    char *json;              /* the last dw_moe_bias_json text, or NULL */
} dw_moe_bias;

/* The default γ when config.json asks for the bias by topk_method "noaux_tc" alone. */
#define DW_MOE_BIAS_DEFAULT_SPEED 0.001

/* γ: gamma_opt (--moe-bias-update) when > 0; else a resumed checkpoint's (ckpt_dir's state.json
 * "moe_bias", NULL: a fresh run); else the model config's moe_bias_update_speed (config.json text of
 * the graph); else off. On: the values (the checkpoint's, else those the weights brought as
 * e_score_correction_bias tensors, else zeros) set on the engine. Off: a bias the weights brought
 * stays on the engine, never updated; without one the routers choose by the logits. A negative or
 * non-finite gamma_opt, γ for a model without an MoE router, and a malformed "moe_bias" are refused
 * naming the flag or file. */
dw_status dw_moe_bias_init(dw_ctx *ctx, dw_engine *e, double gamma_opt, const char *ckpt_dir, dw_moe_bias *b);
void dw_moe_bias_free(dw_moe_bias *b);
/* Back to checkpoint ckpt_dir's values (zeros when it has none), γ kept, set on the engine: for a
 * run that goes back to one of its checkpoints. No-op when off. */
dw_status dw_moe_bias_reload(dw_ctx *ctx, dw_engine *e, const char *ckpt_dir, dw_moe_bias *b);

/* One layer's update: bias[x] += gamma·sign(mean − load[x]) over x < E, in FP32 (the sign from
 * the exact comparison sum(load) vs E·load[x]: loads are whole counts). */
void dw_moe_bias_update(float *bias, const double *load, int64_t E, float gamma);
/* After an optimizer step whose loads m->step holds (dw_moe_routing_step): every row updated and
 * set on the engine (between steps). */
dw_status dw_moe_bias_step(dw_ctx *ctx, dw_engine *e, const dw_moe_routing *m, dw_moe_bias *b);
/* max |b| over every row (NaN when off), for metrics.jsonl. */
double dw_moe_bias_max_abs(const dw_moe_bias *b);
/* state.json's "moe_bias" as JSON text (owned by b, valid until the next call or the free):
 * {"update_speed", "layers", "experts", "values": [[hex floats] per layer]}; NULL when off, or
 * when out of memory (b->layers not 0). */
const char *dw_moe_bias_json(dw_moe_bias *b);

#endif /* DW_TRAIN_MOE_BIAS_H */
