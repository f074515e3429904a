/* test_quant_counts_fallback.c — the quantisers' counters as a fallback rule (train/guard_quant.c,
 * dw_train_opts.quant_overflow_max / quant_underflow_max / quant_counts_after) on the CPU engine.
 * A tiny NVFP4 Llama whose layer-0 up_proj weight, written to the model directory's
 * model.safetensors by the test and loaded from it, is made to saturate: one outlier A sets the
 * tensor scale s_t, every row carries +-B in the columns k = j0 (mod 16) with B / (6 s_t) = 1.4 x
 * 2^-9, so each 16-block's UE4M3 scale rounds down to 2^-9 and its B elements quantise to the
 * top code with |B| > 7/6 of the dequantised value (overflow), and the rest is tiny. The outlier's
 * row m is kept out of everything else: gate_proj (in BF16) has row m at zero, so h = silu(g) * u
 * is 0 in channel m and up_proj's dy there is dh * silu(0) = 0 — no other operand sees it. Then:
 *   - with the rule off, the counts (quant_stats.jsonl) show that layer's w overflow fraction over
 *     5% every step, and no overflow anywhere else;
 *   - with the defaults (overflow over 0.1% in 3 steps in a row) exactly that layer falls back to
 *     BF16 at step 3 (after 2: at step 2), tensor w, rule overflow, and not before: the decision
 *     line, metrics.jsonl's precision_change at that step and none before, the node's recipe; a
 *     run resumed from a later checkpoint keeps it;
 *   - the underflow rule alone (quant_underflow_max 0.5, overflow off) takes the same layer for
 *     its flushed elements, rule underflow;
 *   - the clean model (the same without planting) never falls back under the defaults or the
 *     underflow rule at 0.5.
 * Fresh random weights and data per run (DW_TEST_SEED replays). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/json.h"
#include "deepwell.h"
#include "formats/rules.h"
#include "runtime/engine.h"
#include "testutil.h"

static dw_ctx *ctx;
static dw_test_rng rng;
static char *dir, *model;
static const char *const L = "model.layers.0.mlp.up_proj";
static const char *const POLICY = "{\"default\": \"nvfp4\", \"fallback\": \"none\", "
                                  "\"rules\": [{\"match\": \"*.gate_proj\", \"recipe\": \"bf16\"}]}";
/* the fixture's model (dw_test_train_fixture's config with these sizes) */
static const char *const CONFIG = "{\"model_type\": \"llama\", \"vocab_size\": 256, \"hidden_size\": 64, "
                                  "\"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
                                  "\"intermediate_size\": 128, \"max_position_embeddings\": 32}";

static int setup(void **state) {
    (void)state;
    dw_test_rng_init(&rng, dw_test_seed());
    return dw_test_train_fixture(&ctx, &dir, &model, 2, 64, 128);
}
static int teardown(void **state) {
    (void)state;
    dw_test_train_fixture_close(ctx, dir, model);
    return 0;
}

static dw_policy *policy(void) {
    char *path = dw_test_path(dir, "policy.json");
    assert_int_equal(dw_test_write(path, POLICY, strlen(POLICY)), 0);
    dw_policy *p = NULL;
    if (dw_policy_load(ctx, path, &p) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    free(path);
    return p;
}

/* A model directory `name` under dir: the fixture's config and, in model.safetensors, random
 * weights from `seed`, layer 0's up_proj planted (above) when `plant`. */
static char *write_model(const char *name, uint64_t seed, bool plant) {
    char *sub = dw_test_path(dir, name);
    assert_int_equal(mkdir(sub, 0755), 0);
    char *md = dw_test_model_dir(sub, CONFIG), *wpath = md ? dw_test_path(md, "model.safetensors") : NULL;
    assert_non_null(md);
    dw_model *m = dw_test_open_model(ctx, model, seed, NULL, 2, 16);
    assert_non_null(m);
    dw_engine *e = dw_model_engine(m);
    if (plant) {
        const int i = dw_test_param_index(e, "model.layers.0.mlp.up_proj.weight");
        assert_true(i >= 0);
        int64_t sh[4];
        dw_engine_param_shape(e, i, sh);
        const int64_t M = sh[0], K = sh[1];
        float *w = malloc((size_t)(M * K) * sizeof *w);
        assert_int_equal(dw_engine_param_read(e, i, w), DW_OK);
        const float A = 0.5f;
        uint32_t abits;
        memcpy(&abits, &A, sizeof abits);
        const float st = dw_rule_nvfp4_tensor_scale(abits), B = 1.4f * ldexpf(1.0f, -9) * 6.0f * st;
        const int64_t j0 = (int64_t)(dw_test_next(&rng) % 16), ma = (int64_t)(dw_test_next(&rng) % (uint64_t)M);
        const int64_t ka = (j0 + 1 + (int64_t)(dw_test_next(&rng) % 15)) % 16 + 16 * (int64_t)(dw_test_next(&rng) % (uint64_t)(K / 16));
        for (int64_t m2 = 0; m2 < M; m2++)
            for (int64_t k = 0; k < K; k++)
                w[m2 * K + k] = k % 16 == j0 ? ((dw_test_next(&rng) & 1) ? B : -B) : w[m2 * K + k] * 1e-3f * B;
        w[ma * K + ka] = (dw_test_next(&rng) & 1) ? A : -A;
        assert_int_equal(dw_engine_param_write(e, i, w), DW_OK);
        const int gi = dw_test_param_index(e, "model.layers.0.mlp.gate_proj.weight"); /* [M, K] too */
        assert_int_equal(dw_engine_param_read(e, gi, w), DW_OK);
        for (int64_t k = 0; k < K; k++) w[ma * K + k] = 0.0f;
        assert_int_equal(dw_engine_param_write(e, gi, w), DW_OK);
        free(w);
    }
    if (dw_engine_save_weights(e, wpath) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    dw_model_free(m);
    free(sub), free(wpath);
    return md;
}

static dw_model *open_file(const char *md, const dw_policy *pol) {
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.batch = 2, mo.seq = 16, mo.weights = DW_WEIGHTS_FILE, mo.policy = pol;
    dw_model *m = NULL;
    if (dw_model_open(ctx, md, &mo, &m) != DW_OK) fail_msg("%s: %s", md, dw_errmsg(ctx));
    return m;
}

static void train_opts(dw_train_opts *o, const char *out, int64_t steps) {
    dw_train_opts_init(o, sizeof *o);
    o->data = "builtin", o->out_dir = out, o->steps = steps, o->batch = 2, o->seq = 16, o->global_batch = 2;
    o->lr = 1e-9, o->min_lr = 1e-10, o->warmup = 0, o->weight_decay = 0, o->eval_every = 0, o->ckpt_minutes = 0;
    o->seed = dw_test_next(&rng) >> 1;
    o->quant_check_every = 0; /* the counters' rule alone (the error checks are test_guard_dy's) */
}

static json_t *lines_or_empty(const char *run, const char *file) {
    char *p = dw_test_path(run, file);
    json_t *a = dw_test_json_lines(p);
    free(p);
    return a ? a : json_array();
}
static const char *str(const json_t *j, const char *k) {
    const char *s = json_string_value(json_object_get(j, k));
    return s ? s : "";
}
static long long num(const json_t *j, const char *k) { return (long long)json_integer_value(json_object_get(j, k)); }

/* One training run of `steps` on model directory md; its decisions. */
static json_t *run(const char *md, const char *out, int64_t steps, double over_max, double under_max, int64_t after,
                   dw_recipe *planted_recipe) {
    dw_policy *pol = policy();
    dw_model *m = open_file(md, pol);
    dw_engine *e = dw_model_engine(m);
    assert_int_equal(dw_test_node_recipe(e, L), DW_RECIPE_NVFP4);
    dw_train_opts o;
    train_opts(&o, out, steps);
    o.quant_overflow_max = over_max, o.quant_underflow_max = under_max, o.quant_counts_after = after;
    o.ckpt_every = 1, o.keep = 0;
    if (dw_train(e, &o) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    if (planted_recipe) *planted_recipe = dw_test_node_recipe(e, L);
    dw_model_free(m);
    dw_policy_free(pol);
    return lines_or_empty(out, "precision_decisions.jsonl");
}

/* metrics.jsonl: the steps whose line has a precision_change naming L, as a bit set. */
static unsigned changes_of(const char *out) {
    json_t *ms = lines_or_empty(out, "metrics.jsonl");
    unsigned bits = 0;
    for (size_t i = 0; i < json_array_size(ms); i++) {
        const json_t *j = json_array_get(ms, i);
        const char *pc = str(j, "precision_change");
        if (*pc) {
            if (!strstr(pc, L)) fail_msg("%s: step %lld changed %s", out, num(j, "step"), pc);
            bits |= 1u << num(j, "step");
        }
    }
    json_decref(ms);
    return bits;
}

static void test_counts_show_overflow(void **state) {
    (void)state;
    char *md = write_model("planted_stats", dw_test_next(&rng), true), *out = dw_test_path(dir, "stats");
    dw_policy *pol = policy();
    dw_model *m = open_file(md, pol);
    dw_train_opts o;
    train_opts(&o, out, 3);
    o.quant_check_every = 1, o.quant_fallback_after = 0; /* counts per step in quant_stats.jsonl */
    o.quant_overflow_max = -1, o.quant_underflow_max = -1;
    if (dw_train(dw_model_engine(m), &o) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    json_t *qs = lines_or_empty(out, "quant_stats.jsonl"), *dec = lines_or_empty(out, "precision_decisions.jsonl");
    assert_int_equal(json_array_size(dec), 0);
    int planted = 0;
    for (size_t i = 0; i < json_array_size(qs); i++) {
        const json_t *j = json_array_get(qs, i);
        if (!json_object_get(j, "counts")) continue;
        const long long ov = num(j, "overflow"), el = num(j, "elements");
        if (!strcmp(str(j, "layer"), L) && !strcmp(str(j, "counts"), "w")) {
            print_message("step %lld: %s w overflow %lld / %lld, underflow %lld\n", num(j, "step"), L, ov, el,
                          num(j, "underflow"));
            assert_true(el > 0);
            assert_true((double)ov > 0.05 * (double)el);
            planted++;
        } else if (ov != 0) {
            fail_msg("step %lld: %s %s: %lld overflows (only the planted weight saturates)", num(j, "step"),
                     str(j, "layer"), str(j, "counts"), ov);
        } else if (strcmp(str(j, "layer"), L) && el <= 0 && strcmp(str(j, "counts"), "dy")) {
            fail_msg("step %lld: %s %s: no elements counted", num(j, "step"), str(j, "layer"), str(j, "counts"));
        }
    }
    assert_int_equal(planted, 3);
    json_decref(qs), json_decref(dec);
    dw_model_free(m);
    dw_policy_free(pol);
    free(md), free(out);
}

static void test_overflow_fallback(void **state) {
    (void)state;
    char *md = write_model("planted", dw_test_next(&rng), true);
    for (int after = 2; after <= 3; after++) {
        char name[32];
        snprintf(name, sizeof name, "over%d", after);
        char *out = dw_test_path(dir, name);
        dw_recipe rec;
        json_t *dec = after == 3 ? run(md, out, 4, 0.001, -1, 3, &rec) /* the defaults */
                                 : run(md, out, 4, 0.001, -1, 2, &rec);
        if (json_array_size(dec) != 1) fail_msg("after %d: %zu decisions (expected 1)", after, json_array_size(dec));
        const json_t *d = json_array_get(dec, 0);
        print_message("after %d: step %lld, %s: %s\n", after, num(d, "step"), str(d, "layer"), str(d, "reason"));
        assert_string_equal(str(d, "layer"), L);
        assert_int_equal(num(d, "step"), after);
        assert_string_equal(str(d, "tensor"), "w");
        assert_string_equal(str(d, "rule"), "overflow");
        assert_int_equal(num(d, "steps"), after);
        assert_true(json_real_value(json_object_get(d, "fraction")) > 0.05);
        char want[64];
        snprintf(want, sizeof want, "> 0.1%% for %d steps", after);
        assert_non_null(strstr(str(d, "reason"), want));
        assert_int_equal(rec, DW_RECIPE_BF16);
        assert_int_equal(changes_of(out), 1u << after); /* the progress record at that step, none before */
        json_decref(dec);
        if (after == 3) { /* resumed from the step-4 checkpoint in a fresh engine: the fallback holds */
            dw_policy *pol = policy();
            dw_model *m2 = open_file(md, pol);
            dw_train_opts o;
            train_opts(&o, out, 6);
            char *ck = dw_test_path(out, "ckpt-4");
            o.resume = ck, o.ckpt_every = 1, o.keep = 0;
            if (dw_train(dw_model_engine(m2), &o) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
            assert_int_equal(dw_test_node_recipe(dw_model_engine(m2), L), DW_RECIPE_BF16);
            json_t *d2 = lines_or_empty(out, "precision_decisions.jsonl");
            assert_int_equal(json_array_size(d2), 1);
            json_decref(d2);
            dw_model_free(m2);
            dw_policy_free(pol);
            free(ck);
        }
        free(out);
    }
    free(md);
}

static void test_underflow_fallback(void **state) {
    (void)state;
    char *md = write_model("planted_u", dw_test_next(&rng), true), *out = dw_test_path(dir, "under");
    dw_recipe rec;
    json_t *dec = run(md, out, 3, -1, 0.5, 3, &rec);
    if (json_array_size(dec) != 1) fail_msg("%zu decisions (expected 1)", json_array_size(dec));
    const json_t *d = json_array_get(dec, 0);
    print_message("step %lld, %s: %s\n", num(d, "step"), str(d, "layer"), str(d, "reason"));
    assert_string_equal(str(d, "layer"), L);
    assert_int_equal(num(d, "step"), 3);
    assert_string_equal(str(d, "tensor"), "w");
    assert_string_equal(str(d, "rule"), "underflow");
    assert_int_equal(rec, DW_RECIPE_BF16);
    json_decref(dec);
    free(md), free(out);
}

static void test_clean_never_falls_back(void **state) {
    (void)state;
    char *md = write_model("clean", dw_test_next(&rng), false);
    for (int v = 0; v < 2; v++) {
        char *out = dw_test_path(dir, v ? "clean_u" : "clean");
        dw_recipe rec;
        json_t *dec = v ? run(md, out, 4, 0.001, 0.5, 3, &rec) : run(md, out, 4, 0.001, -1, 3, &rec);
        if (json_array_size(dec) != 0)
            fail_msg("clean model: %zu decisions, the first %s", json_array_size(dec), str(json_array_get(dec, 0), "reason"));
        assert_int_equal(rec, DW_RECIPE_NVFP4);
        assert_int_equal(changes_of(out), 0u);
        json_decref(dec);
        free(out);
    }
    free(md);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_show_overflow),
        cmocka_unit_test(test_overflow_fallback),
        cmocka_unit_test(test_underflow_fallback),
        cmocka_unit_test(test_clean_never_falls_back),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
