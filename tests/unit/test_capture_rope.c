/* test_capture_rope.c — RoPE in Hugging Face configs (capture/model_config_rope.c): the types
 * default, linear, llama3 and yarn under rope_scaling (keys rope_type and type) and under
 * transformers 5's rope_parameters (with rope_theta inside; it wins over rope_scaling); yarn's
 * defaults and attention factor (mscale, mscale_all_dim, an explicit attention_factor); refusals
 * that name the type or field; save -> load round trips; the llama-1b preset's Llama 3.2 scaling;
 * the rope nodes of a captured graph carrying the type through the graph's JSON form. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/model_config.h"
#include "deepwell.h"
#include "ir/ir.h"
#include "testutil.h"

#define LLAMA                                                                                                    \
    "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":16,\"num_hidden_layers\":1,"                    \
    "\"num_attention_heads\":2,\"intermediate_size\":16,\"max_position_embeddings\":4096"

/* Loads LLAMA + extra (ending the object) from a fresh directory; the status, *c filled. */
static dw_status load(const char *extra, dw_model_config *c) {
    char json[2048], *dir = dw_test_tmpdir(), *p = dw_test_path(dir, "config.json");
    snprintf(json, sizeof json, "%s%s}", LLAMA, extra);
    assert_int_equal(dw_test_write(p, json, strlen(json)), 0);
    dw_status s = dw_model_config_load(dw_test_ctx, dir, c);
    free(p);
    dw_test_rmtree(dir);
    free(dir);
    return s;
}

static dw_model_config load_ok(const char *extra) {
    dw_model_config c;
    if (load(extra, &c) != DW_OK) fail_msg("%s: %s", extra, dw_errmsg(dw_test_ctx));
    return c;
}

static void expect_refused(const char *extra, dw_status want, const char *n1, const char *n2) {
    dw_model_config c;
    dw_status s = load(extra, &c);
    const char *m = dw_errmsg(dw_test_ctx);
    if (s != want || !strstr(m, n1) || (n2 && !strstr(m, n2)) || !strstr(m, "config.json"))
        fail_msg("%s: status %s, message '%s' (wanted %s naming '%s')", extra, dw_status_name(s), m,
                 dw_status_name(want), n1);
}

/* Field by field (the struct has padding). */
static bool same_rope(const dw_rope_scaling *a, const dw_rope_scaling *b) {
    return a->type == b->type && a->factor == b->factor && a->low_freq_factor == b->low_freq_factor &&
           a->high_freq_factor == b->high_freq_factor && a->original_max == b->original_max &&
           a->beta_fast == b->beta_fast && a->beta_slow == b->beta_slow &&
           a->attention_factor == b->attention_factor && a->truncate == b->truncate;
}

static void test_types(void **state) {
    (void)state;
    dw_model_config c = load_ok(",\"rope_theta\":20000.0,\"rope_scaling\":null");
    assert_true(c.rope_theta == 20000.0 && c.rope_scaling.type == DW_ROPE_DEFAULT);
    c = load_ok(",\"rope_scaling\":{\"type\":\"linear\",\"factor\":4.0}"); /* the old key */
    assert_true(c.rope_scaling.type == DW_ROPE_LINEAR && c.rope_scaling.factor == 4.0 && c.rope_theta == 10000.0);
    c = load_ok(",\"rope_theta\":500000.0,\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":32.0,"
                "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}");
    assert_true(c.rope_scaling.type == DW_ROPE_LLAMA3 && c.rope_scaling.factor == 32 &&
                c.rope_scaling.low_freq_factor == 1 && c.rope_scaling.high_freq_factor == 4 &&
                c.rope_scaling.original_max == 8192 && c.rope_theta == 500000);
    /* transformers 5: rope_parameters with rope_theta inside, over a stale rope_scaling */
    c = load_ok(",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2},\"rope_parameters\":{\"rope_type\":"
                "\"yarn\",\"rope_theta\":1000000.0,\"factor\":4.0,\"original_max_position_embeddings\":1024}");
    assert_true(c.rope_scaling.type == DW_ROPE_YARN && c.rope_theta == 1e6 && c.rope_scaling.factor == 4);
    assert_true(c.rope_scaling.original_max == 1024 && c.rope_scaling.beta_fast == 32 && c.rope_scaling.beta_slow == 1);
    assert_true(c.rope_scaling.truncate);
    assert_true(fabs(c.rope_scaling.attention_factor - (0.1 * log(4.0) + 1)) < 1e-15);
    c = load_ok(",\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":300.0}");
    assert_true(c.rope_theta == 300 && c.rope_scaling.type == DW_ROPE_DEFAULT);
}

static void test_yarn_attention_factor(void **state) {
    (void)state;
    /* DeepSeek-style: mscale / mscale_all_dim -> (0.1 m ln f + 1) / (0.1 m' ln f + 1) */
    dw_model_config c = load_ok(",\"rope_scaling\":{\"type\":\"yarn\",\"factor\":40,\"mscale\":0.707,"
                                "\"mscale_all_dim\":1.0,\"original_max_position_embeddings\":4096,"
                                "\"beta_fast\":16,\"beta_slow\":2,\"truncate\":false}");
    const double want = (0.1 * 0.707 * log(40.0) + 1) / (0.1 * log(40.0) + 1);
    assert_true(fabs(c.rope_scaling.attention_factor - want) < 1e-15);
    assert_true(c.rope_scaling.beta_fast == 16 && c.rope_scaling.beta_slow == 2 && !c.rope_scaling.truncate);
    c = load_ok(",\"rope_scaling\":{\"type\":\"yarn\",\"factor\":40,\"attention_factor\":1.25}");
    assert_true(c.rope_scaling.attention_factor == 1.25 && c.rope_scaling.original_max == 4096);
    /* no factor: the ratio of the positions (max_position_embeddings 4096) */
    c = load_ok(",\"rope_scaling\":{\"rope_type\":\"yarn\",\"original_max_position_embeddings\":1024}");
    assert_true(c.rope_scaling.factor == 4.0);
}

static void test_refusals(void **state) {
    (void)state;
    expect_refused(",\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":2}", DW_ERR_UNSUPPORTED,
                   "rope type 'dynamic' is not supported", "'rope_scaling'");
    expect_refused(",\"rope_parameters\":{\"rope_type\":\"longrope\",\"rope_theta\":1e4}", DW_ERR_UNSUPPORTED,
                   "rope type 'longrope' is not supported", "'rope_parameters'");
    expect_refused(",\"rope_scaling\":{\"type\":\"su\"}", DW_ERR_UNSUPPORTED, "'su'", "default, linear, llama3, yarn");
    expect_refused(",\"rope_scaling\":{\"rope_type\":\"linear\"}", DW_ERR_FORMAT, "'factor'", "'rope_scaling'");
    expect_refused(",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":\"2\"}", DW_ERR_FORMAT, "'factor'",
                   "a number");
    expect_refused(",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":-2}", DW_ERR_INVALID, "'factor'", "positive");
    expect_refused(",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":4,"
                   "\"high_freq_factor\":1,\"original_max_position_embeddings\":8192}",
                   DW_ERR_INVALID, "'low_freq_factor' < 'high_freq_factor'", "llama3");
    expect_refused(",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,"
                   "\"high_freq_factor\":4}", DW_ERR_FORMAT, "'original_max_position_embeddings'", NULL);
    expect_refused(",\"rope_scaling\":[1]", DW_ERR_FORMAT, "'rope_scaling'", "expected an object");
    expect_refused(",\"partial_rotary_factor\":0.5", DW_ERR_UNSUPPORTED, "partial_rotary_factor", NULL);
    expect_refused(",\"rope_parameters\":{\"rope_type\":\"default\",\"partial_rotary_factor\":0.25}",
                   DW_ERR_UNSUPPORTED, "partial_rotary_factor", NULL);
}

/* save -> load keeps every type's parameters (config.json in transformers 4's rope_scaling form) */
static void test_round_trip(void **state) {
    (void)state;
    const char *extras[] = {
        "",
        ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":3.5}",
        ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4,"
        "\"original_max_position_embeddings\":2048}",
        ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":1e6,\"factor\":40,\"mscale\":1,"
        "\"mscale_all_dim\":0.5,\"original_max_position_embeddings\":1000,\"truncate\":false}",
    };
    for (size_t k = 0; k < sizeof extras / sizeof extras[0]; k++) {
        dw_model_config a = load_ok(extras[k]), b;
        char *dir = dw_test_tmpdir(), *p = dw_test_path(dir, "config.json");
        assert_int_equal(dw_model_config_save(dw_test_ctx, &a, p), DW_OK);
        assert_int_equal(dw_model_config_load(dw_test_ctx, dir, &b), DW_OK);
        assert_int_equal(a.rope_scaling.type, (int)k);
        if (!same_rope(&a.rope_scaling, &b.rope_scaling) || a.rope_theta != b.rope_theta)
            fail_msg("%s: rope type %d factor %g attention %g came back as type %d factor %g attention %g",
                     extras[k], a.rope_scaling.type, a.rope_scaling.factor, a.rope_scaling.attention_factor,
                     b.rope_scaling.type, b.rope_scaling.factor, b.rope_scaling.attention_factor);
        free(p);
        dw_test_rmtree(dir);
        free(dir);
    }
}

/* Llama-3.2-1B's published rope_scaling; its parameter count is test_capture_config's */
static void test_llama_1b(void **state) {
    (void)state;
    dw_model_config c;
    assert_int_equal(dw_model_config_load(dw_test_ctx, "llama-1b", &c), DW_OK);
    assert_true(c.rope_theta == 500000.0 && c.rope_scaling.type == DW_ROPE_LLAMA3 && c.rope_scaling.factor == 32 &&
                c.rope_scaling.low_freq_factor == 1 && c.rope_scaling.high_freq_factor == 4 &&
                c.rope_scaling.original_max == 8192);
    assert_int_equal(dw_model_config_params(&c), 1235814400);
}

/* The rope nodes of a captured graph carry the type, and the graph's JSON form keeps it. */
static void test_graph(void **state) {
    (void)state;
    char json[2048], *dir = dw_test_tmpdir(), *p = dw_test_path(dir, "config.json");
    snprintf(json, sizeof json, "%s,\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":8,\"beta_fast\":24,"
             "\"original_max_position_embeddings\":512}}", LLAMA);
    assert_int_equal(dw_test_write(p, json, strlen(json)), 0);
    dw_graph *g = NULL, *back = NULL;
    assert_int_equal(dw_capture_hf(dw_test_ctx, dir, &g), DW_OK);
    char *text = NULL;
    assert_int_equal(dw_graph_to_json(dw_test_ctx, g, false, &text), DW_OK);
    assert_int_equal(dw_graph_from_json(dw_test_ctx, text, strlen(text), "graph", &back), DW_OK);
    int ropes = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].op != DW_OP_ROPE) continue;
        ropes++;
        const dw_rope_scaling *r = &g->nodes[i].attrs.rope, *rb = &back->nodes[i].attrs.rope;
        assert_true(r->type == DW_ROPE_YARN && r->factor == 8 && r->beta_fast == 24 && r->original_max == 512);
        assert_true(same_rope(r, rb));
    }
    assert_int_equal(ropes, 2); /* q and k of the one layer */
    dw_free_string(text);
    dw_graph_free(g);
    dw_graph_free(back);
    free(p);
    dw_test_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_types),     cmocka_unit_test(test_yarn_attention_factor),
        cmocka_unit_test(test_refusals),  cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_llama_1b),  cmocka_unit_test(test_graph),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
