/* thresholds.h — private: a policy's "max_rel_error", the relative quantisation error above which
 * the run-time guard (train/guard_quant.c) counts a tensor as badly served. JSON: a number (every
 * quantised recipe) or {"nvfp4": 0.25, "fp8_block": 0.05, ...}; a recipe left out keeps
 * dw_qstats_default_threshold. Stored per recipe, 0 meaning "the default". */
#ifndef DW_PRECISION_THRESHOLDS_H
#define DW_PRECISION_THRESHOLDS_H

#include "core/json.h"
#include "deepwell.h"
#include "formats/formats.h"

/* Parses v (the field's value, NULL: absent) into thr (zeroed first); DW_ERR_FORMAT naming path,
 * the key and what is wrong. */
dw_status dw_thresholds_parse(dw_ctx *ctx, const json_t *v, const char *path, double thr[DW_RECIPE_COUNT]);
/* {recipe: value} of the set ones, or NULL when none is set. */
json_t *dw_thresholds_json(const double thr[DW_RECIPE_COUNT]);

#endif /* DW_PRECISION_THRESHOLDS_H */
