/* test_plan_search.c — the search on randomised models, machines and jobs: every returned plan
 * passes the independent checker (dw_plan_check) and this file's own re-derivation of the
 * constraints; results are deterministic, sorted, fully accounted for; on small machines the
 * best plan equals a brute-force minimum over the whole space (pruning loses nothing). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/json.h"
#include "test_plan_common.h"
#include "testutil.h"

static int64_t pick(dw_test_rng *r, const int64_t *v, int n) { return v[dw_test_next(r) % (uint64_t)n]; }

static dw_model_config random_model(dw_test_rng *r) {
    static const int64_t heads[] = {4, 6, 8, 12, 16, 32, 64}, hds[] = {64, 128}, kvdiv[] = {1, 2, 4, 8};
    int64_t H = pick(r, heads, 7), hd = pick(r, hds, 2), kd = pick(r, kvdiv, 4);
    while (H % kd) kd /= 2;
    int64_t L = 2 + (int64_t)(dw_test_next(r) % 47), V = 1000 + (int64_t)(dw_test_next(r) % 130000);
    dw_model_config c = dw_test_next(r) % 2 ? plan_llama(V, H * hd, L, H, H / kd, H * hd * 3)
                                             : plan_gpt(V, H * hd, L, H, 8192);
    c.tie_embeddings = dw_test_next(r) % 2;
    if (dw_test_next(r) % 10 < 3) {
        static const int64_t experts[] = {4, 8, 16, 64};
        c.n_experts = pick(r, experts, 4);
        c.top_k = 1 + (int64_t)(dw_test_next(r) % 4);
        c.d_ff_expert = H * hd;
        c.n_shared_experts = (int64_t)(dw_test_next(r) % 2);
        c.first_dense_layers = (int64_t)(dw_test_next(r) % 3);
    }
    return c;
}

/* This file's own reading of the constraints (deliberately not calling the library's). */
static void own_check(const dw_plan_in *in, const dw_plan_entry *e) {
    const dw_par *p = &e->par;
    const dw_model_config *c = in->cfg;
    assert_int_equal((int64_t)p->dp * p->tp * p->pp * p->cp, (int64_t)in->hw->nodes * in->hw->n_gpus);
    assert_true(p->tp <= in->hw->nvlink_domain);
    assert_int_equal(c->n_heads % p->tp, 0);
    assert_int_equal(c->n_kv_heads % p->tp, 0);
    /* layers: an even split, or first and last stage short of the middle stages' count (the
     * first may be left with none, the last with one) */
    int64_t slots = (int64_t)p->pp * p->vpp, per = c->n_layers / slots + (c->n_layers % slots != 0);
    assert_true(c->n_layers % slots == 0 || (slots >= 2 && per * slots - c->n_layers <= 2 * per - 1));
    if (p->a2a_overlap) assert_true(p->ep > 1);
    if (p->sched == DW_SCHED_DUALPIPE)
        assert_true(p->a2a_overlap && p->vpp == 1 && p->pp % 2 == 0 && p->grad_accum % 2 == 0);
    else assert_int_equal(p->sched, p->vpp > 1 ? DW_SCHED_INTERLEAVED : DW_SCHED_1F1B);
    int64_t E = in->job.moe_experts ? in->job.moe_experts : c->n_experts;
    if (E) assert_int_equal(E % p->ep, 0);
    else assert_int_equal(p->ep, 1);
    int etp = p->etp ? p->etp : p->tp; /* expert TP: tp, or 1 (folded, MoE only) */
    assert_true(etp == p->tp || (etp == 1 && E > 0));
    assert_int_equal(((int64_t)p->dp * (p->tp / etp)) % p->ep, 0);
    assert_int_equal((int64_t)p->dp * p->micro_batch * p->grad_accum, in->job.global_batch);
    if (p->vpp > 1) assert_int_equal(p->grad_accum % p->pp, 0);
    if (p->cp > 1) assert_int_equal(in->job.seq % (2 * p->cp), 0);
    if (p->zero >= 2) assert_int_equal(p->pp, 1);
    if (p->offload) assert_true(p->zero >= 1);
    const dw_mem *m = &e->mem;
    double sum = m->weights + m->grads + m->optimizer + m->activations + m->workspace + m->scales;
    assert_true(fabs(sum - m->total) <= 1e-9 * m->total);
    assert_true(m->total <= 0.9 * (double)in->hw->gpus[0].hbm_bytes);
    assert_true(e->cost.step > 0 && e->cost.mfu > 0 && e->cost.hfu > 0 && e->cost.hfu < 1);
    assert_true(e->cost.bubble_frac >= 0 && e->cost.bubble_frac < 1);
}

static void test_random_jobs(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed());
    int with_plans = 0;
    for (int it = 0; it < 60; it++) {
        dw_model_config c = random_model(&rng);
        int pi = (int)(dw_test_next(&rng) % (uint64_t)dw_hw_preset_count());
        int nodes = 1 + (int)(dw_test_next(&rng) % 8);
        dw_hw *hw = NULL;
        assert_int_equal(dw_hw_preset(ctx, dw_hw_preset_name(pi), nodes, &hw), DW_OK);
        static const int64_t seqs[] = {512, 1024, 2048, 4096, 8192};
        dw_job j = {.seq = pick(&rng, seqs, 5), .global_batch = 1 + (int64_t)(dw_test_next(&rng) % 512),
                    .recipe = dw_plan_recipes[dw_test_next(&rng) % DW_PLAN_RECIPES]};
        if (dw_test_next(&rng) % 2) j.global_batch = 64 * (1 + (int64_t)(dw_test_next(&rng) % 8));
        if (c.n_experts) j.moe_capacity = 1.0 + (double)(dw_test_next(&rng) % 4) * 0.25;
        dw_plan_in in;
        assert_int_equal(dw_plan_in_init(ctx, &c, hw, &j, NULL, &in), DW_OK);
        int top = 1 + (int)(dw_test_next(&rng) % 6);
        dw_plan_result r1, r2;
        assert_int_equal(dw_plan_search(ctx, &in, top, &r1), DW_OK);
        assert_int_equal(dw_plan_search(ctx, &in, top, &r2), DW_OK);
        /* deterministic */
        assert_int_equal(r1.n_plans, r2.n_plans);
        assert_int_equal(r1.evaluated, r2.evaluated);
        assert_memory_equal(&r1.rej, &r2.rej, sizeof r1.rej);
        if (r1.n_plans) assert_memory_equal(r1.plans, r2.plans, sizeof *r1.plans * (size_t)r1.n_plans);
        /* accounted for: every configuration is rejected for a reason, kept, or dominated */
        int64_t rejected = 0;
        for (int k = 0; k < DW_REJECT_COUNT; k++)
            if (k != DW_REJECT_DOMINATED) rejected += r1.rej.count[k];
        assert_int_equal(r1.evaluated, rejected + r1.feasible);
        assert_int_equal(r1.feasible, r1.n_plans + r1.rej.count[DW_REJECT_DOMINATED]);
        for (int i = 0; i < r1.n_plans; i++) {
            char why[1024];
            int bad = dw_plan_check(&in, &r1.plans[i].par, why, sizeof why);
            if (bad) fail_msg("iteration %d plan %d fails the checker: %s", it, i, why);
            own_check(&in, &r1.plans[i]);
            if (i) assert_true(r1.plans[i - 1].cost.step <= r1.plans[i].cost.step * (1 + 1e-9));
            /* JSON round trip of the parallel settings */
            json_t *jj = dw_plan_entry_json(&in, &r1.plans[i]);
            dw_par back;
            assert_int_equal(dw_par_from_json(ctx, jj, "plan", &back), DW_OK);
            assert_memory_equal(&back, &r1.plans[i].par, sizeof back);
            json_decref(jj);
        }
        with_plans += r1.n_plans > 0;
        dw_plan_result_free(&r1), dw_plan_result_free(&r2);
        dw_hw_free(hw);
    }
    assert_true(with_plans >= 10); /* the generator is not all infeasible jobs */
    dw_ctx_free(ctx);
}

/* Every configuration of the search space, evaluated without pruning. */
static double brute_force(const dw_plan_in *in) {
    static const int cps[] = {1, 2, 4, 8, 16, 32}, vs[] = {1, 2, 3, 4, 6, 8};
    int64_t N = in->n_gpus;
    double best = INFINITY;
    for (int tp = 1; tp <= N; tp++)
        for (int ci = 0; ci < 6; ci++)
            for (int pp = 1; pp <= N; pp++) {
                int cp = cps[ci];
                if (N % ((int64_t)tp * cp * pp)) continue;
                int dp = (int)(N / ((int64_t)tp * cp * pp));
                for (int ep = 1; ep <= dp * tp; ep++)
                    /* schedules: by v, each with and without all-to-all overlap, and DualPipe (7) */
                    for (int vi = 0; vi < 7 * 2; vi++)
                        for (int64_t mb = 1; mb <= 32; mb++) {
                            bool ovl = vi % 2, dual = vi / 2 == 6;
                            int v = dual ? 1 : vs[vi / 2];
                            if (in->job.global_batch % (dp * mb)) continue;
                            if (v > 1 && pp == 1) continue;
                            if ((ovl || dual) && ep == 1) continue;
                            if (dual && (!ovl || pp % 2)) continue;
                            for (int rc = 0; rc < 3; rc++)
                                for (int z = 0; z < 4; z++)
                                    for (int off = 0; off < 4; off++) {
                                        int fold = off / 2; /* expert TP 1 instead of tp */
                                        if ((off % 2 && !z) || (fold && tp == 1)) continue;
                                        dw_par p = {.dp = dp, .tp = tp, .pp = pp, .ep = ep, .cp = cp,
                                                    .etp = fold ? 1 : tp,
                                                    .vpp = v, .micro_batch = mb, .a2a_overlap = ovl,
                                                    .grad_accum = in->job.global_batch / (dp * mb),
                                                    .sched = dual ? DW_SCHED_DUALPIPE
                                                             : v > 1 ? DW_SCHED_INTERLEAVED : DW_SCHED_1F1B,
                                                    .recompute = (dw_recompute)rc, .zero = z, .offload = off % 2};
                                        if (pp > in->cfg->n_layers + 2) continue;
                                        dw_plan_entry e;
                                        dw_reject why;
                                        char det[200];
                                        if (dw_plan_evaluate(in, &p, true, &e, &why, det, sizeof det) &&
                                            e.cost.step < best)
                                            best = e.cost.step;
                                    }
                        }
            }
    return best;
}

static void test_pruning_is_exact(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0x9abc);
    int compared = 0;
    for (int it = 0; it < 12; it++) {
        dw_model_config c = random_model(&rng);
        c.n_layers = 2 + (int64_t)(dw_test_next(&rng) % 14);
        dw_hw *hw = NULL;
        assert_int_equal(dw_hw_preset(ctx, "h100-sxm", 1 + (int)(dw_test_next(&rng) % 2), &hw), DW_OK);
        dw_job j = {.seq = 2048, .global_batch = 16 * (1 + (int64_t)(dw_test_next(&rng) % 4))};
        dw_plan_in in;
        assert_int_equal(dw_plan_in_init(ctx, &c, hw, &j, NULL, &in), DW_OK);
        dw_plan_result r;
        assert_int_equal(dw_plan_search(ctx, &in, 2, &r), DW_OK);
        double bf = brute_force(&in);
        if (r.n_plans == 0) assert_true(isinf(bf));
        else {
            assert_true(fabs(r.plans[0].cost.step - bf) <= 1e-9 * bf);
            compared++;
        }
        dw_plan_result_free(&r);
        dw_hw_free(hw);
    }
    assert_true(compared >= 3);
    dw_ctx_free(ctx);
}

/* Best predicted step of a job on a (modified) machine; INFINITY when nothing fits. */
static double best_step(dw_ctx *ctx, const dw_model_config *c, const dw_hw *hw, const dw_job *j, int64_t *feasible) {
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, c, hw, j, NULL, &in), DW_OK);
    dw_plan_result r;
    assert_int_equal(dw_plan_search(ctx, &in, 1, &r), DW_OK);
    double t = r.n_plans ? r.plans[0].cost.step : INFINITY;
    if (feasible) *feasible = r.feasible;
    dw_plan_result_free(&r);
    return t;
}

/* Properties any sane cost model has: less memory never helps, faster links or chips never
 * hurt (every configuration's time is monotone in them, so the minimum is too). */
static void test_monotone_properties(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0x4242);
    for (int it = 0; it < 15; it++) {
        dw_model_config c = random_model(&rng);
        dw_hw *hw = NULL;
        int nodes = 1 << (int)(dw_test_next(&rng) % 3);
        assert_int_equal(dw_hw_preset(ctx, dw_hw_preset_name((int)(dw_test_next(&rng) % 4)), nodes, &hw), DW_OK);
        dw_job j = {.seq = 2048, .global_batch = 64 * (1 + (int64_t)(dw_test_next(&rng) % 4)),
                    .recipe = dw_plan_recipes[dw_test_next(&rng) % DW_PLAN_RECIPES]};
        int64_t f1 = 0, f2 = 0;
        double base = best_step(ctx, &c, hw, &j, &f1);
        dw_job tight = j;
        tight.mem_headroom = 0.4;
        double t = best_step(ctx, &c, hw, &tight, &f2);
        assert_true(f2 <= f1);
        assert_true(t >= base * (1 - 1e-12));
        hw->nvlink_gbps *= 2, hw->internode_gbps *= 2;
        t = best_step(ctx, &c, hw, &j, NULL);
        assert_true(t <= base * (1 + 1e-12));
        for (int g = 0; g < hw->n_gpus; g++) {
            hw->gpus[g].peak_bf16_tflops *= 2, hw->gpus[g].peak_fp8_tflops *= 2, hw->gpus[g].peak_fp4_tflops *= 2;
            hw->gpus[g].hbm_gbps *= 2;
        }
        double t2 = best_step(ctx, &c, hw, &j, NULL);
        assert_true(t2 <= t * (1 + 1e-12));
        if (isfinite(t)) assert_true(t2 < t);
        dw_hw_free(hw);
    }
    dw_ctx_free(ctx);
}

static void test_nothing_fits(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = plan_preset(ctx, "h100-sxm", 1);
    dw_model_config c = plan_llama(128256, 16384, 126, 128, 8, 53248); /* 405B on 8 GPUs */
    dw_job j = {.seq = 8192, .global_batch = 64};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, &c, hw, &j, NULL, &in), DW_OK);
    dw_plan_result r;
    assert_int_equal(dw_plan_search(ctx, &in, 3, &r), DW_OK);
    assert_int_equal(r.n_plans, 0);
    assert_true(r.rej.count[DW_REJECT_MEMORY] > 0);
    assert_non_null(strstr(r.rej.example[DW_REJECT_MEMORY][0], "GiB >"));
    assert_true(r.rej.n_examples[DW_REJECT_MEMORY] >= 2);
    assert_string_not_equal(r.rej.example[DW_REJECT_MEMORY][0], r.rej.example[DW_REJECT_MEMORY][1]);
    json_t *jr = dw_plan_result_json(&in, &r);
    assert_true(json_is_null(json_object_get(jr, "best")));
    assert_true(json_array_size(json_object_get(jr, "rejected")) > 0);
    json_decref(jr);
    dw_plan_result_free(&r);
    /* a huge global batch: pipelines too long to simulate are rejected, never returned */
    dw_model_config small = plan_gpt(50257, 768, 12, 12, 1024);
    dw_job big = {.seq = 1024, .global_batch = 1 << 24};
    assert_int_equal(dw_plan_in_init(ctx, &small, hw, &big, NULL, &in), DW_OK);
    assert_int_equal(dw_plan_search(ctx, &in, 2, &r), DW_OK);
    assert_true(r.rej.count[DW_REJECT_SIM_SIZE] > 0);
    assert_true(r.n_plans > 0);
    for (int i = 0; i < r.n_plans; i++)
        assert_true(r.plans[i].par.grad_accum * r.plans[i].par.pp * r.plans[i].par.vpp <= DW_PLAN_SIM_LIMIT);
    dw_plan_result_free(&r);
    /* bad jobs are refused with a message naming the field */
    j.seq = 0;
    assert_int_equal(dw_plan_in_init(ctx, &c, hw, &j, NULL, &in), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "--seq"));
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

static void test_checker_catches_violations(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = plan_preset(ctx, "h100-sxm", 2);
    dw_model_config c = plan_llama(32000, 4096, 32, 32, 8, 11008);
    dw_job j = {.seq = 4096, .global_batch = 64};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, &c, hw, &j, NULL, &in), DW_OK);
    dw_par ok = {.dp = 8, .tp = 2, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = 1, .grad_accum = 8,
                 .recompute = DW_RECOMPUTE_FULL, .zero = 1};
    char why[1024];
    assert_int_equal(dw_plan_check(&in, &ok, why, sizeof why), 0);
    struct { dw_par p; const char *needle; } bad[] = {
        {ok, "tp 16"}, {ok, "kv heads"}, {ok, "layers"}, {ok, "global batch"}, {ok, "ZeRO-2"}, {ok, "GPUs"},
    };
    bad[0].p.tp = 16, bad[0].p.dp = 1;                       /* beyond the NVLink domain */
    bad[1].p.tp = 16, bad[1].p.dp = 1;                       /* 8 KV heads */
    bad[2].p.pp = 2, bad[2].p.vpp = 5, bad[2].p.dp = 4;      /* 32 / 10 */
    bad[3].p.micro_batch = 3;                                /* 8 * 3 * 8 != 64 */
    bad[4].p.pp = 2, bad[4].p.dp = 4, bad[4].p.zero = 2, bad[4].p.grad_accum = 16;
    bad[5].p.dp = 4;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_true(dw_plan_check(&in, &bad[i].p, why, sizeof why) > 0);
        if (!strstr(why, bad[i].needle)) fail_msg("case %zu: '%s' not in: %s", i, bad[i].needle, why);
    }
    dw_par big = ok;
    big.recompute = DW_RECOMPUTE_NONE, big.micro_batch = 8, big.grad_accum = 1, big.zero = 0;
    assert_int_equal(dw_plan_check(&in, &big, why, sizeof why), 1);
    assert_non_null(strstr(why, "memory"));
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_jobs),
        cmocka_unit_test(test_pruning_is_exact),
        cmocka_unit_test(test_monotone_properties),
        cmocka_unit_test(test_nothing_fits),
        cmocka_unit_test(test_checker_catches_violations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
