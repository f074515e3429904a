/* test_plan_explain.c — what `deepwell plan --explain` reads through deepwell.h: the step split
 * (dw_plan_get_time_split) adds up to the predicted step for every kept candidate; memory per
 * pipeline rank (dw_plan_get_rank_memory) peaks at the plan's worst stage with its total; the
 * layer layout (dw_plan_get_stage) partitions the stack in order with the embedding first, the
 * LM head last and the config's dense layers where the config puts them; the layout struct's
 * expert TP and overlap agree with the summary. Random jobs (dense and MoE), and DeepSeek-V3's
 * published PP16 DualPipe layout (3, 14 x 4, 2 + MTP: docs/planner.md). The families'
 * accounts (dw_plan_set_get_family) against the kept plans, membership re-derived here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "test_plan_common.h"
#include "testutil.h"

static dw_plan_job job_of(int64_t seq, int64_t G, int top) {
    dw_plan_job j;
    dw_plan_job_init(&j, sizeof j);
    j.seq = seq, j.global_batch = G, j.top_k = top;
    return j;
}

/* Every property above for one plan of `model` (n_layers blocks, dense_first of them dense). */
static void check_plan(const dw_plan *p, int64_t n_layers, int64_t dense_first) {
    dw_plan_cost c = {.size = sizeof c};
    dw_plan_mem m = {.size = sizeof m};
    dw_plan_time_split t = {.size = sizeof t};
    dw_plan_layout l = {.size = sizeof l};
    assert_int_equal(dw_plan_get_cost(p, &c), DW_OK);
    assert_int_equal(dw_plan_get_memory(p, &m), DW_OK);
    assert_int_equal(dw_plan_get_time_split(p, &t), DW_OK);
    assert_int_equal(dw_plan_get_layout(p, &l), DW_OK);
    double sum = t.compute + t.tp_exposed + t.cp_exposed + t.ep_exposed + t.recompute + t.bubble + t.dp_exposed +
                 t.optimizer;
    if (fabs(sum / c.step - 1) > 1e-9) fail_msg("%s: split sums to %.9g, step %.9g", dw_plan_summary(p), sum, c.step);
    assert_true(t.compute > 0 && t.tp_exposed >= 0 && t.cp_exposed >= 0 && t.ep_exposed >= 0 && t.recompute >= 0);
    assert_true(t.bubble >= -1e-12 * c.step && t.dp_exposed >= 0 && t.optimizer >= 0 && t.ep_hidden >= 0);
    assert_true(fabs(t.tp_exposed - c.tp_comm) <= 1e-12 * c.step && fabs(t.ep_exposed - c.ep_comm) <= 1e-12 * c.step);
    /* the layout struct's MoE fields against the summary ("etpN" only when not tp; "+a2a_overlap"
     * for an overlapped non-DualPipe schedule) */
    const char *sum_s = dw_plan_summary(p);
    char etp[16];
    snprintf(etp, sizeof etp, " etp%d ", l.etp);
    assert_true(l.etp == l.tp ? strstr(sum_s, " etp") == NULL : strstr(sum_s, etp) != NULL);
    assert_true(l.etp == l.tp || l.etp == 1);
    if (strstr(sum_s, "+a2a_overlap") || strcmp(dw_plan_schedule(p), "dualpipe") == 0) assert_true(l.a2a_overlap);
    else assert_false(l.a2a_overlap);
    assert_true(l.grad_accum * l.dp * l.micro_batch == l.global_batch);
    /* memory per rank: the worst stage holds the plan's total, no rank more */
    int worst = -1;
    for (int r = 0; r < l.pp; r++) {
        dw_plan_mem rm = {.size = sizeof rm};
        assert_int_equal(dw_plan_get_rank_memory(p, r, &rm), DW_OK);
        assert_true(rm.total <= m.total * (1 + 1e-12));
        if (fabs(rm.total - m.total) <= 1e-9 * m.total && worst < 0) worst = r;
    }
    assert_int_equal(worst, m.worst_stage);
    dw_plan_mem bad = {.size = sizeof bad};
    assert_int_equal(dw_plan_get_rank_memory(p, l.pp, &bad), DW_ERR_INVALID);
    /* the layout: pp x vpp stages covering the stack in order */
    int n = dw_plan_stage_count(p);
    assert_int_equal(n, l.pp * l.vpp);
    int64_t next = 0, dense = 0, heads = 0, embeds = 0;
    for (int i = 0; i < n; i++) {
        dw_plan_stage st = {.size = sizeof st};
        assert_int_equal(dw_plan_get_stage(p, i, &st), DW_OK);
        assert_true(st.first_layer == next);
        assert_true(st.dense_layers + st.moe_layers == st.layers && st.layers >= 0);
        /* the config's dense layers are the first ones of the stack */
        int64_t want_dense = 0;
        for (int64_t b = st.first_layer; b < st.first_layer + st.layers; b++) want_dense += b < dense_first;
        if (dense_first < n_layers) assert_true(st.dense_layers == want_dense);
        next += st.layers, dense += st.dense_layers;
        heads += st.lm_head, embeds += st.embedding;
        assert_true(st.embedding == (i == 0) && st.lm_head == (i == n - 1));
        assert_true(st.rank >= 0 && st.rank < l.pp && st.chunk >= 0);
        if (strcmp(dw_plan_schedule(p), "dualpipe")) assert_true(st.rank == i % l.pp && st.chunk == i / l.pp);
        else assert_true(st.rank == i && st.chunk == 0);
    }
    assert_true(next == n_layers && heads == 1 && embeds == 1);
    assert_true(dense == (dense_first < n_layers ? dense_first : n_layers));
    dw_plan_stage bad_st = {.size = sizeof bad_st};
    assert_int_equal(dw_plan_get_stage(p, n, &bad_st), DW_ERR_INVALID);
}

static void test_random_jobs(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0xe7);
    static const char *const models[] = {"llama-8b", "mixtral-8x7b"};
    for (int trial = 0; trial < 2; trial++) {
        const char *model = models[trial];
        int nodes = 1 << (dw_test_next(&rng) % 3);
        int64_t G = (int64_t)(dw_test_next(&rng) % 4 + 1) * 64;
        dw_hw *hw = plan_preset(ctx, "h100-sxm", nodes);
        dw_plan_job j = job_of(4096, G, 4);
        dw_plan_set *set = NULL;
        assert_int_equal(dw_autoplan_search(ctx, model, hw, &j, &set), DW_OK);
        dw_model_config cfg;
        assert_int_equal(dw_model_config_load(ctx, model, &cfg), DW_OK);
        print_message("%s on %d nodes, batch %lld: %d plans\n", model, nodes, (long long)G, dw_plan_set_count(set));
        assert_true(dw_plan_set_count(set) > 0);
        for (int i = 0; i < dw_plan_set_count(set); i++) {
            dw_plan *p = NULL;
            assert_int_equal(dw_plan_set_get(ctx, set, i, &p), DW_OK);
            check_plan(p, cfg.n_layers, cfg.n_experts ? 0 : cfg.n_layers);
            dw_plan_free(p);
        }
        dw_plan_set_free(set);
        dw_hw_free(hw);
    }
    dw_ctx_free(ctx);
}

/* DeepSeek-V3's published layout: PP16 DualPipe, EP64 over DP128 (a plan read from JSON). */
static void test_deepseek_v3_layout(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = plan_preset(ctx, "h100-sxm", 256);
    dw_plan_job j = job_of(4096, 15360, 1);
    j.recipe = DW_RECIPE_FP8_BLOCK, j.mem_headroom = 0.05;
    const char *text = "{\"parallel\": {\"dp\": 128, \"tp\": 1, \"pp\": 16, \"ep\": 64, \"cp\": 1}, "
                       "\"virtual_stages\": 1, \"schedule\": \"dualpipe\", \"a2a_overlap\": true, \"micro_batch\": 1, "
                       "\"recompute\": \"selective\", \"zero\": 1, \"offload\": true}";
    dw_plan *p = NULL;
    assert_int_equal(dw_plan_from_json(ctx, text, strlen(text), "test", "deepseek-v3", hw, &j, &p), DW_OK);
    dw_plan_checks ck = {.size = sizeof ck};
    assert_int_equal(dw_plan_get_checks(p, &ck), DW_OK);
    assert_true(ck.constraints_ok);
    check_plan(p, 61, 3);
    static const int64_t want[16] = {3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 2};
    for (int i = 0; i < 16; i++) {
        dw_plan_stage st = {.size = sizeof st};
        assert_int_equal(dw_plan_get_stage(p, i, &st), DW_OK);
        assert_true(st.layers == want[i]);
        assert_true(st.mtp == (i == 15 ? 1 : 0));
        assert_true(st.dense_layers == (i == 0 ? 3 : 0));
    }
    dw_plan_layout l = {.size = sizeof l};
    assert_int_equal(dw_plan_get_layout(p, &l), DW_OK);
    assert_true(l.etp == 1 && l.a2a_overlap && l.ep == 64 && l.grad_accum == 120);
    dw_plan_free(p);
    /* a plan without a model has no stages */
    assert_int_equal(dw_plan_single(ctx, 1, 1024, &p), DW_OK);
    assert_int_equal(dw_plan_stage_count(p), 0);
    dw_plan_stage st = {.size = sizeof st};
    assert_int_equal(dw_plan_get_stage(p, 0, &st), DW_ERR_INVALID);
    dw_plan_time_split t = {.size = sizeof t};
    assert_int_equal(dw_plan_get_time_split(p, &t), DW_ERR_INVALID);
    dw_plan_free(p);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

/* Family membership, written again from the public layout (an independent copy of family.c's
 * rules, in dw_plan_families order). */
static bool in_family(const dw_plan *p, int f) {
    dw_plan_layout l = {.size = sizeof l};
    assert_int_equal(dw_plan_get_layout(p, &l), DW_OK);
    const char *sc = dw_plan_schedule(p);
    bool dual = !strcmp(sc, "dualpipe");
    switch (f) {
    case 0: return l.pp == 1;
    case 1: return l.pp > 1 && !strcmp(sc, "1f1b");
    case 2: return !strcmp(sc, "interleaved_1f1b");
    case 3: return dual;
    case 4: return l.a2a_overlap && !dual;
    case 5: return l.tp > 1;
    case 6: return l.cp > 1;
    case 7: return l.ep > 1;
    case 8: return l.etp < l.tp;
    case 9: return l.zero == 3;
    case 10: return l.offload;
    case 11: return l.recompute == DW_RECOMPUTE_FULL;
    }
    fail_msg("family %d: the test knows 12", f);
    return false;
}

/* Families on a search that keeps every feasible configuration (nothing pruned): each family's
 * fastest member, first kept plan and feasible count equal what the kept plans say. On a search
 * that keeps 3: a family with no kept plan has nothing faster than the third. */
static void test_families(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0xfa);
    static const char *const models[] = {"gpt2-124m", "mixtral-tiny", "olmoe-tiny"};
    const char *model = models[dw_test_next(&rng) % 3];
    int64_t G = 4 << (dw_test_next(&rng) % 2);
    dw_hw *hw = plan_preset(ctx, "h100-sxm", 1);
    assert_int_equal(dw_hw_keep_gpus(ctx, hw, 2), DW_OK);
    assert_int_equal(dw_plan_families(), 12);
    for (int top = 1000; top >= 3; top = top == 1000 ? 3 : 0) {
        dw_plan_job j = job_of(256, G, top);
        dw_plan_set *set = NULL;
        assert_int_equal(dw_autoplan_search(ctx, model, hw, &j, &set), DW_OK);
        int64_t evaluated, feasible;
        dw_plan_set_stats(set, &evaluated, &feasible);
        int n = dw_plan_set_count(set);
        print_message("%s on 2 GPUs, batch %lld, top %d: %d kept of %lld feasible\n", model, (long long)G, top, n,
                      (long long)feasible);
        assert_true(n > 0);
        bool all = feasible <= top;
        if (top == 1000) assert_true(all); /* the job is small enough to keep everything */
        double last = 0;
        bool last_runs = false;
        for (int f = 0; f < dw_plan_families(); f++) {
            dw_plan_family_info fi = {.size = sizeof fi};
            assert_int_equal(dw_plan_set_get_family(set, f, &fi), DW_OK);
            int members = 0, first = -1;
            double fastest = 0;
            for (int i = 0; i < n; i++) {
                dw_plan *p = NULL;
                assert_int_equal(dw_plan_set_get(ctx, set, i, &p), DW_OK);
                dw_plan_cost c = {.size = sizeof c};
                assert_int_equal(dw_plan_get_cost(p, &c), DW_OK);
                if (i == n - 1) last = c.step, last_runs = dw_plan_runs_on_engine(p, NULL);
                if (in_family(p, f)) {
                    if (first < 0) first = i, fastest = c.step;
                    members++;
                }
                dw_plan_free(p);
            }
            assert_int_equal(fi.kept, first);
            if (first >= 0) assert_true(fi.simulated && fi.best_step <= fastest * (1 + 1e-9));
            if (all) {
                assert_true(fi.feasible == members && fi.lower_bound == 0);
                if (first >= 0) assert_true(fabs(fi.best_step / fastest - 1) < 1e-9);
            } else if (first < 0 && fi.feasible > 0 && !last_runs) {
                /* nothing in it beats the kept plans: its simulated best and its pruned bounds.
                 * (When the last kept plan runs on the engine, a family of plans it cannot run
                 * may be priced faster and still rank below it: search.c's order.) */
                if (fi.simulated) assert_true(fi.best_step >= last * (1 - 1e-9));
                if (fi.lower_bound > 0) assert_true(fi.lower_bound >= last * (1 - 1e-9));
            }
            if (fi.feasible == 0 && fi.rejected > 0) assert_true(fi.main_reason >= 0 && fi.main_reason_count > 0);
            assert_true(fi.main_reason_count <= fi.rejected && fi.name && fi.name[0]);
        }
        dw_plan_family_info bad = {.size = sizeof bad};
        assert_int_equal(dw_plan_set_get_family(set, dw_plan_families(), &bad), DW_ERR_INVALID);
        dw_plan_set_free(set);
    }
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_jobs),
        cmocka_unit_test(test_deepseek_v3_layout),
        cmocka_unit_test(test_families),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
