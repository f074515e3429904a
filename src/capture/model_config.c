/* model_config.c — Hugging Face config.json <-> dw_model_config, one parse_<family> and
 * write_<family> pair per family of capture/archs.def, plus the closed-form parameter count.
 * Presets live in model_presets.c; the graph built from a config lives in capture.c. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "capture/model_config_impl.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/log.h"

/* Reads an integer field into an int64_t (required, or optional keeping *out's default). */
static dw_status get_i64(dw_ctx *ctx, const json_t *j, const char *key, const char *what,
                         bool required, int64_t *out) {
    long long v = *out;
    DW_TRY(required ? dw_json_get_int(ctx, j, key, what, &v)
                    : dw_json_get_int_opt(ctx, j, key, what, &v));
    *out = (int64_t)v;
    return DW_OK;
}

static dw_status parse_gpt2(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c) {
    dw_model_preset_find("gpt2-tiny", c); /* the family's defaults; the shape is read below */
    DW_TRY(get_i64(ctx, j, "vocab_size", what, true, &c->vocab_size));
    DW_TRY(get_i64(ctx, j, "n_embd", what, true, &c->d_model));
    DW_TRY(get_i64(ctx, j, "n_layer", what, true, &c->n_layers));
    DW_TRY(get_i64(ctx, j, "n_head", what, true, &c->n_heads));
    DW_TRY(get_i64(ctx, j, "n_positions", what, true, &c->max_seq));
    c->n_kv_heads = c->n_heads;
    c->head_dim = c->n_heads > 0 ? c->d_model / c->n_heads : 0;
    c->d_ff = 4 * c->d_model; /* n_inner: null means 4 * n_embd */
    DW_TRY(get_i64(ctx, j, "n_inner", what, false, &c->d_ff));
    DW_TRY(dw_json_get_num_opt(ctx, j, "layer_norm_epsilon", what, &c->norm_eps));
    DW_TRY(dw_json_get_num_opt(ctx, j, "initializer_range", what, &c->init_std));
    DW_TRY(dw_json_get_bool_opt(ctx, j, "tie_word_embeddings", what, &c->tie_embeddings));
    const char *act = "gelu_new";
    DW_TRY(dw_json_get_str_opt(ctx, j, "activation_function", what, &act));
    if (strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh"))
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED,
                            "%s: field 'activation_function': '%s' is not supported (supported: "
                            "gelu_new, gelu_pytorch_tanh)", what, act);
    const char *flags[] = {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        bool on = false;
        DW_TRY(dw_json_get_bool_opt(ctx, j, flags[i], what, &on));
        if (on)
            return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: field '%s': true is not supported",
                                what, flags[i]);
    }
    bool scale = true;
    DW_TRY(dw_json_get_bool_opt(ctx, j, "scale_attn_weights", what, &scale));
    if (!scale)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED,
                            "%s: field 'scale_attn_weights': false is not supported", what);
    return DW_OK;
}

/* pad_token_id (null or absent: none): the padding_idx of these families' nn.Embedding. A negative
 * id counts from the end as torch's padding_idx does; outside [-V, V) no row is the padding row (torch
 * refuses such a padding_idx; a warning says so). */
static dw_status parse_pad(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c) {
    long long pad = LLONG_MIN;
    DW_TRY(dw_json_get_int_opt(ctx, j, "pad_token_id", what, &pad));
    c->has_pad = pad != LLONG_MIN;
    if (!c->has_pad) return DW_OK;
    if (pad < -c->vocab_size || pad >= c->vocab_size) {
        DW_LOGW("%s: pad_token_id %lld is outside the vocabulary (vocab_size %lld): no padding row "
                "(transformers would refuse it as padding_idx)", what, pad, (long long)c->vocab_size);
        c->has_pad = false;
        return DW_OK;
    }
    c->pad_token = pad < 0 ? c->vocab_size + pad : pad;
    return DW_OK;
}

/* The keys the Llama-like families share (sizes, eps, biases, tying), with the family's defaults set
 * first; not the activation, RoPE or windows. */
static dw_status parse_decoder(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c) {
    const dw_arch arch = c->arch;
    dw_model_preset_find(arch == DW_ARCH_QWEN2 ? "qwen2-tiny" : "llama-tiny", c); /* family defaults */
    c->arch = arch;
    snprintf(c->model_type, sizeof c->model_type, "%s", dw_hf_arch_get(arch)->model_type);
    c->rope_theta = 10000.0;
    c->tie_embeddings = false;
    c->qkv_bias = false;
    DW_TRY(get_i64(ctx, j, "vocab_size", what, true, &c->vocab_size));
    DW_TRY(get_i64(ctx, j, "hidden_size", what, true, &c->d_model));
    DW_TRY(get_i64(ctx, j, "num_hidden_layers", what, true, &c->n_layers));
    DW_TRY(get_i64(ctx, j, "num_attention_heads", what, true, &c->n_heads));
    DW_TRY(get_i64(ctx, j, "intermediate_size", what, true, &c->d_ff));
    DW_TRY(get_i64(ctx, j, "max_position_embeddings", what, true, &c->max_seq));
    c->n_kv_heads = c->n_heads;
    DW_TRY(get_i64(ctx, j, "num_key_value_heads", what, false, &c->n_kv_heads));
    c->head_dim = c->n_heads > 0 ? c->d_model / c->n_heads : 0;
    DW_TRY(get_i64(ctx, j, "head_dim", what, false, &c->head_dim));
    c->norm_eps = 1e-6; /* transformers' default for these configs */
    DW_TRY(dw_json_get_num_opt(ctx, j, "rms_norm_eps", what, &c->norm_eps));
    DW_TRY(dw_json_get_num_opt(ctx, j, "initializer_range", what, &c->init_std));
    DW_TRY(dw_json_get_bool_opt(ctx, j, "tie_word_embeddings", what, &c->tie_embeddings));
    DW_TRY(dw_json_get_bool_opt(ctx, j, "attention_bias", what, &c->qkv_bias));
    DW_TRY(dw_json_get_bool_opt(ctx, j, "mlp_bias", what, &c->mlp_bias));
    if (c->arch == DW_ARCH_QWEN2) c->qkv_bias = true; /* Qwen2 always biases q, k, v */
    return parse_pad(ctx, j, what, c);
}

static dw_status parse_llama(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c) {
    DW_TRY(parse_decoder(ctx, j, what, c));
    const char *act = "silu";
    DW_TRY(dw_json_get_str_opt(ctx, j, "hidden_act", what, &act));
    if (strcmp(act, "silu"))
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED,
                            "%s: field 'hidden_act': '%s' is not supported (supported: silu)", what,
                            act);
    DW_TRY(dw_model_config_parse_rope(ctx, j, what, c)); /* model_config_rope.c */
    return dw_model_config_parse_window(ctx, j, what, c); /* model_config_window.c */
}

/* Qwen3: the llama fields, RMSNorm over each head of q and k (q_norm, k_norm of width head_dim)
 * before RoPE, head_dim explicit (transformers' default d_model / heads otherwise), biases on q, k,
 * v and o only with attention_bias, the Qwen sliding-window keys. */
static dw_status parse_qwen3(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c) {
    DW_TRY(parse_llama(ctx, j, what, c));
    c->qk_norm_heads = true;
    return DW_OK;
}

/* Reads a soft-capping key: a positive number, or null (none); absent: the default *out keeps. */
static dw_status get_cap(dw_ctx *ctx, const json_t *j, const char *key, const char *what, double *out) {
    const json_t *v = json_object_get(j, key);
    if (v && json_is_null(v)) {
        *out = 0;
        return DW_OK;
    }
    DW_TRY(dw_json_get_num_opt(ctx, j, key, what, out));
    if (!(*out > 0 && *out < 1e30))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: field '%s' = %g: must be a positive number (or null: none)",
                            what, key, *out);
    return DW_OK;
}

/* Gemma 2 (transformers' Gemma2Config and its defaults): the llama sizes with head_dim 256 and 4 KV
 * heads unless given, tied embeddings, hidden_activation gelu_pytorch_tanh (GeGLU), embeddings times
 * sqrt(hidden_size), (1 + w) RMSNorms before and after attention and MLP, query_pre_attn_scalar
 * (256), attn_logit_softcapping (50) and final_logit_softcapping (30) (null: none), RoPE, and the
 * sliding window on the layers layer_types names (else the even ones; model_config_window.c). */
static dw_status parse_gemma2(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c) {
    long long kv = 4, hd = 256;
    DW_TRY(dw_json_get_int_opt(ctx, j, "num_key_value_heads", what, &kv));
    DW_TRY(dw_json_get_int_opt(ctx, j, "head_dim", what, &hd));
    DW_TRY(parse_decoder(ctx, j, what, c));
    if (!json_object_get(j, "num_key_value_heads")) c->n_kv_heads = kv;
    if (!json_object_get(j, "head_dim")) c->head_dim = hd;
    c->tie_embeddings = true, c->mlp_bias = false;
    DW_TRY(dw_json_get_bool_opt(ctx, j, "tie_word_embeddings", what, &c->tie_embeddings));
    const char *act = "gelu_pytorch_tanh";
    DW_TRY(dw_json_get_str_opt(ctx, j, "hidden_activation", what, &act));
    if (strcmp(act, "gelu_pytorch_tanh") && strcmp(act, "gelu_new"))
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: field 'hidden_activation': '%s' is not supported (supported: "
                            "gelu_pytorch_tanh)", what, act);
    c->act = DW_ACT_GELU_GLU;
    c->embed_scale = sqrt((double)c->d_model);
    c->norm_offset = 1.0, c->sandwich_norms = true;
    c->query_pre_attn_scalar = 256, c->attn_softcap = 50.0, c->final_softcap = 30.0;
    DW_TRY(dw_json_get_num_opt(ctx, j, "query_pre_attn_scalar", what, &c->query_pre_attn_scalar));
    if (!(c->query_pre_attn_scalar > 0 && c->query_pre_attn_scalar < 1e30))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: field 'query_pre_attn_scalar' = %g: must be positive", what,
                            c->query_pre_attn_scalar);
    DW_TRY(get_cap(ctx, j, "attn_logit_softcapping", what, &c->attn_softcap));
    DW_TRY(get_cap(ctx, j, "final_logit_softcapping", what, &c->final_softcap));
    DW_TRY(dw_model_config_parse_rope(ctx, j, what, c));
    return dw_model_config_parse_window(ctx, j, what, c);
}

/* Phi-3: the llama fields and block (SwiGLU, RoPE, no biases), q/k/v and gate/up fused in its
 * checkpoints (archs.def's fused column), sliding_window on every layer as Mistral's (default
 * none); the longrope type (top-level original_max_position_embeddings, 4096 by default) and
 * partial_rotary_factor below 1 (Phi-4-mini), read by model_config_rope.c. */
static dw_status parse_phi3(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c) {
    DW_TRY(parse_llama(ctx, j, what, c));
    c->qkv_bias = false, c->mlp_bias = false; /* Phi3Attention and Phi3MLP have none (the keys are not read) */
    return DW_OK;
}

/* The fields every mixture-of-experts family shares, after the llama ones: the expert count
 * (required, under the family's key), num_experts_per_tok, router_aux_loss_coef (defaults as
 * set by the caller), output_router_logits (the load-balancing loss joins the training loss, as in
 * transformers), router_z_loss_coef (Deepwell's: ST-MoE's router z-loss, 0 none), capacity_factor
 * (Deepwell's: assignments past an expert's capacity dropped, 0 dropless), moe_token_drop_policy
 * (Deepwell's, Megatron-Core's values: "position" (default) or "probs"), the experts' width
 * (intermediate_size), and DeepSeek-V3's routing keys (n_group, topk_group, routed_scaling_factor,
 * scoring_func: model_config_mla.c). */
static dw_status parse_moe(dw_ctx *ctx, const json_t *j, const char *what, const char *experts_key,
                           dw_model_config *c) {
    /* transformers 5 writes Qwen3-MoE's num_experts as num_local_experts (its attribute map) */
    const bool alias = !strcmp(experts_key, "num_experts") && !json_object_get(j, "num_experts") &&
                       json_object_get(j, "num_local_experts");
    DW_TRY(get_i64(ctx, j, alias ? "num_local_experts" : experts_key, what, true, &c->n_experts));
    DW_TRY(get_i64(ctx, j, "num_experts_per_tok", what, false, &c->top_k));
    DW_TRY(dw_json_get_num_opt(ctx, j, "router_aux_loss_coef", what, &c->router_aux_loss_coef));
    DW_TRY(dw_json_get_bool_opt(ctx, j, "output_router_logits", what, &c->aux_loss));
    if (c->aux_loss && !(c->router_aux_loss_coef > 0))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: output_router_logits asks for the load-balancing loss, "
                            "but router_aux_loss_coef is %g", what, c->router_aux_loss_coef);
    DW_TRY(dw_json_get_num_opt(ctx, j, "router_z_loss_coef", what, &c->router_z_loss_coef));
    if (!(c->router_z_loss_coef >= 0 && c->router_z_loss_coef < 1e3))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: router_z_loss_coef %g must be in [0, 1000)", what,
                            c->router_z_loss_coef);
    DW_TRY(dw_json_get_num_opt(ctx, j, "capacity_factor", what, &c->capacity_factor));
    if (!(c->capacity_factor >= 0 && c->capacity_factor <= 1e3))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: capacity_factor %g must be in (0, 1000], or 0 for dropless "
                            "routing", what, c->capacity_factor);
    const json_t *drop = json_object_get(j, "moe_token_drop_policy"); /* Megatron-Core's name and values */
    if (drop && !(json_is_string(drop) && (!strcmp(json_string_value(drop), "probs") ||
                                           !strcmp(json_string_value(drop), "position"))))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: moe_token_drop_policy must be \"probs\" or \"position\"", what);
    c->drop_by_weight = drop && !strcmp(json_string_value(drop), "probs");
    const json_t *topk = json_object_get(j, "topk_method"); /* DeepSeek's name: "noaux_tc" asks for the bias */
    if (topk && !(json_is_string(topk) && (!strcmp(json_string_value(topk), "noaux_tc") ||
                                           !strcmp(json_string_value(topk), "greedy"))))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: topk_method must be \"greedy\" or \"noaux_tc\" (the selection "
                            "bias of auxiliary-loss-free balancing)", what);
    c->moe_bias_speed = topk && !strcmp(json_string_value(topk), "noaux_tc") ? 0.001 : 0.0;
    DW_TRY(dw_json_get_num_opt(ctx, j, "moe_bias_update_speed", what, &c->moe_bias_speed));
    if (!(c->moe_bias_speed >= 0 && c->moe_bias_speed <= 1))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: moe_bias_update_speed %g must be in [0, 1] (0: no selection "
                            "bias)", what, c->moe_bias_speed);
    c->d_ff_expert = c->d_ff;
    return dw_group_routing_parse(ctx, j, what, c);
}

/* Mixtral: the llama fields, then the experts (every layer's MLP is a mixture of
 * num_local_experts SwiGLU experts of width intermediate_size, top num_experts_per_tok,
 * renormalised softmax weights). */
static dw_status parse_mixtral(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c) {
    DW_TRY(parse_llama(ctx, j, what, c));
    c->top_k = 2, c->router_aux_loss_coef = 0.001, c->norm_topk = true;
    DW_TRY(parse_moe(ctx, j, what, "num_local_experts", c));
    double jitter = 0.0;
    DW_TRY(dw_json_get_num_opt(ctx, j, "router_jitter_noise", what, &jitter));
    if (jitter > 0)
        DW_LOGW("%s: router_jitter_noise %g noted: Deepwell's router adds no noise (as transformers in eval)", what,
                jitter);
    return DW_OK;
}

/* OLMoE: the llama fields, RMSNorm over the whole q and k projections, and num_experts SwiGLU
 * experts of width intermediate_size, top num_experts_per_tok, renormalised only with
 * norm_topk_prob. */
static dw_status parse_olmoe(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c) {
    DW_TRY(parse_llama(ctx, j, what, c));
    c->norm_eps = 1e-5;
    DW_TRY(dw_json_get_num_opt(ctx, j, "rms_norm_eps", what, &c->norm_eps));
    c->qk_norm = true, c->top_k = 8, c->norm_topk = false, c->router_aux_loss_coef = 0.01;
    DW_TRY(parse_moe(ctx, j, what, "num_experts", c));
    DW_TRY(dw_json_get_bool_opt(ctx, j, "norm_topk_prob", what, &c->norm_topk));
    /* not a transformers key: Deepwell's own OLMoE-like shapes without q/k norms (moe-e64) say so */
    DW_TRY(dw_json_get_bool_opt(ctx, j, "deepwell_qk_norm", what, &c->qk_norm));
    const json_t *clip = json_object_get(j, "clip_qkv");
    if (clip && !json_is_null(clip))
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: field 'clip_qkv': clamping q, k, v is not supported (null only)",
                            what);
    return DW_OK;
}

/* mlp_only_layers: null or a list of layer indices in [0, num_hidden_layers), into the bitmap. */
static dw_status parse_mlp_only(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c) {
    memset(c->mlp_only, 0, sizeof c->mlp_only);
    const json_t *a = json_object_get(j, "mlp_only_layers");
    if (!a || json_is_null(a)) return DW_OK;
    if (!json_is_array(a))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'mlp_only_layers': expected a list of layer indices or null",
                            what);
    const int64_t L = c->n_layers < DW_MODEL_MAX_LAYERS ? c->n_layers : DW_MODEL_MAX_LAYERS;
    size_t i;
    const json_t *v;
    json_array_foreach(a, i, v) {
        if (!json_is_integer(v))
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'mlp_only_layers': entry %zu is not an integer", what,
                                i);
        const json_int_t l = json_integer_value(v);
        if (l < 0 || l >= L)
            return dw_set_error(ctx, DW_ERR_INVALID, "%s: field 'mlp_only_layers': entry %zu = %lld is not a layer "
                                "(num_hidden_layers %lld: 0 to %lld)", what, i, (long long)l, (long long)c->n_layers,
                                (long long)c->n_layers - 1);
        c->mlp_only[l / 64] |= (uint64_t)1 << (l % 64);
    }
    return DW_OK;
}

/* The Qwen mixture-of-experts families, after the llama fields: num_experts routed experts of
 * width moe_intermediate_size, top num_experts_per_tok, renormalised with norm_topk_prob; MoE
 * layers chosen by decoder_sparse_step and mlp_only_layers, the others dense MLPs of width
 * intermediate_size. Defaults as transformers' configs. */
static dw_status parse_qwen_moe(dw_ctx *ctx, const json_t *j, const char *what, bool qwen3, dw_model_config *c) {
    DW_TRY(parse_llama(ctx, j, what, c));
    c->top_k = qwen3 ? 8 : 4, c->norm_topk = false, c->router_aux_loss_coef = 0.001;
    DW_TRY(parse_moe(ctx, j, what, "num_experts", c));
    c->d_ff_expert = qwen3 ? 768 : 1408;
    DW_TRY(get_i64(ctx, j, "moe_intermediate_size", what, false, &c->d_ff_expert));
    DW_TRY(dw_json_get_bool_opt(ctx, j, "norm_topk_prob", what, &c->norm_topk));
    c->sparse_step = 1;
    DW_TRY(get_i64(ctx, j, "decoder_sparse_step", what, false, &c->sparse_step));
    if (c->sparse_step < 1 || c->sparse_step > DW_MODEL_MAX_LAYERS)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: field 'decoder_sparse_step' = %lld: must be 1 (every layer) to "
                            "%d", what, (long long)c->sparse_step, DW_MODEL_MAX_LAYERS);
    DW_TRY(parse_mlp_only(ctx, j, what, c));
    if (qwen3) {
        c->qk_norm_heads = true;
        return DW_OK;
    }
    c->qkv_bias = true; /* Qwen2-MoE biases q, k, v (transformers 5: qkv_bias), never o */
    DW_TRY(dw_json_get_bool_opt(ctx, j, "qkv_bias", what, &c->qkv_bias));
    c->d_ff_shared = 5632, c->shared_gate = true;
    DW_TRY(get_i64(ctx, j, "shared_expert_intermediate_size", what, false, &c->d_ff_shared));
    if (c->n_experts > 0 && c->d_ff_shared < 1)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: field 'shared_expert_intermediate_size' = %lld: every Qwen2-MoE "
                            "layer has a shared expert and its gate (shared_expert_gate), so the width must be "
                            "positive", what, (long long)c->d_ff_shared);
    return DW_OK;
}

/* Qwen2-MoE: the Qwen MoE layers plus a shared SwiGLU expert of width
 * shared_expert_intermediate_size, gated per token by sigmoid(shared_expert_gate(x)); q, k, v biases. */
static dw_status parse_qwen2_moe(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c) {
    return parse_qwen_moe(ctx, j, what, false, c);
}

/* Qwen3-MoE: the Qwen MoE layers, RMSNorm over each head of q and k (q_norm, k_norm of width
 * head_dim) before RoPE, no shared expert, biases only with attention_bias (then o too). */
static dw_status parse_qwen3_moe(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c) {
    return parse_qwen_moe(ctx, j, what, true, c);
}

dw_status dw_model_config_check(dw_ctx *ctx, const dw_model_config *c, const char *what) {
    static const char *const hf[2][8] = {
        {"vocab_size", "n_embd", "n_layer", "n_head", "n_head", "head_dim", "n_inner", "n_positions"},
        {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings"}};
    const int64_t v[8] = {c->vocab_size, c->d_model, c->n_layers, c->n_heads,
                          c->n_kv_heads, c->head_dim, c->d_ff, c->max_seq};
    /* bounds beyond any released model, so that every size product below fits in 64 bits and a
     * typo (1e12 layers) is refused at once instead of exhausting memory */
    static const int64_t limit[8] = {(int64_t)1 << 24, (int64_t)1 << 20, DW_MODEL_MAX_LAYERS, (int64_t)1 << 16,
                                     (int64_t)1 << 16, (int64_t)1 << 16, (int64_t)1 << 24, (int64_t)1 << 24};
    for (int i = 0; i < 8; i++) {
        if (v[i] <= 0)
            return dw_set_error(ctx, DW_ERR_INVALID, "%s: field '%s' = %lld: must be a positive size",
                                what, hf[c->arch != DW_ARCH_GPT2][i], (long long)v[i]);
        if (v[i] > limit[i])
            return dw_set_error(ctx, DW_ERR_INVALID, "%s: field '%s' = %lld is beyond %lld, larger than any model "
                                "Deepwell trains or plans", what, hf[c->arch != DW_ARCH_GPT2][i], (long long)v[i],
                                (long long)limit[i]);
    }
    if (c->d_ff_expert > ((int64_t)1 << 24))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: expert width %lld is beyond %lld", what, (long long)c->d_ff_expert,
                            (long long)1 << 24);
    if (c->d_ff_shared < 0 || c->d_ff_shared > ((int64_t)1 << 24) ||
        (c->shared_gate && c->n_experts && c->d_ff_shared < 1))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: shared expert width (shared_expert_intermediate_size) %lld: need "
                            "1 to %lld for a gated shared expert, 0 for none", what, (long long)c->d_ff_shared,
                            (long long)1 << 24);
    if (c->n_heads % c->n_kv_heads)
        return dw_set_error(ctx, DW_ERR_INVALID,
                            "%s: num_attention_heads (%lld) is not a multiple of "
                            "num_key_value_heads (%lld)", what, (long long)c->n_heads,
                            (long long)c->n_kv_heads);
    if (c->arch == DW_ARCH_GPT2 && c->d_model % c->n_heads)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: n_embd (%lld) is not a multiple of n_head (%lld)",
                            what, (long long)c->d_model, (long long)c->n_heads);
    if (c->pos == DW_POS_ROPE && (c->head_dim % 2 || !(c->rope_theta > 0)))
        return dw_set_error(ctx, DW_ERR_INVALID,
                            "%s: rope needs an even head_dim (%lld) and rope_theta > 0 (%g)", what,
                            (long long)c->head_dim, c->rope_theta);
    const char *rope_bad =
        c->pos == DW_POS_ROPE ? dw_rope_scaling_problem(&c->rope_scaling, c->rope_theta, c->head_dim) : NULL;
    if (rope_bad)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: rope type '%s': %s", what,
                            dw_rope_type_name(c->rope_scaling.type) ? dw_rope_type_name(c->rope_scaling.type) : "?",
                            rope_bad);
    if (c->n_experts && (c->n_experts > 4096 || c->top_k < 1 || c->top_k > c->n_experts || c->d_ff_expert < 1))
        return dw_set_error(ctx, DW_ERR_INVALID,
                            "%s: experts %lld, top-k %lld, expert width %lld: need 1 <= num_experts_per_tok <= "
                            "num_local_experts <= 4096 and a positive width", what, (long long)c->n_experts,
                            (long long)c->top_k, (long long)c->d_ff_expert);
    /* the parameter count in floating point first: within 2^48 (280 T), the integer count is exact */
    const double d = (double)c->d_model, q = (double)(c->n_heads * c->head_dim), kv = (double)(c->n_kv_heads * c->head_dim);
    const double mlp = 3.0 * d * (double)c->d_ff + 3.0 * d * (double)c->d_ff_shared +
                       (c->n_experts ? (double)c->n_experts * 3.0 * d * (double)c->d_ff_expert : 0);
    const double approx = 2.0 * (double)c->vocab_size * d + (double)c->n_layers * (2 * d * q + 2 * d * kv + mlp);
    if (approx > 281474976710656.0)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: about %.3g parameters, beyond 2^48: no such model can be planned "
                            "or trained", what, approx);
    if (!(c->norm_eps > 0) || !(c->init_std > 0))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: norm epsilon (%g) and initializer_range (%g) "
                            "must be positive", what, c->norm_eps, c->init_std);
    return DW_OK;
}

static void write_gpt2(json_t *j, const dw_model_config *c);
static void write_llama(json_t *j, const dw_model_config *c);
static void write_mixtral(json_t *j, const dw_model_config *c);
static void write_olmoe(json_t *j, const dw_model_config *c);
static void write_qwen2_moe(json_t *j, const dw_model_config *c);
static void write_qwen3_moe(json_t *j, const dw_model_config *c);
static void write_qwen3(json_t *j, const dw_model_config *c);
static void write_gemma2(json_t *j, const dw_model_config *c);
static void write_phi3(json_t *j, const dw_model_config *c);

/* Each architecture's family functions (archs.def's family column). */
static const struct {
    dw_status (*parse)(dw_ctx *, const json_t *, const char *, dw_model_config *);
    void (*write)(json_t *, const dw_model_config *);
} families[DW_ARCH_COUNT] = {
#define DW_ARCH(ID, type, cls, fam, reads_config, trains, prefix, ignorable, experts, fused) {parse_##fam, write_##fam},
#include "capture/archs.def"
#undef DW_ARCH
};

dw_status dw_model_config_from_json(dw_ctx *ctx, const json_t *j, const char *what,
                                    dw_model_config *out) {
    memset(out, 0, sizeof *out);
    if (!json_is_object(j))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: expected a JSON object", what);
    const char *type = NULL;
    DW_TRY(dw_json_get_str(ctx, j, "model_type", what, &type));
    const dw_hf_arch *a = dw_hf_arch_find(type);
    if (!a || !a->reads_config) {
        char list[256];
        dw_hf_arch_list(list, sizeof list);
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED,
                            "%s: model_type '%s' is not supported yet (supported: %s)", what, type, list);
    }
    dw_model_config c = {.arch = a->id};
    if (a->id == DW_ARCH_DEEPSEEK_V3) DW_TRY(dw_model_config_mla_parse(ctx, j, what, &c)); /* planning only */
    else {
        DW_TRY(families[a->id].parse(ctx, j, what, &c));
        c.planning_only = false;
    }
    DW_TRY(dw_model_config_check(ctx, &c, what));
    *out = c;
    return DW_OK;
}

dw_status dw_model_config_load(dw_ctx *ctx, const char *model, dw_model_config *out) {
    memset(out, 0, sizeof *out);
    if (!model || !*model) return dw_set_error(ctx, DW_ERR_INVALID, "no model given");
    struct stat st;
    char path[4096];
    if (stat(model, &st) == 0) {
        if (S_ISDIR(st.st_mode)) snprintf(path, sizeof path, "%s/config.json", model);
        else snprintf(path, sizeof path, "%s", model);
        json_t *j = NULL;
        DW_TRY(dw_json_load_file(ctx, path, &j));
        dw_status s = dw_model_config_from_json(ctx, j, path, out);
        json_decref(j);
        return s;
    }
    if (dw_model_preset_find(model, out)) return DW_OK;
    char list[512];
    dw_model_preset_list(list, sizeof list);
    return dw_set_error(ctx, DW_ERR_INVALID,
                        "model '%s' is neither a directory with config.json, a config file nor a "
                        "preset (presets: %s)", model, list);
}

static void set_int(json_t *j, const char *k, int64_t v) { json_object_set_new(j, k, json_integer(v)); }
static void set_num(json_t *j, const char *k, double v) { json_object_set_new(j, k, json_real(v)); }
static void set_bool(json_t *j, const char *k, bool v) { json_object_set_new(j, k, json_boolean(v)); }
static void set_str(json_t *j, const char *k, const char *v) {
    json_object_set_new(j, k, json_string(v));
}

static void write_gpt2(json_t *j, const dw_model_config *c) {
    set_int(j, "n_embd", c->d_model);
    set_int(j, "n_layer", c->n_layers);
    set_int(j, "n_head", c->n_heads);
    set_int(j, "n_inner", c->d_ff);
    set_int(j, "n_positions", c->max_seq);
    set_int(j, "n_ctx", c->max_seq);
    set_num(j, "layer_norm_epsilon", c->norm_eps);
    set_str(j, "activation_function", "gelu_new");
}

static void write_llama(json_t *j, const dw_model_config *c) {
    set_int(j, "hidden_size", c->d_model);
    set_int(j, "num_hidden_layers", c->n_layers);
    set_int(j, "num_attention_heads", c->n_heads);
    set_int(j, "num_key_value_heads", c->n_kv_heads);
    set_int(j, "head_dim", c->head_dim);
    set_int(j, "intermediate_size", c->d_ff);
    set_int(j, "max_position_embeddings", c->max_seq);
    set_num(j, "rms_norm_eps", c->norm_eps);
    set_str(j, "hidden_act", "silu");
    if (c->arch != DW_ARCH_QWEN2 && c->arch != DW_ARCH_QWEN2_MOE) set_bool(j, "attention_bias", c->qkv_bias);
    set_bool(j, "mlp_bias", c->mlp_bias);
    dw_model_config_write_rope(j, c); /* rope_theta, rope_scaling */
    dw_model_config_write_window(j, c); /* sliding_window, use_sliding_window, ... */
    if (c->arch == DW_ARCH_DEEPSEEK_V3) dw_model_config_mla_write(j, c); /* model_config_mla.c */
}

/* The Deepwell keys of token dropping: capacity_factor, and moe_token_drop_policy when not by position;
 * moe_bias_update_speed when the selection bias is on; the routing keys that differ from plain top-k. */
static void write_moe_drop(json_t *j, const dw_model_config *c) {
    if (c->capacity_factor > 0) set_num(j, "capacity_factor", c->capacity_factor);
    if (c->drop_by_weight) json_object_set_new(j, "moe_token_drop_policy", json_string("probs"));
    if (c->moe_bias_speed > 0) set_num(j, "moe_bias_update_speed", c->moe_bias_speed); /* the selection bias */
    dw_group_routing_write(j, c); /* n_group, topk_group, routed_scaling_factor, scoring_func */
}

/* The keys every mixture-of-experts family writes after the llama ones (the experts' width as
 * intermediate_size, the count under the family's key). */
static void write_moe(json_t *j, const dw_model_config *c, const char *experts_key) {
    write_llama(j, c);
    set_int(j, "intermediate_size", c->d_ff_expert);
    set_int(j, experts_key, c->n_experts);
    set_int(j, "num_experts_per_tok", c->top_k);
    set_num(j, "router_aux_loss_coef", c->router_aux_loss_coef);
    set_bool(j, "output_router_logits", c->aux_loss);
    if (c->router_z_loss_coef > 0) set_num(j, "router_z_loss_coef", c->router_z_loss_coef);
    write_moe_drop(j, c);
}

static void write_mixtral(json_t *j, const dw_model_config *c) {
    write_moe(j, c, "num_local_experts");
    set_num(j, "router_jitter_noise", 0.0);
}

static void write_olmoe(json_t *j, const dw_model_config *c) {
    write_moe(j, c, "num_experts");
    set_bool(j, "norm_topk_prob", c->norm_topk);
    if (!c->qk_norm) set_bool(j, "deepwell_qk_norm", false); /* transformers' OLMoE always has them */
    json_object_set_new(j, "clip_qkv", json_null());
}

/* The Qwen MoE keys: the dense width stays intermediate_size, the experts' is moe_intermediate_size. */
static void write_qwen_moe(json_t *j, const dw_model_config *c) {
    write_llama(j, c);
    set_int(j, "num_experts", c->n_experts);
    set_int(j, "num_experts_per_tok", c->top_k);
    set_int(j, "moe_intermediate_size", c->d_ff_expert);
    set_bool(j, "norm_topk_prob", c->norm_topk);
    set_int(j, "decoder_sparse_step", c->sparse_step > 0 ? c->sparse_step : 1);
    json_t *only = json_array();
    for (int64_t l = 0; l < c->n_layers && l < DW_MODEL_MAX_LAYERS; l++)
        if (c->mlp_only[l / 64] >> (l % 64) & 1) json_array_append_new(only, json_integer(l));
    json_object_set_new(j, "mlp_only_layers", only);
    set_num(j, "router_aux_loss_coef", c->router_aux_loss_coef);
    set_bool(j, "output_router_logits", c->aux_loss);
    if (c->router_z_loss_coef > 0) set_num(j, "router_z_loss_coef", c->router_z_loss_coef);
    write_moe_drop(j, c);
}

static void write_qwen2_moe(json_t *j, const dw_model_config *c) {
    write_qwen_moe(j, c);
    set_bool(j, "qkv_bias", c->qkv_bias);
    set_int(j, "shared_expert_intermediate_size", c->d_ff_shared);
}

static void write_qwen3_moe(json_t *j, const dw_model_config *c) { write_qwen_moe(j, c); }

static void write_qwen3(json_t *j, const dw_model_config *c) { write_llama(j, c); }

static void set_cap(json_t *j, const char *k, double v) { json_object_set_new(j, k, v > 0 ? json_real(v) : json_null()); }

static void write_gemma2(json_t *j, const dw_model_config *c) {
    write_llama(j, c);
    json_object_del(j, "mlp_bias");
    set_str(j, "hidden_act", "gelu_pytorch_tanh"); /* transformers' Gemma2 reads hidden_activation */
    set_str(j, "hidden_activation", "gelu_pytorch_tanh");
    json_object_set_new(j, "query_pre_attn_scalar", dw_json_whole(c->query_pre_attn_scalar)); /* int there */
    set_cap(j, "attn_logit_softcapping", c->attn_softcap);
    set_cap(j, "final_logit_softcapping", c->final_softcap);
}

static void write_phi3(json_t *j, const dw_model_config *c) {
    write_llama(j, c);
    json_object_del(j, "attention_bias");
    json_object_del(j, "mlp_bias");
}

json_t *dw_model_config_to_json(const dw_model_config *c) {
    json_t *j = json_object();
    json_t *arch = json_array();
    json_array_append_new(arch, json_string(dw_hf_arch_get(c->arch)->hf_class));
    json_object_set_new(j, "architectures", arch);
    set_str(j, "model_type", c->model_type);
    set_int(j, "vocab_size", c->vocab_size);
    families[c->arch].write(j, c);
    set_num(j, "initializer_range", c->init_std);
    set_bool(j, "tie_word_embeddings", c->tie_embeddings);
    if (c->has_pad) set_int(j, "pad_token_id", c->pad_token);
    set_str(j, "torch_dtype", "float32");
    return j;
}

dw_status dw_model_config_save(dw_ctx *ctx, const dw_model_config *cfg, const char *path) {
    json_t *j = dw_model_config_to_json(cfg);
    char *text = dw_json_dump(j, true);
    json_decref(j);
    if (!text) return dw_set_error(ctx, DW_ERR_NOMEM, "%s: could not serialise the config", path);
    size_t n = strlen(text);
    char *line = realloc(text, n + 2); /* end the file with a newline */
    if (!line) {
        free(text);
        return dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", path);
    }
    line[n] = '\n';
    line[n + 1] = '\0';
    dw_status s = dw_write_file_atomic(ctx, path, line, n + 1);
    free(line);
    return s;
}

bool dw_model_config_o_bias(const dw_model_config *c) {
    return c->linear_bias || (c->qkv_bias && (c->arch == DW_ARCH_LLAMA || c->arch == DW_ARCH_QWEN3 || c->arch == DW_ARCH_QWEN3_MOE ||
                                              c->arch == DW_ARCH_GEMMA2));
}

bool dw_model_config_moe_layer(const dw_model_config *c, int64_t l) {
    if (c->n_experts <= 0 || l < c->first_dense_layers) return false;
    if (l >= 0 && l < DW_MODEL_MAX_LAYERS && (c->mlp_only[l / 64] >> (l % 64) & 1)) return false;
    return c->sparse_step <= 1 || (l + 1) % c->sparse_step == 0;
}

/* One decoder layer's MLP parameters (dense or MoE). */
static int64_t mlp_params(const dw_model_config *c, bool moe) {
    int64_t d = c->d_model;
    bool glu = c->act != DW_ACT_GELU_TANH;
    if (moe) {
        int64_t expert = 3 * d * c->d_ff_expert;
        int64_t shared = 3 * d * c->d_ff_shared + (c->shared_gate && c->d_ff_shared ? d : 0); /* Qwen2-MoE */
        return (c->n_experts + c->n_shared_experts) * expert + shared + d * c->n_experts /* router */ +
               (c->route.expert_bias ? c->n_experts : 0);
    }
    int64_t F = c->d_ff;
    int64_t p = (glu ? 3 : 2) * d * F;
    if (c->linear_bias || c->mlp_bias) p += (glu ? 2 * F : F) + d;
    return p;
}

int64_t dw_model_config_params(const dw_model_config *c) {
    int64_t d = c->d_model, V = c->vocab_size;
    int64_t q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
    int64_t norm = c->norm == DW_NORM_LAYERNORM ? 2 * d : d;
    int64_t attn = d * q + 2 * d * kv + q * d;
    if (c->linear_bias || c->qkv_bias) attn += q + 2 * kv;
    if (dw_model_config_o_bias(c)) attn += d; /* output projection bias */
    if (c->qk_norm) attn += q + kv; /* OLMoE: RMSNorm weights over the q and k projections */
    if (c->qk_norm_heads) attn += 2 * c->head_dim; /* Qwen3: one RMSNorm weight per head_dim for q, k */
    if (c->sandwich_norms) attn += 2 * norm;       /* Gemma 2: post_attention and post_feedforward norms */
    if (c->mla.kv_lora_rank > 0) attn = dw_mla_attn_params(c); /* DeepSeek's latent attention */
    int64_t p = V * d + (c->pos == DW_POS_LEARNED ? c->max_seq * d : 0);
    for (int64_t l = 0; l < c->n_layers; l++)
        p += 2 * norm + attn + mlp_params(c, dw_model_config_moe_layer(c, l));
    p += norm;
    if (!c->tie_embeddings) p += V * d;
    return p;
}
