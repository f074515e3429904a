/* test_guard_train.c — the trainer's guardrails (train/guard*.c) through the public API on the CPU
 * engine: a weight set to +inf from the progress callback makes the next loss NaN, so that
 * step is skipped — weights and AdamW moments byte for byte as before it, "skipped" in the
 * progress and in metrics.jsonl — and once the weight is put back training goes on; --max-skips
 * in a row stop the run with DW_ERR_NUMERIC and a checkpoint holding the last good weights. In an
 * NVFP4 program, the one layer given an outlier channel in its weight (every 16th input at 40
 * sigma) falls back to BF16 after quant_fallback_after checks, no other layer does, the decision
 * is in precision_decisions.jsonl and that step's metrics.jsonl line, quant_stats.jsonl has every
 * check, and a resumed run applies it again before its first step and continues the
 * uninterrupted run's losses bit for bit. The first run measures on samples (a random
 * quant_check_elements far under the layer's size, "measured" < "elements" in quant_stats.jsonl),
 * the resumed one whole tensors: the same decision at the same step either way. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/program.h"
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

static dw_model *open_model(uint64_t seed, const dw_policy *pol) {
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.batch = 2;
    mo.seq = 16;
    mo.weights = DW_WEIGHTS_RANDOM;
    mo.seed = seed;
    mo.policy = pol;
    dw_model *m = NULL;
    if (dw_model_open(ctx, model, &mo, &m) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    return m;
}

static void base_opts(dw_train_opts *o, const char *out, uint64_t seed, int64_t steps) {
    dw_train_opts_init(o, sizeof *o);
    o->data = "builtin";
    o->out_dir = out;
    o->steps = steps;
    o->batch = 2;
    o->seq = 16;
    o->global_batch = 4;
    o->warmup = 2;
    o->eval_every = 0;
    o->ckpt_minutes = 0;
    o->seed = seed;
}

static int param_index(dw_engine *e, const char *name) {
    for (int i = 0; i < dw_engine_param_count(e); i++)
        if (!strcmp(dw_engine_param_name(e, i), name)) return i;
    fail_msg("no parameter %s", name);
    return -1;
}

static int64_t numel(dw_engine *e, int i) {
    int64_t s[4];
    dw_engine_param_shape(e, i, s);
    return s[0] * s[1] * s[2] * s[3];
}

/* Every parameter, concatenated. */
static float *all_weights(dw_engine *e, size_t *bytes) {
    size_t n = 0;
    for (int i = 0; i < dw_engine_param_count(e); i++) n += (size_t)numel(e, i);
    float *w = malloc(n * sizeof *w), *p = w;
    for (int i = 0; i < dw_engine_param_count(e); i++) {
        assert_int_equal(dw_engine_param_read(e, i, p), DW_OK);
        p += numel(e, i);
    }
    *bytes = n * sizeof *w;
    return w;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    b[*n] = 0;
    fclose(f);
    return b;
}

static int count_lines_with(const char *path, const char *needle) {
    size_t n = 0;
    char *t = slurp(path, &n);
    if (!t) return -1;
    int c = 0;
    for (char *line = strtok(t, "\n"); line; line = strtok(NULL, "\n")) c += strstr(line, needle) != NULL;
    free(t);
    return c;
}

/* ---- non-finite steps -------------------------------------------------------------------------- */
typedef struct {
    dw_engine *e;
    int64_t poison_at, restore_at; /* steps after whose callback the weight is poisoned / put back */
    int wi;                        /* the poisoned parameter and element */
    int64_t at;
    float old;
    float *w_before;               /* all weights right after poisoning */
    size_t w_bytes;
    char *opt_before, *opt_path;   /* the optimizer file right after poisoning */
    size_t opt_bytes;
    int64_t calls, skipped;
    const char *why[16];
} poison;

static void on_progress(const dw_train_progress *p, void *user) {
    poison *s = user;
    s->calls++;
    assert_int_equal(p->step, s->calls);
    s->why[p->step] = p->skipped;
    if (p->skipped) {
        s->skipped++;
        assert_true(!isfinite(p->loss) || !isfinite(p->grad_norm));
        size_t b = 0, ob = 0;
        float *w = all_weights(s->e, &b); /* nothing moved */
        assert_true(b == s->w_bytes && !memcmp(w, s->w_before, b));
        free(w);
        assert_int_equal(dw_engine_save_optimizer(s->e, s->opt_path), DW_OK);
        char *o = slurp(s->opt_path, &ob);
        assert_true(ob == s->opt_bytes && !memcmp(o, s->opt_before, ob));
        free(o);
    } else {
        assert_true(isfinite(p->loss) && isfinite(p->grad_norm));
    }
    if (p->step == s->poison_at) {
        float *row = malloc((size_t)numel(s->e, s->wi) * sizeof *row);
        assert_int_equal(dw_engine_param_read(s->e, s->wi, row), DW_OK);
        s->old = row[s->at];
        row[s->at] = INFINITY; /* every token's MLP output becomes +-inf, the next norm NaN */
        assert_int_equal(dw_engine_param_write(s->e, s->wi, row), DW_OK);
        free(row);
        free(s->w_before);
        s->w_before = all_weights(s->e, &s->w_bytes);
        assert_int_equal(dw_engine_save_optimizer(s->e, s->opt_path), DW_OK);
        free(s->opt_before);
        s->opt_before = slurp(s->opt_path, &s->opt_bytes);
    }
    if (p->step == s->restore_at) {
        float *row = malloc((size_t)numel(s->e, s->wi) * sizeof *row);
        assert_int_equal(dw_engine_param_read(s->e, s->wi, row), DW_OK);
        row[s->at] = s->old;
        assert_int_equal(dw_engine_param_write(s->e, s->wi, row), DW_OK);
        free(row);
    }
}

static void test_skip_nonfinite(void **state) {
    (void)state;
    char *out = dw_test_path(dir, "skip");
    dw_train_opts o;
    base_opts(&o, out, dw_test_next(&rng) >> 1, 7);
    dw_model *m = open_model(dw_test_next(&rng), NULL);
    dw_engine *e = dw_model_engine(m);
    poison s = {.e = e, .poison_at = 2 + (int64_t)(dw_test_next(&rng) % 3), .opt_path = dw_test_path(dir, "opt.st")};
    s.restore_at = s.poison_at + 1; /* exactly one step sees the overflow */
    s.wi = param_index(e, "model.layers.0.mlp.down_proj.weight");
    s.at = (int64_t)(dw_test_next(&rng) % (uint64_t)numel(e, s.wi));
    o.progress = on_progress;
    o.progress_user = &s;
    if (dw_train(e, &o) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    assert_int_equal(s.calls, 7);
    assert_int_equal(s.skipped, 1);
    assert_non_null(s.why[s.poison_at + 1]);
    assert_true(!strcmp(s.why[s.poison_at + 1], "nonfinite loss") || !strcmp(s.why[s.poison_at + 1], "nonfinite grad"));
    char *metrics = dw_test_path(out, "metrics.jsonl");
    assert_int_equal(count_lines_with(metrics, "\"skipped\": \"nonfinite"), 1);
    char needle[64];
    snprintf(needle, sizeof needle, "{\"step\": %lld, \"loss\": null", (long long)(s.poison_at + 1));
    assert_int_equal(count_lines_with(metrics, needle), 1);
    free(metrics);

    /* never put back: max_skips in a row stop the run, with a checkpoint of the poisoned (last
     * good) state */
    char *out2 = dw_test_path(dir, "skip2");
    base_opts(&o, out2, dw_test_next(&rng) >> 1, 20);
    o.max_skips = 2 + (int64_t)(dw_test_next(&rng) % 3);
    dw_model *m2 = open_model(dw_test_next(&rng), NULL);
    poison s2 = {.e = dw_model_engine(m2), .poison_at = 2, .restore_at = -1, .wi = s.wi, .at = s.at,
                 .opt_path = s.opt_path};
    o.progress = on_progress;
    o.progress_user = &s2;
    assert_int_equal(dw_train(dw_model_engine(m2), &o), DW_ERR_NUMERIC);
    print_message("%s\n", dw_errmsg(ctx));
    assert_non_null(strstr(dw_errmsg(ctx), "--max-skips"));
    assert_int_equal(s2.skipped, o.max_skips);
    assert_int_equal(s2.calls, 2 + o.max_skips);
    char ck[64];
    snprintf(ck, sizeof ck, "ckpt-%lld", (long long)(2 + o.max_skips));
    assert_non_null(strstr(dw_errmsg(ctx), ck));
    char *cdir = dw_test_path(out2, ck), *mpath = dw_test_path(cdir, "model.safetensors");
    dw_model *m3 = open_model(1, NULL); /* other weights, then the checkpoint's */
    assert_int_equal(dw_engine_load_weights(dw_model_engine(m3), mpath), DW_OK);
    size_t b = 0;
    float *w = all_weights(dw_model_engine(m3), &b);
    assert_true(b == s2.w_bytes && !memcmp(w, s2.w_before, b));
    free(w);
    free(cdir), free(mpath);
    dw_model_free(m3);
    dw_model_free(m2);
    free(s.w_before), free(s.opt_before), free(s2.w_before), free(s2.opt_before);
    free(s.opt_path);
    free(out2);
    dw_model_free(m);
    free(out);
}

/* ---- quantised layers ---------------------------------------------------------------------------- */
/* in the first block: the NVFP4 recipe keeps the last one (and the head) in BF16 */
static const char *LAYER = "model.layers.0.mlp.up_proj";

typedef struct {
    int64_t calls, stop_at;
    double loss[16];
    char change[16][512];
} seen;

static void on_step(const dw_train_progress *p, void *user) {
    seen *s = user;
    s->calls++;
    s->loss[p->step] = p->loss;
    assert_null(p->skipped);
    if (p->precision_change) snprintf(s->change[p->step], sizeof s->change[p->step], "%s", p->precision_change);
    if (p->step == s->stop_at) dw_train_request_stop();
}

/* W of LAYER [M, K]: every 16th input column (from c0) at +-40 x the weights' RMS. */
static void plant_outlier(dw_engine *e, int64_t c0, uint64_t sign_seed) {
    dw_test_rng signs;
    dw_test_rng_init(&signs, sign_seed);
    char name[128];
    snprintf(name, sizeof name, "%s.weight", LAYER);
    const int i = param_index(e, name);
    int64_t sh[4];
    dw_engine_param_shape(e, i, sh);
    const int64_t M = sh[0], K = sh[1];
    float *w = malloc((size_t)(M * K) * sizeof *w);
    assert_int_equal(dw_engine_param_read(e, i, w), DW_OK);
    double ss = 0;
    for (int64_t k = 0; k < M * K; k++) ss += (double)w[k] * w[k];
    const float big = (float)(40.0 * sqrt(ss / (double)(M * K)));
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = c0; k < K; k += 16) w[m * K + k] = (dw_test_next(&signs) & 1) ? big : -big;
    assert_int_equal(dw_engine_param_write(e, i, w), DW_OK);
    free(w);
}

/* The first quant_stats.jsonl line of LAYER's tensor w: its "elements" and "measured". */
static void w_counts(const char *qs, int64_t *elements, int64_t *measured) {
    size_t n = 0;
    char *t = slurp(qs, &n);
    assert_non_null(t);
    const char *l = strstr(t, "\"layer\": \"model.layers.0.mlp.up_proj\", \"tensor\": \"w\"");
    assert_non_null(l);
    long long e = -1, m = -1;
    const char *f = strstr(l, "\"elements\": ");
    assert_non_null(f);
    assert_int_equal(sscanf(f, "\"elements\": %lld, \"measured\": %lld", &e, &m), 2);
    *elements = e, *measured = m;
    free(t);
}

static dw_recipe node_recipe(dw_engine *e, const char *name) {
    const dw_compiled *p = dw_engine_program(e);
    for (int i = 0; i < p->g->n_nodes; i++)
        if (!strcmp(p->g->nodes[i].name, name)) return p->node[i].bind.recipe;
    fail_msg("no node %s", name);
    return DW_RECIPE_COUNT;
}

static void test_quant_fallback(void **state) {
    (void)state;
    dw_policy *pol = NULL;
    assert_int_equal(dw_policy_from_precision(ctx, "nvfp4", false, &pol), DW_OK);
    const uint64_t wseed = dw_test_next(&rng), dseed = dw_test_next(&rng) >> 1;
    const int64_t c0 = (int64_t)(dw_test_next(&rng) % 16);
    const uint64_t sign_seed = dw_test_next(&rng);
    char *outa = dw_test_path(dir, "qa"), *outb = dw_test_path(dir, "qb");
    dw_train_opts o;
    /* A: 6 steps straight, a check every step, the fallback after 2 */
    base_opts(&o, outa, dseed, 6);
    o.quant_check_every = 1;
    o.quant_fallback_after = 2;
    o.quant_check_elements = 64 + (int64_t)(dw_test_next(&rng) % 400); /* W is [64, 32]: sampled */
    seen a = {0};
    o.progress = on_step;
    o.progress_user = &a;
    dw_model *ma = open_model(wseed, pol);
    dw_engine *ea = dw_model_engine(ma);
    assert_int_equal(node_recipe(ea, LAYER), DW_RECIPE_NVFP4);
    plant_outlier(ea, c0, sign_seed);
    if (dw_train(ea, &o) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    assert_int_equal(a.calls, 6);
    print_message("step 2: %s\n", a.change[2]);
    assert_non_null(strstr(a.change[2], LAYER));
    for (int k = 1; k <= 6; k++)
        if (k != 2) assert_string_equal(a.change[k], "");
    assert_int_equal(node_recipe(ea, LAYER), DW_RECIPE_BF16);
    assert_int_equal(node_recipe(ea, "model.layers.0.mlp.down_proj"), DW_RECIPE_NVFP4);
    char *dec = dw_test_path(outa, "precision_decisions.jsonl"), *qs = dw_test_path(outa, "quant_stats.jsonl");
    assert_int_equal(count_lines_with(dec, "\"step\": 2, \"layer\": \"model.layers.0.mlp.up_proj\", \"tensor\": \"w\""), 1);
    assert_int_equal(count_lines_with(dec, "\"step\""), 1);
    /* every check measured the layer's w until it fell back; every other quantised layer all along */
    assert_int_equal(count_lines_with(qs, "\"layer\": \"model.layers.0.mlp.up_proj\", \"tensor\": \"w\""), 2);
    assert_int_equal(count_lines_with(qs, "\"layer\": \"model.layers.0.mlp.down_proj\", \"tensor\": \"w\""), 6);
    int64_t elements, measured;
    w_counts(qs, &elements, &measured);
    print_message("cap %lld: w measured %lld of %lld\n", (long long)o.quant_check_elements, (long long)measured,
                  (long long)elements);
    if (!(measured > 0 && measured <= o.quant_check_elements && measured < elements))
        fail_msg("w: measured %lld of %lld, cap %lld", (long long)measured, (long long)elements,
                 (long long)o.quant_check_elements);
    char *mj = dw_test_path(outa, "metrics.jsonl");
    assert_int_equal(count_lines_with(mj, "\"precision_change\": \"model.layers.0.mlp.up_proj w "), 1);
    assert_int_equal(count_lines_with(mj, "\"precision_change\""), 1);
    free(mj);
    char *ck = dw_test_path(outa, "ckpt-6"), *sj = dw_test_path(ck, "state.json");
    assert_int_equal(count_lines_with(sj, "\"model.layers.0.mlp.up_proj\": \"bf16\""), 1);
    free(ck), free(sj), free(dec), free(qs);

    /* B: the same run stopped after step 4, then resumed in a fresh engine (nvfp4 everywhere as
     * compiled): the fallback is applied before step 5 and the losses are A's bit for bit */
    base_opts(&o, outb, dseed, 6);
    o.quant_check_every = 1;
    o.quant_fallback_after = 2;
    o.quant_check_elements = 0; /* whole tensors */
    seen b = {.stop_at = 4};
    o.progress = on_step;
    o.progress_user = &b;
    dw_model *mb = open_model(wseed, pol);
    plant_outlier(dw_model_engine(mb), c0, sign_seed);
    if (dw_train(dw_model_engine(mb), &o) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    assert_int_equal(b.calls, 4);
    dw_model *mc = open_model(dw_test_next(&rng), pol);
    assert_int_equal(node_recipe(dw_model_engine(mc), LAYER), DW_RECIPE_NVFP4);
    o.resume = outb;
    b.stop_at = 0;
    if (dw_train(dw_model_engine(mc), &o) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    assert_int_equal(b.calls, 6);
    assert_int_equal(node_recipe(dw_model_engine(mc), LAYER), DW_RECIPE_BF16);
    for (int k = 1; k <= 6; k++)
        if (memcmp(&a.loss[k], &b.loss[k], sizeof(double))) fail_msg("step %d: loss %.17g, straight %.17g", k, b.loss[k], a.loss[k]);
    dec = dw_test_path(outb, "precision_decisions.jsonl");
    assert_int_equal(count_lines_with(dec, "\"step\": 2, \"layer\": \"model.layers.0.mlp.up_proj\", \"tensor\": \"w\""), 1);
    assert_int_equal(count_lines_with(dec, "\"step\""), 1);
    free(dec);
    qs = dw_test_path(outb, "quant_stats.jsonl");
    w_counts(qs, &elements, &measured);
    assert_int_equal(measured, elements);
    free(qs);
    dw_model_free(ma), dw_model_free(mb), dw_model_free(mc);
    dw_policy_free(pol);
    free(outa), free(outb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_skip_nonfinite),
        cmocka_unit_test(test_quant_fallback),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
