/* test_arena_skip_counts.c — the weight counters after a skipped step when the BF16 copies live
 * in the activation arena (issue 31 x issue 25). A step the guard skips (non-finite loss: no
 * optimizer step, no refresh) still ran its backward, which under bf16_arena took some BF16
 * copies' memory; the next forward makes those copies again (runtime/engine_grad_arena.c). The
 * weights did not change, so the quantised weight caches are still valid and must be neither
 * remade nor counted again: the step after the skip counts w once, as the pools do.
 * A tiny llama in fp8_block and in mxfp8 trains 6 steps twice from the same seeds — opened with
 * grad_arena (the gradients and BF16 copies in the arena, asserted) and without (the pools) —
 * with one RMSNorm weight's FP32 master set to +inf between two steps (written straight into the
 * masters: nothing is refreshed, and the norm reads the master, so both programs see it) and put
 * back after the next, which is skipped as non-finite. A check every step: from step 2 on, every
 * step but the skipped one has each layer's counted w and dy equal to its measured w + w^T and
 * dy + dy^T, elements included (testutil's dw_test_quant_counts_check); both runs' losses agree
 * bit for bit (NaN at the skip) and their quant_stats.jsonl line for line. Fresh random weights,
 * data and poisoned step and element per run (DW_TEST_SEED replays). */
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
#include "core/json.h"
#include "deepwell.h"
#include "runtime/backend.h"
#include "runtime/engine.h"
#include "testutil.h"

enum { STEPS = 6 };

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

typedef struct {
    dw_engine *e;
    int64_t poison_at; /* the step after whose progress the master is poisoned; put back a step later */
    int wi;            /* the RMSNorm weight and its element */
    int64_t at;
    float old;
    double loss[STEPS + 1];
    const char *why[STEPS + 1];
    int skipped;
} poison;

/* One FP32 master element written (or read) in place: no refresh, as a norm reads the masters. */
static void master(dw_engine *e, int wi, int64_t at, float *v, bool write) {
    float *dev = e->x->w + e->p->param_off[wi] + at;
    dw_status st = write ? e->be->i->upload(e->be, dev, v, sizeof *v) : e->be->i->download(e->be, v, dev, sizeof *v);
    assert_int_equal(st, DW_OK);
}

static void on_progress(const dw_train_progress *p, void *user) {
    poison *s = user;
    assert_true(p->step >= 1 && p->step <= STEPS);
    s->loss[p->step] = p->loss, s->why[p->step] = p->skipped, s->skipped += p->skipped != NULL;
    if (p->step == s->poison_at) {
        float inf = INFINITY;
        master(s->e, s->wi, s->at, &s->old, false);
        master(s->e, s->wi, s->at, &inf, true);
    }
    if (p->step == s->poison_at + 1) master(s->e, s->wi, s->at, &s->old, true);
}

/* One run: the model opened with grad_arena (or the pools), trained STEPS with the poison. */
static void run(const char *recipe, bool arena, uint64_t wseed, uint64_t dseed, int64_t poison_at, uint64_t elem,
                const char *out, poison *s) {
    dw_policy *pol = NULL;
    assert_int_equal(dw_policy_from_precision(ctx, recipe, false, &pol), DW_OK);
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.batch = 2, mo.seq = 16, mo.weights = DW_WEIGHTS_RANDOM, mo.seed = wseed, mo.policy = pol, mo.grad_arena = arena;
    dw_model *m = NULL;
    if (dw_model_open(ctx, model, &mo, &m) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    dw_engine *e = dw_model_engine(m);
    assert_true(e->p->grad_arena == arena && e->p->bf16_arena == arena); /* DW_GRAD_ARENA / DW_BF16_ARENA unset */
    *s = (poison){.e = e, .poison_at = poison_at, .wi = dw_test_param_index(e, "model.layers.0.input_layernorm.weight")};
    assert_true(s->wi >= 0);
    int64_t sh[4];
    dw_engine_param_shape(e, s->wi, sh);
    s->at = (int64_t)(elem % (uint64_t)(sh[0] * sh[1] * sh[2] * sh[3]));
    dw_train_opts o;
    dw_train_opts_init(&o, sizeof o);
    o.data = "builtin", o.out_dir = out, o.steps = STEPS, o.batch = 2, o.seq = 16, o.global_batch = 2;
    o.warmup = 2, o.eval_every = 0, o.ckpt_minutes = 0, o.seed = dseed;
    o.quant_check_every = 1, o.quant_fallback_after = 0;
    o.progress = on_progress, o.progress_user = s;
    if (dw_train(e, &o) != DW_OK) fail_msg("%s %s: %s", recipe, arena ? "arena" : "pools", dw_errmsg(ctx));
    dw_model_free(m);
    dw_policy_free(pol);
}

static void test_skip_counts_once(void **state) {
    (void)state;
    const char *recipes[2] = {"fp8_block", "mxfp8"};
    for (int r = 0; r < 2; r++) {
        const uint64_t wseed = dw_test_next(&rng), dseed = dw_test_next(&rng) >> 1, elem = dw_test_next(&rng);
        const int64_t poison_at = 2 + (int64_t)(dw_test_next(&rng) % 2); /* step 3 or 4 skipped */
        poison s[2];
        char *out[2] = {NULL, NULL}, name[64];
        for (int a = 0; a < 2; a++) {
            snprintf(name, sizeof name, "%s-%s", recipes[r], a ? "arena" : "pools");
            out[a] = dw_test_path(dir, name);
            run(recipes[r], a == 1, wseed, dseed, poison_at, elem, out[a], &s[a]);
            assert_int_equal(s[a].skipped, 1);
            assert_non_null(s[a].why[poison_at + 1]);
            for (int64_t step = 2; step <= STEPS; step++) {
                if (step == poison_at + 1) continue; /* skipped: no check */
                int layers = 0;
                long long w_under = 0;
                if (dw_test_quant_counts_check(out[a], step, &layers, &w_under) != 0)
                    fail_msg("%s: step %lld (step %lld skipped)", name, (long long)step, (long long)poison_at + 1);
                assert_int_equal(layers, 14); /* 2 blocks x 7 linear layers */
            }
        }
        for (int64_t step = 1; step <= STEPS; step++)
            if (memcmp(&s[0].loss[step], &s[1].loss[step], sizeof(double)))
                fail_msg("%s step %lld: loss %.17g (pools) vs %.17g (arena)", recipes[r], (long long)step,
                         s[0].loss[step], s[1].loss[step]);
        json_t *qs[2];
        for (int a = 0; a < 2; a++) {
            char *p = dw_test_path(out[a], "quant_stats.jsonl");
            qs[a] = dw_test_json_lines(p);
            assert_non_null(qs[a]);
            free(p);
        }
        if (!json_equal(qs[0], qs[1]))
            fail_msg("%s: quant_stats.jsonl differs between the pools (%zu lines) and the arena (%zu)", recipes[r],
                     json_array_size(qs[0]), json_array_size(qs[1]));
        for (int a = 0; a < 2; a++) json_decref(qs[a]), free(out[a]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_skip_counts_once),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
