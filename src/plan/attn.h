/* attn.h — private to src/plan: the attention block as the planner prices it (attn.c), read by
 * cost.c, layout.c, memory.c and model.c. */
#ifndef DW_PLAN_ATTN_H
#define DW_PLAN_ATTN_H

#include "plan/plan.h"

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

#endif
