/* thresholds.c — a policy's "max_rel_error" field (thresholds.h). */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "precision/thresholds.h"

static dw_status one(dw_ctx *ctx, const json_t *v, const char *path, const char *key, double *out) {
    const double x = json_is_number(v) ? json_number_value(v) : NAN;
    if (!(x > 0 && x <= 1e6))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'max_rel_error'%s%s: expected a number > 0 (a relative "
                            "error such as 0.2)", path, key ? "." : "", key ? key : "");
    *out = x;
    return DW_OK;
}

dw_status dw_thresholds_parse(dw_ctx *ctx, const json_t *v, const char *path, double thr[DW_RECIPE_COUNT]) {
    memset(thr, 0, DW_RECIPE_COUNT * sizeof *thr);
    if (!v) return DW_OK;
    if (!json_is_object(v)) {
        double x = 0;
        DW_TRY(one(ctx, v, path, NULL, &x));
        for (int r = 1; r < DW_RECIPE_COUNT; r++) thr[r] = x;
        return DW_OK;
    }
    const char *key;
    json_t *x;
    json_object_foreach((json_t *)v, key, x) {
        dw_recipe r;
        if (!dw_recipe_parse(key, &r) || r == DW_RECIPE_BF16)
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'max_rel_error': '%s' is not a quantised recipe", path,
                                key);
        DW_TRY(one(ctx, x, path, key, &thr[r]));
    }
    return DW_OK;
}

json_t *dw_thresholds_json(const double thr[DW_RECIPE_COUNT]) {
    json_t *o = NULL;
    for (int r = 1; r < DW_RECIPE_COUNT; r++) {
        if (!(thr[r] > 0)) continue;
        if (!o) o = json_object();
        if (o) json_object_set_new(o, dw_recipe_name((dw_recipe)r), json_real(thr[r]));
    }
    return o;
}
