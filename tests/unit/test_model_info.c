/* test_model_info.c — deepwell.h's model presets and dw_model_info_load: every preset against
 * capture's private config, a random Llama config.json written here, a shorter result struct,
 * and refusals (unknown preset named, NULL, unset size). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/model_config.h"
#include "deepwell.h"
#include "testutil.h"

#define CTX dw_test_ctx

static void test_presets(void **state) {
    (void)state;
    int n = dw_model_preset_count();
    assert_true(n > 4);
    assert_null(dw_model_preset_name(n));
    assert_null(dw_model_preset_name(-1));
    for (int i = 0; i < n; i++) {
        const char *name = dw_model_preset_name(i);
        assert_non_null(name);
        dw_model_info m = {.size = sizeof m};
        dw_model_config c;
        assert_int_equal(dw_model_info_load(CTX, name, &m), DW_OK);
        assert_int_equal(dw_model_config_load(CTX, name, &c), DW_OK);
        assert_string_equal(m.model_type, c.model_type);
        assert_int_equal(m.n_layers, c.n_layers);
        assert_int_equal(m.d_model, c.d_model);
        assert_int_equal(m.n_kv_heads, c.n_kv_heads);
        assert_int_equal(m.n_experts, c.n_experts);
        assert_int_equal(m.params, dw_model_config_params(&c));
        assert_int_equal(m.planning_only, c.planning_only);
        assert_true(m.params > 0);
    }
}

static void test_config_json(void **state) {
    (void)state;
    int64_t H = dw_test_rnd(1, 16), hd = 8 * dw_test_rnd(1, 16), Hkv = H % 2 ? H : H / 2, L = dw_test_rnd(1, 40);
    int64_t V = dw_test_rnd(100, 60000), ff = dw_test_rnd(1, 5000), T = 64 * dw_test_rnd(1, 64);
    char *dir = dw_test_tmpdir(), *path = dw_test_path(dir, "config.json"), text[512];
    int len = snprintf(text, sizeof text,
                       "{\"model_type\": \"llama\", \"hidden_size\": %lld, \"num_hidden_layers\": %lld, "
                       "\"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, \"intermediate_size\": %lld, "
                       "\"vocab_size\": %lld, \"max_position_embeddings\": %lld, \"tie_word_embeddings\": false}",
                       (long long)(H * hd), (long long)L, (long long)H, (long long)Hkv, (long long)ff, (long long)V,
                       (long long)T);
    assert_int_equal(dw_test_write(path, text, (size_t)len), 0);
    dw_model_info m = {.size = sizeof m};
    assert_int_equal(dw_model_info_load(CTX, dir, &m), DW_OK);
    assert_string_equal(m.model_type, "llama");
    assert_int_equal(m.d_model, H * hd);
    assert_int_equal(m.head_dim, hd);
    assert_int_equal(m.n_kv_heads, Hkv);
    assert_int_equal(m.vocab_size, V);
    assert_int_equal(m.max_seq, T);
    assert_int_equal(m.n_experts, 0);
    assert_false(m.planning_only);
    /* Llama, untied: embeddings + LM head + per layer attention (q, o: d^2; k, v: d Hkv hd),
     * SwiGLU MLP 3 d ff and two RMSNorm weights, + the final norm */
    int64_t d = H * hd;
    int64_t want = 2 * V * d + L * (2 * d * d + 2 * d * Hkv * hd + 3 * d * ff + 2 * d) + d;
    assert_int_equal(m.params, want);
    /* a shorter, older struct: nothing past its size is written */
    unsigned char buf[sizeof(dw_model_info) + 8];
    memset(buf, 0x44, sizeof buf);
    size_t old = offsetof(dw_model_info, n_experts);
    memcpy(buf, &old, sizeof old);
    assert_int_equal(dw_model_info_load(CTX, path, (dw_model_info *)(void *)buf), DW_OK);
    for (size_t k = old; k < sizeof buf; k++) assert_int_equal(buf[k], 0x44);
    dw_test_rmtree(dir);
    free(path);
    free(dir);
}

static void test_refusals(void **state) {
    (void)state;
    dw_model_info m = {.size = sizeof m};
    assert_int_equal(dw_model_info_load(CTX, "llama-3000b", &m), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "llama-3000b"));
    assert_non_null(strstr(dw_errmsg(CTX), dw_model_preset_name(0)));
    assert_int_equal(dw_model_info_load(CTX, NULL, &m), DW_ERR_INVALID);
    assert_int_equal(dw_model_info_load(CTX, "gpt2-124m", NULL), DW_ERR_INVALID);
    dw_model_info unset = {0};
    assert_int_equal(dw_model_info_load(CTX, "gpt2-124m", &unset), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "size"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets),
        cmocka_unit_test(test_config_json),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
