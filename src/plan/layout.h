/* layout.h — private to src/plan: how layers map to virtual pipeline stages, and per-token
 * activation bytes. Shared by memory.c, cost.c and check.c; it brings attn.h (the attention
 * block) and operand.h (recipe bytes) with it. */
#ifndef DW_PLAN_LAYOUT_H
#define DW_PLAN_LAYOUT_H

#include "plan/attn.h"
#include "plan/operand.h"
#include "plan/plan.h"

typedef struct {
    int64_t layers, moe_layers; /* transformer blocks on this virtual stage, of which MoE */
    bool embed, head;           /* holds the embedding (first) / final norm + LM head (last) */
    int64_t mtp;                /* the last stage: multi-token-prediction modules (DeepSeek-V3),
                                   each a block like the model's last (MoE) + a projection of
                                   [h; embedding] and the shared LM head once more */
} dw_vstage;

/* Layers over P = pp*v model stages (index vs; which rank holds which: dw_plan_chunk_stage):
 * uniform when P divides L; otherwise every middle stage holds n = ceil(L / P) blocks and the
 * first and last stage, which hold the embedding and the LM head, give up the nP - L missing
 * ones (the first ceil of half, the last the rest; the first may keep only the embedding, the
 * last keeps a block) (Llama 3: one fewer each). A multi-token-prediction module takes a slot of
 * the last stage (DeepSeek-V3's 61 + 1 over 16: 3, 14 x 4, 2 + MTP; over 32: 1, 30 x 2, MTP). Dense and MoE blocks keep their places in the
 * stack (a config's first dense layers land on the first stages). False when no split exists. */
bool dw_plan_vstage(const dw_plan_in *in, int pp, int v, int vs, dw_vstage *out);
/* The index in the layer stack of model stage vs's first block (the blocks of stages 0..vs-1;
 * plan_explain.c). */
int64_t dw_plan_vstage_first_layer(const dw_plan_in *in, int pp, int v, int vs);

/* Saved-for-backward activation bytes per token of one block (all TP ranks together, i.e.
 * divide by tp for one rank with sequence parallelism). */
double dw_plan_act_bytes_dense(const dw_plan_in *in, dw_recompute rc);
double dw_plan_act_bytes_moe(const dw_plan_in *in, dw_recompute rc);
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
