/* test_moe_drop.c — MoE token dropping by weight (config.json moe_token_drop_policy "probs"). The
 * CPU dispatch against a brute-force oracle written here (assignment a is kept iff fewer than cap
 * assignments of its expert outrank it: a heavier weight, or an equal one earlier in (token, k)
 * order; kept rows packed expert by expert in (token, k) order), exact on fresh random sizes and
 * weights with many ties, skewed and single-token routing. Through capture and the CPU engine
 * (mixtral-tiny): the dispatch reads the router's weights; with nothing dropped the loss and every
 * parameter gradient equal the position policy's bit for bit (the weights' extra reader adds
 * nothing to their gradient); with drops the two policies' losses differ. (The config key:
 * test_moe_capacity.c.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "ir/ir.h"
#include "kernels/cpu/ops_cpu.h"
#include "moe_route.h"
#include "opcheck.h"
#include "runtime/engine.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)

/* The brute-force oracle: want_pos (A), want_off (E+1). */
static void oracle(const int32_t *idx, const float *w, int64_t A, int64_t E, int64_t cap, int32_t *want_pos,
                   int32_t *want_off) {
    int64_t kept[64] = {0}, next[64] = {0};
    bool *keep = calloc((size_t)A, 1);
    for (int64_t a = 0; a < A; a++) {
        int64_t above = 0;
        for (int64_t b = 0; b < A; b++)
            above += idx[b] == idx[a] && (w[b] > w[a] || (w[b] == w[a] && b < a));
        keep[a] = above < cap;
        kept[idx[a]] += keep[a];
    }
    want_off[0] = 0;
    for (int64_t e = 0; e < E; e++) want_off[e + 1] = want_off[e] + (int32_t)kept[e];
    for (int64_t a = 0; a < A; a++) want_pos[a] = keep[a] ? want_off[idx[a]] + (int32_t)next[idx[a]]++ : -1;
    free(keep);
}

static int64_t run_dispatch(int64_t N, int64_t C, int64_t K, int64_t E, double factor, bool skew, int levels) {
    const int64_t A = N * K, cap = dw_moe_capacity(factor, N, K, E);
    float *x = dw_oc_alloc(N * C), *xs = dw_oc_alloc(A * C), *w = dw_oc_alloc(A);
    int32_t *idx = dw_test_moe_routing(RNG, N, K, E, skew ? 2 : 0), *off = malloc((size_t)(E + 1) * 4);
    int32_t *pos = malloc((size_t)A * 4), *woff = malloc((size_t)(E + 1) * 4), *wpos = malloc((size_t)A * 4);
    dw_oc_fill(RNG, x, N * C, -1, 1);
    for (int64_t a = 0; a < A; a++) /* levels > 0: few distinct weights, so ties are common */
        w[a] = levels ? (float)(dw_test_next(RNG) % (uint64_t)levels) / (float)levels : dw_test_uniform(RNG, 0, 1);
    for (int64_t i = 0; i < A * C; i++) xs[i] = NAN;
    dw_cpu_moe_dispatch_fwd(xs, off, pos, x, idx, w, N, C, K, E, cap);
    oracle(idx, w, A, E, cap, wpos, woff);
    int64_t bad = dw_test_moe_check_dispatch(xs, off, pos, x, woff, wpos, N, C, K, E, cap);
    if (bad)
        fprintf(stderr, "dispatch by weight N=%lld C=%lld K=%lld E=%lld factor %g cap %lld levels %d: %lld bad\n",
                (long long)N, (long long)C, (long long)K, (long long)E, factor, (long long)cap, levels, (long long)bad);
    free(x), free(xs), free(w), free(idx), free(off), free(pos), free(woff), free(wpos);
    return bad;
}

static void test_dispatch_by_weight(void **state) {
    (void)state;
    static const double factors[] = {0.25, 0.5, 1.0, 1.5, 0.0};
    int64_t bad = 0;
    for (int rep = 0; rep < 4; rep++) {
        const int64_t E = dw_test_rnd(2, 9), K = dw_test_rnd(1, E), N = dw_test_rnd(1, 40), C = dw_test_rnd(1, 7);
        for (size_t f = 0; f < sizeof factors / sizeof factors[0]; f++)
            for (int skew = 0; skew < 2; skew++) {
                bad += run_dispatch(N, C, K, E, factors[f], skew, 0);
                bad += run_dispatch(N, C, K, E, factors[f], skew, 3);
            }
        bad += run_dispatch(1, C, K, E, 0.5, true, 2); /* a single token */
    }
    assert_int_equal(bad, 0);
}

/* The oracle itself must tell the policies apart: on a routing that drops, keeping by weight keeps a
 * heavier assignment that position drops. */
static void test_policies_differ(void **state) {
    (void)state;
    const int32_t idx[4] = {0, 0, 0, 1}; /* N 4, K 1, E 2: three on expert 0 */
    const float w[4] = {0.1f, 0.2f, 0.9f, 0.5f}, x[4] = {1, 2, 3, 4};
    float xs[4];
    int32_t off[3], pos[4];
    dw_cpu_moe_dispatch_fwd(xs, off, pos, x, idx, w, 4, 1, 1, 2, 2); /* cap 2: tokens 2 and 1 stay */
    const int32_t want[4] = {-1, 0, 1, 2};
    for (int a = 0; a < 4; a++) assert_int_equal(pos[a], want[a]);
    assert_true(xs[0] == 2 && xs[1] == 3 && xs[2] == 4);
    dw_cpu_moe_dispatch_fwd(xs, off, pos, x, idx, NULL, 4, 1, 1, 2, 2); /* by position: tokens 0 and 1 */
    assert_int_equal(pos[2], -1);
    assert_int_equal(pos[0], 0);
}

/* The engine's index of the parameter named name. */
static int param_index(const dw_engine *e, const char *name) {
    for (int i = 0; i < dw_engine_param_count(e); i++)
        if (!strcmp(dw_engine_param_name(e, i), name)) return i;
    fail_msg("no parameter %s", name);
    return -1;
}

static void build(double factor, bool by_weight, int64_t B, int64_t T, dw_test_rng r, dw_test_model *m) {
    dw_test_moe_tiny(CTX, factor, by_weight, B, T, r, m);
}

static void test_engine_by_weight(void **state) {
    (void)state;
    const int64_t B = 2, T = 8;
    int32_t x[16], y[16];
    dw_test_random_tokens(x, B * T, 256, RNG);
    dw_test_random_tokens(y, B * T, 256, RNG);
    const dw_test_rng weights = *RNG;
    const char *params[3] = {"model.layers.1.mlp.gate.weight", "model.layers.0.mlp.experts.up_proj",
                             "model.layers.0.input_layernorm.weight"};
    double loss[2];
    float *grad[2][3];
    for (int k = 0; k < 2; k++) { /* factor 1000 drops nothing: the two policies agree bit for bit */
        dw_test_model m;
        build(1000.0, k == 1, B, T, weights, &m);
        assert_int_equal(dw_engine_zero_grad(m.e), DW_OK);
        assert_int_equal(dw_engine_forward_backward(m.e, x, y, B, T, 1.0, &loss[k]), DW_OK);
        for (int p = 0; p < 3; p++) {
            const int64_t n = dw_ir_numel(&m.g->tensors[dw_graph_find_tensor(m.g, params[p])]);
            grad[k][p] = malloc((size_t)n * sizeof(float));
            assert_int_equal(dw_engine_grad_read(m.e, param_index(m.e, params[p]), grad[k][p]), DW_OK);
            if (k == 1 && memcmp(grad[0][p], grad[1][p], (size_t)n * sizeof(float)))
                fail_msg("%s: the gradient differs between the policies without drops", params[p]);
        }
        dw_test_model_free(&m);
    }
    if (loss[1] != loss[0]) fail_msg("no drops: by weight %.9g != by position %.9g", loss[1], loss[0]);
    for (int k = 0; k < 2; k++)
        for (int p = 0; p < 3; p++) free(grad[k][p]);
    for (int k = 0; k < 2; k++) { /* factor 0.25: a row per expert, the policies keep different ones */
        dw_test_model m;
        build(0.25, k == 1, B, T, weights, &m);
        assert_int_equal(dw_engine_forward(m.e, x, y, B, T, NULL, &loss[k]), DW_OK);
        dw_test_model_free(&m);
    }
    if (!(fabs(loss[1] - loss[0]) > 1e-7)) fail_msg("factor 0.25: by weight %.9g == by position %.9g", loss[1], loss[0]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dispatch_by_weight), cmocka_unit_test(test_policies_differ),
        cmocka_unit_test(test_engine_by_weight),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
