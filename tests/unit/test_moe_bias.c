/* test_moe_bias.c — auxiliary-loss-free load balancing (DeepSeek-V3): the MoE routers' selection
 * bias. The CPU router with a bias (kernels/cpu/router_cpu.c) against a brute-force oracle written
 * here (every expert ranked by sorting on score + bias in double, ties to the lower expert; the
 * weights from the unbiased scores), softmax and sigmoid, renormalised or not, on fresh random
 * sizes, with exact ties, a bias that must change the choice and NaN logits. The engine's switch
 * (runtime/engine_moe_bias.c): the router node reads the bias only while it is on, the values read
 * back bit for bit. The update rule (train/moe_bias.c) over several steps of known routings against
 * a double oracle rounded once, and through the trainer's per-layer step onto the engine. State:
 * state.json's "moe_bias" read back bit for bit (negative zero and subnormals included), malformed
 * values and bad speeds refused naming the file or flag. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/program.h"
#include "kernels/cpu/ops_cpu.h"
#include "runtime/engine.h"
#include "runtime/engine_moe_bias.h"
#include "testutil.h"
#include "train/moe_bias.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)

/* ---- the router op with a bias, against sorting ------------------------------------------------ */
static double score_of(const float *z, int64_t E, int64_t e, int score) {
    if (score) return 1.0 / (1.0 + exp(-(double)z[e]));
    double m = z[0], s = 0.0;
    for (int64_t x = 1; x < E; x++) m = fmax(m, (double)z[x]);
    for (int64_t x = 0; x < E; x++) s += exp((double)z[x] - m);
    return exp((double)z[e] - m) / s;
}

/* Row z's experts in rank order by score + bias (larger first, then the lower expert), NaN logits
 * left out (softmax: one NaN logit makes every score NaN, so none is left); insertion sort. Returns
 * how many are ranked. */
static int64_t oracle_order(const float *z, const float *bias, int64_t E, int score, int64_t *order) {
    int64_t n = 0;
    double key[256];
    for (int64_t e = 0; e < E; e++)
        if (z[e] != z[e] && !score) return 0;
    for (int64_t e = 0; e < E; e++) {
        if (z[e] != z[e]) continue;
        key[e] = score_of(z, E, e, score) + (double)bias[e];
        int64_t j = n++;
        while (j > 0 && (key[order[j - 1]] < key[e] || (key[order[j - 1]] == key[e] && order[j - 1] > e))) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = e;
    }
    return n;
}

/* One case: the kernel's experts equal the oracle's and its weights the unbiased scores of those
 * experts (renormalised over them or not) within one FP32 rounding. Returns the mismatches;
 * *changed counts the rows whose first expert the bias moved. */
static int64_t run_router(int64_t N, int64_t E, int64_t K, int score, int renorm, int kind, int64_t *changed) {
    float *z = malloc((size_t)(N * E) * 4), *bias = malloc((size_t)E * 4), *w = malloc((size_t)(N * K) * 4);
    float *w0 = malloc((size_t)(N * K) * 4);
    int32_t *idx = malloc((size_t)(N * K) * 4), *idx0 = malloc((size_t)(N * K) * 4);
    for (int64_t i = 0; i < N * E; i++) z[i] = dw_test_uniform(RNG, -3.0f, 3.0f);
    for (int64_t e = 0; e < E; e++) bias[e] = dw_test_uniform(RNG, -0.3f, 0.3f);
    if (kind == 1) { /* exact ties: expert E-1 repeats expert 0's logit and bias (the lower goes first) */
        bias[E - 1] = bias[0];
        for (int64_t n = 0; n < N; n++) z[n * E + E - 1] = z[n * E];
    }
    if (kind == 2) { /* the bias must decide: the row's smallest-logit expert gets +2 > any score */
        for (int64_t e = 0; e < E; e++) bias[e] = 0.0f;
        bias[E - 1] = 2.0f;
    }
    if (kind == 3 && E > 1) z[(N - 1) * E + 0] = NAN; /* a NaN logit: never chosen */
    dw_cpu_moe_router_fwd_biased(w, idx, z, bias, N, E, K, score, renorm);
    dw_cpu_moe_router_fwd(w0, idx0, z, N, E, K, score, renorm);
    int64_t bad = 0, order[256];
    for (int64_t n = 0; n < N; n++) {
        const float *zr = z + n * E;
        const int64_t avail = oracle_order(zr, bias, E, score, order);
        double sum = 0.0;
        for (int64_t k = 0; k < K && k < avail; k++) sum += score_of(zr, E, order[k], score);
        for (int64_t k = 0; k < K; k++) {
            const int32_t want = k < avail ? (int32_t)order[k] : -1;
            if (idx[n * K + k] != want) {
                bad++;
                fprintf(stderr, "router kind %d %s%s N=%lld E=%lld K=%lld: row %lld k %lld expert %d, oracle %d\n", kind,
                        score ? "sigmoid" : "softmax", renorm ? " renorm" : "", (long long)N, (long long)E,
                        (long long)K, (long long)n, (long long)k, idx[n * K + k], want);
                continue;
            }
            if (want < 0) {
                bad += !isnan(w[n * K + k]);
                continue;
            }
            const double p = score_of(zr, E, want, score), ww = renorm ? p / sum : p;
            if (fabs((double)w[n * K + k] - ww) > 1e-6 * fabs(ww) + 1e-30) {
                bad++;
                fprintf(stderr, "router kind %d: row %lld k %lld weight %.9g, oracle %.9g\n", kind, (long long)n,
                        (long long)k, w[n * K + k], ww);
            }
        }
        *changed += idx[n * K] != idx0[n * K];
    }
    free(z), free(bias), free(w), free(w0), free(idx), free(idx0);
    return bad;
}

static void test_router_biased(void **state) {
    (void)state;
    int64_t bad = 0;
    for (int score = 0; score < 2; score++)
        for (int renorm = 0; renorm < 2; renorm++)
            for (int kind = 0; kind < 4; kind++) {
                const int64_t E = dw_test_rnd(3, 40), K = dw_test_rnd(1, E), N = dw_test_rnd(1, 17);
                int64_t changed = 0;
                bad += run_router(N, E, K, score, renorm, kind, &changed);
                bad += run_router(N, E, E, score, renorm, kind, &changed); /* every expert */
                if (kind == 2) { /* expert E-1 first in every row; without the bias in fewer */
                    int64_t moved = 0;
                    bad += run_router(64, E, K, score, renorm, kind, &moved);
                    if (moved == 0) bad++, fprintf(stderr, "a bias of +2 moved no row's first expert\n");
                }
            }
    assert_int_equal(bad, 0);
}

/* ---- the engine's switch ----------------------------------------------------------------------- */
/* Runs the forward step by step; at the router, its experts against the reference on the stored
 * logits with bias (NULL: none). */
static void check_engine_router(dw_test_model *m, int r, const float *bias, int score, bool renorm) {
    const dw_graph *g = m->g;
    const dw_ir_node *n = &g->nodes[r];
    const int64_t B = 2, T = 6, N = B * T, E = g->tensors[n->in[0]].shape[2], K = n->attrs.top_k;
    int32_t x[12], y[12];
    dw_test_random_tokens(x, N, dw_graph_vocab(g), RNG);
    dw_test_random_tokens(y, N, dw_graph_vocab(g), RNG);
    const dw_compiled *c = m->c;
    assert_int_equal(dw_exec_set_batch(m->e->x, x, y, B, T), DW_OK);
    bool seen = false;
    for (int s = c->phase[DW_PHASE_FORWARD][0]; s < c->phase[DW_PHASE_FORWARD][1]; s++) {
        assert_int_equal(dw_exec_step(m->e->x, s, false, 1.0), DW_OK);
        if (c->steps[s].node != r) continue;
        float *z = malloc((size_t)(N * E) * 4), *ex = malloc((size_t)(N * K) * 4), *ww = malloc((size_t)(N * K) * 4);
        int32_t *want = malloc((size_t)(N * K) * 4);
        assert_int_equal(dw_engine_read_value(m->e, n->in[0], z), DW_OK);
        assert_int_equal(dw_engine_read_value(m->e, n->out[1], ex), DW_OK);
        dw_cpu_moe_router_fwd_biased(ww, want, z, bias, N, E, K, score, renorm);
        for (int64_t i = 0; i < N * K; i++)
            if (ex[i] != (float)want[i]) fail_msg("assignment %lld: engine %g, reference %d", (long long)i, ex[i], want[i]);
        free(z), free(ex), free(ww), free(want);
        seen = true;
    }
    assert_true(seen);
}

static void test_engine_switch(void **state) {
    (void)state;
    for (int score = 0; score < 2; score++) {
        int r = -1;
        dw_graph *g = dw_test_router_graph(CTX, 2, 6, RNG, score, score == 0, false, &r);
        assert_non_null(g);
        dw_test_model m;
        assert_int_equal(dw_test_model_build(CTX, g, NULL, DW_DEVICE_AUTO, &m), DW_OK);
        dw_test_random_params(m.e, RNG, 0.5f, "gate.weight", 2.0f);
        int64_t L = 0, E = 0;
        dw_engine_moe_bias_shape(m.e, &L, &E);
        assert_int_equal(L, 1);
        assert_int_equal(E, g->tensors[g->nodes[r].in[0]].shape[2]);
        bool on = true;
        float *b = malloc((size_t)E * 4), *back = malloc((size_t)E * 4);
        assert_int_equal(dw_engine_moe_bias_get(m.e, back, &on), DW_OK); /* a new engine: off, zeros */
        assert_false(on);
        for (int64_t e = 0; e < E; e++) assert_true(back[e] == 0.0f);
        check_engine_router(&m, r, NULL, score, score == 0);
        for (int64_t e = 0; e < E; e++) b[e] = dw_test_uniform(RNG, -1.5f, 1.5f); /* large: choices move */
        b[E - 1] = -0.0f;
        assert_int_equal(dw_engine_moe_bias_set(m.e, b), DW_OK);
        assert_int_equal(dw_engine_moe_bias_get(m.e, back, &on), DW_OK);
        assert_true(on);
        assert_memory_equal(back, b, (size_t)E * 4);
        check_engine_router(&m, r, b, score, score == 0);
        assert_int_equal(dw_engine_moe_bias_set(m.e, NULL), DW_OK); /* off again: by the logits */
        check_engine_router(&m, r, NULL, score, score == 0);
        free(b), free(back);
        dw_test_model_free(&m);
    }
    /* a model without a router has nothing to bias */
    dw_graph *g = dw_test_small_graph(CTX, "llama-tiny", 1, 4, RNG);
    assert_non_null(g);
    dw_test_model m;
    assert_int_equal(dw_test_model_build(CTX, g, NULL, DW_DEVICE_AUTO, &m), DW_OK);
    int64_t L = 1, E = 1;
    dw_engine_moe_bias_shape(m.e, &L, &E);
    assert_int_equal(L, 0);
    float one = 1.0f;
    assert_int_equal(dw_engine_moe_bias_set(m.e, &one), DW_ERR_UNSUPPORTED);
    dw_moe_bias b;
    assert_int_equal(dw_moe_bias_init(CTX, m.e, 0.01, NULL, &b), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "--moe-bias-update"));
    assert_int_equal(dw_moe_bias_init(CTX, m.e, 0.0, NULL, &b), DW_OK); /* off: nothing to do */
    assert_int_equal(b.layers, 0);
    assert_true(isnan(dw_moe_bias_max_abs(&b)));
    dw_test_model_free(&m);
}

/* ---- the update rule --------------------------------------------------------------------------- */
/* b + gamma * sign(mean - load) in double, rounded once to FP32 (the sum of two floats of nearby
 * exponents is exact in double, so this is FP32's correctly rounded sum). */
static float oracle_update(float b, double load, double mean, float gamma) {
    const double s = load < mean ? 1.0 : load > mean ? -1.0 : 0.0;
    return (float)((double)b + s * (double)gamma);
}

static void test_update_rule(void **state) {
    (void)state;
    const int64_t E = dw_test_rnd(2, 24), K = dw_test_rnd(1, E), N = dw_test_rnd(1, 50), steps = 6;
    const float gamma = dw_test_uniform(RNG, 1e-4f, 1e-2f);
    float *b = calloc((size_t)E, 4), *want = calloc((size_t)E, 4);
    double *load = malloc((size_t)E * 8);
    int32_t *idx = malloc((size_t)(N * K) * 4);
    for (int64_t s = 0; s < steps; s++) {
        /* a known routing: each token's K distinct experts, skewed toward the low ones; step 0 even */
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) {
                int32_t e;
                bool dup;
                do {
                    e = s == 0 ? (int32_t)((n + k) % E) : (int32_t)(dw_test_next(RNG) % (uint64_t)(1 + dw_test_next(RNG) % E));
                    dup = false;
                    for (int64_t j = 0; j < k; j++) dup |= idx[n * K + j] == e;
                } while (dup);
                idx[n * K + k] = e;
            }
        for (int64_t e = 0; e < E; e++) load[e] = 0;
        for (int64_t a = 0; a < N * K; a++) load[idx[a]] += 1;
        const double mean = (double)(N * K) / (double)E;
        for (int64_t e = 0; e < E; e++) want[e] = oracle_update(want[e], load[e], mean, gamma);
        dw_moe_bias_update(b, load, E, gamma);
        for (int64_t e = 0; e < E; e++)
            if (memcmp(&b[e], &want[e], 4)) fail_msg("step %lld expert %lld: %a, oracle %a", (long long)s, (long long)e, b[e], want[e]);
    }
    /* a balanced routing (every load the mean) leaves the bias as it is */
    for (int64_t e = 0; e < E; e++) load[e] = 7;
    memcpy(want, b, (size_t)E * 4);
    dw_moe_bias_update(b, load, E, gamma);
    assert_memory_equal(b, want, (size_t)E * 4);
    free(b), free(want), free(load), free(idx);
}

/* The trainer's step: each router's row from its layer's loads, set on the engine. */
static void test_step_onto_engine(void **state) {
    (void)state;
    dw_graph *g = dw_test_moe_graph(CTX, 1, 4, RNG);
    assert_non_null(g);
    dw_test_model m;
    assert_int_equal(dw_test_model_build(CTX, g, NULL, DW_DEVICE_AUTO, &m), DW_OK);
    dw_moe_bias b;
    assert_int_equal(dw_moe_bias_init(CTX, m.e, 0.25, NULL, &b), DW_OK); /* 0.25: exact sums to check by eye */
    assert_int_equal(b.layers, 1);
    const int64_t E = b.experts;
    dw_moe_routing r = {.layers = 1, .experts = E};
    r.step = calloc((size_t)(2 + E), 8);
    float *want = calloc((size_t)E, 4), *back = malloc((size_t)E * 4);
    for (int s = 0; s < 5; s++) {
        double total = 0;
        for (int64_t e = 0; e < E; e++) total += r.step[2 + e] = (double)dw_test_rnd(0, 9);
        for (int64_t e = 0; e < E; e++) want[e] = oracle_update(want[e], r.step[2 + e], total / (double)E, 0.25f);
        assert_int_equal(dw_moe_bias_step(CTX, m.e, &r, &b), DW_OK);
        bool on = false;
        assert_int_equal(dw_engine_moe_bias_get(m.e, back, &on), DW_OK);
        assert_true(on);
        assert_memory_equal(back, want, (size_t)E * 4);
        assert_memory_equal(b.bias, want, (size_t)E * 4);
    }
    double mx = 0;
    for (int64_t e = 0; e < E; e++) mx = fmax(mx, fabs((double)want[e]));
    assert_true(dw_moe_bias_max_abs(&b) == mx);
    r.layers = 2; /* routing of another shape is refused */
    assert_int_equal(dw_moe_bias_step(CTX, m.e, &r, &b), DW_ERR_UNSUPPORTED);
    free(r.step), free(want), free(back);
    dw_moe_bias_free(&b);
    dw_test_model_free(&m);
}

/* ---- state.json -------------------------------------------------------------------------------- */
/* Writes DIR/state.json as {"step": 1, "moe_bias": <text>} (text NULL: none). */
static void write_state(const char *dir, const char *text) {
    char *p = dw_test_path(dir, "state.json"), buf[1 << 16];
    snprintf(buf, sizeof buf, "{\"step\": 1%s%s}", text ? ", \"moe_bias\": " : "", text ? text : "");
    assert_int_equal(dw_test_write(p, buf, strlen(buf)), 0);
    free(p);
}

static void test_state_round_trip(void **state) {
    (void)state;
    dw_graph *g = dw_test_moe_graph(CTX, 1, 4, RNG);
    assert_non_null(g);
    dw_test_model m;
    assert_int_equal(dw_test_model_build(CTX, g, NULL, DW_DEVICE_AUTO, &m), DW_OK);
    char *dir = dw_test_tmpdir();
    dw_moe_bias a, b;
    assert_int_equal(dw_moe_bias_init(CTX, m.e, 0.003, NULL, &a), DW_OK);
    const int64_t E = a.experts;
    for (int64_t e = 0; e < E; e++) a.bias[e] = dw_test_uniform(RNG, -1, 1) * powf(2.0f, (float)dw_test_rnd(-140, 10));
    a.bias[0] = -0.0f, a.bias[E - 1] = 1.4e-45f; /* negative zero, the smallest subnormal */
    write_state(dir, dw_moe_bias_json(&a));
    /* resumed: the checkpoint's values and speed, set on the engine */
    assert_int_equal(dw_moe_bias_init(CTX, m.e, 0.0, dir, &b), DW_OK);
    assert_int_equal(b.layers, 1);
    assert_memory_equal(b.bias, a.bias, (size_t)E * 4);
    assert_true(b.gamma == a.gamma);
    float *back = malloc((size_t)E * 4);
    bool on = false;
    assert_int_equal(dw_engine_moe_bias_get(m.e, back, &on), DW_OK);
    assert_true(on);
    assert_memory_equal(back, a.bias, (size_t)E * 4);
    dw_moe_bias_free(&b);
    /* a flag's speed replaces the recorded one; the values stay */
    assert_int_equal(dw_moe_bias_init(CTX, m.e, 0.5, dir, &b), DW_OK);
    assert_true(b.gamma == 0.5f);
    assert_memory_equal(b.bias, a.bias, (size_t)E * 4);
    dw_moe_bias_free(&b);
    /* going back to a checkpoint: its values, this run's speed; one without a bias: zeros */
    assert_int_equal(dw_moe_bias_init(CTX, m.e, 0.125, NULL, &b), DW_OK);
    for (int64_t e = 0; e < E; e++) b.bias[e] = 3.0f;
    assert_int_equal(dw_moe_bias_reload(CTX, m.e, dir, &b), DW_OK);
    assert_memory_equal(b.bias, a.bias, (size_t)E * 4);
    assert_true(b.gamma == 0.125f);
    assert_int_equal(dw_engine_moe_bias_get(m.e, back, &on), DW_OK);
    assert_memory_equal(back, a.bias, (size_t)E * 4);
    write_state(dir, NULL);
    assert_int_equal(dw_moe_bias_reload(CTX, m.e, dir, &b), DW_OK);
    for (int64_t e = 0; e < E; e++) assert_true(b.bias[e] == 0.0f);
    dw_moe_bias_free(&b);
    /* a run without a bias, resumed without the flag: off, and the engine switched off */
    write_state(dir, NULL);
    assert_int_equal(dw_moe_bias_init(CTX, m.e, 0.0, dir, &b), DW_OK);
    assert_int_equal(b.layers, 0);
    assert_int_equal(dw_engine_moe_bias_get(m.e, NULL, &on), DW_OK);
    assert_false(on);
    /* malformed: each refused naming state.json and the field */
    char bad[512];
    const char *cases[][2] = {
        {"{\"update_speed\": \"0x1p-8\", \"layers\": 1, \"experts\": %lld, \"values\": [[\"nan\"]]}", "values"},
        {"{\"update_speed\": \"0x1p-8\", \"layers\": 2, \"experts\": %lld, \"values\": []}", "routers"},
        {"{\"update_speed\": \"-0x1p-8\", \"layers\": 1, \"experts\": %lld, \"values\": [[]]}", "update_speed"},
        {"{\"update_speed\": 0.1, \"layers\": 1, \"experts\": %lld, \"values\": [[]]}", "update_speed"},
        {"{\"update_speed\": \"0x1.00000001p0\", \"layers\": 1, \"experts\": %lld, \"values\": [[]]}", "update_speed"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(bad, sizeof bad, cases[i][0], (long long)E);
        write_state(dir, bad);
        assert_int_equal(dw_moe_bias_init(CTX, m.e, 0.0, dir, &b), DW_ERR_FORMAT);
        if (!strstr(dw_errmsg(CTX), "state.json") || !strstr(dw_errmsg(CTX), cases[i][1]))
            fail_msg("case %zu: %s", i, dw_errmsg(CTX));
        assert_int_equal(b.layers, 0);
    }
    /* bad speeds from the caller, named by the flag */
    const double speeds[] = {-0.001, NAN, INFINITY, 2.0, 1e-60};
    for (size_t i = 0; i < sizeof speeds / sizeof speeds[0]; i++) {
        assert_int_equal(dw_moe_bias_init(CTX, m.e, speeds[i], NULL, &b), DW_ERR_INVALID);
        assert_non_null(strstr(dw_errmsg(CTX), "--moe-bias-update"));
    }
    free(back);
    dw_moe_bias_free(&a);
    dw_test_rmtree(dir);
    free(dir);
    dw_test_model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_router_biased),     cmocka_unit_test(test_engine_switch),
        cmocka_unit_test(test_update_rule),       cmocka_unit_test(test_step_onto_engine),
        cmocka_unit_test(test_state_round_trip),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
