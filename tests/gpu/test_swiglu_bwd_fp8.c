/* test_swiglu_bwd_fp8.c — the SwiGLU backward that writes its gradients as fp8_block operands
 * (kernels/cuda/swiglu_bwd_fp8.cu: dw_cuda_swiglu_bwd_fp8) against what it replaces: the BF16
 * backward (dw_cuda_swiglu_bwd) and the quantiser (dw_quantize_cuda, fp8_block, rows and the
 * transposed copy in one pass) on each gradient, byte for byte — both gradients' row codes and
 * scales and their transposed codes and scales — and the counts (overflow, underflow, elements)
 * the quantiser adds for the same copies, from counters that start at random values. Fresh random
 * tiles, each 128-token block of a feature column and each 1x128 row block at its own scale from
 * 1e-30 to 1e4, planted elements 1e-8 of their block's spread (flushed), a row of zeros, a NaN and
 * an infinity in the inputs; shapes from one tile to 2048 x 5632 (a llama MLP's width). Bad
 * arguments refused. Also the MoE experts' variant that keeps the BF16 gradients and writes their
 * rows (dw_cuda_swiglu_bwd_rows_fp8). Needs a GPU (label gpu). */
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
#include "kernels/cuda/quant.h"
#include "precision/quant_counts.h"
#include "testutil.h"

static dw_ctx *g_cpu, *g_gpu;
static dw_test_rng g_rng;

static int setup(void **state) {
    (void)state;
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x5B1Dull);
    return dw_test_cpu_gpu_setup(&g_cpu, &g_gpu);
}
static int teardown(void **state) {
    (void)state;
    dw_test_cpu_gpu_teardown(g_cpu, g_gpu);
    return 0;
}

static int64_t pick(int64_t n) { return (int64_t)(dw_test_next(&g_rng) % (uint64_t)n); }
static uint16_t rnd_bf16(float sd) { return dw_encode_bf16(dw_test_normal(&g_rng) * sd); }

static void *dev(size_t n) { return dw_test_to_dev(NULL, n); }

static void test_against_quantiser(void **state) {
    (void)state;
    void *stream = NULL;
    assert_int_equal(dw_ctx_stream(g_gpu, &stream), DW_OK);
    const int64_t shapes[][2] = {{128, 128}, {256, 384}, {384, 1024}, {2048, 5632}};
    int bad = 0;
    uint64_t flushed = 0;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        const int64_t N = shapes[sh][0], F = shapes[sh][1], n = N * F, nb = n / 128;
        uint16_t *dout = malloc((size_t)n * 2), *gate = malloc((size_t)n * 2), *up = malloc((size_t)n * 2);
        for (int64_t i = 0; i < n; i++) gate[i] = rnd_bf16(3.0f), up[i] = rnd_bf16(1.0f);
        /* dout's scale varies by row block and by column block, so both copies' blocks span decades */
        float *col_sd = malloc((size_t)F * sizeof(float));
        for (int64_t f = 0; f < F; f++) col_sd[f] = powf(10.0f, dw_test_uniform(&g_rng, -15.0f, 2.0f));
        for (int64_t b = 0; b < nb; b++) {
            const float row_sd = powf(10.0f, dw_test_uniform(&g_rng, -15.0f, 2.0f));
            for (int64_t i = 128 * b; i < 128 * (b + 1); i++) dout[i] = rnd_bf16(row_sd * col_sd[i % F]);
            if (pick(4) == 0) dout[128 * b + pick(128)] = rnd_bf16(row_sd * col_sd[(128 * b) % F] * 1e-8f);
        }
        const int64_t zr = pick(N); /* a token with no gradient */
        memset(dout + zr * F, 0, (size_t)F * 2);
        dout[pick(n)] = 0x7FC0;  /* NaN */
        gate[pick(n)] = 0x7F80;  /* +inf */
        uint16_t *d_dout = dw_test_to_dev(dout, (size_t)n * 2), *d_gate = dw_test_to_dev(gate, (size_t)n * 2),
                 *d_up = dw_test_to_dev(up, (size_t)n * 2);
        /* reference: BF16 gradients, then the quantiser on each */
        uint16_t *d_bf[2] = {dev((size_t)n * 2), dev((size_t)n * 2)};
        assert_int_equal(dw_cuda_swiglu_bwd(g_gpu, DW_ACT_BF16, d_bf[0], d_bf[1], d_dout, d_gate, d_up, n, stream), DW_OK);
        uint64_t start[4][DW_QC_WORDS]; /* ref dgate, ref dup, fused dgate, fused dup */
        for (int k = 0; k < 4; k++)
            for (int w = 0; w < DW_QC_WORDS; w++) start[k][w] = dw_test_next(&g_rng) >> 8;
        uint64_t *d_cnt = dw_test_to_dev(start, sizeof start);
        const dw_quant_opts o = {.recipe = DW_RECIPE_FP8_BLOCK, .rounding = DW_SCALE_RCEIL, .pow2 = false};
        const size_t wsb = dw_quantize_cuda_workspace_bytes(DW_RECIPE_FP8_BLOCK, N, F);
        void *ws = wsb ? dev(wsb) : NULL;
        uint8_t *rc[2], *rct[2], *fc[2], *fct[2];
        float *rs[2], *rst[2], *fs[2], *fst[2];
        dw_cuda_fp8_grad fg[2];
        for (int k = 0; k < 2; k++) {
            rc[k] = dev((size_t)n), rct[k] = dev((size_t)n), fc[k] = dev((size_t)n), fct[k] = dev((size_t)n);
            rs[k] = dev((size_t)nb * 4), rst[k] = dev((size_t)nb * 4), fs[k] = dev((size_t)nb * 4), fst[k] = dev((size_t)nb * 4);
            dw_quant_dev_out a = {.codes = rc[k], .scales = rs[k], .counts = d_cnt + k * DW_QC_WORDS};
            dw_quant_dev_out t = {.codes = rct[k], .scales = rst[k], .counts = d_cnt + k * DW_QC_WORDS};
            assert_int_equal(dw_quantize_cuda(g_gpu, &o, DW_QUANT_IN_BF16, d_bf[k], N, F, &a, &t, ws, stream), DW_OK);
            fg[k] = (dw_cuda_fp8_grad){.codes = fc[k], .codes_t = fct[k], .scales = fs[k], .scales_t = fst[k],
                                       .counts = d_cnt + (2 + k) * DW_QC_WORDS};
        }
        assert_int_equal(dw_cuda_swiglu_bwd_fp8(g_gpu, d_dout, d_gate, d_up, N, F, &fg[0], &fg[1], stream), DW_OK);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        uint64_t end[4][DW_QC_WORDS];
        dw_test_from_dev(end, d_cnt, sizeof end);
        for (int k = 0; k < 2; k++) {
            void *h[8] = {dw_test_from_dev_new(rc[k], (size_t)n), dw_test_from_dev_new(fc[k], (size_t)n), dw_test_from_dev_new(rct[k], (size_t)n),
                          dw_test_from_dev_new(fct[k], (size_t)n), dw_test_from_dev_new(rs[k], (size_t)nb * 4), dw_test_from_dev_new(fs[k], (size_t)nb * 4),
                          dw_test_from_dev_new(rst[k], (size_t)nb * 4), dw_test_from_dev_new(fst[k], (size_t)nb * 4)};
            const int64_t dc = dw_test_differing(h[0], h[1], n, 1), dct = dw_test_differing(h[2], h[3], n, 1), ds = dw_test_differing(h[4], h[5], nb, 4),
                          dst = dw_test_differing(h[6], h[7], nb, 4);
            uint64_t got[2][DW_QC_WORDS];
            for (int w = 0; w < DW_QC_WORDS; w++) got[0][w] = end[k][w] - start[k][w], got[1][w] = end[2 + k][w] - start[2 + k][w];
            int64_t nan_s = 0;
            for (int64_t b = 0; b < nb; b++) nan_s += isnan(((float *)h[4])[b]) + isnan(((float *)h[6])[b]);
            printf("%s N=%lld F=%lld: codes %lld, codes^T %lld, scales %lld, scales^T %lld differ (want 0); counts "
                   "fused %llu/%llu/%llu, quantiser %llu/%llu/%llu; %lld NaN scales\n", k ? "dup  " : "dgate",
                   (long long)N, (long long)F, (long long)dc, (long long)dct, (long long)ds, (long long)dst,
                   (unsigned long long)got[1][0], (unsigned long long)got[1][1], (unsigned long long)got[1][2],
                   (unsigned long long)got[0][0], (unsigned long long)got[0][1], (unsigned long long)got[0][2],
                   (long long)nan_s);
            if (dc || dct || ds || dst || memcmp(got[0], got[1], sizeof got[0]) || got[1][DW_QC_N] != 2 * (uint64_t)n)
                bad++, printf("MISMATCH %s N=%lld F=%lld\n", k ? "dup" : "dgate", (long long)N, (long long)F);
            flushed += got[1][DW_QC_UNDER];
            for (int j = 0; j < 8; j++) free(h[j]);
            void *d[] = {rc[k], rct[k], fc[k], fct[k], rs[k], rst[k], fs[k], fst[k], d_bf[k]};
            for (size_t j = 0; j < sizeof d / sizeof d[0]; j++) cudaFree(d[j]);
        }
        cudaFree(ws), cudaFree(d_cnt), cudaFree(d_dout), cudaFree(d_gate), cudaFree(d_up);
        free(dout), free(gate), free(up), free(col_sd);
    }
    if (bad) fail_msg("%d mismatches (lines above)", bad);
    if (flushed == 0) fail_msg("no planted element counted as flushed");
}

/* The MoE experts' variant (dw_cuda_swiglu_bwd_rows_fp8): BF16 dgate and dup, and each one's
 * fp8_block rows, against dw_cuda_swiglu_bwd and the MoE rows quantiser on its output
 * (dw_grouped_fp8_quantize_rows_cuda), byte for byte,
 * at row counts no multiple of 128 (a MoE layer's routed rows), with 1x128 blocks from 1e-30 to
 * 1e4, planted tiny elements, a zero row, a NaN and an infinity; bad arguments refused. */
static void test_rows_variant(void **state) {
    (void)state;
    void *stream = NULL;
    assert_int_equal(dw_ctx_stream(g_gpu, &stream), DW_OK);
    const int64_t shapes[][2] = {{1, 128}, {77, 256}, {1000 + pick(64), 1024}, {3001, 5632}};
    int bad = 0;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        const int64_t N = shapes[sh][0], F = shapes[sh][1], n = N * F, nb = n / 128;
        uint16_t *dout = malloc((size_t)n * 2), *gate = malloc((size_t)n * 2), *up = malloc((size_t)n * 2);
        for (int64_t i = 0; i < n; i++) gate[i] = rnd_bf16(3.0f), up[i] = rnd_bf16(1.0f);
        for (int64_t b = 0; b < nb; b++) {
            const float sd = powf(10.0f, dw_test_uniform(&g_rng, -15.0f, 2.0f));
            for (int64_t i = 128 * b; i < 128 * (b + 1); i++) dout[i] = rnd_bf16(sd);
            if (pick(4) == 0) dout[128 * b + pick(128)] = rnd_bf16(sd * 1e-8f);
        }
        memset(dout + pick(N) * F, 0, (size_t)F * 2);
        dout[pick(n)] = 0x7FC0; /* NaN */
        gate[pick(n)] = 0x7F80; /* +inf */
        uint16_t *d_in[3] = {dw_test_to_dev(dout, (size_t)n * 2), dw_test_to_dev(gate, (size_t)n * 2),
                             dw_test_to_dev(up, (size_t)n * 2)};
        uint16_t *rb[2] = {dev((size_t)n * 2), dev((size_t)n * 2)}, *fb[2] = {dev((size_t)n * 2), dev((size_t)n * 2)};
        assert_int_equal(dw_cuda_swiglu_bwd(g_gpu, DW_ACT_BF16, rb[0], rb[1], d_in[0], d_in[1], d_in[2], n, stream), DW_OK);
        uint8_t *rc[2], *fc[2];
        float *rs[2], *fs[2];
        for (int k = 0; k < 2; k++) { /* the MoE dgrad's own rows quantiser (ops_cuda_moe.c) */
            rc[k] = dev((size_t)n), fc[k] = dev((size_t)n), rs[k] = dev((size_t)nb * 4), fs[k] = dev((size_t)nb * 4);
            assert_int_equal(dw_grouped_fp8_quantize_rows_cuda(g_gpu, rb[k], true, N, F, rc[k], rs[k]), DW_OK);
        }
        assert_int_equal(dw_cuda_swiglu_bwd_rows_fp8(g_gpu, fb[0], fb[1], d_in[0], d_in[1], d_in[2], N, F, fc, fs, stream),
                         DW_OK);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        for (int k = 0; k < 2; k++) {
            void *h[6] = {dw_test_from_dev_new(rb[k], (size_t)n * 2), dw_test_from_dev_new(fb[k], (size_t)n * 2), dw_test_from_dev_new(rc[k], (size_t)n),
                          dw_test_from_dev_new(fc[k], (size_t)n), dw_test_from_dev_new(rs[k], (size_t)nb * 4), dw_test_from_dev_new(fs[k], (size_t)nb * 4)};
            const int64_t db = dw_test_differing(h[0], h[1], n, 2), dc = dw_test_differing(h[2], h[3], n, 1), ds = dw_test_differing(h[4], h[5], nb, 4);
            int64_t zero_s = 0;
            for (int64_t b = 0; b < nb; b++) zero_s += ((float *)h[5])[b] == 0.0f;
            printf("rows %s N=%lld F=%lld: BF16 %lld, codes %lld, scales %lld differ (want 0); %lld zero scales\n",
                   k ? "dup  " : "dgate", (long long)N, (long long)F, (long long)db, (long long)dc, (long long)ds,
                   (long long)zero_s);
            if (db || dc || ds) bad++, printf("MISMATCH rows %s N=%lld F=%lld\n", k ? "dup" : "dgate", (long long)N, (long long)F);
            for (int j = 0; j < 6; j++) free(h[j]);
            cudaFree(rb[k]), cudaFree(fb[k]), cudaFree(rc[k]), cudaFree(fc[k]), cudaFree(rs[k]), cudaFree(fs[k]);
        }
        for (int k = 0; k < 3; k++) cudaFree(d_in[k]);
        free(dout), free(gate), free(up);
    }
    if (bad) fail_msg("%d mismatches (lines above)", bad);
    void *p = (void *)256;
    uint8_t *c2[2] = {p, p}, *cbad[2] = {p, (uint8_t *)p + 4};
    float *s2[2] = {p, p};
    assert_int_equal(dw_cuda_swiglu_bwd_rows_fp8(g_gpu, p, p, p, p, p, 100, 96, c2, s2, stream), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_swiglu_bwd_rows_fp8(g_gpu, p, NULL, p, p, p, 100, 128, c2, s2, stream), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_swiglu_bwd_rows_fp8(g_gpu, p, p, p, p, p, 100, 128, cbad, s2, stream), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_swiglu_bwd_rows_fp8(g_gpu, p, p, p, (char *)p + 2, p, 100, 128, c2, s2, stream),
                     DW_ERR_INVALID);
    assert_int_equal(dw_cuda_swiglu_bwd_rows_fp8(g_gpu, NULL, NULL, NULL, NULL, NULL, 0, 128, c2, s2, stream), DW_OK);
}

/* Refused: sizes off the 128 tiles, a missing output, misaligned codes, one gradient counted. */
static void test_refusals(void **state) {
    (void)state;
    void *stream = NULL;
    assert_int_equal(dw_ctx_stream(g_gpu, &stream), DW_OK);
    void *p = (void *)256;
    uint64_t cnt[DW_QC_WORDS];
    dw_cuda_fp8_grad g = {.codes = p, .codes_t = p, .scales = p, .scales_t = p}, h = g;
    assert_int_equal(dw_cuda_swiglu_bwd_fp8(g_gpu, p, p, p, 100, 128, &g, &h, stream), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_swiglu_bwd_fp8(g_gpu, p, p, p, 128, 96, &g, &h, stream), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_swiglu_bwd_fp8(g_gpu, p, p, p, 128, 128, &g, NULL, stream), DW_ERR_INVALID);
    h.codes_t = (uint8_t *)p + 8;
    assert_int_equal(dw_cuda_swiglu_bwd_fp8(g_gpu, p, p, p, 128, 128, &g, &h, stream), DW_ERR_INVALID);
    h.codes_t = p, h.counts = cnt;
    assert_int_equal(dw_cuda_swiglu_bwd_fp8(g_gpu, p, p, p, 128, 128, &g, &h, stream), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_swiglu_bwd_fp8(g_gpu, p, p, p, 0, 128, &g, &h, stream), DW_OK); /* nothing to do */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_against_quantiser, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rows_variant, setup, teardown),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
