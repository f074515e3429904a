/* test_plan_repro.c — published large-scale training configurations through the planner:
 * Megatron-LM's GPT table (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
 * on GPU Clusters Using Megatron-LM", Table 1, DGX A100) and Llama 3 405B (Llama 3 paper,
 * Table 4, H100). For each: the published parallelism is feasible; its predicted speed lies in a
 * stated band around the published one; the planner's best is at most a stated factor faster.
 * The bands are the model's honest error (docs/planner.md explains each), not tuned to pass. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>

#include "test_plan_common.h"

/* The best completion of a published (tp, pp, cp, dp): the knobs papers leave out (virtual
 * stages, micro-batch, ZeRO stage, offload) chosen by the model; recompute fixed when rc >= 0. */
static bool best_completion(const dw_plan_in *in, int tp, int pp, int cp, int dp, int rc_only, dw_plan_entry *best) {
    static const int vs[] = {1, 2, 3, 4, 6, 8};
    bool found = false;
    for (int vi = 0; vi < 6; vi++)
        for (int64_t mb = 1; mb <= 32; mb++) {
            if (in->job.global_batch % (dp * mb) || (vs[vi] > 1 && pp == 1)) continue;
            for (int rc = 0; rc < 3; rc++) {
                if (rc_only >= 0 && rc != rc_only) continue;
                for (int z = 0; z < 4; z++)
                    for (int off = 0; off < 2; off++) {
                        if (off && !z) continue;
                        dw_par p = {.dp = dp, .tp = tp, .pp = pp, .cp = cp, .ep = 1, .vpp = vs[vi],
                                    .micro_batch = mb, .grad_accum = in->job.global_batch / (dp * mb),
                                    .sched = vs[vi] > 1 ? DW_SCHED_INTERLEAVED : DW_SCHED_1F1B,
                                    .recompute = (dw_recompute)rc, .zero = z, .offload = off};
                        dw_plan_entry e;
                        dw_reject why;
                        char det[300];
                        if (dw_plan_evaluate(in, &p, true, &e, &why, det, sizeof det) &&
                            (!found || e.cost.step < best->cost.step)) {
                            *best = e;
                            found = true;
                        }
                    }
            }
        }
    return found;
}

static void test_megatron_2021_table(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    /* GPT, seq 2048, vocab 51200; published achieved TFLOP/s per A100 (full recomputation
     * counted: 96 B s l h^2 (1 + s/6h + V/16lh)). */
    static const struct { const char *name; int H, h, L, tp, pp, gpus, G; double tflops; } rows[] = {
        {"1.7B", 24, 2304, 24, 1, 1, 32, 512, 137},       {"3.6B", 32, 3072, 30, 2, 1, 64, 512, 138},
        {"7.5B", 32, 4096, 36, 4, 1, 128, 512, 142},      {"18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135},
        {"39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138},    {"76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140},
        {"145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148}, {"310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155},
        {"529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163}, {"1008B", 160, 25600, 128, 8, 64, 3072, 3072, 163},
    };
    printf("%-7s %6s %9s %9s %7s %9s  %s\n", "model", "pubMFU", "predMFU", "pred/pub", "bestMFU", "best/pub",
           "planner's best (pred: published TP/PP with full recompute; best/pub: step-time ratio)");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        dw_model_config c = plan_gpt(51200, rows[i].h, rows[i].L, rows[i].H, 2048);
        dw_hw *hw = plan_dgx_a100(rows[i].gpus / 8);
        dw_job j = {.seq = 2048, .global_batch = rows[i].G};
        dw_plan_in in;
        assert_int_equal(dw_plan_in_init(ctx, &c, hw, &j, NULL, &in), DW_OK);
        /* published model-FLOPs MFU: their hardware FLOPs less the recomputed forward,
         * 72 (1 + s/6h) + 6V/lh of 96 (1 + s/6h) + 6V/lh, over the 312 TFLOP/s peak */
        double s = 2048, h = rows[i].h, l = rows[i].L, V = 51200;
        double pub = rows[i].tflops / 312 * (72 * (1 + s / (6 * h)) + 6 * V / (l * h)) /
                     (96 * (1 + s / (6 * h)) + 6 * V / (l * h));
        int dp = rows[i].gpus / (rows[i].tp * rows[i].pp);
        dw_plan_entry e;
        /* published runs recompute every layer: compare like with like */
        assert_true(best_completion(&in, rows[i].tp, rows[i].pp, 1, dp, DW_RECOMPUTE_FULL, &e));
        assert_int_equal(dw_plan_check(&in, &e.par, NULL, 0), 0);
        /* the published parallelism with recompute left to the model, for the parallelism
         * comparison against the planner's own choice */
        dw_plan_entry f;
        assert_true(best_completion(&in, rows[i].tp, rows[i].pp, 1, dp, -1, &f));
        dw_plan_result r;
        assert_int_equal(dw_plan_search(ctx, &in, 1, &r), DW_OK);
        assert_int_equal(r.n_plans, 1);
        char buf[200];
        dw_par_format(&r.plans[0].par, buf, sizeof buf);
        double ratio = e.cost.mfu / pub, best = f.cost.step / r.plans[0].cost.step;
        printf("%-7s %6.3f %9.3f %9.2f %7.3f %9.2f  %s\n", rows[i].name, pub, e.cost.mfu, ratio,
               r.plans[0].cost.mfu, best, buf);
        /* Band: the model predicts 1.1-1.55x the published speed (2021 kernels: no flash
         * attention, less fusion; the gap grows with the attention share s/6h). */
        if (ratio < 1.0 || ratio > 1.6) fail_msg("%s: predicted/published MFU %.3f outside [1.0, 1.6]", rows[i].name, ratio);
        /* the planner's best is never slower than the published parallelism, and at most 1.35x
         * faster (it trades TP/PP for ZeRO-3 data parallelism on the mid-size models) */
        assert_true(best >= 1 - 1e-12);
        if (best > 1.35) fail_msg("%s: planner best %.2fx the published parallelism", rows[i].name, best);
        dw_plan_result_free(&r);
        dw_hw_free(hw);
    }
    dw_ctx_free(ctx);
}

static void test_llama3_405b(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_model_config c = plan_llama(128256, 16384, 126, 128, 8, 53248);
    /* Table 4: seq 8192, 16M tokens per batch (2048 sequences); TP8 CP1 PP16 on 8,192 GPUs
     * (DP64, 430 TFLOP/s, BF16 MFU 43%) and 16,384 GPUs (DP128, 400 TFLOP/s, 41%). */
    static const struct { int gpus, dp; double mfu, lo, hi, best_max; } rows[] = {
        {8192, 64, 0.43, 0.85, 1.20, 1.55},
        {16384, 128, 0.41, 0.85, 1.20, 1.25},
    };
    for (size_t i = 0; i < 2; i++) {
        dw_hw *hw = NULL;
        assert_int_equal(dw_hw_preset(ctx, "h100-sxm", rows[i].gpus / 8, &hw), DW_OK);
        dw_job j = {.seq = 8192, .global_batch = 2048};
        dw_plan_in in;
        assert_int_equal(dw_plan_in_init(ctx, &c, hw, &j, NULL, &in), DW_OK);
        dw_plan_entry e;
        assert_true(best_completion(&in, 8, 16, 1, rows[i].dp, -1, &e));
        assert_int_equal(dw_plan_check(&in, &e.par, NULL, 0), 0);
        dw_plan_result r;
        assert_int_equal(dw_plan_search(ctx, &in, 1, &r), DW_OK);
        char pb[200], bb[200];
        dw_par_format(&e.par, pb, sizeof pb);
        dw_par_format(&r.plans[0].par, bb, sizeof bb);
        double ratio = e.cost.mfu / rows[i].mfu, best = e.cost.step / r.plans[0].cost.step;
        printf("Llama 3 405B on %d H100: published MFU %.2f; predicted %.3f for [%s]; planner best %.3f "
               "(%.2fx) [%s]\n", rows[i].gpus, rows[i].mfu, e.cost.mfu, pb, r.plans[0].cost.mfu, best, bb);
        if (ratio < rows[i].lo || ratio > rows[i].hi)
            fail_msg("%d GPUs: predicted/published MFU %.3f outside [%.2f, %.2f]", rows[i].gpus, ratio,
                     rows[i].lo, rows[i].hi);
        assert_true(best >= 1 - 1e-12);
        if (best > rows[i].best_max)
            fail_msg("%d GPUs: planner best %.2fx the published config (limit %.2f)", rows[i].gpus, best,
                     rows[i].best_max);
        dw_plan_result_free(&r);
        dw_hw_free(hw);
    }
    /* 131,072-token run: TP8 CP16 PP16 DP8 on 16,384 GPUs, 16M tokens per step (128 sequences).
     * Feasibility only: the paper does not state its attention-FLOP convention, which at this
     * length moves MFU by ~1.6x (docs/planner.md). */
    dw_hw *hw = plan_preset(ctx, "h100-sxm", 2048);
    dw_job j = {.seq = 131072, .global_batch = 128};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, &c, hw, &j, NULL, &in), DW_OK);
    dw_plan_entry e;
    assert_true(best_completion(&in, 8, 16, 16, 8, -1, &e));
    assert_int_equal(dw_plan_check(&in, &e.par, NULL, 0), 0);
    printf("Llama 3 405B, 131072 tokens, TP8 CP16 PP16 DP8: feasible, predicted MFU %.3f (published 0.38)\n",
           e.cost.mfu);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_megatron_2021_table),
        cmocka_unit_test(test_llama3_405b),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
