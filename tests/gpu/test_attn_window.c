/* test_attn_window.c — the CUDA engine and sliding-window attention (issue 26): a model whose window
 * is shorter than the sequence runs the windowed attention kernels, one of at least the sequence the
 * causal kernels; either way the first and third losses equal the CPU engine's (FP32 programs, 1e-4
 * relative) from the same weights and batches. Gemma 2 too (embedding x sqrt(C), (1 + w) RMSNorms,
 * GeGLU, scores capped at 50, logits at 30, alternating windowed layers): FP32 programs on the
 * reference kernels, and BF16 programs with head_dim 64 and 128 (the tensor-core kernels with the
 * window and the cap) within 3e-2 of the CPU's FP32 losses (test_engine_cuda.c's BF16 loss
 * tolerance). Needs a GPU. */
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

/* A 2-layer model of config.json `text` captured at 2 x T on ctx. */
static dw_graph *model(dw_ctx *ctx, const char *text, int64_t T) {
    json_t *j = NULL;
    dw_model_config c;
    assert_int_equal(dw_json_load_string(ctx, text, strlen(text), "config.json", &j), DW_OK);
    assert_int_equal(dw_model_config_from_json(ctx, j, "config.json", &c), DW_OK);
    json_decref(j);
    dw_graph *g = NULL;
    if (dw_capture_config(ctx, &c, 2, T, &g) != DW_OK) fail_msg("%s", dw_errmsg(ctx));
    return g;
}

/* Losses of the CUDA engine (precision NULL: the FP32 program, else e.g. "bf16") against the CPU's
 * FP32 ones, within rtol, over 3 steps of the model of `text` at T tokens. */
static void same_losses_of(const char *text, int64_t T, const char *precision, double rtol) {
    const uint64_t seed = dw_test_seed() ^ 0xA11Dull ^ (uint64_t)T ^ (uint64_t)strlen(text) << 20;
    double first[2], last[2];
    for (int k = 0; k < 2; k++) {
        dw_ctx *ctx = k ? g_gpu : g_cpu;
        dw_test_model m;
        if (dw_test_model_build(ctx, model(ctx, text, T), k ? precision : NULL, DW_DEVICE_AUTO, &m) != DW_OK)
            fail_msg("%s at T %lld must build on %s: %s", text, (long long)T, k ? "CUDA" : "the CPU", dw_errmsg(ctx));
        dw_test_rng r;
        dw_test_rng_init(&r, seed);
        assert_int_equal(dw_test_model_train_random(&m, 2, T, 3, 1e-3, &r, &first[k], &last[k]), DW_OK);
        dw_test_model_free(&m);
    }
    if (!(fabs(first[1] - first[0]) <= rtol * fabs(first[0])) || !(fabs(last[1] - last[0]) <= rtol * fabs(last[0])))
        fail_msg("%s, T %lld, %s: CUDA losses %.8g .. %.8g, CPU %.8g .. %.8g", text, (long long)T,
                 precision ? precision : "fp32", first[1], last[1], first[0], last[0]);
}

/* A 2-layer mistral with a window of W keys at T tokens, FP32 programs. */
static void same_losses(int64_t W, int64_t T) {
    char text[512];
    snprintf(text, sizeof text,
             "{\"model_type\":\"mistral\",\"vocab_size\":64,\"hidden_size\":32,\"num_hidden_layers\":2,"
             "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":48,"
             "\"max_position_embeddings\":64,\"sliding_window\":%lld}", (long long)W);
    same_losses_of(text, T, NULL, 1e-4);
}

/* A 2-layer gemma2 of head_dim D (layer 0 windowed to W keys; query_pre_attn_scalar D) at T tokens. */
static void gemma2_losses(int64_t W, int64_t T, int64_t D, const char *precision, double rtol) {
    char text[768];
    snprintf(text, sizeof text,
             "{\"model_type\":\"gemma2\",\"vocab_size\":64,\"hidden_size\":32,\"num_hidden_layers\":2,"
             "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":%lld,\"intermediate_size\":48,"
             "\"max_position_embeddings\":256,\"query_pre_attn_scalar\":%lld,\"sliding_window\":%lld,"
             "\"attn_logit_softcapping\":50.0,\"final_logit_softcapping\":30.0}",
             (long long)D, (long long)D, (long long)W);
    same_losses_of(text, T, precision, rtol);
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

/* Gemma 2 on the reference kernels (FP32): windows shorter than T, and one of at least T. */
static void test_gemma2_fp32(void **state) {
    (void)state;
    for (int i = 0; i < 2; i++) {
        const int64_t W = dw_test_rnd(1, 40);
        gemma2_losses(W, W + dw_test_rnd(1, 100), 2 * dw_test_rnd(4, 20), NULL, 1e-4);
    }
    const int64_t T = dw_test_rnd(2, 48);
    gemma2_losses(T + dw_test_rnd(0, 8), T, 16, NULL, 1e-4);
}

/* Gemma 2 in BF16 on the tensor-core kernels: windows inside one 64-key tile and across two. */
static void test_gemma2_bf16(void **state) {
    (void)state;
    gemma2_losses(dw_test_rnd(1, 63), dw_test_rnd(130, 200), 64, "bf16", 3e-2);
    gemma2_losses(dw_test_rnd(65, 100), dw_test_rnd(150, 250), 128, "bf16", 3e-2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_short_window_runs),
        cmocka_unit_test(test_long_window_runs),
        cmocka_unit_test(test_gemma2_fp32),
        cmocka_unit_test(test_gemma2_bf16),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
