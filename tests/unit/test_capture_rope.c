/* test_capture_rope.c — RoPE in Hugging Face configs (capture/model_config_rope.c): the types
 * default, linear, llama3, yarn and longrope under rope_scaling (keys rope_type and type) and under
 * transformers 5's rope_parameters (with rope_theta inside; it wins over rope_scaling); yarn's
 * defaults and attention factor (mscale, mscale_all_dim, an explicit attention_factor); longrope's
 * lists, original positions and attention factor (Phi-3's top-level key, its 4096 default, a given
 * factor); phi3's partial_rotary_factor as a rotary width; refusals that name the type or field;
 * save -> load round trips (Phi-3's three-key rope_scaling); the llama-1b preset's Llama 3.2
 * scaling; the rope nodes of a captured graph carrying the type through the graph's JSON form. */
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

#include <jansson.h>

#include "capture/model_config.h"
#include "deepwell.h"
#include "ir/ir.h"
#include "testutil.h"

#define LLAMA                                                                                                    \
    "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":16,\"num_hidden_layers\":1,"                    \
    "\"num_attention_heads\":2,\"intermediate_size\":16,\"max_position_embeddings\":4096"

/* Phi-3 with head_dim 16 (rotary lists of 8 entries over the whole head) */
#define PHI3_SIZES "{\"model_type\":\"phi3\",\"vocab_size\":10,\"num_hidden_layers\":1,\"intermediate_size\":16"
#define PHI3_128K PHI3_SIZES ",\"hidden_size\":32,\"num_attention_heads\":2,\"max_position_embeddings\":131072"
#define PHI3 PHI3_SIZES ",\"hidden_size\":32,\"num_attention_heads\":2,\"max_position_embeddings\":4096"
#define PHI3_WIDE PHI3_SIZES ",\"hidden_size\":512,\"num_attention_heads\":1,\"max_position_embeddings\":4096"
#define LISTS8 "\"short_factor\":[1,1,1,1,1,1,1.5,2],\"long_factor\":[1,2,3,4,5,6,7,8.25]"
#define LISTS4 "\"short_factor\":[1,1.25,1.5,2],\"long_factor\":[3,5,7,9]"

/* Loads base + extra (ending the object) from a fresh directory; the status, *c filled. */
static dw_status load_from(const char *base, const char *extra, dw_model_config *c) {
    char json[8192], *dir = dw_test_tmpdir(), *p = dw_test_path(dir, "config.json");
    snprintf(json, sizeof json, "%s%s}", base, extra);
    assert_int_equal(dw_test_write(p, json, strlen(json)), 0);
    dw_status s = dw_model_config_load(dw_test_ctx, dir, c);
    free(p);
    dw_test_rmtree(dir);
    free(dir);
    return s;
}

static dw_model_config load_ok_from(const char *base, const char *extra) {
    dw_model_config c;
    if (load_from(base, extra, &c) != DW_OK) fail_msg("%s: %s", extra, dw_errmsg(dw_test_ctx));
    return c;
}

static dw_model_config load_ok(const char *extra) { return load_ok_from(LLAMA, extra); }

static void expect_refused_from(const char *base, const char *extra, dw_status want, const char *n1, const char *n2) {
    dw_model_config c;
    dw_status s = load_from(base, extra, &c);
    const char *m = dw_errmsg(dw_test_ctx);
    if (s != want || !strstr(m, n1) || (n2 && !strstr(m, n2)) || !strstr(m, "config.json"))
        fail_msg("%s: status %s, message '%s' (wanted %s naming '%s')", extra, dw_status_name(s), m,
                 dw_status_name(want), n1);
}

static void expect_refused(const char *extra, dw_status want, const char *n1, const char *n2) {
    expect_refused_from(LLAMA, extra, want, n1, n2);
}

/* Field by field (the struct has padding). */
static bool same_rope(const dw_rope_scaling *a, const dw_rope_scaling *b) {
    bool same = a->type == b->type && a->rotary_dim == b->rotary_dim && a->factor == b->factor &&
                a->low_freq_factor == b->low_freq_factor && a->high_freq_factor == b->high_freq_factor &&
                a->original_max == b->original_max && a->beta_fast == b->beta_fast && a->beta_slow == b->beta_slow &&
                a->attention_factor == b->attention_factor && a->truncate == b->truncate &&
                a->n_factors == b->n_factors;
    for (int32_t i = 0; same && i < a->n_factors; i++)
        same = a->short_factor[i] == b->short_factor[i] && a->long_factor[i] == b->long_factor[i];
    return same;
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

/* Longrope: the lists as given, the original positions from Phi-3's top-level key (else the rope
 * object's, else phi3's 4096, else max_position_embeddings), the attention factor given or
 * sqrt(1 + ln(max / original) / ln(original)) (the object's factor when no original is named). */
static void test_longrope(void **state) {
    (void)state;
    dw_model_config c = load_ok_from(PHI3, ",\"original_max_position_embeddings\":1024,\"rope_scaling\":{\"type\":"
                                     "\"longrope\"," LISTS8 "}");
    const dw_rope_scaling *r = &c.rope_scaling;
    assert_true(r->type == DW_ROPE_LONGROPE && r->rotary_dim == 0 && r->n_factors == 8 && r->original_max == 1024);
    assert_true(r->short_factor[6] == 1.5 && r->short_factor[7] == 2 && r->long_factor[0] == 1 &&
                r->long_factor[7] == 8.25);
    assert_true(fabs(r->attention_factor - sqrt(1 + log(4.0) / log(1024.0))) < 1e-15);
    c = load_ok_from(PHI3, ",\"rope_scaling\":{\"type\":\"su\"," LISTS8 "}"); /* the old name; original 4096 */
    assert_true(r->type == DW_ROPE_LONGROPE && r->original_max == 4096 && r->attention_factor == 1.0);
    c = load_ok_from(PHI3_128K, ",\"rope_scaling\":{\"type\":\"longrope\"," LISTS8 "}");
    assert_true(fabs(r->attention_factor - 1.1902380714238083) < 1e-15); /* Phi-3-mini-128k's */
    c = load_ok_from(PHI3, ",\"original_max_position_embeddings\":1024,\"rope_scaling\":{\"type\":\"longrope\","
                     "\"attention_factor\":1.5," LISTS8 "}");
    assert_true(r->attention_factor == 1.5);
    /* transformers 5, another family: no original named, the object's factor */
    c = load_ok(",\"rope_parameters\":{\"rope_type\":\"longrope\",\"rope_theta\":1e5,\"factor\":4,"
                LISTS4 "}");
    assert_true(r->type == DW_ROPE_LONGROPE && r->original_max == 4096 && c.rope_theta == 1e5 && r->n_factors == 4);
    assert_true(fabs(r->attention_factor - sqrt(1 + log(4.0) / log(4096.0))) < 1e-15);
    c = load_ok(",\"rope_scaling\":{\"rope_type\":\"longrope\",\"original_max_position_embeddings\":512," LISTS4 "}");
    assert_true(r->original_max == 512 && fabs(r->attention_factor - sqrt(1 + log(8.0) / log(512.0))) < 1e-15);
}

/* phi3's partial_rotary_factor: the first int(head_dim x factor) dims rotate, longrope's lists measured
 * against them; at the top level or in rope_parameters. */
static void test_partial(void **state) {
    (void)state;
    dw_model_config c = load_ok_from(PHI3, ",\"partial_rotary_factor\":0.5");
    assert_true(c.rope_scaling.type == DW_ROPE_DEFAULT && c.rope_scaling.rotary_dim == 8);
    c = load_ok_from(PHI3, ",\"partial_rotary_factor\":0.3"); /* int(4.8) = 4 */
    assert_int_equal(c.rope_scaling.rotary_dim, 4);
    c = load_ok_from(PHI3, ",\"partial_rotary_factor\":1.0");
    assert_int_equal(c.rope_scaling.rotary_dim, 0);
    c = load_ok_from(PHI3, ",\"partial_rotary_factor\":0.5,\"rope_scaling\":{\"type\":\"longrope\"," LISTS4 "}");
    assert_true(c.rope_scaling.type == DW_ROPE_LONGROPE && c.rope_scaling.rotary_dim == 8 &&
                c.rope_scaling.n_factors == 4);
    c = load_ok_from(PHI3, ",\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":2,\"partial_rotary_factor\":"
                     "0.75,\"rope_theta\":1e4}");
    assert_true(c.rope_scaling.type == DW_ROPE_LINEAR && c.rope_scaling.rotary_dim == 12);
}

static void test_refusals(void **state) {
    (void)state;
    expect_refused(",\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":2}", DW_ERR_UNSUPPORTED,
                   "rope type 'dynamic' is not supported", "'rope_scaling'");
    expect_refused(",\"rope_parameters\":{\"rope_type\":\"longrope\",\"rope_theta\":1e4}", DW_ERR_INVALID,
                   "'short_factor' must be a list of 4 numbers", "'rope_parameters'");
    expect_refused(",\"rope_scaling\":{\"type\":\"su\",\"short_factor\":[1,1,1,1]}", DW_ERR_INVALID,
                   "'long_factor' must be a list of 4", "got none");
    expect_refused(",\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1,1,1],\"long_factor\":[1,1,1,1]}",
                   DW_ERR_INVALID, "'short_factor' must be a list of 4 numbers", "got a list of 3");
    expect_refused(",\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1,1,1,1],\"long_factor\":[1,1,0,1]}",
                   DW_ERR_INVALID, "'long_factor'[2] must be a positive finite number", "'rope_scaling'");
    expect_refused(",\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1,-1,1,1],\"long_factor\":[1,1,1,1]}",
                   DW_ERR_INVALID, "'short_factor'[1]", NULL);
    expect_refused(",\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1,1,\"1\",1],\"long_factor\":[1,1,1,"
                   "1]}", DW_ERR_INVALID, "'short_factor'[2]", NULL);
    expect_refused(",\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":{},\"long_factor\":[1,1,1,1]}",
                   DW_ERR_INVALID, "'short_factor'", "got no list");
    expect_refused(",\"rope_scaling\":{\"type\":\"longrope\",\"attention_factor\":-1,\"short_factor\":[1,1,1,1],"
                   "\"long_factor\":[1,1,1,1]}", DW_ERR_INVALID, "'attention_factor'", "longrope");
    expect_refused_from(PHI3, ",\"rope_scaling\":{\"type\":\"longrope\"," LISTS4 "}", DW_ERR_INVALID,
                        "'short_factor' must be a list of 8", "rotary dims 16");
    expect_refused_from(PHI3, ",\"partial_rotary_factor\":0.5,\"rope_scaling\":{\"type\":\"longrope\"," LISTS8 "}",
                        DW_ERR_INVALID, "'short_factor' must be a list of 4", "rotary dims 8");
    expect_refused_from(PHI3, ",\"partial_rotary_factor\":0.35", DW_ERR_INVALID, "partial_rotary_factor 0.35",
                        "= 5 rotary dims");
    expect_refused_from(PHI3, ",\"partial_rotary_factor\":0", DW_ERR_INVALID, "partial_rotary_factor 0", NULL);
    expect_refused_from(PHI3, ",\"partial_rotary_factor\":1.5", DW_ERR_INVALID, "partial_rotary_factor 1.5", NULL);
    expect_refused_from(PHI3, ",\"partial_rotary_factor\":\"half\"", DW_ERR_FORMAT, "partial_rotary_factor", NULL);
    char big[2400] = ",\"rope_scaling\":{\"type\":\"longrope\"";
    for (int list = 0; list < 2; list++) { /* 256 pairs: past DW_ROPE_MAX_FACTORS */
        strcat(big, list ? "],\"long_factor\":[" : ",\"short_factor\":[");
        for (int i = 0; i < 256; i++) strcat(big, i ? ",1" : "1");
    }
    strcat(big, "]}");
    expect_refused_from(PHI3_WIDE, big, DW_ERR_UNSUPPORTED, "at most 128 rotary dimension pairs", "'short_factor'");
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
    expect_refused(",\"partial_rotary_factor\":0.5", DW_ERR_UNSUPPORTED, "partial_rotary_factor 0.5", "for llama");
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

/* Longrope and partial widths come back from save -> load; Phi-3's config keeps the form its
 * transformers 4 class requires: rope_scaling of exactly type, short_factor and long_factor,
 * original_max_position_embeddings at the top level, attention_factor only when not the implied. */
static void test_round_trip_phi3(void **state) {
    (void)state;
    const struct {
        const char *base, *extra;
        size_t keys; /* of the saved rope_scaling */
        bool phi3;
    } cases[] = {
        {PHI3, ",\"original_max_position_embeddings\":1024,\"rope_scaling\":{\"type\":\"longrope\"," LISTS8 "}", 3,
         true},
        {PHI3, ",\"partial_rotary_factor\":0.5,\"rope_scaling\":{\"type\":\"su\",\"attention_factor\":1.25," LISTS4 "}",
         4, true},
        {PHI3, ",\"partial_rotary_factor\":0.3", 0, true},
        {LLAMA, ",\"rope_parameters\":{\"rope_type\":\"longrope\",\"factor\":4," LISTS4 "}", 4, false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        dw_model_config a = load_ok_from(cases[k].base, cases[k].extra), b;
        char *dir = dw_test_tmpdir(), *p = dw_test_path(dir, "config.json");
        assert_int_equal(dw_model_config_save(dw_test_ctx, &a, p), DW_OK);
        assert_int_equal(dw_model_config_load(dw_test_ctx, dir, &b), DW_OK);
        if (!same_rope(&a.rope_scaling, &b.rope_scaling))
            fail_msg("%s: rope type %d width %d attention %g came back as type %d width %d attention %g",
                     cases[k].extra, a.rope_scaling.type, a.rope_scaling.rotary_dim, a.rope_scaling.attention_factor,
                     b.rope_scaling.type, b.rope_scaling.rotary_dim, b.rope_scaling.attention_factor);
        json_error_t err;
        json_t *j = json_load_file(p, 0, &err), *rs = json_object_get(j, "rope_scaling");
        assert_non_null(j);
        assert_int_equal(json_is_object(rs) ? json_object_size(rs) : 0, cases[k].keys);
        if (a.rope_scaling.type == DW_ROPE_LONGROPE) {
            assert_string_equal(json_string_value(json_object_get(rs, cases[k].phi3 ? "type" : "rope_type")),
                                "longrope");
            assert_true(json_integer_value(json_object_get(j, "original_max_position_embeddings")) ==
                        (json_int_t)a.rope_scaling.original_max);
        }
        free(p);
        json_decref(j);
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

/* The rope nodes of a captured graph carry the type (and a partial width), and the graph's JSON form
 * keeps it. */
static void test_graph(void **state) {
    (void)state;
    const char *configs[] = {
        LLAMA ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":8,\"beta_fast\":24,"
              "\"original_max_position_embeddings\":512}}",
        PHI3 ",\"partial_rotary_factor\":0.5,\"original_max_position_embeddings\":512,\"rope_scaling\":{\"type\":"
             "\"longrope\"," LISTS4 "}}",
        PHI3 ",\"partial_rotary_factor\":0.75}",
    };
    for (int k = 0; k < 3; k++) {
        char *dir = dw_test_tmpdir(), *p = dw_test_path(dir, "config.json");
        assert_int_equal(dw_test_write(p, configs[k], strlen(configs[k])), 0);
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
            if (k == 0)
                assert_true(r->type == DW_ROPE_YARN && r->factor == 8 && r->beta_fast == 24 && r->original_max == 512);
            if (k == 1) assert_true(r->type == DW_ROPE_LONGROPE && r->rotary_dim == 8 && r->long_factor[3] == 9);
            if (k == 2) assert_true(r->type == DW_ROPE_DEFAULT && r->rotary_dim == 12);
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
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_types),     cmocka_unit_test(test_yarn_attention_factor),
        cmocka_unit_test(test_longrope),  cmocka_unit_test(test_partial),
        cmocka_unit_test(test_refusals),  cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_round_trip_phi3),
        cmocka_unit_test(test_llama_1b),  cmocka_unit_test(test_graph),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
