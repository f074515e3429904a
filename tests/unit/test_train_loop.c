/* test_train_loop.c — dw_train(engine, opts) through the public API on the CPU engine of a model
 * opened with dw_model_open: the progress callback sees every step with its schedule's learning
 * rate, validation, sample and checkpoint events where asked; two runs from the same seed give the
 * same losses; a stop requested from the callback ends the run after that step with a checkpoint
 * of it (state: step, tokens, data position, precision, tokenizer); resuming into an engine with
 * no weights continues the loss sequence bit for bit and keeps metrics.jsonl whole; dw_model_open
 * of the run directory holds the trained weights; a BF16
 * program trains reproducibly too; option errors name the option; contexts resolve their device. */
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
#include "testutil.h"
#include "train/ckpt.h"

static dw_ctx *ctx;
static dw_test_rng rng;
static char *dir, *model;

static int setup(void **state) {
    (void)state;
    dw_test_rng_init(&rng, dw_test_seed());
    return dw_test_train_fixture(&ctx, &dir, &model, 1, 16, 32);
}
static int teardown(void **state) {
    (void)state;
    dw_test_train_fixture_close(ctx, dir, model);
    return 0;
}

/* The model directory's model at capacity 2 x 16: random weights from seed, or none (zeros). */
static dw_model *open_model(uint64_t seed, dw_weights_from w, const dw_policy *pol) {
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.batch = 2;
    mo.seq = 16;
    mo.weights = w;
    mo.seed = seed;
    mo.policy = pol;
    dw_model *m = NULL;
    if (dw_model_open(ctx, model, &mo, &m) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    assert_false(dw_model_trained(m));
    assert_string_equal(dw_model_tokenizer(m), "bytes");
    return m;
}

typedef struct {
    int64_t calls, stop_at, evals, ckpts, samples;
    double lr[64], loss[64];
    char sample[256]; /* the last sample's text */
    const dw_train_opts *o;
} seen;

static void on_progress(const dw_train_progress *p, void *user) {
    seen *s = user;
    assert_int_equal(p->step, s->calls + 1);
    assert_int_equal(p->total, s->o->steps);
    assert_true(isfinite(p->loss) && p->loss > 0 && isfinite(p->grad_norm) && p->tokens_per_s > 0);
    s->lr[s->calls] = p->lr;
    s->loss[s->calls] = p->loss;
    s->calls++;
    s->evals += !isnan(p->val_loss);
    s->ckpts += p->checkpoint != NULL;
    s->samples += p->sample != NULL;
    if (p->sample) {
        assert_true(strlen(p->sample) > 0);
        snprintf(s->sample, sizeof s->sample, "%s", p->sample);
    }
    if (s->calls == s->stop_at) dw_train_request_stop();
}

static void base_opts(dw_train_opts *o, const char *out, uint64_t seed) {
    dw_train_opts_init(o, sizeof *o);
    o->data = "builtin";
    o->out_dir = out;
    o->steps = 12;
    o->batch = 2;
    o->seq = 16;
    o->global_batch = 4;
    o->warmup = 3;
    o->lr = 1e-3;
    o->min_lr = 1e-4;
    o->eval_every = 4;
    o->eval_batches = 2;
    o->sample_every = 6;
    o->sample_tokens = 4;
    o->ckpt_every = 5;
    o->seed = seed;
}

/* Whether two engines hold bit-identical parameters. */
static bool same_weights(dw_engine *a, dw_engine *b) {
    bool same = dw_engine_param_count(a) == dw_engine_param_count(b);
    for (int i = 0; same && i < dw_engine_param_count(a); i++) {
        int64_t shape[4], n = 1;
        for (int d = dw_engine_param_shape(a, i, shape); d > 0; d--) n *= shape[d - 1];
        float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
        assert_int_equal(dw_engine_param_read(a, i, x), DW_OK);
        assert_int_equal(dw_engine_param_read(b, i, y), DW_OK);
        same = !memcmp(x, y, (size_t)n * 4);
        free(x), free(y);
    }
    return same;
}

static int count_lines(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0, c;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

static void test_progress_stop_resume(void **state) {
    (void)state;
    const uint64_t wseed = dw_test_next(&rng);
    dw_train_opts o;
    char *out = dw_test_path(dir, "run");
    base_opts(&o, out, dw_test_next(&rng) >> 1);
    seen s = {.stop_at = 0, .o = &o};
    o.progress = on_progress;
    o.progress_user = &s;
    dw_model *m1 = open_model(wseed, DW_WEIGHTS_RANDOM, NULL);
    assert_int_equal(dw_train(dw_model_engine(m1), &o), DW_OK);
    assert_int_equal(s.calls, 12);
    assert_int_equal(s.evals, 3);   /* steps 4, 8, 12 */
    assert_int_equal(s.ckpts, 3);   /* 5, 10 and the end */
    assert_int_equal(s.samples, 2); /* 6, 12 */
    /* warmup then cosine to min_lr at the last step */
    assert_true(fabs(s.lr[0] - 1e-3 / 3) < 1e-15 && fabs(s.lr[2] - 1e-3) < 1e-15);
    assert_true(fabs(s.lr[11] - 1e-4) < 1e-15);
    for (int i = 3; i < 12; i++) assert_true(s.lr[i] <= s.lr[i - 1]);
    assert_false(dw_train_stop_requested());
    print_message("losses: step 1 %.4f, step 12 %.4f\n", s.loss[0], s.loss[11]);
    assert_true(s.loss[11] < s.loss[0]); /* it learns */
    char *metrics = dw_test_path(out, "metrics.jsonl");
    assert_int_equal(count_lines(metrics), 12);
    free(metrics);
    dw_ckpt_state st;
    char *cdir = NULL;
    assert_int_equal(dw_ckpt_open(ctx, out, &cdir, &st), DW_OK);
    assert_int_equal(st.step, 12);
    assert_string_equal(st.precision, "fp32");
    assert_string_equal(st.tokenizer, "bytes");
    free(cdir);
    /* dw_model_open of the run directory: its latest checkpoint's weights, its tokenizer */
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.batch = 2;
    mo.seq = 16;
    dw_model *from_ckpt = NULL;
    assert_int_equal(dw_model_open(ctx, out, &mo, &from_ckpt), DW_OK);
    assert_true(dw_model_trained(from_ckpt));
    assert_string_equal(dw_model_tokenizer(from_ckpt), "bytes");
    assert_true(same_weights(dw_model_engine(m1), dw_model_engine(from_ckpt)));
    dw_model_free(from_ckpt);
    /* the model directory has no weights: asking for them is refused */
    mo.weights = DW_WEIGHTS_FILE;
    from_ckpt = (dw_model *)out;
    assert_int_equal(dw_model_open(ctx, model, &mo, &from_ckpt), DW_ERR_IO);
    assert_null(from_ckpt);
    /* the run directory now holds a run: a fresh start there is refused */
    dw_model *again = open_model(wseed, DW_WEIGHTS_RANDOM, NULL);
    o.progress = NULL;
    assert_int_equal(dw_train(dw_model_engine(again), &o), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "already holds a run"));
    dw_model_free(again);
    o.progress = on_progress;

    /* a second run from the same seeds, with a stop request from the callback at step k: the same
     * losses, and the run ends there with a checkpoint of k */
    char *out2 = dw_test_path(dir, "run2");
    o.out_dir = out2;
    o.ckpt_every = 0;
    int64_t k = 1 + (int64_t)(dw_test_next(&rng) % 10);
    seen s2 = {.stop_at = k, .o = &o};
    o.progress_user = &s2;
    dw_model *m2 = open_model(wseed, DW_WEIGHTS_RANDOM, NULL);
    assert_int_equal(dw_train(dw_model_engine(m2), &o), DW_OK);
    assert_int_equal(s2.calls, k);
    assert_true(dw_train_stop_requested());
    assert_int_equal(dw_ckpt_open(ctx, out2, &cdir, &st), DW_OK);
    assert_int_equal(st.step, k);
    assert_int_equal(st.tokens_seen, k * 4 * 16);
    assert_int_equal(st.data_position, (uint64_t)(k * 4));
    assert_int_equal(st.batch, 2);
    assert_int_equal(st.global_batch, 4);
    free(cdir);
    for (int64_t i = 0; i < k; i++) assert_true(s2.loss[i] == s.loss[i]);

    /* resuming into an engine without weights continues the same loss sequence bit for bit */
    dw_model *m3 = open_model(0, DW_WEIGHTS_NONE, NULL);
    o.resume = out2;
    seen s3 = {.stop_at = 0, .o = &o, .calls = k};
    o.progress_user = &s3;
    assert_int_equal(dw_train(dw_model_engine(m3), &o), DW_OK);
    assert_int_equal(s3.calls, 12);
    for (int64_t i = k; i < 12; i++) assert_true(s3.loss[i] == s.loss[i]);
    char *metrics2 = dw_test_path(out2, "metrics.jsonl");
    assert_int_equal(count_lines(metrics2), 12); /* the first k lines kept, the rest appended */
    free(metrics2);
    /* the final weights of both runs are the same too */
    assert_true(same_weights(dw_model_engine(m1), dw_model_engine(m3)));
    /* a resume with another batch shape is refused, naming the checkpoint's */
    o.batch = 1;
    o.progress = NULL;
    assert_int_equal(dw_train(dw_model_engine(m3), &o), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "--batch 2"));
    dw_model_free(m1), dw_model_free(m2), dw_model_free(m3);
    free(out);
    free(out2);
}

/* A BF16 program trains on the CPU engine: finite losses, bit-identical across two runs from
 * the same seeds (samples from a text prompt too), and the checkpoint records its precision. */
static void test_bf16_reproducible(void **state) {
    (void)state;
    dw_policy *pol = NULL;
    assert_int_equal(dw_policy_from_precision(ctx, "bf16", false, &pol), DW_OK);
    const uint64_t wseed = dw_test_next(&rng), dseed = dw_test_next(&rng) >> 1;
    seen s[2];
    for (int r = 0; r < 2; r++) {
        char name[16];
        snprintf(name, sizeof name, "bf16-%d", r);
        char *out = dw_test_path(dir, name);
        dw_train_opts o;
        base_opts(&o, out, dseed);
        o.steps = 5;
        o.eval_every = 0;
        o.sample_every = 5;
        o.sample_prompt = "1+2=";
        o.sample_tokens = 6;
        s[r] = (seen){.o = &o};
        o.progress = on_progress;
        o.progress_user = &s[r];
        dw_model *m = open_model(wseed, DW_WEIGHTS_RANDOM, pol);
        assert_int_equal(dw_train(dw_model_engine(m), &o), DW_OK);
        assert_int_equal(s[r].calls, 5);
        dw_ckpt_state st;
        char *cdir = NULL;
        assert_int_equal(dw_ckpt_open(ctx, out, &cdir, &st), DW_OK);
        assert_string_equal(st.precision, "bf16");
        free(cdir);
        dw_model_free(m);
        free(out);
    }
    for (int i = 0; i < 5; i++) assert_true(s[0].loss[i] == s[1].loss[i]);
    /* the sample: the prompt (byte tokenizer), then the generated bytes, the same in both runs */
    assert_int_equal(s[0].samples, 1);
    assert_true(!strncmp(s[0].sample, "1+2=", 4));
    assert_string_equal(s[0].sample, s[1].sample);
    dw_policy_free(pol);
}

static void test_option_errors(void **state) {
    (void)state;
    dw_model *m = open_model(1, DW_WEIGHTS_RANDOM, NULL);
    dw_engine *e = dw_model_engine(m);
    dw_train_opts o;
    dw_train_opts_init(&o, sizeof o);
    char *out = dw_test_path(dir, "bad");
    o.data = "builtin";
    o.out_dir = out;
    o.batch = 2;
    o.seq = 16;
    o.global_batch = 5;
    assert_int_equal(dw_train(e, &o), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "--global-batch 5"));
    o.global_batch = 6;
    o.seq = 32; /* beyond the engine's capacity 16 */
    assert_int_equal(dw_train(e, &o), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "capacity"));
    o.seq = 16;
    o.batch = 3; /* beyond the capacity 2 */
    assert_int_equal(dw_train(e, &o), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "capacity"));
    o.batch = 2;
    o.lr = 0;
    assert_int_equal(dw_train(e, &o), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "--lr"));
    o.lr = 1e-3;
    o.data = NULL;
    assert_int_equal(dw_train(e, &o), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "--data"));
    o.data = "builtin";
    o.out_dir = NULL;
    assert_int_equal(dw_train(e, &o), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "--out"));
    assert_int_equal(dw_train(e, NULL), DW_ERR_INVALID);
    /* nothing was written by the refused runs */
    FILE *f = fopen(out, "r");
    assert_null(f);
    dw_model_free(m);
    /* contexts: CUDA where a GPU is usable, else refused with a reason and no context; AUTO is
     * the CPU in a CPU-only build */
    dw_ctx *c = (dw_ctx *)1;
    dw_ctx_opts co = {.device = DW_DEVICE_CUDA};
    if (dw_ctx_create(&co, &c) == DW_OK) {
        assert_int_equal(dw_ctx_device(c), DW_DEVICE_CUDA);
        dw_ctx_free(c);
    } else {
        assert_null(c);
        assert_true(strlen(dw_errmsg(NULL)) > 0);
    }
    co.device = DW_DEVICE_AUTO;
    assert_int_equal(dw_ctx_create(&co, &c), DW_OK);
    if (!dw_built_with_cuda()) assert_int_equal(dw_ctx_device(c), DW_DEVICE_CPU);
    assert_true(dw_ctx_device(c) != DW_DEVICE_AUTO);
    dw_ctx_free(c);
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_progress_stop_resume),
        cmocka_unit_test(test_bf16_reproducible),
        cmocka_unit_test(test_option_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
