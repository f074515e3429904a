/* model_config_window.c — sliding-window attention in a Hugging Face config.json, both ways, as
 * transformers reads it:
 *   mistral, mixtral, phi3: sliding_window (null: none; absent: Mistral's 4096, none for the others) on
 *     every layer;
 *   qwen2, qwen2_moe, qwen3, qwen3_moe: with use_sliding_window (default false), sliding_window on
 *     layers l >= max_window_layers (default 28);
 *   gemma2: sliding_window (default 4096; null: none) on the even layers 0, 2, 4, ... (transformers 4's
 *     is_sliding, transformers 5's default layer_types);
 *   any of them with layer_types (transformers >= 4.53 and 5): "sliding_attention" layers windowed,
 *     "full_attention" layers not (it wins over max_window_layers and gemma2's even layers).
 * Other families (llama, olmoe, gpt2) have no window: their keys are ignored, as transformers does.
 * A window of W keys lets query t see keys t-W+1..t (the attention op's attrs.window). */
#include <stdio.h>
#include <string.h>

#include "capture/model_config_impl.h"
#include "core/error.h"
#include "core/json.h"

static bool mistral_like(dw_arch a) { return a == DW_ARCH_MISTRAL || a == DW_ARCH_MIXTRAL || a == DW_ARCH_PHI3; }
static bool qwen_like(dw_arch a) {
    return a == DW_ARCH_QWEN2 || a == DW_ARCH_QWEN2_MOE || a == DW_ARCH_QWEN3 || a == DW_ARCH_QWEN3_MOE;
}

bool dw_model_config_windowed(const dw_model_config *c, int64_t l) {
    return c->sliding_window > 0 && l >= 0 && l < DW_MODEL_MAX_LAYERS && (c->window_layers[l / 64] >> (l % 64) & 1);
}

static void set_layer(dw_model_config *c, int64_t l) { c->window_layers[l / 64] |= (uint64_t)1 << (l % 64); }

/* layer_types: a list of num_hidden_layers strings, each "full_attention" or "sliding_attention". */
static dw_status parse_layer_types(dw_ctx *ctx, const json_t *a, const char *what, dw_model_config *c) {
    if (!json_is_array(a) || (int64_t)json_array_size(a) != c->n_layers)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'layer_types': expected a list of %lld strings (one per "
                            "layer: \"full_attention\" or \"sliding_attention\")", what, (long long)c->n_layers);
    size_t i;
    const json_t *v;
    json_array_foreach(a, i, v) {
        const char *s = json_is_string(v) ? json_string_value(v) : NULL;
        if (s && !strcmp(s, "sliding_attention")) set_layer(c, (int64_t)i);
        else if (!s || strcmp(s, "full_attention"))
            return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: field 'layer_types': entry %zu is %s%s%s (supported: "
                                "full_attention, sliding_attention)", what, i, s ? "'" : "not a string", s ? s : "",
                                s ? "'" : "");
    }
    return DW_OK;
}

dw_status dw_model_config_parse_window(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c) {
    c->sliding_window = 0;
    memset(c->window_layers, 0, sizeof c->window_layers);
    const bool gemma = c->arch == DW_ARCH_GEMMA2;
    if (!mistral_like(c->arch) && !qwen_like(c->arch) && !gemma) return DW_OK;
    long long window = c->arch == DW_ARCH_MIXTRAL || c->arch == DW_ARCH_PHI3 ? 0 : 4096; /* the configs' defaults */
    const json_t *jw = json_object_get(j, "sliding_window");
    if (jw && json_is_null(jw)) window = 0;
    else DW_TRY(dw_json_get_int_opt(ctx, j, "sliding_window", what, &window));
    if (window < 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: field 'sliding_window' = %lld: must be positive (or null: none)",
                            what, window);
    bool use = mistral_like(c->arch) || gemma;
    DW_TRY(dw_json_get_bool_opt(ctx, j, "use_sliding_window", what, &use));
    long long first = qwen_like(c->arch) ? 28 : 0; /* max_window_layers */
    if (qwen_like(c->arch)) DW_TRY(dw_json_get_int_opt(ctx, j, "max_window_layers", what, &first));
    if (first < 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: field 'max_window_layers' = %lld: must be 0 or more", what, first);
    if (!use || window == 0) return DW_OK; /* full attention everywhere (layer_types then says full_attention) */
    c->sliding_window = window;
    const json_t *types = json_object_get(j, "layer_types");
    if (types && !json_is_null(types)) return parse_layer_types(ctx, types, what, c);
    for (int64_t l = first; l < c->n_layers && l < DW_MODEL_MAX_LAYERS; l += gemma ? 2 : 1) set_layer(c, l);
    return DW_OK;
}

void dw_model_config_write_window(json_t *j, const dw_model_config *c) {
    const bool gemma = c->arch == DW_ARCH_GEMMA2;
    if (!mistral_like(c->arch) && !qwen_like(c->arch) && !gemma) return;
    int64_t first = c->n_layers, count = 0; /* the first windowed layer; how many are */
    for (int64_t l = c->n_layers - 1; l >= 0; l--)
        if (dw_model_config_windowed(c, l)) first = l, count++;
    const bool suffix = count == c->n_layers - first; /* exactly layers first..L-1 */
    json_object_set_new(j, "sliding_window", count ? json_integer(c->sliding_window) : json_null());
    if (qwen_like(c->arch)) {
        json_object_set_new(j, "use_sliding_window", json_boolean(count > 0));
        json_object_set_new(j, "max_window_layers", json_integer(count ? first : c->n_layers));
    }
    if (count && (gemma || (qwen_like(c->arch) ? !suffix : count != c->n_layers))) { /* only layer_types says which */
        json_t *types = json_array();
        for (int64_t l = 0; l < c->n_layers; l++)
            json_array_append_new(types, json_string(dw_model_config_windowed(c, l) ? "sliding_attention"
                                                                                      : "full_attention"));
        json_object_set_new(j, "layer_types", types);
    }
}
