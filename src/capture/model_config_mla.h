/* model_config_mla.h — private: DeepSeek-V3's config fields beyond the llama family: multi-head
 * latent attention (MLA: low-rank q and kv projections, a shared RoPE key, a cached latent) and
 * group-limited routing. Parsed from a deepseek_v3 config.json for the planner only: capture and
 * training refuse the model (planning_only). The types are fields of dw_model_config. */
#ifndef DW_CAPTURE_MODEL_CONFIG_MLA_H
#define DW_CAPTURE_MODEL_CONFIG_MLA_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"

/* Multi-head latent attention (DeepSeek-V2/V3), per layer, H heads, d model width:
 *   q_a_proj  [d, q_lora]            (absent when q_lora_rank is 0: q_proj [d, H (nope + rope)])
 *   q_a_layernorm [q_lora]
 *   q_b_proj  [q_lora, H (nope + rope)]
 *   kv_a_proj_with_mqa [d, kv_lora + rope]   (the latent c_kv and one RoPE key shared by all heads)
 *   kv_a_layernorm [kv_lora]
 *   kv_b_proj [kv_lora, H (nope + v)]        (per-head K_nope and V from the latent)
 *   o_proj    [H v, d]
 * Attention scores use nope + rope channels per head, values v channels. kv_lora_rank 0: not MLA. */
typedef struct {
    int64_t q_lora_rank, kv_lora_rank;
    int64_t qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
} dw_mla_dims;

/* Group-limited (DeepSeek-V3: node-limited) routing: the routed experts form n_group groups, a
 * token first picks topk_group groups, then its top_k experts inside them (0 or 1 group: plain
 * top-k, as 0 and 0 after a parse). sigmoid: the router scores by sigmoid (scoring_func), else
 * softmax; routed_scale: the weights' factor (routed_scaling_factor; 0: 1, as after a parse). The router op takes all four (capture.c,
 * kernels/router_desc.h). expert_bias: the router has a per-expert bias (e_score_correction_bias,
 * auxiliary-loss-free balancing), one parameter per routed expert (DeepSeek-V3's count; the
 * families capture trains keep it as the selection bias's state, train/moe_bias.h, not a graph
 * parameter). n_mtp_layers: multi-token prediction modules in the checkpoint
 * (num_nextn_predict_layers), not part of the model's parameter count. */
typedef struct {
    int64_t n_group, topk_group;
    bool sigmoid;
    double routed_scale;
    bool expert_bias;
    int64_t n_mtp_layers;
} dw_group_routing;

struct dw_model_config_s;
struct json_t;

/* Parses a deepseek_v3 config.json object (`what` names the file in errors) into *c, which the
 * caller zeroed: a planning-only model. Errors name the field. */
dw_status dw_model_config_mla_parse(dw_ctx *ctx, const struct json_t *j, const char *what,
                                    struct dw_model_config_s *c);
/* The routing keys of any MoE family's config.json (`what` names the file; c's expert count and
 * top_k already parsed, c->route holding the family's defaults): n_group, topk_group,
 * routed_scaling_factor, scoring_func ("softmax" | "sigmoid"). Refused naming the file and field:
 * n_group not dividing the experts or above 64, topk_group above n_group, num_experts_per_tok
 * beyond the experts of topk_group groups, a scale not finite and > 0, another scoring_func. */
dw_status dw_group_routing_parse(dw_ctx *ctx, const struct json_t *j, const char *what, struct dw_model_config_s *c);
/* Those keys into j where they differ from plain routing (the inverse of the parser). */
void dw_group_routing_write(struct json_t *j, const struct dw_model_config_s *c);
/* Writes the deepseek_v3 keys of c into the config.json object j (the inverse of the parser). */
void dw_model_config_mla_write(struct json_t *j, const struct dw_model_config_s *c);
/* Parameters of one MLA attention block (the projections and the two latent norms). */
int64_t dw_mla_attn_params(const struct dw_model_config_s *c);
/* Of those, the matrices (the GEMM weights a token passes through). */
int64_t dw_mla_attn_matmul(const struct dw_model_config_s *c);

#endif /* DW_CAPTURE_MODEL_CONFIG_MLA_H */
