/* test_moe_memplan.c — MoE buffers sized by the capacity (compile/moe_rows.c): with a capacity
 * factor below 1, mixtral-tiny's dispatch rows and every tensor computed row by row from them (the
 * expert GEMMs' outputs and their SwiGLU) hold min(N K, E ceil(f N K / E)) rows, checked against
 * that formula at random factors and shapes: their values' and gradients' arena items have exactly
 * those bytes, the combine's output and the tokens' tensors keep theirs, a factor of 1 or more
 * changes nothing, and the arena shrinks against the dropless program. The engine runs on the
 * smaller buffers: a micro-batch of fewer tokens than the program's gives bit for bit the loss
 * and gradients of a program compiled for that many tokens. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/passes.h"
#include "ir/ir.h"
#include "moe_route.h"
#include "runtime/engine.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)

/* The bytes of the arena item of kind k for tensor t (0: none). */
static int64_t item_bytes(const dw_compiled *c, dw_buf_kind k, int t) {
    for (int i = 0; i < c->n_items; i++)
        if (c->info[i].kind == k && c->info[i].index == t) return c->items[i].size;
    return 0;
}

/* Whether tensor t is MoE rows: the dispatch's rows or an expert op's output. */
static bool moe_rows(const dw_graph *g, int t) {
    const int p = g->tensors[t].producer;
    if (p < 0) return false;
    const dw_op op = g->nodes[p].op;
    return (op == DW_OP_MOE_DISPATCH && g->nodes[p].out[0] == t) || op == DW_OP_MOE_LINEAR ||
           (op == DW_OP_SWIGLU && strstr(g->nodes[p].name, "experts"));
}

static void check_sizes(double factor, int64_t B, int64_t T) {
    dw_test_model m, d;
    dw_test_moe_tiny(CTX, factor, false, B, T, *RNG, &m);
    dw_test_moe_tiny(CTX, 0.0, false, B, T, *RNG, &d);
    const dw_graph *g = m.g;
    const int64_t N = B * T, K = 2, E = 4; /* mixtral-tiny: 4 experts, top 2 */
    const int64_t want_rows = factor < 1 ? (E * dw_moe_capacity(factor, N, K, E) < N * K
                                                ? E * dw_moe_capacity(factor, N, K, E) : N * K) : N * K;
    int routed = 0;
    for (int t = 0; t < g->n_tensors; t++) {
        if (g->tensors[t].kind != DW_TENSOR_ACT) continue;
        const dw_prog_tensor *pt = &m.c->tensor[t];
        const int64_t full = dw_ir_numel(&g->tensors[t]) * 4; /* FP32 program */
        const int64_t want = moe_rows(g, t) ? want_rows * pt->width * 4 : full;
        if (moe_rows(g, t)) {
            routed++;
            if (pt->rows_cap != want_rows)
                fail_msg("factor %g N %lld: %s holds %lld rows, want %lld", factor, (long long)N, g->tensors[t].name,
                         (long long)pt->rows_cap, (long long)want_rows);
        }
        const int64_t v = item_bytes(m.c, DW_BUF_VALUE, t);
        if (v && v != want)
            fail_msg("factor %g: %s's value item %lld bytes, want %lld", factor, g->tensors[t].name, (long long)v,
                     (long long)want);
        const int64_t gr = item_bytes(m.c, DW_BUF_GRAD, t);
        if (gr && moe_rows(g, t) && gr != want) /* a gradient item of its own: the same rows */
            fail_msg("factor %g: %s's gradient item %lld bytes, want %lld", factor, g->tensors[t].name, (long long)gr,
                     (long long)want);
    }
    assert_int_equal(routed, 2 * 5); /* per layer: rows, gate, up, act, down */
    if (want_rows < N * K && !(m.c->arena_bytes < d.c->arena_bytes))
        fail_msg("factor %g: arena %lld bytes, dropless %lld", factor, (long long)m.c->arena_bytes,
                 (long long)d.c->arena_bytes);
    if (want_rows == N * K && m.c->arena_bytes != d.c->arena_bytes)
        fail_msg("factor %g keeps every row but the arena changed", factor);
    dw_test_model_free(&m);
    dw_test_model_free(&d);
}

static void test_buffer_sizes(void **state) {
    (void)state;
    check_sizes(0.5, 2, 8);
    check_sizes(1.0, 2, 8);
    check_sizes(1.5, 1, 8);
    for (int rep = 0; rep < 3; rep++) /* random factors below 1 and shapes */
        check_sizes((double)dw_test_rnd(1, 19) / 20.0, dw_test_rnd(1, 3), dw_test_rnd(2, 12));
}

/* Loss and every parameter gradient of one micro-batch of b x t tokens on engine e. */
static double loss_grads(dw_engine *e, const int32_t *x, const int32_t *y, int64_t b, int64_t t, float **g) {
    double loss;
    assert_int_equal(dw_engine_zero_grad(e), DW_OK);
    assert_int_equal(dw_engine_forward_backward(e, x, y, b, t, 1.0, &loss), DW_OK);
    for (int i = 0; i < dw_engine_param_count(e); i++) {
        int64_t shape[4], n = 1;
        const int nd = dw_engine_param_shape(e, i, shape);
        for (int d = 0; d < nd; d++) n *= shape[d];
        g[i] = malloc((size_t)n * sizeof(float));
        assert_int_equal(dw_engine_grad_read(e, i, g[i]), DW_OK);
    }
    return loss;
}

static void test_smaller_call(void **state) {
    (void)state;
    const dw_test_rng w = *RNG;
    dw_test_model big, small;
    dw_test_moe_tiny(CTX, 0.5, false, 3, 8, w, &big);   /* capacity rows for 24 tokens */
    dw_test_moe_tiny(CTX, 0.5, false, 1, 8, w, &small); /* ... and for 8 */
    int32_t x[8], y[8];
    dw_test_random_tokens(x, 8, 256, RNG);
    dw_test_random_tokens(y, 8, 256, RNG);
    const int np = dw_engine_param_count(big.e);
    float **gb = calloc((size_t)np, sizeof *gb), **gs = calloc((size_t)np, sizeof *gs);
    const double lb = loss_grads(big.e, x, y, 1, 8, gb), ls = loss_grads(small.e, x, y, 1, 8, gs);
    if (lb != ls) fail_msg("1 x 8 tokens: loss %.17g on the 3 x 8 program, %.17g on the 1 x 8 one", lb, ls);
    for (int i = 0; i < np; i++) {
        int64_t shape[4], n = 1;
        const int nd = dw_engine_param_shape(big.e, i, shape);
        for (int d = 0; d < nd; d++) n *= shape[d];
        if (memcmp(gb[i], gs[i], (size_t)n * sizeof(float)))
            fail_msg("%s: gradients differ between the programs", dw_engine_param_name(big.e, i));
        free(gb[i]), free(gs[i]);
    }
    free(gb), free(gs);
    dw_test_model_free(&big);
    dw_test_model_free(&small);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buffer_sizes),
        cmocka_unit_test(test_smaller_call),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
