/* test_guard_stats.c — precision/quant_stats.c, the guardrails' measurement of one quantised tensor:
 * a tensor on the format's grid quantises without error; a normal tensor stays under its recipe's
 * default threshold in every recipe, with nothing saturated; a planted outlier channel (one
 * element in 16 at 40 sigma) trips NVFP4's threshold on the bulk error while ||q(x)-x||/||x||,
 * dominated by the outliers, stays low (why the guard uses the bulk); a block whose scale underflows counts
 * exactly its elements as flushed; the transposed measurement equals the measurement of x^T;
 * sums over parts give the whole's error; a policy's "max_rel_error" loads, round-trips and is
 * refused naming the file and key when malformed. Fresh random inputs each run (DW_TEST_SEED
 * replays). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "precision/policy.h"
#include "precision/quant_stats.h"
#include "precision/thresholds.h"
#include "testutil.h"

static dw_ctx *ctx;
static dw_test_rng rng;

static int setup(void **state) {
    (void)state;
    dw_ctx_opts o = {.device = DW_DEVICE_CPU};
    dw_test_rng_init(&rng, dw_test_seed());
    return dw_ctx_create(&o, &ctx) == DW_OK ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    dw_ctx_free(ctx);
    return 0;
}

static float *normal(int64_t n, float sd) {
    float *x = malloc((size_t)n * sizeof *x);
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++) x[i] = sd * dw_test_normal(&rng);
    return x;
}

static dw_qstats measure(dw_recipe r, const float *x, int64_t rows, int64_t cols, bool trans) {
    dw_qstats s = dw_qstats_zero();
    if (dw_qstats_measure(ctx, r, x, rows, cols, trans, &s) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    return s;
}

/* Values on every recipe's grid: small integers times a power of two with the block's amax on a
 * code (E2M1 holds 0, 0.5 ... 6; 6 x 2^k in each 16- and 32-block and each 128-block/row). */
static void test_exact_grid(void **state) {
    (void)state;
    static const float grid[] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    const int64_t rows = 128, cols = 256;
    float *x = malloc(rows * cols * sizeof *x);
    const float scale = ldexpf(1.0f, (int)(dw_test_next(&rng) % 9) - 4);
    for (int64_t i = 0; i < rows * cols; i++)
        x[i] = (i % 16 == 0 ? 6.0f : grid[dw_test_next(&rng) % 8]) * scale * ((dw_test_next(&rng) & 1) ? 1 : -1);
    for (int r = 1; r < DW_RECIPE_COUNT; r++) {
        if (r == DW_RECIPE_NVFP4 || r == DW_RECIPE_FP8_TENSOR || r == DW_RECIPE_FP8_ROW ||
            r == DW_RECIPE_FP8_BLOCK || r == DW_RECIPE_FP8_BLOCK2D)
            continue; /* FP32 scales amax/max: 6/448 is not a power of two, so the grid moves */
        dw_qstats s = measure((dw_recipe)r, x, rows, cols, false);
        assert_int_equal(s.q.n, rows * cols);
        if (s.q.sum_e2 != 0 || s.bulk_e2 != 0) fail_msg("%s: error %g on its own grid", dw_recipe_name((dw_recipe)r), s.q.sum_e2);
        assert_int_equal(s.q.flushed, 0);
        assert_int_equal(s.q.saturated, 0);
    }
    free(x);
}

static void test_normal_under_threshold(void **state) {
    (void)state;
    const int64_t rows = 64 + (int64_t)(dw_test_next(&rng) % 64), cols = 256 + (int64_t)(dw_test_next(&rng) % 200);
    float *x = normal(rows * cols, dw_test_uniform(&rng, 1e-3f, 1e3f));
    for (int r = 1; r < DW_RECIPE_COUNT; r++)
        for (int t = 0; t < 2; t++) {
            dw_qstats s = measure((dw_recipe)r, x, rows, cols, t);
            const double e = dw_qstats_rel_error(&s), bulk = dw_qstats_bulk_error(&s),
                         thr = dw_qstats_default_threshold((dw_recipe)r);
            print_message("%-12s %s rel error %.4f bulk %.4f (threshold %.2f) underflow %.4f%%\n",
                          dw_recipe_name((dw_recipe)r), t ? "x^T" : "x  ", e, bulk, thr,
                          100.0 * (double)s.q.flushed / (double)s.q.n);
            assert_int_equal(s.q.n, rows * cols);
            assert_true(e > 0 && bulk >= e * 0.95 && bulk <= e * 1.3); /* outlier-free: the two agree */
            assert_true(bulk < thr / 1.5); /* a margin: a normal tensor never trips */
            assert_int_equal(s.q.saturated, 0);
        }
    free(x);
}

/* An outlier channel: every 16th column at +-40 sigma. In NVFP4 each 16-block's other 15 values
 * land below E2M1's 0.25 x scale and flush; the error is their whole energy. */
static void test_outlier_trips(void **state) {
    (void)state;
    const int64_t rows = 64, cols = 512;
    float *x = normal(rows * cols, 1.0f);
    const int64_t c0 = (int64_t)(dw_test_next(&rng) % 16);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = c0; j < cols; j += 16) x[i * cols + j] = (dw_test_next(&rng) & 1) ? 40.0f : -40.0f;
    dw_qstats s = measure(DW_RECIPE_NVFP4, x, rows, cols, false);
    const double e = dw_qstats_rel_error(&s), bulk = dw_qstats_bulk_error(&s), thr = dw_qstats_default_threshold(DW_RECIPE_NVFP4);
    print_message("nvfp4 with an outlier channel: rel error %.4f, bulk %.4f, %lld of %lld flushed\n", e, bulk,
                  (long long)s.q.flushed, (long long)s.q.n);
    assert_true(bulk > 2 * thr);
    assert_true(e < thr); /* the outliers hold almost all of ||x||: the plain ratio cannot see them */
    assert_true(s.q.flushed > rows * cols / 2);
    /* the same tensor along the tokens (x^T): the channel is whole rows of x^T, the others normal */
    dw_qstats t = measure(DW_RECIPE_NVFP4, x, rows, cols, true);
    assert_true(dw_qstats_bulk_error(&t) < thr);
    free(x);
}

/* NVFP4: one element at 1e6 puts the tensor scale at 1e6 / (6 x 448); a block of values below
 * 2^-10 x 6 x s_t gets a UE4M3 scale of 0, so exactly its 16 non-zero elements flush. */
static void test_flushed_block(void **state) {
    (void)state;
    const int64_t rows = 4, cols = 64;
    float *x = normal(rows * cols, 1e5f);
    for (int64_t i = 0; i < rows * cols; i++) x[i] = copysignf(1e5f + fabsf(x[i]), x[i]); /* no small values */
    x[0] = 1e6f;
    const int64_t b = 1 + (int64_t)(dw_test_next(&rng) % (rows * cols / 16 - 1)); /* a block other than x[0]'s */
    for (int64_t k = 0; k < 16; k++) x[b * 16 + k] = dw_test_uniform(&rng, 0.5f, 1.0f);
    dw_qstats s = measure(DW_RECIPE_NVFP4, x, rows, cols, false);
    assert_int_equal(s.q.flushed, 16);
    assert_int_equal(s.q.saturated, 0);
    free(x);
}

static void test_transposed_and_sums(void **state) {
    (void)state;
    const int64_t rows = 48 + (int64_t)(dw_test_next(&rng) % 80), cols = 32 + (int64_t)(dw_test_next(&rng) % 100);
    float *x = normal(rows * cols, 2.0f), *xt = malloc(rows * cols * sizeof *xt);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) xt[j * rows + i] = x[i * cols + j];
    for (int r = 1; r < DW_RECIPE_COUNT; r++) {
        dw_qstats a = measure((dw_recipe)r, x, rows, cols, true), b = measure((dw_recipe)r, xt, cols, rows, false);
        assert_true(a.q.sum_e2 == b.q.sum_e2 && a.q.sum_x2 == b.q.sum_x2 && a.q.flushed == b.q.flushed && a.q.n == b.q.n);
        assert_true(a.bulk_e2 == b.bulk_e2 && a.bulk_x2 == b.bulk_x2);
        if (r == DW_RECIPE_FP8_TENSOR || r == DW_RECIPE_NVFP4 || r == DW_RECIPE_FP8_BLOCK2D) continue; /* whole-tensor or 2-D scales */
        dw_qstats whole = measure((dw_recipe)r, x, rows, cols, false), parts = dw_qstats_zero();
        const int64_t h = rows / 2;
        if (dw_qstats_measure(ctx, (dw_recipe)r, x, h, cols, false, &parts) != DW_OK ||
            dw_qstats_measure(ctx, (dw_recipe)r, x + h * cols, rows - h, cols, false, &parts) != DW_OK)
            fail_msg("%s", dw_errmsg(ctx));
        assert_true(fabs(parts.q.sum_e2 - whole.q.sum_e2) <= 1e-12 * whole.q.sum_e2 && parts.q.n == whole.q.n);
    }
    dw_qstats none = dw_qstats_zero();
    assert_int_equal(dw_qstats_measure(ctx, DW_RECIPE_BF16, x, rows, cols, false, &none), DW_ERR_INVALID);
    assert_true(dw_qstats_rel_error(&none) == 0.0);
    free(x);
    free(xt);
}

/* A policy file with text; its load status; *out the policy (or NULL). */
static dw_status load_policy(const char *text, dw_policy **out) {
    char *dir = dw_test_tmpdir(), *path = dw_test_path(dir, "policy.json");
    assert_int_equal(dw_test_write(path, text, strlen(text)), 0);
    dw_status st = dw_policy_load(ctx, path, out);
    dw_test_rmtree(dir);
    free(dir), free(path);
    return st;
}

static void test_policy_thresholds(void **state) {
    (void)state;
    const double v = 0.05 + 0.01 * (double)(dw_test_next(&rng) % 50);
    char text[256];
    snprintf(text, sizeof text, "{\"default\": \"nvfp4\", \"max_rel_error\": {\"nvfp4\": %.2f, \"fp8_block\": 0.5}}", v);
    dw_policy *p = NULL;
    if (load_policy(text, &p) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    assert_true(fabs(p->max_rel_error[DW_RECIPE_NVFP4] - v) < 1e-12 && p->max_rel_error[DW_RECIPE_FP8_BLOCK] == 0.5);
    assert_true(p->max_rel_error[DW_RECIPE_MXFP8] == 0); /* unset: the default */
    char *json = NULL;
    assert_int_equal(dw_policy_to_json(ctx, p, &json), DW_OK);
    dw_policy_free(p);
    p = NULL;
    assert_non_null(strstr(json, "\"max_rel_error\""));
    if (load_policy(json, &p) != DW_OK) fail_msg("round trip: %s", dw_errmsg(ctx)); /* the dump loads again */
    assert_true(fabs(p->max_rel_error[DW_RECIPE_NVFP4] - v) < 1e-12 && p->max_rel_error[DW_RECIPE_MXFP8] == 0);
    dw_free_string(json);
    dw_policy_free(p);
    assert_int_equal(load_policy("{\"default\": \"mxfp8\", \"max_rel_error\": 0.3}", &p), DW_OK);
    for (int r = 1; r < DW_RECIPE_COUNT; r++) assert_true(p->max_rel_error[r] == 0.3);
    dw_policy_free(p);
    static const char *const bad[][2] = {
        {"{\"default\": \"nvfp4\", \"max_rel_error\": {\"bf16\": 0.3}}", "'bf16' is not a quantised recipe"},
        {"{\"default\": \"nvfp4\", \"max_rel_error\": {\"nvfp5\": 0.3}}", "'nvfp5' is not a quantised recipe"},
        {"{\"default\": \"nvfp4\", \"max_rel_error\": -1}", "field 'max_rel_error': expected a number > 0"},
        {"{\"default\": \"nvfp4\", \"max_rel_error\": {\"nvfp4\": \"x\"}}", "field 'max_rel_error'.nvfp4: expected"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(load_policy(bad[i][0], &p), DW_ERR_FORMAT);
        assert_null(p);
        if (!strstr(dw_errmsg(ctx), bad[i][1]) || !strstr(dw_errmsg(ctx), "policy.json"))
            fail_msg("%s: %s", bad[i][0], dw_errmsg(ctx));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_grid),      cmocka_unit_test(test_normal_under_threshold),
        cmocka_unit_test(test_outlier_trips),   cmocka_unit_test(test_flushed_block),
        cmocka_unit_test(test_transposed_and_sums), cmocka_unit_test(test_policy_thresholds),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
