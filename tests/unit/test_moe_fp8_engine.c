/* test_moe_fp8_engine.c — MoE experts in fp8_block through the compiler and the CPU engine
 * (compile/bind_grouped.c, runtime/cpu/ops_cpu_moe.c): a Mixtral of hidden 128 and expert FFN 256
 * (mixtral-tiny's 64 is no multiple of 128) under --precision fp8_block binds fprop and dgrad of
 * every moe_linear to the fp8_block CPU reference and keeps wgrad BF16 by default (the note says
 * so); under a rule's "bf16_passes": [] (DW_TEST_FP8_WGRAD) the wgrad too; the routers stay BF16.
 * Under that rule the engine's own quantised
 * operands (the weight cache W, W^T; x and dy 1x128; wgrad's padded dy^T, x^T) equal the
 * quantisers run here on the values it read, and the layer's output, input gradient and weight
 * gradient equal the fp8 grouped reference on those operands exactly; training on a fixed batch
 * lowers the loss. The policy's keys: a rule {"op": "moe_linear", "recipe": "bf16"} keeps the
 * experts BF16 (then their output equals the BF16 grouped reference exactly, with no weight cache);
 * a rule's "bf16_passes" keeps the named GEMMs BF16 (["wgrad"]: the experts' weight gradient then
 * equals the BF16 grouped reference exactly); the CUDA target on sm_90 by default and with DW_MOE_FP8=1 (the sm_90 kernel), with DW_MOE_FP8=0
 * and on sm_100 (BF16, the note saying why) as bind_grouped says; expert weights whose fprop and dgrad run in fp8_block get no standing BF16 copy. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "compile/program.h"
#include "formats/formats.h"
#include "gemm/grouped.h"
#include "gemm/grouped_fp8.h"
#include "ir/ir.h"
#include "kernels/cpu/moe_fp8_cpu.h"
#include "kernels/cpu/ops_cpu.h"
#include "precision/policy.h"
#include "runtime/engine.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)

/* Mixtral-tiny widened to hidden 128 (head 32) and experts of 256: every expert GEMM has K and M
 * multiples of 128. */
static dw_graph *mixtral128(int64_t B, int64_t T) {
    dw_model_config c;
    assert_int_equal(dw_model_config_load(CTX, "mixtral-tiny", &c), DW_OK);
    c.d_model = 128, c.head_dim = 32, c.d_ff = 256, c.d_ff_expert = 256;
    dw_graph *g = NULL;
    if (dw_capture_config(CTX, &c, B, T, &g) != DW_OK) fail_msg("capture: %s", dw_errmsg(CTX));
    return g;
}

static dw_policy *policy_json(const char *json) {
    dw_policy *p = NULL;
    if (dw_test_policy(CTX, json, false, &p) != DW_OK) fail_msg("policy: %s", dw_errmsg(CTX));
    return p;
}

static int node_named(const dw_graph *g, const char *name) {
    for (int i = 0; i < g->n_nodes; i++)
        if (!strcmp(g->nodes[i].name, name)) return i;
    fail_msg("no node %s", name);
    return -1;
}

static float *read_value(dw_engine *e, int t, int64_t n) {
    float *v = malloc((size_t)n * sizeof *v);
    assert_int_equal(dw_engine_read_value(e, t, v), DW_OK);
    return v;
}

/* The BF16 value the CPU backend stores for an FP32 result in a BF16 program. */
static float stored(const dw_engine *e, float v) { return e->p->act_size == 2 ? dw_decode_bf16(dw_encode_bf16(v)) : v; }

/* n bytes at a and b equal; else the first difference printed and a failure. */
static int64_t same_bytes(const char *what, const void *a, const void *b, size_t n) {
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) {
            fprintf(stderr, "%s: byte %zu differs (%u vs %u)\n", what, i, x[i], y[i]);
            return 1;
        }
    return 0;
}
static int64_t same_floats(const char *what, const float *got, const float *want, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof got[i])) {
            fprintf(stderr, "%s: element %lld is %.9g, the reference %.9g\n", what, (long long)i, got[i], want[i]);
            return 1;
        }
    return 0;
}

/* The program binds the experts in fp8_block (fprop, dgrad, and wgrad when the registry has one
 * and the policy asks: a rule's "bf16_passes": [], not the default, which keeps it BF16 and says
 * so), the routers BF16, and gives each expert node a weight cache refreshed after the update. */
static void check_binding(const char *policy, bool fp8_wgrad) {
    dw_graph *g = mixtral128(2, 16);
    dw_test_model m;
    assert_int_equal(dw_test_model_build(CTX, g, policy, DW_DEVICE_AUTO, &m), DW_OK);
    int experts = 0, routers = 0;
    for (int i = 0; i < m.g->n_nodes; i++) {
        const dw_node_binding *b = &m.c->node[i].bind;
        if (m.g->nodes[i].op == DW_OP_LINEAR && dw_policy_is_moe_gate(m.g->nodes[i].name)) { /* the router's GEMM */
            assert_int_equal(b->recipe, DW_RECIPE_BF16);
            assert_int_equal(b->reason, DW_POLICY_MOE_GATE);
            routers++;
        }
        if (m.g->nodes[i].op != DW_OP_MOE_LINEAR) continue;
        experts++;
        assert_int_equal(b->recipe, DW_RECIPE_FP8_BLOCK);
        for (int p = 0; p < DW_QPASS_COUNT; p++) {
            dw_grouped_args a = {.pass = p, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_FP8_BLOCK, .rows = 64,
                                 .experts = 4, .k = 128, .m = 256, .x = b, .w = b, .dy = b, .out = (void *)b,
                                 .offsets = (const int32_t *)b, .x_scales = (const float *)b,
                                 .w_scales = (const float *)b, .dy_scales = (const float *)b};
            const char *k = dw_grouped_registry_pick(DW_DEVICE_CPU, 0, &a, NULL, 0); /* what the registry offers */
            assert_non_null(k);
            assert_int_equal(b->quantised[p], p != DW_QPASS_WGRAD || fp8_wgrad);
            assert_string_equal(b->kernel[p], b->quantised[p] ? k : "grouped_cpu_reference");
        }
        assert_non_null(b->note);
        const bool said = strstr(b->note, "wgrad BF16 FALLBACK: fp8_block experts keep wgrad BF16 by default") != NULL;
        if (said == fp8_wgrad) fail_msg("%s: note %s the default: %s", m.g->nodes[i].name, said ? "names" : "lacks", b->note);
        assert_string_equal(b->kernel[DW_QPASS_FPROP], "grouped_cpu_fp8_block");
        const dw_ir_tensor *w = &m.g->tensors[m.g->nodes[i].in[1]];
        const int64_t codes = w->shape[0] * w->shape[1] * w->shape[2];
        for (int q = 0; q < 2; q++) assert_true(m.c->node[i].wq[q].off >= 0 && m.c->node[i].wq[q].bytes >= codes + codes / 16384 * 4);
        assert_true(m.c->bf16_lazy[m.c->tensor[m.g->nodes[i].in[1]].param]); /* no BF16 copy cast per update */
        bool refreshed = false;
        for (int s = m.c->phase[DW_PHASE_REFRESH][0]; s < m.c->phase[DW_PHASE_REFRESH][1]; s++)
            refreshed |= m.c->steps[s].kind == DW_STEP_QUANT_W && m.c->steps[s].node == i;
        assert_true(refreshed);
    }
    assert_int_equal(experts, 6);
    assert_true(routers == 2);
    dw_test_model_free(&m);
}

static void test_binding(void **state) {
    (void)state;
    check_binding("fp8_block", false);
    check_binding(DW_TEST_FP8_WGRAD, true);
}

/* One training forward and backward, step by step: at the expert node `name`'s forward and
 * backward, its operands and results against the quantisers and the fp8 grouped reference. */
static void check_node_exact(dw_test_model *m, const char *name, int64_t B, int64_t T) {
    dw_engine *e = m->e;
    dw_exec *x = e->x;
    const dw_compiled *p = m->c;
    const int node = node_named(m->g, name);
    const dw_ir_node *n = &m->g->nodes[node];
    const dw_ir_tensor *wt = &m->g->tensors[n->in[1]];
    const int64_t E = wt->shape[0], M = wt->shape[1], K = wt->shape[2], R = B * T * 2; /* top 2, dropless */
    int32_t tok[64], tgt[64];
    dw_test_random_tokens(tok, B * T, dw_graph_vocab(m->g), RNG);
    dw_test_random_tokens(tgt, B * T, dw_graph_vocab(m->g), RNG);
    assert_int_equal(dw_engine_zero_grad(e), DW_OK);
    assert_int_equal(dw_exec_set_batch(x, tok, tgt, B, T), DW_OK);

    /* the weight cache against the masters quantised here */
    const int pi = p->tensor[n->in[1]].param;
    float *w = dw_test_param_read(e, wt->name, NULL);
    assert_non_null(w);
    uint8_t *wc = malloc((size_t)(E * M * K)), *wtc = malloc((size_t)(E * M * K));
    const int64_t nb = E * (M / 128) * (K / 128);
    float *ws = malloc((size_t)nb * 4), *wts = malloc((size_t)nb * 4);
    assert_int_equal(dw_grouped_fp8_quantize_weights_cpu(CTX, w, E, M, K, wc, ws, wtc, wts), DW_OK);
    const dw_qslot_layout *q0 = &p->node[node].wq[0], *q1 = &p->node[node].wq[1];
    int64_t bad = same_bytes("W codes", x->work + q0->off, wc, (size_t)(E * M * K));
    bad += same_bytes("W scales", x->work + q0->off + q0->scales, ws, (size_t)nb * 4);
    bad += same_bytes("W^T codes", x->work + q1->off, wtc, (size_t)(E * M * K));
    bad += same_bytes("W^T scales", x->work + q1->off + q1->scales, wts, (size_t)nb * 4);

    float *xv = NULL, *yv = NULL, *off = NULL;
    int32_t offsets[65];
    uint8_t *codes = malloc((size_t)(R * (M > K ? M : K)));
    float *sc = malloc((size_t)(R * (M > K ? M : K) / 128) * 4), *ref = malloc((size_t)(R * (M > K ? M : K)) * 4);
    const double dloss = 1.0 / (double)(B * T);
    dw_exec_begin_phase(x, DW_PHASE_FORWARD);
    for (int s = p->phase[DW_PHASE_FORWARD][0]; s < p->phase[DW_PHASE_FORWARD][1]; s++) {
        assert_int_equal(dw_exec_step(x, s, true, dloss), DW_OK);
        if (p->steps[s].node != node) continue;
        xv = read_value(e, n->in[0], R * K), yv = read_value(e, n->out[0], R * M), off = read_value(e, n->in[2], E + 1);
        for (int64_t i = 0; i <= E; i++) offsets[i] = (int32_t)off[i];
        assert_int_equal(offsets[E], R);
        assert_int_equal(dw_grouped_fp8_quantize_rows_cpu(CTX, xv, R, K, codes, sc), DW_OK);
        const dw_qslot_layout *l = &p->work.q_rows;
        bad += same_bytes("x codes", x->work + l->off, codes, (size_t)(R * K));
        bad += same_bytes("x scales", x->work + l->off + l->scales, sc, (size_t)(R * K / 128) * 4);
        dw_cpu_moe_linear_fp8(ref, codes, sc, wc, ws, offsets, R, E, K, M);
        for (int64_t i = 0; i < R * M; i++) ref[i] = stored(e, ref[i]);
        bad += same_floats("y", yv, ref, R * M);
    }
    assert_non_null(xv);
    dw_exec_begin_phase(x, DW_PHASE_BACKWARD);
    bool seen = false;
    for (int s = p->phase[DW_PHASE_BACKWARD][0]; s < p->phase[DW_PHASE_BACKWARD][1]; s++) {
        assert_int_equal(dw_exec_step(x, s, true, dloss), DW_OK);
        if (p->steps[s].node != node || p->steps[s].kind != DW_STEP_BWD) continue;
        seen = true;
        assert_int_equal(p->node[node].grad_mode[0], DW_GRAD_WRITE); /* dx lands in its own buffer */
        float *dy = dw_test_act_grad_read(e, n->out[0], R * M), *dx = dw_test_act_grad_read(e, n->in[0], R * K);
        assert_int_equal(dw_grouped_fp8_quantize_rows_cpu(CTX, dy, R, M, codes, sc), DW_OK);
        const dw_qslot_layout *l = &p->work.q_rows;
        bad += same_bytes("dy codes", x->work + l->off, codes, (size_t)(R * M));
        bad += same_bytes("dy scales", x->work + l->off + l->scales, sc, (size_t)(R * M / 128) * 4);
        dw_cpu_moe_linear_fp8(ref, codes, sc, wtc, wts, offsets, R, E, M, K);
        for (int64_t i = 0; i < R * K; i++) ref[i] = stored(e, ref[i]);
        bad += same_floats("dx", dx, ref, R * K);
        const float *dW = x->grad + p->param_off[pi]; /* zeroed before: this pass's wgrad alone */
        float *want = calloc((size_t)(E * M * K), sizeof *want);
        if (p->node[node].bind.quantised[DW_QPASS_WGRAD]) { /* dy^T and x^T padded per expert */
            const int64_t P = dw_grouped_fp8_wgrad_cols(R, E);
            uint8_t *a = malloc((size_t)(M * P)), *b = malloc((size_t)(K * P));
            float *sa = malloc((size_t)(M * P / 128) * 4), *sb = malloc((size_t)(K * P / 128) * 4);
            assert_int_equal(dw_grouped_fp8_quantize_cols_cpu(CTX, dy, offsets, R, E, M, a, sa), DW_OK);
            assert_int_equal(dw_grouped_fp8_quantize_cols_cpu(CTX, xv, offsets, R, E, K, b, sb), DW_OK);
            bad += same_bytes("dy^T codes", x->work + p->work.q_dyt.off, a, (size_t)(M * P));
            bad += same_bytes("x^T codes", x->work + p->work.q_xt.off, b, (size_t)(K * P));
            dw_cpu_moe_linear_fp8_wgrad(want, a, sa, b, sb, offsets, E, M, K, P, false);
            free(a), free(b), free(sa), free(sb);
        } else { /* the BF16 wgrad: the CPU reference on the stored values */
            dw_cpu_moe_linear_bwd(NULL, want, dy, xv, NULL, offsets, R, E, K, M);
        }
        bad += same_floats("dW", dW, want, E * M * K);
        free(want), free(dy), free(dx);
    }
    assert_true(seen);
    if (bad) fail_msg("%s: %lld mismatches (first of each on stderr)", name, (long long)bad);
    free(w), free(wc), free(wtc), free(ws), free(wts), free(xv), free(yv), free(off), free(codes), free(sc), free(ref);
}

/* The fp8_block wgrad's operands and product too (DW_TEST_FP8_WGRAD: the rule's "bf16_passes": []). */
static void test_exact(void **state) {
    (void)state;
    const int64_t B = 2, T = 16;
    dw_test_model m;
    assert_int_equal(dw_test_model_build(CTX, mixtral128(B, T), DW_TEST_FP8_WGRAD, DW_DEVICE_AUTO, &m), DW_OK);
    assert_true(m.c->node[node_named(m.g, "model.layers.1.mlp.experts.down")].bind.quantised[DW_QPASS_WGRAD]);
    dw_test_random_params(m.e, RNG, 0.05f, NULL, 0.05f);
    assert_int_equal(dw_engine_refresh(m.e), DW_OK);
    check_node_exact(&m, "model.layers.1.mlp.experts.down", B, T);
    check_node_exact(&m, "model.layers.0.mlp.experts.down", B, T);
    dw_test_model_free(&m);
}

/* A program compiled for CUDA (sm_90, DW_MOE_FP8 unset: the default) runs on the CPU engine in the
 * same arithmetic: the fp8 CPU reference where the GPU runs the sm_90 kernel (its wgrad too, under
 * DW_TEST_FP8_WGRAD). */
static void test_cuda_program_on_cpu(void **state) {
    (void)state;
    const int64_t B = 2, T = 16;
    unsetenv("DW_MOE_FP8");
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.device = DW_DEVICE_CUDA, o.sm = 90;
    dw_test_model m;
    assert_int_equal(dw_test_model_build_opts(CTX, mixtral128(B, T), DW_TEST_FP8_WGRAD, &o, &m), DW_OK);
    const int node = node_named(m.g, "model.layers.0.mlp.experts.down");
    assert_string_equal(m.c->node[node].bind.kernel[DW_QPASS_FPROP], "grouped_fp8block_sm90");
    assert_string_equal(m.c->node[node].bind.kernel[DW_QPASS_WGRAD], "grouped_fp8block_sm90");
    dw_test_random_params(m.e, RNG, 0.05f, NULL, 0.05f);
    assert_int_equal(dw_engine_refresh(m.e), DW_OK);
    check_node_exact(&m, "model.layers.0.mlp.experts.down", B, T);
    dw_test_model_free(&m);
}

static void test_training(void **state) {
    (void)state;
    const int64_t B = 2, T = 16;
    dw_test_model m;
    assert_int_equal(dw_test_model_build(CTX, mixtral128(B, T), "fp8_block", DW_DEVICE_AUTO, &m), DW_OK);
    double first = 0, last = 0;
    assert_int_equal(dw_test_model_train_random(&m, B, T, 30, 1e-2, RNG, &first, &last), DW_OK);
    if (!(last < first - 0.5)) fail_msg("fp8_block experts: loss %.5f -> %.5f did not fall", first, last);
    dw_test_model_free(&m);
}

/* {"op": "moe_linear", "recipe": "bf16"} keeps the experts BF16 (no weight cache, no fp8 slot):
 * the output equals the BF16 grouped reference on the BF16 weights, exactly. */
static void test_rule_keeps_bf16(void **state) {
    (void)state;
    const int64_t B = 2, T = 16, R = B * T * 2;
    dw_test_model m;
    memset(&m, 0, sizeof m);
    m.g = mixtral128(B, T);
    m.pol = policy_json("{\"default\": \"fp8_block\", \"rules\": [{\"op\": \"moe_linear\", \"recipe\": \"bf16\"}]}");
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    assert_int_equal(dw_compile(CTX, m.g, NULL, m.pol, &o, &m.c), DW_OK);
    assert_int_equal(dw_engine_create(CTX, m.c, NULL, &m.e), DW_OK);
    for (int i = 0; i < m.g->n_nodes; i++) {
        const dw_node_binding *b = &m.c->node[i].bind;
        if (m.g->nodes[i].op == DW_OP_MOE_LINEAR) {
            assert_int_equal(b->recipe, DW_RECIPE_BF16);
            assert_int_equal(b->reason, DW_POLICY_BY_RULE);
            assert_true(!b->quantised[0] && !b->quantised[1] && !b->quantised[2]);
            assert_string_equal(b->kernel[0], "grouped_cpu_reference");
            assert_true(m.c->node[i].wq[0].off < 0);
        }
        if (!strcmp(m.g->nodes[i].name, "model.layers.0.self_attn.q_proj")) assert_int_equal(b->recipe, DW_RECIPE_FP8_BLOCK);
    }
    dw_test_random_params(m.e, RNG, 0.05f, NULL, 0.05f);
    assert_int_equal(dw_engine_refresh(m.e), DW_OK);
    int32_t tok[32];
    dw_test_random_tokens(tok, B * T, dw_graph_vocab(m.g), RNG);
    const int node = node_named(m.g, "model.layers.1.mlp.experts.gate");
    const dw_ir_node *n = &m.g->nodes[node];
    const dw_ir_tensor *wt = &m.g->tensors[n->in[1]];
    const int64_t E = wt->shape[0], M = wt->shape[1], K = wt->shape[2];
    assert_int_equal(dw_exec_set_batch(m.e->x, tok, tok, B, T), DW_OK);
    dw_exec_begin_phase(m.e->x, DW_PHASE_FORWARD);
    int64_t bad = -1;
    for (int s = m.c->phase[DW_PHASE_FORWARD][0]; s < m.c->phase[DW_PHASE_FORWARD][1]; s++) {
        assert_int_equal(dw_exec_step(m.e->x, s, false, 1.0), DW_OK);
        if (m.c->steps[s].node != node) continue;
        float *xv = read_value(m.e, n->in[0], R * K), *yv = read_value(m.e, n->out[0], R * M);
        float *off = read_value(m.e, n->in[2], E + 1), *ref = malloc((size_t)(R * M) * 4);
        float *w = dw_test_param_read(m.e, wt->name, NULL);
        int32_t offsets[9];
        for (int64_t i = 0; i <= E; i++) offsets[i] = (int32_t)off[i];
        for (int64_t i = 0; i < E * M * K; i++) w[i] = dw_decode_bf16(dw_encode_bf16(w[i])); /* the BF16 copy */
        dw_cpu_moe_linear_fwd(ref, xv, w, offsets, R, E, K, M);
        for (int64_t i = 0; i < R * M; i++) ref[i] = stored(m.e, ref[i]);
        bad = same_floats("bf16 experts' y", yv, ref, R * M);
        free(xv), free(yv), free(off), free(ref), free(w);
    }
    assert_int_equal(bad, 0);
    dw_test_model_free(&m);
}

/* A rule's "bf16_passes" keeps those GEMMs BF16 in a quantised recipe (Transformer Engine's
 * override_linear_precision): experts with ["wgrad"] run fprop and dgrad in fp8_block and the
 * wgrad in BF16 — the weight gradient equals the BF16 grouped reference on the stored dy and x,
 * exactly, and the note says which rule; a dense layer with ["dgrad"] keeps its dgrad BF16. */
static void test_rule_bf16_passes(void **state) {
    (void)state;
    const int64_t B = 2, T = 16;
    dw_test_model m;
    memset(&m, 0, sizeof m);
    m.g = mixtral128(B, T);
    m.pol = policy_json("{\"default\": \"fp8_block\", \"rules\": ["
                        "{\"op\": \"moe_linear\", \"recipe\": \"fp8_block\", \"bf16_passes\": [\"wgrad\"]},"
                        "{\"match\": \"*.q_proj\", \"recipe\": \"fp8_block\", \"bf16_passes\": [\"dgrad\"]}]}");
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    assert_int_equal(dw_compile(CTX, m.g, NULL, m.pol, &o, &m.c), DW_OK);
    assert_int_equal(dw_engine_create(CTX, m.c, NULL, &m.e), DW_OK);
    int experts = 0, dense = 0;
    for (int i = 0; i < m.g->n_nodes; i++) {
        const dw_node_binding *b = &m.c->node[i].bind;
        const bool expert = m.g->nodes[i].op == DW_OP_MOE_LINEAR, q = strstr(m.g->nodes[i].name, ".q_proj") != NULL;
        if (!expert && !q) continue;
        assert_int_equal(b->recipe, DW_RECIPE_FP8_BLOCK);
        assert_int_equal(b->reason, DW_POLICY_BY_RULE);
        const int kept = expert ? DW_QPASS_WGRAD : DW_QPASS_DGRAD;
        for (int p = 0; p < DW_QPASS_COUNT; p++) assert_int_equal(b->quantised[p], p != kept);
        assert_non_null(b->note);
        const char *want = expert ? "policy rule 0 keeps wgrad BF16" : "policy rule 1 keeps dgrad BF16";
        if (!strstr(b->note, want)) fail_msg("%s: note lacks '%s': %s", m.g->nodes[i].name, want, b->note);
        experts += expert, dense += q;
    }
    assert_int_equal(experts, 6);
    assert_int_equal(dense, 2);
    dw_test_random_params(m.e, RNG, 0.05f, NULL, 0.05f);
    assert_int_equal(dw_engine_refresh(m.e), DW_OK);
    check_node_exact(&m, "model.layers.1.mlp.experts.down", B, T); /* its else branch: the BF16 wgrad */
    dw_test_model_free(&m);
}

/* The CUDA target: on sm_90 fprop and dgrad run the fp8_block kernel by default (DW_MOE_FP8 unset)
 * and with DW_MOE_FP8=1; with DW_MOE_FP8=0 the experts stay BF16 and the note names the switch; on
 * sm_100 the sm_90 kernel is not offered. wgrad stays BF16 in each, the note naming the default.
 * Where dgrad runs quantised, each expert SwiGLU's backward writes its gradients' rows too, and each
 * combine's backward the down layer's dy rows. */
static void test_cuda_target(void **state) {
    (void)state;
    dw_graph *g = mixtral128(2, 16);
    dw_policy *pol = NULL;
    assert_int_equal(dw_policy_from_precision(CTX, "fp8_block", false, &pol), DW_OK);
    const int node = node_named(g, "model.layers.0.mlp.experts.up");
    const struct {
        int sm;
        const char *env, *note, *fprop; /* env NULL: DW_MOE_FP8 unset */
    } cases[] = {{90, NULL, NULL, "grouped_fp8block_sm90"},
                 {90, "0", "switched off by DW_MOE_FP8=0", "grouped_wgmma_sm90"},
                 {100, NULL, "needs sm_90, device is sm_100", NULL},
                 {90, "1", NULL, "grouped_fp8block_sm90"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        if (cases[k].env) setenv("DW_MOE_FP8", cases[k].env, 1);
        else unsetenv("DW_MOE_FP8");
        dw_compile_opts o;
        dw_compile_opts_init(&o, sizeof o);
        o.device = DW_DEVICE_CUDA, o.sm = cases[k].sm;
        dw_compiled *c = NULL;
        if (dw_compile(CTX, g, NULL, pol, &o, &c) != DW_OK) fail_msg("compile sm_%d: %s", cases[k].sm, dw_errmsg(CTX));
        const dw_node_binding *b = &c->node[node].bind;
        assert_int_equal(b->recipe, DW_RECIPE_FP8_BLOCK);
        assert_non_null(b->note);
        assert_false(b->quantised[DW_QPASS_WGRAD]);
        if (!strstr(b->note, "wgrad BF16 FALLBACK: fp8_block experts keep wgrad BF16 by default"))
            fail_msg("sm_%d note lacks the default wgrad: %s", cases[k].sm, b->note);
        if (cases[k].note) {
            assert_false(b->quantised[DW_QPASS_FPROP] || b->quantised[DW_QPASS_DGRAD]);
            if (!strstr(b->note, cases[k].note)) fail_msg("sm_%d note lacks '%s': %s", cases[k].sm, cases[k].note, b->note);
            assert_true(c->node[node].wq[0].off < 0);
        } else {
            assert_true(b->quantised[DW_QPASS_FPROP] && b->quantised[DW_QPASS_DGRAD]);
            assert_true(c->node[node].wq[0].off >= 0);
        }
        if (cases[k].fprop) assert_string_equal(b->kernel[DW_QPASS_FPROP], cases[k].fprop);
        /* each expert SwiGLU's backward writes its gradients' fp8_block rows for the gate and up
         * layers' dgrad where those run quantised (dw_compile_swiglu_bwd_moe_rows), into a workspace
         * region of its own that holds both: codes [R, F] and scales [R, F/128] of each */
        int swiglus = 0, taken = 0, routers = 0;
        int64_t need = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            routers += g->nodes[i].op == DW_OP_MOE_ROUTER;
            int L[2];
            if (!dw_compile_swiglu_bwd_moe_rows(c, i, L)) continue;
            taken++;
            for (int t = 0; t < 2; t++) {
                assert_int_equal(g->nodes[L[t]].op, DW_OP_MOE_LINEAR);
                assert_int_equal(g->tensors[g->nodes[i].in[t]].producer, L[t]);
                assert_true(c->node[L[t]].bind.quantised[DW_QPASS_DGRAD]);
            }
            if (!strstr(g->nodes[L[0]].name, "experts.gate") || !strstr(g->nodes[L[1]].name, "experts.up"))
                fail_msg("SwiGLU %s: layers %s and %s", g->nodes[i].name, g->nodes[L[0]].name, g->nodes[L[1]].name);
            const int64_t R = c->tensor[g->nodes[i].in[0]].rows_cap, F = 256;
            const int64_t bytes = 2 * ((R * F + 255) / 256 * 256) + 2 * ((R * (F / 128) * 4 + 255) / 256 * 256);
            if (bytes > need) need = bytes;
        }
        int combines = 0; /* and each combine's backward the down layer's dy rows, in the same region */
        for (int i = 0; i < g->n_nodes; i++) {
            const int d = dw_compile_combine_bwd_moe_rows(c, i);
            if (d < 0) continue;
            combines++;
            assert_int_equal(g->tensors[g->nodes[i].in[0]].producer, d);
            if (!strstr(g->nodes[d].name, "experts.down")) fail_msg("combine %s: layer %s", g->nodes[i].name, g->nodes[d].name);
            const int64_t R = c->tensor[g->nodes[i].in[0]].rows_cap, C = 128;
            const int64_t bytes = (R * C + 255) / 256 * 256 + (R * (C / 128) * 4 + 255) / 256 * 256;
            if (bytes > need) need = bytes;
        }
        assert_int_equal(combines, cases[k].note ? 0 : routers);
        for (int i = 0; i < g->n_nodes; i++) swiglus += g->nodes[i].op == DW_OP_SWIGLU;
        assert_int_equal(swiglus, routers);
        assert_int_equal(taken, cases[k].note ? 0 : routers);
        if (taken) assert_true(c->work.glu_rows >= 0 && c->work.glu_rows % 256 == 0 && c->work.glu_rows_bytes >= need &&
                               c->work.glu_rows + c->work.glu_rows_bytes <= c->work.bytes);
        else assert_true(c->work.glu_rows < 0 && c->work.glu_rows_bytes == 0);
        dw_compiled_free(c);
    }
    unsetenv("DW_MOE_FP8");
    dw_policy_free(pol);
    dw_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_binding),          cmocka_unit_test(test_exact),
        cmocka_unit_test(test_cuda_program_on_cpu), cmocka_unit_test(test_training),
        cmocka_unit_test(test_rule_keeps_bf16),  cmocka_unit_test(test_rule_bf16_passes),
        cmocka_unit_test(test_cuda_target),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
