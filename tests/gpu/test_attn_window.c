/* test_attn_window.c — the CUDA engine and sliding-window attention (issue 26): a model whose window
 * is shorter than the sequence runs the reference attention kernels with the window, one of at least
 * the sequence the causal kernels; either way the first and third losses equal the CPU engine's (FP32
 * programs, 1e-4 relative) from the same weights and batches. Needs a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "capture/capture.h"
#include "capture/model_config_impl.h"
#include "core/json.h"
#include "testutil.h"

static dw_ctx *g_cpu, *g_gpu;

static int setup(void **state) {
    (void)state;
    return dw_test_cpu_gpu_setup(&g_cpu, &g_gpu);
}
static int teardown(void **state) {
    (void)state;
    dw_test_cpu_gpu_teardown(g_cpu, g_gpu);
    return 0;
}

/* A 2-layer mistral with a window of W keys, captured at 2 x T on ctx. */
static dw_graph *mistral(dw_ctx *ctx, int64_t W, int64_t T) {
    char text[512];
    snprintf(text, sizeof text,
             "{\"model_type\":\"mistral\",\"vocab_size\":64,\"hidden_size\":32,\"num_hidden_layers\":2,"
             "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":48,"
             "\"max_position_embeddings\":64,\"sliding_window\":%lld}", (long long)W);
    json_t *j = NULL;
    dw_model_config c;
    assert_int_equal(dw_json_load_string(ctx, text, strlen(text), "config.json", &j), DW_OK);
    assert_int_equal(dw_model_config_from_json(ctx, j, "config.json", &c), DW_OK);
    json_decref(j);
    dw_graph *g = NULL;
    if (dw_capture_config(ctx, &c, 2, T, &g) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    return g;
}

/* Losses of the CUDA engine against the CPU's (FP32 programs, 1e-4 relative) over 3 steps of a
 * mistral with a window of W keys at T tokens. */
static void same_losses(int64_t W, int64_t T) {
    const uint64_t seed = dw_test_seed() ^ 0xA11Dull ^ (uint64_t)(W * 1000 + T);
    double first[2], last[2];
    for (int k = 0; k < 2; k++) {
        dw_ctx *ctx = k ? g_gpu : g_cpu;
        dw_test_model m;
        if (dw_test_model_build(ctx, mistral(ctx, W, T), NULL, DW_DEVICE_AUTO, &m) != DW_OK)
            fail_msg("W %lld, T %lld must build: %s", (long long)W, (long long)T, dw_errmsg(ctx));
        dw_test_rng r;
        dw_test_rng_init(&r, seed);
        assert_int_equal(dw_test_model_train_random(&m, 2, T, 3, 1e-3, &r, &first[k], &last[k]), DW_OK);
        dw_test_model_free(&m);
    }
    if (!(fabs(first[1] - first[0]) <= 1e-4 * fabs(first[0])) || !(fabs(last[1] - last[0]) <= 1e-4 * fabs(last[0])))
        fail_msg("W %lld, T %lld: CUDA losses %.8g .. %.8g, CPU %.8g .. %.8g", (long long)W, (long long)T, first[1],
                 last[1], first[0], last[0]);
}

/* A window shorter than the sequence runs on the reference kernels with the window. */
static void test_short_window_runs(void **state) {
    (void)state;
    for (int i = 0; i < 3; i++) {
        const int64_t W = dw_test_rnd(1, 15);
        same_losses(W, W + dw_test_rnd(1, 48));
    }
}

/* A window of at least the sequence is the causal mask: the usual kernels. */
static void test_long_window_runs(void **state) {
    (void)state;
    const int64_t T = dw_test_rnd(2, 32);
    same_losses(T + dw_test_rnd(0, 8), T);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_short_window_runs),
        cmocka_unit_test(test_long_window_runs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
