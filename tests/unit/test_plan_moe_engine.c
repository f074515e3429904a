/* test_plan_moe_engine.c — the planner's one-GPU prediction for Deepwell's engine on its MoE
 * benchmark presets against the measured step: bench/RESULTS.md, "Session 25", call F, commit
 * 02132b5 on an H100 (`deepwell bench step MODEL --batch B --seq 2048 [--precision fp8_block]`):
 * moe-e8 B8 91,742 (bf16) and 100,956 (fp8_block) tokens/s, moe-e64 B4 87,881 and 88,474. Band:
 * predicted/measured tokens/s in [0.85, 1.15]. The grouped-GEMM share of src/plan/engine.c is
 * fitted on both models' bf16 expert times of "Session 24", call B (another H100), the memory-bound
 * and AdamW shares on those profiles too; fp8_block is out of sample; docs/planner.md gives the
 * table. Also: the engine's executed FLOPs count the routed experts' three GEMMs of every MoE layer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>

#include "test_plan_common.h"
#include "testutil.h"

static dw_hw *one_gpu(dw_ctx *ctx, const char *preset) {
    dw_hw *hw = plan_preset(ctx, preset, 1);
    hw->n_gpus = 1; /* GPU 0 of the node alone */
    return hw;
}
static dw_hw *one_h200(dw_ctx *ctx) { return one_gpu(ctx, "h200"); }

/* The measured configuration (micro-batch B, one micro-batch a step, the engine's only plan
 * shape for `bench step --batch B`): predicted tokens/s over measured within [lo, hi]. */
static void check_measured(const char *model, int64_t B, dw_recipe r, double measured, double lo, double hi) {
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = one_gpu(ctx, "h100-sxm");
    dw_model_config c;
    assert_int_equal(dw_model_config_load(ctx, model, &c), DW_OK);
    dw_job j = {.seq = 2048, .global_batch = B, .recipe = r};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, &c, hw, &j, NULL, &in), DW_OK);
    assert_true(in.engine_model);
    dw_par p = {.dp = 1, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = B, .grad_accum = 1};
    assert_true(dw_plan_engine_runnable(&in, &p, NULL, 0));
    dw_plan_entry e;
    dw_reject why;
    char det[300];
    assert_true(dw_plan_evaluate(&in, &p, true, &e, &why, det, sizeof det));
    dw_engine_time et;
    assert_int_equal(dw_plan_engine_time(ctx, &in, B, DW_RECOMPUTE_NONE, &et), DW_OK);
    double ratio = e.cost.tokens_per_s / measured;
    print_message("%s %s B%lld T2048 on an H100: predicted %.0f tokens/s (step %.1f ms: GEMMs %.1f, attention %.1f, "
                  "memory-bound %.1f, launches %.1f, AdamW %.1f), measured %.0f: %.3f\n",
                  model, dw_recipe_name(r), (long long)B, e.cost.tokens_per_s, 1e3 * e.cost.step, 1e3 * et.gemm, 1e3 * et.attn,
                  1e3 * et.mem, 1e3 * et.overhead, 1e3 * et.optimizer, measured, ratio);
    if (ratio < lo || ratio > hi) fail_msg("%s: predicted/measured %.3f outside [%.2f, %.2f]", model, ratio, lo, hi);
    /* the routed experts' GEMMs (gate, up, down: 3 x 2 N top_k d f_e forward, twice that backward)
     * are part of the executed work */
    double N = (double)B * 2048, moe_layers = 0;
    for (int64_t l = 0; l < c.n_layers; l++) moe_layers += dw_model_config_moe_layer(&c, l);
    double experts = moe_layers * 3 * 3 * 2 * N * (double)c.top_k * (double)c.d_model * (double)c.d_ff_expert;
    assert_true(moe_layers > 0);
    assert_true(et.flops > experts);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

static void test_moe_e8_h100(void **state) {
    (void)state;
    check_measured("moe-e8", 8, DW_RECIPE_BF16, 91742, 0.85, 1.15);
    check_measured("moe-e8", 8, DW_RECIPE_FP8_BLOCK, 100956, 0.85, 1.15);
}

static void test_moe_e64_h100(void **state) {
    (void)state;
    check_measured("moe-e64", 4, DW_RECIPE_BF16, 87881, 0.85, 1.15);
    check_measured("moe-e64", 4, DW_RECIPE_FP8_BLOCK, 88474, 0.85, 1.15);
}

/* The expert GEMMs' time grows with the routed rows: doubling top_k (the same experts, twice the
 * rows) adds at least the first run's expert time again, less what the padding of a half tile
 * per expert already paid for; the dense parts do not move. Random tiny MoE shapes. */
static void test_moe_engine_rows(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = one_h200(ctx);
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0x3e);
    dw_model_config c;
    assert_int_equal(dw_model_config_load(ctx, "mixtral-tiny", &c), DW_OK);
    int64_t B = 1 + (int64_t)(dw_test_next(&rng) % 4), T = 16 << (dw_test_next(&rng) % 3);
    dw_job j = {.seq = T, .global_batch = B};
    dw_engine_time et[2];
    for (int k = 0; k < 2; k++) {
        dw_model_config ck = c;
        ck.top_k = c.top_k * (k + 1);
        dw_plan_in in;
        assert_int_equal(dw_plan_in_init(ctx, &ck, hw, &j, NULL, &in), DW_OK);
        assert_int_equal(dw_plan_engine_time(ctx, &in, B, DW_RECOMPUTE_NONE, &et[k]), DW_OK);
    }
    double N = (double)(B * T), moe_layers = 0;
    for (int64_t l = 0; l < c.n_layers; l++) moe_layers += dw_model_config_moe_layer(&c, l);
    double added = moe_layers * 3 * 3 * 2 * N * (double)c.top_k * (double)c.d_model * (double)c.d_ff_expert;
    print_message("mixtral-tiny B%lld T%lld: top_k x2 adds %.4g FLOPs (hand %.4g), %.3g s of GEMMs\n", (long long)B,
                  (long long)T, et[1].flops - et[0].flops, added, et[1].gemm - et[0].gemm);
    assert_true(fabs((et[1].flops - et[0].flops) / added - 1) < 1e-9);
    assert_true(et[1].gemm > et[0].gemm);
    assert_true(fabs(et[1].attn / et[0].attn - 1) < 1e-12);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_e8_h100),
        cmocka_unit_test(test_moe_e64_h100),
        cmocka_unit_test(test_moe_engine_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
