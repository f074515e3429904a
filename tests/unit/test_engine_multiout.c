/* test_engine_multiout.c — a node with two outputs through the whole pipeline, on the CPU engine:
 * the MoE router (weights and int32 experts) in dw_test_router_graph. The graph survives its JSON
 * round trip; the compiled program gives the int32 output 4-byte storage and no gradient in FP32
 * and BF16 programs alike; the forward's experts and weights equal the reference kernel's on the
 * logits the engine stored; the FP32 program's gradients through the router equal central
 * differences of its own loss; and a few AdamW steps lower the loss in FP32 and BF16. */
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
#include "formats/formats.h"
#include "kernels/cpu/ops_cpu.h"
#include "runtime/engine.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)

static void test_json_round_trip(void **state) {
    (void)state;
    for (int score = 0; score < 2; score++) {
        int r = -1;
        dw_graph *g = dw_test_router_graph(CTX, 2, 5, RNG, score, score == 0, false, &r);
        assert_non_null(g);
        assert_int_equal(g->nodes[r].n_out, 2);
        assert_int_equal(g->tensors[g->nodes[r].out[1]].dtype, DW_IR_I32);
        char *text = NULL;
        assert_int_equal(dw_graph_to_json(CTX, g, false, &text), DW_OK);
        dw_graph *h = NULL;
        assert_int_equal(dw_graph_from_json(CTX, text, strlen(text), "round trip", &h), DW_OK);
        char *again = NULL;
        assert_int_equal(dw_graph_to_json(CTX, h, false, &again), DW_OK);
        assert_string_equal(text, again);
        assert_non_null(strstr(text, "\"outputs\""));
        /* a recorded output count that does not fit the op is refused, naming the field */
        char *bad = strdup(text), *at = strstr(bad, "\"outputs\"");
        memcpy(at, "\"outputz\"", 9);
        dw_graph *x = NULL;
        assert_int_equal(dw_graph_from_json(CTX, bad, strlen(bad), "bad.json", &x), DW_ERR_FORMAT);
        assert_non_null(strstr(dw_errmsg(CTX), "outputs"));
        free(bad), free(text), free(again);
        dw_graph_free(h), dw_graph_free(g);
    }
}

static void test_program(void **state) {
    (void)state;
    for (int bf16 = 0; bf16 < 2; bf16++) {
        int r = -1;
        dw_graph *g = dw_test_router_graph(CTX, 2, 6, RNG, 0, true, false, &r);
        assert_non_null(g);
        dw_test_model m;
        assert_int_equal(dw_test_model_build(CTX, g, bf16 ? "bf16" : NULL, DW_DEVICE_AUTO, &m), DW_OK);
        const int w = g->nodes[r].out[0], ex = g->nodes[r].out[1];
        const dw_compiled *c = m.c;
        assert_true(c->tensor[ex].val_off >= 0 && c->tensor[w].val_off >= 0);
        assert_int_equal(c->tensor[ex].grad_off, -1); /* integers have no gradient */
        assert_true(c->tensor[w].grad_off >= 0);
        bool found = false;
        for (int i = 0; i < c->n_items; i++)
            if (c->info[i].kind == DW_BUF_VALUE && c->info[i].index == ex) {
                assert_int_equal(c->items[i].size, dw_ir_numel(&g->tensors[ex]) * 4);
                found = true;
            }
        assert_true(found);
        assert_int_equal(c->node[r + 1].grad_mode[0], DW_GRAD_WRITE); /* `up` writes dw */
        dw_test_model_free(&m);
    }
}

/* Forward: the engine's experts and weights are the reference kernel's on the stored logits. */
static void test_forward(void **state) {
    (void)state;
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int score = 0; score < 2; score++) {
            int r = -1;
            const int64_t B = 2, T = 7;
            dw_graph *g = dw_test_router_graph(CTX, B, T, RNG, score, score == 1, false, &r);
            assert_non_null(g);
            dw_test_model m;
            assert_int_equal(dw_test_model_build(CTX, g, bf16 ? "bf16" : NULL, DW_DEVICE_AUTO, &m), DW_OK);
            dw_test_random_params(m.e, RNG, 0.5f, "gate.weight", 2.0f); /* wide logits: rare ties */
            const dw_ir_node *n = &g->nodes[r];
            const int64_t N = B * T, E = g->tensors[n->in[0]].shape[2], K = n->attrs.top_k;
            int32_t x[14], y[14];
            dw_test_random_tokens(x, N, dw_graph_vocab(g), RNG);
            dw_test_random_tokens(y, N, dw_graph_vocab(g), RNG);
            /* step by step so that the router's tensors are read right after it ran */
            const dw_compiled *c = m.c;
            assert_int_equal(dw_exec_set_batch(m.e->x, x, y, B, T), DW_OK);
            for (int s = c->phase[DW_PHASE_FORWARD][0]; s < c->phase[DW_PHASE_FORWARD][1]; s++) {
                assert_int_equal(dw_exec_step(m.e->x, s, false, 1.0), DW_OK);
                if (c->steps[s].node != r) continue;
                float *z = malloc((size_t)(N * E) * 4), *w = malloc((size_t)(N * K) * 4),
                      *ex = malloc((size_t)(N * K) * 4), *ww = malloc((size_t)(N * K) * 4);
                int32_t *want = malloc((size_t)(N * K) * 4);
                assert_int_equal(dw_engine_read_value(m.e, n->in[0], z), DW_OK);
                assert_int_equal(dw_engine_read_value(m.e, n->out[0], w), DW_OK);
                assert_int_equal(dw_engine_read_value(m.e, n->out[1], ex), DW_OK);
                dw_cpu_moe_router_fwd(ww, want, z, N, E, K, score, score == 1);
                for (int64_t i = 0; i < N * K; i++) {
                    assert_true(ex[i] == (float)want[i]);
                    const float rw = bf16 ? dw_decode_bf16(dw_encode_bf16(ww[i])) : ww[i];
                    if (w[i] != rw) fail_msg("weight %lld: engine %.9g, reference %.9g", (long long)i, w[i], rw);
                }
                free(z), free(w), free(ex), free(ww), free(want);
            }
            dw_test_model_free(&m);
        }
}

/* FP32 program: the gradients of the gate (through the router's backward) and of `up` (through
 * its weights output) against central differences of the engine's own loss. The weights are
 * continuous in the logits but kinked where two experts swap rank: an element whose +-h
 * evaluations chose different experts than the unperturbed run is not comparable, and is counted;
 * at least half of the elements must be compared (the gate's spread logits make swaps rare). */
static void test_gradients(void **state) {
    (void)state;
    for (int score = 0; score < 2; score++)
        for (int renorm = 0; renorm < 2; renorm++) {
            const int64_t B = 2, T = 5;
            int r = -1;
            dw_graph *g = dw_test_router_graph(CTX, B, T, RNG, score, renorm, false, &r);
            assert_non_null(g);
            dw_test_model m;
            assert_int_equal(dw_test_model_build(CTX, g, NULL, DW_DEVICE_AUTO, &m), DW_OK);
            dw_test_random_params(m.e, RNG, 0.5f, "gate.weight", 2.0f); /* wide logits: rare ties */
            int32_t x[10], y[10];
            dw_test_random_tokens(x, B * T, dw_graph_vocab(g), RNG);
            dw_test_random_tokens(y, B * T, dw_graph_vocab(g), RNG);
            const int ex = g->nodes[r].out[1];
            double loss;
            assert_int_equal(dw_engine_zero_grad(m.e), DW_OK);
            assert_int_equal(dw_engine_forward_backward(m.e, x, y, B, T, 1.0, &loss), DW_OK);
            const char *names[2] = {"gate.weight", "up.weight"};
            for (int k = 0; k < 2; k++) {
                const int64_t n = dw_ir_numel(&g->tensors[dw_graph_find_tensor(g, names[k])]);
                double gmax;
                int64_t compared;
                /* FP32 losses over a 2h step: ~1e-6 / 2e-3 of noise, h^2 of curvature */
                const int64_t bad = dw_test_fd_param(m.e, names[k], x, y, B, T, ex, 1e-3f, 2e-3, 2e-2, &gmax, &compared);
                if (bad)
                    fail_msg("%s%s %s: %lld elements off (first on stderr)", score ? "sigmoid" : "softmax",
                             renorm ? " renorm" : "", names[k], (long long)bad);
                /* one expert renormalised weighs 1 whatever the logits: no gradient reaches the gate */
                const bool constant = renorm && g->nodes[r].attrs.top_k == 1 && k == 0;
                assert_true(constant || gmax > 0); /* (constant: it rounds to ~1e-9, compared above) */
                if (compared < n / 2)
                    fail_msg("%s: only %lld of %lld elements away from a rank swap", names[k], (long long)compared,
                             (long long)n);
            }
            dw_test_model_free(&m);
        }
}

static void test_training(void **state) {
    (void)state;
    for (int bf16 = 0; bf16 < 2; bf16++) {
        const int64_t B = 2, T = 8;
        dw_graph *g = dw_test_router_graph(CTX, B, T, RNG, bf16, true, false, NULL);
        assert_non_null(g);
        dw_test_model m;
        assert_int_equal(dw_test_model_build(CTX, g, bf16 ? "bf16" : NULL, DW_DEVICE_AUTO, &m), DW_OK);
        double first = 0, last = 0;
        assert_int_equal(dw_test_model_train_random(&m, B, T, 30, 3e-2, RNG, &first, &last), DW_OK);
        if (!(last < first - 0.3)) fail_msg("%s: loss %.5f -> %.5f did not fall", bf16 ? "bf16" : "fp32", first, last);
        dw_test_model_free(&m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_round_trip), cmocka_unit_test(test_program), cmocka_unit_test(test_forward),
        cmocka_unit_test(test_gradients),       cmocka_unit_test(test_training),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
