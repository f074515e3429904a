/* test_moe_counts.c — the MoE layers' routing counters (dw_engine_moe_counts; the trainer's
 * moe_dropped and per-step loads come from them), on mixtral-tiny's CPU engine with a capacity,
 * by position and by weight. The oracle: a forward (which does not count) reads each layer's
 * router choices; a training step on the same batch and weights must then add exactly N K
 * assignments, each expert's count of those choices, and sum_e max(0, count_e - cap) dropped
 * (cap = dw_moe_capacity) per layer; two micro-batches add up; validation-like forwards add
 * nothing; a dense model has no layers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "ir/ir.h"
#include "moe_route.h"
#include "runtime/engine.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)

/* The counters' growth of layer l over one training step, against the router's choices of a
 * forward on the same batch. */
static int64_t check_step(dw_test_model *m, const int32_t *x, const int32_t *y, int64_t B, int64_t T, double factor) {
    int64_t L, E;
    assert_int_equal(dw_engine_moe_counts(m->e, &L, &E, NULL), DW_OK);
    const int64_t W = 2 + E, N = B * T;
    int64_t *before = calloc((size_t)(L * W), 8), *after = calloc((size_t)(L * W), 8), *want = calloc((size_t)(L * W), 8);
    double loss;
    assert_int_equal(dw_engine_moe_counts(m->e, NULL, NULL, before), DW_OK);
    assert_int_equal(dw_engine_forward(m->e, x, y, B, T, NULL, &loss), DW_OK);
    assert_int_equal(dw_engine_moe_counts(m->e, NULL, NULL, after), DW_OK);
    int64_t bad = memcmp(before, after, (size_t)(L * W) * 8) != 0; /* a forward counts nothing */
    if (bad) fprintf(stderr, "a forward changed the counters\n");
    for (int64_t l = 0; l < L; l++) { /* the oracle from the forward's choices */
        char name[96];
        snprintf(name, sizeof name, "model.layers.%lld.mlp.router.experts", (long long)l);
        const int t = dw_graph_find_tensor(m->g, name);
        assert_true(t >= 0);
        const int64_t K = m->g->tensors[t].shape[2], cap = dw_moe_capacity(factor, N, K, E);
        float *idx = malloc((size_t)(N * K) * sizeof *idx);
        assert_int_equal(dw_engine_read_value(m->e, t, idx), DW_OK);
        int64_t *w = want + l * W;
        w[0] = N * K;
        for (int64_t a = 0; a < N * K; a++) w[2 + (int64_t)idx[a]]++;
        for (int64_t e = 0; e < E; e++) w[1] += w[2 + e] > cap ? w[2 + e] - cap : 0;
        free(idx);
    }
    assert_int_equal(dw_engine_zero_grad(m->e), DW_OK);
    assert_int_equal(dw_engine_forward_backward(m->e, x, y, B, T, 1.0, &loss), DW_OK);
    assert_int_equal(dw_engine_moe_counts(m->e, NULL, NULL, after), DW_OK);
    for (int64_t i = 0; i < L * W; i++)
        if (after[i] - before[i] != want[i]) {
            fprintf(stderr, "layer %lld counter %lld: grew by %lld, want %lld\n", (long long)(i / W),
                    (long long)(i % W), (long long)(after[i] - before[i]), (long long)want[i]);
            bad++;
        }
    free(before), free(after), free(want);
    return bad;
}

static void run_policy(bool by_weight) {
    const int64_t B = 2, T = 8;
    dw_test_model m;
    dw_test_moe_tiny(CTX, 0.5, by_weight, B, T, *RNG, &m);
    dw_model_config c;
    assert_int_equal(dw_model_config_load(CTX, "mixtral-tiny", &c), DW_OK);
    c.capacity_factor = 0.5;
    int64_t L, E, bad = 0;
    assert_int_equal(dw_engine_moe_counts(m.e, &L, &E, NULL), DW_OK);
    assert_int_equal(L, c.n_layers);
    assert_int_equal(E, c.n_experts);
    int64_t dropped = 0;
    for (int mb = 0; mb < 2; mb++) { /* two micro-batches: the counters keep adding */
        int32_t x[16], y[16];
        dw_test_random_tokens(x, B * T, 256, RNG);
        dw_test_random_tokens(y, B * T, 256, RNG);
        bad += check_step(&m, x, y, B, T, c.capacity_factor);
    }
    int64_t *all = calloc((size_t)(L * (2 + E)), 8);
    assert_int_equal(dw_engine_moe_counts(m.e, NULL, NULL, all), DW_OK);
    for (int64_t l = 0; l < L; l++) {
        assert_int_equal(all[l * (2 + E)], 2 * B * T * c.top_k);
        dropped += all[l * (2 + E) + 1];
    }
    assert_true(dropped > 0); /* factor 0.5 always drops: half the mean load */
    free(all);
    dw_test_model_free(&m);
    assert_int_equal(bad, 0);
}

static void test_counts_by_position(void **state) { (void)state, run_policy(false); }
static void test_counts_by_weight(void **state) { (void)state, run_policy(true); }

static void test_dense_has_none(void **state) {
    (void)state;
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_hf_shape(CTX, "llama-tiny", 1, 8, &g), DW_OK);
    dw_test_model m;
    assert_int_equal(dw_test_model_build(CTX, g, NULL, DW_DEVICE_AUTO, &m), DW_OK);
    int64_t L = -1, E = -1, one = 7;
    assert_int_equal(dw_engine_moe_counts(m.e, &L, &E, &one), DW_OK);
    assert_int_equal(L, 0);
    assert_int_equal(E, 0);
    assert_int_equal(one, 7); /* nothing written */
    dw_test_model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_by_position),
        cmocka_unit_test(test_counts_by_weight),
        cmocka_unit_test(test_dense_has_none),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
