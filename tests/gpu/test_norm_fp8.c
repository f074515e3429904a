/* test_norm_fp8.c — the norms' forward that also writes its output's fp8_block rows (ops_norm.cu:
 * dw_cuda_norm_fwd_fp8) against what it replaces: the norm (dw_cuda_rmsnorm_fwd_offset, with and
 * without Gemma's 1 + w, and dw_cuda_layernorm_fwd with a bias) followed by the MoE and dense rows
 * quantiser on its BF16 output, byte for byte — the output, the statistics (rstd, mean), the E4M3
 * codes and the FP32 scales — and the counts (overflow, underflow, elements) the counting pass
 * (dw_qcounts_add_cuda) finds in the quantiser's codes, added to counters that start at random
 * values. Fresh random rows; the weights' 128-column blocks at scales from 1e-20 to 1e3 (so the
 * output's blocks span decades), columns 1e-8 of their block (flushed), a zero row, a NaN and an
 * infinity; widths from 128 to 8192 (each threads-per-row case) at row counts that leave blocks of
 * rows partly used. Bad arguments refused. Also the GELU that a quantised linear layer runs after
 * its GEMM and that writes its readers' rows the same way (dw_cuda_gelu_fwd_fp8). Needs a GPU
 * (label gpu). */
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

#include "core/ctx.h"
#include "formats/formats.h"
#include "gemm/grouped_fp8.h"
#include "gpu_upload.h"
#include "kernels/cuda/ops_cuda.h"
#include "precision/quant_counts.h"
#include "testutil.h"

static dw_ctx *g_cpu, *g_gpu;
static dw_test_rng g_rng;

static int setup(void **state) {
    (void)state;
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x4E0Aull);
    return dw_test_cpu_gpu_setup(&g_cpu, &g_gpu);
}
static int teardown(void **state) {
    (void)state;
    dw_test_cpu_gpu_teardown(g_cpu, g_gpu);
    return 0;
}

static int64_t pick(int64_t n) { return (int64_t)(dw_test_next(&g_rng) % (uint64_t)n); }

static void *dev(size_t n) { return dw_test_to_dev(NULL, n); }

/* kind 0: rmsnorm, 1: rmsnorm with 1 + w, 2: layernorm with a bias */
static int one_case(int kind, int64_t N, int64_t C, uint64_t *flushed) {
    void *stream = NULL;
    assert_int_equal(dw_ctx_stream(g_gpu, &stream), DW_OK);
    const int64_t n = N * C, nb = n / 128;
    const bool rms = kind < 2;
    const double woff = kind == 1 ? 1.0 : 0.0, eps = 1e-5;
    uint16_t *x = malloc((size_t)n * 2);
    float *w = malloc((size_t)C * 4), *b = malloc((size_t)C * 4);
    for (int64_t i = 0; i < n; i++) x[i] = dw_encode_bf16(dw_test_normal(&g_rng) * 2.0f + (rms ? 0.0f : 0.5f));
    for (int64_t cb = 0; cb < C / 128; cb++) {
        const float sd = powf(10.0f, dw_test_uniform(&g_rng, -20.0f, 3.0f));
        for (int64_t c = 128 * cb; c < 128 * (cb + 1); c++) {
            w[c] = dw_test_normal(&g_rng) * sd - (float)woff; /* the weight applied: about sd */
            b[c] = dw_test_normal(&g_rng) * sd * 0.1f;
        }
        if (pick(2) == 0) w[128 * cb + pick(128)] = sd * 1e-8f - (float)woff; /* a column flushed to zero */
    }
    memset(x + pick(N) * C, 0, (size_t)C * 2); /* a zero row: its output is the bias */
    x[pick(n)] = 0x7FC0;                       /* NaN: its row NaN */
    x[pick(n)] = 0x7F80;                       /* +inf */
    void *dx = dw_test_to_dev(x, (size_t)n * 2), *dwt = dw_test_to_dev(w, (size_t)C * 4),
         *db = dw_test_to_dev(b, (size_t)C * 4);
    void *out[2] = {dev((size_t)n * 2), dev((size_t)n * 2)};
    float *st[2][2] = {{dev((size_t)N * 4), dev((size_t)N * 4)}, {dev((size_t)N * 4), dev((size_t)N * 4)}};
    uint8_t *codes[2] = {dev((size_t)n), dev((size_t)n)};
    float *scales[2] = {dev((size_t)nb * 4), dev((size_t)nb * 4)};
    uint64_t cnt0[2][DW_QC_WORDS], cnt1[2][DW_QC_WORDS]; /* [0]: the counting pass, [1]: the kernel */
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < DW_QC_WORDS; i++) cnt0[k][i] = dw_test_next(&g_rng) >> 8;
    uint64_t *dcnt = dw_test_to_dev(cnt0, sizeof cnt0);
    /* reference: the norm, the rows quantiser, the counting pass */
    if (rms)
        assert_int_equal(dw_cuda_rmsnorm_fwd_offset(g_gpu, DW_ACT_BF16, out[0], st[0][1], dx, dwt, woff, N, C, eps, stream),
                         DW_OK);
    else
        assert_int_equal(dw_cuda_layernorm_fwd(g_gpu, DW_ACT_BF16, out[0], st[0][0], st[0][1], dx, dwt, db, N, C, eps,
                                               stream), DW_OK);
    assert_int_equal(dw_grouped_fp8_quantize_rows_cuda(g_gpu, out[0], true, N, C, codes[0], scales[0]), DW_OK);
    assert_int_equal(dw_qcounts_add_cuda(g_gpu, DW_RECIPE_FP8_BLOCK, 1, out[0], N, C, false, codes[0], scales[0], NULL,
                                         dcnt, stream), DW_OK);
    assert_int_equal(dw_cuda_norm_fwd_fp8(g_gpu, rms, out[1], rms ? NULL : st[1][0], st[1][1], dx, dwt, rms ? NULL : db,
                                          woff, N, C, eps, codes[1], scales[1], dcnt + DW_QC_WORDS, stream), DW_OK);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaMemcpy(cnt1, dcnt, sizeof cnt1, cudaMemcpyDeviceToHost), cudaSuccess);
    uint64_t got[2][DW_QC_WORDS];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < DW_QC_WORDS; i++) got[k][i] = cnt1[k][i] - cnt0[k][i];
    void *h[8] = {dw_test_from_dev_new(out[0], (size_t)n * 2), dw_test_from_dev_new(out[1], (size_t)n * 2), dw_test_from_dev_new(codes[0], (size_t)n),
                  dw_test_from_dev_new(codes[1], (size_t)n), dw_test_from_dev_new(scales[0], (size_t)nb * 4), dw_test_from_dev_new(scales[1], (size_t)nb * 4),
                  dw_test_from_dev_new(st[0][1], (size_t)N * 4), dw_test_from_dev_new(st[1][1], (size_t)N * 4)};
    int64_t dmean = 0;
    if (!rms) {
        void *m0 = dw_test_from_dev_new(st[0][0], (size_t)N * 4), *m1 = dw_test_from_dev_new(st[1][0], (size_t)N * 4);
        dmean = dw_test_differing(m0, m1, N, 4);
        free(m0), free(m1);
    }
    const int64_t dout = dw_test_differing(h[0], h[1], n, 2), dc = dw_test_differing(h[2], h[3], n, 1), ds = dw_test_differing(h[4], h[5], nb, 4),
                  drs = dw_test_differing(h[6], h[7], N, 4);
    int64_t nan_s = 0, tiny = 0;
    for (int64_t i = 0; i < nb; i++) nan_s += isnan(((float *)h[5])[i]), tiny += ((float *)h[5])[i] < 1e-15f;
    static const char *names[3] = {"rmsnorm", "rmsnorm 1+w", "layernorm"};
    printf("%s N=%lld C=%lld: outputs %lld, rstd %lld, mean %lld, codes %lld, scales %lld differ (want 0); %lld NaN and "
           "%lld tiny scales; counts kernel %llu/%llu/%llu, counting pass %llu/%llu/%llu\n",
           names[kind], (long long)N, (long long)C, (long long)dout, (long long)drs, (long long)dmean, (long long)dc,
           (long long)ds, (long long)nan_s, (long long)tiny, (unsigned long long)got[1][0], (unsigned long long)got[1][1],
           (unsigned long long)got[1][2], (unsigned long long)got[0][0], (unsigned long long)got[0][1],
           (unsigned long long)got[0][2]);
    const bool bad = dout || drs || dmean || dc || ds || nan_s < 1 || memcmp(got[0], got[1], sizeof got[0]) ||
                     got[1][DW_QC_N] != (uint64_t)n;
    if (bad) printf("MISMATCH %s N=%lld C=%lld\n", names[kind], (long long)N, (long long)C);
    *flushed += got[1][DW_QC_UNDER];
    for (int k = 0; k < 8; k++) free(h[k]);
    void *d[] = {dx, dwt, db, out[0], out[1], st[0][0], st[0][1], st[1][0], st[1][1], codes[0], codes[1], scales[0],
                 scales[1], dcnt};
    for (size_t k = 0; k < sizeof d / sizeof d[0]; k++) cudaFree(d[k]);
    free(x), free(w), free(b);
    return bad;
}

static void test_against_norm_and_quantiser(void **state) {
    (void)state;
    const int64_t shapes[][2] = {{1, 128}, {37, 768}, {300 + pick(64), 2048}, {33, 4096}, {9, 8192}};
    int bad = 0;
    uint64_t flushed = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int kind = 0; kind < 3; kind++) bad += one_case(kind, shapes[s][0], shapes[s][1], &flushed);
    if (bad) fail_msg("%d mismatches (lines above)", bad);
    if (flushed == 0) fail_msg("no planted element counted as flushed");
}

/* The GELU's (dw_cuda_gelu_fwd_fp8, run after GPT-2's c_fc): against dw_cuda_gelu_fwd, the rows
 * quantiser and the counting pass, byte for byte, each 1x128 block of x at its own scale (1e-30 to
 * 1e4), a zero block, a NaN and an infinity; with out NULL the output's memory is left as it was. */
static void test_gelu_against_quantiser(void **state) {
    (void)state;
    void *stream = NULL;
    assert_int_equal(dw_ctx_stream(g_gpu, &stream), DW_OK);
    const int64_t shapes[][2] = {{1, 128}, {37, 768}, {255, 3072}, {1024 + pick(64), 3072}};
    int bad = 0;
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        const int64_t R = shapes[t][0], C = shapes[t][1], n = R * C, nb = n / 128;
        uint16_t *x = malloc((size_t)n * 2);
        for (int64_t b = 0; b < nb; b++) {
            const float sd = powf(10.0f, dw_test_uniform(&g_rng, -30.0f, 4.0f));
            for (int64_t i = 128 * b; i < 128 * (b + 1); i++) x[i] = dw_encode_bf16(dw_test_normal(&g_rng) * sd);
        }
        memset(x + 128 * pick(nb), 0, 256);
        x[pick(n)] = 0x7FC0, x[pick(n)] = 0x7F80;
        void *dx = dw_test_to_dev(x, (size_t)n * 2);
        void *out[3] = {dev((size_t)n * 2), dev((size_t)n * 2), dev((size_t)n * 2)};
        uint8_t *codes[3] = {dev((size_t)n), dev((size_t)n), dev((size_t)n)};
        float *scales[3] = {dev((size_t)nb * 4), dev((size_t)nb * 4), dev((size_t)nb * 4)};
        assert_int_equal(cudaMemset(out[2], 0x5A, (size_t)n * 2), cudaSuccess);
        uint64_t cnt0[2][DW_QC_WORDS], cnt1[2][DW_QC_WORDS];
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < DW_QC_WORDS; i++) cnt0[k][i] = dw_test_next(&g_rng) >> 8;
        uint64_t *dcnt = dw_test_to_dev(cnt0, sizeof cnt0);
        assert_int_equal(dw_cuda_gelu_fwd(g_gpu, DW_ACT_BF16, out[0], dx, n, stream), DW_OK);
        assert_int_equal(dw_grouped_fp8_quantize_rows_cuda(g_gpu, out[0], true, R, C, codes[0], scales[0]), DW_OK);
        assert_int_equal(dw_qcounts_add_cuda(g_gpu, DW_RECIPE_FP8_BLOCK, 1, out[0], R, C, false, codes[0], scales[0], NULL,
                                             dcnt, stream), DW_OK);
        assert_int_equal(dw_cuda_gelu_fwd_fp8(g_gpu, out[1], dx, R, C, codes[1], scales[1], dcnt + DW_QC_WORDS, stream),
                         DW_OK);
        assert_int_equal(dw_cuda_gelu_fwd_fp8(g_gpu, NULL, dx, R, C, codes[2], scales[2], NULL, stream), DW_OK);
        dw_test_from_dev(cnt1, dcnt, sizeof cnt1);
        int64_t d[5] = {0, 0, 0, 0, 0}; /* outputs, codes (fused, no out), scales (fused, no out) */
        void *h[9];
        for (int k = 0; k < 3; k++)
            h[3 * k] = dw_test_from_dev_new(out[k], (size_t)n * 2), h[3 * k + 1] = dw_test_from_dev_new(codes[k], (size_t)n),
            h[3 * k + 2] = dw_test_from_dev_new(scales[k], (size_t)nb * 4);
        d[0] = dw_test_differing(h[0], h[3], n, 2);
        d[1] = dw_test_differing(h[1], h[4], n, 1), d[2] = dw_test_differing(h[1], h[7], n, 1);
        d[3] = dw_test_differing(h[2], h[5], nb, 4), d[4] = dw_test_differing(h[2], h[8], nb, 4);
        int64_t kept = 0;
        for (int64_t i = 0; i < n; i++) kept += ((uint16_t *)h[6])[i] == 0x5A5A;
        uint64_t got[2][DW_QC_WORDS];
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < DW_QC_WORDS; i++) got[k][i] = cnt1[k][i] - cnt0[k][i];
        printf("gelu R=%lld C=%lld: outputs %lld, codes %lld/%lld, scales %lld/%lld differ (want 0); output left alone "
               "without out %lld of %lld; counts kernel %llu/%llu/%llu, counting pass %llu/%llu/%llu\n", (long long)R,
               (long long)C, (long long)d[0], (long long)d[1], (long long)d[2], (long long)d[3], (long long)d[4],
               (long long)kept, (long long)n, (unsigned long long)got[1][0], (unsigned long long)got[1][1],
               (unsigned long long)got[1][2], (unsigned long long)got[0][0], (unsigned long long)got[0][1],
               (unsigned long long)got[0][2]);
        if (d[0] || d[1] || d[2] || d[3] || d[4] || kept != n || memcmp(got[0], got[1], sizeof got[0]) ||
            got[1][DW_QC_N] != (uint64_t)n)
            bad++, printf("MISMATCH gelu R=%lld C=%lld\n", (long long)R, (long long)C);
        for (int k = 0; k < 9; k++) free(h[k]);
        for (int k = 0; k < 3; k++) cudaFree(out[k]), cudaFree(codes[k]), cudaFree(scales[k]);
        cudaFree(dx), cudaFree(dcnt), free(x);
    }
    void *p = (void *)256;
    assert_int_equal(dw_cuda_gelu_fwd_fp8(g_gpu, p, p, 4, 96, p, p, NULL, stream), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_gelu_fwd_fp8(g_gpu, p, (char *)p + 2, 4, 128, p, p, NULL, stream), DW_ERR_INVALID);
    if (bad) fail_msg("%d mismatches (lines above)", bad);
}

/* Refused: a width off the 128-block or over 8192, layernorm with a weight offset, misaligned codes. */
static void test_refusals(void **state) {
    (void)state;
    void *stream = NULL;
    assert_int_equal(dw_ctx_stream(g_gpu, &stream), DW_OK);
    void *p = (void *)256;
    float *f = p;
    uint8_t *c = p;
    assert_int_equal(dw_cuda_norm_fwd_fp8(g_gpu, true, p, NULL, f, p, f, NULL, 0.0, 4, 96, 1e-5, c, f, NULL, stream),
                     DW_ERR_INVALID);
    assert_int_equal(dw_cuda_norm_fwd_fp8(g_gpu, true, p, NULL, f, p, f, NULL, 0.0, 4, 8320, 1e-5, c, f, NULL, stream),
                     DW_ERR_INVALID);
    assert_int_equal(dw_cuda_norm_fwd_fp8(g_gpu, false, p, f, f, p, f, f, 1.0, 4, 128, 1e-5, c, f, NULL, stream),
                     DW_ERR_INVALID);
    assert_int_equal(dw_cuda_norm_fwd_fp8(g_gpu, true, p, NULL, f, p, f, NULL, 0.0, 4, 128, 1e-5, c + 4, f, NULL, stream),
                     DW_ERR_INVALID);
    assert_int_equal(dw_cuda_norm_fwd_fp8(g_gpu, true, p, NULL, f, p, f, NULL, 0.0, 4, 128, 1e-5, NULL, f, NULL, stream),
                     DW_ERR_INVALID);
    assert_int_equal(dw_cuda_norm_fwd_fp8(g_gpu, true, NULL, NULL, NULL, NULL, NULL, NULL, 0.0, 0, 128, 1e-5, NULL, NULL,
                                          NULL, stream), DW_OK); /* no rows: nothing to do */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_against_norm_and_quantiser, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gelu_against_quantiser, setup, teardown),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
