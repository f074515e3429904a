/* test_engine_moe.c — a mixture-of-experts feed-forward (router, dispatch, grouped expert GEMMs,
 * SwiGLU over the dispatched rows, combine: dw_test_moe_graph) through the CPU engine. The FP32
 * program's loss equals an independent per-token computation in double written here (each token's
 * top-K experts by its logits, renormalised softmax weights, SwiGLU expert MLPs), at the full and
 * at a smaller batch; its parameter gradients equal central differences of its own loss away from
 * rank swaps; FP32 and BF16 programs train; a program for the CUDA backend, which has no MoE
 * entries yet, is refused when compiled, naming the op and the backend. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "runtime/engine.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)

/* Parameter `name` read back into a new array. */
static float *param(dw_engine *e, const char *name, int *index) {
    for (int i = 0; i < dw_engine_param_count(e); i++)
        if (!strcmp(dw_engine_param_name(e, i), name)) {
            float *v = malloc((size_t)dw_test_param_numel(e, i) * 4);
            assert_int_equal(dw_engine_param_read(e, i, v), DW_OK);
            if (index) *index = i;
            return v;
        }
    fail_msg("no parameter %s", name);
    return NULL;
}

/* The model's mean loss over b x t tokens, token by token in double. */
static double reference_loss(dw_engine *e, const dw_graph *g, const int32_t *x, const int32_t *y, int64_t n) {
    const dw_ir_tensor *w1t = &g->tensors[dw_graph_find_tensor(g, "experts.w1")];
    const int64_t E = w1t->shape[0], F = w1t->shape[1], C = w1t->shape[2], V = dw_graph_vocab(g);
    int64_t K = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == DW_OP_MOE_ROUTER) K = g->nodes[i].attrs.top_k;
    float *wte = param(e, "wte.weight", NULL), *gate = param(e, "gate.weight", NULL), *w1 = param(e, "experts.w1", NULL);
    float *w3 = param(e, "experts.w3", NULL), *w2 = param(e, "experts.w2", NULL), *head = param(e, "head.weight", NULL);
    double loss = 0.0, z[16], s[16], h[16], lg[64];
    int taken[16];
    for (int64_t i = 0; i < n; i++) {
        const float *xe = wte + x[i] * C;
        double m = -INFINITY, sum = 0.0, wsum = 0.0;
        for (int64_t q = 0; q < E; q++) {
            z[q] = 0.0;
            for (int64_t c = 0; c < C; c++) z[q] += (double)gate[q * C + c] * xe[c];
            m = fmax(m, z[q]);
            taken[q] = 0;
        }
        for (int64_t q = 0; q < E; q++) sum += exp(z[q] - m);
        for (int64_t c = 0; c < C; c++) s[c] = xe[c];
        int64_t chosen[16];
        for (int64_t k = 0; k < K; k++) { /* the K largest logits, ties to the lower expert */
            int64_t best = -1;
            for (int64_t q = 0; q < E; q++)
                if (!taken[q] && (best < 0 || z[q] > z[best])) best = q;
            taken[best] = 1, chosen[k] = best, wsum += exp(z[best] - m) / sum;
        }
        for (int64_t k = 0; k < K; k++) {
            const int64_t q = chosen[k];
            const double wk = exp(z[q] - m) / sum / wsum;
            for (int64_t f = 0; f < F; f++) {
                double a = 0.0, b = 0.0;
                for (int64_t c = 0; c < C; c++)
                    a += (double)w1[(q * F + f) * C + c] * xe[c], b += (double)w3[(q * F + f) * C + c] * xe[c];
                h[f] = a / (1.0 + exp(-a)) * b;
            }
            for (int64_t c = 0; c < C; c++) {
                double o = 0.0;
                for (int64_t f = 0; f < F; f++) o += (double)w2[(q * C + c) * F + f] * h[f];
                s[c] += wk * o;
            }
        }
        double lm = -INFINITY, ls = 0.0;
        for (int64_t v = 0; v < V; v++) {
            lg[v] = 0.0;
            for (int64_t c = 0; c < C; c++) lg[v] += (double)head[v * C + c] * s[c];
            lm = fmax(lm, lg[v]);
        }
        for (int64_t v = 0; v < V; v++) ls += exp(lg[v] - lm);
        loss += lm + log(ls) - lg[y[i]];
    }
    free(wte), free(gate), free(w1), free(w3), free(w2), free(head);
    return loss / (double)n;
}

static void test_forward_reference(void **state) {
    (void)state;
    for (int rep = 0; rep < 3; rep++) {
        const int64_t B = 2, T = 6;
        dw_graph *g = dw_test_moe_graph(CTX, B, T, RNG);
        assert_non_null(g);
        dw_test_model m;
        assert_int_equal(dw_test_model_build(CTX, g, NULL, DW_DEVICE_AUTO, &m), DW_OK);
        dw_test_random_params(m.e, RNG, 0.5f, "gate.weight", 2.0f); /* wide logits: rare ties */
        int32_t x[12], y[12];
        dw_test_random_tokens(x, B * T, dw_graph_vocab(g), RNG);
        dw_test_random_tokens(y, B * T, dw_graph_vocab(g), RNG);
        const int64_t shapes[2][2] = {{B, T}, {1, 4}}; /* the full batch and a smaller one */
        for (int k = 0; k < 2; k++) {
            const int64_t b = shapes[k][0], t = shapes[k][1];
            int32_t xb[12], yb[12];
            for (int64_t i = 0; i < b; i++)
                for (int64_t j = 0; j < t; j++) xb[i * t + j] = x[i * T + j], yb[i * t + j] = y[i * T + j];
            double loss = 0;
            assert_int_equal(dw_engine_forward(m.e, xb, yb, b, t, NULL, &loss), DW_OK);
            const double want = reference_loss(m.e, g, xb, yb, b * t);
            if (fabs(loss - want) > 1e-5 * fabs(want))
                fail_msg("%s (batch %lld x %lld): engine loss %.9g, reference %.9g", g->model.summary, (long long)b,
                         (long long)t, loss, want);
        }
        dw_test_model_free(&m);
    }
}

/* FP32 gradients of the router gate and the three expert weights against central differences of
 * the engine's loss; an element whose +-h runs choose other experts than the unperturbed one is
 * not comparable (counted; at least half must be compared). */
static void test_gradients(void **state) {
    (void)state;
    const int64_t B = 2, T = 4;
    dw_graph *g = dw_test_moe_graph(CTX, B, T, RNG);
    assert_non_null(g);
    dw_test_model m;
    assert_int_equal(dw_test_model_build(CTX, g, NULL, DW_DEVICE_AUTO, &m), DW_OK);
    dw_test_random_params(m.e, RNG, 0.5f, "gate.weight", 2.0f); /* wide logits: rare ties */
    int32_t x[8], y[8];
    dw_test_random_tokens(x, B * T, dw_graph_vocab(g), RNG);
    dw_test_random_tokens(y, B * T, dw_graph_vocab(g), RNG);
    const int ex = dw_graph_find_tensor(g, "experts");
    const int64_t nk = B * T * g->tensors[ex].shape[2];
    float *ex0 = malloc((size_t)nk * 4), *ex1 = malloc((size_t)nk * 4);
    double loss;
    assert_int_equal(dw_engine_zero_grad(m.e), DW_OK);
    assert_int_equal(dw_engine_forward_backward(m.e, x, y, B, T, 1.0, &loss), DW_OK);
    assert_int_equal(dw_engine_forward(m.e, x, y, B, T, NULL, &loss), DW_OK);
    assert_int_equal(dw_engine_read_value(m.e, ex, ex0), DW_OK);
    const char *names[4] = {"gate.weight", "experts.w1", "experts.w3", "experts.w2"};
    for (int k = 0; k < 4; k++) {
        int p = -1;
        float *v = param(m.e, names[k], &p);
        const int64_t n = dw_test_param_numel(m.e, p);
        float *gr = malloc((size_t)n * 4);
        assert_int_equal(dw_engine_grad_read(m.e, p, gr), DW_OK);
        double gmax = 0;
        for (int64_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(gr[i]));
        int64_t compared = 0;
        for (int64_t i = 0; i < n; i++) {
            const float v0 = v[i], h = 1e-3f;
            double lp, lm;
            bool same = true;
            for (int sgn = 1; sgn >= -1; sgn -= 2) {
                v[i] = v0 + (float)sgn * h;
                assert_int_equal(dw_engine_param_write(m.e, p, v), DW_OK);
                assert_int_equal(dw_engine_forward(m.e, x, y, B, T, NULL, sgn > 0 ? &lp : &lm), DW_OK);
                assert_int_equal(dw_engine_read_value(m.e, ex, ex1), DW_OK);
                same &= !memcmp(ex0, ex1, (size_t)nk * 4);
            }
            v[i] = v0;
            if (!same) continue;
            compared++;
            const double fd = (lp - lm) / (2.0 * (double)h);
            if (fabs(fd - gr[i]) > 2e-3 + 2e-2 * gmax)
                fail_msg("%s[%lld]: engine %.6g, differences %.6g (max |grad| %.3g)", names[k], (long long)i, gr[i], fd,
                         gmax);
        }
        assert_int_equal(dw_engine_param_write(m.e, p, v), DW_OK);
        if (compared < n / 2) fail_msg("%s: only %lld of %lld away from a rank swap", names[k], (long long)compared, (long long)n);
        /* one expert per token, renormalised, weighs 1: no gradient reaches the gate then */
        assert_true(gmax > 0 || (k == 0 && g->tensors[ex].shape[2] == 1));
        free(v), free(gr);
    }
    free(ex0), free(ex1);
    dw_test_model_free(&m);
}

static void test_training(void **state) {
    (void)state;
    for (int bf16 = 0; bf16 < 2; bf16++) {
        const int64_t B = 2, T = 8;
        dw_graph *g = dw_test_moe_graph(CTX, B, T, RNG);
        assert_non_null(g);
        dw_test_model m;
        assert_int_equal(dw_test_model_build(CTX, g, bf16 ? "bf16" : NULL, DW_DEVICE_AUTO, &m), DW_OK);
        assert_int_equal(dw_engine_init_weights(m.e, dw_test_next(RNG)), DW_OK);
        int32_t x[16], y[16];
        dw_test_random_tokens(x, B * T, dw_graph_vocab(g), RNG);
        dw_test_random_tokens(y, B * T, dw_graph_vocab(g), RNG);
        double first = 0, last = 0;
        assert_int_equal(dw_test_train_fixed(m.e, x, y, B, T, 30, 3e-2, &first, &last), DW_OK);
        if (!(last < first - 0.3)) fail_msg("%s: loss %.5f -> %.5f did not fall", bf16 ? "bf16" : "fp32", first, last);
        dw_test_model_free(&m);
    }
}

/* The CUDA backend has no MoE dispatch entry yet (ops.def's cuda column 0): compiling for it is
 * refused, naming the op, the node and the backend; the CPU program still runs. */
static void test_cuda_refused(void **state) {
    (void)state;
    dw_graph *g = dw_test_moe_graph(CTX, 1, 4, RNG);
    assert_non_null(g);
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.device = DW_DEVICE_CUDA, o.sm = 90;
    dw_compiled *c = (dw_compiled *)g;
    assert_int_equal(dw_compile(CTX, g, NULL, NULL, &o, &c), DW_ERR_UNSUPPORTED);
    assert_null(c);
    const char *msg = dw_errmsg(CTX);
    if (!strstr(msg, "moe_dispatch") || !strstr(msg, "'dispatch'") || !strstr(msg, "CUDA"))
        fail_msg("message lacks the op, node or backend: %s", msg);
    dw_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_reference),
        cmocka_unit_test(test_gradients),
        cmocka_unit_test(test_training),
        cmocka_unit_test(test_cuda_refused),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
