/* test_moe_mxfp8_engine.c — MoE experts in mxfp8 through the compiler and the CPU engine
 * (compile/bind_grouped.c, runtime/moe_fp8.c, runtime/cpu/ops_cpu_moe.c): mixtral-tiny (hidden 64,
 * experts of 128) and olmoe-tiny (hidden 64, 8 experts of 32, top 4) under --precision mxfp8 bind
 * every moe_linear pass (fprop, dgrad, wgrad) to the mxfp8 CPU reference, with a weight cache
 * refreshed after each update and no standing BF16 copy, the routers BF16. Three training steps
 * equal, bit for bit (losses, every parameter, routing counters), the same program compiled while
 * an oracle grouped kernel registered here wins the selection: it dequantises the engine's operands
 * (dw_dequantize_cpu) and multiplies them in double per 32-block, wgrad over the 32-padded layout
 * written again — so the engine's quantised expert path runs exactly the arithmetic FORMATS.md's
 * mxfp8 and grouped_mxfp8.h state. At one expert node the engine's operands (x, dy along rows;
 * wgrad's padded dy^T, x^T; the weight cache W, W^T) equal the quantisers run here on the values
 * it read. Against BF16 from the same weights and batch the losses stay within a measured band
 * (and differ: the experts do run quantised). Experts of 48 (no multiple of 32) fall back to BF16
 * with the rule's reason named in the node's note. */
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
#include "capture/model_config.h"
#include "compile/program.h"
#include "formats/formats.h"
#include "gemm/grouped.h"
#include "gemm/grouped_mxfp8.h"
#include "ir/ir.h"
#include "precision/policy.h"
#include "runtime/engine.h"
#include "runtime/exec.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)

static dw_graph *tiny(const char *preset, int64_t d_ff_expert, int64_t B, int64_t T) {
    dw_model_config c;
    assert_int_equal(dw_model_config_load(CTX, preset, &c), DW_OK);
    if (d_ff_expert) c.d_ff_expert = d_ff_expert;
    dw_graph *g = NULL;
    if (dw_capture_config(CTX, &c, B, T, &g) != DW_OK) fail_msg("capture %s: %s", preset, dw_errmsg(CTX));
    return g;
}

/* ---- the oracle: the engine's mxfp8 operands dequantised, multiplied in double per 32-block ---- */
static int64_t oracle_calls[3];

static float *dequant(const void *codes, const float *scales, int64_t rows, int64_t cols) {
    float *v = malloc((size_t)(rows * cols + 1) * sizeof *v);
    const dw_qtensor q = {.recipe = DW_RECIPE_MXFP8, .rows = rows, .cols = cols, .codes = (uint8_t *)(uintptr_t)codes,
                          .scales = (void *)(uintptr_t)scales, .tensor_scale = 1.0f};
    dw_dequantize_cpu(&q, v);
    return v;
}

static dw_status oracle_run(dw_ctx *ctx, const dw_grouped_args *a, void *user) {
    (void)ctx, (void)user;
    oracle_calls[a->pass]++;
    const int64_t R = a->rows, E = a->experts, M = a->m, K = a->k;
    const int32_t *off = a->offsets;
    if (a->pass == DW_GEMM_WGRAD) { /* expert e's rows from 32 * sum_{e'<e} ceil(count/32) on */
        const int64_t P = 32 * (R / 32 + E);
        float *dy = dequant(a->dy, a->dy_scales, M, P), *x = dequant(a->x, a->x_scales, K, P), *dw = a->out;
        int64_t start = 0;
        for (int64_t e = 0; e < E; e++) {
            const int64_t end = start + (off[e + 1] - off[e] + 31) / 32 * 32;
            for (int64_t m = 0; m < M && end > start; m++)
                for (int64_t k = 0; k < K; k++) {
                    double acc = 0;
                    for (int64_t b = start; b < end; b += 32) {
                        double part = 0;
                        for (int64_t l = b; l < b + 32; l++) part += (double)dy[m * P + l] * x[k * P + l];
                        acc += part;
                    }
                    float *d = &dw[(e * M + m) * K + k];
                    *d = (float)((a->overwrite ? 0.0 : (double)*d) + acc);
                }
            if (end == start && a->overwrite) memset(dw + e * M * K, 0, (size_t)(M * K) * sizeof *dw);
            start = end;
        }
        free(dy), free(x);
        return DW_OK;
    }
    const bool fprop = a->pass == DW_GEMM_FPROP;
    const int64_t L = fprop ? K : M, N = fprop ? M : K;
    float *act = dequant(fprop ? a->x : a->dy, fprop ? a->x_scales : a->dy_scales, R, L);
    float *w = dequant(a->w, a->w_scales, E * N, L), *out = a->out;
    for (int64_t e = 0; e < E; e++)
        for (int64_t r = off[e]; r < off[e + 1]; r++)
            for (int64_t j = 0; j < N; j++) {
                double acc = 0;
                for (int64_t b = 0; b < L; b += 32) {
                    double part = 0;
                    for (int64_t l = b; l < b + 32; l++) part += (double)act[r * L + l] * w[(e * N + j) * L + l];
                    acc += part;
                }
                out[r * N + j] = (float)acc;
            }
    memset(out + (int64_t)off[E] * N, 0, (size_t)((R - off[E]) * N) * sizeof *out);
    free(act), free(w);
    return DW_OK;
}

static const dw_grouped_kernel_desc oracle = {.name = "test_oracle_mxfp8", .dtype = DW_GROUPED_F32,
                                              .recipe = DW_RECIPE_MXFP8, .device = DW_DEVICE_CPU, .priority = 100,
                                              .run = oracle_run};

/* Every moe_linear of m binds its three passes to `kernel` in mxfp8 with a weight cache refreshed
 * after the update and no BF16 copy; the routers stay BF16. The expert layers counted. */
static int check_binding(const dw_test_model *m, const char *kernel) {
    int experts = 0, routers = 0;
    for (int i = 0; i < m->g->n_nodes; i++) {
        const dw_node_binding *b = &m->c->node[i].bind;
        if (m->g->nodes[i].op == DW_OP_LINEAR && dw_policy_is_moe_gate(m->g->nodes[i].name)) {
            assert_int_equal(b->recipe, DW_RECIPE_BF16);
            routers++;
        }
        if (m->g->nodes[i].op != DW_OP_MOE_LINEAR) continue;
        experts++;
        assert_int_equal(b->recipe, DW_RECIPE_MXFP8);
        for (int p = 0; p < DW_QPASS_COUNT; p++) {
            if (!b->quantised[p]) fail_msg("%s pass %d not mxfp8: %s", m->g->nodes[i].name, p, b->note ? b->note : "");
            assert_string_equal(b->kernel[p], kernel);
        }
        const dw_ir_tensor *w = &m->g->tensors[m->g->nodes[i].in[1]];
        const int64_t codes = w->shape[0] * w->shape[1] * w->shape[2];
        for (int q = 0; q < 2; q++) assert_true(m->c->node[i].wq[q].off >= 0 && m->c->node[i].wq[q].bytes >= codes + codes / 32);
        assert_true(m->c->bf16_lazy[m->c->tensor[m->g->nodes[i].in[1]].param]);
        bool refreshed = false;
        for (int s = m->c->phase[DW_PHASE_REFRESH][0]; s < m->c->phase[DW_PHASE_REFRESH][1]; s++)
            refreshed |= m->c->steps[s].kind == DW_STEP_QUANT_W && m->c->steps[s].node == i;
        assert_true(refreshed);
    }
    assert_true(routers >= 1);
    return experts;
}

/* Three steps of preset under mxfp8: the engine's kernels against the oracle's, bit for bit. */
static void oracle_case(const char *preset, int experts) {
    const int64_t B = 2, T = 16;
    dw_test_model a, b;
    assert_int_equal(dw_test_model_build(CTX, tiny(preset, 0, B, T), "mxfp8", DW_DEVICE_AUTO, &a), DW_OK);
    assert_int_equal(check_binding(&a, "grouped_cpu_mxfp8"), experts);
    assert_int_equal(dw_grouped_kernel_register(&oracle), DW_OK);
    memset(oracle_calls, 0, sizeof oracle_calls);
    assert_int_equal(dw_test_model_build(CTX, tiny(preset, 0, B, T), "mxfp8", DW_DEVICE_AUTO, &b), DW_OK);
    assert_int_equal(check_binding(&b, "test_oracle_mxfp8"), experts);
    double first = 0, last = 0;
    const int same = dw_test_same_training(&a, &b, B, T, 3, 1e-2, dw_test_next(RNG), preset, &first, &last);
    assert_true(dw_grouped_kernel_unregister("test_oracle_mxfp8"));
    for (int p = 0; p < 3; p++) assert_int_equal(oracle_calls[p], 3 * experts); /* every pass of every step */
    assert_int_equal(same, 0);
    printf("%s mxfp8: 3 steps, loss %.6f -> %.6f, equal to the oracle's\n", preset, first, last);
    dw_test_model_free(&a), dw_test_model_free(&b);
}

static void test_oracle_mixtral(void **state) {
    (void)state;
    oracle_case("mixtral-tiny", 6);
}
static void test_oracle_olmoe(void **state) {
    (void)state;
    oracle_case("olmoe-tiny", 3 * 2);
}

/* ---- one expert node's operands against the quantisers run here on the values it read ---------- */
/* n bytes of the workspace at off against want; 1 (and the first difference printed) when they differ. */
static int64_t same_bytes(const char *what, const dw_exec *x, int64_t off, const void *want, size_t n) {
    const uint8_t *a = (const uint8_t *)x->work + off, *b = want;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            fprintf(stderr, "%s: byte %zu is %u, the quantiser's %u\n", what, i, a[i], b[i]);
            return 1;
        }
    return 0;
}

static void check_node_operands(dw_test_model *m, const char *name, int64_t B, int64_t T, int64_t top_k) {
    dw_engine *e = m->e;
    dw_exec *x = e->x;
    const dw_compiled *p = m->c;
    int node = -1;
    for (int i = 0; i < m->g->n_nodes && node < 0; i++) node = strcmp(m->g->nodes[i].name, name) ? -1 : i;
    assert_true(node >= 0);
    const dw_ir_node *n = &m->g->nodes[node];
    const dw_ir_tensor *wt = &m->g->tensors[n->in[1]];
    const int64_t E = wt->shape[0], M = wt->shape[1], K = wt->shape[2], R = B * T * top_k; /* dropless */
    int32_t tok[64], tgt[64];
    dw_test_random_tokens(tok, B * T, dw_graph_vocab(m->g), RNG);
    dw_test_random_tokens(tgt, B * T, dw_graph_vocab(m->g), RNG);
    assert_int_equal(dw_engine_zero_grad(e), DW_OK);
    assert_int_equal(dw_exec_set_batch(x, tok, tgt, B, T), DW_OK);
    float *w = dw_test_param_read(e, wt->name, NULL); /* the weight cache against the masters quantised here */
    uint8_t *wc = malloc((size_t)(E * M * K)), *ws = malloc((size_t)(E * M * K / 32));
    uint8_t *wtc = malloc((size_t)(E * M * K)), *wts = malloc((size_t)(E * M * K / 32));
    assert_int_equal(dw_grouped_mxfp8_quantize_weights_cpu(CTX, w, E, M, K, wc, ws, wtc, wts), DW_OK);
    const dw_qslot_layout *q0 = &p->node[node].wq[0], *q1 = &p->node[node].wq[1];
    int64_t bad = same_bytes("W codes", x, q0->off, wc, (size_t)(E * M * K));
    bad += same_bytes("W scales", x, q0->off + q0->scales, ws, (size_t)(E * M * K / 32));
    bad += same_bytes("W^T codes", x, q1->off, wtc, (size_t)(E * M * K));
    bad += same_bytes("W^T scales", x, q1->off + q1->scales, wts, (size_t)(E * M * K / 32));
    const int64_t C = M > K ? M : K, P = dw_grouped_mxfp8_wgrad_cols(R, E);
    uint8_t *codes = malloc((size_t)(C * (P > R ? P : R))), *sc = malloc((size_t)(C * (P > R ? P : R) / 32));
    float *xv = NULL, *off = NULL;
    int32_t offsets[65];
    const dw_work_layout *l = &p->work;
    dw_exec_begin_phase(x, DW_PHASE_FORWARD);
    for (int s = p->phase[DW_PHASE_FORWARD][0]; s < p->phase[DW_PHASE_FORWARD][1]; s++) {
        assert_int_equal(dw_exec_step(x, s, true, 1.0 / (double)(B * T)), DW_OK);
        if (p->steps[s].node != node) continue;
        xv = malloc((size_t)(R * K) * sizeof *xv), off = malloc((size_t)(E + 1) * sizeof *off);
        assert_int_equal(dw_engine_read_value(e, n->in[0], xv), DW_OK);
        assert_int_equal(dw_engine_read_value(e, n->in[2], off), DW_OK);
        for (int64_t i = 0; i <= E; i++) offsets[i] = (int32_t)off[i];
        assert_int_equal(offsets[E], R);
        assert_int_equal(dw_grouped_mxfp8_quantize_rows_cpu(CTX, xv, R, K, codes, sc), DW_OK);
        bad += same_bytes("x codes", x, l->q_rows.off, codes, (size_t)(R * K));
        bad += same_bytes("x scales", x, l->q_rows.off + l->q_rows.scales, sc, (size_t)(R * K / 32));
    }
    assert_non_null(xv);
    dw_exec_begin_phase(x, DW_PHASE_BACKWARD);
    bool seen = false;
    for (int s = p->phase[DW_PHASE_BACKWARD][0]; s < p->phase[DW_PHASE_BACKWARD][1]; s++) {
        assert_int_equal(dw_exec_step(x, s, true, 1.0 / (double)(B * T)), DW_OK);
        if (p->steps[s].node != node || p->steps[s].kind != DW_STEP_BWD) continue;
        seen = true;
        float *dy = dw_test_act_grad_read(e, n->out[0], R * M);
        assert_int_equal(dw_grouped_mxfp8_quantize_rows_cpu(CTX, dy, R, M, codes, sc), DW_OK);
        bad += same_bytes("dy codes", x, l->q_rows.off, codes, (size_t)(R * M));
        bad += same_bytes("dy scales", x, l->q_rows.off + l->q_rows.scales, sc, (size_t)(R * M / 32));
        assert_int_equal(dw_grouped_mxfp8_quantize_cols_cpu(CTX, dy, offsets, R, E, M, codes, sc), DW_OK);
        bad += same_bytes("dy^T codes", x, l->q_dyt.off, codes, (size_t)(M * P));
        bad += same_bytes("dy^T scales", x, l->q_dyt.off + l->q_dyt.scales, sc, (size_t)(M * P / 32));
        assert_int_equal(dw_grouped_mxfp8_quantize_cols_cpu(CTX, xv, offsets, R, E, K, codes, sc), DW_OK);
        bad += same_bytes("x^T codes", x, l->q_xt.off, codes, (size_t)(K * P));
        bad += same_bytes("x^T scales", x, l->q_xt.off + l->q_xt.scales, sc, (size_t)(K * P / 32));
        free(dy);
    }
    assert_true(seen);
    if (bad) fail_msg("%s: %lld operands differ (first of each on stderr)", name, (long long)bad);
    free(w), free(wc), free(ws), free(wtc), free(wts), free(codes), free(sc), free(xv), free(off);
}

static void test_operands(void **state) {
    (void)state;
    const int64_t B = 2, T = 16;
    const struct {
        const char *preset, *node;
        int64_t top_k;
    } cases[] = {{"mixtral-tiny", "model.layers.1.mlp.experts.down", 2}, {"olmoe-tiny", "model.layers.0.mlp.experts.up", 4}};
    for (int k = 0; k < 2; k++) {
        dw_test_model m;
        assert_int_equal(dw_test_model_build(CTX, tiny(cases[k].preset, 0, B, T), "mxfp8", DW_DEVICE_AUTO, &m), DW_OK);
        dw_test_random_params(m.e, RNG, 0.05f, NULL, 0.05f);
        assert_int_equal(dw_engine_refresh(m.e), DW_OK);
        check_node_operands(&m, cases[k].node, B, T, cases[k].top_k);
        dw_test_model_free(&m);
    }
}

/* mxfp8 against BF16 (same weights, same batch, 3 steps of lr 1e-3): the losses within a band set
 * at about 3x what 91 seeds measured (|difference| / loss: step 1 at most 6.3e-4, bound 2e-3; step 3
 * at most 1.5e-3, bound 5e-3), and not equal (the experts and linears do run quantised). */
static void test_bf16_band(void **state) {
    (void)state;
    const char *presets[] = {"mixtral-tiny", "olmoe-tiny"};
    for (int k = 0; k < 2; k++) {
        const int64_t B = 2, T = 16;
        const uint64_t seed = dw_test_next(RNG);
        double l[2][2];
        const char *prec[2] = {"mxfp8", "bf16"};
        for (int p = 0; p < 2; p++) {
            dw_test_model m;
            dw_test_rng r;
            dw_test_rng_init(&r, seed);
            assert_int_equal(dw_test_model_build(CTX, tiny(presets[k], 0, B, T), prec[p], DW_DEVICE_AUTO, &m), DW_OK);
            assert_int_equal(dw_test_model_train_random(&m, B, T, 3, 1e-3, &r, &l[p][0], &l[p][1]), DW_OK);
            dw_test_model_free(&m);
        }
        const double d0 = fabs(l[0][0] - l[1][0]) / l[1][0], d1 = fabs(l[0][1] - l[1][1]) / l[1][1];
        printf("%s: mxfp8 %.6f -> %.6f, bf16 %.6f -> %.6f (relative %.2e, %.2e)\n", presets[k], l[0][0], l[0][1],
               l[1][0], l[1][1], d0, d1);
        if (!(d0 < 2e-3 && d1 < 5e-3)) fail_msg("%s: mxfp8 left the band around bf16", presets[k]);
        assert_true(l[0][0] != l[1][0] || l[0][1] != l[1][1]);
    }
}

/* Experts of 48: no 1x32 blocks along M (fprop) and K (dgrad): BF16 with the rule named. */
static void test_refusal(void **state) {
    (void)state;
    dw_test_model m;
    assert_int_equal(dw_test_model_build(CTX, tiny("mixtral-tiny", 48, 2, 16), "mxfp8", DW_DEVICE_AUTO, &m), DW_OK);
    int seen = 0;
    for (int i = 0; i < m.g->n_nodes; i++) {
        if (m.g->nodes[i].op != DW_OP_MOE_LINEAR) continue;
        const dw_node_binding *b = &m.c->node[i].bind;
        assert_int_equal(b->recipe, DW_RECIPE_MXFP8);
        assert_false(b->quantised[0] || b->quantised[1] || b->quantised[2]);
        assert_non_null(b->note);
        if (!strstr(b->note, "BF16 FALLBACK: grouped_cpu_mxfp8: K and M must be multiples of 32"))
            fail_msg("%s: %s", m.g->nodes[i].name, b->note);
        assert_string_equal(b->kernel[0], "grouped_cpu_reference");
        assert_true(m.c->node[i].wq[0].off < 0);
        seen++;
    }
    assert_int_equal(seen, 6);
    double first = 0, last = 0; /* and it trains, BF16 experts */
    assert_int_equal(dw_test_model_train_random(&m, 2, 16, 2, 1e-2, RNG, &first, &last), DW_OK);
    dw_test_model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oracle_mixtral),
        cmocka_unit_test(test_oracle_olmoe),
        cmocka_unit_test(test_operands),
        cmocka_unit_test(test_bf16_band),
        cmocka_unit_test(test_refusal),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
