/* model.c — the planner's view of the model: job validation, parameter counts (closed forms over
 * dw_model_config, dense or MoE) and model FLOPs per token (the captured graph's, from the op
 * table, where capture builds the model; the closed form otherwise). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "capture/capture.h"
#include "core/error.h"
#include "plan/attn.h"

const dw_recipe dw_plan_recipes[DW_PLAN_RECIPES] = {DW_RECIPE_BF16, DW_RECIPE_FP8_BLOCK, DW_RECIPE_MXFP8,
                                                     DW_RECIPE_NVFP4};

bool dw_plan_supports_recipe(int32_t recipe) {
    for (int i = 0; i < DW_PLAN_RECIPES; i++)
        if (recipe == (int32_t)dw_plan_recipes[i]) return true;
    return false;
}

static bool is_glu(const dw_model_config *c) { return c->act != DW_ACT_GELU_TANH; }

/* Sets in->engine_model / engine_why / graph_flops_per_token: whether capture builds the model
 * (then Deepwell's engine can run it on one GPU) and its FLOPs from the op table. */
static void probe_engine_model(dw_plan_in *in) {
    in->engine_model = false;
    in->engine_why[0] = 0;
    in->graph_flops_per_token = 0;
    if (in->experts != in->cfg->n_experts || (in->experts > 0 && in->top_k != in->cfg->top_k)) {
        snprintf(in->engine_why, sizeof in->engine_why, "--moe makes a mixture-of-experts the config does not "
                 "describe: the engine runs the model its config describes");
        return;
    }
    dw_graph *g = NULL;
    if (dw_capture_config(NULL, in->cfg, 1, in->job.seq, &g) == DW_OK) {
        in->engine_model = true;
        in->graph_flops_per_token = dw_graph_model_flops_per_token(g);
    } else snprintf(in->engine_why, sizeof in->engine_why, "the engine cannot build this model: %s", dw_errmsg(NULL));
    dw_graph_free(g);
}

dw_status dw_plan_in_init(dw_ctx *ctx, const dw_model_config *cfg, const dw_hw *hw,
                          const dw_job *job, const dw_gemm_table *gemm, dw_plan_in *out) {
    memset(out, 0, sizeof *out);
    if (cfg->d_model < 1 || cfg->n_layers < 1 || cfg->n_heads < 1 || cfg->n_kv_heads < 1 ||
        cfg->vocab_size < 1 || cfg->d_ff < 0 || cfg->head_dim < 1)
        return dw_set_error(ctx, DW_ERR_INVALID,
                            "model: d_model, n_layers, n_heads, n_kv_heads, head_dim, vocab_size "
                            "must be positive");
    if (cfg->n_heads % cfg->n_kv_heads)
        return dw_set_error(ctx, DW_ERR_INVALID, "model: n_heads %lld not a multiple of n_kv_heads %lld",
                            (long long)cfg->n_heads, (long long)cfg->n_kv_heads);
    if (!hw || hw->n_gpus < 1)
        return dw_set_error(ctx, DW_ERR_INVALID,
                            "hardware has no GPUs%s%s: plan for a preset (--hw h100-sxm) or a JSON file",
                            hw && hw->notice[0] ? " — " : "", hw ? hw->notice : "");
    const dw_gpu_info *g = &hw->gpus[0];
    if (g->peak_bf16_tflops <= 0 || g->hbm_bytes == 0 || g->hbm_gbps <= 0)
        return dw_set_error(ctx, DW_ERR_INVALID,
                            "hardware: GPU 0 lacks a BF16 peak rate, HBM size or HBM bandwidth "
                            "(peak.bf16_tflops, hbm_bytes, peak.hbm_gbps), all needed to plan");
    if (job->seq < 1) return dw_set_error(ctx, DW_ERR_INVALID, "--seq must be positive");
    if (job->global_batch < 1)
        return dw_set_error(ctx, DW_ERR_INVALID, "--global-batch must be positive");
    if (!dw_plan_supports_recipe(job->recipe))
        return dw_set_error(ctx, DW_ERR_INVALID, "unknown precision recipe '%s' (bf16, fp8_block, mxfp8, nvfp4)",
                            dw_recipe_name(job->recipe));
    if ((job->recipe == DW_RECIPE_FP8_BLOCK || job->recipe == DW_RECIPE_MXFP8) && g->peak_fp8_tflops <= 0)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "precision %s needs FP8 tensor cores; %s has none",
                            dw_recipe_name(job->recipe), g->name);
    if (job->recipe == DW_RECIPE_NVFP4 && g->peak_fp4_tflops <= 0 && g->peak_fp8_tflops <= 0)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "precision nvfp4 needs FP4 or FP8 tensor cores");
    out->cfg = cfg;
    out->hw = hw;
    out->job = *job;
    out->gemm = gemm;
    if (out->job.mem_headroom <= 0) out->job.mem_headroom = 0.10;
    if (out->job.mem_headroom >= 0.9)
        return dw_set_error(ctx, DW_ERR_INVALID, "memory headroom %.2f must be below 0.9",
                            out->job.mem_headroom);
    out->n_gpus = (int64_t)hw->nodes * hw->n_gpus;
    out->experts = job->moe_experts > 0 ? job->moe_experts : cfg->n_experts;
    out->top_k = job->moe_top_k > 0 ? job->moe_top_k : (cfg->top_k > 0 ? cfg->top_k : 1);
    /* the capacity factor: the job's, else the config's (capacity_factor, for its own experts), else
     * 1 (dropless); below 1 the experts keep that share of the assignments (the rest dropped), at 1
     * and above they compute their padded capacity */
    const double cfg_capacity = out->experts == cfg->n_experts ? cfg->capacity_factor : 0.0;
    out->capacity = job->moe_capacity > 0 ? job->moe_capacity : cfg_capacity > 0 ? cfg_capacity : 1.0;
    if (out->experts < 0 || (out->experts > 0 && out->top_k > out->experts))
        return dw_set_error(ctx, DW_ERR_INVALID, "--moe: top_k %lld exceeds experts %lld",
                            (long long)out->top_k, (long long)out->experts);
    if (!(out->capacity > 0 && out->capacity <= 64))
        return dw_set_error(ctx, DW_ERR_INVALID, "--moe: capacity %.3g must be in (0, 64]", out->capacity);
    if (out->experts > 0 && cfg->n_experts > 0) { /* the config's rule (first dense layers, Qwen's sparse step) */
        for (int64_t l = 0; l < cfg->n_layers; l++) out->moe_layers += dw_model_config_moe_layer(cfg, l);
    } else if (out->experts > 0) { /* a dense model turned MoE by --moe: every layer */
        out->moe_layers = cfg->n_layers;
    }
    probe_engine_model(out);
    return DW_OK;
}

/* Expert FFN width: the config's, else the dense d_ff (a dense model turned MoE by --moe). */
static double expert_ff(const dw_plan_in *in) {
    return in->cfg->d_ff_expert > 0 ? (double)in->cfg->d_ff_expert : (double)in->cfg->d_ff;
}

void dw_plan_params(const dw_plan_in *in, dw_param_counts *o) {
    const dw_model_config *c = in->cfg;
    double d = (double)c->d_model, ff = (double)c->d_ff, V = (double)c->vocab_size;
    double mats = is_glu(c) ? 3 : 2;
    memset(o, 0, sizeof *o);
    /* attention: W_qkv [d, (H+2Hkv)hd] + W_o [H hd, d] (+ biases, q/k norms), or MLA's
     * projections and latent norms (attn.c) */
    dw_attn_shape as;
    dw_plan_attn_shape(in, &as);
    o->attn = as.params;
    /* MLP: GLU has gate+up [d, ff] and down [ff, d]; GELU has fc [d, ff] and proj [ff, d] */
    o->mlp = mats * d * ff;
    if (c->linear_bias || c->mlp_bias) o->mlp += (mats - 1) * ff + d;
    double norm = c->norm == DW_NORM_LAYERNORM ? 2 * d : d;
    o->norms = (c->sandwich_norms ? 4 : 2) * norm; /* Gemma 2: norms after attention and MLP too */
    if (in->experts > 0) {
        double fe = expert_ff(in);
        o->moe_experts = (double)in->experts * mats * d * fe;
        o->moe_shared = (double)(c->n_shared_experts > 0 ? c->n_shared_experts : 0) * mats * d * fe +
                        mats * d * (double)c->d_ff_shared + (c->shared_gate && c->d_ff_shared ? d : 0);
        o->router = d * (double)in->experts + (c->route.expert_bias ? (double)in->experts : 0);
    }
    o->embed = V * d;
    o->pos = c->pos == DW_POS_LEARNED ? (double)c->max_seq * d : 0;
    o->final_norm = norm;
    o->lm_head = c->tie_embeddings ? 0 : V * d;
    double L = (double)c->n_layers, Lm = (double)in->moe_layers;
    o->total = o->embed + o->pos + o->final_norm + o->lm_head + L * (o->attn + o->norms) +
               (L - Lm) * o->mlp + Lm * (o->moe_experts + o->moe_shared + o->router);
    /* Matmul weights a token passes through (biases and norms excluded): */
    double attn_w = as.matmul, mlp_w = mats * d * ff, active_moe = 0;
    if (in->experts > 0)
        active_moe = ((double)in->top_k + (c->n_shared_experts > 0 ? (double)c->n_shared_experts : 0)) *
                         mats * d * expert_ff(in) +
                     mats * d * (double)c->d_ff_shared + (c->shared_gate && c->d_ff_shared ? d : 0) +
                     d * (double)in->experts;
    o->active_per_token = L * attn_w + (L - Lm) * mlp_w + Lm * active_moe + V * d;
}

double dw_plan_model_flops_per_token(const dw_plan_in *in) {
    return in->graph_flops_per_token > 0 ? in->graph_flops_per_token : dw_plan_formula_flops_per_token(in);
}

double dw_plan_formula_flops_per_token(const dw_plan_in *in) {
    dw_param_counts pc;
    dw_plan_params(in, &pc);
    dw_attn_shape as;
    dw_plan_attn_shape(in, &as);
    /* attention scores and values, non-causal: 2 (dqk + dv) per head per key, x3 for training */
    return 6.0 * pc.active_per_token + 6.0 * (double)in->cfg->n_layers * as.H * (as.dqk + as.dv) * (double)in->job.seq;
}
