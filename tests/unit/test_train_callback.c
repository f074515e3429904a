/* test_train_callback.c — dw_train fed by the caller's next_batch/val_batch (deepwell.h) on the
 * CPU: the callbacks see indices 0, 1, ... (continued from the checkpoint's position on resume),
 * the run equals one over the same batches fed again after a resume bit for bit, validation
 * restarts its index and ends when val_batch returns 1, a failing callback stops with DW_ERR_IO
 * before the step's update leaving the last checkpoint loadable, an id outside the vocabulary is
 * refused naming its place, and data given both ways is refused; the recorded "(next_batch)" is
 * not opened as files. */
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

enum { B = 2, T = 16, V = 256, NWIN = 7 };

static dw_ctx *ctx;
static dw_test_rng rng;
static char *dir, *model;
static int32_t windows[NWIN][T + 1]; /* fresh random token windows */

static int setup(void **state) {
    (void)state;
    dw_test_rng_init(&rng, dw_test_seed());
    for (int w = 0; w < NWIN; w++)
        for (int t = 0; t <= T; t++) windows[w][t] = (int32_t)(dw_test_next(&rng) % V);
    return dw_test_train_fixture(&ctx, &dir, &model, 1, 16, 32);
}
static int teardown(void **state) {
    (void)state;
    dw_test_train_fixture_close(ctx, dir, model);
    return 0;
}

static dw_model *open_model(dw_weights_from w) {
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.batch = B;
    mo.seq = T;
    mo.weights = w;
    mo.seed = 5;
    dw_model *m = NULL;
    if (dw_model_open(ctx, model, &mo, &m) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    return m;
}

typedef struct {
    int64_t next_calls, val_calls, fail_at, val_len;
    int64_t indices[64];
    int bad_id_at;  /* next_batch index whose targets[1][3] is out of range, -1 none */
    double loss[32];
    int64_t steps_seen;
} feed;

/* Window (i * B + r) mod NWIN as row r of micro-batch i. */
static void fill(int64_t i, int32_t *tokens, int32_t *targets) {
    for (int r = 0; r < B; r++) {
        const int32_t *w = windows[(i * B + r) % NWIN];
        memcpy(tokens + r * T, w, T * sizeof *w);
        memcpy(targets + r * T, w + 1, T * sizeof *w);
    }
}

static int next_batch(void *user, int64_t index, int32_t *tokens, int32_t *targets, int64_t b, int64_t t) {
    feed *f = user;
    assert_int_equal(b, B);
    assert_int_equal(t, T);
    if (f->next_calls < 64) f->indices[f->next_calls] = index;
    f->next_calls++;
    if (index == f->fail_at) return -7;
    fill(index, tokens, targets);
    if (index == f->bad_id_at) targets[1 * T + 3] = V + 4;
    return 0;
}

static int val_batch(void *user, int64_t index, int32_t *tokens, int32_t *targets, int64_t b, int64_t t) {
    feed *f = user;
    (void)b, (void)t;
    f->val_calls++;
    if (index >= f->val_len) return 1;
    fill(100 + index, tokens, targets);
    return 0;
}

static void on_progress(const dw_train_progress *p, void *user) {
    feed *f = user;
    f->loss[p->step - 1] = p->loss;
    f->steps_seen++;
    if (p->step % 2 == 0) assert_true(isfinite(p->val_loss));
}

static void opts_for(dw_train_opts *o, const char *out, feed *f, int64_t steps) {
    dw_train_opts_init(o, sizeof *o);
    o->out_dir = out;
    o->steps = steps;
    o->batch = B;
    o->seq = T;
    o->global_batch = 2 * B; /* two micro-batches a step */
    o->warmup = 1;
    o->schedule = DW_LR_CONSTANT; /* runs of 4 and 6 steps share their learning rates */
    o->eval_every = 2;
    o->eval_batches = 3;
    o->ckpt_every = 2;
    o->next_batch = next_batch;
    o->val_batch = val_batch;
    o->batch_user = f;
    o->progress = on_progress;
    o->progress_user = f;
}

static void test_indices_resume_and_validation(void **state) {
    (void)state;
    char *whole = dw_test_path(dir, "whole"), *cut = dw_test_path(dir, "cut");
    feed a = {.fail_at = -1, .val_len = 2, .bad_id_at = -1}, b = a, c = a;
    dw_model *m = open_model(DW_WEIGHTS_RANDOM);
    dw_train_opts o;
    opts_for(&o, whole, &a, 6);
    assert_int_equal(dw_train(dw_model_engine(m), &o), DW_OK);
    assert_int_equal(a.next_calls, 12);
    for (int64_t i = 0; i < 12; i++) assert_int_equal(a.indices[i], i);
    /* three validations (steps 2, 4, 6) of 2 micro-batches, each asking once more and told "no more" */
    assert_int_equal(a.val_calls, 3 * 3);
    dw_model_free(m);

    m = open_model(DW_WEIGHTS_RANDOM); /* the same seed: the same start */
    opts_for(&o, cut, &b, 4);
    assert_int_equal(dw_train(dw_model_engine(m), &o), DW_OK);
    dw_model_free(m);
    m = open_model(DW_WEIGHTS_NONE); /* resumed: weights, moments and position from ckpt-4 */
    opts_for(&o, cut, &c, 6);
    o.resume = cut;
    assert_int_equal(dw_train(dw_model_engine(m), &o), DW_OK);
    assert_int_equal(c.next_calls, 4);
    for (int64_t i = 0; i < 4; i++) assert_int_equal(c.indices[i], 8 + i); /* the position continues */
    for (int s = 0; s < 4; s++) assert_true(b.loss[s] == a.loss[s]);
    for (int s = 4; s < 6; s++) assert_true(c.loss[s] == a.loss[s]);
    dw_model_free(m);

    /* a file run is not resumed with the callback, nor this one with files */
    m = open_model(DW_WEIGHTS_NONE);
    feed d = {.fail_at = -1, .val_len = 2, .bad_id_at = -1};
    opts_for(&o, cut, &d, 8);
    o.next_batch = NULL, o.val_batch = NULL, o.data = "builtin";
    o.resume = cut;
    assert_int_equal(dw_train(dw_model_engine(m), &o), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "(next_batch)"));
    dw_model_free(m);
    dw_data *data = NULL; /* what `deepwell train --resume` of such a run opens: refused, saying why */
    assert_int_equal(dw_data_open_pattern(ctx, "(next_batch)", T, V, &data), DW_ERR_INVALID);
    assert_null(data);
    assert_non_null(strstr(dw_errmsg(ctx), "came from the caller"));
    free(whole), free(cut);
}

static void test_failures(void **state) {
    (void)state;
    char *out = dw_test_path(dir, "fail"), *ck = dw_test_path(out, "ckpt-2");
    feed f = {.fail_at = 5, .val_len = 1, .bad_id_at = -1}; /* the second micro-batch of step 3 */
    dw_model *m = open_model(DW_WEIGHTS_RANDOM);
    dw_train_opts o;
    opts_for(&o, out, &f, 6);
    assert_int_equal(dw_train(dw_model_engine(m), &o), DW_ERR_IO);
    assert_non_null(strstr(dw_errmsg(ctx), "next_batch failed (returned -7) for micro-batch 5"));
    assert_int_equal(f.steps_seen, 2);
    dw_model_free(m);
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.batch = B, mo.seq = T;
    dw_model *back = NULL; /* the last checkpoint is whole */
    assert_int_equal(dw_model_open(ctx, ck, &mo, &back), DW_OK);
    dw_model_free(back);

    char *out2 = dw_test_path(dir, "badid");
    feed g = {.fail_at = -1, .val_len = 1, .bad_id_at = 3};
    m = open_model(DW_WEIGHTS_RANDOM);
    opts_for(&o, out2, &g, 4);
    assert_int_equal(dw_train(dw_model_engine(m), &o), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "next_batch: micro-batch 3: targets[1][3] = 260 is outside the model's "
                                           "vocabulary [0, 256)"));
    char *out3 = dw_test_path(dir, "noval");
    feed h = {.fail_at = -1, .val_len = 0, .bad_id_at = -1};
    opts_for(&o, out3, &h, 4);
    assert_int_equal(dw_train(dw_model_engine(m), &o), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "val_batch gave no micro-batch"));
    char *out4 = dw_test_path(dir, "both");
    opts_for(&o, out4, &h, 4);
    o.data = "builtin";
    assert_int_equal(dw_train(dw_model_engine(m), &o), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "not both"));
    o.next_batch = NULL; /* files, with the callback's validation */
    assert_int_equal(dw_train(dw_model_engine(m), &o), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "val_batch needs next_batch"));
    dw_model_free(m);
    free(out), free(ck), free(out2), free(out3), free(out4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_indices_resume_and_validation),
        cmocka_unit_test(test_failures),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
