/* test_train_sample.c — sampling: greedy and top-1 pick the argmax, draws follow softmax(l/T)
 * (restricted to the top k), greedy generation agrees with one causal forward pass over the
 * result, and the byte / id tokenizers round-trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "train/sample.h"

static dw_ctx *ctx;
static dw_test_rng trng;

static int setup(void **state) {
    (void)state;
    dw_ctx_opts o = {.device = DW_DEVICE_CPU};
    dw_test_rng_init(&trng, dw_test_seed());
    return dw_ctx_create(&o, &ctx) == DW_OK ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    dw_ctx_free(ctx);
    return 0;
}

static int64_t argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void test_greedy_and_top1(void **state) {
    (void)state;
    float logits[300];
    double work[300];
    dw_rng r = {dw_test_next(&trng)};
    for (int rep = 0; rep < 20; rep++) {
        int64_t V = 2 + (int64_t)(dw_test_next(&trng) % 298);
        for (int64_t i = 0; i < V; i++) logits[i] = dw_test_normal(&trng) * 3;
        dw_sample_opts greedy = {.temperature = 0, .top_k = 0}, top1 = {.temperature = 2.0, .top_k = 1};
        assert_int_equal(dw_sample_logits(logits, V, &greedy, &r, work), argmax(logits, V));
        assert_int_equal(dw_sample_logits(logits, V, &top1, &r, work), argmax(logits, V));
    }
}

/* Empirical frequencies over many draws match the softmax within 5 standard deviations. */
static void test_distribution(void **state) {
    (void)state;
    enum { V = 6, N = 100000 };
    float logits[V];
    double work[V], p[V];
    for (int i = 0; i < V; i++) logits[i] = dw_test_normal(&trng);
    for (int k = 0; k <= 3; k += 3) {
        dw_sample_opts o = {.temperature = dw_test_uniform(&trng, 0.5f, 2.0f), .top_k = k};
        /* expected: softmax(l / T) over the k largest (all when k = 0) */
        float sorted[V];
        memcpy(sorted, logits, sizeof sorted);
        for (int i = 0; i < V; i++)
            for (int j = i + 1; j < V; j++)
                if (sorted[j] > sorted[i]) {
                    float t = sorted[i];
                    sorted[i] = sorted[j];
                    sorted[j] = t;
                }
        float thresh = k ? sorted[k - 1] : -INFINITY;
        double z = 0;
        for (int i = 0; i < V; i++) z += p[i] = logits[i] >= thresh ? exp(logits[i] / o.temperature) : 0.0;
        int count[V] = {0};
        dw_rng r = {dw_test_next(&trng)};
        for (int n = 0; n < N; n++) count[dw_sample_logits(logits, V, &o, &r, work)]++;
        for (int i = 0; i < V; i++) {
            double q = p[i] / z, sd = sqrt(q * (1 - q) / N);
            if (q == 0) assert_int_equal(count[i], 0);
            else if (fabs((double)count[i] / N - q) > 5 * sd + 1e-9)
                fail_msg("token %d: frequency %.4f, softmax %.4f (k=%d)", i, (double)count[i] / N, q, k);
        }
    }
}

static void test_tokenizers(void **state) {
    (void)state;
    char text[200];
    int n = 1 + (int)(dw_test_next(&trng) % 190);
    for (int i = 0; i < n; i++) text[i] = (char)(1 + dw_test_next(&trng) % 255);
    text[n] = '\0';
    int32_t *ids = NULL;
    int64_t m = 0;
    assert_int_equal(dw_tokenize(ctx, DW_TOK_BYTES, text, 256, &ids, &m), DW_OK);
    assert_int_equal(m, n);
    char *back = dw_detokenize(DW_TOK_BYTES, ids, m);
    assert_string_equal(back, text);
    free(back);
    free(ids);
    assert_int_equal(dw_tokenize(ctx, DW_TOK_IDS, " 5 17,3\n0 ", 20, &ids, &m), DW_OK);
    assert_int_equal(m, 4);
    assert_true(ids[0] == 5 && ids[1] == 17 && ids[2] == 3 && ids[3] == 0);
    back = dw_detokenize(DW_TOK_IDS, ids, m);
    assert_string_equal(back, "5 17 3 0");
    free(back);
    free(ids);
    assert_int_equal(dw_tokenize(ctx, DW_TOK_IDS, "5 20", 20, &ids, &m), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "20"));
    assert_int_equal(dw_tokenize(ctx, DW_TOK_IDS, "5 x", 20, &ids, &m), DW_ERR_INVALID);
    assert_int_equal(dw_tokenize(ctx, DW_TOK_BYTES, "a", 90, &ids, &m), DW_ERR_INVALID); /* 'a' = 97 */
    int32_t big[2] = {65, 300};
    back = dw_detokenize(DW_TOK_BYTES, big, 2);
    assert_string_equal(back, "A<300>");
    free(back);
}

/* Greedy generation, token by token, equals the argmax of one forward pass over the result. */
static void test_generate_matches_forward(void **state) {
    (void)state;
    dw_model_config cfg;
    assert_int_equal(dw_model_config_load(ctx, dw_test_next(&trng) & 1 ? "gpt2-tiny" : "llama-tiny", &cfg), DW_OK);
    cfg.d_model = 32;
    cfg.n_layers = 1;
    cfg.n_heads = cfg.n_kv_heads = 2;
    cfg.head_dim = 16;
    cfg.d_ff = 64;
    const int64_t T = 24, V = cfg.vocab_size, np = 3, n = T - np;
    dw_engine *e = NULL;
    assert_int_equal(dw_engine_create_cpu(ctx, &cfg, 1, T, &e), DW_OK);
    assert_int_equal(dw_engine_init_weights(e, dw_test_next(&trng)), DW_OK);
    for (int i = 0; i < dw_engine_param_count(e); i++) { /* sharpen: distinct argmaxes */
        dw_param *p = dw_engine_param(e, i);
        for (int64_t k = 0; p->ndim == 2 && k < p->numel; k++) p->data[k] *= 20;
    }
    int32_t tok[24];
    for (int i = 0; i < np; i++) tok[i] = (int32_t)(dw_test_next(&trng) % (uint64_t)V);
    dw_sample_opts greedy = {.temperature = 0};
    dw_rng r = {1};
    assert_int_equal(dw_generate(ctx, e, T, tok, np, n, &greedy, &r), DW_OK);
    float *logits = malloc((size_t)(T * V) * sizeof *logits);
    assert_int_equal(dw_engine_forward(e, tok, NULL, 1, T, logits, NULL), DW_OK);
    for (int64_t i = np; i < T; i++) assert_int_equal(tok[i], argmax(logits + (i - 1) * V, V));
    free(logits);
    dw_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_top1),
        cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_tokenizers),
        cmocka_unit_test(test_generate_matches_forward),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
