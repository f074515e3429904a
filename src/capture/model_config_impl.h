/* model_config_impl.h — private to capture/ and ir/: presets lookup and the config <-> JSON
 * conversions shared by config.json loading/saving and the graph's JSON form. */
#ifndef DW_CAPTURE_MODEL_CONFIG_IMPL_H
#define DW_CAPTURE_MODEL_CONFIG_IMPL_H

#include <stddef.h>

#include <jansson.h>

#include "capture/model_config.h"

/* Fills *out with the preset `name`; false when there is none. */
bool dw_model_preset_find(const char *name, dw_model_config *out);
/* "gpt2-tiny, gpt2-124m, ..." into buf. */
void dw_model_preset_list(char *buf, size_t n);

/* Parses a Hugging Face config object; `what` (the file name) prefixes every error. */
dw_status dw_model_config_from_json(dw_ctx *ctx, const json_t *j, const char *what,
                                    dw_model_config *out);
/* RoPE (model_config_rope.c): rope_theta, partial_rotary_factor (1 only) and the rope type of
 * rope_scaling / rope_parameters into c->rope_theta and c->rope_scaling (c->max_seq read first:
 * yarn's default original positions); refuses unsupported types by name. Writes them back as
 * rope_theta and rope_scaling (null for the default type). */
dw_status dw_model_config_parse_rope(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c);
void dw_model_config_write_rope(json_t *j, const dw_model_config *c);
/* A positive whole number as transformers writes it (an integer: its strict config classes refuse
 * 24.0 for an int field), else a real. */
json_t *dw_json_whole(double v);
/* Sliding windows (model_config_window.c): the family's keys (sliding_window, use_sliding_window,
 * max_window_layers, layer_types; c->n_layers read first) into c->sliding_window and
 * c->window_layers, and written back the same way. */
dw_status dw_model_config_parse_window(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c);
void dw_model_config_write_window(json_t *j, const dw_model_config *c);
/* The Hugging Face config.json object for cfg (new reference). */
json_t *dw_model_config_to_json(const dw_model_config *cfg);
/* Checks the fields' consistency (positive sizes, heads divide, ...); `what` names the source. */
dw_status dw_model_config_check(dw_ctx *ctx, const dw_model_config *cfg, const char *what);

/* Whether the attention output projection has a bias: GPT-2 always, Llama, Qwen3 and Qwen3-MoE
 * with attention_bias (q, k, v, o all biased), never Mistral or Qwen2 (whose q, k, v biases stop
 * there). */
bool dw_model_config_o_bias(const dw_model_config *cfg);

#endif /* DW_CAPTURE_MODEL_CONFIG_IMPL_H */
