/* layout.h — private to src/plan: how layers map to virtual pipeline stages, and per-token
 * activation bytes. Shared by memory.c, cost.c and check.c. */
#ifndef DW_PLAN_LAYOUT_H
#define DW_PLAN_LAYOUT_H

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

/* The attention block as priced: standard (grouped-query) attention or DeepSeek's multi-head
 * latent attention (attn.c). GEMMs per token: C[T, n] = X[T, k] W[k, n], with TP sharding of n
 * (column parallel), of k (row parallel), or none (replicated on every TP rank). */
enum { DW_SHARD_NONE = 0, DW_SHARD_N, DW_SHARD_K };
typedef struct {
    double n, k;
    int shard;
} dw_attn_gemm;
typedef struct {
    bool mla;
    double H, kv_heads;         /* heads; K/V heads (standard attention) */
    double dqk, dv;             /* score and value channels per head */
    dw_attn_gemm gemm[5];
    int n_gemm;
    int up_first;               /* MLA: index of q_b (the up-projections re-run by selective
                                   recompute are gemm[up_first] and the kv_b after it); -1 none */
    double params, matmul;      /* all parameters of the block's attention; of them the matrices */
    double replicated;          /* of params, those every TP rank holds whole (MLA's down-projections) */
    double elem;                /* elementwise bytes per token beyond the norms: RoPE, latent norms */
    double qin;                 /* GEMM input elements per token that a low-precision recipe quantises */
    double latent;              /* MLA: latent bytes per token kept for backward (q, kv latents, rope key) */
    double up_inputs;           /* MLA: the up-projections' quantised inputs, a (ql + kl) */
} dw_attn_shape;
void dw_plan_attn_shape(const dw_plan_in *in, dw_attn_shape *out);
/* Saved bytes per token of the attention half of a block (+ both norm inputs), all TP ranks
 * together, for operand bytes ab and a recompute mode other than full. */
double dw_plan_attn_saved(const dw_attn_shape *a, double d, double ab, dw_recompute rc);

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
