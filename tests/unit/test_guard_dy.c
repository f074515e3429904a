/* test_guard_dy.c — the guard on the gradient operands (train/guard_quant.c, the linear op's dy
 * measurement) and the quantisers' counters in training (train/guard_counts.c), on the CPU engine:
 *   - an NVFP4 Llama (gate projections in BF16) whose layer-0 MLP gets, in every 16th channel c
 *     from a random c0, a gate row at 40x the weights' RMS and an up row of zeros: the forward is
 *     untouched there (h = silu(g) * u = 0 in those channels), but up_proj's output gradient
 *     dy = dh * silu(g) carries an outlier channel in every 16-block of the rows where g > 0.
 *     Exactly that layer falls back, at the second check, with tensor dy (or dy^T); its dy lines
 *     in quant_stats.jsonl are over the threshold, layer 1's up_proj stays under; a run resumed
 *     from a checkpoint after the fallback keeps it.
 *   - the counters: with a check every step (mxfp4, fp8_tensor, fp8_block; about 1 in 64 weights
 *     planted at 1e-12 of the RMS, a learning rate of 1e-9), each layer's counted w and dy
 *     underflows and overflows of step s >= 2 equal the check's measurements of w + w^T (the
 *     weights the update quantised for the next step) and of dy + dy^T (the step's own backward),
 *     both from the reference quantiser's statistics (quant_stats.c); metrics.jsonl's totals are
 *     the counts summed over the layers. */
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
#include "deepwell.h"
#include "runtime/engine.h"
#include "testutil.h"

static dw_ctx *ctx;
static dw_test_rng rng;
static char *dir, *model;

static int setup(void **state) {
    (void)state;
    dw_test_rng_init(&rng, dw_test_seed());
    return dw_test_train_fixture(&ctx, &dir, &model, 2, 32, 64);
}
static int teardown(void **state) {
    (void)state;
    dw_test_train_fixture_close(ctx, dir, model);
    return 0;
}

static dw_policy *policy(const char *text) {
    char *path = dw_test_path(dir, "policy.json");
    assert_int_equal(dw_test_write(path, text, strlen(text)), 0);
    dw_policy *p = NULL;
    if (dw_policy_load(ctx, path, &p) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    free(path);
    return p;
}

static dw_model *open_model(uint64_t seed, const dw_policy *pol) {
    dw_model *m = dw_test_open_model(ctx, model, seed, pol, 2, 16);
    assert_non_null(m);
    return m;
}

static void base_opts(dw_train_opts *o, const char *out, uint64_t seed, int64_t steps) {
    dw_train_opts_init(o, sizeof *o);
    o->data = "builtin";
    o->out_dir = out;
    o->steps = steps;
    o->batch = 2;
    o->seq = 16;
    o->global_batch = 2;
    o->warmup = 2;
    o->lr = 1e-4;
    o->eval_every = 0;
    o->ckpt_minutes = 0;
    o->seed = seed;
    o->quant_check_every = 1;
    o->quant_fallback_after = 2;
}

static int param_index(dw_engine *e, const char *name) {
    const int i = dw_test_param_index(e, name);
    if (i < 0) fail_msg("no parameter %s", name);
    return i;
}

/* Rows c0, c0 + 16, ... of layer 0's gate_proj at 100x RMS (random signs), of its up_proj zero (at 40x,
 * DW_TEST_SEED=28203102566450190 left dy under the fallback's bound: no decision). */
static void plant(dw_engine *e, int64_t c0) {
    const char *names[2] = {"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"};
    for (int t = 0; t < 2; t++) {
        const int i = param_index(e, names[t]);
        int64_t sh[4];
        dw_engine_param_shape(e, i, sh);
        const int64_t M = sh[0], K = sh[1];
        float *w = malloc((size_t)(M * K) * sizeof *w);
        assert_int_equal(dw_engine_param_read(e, i, w), DW_OK);
        double ss = 0;
        for (int64_t k = 0; k < M * K; k++) ss += (double)w[k] * w[k];
        const float big = (float)(100.0 * sqrt(ss / (double)(M * K)));
        for (int64_t m = c0; m < M; m += 16)
            for (int64_t k = 0; k < K; k++) w[m * K + k] = t ? 0.0f : (dw_test_next(&rng) & 1) ? big : -big;
        assert_int_equal(dw_engine_param_write(e, i, w), DW_OK);
        free(w);
    }
}

static json_t *lines(const char *path) {
    json_t *a = dw_test_json_lines(path);
    if (!a) fail_msg("%s: no JSON lines", path);
    return a;
}

static const char *str(const json_t *j, const char *k) {
    const char *s = json_string_value(json_object_get(j, k));
    return s ? s : "";
}
static long long num(const json_t *j, const char *k) { return (long long)json_integer_value(json_object_get(j, k)); }

static void test_dy_fallback(void **state) {
    (void)state;
    dw_policy *pol = policy("{\"default\": \"nvfp4\", \"fallback\": \"none\", "
                            "\"rules\": [{\"match\": \"*.gate_proj\", \"recipe\": \"bf16\"}]}");
    const uint64_t wseed = dw_test_next(&rng), dseed = dw_test_next(&rng) >> 1;
    const int64_t c0 = (int64_t)(dw_test_next(&rng) % 16);
    const char *L = "model.layers.0.mlp.up_proj";
    char *out = dw_test_path(dir, "dy");
    dw_train_opts o;
    base_opts(&o, out, dseed, 4);
    o.ckpt_every = 2;
    dw_model *m = open_model(wseed, pol);
    dw_engine *e = dw_model_engine(m);
    assert_int_equal(dw_test_node_recipe(e, L), DW_RECIPE_NVFP4);
    plant(e, c0);
    if (dw_train(e, &o) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    char *dp = dw_test_path(out, "precision_decisions.jsonl"), *qp = dw_test_path(out, "quant_stats.jsonl");
    json_t *dec = lines(dp), *qs = lines(qp);
    if (json_array_size(dec) != 1) fail_msg("%zu decisions (expected 1)", json_array_size(dec));
    const json_t *d = json_array_get(dec, 0);
    print_message("decision: step %lld, %s, tensor %s, %s\n", num(d, "step"), str(d, "layer"), str(d, "tensor"),
                  str(d, "reason"));
    assert_string_equal(str(d, "layer"), L);
    assert_int_equal(num(d, "step"), 2);
    assert_true(!strcmp(str(d, "tensor"), "dy") || !strcmp(str(d, "tensor"), "dy^T"));
    assert_non_null(strstr(str(d, "reason"), "checks in a row (dy"));
    assert_int_equal(dw_test_node_recipe(e, L), DW_RECIPE_BF16);
    assert_int_equal(dw_test_node_recipe(e, "model.layers.1.mlp.up_proj"), DW_RECIPE_NVFP4);
    /* the planted layer's dy over the threshold at both checks; layer 1's under */
    int over = 0, under = 0;
    for (size_t i = 0; i < json_array_size(qs); i++) {
        const json_t *j = json_array_get(qs, i);
        if (strcmp(str(j, "tensor"), "dy")) continue;
        const double b = json_real_value(json_object_get(j, "bulk_error")), t = json_real_value(json_object_get(j, "threshold"));
        if (!strcmp(str(j, "layer"), L)) over += b > t;
        if (!strcmp(str(j, "layer"), "model.layers.1.mlp.up_proj")) under += b < t;
    }
    assert_int_equal(over, 2);
    assert_int_equal(under, 4);
    json_decref(dec), json_decref(qs);

    /* resumed from the step-2 checkpoint in a fresh engine (no planting): the fallback holds */
    dw_model *m2 = open_model(dw_test_next(&rng), pol);
    char *ck = dw_test_path(out, "ckpt-2");
    base_opts(&o, out, dseed, 3);
    o.ckpt_every = 2;
    o.resume = ck;
    if (dw_train(dw_model_engine(m2), &o) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    assert_int_equal(dw_test_node_recipe(dw_model_engine(m2), L), DW_RECIPE_BF16);
    dec = lines(dp);
    assert_int_equal(json_array_size(dec), 1);
    json_decref(dec);
    dw_model_free(m), dw_model_free(m2);
    dw_policy_free(pol);
    free(ck), free(dp), free(qp), free(out);
}

/* In every linear weight, about 1 in 64 elements at 1e-12 of the weights' RMS: flushed by every
 * recipe (with a learning rate of 1e-9 they stay far below their blocks' largest). */
static void plant_tiny(dw_engine *e) {
    for (int i = 0; i < dw_engine_param_count(e); i++) {
        const char *name = dw_engine_param_name(e, i);
        if (!strstr(name, "_proj.weight")) continue;
        int64_t sh[4];
        dw_engine_param_shape(e, i, sh);
        const int64_t n = sh[0] * sh[1];
        float *w = malloc((size_t)n * sizeof *w);
        assert_int_equal(dw_engine_param_read(e, i, w), DW_OK);
        for (int64_t k = 0; k < n; k++)
            if (dw_test_next(&rng) % 64 == 0) w[k] *= 1e-12f;
        assert_int_equal(dw_engine_param_write(e, i, w), DW_OK);
        free(w);
    }
}

static void test_counts_in_training(void **state) {
    (void)state;
    const char *recipes[3] = {"mxfp4", "fp8_tensor", "fp8_block"};
    for (int r = 0; r < 3; r++) {
        dw_policy *pol = NULL;
        assert_int_equal(dw_policy_from_precision(ctx, recipes[r], false, &pol), DW_OK);
        char *out = dw_test_path(dir, recipes[r]);
        dw_train_opts o;
        base_opts(&o, out, dw_test_next(&rng) >> 1, 3);
        o.quant_fallback_after = 0;
        o.lr = 1e-9;
        o.min_lr = 0;
        dw_model *m = open_model(dw_test_next(&rng), pol);
        plant_tiny(dw_model_engine(m));
        if (dw_train(dw_model_engine(m), &o) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
        for (int64_t step = 2; step <= 3; step++) {
            int layers = 0;
            long long w_under = 0;
            if (dw_test_quant_counts_check(out, step, &layers, &w_under) != 0) fail_msg("%s: step %lld", recipes[r], (long long)step);
            assert_int_equal(layers, 14); /* 2 blocks x 7 linear layers */
            assert_true(w_under > 0);     /* the planted weights */
        }
        dw_model_free(m);
        dw_policy_free(pol);
        free(out);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dy_fallback),
        cmocka_unit_test(test_counts_in_training),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
