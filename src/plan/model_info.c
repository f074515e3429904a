/* model_info.c — deepwell.h's dw_model_info_load: a model config (preset or config.json) as the
 * public struct the CLI lists. Reads capture's parser; adds nothing to it. */
#include <stdio.h>

#include "capture/model_config.h"
#include "core/error.h"
#include "core/sized.h"

dw_status dw_model_info_load(dw_ctx *ctx, const char *model, dw_model_info *out) {
    if (!model || !out) return dw_set_error(ctx, DW_ERR_INVALID, "dw_model_info_load: NULL argument");
    dw_model_info i = {.size = sizeof i};
    if (!dw_sized_write(out, &i, sizeof i))
        return dw_set_error(ctx, DW_ERR_INVALID, "dw_model_info_load: out->size is 0 (set it to sizeof the struct)");
    dw_model_config c;
    DW_TRY(dw_model_config_load(ctx, model, &c));
    snprintf(i.model_type, sizeof i.model_type, "%s", c.model_type);
    i.vocab_size = c.vocab_size, i.d_model = c.d_model, i.n_layers = c.n_layers, i.n_heads = c.n_heads;
    i.n_kv_heads = c.n_kv_heads, i.head_dim = c.head_dim, i.d_ff = c.d_ff, i.max_seq = c.max_seq;
    i.n_experts = c.n_experts, i.top_k = c.top_k;
    i.params = dw_model_config_params(&c);
    i.planning_only = c.planning_only;
    dw_sized_write(out, &i, sizeof i);
    return DW_OK;
}
