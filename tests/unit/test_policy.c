/* test_policy.c — precision policies: JSON load/save, rule order, the passes kept BF16 (a rule's
 * "bf16_passes", [] apart from no field; fp8_block experts' wgrad by default), the "safe" fallback
 * (also on the MoE presets' routers and shared-expert gates as captured), errors that name the file
 * and field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "capture/model_config.h"
#include "ir/ir.h"
#include "precision/policy.h"
#include "testutil.h"

static dw_policy *load_text(const char *dir, const char *text, dw_status want) {
    char *path = dw_test_path(dir, "policy.json");
    assert_int_equal(dw_test_write(path, text, strlen(text)), 0);
    dw_policy *p = (dw_policy *)1;
    dw_status s = dw_policy_load(NULL, path, &p);
    if (s != want) fail_msg("%s: got %s (%s)", text, dw_status_name(s), dw_errmsg(NULL));
    if (s != DW_OK) {
        assert_null(p);
        assert_non_null(strstr(dw_errmsg(NULL), "policy.json"));
    }
    free(path);
    return s == DW_OK ? p : NULL;
}

static void test_rules_in_order(void **state) {
    (void)state;
    char *dir = dw_test_tmpdir();
    dw_policy *p = load_text(dir,
                             "{\"default\": \"fp8_block\", \"rules\": ["
                             " {\"match\": \"*.self_attn.o_proj\", \"recipe\": \"mxfp8\"},"
                             " {\"match\": \"*.self_attn.*\", \"recipe\": \"bf16\"},"
                             " {\"op\": \"linear\", \"match\": \"*.mlp.down_proj\", \"recipe\": \"nvfp4\","
                             "  \"bf16_passes\": [\"wgrad\", \"fprop\"]}]}",
                             DW_OK);
    dw_policy_reason why;
    int rule = -2;
    /* first match wins: o_proj hits rule 0 before the broader rule 1 */
    assert_int_equal(dw_policy_resolve(p, "model.layers.5.self_attn.o_proj", "linear", 16, &why, &rule),
                     DW_RECIPE_MXFP8);
    assert_int_equal(why, DW_POLICY_BY_RULE);
    assert_int_equal(rule, 0);
    assert_int_equal(dw_policy_resolve(p, "model.layers.5.self_attn.q_proj", "linear", 16, &why, &rule),
                     DW_RECIPE_BF16);
    assert_int_equal(rule, 1);
    assert_int_equal(dw_policy_resolve(p, "model.layers.5.mlp.down_proj", "linear", 16, &why, &rule),
                     DW_RECIPE_NVFP4);
    assert_int_equal(dw_policy_resolve(p, "model.layers.5.mlp.up_proj", "linear", 16, &why, &rule),
                     DW_RECIPE_FP8_BLOCK);
    assert_int_equal(why, DW_POLICY_BY_DEFAULT);
    assert_int_equal(rule, -1);
    /* without fallback "safe", the first block follows the default; the LM head stays BF16 under
     * the default fallback "head", and follows the default under "none" */
    assert_int_equal(dw_policy_resolve(p, "model.layers.0.mlp.up_proj", "linear", 16, &why, NULL),
                     DW_RECIPE_FP8_BLOCK);
    assert_int_equal(dw_policy_resolve(p, "lm_head", "linear", 16, &why, NULL), DW_RECIPE_BF16);
    assert_int_equal(why, DW_POLICY_BY_HEAD);
    assert_int_equal(dw_policy_set_fallback(NULL, p, "none"), DW_OK);
    assert_int_equal(dw_policy_resolve(p, "lm_head", "linear", 16, &why, NULL), DW_RECIPE_FP8_BLOCK);
    assert_int_equal(why, DW_POLICY_BY_DEFAULT);
    assert_int_equal(dw_policy_resolve(p, "model.layers.0.mlp.up_proj", "linear", 16, &why, NULL),
                     DW_RECIPE_FP8_BLOCK);
    assert_int_equal(dw_policy_set_fallback(NULL, p, "always"), DW_ERR_INVALID);
    assert_int_equal(dw_policy_set_fallback(NULL, p, "head"), DW_OK);
    /* non-GEMM ops never take a low-precision recipe */
    assert_int_equal(dw_policy_resolve(p, "model.layers.5.input_layernorm", "rmsnorm", 16, &why, NULL),
                     DW_RECIPE_BF16);
    assert_int_equal(why, DW_POLICY_NOT_GEMM);

    /* JSON round trip keeps the rules and their order */
    char *json = NULL;
    assert_int_equal(dw_policy_to_json(NULL, p, &json), DW_OK);
    dw_policy *q = load_text(dir, json, DW_OK);
    assert_int_equal(q->n_rules, 3);
    for (int i = 0; i < 3; i++) {
        assert_string_equal(q->rules[i].match, p->rules[i].match);
        assert_int_equal(q->rules[i].recipe, p->rules[i].recipe);
        assert_int_equal(q->rules[i].bf16_passes, p->rules[i].bf16_passes);
    }
    assert_int_equal(dw_policy_bf16_passes(q, 2, "linear", DW_RECIPE_NVFP4), 1u << 0 | 1u << 2); /* fprop and wgrad */
    assert_int_equal(dw_policy_bf16_passes(q, 0, "linear", DW_RECIPE_MXFP8), 0);
    assert_int_equal(dw_policy_bf16_passes(q, -1, "linear", DW_RECIPE_FP8_BLOCK), 0);
    assert_non_null(q->rules[2].op);
    assert_null(q->rules[0].op);
    free(json);
    dw_policy_free(q);
    dw_policy_free(p);
    dw_policy_free(NULL);
    dw_test_rmtree(dir);
    free(dir);
}

/* The passes kept BF16 per node: a rule's "bf16_passes" where it has the field ([] too: all three
 * quantised), else the default — wgrad for moe_linear in fp8_block or fp8_block2d, flagged as the
 * default's, nothing for dense linear layers and other recipes; the reasons' texts; a rule's []
 * survives the JSON round trip and stays apart from a rule without the field. */
static void test_bf16_passes_default(void **state) {
    (void)state;
    static const char policy[] =
        "{\"default\": \"fp8_block\", \"rules\": ["
        " {\"match\": \"*.layers.1.*\", \"op\": \"moe_linear\", \"recipe\": \"fp8_block\", \"bf16_passes\": []},"
        " {\"match\": \"*.layers.2.*\", \"op\": \"moe_linear\", \"recipe\": \"fp8_block\"},"
        " {\"match\": \"*.layers.3.*\", \"op\": \"moe_linear\", \"recipe\": \"fp8_block\", \"bf16_passes\": [\"dgrad\"]},"
        " {\"match\": \"*.layers.4.*\", \"op\": \"moe_linear\", \"recipe\": \"mxfp8\"},"
        " {\"match\": \"*.layers.5.*\", \"op\": \"moe_linear\", \"recipe\": \"fp8_block2d\"},"
        " {\"match\": \"*.layers.6.*\", \"recipe\": \"fp8_block\", \"bf16_passes\": []}]}";
    char *dir = dw_test_tmpdir();
    dw_policy *p = load_text(dir, policy, DW_OK);
    const unsigned wgrad_default = 1u << 2 | DW_POLICY_PASSES_DEFAULT;
    static const struct {
        const char *name, *op;
        dw_recipe recipe;
        int rule;
        unsigned passes;
    } cases[] = {
        {"model.layers.0.mlp.experts.up", "moe_linear", DW_RECIPE_FP8_BLOCK, -1, 1u << 2 | DW_POLICY_PASSES_DEFAULT},
        {"model.layers.1.mlp.experts.up", "moe_linear", DW_RECIPE_FP8_BLOCK, 0, 0},          /* [] : all quantised */
        {"model.layers.2.mlp.experts.up", "moe_linear", DW_RECIPE_FP8_BLOCK, 1, 1u << 2 | DW_POLICY_PASSES_DEFAULT},
        {"model.layers.3.mlp.experts.up", "moe_linear", DW_RECIPE_FP8_BLOCK, 2, 1u << 1},    /* the rule's alone */
        {"model.layers.4.mlp.experts.up", "moe_linear", DW_RECIPE_MXFP8, 3, 0},              /* not fp8_block */
        {"model.layers.5.mlp.experts.up", "moe_linear", DW_RECIPE_FP8_BLOCK2D, 4, 1u << 2 | DW_POLICY_PASSES_DEFAULT},
        {"model.layers.6.mlp.experts.up", "moe_linear", DW_RECIPE_FP8_BLOCK, 5, 0},
        {"model.layers.0.mlp.up_proj", "linear", DW_RECIPE_FP8_BLOCK, -1, 0},                /* dense: no default */
        {"model.layers.2.mlp.up_proj", "linear", DW_RECIPE_FP8_BLOCK, -1, 0},
        {"model.layers.0.mlp.gate", "linear", DW_RECIPE_BF16, -1, 0},                       /* the router */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rule = -2;
        const dw_recipe r = dw_policy_resolve(p, cases[i].name, cases[i].op, 16, NULL, &rule);
        const unsigned got = dw_policy_bf16_passes(p, rule, cases[i].op, r);
        if (r != cases[i].recipe || rule != cases[i].rule || got != cases[i].passes)
            fail_msg("%s (%s): %s, rule %d, passes 0x%x; want %s, rule %d, passes 0x%x", cases[i].name, cases[i].op,
                     dw_recipe_name(r), rule, got, dw_recipe_name(cases[i].recipe), cases[i].rule, cases[i].passes);
    }
    assert_true(p->rules[0].passes_set && p->rules[5].passes_set && p->rules[2].passes_set);
    assert_false(p->rules[1].passes_set || p->rules[3].passes_set || p->rules[4].passes_set);
    /* without a policy's rules: the default by op and recipe alone */
    assert_int_equal(dw_policy_bf16_passes(NULL, -1, "moe_linear", DW_RECIPE_FP8_BLOCK), wgrad_default);
    assert_int_equal(dw_policy_bf16_passes(NULL, -1, "moe_linear", DW_RECIPE_BF16), 0);
    assert_int_equal(dw_policy_bf16_passes(NULL, -1, "moe_linear", DW_RECIPE_NVFP4), 0);
    assert_int_equal(dw_policy_bf16_passes(NULL, -1, "linear", DW_RECIPE_FP8_BLOCK2D), 0);

    /* the reasons: the default says so and how to turn it off; a rule names itself */
    char why[256] = "untouched";
    assert_false(dw_policy_keeps_bf16(wgrad_default, -1, 0, why, sizeof why));
    assert_false(dw_policy_keeps_bf16(wgrad_default, -1, 1, why, sizeof why));
    assert_string_equal(why, "untouched");
    assert_true(dw_policy_keeps_bf16(wgrad_default, 1, 2, why, sizeof why));
    assert_string_equal(why, "fp8_block experts keep wgrad BF16 by default (the grouped FP8 wgrad is slower on "
                             "sm_90; a rule's \"bf16_passes\": [] quantises it)");
    assert_true(dw_policy_keeps_bf16(1u << 1, 2, 1, why, sizeof why));
    assert_string_equal(why, "policy rule 2 keeps dgrad BF16 (bf16_passes)");
    assert_true(dw_policy_keeps_bf16(1u << 2, 0, 2, NULL, 0));
    assert_false(dw_policy_keeps_bf16(0, 0, 2, why, sizeof why));

    /* the JSON round trip keeps [] apart from no field */
    char *json = NULL;
    assert_int_equal(dw_policy_to_json(NULL, p, &json), DW_OK);
    dw_policy *q = load_text(dir, json, DW_OK);
    assert_int_equal(q->n_rules, p->n_rules);
    for (int i = 0; i < p->n_rules; i++) {
        if (q->rules[i].passes_set != p->rules[i].passes_set || q->rules[i].bf16_passes != p->rules[i].bf16_passes)
            fail_msg("rule %d: passes_set %d, passes 0x%x after the round trip; before %d, 0x%x (%s)", i,
                     q->rules[i].passes_set, q->rules[i].bf16_passes, p->rules[i].passes_set, p->rules[i].bf16_passes,
                     json);
        assert_int_equal(dw_policy_bf16_passes(q, i, "moe_linear", q->rules[i].recipe),
                         dw_policy_bf16_passes(p, i, "moe_linear", p->rules[i].recipe));
    }
    int fields = 0; /* rules 0, 2 and 5 write the field, 1, 3 and 4 not */
    for (const char *f = strstr(json, "bf16_passes"); f; f = strstr(f + 1, "bf16_passes")) fields++;
    assert_int_equal(fields, 3);
    free(json);
    dw_policy_free(q);
    dw_policy_free(p);
    dw_test_rmtree(dir);
    free(dir);
}

static void test_safe_fallback(void **state) {
    (void)state;
    dw_policy *p = NULL;
    assert_int_equal(dw_policy_from_precision(NULL, "mxfp8", true, &p), DW_OK);
    struct { const char *name; int64_t layers; bool fragile; } cases[] = {
        {"transformer.wte", 12, true},
        {"model.embed_tokens", 16, true},
        {"lm_head", 16, true},
        {"transformer.h.0.attn.c_attn", 12, true},
        {"transformer.h.11.mlp.c_proj", 12, true},
        {"transformer.h.1.mlp.c_fc", 12, false},
        {"transformer.h.10.attn.c_proj", 12, false},
        {"model.layers.0.self_attn.q_proj", 16, true},
        {"model.layers.15.mlp.down_proj", 16, true},
        {"model.layers.7.mlp.gate_proj", 16, false}, /* SwiGLU gate is not a router */
        {"model.layers.7.mlp.gate", 16, true},       /* DeepSeek-style router */
        {"model.layers.7.block_sparse_moe.gate", 32, true}, /* Mixtral router */
        {"model.layers.7.mlp.shared_expert_gate", 16, true}, /* Qwen2-MoE's shared-expert gate */
        {"model.layers.7.mlp.shared_expert.gate_proj", 16, false}, /* the shared expert's SwiGLU gate */
        {"model.layers.7.mlp.experts.gate_proj", 16, false},
        {"model.layers.10.self_attn.k_proj", 16, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dw_policy_reason why;
        dw_recipe r = dw_policy_resolve(p, cases[i].name, "linear", cases[i].layers, &why, NULL);
        if ((r == DW_RECIPE_BF16) != cases[i].fragile || dw_policy_is_fragile(cases[i].name, cases[i].layers) != cases[i].fragile)
            fail_msg("%s: recipe %s, expected %s", cases[i].name, dw_recipe_name(r),
                     cases[i].fragile ? "bf16 (safe)" : "mxfp8");
        const dw_policy_reason want = !cases[i].fragile                   ? DW_POLICY_BY_DEFAULT
                                      : dw_policy_is_moe_gate(cases[i].name) ? DW_POLICY_MOE_GATE
                                                                              : DW_POLICY_BY_SAFE;
        assert_int_equal(why, want);
    }
    dw_policy_free(p);
}

static bool ends_with(const char *s, const char *tail) {
    const size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* The MoE presets as captured: every router (mlp.gate) and Qwen2-MoE's shared_expert_gate stays
 * BF16 in any block (n_layers large: the last-block rule covers none of them) under every policy —
 * with "safe", without it, and against an explicit rule asking for MXFP8 — while every other GEMM
 * but the LM head and block 0's takes the default. */
static void test_safe_keeps_moe_gates(void **state) {
    (void)state;
    static const char *const presets[] = {"mixtral-tiny", "olmoe-tiny", "qwen2-moe-tiny", "qwen3-moe-tiny"};
    dw_policy *safe = NULL, *none = NULL;
    assert_int_equal(dw_policy_from_precision(NULL, "mxfp8", true, &safe), DW_OK);
    assert_int_equal(dw_policy_from_precision(NULL, "mxfp8", false, &none), DW_OK);
    dw_policy *rule = NULL; /* a rule asking for every linear layer in MXFP8: the gates still stay BF16 */
    {
        char *dir = dw_test_tmpdir(), *f = dw_test_path(dir, "p.json");
        FILE *fp = fopen(f, "w");
        assert_non_null(fp);
        fputs("{\"default\": \"bf16\", \"rules\": [{\"match\": \"*\", \"recipe\": \"mxfp8\"}]}", fp);
        fclose(fp);
        assert_int_equal(dw_policy_load(NULL, f, &rule), DW_OK);
        dw_test_rmtree(dir);
        free(f), free(dir);
    }
    for (size_t k = 0; k < sizeof presets / sizeof presets[0]; k++) {
        dw_model_config c;
        assert_int_equal(dw_model_config_load(NULL, presets[k], &c), DW_OK);
        dw_graph *g = NULL;
        assert_int_equal(dw_capture_config(NULL, &c, 1, 4, &g), DW_OK);
        int routers = 0, shared = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            const char *name = g->nodes[i].name;
            if (g->nodes[i].op != DW_OP_LINEAR) continue;
            const bool is_shared = ends_with(name, ".mlp.shared_expert_gate");
            const bool gate = is_shared || ends_with(name, ".mlp.gate") || ends_with(name, ".block_sparse_moe.gate");
            routers += gate && !is_shared, shared += is_shared;
            dw_policy_reason why;
            const dw_recipe r = dw_policy_resolve(safe, name, "linear", 1000, &why, NULL);
            if (gate && (r != DW_RECIPE_BF16 || why != DW_POLICY_MOE_GATE))
                fail_msg("%s %s: %s under safe, want bf16", presets[k], name, dw_recipe_name(r));
            if (!gate && !strstr(name, "lm_head") && !strstr(name, ".layers.0.") && r != DW_RECIPE_MXFP8)
                fail_msg("%s %s: %s under safe, want the default", presets[k], name, dw_recipe_name(r));
            if (gate) assert_int_equal(dw_policy_resolve(none, name, "linear", 1000, NULL, NULL), DW_RECIPE_BF16);
            if (gate) assert_int_equal(dw_policy_resolve(rule, name, "linear", 1000, NULL, NULL), DW_RECIPE_BF16);
        }
        if (routers < 1 || (!strcmp(presets[k], "qwen2-moe-tiny") && shared < 1))
            fail_msg("%s: %d routers, %d shared-expert gates found among the linear nodes", presets[k], routers, shared);
        dw_graph_free(g);
    }
    dw_policy_free(safe);
    dw_policy_free(none);
    dw_policy_free(rule);
}

static void test_bad_policies(void **state) {
    (void)state;
    char *dir = dw_test_tmpdir();
    load_text(dir, "{\"default\": \"fp7\"}", DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(NULL), "unknown recipe 'fp7'"));
    assert_non_null(strstr(dw_errmsg(NULL), "mxfp8")); /* lists the known ones */
    load_text(dir, "{\"rules\": []}", DW_ERR_FORMAT);
    assert_non_null(strstr(dw_errmsg(NULL), "'default'"));
    load_text(dir, "{\"default\": \"bf16\", \"fallback\": \"maybe\"}", DW_ERR_FORMAT);
    load_text(dir, "{\"default\": \"bf16\", \"rules\": {}}", DW_ERR_FORMAT);
    load_text(dir, "{\"default\": \"bf16\", \"rules\": [{\"recipe\": \"bf16\"}]}", DW_ERR_FORMAT);
    assert_non_null(strstr(dw_errmsg(NULL), "rules[0]"));
    load_text(dir, "{\"default\": \"bf16\", \"rules\": [{\"match\": \"*\", \"recipe\": \"x\"}]}",
              DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(NULL), "rules[0]"));
    static const char *const bad_passes[][2] = {
        {"\"wgrad\"", "expected an array"}, {"[\"wgrad\", \"wgrad\"]", "'wgrad' twice"},
        {"[\"bwd\"]", "'bf16_passes'[0]"}, {"[1]", "'bf16_passes'[0]"}};
    for (size_t i = 0; i < sizeof bad_passes / sizeof bad_passes[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, "{\"default\": \"fp8_block\", \"rules\": [{\"op\": \"linear\", "
                 "\"recipe\": \"fp8_block\", \"bf16_passes\": %s}]}", bad_passes[i][0]);
        load_text(dir, text, DW_ERR_FORMAT);
        if (!strstr(dw_errmsg(NULL), bad_passes[i][1]) || !strstr(dw_errmsg(NULL), "rules[0]"))
            fail_msg("bf16_passes %s: %s", bad_passes[i][0], dw_errmsg(NULL));
    }
    load_text(dir, "{\"default\": \"bf16\", \"rulez\": []}", DW_ERR_FORMAT);
    assert_non_null(strstr(dw_errmsg(NULL), "unknown field 'rulez'"));
    load_text(dir, "{\"default\": \"bf16\",", DW_ERR_FORMAT);
    dw_policy *p = (dw_policy *)1;
    assert_int_equal(dw_policy_from_precision(NULL, "int4", false, &p), DW_ERR_INVALID);
    assert_null(p);
    dw_test_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rules_in_order),
        cmocka_unit_test(test_bf16_passes_default),
        cmocka_unit_test(test_safe_fallback),
        cmocka_unit_test(test_safe_keeps_moe_gates),
        cmocka_unit_test(test_bad_policies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
