/* test_float_forward.c — feed-forward graphs through the public C API (dw_graph_from_json with
 * input/output roles -> dw_compile -> dw_engine_forward_float) on the CPU engine: a random network
 * of every op such a graph maps (rmsnorm, linear with and without bias, exact and tanh GELU, silu,
 * relu, residual add, layernorm) at random widths against a double-precision oracle written here
 * (FP32 program: 1e-5 of the output's scale; BF16 program: 3e-2), fewer rows than the capacity,
 * the widths, the JSON round trip, and the refusals: rows out of range, NULL buffers, token calls on
 * a float engine and float calls on a token engine, malformed roles. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* The network, widths C (input, residual), F (hidden), M (output):
 *   h = rmsnorm(x, g0); u = gelu_erf(fc1(h) + b1); r = x + fc2(u); v = layernorm(r, g1, b1n);
 *   z = out(relu(gelu_tanh(silu(v)))) + bo          x (N,C) -> z (N,M) */
typedef struct {
    int64_t C, F, M;
} ff_dims;

static const char *const PARAMS[] = {"norm0.weight", "fc1.weight", "fc1.bias", "fc2.weight", "ln.weight",
                                     "ln.bias",      "out.weight", "out.bias"};
enum { P_G0, P_W1, P_B1, P_W2, P_G1, P_BN, P_WO, P_BO, P_COUNT };

static void param_shape(const ff_dims *d, int p, int64_t *rows, int64_t *cols) {
    const int64_t s[P_COUNT][2] = {{d->C, 1}, {d->F, d->C}, {d->F, 1}, {d->C, d->F},
                                   {d->C, 1}, {d->C, 1},    {d->M, d->C}, {d->M, 1}};
    *rows = s[p][0], *cols = s[p][1];
}

/* The graph document for B x T rows (input name `in_name`, roles as given). */
static char *ff_json(const ff_dims *d, int64_t B, int64_t T, const char *in_dtype, const char *roles) {
    char *s = malloc(1 << 14);
    assert_non_null(s);
    int n = snprintf(s, 1 << 14,
        "{\"format\":\"deepwell-graph\",\"version\":2,\"model_type\":\"feedforward\",\"batch\":%lld,\"seq\":%lld,"
        "\"model\":{\"blocks\":0,\"vocab\":1,\"max_seq\":1},\"config\":null,\"roles\":%s,\"tensors\":["
        "{\"name\":\"x\",\"kind\":\"input\",\"dtype\":\"%s\",\"shape\":[%lld,%lld,%lld]}",
        (long long)B, (long long)T, roles, in_dtype, (long long)B, (long long)T, (long long)d->C);
    for (int p = 0; p < P_COUNT; p++) {
        int64_t r, c;
        param_shape(d, p, &r, &c);
        if (c == 1)
            n += snprintf(s + n, (1 << 14) - n, ",{\"name\":\"%s\",\"kind\":\"param\",\"dtype\":\"f32\",\"shape\":[%lld],"
                          "\"init\":\"ones\"}", PARAMS[p], (long long)r);
        else
            n += snprintf(s + n, (1 << 14) - n, ",{\"name\":\"%s\",\"kind\":\"param\",\"dtype\":\"f32\",\"shape\":[%lld,"
                          "%lld],\"init\":\"normal\",\"init_std\":0.02}", PARAMS[p], (long long)r, (long long)c);
    }
#define NODE(name, op, ins, w) \
    n += snprintf(s + n, (1 << 14) - n, "%s{\"name\":\"" name "\",\"op\":\"" op "\",\"inputs\":[" ins "],\"output\":\"" \
                  name "\",\"shape\":[%lld,%lld,%lld]%s}", first ? "" : ",", (long long)B, (long long)T, (long long)(w), \
                  !strcmp(op, "rmsnorm") || !strcmp(op, "layernorm") ? ",\"attrs\":{\"eps\":1e-5}" : ""), first = 0
    int first = 1;
    n += snprintf(s + n, (1 << 14) - n, "],\"nodes\":[");
    NODE("norm0", "rmsnorm", "\"x\",\"norm0.weight\"", d->C);
    NODE("fc1", "linear", "\"norm0\",\"fc1.weight\",\"fc1.bias\"", d->F);
    NODE("act1", "gelu_erf", "\"fc1\"", d->F);
    NODE("fc2", "linear", "\"act1\",\"fc2.weight\"", d->C);
    NODE("res", "add", "\"x\",\"fc2\"", d->C);
    NODE("ln", "layernorm", "\"res\",\"ln.weight\",\"ln.bias\"", d->C);
    NODE("silu", "silu", "\"ln\"", d->C);
    NODE("gelu", "gelu", "\"silu\"", d->C);
    NODE("relu", "relu", "\"gelu\"", d->C);
    NODE("out", "linear", "\"relu\",\"out.weight\",\"out.bias\"", d->M);
#undef NODE
    snprintf(s + n, (1 << 14) - n, "]}");
    return s;
}

static const char *ROLES = "{\"input\":\"x\",\"output\":\"out\"}";

/* ---- the oracle, in double ---------------------------------------------------------------- */
static void linear(double *y, const double *x, const float *w, const float *b, int64_t N, int64_t K, int64_t M) {
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < M; j++) {
            double a = b ? b[j] : 0.0;
            for (int64_t k = 0; k < K; k++) a += x[i * K + k] * (double)w[j * K + k];
            y[i * M + j] = a;
        }
}
static void norm(double *y, const double *x, const float *g, const float *b, int64_t N, int64_t C, bool rms) {
    for (int64_t i = 0; i < N; i++) {
        double mean = 0, var = 0;
        for (int64_t k = 0; k < C; k++) mean += x[i * C + k] / (double)C;
        if (rms) mean = 0;
        for (int64_t k = 0; k < C; k++) var += (x[i * C + k] - mean) * (x[i * C + k] - mean) / (double)C;
        for (int64_t k = 0; k < C; k++)
            y[i * C + k] = (x[i * C + k] - mean) / sqrt(var + 1e-5) * g[k] + (b ? b[k] : 0.0);
    }
}
static void oracle(const ff_dims *d, float *const *p, const float *xf, int64_t N, double *z) {
    const int64_t C = d->C, F = d->F;
    double *x = malloc((size_t)(N * C) * sizeof *x), *h = malloc((size_t)(N * C) * sizeof *h);
    double *u = malloc((size_t)(N * F) * sizeof *u), *r = malloc((size_t)(N * C) * sizeof *r);
    for (int64_t i = 0; i < N * C; i++) x[i] = xf[i];
    norm(h, x, p[P_G0], NULL, N, C, true);
    linear(u, h, p[P_W1], p[P_B1], N, C, F);
    for (int64_t i = 0; i < N * F; i++) u[i] = 0.5 * u[i] * erfc(-u[i] / sqrt(2.0));
    linear(r, u, p[P_W2], NULL, N, F, C);
    for (int64_t i = 0; i < N * C; i++) r[i] += x[i];
    norm(h, r, p[P_G1], p[P_BN], N, C, false);
    for (int64_t i = 0; i < N * C; i++) {
        double v = h[i] / (1.0 + exp(-h[i]));                                                  /* silu */
        v = 0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));             /* gelu (tanh) */
        h[i] = v > 0 ? v : 0.0;                                                                /* relu */
    }
    linear(z, h, p[P_WO], p[P_BO], N, C, d->M);
    free(x), free(h), free(u), free(r);
}

/* ---- fixture ------------------------------------------------------------------------------ */
typedef struct {
    dw_graph *g;
    dw_policy *pol;
    dw_compiled *c;
    dw_engine *e;
} ff_engine;

static ff_engine ff_open(const ff_dims *d, int64_t B, int64_t T, const char *precision, float *const *params) {
    ff_engine f = {0};
    char *js = ff_json(d, B, T, "f32", ROLES);
    if (dw_graph_from_json(dw_test_ctx, js, strlen(js), "test graph", &f.g) != DW_OK)
        fail_msg("%s", dw_errmsg(dw_test_ctx));
    free(js);
    if (precision) assert_int_equal(dw_policy_from_precision(dw_test_ctx, precision, false, &f.pol), DW_OK);
    if (dw_compile(dw_test_ctx, f.g, NULL, f.pol, NULL, &f.c) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
    if (dw_engine_create(dw_test_ctx, f.c, NULL, &f.e) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
    for (int p = 0; p < P_COUNT; p++) {
        const int i = dw_test_param_index(f.e, PARAMS[p]);
        assert_true(i >= 0);
        assert_int_equal(dw_engine_param_write(f.e, i, params[p]), DW_OK);
    }
    return f;
}

static void ff_close(ff_engine *f) {
    dw_engine_free(f->e);
    dw_compiled_free(f->c);
    dw_policy_free(f->pol);
    dw_graph_free(f->g);
}

static ff_dims random_dims(void) {
    ff_dims d = {dw_test_rnd(3, 40), dw_test_rnd(5, 70), dw_test_rnd(1, 30)};
    return d;
}

static float **random_params(const ff_dims *d) {
    float **p = calloc(P_COUNT, sizeof *p);
    for (int k = 0; k < P_COUNT; k++) {
        int64_t r, c;
        param_shape(d, k, &r, &c);
        p[k] = malloc((size_t)(r * c) * sizeof **p);
        for (int64_t i = 0; i < r * c; i++)
            p[k][i] = c == 1 && (k == P_G0 || k == P_G1) ? dw_test_uniform(&dw_test_group_rng, 0.5f, 1.5f)
                      : dw_test_uniform(&dw_test_group_rng, -1.0f, 1.0f) / sqrtf((float)c);
    }
    return p;
}

static void free_params(float **p) {
    for (int k = 0; k < P_COUNT; k++) free(p[k]);
    free(p);
}

/* max |got - want| / max |want| over n values */
static double rel_err(const float *got, const double *want, int64_t n) {
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        e = fmax(e, fabs(got[i] - want[i]));
        s = fmax(s, fabs(want[i]));
    }
    return e / fmax(s, 1e-30);
}

static void check_against_oracle(const char *precision, double tol) {
    const ff_dims d = random_dims();
    const int64_t B = dw_test_rnd(1, 6), T = dw_test_rnd(1, 5);
    float **p = random_params(&d);
    ff_engine f = ff_open(&d, B, T, precision, p);
    assert_int_equal(dw_graph_input_width(f.g), d.C);
    assert_int_equal(dw_graph_output_width(f.g), d.M);
    for (int call = 0; call < 2; call++) { /* the capacity, then fewer rows */
        const int64_t b = call ? dw_test_rnd(1, B) : B, t = call ? dw_test_rnd(1, T) : T, N = b * t;
        float *x = malloc((size_t)(N * d.C) * sizeof *x), *y = malloc((size_t)(N * d.M) * sizeof *y);
        double *z = malloc((size_t)(N * d.M) * sizeof *z);
        for (int64_t i = 0; i < N * d.C; i++) x[i] = 2.0f * dw_test_normal(&dw_test_group_rng);
        for (int64_t i = 0; i < N * d.M; i++) y[i] = NAN;
        if (dw_engine_forward_float(f.e, x, b, t, y) != DW_OK) fail_msg("%s", dw_errmsg(dw_test_ctx));
        oracle(&d, p, x, N, z);
        const double err = rel_err(y, z, N * d.M);
        if (!(err <= tol))
            fail_msg("%s C=%lld F=%lld M=%lld rows %lldx%lld: error %.3g of the output's scale (tolerance %.1g)",
                     precision ? precision : "fp32", (long long)d.C, (long long)d.F, (long long)d.M, (long long)b,
                     (long long)t, err, tol);
        free(x), free(y), free(z);
    }
    ff_close(&f);
    free_params(p);
}

static void test_fp32_oracle(void **state) {
    (void)state;
    for (int rep = 0; rep < 4; rep++) check_against_oracle(NULL, 1e-5);
}

static void test_bf16_oracle(void **state) {
    (void)state;
    for (int rep = 0; rep < 2; rep++) check_against_oracle("bf16", 3e-2);
}

static void test_json_round_trip(void **state) {
    (void)state;
    const ff_dims d = random_dims();
    char *js = ff_json(&d, 2, 3, "f32", ROLES), *a = NULL, *b = NULL;
    dw_graph *g = NULL, *h = NULL;
    assert_int_equal(dw_graph_from_json(dw_test_ctx, js, strlen(js), NULL, &g), DW_OK);
    assert_int_equal(dw_graph_to_json(dw_test_ctx, g, false, &a), DW_OK);
    assert_non_null(strstr(a, "\"input\": \"x\"") ? strstr(a, "\"input\": \"x\"") : strstr(a, "\"input\":\"x\""));
    assert_null(strstr(a, "\"loss\""));
    assert_int_equal(dw_graph_from_json(dw_test_ctx, a, strlen(a), NULL, &h), DW_OK);
    assert_int_equal(dw_graph_to_json(dw_test_ctx, h, false, &b), DW_OK);
    assert_string_equal(a, b);
    assert_int_equal(dw_graph_input_width(h), d.C);
    dw_free_string(a), dw_free_string(b);
    dw_graph_free(g), dw_graph_free(h);
    free(js);
}

static void expect_error(dw_status got, dw_status want, const char *needle) {
    assert_int_equal(got, want);
    if (!strstr(dw_errmsg(dw_test_ctx), needle)) fail_msg("message '%s' lacks '%s'", dw_errmsg(dw_test_ctx), needle);
}

static void test_refusals(void **state) {
    (void)state;
    const ff_dims d = random_dims();
    float **p = random_params(&d);
    ff_engine f = ff_open(&d, 2, 3, NULL, p);
    float *x = calloc((size_t)(8 * 4 * d.C), sizeof *x), *y = calloc((size_t)(8 * 4 * d.M), sizeof *y);
    expect_error(dw_engine_forward_float(f.e, x, 3, 3, y), DW_ERR_INVALID, "capacity");
    expect_error(dw_engine_forward_float(f.e, x, 2, 4, y), DW_ERR_INVALID, "capacity");
    expect_error(dw_engine_forward_float(f.e, x, 0, 1, y), DW_ERR_INVALID, "capacity");
    expect_error(dw_engine_forward_float(f.e, NULL, 1, 1, y), DW_ERR_INVALID, "buffer");
    expect_error(dw_engine_forward_float(f.e, x, 1, 1, NULL), DW_ERR_INVALID, "buffer");
    int32_t tok[6] = {0};
    expect_error(dw_engine_forward(f.e, tok, NULL, 2, 3, NULL, NULL), DW_ERR_UNSUPPORTED, "dw_engine_forward_float");
    expect_error(dw_engine_forward_backward(f.e, tok, tok, 2, 3, 1.0, NULL), DW_ERR_UNSUPPORTED, "float");
    ff_close(&f);

    /* a token graph's engine refuses float input */
    dw_graph *g = NULL;
    dw_compiled *c = NULL;
    dw_engine *e = NULL;
    assert_int_equal(dw_capture_hf_shape(dw_test_ctx, "gpt2-tiny", 1, 8, &g), DW_OK);
    assert_int_equal(dw_graph_input_width(g), 0);
    assert_int_equal(dw_graph_output_width(g), 0);
    assert_int_equal(dw_compile(dw_test_ctx, g, NULL, NULL, NULL, &c), DW_OK);
    assert_int_equal(dw_engine_create(dw_test_ctx, c, NULL, &e), DW_OK);
    expect_error(dw_engine_forward_float(e, x, 1, 1, y), DW_ERR_UNSUPPORTED, "token ids");
    dw_engine_free(e), dw_compiled_free(c), dw_graph_free(g);

    /* malformed roles: the input an int32 tensor; no output role */
    dw_graph *bad = NULL;
    char *js = ff_json(&d, 2, 3, "i32", ROLES);
    assert_int_not_equal(dw_graph_from_json(dw_test_ctx, js, strlen(js), "bad", &bad), DW_OK);
    assert_null(bad);
    free(js);
    js = ff_json(&d, 2, 3, "f32", "{\"input\":\"x\"}");
    expect_error(dw_graph_from_json(dw_test_ctx, js, strlen(js), "bad", &bad), DW_ERR_FORMAT, "output");
    assert_null(bad);
    free(js);
    js = ff_json(&d, 2, 3, "f32", "{\"input\":\"x\",\"output\":\"fc1.weight\"}");
    expect_error(dw_graph_from_json(dw_test_ctx, js, strlen(js), "bad", &bad), DW_ERR_FORMAT, "fc1.weight");
    assert_null(bad);
    free(js);
    free(x), free(y);
    free_params(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32_oracle),
        cmocka_unit_test(test_bf16_oracle),
        cmocka_unit_test(test_json_round_trip),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
