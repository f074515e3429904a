/* model_config_rope.c — RoPE's base and frequency type in a Hugging Face config.json, both ways:
 * transformers 4's rope_theta beside rope_scaling {"rope_type" (or "type"), "factor", ...} and
 * transformers 5's rope_parameters {"rope_type", "rope_theta", ...} (read last: it wins when a
 * config has both). Types default, linear, llama3 and yarn (kernels/rope_freq.h computes their
 * frequencies); dynamic, longrope and any other type are refused by name. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "capture/model_config_impl.h"
#include "core/error.h"
#include "core/json.h"

/* Yarn's attention factor from the magnitude scale: 1 up to factor 1, else 0.1 m ln(factor) + 1. */
static double yarn_mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * log(factor) + 1.0; }

/* partial_rotary_factor (at the top level or in a rope object): 1 only. */
static dw_status whole_head(dw_ctx *ctx, const json_t *o, const char *what) {
    double partial = 1.0;
    DW_TRY(dw_json_get_num_opt(ctx, o, "partial_rotary_factor", what, &partial));
    if (partial != 1.0)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: partial_rotary_factor %g is not supported (1 only: RoPE over "
                            "the whole head)", what, partial);
    return DW_OK;
}

/* The fields of one rope object `o` (the config's key `key`) into c. */
static dw_status parse_rope_object(dw_ctx *ctx, const json_t *o, const char *key, const char *file,
                                   dw_model_config *c) {
    if (!json_is_object(o))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field '%s': expected an object or null", file, key);
    char what[600];
    snprintf(what, sizeof what, "%s: field '%s'", file, key); /* errors: "config.json: field 'rope_scaling': ..." */
    const char *type = NULL;
    DW_TRY(dw_json_get_str_opt(ctx, o, "rope_type", what, &type));
    if (!type) DW_TRY(dw_json_get_str_opt(ctx, o, "type", what, &type)); /* transformers before 4.43 */
    if (!type) type = "default";
    dw_rope_scaling r = {.type = -1};
    for (int32_t t = 0; t < DW_ROPE_TYPE_COUNT; t++)
        if (!strcmp(type, dw_rope_type_name(t))) r.type = t;
    if (r.type < 0)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: rope type '%s' is not supported (supported: default, linear, "
                            "llama3, yarn)", what, type);
    DW_TRY(dw_json_get_num_opt(ctx, o, "rope_theta", what, &c->rope_theta));
    DW_TRY(whole_head(ctx, o, what));
    if (r.type == DW_ROPE_YARN) { /* factor optional: the ratio of the positions then */
        r.original_max = (double)c->max_seq;
        DW_TRY(dw_json_get_num_opt(ctx, o, "original_max_position_embeddings", what, &r.original_max));
        r.factor = r.original_max > 0 ? (double)c->max_seq / r.original_max : 0;
        DW_TRY(dw_json_get_num_opt(ctx, o, "factor", what, &r.factor));
        r.beta_fast = 32, r.beta_slow = 1, r.truncate = true;
        DW_TRY(dw_json_get_num_opt(ctx, o, "beta_fast", what, &r.beta_fast));
        DW_TRY(dw_json_get_num_opt(ctx, o, "beta_slow", what, &r.beta_slow));
        DW_TRY(dw_json_get_bool_opt(ctx, o, "truncate", what, &r.truncate));
        double mscale = 0, mscale_all_dim = 0;
        DW_TRY(dw_json_get_num_opt(ctx, o, "mscale", what, &mscale));
        DW_TRY(dw_json_get_num_opt(ctx, o, "mscale_all_dim", what, &mscale_all_dim));
        r.attention_factor = mscale && mscale_all_dim
                                 ? yarn_mscale(r.factor, mscale) / yarn_mscale(r.factor, mscale_all_dim)
                                 : yarn_mscale(r.factor, 1.0);
        DW_TRY(dw_json_get_num_opt(ctx, o, "attention_factor", what, &r.attention_factor));
    } else if (r.type != DW_ROPE_DEFAULT) {
        DW_TRY(dw_json_get_num(ctx, o, "factor", what, &r.factor));
    }
    if (r.type == DW_ROPE_LLAMA3) {
        DW_TRY(dw_json_get_num(ctx, o, "low_freq_factor", what, &r.low_freq_factor));
        DW_TRY(dw_json_get_num(ctx, o, "high_freq_factor", what, &r.high_freq_factor));
        DW_TRY(dw_json_get_num(ctx, o, "original_max_position_embeddings", what, &r.original_max));
    }
    if (r.type == DW_ROPE_DEFAULT) r = (dw_rope_scaling){0};
    const char *bad = dw_rope_scaling_problem(&r, c->rope_theta);
    if (bad) return dw_set_error(ctx, DW_ERR_INVALID, "%s: rope type '%s': %s", what, type, bad);
    c->rope_scaling = r;
    return DW_OK;
}

dw_status dw_model_config_parse_rope(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c) {
    c->rope_scaling = (dw_rope_scaling){0};
    DW_TRY(dw_json_get_num_opt(ctx, j, "rope_theta", what, &c->rope_theta));
    DW_TRY(whole_head(ctx, j, what));
    static const char *const keys[] = {"rope_scaling", "rope_parameters"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const json_t *o = json_object_get(j, keys[k]);
        if (o && !json_is_null(o)) DW_TRY(parse_rope_object(ctx, o, keys[k], what, c));
    }
    return DW_OK;
}

void dw_model_config_write_rope(json_t *j, const dw_model_config *c) {
    json_object_set_new(j, "rope_theta", json_real(c->rope_theta));
    const dw_rope_scaling *r = &c->rope_scaling;
    if (r->type == DW_ROPE_DEFAULT) {
        json_object_set_new(j, "rope_scaling", json_null());
        return;
    }
    json_t *o = json_object(); /* transformers 4's form, which transformers 5 also reads */
    json_object_set_new(o, "rope_type", json_string(dw_rope_type_name(r->type)));
    json_object_set_new(o, "factor", json_real(r->factor));
    if (r->type != DW_ROPE_LINEAR) /* an integer, as transformers writes it */
        json_object_set_new(o, "original_max_position_embeddings",
                            r->original_max == floor(r->original_max) && r->original_max < 9e15
                                ? json_integer((json_int_t)r->original_max)
                                : json_real(r->original_max));
    if (r->type == DW_ROPE_LLAMA3) {
        json_object_set_new(o, "low_freq_factor", json_real(r->low_freq_factor));
        json_object_set_new(o, "high_freq_factor", json_real(r->high_freq_factor));
    }
    if (r->type == DW_ROPE_YARN) {
        json_object_set_new(o, "beta_fast", json_real(r->beta_fast));
        json_object_set_new(o, "beta_slow", json_real(r->beta_slow));
        json_object_set_new(o, "attention_factor", json_real(r->attention_factor));
        json_object_set_new(o, "truncate", json_boolean(r->truncate));
    }
    json_object_set_new(j, "rope_scaling", o);
}
