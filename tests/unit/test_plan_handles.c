/* test_plan_handles.c — deepwell.h's planner handles: dw_autoplan_search / dw_autoplan on random
 * presets, node counts, batches and recipes against the private search; every candidate's
 * layout, predictions and checks; JSON round trips (plan and set documents); broken plans
 * (made, checked, refused predictions); dw_plan_single; the engine view of one-GPU plans; the
 * rejection record; growable options and results; refusals of bad arguments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "test_plan_common.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)

static void expect_error(dw_status got, dw_status want, const char *msg, const char *needle) {
    assert_int_equal(got, want);
    if (needle && !strstr(msg, needle)) fail_msg("message '%s' lacks '%s'", msg, needle);
}

static dw_plan_job job_of(int64_t seq, int64_t G, int32_t recipe) {
    dw_plan_job j;
    dw_plan_job_init(&j, sizeof j);
    j.seq = seq, j.global_batch = G, j.recipe = recipe;
    return j;
}

static void test_job_and_names(void **state) {
    (void)state;
    dw_plan_job j;
    memset(&j, 0x6B, sizeof j);
    dw_plan_job_init(&j, sizeof j);
    assert_int_equal(j.size, sizeof j);
    assert_int_equal(j.recipe, DW_RECIPE_BF16);
    assert_int_equal(j.top_k, 5);
    assert_true(j.seq == 0 && j.global_batch == 0 && j.moe_capacity == 0 && j.mem_headroom == 0);
    assert_null(j.gemm_rates);
    unsigned char buf[sizeof(dw_plan_job) + 8];
    memset(buf, 0x6B, sizeof buf);
    size_t old = offsetof(dw_plan_job, gemm_rates);
    dw_plan_job_init((dw_plan_job *)(void *)buf, old);
    for (size_t i = old; i < sizeof buf; i++) assert_int_equal(buf[i], 0x6B);
    int planned = 0;
    for (int r = -2; r < DW_RECIPE_COUNT + 2; r++) {
        bool want = r == DW_RECIPE_BF16 || r == DW_RECIPE_FP8_BLOCK || r == DW_RECIPE_MXFP8 || r == DW_RECIPE_NVFP4;
        assert_int_equal(dw_plan_supports_recipe(r), want);
        planned += want;
    }
    assert_int_equal(planned, DW_PLAN_RECIPES);
    assert_string_equal(dw_recompute_name(DW_RECOMPUTE_SELECTIVE), "selective");
    assert_string_equal(dw_recompute_name(DW_RECOMPUTE_COUNT), "?");
    assert_int_equal(dw_plan_reject_reasons(), DW_REJECT_COUNT);
    for (int k = 0; k < DW_REJECT_COUNT; k++) assert_string_equal(dw_plan_reject_name(k), dw_reject_name((dw_reject)k));
    assert_null(dw_plan_reject_name(DW_REJECT_COUNT));
    assert_null(dw_plan_reject_name(-1));
}

/* A candidate against the private search's entry it came from. */
static void check_candidate(const dw_plan *p, const dw_plan_entry *e, int64_t gpus, int64_t seq, int64_t G,
                            int32_t recipe) {
    dw_plan_layout l = {.size = sizeof l};
    assert_int_equal(dw_plan_get_layout(p, &l), DW_OK);
    const dw_par *q = &e->par;
    assert_true(l.dp == q->dp && l.tp == q->tp && l.pp == q->pp && l.cp == q->cp && l.ep == q->ep && l.vpp == q->vpp);
    assert_true(l.zero == q->zero && l.recompute == (int)q->recompute && l.offload == q->offload);
    assert_int_equal(l.micro_batch, q->micro_batch);
    assert_int_equal(l.global_batch / ((int64_t)l.dp * l.micro_batch), q->grad_accum);
    assert_true(l.seq == seq && l.global_batch == G && l.recipe == recipe);
    assert_int_equal(dw_plan_world_size(p), gpus);
    char buf[200];
    dw_par_format(q, buf, sizeof buf);
    assert_string_equal(dw_plan_summary(p), buf);
    assert_string_equal(dw_plan_schedule(p), dw_sched_name(q->sched)); /* 1f1b, interleaved_1f1b or dualpipe */
    assert_true((q->vpp > 1) == (q->sched == DW_SCHED_INTERLEAVED)); /* the interleaved schedule is vpp's */
    dw_plan_mem m = {.size = sizeof m};
    dw_plan_cost c = {.size = sizeof c};
    assert_int_equal(dw_plan_get_memory(p, &m), DW_OK);
    assert_int_equal(dw_plan_get_cost(p, &c), DW_OK);
    assert_int_equal(m.size, sizeof m);
    assert_true(m.total == e->mem.total && m.limit == e->mem.limit && m.worst_stage == e->mem.worst_stage);
    assert_true(c.step == e->cost.step && c.mfu == e->cost.mfu);
    assert_true(fabs(c.tokens_per_s * c.step - (double)(G * seq)) <= 1e-9 * (double)(G * seq));
    dw_plan_checks ck = {.size = sizeof ck};
    assert_int_equal(dw_plan_get_checks(p, &ck), DW_OK);
    assert_true(ck.constraints_ok && ck.memory_ok);
    assert_int_equal(ck.violations, 0);
    assert_string_equal(ck.why, "");
    double hidden = c.tp_comm + c.cp_comm + c.ep_comm + c.pp_comm + c.dp_exposed;
    assert_true(fabs(ck.overlap - hidden / c.step) < 1e-12);
    assert_int_equal(ck.overlap_ok, ck.overlap <= 0.5);
    assert_int_equal(ck.bubble_ok, c.bubble_frac <= 0.5);
}

static void test_search_random(void **state) {
    (void)state;
    static const char *models[] = {"gpt2-124m", "llama-1b", "llama-8b", "mixtral-8x7b"};
    for (int it = 0; it < 6; it++) {
        const char *model = models[dw_test_next(RNG) % 4];
        const char *preset = dw_hw_preset_name((int)(dw_test_next(RNG) % 4)); /* not the 72-GPU domain */
        int nodes = 1 << (int)(dw_test_next(RNG) % 3);
        dw_hw *hw = plan_preset(CTX, preset, nodes);
        int32_t recipe = dw_plan_recipes[dw_test_next(RNG) % DW_PLAN_RECIPES];
        int64_t seq = 1024 << (dw_test_next(RNG) % 3), G = 8 * nodes * (int64_t)dw_test_rnd(1, 8);
        dw_plan_job j = job_of(seq, G, recipe);
        j.top_k = (int)dw_test_rnd(1, 6);
        dw_plan_set *set = NULL;
        assert_int_equal(dw_autoplan_search(CTX, model, hw, &j, &set), DW_OK);
        dw_hw_free(hw); /* the set holds its own copy */
        hw = plan_preset(CTX, preset, nodes);
        /* the same search through the private API */
        dw_model_config cfg;
        assert_int_equal(dw_model_config_load(CTX, model, &cfg), DW_OK);
        dw_job pj = {.seq = seq, .global_batch = G, .recipe = (dw_recipe)recipe};
        dw_plan_in in;
        assert_int_equal(dw_plan_in_init(CTX, &cfg, hw, &pj, NULL, &in), DW_OK);
        dw_plan_result r;
        assert_int_equal(dw_plan_search(CTX, &in, j.top_k, &r), DW_OK);
        assert_int_equal(dw_plan_set_count(set), r.n_plans);
        int64_t ev = -1, fe = -1;
        dw_plan_set_stats(set, &ev, &fe);
        assert_true(ev == r.evaluated && fe == r.feasible);
        int64_t rejected = 0;
        for (int k = 0; k < dw_plan_reject_reasons(); k++) {
            int ex = -1;
            int64_t n = dw_plan_set_rejected(set, k, &ex);
            assert_int_equal(n, r.rej.count[k]);
            assert_true(ex >= 0 && ex <= 3 && ex <= n);
            for (int i = 0; i < ex; i++) assert_string_equal(dw_plan_set_reject_example(set, k, i), r.rej.example[k][i]);
            assert_null(dw_plan_set_reject_example(set, k, ex));
            if (k != DW_REJECT_DOMINATED) rejected += n;
        }
        assert_int_equal(rejected + fe, ev); /* every configuration accounted for */
        dw_plan_info info = {.size = sizeof info};
        assert_int_equal(dw_plan_set_get_info(set, &info), DW_OK);
        assert_string_equal(info.model, model);
        assert_string_equal(info.model_type, cfg.model_type);
        assert_int_equal(info.gpus, (int64_t)nodes * 8);
        assert_true(info.nodes == nodes && info.gpus_per_node == 8 && info.nvlink_domain == 8);
        assert_string_equal(info.gpu, hw->gpus[0].name);
        assert_string_equal(info.hw_source, "preset");
        assert_true(info.seq == seq && info.global_batch == G && info.recipe == recipe);
        assert_true(info.peak_flops == dw_plan_peak_flops(&hw->gpus[0], (dw_recipe)recipe));
        assert_true(fabs(info.mem_headroom - 0.10) < 1e-15 && !info.engine);
        double prev = 0;
        for (int i = 0; i < r.n_plans; i++) {
            dw_plan *p = NULL;
            assert_int_equal(dw_plan_set_get(CTX, set, i, &p), DW_OK);
            check_candidate(p, &r.plans[i], (int64_t)nodes * 8, seq, G, recipe);
            dw_plan_cost c = {.size = sizeof c};
            dw_plan_get_cost(p, &c);
            assert_true(c.step >= prev * (1 - 1e-9)); /* ties within 1e-9 prefer the simpler plan */
            prev = c.step;
            dw_plan_info pi = {.size = sizeof pi};
            assert_int_equal(dw_plan_get_info(p, &pi), DW_OK);
            assert_true(pi.params == info.params && pi.gpus == info.gpus && pi.experts == info.experts);
            dw_plan_free(p);
        }
        dw_plan *bad = (dw_plan *)1;
        expect_error(dw_plan_set_get(CTX, set, r.n_plans, &bad), DW_ERR_INVALID, dw_errmsg(CTX), "candidate");
        assert_null(bad);
        /* the set's document is the private search's */
        char *a = NULL;
        assert_int_equal(dw_plan_set_to_json(CTX, set, true, &a), DW_OK);
        json_t *doc = dw_plan_result_json(&in, &r);
        char *b = dw_json_dump(doc, true);
        assert_string_equal(a, b);
        free(b);
        json_decref(doc);
        dw_free_string(a);
        /* dw_autoplan: the best, or "no configuration fits" */
        dw_plan *best = NULL;
        dw_status st = dw_autoplan(CTX, model, hw, &j, &best);
        if (r.n_plans > 0) {
            assert_int_equal(st, DW_OK);
            check_candidate(best, &r.plans[0], (int64_t)nodes * 8, seq, G, recipe);
        } else {
            expect_error(st, DW_ERR_UNSUPPORTED, dw_errmsg(CTX), "no configuration fits");
            assert_null(best);
        }
        dw_plan_free(best);
        dw_plan_result_free(&r);
        dw_plan_set_free(set);
        dw_hw_free(hw);
    }
}

static void test_nothing_fits(void **state) {
    (void)state;
    dw_hw *hw = plan_preset(CTX, "h100-sxm", 1);
    dw_plan_job j = job_of(8192, 64, DW_RECIPE_BF16);
    dw_plan_set *set = NULL;
    assert_int_equal(dw_autoplan_search(CTX, "llama-405b", hw, &j, &set), DW_OK);
    assert_int_equal(dw_plan_set_count(set), 0);
    assert_true(dw_plan_set_rejected(set, DW_REJECT_MEMORY, NULL) > 0);
    char *text = NULL;
    assert_int_equal(dw_plan_set_to_json(CTX, set, false, &text), DW_OK);
    assert_non_null(strstr(text, "\"best\":null"));
    dw_free_string(text);
    dw_plan_set_free(set);
    dw_plan *p = (dw_plan *)1;
    expect_error(dw_autoplan(CTX, "llama-405b", hw, &j, &p), DW_ERR_UNSUPPORTED, dw_errmsg(CTX), "no configuration fits");
    assert_null(p);
    assert_non_null(strstr(dw_errmsg(CTX), "llama-405b"));
    dw_hw_free(hw);
}

static bool same_layout(const dw_plan *a, const dw_plan *b) {
    dw_plan_layout x = {.size = sizeof x}, y = {.size = sizeof y};
    dw_plan_get_layout(a, &x);
    dw_plan_get_layout(b, &y);
    return !memcmp(&x, &y, sizeof x);
}

static void test_json_round_trip(void **state) {
    (void)state;
    int nodes = 1 << (int)(dw_test_next(RNG) % 3);
    dw_hw *hw = plan_preset(CTX, "h200", nodes);
    dw_plan_job j = job_of(4096, 32 * nodes * (int64_t)dw_test_rnd(1, 4), dw_plan_recipes[dw_test_next(RNG) % 4]);
    dw_plan_set *set = NULL;
    assert_int_equal(dw_autoplan_search(CTX, "llama-8b", hw, &j, &set), DW_OK);
    assert_true(dw_plan_set_count(set) > 0);
    for (int i = 0; i < dw_plan_set_count(set); i++) {
        dw_plan *p = NULL, *q = NULL;
        assert_int_equal(dw_plan_set_get(CTX, set, i, &p), DW_OK);
        char *text = NULL;
        assert_int_equal(dw_plan_to_json(CTX, p, dw_test_next(RNG) % 2, &text), DW_OK);
        assert_non_null(strstr(text, "\"job\""));
        assert_int_equal(dw_plan_from_json(CTX, text, strlen(text), "round trip", "llama-8b", hw, &j, &q), DW_OK);
        assert_true(same_layout(p, q));
        dw_plan_mem a = {.size = sizeof a}, b = {.size = sizeof b};
        dw_plan_cost c = {.size = sizeof c}, d = {.size = sizeof d};
        assert_int_equal(dw_plan_get_memory(q, &b), DW_OK);
        assert_int_equal(dw_plan_get_cost(q, &d), DW_OK);
        dw_plan_get_memory(p, &a);
        dw_plan_get_cost(p, &c);
        assert_memory_equal(&a, &b, sizeof a); /* re-derived from the layout alone: the same numbers */
        assert_memory_equal(&c, &d, sizeof c);
        char *again = NULL;
        assert_int_equal(dw_plan_to_json(CTX, q, false, &again), DW_OK);
        dw_plan_free(q);
        assert_int_equal(dw_plan_from_json(CTX, again, strlen(again), NULL, "llama-8b", hw, &j, &q), DW_OK);
        assert_true(same_layout(p, q));
        dw_free_string(again);
        dw_free_string(text);
        dw_plan_free(q);
        dw_plan_free(p);
    }
    /* the set's document: its "best"; from a file too */
    char *doc = NULL, *dir = dw_test_tmpdir(), *path = dw_test_path(dir, "plan.json");
    assert_int_equal(dw_plan_set_to_json(CTX, set, true, &doc), DW_OK);
    assert_int_equal(dw_test_write(path, doc, strlen(doc)), 0);
    dw_plan *best = NULL, *loaded = NULL;
    assert_int_equal(dw_plan_set_get(CTX, set, 0, &best), DW_OK);
    assert_int_equal(dw_plan_load(CTX, path, "llama-8b", hw, &j, &loaded), DW_OK);
    assert_true(same_layout(best, loaded));
    /* an SVG of it */
    char *svg = dw_test_path(dir, "t.svg");
    assert_int_equal(dw_plan_write_svg(CTX, best, svg), DW_OK);
    char head[5] = {0};
    FILE *f = fopen(svg, "rb");
    assert_non_null(f);
    assert_int_equal(fread(head, 1, 4, f), 4);
    fclose(f);
    assert_string_equal(head, "<svg");
    dw_plan_free(loaded);
    dw_plan_free(best);
    dw_free_string(doc);
    dw_test_rmtree(dir);
    free(svg);
    free(path);
    free(dir);
    dw_plan_set_free(set);
    dw_hw_free(hw);
}

static void test_broken_plans(void **state) {
    (void)state;
    dw_hw *hw = plan_preset(CTX, "h100-sxm", 2);
    dw_plan_job j = job_of(4096, 64, DW_RECIPE_BF16);
    const char *tp16 = "{\"parallel\": {\"dp\": 1, \"tp\": 16, \"pp\": 1, \"ep\": 1, \"cp\": 1}, \"micro_batch\": 1}";
    dw_plan *p = NULL;
    assert_int_equal(dw_plan_from_json(CTX, tp16, strlen(tp16), "tp16", "llama-8b", hw, &j, &p), DW_OK);
    dw_plan_checks ck = {.size = sizeof ck};
    assert_int_equal(dw_plan_get_checks(p, &ck), DW_OK);
    assert_false(ck.constraints_ok || ck.memory_ok || ck.overlap_ok || ck.bubble_ok);
    assert_true(ck.violations >= 1);
    assert_non_null(strstr(ck.why, "NVLink domain"));
    dw_plan_layout l = {.size = sizeof l};
    assert_int_equal(dw_plan_get_layout(p, &l), DW_OK);
    assert_int_equal(l.tp, 16);
    assert_int_equal(l.global_batch / (l.dp * l.micro_batch), 64); /* grad_accum filled from the job */
    dw_plan_mem m = {.size = sizeof m, .total = 5, .worst_stage = 3};
    dw_plan_cost c = {.size = sizeof c, .step = 7};
    expect_error(dw_plan_get_memory(p, &m), DW_ERR_INVALID, dw_errmsg(NULL), "constraint");
    expect_error(dw_plan_get_cost(p, &c), DW_ERR_INVALID, dw_errmsg(NULL), "NVLink domain");
    assert_true(m.size == sizeof m && m.total == 0 && m.worst_stage == 0 && c.step == 0); /* zeroed on error */
    expect_error(dw_plan_write_svg(CTX, p, "/tmp/never.svg"), DW_ERR_INVALID, dw_errmsg(CTX), "constraint");
    char *text = NULL;
    assert_int_equal(dw_plan_to_json(CTX, p, false, &text), DW_OK); /* layout, no predictions */
    assert_null(strstr(text, "step_time_s"));
    dw_free_string(text);
    dw_plan_free(p);
    /* a plan that fits nowhere: well-formed, memory fails */
    const char *big = "{\"parallel\": {\"dp\": 16, \"tp\": 1, \"pp\": 1, \"ep\": 1, \"cp\": 1}, \"micro_batch\": 4, "
                      "\"recompute\": \"none\", \"zero\": 0}";
    assert_int_equal(dw_plan_from_json(CTX, big, strlen(big), "big", "llama-8b", hw, &j, &p), DW_OK);
    assert_int_equal(dw_plan_get_checks(p, &ck), DW_OK);
    assert_true(ck.constraints_ok && !ck.memory_ok);
    assert_int_equal(dw_plan_get_memory(p, &m), DW_OK);
    assert_true(m.total > m.limit);
    dw_plan_free(p);
    /* malformed documents */
    p = (dw_plan *)1;
    expect_error(dw_plan_from_json(CTX, "{\"parallel\": ", 13, "cut.json", "llama-8b", hw, &j, &p), DW_ERR_FORMAT,
                 dw_errmsg(CTX), "cut.json:1:");
    assert_null(p);
    const char *no_tp = "{\"parallel\": {\"dp\": 8}}";
    expect_error(dw_plan_from_json(CTX, no_tp, strlen(no_tp), "p3", "llama-8b", hw, &j, &p), DW_ERR_FORMAT,
                 dw_errmsg(CTX), "'tp'");
    const char *rc = "{\"parallel\": {\"dp\": 16, \"tp\": 1, \"pp\": 1, \"ep\": 1, \"cp\": 1}, \"recompute\": \"most\"}";
    expect_error(dw_plan_from_json(CTX, rc, strlen(rc), "rc", "llama-8b", hw, &j, &p), DW_ERR_FORMAT, dw_errmsg(CTX),
                 "most");
    expect_error(dw_plan_from_json(CTX, "[1]", 3, "arr", "llama-8b", hw, &j, &p), DW_ERR_FORMAT, dw_errmsg(CTX),
                 "object");
    expect_error(dw_plan_load(CTX, "/nonexistent/plan.json", "llama-8b", hw, &j, &p), DW_ERR_IO, dw_errmsg(CTX),
                 "/nonexistent/plan.json");
    expect_error(dw_plan_from_json(CTX, NULL, 0, "x", "llama-8b", hw, &j, &p), DW_ERR_INVALID, dw_errmsg(CTX), "NULL");
    expect_error(dw_plan_from_json(CTX, tp16, strlen(tp16), "x", "no-such-model", hw, &j, &p), DW_ERR_INVALID,
                 dw_errmsg(CTX), "no-such-model");
    expect_error(dw_plan_from_json(CTX, tp16, strlen(tp16), "x", "llama-8b", NULL, &j, &p), DW_ERR_INVALID,
                 dw_errmsg(CTX), "hardware");
    assert_null(p);
    dw_hw_free(hw);
}

static void test_single(void **state) {
    (void)state;
    int64_t mb = dw_test_rnd(1, 64), seq = dw_test_rnd(1, 8192);
    dw_plan *p = NULL;
    assert_int_equal(dw_plan_single(CTX, mb, seq, &p), DW_OK);
    dw_plan_layout l = {.size = sizeof l};
    assert_int_equal(dw_plan_get_layout(p, &l), DW_OK);
    assert_true(l.dp == 1 && l.tp == 1 && l.pp == 1 && l.cp == 1 && l.ep == 1 && l.vpp == 1);
    assert_true(l.zero == 0 && l.recompute == DW_RECOMPUTE_NONE && !l.offload);
    assert_true(l.micro_batch == mb && l.seq == seq && l.global_batch == mb && l.recipe == DW_RECIPE_BF16);
    assert_int_equal(dw_plan_world_size(p), 1);
    assert_string_equal(dw_plan_schedule(p), "1f1b");
    assert_non_null(strstr(dw_plan_summary(p), "dp1 tp1 pp1 v1 cp1 ep1"));
    dw_plan_info info = {.size = sizeof info};
    assert_int_equal(dw_plan_get_info(p, &info), DW_OK);
    assert_null(info.model);
    assert_null(info.gpu);
    assert_true(info.seq == seq && info.global_batch == mb && info.gpus == 0);
    dw_plan_mem m = {.size = sizeof m};
    dw_plan_checks ck = {.size = sizeof ck};
    expect_error(dw_plan_get_memory(p, &m), DW_ERR_INVALID, dw_errmsg(NULL), "dw_plan_single");
    expect_error(dw_plan_get_checks(p, &ck), DW_ERR_INVALID, dw_errmsg(NULL), "dw_plan_single");
    const char *why = NULL;
    assert_false(dw_plan_runs_on_engine(p, &why));
    assert_non_null(strstr(why, "no model"));
    dw_plan_engine_mem em = {.size = sizeof em};
    expect_error(dw_plan_get_engine_memory(CTX, p, &em), DW_ERR_UNSUPPORTED, dw_errmsg(CTX), "no model");
    dw_policy *pol = NULL;
    assert_int_equal(dw_plan_engine_policy(CTX, p, &pol), DW_OK);
    assert_non_null(pol);
    dw_policy_free(pol);
    char *text = NULL;
    assert_int_equal(dw_plan_to_json(CTX, p, false, &text), DW_OK);
    json_t *doc = NULL;
    assert_int_equal(dw_json_load_string(CTX, text, strlen(text), "single", &doc), DW_OK);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(doc, "job"), "seq")), seq);
    assert_int_equal(json_integer_value(json_object_get(doc, "micro_batch")), mb);
    json_decref(doc);
    dw_free_string(text);
    /* an older, shorter layout struct: nothing past its size is written */
    unsigned char buf[sizeof(dw_plan_layout) + 8];
    memset(buf, 0x21, sizeof buf);
    size_t old = offsetof(dw_plan_layout, micro_batch);
    memcpy(buf, &old, sizeof old);
    assert_int_equal(dw_plan_get_layout(p, (dw_plan_layout *)(void *)buf), DW_OK);
    for (size_t i = old; i < sizeof buf; i++) assert_int_equal(buf[i], 0x21);
    dw_plan_layout unset = {0};
    expect_error(dw_plan_get_layout(p, &unset), DW_ERR_INVALID, dw_errmsg(NULL), "size");
    dw_plan_free(p);
    p = (dw_plan *)1;
    expect_error(dw_plan_single(CTX, 0, 64, &p), DW_ERR_INVALID, dw_errmsg(CTX), "micro-batch 0");
    assert_null(p);
    expect_error(dw_plan_single(CTX, 1, -1, &p), DW_ERR_INVALID, dw_errmsg(CTX), "sequence -1");
    dw_plan_free(NULL);
    dw_plan_set_free(NULL);
    assert_int_equal(dw_plan_world_size(NULL), 0);
    assert_string_equal(dw_plan_summary(NULL), "");
}

static void test_engine_view(void **state) {
    (void)state;
    dw_hw *hw = plan_preset(CTX, "h200", 1);
    assert_int_equal(dw_hw_keep_gpus(CTX, hw, 1), DW_OK);
    int32_t recipe = dw_plan_recipes[dw_test_next(RNG) % DW_PLAN_RECIPES];
    dw_plan_job j = job_of(256, 4 * dw_test_rnd(1, 4), recipe);
    dw_plan *p = NULL;
    assert_int_equal(dw_autoplan(CTX, "gpt2-tiny", hw, &j, &p), DW_OK);
    dw_plan_info info = {.size = sizeof info};
    assert_int_equal(dw_plan_get_info(p, &info), DW_OK);
    assert_true(info.engine);
    const char *why = NULL;
    assert_true(dw_plan_runs_on_engine(p, &why));
    dw_plan_engine_mem em = {.size = sizeof em};
    assert_int_equal(dw_plan_get_engine_memory(CTX, p, &em), DW_OK);
    int64_t sum = em.cublaslt + em.attention + em.context;
    for (int i = 0; i < 5; i++) {
        assert_true(em.pool[i] >= 0);
        sum += em.pool[i];
    }
    assert_int_equal(sum, em.total);
    dw_plan_mem m = {.size = sizeof m};
    assert_int_equal(dw_plan_get_memory(p, &m), DW_OK);
    assert_true(m.total == (double)em.total); /* one GPU: the planner's memory is the engine's */
    dw_plan_engine_cost ec = {.size = sizeof ec};
    assert_int_equal(dw_plan_get_engine_cost(CTX, p, &ec), DW_OK);
    assert_true(ec.fwd > 0 && ec.bwd > 0 && ec.optimizer > 0 && ec.launches > 0);
    assert_true(fabs(ec.gemm + ec.attn + ec.mem + ec.overhead - (ec.fwd + ec.bwd)) <= 1e-9 * (ec.fwd + ec.bwd));
    dw_policy *pol = NULL;
    assert_int_equal(dw_plan_engine_policy(CTX, p, &pol), DW_OK);
    char *pj = NULL;
    assert_int_equal(dw_policy_to_json(CTX, pol, &pj), DW_OK);
    assert_non_null(strstr(pj, dw_recipe_name((dw_recipe)recipe)));
    dw_free_string(pj);
    dw_policy_free(pol);
    dw_plan_free(p);
    dw_hw_free(hw);
    /* eight GPUs, a small model: data parallelism, which the runtime runs on the engine, each
     * rank holding the one-GPU engine's pools */
    hw = plan_preset(CTX, "h200", 1);
    j = job_of(1024, 64, DW_RECIPE_BF16);
    assert_int_equal(dw_autoplan(CTX, "gpt2-124m", hw, &j, &p), DW_OK);
    assert_true(dw_plan_runs_on_engine(p, &why));
    dw_plan_engine_cost dc = {.size = sizeof dc};
    assert_int_equal(dw_plan_get_engine_cost(CTX, p, &dc), DW_OK);
    assert_true(dc.fwd > 0 && dc.bwd > 0);
    dw_plan_free(p);
    /* a planning-only preset: the planner sizes it, the engine does not build it */
    j = job_of(4096, 64, DW_RECIPE_BF16);
    assert_int_equal(dw_autoplan(CTX, "llama-70b", hw, &j, &p), DW_OK);
    assert_false(dw_plan_runs_on_engine(p, &why));
    assert_non_null(strstr(why, "planning-only"));
    dw_plan_engine_cost unused = {.size = sizeof unused};
    expect_error(dw_plan_get_engine_cost(CTX, p, &unused), DW_ERR_UNSUPPORTED, dw_errmsg(CTX),
                 "the engine does not run this plan");
    dw_plan_free(p);
    dw_hw_free(hw);
}

static void test_bad_jobs(void **state) {
    (void)state;
    dw_hw *hw = plan_preset(CTX, "h100-sxm", 1);
    dw_plan_set *s = (dw_plan_set *)1;
    dw_plan_job j = job_of(4096, 64, DW_RECIPE_BF16);
    expect_error(dw_autoplan_search(CTX, NULL, hw, &j, &s), DW_ERR_INVALID, dw_errmsg(CTX), "missing model");
    assert_null(s);
    expect_error(dw_autoplan_search(CTX, "llama-8b", NULL, &j, &s), DW_ERR_INVALID, dw_errmsg(CTX), "hardware");
    expect_error(dw_autoplan_search(CTX, "llama-8b", hw, NULL, &s), DW_ERR_INVALID, dw_errmsg(CTX), "NULL job");
    expect_error(dw_autoplan_search(CTX, "llama-8b", hw, &j, NULL), DW_ERR_INVALID, dw_errmsg(CTX), "NULL");
    dw_plan_job zero = {0};
    expect_error(dw_autoplan_search(CTX, "llama-8b", hw, &zero, &s), DW_ERR_INVALID, dw_errmsg(CTX), "dw_plan_job_init");
    dw_plan_job k = j;
    k.recipe = DW_RECIPE_MXFP4;
    expect_error(dw_autoplan_search(CTX, "llama-8b", hw, &k, &s), DW_ERR_INVALID, dw_errmsg(CTX), "mxfp4");
    k.recipe = 99;
    expect_error(dw_autoplan_search(CTX, "llama-8b", hw, &k, &s), DW_ERR_INVALID, dw_errmsg(CTX), "precision");
    k = j, k.seq = 0;
    expect_error(dw_autoplan_search(CTX, "llama-8b", hw, &k, &s), DW_ERR_INVALID, dw_errmsg(CTX), "seq");
    k = j, k.top_k = 0;
    expect_error(dw_autoplan_search(CTX, "llama-8b", hw, &k, &s), DW_ERR_INVALID, dw_errmsg(CTX), "top_k");
    k = j, k.mem_headroom = 0.95;
    expect_error(dw_autoplan_search(CTX, "llama-8b", hw, &k, &s), DW_ERR_INVALID, dw_errmsg(CTX), "headroom");
    k = j, k.gemm_rates = "/nonexistent/rates.json";
    expect_error(dw_autoplan_search(CTX, "llama-8b", hw, &k, &s), DW_ERR_IO, dw_errmsg(CTX), "/nonexistent/rates.json");
    expect_error(dw_autoplan_search(CTX, "llama-3000b", hw, &j, &s), DW_ERR_INVALID, dw_errmsg(CTX), "llama-3000b");
    dw_hw *none = dw_hw_alloc(0);
    expect_error(dw_autoplan_search(CTX, "llama-8b", none, &j, &s), DW_ERR_INVALID, dw_errmsg(CTX), "no GPUs");
    assert_null(s);
    dw_hw_free(none);
    char *text = (char *)1;
    expect_error(dw_autoplan_json(CTX, "llama-8b", hw, &j, 0, &text), DW_ERR_INVALID, dw_errmsg(CTX), "top_k");
    assert_null(text);
    dw_plan_info info = {.size = sizeof info};
    assert_int_equal(dw_plan_set_get_info(NULL, &info), DW_ERR_INVALID);
    assert_int_equal(dw_plan_set_count(NULL), 0);
    assert_int_equal(dw_plan_set_rejected(NULL, 0, NULL), 0);
    assert_null(dw_plan_set_reject_example(NULL, 0, 0));
    dw_hw_free(hw);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_job_and_names),  cmocka_unit_test(test_search_random),
        cmocka_unit_test(test_nothing_fits),   cmocka_unit_test(test_json_round_trip),
        cmocka_unit_test(test_broken_plans),   cmocka_unit_test(test_single),
        cmocka_unit_test(test_engine_view),    cmocka_unit_test(test_bad_jobs),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
