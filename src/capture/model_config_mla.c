/* model_config_mla.c — DeepSeek-V3's config.json (model_type deepseek_v3) <-> dw_model_config for
 * the planner: multi-head latent attention with its projection ranks, shared + routed experts,
 * the first dense layers, group-limited routing and the router bias, with exact parameter counts.
 * The model is planning-only: capture and training refuse it (no MLA in the engine yet). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "capture/model_config_impl.h"
#include "core/error.h"
#include "core/json.h"
#include "core/log.h"
#include "kernels/router_desc.h"

/* A size field: present (or defaulted, when not required) and within [lo, 2^24]. */
static dw_status get_size(dw_ctx *ctx, const json_t *j, const char *key, const char *what, bool required,
                          int64_t lo, int64_t *out) {
    long long v = *out;
    DW_TRY(required ? dw_json_get_int(ctx, j, key, what, &v) : dw_json_get_int_opt(ctx, j, key, what, &v));
    *out = (int64_t)v;
    if (*out < lo || *out > ((int64_t)1 << 24))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: field '%s' = %lld: must be %lld to %lld", what, key,
                            (long long)*out, (long long)lo, (long long)1 << 24);
    return DW_OK;
}

/* q_lora_rank: an integer, or null for a model that projects q directly (DeepSeek-V2-Lite);
 * absent keeps the default. */
static dw_status get_q_lora(dw_ctx *ctx, const json_t *j, const char *what, int64_t *out) {
    const json_t *v = json_object_get(j, "q_lora_rank");
    if (v && json_is_null(v)) *out = 0;
    return v && !json_is_null(v) ? get_size(ctx, j, "q_lora_rank", what, true, 1, out) : DW_OK;
}

dw_status dw_model_config_mla_parse(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c) {
    /* defaults: DeepSeek-V3's own values, as transformers' DeepseekV3Config has them */
    dw_model_preset_find("deepseek-v3", c);
    c->rope_theta = 10000.0;
    /* the shape; dw_model_config_check bounds it after the parse */
    static const char *const keys[] = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                       "intermediate_size", "max_position_embeddings"};
    int64_t *fields[] = {&c->vocab_size, &c->d_model, &c->n_layers, &c->n_heads, &c->d_ff, &c->max_seq};
    for (int i = 0; i < 6; i++) DW_TRY(get_size(ctx, j, keys[i], what, true, 1, fields[i]));
    dw_mla_dims *m = &c->mla;
    DW_TRY(get_q_lora(ctx, j, what, &m->q_lora_rank));
    DW_TRY(get_size(ctx, j, "kv_lora_rank", what, false, 1, &m->kv_lora_rank));
    DW_TRY(get_size(ctx, j, "qk_nope_head_dim", what, false, 0, &m->qk_nope_head_dim));
    DW_TRY(get_size(ctx, j, "qk_rope_head_dim", what, false, 2, &m->qk_rope_head_dim));
    DW_TRY(get_size(ctx, j, "v_head_dim", what, false, 1, &m->v_head_dim));
    if (m->qk_rope_head_dim % 2)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: field 'qk_rope_head_dim' = %lld: RoPE needs an even width",
                            what, (long long)m->qk_rope_head_dim);
    /* the attention head as the planner's generic fields see it: scores over nope + rope channels;
     * MLA has no grouped K/V heads (every head has its own K and V from the latent) */
    c->head_dim = m->qk_nope_head_dim + m->qk_rope_head_dim;
    c->n_kv_heads = c->n_heads;
    DW_TRY(dw_json_get_num_opt(ctx, j, "rms_norm_eps", what, &c->norm_eps));
    DW_TRY(dw_json_get_num_opt(ctx, j, "rope_theta", what, &c->rope_theta));
    DW_TRY(dw_json_get_num_opt(ctx, j, "initializer_range", what, &c->init_std));
    DW_TRY(dw_json_get_bool_opt(ctx, j, "tie_word_embeddings", what, &c->tie_embeddings));
    bool bias = false;
    DW_TRY(dw_json_get_bool_opt(ctx, j, "attention_bias", what, &bias));
    if (bias)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: field 'attention_bias': true is not supported "
                            "(DeepSeek-V3's projections have no biases)", what);
    const char *act = "silu";
    DW_TRY(dw_json_get_str_opt(ctx, j, "hidden_act", what, &act));
    if (strcmp(act, "silu"))
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: field 'hidden_act': '%s' is not supported (supported: silu)",
                            what, act);
    /* experts: n_routed_experts of moe_intermediate_size, n_shared_experts of the same width always
     * on, the first first_k_dense_replace layers dense (intermediate_size) */
    DW_TRY(get_size(ctx, j, "n_routed_experts", what, false, 1, &c->n_experts));
    DW_TRY(get_size(ctx, j, "num_experts_per_tok", what, false, 1, &c->top_k));
    DW_TRY(get_size(ctx, j, "moe_intermediate_size", what, false, 1, &c->d_ff_expert));
    DW_TRY(get_size(ctx, j, "n_shared_experts", what, false, 0, &c->n_shared_experts));
    DW_TRY(get_size(ctx, j, "first_k_dense_replace", what, false, 0, &c->first_dense_layers));
    int64_t freq = 1;
    DW_TRY(get_size(ctx, j, "moe_layer_freq", what, false, 1, &freq));
    if (freq != 1)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: field 'moe_layer_freq' = %lld: only 1 (every layer past "
                            "first_k_dense_replace is MoE) is supported", what, (long long)freq);
    if (c->first_dense_layers > c->n_layers)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: field 'first_k_dense_replace' = %lld exceeds num_hidden_layers "
                            "%lld", what, (long long)c->first_dense_layers, (long long)c->n_layers);
    DW_TRY(dw_json_get_bool_opt(ctx, j, "norm_topk_prob", what, &c->norm_topk));
    dw_group_routing *r = &c->route;
    r->sigmoid = true, r->routed_scale = 2.5; /* DeepSeek-V3's scores and scale (transformers' defaults) */
    DW_TRY(dw_group_routing_parse(ctx, j, what, c));
    const char *method = "noaux_tc";
    DW_TRY(dw_json_get_str_opt(ctx, j, "topk_method", what, &method));
    r->expert_bias = !strcmp(method, "noaux_tc");
    DW_TRY(get_size(ctx, j, "num_nextn_predict_layers", what, false, 0, &r->n_mtp_layers));
    const json_t *rs = json_object_get(j, "rope_scaling");
    if (rs && !json_is_null(rs))
        DW_LOGI("%s: rope_scaling noted; it changes no size the planner counts", what);
    c->planning_only = true;
    return DW_OK;
}

static void set_int(json_t *j, const char *k, int64_t v) { json_object_set_new(j, k, json_integer(v)); }

dw_status dw_group_routing_parse(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c) {
    dw_group_routing *r = &c->route;
    const int64_t E = c->n_experts;
    if (r->n_group < 1) r->n_group = 1, r->topk_group = 0; /* no family default: every group kept */
    DW_TRY(get_size(ctx, j, "n_group", what, false, 1, &r->n_group));
    if (r->topk_group < 1 || r->topk_group > r->n_group) r->topk_group = r->n_group; /* absent: as many as there are */
    DW_TRY(get_size(ctx, j, "topk_group", what, false, 1, &r->topk_group));
    if (r->n_group > DW_ROUTER_MAX_GROUPS || E % r->n_group)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: field 'n_group' = %lld: must divide the %lld routed experts into "
                            "equal groups, at most %d of them", what, (long long)r->n_group, (long long)E,
                            DW_ROUTER_MAX_GROUPS);
    if (r->topk_group > r->n_group)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: field 'topk_group' = %lld exceeds n_group %lld", what,
                            (long long)r->topk_group, (long long)r->n_group);
    const int64_t reach = r->topk_group * (E / r->n_group);
    if (r->topk_group < r->n_group && c->top_k > reach) /* else dw_model_config_check bounds top_k */
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: field 'num_experts_per_tok' = %lld exceeds the %lld experts of "
                            "topk_group %lld groups (n_group %lld)", what, (long long)c->top_k, (long long)reach,
                            (long long)r->topk_group, (long long)r->n_group);
    if (r->routed_scale <= 0) r->routed_scale = 1.0;
    DW_TRY(dw_json_get_num_opt(ctx, j, "routed_scaling_factor", what, &r->routed_scale));
    if (!(r->routed_scale > 0 && isfinite(r->routed_scale)))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: field 'routed_scaling_factor' = %g: must be finite and > 0", what,
                            r->routed_scale);
    const char *score = r->sigmoid ? "sigmoid" : "softmax";
    DW_TRY(dw_json_get_str_opt(ctx, j, "scoring_func", what, &score));
    if (strcmp(score, "softmax") && strcmp(score, "sigmoid"))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: field 'scoring_func' = '%s': must be \"softmax\" or \"sigmoid\"",
                            what, score);
    r->sigmoid = !strcmp(score, "sigmoid");
    if (r->n_group == 1) r->n_group = r->topk_group = 0; /* plain routing reads back as the presets hold it */
    if (r->routed_scale == 1.0) r->routed_scale = 0;
    return DW_OK;
}

void dw_group_routing_write(json_t *j, const dw_model_config *c) {
    const dw_group_routing *r = &c->route;
    if (r->n_group > 1) set_int(j, "n_group", r->n_group), set_int(j, "topk_group", r->topk_group);
    if (r->routed_scale > 0 && r->routed_scale != 1.0)
        json_object_set_new(j, "routed_scaling_factor", json_real(r->routed_scale));
    if (r->sigmoid) json_object_set_new(j, "scoring_func", json_string("sigmoid"));
}

void dw_model_config_mla_write(json_t *j, const dw_model_config *c) {
    set_int(j, "hidden_size", c->d_model);
    set_int(j, "num_hidden_layers", c->n_layers);
    set_int(j, "num_attention_heads", c->n_heads);
    set_int(j, "num_key_value_heads", c->n_kv_heads);
    set_int(j, "intermediate_size", c->d_ff);
    set_int(j, "max_position_embeddings", c->max_seq);
    json_object_set_new(j, "rms_norm_eps", json_real(c->norm_eps));
    json_object_set_new(j, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(j, "hidden_act", json_string("silu"));
    json_object_set_new(j, "attention_bias", json_false());
    json_object_set_new(j, "q_lora_rank", c->mla.q_lora_rank > 0 ? json_integer(c->mla.q_lora_rank) : json_null());
    set_int(j, "kv_lora_rank", c->mla.kv_lora_rank);
    set_int(j, "qk_nope_head_dim", c->mla.qk_nope_head_dim);
    set_int(j, "qk_rope_head_dim", c->mla.qk_rope_head_dim);
    set_int(j, "v_head_dim", c->mla.v_head_dim);
    set_int(j, "n_routed_experts", c->n_experts);
    set_int(j, "num_experts_per_tok", c->top_k);
    set_int(j, "moe_intermediate_size", c->d_ff_expert);
    set_int(j, "n_shared_experts", c->n_shared_experts);
    set_int(j, "first_k_dense_replace", c->first_dense_layers);
    set_int(j, "moe_layer_freq", 1);
    json_object_set_new(j, "norm_topk_prob", json_boolean(c->norm_topk));
    set_int(j, "n_group", c->route.n_group);
    set_int(j, "topk_group", c->route.topk_group);
    json_object_set_new(j, "routed_scaling_factor", json_real(c->route.routed_scale > 0 ? c->route.routed_scale : 1.0));
    json_object_set_new(j, "scoring_func", json_string(c->route.sigmoid ? "sigmoid" : "softmax"));
    json_object_set_new(j, "topk_method", json_string(c->route.expert_bias ? "noaux_tc" : "greedy"));
    set_int(j, "num_nextn_predict_layers", c->route.n_mtp_layers);
}

/* The projections' matrices (see model_config_mla.h for their shapes). */
int64_t dw_mla_attn_matmul(const dw_model_config *c) {
    const dw_mla_dims *m = &c->mla;
    int64_t d = c->d_model, H = c->n_heads, qk = m->qk_nope_head_dim + m->qk_rope_head_dim;
    int64_t q = m->q_lora_rank > 0 ? d * m->q_lora_rank + m->q_lora_rank * H * qk : d * H * qk;
    int64_t kv = d * (m->kv_lora_rank + m->qk_rope_head_dim) + m->kv_lora_rank * H * (m->qk_nope_head_dim + m->v_head_dim);
    return q + kv + H * m->v_head_dim * d;
}

int64_t dw_mla_attn_params(const dw_model_config *c) {
    return dw_mla_attn_matmul(c) + c->mla.q_lora_rank + c->mla.kv_lora_rank; /* + the two latent RMSNorms */
}
