/* test_embed_pad.c — the embedding's padding row (nn.Embedding padding_idx, issue 26): the CPU
 * backward leaves row pad exactly as it was (the tied head's contribution, or zero) and every
 * other row bit for bit as the unpadded backward gives it; config.json's pad_token_id reaches the
 * embedding node of the Llama-like families (not GPT-2), round-trips through the config and graph
 * JSON (negative ids counting from the end, ids outside the vocabulary giving none), a pad outside
 * the table is refused by graph inference and a pad_token_id that is not an integer by name. Fresh
 * random tokens and gradients a run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "capture/model_config_impl.h"
#include "core/json.h"
#include "ir/ir.h"
#include "kernels/cpu/ops_cpu.h"
#include "testutil.h"

static dw_test_rng g_rng;

static int setup(void **state) {
    (void)state;
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0xFADull);
    return 0;
}

/* Random tokens (N) in [0,V) with at least three at pad, random dout (N,C), random or zero start. */
static void check_kernel(int64_t V, int64_t N, int64_t C, bool tied) {
    const int64_t pad = (int64_t)(dw_test_next(&g_rng) % (uint64_t)V);
    int32_t *tok = malloc((size_t)N * sizeof *tok);
    float *dout = malloc((size_t)(N * C) * sizeof *dout);
    float *start = malloc((size_t)(V * C) * sizeof *start);
    float *want = malloc((size_t)(V * C) * sizeof *want), *got = malloc((size_t)(V * C) * sizeof *got);
    assert_true(tok && dout && start && want && got);
    int64_t pads = 0;
    for (int64_t n = 0; n < N; n++) {
        tok[n] = (int32_t)(n % 4 == 1 ? pad : (int64_t)(dw_test_next(&g_rng) % (uint64_t)V));
        pads += tok[n] == pad;
    }
    assert_true(pads >= 3);
    for (int64_t i = 0; i < N * C; i++) dout[i] = dw_test_uniform(&g_rng, -1.0f, 1.0f);
    /* tied: the LM head's gradient is already in the table's gradient when the lookup's adds */
    for (int64_t i = 0; i < V * C; i++) start[i] = tied ? dw_test_uniform(&g_rng, -1.0f, 1.0f) : 0.0f;
    memcpy(want, start, (size_t)(V * C) * sizeof *want);
    memcpy(got, start, (size_t)(V * C) * sizeof *got);
    dw_cpu_embedding_bwd(want, dout, tok, N, C);
    dw_cpu_embedding_bwd_pad(got, dout, tok, N, C, pad);
    for (int64_t v = 0; v < V; v++) {
        const float *expect = v == pad ? start + v * C : want + v * C;
        if (memcmp(got + v * C, expect, (size_t)C * sizeof *got))
            fail_msg("V %lld N %lld C %lld %s: row %lld (pad %lld) differs", (long long)V, (long long)N,
                     (long long)C, tied ? "tied" : "untied", (long long)v, (long long)pad);
    }
    /* the pad positions did carry gradient: the unpadded backward changes that row */
    assert_true(memcmp(want + pad * C, start + pad * C, (size_t)C * sizeof *want) != 0);
    /* pad -1 is the unpadded backward */
    memcpy(got, start, (size_t)(V * C) * sizeof *got);
    dw_cpu_embedding_bwd_pad(got, dout, tok, N, C, -1);
    assert_memory_equal(got, want, (size_t)(V * C) * sizeof *got);
    free(tok), free(dout), free(start), free(want), free(got);
}

static void test_kernel_pad(void **state) {
    (void)state;
    const int64_t sizes[][3] = {{1, 5, 3}, {7, 13, 5}, {37, 64, 17}, {300, 257, 33}};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        for (int tied = 0; tied < 2; tied++) check_kernel(sizes[k][0], sizes[k][1], sizes[k][2], tied);
}

/* A tiny config of model_type `type` with pad_token_id `pad` (JSON text; NULL: the key absent). */
static json_t *tiny(const char *type, const char *pad) {
    const char *gpt2 = "{\"model_type\": \"gpt2\", \"vocab_size\": 50, \"n_embd\": 16, \"n_layer\": 1, "
                       "\"n_head\": 2, \"n_positions\": 32}";
    const char *llama = "{\"vocab_size\": 50, \"hidden_size\": 16, \"num_hidden_layers\": 1, "
                        "\"num_attention_heads\": 2, \"num_key_value_heads\": 2, \"head_dim\": 8, "
                        "\"intermediate_size\": 24, \"max_position_embeddings\": 32}";
    json_error_t e;
    json_t *j = json_loads(strcmp(type, "gpt2") ? llama : gpt2, 0, &e);
    assert_non_null(j);
    json_object_set_new(j, "model_type", json_string(type));
    if (pad) {
        json_t *v = json_loads(pad, JSON_DECODE_ANY, &e);
        assert_non_null(v);
        json_object_set_new(j, "pad_token_id", v);
    }
    return j;
}

static const dw_ir_node *embedding_node(const dw_graph *g) {
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == DW_OP_EMBEDDING) return &g->nodes[i];
    fail_msg("no embedding node");
    return NULL;
}

/* The config read from `type` with pad_token_id `pad`: has_pad and the row, then the graph. */
static void check_capture(const char *type, const char *pad, bool has, int64_t row) {
    json_t *j = tiny(type, pad);
    dw_model_config c;
    if (dw_model_config_from_json(dw_test_ctx, j, "config.json", &c) != DW_OK)
        fail_msg("%s pad_token_id %s: %s", type, pad ? pad : "(absent)", dw_errmsg(dw_test_ctx));
    json_decref(j);
    if (c.has_pad != has || (has && c.pad_token != row))
        fail_msg("%s pad_token_id %s: has_pad %d row %lld", type, pad ? pad : "(absent)", c.has_pad,
                 (long long)c.pad_token);
    /* the config's JSON keeps it */
    json_t *back = dw_model_config_to_json(&c);
    dw_model_config c2;
    assert_int_equal(dw_model_config_from_json(dw_test_ctx, back, "saved config", &c2), DW_OK);
    json_decref(back);
    assert_int_equal(c2.has_pad, c.has_pad);
    if (has) assert_int_equal(c2.pad_token, row);
    /* the graph's embedding node carries it, and so does the graph's JSON */
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_config(dw_test_ctx, &c, 2, 8, &g), DW_OK);
    const dw_ir_node *n = embedding_node(g);
    assert_int_equal(n->attrs.has_pad, has);
    if (has) assert_int_equal(n->attrs.pad, row);
    json_t *gj = dw_graph_json(g);
    dw_graph *g2 = NULL;
    assert_int_equal(dw_graph_from_json_obj(dw_test_ctx, gj, "graph", &g2), DW_OK);
    const dw_ir_node *n2 = embedding_node(g2);
    assert_int_equal(n2->attrs.has_pad, has);
    assert_int_equal(n2->attrs.pad, n->attrs.pad);
    /* a pad outside the table is refused by inference, naming the node */
    json_t *nodes = json_object_get(gj, "nodes");
    for (size_t i = 0; i < json_array_size(nodes); i++) {
        json_t *o = json_array_get(nodes, i);
        if (strcmp(json_string_value(json_object_get(o, "op")), "embedding")) continue;
        json_t *a = json_object_get(o, "attrs");
        assert_non_null(a);
        json_object_set_new(a, "pad", json_integer(50));
    }
    dw_graph *bad = NULL;
    assert_int_not_equal(dw_graph_from_json_obj(dw_test_ctx, gj, "graph", &bad), DW_OK);
    assert_null(bad);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "padding row 50"));
    json_decref(gj);
    dw_graph_free(g2);
    dw_graph_free(g);
}

static void test_capture_pad(void **state) {
    (void)state;
    const char *families[] = {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2"};
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
        const int64_t row = (int64_t)(dw_test_next(&g_rng) % 50);
        char pad[16];
        snprintf(pad, sizeof pad, "%lld", (long long)row);
        check_capture(families[f], pad, true, row);
        check_capture(families[f], NULL, false, 0);
        check_capture(families[f], "null", false, 0);
        check_capture(families[f], "-1", true, 49); /* torch counts a negative padding_idx from the end */
        check_capture(families[f], "50", false, 0);  /* outside [-V, V): no padding row (a warning) */
        check_capture(families[f], "-51", false, 0);
    }
    check_capture("gpt2", "7", false, 0); /* GPT-2's wte has no padding_idx */
}

static void test_pad_not_an_integer(void **state) {
    (void)state;
    const char *bad[] = {"\"0\"", "1.5", "true"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *j = tiny("llama", bad[i]);
        dw_model_config c;
        assert_int_not_equal(dw_model_config_from_json(dw_test_ctx, j, "config.json", &c), DW_OK);
        json_decref(j);
        if (!strstr(dw_errmsg(dw_test_ctx), "pad_token_id"))
            fail_msg("pad_token_id %s: message does not name the field: %s", bad[i], dw_errmsg(dw_test_ctx));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel_pad),
        cmocka_unit_test(test_capture_pad),
        cmocka_unit_test(test_pad_not_an_integer),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
