/* test_moe_mxfp8_engine_cuda.c — MoE experts in mxfp8 on the GPU (sm_80..99): mixtral-tiny compiled
 * for this GPU under mxfp8 binds fprop, dgrad and wgrad of every expert layer to the dequantising
 * route (grouped_mxfp8_dequant_bf16); the CUDA engine and the CPU engine (its oracle: the same
 * program's mxfp8 passes through the CPU reference, test_moe_mxfp8_engine.c) from the same weights
 * (dw_engine_init_weights: the same values on both) hold the same expert weight caches (W, W^T codes
 * and UE8M0 scales) byte for byte, and three AdamW steps on one batch give losses within 5e-2
 * relative (BF16 rounding of activations and FP32 sums on the GPU against double on the CPU; the
 * quantised tolerance of test_moe_fp8_engine_cuda.c) that fall. Elsewhere it skips. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "compile/program.h"
#include "gemm/compute_capability.h"
#include "runtime/engine.h"
#include "testutil.h"

static dw_ctx *g_cpu, *g_gpu;

static int setup(void **state) {
    (void)state;
    dw_test_rng_init(&dw_test_group_rng, dw_test_seed());
    return dw_test_cpu_gpu_setup(&g_cpu, &g_gpu);
}
static int teardown(void **state) {
    (void)state;
    dw_test_cpu_gpu_teardown(g_cpu, g_gpu);
    return 0;
}

static void test_mxfp8_experts(void **state) {
    (void)state;
    const int sm = dw_gemm_ctx_sm(g_gpu);
    if (sm < 80 || sm > 99) {
        printf("SKIP: sm_%d is outside grouped_mxfp8_dequant_bf16's sm_80..sm_99\n", sm);
        return;
    }
    const int64_t B = 2, T = 32 + (int64_t)dw_test_rnd(0, 16), N = B * T;
    dw_model_config mc;
    assert_int_equal(dw_model_config_load(g_gpu, "mixtral-tiny", &mc), DW_OK);
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_config(g_gpu, &mc, B, T, &g), DW_OK);
    dw_policy *pol = NULL;
    assert_int_equal(dw_policy_from_precision(g_gpu, "mxfp8", false, &pol), DW_OK);
    dw_compiled *c = NULL;
    if (dw_compile(g_gpu, g, NULL, pol, NULL, &c) != DW_OK) fail_msg("compile: %s", dw_errmsg(g_gpu));
    int experts = 0, bad = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == DW_OP_MOE_LINEAR) {
            experts++;
            for (int p = 0; p < DW_QPASS_COUNT; p++)
                assert_string_equal(c->node[i].bind.kernel[p], "grouped_mxfp8_dequant_bf16");
        }
    assert_int_equal(experts, 6);
    dw_engine *cpu = NULL, *gpu = NULL;
    assert_int_equal(dw_engine_create(g_cpu, c, NULL, &cpu), DW_OK);
    if (dw_engine_create(g_gpu, c, NULL, &gpu) != DW_OK) fail_msg("cuda engine: %s", dw_errmsg(g_gpu));
    const uint64_t seed = dw_test_next(&dw_test_group_rng);
    assert_int_equal(dw_engine_init_weights(cpu, seed), DW_OK);
    assert_int_equal(dw_engine_init_weights(gpu, seed), DW_OK);
    for (int i = 0; i < g->n_nodes; i++) /* the weight caches, byte for byte */
        for (int q = 0; g->nodes[i].op == DW_OP_MOE_LINEAR && q < 2; q++) {
            const dw_qslot_layout *l = &c->node[i].wq[q];
            unsigned char *h = malloc((size_t)l->tscale); /* codes and scales with their padding */
            assert_int_equal(cudaMemcpy(h, gpu->x->work + l->off, (size_t)l->tscale, cudaMemcpyDeviceToHost), cudaSuccess);
            if (memcmp(h, cpu->x->work + l->off, (size_t)l->tscale)) bad++, printf("MISMATCH %s cache %d\n", g->nodes[i].name, q);
            free(h);
        }
    int32_t *x = malloc((size_t)N * 4), *y = malloc((size_t)N * 4);
    dw_test_random_tokens(x, N, dw_graph_vocab(g), &dw_test_group_rng);
    dw_test_random_tokens(y, N, dw_graph_vocab(g), &dw_test_group_rng);
    double first[2] = {0, 0}, last[2] = {0, 0};
    dw_engine *e[2] = {cpu, gpu};
    for (int k = 0; k < 2; k++)
        if (dw_test_train_fixed(e[k], x, y, B, T, 3, 3e-3, &first[k], &last[k]) != DW_OK)
            fail_msg("%s training: %s", k ? "cuda" : "cpu", dw_errmsg(k ? g_gpu : g_cpu));
    printf("mxfp8 experts: loss gpu %.6f -> %.6f, cpu %.6f -> %.6f\n", first[1], last[1], first[0], last[0]);
    if (!(fabs(first[1] - first[0]) / first[0] <= 5e-2 && fabs(last[1] - last[0]) / last[0] <= 5e-2)) bad++;
    if (!(last[1] < first[1])) bad++, printf("MISMATCH: the GPU loss did not fall\n");
    dw_engine_free(cpu), dw_engine_free(gpu);
    dw_compiled_free(c), dw_policy_free(pol), dw_graph_free(g);
    free(x), free(y);
    if (bad) fail_msg("%d mismatches (lines above)", bad);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_mxfp8_experts)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
