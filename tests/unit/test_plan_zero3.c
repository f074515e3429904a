/* test_plan_zero3.c — the planner prices ZeRO-3 as train/dp_zero3.c runs it (issue 28): on random
 * models, ranks, micro-batches, accumulations and recompute, each rank's memory is the one-GPU
 * engine's pools with the weights pool replaced by the largest shard of the FP32 masters (256-byte
 * aligned) plus the gather block, and the optimizer pool by the shard's moments; the gather block is
 * the static memory planner's arena over the parameters' lifetimes, which this test derives itself
 * from the compiled program's steps (first to last forward step reading a parameter, then first to
 * last backward step, each from the sweep's previous first reader, where the prefetch starts it); the step time is ZeRO-2's reduction, no all-gather, the AdamW of the shard,
 * and every micro-batch's broadcasts of each parameter's parts (one per owning rank, once per sweep
 * that reads it) summed here part by part, exposed as the prefetch leaves them: each sweep's first
 * event step's whole, the rest where they outlast the compute between (an exact oracle on a
 * hand-computed sweep, bounds on the programs), all exposed without overlap; faster links never
 * make a ZeRO-3 step slower. The engine's times here are eager, as ZeRO-3 issues its steps
 * (test_plan_zero3_launch.c). A quantised recipe is not runnable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "compile/memplan.h"
#include "compile/passes.h"
#include "compile/program.h"
#include "test_plan_common.h"
#include "testutil.h"

/* What the test derives from the program alone: the gather arena, one micro-batch's gather seconds
 * (parts broadcast at the planner's collective model), the whole param floats. */
typedef struct {
    int64_t gather, floats, bcast_floats;
    int64_t casts; /* (parameter, sweep) pairs gathered: each gathered parameter's BF16 cast */
    double seconds;
    double first_s; /* the gathers of each sweep's first event step (blocking under the prefetch) */
} z3_oracle;

/* Parameter tensor t's first and last reader among the steps [s0, s1) of the kind forward or backward. */
static void reads(const dw_compiled *c, int t, int s0, int s1, int *first, int *last) {
    *first = *last = -1;
    for (int s = s0; s < s1; s++) {
        if (c->steps[s].kind != DW_STEP_FWD && c->steps[s].kind != DW_STEP_BWD) continue;
        const dw_ir_node *n = dw_compile_node(c, c->steps[s].node);
        int hit = 0;
        for (int i = 0; i < n->n_in; i++) hit |= n->in[i] == t;
        if (!hit) continue;
        if (*first < 0) *first = s;
        *last = s;
    }
}

static void oracle(dw_ctx *ctx, const dw_plan_in *in, int64_t mb, int rc, int dp, z3_oracle *o) {
    dw_graph *g = NULL;
    dw_policy *pol = NULL;
    dw_compiled *c = NULL;
    assert_int_equal(dw_capture_config(ctx, in->cfg, mb, in->job.seq, &g), DW_OK);
    assert_int_equal(dw_policy_from_precision(ctx, "bf16", false, &pol), DW_OK);
    dw_compile_opts co;
    dw_compile_opts_init(&co, sizeof co);
    co.device = DW_DEVICE_CUDA, co.sm = 90, co.fused_head = true, co.recompute = rc;
    assert_int_equal(dw_compile(ctx, g, NULL, pol, &co, &c), DW_OK);
    memset(o, 0, sizeof *o);
    o->floats = c->param_floats;
    const int64_t block = c->param_floats / (dp * 64) * 64; /* shards: 64-float blocks, the last rank the rest */
    dw_mem_item *items = calloc((size_t)c->n_params + 1, sizeof *items);
    int *rd = malloc((size_t)(4 * c->n_params + 1) * sizeof *rd); /* (n_params, 4) ff fl bf bl */
    assert_non_null(rd);
    for (int k = 0; k < c->n_params; k++) {
        reads(c, c->param_tensor[k], c->phase[DW_PHASE_FORWARD][0], c->phase[DW_PHASE_FORWARD][1], &rd[4 * k], &rd[4 * k + 1]);
        reads(c, c->param_tensor[k], c->phase[DW_PHASE_BACKWARD][0], c->phase[DW_PHASE_BACKWARD][1], &rd[4 * k + 2],
              &rd[4 * k + 3]);
    }
    int n = 0, f0 = -1, b0 = -1; /* each sweep's first event step: the earliest first reader */
    for (int k = 0; k < c->n_params; k++) {
        if (rd[4 * k] >= 0 && (f0 < 0 || rd[4 * k] < f0)) f0 = rd[4 * k];
        if (rd[4 * k + 2] >= 0 && (b0 < 0 || rd[4 * k + 2] < b0)) b0 = rd[4 * k + 2];
    }
    for (int k = 0; k < c->n_params; k++) {
        const int ff = rd[4 * k], fl = rd[4 * k + 1], bf = rd[4 * k + 2], bl = rd[4 * k + 3];
        if (ff < 0 && bf < 0) continue;
        /* the prefetch: live from the sweep's latest first reader of any parameter before its own */
        int fs = ff, bs = bf;
        for (int j = 0; j < c->n_params; j++) {
            if (rd[4 * j] >= 0 && rd[4 * j] < ff && (fs == ff || rd[4 * j] > fs)) fs = rd[4 * j];
            if (rd[4 * j + 2] >= 0 && rd[4 * j + 2] < bf && (bs == bf || rd[4 * j + 2] > bs)) bs = rd[4 * j + 2];
        }
        const int64_t numel = dw_ir_numel(&g->tensors[c->param_tensor[k]]);
        dw_mem_item it = {.size = (numel * 4 + 255) / 256 * 256 + numel * 2, .align = 256}; /* FP32 + BF16 */
        if (ff >= 0) it.first = fs, it.last = fl;
        if (bf >= 0 && ff >= 0) it.first2 = bs, it.last2 = bl;
        if (ff < 0) it.first = bs, it.last = bl;
        items[n++] = it;
        const int sweeps = (ff >= 0) + (bf >= 0);
        o->casts += sweeps;
        for (int r = 0; r < dp; r++) {
            const int64_t rlo = r * block, rhi = r == dp - 1 ? c->param_floats : rlo + block;
            const int64_t a = c->param_off[k], lo = a > rlo ? a : rlo, hi = a + numel < rhi ? a + numel : rhi;
            if (hi <= lo) continue;
            const double bytes = 4.0 * (double)(hi - lo);
            const double t = dw_plan_coll_time(in->hw, DW_COLL_ALLGATHER, dp, 1, bytes) * dp / (dp - 1);
            o->bcast_floats += sweeps * (hi - lo);
            o->seconds += sweeps * t;
            o->first_s += (ff >= 0 && ff == f0 ? t : 0) + (bf >= 0 && bf == b0 ? t : 0);
        }
    }
    int64_t sum = 0, apart = 0; /* every slot's bytes; side by side, each 256-aligned */
    for (int i = 0; i < n; i++) sum += items[i].size, apart += (items[i].size + 255) / 256 * 256;
    assert_int_equal(dw_memplan_assign(ctx, items, n, &o->gather), DW_OK);
    /* the arena holds what is live together, and reuses: less than every parameter at once */
    assert_true(o->gather >= dw_memplan_live_peak(items, n) && o->gather <= apart);
    assert_true(o->gather < sum);
    free(items), free(rd);
    dw_compiled_free(c);
    dw_policy_free(pol);
    dw_graph_free(g);
}

static void test_zero3_priced_as_run(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0x23);
    plan_dp_job t;
    plan_random_dp_job(ctx, &rng, &t);
    dw_model_config cfg = t.cfg;
    dw_hw *hw = t.hw;
    const int dp = t.dp, rc = t.rc;
    const int64_t mb = t.mb, ga = t.ga;
    dw_job j = t.job;
    dw_plan_in in = t.in;
    z3_oracle o;
    oracle(ctx, &in, mb, rc, dp, &o);
    dw_engine_mem em;
    dw_engine_time et;
    assert_int_equal(dw_plan_engine_memory(ctx, &in, mb, rc, &em), DW_OK);
    const dw_par pz3 = {.dp = dp, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = mb, .grad_accum = ga,
                        .zero = 3, .recompute = rc};
    assert_int_equal(dw_plan_engine_time_par(ctx, &in, &pz3, &et), DW_OK); /* launches eager, as ZeRO-3 runs */
    dw_plan_entry e[4];
    for (int z = 2; z <= 3; z++) {
        dw_par p = {.dp = dp, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = mb, .grad_accum = ga,
                    .zero = z, .recompute = rc};
        dw_reject why;
        char det[200];
        assert_true(dw_plan_evaluate(&in, &p, true, &e[z], &why, det, sizeof det));
        assert_true(e[z].runs);
    }
    /* memory: ZeRO-2's pools with the weights pool the shard of the masters plus the gather block */
    const int64_t block = o.floats / (dp * 64) * 64, last = o.floats - (dp - 1) * block;
    const int64_t shard = (4 * last + 255) / 256 * 256;
    assert_true(e[3].mem.weights == (double)(shard + o.gather));
    assert_true(e[3].mem.optimizer == (double)(8 * last) && e[3].mem.optimizer == e[2].mem.optimizer);
    int64_t stage = 0; /* ZeRO-2/3's gradients: the shard's + the staging slots (compile/grad_stage.h) */
    assert_int_equal(dw_plan_engine_grad_stage(ctx, &in, &e[3].par, &stage), DW_OK);
    const int64_t grads = 4 * last + stage;
    assert_true(e[3].mem.total ==
                (double)(em.total - em.pool[0] - em.pool[1] - em.pool[2] + shard + o.gather + grads + 8 * last));
    assert_true(e[3].mem.grads == (double)grads && e[2].mem.grads == (double)grads);
    assert_true(e[3].mem.activations == (double)em.pool[3]);
    assert_true(e[3].mem.weights < (double)em.pool[0]);
    /* the planner's own ZeRO-3 figures, against the oracle */
    dw_engine_zero3 z3;
    dw_par p3 = e[3].par;
    assert_int_equal(dw_plan_engine_zero3(ctx, &in, &p3, &z3), DW_OK);
    assert_true(z3.gather_bytes == o.gather && z3.shard_bytes == shard && z3.gathered_floats == o.bcast_floats);
    assert_true(fabs(z3.gather_s / o.seconds - 1) < 1e-12);
    /* every parameter float is broadcast at least once a micro-batch, at most twice */
    assert_true(o.bcast_floats <= 2 * o.floats && o.bcast_floats > 0);
    /* prefetched: each sweep's first event step's gathers whole, no more than all of them, and at most
     * the micro-batch's compute (forward and backward) hidden */
    const double x3 = z3.gather_exposed_s, tol = 1e-12 * o.seconds;
    assert_true(x3 >= o.first_s - tol && x3 <= o.seconds + tol && o.first_s > 0);
    assert_true(x3 >= o.first_s + fmax(0, o.seconds - o.first_s - z3.step_compute_s) - tol);
    /* the steps' compute is the engine's forward and backward, split step by step (less the
     * micro-batch's fixed overhead, a few tens of microseconds, on no step) */
    assert_true(z3.step_compute_s <= (et.fwd + et.bwd) * (1 + 1e-12) && z3.step_compute_s >= et.fwd + et.bwd - 1e-4);
    /* time, term by term: ZeRO-2's reduction (no all-gather after the step), ga x the gathers, of
     * which ga x gather_exposed_s exposed (overlap, the search's), all without */
    dw_param_counts pc;
    dw_plan_params(&in, &pc);
    const double ag = dw_plan_coll_time(hw, DW_COLL_ALLGATHER, dp, 1, 4 * pc.total);
    const double gathers = (double)ga * o.seconds;
    assert_true(fabs(e[3].cost.dp_comm - (e[2].cost.dp_comm - ag + gathers)) <= 1e-12 * e[3].cost.dp_comm);
    /* each gathered parameter cast to BF16 in its slot, per sweep: 4 + 2 bytes a float at 40% of the
     * HBM bandwidth and an eager launch (the engine model's memory-pass and launch rates), exposed */
    const double cast = (double)o.bcast_floats * 6.0 / (hw->gpus[0].hbm_gbps * 1e9 * 0.70) +
                        (double)o.casts * DW_PLAN_LAUNCH_EAGER_S;
    assert_true(o.casts > 0 && fabs(z3.cast_s - cast) <= 1e-12 * cast);
    assert_true(fabs(e[3].cost.dp_exposed - (e[2].cost.dp_exposed - ag + (double)ga * (x3 + cast))) <=
                1e-12 * e[3].cost.dp_comm);
    double a0, x0, o0, a2, x2, o2; /* without overlap (--no-overlap, DW_Z3_PREFETCH=0): all exposed */
    dw_plan_runtime_dp(&in, &p3, et.optimizer, et.bwd, false, &a0, &x0, &o0);
    dw_par p2 = e[2].par;
    dw_plan_runtime_dp(&in, &p2, et.optimizer, et.bwd, false, &a2, &x2, &o2);
    assert_true(fabs(x0 - (x2 - ag + gathers + (double)ga * cast)) <= 1e-12 * a0 && fabs(a0 - e[3].cost.dp_comm) <= 1e-12 * a0);
    assert_true(e[3].cost.dp_exposed <= x0 * (1 + 1e-12));
    assert_true(fabs(e[3].cost.optimizer / (et.optimizer / dp) - 1) < 1e-12);
    assert_true(fabs(e[3].cost.compute / ((double)ga * (et.fwd + et.bwd)) - 1) < 1e-9);
    assert_true(fabs(e[3].cost.step / (e[3].cost.pipeline + e[3].cost.dp_exposed + e[3].cost.optimizer) - 1) < 1e-12);
    /* a quantised recipe: the runtime gathers no weight caches, so no ZeRO-3 plan of it runs */
    j.recipe = DW_RECIPE_MXFP8;
    assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in), DW_OK);
    char why[300];
    assert_false(dw_plan_engine_runnable(&in, &p3, why, sizeof why));
    assert_non_null(strstr(why, "ZeRO-3"));
    assert_non_null(strstr(why, "quantised"));
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

/* The prefetch's exposure on hand-computed sweeps (dyadic seconds, so exact): steps 0..7, gathers
 * at the event steps 1, 3 and 6. Step 0's compute precedes the first event and hides nothing. */
static void test_prefetch_exposed_by_hand(void **state) {
    (void)state;
    const double gather[8] = {0, 3, 0, 2, 0, 0, 5, 0}, step_s[8] = {7, 1, 0.5, 2, 1, 1.5, 0.25, 9};
    /* 3 (the first, blocking) + max(0, 2 - (1 + 0.5)) + max(0, 5 - (2 + 1 + 1.5)) */
    assert_true(dw_plan_z3_prefetch_exposed(0, 8, gather, step_s) == 3 + 0.5 + 0.5);
    /* the sweep from step 2: step 3's gathers block, step 6's hide under 4.5 s but 0.5 */
    assert_true(dw_plan_z3_prefetch_exposed(2, 8, gather, step_s) == 2 + 0.5);
    const double slow[8] = {0, 0.5, 0, 1.5, 0, 0, 4.5, 0}; /* each later one hidden whole */
    assert_true(dw_plan_z3_prefetch_exposed(0, 8, slow, step_s) == 0.5);
    const double none[8] = {0};
    assert_true(dw_plan_z3_prefetch_exposed(0, 8, none, step_s) == 0);
    /* random sweeps: between the first event's gathers and all of them; faster links (the gathers
     * scaled down) never expose more */
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0x2f);
    for (int trial = 0; trial < 200; trial++) {
        double g[32], c[32], g2[32], sum = 0, first = -1;
        const double scale = (double)(dw_test_next(&rng) % 1000) / 1000;
        for (int s = 0; s < 32; s++) {
            g[s] = dw_test_next(&rng) % 3 ? 0 : (double)(dw_test_next(&rng) % 1000) / 97;
            c[s] = (double)(dw_test_next(&rng) % 1000) / 331;
            g2[s] = g[s] * scale;
            sum += g[s];
            if (first < 0 && g[s] > 0) first = g[s];
        }
        const double x = dw_plan_z3_prefetch_exposed(0, 32, g, c);
        assert_true(x <= sum * (1 + 1e-12) && x >= (first > 0 ? first : 0));
        assert_true(dw_plan_z3_prefetch_exposed(0, 32, g2, c) <= x * (1 + 1e-12));
    }
}

/* Faster links never make a ZeRO-3 plan's step slower: the same plan with the NVLink bandwidth
 * raised step by step. */
static void test_zero3_faster_links(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0x31);
    dw_model_config cfg;
    int dp;
    dw_hw *hw = plan_random_dp(ctx, &rng, &cfg, &dp);
    const int64_t mb = 1 + (int64_t)(dw_test_next(&rng) % 2);
    dw_job j = {.seq = 128, .global_batch = dp * mb};
    dw_par p = {.dp = dp, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = mb, .grad_accum = 1,
                .zero = 3};
    const double base = hw->nvlink_gbps;
    double prev = -1, prev_exp = -1, slowest = 0;
    for (int i = 0; i < 6; i++) {
        hw->nvlink_gbps = base / 8 * (double)(1 << i); /* 1/8 .. 4x the preset */
        dw_plan_in in;
        assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in), DW_OK);
        dw_plan_entry e;
        dw_reject why;
        char det[200];
        assert_true(dw_plan_evaluate(&in, &p, true, &e, &why, det, sizeof det) && e.runs);
        if (prev >= 0) assert_true(e.cost.step <= prev * (1 + 1e-12) && e.cost.dp_exposed <= prev_exp * (1 + 1e-12));
        prev = e.cost.step, prev_exp = e.cost.dp_exposed;
        if (i == 0) slowest = e.cost.step;
    }
    assert_true(prev < slowest); /* the links do count: the first gathers of each sweep at least */
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

/* The search ranks ZeRO-3 plans among the runnable: on a machine whose memory only ZeRO-3 fits
 * (gpt2-124m, 8 GPUs, memory cut below ZeRO-2's per-rank figure), the first plan is a runnable
 * ZeRO-3 one, and every runnable plan precedes every plan the runtime does not run. */
static void test_zero3_ranked_when_only_it_fits(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_model_config cfg;
    assert_int_equal(dw_model_config_load(ctx, "gpt2-124m", &cfg), DW_OK);
    dw_hw *hw = plan_preset(ctx, "h200", 1);
    hw->n_gpus = 8, hw->nvlink_domain = 8;
    dw_job j = {.seq = 256, .global_batch = 8};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in), DW_OK);
    dw_par p = {.dp = 8, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = 1, .grad_accum = 1};
    dw_mem m2, m3;
    p.zero = 2, dw_plan_memory(&in, &p, &m2);
    p.zero = 3, dw_plan_memory(&in, &p, &m3);
    assert_true(m3.total < m2.total);
    /* usable memory between ZeRO-3's and ZeRO-2's per-rank figures (both recompute settings) */
    p.recompute = DW_RECOMPUTE_FULL;
    dw_mem m3f, m2f;
    dw_plan_memory(&in, &p, &m3f);
    p.zero = 2, dw_plan_memory(&in, &p, &m2f);
    const double hi = fmin(m2.total, m2f.total), lo = fmax(m3.total, m3f.total);
    assert_true(lo < hi);
    for (int i = 0; i < hw->n_gpus; i++) hw->gpus[i].hbm_bytes = (int64_t)((lo + hi) / 2 / (1.0 - in.job.mem_headroom));
    assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &j, NULL, &in), DW_OK);
    dw_plan_result r;
    assert_int_equal(dw_plan_search(ctx, &in, 16, &r), DW_OK);
    assert_true(r.n_plans >= 1 && r.plans[0].runs && r.plans[0].par.zero == 3 && r.plans[0].par.dp == 8);
    for (int i = 1; i < r.n_plans; i++) assert_true(r.plans[i - 1].runs || !r.plans[i].runs);
    dw_plan_result_free(&r);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zero3_priced_as_run),
        cmocka_unit_test(test_prefetch_exposed_by_hand),
        cmocka_unit_test(test_zero3_faster_links),
        cmocka_unit_test(test_zero3_ranked_when_only_it_fits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
