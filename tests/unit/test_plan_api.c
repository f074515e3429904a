/* test_plan_api.c — the public dw_autoplan_json entry: a document with a feasible best plan for
 * a random machine size, the same plan as the private search, and errors that name the input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "deepwell.h"
#include "test_plan_common.h"
#include "testutil.h"

static void test_autoplan_json(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed());
    int nodes = 1 << (int)(dw_test_next(&rng) % 3); /* 1, 2, 4: 24 GPUs cannot split llama-8b */
    dw_hw *hw = plan_preset(ctx, "h200", nodes);
    dw_plan_job job;
    dw_plan_job_init(&job, sizeof job);
    job.seq = 2048;
    job.global_batch = 32 * (1 + (int64_t)(dw_test_next(&rng) % 8));
    job.recipe = DW_RECIPE_FP8_BLOCK;
    char *text = (char *)1;
    assert_int_equal(dw_autoplan_json(ctx, "llama-8b", hw, &job, 3, &text), DW_OK);
    json_t *doc = NULL;
    assert_int_equal(dw_json_load_string(ctx, text, strlen(text), "plan", &doc), DW_OK);
    const json_t *best = json_object_get(doc, "best");
    assert_true(json_is_object(best));
    /* the same plan as the private API */
    dw_model_config cfg;
    assert_int_equal(dw_model_config_load(ctx, "llama-8b", &cfg), DW_OK);
    dw_job j = {.seq = job.seq, .global_batch = job.global_batch, .recipe = DW_RECIPE_FP8_BLOCK};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in), DW_OK);
    dw_plan_result r;
    assert_int_equal(dw_plan_search(ctx, &in, 1, &r), DW_OK);
    dw_par p;
    assert_int_equal(dw_par_from_json(ctx, doc, "plan", &p), DW_OK);
    assert_memory_equal(&p, &r.plans[0].par, sizeof p);
    assert_int_equal(dw_plan_check(&in, &p, NULL, 0), 0);
    dw_plan_result_free(&r);
    json_decref(doc);
    dw_free_string(text);
    job.recipe = DW_RECIPE_FP8_TENSOR; /* a recipe the planner does not model */
    assert_int_equal(dw_autoplan_json(ctx, "llama-8b", hw, &job, 3, &text), DW_ERR_INVALID);
    assert_null(text);
    assert_non_null(strstr(dw_errmsg(ctx), "fp8_tensor"));
    job.recipe = DW_RECIPE_BF16;
    assert_int_equal(dw_autoplan_json(ctx, "no-such-model", hw, &job, 3, &text), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "no-such-model"));
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_autoplan_json)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
