/* test_amax_history.c — delayed scaling of fp8_tensor (precision/amax_history.c, amax_rules.h).
 * The rule against a brute-force oracle: fresh random tensors over many steps, each step several
 * quantisations (training ones noted, others not; now and then a non-finite tensor, an all-zero
 * one, a step with nothing), the oracle keeping the plain list of every step's largest noted
 * amax and scaling from the largest of the last N (its own amax while those are all 0, or when
 * its own is not finite); codes and scale compared bit for bit, row-wise and transposed, and an
 * empty history gives exactly dw_quantize_cpu's fp8_tensor. In the CPU engine (an fp8_tensor
 * Llama): --fp8-amax-history changes the training (the weights differ from just-in-time
 * scaling), state.json carries the histories, a run resumed from its checkpoint ends bit for bit
 * where the uninterrupted run does, and resuming with another length, or without it, is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deepwell.h"
#include "formats/formats.h"
#include "precision/amax_history.h"
#include "testutil.h"

static dw_ctx *ctx;
static dw_test_rng rng;
static char *dir, *model;

static int setup(void **state) {
    (void)state;
    dw_test_rng_init(&rng, dw_test_seed());
    return dw_test_train_fixture(&ctx, &dir, &model, 1, 32, 64);
}
static int teardown(void **state) {
    (void)state;
    dw_test_train_fixture_close(ctx, dir, model);
    return 0;
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static void test_rule_against_oracle(void **state) {
    (void)state;
    for (int trial = 0; trial < 40; trial++) {
        const uint32_t N = (uint32_t)dw_test_rnd(1, 6);
        uint32_t *h = calloc(DW_AMAX_WORDS(N), sizeof *h);
        uint32_t steps[64] = {0}; /* the oracle: each finished step's largest noted amax */
        int nsteps = 0;
        for (int step = 0; step < 40; step++) {
            uint32_t noted = 0;
            const int uses = (int)dw_test_rnd(0, 3);
            for (int u = 0; u < uses; u++) {
                const int64_t rows = dw_test_rnd(1, 9), cols = dw_test_rnd(1, 9);
                const float spread = powf(2.0f, (float)dw_test_rnd(-6, 6));
                float *x = malloc((size_t)(rows * cols) * sizeof *x);
                for (int64_t i = 0; i < rows * cols; i++) x[i] = spread * dw_test_normal(&rng);
                const int64_t odd = dw_test_rnd(0, 19);
                if (odd == 0) x[dw_test_rnd(0, rows * cols - 1)] = NAN;
                if (odd == 1) x[dw_test_rnd(0, rows * cols - 1)] = -INFINITY;
                if (odd == 2) memset(x, 0, (size_t)(rows * cols) * sizeof *x);
                const bool record = dw_test_rnd(0, 3) != 0, trans = dw_test_rnd(0, 1);
                uint32_t cur = 0;
                for (int64_t i = 0; i < rows * cols; i++) cur = (bits(x[i]) & 0x7FFFFFFFu) > cur ? bits(x[i]) & 0x7FFFFFFFu : cur;
                uint32_t hist = 0;
                for (int k = nsteps - (int)N < 0 ? 0 : nsteps - (int)N; k < nsteps; k++) hist = steps[k] > hist ? steps[k] : hist;
                const uint32_t pick = hist > 0 && cur < 0x7F800000u ? hist : cur;
                uint8_t *codes = malloc((size_t)(rows * cols)), *ref = malloc((size_t)(rows * cols));
                float scale = 0, ref_scale = 0;
                dw_qtensor q = {.codes = codes, .scales = &scale}, r = {.codes = ref, .scales = &ref_scale};
                assert_int_equal(dw_amax_quantize_cpu(ctx, h, record, x, rows, cols, trans, &q), DW_OK);
                if (hist == 0) { /* empty: the plain recipe, bit for bit */
                    const dw_quant_opts o = {.recipe = DW_RECIPE_FP8_TENSOR};
                    assert_int_equal(trans ? dw_quantize_transposed_cpu(ctx, &o, x, rows, cols, &r)
                                           : dw_quantize_cpu(ctx, &o, x, rows, cols, &r), DW_OK);
                } else { /* s = pick / 448, codes E4M3(x / s) (saturating), by hand */
                    float a;
                    memcpy(&a, &pick, sizeof a);
                    ref_scale = a / 448.0f;
                    if (ref_scale == 0.0f) ref_scale = 1.0f;
                    const bool bad = pick >= 0x7F800000u;
                    if (bad) ref_scale = NAN;
                    for (int64_t i = 0; i < rows; i++)
                        for (int64_t j = 0; j < cols; j++)
                            ref[trans ? j * rows + i : i * cols + j] = bad ? 0x7F : dw_encode_e4m3(x[i * cols + j] / ref_scale);
                }
                assert_int_equal(bits(scale), bits(ref_scale));
                assert_memory_equal(codes, ref, (size_t)(rows * cols));
                assert_int_equal(q.rows, trans ? cols : rows);
                if (record && cur < 0x7F800000u && cur > noted) noted = cur;
                free(x), free(codes), free(ref);
            }
            assert_int_equal(h[DW_AMAX_PENDING], noted);
            dw_amax_roll(h, N);
            steps[nsteps++] = noted;
        }
        free(h);
    }
}

static dw_model *open_model(const char *precision) {
    dw_policy *pol = NULL;
    assert_int_equal(dw_policy_from_precision(ctx, precision, false, &pol), DW_OK);
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.batch = 2;
    mo.seq = 16;
    mo.weights = DW_WEIGHTS_RANDOM;
    mo.seed = 3;
    mo.policy = pol;
    dw_model *m = NULL;
    if (dw_model_open(ctx, model, &mo, &m) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    dw_policy_free(pol);
    return m;
}

static void opts_for(dw_train_opts *o, const char *out, int64_t steps, int64_t hist) {
    dw_train_opts_init(o, sizeof *o);
    o->data = "builtin";
    o->out_dir = out;
    o->steps = steps;
    o->batch = 2;
    o->seq = 16;
    o->global_batch = 4;
    o->lr = 1e-2;
    o->warmup = 1;
    o->schedule = DW_LR_CONSTANT; /* runs of 6 and 8 steps share their learning rates */
    o->eval_every = 0;
    o->ckpt_every = 3;
    o->ckpt_minutes = 0;
    o->keep = 0;
    o->quant_check_every = 0;
    o->fp8_amax_history = hist;
}

static float *params(dw_engine *e, int64_t *n) {
    int64_t total = 0;
    for (int i = 0; i < dw_engine_param_count(e); i++) total += dw_test_param_numel(e, i);
    float *all = malloc((size_t)total * sizeof *all), *p = all;
    for (int i = 0; i < dw_engine_param_count(e); i++) {
        assert_int_equal(dw_engine_param_read(e, i, p), DW_OK);
        p += dw_test_param_numel(e, i);
    }
    *n = total;
    return all;
}

static float *train(const char *name, int64_t steps, int64_t hist, const char *resume, int64_t *n) {
    char *out = dw_test_path(dir, name);
    dw_model *m = open_model("fp8_tensor");
    dw_train_opts o;
    opts_for(&o, out, steps, hist);
    o.resume = resume;
    if (dw_train(dw_model_engine(m), &o) != DW_OK) fail_msg("%s: %s", name, dw_errmsg(ctx));
    float *p = params(dw_model_engine(m), n);
    dw_model_free(m);
    free(out);
    return p;
}

static void test_engine_resume(void **state) {
    (void)state;
    int64_t n1 = 0, n2 = 0, n3 = 0;
    float *whole = train("whole", 8, 4, NULL, &n1), *jit = train("jit", 8, 0, NULL, &n3);
    assert_int_equal(n1, n3);
    assert_true(memcmp(whole, jit, (size_t)n1 * sizeof *whole) != 0); /* the histories change the steps */
    char *cut = dw_test_path(dir, "cut"), *state6 = dw_test_path(dir, "cut/ckpt-6/state.json");
    free(train("cut", 6, 4, NULL, &n2));
    FILE *f = fopen(state6, "r");
    assert_non_null(f);
    char text[1 << 16];
    const size_t len = fread(text, 1, sizeof text - 1, f);
    text[len] = '\0';
    fclose(f);
    assert_non_null(strstr(text, "\"fp8_amax_history\": {"));
    assert_non_null(strstr(text, "\"length\": 4"));
    assert_non_null(strstr(text, "\"model.layers.0.mlp.down_proj\": {"));
    assert_non_null(strstr(text, "\"pos\": 2")); /* 6 steps rolled into rings of 4 */
    float *resumed = train("cut", 8, 4, cut, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(whole, resumed, (size_t)n1 * sizeof *whole); /* bit for bit */

    dw_model *m = open_model("fp8_tensor");
    dw_train_opts o;
    opts_for(&o, cut, 8, 2);
    o.resume = cut;
    assert_int_equal(dw_train(dw_model_engine(m), &o), DW_ERR_FORMAT);
    assert_non_null(strstr(dw_errmsg(ctx), "--fp8-amax-history 4"));
    opts_for(&o, cut, 8, 0);
    o.resume = cut;
    assert_int_equal(dw_train(dw_model_engine(m), &o), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "--fp8-amax-history 4"));
    opts_for(&o, cut, 8, -1);
    assert_int_equal(dw_train(dw_model_engine(m), &o), DW_ERR_INVALID);
    dw_model_free(m);
    free(whole), free(jit), free(resumed), free(cut), free(state6);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule_against_oracle),
        cmocka_unit_test(test_engine_resume),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
