/* test_quant_check_sample.c — the guard's capped measurement (precision/quant_stats.c,
 * dw_qstats_sample): a tensor at or under the cap gives exactly the uncapped sums (bit for bit);
 * over it, the sample is whole block rows of the quantised layout, ascending, within the cap, the
 * same evenly spread rows every time except the one holding the amax, which is always there, and
 * the sampled sums equal those of the full tensor's layout restricted to those rows (gathered
 * here, measured uncapped); a planted outlier channel and a single saturating outlier stay over
 * their thresholds when sampled, a normal tensor under. Every recipe, x and x^T, fresh random
 * shapes each run (DW_TEST_SEED replays). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "precision/quant_stats.h"
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

static int64_t pick(int64_t lo, int64_t hi) { return lo + (int64_t)(dw_test_next(&rng) % (uint64_t)(hi - lo + 1)); }

static float *normal(int64_t n, float sd) {
    float *x = malloc((size_t)n * sizeof *x);
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++) x[i] = sd * dw_test_normal(&rng);
    return x;
}

static dw_qstats measure(dw_recipe r, const float *x, int64_t rows, int64_t cols, bool trans, int64_t cap) {
    dw_qstats s = dw_qstats_zero();
    s.cap = cap;
    if (dw_qstats_measure(ctx, r, x, rows, cols, trans, &s) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    return s;
}

/* The sums compared bit for bit (the JSON fields are printed from these). */
static void assert_same_sums(const dw_qstats *a, const dw_qstats *b, const char *what) {
    if (memcmp(&a->q, &b->q, sizeof a->q) || memcmp(&a->bulk_e2, &b->bulk_e2, sizeof a->bulk_e2) ||
        memcmp(&a->bulk_x2, &b->bulk_x2, sizeof a->bulk_x2))
        fail_msg("%s: sums differ: n %lld/%lld e2 %.17g/%.17g x2 %.17g/%.17g bulk %.17g/%.17g sat %lld/%lld", what,
                 (long long)a->q.n, (long long)b->q.n, a->q.sum_e2, b->q.sum_e2, a->q.sum_x2, b->q.sum_x2,
                 dw_qstats_bulk_error(a), dw_qstats_bulk_error(b), (long long)a->q.saturated, (long long)b->q.saturated);
}

static int64_t block_rows(dw_recipe r) {
    int br;
    dw_recipe_block(r, &br, NULL);
    return br > 0 ? br : 1;
}

/* (1) At or under the cap, or cap 0: today's numbers exactly. */
static void test_under_cap_identical(void **state) {
    (void)state;
    for (int r = 1; r < DW_RECIPE_COUNT; r++)
        for (int trans = 0; trans < 2; trans++) {
            const int64_t rows = pick(1, 300), cols = pick(1, 300), n = rows * cols;
            float *x = normal(n, (float)pick(1, 1000) / 100);
            const dw_qstats all = measure((dw_recipe)r, x, rows, cols, trans, 0);
            const int64_t caps[] = {n, n + pick(1, 1000), INT64_MAX};
            for (int c = 0; c < 3; c++) {
                const dw_qstats s = measure((dw_recipe)r, x, rows, cols, trans, caps[c]);
                char what[96];
                snprintf(what, sizeof what, "%s %lldx%lld trans %d cap %lld", dw_recipe_name((dw_recipe)r),
                         (long long)rows, (long long)cols, trans, (long long)caps[c]);
                assert_same_sums(&s, &all, what);
                assert_int_equal(s.elements, n);
                assert_int_equal(s.q.n, n);
            }
            free(x);
        }
}

/* The layout's (x or x^T) first element of largest magnitude: its block row. */
static int64_t amax_group(const float *x, int64_t rows, int64_t cols, bool trans, int64_t BR) {
    const int64_t R = trans ? cols : rows, C = trans ? rows : cols;
    double most = -1;
    int64_t at = 0;
    for (int64_t a = 0; a < R; a++)
        for (int64_t b = 0; b < C; b++) {
            const double v = fabs((double)(trans ? x[b * cols + a] : x[a * cols + b]));
            if (v > most) most = v, at = a;
        }
    return at / BR;
}

/* (2) Over the cap: the sample's shape, and its sums against the layout restricted to it. */
static void test_over_cap_oracle(void **state) {
    (void)state;
    for (int rep = 0; rep < 3; rep++)
        for (int r = 1; r < DW_RECIPE_COUNT; r++)
            for (int trans = 0; trans < 2; trans++) {
                const dw_recipe rc = (dw_recipe)r;
                const int64_t BR = block_rows(rc);
                const int64_t rows = pick(BR == 1 ? 40 : 300, BR == 1 ? 400 : 700), cols = pick(40, 400);
                const int64_t R = trans ? cols : rows, C = trans ? rows : cols, G = (R + BR - 1) / BR;
                if (G < 3) continue;
                const int64_t n = rows * cols, cap = pick(BR * C, (G - 1) * BR * C - 1); /* 1 <= k < G */
                float *x = normal(n, (float)pick(1, 1000) / 100);
                if (dw_test_next(&rng) % 2) x[pick(0, n - 1)] *= 50; /* an amax somewhere */
                int64_t *group = malloc((size_t)G * sizeof *group), gr = 0;
                assert_non_null(group);
                const int64_t k = dw_qstats_sample(rc, x, rows, cols, trans, cap, &gr, group);
                char what[128];
                snprintf(what, sizeof what, "%s %lldx%lld trans %d cap %lld k %lld", dw_recipe_name(rc), (long long)rows,
                         (long long)cols, trans, (long long)cap, (long long)k);
                assert_int_equal(gr, BR);
                assert_int_equal(k, cap / (BR * C));
                const int64_t a = amax_group(x, rows, cols, trans, BR);
                int64_t moved = 0;
                bool has_amax = false;
                for (int64_t i = 0; i < k; i++) {
                    if (i && group[i] <= group[i - 1]) fail_msg("%s: groups not ascending", what);
                    if (group[i] < 0 || group[i] >= G) fail_msg("%s: group %lld out of range", what, (long long)group[i]);
                    has_amax |= group[i] == a;
                    moved += group[i] != i * G / k;
                }
                if (!has_amax) fail_msg("%s: the amax's group %lld is not sampled", what, (long long)a);
                if (moved > 1) fail_msg("%s: %lld groups off the even spread", what, (long long)moved);
                /* the oracle: the layout's sampled rows gathered, measured whole */
                int64_t m = 0;
                float *sub = malloc((size_t)(k * BR * C) * sizeof *sub);
                assert_non_null(sub);
                for (int64_t i = 0; i < k; i++)
                    for (int64_t row = group[i] * BR; row < (group[i] + 1) * BR && row < R; row++, m++)
                        for (int64_t b = 0; b < C; b++) sub[m * C + b] = trans ? x[b * cols + row] : x[row * cols + b];
                const dw_qstats want = measure(rc, sub, m, C, false, 0);
                const dw_qstats got = measure(rc, x, rows, cols, trans, cap);
                assert_same_sums(&got, &want, what);
                assert_int_equal(got.elements, n);
                assert_int_equal(got.q.n, m * C);
                if (got.q.n > cap) fail_msg("%s: %lld measured over the cap", what, (long long)got.q.n);
                /* the same sample again (same positions every check) */
                const dw_qstats again = measure(rc, x, rows, cols, trans, cap);
                assert_same_sums(&again, &got, what);
                free(sub);
                free(group);
                free(x);
            }
}

/* (3) The decisions: a sampled outlier channel (one column in 16 at 40 sigma, as test_guard_stats)
 * and one saturating element (fp8_tensor: it sets the scale that flushes the rest) stay over the
 * threshold; a normal tensor stays under. */
static void test_sampled_decisions(void **state) {
    (void)state;
    const int64_t rows = 1024, cols = 512, n = rows * cols, cap = pick(4096, 32768);
    for (int trans = 0; trans < 2; trans++) {
        float *x = normal(n, 1);
        const double thr4 = dw_qstats_default_threshold(DW_RECIPE_NVFP4);
        const dw_qstats calm = measure(DW_RECIPE_NVFP4, x, rows, cols, trans, cap);
        assert_true(calm.q.n <= cap && calm.q.n > 0);
        if (!(dw_qstats_bulk_error(&calm) < thr4)) fail_msg("normal tensor sampled over: %g", dw_qstats_bulk_error(&calm));
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j += 16) x[i * cols + j] = 40 * (dw_test_next(&rng) % 2 ? 1 : -1);
        const dw_qstats full = measure(DW_RECIPE_NVFP4, x, rows, cols, trans, 0),
                        smp = measure(DW_RECIPE_NVFP4, x, rows, cols, trans, cap);
        assert_true(smp.q.n < full.q.n);
        if (trans == 0 && !(dw_qstats_bulk_error(&full) > thr4 && dw_qstats_bulk_error(&smp) > thr4))
            fail_msg("outlier channel: full %g sampled %g, threshold %g", dw_qstats_bulk_error(&full),
                     dw_qstats_bulk_error(&smp), thr4);
        free(x);
        /* one huge element anywhere: the per-tensor scale squeezes everything else */
        x = normal(n, 1);
        const int64_t at = pick(0, n - 1);
        x[at] = 1e7f;
        const double thr8 = dw_qstats_default_threshold(DW_RECIPE_FP8_TENSOR);
        const dw_qstats f8 = measure(DW_RECIPE_FP8_TENSOR, x, rows, cols, trans, 0),
                        s8 = measure(DW_RECIPE_FP8_TENSOR, x, rows, cols, trans, cap);
        if (!(dw_qstats_bulk_error(&f8) > thr8 && dw_qstats_bulk_error(&s8) > thr8 && s8.q.sum_x2 >= 1e14))
            fail_msg("saturating outlier at %lld: full %g sampled %g (sum x^2 %g), threshold %g", (long long)at,
                     dw_qstats_bulk_error(&f8), dw_qstats_bulk_error(&s8), s8.q.sum_x2, thr8);
        free(x);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_under_cap_identical),
        cmocka_unit_test(test_over_cap_oracle),
        cmocka_unit_test(test_sampled_decisions),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
