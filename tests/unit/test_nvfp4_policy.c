/* test_nvfp4_policy.c — the NVFP4 training recipe as policy switches (precision/nvfp4_recipe.c):
 * `--precision nvfp4` (dw_policy_from_precision) and a policy file without an "nvfp4" field get
 * every piece on, the LM head and the last 15% of the blocks in BF16 (rounded to whole blocks),
 * with the reason the compile report prints; each field overrides; an explicit rule
 * naming nvfp4 wins over the BF16 tail; the JSON dump carries the recipe (only where a node can
 * get nvfp4) and loads back the same; bad fields are refused naming the file and the key; and a
 * compiled llama-tiny reports which nodes the recipe kept in BF16. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "precision/policy.h"
#include "testutil.h"

static dw_policy *load_text(const char *dir, const char *text, dw_status want, const char *msg_part) {
    char *path = dw_test_path(dir, "policy.json");
    assert_int_equal(dw_test_write(path, text, strlen(text)), 0);
    dw_policy *p = (dw_policy *)1;
    dw_status s = dw_policy_load(NULL, path, &p);
    if (s != want) fail_msg("%s: got %s (%s)", text, dw_status_name(s), dw_errmsg(NULL));
    if (s != DW_OK) {
        assert_null(p);
        assert_non_null(strstr(dw_errmsg(NULL), "policy.json"));
        if (msg_part && !strstr(dw_errmsg(NULL), msg_part)) fail_msg("%s: message '%s' lacks '%s'", text, dw_errmsg(NULL), msg_part);
    }
    free(path);
    return s == DW_OK ? p : NULL;
}

static dw_recipe resolve(const dw_policy *p, const char *name, int64_t layers, dw_policy_reason *why) {
    return dw_policy_resolve(p, name, "linear", layers, why, NULL);
}

static void test_defaults(void **state) {
    (void)state;
    dw_policy *p = NULL;
    assert_int_equal(dw_policy_from_precision(NULL, "nvfp4", false, &p), DW_OK);
    assert_true(p->nvfp4.rht && p->nvfp4.weight_2d && p->nvfp4.sr && p->nvfp4.bf16_head);
    assert_true(p->nvfp4.bf16_last_blocks == 0.15);
    /* tails: round(0.15 L) */
    const int64_t L[] = {1, 3, 4, 8, 12, 24, 62}, want[] = {0, 0, 1, 1, 2, 4, 9};
    for (int i = 0; i < 7; i++) assert_int_equal(dw_nvfp4_bf16_tail(&p->nvfp4, L[i]), want[i]);
    dw_policy_reason why;
    char name[64];
    for (int l = 0; l < 12; l++) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj", l);
        const dw_recipe r = resolve(p, name, 12, &why);
        assert_int_equal(r, l >= 10 ? DW_RECIPE_BF16 : DW_RECIPE_NVFP4);
        assert_int_equal(why, l >= 10 ? DW_POLICY_NVFP4_BF16 : DW_POLICY_BY_DEFAULT);
    }
    assert_int_equal(resolve(p, "transformer.h.7.attn.c_attn", 8, &why), DW_RECIPE_BF16);
    assert_int_equal(resolve(p, "transformer.h.6.attn.c_attn", 8, &why), DW_RECIPE_NVFP4);
    assert_int_equal(resolve(p, "lm_head", 8, &why), DW_RECIPE_BF16);
    assert_int_equal(why, DW_POLICY_NVFP4_BF16);
    assert_non_null(strstr(dw_policy_reason_text(why), "nvfp4 recipe"));
    /* the dump names the recipe; another default recipe's dump does not */
    char *json = NULL;
    assert_int_equal(dw_policy_to_json(NULL, p, &json), DW_OK);
    assert_non_null(strstr(json, "\"nvfp4\""));
    assert_non_null(strstr(json, "\"stochastic_rounding\":true"));
    free(json);
    dw_policy_free(p);
    assert_int_equal(dw_policy_from_precision(NULL, "fp8_block", false, &p), DW_OK);
    assert_int_equal(dw_policy_to_json(NULL, p, &json), DW_OK);
    assert_null(strstr(json, "nvfp4"));
    /* the tail is nvfp4's only; the head stays BF16 there by the policy's default fallback */
    assert_int_equal(resolve(p, "model.layers.7.mlp.up_proj", 8, &why), DW_RECIPE_FP8_BLOCK);
    assert_int_equal(resolve(p, "lm_head", 8, &why), DW_RECIPE_BF16);
    assert_int_equal(why, DW_POLICY_BY_HEAD);
    free(json);
    dw_policy_free(p);
}

static void test_overrides_and_round_trip(void **state) {
    (void)state;
    char *dir = dw_test_tmpdir();
    dw_policy_reason why;
    dw_policy *p = load_text(dir, "{\"default\": \"nvfp4\"}", DW_OK, NULL); /* no field: the defaults */
    assert_true(p->nvfp4.rht && p->nvfp4.sr && p->nvfp4.weight_2d);
    assert_int_equal(resolve(p, "lm_head", 8, &why), DW_RECIPE_BF16);
    dw_policy_free(p);
    p = load_text(dir, "{\"default\": \"nvfp4\", \"nvfp4\": {\"rht\": false, \"weight_2d\": false, "
                       "\"stochastic_rounding\": false, \"bf16_last_blocks\": 0, \"bf16_head\": false, \"seed\": 77}}",
                  DW_OK, NULL);
    assert_false(p->nvfp4.rht || p->nvfp4.weight_2d || p->nvfp4.sr || p->nvfp4.bf16_head);
    assert_int_equal(p->nvfp4.seed, 77);
    assert_int_equal(resolve(p, "lm_head", 8, &why), DW_RECIPE_NVFP4);
    assert_int_equal(resolve(p, "model.layers.7.mlp.up_proj", 8, &why), DW_RECIPE_NVFP4);
    char *json = NULL;
    assert_int_equal(dw_policy_to_json(NULL, p, &json), DW_OK);
    dw_policy *q = load_text(dir, json, DW_OK, NULL);
    assert_memory_equal(&q->nvfp4, &p->nvfp4, sizeof p->nvfp4);
    free(json), dw_policy_free(q), dw_policy_free(p);
    /* a larger tail; an explicit rule naming nvfp4 wins over it; fallback "safe" comes first */
    p = load_text(dir, "{\"default\": \"nvfp4\", \"nvfp4\": {\"bf16_last_blocks\": 0.5}, \"rules\": "
                       "[{\"match\": \"model.layers.7.*\", \"recipe\": \"nvfp4\"}]}", DW_OK, NULL);
    assert_int_equal(resolve(p, "model.layers.4.mlp.up_proj", 8, &why), DW_RECIPE_BF16);
    assert_int_equal(resolve(p, "model.layers.3.mlp.up_proj", 8, &why), DW_RECIPE_NVFP4);
    assert_int_equal(resolve(p, "model.layers.7.mlp.up_proj", 8, &why), DW_RECIPE_NVFP4);
    assert_int_equal(why, DW_POLICY_BY_RULE);
    dw_policy_free(p);
    /* a rule-only use of nvfp4 still dumps the recipe */
    p = load_text(dir, "{\"default\": \"bf16\", \"rules\": [{\"op\": \"linear\", \"recipe\": \"nvfp4\"}]}", DW_OK, NULL);
    assert_int_equal(dw_policy_to_json(NULL, p, &json), DW_OK);
    assert_non_null(strstr(json, "\"bf16_last_blocks\""));
    free(json), dw_policy_free(p);
    /* refusals name the file and the key */
    load_text(dir, "{\"default\": \"nvfp4\", \"nvfp4\": {\"hadamard\": true}}", DW_ERR_FORMAT, "unknown key 'hadamard'");
    load_text(dir, "{\"default\": \"nvfp4\", \"nvfp4\": {\"bf16_last_blocks\": 1.5}}", DW_ERR_FORMAT, "nvfp4.bf16_last_blocks");
    load_text(dir, "{\"default\": \"nvfp4\", \"nvfp4\": {\"rht\": 1}}", DW_ERR_FORMAT, "nvfp4.rht");
    load_text(dir, "{\"default\": \"nvfp4\", \"nvfp4\": {\"seed\": -3}}", DW_ERR_FORMAT, "nvfp4.seed");
    load_text(dir, "{\"default\": \"nvfp4\", \"nvfp4\": [1]}", DW_ERR_FORMAT, "field 'nvfp4'");
    dw_test_rmtree(dir);
    free(dir);
}

static void test_compile_report(void **state) {
    (void)state;
    dw_test_rng r;
    dw_test_rng_init(&r, dw_test_seed());
    dw_ctx *ctx = NULL;
    const dw_ctx_opts o = {.device = DW_DEVICE_CPU};
    assert_int_equal(dw_ctx_create(&o, &ctx), DW_OK);
    dw_graph *g = dw_test_small_graph(ctx, "llama-tiny", 1, 16, &r);
    assert_non_null(g);
    dw_policy *p = NULL;
    assert_int_equal(dw_policy_from_precision(ctx, "nvfp4", false, &p), DW_OK);
    dw_compiled *c = NULL;
    assert_int_equal(dw_compile(ctx, g, NULL, p, NULL, &c), DW_OK);
    char *text = NULL;
    assert_int_equal(dw_compiled_report(ctx, c, &text), DW_OK);
    assert_non_null(strstr(text, "nvfp4 recipe: the LM head and the last blocks stay BF16"));
    dw_free_string(text);
    dw_compiled_free(c);
    dw_policy_free(p);
    dw_graph_free(g);
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_overrides_and_round_trip),
        cmocka_unit_test(test_compile_report),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
