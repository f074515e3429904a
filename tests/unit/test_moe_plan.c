/* test_moe_plan.c — the planner's MoE capacity factor (src/plan/model.c, `deepwell plan --moe
 * capacity=F`): the job's factor wins, else the config's capacity_factor (for the config's own
 * experts), else 1 (dropless); outside (0, 64] it is refused naming it. Below 1 the routed copies
 * shrink with it: the MoE activation bytes per token (Mixtral-8x7B's hand-worked 45,200 + 2 C x
 * 94,208 bytes, test_plan_formulas.c's figures), the EP all-to-all bytes (2 C copies of d per token)
 * and the expert compute time, exactly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/layout.h"
#include "test_plan_common.h"
#include "testutil.h"

static dw_model_config mixtral(double capacity_factor) {
    dw_model_config mx = plan_llama(32000, 4096, 32, 32, 8, 14336);
    mx.n_experts = 8, mx.top_k = 2, mx.d_ff_expert = 14336, mx.capacity_factor = capacity_factor;
    return mx;
}

static double capacity_of(dw_ctx *ctx, const dw_hw *hw, double cfg, double job, int64_t experts, dw_status *st) {
    dw_model_config mx = mixtral(cfg);
    dw_job j = {.seq = 4096, .global_batch = 8, .moe_capacity = job, .moe_experts = experts};
    dw_plan_in in;
    *st = dw_plan_in_init(ctx, &mx, hw, &j, NULL, &in);
    return in.capacity;
}

static void test_capacity_source(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = plan_preset(ctx, "h100-sxm", 1);
    dw_status st;
    assert_true(capacity_of(ctx, hw, 0.0, 0.0, 0, &st) == 1.0 && st == DW_OK);   /* dropless */
    assert_true(capacity_of(ctx, hw, 0.5, 0.0, 0, &st) == 0.5 && st == DW_OK);   /* the config's */
    assert_true(capacity_of(ctx, hw, 0.5, 0.75, 0, &st) == 0.75 && st == DW_OK); /* the job's wins */
    assert_true(capacity_of(ctx, hw, 1.25, 0.0, 0, &st) == 1.25 && st == DW_OK);
    assert_true(capacity_of(ctx, hw, 0.5, 0.0, 16, &st) == 1.0 && st == DW_OK);  /* other experts: not the config's */
    capacity_of(ctx, hw, 0.0, 65.0, 0, &st);
    assert_int_equal(st, DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "capacity"));
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

/* *mx must outlive *in, which points at it. */
static void plan_at(dw_ctx *ctx, const dw_hw *hw, double capacity, dw_model_config *mx, dw_plan_in *in) {
    *mx = mixtral(capacity); /* through the config, as config.json's key */
    dw_job j = {.seq = 4096, .global_batch = 8};
    assert_int_equal(dw_plan_in_init(ctx, mx, hw, &j, NULL, in), DW_OK);
    assert_true(in->capacity == capacity);
}

static void test_capacity_costs(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = plan_preset(ctx, "h100-sxm", 1);
    static const double caps[] = {0.25, 0.5, 0.75, 1.0};
    double expert_s[4];
    for (int i = 0; i < 4; i++) {
        dw_model_config mx;
        dw_plan_in in;
        plan_at(ctx, hw, caps[i], &mx, &in);
        /* per token per block: attention 45,184 + routing 16 + 2 C routed copies of 94,208 */
        assert_true(dw_plan_act_bytes_moe(&in, DW_RECOMPUTE_NONE) == 45200.0 + 2 * caps[i] * 94208.0);
        /* EP 8 in one NVLink domain: 4 all-to-alls a block of 4096 x 2 C copies of d = 4096 BF16 */
        dw_par pe = {.dp = 8, .tp = 1, .pp = 1, .cp = 1, .ep = 8, .vpp = 1, .micro_batch = 1, .grad_accum = 1};
        dw_plan_entry e;
        dw_plan_time(&in, &pe, &e, NULL);
        const double a2a = 7 * 3e-6 + 0.875 * (4096.0 * 4096 * 2 * caps[i] * 2) / 360e9;
        if (fabs(e.cost.ep_comm - 32 * 4 * a2a) > 1e-12)
            fail_msg("capacity %g: ep_comm %.9g, want %.9g", caps[i], e.cost.ep_comm, 32 * 4 * a2a);
        expert_s[i] = e.cost.compute;
    }
    for (int i = 1; i < 4; i++) /* fewer routed rows, less compute */
        if (!(expert_s[i - 1] < expert_s[i])) fail_msg("compute at %g not below %g", caps[i - 1], caps[i]);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capacity_source),
        cmocka_unit_test(test_capacity_costs),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
