/* test_plan_engine.c — the planner's one-GPU view of Deepwell's CUDA engine: memory of a plan the
 * engine runs equals the engine's compiled pools (dw_compile, computed here independently) plus
 * the cuBLASLt workspace and the context allowance, on random presets, micro-batches, sequences
 * and recipes; plans the engine cannot run say why and keep the analytical model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "compile/compile.h"
#include "test_plan_common.h"
#include "testutil.h"

/* Pools of the engine for cfg at b x s under the planner's policy for prec (independent of
 * src/plan: the policy is built here from the recipe name and the safe-fallback rule). */
static int64_t compiled_pools(dw_ctx *ctx, const dw_model_config *cfg, int64_t b, int64_t s, const char *prec,
                              int64_t pools[DW_POOL_COUNT]) {
    dw_graph *g = NULL;
    dw_policy *pol = NULL;
    dw_compiled *c = NULL;
    assert_int_equal(dw_capture_config(ctx, cfg, b, s, &g), DW_OK);
    assert_int_equal(dw_policy_from_precision(ctx, prec, strcmp(prec, "bf16") != 0, &pol), DW_OK);
    assert_int_equal(dw_compile(ctx, g, NULL, pol, &c), DW_OK);
    int64_t t = 0;
    for (int p = 0; p < DW_POOL_COUNT; p++) pools[p] = dw_compiled_pool_bytes(c, p), t += pools[p];
    dw_compiled_free(c);
    dw_policy_free(pol);
    dw_graph_free(g);
    return t;
}

static dw_hw *one_gpu(dw_ctx *ctx) {
    dw_hw *hw = plan_preset(ctx, "h200", 1);
    hw->n_gpus = 1; /* GPU 0 of the node alone (the planner reads gpus[0] and n_gpus) */
    hw->nvlink_domain = 1;
    return hw;
}

static void test_memory_equals_compiled_pools(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = one_gpu(ctx);
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed());
    static const char *const models[] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny", "gpt2-124m", "llama-1b"};
    static const int64_t seqs[] = {64, 128, 256, 512, 1024};
    for (int it = 0; it < 12; it++) {
        const char *name = models[it < 5 ? it : (int)(dw_test_next(&rng) % 5)];
        dw_model_config cfg;
        assert_int_equal(dw_model_config_load(ctx, name, &cfg), DW_OK);
        int64_t s = seqs[dw_test_next(&rng) % 5];
        if (s > cfg.max_seq) s = cfg.max_seq;
        int64_t mb = (int64_t)1 << (dw_test_next(&rng) % 4), ga = 1 + (int64_t)(dw_test_next(&rng) % 3);
        dw_plan_prec pr = (dw_plan_prec)(dw_test_next(&rng) % DW_PREC_COUNT);
        dw_job j = {.seq = s, .global_batch = mb * ga, .prec = pr};
        dw_plan_in in;
        assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in), DW_OK);
        assert_true(in.engine_model);
        dw_par p = {.dp = 1, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = mb, .grad_accum = ga};
        char why[300];
        assert_true(dw_plan_engine_runnable(&in, &p, why, sizeof why));
        int64_t pools[DW_POOL_COUNT];
        int64_t sum = compiled_pools(ctx, &cfg, mb, s, dw_plan_prec_name(pr), pools);
        dw_mem m;
        dw_plan_memory(&in, &p, &m);
        print_message("%s s=%lld mb=%lld %s: predicted %.0f B, compiled pools %lld B\n", name, (long long)s,
                      (long long)mb, dw_plan_prec_name(pr), m.total, (long long)sum);
        assert_true(m.total == (double)(sum + DW_COMPILE_LT_WORKSPACE + DW_PLAN_CUDA_CONTEXT));
        assert_true(m.weights == (double)pools[DW_POOL_WEIGHTS]);
        assert_true(m.grads == (double)pools[DW_POOL_GRADS]);
        assert_true(m.optimizer == (double)pools[DW_POOL_OPTIM]);
        assert_true(m.activations == (double)pools[DW_POOL_ACT]);
        assert_true(m.workspace == (double)(pools[DW_POOL_WORK] + DW_COMPILE_LT_WORKSPACE + DW_PLAN_CUDA_CONTEXT));
        /* the parts add up and the padded parameter pools hold 18 bytes per parameter at least */
        assert_true(m.weights + m.grads + m.optimizer + m.activations + m.workspace + m.scales == m.total);
        dw_param_counts pc;
        dw_plan_params(&in, &pc);
        assert_true(m.weights + m.grads + m.optimizer >= 18 * pc.total);
        /* the dryrun check and the search see the same figure */
        dw_plan_entry e;
        dw_reject r;
        char det[200];
        assert_true(dw_plan_evaluate(&in, &p, false, &e, &r, det, sizeof det));
        assert_true(e.mem.total == m.total);
        /* plans the engine does not run: reason given, analytical memory */
        dw_par q = p;
        q.recompute = DW_RC_SELECTIVE;
        assert_false(dw_plan_engine_runnable(&in, &q, why, sizeof why));
        assert_non_null(strstr(why, "recompute"));
        q = p, q.zero = 1;
        assert_false(dw_plan_engine_runnable(&in, &q, why, sizeof why));
        assert_non_null(strstr(why, "ZeRO"));
        dw_plan_memory(&in, &q, &m);
        assert_true(m.workspace >= 1024.0 * 1024 * 1024); /* the analytical model's fixed 1 GiB */
    }
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

static void test_not_runnable_reasons(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw8 = plan_preset(ctx, "h200", 1);
    dw_model_config cfg;
    assert_int_equal(dw_model_config_load(ctx, "gpt2-124m", &cfg), DW_OK);
    dw_job j = {.seq = 1024, .global_batch = 16};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, &cfg, hw8, &j, NULL, &in), DW_OK);
    dw_par p = {.dp = 8, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = 2, .grad_accum = 1};
    char why[300];
    assert_false(dw_plan_engine_runnable(&in, &p, why, sizeof why));
    assert_non_null(strstr(why, "8 GPUs"));
    /* planning-only and MoE models: the engine cannot build them, whatever the plan */
    dw_hw *hw = one_gpu(ctx);
    assert_int_equal(dw_model_config_load(ctx, "llama-8b", &cfg), DW_OK);
    j.seq = 2048, j.global_batch = 1;
    assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in), DW_OK);
    assert_false(in.engine_model);
    p = (dw_par){.dp = 1, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = 1, .grad_accum = 1};
    assert_false(dw_plan_engine_runnable(&in, &p, why, sizeof why));
    assert_non_null(strstr(why, "planning-only"));
    assert_int_equal(dw_model_config_load(ctx, "gpt2-124m", &cfg), DW_OK);
    j.seq = 1024, j.moe_experts = 8, j.moe_top_k = 2;
    assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in), DW_OK);
    assert_false(dw_plan_engine_runnable(&in, &p, why, sizeof why));
    assert_non_null(strstr(why, "mixture-of-experts"));
    dw_hw_free(hw);
    dw_hw_free(hw8);
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory_equals_compiled_pools),
        cmocka_unit_test(test_not_runnable_reasons),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
