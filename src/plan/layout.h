/* layout.h — private to src/plan: how layers map to virtual pipeline stages, and per-token
 * activation bytes. Shared by memory.c, cost.c and check.c. */
#ifndef DW_PLAN_LAYOUT_H
#define DW_PLAN_LAYOUT_H

#include "plan/plan.h"

typedef struct {
    int64_t layers, moe_layers; /* transformer blocks on this virtual stage, of which MoE */
    bool embed, head;           /* holds the embedding (first) / final norm + LM head (last) */
} dw_vstage;

/* Layers over pp*v virtual stages: uniform when L % (pp v) == 0; otherwise Llama-3 style when
 * (L + 2) % (pp v) == 0 — the first and last virtual stage hold one block fewer to make room
 * for the embedding and the LM head. Returns false when neither holds. */
bool dw_plan_vstage(const dw_plan_in *in, int pp, int v, int vs, dw_vstage *out);

/* Saved-for-backward activation bytes per token of one block (all TP ranks together, i.e.
 * divide by tp for one rank with sequence parallelism). */
double dw_plan_act_bytes_dense(const dw_plan_in *in, dw_recompute rc);
double dw_plan_act_bytes_moe(const dw_plan_in *in, dw_recompute rc);
/* Bytes per element of quantised GEMM operands: 2 (bf16), 1 (fp8), 0.5 (fp4). */
double dw_plan_operand_bytes(dw_recipe p);
/* Scale bytes per quantised element: activations/gradients (1-D blocks), weights. */
double dw_plan_act_scale_bytes(dw_recipe p);
double dw_plan_weight_scale_bytes(dw_recipe p);

/* Local parameter counts of one rank for a virtual stage. */
typedef struct {
    double dense;   /* replicated over dp*cp (attention, dense MLP, shared experts, norms, embeddings) */
    double expert;  /* replicated over dp*cp/ep (routed experts) */
    double matmul;  /* of dense+expert, the GEMM weights a low-precision recipe caches */
    double max_layer; /* largest single block on this rank (ZeRO-3 gather / bucket unit) */
} dw_local_params;
void dw_plan_local_params(const dw_plan_in *in, const dw_par *par, const dw_vstage *st,
                          dw_local_params *out);

#endif
