/* test_amax_cuda.c — delayed scaling on the GPU (kernels/cuda/quant.h dw_quantize_cuda_amax,
 * precision/amax_history.cu) against the CPU (precision/amax_history.c), byte for byte: over
 * random steps, fp8_tensor quantisations of fresh FP32 and BF16 tensors (ragged shapes, with and
 * without the transposed copy, training ones noted and others not, now and then a NaN or an
 * all-zero tensor) under a history in device memory and the same history on the host: codes,
 * scales and the history words after every quantisation, then after each step's roll (one kernel
 * against dw_amax_roll). An empty history gives dw_quantize_cuda's result. Guard bands after the
 * outputs checked. Needs a GPU (label gpu). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"
#include "kernels/cuda/quant.h"
#include "precision/amax_history.h"
#include "testutil.h"

#define GUARD 64
#define POISON 0x5A

static void ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) fail_msg("%s: %s", what, cudaGetErrorString(e));
}

static void *dev(size_t n) {
    void *p = NULL;
    ok(cudaMalloc(&p, n + GUARD), "cudaMalloc");
    ok(cudaMemset(p, POISON, n + GUARD), "cudaMemset");
    return p;
}

static void fetch(void *h, const void *d, size_t n, const char *what) {
    uint8_t *b = malloc(n + GUARD);
    ok(cudaMemcpy(b, d, n + GUARD, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (size_t i = n; i < n + GUARD; i++)
        if (b[i] != POISON) fail_msg("%s: write past the end", what);
    memcpy(h, b, n);
    free(b);
}

static void test_against_cpu(void **state) {
    (void)state;
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    assert_int_equal(dw_ctx_create(&co, &ctx), DW_OK);
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed());
    for (int trial = 0; trial < 6; trial++) {
        const int64_t N = dw_test_rnd(1, 5), words = DW_AMAX_WORDS(N);
        uint32_t *h = calloc((size_t)words, sizeof *h), *got = malloc((size_t)words * sizeof *got);
        uint32_t *dh = dev((size_t)words * sizeof *dh);
        ok(cudaMemset(dh, 0, (size_t)words * sizeof *dh), "cudaMemset");
        for (int step = 0; step < 12; step++) {
            for (int u = (int)dw_test_rnd(0, 3); u > 0; u--) {
                const int64_t rows = dw_test_rnd(1, 300), cols = dw_test_rnd(1, 300), n = rows * cols;
                const bool bf16 = dw_test_rnd(0, 1), trans = dw_test_rnd(0, 1), record = dw_test_rnd(0, 3) != 0;
                const float spread = ldexpf(1.0f, (int)dw_test_rnd(-5, 5));
                float *x = malloc((size_t)n * sizeof *x);
                uint16_t *xb = malloc((size_t)n * sizeof *xb);
                for (int64_t i = 0; i < n; i++) {
                    xb[i] = dw_encode_bf16(spread * dw_test_normal(&rng));
                    x[i] = bf16 ? dw_decode_bf16(xb[i]) : spread * dw_test_normal(&rng);
                }
                const int64_t odd = dw_test_rnd(0, 15);
                if (odd == 0) x[dw_test_rnd(0, n - 1)] = NAN;
                if (odd == 1) memset(x, 0, (size_t)n * sizeof *x);
                if (bf16 && odd <= 1)
                    for (int64_t i = 0; i < n; i++) xb[i] = dw_encode_bf16(x[i]);
                void *dx = NULL;
                const size_t in_bytes = (size_t)n * (bf16 ? 2 : 4);
                ok(cudaMalloc(&dx, in_bytes), "cudaMalloc");
                ok(cudaMemcpy(dx, bf16 ? (void *)xb : (void *)x, in_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
                assert_int_equal(cudaDeviceSynchronize(), cudaSuccess); /* a pageable upload may land after cudaMemcpy returns */
                uint8_t *dcodes = dev((size_t)n), *dtc = dev((size_t)n);
                float *dscale = dev(4), *dts = dev(4);
                uint32_t *ws = dev(dw_quantize_cuda_workspace_bytes(DW_RECIPE_FP8_TENSOR, rows, cols));
                dw_quant_dev_out o = {.codes = dcodes, .scales = dscale}, t = {.codes = dtc, .scales = dts};
                const dw_quant_opts qo = {.recipe = DW_RECIPE_FP8_TENSOR};
                assert_int_equal(dw_quantize_cuda_amax(ctx, &qo, bf16 ? DW_QUANT_IN_BF16 : DW_QUANT_IN_F32, dx, rows,
                                                       cols, &o, trans ? &t : NULL, ws, NULL, dh, record), DW_OK);
                ok(cudaDeviceSynchronize(), "quantize");
                uint8_t *codes = malloc((size_t)n), *ref = malloc((size_t)n), *tc = malloc((size_t)n);
                float scale = 0, ref_scale = 0, ts = 0;
                dw_qtensor q = {.codes = ref, .scales = &ref_scale};
                assert_int_equal(dw_amax_quantize_cpu(ctx, h, record, x, rows, cols, false, &q), DW_OK);
                fetch(codes, dcodes, (size_t)n, "codes");
                fetch(&scale, dscale, 4, "scale");
                assert_memory_equal(&scale, &ref_scale, 4);
                assert_memory_equal(codes, ref, (size_t)n);
                if (trans) {
                    uint32_t h2[64];
                    memcpy(h2, h, (size_t)words * sizeof *h); /* the same history: x^T alike */
                    dw_qtensor qt = {.codes = ref, .scales = &ref_scale};
                    assert_int_equal(dw_amax_quantize_cpu(ctx, h2, false, x, rows, cols, true, &qt), DW_OK);
                    fetch(tc, dtc, (size_t)n, "transposed codes");
                    fetch(&ts, dts, 4, "transposed scale");
                    assert_memory_equal(&ts, &scale, 4);
                    assert_memory_equal(tc, ref, (size_t)n);
                }
                fetch(got, dh, (size_t)words * sizeof *got, "history");
                assert_memory_equal(got, h, (size_t)words * sizeof *h);
                free(x), free(xb), free(codes), free(ref), free(tc);
                cudaFree(dx), cudaFree(dcodes), cudaFree(dtc), cudaFree(dscale), cudaFree(dts), cudaFree(ws);
            }
            assert_int_equal(dw_amax_roll_cuda(ctx, dh, 1, N, NULL), DW_OK);
            ok(cudaDeviceSynchronize(), "roll");
            dw_amax_roll(h, (uint32_t)N);
            fetch(got, dh, (size_t)words * sizeof *got, "history after the roll");
            assert_memory_equal(got, h, (size_t)words * sizeof *h);
        }
        free(h), free(got);
        cudaFree(dh);
    }
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_against_cpu)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
