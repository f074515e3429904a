/* test_spike_train.c — loss-spike rollback (train/spike.c, dw_train_opts.spike_zscore) on the CPU
 * engine through the public API. The data comes from next_batch: two fresh random windows, the
 * same every step (the loss falls step after step), except that the two micro-batches of step 9
 * are fresh random tokens. That step's loss spikes: exactly one rollback, to the checkpoint of
 * step 6, "rollback" in metrics.jsonl; the batches taken after it are 12..15 again, then 18..
 * (the garbage never again), and the final weights equal, bit for bit, those of a run whose data
 * never held the garbage. The spike detector alone: z-scores against a brute-force oracle, the
 * state's JSON round trip. Refusals: bad option values, a spike with no checkpoint to go back to,
 * and --max-rollbacks 0. */
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
#include "train/spike.h"

enum { B = 2, T = 16, V = 256, STEPS = 12, GARBAGE = 16 /* micro-batches 16, 17: step 9 */ };

static dw_ctx *ctx;
static dw_test_rng rng;
static char *dir, *model;
static int32_t windows[2][T + 1];

static int setup(void **state) {
    (void)state;
    dw_test_rng_init(&rng, dw_test_seed());
    for (int w = 0; w < 2; w++)
        for (int t = 0; t <= T; t++) windows[w][t] = (int32_t)(dw_test_next(&rng) % V);
    return dw_test_train_fixture(&ctx, &dir, &model, 1, 16, 32);
}
static int teardown(void **state) {
    (void)state;
    dw_test_train_fixture_close(ctx, dir, model);
    return 0;
}

typedef struct {
    bool garbage;  /* micro-batches GARBAGE, GARBAGE+1 are random tokens */
    bool shifted;  /* index k >= GARBAGE reads what k + 2 holds (the data without the garbage) */
    int64_t n, idx[64];
} feed;

/* Micro-batch k: the two windows, row order by k's parity. */
static void fill(int64_t k, int32_t *tokens, int32_t *targets) {
    for (int r = 0; r < B; r++) {
        const int32_t *w = windows[(k + r) % 2];
        memcpy(tokens + r * T, w, T * sizeof *w);
        memcpy(targets + r * T, w + 1, T * sizeof *w);
    }
}

static int next_batch(void *user, int64_t index, int32_t *tokens, int32_t *targets, int64_t b, int64_t t) {
    feed *f = user;
    (void)b, (void)t;
    if (f->n < 64) f->idx[f->n] = index;
    f->n++;
    if (f->garbage && (index == GARBAGE || index == GARBAGE + 1)) {
        dw_test_random_tokens(tokens, B * T, V, &rng);
        dw_test_random_tokens(targets, B * T, V, &rng);
        return 0;
    }
    fill(f->shifted && index >= GARBAGE ? index + 2 : index, tokens, targets);
    return 0;
}

static dw_model *open_model(void) {
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.batch = B;
    mo.seq = T;
    mo.weights = DW_WEIGHTS_RANDOM;
    mo.seed = 11;
    dw_model *m = NULL;
    if (dw_model_open(ctx, model, &mo, &m) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    return m;
}

static void opts_for(dw_train_opts *o, const char *out, feed *f) {
    dw_train_opts_init(o, sizeof *o);
    o->out_dir = out;
    o->steps = STEPS;
    o->batch = B;
    o->seq = T;
    o->global_batch = 2 * B; /* two micro-batches a step */
    o->lr = 3e-3;
    o->warmup = 0;
    o->schedule = DW_LR_COSINE; /* the step number matters: a wrong step after the rollback shows */
    o->eval_every = 0;
    o->ckpt_every = 3;
    o->ckpt_minutes = 0;
    o->keep = 0;
    o->next_batch = next_batch;
    o->batch_user = f;
    o->spike_zscore = 3;
    o->spike_window = 4;
}

/* The run's parameters, concatenated (malloc'd); *n floats. */
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

static int count_rollbacks(const char *run, char *line, size_t cap) {
    char *path = dw_test_path(run, "metrics.jsonl");
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char buf[4096];
    int n = 0;
    while (fgets(buf, sizeof buf, f))
        if (strstr(buf, "\"rollback\"")) {
            n++;
            if (line) snprintf(line, cap, "%s", buf);
        }
    fclose(f);
    free(path);
    return n;
}

static void test_rollback_skips_the_batch(void **state) {
    (void)state;
    char *ra = dw_test_path(dir, "spiked"), *rb = dw_test_path(dir, "clean");
    feed a = {.garbage = true}, b = {.shifted = true};
    dw_train_opts o;
    dw_model *ma = open_model(), *mb = open_model();
    opts_for(&o, ra, &a);
    assert_int_equal(dw_train(dw_model_engine(ma), &o), DW_OK);
    opts_for(&o, rb, &b);
    assert_int_equal(dw_train(dw_model_engine(mb), &o), DW_OK);

    char line[4096] = "";
    assert_int_equal(count_rollbacks(rb, NULL, 0), 0);
    assert_int_equal(count_rollbacks(ra, line, sizeof line), 1);
    assert_non_null(strstr(line, "{\"step\": 6, \"rollback\": {\"step\": 9,"));
    assert_non_null(strstr(line, "ckpt-6\""));
    assert_non_null(strstr(line, "\"skip\": [16, 18]"));
    /* taken: 0..17 (step 9 the garbage), then from the checkpoint of step 6: 12..15, 18..25 */
    int64_t want[64], n = 0;
    for (int64_t k = 0; k < 18; k++) want[n++] = k;
    for (int64_t k = 12; k < 16; k++) want[n++] = k;
    for (int64_t k = 18; k < 26; k++) want[n++] = k;
    assert_int_equal(a.n, n);
    for (int64_t i = 0; i < n; i++) assert_int_equal(a.idx[i], want[i]);
    assert_int_equal(b.n, 2 * STEPS);

    int64_t na = 0, nb = 0;
    float *pa = params(dw_model_engine(ma), &na), *pb = params(dw_model_engine(mb), &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(pa, pb, (size_t)na * sizeof *pa); /* bit for bit */
    free(pa), free(pb);
    dw_model_free(ma), dw_model_free(mb);
    free(ra), free(rb);
}

static void test_stops(void **state) {
    (void)state;
    char *r0 = dw_test_path(dir, "no-rollbacks"), *r1 = dw_test_path(dir, "no-ckpt");
    feed a = {.garbage = true}, c = {.garbage = true};
    dw_train_opts o;
    dw_model *m = open_model();
    opts_for(&o, r0, &a);
    o.max_rollbacks = 0;
    assert_int_equal(dw_train(dw_model_engine(m), &o), DW_ERR_NUMERIC);
    assert_non_null(strstr(dw_errmsg(ctx), "step 9: loss spike"));
    assert_non_null(strstr(dw_errmsg(ctx), "--max-rollbacks 0"));
    assert_int_equal(a.n, 18); /* stopped at the spike */
    dw_model_free(m);
    m = open_model();
    opts_for(&o, r1, &c);
    o.ckpt_every = 0;
    assert_int_equal(dw_train(dw_model_engine(m), &o), DW_ERR_NUMERIC);
    assert_non_null(strstr(dw_errmsg(ctx), "no checkpoint to roll back to"));
    dw_model_free(m);
    free(r0), free(r1);
}

static void test_bad_options(void **state) {
    (void)state;
    char *r = dw_test_path(dir, "bad");
    feed f = {0};
    dw_model *m = open_model();
    const double z[] = {-1, NAN, INFINITY};
    for (int i = 0; i < 3; i++) {
        dw_train_opts o;
        opts_for(&o, r, &f);
        o.spike_zscore = z[i];
        assert_int_equal(dw_train(dw_model_engine(m), &o), DW_ERR_INVALID);
        assert_non_null(strstr(dw_errmsg(ctx), "--spike-zscore"));
    }
    dw_train_opts o;
    opts_for(&o, r, &f);
    o.spike_window = 1;
    assert_int_equal(dw_train(dw_model_engine(m), &o), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "--spike-window 1"));
    opts_for(&o, r, &f);
    o.max_rollbacks = -1;
    assert_int_equal(dw_train(dw_model_engine(m), &o), DW_ERR_INVALID);
    assert_int_equal(f.n, 0);
    dw_model_free(m);
    free(r);
}

/* z-scores against a direct computation over the last W values; the JSON round trip. */
static void test_detector(void **state) {
    (void)state;
    for (int trial = 0; trial < 20; trial++) {
        const int64_t W = dw_test_rnd(2, 9), n = dw_test_rnd(0, 30);
        double v[40];
        dw_spike s, t;
        assert_int_equal(dw_spike_init(ctx, &s, 2.5, W, 3), DW_OK);
        assert_int_equal(dw_spike_init(ctx, &t, 2.5, W, 3), DW_OK);
        for (int64_t i = 0; i < n; i++) v[i] = 3 + dw_test_normal(&rng), dw_spike_push(&s, v[i]);
        const double x = 3 + 4 * dw_test_normal(&rng);
        double z = 0;
        const bool spike = dw_spike_test(&s, x, &z);
        if (n < W) {
            assert_false(spike);
            assert_true(isnan(z));
        } else {
            double mean = 0, var = 0;
            for (int64_t i = n - W; i < n; i++) mean += v[i];
            mean /= (double)W;
            for (int64_t i = n - W; i < n; i++) var += (v[i] - mean) * (v[i] - mean);
            const double want = (x - mean) / sqrt(var / (double)W);
            assert_true(fabs(z - want) <= 1e-12 * (1 + fabs(want)));
            assert_int_equal(spike, want > 2.5);
        }
        assert_int_equal(dw_spike_add_skip(ctx, &s, 40, 44), DW_OK);
        char *text = dw_spike_state_json(&s);
        json_t *j = json_loads(text, 0, NULL);
        assert_non_null(j);
        assert_int_equal(dw_spike_state_load(ctx, &t, j, "test"), DW_OK);
        double z2 = 0;
        assert_int_equal(dw_spike_test(&t, x, &z2), spike);
        assert_memory_equal(&z, &z2, sizeof z); /* hex floats: exact */
        uint64_t to = 0;
        assert_false(dw_spike_take_skip(&t, 41, &to));
        assert_true(dw_spike_take_skip(&t, 40, &to));
        assert_int_equal(to, 44);
        assert_false(dw_spike_take_skip(&t, 40, &to));
        json_decref(j);
        free(text);
        dw_spike_free(&s), dw_spike_free(&t);
    }
    dw_spike s;
    assert_int_equal(dw_spike_init(ctx, &s, 2, 3, 1), DW_OK);
    json_t *bad = json_loads("{\"window\": [\"1.5\", \"zz\"], \"skip\": []}", 0, NULL);
    assert_int_equal(dw_spike_state_load(ctx, &s, bad, "state.json"), DW_ERR_FORMAT);
    assert_non_null(strstr(dw_errmsg(ctx), "state.json"));
    json_decref(bad);
    dw_spike_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detector),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_rollback_skips_the_batch),
        cmocka_unit_test(test_stops),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
