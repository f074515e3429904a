/* test_train_loop.c — dw_train through the public API: the progress callback sees every step
 * with its schedule's learning rate, validation and checkpoint events where asked; a stop
 * requested from the callback ends the run after that step with a checkpoint of it; option errors
 * name the option; CUDA is refused as not implemented. */
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
#include "train/model_open.h"

static dw_ctx *ctx;
static dw_test_rng rng;
static char *dir, *model;

static int setup(void **state) {
    (void)state;
    dw_ctx_opts o = {.device = DW_DEVICE_CPU};
    dw_test_rng_init(&rng, dw_test_seed());
    dir = dw_test_tmpdir();
    model = dw_test_path(dir, "model");
    char *cfg = dw_test_path(model, "config.json");
    const char *text = "{\"model_type\": \"llama\", \"vocab_size\": 256, \"hidden_size\": 16, "
                       "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
                       "\"intermediate_size\": 32, \"max_position_embeddings\": 32}";
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", model);
    int rc = system(cmd);
    rc |= dw_test_write(cfg, text, strlen(text));
    free(cfg);
    return rc == 0 && dw_ctx_create(&o, &ctx) == DW_OK ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    dw_ctx_free(ctx);
    dw_test_rmtree(dir);
    free(dir);
    free(model);
    return 0;
}

typedef struct {
    int64_t calls, stop_at, evals, ckpts, samples;
    double lr[64], loss[64];
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
    if (s->calls == s->stop_at) dw_train_request_stop();
}

static void test_progress_and_stop(void **state) {
    (void)state;
    dw_train_opts o;
    dw_train_opts_default(&o);
    char *out = dw_test_path(dir, "run");
    o.model = model;
    o.data = "builtin";
    o.out_dir = out;
    o.steps = 12;
    o.batch = 2;
    o.seq = 16;
    o.global_batch = 4;
    o.warmup = 3;
    o.lr = 1e-3;
    o.min_lr = 1e-4;
    o.eval_every = 4;
    o.eval_batches = 2;
    o.sample_every = 6;
    o.sample_tokens = 4;
    o.ckpt_every = 5;
    o.seed = dw_test_next(&rng) >> 1;
    seen s = {.stop_at = 0, .o = &o};
    o.progress = on_progress;
    o.progress_user = &s;
    assert_int_equal(dw_train(ctx, &o), DW_OK);
    assert_int_equal(s.calls, 12);
    assert_int_equal(s.evals, 3);   /* steps 4, 8, 12 */
    assert_int_equal(s.ckpts, 3);   /* 5, 10 and the end */
    assert_int_equal(s.samples, 2); /* 6, 12 */
    /* warmup then cosine to min_lr at the last step */
    assert_true(fabs(s.lr[0] - 1e-3 / 3) < 1e-15 && fabs(s.lr[2] - 1e-3) < 1e-15);
    assert_true(fabs(s.lr[11] - 1e-4) < 1e-15);
    for (int i = 3; i < 12; i++) assert_true(s.lr[i] <= s.lr[i - 1]);
    assert_false(dw_train_stop_requested());

    /* a stop request from the callback at step k: the run ends there with a checkpoint of k */
    char *out2 = dw_test_path(dir, "run2");
    o.out_dir = out2;
    o.ckpt_every = 0;
    int64_t k = 1 + (int64_t)(dw_test_next(&rng) % 10);
    seen s2 = {.stop_at = k, .o = &o};
    o.progress_user = &s2;
    assert_int_equal(dw_train(ctx, &o), DW_OK);
    assert_int_equal(s2.calls, k);
    assert_true(dw_train_stop_requested());
    dw_ckpt_state st;
    char *cdir = NULL;
    assert_int_equal(dw_ckpt_open(ctx, out2, &cdir, &st), DW_OK);
    assert_int_equal(st.step, k);
    assert_int_equal(st.tokens_seen, k * 4 * 16);
    assert_int_equal(st.data_position, (uint64_t)(k * 4));
    free(cdir);
    /* the same steps gave the same losses as the first run */
    for (int64_t i = 0; i < k; i++) assert_true(s2.loss[i] == s.loss[i]);

    /* resuming it to the end continues the same loss sequence */
    o.resume = out2;
    seen s3 = {.stop_at = 0, .o = &o, .calls = k};
    o.progress_user = &s3;
    assert_int_equal(dw_train(ctx, &o), DW_OK);
    assert_int_equal(s3.calls, 12);
    for (int64_t i = k; i < 12; i++) assert_true(s3.loss[i] == s.loss[i]);
    free(out);
    free(out2);
}

static void test_option_errors(void **state) {
    (void)state;
    dw_train_opts o;
    dw_train_opts_default(&o);
    char *out = dw_test_path(dir, "bad");
    o.model = model;
    o.data = "builtin";
    o.out_dir = out;
    o.batch = 3;
    o.global_batch = 8;
    assert_int_equal(dw_train(ctx, &o), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "--global-batch 8"));
    o.global_batch = 6;
    o.seq = 64; /* beyond max_position_embeddings 32 */
    assert_int_equal(dw_train(ctx, &o), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "max_seq"));
    o.seq = 16;
    o.data = NULL;
    assert_int_equal(dw_train(ctx, &o), DW_ERR_INVALID);
    dw_ctx *c = (dw_ctx *)1;
    if (dw_train_ctx_create("cuda", &c) == DW_OK) { /* a CUDA build on a machine with a GPU */
        assert_int_equal(dw_ctx_device(c), DW_DEVICE_CUDA);
        dw_ctx_free(c);
    } else { /* no CUDA in this build, or no usable GPU: refused with the reason */
        assert_null(c);
        assert_non_null(strstr(dw_errmsg(NULL), "--device cuda: "));
    }
    assert_int_equal(dw_train_ctx_create("tpu", &c), DW_ERR_INVALID);
    assert_int_equal(dw_train_ctx_create("auto", &c), DW_OK);
    if (!dw_built_with_cuda()) assert_int_equal(dw_ctx_device(c), DW_DEVICE_CPU);
    dw_ctx_free(c);
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_progress_and_stop),
        cmocka_unit_test(test_option_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
