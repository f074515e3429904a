/* test_dp_buckets.c — the gradient buckets of data parallelism (src/train/dp_buckets.c), against
 * what a training step really does: on the CPU engine, random weights and tokens, the forward and
 * backward steps run one by one with the gradient pool compared after each, so the oracle is the
 * last step that changed any float of each parameter; a bucket must be planned ready exactly at the
 * last such step over the parameters it overlaps (earlier would reduce unfinished gradients, later
 * would give away overlap; a parameter whose writer the step list does not show, as a fused LM
 * head's, waits for the last step). Dense and MoE presets, with and without recompute (forwards run again
 * inside the backward sweep) and the fused LM head (its weight gradient written by the loss's forward), random bucket sizes; the buckets tile the pool in 64-float-aligned
 * pieces no larger than asked, in the order they start (ready, then from the pool's end). Also
 * DW_DP_BUCKET_FLOATS is read strictly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "compile/program.h"
#include "runtime/engine.h"
#include "testutil.h"
#include "train/dp.h"

#define CTX dw_test_ctx

/* *last_change: (n_params) the last program step that changed a float of each parameter's
 * gradient in one training step (-1: none did). */
static void observe(dw_test_model *m, int64_t B, int64_t T, int *last_change) {
    dw_engine *e = m->e;
    const dw_compiled *p = m->c;
    dw_test_random_params(e, &dw_test_group_rng, 0.5f, NULL, 0);
    int32_t *x = malloc((size_t)(B * T) * sizeof *x), *y = malloc((size_t)(B * T) * sizeof *y);
    float *before = malloc((size_t)p->param_floats * sizeof *before);
    assert_non_null(x), assert_non_null(y), assert_non_null(before);
    dw_test_random_tokens(x, B * T, e->g->model.vocab, &dw_test_group_rng);
    dw_test_random_tokens(y, B * T, e->g->model.vocab, &dw_test_group_rng);
    assert_int_equal(dw_engine_zero_grad(e), DW_OK);
    assert_int_equal(dw_exec_set_batch(e->x, x, y, B, T), DW_OK);
    for (int k = 0; k < p->n_params; k++) last_change[k] = -1;
    for (int ph = DW_PHASE_FORWARD; ph <= DW_PHASE_BACKWARD; ph++) {
        dw_exec_begin_phase(e->x, (dw_phase)ph);
        for (int s = p->phase[ph][0]; s < p->phase[ph][1]; s++) {
            memcpy(before, e->x->grad, (size_t)p->param_floats * sizeof *before);
            assert_int_equal(dw_exec_step(e->x, s, true, 1.0), DW_OK);
            for (int k = 0; k < p->n_params; k++) {
                const int64_t off = p->param_off[k], n = dw_ir_numel(&p->g->tensors[p->param_tensor[k]]);
                if (memcmp(before + off, e->x->grad + off, (size_t)n * sizeof(float))) last_change[k] = s;
            }
        }
    }
    free(x), free(y), free(before);
}

static void check_preset(const char *preset, int recompute, bool fused_head) {
    const int64_t B = dw_test_rnd(1, 2), T = dw_test_rnd(4, 16);
    dw_model_config mc;
    assert_int_equal(dw_model_config_load(CTX, preset, &mc), DW_OK);
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_config(CTX, &mc, B, T, &g), DW_OK);
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.recompute = recompute, o.fused_head = fused_head; /* the fused head's dW: written in its forward */
    dw_test_model m;
    assert_int_equal(dw_test_model_build_opts(CTX, g, NULL, &o, &m), DW_OK);
    const dw_compiled *p = m.c;
    int *last = malloc((size_t)p->n_params * sizeof *last);
    assert_non_null(last);
    observe(&m, B, T, last);
    /* a size from a few buckets per parameter to the whole pool in one */
    const int64_t want = dw_test_rnd(1, p->param_floats / 4 + 64), size = (want + 63) / 64 * 64;
    dw_dp_buckets bk;
    assert_int_equal(dw_dp_buckets_plan(CTX, p, want, &bk), DW_OK);
    assert_int_equal(bk.n, (int)((p->param_floats + size - 1) / size));
    char *covered = calloc((size_t)p->param_floats, 1);
    assert_non_null(covered);
    int early = 0, exact = 0;
    for (int i = 0; i < bk.n; i++) {
        const dw_dp_bucket *b = &bk.b[i];
        assert_true(b->begin >= 0 && b->begin < b->end && b->end <= p->param_floats && b->end - b->begin <= size);
        assert_true(b->begin % 64 == 0 && b->end % 64 == 0);
        for (int64_t f = b->begin; f < b->end; f++) assert_int_equal(covered[f]++, 0);
        int oracle = -1; /* the last change over the parameters the bucket overlaps */
        for (int k = 0; k < p->n_params; k++) {
            const int64_t lo = p->param_off[k], hi = lo + dw_ir_numel(&p->g->tensors[p->param_tensor[k]]);
            if (lo < b->end && hi > b->begin && last[k] > oracle) oracle = last[k];
        }
        /* never before the last change; after it only as the conservative last step (a parameter whose
         * writer the step list does not show) */
        if (b->ready < oracle || (b->ready != oracle && b->ready != p->phase[DW_PHASE_BACKWARD][1] - 1))
            fail_msg("%s (recompute %d): bucket [%lld, %lld) planned ready after step %d, its gradients last change "
                     "at step %d", preset, recompute, (long long)b->begin, (long long)b->end, b->ready, oracle);
        exact += b->ready == oracle && oracle < p->phase[DW_PHASE_BACKWARD][1] - 1;
        if (i > 0) { /* starting order */
            const dw_dp_bucket *a = &bk.b[i - 1];
            assert_true(a->ready < b->ready || (a->ready == b->ready && a->begin > b->begin));
        }
        early += b->ready < p->phase[DW_PHASE_BACKWARD][1] - 1;
    }
    for (int64_t f = 0; f < p->param_floats; f++) assert_int_equal(covered[f], 1);
    if (bk.n > 4) assert_true(exact > 0); /* not every bucket at the conservative end */
    if (bk.n > 4) assert_true(early > 0); /* some buckets can overlap the rest of backward */
    free(covered);
    free(last);
    dw_dp_buckets_free(&bk);
    dw_dp_buckets_free(&bk); /* harmless twice */
    dw_test_model_free(&m);
}

static void test_dense(void **state) {
    (void)state;
    for (int rep = 0; rep < 3; rep++) {
        check_preset("gpt2-tiny", DW_RECOMPUTE_NONE, rep == 2);
        check_preset("llama-tiny", rep == 1 ? DW_RECOMPUTE_FULL : DW_RECOMPUTE_NONE, false);
        check_preset("llama-tiny", rep == 1 ? DW_RECOMPUTE_FULL : DW_RECOMPUTE_NONE, true); /* an untied head */
    }
}

static void test_moe(void **state) {
    (void)state;
    check_preset("mixtral-tiny", DW_RECOMPUTE_NONE, false);
    check_preset("mixtral-tiny", DW_RECOMPUTE_FULL, true);
}

static void test_bucket_env(void **state) {
    (void)state;
    int64_t n = 0;
    unsetenv("DW_DP_BUCKET_FLOATS");
    for (int zero = 0; zero <= 3; zero++) { /* ZeRO-0/1: views of the pool; ZeRO-2/3: staging slots */
        assert_int_equal(dw_dp_bucket_floats(CTX, zero, &n), DW_OK);
        assert_int_equal(n, zero >= 2 ? 4 << 20 : 64 << 20);
    }
    const char *bad[] = {"0", "-5", "12x", "abc"}; /* "" is unset (dw_env) */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("DW_DP_BUCKET_FLOATS", bad[i], 1);
        assert_int_equal(dw_dp_bucket_floats(CTX, 0, &n), DW_ERR_INVALID);
        assert_non_null(strstr(dw_errmsg(CTX), "DW_DP_BUCKET_FLOATS"));
    }
    setenv("DW_DP_BUCKET_FLOATS", "1000", 1);
    assert_int_equal(dw_dp_bucket_floats(CTX, 0, &n), DW_OK);
    assert_int_equal(n, 1000);
    unsetenv("DW_DP_BUCKET_FLOATS");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense),
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_bucket_env),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
