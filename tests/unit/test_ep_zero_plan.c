/* test_ep_zero_plan.c — the planner's per-GPU optimizer memory under expert parallelism x data
 * parallelism (src/plan/memory.c; issue 28): FP32 master + AdamW m and v, 12 bytes a parameter.
 * Mixtral-8x7B (32 MoE layers of 8 SwiGLU experts, 3 x 4096 x 14336 each: X = 45.1 G expert
 * parameters by hand) on 8 H100s, dp 8, EP 2, 4 and 8. Oracle: a rank holds the dense parameters D
 * (the same at every EP) and X / ep of the experts; ZeRO-0 keeps all their state, 12 (D + X / ep);
 * ZeRO-1 shards the dense state over all 8 ranks and each expert's over the 8 / ep ranks holding
 * that expert, 12 (D / 8 + (X / ep) / (8 / ep)) = 12 (D + X) / 8, whatever ep, the gradients whole
 * (4 (D + X / ep)); ZeRO-2 the same moments and a gradient shard above 4 (D + X) / 8. D comes from the EP-2 ZeRO-0 figure and is checked against the planner's
 * own parameter count; every other figure is the oracle's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>

#include "test_plan_common.h"

static void close_to(const char *what, int ep, double got, double want) {
    if (!(fabs(got - want) <= 1e-9 * want)) fail_msg("ep %d: %s %.6g bytes, oracle %.6g", ep, what, got, want);
}

static void test_ep_zero_memory(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = plan_preset(ctx, "h100-sxm", 1);
    dw_model_config mx = plan_llama(32000, 4096, 32, 32, 8, 14336);
    mx.n_experts = 8, mx.top_k = 2, mx.d_ff_expert = 14336;
    dw_job j = {.seq = 4096, .global_batch = 64};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, &mx, hw, &j, NULL, &in), DW_OK);
    const double X = 32.0 * 8 * 3 * 4096 * 14336, dp = 8;
    double D = -1;
    for (int ep = 2; ep <= 8; ep *= 2) {
        dw_mem m[3];
        for (int z = 0; z < 3; z++) {
            dw_par p = {.dp = 8, .tp = 1, .pp = 1, .cp = 1, .ep = ep, .vpp = 1, .micro_batch = 1, .grad_accum = 8,
                        .recompute = DW_RECOMPUTE_FULL, .zero = z};
            dw_plan_memory(&in, &p, &m[z]);
        }
        if (D < 0) {
            D = m[0].optimizer / 12 - X / ep;
            dw_param_counts pc;
            dw_plan_params(&in, &pc);
            close_to("the dense parameters (planner's count)", ep, 12 * D, 12 * (pc.total - 32 * pc.moe_experts));
        }
        close_to("ZeRO-0 optimizer", ep, m[0].optimizer, 12 * (D + X / ep));
        close_to("ZeRO-1 optimizer", ep, m[1].optimizer, 12 * (D / dp + (X / ep) / (dp / ep)));
        close_to("ZeRO-1 optimizer, the dense sharding's", ep, m[1].optimizer, 12 * (D + X) / dp);
        close_to("ZeRO-1 gradients (whole)", ep, m[1].grads, 4 * (D + X / ep));
        close_to("ZeRO-2 optimizer", ep, m[2].optimizer, m[1].optimizer);
        /* ZeRO-2: the gradient shard, sharded as the moments are, plus one layer's bucket */
        assert_true(m[2].grads < m[1].grads && m[2].grads > 4 * (D + X) / dp);
    }
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ep_zero_memory),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
