/* attn.c — the attention block as the planner prices it: standard (grouped-query) attention or
 * DeepSeek's multi-head latent attention (MLA), as one shape: its GEMMs with their TP sharding,
 * score and value channels, parameters, elementwise and saved bytes per token. cost.c, layout.c,
 * memory.c and model.c read this instead of the config's head fields. Formulas: docs/planner.md. */
#include <string.h>

#include "plan/attn.h"
#include "plan/operand.h"

static void add_gemm(dw_attn_shape *a, double n, double k, int shard) {
    a->gemm[a->n_gemm++] = (dw_attn_gemm){.n = n, .k = k, .shard = shard};
}

void dw_plan_attn_shape(const dw_plan_in *in, dw_attn_shape *a) {
    const dw_model_config *c = in->cfg;
    double d = (double)c->d_model, H = (double)c->n_heads, ab = dw_plan_operand_bytes(in->job.recipe);
    memset(a, 0, sizeof *a);
    a->H = H;
    if (c->mla.kv_lora_rank > 0) {
        const dw_mla_dims *m = &c->mla;
        double ql = (double)m->q_lora_rank, kl = (double)m->kv_lora_rank, rope = (double)m->qk_rope_head_dim;
        double nope = (double)m->qk_nope_head_dim, v = (double)m->v_head_dim;
        a->mla = true;
        a->dqk = nope + rope, a->dv = v;
        /* down-projections replicated on every TP rank (they see the gathered sequence), the
         * per-head up-projections and the output projection split by heads */
        if (ql > 0) {
            add_gemm(a, ql, d, DW_SHARD_NONE);
            add_gemm(a, H * a->dqk, ql, DW_SHARD_N);
        } else {
            add_gemm(a, H * a->dqk, d, DW_SHARD_N);
        }
        add_gemm(a, kl + rope, d, DW_SHARD_NONE);
        add_gemm(a, H * (nope + v), kl, DW_SHARD_N);
        add_gemm(a, d, H * v, DW_SHARD_K);
        a->up_first = ql > 0 ? 1 : 0; /* gemm[1] (q_b) and gemm[3 or 2] (kv_b): re-run by selective */
        a->params = (double)dw_mla_attn_params(c);
        a->matmul = (double)dw_mla_attn_matmul(c);
        a->replicated = (ql > 0 ? d * ql + ql : 0) + d * (kl + rope) + kl;
        /* RoPE on each head's rope channels and the shared key; the two latent RMSNorms */
        a->elem = 4 * (H + 1) * rope + 8 * (ql + kl);
        a->qin = d + ql + kl + H * v;
        /* the latents kept for the norms' and up-projections' backward (the "cached latent") */
        a->latent = 2 * (ql + kl + rope);
        a->up_inputs = ab * (ql + kl);
        return;
    }
    double hd = (double)c->head_dim, Hkv = (double)c->n_kv_heads;
    a->dqk = a->dv = hd;
    add_gemm(a, (H + 2 * Hkv) * hd, d, DW_SHARD_N);
    add_gemm(a, d, H * hd, DW_SHARD_K);
    a->up_first = -1;
    a->matmul = d * (H + 2 * Hkv) * hd + H * hd * d;
    a->params = a->matmul;
    double qkv = (H + 2 * Hkv) * hd;
    if (c->linear_bias) a->params += qkv + d;
    else if (c->qkv_bias) a->params += qkv;
    if (c->qk_norm) a->params += (H + Hkv) * hd; /* OLMoE's q/k norm weights */
    if (c->qk_norm_heads) a->params += 2 * hd;   /* Qwen3's per-head q/k norm weights */
    a->elem = 4 * (H + Hkv) * hd;
    a->qin = d + H * hd;
    a->kv_heads = Hkv;
}

double dw_plan_attn_saved(const dw_attn_shape *a, double d, double ab, dw_recompute rc) {
    /* norm-1 input 2d | Q, K, V 2H(dqk + dqk) + 2 Hkv... | attention output 2 H dv (+ a H dv
     * quantised when a < 2) | softmax LSE 4H | norm-2 input 2d; GEMM inputs a d (+ MLA's a (ql + kl)) */
    double H = a->H, b = 2 * d + 2 * H * a->dv + 4 * H + 2 * d;
    if (a->mla) {
        b += a->latent;
        if (rc == DW_RECOMPUTE_NONE) b += 2 * H * (2 * a->dqk + a->dv) + a->up_inputs; /* Q, K, V kept */
    } else {
        b += 2 * (H + 2 * a->kv_heads) * a->dqk;
    }
    if (rc == DW_RECOMPUTE_NONE) b += ab * d + (ab < 2 ? ab * H * a->dv : 0);
    return b;
}
