/* test_train_sample.c — sampling: greedy and top-1 pick the argmax, draws follow softmax(l/T)
 * (restricted to the top k); dw_engine_generate: greedy generation agrees with causal forward
 * passes over the result (the whole sequence, and the sliding window of the program's T beyond
 * it), a sampled generation is reproducible from its RNG state; the tokenizers by name ("bytes",
 * "ids") round-trip and refuse what they cannot encode. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
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
    assert_int_equal(dw_tokenize(ctx, "bytes", text, 256, &ids, &m), DW_OK);
    assert_int_equal(m, n);
    for (int i = 0; i < n; i++) assert_int_equal(ids[i], (unsigned char)text[i]);
    char *back = dw_detokenize("bytes", ids, m);
    assert_string_equal(back, text);
    free(back);
    free(ids);
    assert_int_equal(dw_tokenize(ctx, "ids", " 5 17,3\n0 ", 20, &ids, &m), DW_OK);
    assert_int_equal(m, 4);
    assert_true(ids[0] == 5 && ids[1] == 17 && ids[2] == 3 && ids[3] == 0);
    back = dw_detokenize("ids", ids, m);
    assert_string_equal(back, "5 17 3 0");
    free(back);
    free(ids);
    /* random ids round-trip through the text */
    int32_t want[50];
    const int64_t V = 2 + (int64_t)(dw_test_next(&trng) % 100000);
    for (int i = 0; i < 50; i++) want[i] = (int32_t)(dw_test_next(&trng) % (uint64_t)V);
    back = dw_detokenize("ids", want, 50);
    assert_int_equal(dw_tokenize(ctx, "ids", back, V, &ids, &m), DW_OK);
    assert_int_equal(m, 50);
    assert_memory_equal(ids, want, sizeof want);
    free(back);
    free(ids);
    /* refusals: out of the vocabulary (naming it), not a number, a byte above the vocabulary, an
     * unknown tokenizer; the outputs are cleared */
    ids = (int32_t *)text, m = 7;
    assert_int_equal(dw_tokenize(ctx, "ids", "5 20", 20, &ids, &m), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "20"));
    assert_null(ids);
    assert_int_equal(m, 0);
    assert_int_equal(dw_tokenize(ctx, "ids", "5 x", 20, &ids, &m), DW_ERR_INVALID);
    assert_int_equal(dw_tokenize(ctx, "ids", "-1", 20, &ids, &m), DW_ERR_INVALID);
    assert_int_equal(dw_tokenize(ctx, "bytes", "a", 90, &ids, &m), DW_ERR_INVALID); /* 'a' = 97 */
    assert_int_equal(dw_tokenize(ctx, "words", "a", 90, &ids, &m), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "words"));
    assert_null(ids);
    assert_null(dw_detokenize("words", want, 3));
    int32_t big[2] = {65, 300};
    back = dw_detokenize("bytes", big, 2);
    assert_string_equal(back, "A<300>");
    free(back);
    back = dw_detokenize("ids", big, 0);
    assert_string_equal(back, "");
    free(back);
}

static int64_t numel(dw_engine *e, int i) {
    int64_t shape[4], n = 1;
    for (int d = dw_engine_param_shape(e, i, shape); d > 0; d--) n *= shape[d - 1];
    return n;
}

/* A CPU engine for a one-block model of random family at batch 1 x T, initialised from a random
 * seed and sharpened (matrices x 20) so that argmaxes are distinct. */
static dw_test_model sharp_model(int64_t T) {
    dw_model_config cfg;
    assert_int_equal(dw_model_config_load(ctx, dw_test_next(&trng) & 1 ? "gpt2-tiny" : "llama-tiny", &cfg), DW_OK);
    cfg.d_model = 32;
    cfg.n_layers = 1;
    cfg.n_heads = cfg.n_kv_heads = 2;
    cfg.head_dim = 16;
    cfg.d_ff = 64;
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_config(ctx, &cfg, 1, T, &g), DW_OK);
    dw_test_model m;
    assert_int_equal(dw_test_model_build(ctx, g, NULL, DW_DEVICE_AUTO, &m), DW_OK);
    assert_int_equal(dw_engine_init_weights(m.e, dw_test_next(&trng)), DW_OK);
    for (int i = 0; i < dw_engine_param_count(m.e); i++) {
        int64_t shape[4];
        if (dw_engine_param_shape(m.e, i, shape) != 2) continue;
        const int64_t n = numel(m.e, i);
        float *p = malloc((size_t)n * sizeof *p);
        assert_int_equal(dw_engine_param_read(m.e, i, p), DW_OK);
        for (int64_t k = 0; k < n; k++) p[k] *= 20;
        assert_int_equal(dw_engine_param_write(m.e, i, p), DW_OK);
        free(p);
    }
    return m;
}

/* Greedy generation, token by token, equals the argmax of one forward pass over the result; past
 * the program's T, each token is the argmax of the forward over the last T tokens. */
static void test_generate_matches_forward(void **state) {
    (void)state;
    const int64_t T = 24, np = 1 + (int64_t)(dw_test_next(&trng) % 4), n = T - np, extra = 8;
    dw_test_model m = sharp_model(T);
    const int64_t V = dw_graph_vocab(m.g);
    int32_t tok[24 + 8];
    for (int i = 0; i < np; i++) tok[i] = (int32_t)(dw_test_next(&trng) % (uint64_t)V);
    uint64_t r = dw_test_next(&trng);
    assert_int_equal(dw_engine_generate(m.e, tok, np, n + extra, 0.0, 0, &r), DW_OK);
    float *logits = malloc((size_t)(T * V) * sizeof *logits);
    assert_int_equal(dw_engine_forward(m.e, tok, NULL, 1, T, logits, NULL), DW_OK);
    for (int64_t i = np; i < T; i++) assert_int_equal(tok[i], argmax(logits + (i - 1) * V, V));
    for (int64_t i = T; i < T + extra; i++) { /* the window [i - T, i) */
        assert_int_equal(dw_engine_forward(m.e, tok + i - T, NULL, 1, T, logits, NULL), DW_OK);
        assert_int_equal(tok[i], argmax(logits + (T - 1) * V, V));
    }
    for (int64_t i = 0; i < T + extra; i++) assert_true(tok[i] >= 0 && tok[i] < V);
    free(logits);
    dw_test_model_free(&m);
}

/* Sampling at a temperature: the same RNG state gives the same tokens and the same advanced
 * state; the state advances; a bad request is refused. */
static void test_generate_sampled(void **state) {
    (void)state;
    const int64_t T = 16;
    dw_test_model m = sharp_model(T);
    const int64_t V = dw_graph_vocab(m.g);
    int32_t a[40], b[40];
    a[0] = b[0] = (int32_t)(dw_test_next(&trng) % (uint64_t)V);
    uint64_t ra = dw_test_next(&trng), rb = ra, r0 = ra;
    const double temp = dw_test_uniform(&trng, 0.5f, 2.0f);
    const int top_k = (int)(dw_test_next(&trng) % 5);
    assert_int_equal(dw_engine_generate(m.e, a, 1, 30, temp, top_k, &ra), DW_OK);
    assert_int_equal(dw_engine_generate(m.e, b, 1, 30, temp, top_k, &rb), DW_OK);
    assert_memory_equal(a, b, 31 * sizeof *a);
    assert_true(ra == rb && ra != r0);
    for (int i = 0; i < 31; i++) assert_true(a[i] >= 0 && a[i] < V);
    uint64_t r = 1;
    assert_int_equal(dw_engine_generate(m.e, a, 0, 3, 0.0, 0, &r), DW_ERR_INVALID);
    assert_int_equal(dw_engine_generate(m.e, a, 1, -1, 0.0, 0, &r), DW_ERR_INVALID);
    assert_int_equal(dw_engine_generate(m.e, a, 1, 3, 1.0, -2, &r), DW_ERR_INVALID);
    dw_test_model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_top1),
        cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_tokenizers),
        cmocka_unit_test(test_generate_matches_forward),
        cmocka_unit_test(test_generate_sampled),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
