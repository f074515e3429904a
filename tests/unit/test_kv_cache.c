/* test_kv_cache.c — cached decoding (runtime/kv_cache.h) on the CPU engine for FP32 and BF16
 * programs, dense and mixture-of-experts: for random-weight models of each family (GPT-2's learned
 * positions, Llama's RoPE and GQA, Qwen2's biases and tied head, Mixtral, OLMoE, Qwen2-MoE's shared
 * expert, Qwen3-MoE's per-head norms) at a random sequence length, the logits of a prefill and of
 * every later step equal bit for bit those of a whole-sequence forward over the same tokens, and
 * dw_engine_generate gives the same tokens with the cache as without it (greedy and sampled, past
 * the program's sequence length). Also model directories of the families with their own attention:
 * Gemma 2 (sliding window on alternate layers, soft-capped scores and logits, query_pre_attn_scalar),
 * Mistral (a window on every layer) and Phi-3 (packed q|k|v, partial rotary, longrope whose long
 * factors start mid-decoding). dw_engine_generate_timed reports the prefill and the decode apart.
 * A MoE that may drop tokens (capacity factor below E) and a quantised (fp8) program keep the full
 * recompute. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/kv_cache.h"
#include "test_kv_cache_dirs.h"
#include "testutil.h"

static const char *const FAMILIES[] = {"gpt2-tiny",   "llama-tiny",     "qwen2-tiny",    "mixtral-tiny",
                                       "olmoe-tiny", "qwen2-moe-tiny", "qwen3-moe-tiny"};

/* A model of `what` at seq T with random weights from the run's generator; BF16 with bf16. */
static dw_model *open_model(const char *what, int64_t T, bool bf16, dw_policy **pol) {
    *pol = NULL;
    if (bf16) assert_int_equal(dw_policy_from_precision(dw_test_ctx, "bf16", false, pol), DW_OK);
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.seq = T, mo.seed = dw_test_next(&dw_test_group_rng), mo.policy = *pol;
    dw_model *m = NULL;
    if (dw_model_open(dw_test_ctx, what, &mo, &m) != DW_OK) fail_msg("%s: %s", what, dw_errmsg(dw_test_ctx));
    return m;
}

/* Prefill np tokens, then step to T: each step's logits against the forward over the prefix. */
static void check_logits(const char *what, bool bf16) {
    const int64_t T = dw_test_rnd(8, 20), np = dw_test_rnd(1, T - 1);
    dw_policy *pol;
    dw_model *m = open_model(what, T, bf16, &pol);
    dw_engine *e = dw_model_engine(m);
    const int64_t V = dw_graph_vocab(dw_model_graph(m));
    assert_true(dw_kv_cache_supported(e));
    int32_t *tok = malloc((size_t)T * sizeof *tok);
    float *full = malloc((size_t)(T * V) * sizeof *full), *got = malloc((size_t)V * sizeof *got);
    assert_true(tok && full && got);
    for (int64_t i = 0; i < T; i++) tok[i] = (int32_t)dw_test_rnd(0, V - 1);
    dw_kv_cache *kv = NULL;
    assert_int_equal(dw_kv_cache_create(e, &kv), DW_OK);
    for (int64_t len = np; len <= T; len++) {
        if (len == np) assert_int_equal(dw_kv_cache_prefill(kv, tok, np, got), DW_OK);
        else assert_int_equal(dw_kv_cache_step(kv, tok[len - 1], got), DW_OK);
        assert_int_equal(dw_kv_cache_len(kv), len);
        assert_int_equal(dw_engine_forward(e, tok, NULL, 1, len, full, NULL), DW_OK);
        if (memcmp(got, full + (len - 1) * V, (size_t)V * sizeof *got) != 0)
            fail_msg("%s %s: position %lld of %lld (prefill %lld): cached logits differ from the forward's", what,
                     bf16 ? "bf16" : "fp32", (long long)(len - 1), (long long)T, (long long)np);
    }
    assert_int_equal(dw_kv_cache_step(kv, 1, got), DW_ERR_INVALID); /* full */
    dw_kv_cache_free(kv);
    free(tok), free(full), free(got);
    dw_model_free(m);
    dw_policy_free(pol);
}

/* dw_engine_generate with and without the cache: the same tokens, past the program's T too. */
static void check_generate(const char *what, bool bf16) {
    const int64_t T = dw_test_rnd(8, 16), np = dw_test_rnd(1, T - 1), n = T + 6 - np;
    dw_policy *pol;
    dw_model *m = open_model(what, T, bf16, &pol);
    dw_engine *e = dw_model_engine(m);
    const int64_t V = dw_graph_vocab(dw_model_graph(m));
    int32_t a[40], b[40];
    for (int64_t i = 0; i < np; i++) a[i] = b[i] = (int32_t)dw_test_rnd(0, V - 1);
    for (int mode = 0; mode < 2; mode++) {
        const double temp = mode ? 0.9 : 0.0;
        const uint64_t seed = dw_test_next(&dw_test_group_rng);
        uint64_t ra = seed, rb = seed;
        unsetenv("DW_KV_CACHE");
        assert_int_equal(dw_engine_generate(e, a, np, n, temp, mode ? 5 : 0, &ra), DW_OK);
        setenv("DW_KV_CACHE", "0", 1);
        assert_int_equal(dw_engine_generate(e, b, np, n, temp, mode ? 5 : 0, &rb), DW_OK);
        unsetenv("DW_KV_CACHE");
        for (int64_t i = 0; i < np + n; i++)
            if (a[i] != b[i])
                fail_msg("%s %s (temperature %.1f): token %lld: %d with the cache, %d without", what,
                         bf16 ? "bf16" : "fp32", temp, (long long)i, a[i], b[i]);
        assert_int_equal(ra, rb);
    }
    dw_model_free(m);
    dw_policy_free(pol);
}

/* Both precisions, logits and generation, for a directory of test_kv_cache_dirs.h. */
static void check_dir(const char *dir) {
    check_logits(dir, false);
    check_logits(dir, true);
    check_generate(dir, false);
    check_generate(dir, true);
}

static void test_family_dirs(void **state) {
    (void)state;
    dw_kv_for_each_dir(check_dir);
}

/* dw_engine_generate_timed: the prefill and decode apart, with the cache or without; a result
 * struct of size 0 refused, one that ends after prefill_s written no further. */
static void test_timed(void **state) {
    (void)state;
    dw_policy *pol;
    dw_model *m = open_model("llama-tiny", 16, false, &pol);
    dw_engine *e = dw_model_engine(m);
    int32_t tok[32] = {5, 9, 7};
    uint64_t rs = 1;
    for (int cache = 1; cache >= 0; cache--) {
        const int64_t n = dw_test_rnd(2, 20);
        setenv("DW_KV_CACHE", cache ? "1" : "0", 1);
        dw_generate_stats gs = {.size = sizeof gs};
        assert_int_equal(dw_engine_generate_timed(e, tok, 3, n, 0.0, 0, &rs, &gs), DW_OK);
        assert_true(gs.size == sizeof gs && gs.prefill_tokens == 3 && gs.decode_tokens == n - 1);
        assert_true(gs.cached == (bool)cache && gs.prefill_s > 0 && gs.decode_s > 0);
    }
    unsetenv("DW_KV_CACHE");
    dw_generate_stats zero = {.size = 0};
    assert_int_equal(dw_engine_generate_timed(e, tok, 3, 2, 0.0, 0, &rs, &zero), DW_ERR_INVALID);
    struct {
        dw_generate_stats s;
        double canary;
    } part = {.s = {.size = offsetof(dw_generate_stats, decode_s)}, .canary = -7.0};
    part.s.decode_s = -3.0;
    assert_int_equal(dw_engine_generate_timed(e, tok, 3, 4, 0.0, 0, &rs, &part.s), DW_OK);
    assert_true(part.s.prefill_s > 0 && part.s.decode_s == -3.0 && part.canary == -7.0);
    dw_model_free(m);
}

static void test_logits_fp32(void **state) {
    (void)state;
    for (size_t f = 0; f < sizeof FAMILIES / sizeof *FAMILIES; f++) check_logits(FAMILIES[f], false);
}

static void test_logits_bf16(void **state) {
    (void)state;
    for (size_t f = 0; f < sizeof FAMILIES / sizeof *FAMILIES; f++) check_logits(FAMILIES[f], true);
}

static void test_generate(void **state) {
    (void)state;
    for (size_t f = 0; f < sizeof FAMILIES / sizeof *FAMILIES; f++) {
        check_generate(FAMILIES[f], false);
        check_generate(FAMILIES[f], true);
    }
}

/* A MoE whose experts may drop assignments, and an fp8 program, are not decoded with a cache. */
static void test_refused(void **state) {
    (void)state;
    char *tmp = dw_test_tmpdir();
    char *dir = dw_test_model_dir(tmp, "{\"model_type\": \"mixtral\", \"vocab_size\": 64, \"hidden_size\": 32, "
                                       "\"intermediate_size\": 48, \"num_hidden_layers\": 1, "
                                       "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
                                       "\"num_local_experts\": 4, \"num_experts_per_tok\": 2, "
                                       "\"max_position_embeddings\": 32, \"capacity_factor\": 1.5}");
    assert_non_null(dir);
    dw_policy *pol;
    dw_model *m = open_model(dir, 16, false, &pol);
    assert_false(dw_kv_cache_supported(dw_model_engine(m)));
    dw_kv_cache *kv = (dw_kv_cache *)1;
    assert_int_equal(dw_kv_cache_create(dw_model_engine(m), &kv), DW_ERR_UNSUPPORTED);
    assert_null(kv);
    dw_model_free(m);
    assert_int_equal(dw_policy_from_precision(dw_test_ctx, "fp8_tensor", false, &pol), DW_OK);
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.seq = 16, mo.policy = pol;
    assert_int_equal(dw_model_open(dw_test_ctx, "llama-tiny", &mo, &m), DW_OK);
    assert_false(dw_kv_cache_supported(dw_model_engine(m)));
    dw_model_free(m);
    dw_policy_free(pol);
    dw_test_rmtree(tmp);
    free(dir);
    free(tmp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_fp32),
        cmocka_unit_test(test_logits_bf16),
        cmocka_unit_test(test_generate),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_family_dirs),
        cmocka_unit_test(test_timed),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
