/* test_train_arenas.c — the arenas a training run gets by default (dw_compile_opts_train_arenas,
 * src/plan/engine.c; deepwell.h): both on for one micro-batch per step under ZeRO 0 or 1 and
 * nothing touched otherwise, each switch off through its environment variable; dw_model_open
 * with dw_model_opts.grad_arena compiles them in (no gradient pool; a BF16 program's weights pool
 * the FP32 masters alone) and leaves them out under ZeRO-2/3 or without it; the planner's memory
 * for a configuration (dw_plan_engine_memory_par, what `dryrun` prints) prices them by the same
 * rule. A random tiny family and precision each run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/program.h"
#include "runtime/engine.h"
#include "test_plan_common.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)

static const char *const FAMILIES[] = {"gpt2-tiny", "llama-tiny", "mixtral-tiny", "olmoe-tiny"};

static void test_rule(void **state) {
    (void)state;
    unsetenv("DW_GRAD_ARENA"), unsetenv("DW_BF16_ARENA");
    for (int64_t accum = 1; accum <= 3; accum++)
        for (int zero = 0; zero <= 3; zero++)
            for (int before = 0; before < 2; before++) {
                dw_compile_opts o;
                dw_compile_opts_init(&o, sizeof o);
                o.grad_arena = o.bf16_arena = before; /* what the caller had */
                const bool fits = accum == 1 && zero <= 1;
                assert_int_equal(dw_compile_opts_train_arenas(&o, accum, zero), fits);
                assert_int_equal(o.grad_arena, fits || before);
                assert_int_equal(o.bf16_arena, fits || before);
            }
    const char *const vars[2] = {"DW_GRAD_ARENA", "DW_BF16_ARENA"};
    for (int v = 0; v < 2; v++) { /* each switch off alone; the rule unchanged */
        setenv(vars[v], "0", 1);
        dw_compile_opts o;
        dw_compile_opts_init(&o, sizeof o);
        assert_true(dw_compile_opts_train_arenas(&o, 1, (int)dw_test_rnd(0, 1)));
        assert_int_equal(o.grad_arena, v != 0);
        assert_int_equal(o.bf16_arena, v != 1);
        unsetenv(vars[v]);
    }
}

/* A tiny preset opened with grad_arena asked (or not), under ZeRO stage zero. */
static dw_model *open_model(const char *family, const dw_policy *pol, bool arena, int zero) {
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.batch = 2, mo.seq = 16, mo.policy = pol, mo.weights = DW_WEIGHTS_RANDOM, mo.zero = zero;
    mo.grad_arena = arena;
    dw_model *m = NULL;
    if (dw_model_open(CTX, family, &mo, &m) != DW_OK) fail_msg("%s: %s", family, dw_errmsg(CTX));
    return m;
}

static void test_model_open(void **state) {
    (void)state;
    unsetenv("DW_GRAD_ARENA"), unsetenv("DW_BF16_ARENA");
    const char *family = FAMILIES[dw_test_rnd(0, 3)];
    const bool bf16 = dw_test_rnd(0, 1);
    dw_policy *pol = NULL;
    if (bf16) assert_int_equal(dw_policy_from_precision(CTX, "bf16", false, &pol), DW_OK);
    print_message("%s, %s\n", family, bf16 ? "bf16" : "fp32");
    dw_model *pools = open_model(family, pol, false, 0), *arenas = open_model(family, pol, true, 0),
             *z2 = open_model(family, pol, true, 2);
    const dw_compiled *p = dw_engine_program(dw_model_engine(pools)), *a = dw_engine_program(dw_model_engine(arenas)),
                      *q = dw_engine_program(dw_model_engine(z2));
    assert_false(p->grad_arena || p->bf16_arena || q->grad_arena || q->bf16_arena); /* ZeRO-2: the pools */
    assert_true(a->grad_arena);
    assert_int_equal(a->bf16_arena, bf16); /* FP32 programs have no BF16 copies */
    assert_true(dw_compiled_pool_bytes(p, DW_POOL_GRADS) == 4 * p->param_floats);
    assert_true(dw_compiled_pool_bytes(a, DW_POOL_GRADS) == 0);
    assert_true(dw_compiled_pool_bytes(q, DW_POOL_GRADS) == dw_compiled_pool_bytes(p, DW_POOL_GRADS));
    assert_true(dw_compiled_pool_bytes(a, DW_POOL_WEIGHTS) == 4 * a->param_floats);
    assert_true(dw_compiled_pool_bytes(p, DW_POOL_WEIGHTS) == (bf16 ? 6 : 4) * p->param_floats);
    dw_model_free(pools), dw_model_free(arenas), dw_model_free(z2);
    setenv("DW_GRAD_ARENA", "0", 1); /* asked, but switched off */
    dw_model *off = open_model(family, pol, true, 0);
    assert_false(dw_engine_program(dw_model_engine(off))->grad_arena);
    unsetenv("DW_GRAD_ARENA");
    dw_model_free(off);
    dw_policy_free(pol);
}

/* The planner prices a configuration as train runs it: the arenas for one micro-batch a step under
 * ZeRO 0/1, the pools with accumulation or ZeRO-2, DW_GRAD_ARENA=0 / DW_BF16_ARENA=0 obeyed. */
static void test_planner(void **state) {
    (void)state;
    unsetenv("DW_GRAD_ARENA"), unsetenv("DW_BF16_ARENA");
    dw_ctx *ctx = plan_ctx();
    const int dp = 2;
    dw_hw *hw = plan_preset(ctx, "h200", 1);
    dw_model_config cfg;
    const char *family = FAMILIES[dw_test_rnd(0, 3)];
    assert_int_equal(dw_model_config_load(ctx, family, &cfg), DW_OK);
    const int64_t mb = dw_test_rnd(1, 3);
    dw_job j = {.seq = 64, .global_batch = dp * mb * 2, .recipe = DW_RECIPE_BF16};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in), DW_OK);
    dw_par one = {.dp = dp, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = mb, .grad_accum = 1,
                  .zero = (int)dw_test_rnd(0, 1)};
    dw_par acc = one, z2 = one;
    acc.grad_accum = 2, z2.zero = 2;
    dw_engine_mem m1, ma, mz, m0, mb16;
    assert_int_equal(dw_plan_engine_memory_par(ctx, &in, &one, &m1), DW_OK);
    assert_int_equal(dw_plan_engine_memory_par(ctx, &in, &acc, &ma), DW_OK);
    assert_int_equal(dw_plan_engine_memory_par(ctx, &in, &z2, &mz), DW_OK);
    setenv("DW_GRAD_ARENA", "0", 1);
    assert_int_equal(dw_plan_engine_memory_par(ctx, &in, &one, &m0), DW_OK);
    unsetenv("DW_GRAD_ARENA");
    setenv("DW_BF16_ARENA", "0", 1);
    assert_int_equal(dw_plan_engine_memory_par(ctx, &in, &one, &mb16), DW_OK);
    unsetenv("DW_BF16_ARENA");
    print_message("%s mb %lld ZeRO-%d: %.3f MiB with the arenas, %.3f with the pools\n", family, (long long)mb,
                  one.zero, (double)m1.total / (1 << 20), (double)m0.total / (1 << 20));
    assert_true(m1.pool[DW_POOL_GRADS] == 0 && m0.pool[DW_POOL_GRADS] > 0 && mb16.pool[DW_POOL_GRADS] == 0);
    assert_true(m1.pool[DW_POOL_WEIGHTS] * 3 == m0.pool[DW_POOL_WEIGHTS] * 2); /* the masters alone: 4 of 6 B */
    assert_true(mb16.pool[DW_POOL_WEIGHTS] == m0.pool[DW_POOL_WEIGHTS]);
    for (int k = 0; k < DW_POOL_COUNT; k++) assert_true(ma.pool[k] == m0.pool[k] && mz.pool[k] == m0.pool[k]);
    assert_true(m1.total < mb16.total && mb16.total < m0.total);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule),
        cmocka_unit_test(test_model_open),
        cmocka_unit_test(test_planner),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
