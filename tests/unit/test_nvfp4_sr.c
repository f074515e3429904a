/* test_nvfp4_sr.c — stochastic rounding of NVFP4 gradients (kernels/cpu/nvfp4_train_cpu.c, sr):
 *  - unbiased: over S = 4096 steps (fresh Philox streams), the mean dequantised value of every
 *    element with |x| <= 6d (the rest saturate: FORMATS.md's block scale rounds to UE4M3 and may
 *    land below amax / 6, for SR and RNE alike) is within 5 sigma/sqrt(S) + 2^-22 d of the value the quantiser saw (sigma <= half the
 *    grid gap around it; d = the block's decode(b) s_t), while round-to-nearest stays off by a
 *    whole fraction of a gap for the same elements (the check can fail);
 *  - each result is one of the two grid neighbours, exact grid values never move, the scales and
 *    tensor scale are the RNE quantiser's, and the same (seed, stream, step) gives the same bits
 *    while another step gives other bits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"
#include "kernels/cpu/nvfp4_train_cpu.h"
#include "testutil.h"

static dw_test_rng g_rng;

static dw_qtensor qalloc(int64_t rows, int64_t cols) {
    dw_qtensor q = {0};
    q.codes = malloc(dw_quant_codes_bytes(DW_RECIPE_NVFP4, rows, cols) + 1);
    q.scales = malloc(dw_quant_scales_bytes(DW_RECIPE_NVFP4, rows, cols) + 1);
    return q;
}
static void qfree(dw_qtensor *q) {
    free(q->codes);
    free(q->scales);
}

/* Element i of x [., C] against q's block: *d = decode(b) s_t, lo <= |x|/d <= hi its E2M1 grid
 * neighbours (lo = NULL: skip), and the dequantised value of lo (or of *hi when lo is NULL), computed as
 * dw_dequantize_cpu does (grid value times decode(b), then times s_t). */
static float grid_value(const dw_qtensor *q, const float *x, int64_t i, int64_t C, double *lo, double *hi, double *d) {
    static const double g[] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    const float dec = dw_decode_ue4m3(((const uint8_t *)q->scales)[(i / C) * ((C + 15) / 16) + (i % C) / 16]);
    *d = (double)dec * q->tensor_scale;
    if (lo) {
        const double a = fabs((double)x[i]) / *d;
        *lo = 0, *hi = 6;
        for (int k = 0; k < 8; k++) {
            if (g[k] <= a) *lo = g[k];
            if (g[7 - k] >= a) *hi = g[7 - k];
        }
    }
    return (float)(lo ? *lo : *hi) * dec * q->tensor_scale;
}

static void test_sr_unbiased(void **state) {
    (void)state;
    const int64_t R = 3, C = 40, S = 4096; /* 120 elements, ragged last block */
    float *x = malloc((size_t)(R * C) * sizeof *x);
    for (int64_t i = 0; i < R * C; i++) x[i] = dw_test_normal(&g_rng) * (i % 7 == 0 ? 4.0f : 1.0f);
    x[5] = 0.0f, x[6] = -0.0f;
    double *sum = calloc((size_t)(R * C), sizeof *sum);
    float *y = malloc((size_t)(R * C) * sizeof *y), *yr = malloc((size_t)(R * C) * sizeof *yr);
    dw_qtensor q = qalloc(R, C), qr = qalloc(R, C), q2 = qalloc(R, C);
    const uint64_t seed = dw_test_next(&g_rng);
    const dw_nvfp4_qopts rne = {.seed = seed};
    assert_int_equal(dw_nvfp4_quantize_cpu(NULL, &rne, x, R, C, &qr), DW_OK);
    dw_dequantize_cpu(&qr, yr);
    for (int64_t s = 0; s < S; s++) {
        const dw_nvfp4_qopts o = {.sr = true, .seed = seed, .stream = 7, .step = (uint32_t)s};
        assert_int_equal(dw_nvfp4_quantize_cpu(NULL, &o, x, R, C, &q), DW_OK);
        assert_memory_equal(q.scales, qr.scales, dw_quant_scales_bytes(DW_RECIPE_NVFP4, R, C));
        assert_true(q.tensor_scale == qr.tensor_scale);
        if (s < 4) { /* deterministic per (seed, stream, step) */
            assert_int_equal(dw_nvfp4_quantize_cpu(NULL, &o, x, R, C, &q2), DW_OK);
            assert_memory_equal(q.codes, q2.codes, dw_quant_codes_bytes(DW_RECIPE_NVFP4, R, C));
        }
        dw_dequantize_cpu(&q, y);
        for (int64_t i = 0; i < R * C; i++) {
            double lo, hi, d;
            const float flo = grid_value(&qr, x, i, C, &lo, &hi, &d), fhi = grid_value(&qr, x, i, C, NULL, &hi, &d);
            if (fabsf(y[i]) != flo && fabsf(y[i]) != fhi)
                fail_msg("x[%lld] = %g (%g d): SR gave %g d, not %g or %g", (long long)i, (double)x[i], x[i] / d, y[i] / d, lo, hi);
            if (lo == hi && y[i] != yr[i]) fail_msg("x[%lld] on the grid moved: %g -> %g", (long long)i, (double)yr[i], (double)y[i]);
            sum[i] += y[i];
        }
    }
    int rne_biased = 0, saturated = 0;
    for (int64_t i = 0; i < R * C; i++) {
        double lo, hi, d;
        grid_value(&qr, x, i, C, &lo, &hi, &d);
        if (fabs(x[i]) > 6 * d) { /* the block rule's scale rounded down: this element saturates to 6d */
            saturated++;
            continue;
        }
        const double sigma = (hi - lo) / 2 * d, mean = sum[i] / S, tol = 5 * sigma / sqrt((double)S) + ldexp(d, -22);
        if (fabs(mean - x[i]) > tol)
            fail_msg("x[%lld] = %.6g: mean of %lld SR samples %.6g, off by %.3g > %.3g", (long long)i, (double)x[i],
                     (long long)S, mean, fabs(mean - x[i]), tol);
        rne_biased += fabs((double)yr[i] - x[i]) > tol;
    }
    printf("%d of %lld elements: round-to-nearest off by more than the SR tolerance (%d above 6d, saturated)\n",
           rne_biased, (long long)(R * C), saturated);
    assert_true(rne_biased > R * C / 2);
    /* another step, another draw */
    const dw_nvfp4_qopts a = {.sr = true, .seed = seed, .stream = 1, .step = 1}, b = {.sr = true, .seed = seed, .stream = 1, .step = 2};
    assert_int_equal(dw_nvfp4_quantize_cpu(NULL, &a, x, R, C, &q), DW_OK);
    assert_int_equal(dw_nvfp4_quantize_cpu(NULL, &b, x, R, C, &q2), DW_OK);
    assert_true(memcmp(q.codes, q2.codes, dw_quant_codes_bytes(DW_RECIPE_NVFP4, R, C)) != 0);
    qfree(&q), qfree(&qr), qfree(&q2);
    free(x), free(sum), free(y), free(yr);
}

int main(void) {
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x5125ull);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sr_unbiased)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
