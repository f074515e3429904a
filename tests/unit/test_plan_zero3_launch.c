/* test_plan_zero3_launch.c — the planner prices kernel launches as the runtime issues them (issue
 * 28): the one-GPU engine replays its recorded training step (DW_PLAN_LAUNCH_REPLAYED_S a launch),
 * while several ranks with overlapped reductions (train/dp_overlap.c) and ZeRO-3 always
 * (train/dp_zero3.c) stop the recording and issue every step eagerly (DW_PLAN_LAUNCH_EAGER_S).
 * Oracle, on random engine-built models, GPU counts, micro-batches, accumulations and recompute:
 * the eager engine time is the replayed one plus launches x (eager - replayed) per micro-batch,
 * nothing else changed; a plan's compute is grad_accum x that; ZeRO-3's steps between gathers
 * (what hides them) are the eager forward and backward split step by step; one GPU keeps the
 * replayed figure bit for bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "test_plan_common.h"
#include "testutil.h"

/* Which plans the runtime replays: one GPU; several only with --no-overlap below ZeRO-3. */
static void test_replays_as_the_runtime(void **state) {
    (void)state;
    for (int dp = 1; dp <= 8; dp *= 2)
        for (int z = 0; z <= 3; z++)
            for (int ov = 0; ov < 2; ov++) {
                const dw_par p = {.dp = dp, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = 1,
                                  .grad_accum = 1, .zero = dp == 1 ? 0 : z};
                const bool want = dp == 1 || (!ov && z < 3);
                if (dw_plan_runtime_replays(&p, ov) != want)
                    fail_msg("dp %d zero %d overlap %d: replays %d, the runtime %d", dp, p.zero, ov, !want, want);
            }
    assert_true(DW_PLAN_LAUNCH_EAGER_S > DW_PLAN_LAUNCH_REPLAYED_S);
}

/* a within rel of b */
static bool near(double a, double b, double rel) { return fabs(a - b) <= rel * fmax(fabs(a), fabs(b)); }

static void test_eager_launches_priced(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0x4c);
    plan_dp_job t;
    plan_random_dp_job(ctx, &rng, &t);
    const int dp = t.dp, rc = t.rc;
    const int64_t mb = t.mb, ga = t.ga;
    dw_plan_in in = t.in;
    dw_engine_time rep, one;
    assert_int_equal(dw_plan_engine_time(ctx, &in, mb, rc, &rep), DW_OK);
    assert_true(rep.launches > 0);
    const double extra = rep.launches * (DW_PLAN_LAUNCH_EAGER_S - DW_PLAN_LAUNCH_REPLAYED_S); /* a micro-batch */
    /* one GPU: the replayed figure, bit for bit */
    dw_par p1 = {.dp = 1, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = mb, .grad_accum = ga,
                 .recompute = rc};
    assert_int_equal(dw_plan_engine_time_par(ctx, &in, &p1, &one), DW_OK);
    assert_true(memcmp(&one, &rep, sizeof one) == 0);
    for (int z = 0; z <= 3; z++) {
        dw_par p = {.dp = dp, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = mb, .grad_accum = ga,
                    .zero = z, .recompute = rc};
        dw_engine_time e;
        assert_int_equal(dw_plan_engine_time_par(ctx, &in, &p, &e), DW_OK);
        /* the same kernels and work; every launch at the eager price */
        assert_true(e.launches == rep.launches && e.gemm == rep.gemm && e.attn == rep.attn && e.mem == rep.mem &&
                    e.flops == rep.flops && e.optimizer == rep.optimizer);
        assert_true(near(e.overhead - rep.overhead, extra, 1e-9));
        assert_true(near(e.fwd + e.bwd, rep.fwd + rep.bwd + extra, 1e-12));
        /* the plan's compute: every micro-batch's forward and backward, launches eager */
        dw_plan_entry pe;
        dw_reject why;
        char det[200];
        assert_true(dw_plan_evaluate(&in, &p, true, &pe, &why, det, sizeof det) && pe.runs);
        if (!near(pe.cost.compute, (double)ga * (rep.fwd + rep.bwd + extra), 1e-9))
            fail_msg("zero %d dp %d mb %lld ga %lld: compute %.9g s, want %lld x (%.9g + %.0f launches x %.1f us)", z,
                     dp, (long long)mb, (long long)ga, pe.cost.compute, (long long)ga, rep.fwd + rep.bwd, rep.launches,
                     1e6 * (DW_PLAN_LAUNCH_EAGER_S - DW_PLAN_LAUNCH_REPLAYED_S));
        if (z != 3) continue;
        /* ZeRO-3's steps between event steps, which hide the prefetched gathers, run eager too:
         * their sum is the eager forward and backward less the micro-batch's fixed overhead */
        dw_engine_zero3 z3;
        assert_int_equal(dw_plan_engine_zero3(ctx, &in, &p, &z3), DW_OK);
        assert_true(z3.step_compute_s <= (e.fwd + e.bwd) * (1 + 1e-12) && z3.step_compute_s >= e.fwd + e.bwd - 1e-4);
        assert_true(z3.step_compute_s > rep.fwd + rep.bwd - 1e-4 + 0.5 * extra);
    }
    /* the same plan on one GPU keeps the replayed compute */
    t.job.global_batch = mb * ga, t.hw->n_gpus = 1, t.hw->nvlink_domain = 1;
    assert_int_equal(dw_plan_in_init(ctx, &t.cfg, t.hw, &t.job, NULL, &in), DW_OK);
    dw_plan_entry pe;
    dw_reject why;
    char det[200];
    assert_true(dw_plan_evaluate(&in, &p1, true, &pe, &why, det, sizeof det) && pe.runs);
    assert_true(near(pe.cost.compute, (double)ga * (rep.fwd + rep.bwd), 1e-9));
    dw_hw_free(t.hw);
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replays_as_the_runtime),
        cmocka_unit_test(test_eager_launches_priced),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
