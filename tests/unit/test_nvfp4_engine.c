/* test_nvfp4_engine.c — the NVFP4 training recipe inside the CPU engine (runtime/nvfp4_operand.h,
 * runtime/cpu/ops_cpu_linear.c): llama-tiny and gpt2-tiny compiled with nvfp4 and one piece of
 * the recipe switched on at a time, against the same program with every piece off, on one fresh
 * random batch from the same weights:
 *  - Hadamard transform (wgrad only): the loss and every gradient except the quantised linear
 *    weights' are bit-identical (dgrad does not see it); each of those weight gradients that is
 *    not exactly zero differs;
 *  - stochastic rounding (dy): the loss is bit-identical, gradients differ; the same seed gives
 *    the same bits, another seed other bits;
 *  - 16x16 weight blocks: the forward changes (W itself is quantised differently), finitely;
 *  - all pieces with the default BF16 tail: a few AdamW steps lower the loss.
 * The quantiser itself is checked in test_nvfp4_rules/_2d/_sr; this shows the engine calls it. */
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
#include "precision/policy.h"
#include "testutil.h"

static dw_ctx *g_ctx;
static dw_test_rng g_rng;

typedef struct {
    dw_policy *pol;
    dw_compiled *c;
    dw_engine *e;
    double loss;
    float **grad;
} run;

enum { P_OFF, P_RHT, P_SR, P_2D, P_ALL };

/* g's program under nvfp4 with piece `piece` on (P_ALL: the default recipe), one forward-backward
 * from weights `seed` on tok/tgt. */
static run run_one(dw_graph *g, int piece, uint64_t rseed, uint64_t wseed, const int32_t *tok, const int32_t *tgt,
                   int64_t B, int64_t T) {
    run r = {0};
    assert_int_equal(dw_policy_from_precision(g_ctx, "nvfp4", false, &r.pol), DW_OK);
    if (piece != P_ALL)
        r.pol->nvfp4 = (dw_nvfp4_recipe){.rht = piece == P_RHT, .sr = piece == P_SR, .weight_2d = piece == P_2D,
                                         .seed = rseed};
    assert_int_equal(dw_compile(g_ctx, g, NULL, r.pol, NULL, &r.c), DW_OK);
    assert_int_equal(dw_engine_create(g_ctx, r.c, NULL, &r.e), DW_OK);
    assert_int_equal(dw_engine_init_weights(r.e, wseed), DW_OK);
    assert_int_equal(dw_engine_zero_grad(r.e), DW_OK);
    assert_int_equal(dw_engine_forward_backward(r.e, tok, tgt, B, T, 1.0, &r.loss), DW_OK);
    assert_true(isfinite(r.loss));
    const int n = dw_engine_param_count(r.e);
    r.grad = calloc((size_t)n, sizeof *r.grad);
    for (int i = 0; i < n; i++) {
        int64_t shape[4], numel = 1;
        const int nd = dw_engine_param_shape(r.e, i, shape);
        for (int d = 0; d < nd; d++) numel *= shape[d];
        r.grad[i] = malloc((size_t)numel * sizeof(float));
        assert_int_equal(dw_engine_grad_read(r.e, i, r.grad[i]), DW_OK);
    }
    return r;
}

static int64_t numel_of(dw_engine *e, int i) {
    int64_t shape[4], n = 1;
    const int nd = dw_engine_param_shape(e, i, shape);
    for (int d = 0; d < nd; d++) n *= shape[d];
    return n;
}

static void run_free(run *r) {
    for (int i = 0; r->e && i < dw_engine_param_count(r->e); i++) free(r->grad[i]);
    free(r->grad);
    dw_engine_free(r->e);
    dw_compiled_free(r->c);
    dw_policy_free(r->pol);
}

/* Whether parameter i is the weight of a linear node whose wgrad runs quantised. */
static bool quantised_weight(const run *r, const dw_graph *g, int i) {
    const char *name = dw_engine_param_name(r->e, i);
    for (int k = 0; k < g->n_nodes; k++)
        if (g->nodes[k].op == DW_OP_LINEAR && r->c->node[k].bind.quantised[DW_QPASS_WGRAD] &&
            !strcmp(g->tensors[g->nodes[k].in[1]].name, name))
            return true;
    return false;
}

static bool grads_equal(const run *a, const run *b, int i) {
    return !memcmp(a->grad[i], b->grad[i], (size_t)numel_of(a->e, i) * sizeof(float));
}

static bool grad_zero(const run *r, int i) {
    for (int64_t j = 0; j < numel_of(r->e, i); j++)
        if (r->grad[i][j] != 0.0f) return false;
    return true;
}

static void test_pieces_in_the_engine(void **state) {
    (void)state;
    const char *presets[] = {"llama-tiny", "gpt2-tiny"};
    for (int pi = 0; pi < 2; pi++) {
        const int64_t B = 2, T = 16 + 8 * pi; /* 32 tokens: whole Hadamard blocks; 48 */
        dw_graph *g = dw_test_small_graph(g_ctx, presets[pi], B, T, &g_rng);
        assert_non_null(g);
        int32_t tok[64], tgt[64];
        dw_test_random_tokens(tok, B * T, dw_graph_vocab(g), &g_rng);
        dw_test_random_tokens(tgt, B * T, dw_graph_vocab(g), &g_rng);
        const uint64_t w = dw_test_next(&g_rng), s1 = dw_test_next(&g_rng), s2 = s1 ^ 0x9E3779B97F4A7C15ull;
        run off = run_one(g, P_OFF, s1, w, tok, tgt, B, T), rht = run_one(g, P_RHT, s1, w, tok, tgt, B, T);
        run sr = run_one(g, P_SR, s1, w, tok, tgt, B, T), sr_again = run_one(g, P_SR, s1, w, tok, tgt, B, T);
        run sr_other = run_one(g, P_SR, s2, w, tok, tgt, B, T), two_d = run_one(g, P_2D, s1, w, tok, tgt, B, T);
        print_message("%s: loss off %.6f, rht %.6f, sr %.6f, 2d %.6f\n", presets[pi], off.loss, rht.loss, sr.loss, two_d.loss);
        assert_true(off.loss == rht.loss && off.loss == sr.loss);
        assert_true(two_d.loss != off.loss && fabs(two_d.loss - off.loss) < 0.05 * off.loss);
        /* A quantised weight whose gradient is exactly zero without the transform (gpt2-tiny with
         * width 2: a LayerNorm over two features is flat, so the last block's residual gradient
         * rounds to zero) keeps it with the transform; every other one must change. */
        int qw = 0, rht_differs = 0, sr_differs = 0;
        for (int i = 0; i < dw_engine_param_count(off.e); i++) {
            const bool q = quantised_weight(&off, g, i) && !grad_zero(&off, i);
            qw += q;
            if (q) rht_differs += !grads_equal(&off, &rht, i);
            else if (!grads_equal(&off, &rht, i))
                fail_msg("%s: %s's gradient changed with the wgrad's Hadamard transform", presets[pi], dw_engine_param_name(off.e, i));
            sr_differs += !grads_equal(&off, &sr, i);
            if (!grads_equal(&sr, &sr_again, i)) fail_msg("%s: %s: stochastic rounding not reproducible", presets[pi], dw_engine_param_name(off.e, i));
        }
        assert_true(qw > 0);
        assert_int_equal(rht_differs, qw);
        assert_true(sr_differs > 0);
        int other = 0;
        for (int i = 0; i < dw_engine_param_count(off.e); i++) other += !grads_equal(&sr, &sr_other, i);
        assert_true(other > 0);
        run_free(&off), run_free(&rht), run_free(&sr), run_free(&sr_again), run_free(&sr_other), run_free(&two_d);
        /* the default recipe trains */
        run all = run_one(g, P_ALL, 0, w, tok, tgt, B, T);
        dw_adamw_opts o;
        dw_adamw_opts_init(&o, sizeof o);
        o.lr = 1e-2;
        double first = all.loss, last = first, norm;
        for (int s = 1; s <= 8; s++) {
            assert_int_equal(dw_engine_step(all.e, &o, s, &norm), DW_OK);
            assert_int_equal(dw_engine_zero_grad(all.e), DW_OK);
            assert_int_equal(dw_engine_forward_backward(all.e, tok, tgt, B, T, 1.0, &last), DW_OK);
            assert_true(isfinite(last));
        }
        print_message("%s: default recipe, loss %.4f -> %.4f over 8 steps\n", presets[pi], first, last);
        assert_true(last < first - 0.02);
        run_free(&all);
        dw_graph_free(g);
    }
}

static int setup(void **state) {
    (void)state;
    const dw_ctx_opts o = {.device = DW_DEVICE_CPU};
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0xE4Full);
    return dw_ctx_create(&o, &g_ctx) == DW_OK ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    dw_ctx_free(g_ctx);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_pieces_in_the_engine)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
