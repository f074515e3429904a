/* test_sliding_window.c — sliding-window attention and the Qwen3 family (issue 26):
 * - the CPU kernel with a window of W keys against an explicit masked T x T softmax in double; a
 *   window of T or more keys equal bit for bit to plain causal attention (forward and backward); a
 *   window of 1 (each query sees itself): out = v, dq = dk = 0, dv = the group's summed dout;
 * - config.json: mistral's sliding_window (absent: 4096, null: none), the Qwen families'
 *   use_sliding_window / max_window_layers / layer_types, malformed values refused naming the field,
 *   save -> load round trips, and capture putting the window on exactly the windowed layers'
 *   attention nodes;
 * - qwen3: per-head q/k norms, explicit head_dim, attention_bias biasing q, k, v and o, the graph's
 *   parameter count equal to the closed form. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "capture/model_config_impl.h"
#include "core/json.h"
#include "deepwell.h"
#include "kernels/cpu/ops_cpu.h"
#include "testutil.h"

static dw_test_rng g_rng;

static float *rnd(int64_t n) {
    float *p = malloc((size_t)n * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = dw_test_normal(&g_rng);
    return p;
}

/* ---- the kernel ------------------------------------------------------------------------------ */

static void test_kernel_oracle(void **state) {
    (void)state;
    for (int rep = 0; rep < 20; rep++) {
        const int64_t B = dw_test_rnd(1, 2), T = dw_test_rnd(1, 24), Hkv = dw_test_rnd(1, 2);
        const int64_t H = Hkv * dw_test_rnd(1, 3), D = dw_test_rnd(1, 9), W = dw_test_rnd(1, T + 2);
        float *q = rnd(B * T * H * D), *k = rnd(B * T * Hkv * D), *v = rnd(B * T * Hkv * D);
        float *out = calloc((size_t)(B * T * H * D), sizeof(float)), *lse = calloc((size_t)(B * H * T), sizeof(float));
        dw_cpu_attention_window_fwd(out, lse, q, k, v, B, T, H, Hkv, D, W);
        double *s = malloc((size_t)T * sizeof *s);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t t = 0; t < T; t++) {
                    const int64_t g = h / (H / Hkv);
                    double mx = -INFINITY, sum = 0;
                    for (int64_t j = 0; j < T; j++) { /* the full row, masked: j <= t and j > t - W */
                        s[j] = -INFINITY;
                        if (j > t || j <= t - W) continue;
                        double d = 0;
                        for (int64_t c = 0; c < D; c++)
                            d += (double)q[((b * T + t) * H + h) * D + c] * k[((b * T + j) * Hkv + g) * D + c];
                        s[j] = d / sqrt((double)D);
                        mx = fmax(mx, s[j]);
                    }
                    for (int64_t j = 0; j < T; j++) sum += s[j] == -INFINITY ? 0 : exp(s[j] - mx);
                    for (int64_t c = 0; c < D; c++) {
                        double o = 0;
                        for (int64_t j = 0; j < T; j++)
                            if (s[j] != -INFINITY) o += exp(s[j] - mx) / sum * v[((b * T + j) * Hkv + g) * D + c];
                        const float got = out[((b * T + t) * H + h) * D + c];
                        if (fabs(got - o) > 1e-6 * (1 + fabs(o)))
                            fail_msg("B%lld T%lld H%lld/%lld D%lld W%lld: out[%lld,%lld,%lld,%lld] %.9g != %.9g",
                                     (long long)B, (long long)T, (long long)H, (long long)Hkv, (long long)D,
                                     (long long)W, (long long)b, (long long)t, (long long)h, (long long)c, got, o);
                    }
                    assert_true(fabs(lse[(b * H + h) * T + t] - (mx + log(sum))) < 1e-5 * (1 + fabs(mx + log(sum))));
                }
        free(s), free(q), free(k), free(v), free(out), free(lse);
    }
}

static void test_kernel_limits(void **state) {
    (void)state;
    for (int rep = 0; rep < 10; rep++) {
        const int64_t B = dw_test_rnd(1, 2), T = dw_test_rnd(1, 20), Hkv = dw_test_rnd(1, 2);
        const int64_t H = Hkv * dw_test_rnd(1, 3), D = dw_test_rnd(1, 8), nq = B * T * H * D, nk = B * T * Hkv * D;
        float *q = rnd(nq), *k = rnd(nk), *v = rnd(nk), *g = rnd(nq);
        float *o[2], *l[2], *dq[2], *dk[2], *dv[2];
        for (int i = 0; i < 2; i++) {
            o[i] = malloc((size_t)nq * 4), l[i] = malloc((size_t)(B * H * T) * 4), dq[i] = malloc((size_t)nq * 4);
            dk[i] = malloc((size_t)nk * 4), dv[i] = malloc((size_t)nk * 4);
        }
        /* a window of T or more keys is the causal mask: the same bits */
        dw_cpu_attention_fwd(o[0], l[0], q, k, v, B, T, H, Hkv, D);
        dw_cpu_attention_bwd(dq[0], dk[0], dv[0], g, q, k, v, o[0], l[0], B, T, H, Hkv, D);
        const int64_t W = T + dw_test_rnd(0, 3);
        dw_cpu_attention_window_fwd(o[1], l[1], q, k, v, B, T, H, Hkv, D, W);
        dw_cpu_attention_window_bwd(dq[1], dk[1], dv[1], g, q, k, v, o[1], l[1], B, T, H, Hkv, D, W);
        assert_memory_equal(o[0], o[1], (size_t)nq * 4);
        assert_memory_equal(dq[0], dq[1], (size_t)nq * 4);
        assert_memory_equal(dk[0], dk[1], (size_t)nk * 4);
        assert_memory_equal(dv[0], dv[1], (size_t)nk * 4);
        /* a window of 1: each query sees only its own key */
        dw_cpu_attention_window_fwd(o[1], l[1], q, k, v, B, T, H, Hkv, D, 1);
        dw_cpu_attention_window_bwd(dq[1], dk[1], dv[1], g, q, k, v, o[1], l[1], B, T, H, Hkv, D, 1);
        for (int64_t bt = 0; bt < B * T; bt++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t c = 0; c < D; c++) {
                    const int64_t gi = h / (H / Hkv);
                    assert_true(fabsf(o[1][(bt * H + h) * D + c] - v[(bt * Hkv + gi) * D + c]) <= 1e-6f);
                    assert_true(fabsf(dq[1][(bt * H + h) * D + c]) <= 1e-6f);
                }
        for (int64_t bt = 0; bt < B * T; bt++)
            for (int64_t gi = 0; gi < Hkv; gi++)
                for (int64_t c = 0; c < D; c++) {
                    double want = 0;
                    for (int64_t h = gi * (H / Hkv); h < (gi + 1) * (H / Hkv); h++) want += g[(bt * H + h) * D + c];
                    assert_true(fabsf(dk[1][(bt * Hkv + gi) * D + c]) <= 1e-6f);
                    assert_true(fabs(dv[1][(bt * Hkv + gi) * D + c] - want) <= 1e-5 * (1 + fabs(want)));
                }
        for (int i = 0; i < 2; i++) free(o[i]), free(l[i]), free(dq[i]), free(dk[i]), free(dv[i]);
        free(q), free(k), free(v), free(g);
    }
}

/* ---- configs --------------------------------------------------------------------------------- */

/* A config of `type` with L layers and the keys `extra` (",\"k\":v..." or ""), parsed into *c. */
static dw_status parse_layers(const char *type, int64_t L, const char *extra, dw_model_config *c) {
    char text[2048];
    snprintf(text, sizeof text,
             "{\"model_type\":\"%s\",\"vocab_size\":50,\"hidden_size\":16,\"num_hidden_layers\":%lld,"
             "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":24,"
             "\"max_position_embeddings\":64%s}", type, (long long)L, extra);
    json_t *j = NULL;
    assert_int_equal(dw_json_load_string(dw_test_ctx, text, strlen(text), "config.json", &j), DW_OK);
    const dw_status s = dw_model_config_from_json(dw_test_ctx, j, "config.json", c);
    json_decref(j);
    return s;
}
static dw_status parse(const char *type, const char *extra, dw_model_config *c) { return parse_layers(type, 4, extra, c); }

/* The windowed layers as a bit mask (layer l: bit l). */
static unsigned windowed(const dw_model_config *c) {
    unsigned m = 0;
    for (int64_t l = 0; l < c->n_layers; l++) m |= (unsigned)dw_model_config_windowed(c, l) << l;
    return m;
}

static void expect(const char *type, const char *extra, int64_t window, unsigned layers) {
    dw_model_config c;
    if (parse(type, extra, &c) != DW_OK) fail_msg("%s%s: %s", type, extra, dw_errmsg(dw_test_ctx));
    if (windowed(&c) != layers || (layers && c.sliding_window != window))
        fail_msg("%s%s: window %lld on layers 0x%x; expected %lld on 0x%x", type, extra, (long long)c.sliding_window,
                 windowed(&c), (long long)window, layers);
    /* round trip: the written config reads back the same windows */
    json_t *j = dw_model_config_to_json(&c);
    dw_model_config back;
    assert_int_equal(dw_model_config_from_json(dw_test_ctx, j, "saved", &back), DW_OK);
    json_decref(j);
    assert_int_equal(windowed(&back), layers);
    if (layers) assert_int_equal(back.sliding_window, window);
    /* capture: exactly the windowed layers' attention carries the window */
    dw_graph *g = NULL;
    if (dw_capture_config(dw_test_ctx, &c, 1, 8, &g) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
    unsigned seen = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == DW_OP_ATTENTION && g->nodes[i].attrs.window) {
            assert_int_equal(g->nodes[i].attrs.window, window);
            seen |= 1u << g->nodes[i].block;
        }
    assert_int_equal(seen, layers);
    dw_graph_free(g);
}

static void test_config_windows(void **state) {
    (void)state;
    expect("mistral", "", 4096, 0xF); /* MistralConfig's default */
    expect("mistral", ",\"sliding_window\":null", 0, 0);
    expect("mistral", ",\"sliding_window\":5", 5, 0xF);
    expect("mixtral", ",\"num_local_experts\":2", 0, 0); /* MixtralConfig's default: none */
    expect("mixtral", ",\"num_local_experts\":2,\"sliding_window\":7", 7, 0xF);
    expect("qwen2", ",\"sliding_window\":6", 0, 0); /* use_sliding_window false */
    expect("qwen2", ",\"use_sliding_window\":true,\"sliding_window\":6,\"max_window_layers\":1", 6, 0xE);
    expect("qwen2", ",\"use_sliding_window\":true,\"sliding_window\":6", 6, 0); /* max_window_layers 28 */
    expect("qwen3", ",\"use_sliding_window\":true,\"sliding_window\":3,\"max_window_layers\":0", 3, 0xF);
    expect("qwen3", ",\"use_sliding_window\":true,\"sliding_window\":3,\"layer_types\":[\"sliding_attention\","
           "\"full_attention\",\"sliding_attention\",\"full_attention\"]", 3, 0x5);
    expect("qwen2", ",\"use_sliding_window\":true,\"sliding_window\":null,\"max_window_layers\":0", 0, 0);
    expect("llama", ",\"use_sliding_window\":true,\"sliding_window\":3", 0, 0); /* Llama has none */
    const struct {
        const char *type, *extra, *needle;
    } bad[] = {
        {"mistral", ",\"sliding_window\":-2", "'sliding_window' = -2"},
        {"mistral", ",\"sliding_window\":\"4k\"", "sliding_window"},
        {"qwen2", ",\"use_sliding_window\":true,\"max_window_layers\":-1", "'max_window_layers' = -1"},
        {"qwen3", ",\"use_sliding_window\":true,\"layer_types\":[\"full_attention\"]", "'layer_types': expected a list of 4"},
        {"qwen3", ",\"use_sliding_window\":true,\"layer_types\":[\"full_attention\",\"chunked_attention\","
                  "\"full_attention\",\"full_attention\"]", "entry 1 is 'chunked_attention'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dw_model_config c;
        const dw_status s = parse(bad[i].type, bad[i].extra, &c);
        if (s == DW_OK || !strstr(dw_errmsg(dw_test_ctx), bad[i].needle) || !strstr(dw_errmsg(dw_test_ctx), "config.json"))
            fail_msg("%s%s: status %s, message '%s'", bad[i].type, bad[i].extra, dw_status_name(s),
                     dw_errmsg(dw_test_ctx));
    }
}

/* ---- qwen3 ----------------------------------------------------------------------------------- */

static void test_qwen3(void **state) {
    (void)state;
    for (int rep = 0; rep < 20; rep++) {
        const int64_t D = 2 * dw_test_rnd(1, 12), L = dw_test_rnd(1, 4);
        const bool bias = dw_test_rnd(0, 1), tie = dw_test_rnd(0, 1);
        char extra[256];
        snprintf(extra, sizeof extra, ",\"head_dim\":%lld,\"attention_bias\":%s,\"tie_word_embeddings\":%s",
                 (long long)D, bias ? "true" : "false", tie ? "true" : "false");
        dw_model_config c;
        if (parse_layers("qwen3", L, extra, &c) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
        assert_true(c.qk_norm_heads);
        assert_int_equal(c.head_dim, D); /* explicit, not hidden_size / heads */
        assert_int_equal(c.n_layers, L);
        dw_graph *g = NULL;
        if (dw_capture_config(dw_test_ctx, &c, 1, 4, &g) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
        assert_int_equal(dw_graph_params(g), dw_model_config_params(&c));
        int64_t head_norms = 0, biased = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            const dw_ir_node *n = &g->nodes[i];
            if (n->op == DW_OP_HEAD_RMSNORM) head_norms++, assert_int_equal(n->attrs.head_dim, D);
            biased += n->op == DW_OP_LINEAR && strstr(n->name, "self_attn") && n->n_in == 3;
        }
        assert_int_equal(head_norms, 2 * L);
        assert_int_equal(biased, bias ? 4 * L : 0); /* q, k, v and o */
        json_t *j = dw_model_config_to_json(&c); /* round trip */
        dw_model_config back;
        assert_int_equal(dw_model_config_from_json(dw_test_ctx, j, "saved", &back), DW_OK);
        json_decref(j);
        assert_true(back.qk_norm_heads && back.head_dim == D && back.qkv_bias == bias);
        assert_int_equal(dw_model_config_params(&back), dw_model_config_params(&c));
        dw_graph_free(g);
    }
}

int main(void) {
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x51D1Eull);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel_oracle),
        cmocka_unit_test(test_kernel_limits),
        cmocka_unit_test(test_config_windows),
        cmocka_unit_test(test_qwen3),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
