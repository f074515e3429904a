/* test_grouped_fp8_wgrad.c — the fp8_block grouped GEMM's wgrad on the CPU (src/gemm/grouped_fp8.c,
 * kernels/cpu/moe_cpu.c): the quantiser of its transposed, per-expert padded operands against
 * grouped_fp8.h's layout and FORMATS.md's fp8_block rule, both written again here (expert e's
 * rows are the columns from 128 * sum_{e'<e} ceil(count_e'/128) on; each 1x128 block's scale
 * s = amax/448, 1 for an all-zero block, code = E4M3(x / s), the block's padding and the columns
 * past the groups zero codes), rows past the groups never read (they hold NaN); the reference
 * product dW_e += dy_e^T x_e through dw_grouped_gemm against the dequantised operands' product in
 * double over each expert's rows, with skewed routings (every row to one expert, empty experts, a
 * single row, groups of 127, 128, 129 rows); experts without rows leave dW as it was, bit for bit. */
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
#include "gemm/grouped.h"
#include "gemm/grouped_fp8.h"
#include "test_grouped_fp8.h"
#include "testutil.h"

/* The codes and scales of x^T in the padded layout against the rule; the number of mismatches. */
static int64_t check_cols(const float *x, const uint8_t *codes, const float *scales, const int32_t *off, int64_t R,
                          int64_t E, int64_t C) {
    const int64_t P = dw_grouped_fp8_wgrad_cols(R, E), PB = P / 128;
    int64_t *pad = padded_starts(off, E, 128), bad = pad[E] > P;
    for (int64_t c = 0; c < C; c++) {
        for (int64_t e = 0; e < E; e++)
            for (int64_t b = 0; pad[e] + 128 * b < pad[e + 1]; b++) {
                const int64_t t0 = off[e] + 128 * b, n = off[e + 1] - t0 < 128 ? off[e + 1] - t0 : 128;
                float amax = 0;
                for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[(t0 + i) * C + c]));
                const float sc = rule_scale(amax);
                const int64_t col = pad[e] + 128 * b;
                bad += scales[c * PB + col / 128] != sc;
                for (int64_t i = 0; i < 128; i++)
                    bad += codes[c * P + col + i] != (i < n ? dw_encode_e4m3(x[(t0 + i) * C + c] / sc) : 0);
            }
        for (int64_t col = pad[E]; col < P; col++) bad += codes[c * P + col] != 0; /* past the groups */
        for (int64_t pb = pad[E] / 128; pb < PB; pb++) bad += scales[c * PB + pb] != 1.0f;
    }
    free(pad);
    return bad;
}

static void test_quantiser(void **state) {
    (void)state;
    for (int kind = 0; kind < 5; kind++) {
        const int64_t E = kind == 3 ? dw_test_rnd(1, 3) : dw_test_rnd(1, 6), C = 128 * dw_test_rnd(1, 2);
        int32_t *off = malloc((size_t)(E + 1) * 4);
        const int64_t R = wgrad_routing(kind, E, 128, off), P = dw_grouped_fp8_wgrad_cols(R, E);
        float *x = wgrad_operand(R, C, off, E), *s = malloc((size_t)(C * P / 128) * 4);
        uint8_t *c = malloc((size_t)(C * P));
        memset(c, 0xAB, (size_t)(C * P)); /* poisoned: every code and scale must be written */
        for (int64_t i = 0; i < C * P / 128; i++) s[i] = NAN;
        assert_int_equal(dw_grouped_fp8_quantize_cols_cpu(CTX, x, off, R, E, C, c, s), DW_OK);
        const int64_t bad = check_cols(x, c, s, off, R, E, C);
        if (bad) fprintf(stderr, "routing %d E %lld R %lld C %lld: %lld codes or scales differ\n", kind, (long long)E,
                         (long long)R, (long long)C, (long long)bad);
        assert_int_equal(bad, 0);
        free(off), free(x), free(s), free(c);
    }
    /* bad input: offsets that do not start at 0, or pass the rows */
    int32_t off[3] = {1, 2, 3};
    float x[128 * 4] = {0}, s[256];
    uint8_t c[128 * 256];
    assert_int_equal(dw_grouped_fp8_quantize_cols_cpu(CTX, x, off, 3, 2, 128, c, s), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "offsets[0] = 1"));
    off[0] = 0, off[2] = 9;
    assert_int_equal(dw_grouped_fp8_quantize_cols_cpu(CTX, x, off, 3, 2, 128, c, s), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "offsets[2] = 9"));
}

/* One wgrad through dw_grouped_gemm on a dW that holds values already (it is added into). */
static void check_wgrad(int kind) {
    const int64_t E = kind == 3 ? dw_test_rnd(1, 3) : dw_test_rnd(1, 5), M = 128 * dw_test_rnd(1, 2),
                  K = 128 * dw_test_rnd(1, 2);
    int32_t *off = malloc((size_t)(E + 1) * 4);
    const int64_t R = wgrad_routing(kind, E, 128, off), P = dw_grouped_fp8_wgrad_cols(R, E), PB = P / 128;
    float *dy = wgrad_operand(R, M, off, E), *x = wgrad_operand(R, K, off, E);
    uint8_t *dyc = malloc((size_t)(M * P)), *xc = malloc((size_t)(K * P));
    float *dys = malloc((size_t)(M * PB) * 4), *xs = malloc((size_t)(K * PB) * 4);
    assert_int_equal(dw_grouped_fp8_quantize_cols_cpu(CTX, dy, off, R, E, M, dyc, dys), DW_OK);
    assert_int_equal(dw_grouped_fp8_quantize_cols_cpu(CTX, x, off, R, E, K, xc, xs), DW_OK);
    float *dw0 = randv(E * M * K, false), *dw = malloc((size_t)(E * M * K) * 4);
    memcpy(dw, dw0, (size_t)(E * M * K) * 4);
    dw_grouped_args a = {.pass = DW_GEMM_WGRAD, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_FP8_BLOCK, .rows = R,
                         .experts = E, .k = K, .m = M, .x = xc, .x_scales = xs, .dy = dyc, .dy_scales = dys,
                         .offsets = off, .out = dw};
    const char *name = NULL;
    assert_int_equal(dw_grouped_select(CTX, &a, &name), DW_OK);
    assert_string_equal(name, "grouped_cpu_fp8_block");
    assert_int_equal(dw_grouped_gemm(CTX, &a), DW_OK);
    int64_t *pad = padded_starts(off, E, 128), bad = 0;
    for (int64_t e = 0; e < E; e++) {
        double err2 = 0, ref2 = 0;
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++) {
                double s = 0, mag = 0, exact = 0;
                for (int64_t r = off[e]; r < off[e + 1]; r++) {
                    const int64_t col = pad[e] + r - off[e];
                    const double av = (double)dw_decode_e4m3(dyc[m * P + col]) * dys[m * PB + col / 128];
                    const double bv = (double)dw_decode_e4m3(xc[k * P + col]) * xs[k * PB + col / 128];
                    s += av * bv, mag += fabs(av * bv), exact += (double)dy[r * M + m] * x[r * K + k];
                }
                const int64_t i = (e * M + m) * K + k;
                const double want = (double)dw0[i] + s, got = dw[i];
                const bool ok = off[e] == off[e + 1] ? !memcmp(&dw[i], &dw0[i], 4) /* no rows: untouched */
                                                     : fabs(got - want) <= 0x1p-23 * (mag + fabs(want)) + 1e-30;
                if (!ok && !bad++)
                    fprintf(stderr, "routing %d expert %lld (%lld, %lld): %.9g, oracle %.9g\n", kind, (long long)e,
                            (long long)m, (long long)k, got, want);
                err2 += (got - dw0[i] - exact) * (got - dw0[i] - exact), ref2 += exact * exact;
            }
        if (ref2 > 0 && sqrt(err2 / ref2) > 0.1) { /* quantisation is small */
            fprintf(stderr, "routing %d expert %lld: relative error %.3g against the unquantised product\n", kind,
                    (long long)e, sqrt(err2 / ref2));
            bad++;
        }
    }
    assert_int_equal(bad, 0);
    free(off), free(dy), free(x), free(dyc), free(xc), free(dys), free(xs), free(dw0), free(dw), free(pad);
}

static void test_reference(void **state) {
    (void)state;
    for (int kind = 0; kind < 5; kind++) check_wgrad(kind);
    /* bad input: wgrad reads x's scales */
    float v[4] = {0};
    int32_t off[2] = {0, 0};
    dw_grouped_args b = {.pass = DW_GEMM_WGRAD, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_FP8_BLOCK, .rows = 0,
                         .experts = 1, .k = 128, .m = 128, .dy = v, .x = v, .dy_scales = v, .offsets = off, .out = v};
    assert_int_equal(dw_grouped_gemm(CTX, &b), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "x_scales"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantiser),
        cmocka_unit_test(test_reference),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
