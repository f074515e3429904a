/* test_capture_config.c — model configs: presets (parameter counts against the published
 * figures), HF config.json parsing for each supported model_type, errors that name the file and
 * field, refusal of unsupported types and rope scalings, save -> load round trips; the Qwen MoE
 * families' layer rule (decoder_sparse_step, mlp_only_layers), published parameter counts and graphs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "capture/capture.h"
#include "capture/model_config.h"
#include "deepwell.h"
#include "testutil.h"


/* Published parameter counts (transformers' num_parameters(), embeddings counted once). */
static void test_preset_params(void **state) {
    (void)state;
    const struct {
        const char *name;
        int64_t params;
    } known[] = {{"gpt2-124m", 124439808},       {"llama-1b", 1235814400},
                 {"llama-8b", 8030261248LL},     {"llama-70b", 70553706496LL},
                 {"llama-405b", 405853388800LL}, {"mixtral-8x7b", 46702792704LL},
                 {"moe-e8", 2446493696LL},       {"moe-e64", 2723440640LL}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        dw_model_config c;
        assert_int_equal(dw_model_config_load(dw_test_ctx, known[i].name, &c), DW_OK);
        if (dw_model_config_params(&c) != known[i].params)
            fail_msg("%s: %lld params, published %lld", known[i].name,
                     (long long)dw_model_config_params(&c), (long long)known[i].params);
    }
    int n = dw_model_preset_count();
    assert_true(n >= 10);
    bool seen_tiny = false;
    for (int i = 0; i < n; i++) {
        dw_model_config c;
        assert_int_equal(dw_model_config_load(dw_test_ctx, dw_model_preset_name(i), &c), DW_OK);
        bool planning = strstr("llama-8b llama-70b llama-405b mixtral-8x7b deepseek-v3",
                               dw_model_preset_name(i)) != NULL;
        assert_int_equal(c.planning_only, planning);
        if (!strcmp(dw_model_preset_name(i), "gpt2-tiny")) {
            seen_tiny = true;
            assert_int_equal(c.vocab_size, 256);
            assert_true(dw_model_config_params(&c) < 2000000);
        }
    }
    assert_true(seen_tiny);
    dw_model_config ds;
    assert_int_equal(dw_model_config_load(dw_test_ctx, "deepseek-v3", &ds), DW_OK);
    assert_int_equal(ds.n_experts, 256);
    assert_int_equal(ds.top_k, 8);
    assert_int_equal(ds.first_dense_layers, 3);
    assert_int_equal(ds.n_shared_experts, 1);
    assert_int_equal(ds.d_ff_expert, 2048);
    dw_model_config l1;
    assert_int_equal(dw_model_config_load(dw_test_ctx, "llama-1b", &l1), DW_OK);
    assert_int_equal(l1.n_kv_heads, 8);
    assert_true(l1.tie_embeddings);
    assert_true(l1.rope_theta == 500000.0);
}

static char *write_config(const char *dir, const char *json) {
    char *p = dw_test_path(dir, "config.json");
    assert_int_equal(dw_test_write(p, json, strlen(json)), 0);
    return p;
}

static void test_parse_gpt2(void **state) {
    (void)state;
    char *dir = dw_test_tmpdir();
    int64_t H = dw_test_rnd(1, 8), d = H * dw_test_rnd(1, 16) * 2, L = dw_test_rnd(1, 30), V = dw_test_rnd(10, 60000);
    char json[1024];
    snprintf(json, sizeof json,
             "{\"model_type\":\"gpt2\",\"vocab_size\":%lld,\"n_embd\":%lld,\"n_layer\":%lld,"
             "\"n_head\":%lld,\"n_inner\":null,\"n_positions\":%d,\"layer_norm_epsilon\":1e-5,"
             "\"activation_function\":\"gelu_new\",\"initializer_range\":0.03}",
             (long long)V, (long long)d, (long long)L, (long long)H, 512);
    free(write_config(dir, json));
    dw_model_config c;
    assert_int_equal(dw_model_config_load(dw_test_ctx, dir, &c), DW_OK);
    assert_int_equal(c.arch, DW_ARCH_GPT2);
    assert_int_equal(c.d_model, d);
    assert_int_equal(c.n_layers, L);
    assert_int_equal(c.n_heads, H);
    assert_int_equal(c.n_kv_heads, H);
    assert_int_equal(c.head_dim, d / H);
    assert_int_equal(c.d_ff, 4 * d);
    assert_int_equal(c.max_seq, 512);
    assert_int_equal(c.vocab_size, V);
    assert_true(c.tie_embeddings && c.linear_bias);
    assert_true(c.init_std == 0.03);
    /* GPT-2 closed form: V d + T d + L (12 d^2 + 13 d) + 2 d (tied head) */
    assert_int_equal(dw_model_config_params(&c), V * d + 512 * d + L * (12 * d * d + 13 * d) + 2 * d);
    dw_test_rmtree(dir);
    free(dir);
}

static void test_parse_llama_family(void **state) {
    (void)state;
    const char *types[] = {"llama", "mistral", "qwen2"};
    for (int t = 0; t < 3; t++) {
        char *dir = dw_test_tmpdir();
        int64_t Hkv = dw_test_rnd(1, 4), H = Hkv * dw_test_rnd(1, 4), D = 2 * dw_test_rnd(2, 32), d = dw_test_rnd(8, 512);
        int64_t F = dw_test_rnd(8, 1000), L = dw_test_rnd(1, 8), V = dw_test_rnd(10, 1000);
        int tie = (int)dw_test_rnd(0, 1), bias = (int)dw_test_rnd(0, 1);
        char json[2048];
        snprintf(json, sizeof json,
                 "{\"model_type\":\"%s\",\"vocab_size\":%lld,\"hidden_size\":%lld,"
                 "\"num_hidden_layers\":%lld,\"num_attention_heads\":%lld,"
                 "\"num_key_value_heads\":%lld,\"head_dim\":%lld,\"intermediate_size\":%lld,"
                 "\"max_position_embeddings\":4096,\"rms_norm_eps\":1e-6,\"rope_theta\":500000.0,"
                 "\"tie_word_embeddings\":%s,\"attention_bias\":%s,\"hidden_act\":\"silu\","
                 "\"rope_scaling\":null,\"sliding_window\":1024}",
                 types[t], (long long)V, (long long)d, (long long)L, (long long)H, (long long)Hkv,
                 (long long)D, (long long)F, tie ? "true" : "false", bias ? "true" : "false");
        free(write_config(dir, json));
        dw_model_config c;
        assert_int_equal(dw_model_config_load(dw_test_ctx, dir, &c), DW_OK);
        assert_string_equal(c.model_type, types[t]);
        assert_int_equal(c.arch, t == 0 ? DW_ARCH_LLAMA : t == 1 ? DW_ARCH_MISTRAL : DW_ARCH_QWEN2);
        assert_int_equal(c.n_heads, H);
        assert_int_equal(c.n_kv_heads, Hkv);
        assert_int_equal(c.head_dim, D);
        assert_int_equal(c.d_ff, F);
        assert_int_equal(c.tie_embeddings, tie);
        assert_int_equal(c.qkv_bias, t == 2 ? 1 : bias);
        assert_false(c.linear_bias);
        assert_int_equal(c.norm, DW_NORM_RMSNORM);
        assert_int_equal(c.pos, DW_POS_ROPE);
        assert_true(c.rope_theta == 500000.0 && c.norm_eps == 1e-6);
        int64_t qb = c.qkv_bias ? (H + 2 * Hkv) * D : 0;
        int64_t want = V * d * (tie ? 1 : 2) + d + (t == 0 && bias ? L * d : 0) +
                       L * (2 * d * H * D + 2 * d * Hkv * D + qb + 3 * d * F + 2 * d);
        assert_int_equal(dw_model_config_params(&c), want);
        /* save -> load gives the same config */
        char *p2 = dw_test_path(dir, "saved.json");
        assert_int_equal(dw_model_config_save(dw_test_ctx, &c, p2), DW_OK);
        dw_model_config c2;
        assert_int_equal(dw_model_config_load(dw_test_ctx, p2, &c2), DW_OK);
        assert_memory_equal(&c, &c2, sizeof c);
        free(p2);
        dw_test_rmtree(dir);
        free(dir);
    }
}

static void test_save_load_presets(void **state) {
    (void)state;
    const char *names[] = {"gpt2-tiny", "gpt2-124m", "llama-tiny",     "llama-1b",       "qwen2-tiny",
                           "qwen2-moe-tiny", "qwen3-moe-tiny", "mixtral-tiny", "olmoe-tiny", "moe-e8", "moe-e64"};
    char *dir = dw_test_tmpdir();
    char *p = dw_test_path(dir, "config.json");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        dw_model_config a, b;
        assert_int_equal(dw_model_config_load(dw_test_ctx, names[i], &a), DW_OK);
        assert_int_equal(dw_model_config_save(dw_test_ctx, &a, p), DW_OK);
        assert_int_equal(dw_model_config_load(dw_test_ctx, dir, &b), DW_OK);
        assert_memory_equal(&a, &b, sizeof a);
    }
    free(p);
    dw_test_rmtree(dir);
    free(dir);
}

/* Qwen1.5-MoE-A2.7B's and Qwen3-30B-A3B's config.json (the keys that matter). Parameters by hand:
 * Qwen1.5-MoE-A2.7B, per layer: q, k, v, o 4 x 2048^2 = 16,777,216 + q/k/v biases 6,144; 60 experts
 *   x 3 x 2048 x 1408 = 519,045,120; shared expert 3 x 2048 x 5632 = 34,603,008 + its gate 2,048;
 *   router 2048 x 60 = 122,880; norms 4,096 -> 570,560,512; x 24 = 13,693,452,288; embeddings and
 *   head 2 x 151936 x 2048 = 622,329,856; final norm 2,048 -> 14,315,784,192 (published 14.3B).
 * Qwen3-30B-A3B, per layer: q 2048 x 4096 + k, v 2 x 2048 x 512 + o 4096 x 2048 = 18,874,368 + q/k
 *   norms 2 x 128; 128 experts x 3 x 2048 x 768 = 603,979,776; router 262,144; norms 4,096 ->
 *   623,120,640; x 48 = 29,909,790,720; + 622,329,856 + 2,048 -> 30,532,122,624 (published 30.5B). */
static const char qwen15_moe[] =
    "{\"model_type\":\"qwen2_moe\",\"architectures\":[\"Qwen2MoeForCausalLM\"],\"vocab_size\":151936,"
    "\"hidden_size\":2048,\"intermediate_size\":5632,\"num_attention_heads\":16,"
    "\"num_key_value_heads\":16,\"max_position_embeddings\":8192,\"rms_norm_eps\":1e-06,\"rope_theta\":1000000.0,"
    "\"tie_word_embeddings\":false,\"hidden_act\":\"silu\",\"moe_intermediate_size\":1408,"
    "\"num_experts\":60,\"norm_topk_prob\":false,\"output_router_logits\":false,\"router_aux_loss_coef\":0.001,"
    "\"use_sliding_window\":false,\"sliding_window\":32768,\"max_window_layers\":21}";
static const char qwen3_30b[] =
    "{\"model_type\":\"qwen3_moe\",\"architectures\":[\"Qwen3MoeForCausalLM\"],\"vocab_size\":151936,"
    "\"hidden_size\":2048,\"intermediate_size\":6144,\"num_attention_heads\":32,"
    "\"num_key_value_heads\":4,\"head_dim\":128,\"max_position_embeddings\":40960,\"rms_norm_eps\":1e-06,"
    "\"rope_theta\":1000000.0,\"rope_scaling\":null,\"tie_word_embeddings\":false,\"hidden_act\":\"silu\","
    "\"attention_bias\":false,\"moe_intermediate_size\":768,"
    "\"num_experts\":128,\"norm_topk_prob\":true,\"router_aux_loss_coef\":0.001,"
    "\"use_sliding_window\":false,\"sliding_window\":null}";

/* Qwen1.5-MoE-A2.7B's (qwen3 false) or Qwen3-30B-A3B's config.json text into buf with the keys
 * `extra` ("\"k\":v,..." or ""); the keys that vary take the model's values unless extra has them. */
static void qwen_config(char *buf, size_t n, bool qwen3, const char *extra) {
    const char *base = qwen3 ? qwen3_30b : qwen15_moe;
    const char *keys[4][3] = {{"num_hidden_layers", "24", "48"}, {"decoder_sparse_step", "1", "1"},
                              {"mlp_only_layers", "[]", "[]"}, {"num_experts_per_tok", "4", "8"}};
    int len = snprintf(buf, n, "%.*s", (int)strlen(base) - 1, base);
    for (int k = 0; k < 4; k++) {
        char quoted[64];
        snprintf(quoted, sizeof quoted, "\"%s\"", keys[k][0]);
        if (!strstr(extra, quoted)) len += snprintf(buf + len, n - (size_t)len, ",%s:%s", quoted, keys[k][qwen3 ? 2 : 1]);
    }
    if (!qwen3 && !strstr(extra, "shared_expert_intermediate_size"))
        len += snprintf(buf + len, n - (size_t)len, ",\"shared_expert_intermediate_size\":5632");
    snprintf(buf + len, n - (size_t)len, "%s%s}", *extra ? "," : "", extra);
}

/* Loads qwen_config(qwen3, extra) from dir/config.json into *c, then checks that saving it and
 * loading the saved file gives the same config. */
static void load_qwen(const char *dir, bool qwen3, const char *extra, dw_model_config *c) {
    char json[2048];
    qwen_config(json, sizeof json, qwen3, extra);
    free(write_config(dir, json));
    assert_int_equal(dw_model_config_load(dw_test_ctx, dir, c), DW_OK);
    char *saved = dw_test_path(dir, "saved.json");
    dw_model_config c2;
    assert_int_equal(dw_model_config_save(dw_test_ctx, c, saved), DW_OK);
    assert_int_equal(dw_model_config_load(dw_test_ctx, saved, &c2), DW_OK);
    assert_memory_equal(c, &c2, sizeof c2);
    free(saved);
}

static void test_parse_qwen_moe(void **state) {
    (void)state;
    char *dir = dw_test_tmpdir();
    dw_model_config c;
    load_qwen(dir, false, "", &c);
    assert_int_equal(c.arch, DW_ARCH_QWEN2_MOE);
    assert_int_equal(c.n_experts, 60);
    assert_int_equal(c.top_k, 4);
    assert_int_equal(c.d_ff, 5632);
    assert_int_equal(c.d_ff_expert, 1408);
    assert_int_equal(c.d_ff_shared, 5632);
    assert_true(c.shared_gate && c.qkv_bias && !c.norm_topk && !c.qk_norm_heads);
    assert_int_equal(dw_model_config_params(&c), 14315784192LL);

    load_qwen(dir, true, "", &c);
    assert_int_equal(c.arch, DW_ARCH_QWEN3_MOE);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.n_experts, 128);
    assert_int_equal(c.top_k, 8);
    assert_int_equal(c.d_ff_expert, 768);
    assert_true(c.norm_topk && c.qk_norm_heads && !c.qk_norm && !c.qkv_bias && !c.d_ff_shared && !c.shared_gate);
    assert_int_equal(dw_model_config_params(&c), 30532122624LL);

    /* as transformers 5.17's save_pretrained writes Qwen3-MoE: num_local_experts, rope_parameters */
    free(write_config(dir, "{\"model_type\":\"qwen3_moe\",\"vocab_size\":97,\"hidden_size\":48,\"intermediate_size\":40,"
                           "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,"
                           "\"max_position_embeddings\":64,\"num_local_experts\":5,\"num_experts_per_tok\":2,"
                           "\"rope_parameters\":{\"rope_theta\":500000.0,\"rope_type\":\"default\"}}"));
    assert_int_equal(dw_model_config_load(dw_test_ctx, dir, &c), DW_OK);
    assert_int_equal(c.n_experts, 5);
    assert_true(c.rope_theta == 500000.0);

    /* which layers are MoE: transformers' rule, (l not in mlp_only_layers) and (l + 1) % step == 0 */
    for (int rep = 0; rep < 20; rep++) {
        const int64_t L = dw_test_rnd(1, 12), step = dw_test_rnd(1, 4);
        char only[256] = "", extra[512];
        bool dense[12] = {false};
        for (int64_t l = 0, len = 0; l < L; l++)
            if (dw_test_rnd(0, 2) == 0) {
                dense[l] = true;
                len += snprintf(only + len, sizeof only - (size_t)len, "%s%lld", len ? "," : "", (long long)l);
            }
        snprintf(extra, sizeof extra, "\"num_hidden_layers\":%lld,\"decoder_sparse_step\":%lld,\"mlp_only_layers\":[%s]",
                 (long long)L, (long long)step, only);
        load_qwen(dir, rep % 2, extra, &c);
        int64_t moe = 0;
        for (int64_t l = 0; l < L; l++) {
            const bool want = !dense[l] && (l + 1) % step == 0;
            if (dw_model_config_moe_layer(&c, l) != want)
                fail_msg("L %lld, step %lld, mlp_only [%s]: layer %lld", (long long)L, (long long)step, only, (long long)l);
            moe += want;
        }
        /* the dense layers cost their MLP of width intermediate_size, the MoE ones their experts */
        const int64_t per_dense = 3 * 2048 * c.d_ff, per_moe = rep % 2 ? 603979776LL + 262144 : 519045120LL + 34603008 +
                                                                                               2048 + 122880;
        const int64_t attn = rep % 2 ? 18874368 + 256 + 4096 : 16777216 + 6144 + 4096;
        assert_int_equal(dw_model_config_params(&c), 622329856LL + 2048 + L * attn + moe * per_moe + (L - moe) * per_dense);
    }
    dw_test_rmtree(dir);
    free(dir);
}

/* Random small Qwen MoE configs captured: the graph's parameters equal the closed form, and each
 * layer has the nodes its kind says (a router per MoE layer, a sigmoid-gated shared expert per
 * Qwen2-MoE MoE layer, per-head q/k norms in every Qwen3-MoE layer, a dense MLP elsewhere). */
static void test_capture_qwen_moe(void **state) {
    (void)state;
    for (int rep = 0; rep < 30; rep++) {
        const bool qwen3 = rep % 2;
        dw_model_config c;
        assert_int_equal(dw_model_config_load(dw_test_ctx, qwen3 ? "qwen3-moe-tiny" : "qwen2-moe-tiny", &c), DW_OK);
        c.n_layers = dw_test_rnd(1, 5), c.sparse_step = dw_test_rnd(1, 3);
        memset(c.mlp_only, 0, sizeof c.mlp_only);
        for (int64_t l = 0; l < c.n_layers; l++)
            if (dw_test_rnd(0, 3) == 0) c.mlp_only[0] |= (uint64_t)1 << l;
        c.n_experts = dw_test_rnd(1, 6), c.top_k = dw_test_rnd(1, c.n_experts), c.d_ff_expert = dw_test_rnd(2, 20);
        c.n_kv_heads = dw_test_rnd(1, 2), c.n_heads = c.n_kv_heads * dw_test_rnd(1, 3), c.head_dim = 2 * dw_test_rnd(1, 6);
        c.d_model = dw_test_rnd(4, 30), c.d_ff = dw_test_rnd(4, 40), c.tie_embeddings = dw_test_rnd(0, 1);
        if (qwen3) c.qkv_bias = dw_test_rnd(0, 1); /* attention_bias: q, k, v and o */
        else c.d_ff_shared = dw_test_rnd(1, 20), c.qkv_bias = dw_test_rnd(0, 1);
        dw_graph *g = NULL;
        if (dw_capture_config(dw_test_ctx, &c, 1, 4, &g) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
        assert_int_equal(dw_graph_params(g), dw_model_config_params(&c));
        int64_t routers = 0, gates = 0, head_norms = 0, dense = 0, moe = 0, o_bias = 0;
        for (int64_t l = 0; l < c.n_layers; l++) moe += dw_model_config_moe_layer(&c, l);
        for (int i = 0; i < g->n_nodes; i++) {
            const dw_ir_node *n = &g->nodes[i];
            routers += n->op == DW_OP_MOE_ROUTER, gates += n->op == DW_OP_SIGMOID_GATE;
            head_norms += n->op == DW_OP_HEAD_RMSNORM;
            dense += n->op == DW_OP_SWIGLU && !strstr(n->name, "experts") && !strstr(n->name, "shared_expert");
            o_bias += strstr(n->name, "o_proj") && n->n_in == 3;
        }
        assert_int_equal(routers, moe);
        assert_int_equal(gates, qwen3 ? 0 : moe);
        assert_int_equal(head_norms, qwen3 ? 2 * c.n_layers : 0);
        assert_int_equal(dense, c.n_layers - moe);
        assert_int_equal(o_bias, qwen3 && c.qkv_bias ? c.n_layers : 0);
        dw_graph_free(g);
    }
}

/* Loads `json` and expects failure with every `needles` string in the message. */
static void expect_error(const char *json, dw_status want, const char *n1, const char *n2) {
    char *dir = dw_test_tmpdir();
    char *p = write_config(dir, json);
    dw_model_config c;
    c.d_model = 7;
    dw_status s = dw_model_config_load(dw_test_ctx, dir, &c);
    if (s != want || !strstr(dw_errmsg(dw_test_ctx), n1) || (n2 && !strstr(dw_errmsg(dw_test_ctx), n2)) ||
        !strstr(dw_errmsg(dw_test_ctx), "config.json"))
        fail_msg("json %s: status %s, message '%s'", json, dw_status_name(s), dw_errmsg(dw_test_ctx));
    assert_int_equal(c.d_model, 0); /* out-parameter cleared */
    free(p);
    dw_test_rmtree(dir);
    free(dir);
}

static void test_errors(void **state) {
    (void)state;
    expect_error("{\"model_type\":\"gemma\",\"hidden_size\":8}", DW_ERR_UNSUPPORTED,
                 "model_type 'gemma' is not supported yet (supported: gpt2, llama, mistral, qwen2, mixtral, "
                 "deepseek_v3, olmoe, qwen2_moe, qwen3_moe, qwen3, gemma2, phi3)",
                 NULL);
    /* sizes beyond any model are refused at once, before any product can overflow (issue 32) */
    expect_error("{\"model_type\":\"llama\",\"vocab_size\":100,\"hidden_size\":64,\"num_hidden_layers\":1000000000000,"
                 "\"num_attention_heads\":4,\"intermediate_size\":128,\"max_position_embeddings\":64}",
                 DW_ERR_INVALID, "'num_hidden_layers' = 1000000000000 is beyond 10000", NULL);
    expect_error("{\"model_type\":\"llama\",\"vocab_size\":100,\"hidden_size\":1000000000000,\"num_hidden_layers\":2,"
                 "\"num_attention_heads\":4,\"intermediate_size\":128,\"max_position_embeddings\":64}",
                 DW_ERR_INVALID, "'hidden_size' = 1000000000000 is beyond", NULL);
    expect_error("{\"model_type\":\"llama\",\"vocab_size\":16000000,\"hidden_size\":1000000,\"num_hidden_layers\":9000,"
                 "\"num_attention_heads\":15625,\"head_dim\":64,\"intermediate_size\":128,"
                 "\"max_position_embeddings\":64}",
                 DW_ERR_INVALID, "parameters, beyond 2^48", NULL);
    expect_error("{\"model_type\":\"mixtral\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
                 "\"num_attention_heads\":2,\"intermediate_size\":8,\"max_position_embeddings\":8}",
                 DW_ERR_FORMAT, "'num_local_experts'", "missing");
    expect_error("{\"model_type\":\"mixtral\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
                 "\"num_attention_heads\":2,\"intermediate_size\":8,\"max_position_embeddings\":8,"
                 "\"num_local_experts\":4,\"num_experts_per_tok\":5}",
                 DW_ERR_INVALID, "num_experts_per_tok <= num_local_experts", NULL);
    expect_error("{\"model_type\":\"gpt2\",\"vocab_size\":10,\"n_embd\":8,\"n_layer\":1,"
                 "\"n_positions\":8}", DW_ERR_FORMAT, "'n_head'", "missing");
    expect_error("{\"model_type\":\"gpt2\",\"vocab_size\":10,\"n_embd\":\"8\",\"n_layer\":1,"
                 "\"n_head\":2,\"n_positions\":8}", DW_ERR_FORMAT, "'n_embd'", "integer");
    expect_error("{\"model_type\":\"gpt2\",\"vocab_size\":10,\"n_embd\":8,\"n_layer\":1,"
                 "\"n_head\":2,\"n_positions\":8,\"activation_function\":\"relu\"}",
                 DW_ERR_UNSUPPORTED, "'activation_function'", "relu");
    const char *llama = "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,"
                        "\"num_hidden_layers\":1,\"num_attention_heads\":2,"
                        "\"intermediate_size\":16,\"max_position_embeddings\":64";
    char buf[2048];
    snprintf(buf, sizeof buf, "%s,\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":32}}", llama);
    expect_error(buf, DW_ERR_UNSUPPORTED, "'rope_scaling'", "dynamic"); /* more: test_capture_rope.c */
    snprintf(buf, sizeof buf, "%s,\"rope_parameters\":{\"rope_type\":\"ntk\",\"rope_theta\":1e6}}", llama);
    expect_error(buf, DW_ERR_UNSUPPORTED, "'rope_parameters'", "ntk");
    snprintf(buf, sizeof buf, "%s,\"num_key_value_heads\":3}", llama);
    expect_error(buf, DW_ERR_INVALID, "num_key_value_heads", NULL);
    snprintf(buf, sizeof buf, "%s,\"hidden_act\":\"gelu\"}", llama);
    expect_error(buf, DW_ERR_UNSUPPORTED, "'hidden_act'", NULL);
    expect_error("{\"model_type\":\"qwen2\",\"vocab_size\":10,\"hidden_size\":8,"
                 "\"num_hidden_layers\":0,\"num_attention_heads\":2,\"intermediate_size\":16,"
                 "\"max_position_embeddings\":64}", DW_ERR_INVALID, "'num_hidden_layers'", NULL);
    /* the Qwen MoE keys: layers out of range, a zero step or shared expert, a missing expert count */
    qwen_config(buf, sizeof buf, false, "\"mlp_only_layers\":[0,24]");
    expect_error(buf, DW_ERR_INVALID, "field 'mlp_only_layers': entry 1 = 24 is not a layer", "0 to 23");
    qwen_config(buf, sizeof buf, true, "\"mlp_only_layers\":[-1]");
    expect_error(buf, DW_ERR_INVALID, "'mlp_only_layers': entry 0 = -1", NULL);
    qwen_config(buf, sizeof buf, true, "\"mlp_only_layers\":[\"3\"]");
    expect_error(buf, DW_ERR_FORMAT, "'mlp_only_layers': entry 0 is not an integer", NULL);
    qwen_config(buf, sizeof buf, true, "\"mlp_only_layers\":3");
    expect_error(buf, DW_ERR_FORMAT, "'mlp_only_layers': expected a list", NULL);
    qwen_config(buf, sizeof buf, true, "\"decoder_sparse_step\":0");
    expect_error(buf, DW_ERR_INVALID, "field 'decoder_sparse_step' = 0", NULL);
    qwen_config(buf, sizeof buf, false, "\"shared_expert_intermediate_size\":0");
    expect_error(buf, DW_ERR_INVALID, "field 'shared_expert_intermediate_size' = 0", "shared_expert_gate");
    qwen_config(buf, sizeof buf, false, "\"num_experts_per_tok\":61");
    expect_error(buf, DW_ERR_INVALID, "num_experts_per_tok", NULL);
    expect_error("{\"model_type\":\"qwen3_moe\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
                 "\"num_attention_heads\":2,\"intermediate_size\":8,\"max_position_embeddings\":8}",
                 DW_ERR_FORMAT, "'num_experts'", "missing");
    expect_error("{\"model_type\": 3}", DW_ERR_FORMAT, "'model_type'", NULL);
    expect_error("{\"model_type\": \"llama\",", DW_ERR_FORMAT, ":1:", NULL); /* syntax error */
    dw_model_config c;
    assert_int_equal(dw_model_config_load(dw_test_ctx, "no-such-model", &c), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "gpt2-tiny"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_preset_params),     cmocka_unit_test(test_parse_gpt2),
        cmocka_unit_test(test_parse_llama_family), cmocka_unit_test(test_save_load_presets),
        cmocka_unit_test(test_parse_qwen_moe),    cmocka_unit_test(test_capture_qwen_moe),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
