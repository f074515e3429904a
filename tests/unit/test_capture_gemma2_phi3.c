/* test_capture_gemma2_phi3.c — Gemma 2 and Phi-3 (issue 26) below the whole-model parity of
 * tests/python/hf_parity_{gemma2,phi3}.py:
 * - the softcap op's and geglu's reference kernels against their formulas and finite differences;
 *   attention with soft-capped scores against an explicit masked softmax in double, its backward
 *   against finite differences, cap 0 bit for bit the uncapped kernel;
 * - config.json: Gemma2Config's defaults (head_dim 256, 4 KV heads, tied, caps 50 and 30,
 *   query_pre_attn_scalar 256, window 4096 on the even layers), nulls, layer_types; Phi-3's window
 *   and fused flag; bad values refused naming config.json and the key; save -> load round trips;
 * - capture: four (1 + w) norms per Gemma layer, the scaled embeddings, q scaled only when
 *   query_pre_attn_scalar differs from head_dim, the capped attention and logits, GeGLU; the graph's
 *   parameters equal to the closed form; compiling for CUDA refuses the capped attention and the
 *   offset norm by name. */
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

static float *rnd(int64_t n, float sd) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = sd * dw_test_normal(&g_rng);
    return p;
}

static void close_to(double got, double want, double tol, const char *what, int64_t i) {
    if (!(fabs(got - want) <= tol * (1 + fabs(want)))) fail_msg("%s[%lld]: %.9g, expected %.9g", what, (long long)i, got, want);
}

/* ---- elementwise kernels --------------------------------------------------------------------- */

static void test_softcap_kernel(void **state) {
    (void)state;
    for (int rep = 0; rep < 20; rep++) {
        const int64_t n = dw_test_rnd(1, 300);
        const double s = dw_test_rnd(0, 1) ? 1.0 : 0.25 + 8 * dw_test_uniform(&g_rng, 0, 1);
        const double c = dw_test_rnd(0, 3) ? 0.3 + 5 * dw_test_uniform(&g_rng, 0, 1) : 0.0;
        float *x = rnd(n, 3), *g = rnd(n, 1), *y = rnd(n, 1), *dx = rnd(n, 1);
        dw_cpu_softcap_fwd(y, x, n, s, c);
        dw_cpu_softcap_bwd(dx, g, x, n, s, c);
        for (int64_t i = 0; i < n; i++) {
            const double v = s * x[i], want = c > 0 ? c * tanh(v / c) : v;
            close_to(y[i], want, 1e-6, "softcap y", i);
            if (c > 0) assert_true(fabsf(y[i]) <= (float)c); /* capped */
            /* central difference of the formula in double around x */
            const double h = 1e-4, f1 = c > 0 ? c * tanh(s * (x[i] + h) / c) : s * (x[i] + h);
            const double f0 = c > 0 ? c * tanh(s * (x[i] - h) / c) : s * (x[i] - h);
            close_to(dx[i], g[i] * (f1 - f0) / (2 * h), 1e-5, "softcap dx", i);
        }
        free(x), free(g), free(y), free(dx);
    }
}

static double gelu_tanh(double v) { return 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); }

static void test_geglu_kernel(void **state) {
    (void)state;
    for (int rep = 0; rep < 20; rep++) {
        const int64_t n = dw_test_rnd(1, 300);
        float *a = rnd(n, 2), *u = rnd(n, 2), *g = rnd(n, 1), *y = rnd(n, 1), *da = rnd(n, 1), *du = rnd(n, 1);
        dw_cpu_geglu_fwd(y, a, u, n);
        dw_cpu_geglu_bwd(da, du, g, a, u, n);
        for (int64_t i = 0; i < n; i++) {
            close_to(y[i], gelu_tanh(a[i]) * u[i], 1e-6, "geglu y", i);
            const double h = 1e-4, d = (gelu_tanh(a[i] + h) - gelu_tanh(a[i] - h)) / (2 * h);
            close_to(da[i], (double)g[i] * u[i] * d, 1e-5, "geglu dgate", i);
            close_to(du[i], (double)g[i] * gelu_tanh(a[i]), 1e-6, "geglu dup", i);
        }
        free(a), free(u), free(g), free(y), free(da), free(du);
    }
}

/* ---- attention with soft-capped scores ------------------------------------------------------- */

typedef struct {
    int64_t B, T, H, Hkv, D, W;
    double cap;
} attn_shape;

/* sum(g * out) of the capped attention, computed in double from scratch (the oracle) */
static double attn_oracle(const attn_shape *a, const double *q, const double *k, const double *v, const float *g,
                          double *out) {
    const int64_t B = a->B, T = a->T, H = a->H, Hkv = a->Hkv, D = a->D;
    double total = 0, *s = malloc((size_t)T * sizeof *s);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                const int64_t gi = h / (H / Hkv);
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < T; j++) {
                    s[j] = -INFINITY;
                    if (j > t || (a->W && j <= t - a->W)) continue;
                    double d = 0;
                    for (int64_t c = 0; c < D; c++) d += q[((b * T + t) * H + h) * D + c] * k[((b * T + j) * Hkv + gi) * D + c];
                    s[j] = d / sqrt((double)D);
                    if (a->cap > 0) s[j] = a->cap * tanh(s[j] / a->cap);
                    mx = fmax(mx, s[j]);
                }
                for (int64_t j = 0; j < T; j++) sum += s[j] == -INFINITY ? 0 : exp(s[j] - mx);
                for (int64_t c = 0; c < D; c++) {
                    double o = 0;
                    for (int64_t j = 0; j < T; j++)
                        if (s[j] != -INFINITY) o += exp(s[j] - mx) / sum * v[((b * T + j) * Hkv + gi) * D + c];
                    const int64_t i = ((b * T + t) * H + h) * D + c;
                    if (out) out[i] = o;
                    total += g[i] * o;
                }
            }
    free(s);
    return total;
}

static double *widen(const float *x, int64_t n) {
    double *d = malloc((size_t)n * sizeof *d);
    assert_non_null(d);
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static void test_attention_softcap(void **state) {
    (void)state;
    for (int rep = 0; rep < 12; rep++) {
        attn_shape a = {dw_test_rnd(1, 2), dw_test_rnd(1, 12), 0, dw_test_rnd(1, 2), dw_test_rnd(1, 6), 0, 0};
        a.H = a.Hkv * dw_test_rnd(1, 3);
        a.W = dw_test_rnd(0, 1) ? dw_test_rnd(1, a.T + 1) : 0;
        a.cap = 0.3 + 3 * dw_test_uniform(&g_rng, 0, 1);
        const int64_t nq = a.B * a.T * a.H * a.D, nk = a.B * a.T * a.Hkv * a.D;
        float *q = rnd(nq, 1.5f), *k = rnd(nk, 1.5f), *v = rnd(nk, 1), *g = rnd(nq, 1);
        float *out = rnd(nq, 1), *lse = rnd(a.B * a.H * a.T, 1), *dq = rnd(nq, 1), *dk = rnd(nk, 1), *dv = rnd(nk, 1);
        dw_cpu_attention_softcap_fwd(out, lse, q, k, v, a.B, a.T, a.H, a.Hkv, a.D, a.W, a.cap);
        dw_cpu_attention_softcap_bwd(dq, dk, dv, g, q, k, v, out, lse, a.B, a.T, a.H, a.Hkv, a.D, a.W, a.cap);
        double *qd = widen(q, nq), *kd = widen(k, nk), *vd = widen(v, nk), *want = malloc((size_t)nq * sizeof *want);
        attn_oracle(&a, qd, kd, vd, g, want);
        for (int64_t i = 0; i < nq; i++) close_to(out[i], want[i], 1e-6, "capped attention out", i);
        /* every gradient entry against a central difference of the double oracle */
        const double h = 1e-5;
        struct {
            double *x;
            const float *grad;
            int64_t n;
            const char *what;
        } in[3] = {{qd, dq, nq, "dq"}, {kd, dk, nk, "dk"}, {vd, dv, nk, "dv"}};
        for (int s = 0; s < 3; s++)
            for (int64_t i = 0; i < in[s].n; i++) {
                const double x0 = in[s].x[i];
                in[s].x[i] = x0 + h;
                const double f1 = attn_oracle(&a, qd, kd, vd, g, NULL);
                in[s].x[i] = x0 - h;
                const double f0 = attn_oracle(&a, qd, kd, vd, g, NULL);
                in[s].x[i] = x0;
                close_to(in[s].grad[i], (f1 - f0) / (2 * h), 2e-5, in[s].what, i);
            }
        /* cap 0 is the uncapped kernel, bit for bit */
        float *o2 = rnd(nq, 1), *l2 = rnd(a.B * a.H * a.T, 1), *o3 = rnd(nq, 1), *l3 = rnd(a.B * a.H * a.T, 1);
        dw_cpu_attention_softcap_fwd(o2, l2, q, k, v, a.B, a.T, a.H, a.Hkv, a.D, a.W, 0.0);
        dw_cpu_attention_window_fwd(o3, l3, q, k, v, a.B, a.T, a.H, a.Hkv, a.D, a.W);
        assert_memory_equal(o2, o3, (size_t)nq * sizeof(float));
        free(q), free(k), free(v), free(g), free(out), free(lse), free(dq), free(dk), free(dv);
        free(qd), free(kd), free(vd), free(want), free(o2), free(l2), free(o3), free(l3);
    }
}

/* ---- configs and capture --------------------------------------------------------------------- */

/* A config of `type` with L layers plus `extra` (",\"k\":v..." or ""), parsed into *c. */
static dw_status parse(const char *type, int64_t L, const char *extra, dw_model_config *c) {
    char text[2048];
    snprintf(text, sizeof text,
             "{\"model_type\":\"%s\",\"vocab_size\":50,\"hidden_size\":16,\"num_hidden_layers\":%lld,"
             "\"num_attention_heads\":4,\"intermediate_size\":24,\"max_position_embeddings\":64%s}",
             type, (long long)L, extra);
    json_t *j = NULL;
    assert_int_equal(dw_json_load_string(dw_test_ctx, text, strlen(text), "config.json", &j), DW_OK);
    const dw_status s = dw_model_config_from_json(dw_test_ctx, j, "config.json", c);
    json_decref(j);
    return s;
}

static unsigned windowed(const dw_model_config *c) {
    unsigned m = 0;
    for (int64_t l = 0; l < c->n_layers; l++) m |= (unsigned)dw_model_config_windowed(c, l) << l;
    return m;
}

static void test_gemma2_config(void **state) {
    (void)state;
    dw_model_config c;
    if (parse("gemma2", 5, "", &c) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
    /* Gemma2Config's defaults */
    assert_int_equal(c.head_dim, 256);
    assert_int_equal(c.n_kv_heads, 4);
    assert_true(c.tie_embeddings && c.sandwich_norms && c.act == DW_ACT_GELU_GLU);
    assert_true(c.attn_softcap == 50.0 && c.final_softcap == 30.0 && c.query_pre_attn_scalar == 256.0);
    assert_true(c.norm_offset == 1.0 && fabs(c.embed_scale - 4.0) < 1e-12); /* sqrt(16) */
    assert_int_equal(c.sliding_window, 4096);
    assert_int_equal(windowed(&c), 0x15); /* layers 0, 2, 4 */
    assert_int_equal(parse("gemma2", 4, ",\"attn_logit_softcapping\":null,\"final_logit_softcapping\":null,"
                                        "\"sliding_window\":null,\"head_dim\":8,\"num_key_value_heads\":2", &c), DW_OK);
    assert_true(c.attn_softcap == 0 && c.final_softcap == 0 && windowed(&c) == 0 && c.head_dim == 8);
    assert_int_equal(parse("gemma2", 4, ",\"sliding_window\":3,\"layer_types\":[\"full_attention\",\"full_attention\","
                                        "\"sliding_attention\",\"sliding_attention\"]", &c), DW_OK);
    assert_int_equal(windowed(&c), 0xC);
    assert_int_equal(c.sliding_window, 3);
    const struct {
        const char *extra, *needle;
    } bad[] = {
        {",\"attn_logit_softcapping\":\"50\"", "attn_logit_softcapping"},
        {",\"final_logit_softcapping\":0", "'final_logit_softcapping' = 0"},
        {",\"query_pre_attn_scalar\":-1", "'query_pre_attn_scalar' = -1"},
        {",\"hidden_activation\":\"silu\"", "'hidden_activation': 'silu'"},
        {",\"sliding_window\":-1", "'sliding_window' = -1"},
        {",\"layer_types\":[\"sliding_attention\"]", "'layer_types': expected a list of 4"},
        {",\"rope_scaling\":{\"rope_type\":\"longrope\",\"factor\":2}", "'short_factor' must be a list"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const dw_status s = parse("gemma2", 4, bad[i].extra, &c);
        if (s == DW_OK || !strstr(dw_errmsg(dw_test_ctx), bad[i].needle) || !strstr(dw_errmsg(dw_test_ctx), "config.json"))
            fail_msg("gemma2%s: status %s, message '%s'", bad[i].extra, dw_status_name(s), dw_errmsg(dw_test_ctx));
    }
}

static int count_op(const dw_graph *g, dw_op op) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
    return n;
}

static void test_gemma2_capture(void **state) {
    (void)state;
    for (int rep = 0; rep < 16; rep++) {
        const int64_t L = dw_test_rnd(1, 4), D = 2 * dw_test_rnd(1, 8), qpas = dw_test_rnd(0, 1) ? D : dw_test_rnd(1, 64);
        const bool tie = dw_test_rnd(0, 3), bias = dw_test_rnd(0, 1), caps = dw_test_rnd(0, 2);
        char extra[512];
        snprintf(extra, sizeof extra, ",\"head_dim\":%lld,\"num_key_value_heads\":2,\"query_pre_attn_scalar\":%lld,"
                 "\"tie_word_embeddings\":%s,\"attention_bias\":%s%s,\"sliding_window\":%lld", (long long)D,
                 (long long)qpas, tie ? "true" : "false", bias ? "true" : "false",
                 caps ? ",\"attn_logit_softcapping\":2.5,\"final_logit_softcapping\":7.0"
                      : ",\"attn_logit_softcapping\":null,\"final_logit_softcapping\":null",
                 (long long)dw_test_rnd(1, 9));
        dw_model_config c;
        if (parse("gemma2", L, extra, &c) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
        dw_graph *g = NULL;
        if (dw_capture_config(dw_test_ctx, &c, 1, 8, &g) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
        assert_int_equal(dw_graph_params(g), dw_model_config_params(&c));
        assert_int_equal(count_op(g, DW_OP_RMSNORM), 4 * L + 1);
        assert_int_equal(count_op(g, DW_OP_GEGLU), L);
        assert_int_equal(count_op(g, DW_OP_SWIGLU), 0);
        /* the embedding scale, q scales where qpas != D, the capped logits */
        assert_int_equal(count_op(g, DW_OP_SOFTCAP), 1 + (qpas != D ? L : 0) + (caps ? 1 : 0));
        unsigned seen = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            const dw_ir_node *n = &g->nodes[i];
            if (n->op == DW_OP_RMSNORM) assert_true(n->attrs.offset == 1.0);
            if (n->op == DW_OP_ATTENTION) {
                assert_true(n->attrs.softcap == (caps ? 2.5 : 0.0));
                if (n->attrs.window) seen |= 1u << n->block;
            }
            if (n->op == DW_OP_SOFTCAP && strstr(n->name, "q_scale"))
                assert_true(fabs(n->attrs.scale - sqrt((double)D / (double)qpas)) < 1e-15);
            if (n->op == DW_OP_SOFTCAP && !strcmp(n->name, "model.embed_tokens.scale"))
                assert_true(n->attrs.scale == (double)(float)sqrt(16.0) && n->attrs.softcap == 0);
        }
        assert_int_equal(seen, windowed(&c));
        for (int i = 0; i < g->n_tensors; i++) /* the norms' w starts at 0 (applied as 1 + w), as transformers' */
            if (g->tensors[i].kind == DW_TENSOR_PARAM && g->tensors[i].ndim == 1 && strstr(g->tensors[i].name, "norm"))
                assert_int_equal(g->tensors[i].init, DW_INIT_ZEROS);
        assert_true(!caps || g->tensors[g->logits].producer >= 0);
        if (caps) assert_int_equal(g->nodes[g->tensors[g->logits].producer].op, DW_OP_SOFTCAP);
        /* the attention and o_proj biased together under attention_bias */
        int biased = 0;
        for (int i = 0; i < g->n_nodes; i++)
            biased += g->nodes[i].op == DW_OP_LINEAR && strstr(g->nodes[i].name, "self_attn") && g->nodes[i].n_in == 3;
        assert_int_equal(biased, bias ? 4 * L : 0);
        /* round trip through config.json */
        json_t *j = dw_model_config_to_json(&c);
        dw_model_config back;
        assert_int_equal(dw_model_config_from_json(dw_test_ctx, j, "saved", &back), DW_OK);
        json_decref(j);
        assert_true(back.attn_softcap == c.attn_softcap && back.final_softcap == c.final_softcap &&
                    back.query_pre_attn_scalar == c.query_pre_attn_scalar && back.tie_embeddings == c.tie_embeddings &&
                    windowed(&back) == windowed(&c) && back.head_dim == D);
        /* the graph survives its JSON form (the new attrs with it) */
        char *text = NULL;
        assert_int_equal(dw_graph_to_json(dw_test_ctx, g, false, &text), DW_OK);
        dw_graph *g2 = NULL;
        if (dw_graph_from_json(dw_test_ctx, text, strlen(text), "graph", &g2) != DW_OK)
            fail_msg("%s", dw_errmsg(dw_test_ctx));
        for (int i = 0; i < g->n_nodes; i++)
            assert_memory_equal(&g->nodes[i].attrs, &g2->nodes[i].attrs, sizeof g->nodes[i].attrs);
        dw_free_string(text);
        dw_graph_free(g2);
        /* CUDA has every piece (softcap, geglu, the offset norm, capped and windowed attention) */
        dw_compile_opts o;
        dw_compile_opts_init(&o, sizeof o);
        o.device = DW_DEVICE_CUDA;
        dw_compiled *p = NULL;
        if (dw_compile(dw_test_ctx, g, NULL, NULL, &o, &p) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
        dw_compiled_free(p);
        dw_graph_free(g);
    }
}

static void test_phi3_config(void **state) {
    (void)state;
    dw_model_config c;
    if (parse("phi3", 3, "", &c) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
    assert_true(dw_hf_arch_get(c.arch)->fused);
    assert_int_equal(windowed(&c), 0); /* Phi3Config's sliding_window: None */
    assert_true(!c.tie_embeddings && !c.qkv_bias && c.act == DW_ACT_SILU_GLU && c.norm_offset == 0);
    assert_int_equal(parse("phi3", 3, ",\"sliding_window\":5,\"attention_bias\":true", &c), DW_OK);
    assert_int_equal(windowed(&c), 0x7);
    assert_int_equal(c.sliding_window, 5);
    assert_false(c.qkv_bias); /* Phi3Attention has no biases whatever the key says */
    dw_graph *g = NULL;
    if (dw_capture_config(dw_test_ctx, &c, 1, 8, &g) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
    assert_int_equal(dw_graph_params(g), dw_model_config_params(&c));
    assert_int_equal(count_op(g, DW_OP_SWIGLU), 3);
    assert_int_equal(count_op(g, DW_OP_SOFTCAP), 0);
    dw_graph_free(g);
    json_t *j = dw_model_config_to_json(&c);
    dw_model_config back;
    assert_int_equal(dw_model_config_from_json(dw_test_ctx, j, "saved", &back), DW_OK);
    json_decref(j);
    assert_true(windowed(&back) == 0x7 && back.sliding_window == 5 && back.arch == c.arch);
    const struct {
        const char *extra, *needle;
    } bad[] = {
        {",\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1],\"long_factor\":[2]}", "'longrope'"},
        {",\"partial_rotary_factor\":0.25", "partial_rotary_factor 0.25"}, /* one rotary dim of 4 */
        {",\"sliding_window\":\"2047\"", "sliding_window"},
        {",\"hidden_act\":\"gelu\"", "'hidden_act': 'gelu'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const dw_status s = parse("phi3", 3, bad[i].extra, &c);
        if (s == DW_OK || !strstr(dw_errmsg(dw_test_ctx), bad[i].needle) || !strstr(dw_errmsg(dw_test_ctx), "config.json"))
            fail_msg("phi3%s: status %s, message '%s'", bad[i].extra, dw_status_name(s), dw_errmsg(dw_test_ctx));
    }
}

int main(void) {
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x6E3A2ull);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_softcap_kernel),   cmocka_unit_test(test_geglu_kernel),
        cmocka_unit_test(test_attention_softcap), cmocka_unit_test(test_gemma2_config),
        cmocka_unit_test(test_gemma2_capture),   cmocka_unit_test(test_phi3_config),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
