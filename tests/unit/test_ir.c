/* test_ir.c — graph IR and capture: op tables, graphs of random configs (params against the
 * closed form, FLOPs against independently derived matmul/attention counts), JSON round trips,
 * verification errors that name the node, refusal of planning-only shapes, inference of the
 * Qwen MoE ops (head_rmsnorm, sigmoid_gate). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "capture/capture.h"
#include "capture/model_config.h"
#include "ir/ir.h"
#include "deepwell.h"
#include "testutil.h"


#define assert_close(a, b, tol)                                                             \
    do {                                                                                    \
        double a_ = (a), b_ = (b);                                                          \
        if (!(fabs(a_ - b_) <= (tol))) fail_msg("%s = %.17g, expected %.17g", #a, a_, b_);  \
    } while (0)

static void test_op_tables(void **state) {
    (void)state;
    const char *want[] = {"embedding", "position", "rope", "layernorm", "rmsnorm", "linear", "gelu",
                          "silu", "swiglu", "add", "attention", "cross_entropy", "head_xent", "moe_router",
                          "moe_dispatch",
                          "moe_linear", "moe_combine", "moe_aux_stats", "moe_aux_loss", "head_rmsnorm",
                          "sigmoid_gate", "softcap", "geglu", "gelu_erf", "relu"};
    assert_int_equal(DW_OP_COUNT, sizeof want / sizeof want[0]);
    for (int i = 0; i < DW_OP_COUNT; i++) {
        assert_string_equal(dw_op_name((dw_op)i), want[i]);
        dw_op op;
        assert_true(dw_op_parse(want[i], &op));
        assert_int_equal(op, i);
        assert_true(strlen(dw_op_summary((dw_op)i)) > 10);
        assert_int_equal(dw_op_outputs((dw_op)i),
                         i == DW_OP_MOE_ROUTER || i == DW_OP_MOE_AUX_STATS ? 2 : i == DW_OP_MOE_DISPATCH ? 3 : 1);
    }
    dw_op op;
    assert_false(dw_op_parse("moe", &op));
    assert_string_equal(dw_op_name(DW_OP_COUNT), "?");
}

/* A random small config of the given family. */
static dw_model_config random_config(int family) {
    dw_model_config c;
    const char *preset[] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny", "mixtral-tiny", "olmoe-tiny"};
    assert_int_equal(dw_model_config_load(dw_test_ctx, preset[family], &c), DW_OK);
    if (c.n_experts) {
        c.n_experts = dw_test_rnd(1, 6);
        c.top_k = dw_test_rnd(1, c.n_experts);
        c.d_ff_expert = dw_test_rnd(2, 40);
    }
    c.n_kv_heads = dw_test_rnd(1, 3);
    c.n_heads = family == 0 ? c.n_kv_heads : c.n_kv_heads * dw_test_rnd(1, 3);
    if (family == 0) c.n_kv_heads = c.n_heads;
    c.head_dim = 2 * dw_test_rnd(1, 8);
    c.d_model = family == 0 ? c.n_heads * c.head_dim : dw_test_rnd(4, 40);
    c.n_layers = dw_test_rnd(1, 4);
    c.d_ff = dw_test_rnd(4, 70);
    c.vocab_size = dw_test_rnd(5, 300);
    c.max_seq = dw_test_rnd(8, 64);
    c.tie_embeddings = dw_test_rnd(0, 1);
    if (family == 1) {
        c.qkv_bias = dw_test_rnd(0, 1);
        c.mlp_bias = dw_test_rnd(0, 1);
    }
    if (c.n_experts) c.d_ff = c.d_ff_expert; /* Mixtral's intermediate_size is the experts' */
    return c;
}

/* Matmul parameters (weights multiplying activations: everything but embeddings, norms and
 * biases; the LM head counts even when tied) and bias parameters, derived from the config. */
static void matmul_params(const dw_model_config *c, double *mm, double *bias) {
    double d = (double)c->d_model, q = (double)(c->n_heads * c->head_dim),
           kv = (double)(c->n_kv_heads * c->head_dim), F = (double)c->d_ff, L = (double)c->n_layers;
    bool glu = c->arch != DW_ARCH_GPT2;
    *mm = L * (d * q + 2 * d * kv + q * d + (glu ? 3 : 2) * d * F) + (double)c->vocab_size * d;
    if (c->n_experts) /* the router, and the top-k experts a token passes through (moe_linear) */
        *mm = L * (d * q + 2 * d * kv + q * d + d * (double)c->n_experts) + (double)c->vocab_size * d;
    bool ob = c->arch == DW_ARCH_GPT2 || (c->arch == DW_ARCH_LLAMA && c->qkv_bias);
    *bias = L * ((c->qkv_bias ? q + 2 * kv : 0) + (ob ? d : 0) +
                 (c->arch == DW_ARCH_GPT2 ? F + d : c->mlp_bias ? 2 * F + d : 0));
}

static void test_capture_random_configs(void **state) {
    (void)state;
    for (int it = 0; it < 50; it++) {
        dw_model_config c = random_config(it % 5);
        int64_t B = dw_test_rnd(1, 3), T = dw_test_rnd(1, c.max_seq);
        dw_graph *g = NULL;
        if (dw_capture_config(dw_test_ctx, &c, B, T, &g) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
        assert_int_equal(dw_graph_params(g), dw_model_config_params(&c));
        assert_int_equal(dw_graph_seq(g), T);
        /* every parameter is a distinct HF name; the tied head reuses the embedding */
        int heads = 0;
        for (int i = 0; i < g->n_nodes; i++)
            if (!strcmp(g->nodes[i].name, "lm_head")) {
                heads++;
                const char *w = g->tensors[g->nodes[i].in[1]].name;
                const char *emb = c.arch == DW_ARCH_GPT2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
                assert_string_equal(w, c.tie_embeddings ? emb : "lm_head.weight");
            }
        assert_int_equal(heads, 1);
        /* FLOPs: linear nodes = 6 per matmul parameter per token + 2 per bias; attention as
         * counted causally; the rest (elementwise) is small but present. */
        double lin = 0, attn = 0, total = 0, moe = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            double f, b;
            dw_ir_flops(g, &g->nodes[i], &f, &b);
            total += f + b;
            if (g->nodes[i].op == DW_OP_LINEAR) lin += f + b;
            if (g->nodes[i].op == DW_OP_MOE_LINEAR) moe += f + b;
            if (g->nodes[i].op == DW_OP_ATTENTION) attn += f + b;
        }
        double mm, bias, N = (double)(B * T);
        matmul_params(&c, &mm, &bias);
        assert_close(lin, 6 * mm * N + 2 * bias * N, 1e-6 * lin);
        const double active = (double)c.top_k * 3 * (double)c.d_model * (double)c.d_ff_expert * (double)c.n_layers;
        assert_close(moe, c.n_experts ? 6 * active * N : 0.0, 1e-9 * moe);
        double pairs = (double)B * (double)c.n_heads * (double)T * (double)(T + 1) / 2;
        assert_close(attn, (double)c.n_layers * (12.0 * (double)c.head_dim + 10) * pairs,
                            1e-9 * attn);
        assert_close(dw_graph_flops_per_token(g), total / N, 1e-9 * total);
        assert_true(total > lin + attn + moe && total < 1.5 * (lin + attn + moe) + 100 * N * (double)c.d_model * 40);
        dw_graph_free(g);
    }
}

static void test_json_round_trip(void **state) {
    (void)state;
    const char *models[] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny"};
    for (int i = 0; i < 3; i++) {
        dw_graph *g = NULL, *g2 = NULL;
        assert_int_equal(dw_capture_hf_shape(dw_test_ctx, models[i], dw_test_rnd(1, 4), dw_test_rnd(1, 256), &g), DW_OK);
        char *a = NULL, *b = NULL;
        assert_int_equal(dw_graph_to_json(dw_test_ctx, g, i == 0, &a), DW_OK);
        if (dw_graph_from_json(dw_test_ctx, a, strlen(a), "a.json", &g2) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
        assert_int_equal(dw_graph_to_json(dw_test_ctx, g2, i == 0, &b), DW_OK);
        assert_string_equal(a, b);
        assert_int_equal(dw_graph_params(g2), dw_graph_params(g));
        assert_int_equal(dw_graph_node_count(g2), dw_graph_node_count(g));
        json_t *j = json_loads(a, 0, NULL);
        assert_non_null(j);
        assert_int_equal(json_integer_value(json_object_get(j, "params")), dw_graph_params(g));
        assert_true(json_number_value(json_object_get(j, "flops_per_token")) > 0);
        assert_int_equal((int)json_array_size(json_object_get(j, "nodes")), dw_graph_node_count(g));
        json_decref(j);
        char *text = NULL;
        assert_int_equal(dw_graph_print(dw_test_ctx, g, &text), DW_OK);
        assert_non_null(strstr(text, i == 0 ? "transformer.h.3.mlp.c_proj" : "model.layers.3.mlp.down_proj"));
        assert_non_null(strstr(text, "params:"));
        dw_free_string(text);
        dw_free_string(a);
        dw_free_string(b);
        dw_graph_free(g);
        dw_graph_free(g2);
    }
}

/* Applies `edit` to the JSON of llama-tiny and expects loading to fail with `needle`. */
static void expect_load_error(void (*edit)(json_t *), const char *needle) {
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_hf_shape(dw_test_ctx, "llama-tiny", 2, 16, &g), DW_OK);
    json_t *j = dw_graph_json(g);
    dw_graph_free(g);
    edit(j);
    char *text = json_dumps(j, 0);
    json_decref(j);
    dw_graph *bad = (dw_graph *)1;
    dw_status s = dw_graph_from_json(dw_test_ctx, text, strlen(text), "g.json", &bad);
    free(text);
    if (s == DW_OK || !strstr(dw_errmsg(dw_test_ctx), needle))
        fail_msg("expected an error with '%s', got %s '%s'", needle, dw_status_name(s), dw_errmsg(dw_test_ctx));
    assert_null(bad);
}

static json_t *node_named(json_t *j, const char *name) {
    json_t *ns = json_object_get(j, "nodes");
    for (size_t i = 0; i < json_array_size(ns); i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(ns, i), "name")), name))
            return json_array_get(ns, i);
    fail_msg("no node %s", name);
    return NULL;
}
static void edit_shape(json_t *j) {
    json_t *n = node_named(j, "model.layers.1.mlp.down_proj");
    json_array_set_new(json_object_get(n, "shape"), 2, json_integer(129));
}
static void edit_input(json_t *j) {
    json_t *n = node_named(j, "model.layers.2.self_attn.o_proj");
    json_array_set_new(json_object_get(n, "inputs"), 0, json_string("model.layers.2.nowhere"));
}
static void edit_weight(json_t *j) {
    json_t *ts = json_object_get(j, "tensors");
    for (size_t i = 0; i < json_array_size(ts); i++) {
        json_t *t = json_array_get(ts, i);
        if (!strcmp(json_string_value(json_object_get(t, "name")), "model.layers.0.mlp.up_proj.weight"))
            json_array_set_new(json_object_get(t, "shape"), 1, json_integer(127));
    }
}
static void edit_op(json_t *j) {
    json_object_set_new(node_named(j, "model.norm"), "op", json_string("moe"));
}
static void edit_heads(json_t *j) {
    json_t *a = json_object_get(node_named(j, "model.layers.3.self_attn.sdpa"), "attrs");
    json_object_set_new(a, "kv_heads", json_integer(3));
}
static void edit_order(json_t *j) {
    json_t *ns = json_object_get(j, "nodes");
    json_t *first = json_incref(json_array_get(ns, 1));
    json_array_remove(ns, 1);
    json_array_append_new(ns, first);
}
static void edit_format(json_t *j) { json_object_set_new(j, "format", json_string("onnx")); }

static void test_verify_errors(void **state) {
    (void)state;
    expect_load_error(edit_shape, "node 'model.layers.1.mlp.down_proj' (linear)");
    expect_load_error(edit_input, "node 'model.layers.2.self_attn.o_proj': input 'model.layers.2.nowhere'");
    expect_load_error(edit_weight, "node 'model.layers.0.mlp.up_proj' (linear): weight");
    expect_load_error(edit_op, "unknown op 'moe'");
    expect_load_error(edit_heads, "node 'model.layers.3.self_attn.sdpa' (attention)");
    expect_load_error(edit_order, "model.layers.0.input_layernorm");
    expect_load_error(edit_format, "'format'");
}

/* head_rmsnorm and sigmoid_gate: inference accepts the shapes the Qwen MoE blocks give them and
 * refuses others, naming the node. */
static void test_infer_gate_ops(void **state) {
    (void)state;
    dw_graph_model model = {.n_blocks = 1, .vocab = 8, .max_seq = 8};
    dw_graph *g = dw_graph_new(&model, 2, 3);
    assert_non_null(g);
    const int64_t x12[3] = {2, 3, 12}, g1[3] = {2, 3, 1}, g2[3] = {2, 3, 2}, g4[3] = {2, 4, 1}, w4[1] = {4}, w5[1] = {5};
    const int x = dw_graph_add_tensor(g, "x", DW_TENSOR_INPUT, DW_IR_F32, 3, x12);
    const int gl = dw_graph_add_tensor(g, "g", DW_TENSOR_INPUT, DW_IR_F32, 3, g1);
    const int gw = dw_graph_add_tensor(g, "g2", DW_TENSOR_INPUT, DW_IR_F32, 3, g2);
    const int gt = dw_graph_add_tensor(g, "g4", DW_TENSOR_INPUT, DW_IR_F32, 3, g4);
    const int n4 = dw_graph_add_tensor(g, "n4.weight", DW_TENSOR_PARAM, DW_IR_F32, 1, w4);
    const int n5 = dw_graph_add_tensor(g, "n5.weight", DW_TENSOR_PARAM, DW_IR_F32, 1, w5);
    const dw_ir_attrs h4 = {.eps = 1e-6, .head_dim = 4}, h5 = {.eps = 1e-6, .head_dim = 5}, h0 = {.head_dim = 4};
    int in[2] = {x, n4};
    assert_true(dw_graph_add_node(dw_test_ctx, g, DW_OP_HEAD_RMSNORM, "q_norm", in, 2, &h4, "qn") >= 0);
    in[1] = n5;
    assert_true(dw_graph_add_node(dw_test_ctx, g, DW_OP_HEAD_RMSNORM, "bad_norm", in, 2, &h5, "b1") < 0);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "node 'bad_norm' (head_rmsnorm): head_dim 5 must divide the width 12"));
    assert_true(dw_graph_add_node(dw_test_ctx, g, DW_OP_HEAD_RMSNORM, "bad_w", in, 2, &h4, "b2") < 0);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "'n5.weight' has 5 elements; expected 4"));
    in[1] = n4;
    assert_true(dw_graph_add_node(dw_test_ctx, g, DW_OP_HEAD_RMSNORM, "bad_eps", in, 2, &h0, "b3") < 0);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "eps"));
    in[1] = gl;
    assert_true(dw_graph_add_node(dw_test_ctx, g, DW_OP_SIGMOID_GATE, "gated", in, 2, NULL, "y") >= 0);
    const int bad_gates[2] = {gw, gt};
    for (int k = 0; k < 2; k++) {
        in[1] = bad_gates[k];
        char name[16];
        snprintf(name, sizeof name, "bad_gate%d", k);
        assert_true(dw_graph_add_node(dw_test_ctx, g, DW_OP_SIGMOID_GATE, name, in, 2, NULL, name) < 0);
        assert_non_null(strstr(dw_errmsg(dw_test_ctx), "(sigmoid_gate): gate"));
        assert_non_null(strstr(dw_errmsg(dw_test_ctx), "must be (2,3,1)"));
    }
    dw_graph_free(g);
}

static void test_refusals(void **state) {
    (void)state;
    const char *planning[] = {"llama-8b", "llama-70b", "llama-405b", "mixtral-8x7b", "deepseek-v3"};
    for (size_t i = 0; i < 5; i++) {
        dw_graph *g = (dw_graph *)1;
        assert_int_equal(dw_capture_hf(dw_test_ctx, planning[i], &g), DW_ERR_UNSUPPORTED);
        assert_null(g);
        assert_non_null(strstr(dw_errmsg(dw_test_ctx), "planning-only"));
    }
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_hf_shape(dw_test_ctx, "gpt2-tiny", 1, 257, &g), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "256"));
    assert_int_equal(dw_capture_hf(dw_test_ctx, "llama-1b", &g), DW_OK); /* real shape, not allocated */
    assert_int_equal(dw_graph_params(g), 1235814400);
    assert_int_equal(dw_graph_seq(g), 2048);
    dw_graph_free(g);
    dw_graph_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_tables),       cmocka_unit_test(test_capture_random_configs),
        cmocka_unit_test(test_json_round_trip), cmocka_unit_test(test_verify_errors),
        cmocka_unit_test(test_refusals),        cmocka_unit_test(test_infer_gate_ops),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
