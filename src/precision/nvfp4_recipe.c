/* nvfp4_recipe.c — a policy's NVFP4 training recipe: defaults, JSON in and out, and which nodes
 * it keeps in BF16 (nvfp4_recipe.h). */
#include <fnmatch.h>
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "precision/nvfp4_recipe.h"

dw_nvfp4_recipe dw_nvfp4_recipe_default(void) {
    return (dw_nvfp4_recipe){.rht = true, .weight_2d = true, .sr = true, .bf16_last_blocks = 0.15, .bf16_head = true,
                             .seed = 0};
}

static const char *const BOOL_KEYS[] = {"rht", "weight_2d", "stochastic_rounding", "bf16_head"};

static bool *bool_field(dw_nvfp4_recipe *r, int k) {
    bool *f[] = {&r->rht, &r->weight_2d, &r->sr, &r->bf16_head};
    return f[k];
}

dw_status dw_nvfp4_recipe_parse(dw_ctx *ctx, const json_t *v, const char *path, dw_nvfp4_recipe *r) {
    if (!v) return DW_OK;
    if (!json_is_object(v))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'nvfp4': expected an object like {\"rht\": true, "
                            "\"bf16_last_blocks\": 0.15}", path);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val) {
        int b = -1;
        for (int k = 0; k < 4; k++)
            if (!strcmp(key, BOOL_KEYS[k])) b = k;
        if (b >= 0) {
            if (!json_is_boolean(val))
                return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'nvfp4.%s': expected true or false", path, key);
            *bool_field(r, b) = json_is_true(val);
        } else if (!strcmp(key, "bf16_last_blocks")) {
            const double f = json_is_number(val) ? json_number_value(val) : -1;
            if (!(f >= 0 && f <= 1))
                return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'nvfp4.bf16_last_blocks': expected a fraction of "
                                    "the blocks in [0, 1] (0.15 keeps the last 15%% in BF16)", path);
            r->bf16_last_blocks = f;
        } else if (!strcmp(key, "seed")) {
            if (!json_is_integer(val) || json_integer_value(val) < 0)
                return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'nvfp4.seed': expected an integer >= 0", path);
            r->seed = (uint64_t)json_integer_value(val);
        } else {
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'nvfp4': unknown key '%s' (expected rht, weight_2d, "
                                "stochastic_rounding, bf16_last_blocks, bf16_head, seed)", path, key);
        }
    }
    return DW_OK;
}

json_t *dw_nvfp4_recipe_json(const dw_nvfp4_recipe *r) {
    return json_pack("{s:b,s:b,s:b,s:f,s:b,s:I}", "rht", r->rht, "weight_2d", r->weight_2d, "stochastic_rounding",
                     r->sr, "bf16_last_blocks", r->bf16_last_blocks, "bf16_head", r->bf16_head, "seed",
                     (json_int_t)r->seed);
}

int64_t dw_nvfp4_bf16_tail(const dw_nvfp4_recipe *r, int64_t n_layers) {
    if (!(r->bf16_last_blocks > 0) || n_layers <= 0) return 0;
    const int64_t n = (int64_t)floor(r->bf16_last_blocks * (double)n_layers + 0.5);
    return n > n_layers ? n_layers : n;
}

bool dw_nvfp4_keeps_bf16(const dw_nvfp4_recipe *r, const char *node_name, long layer, int64_t n_layers) {
    if (r->bf16_head && fnmatch("*lm_head*", node_name, 0) == 0) return true;
    return layer >= 0 && layer >= n_layers - dw_nvfp4_bf16_tail(r, n_layers);
}
