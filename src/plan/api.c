/* api.c — the public planner entry (include/deepwell.h, [section: plan]): model name + hardware
 * + job in, the `deepwell plan --json` document out. Thin wrapper over search.c. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "plan/plan.h"

dw_status dw_autoplan_json(dw_ctx *ctx, const char *model, const dw_hw *hw, const dw_plan_job *job, int top_k,
                           char **json_out) {
    *json_out = NULL;
    if (!model || !hw || !job) return dw_set_error(ctx, DW_ERR_INVALID, "dw_autoplan_json: NULL argument");
    dw_model_config cfg;
    DW_TRY(dw_model_config_load(ctx, model, &cfg));
    dw_job j = {.seq = job->seq, .global_batch = job->global_batch, .moe_experts = job->moe_experts,
                .moe_top_k = job->moe_top_k, .moe_capacity = job->moe_capacity, .mem_headroom = job->mem_headroom};
    if (job->precision && (!dw_recipe_parse(job->precision, &j.recipe) || !dw_plan_supports_recipe(j.recipe)))
        return dw_set_error(ctx, DW_ERR_INVALID, "unknown precision recipe '%s' (bf16, fp8_block, mxfp8, nvfp4)",
                            job->precision);
    dw_plan_in in;
    DW_TRY(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in));
    dw_plan_result r;
    DW_TRY(dw_plan_search(ctx, &in, top_k, &r));
    json_t *doc = dw_plan_result_json(&in, &r);
    dw_plan_result_free(&r);
    char *text = doc ? dw_json_dump(doc, false) : NULL;
    json_decref(doc);
    if (!text) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    *json_out = text;
    return DW_OK;
}
