/* test_mxfp8_grouped_wgrad.c — the MXFP8 grouped GEMM's wgrad on the CPU (src/gemm/grouped_mxfp8.c,
 * grouped_mxfp8_quant.c, kernels/cpu/grouped_mxfp8_cpu.c): the quantiser of its transposed,
 * per-expert padded operands against grouped_mxfp8.h's layout and FORMATS.md's mxfp8 rule, both
 * written again here (expert e's rows are the columns from 32 * sum_{e'<e} ceil(count_e'/32) on;
 * each 1x32 block's scale code e + 127 with e = ceil(log2(amax / 448)) (the division in FP32), code
 * 0 for an all-zero block, element E4M3(x / 2^e); the block's padding and the columns past the
 * groups zero codes with scale code 0), rows past the groups never read (they hold NaN); the
 * reference product dW_e += dy_e^T x_e through dw_grouped_gemm against the dequantised operands'
 * product in double over each expert's rows, bit for bit after the one rounding (every product and
 * sum is exact in double at these magnitudes), with skewed routings (every row to one expert, empty
 * experts, a single row, groups of 31, 32, 33 rows, an all-zero column); experts without rows leave dW as it was;
 * overwrite over a NaN dW equals adding into zeros bit for bit (empty experts zeros); the
 * weights' and rows' quantisers equal dw_quantize_cpu's mxfp8 (W^T along M); the registry's rules
 * for wgrad (K or M not a multiple of 32 refused by name; the CPU entry on a CPU context; the
 * dequantising entry on sm_90 for BF16). */
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
#include "gemm/grouped_mxfp8.h"
#include "test_grouped_fp8.h"
#include "testutil.h"

/* FORMATS.md's MX rule (rceil, E4M3: max normal 448), written again: the scale's exponent e. */
static int mx_exp(float amax) {
    const float q = amax / 448.0f;
    int ex = 0;
    const float m = frexpf(q, &ex); /* q = m 2^ex, m in [0.5, 1) */
    int e = m == 0.5f ? ex - 1 : ex;
    return e < -127 ? -127 : e > 127 ? 127 : e;
}

/* A wgrad operand (NaN past the groups) with one column all zero: blocks of scale code 0. */
static float *operand(int64_t R, int64_t C, const int32_t *off, int64_t E) {
    float *x = wgrad_operand(R, C, off, E);
    const int64_t c = dw_test_rnd(0, C - 1);
    for (int64_t r = 0; r < off[E]; r++) x[r * C + c] = 0.0f;
    return x;
}

/* The codes and scales of x^T in the padded layout against the rule; the number of mismatches. */
static int64_t check_cols(const float *x, const uint8_t *codes, const uint8_t *scales, const int32_t *off, int64_t R,
                          int64_t E, int64_t C) {
    const int64_t P = dw_grouped_mxfp8_wgrad_cols(R, E), PB = P / 32;
    int64_t *pad = padded_starts(off, E, 32), bad = pad[E] > P;
    for (int64_t c = 0; c < C; c++) {
        for (int64_t e = 0; e < E; e++)
            for (int64_t b = 0; pad[e] + 32 * b < pad[e + 1]; b++) {
                const int64_t t0 = off[e] + 32 * b, n = off[e + 1] - t0 < 32 ? off[e + 1] - t0 : 32;
                float amax = 0;
                for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[(t0 + i) * C + c]));
                const int ex = amax == 0 ? -127 : mx_exp(amax);
                const int64_t col = pad[e] + 32 * b;
                bad += scales[c * PB + col / 32] != (uint8_t)(amax == 0 ? 0 : ex + 127);
                for (int64_t i = 0; i < 32; i++) {
                    const uint8_t want = i < n && amax > 0 ? dw_encode_e4m3(ldexpf(x[(t0 + i) * C + c], -ex)) : 0;
                    bad += codes[c * P + col + i] != want;
                }
            }
        for (int64_t col = pad[E]; col < P; col++) bad += codes[c * P + col] != 0; /* past the groups */
        for (int64_t pb = pad[E] / 32; pb < PB; pb++) bad += scales[c * PB + pb] != 0;
    }
    free(pad);
    return bad;
}

static void test_quantiser(void **state) {
    (void)state;
    for (int kind = 0; kind < 5; kind++) {
        const int64_t E = kind == 3 ? dw_test_rnd(1, 3) : dw_test_rnd(1, 6), C = 32 * dw_test_rnd(1, 4);
        int32_t *off = malloc((size_t)(E + 1) * 4);
        const int64_t R = wgrad_routing(kind, E, 32, off), P = dw_grouped_mxfp8_wgrad_cols(R, E);
        float *x = operand(R, C, off, E);
        uint8_t *c = malloc((size_t)(C * P)), *s = malloc((size_t)(C * P / 32));
        memset(c, 0xAB, (size_t)(C * P)), memset(s, 0xAB, (size_t)(C * P / 32)); /* every byte must be written */
        assert_int_equal(dw_grouped_mxfp8_quantize_cols_cpu(CTX, x, off, R, E, C, c, s), DW_OK);
        const int64_t bad = check_cols(x, c, s, off, R, E, C);
        if (bad) fprintf(stderr, "routing %d E %lld R %lld C %lld: %lld codes or scales differ\n", kind, (long long)E,
                         (long long)R, (long long)C, (long long)bad);
        assert_int_equal(bad, 0);
        free(off), free(x), free(s), free(c);
    }
    int32_t off[3] = {1, 2, 3}; /* bad input: offsets that do not start at 0, or pass the rows */
    float x[32 * 4] = {0};
    uint8_t c[32 * 256], s[256];
    assert_int_equal(dw_grouped_mxfp8_quantize_cols_cpu(CTX, x, off, 3, 2, 32, c, s), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "offsets[0] = 1"));
    off[0] = 0, off[2] = 9;
    assert_int_equal(dw_grouped_mxfp8_quantize_cols_cpu(CTX, x, off, 3, 2, 32, c, s), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "offsets[2] = 9"));
}

/* The weight cache's and the rows' quantisers are FORMATS.md's mxfp8 as dw_quantize_cpu makes it:
 * W along K over all experts' rows, each expert's W^T along M, x along its rows. */
static void test_weights_rows(void **state) {
    (void)state;
    const int64_t E = dw_test_rnd(1, 4), M = 32 * dw_test_rnd(1, 3), K = 32 * dw_test_rnd(1, 3);
    float *w = randv(E * M * K, false), *wt = malloc((size_t)(K * M) * 4);
    uint8_t *q = malloc((size_t)(E * M * K)), *qs = malloc((size_t)(E * M * K / 32));
    uint8_t *qt = malloc((size_t)(E * M * K)), *qts = malloc((size_t)(E * M * K / 32));
    uint8_t *ref = malloc((size_t)(E * M * K)), *refs = malloc((size_t)(E * M * K / 32));
    assert_int_equal(dw_grouped_mxfp8_quantize_weights_cpu(CTX, w, E, M, K, q, qs, qt, qts), DW_OK);
    const dw_quant_opts o = {.recipe = DW_RECIPE_MXFP8};
    dw_qtensor r = {.recipe = DW_RECIPE_MXFP8, .rows = E * M, .cols = K, .codes = ref, .scales = refs, .tensor_scale = 1};
    assert_int_equal(dw_quantize_cpu(CTX, &o, w, E * M, K, &r), DW_OK);
    assert_memory_equal(q, ref, (size_t)(E * M * K));
    assert_memory_equal(qs, refs, (size_t)(E * M * K / 32));
    for (int64_t e = 0; e < E; e++) { /* W_e^T [K, M], transposed here, then quantised along its rows */
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++) wt[k * M + m] = w[(e * M + m) * K + k];
        dw_qtensor t = {.recipe = DW_RECIPE_MXFP8, .rows = K, .cols = M, .codes = ref, .scales = refs, .tensor_scale = 1};
        assert_int_equal(dw_quantize_cpu(CTX, &o, wt, K, M, &t), DW_OK);
        assert_memory_equal(qt + e * M * K, ref, (size_t)(M * K));
        assert_memory_equal(qts + e * M * K / 32, refs, (size_t)(M * K / 32));
    }
    memset(q, 0xAB, (size_t)(E * M * K)), memset(qs, 0xAB, (size_t)(E * M * K / 32));
    assert_int_equal(dw_grouped_mxfp8_quantize_rows_cpu(CTX, w, E * M, K, q, qs), DW_OK); /* as rows x [E M, K] */
    assert_int_equal(dw_quantize_cpu(CTX, &o, w, E * M, K, &r), DW_OK);
    assert_memory_equal(q, ref, (size_t)(E * M * K));
    assert_memory_equal(qs, refs, (size_t)(E * M * K / 32));
    free(w), free(wt), free(q), free(qs), free(qt), free(qts), free(ref), free(refs);
}

/* One wgrad through dw_grouped_gemm on a dW that holds values already (it is added into). */
static void check_wgrad(int kind) {
    const int64_t E = kind == 3 ? dw_test_rnd(1, 3) : dw_test_rnd(1, 5), M = 32 * dw_test_rnd(1, 3),
                  K = 32 * dw_test_rnd(1, 3);
    int32_t *off = malloc((size_t)(E + 1) * 4);
    const int64_t R = wgrad_routing(kind, E, 32, off), P = dw_grouped_mxfp8_wgrad_cols(R, E), PB = P / 32;
    float *dy = operand(R, M, off, E), *x = operand(R, K, off, E);
    uint8_t *dyc = malloc((size_t)(M * P)), *xc = malloc((size_t)(K * P));
    uint8_t *dys = malloc((size_t)(M * PB)), *xs = malloc((size_t)(K * PB));
    assert_int_equal(dw_grouped_mxfp8_quantize_cols_cpu(CTX, dy, off, R, E, M, dyc, dys), DW_OK);
    assert_int_equal(dw_grouped_mxfp8_quantize_cols_cpu(CTX, x, off, R, E, K, xc, xs), DW_OK);
    float *dw0 = randv(E * M * K, false), *dw = malloc((size_t)(E * M * K) * 4);
    memcpy(dw, dw0, (size_t)(E * M * K) * 4);
    dw_grouped_args a = {.pass = DW_GEMM_WGRAD, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_MXFP8, .rows = R,
                         .experts = E, .k = K, .m = M, .x = xc, .x_scales = (const float *)(void *)xs, .dy = dyc,
                         .dy_scales = (const float *)(void *)dys, .offsets = off, .out = dw};
    const char *name = NULL;
    assert_int_equal(dw_grouped_select(CTX, &a, &name), DW_OK);
    assert_string_equal(name, "grouped_cpu_mxfp8");
    assert_int_equal(dw_grouped_gemm(CTX, &a), DW_OK);
    int64_t *pad = padded_starts(off, E, 32), bad = 0;
    for (int64_t e = 0; e < E; e++) {
        double err2 = 0, ref2 = 0;
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++) {
                double s = 0, exact = 0;
                for (int64_t r = off[e]; r < off[e + 1]; r++) {
                    const int64_t col = pad[e] + r - off[e];
                    const double av = ldexp(dw_decode_e4m3(dyc[m * P + col]), dys[m * PB + col / 32] - 127);
                    const double bv = ldexp(dw_decode_e4m3(xc[k * P + col]), xs[k * PB + col / 32] - 127);
                    s += av * bv, exact += (double)dy[r * M + m] * x[r * K + k];
                }
                const int64_t i = (e * M + m) * K + k;
                const float want = off[e] == off[e + 1] ? dw0[i] : (float)((double)dw0[i] + s);
                if (memcmp(&dw[i], &want, 4) && !bad++)
                    fprintf(stderr, "routing %d expert %lld (%lld, %lld): %.9g, oracle %.9g\n", kind, (long long)e,
                            (long long)m, (long long)k, dw[i], want);
                err2 += ((double)dw[i] - dw0[i] - exact) * ((double)dw[i] - dw0[i] - exact), ref2 += exact * exact;
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
}

/* overwrite: dW written over a NaN-filled out equals the sum added into zeros, bit for bit; an
 * expert without rows gets zeros. */
static void test_overwrite(void **state) {
    (void)state;
    for (int kind = 0; kind < 5; kind++) {
        const int64_t E = dw_test_rnd(2, 5), M = 32 * dw_test_rnd(1, 2), K = 32 * dw_test_rnd(1, 2);
        int32_t *off = malloc((size_t)(E + 1) * 4);
        const int64_t R = wgrad_routing(kind, E, 32, off), P = dw_grouped_mxfp8_wgrad_cols(R, E);
        float *dy = operand(R, M, off, E), *x = operand(R, K, off, E);
        uint8_t *dyc = malloc((size_t)(M * P)), *xc = malloc((size_t)(K * P));
        uint8_t *dys = malloc((size_t)(M * P / 32)), *xs = malloc((size_t)(K * P / 32));
        assert_int_equal(dw_grouped_mxfp8_quantize_cols_cpu(CTX, dy, off, R, E, M, dyc, dys), DW_OK);
        assert_int_equal(dw_grouped_mxfp8_quantize_cols_cpu(CTX, x, off, R, E, K, xc, xs), DW_OK);
        float *over = malloc((size_t)(E * M * K) * 4), *added = calloc((size_t)(E * M * K), 4);
        for (int64_t i = 0; i < E * M * K; i++) over[i] = NAN;
        dw_grouped_args a = {.pass = DW_GEMM_WGRAD, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_MXFP8, .rows = R,
                             .experts = E, .k = K, .m = M, .x = xc, .x_scales = (const float *)(void *)xs, .dy = dyc,
                             .dy_scales = (const float *)(void *)dys, .offsets = off, .out = added};
        assert_int_equal(dw_grouped_gemm(CTX, &a), DW_OK);
        a.out = over, a.overwrite = true;
        assert_int_equal(dw_grouped_gemm(CTX, &a), DW_OK);
        assert_memory_equal(over, added, (size_t)(E * M * K) * 4);
        free(off), free(dy), free(x), free(dyc), free(xc), free(dys), free(xs), free(over), free(added);
    }
}

/* wgrad's rules: K or M not a multiple of 32 refused by name; missing scales named; BF16 operands
 * on sm_90 take the dequantising route, sm_100 none. */
static void test_rules(void **state) {
    (void)state;
    static uint8_t buf[4096];
    int32_t off[3] = {0, 2, 4};
    float out[2 * 64 * 48];
    dw_grouped_args a = {.pass = DW_GEMM_WGRAD, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_MXFP8, .rows = 4,
                         .experts = 2, .k = 48, .m = 64, .x = buf, .dy = buf, .out = out, .offsets = off,
                         .x_scales = (const float *)(void *)buf, .dy_scales = (const float *)(void *)buf};
    const char *name = (const char *)1;
    assert_int_equal(dw_grouped_select(CTX, &a, &name), DW_ERR_UNSUPPORTED);
    assert_null(name);
    char *s = NULL;
    assert_int_equal(dw_grouped_explain(CTX, &a, &s), DW_OK);
    if (!strstr(s, "grouped_cpu_mxfp8") || !strstr(s, "K and M must be multiples of 32")) fail_msg("explain:\n%s", s);
    dw_free_string(s);
    a.k = 64, a.x_scales = NULL;
    assert_int_equal(dw_grouped_gemm(CTX, &a), DW_ERR_INVALID);
    if (!strstr(dw_errmsg(CTX), "in mxfp8: needs x_scales dy_scales")) fail_msg("missing scales: %s", dw_errmsg(CTX));
    a.x_scales = (const float *)(void *)buf, a.dtype = DW_GROUPED_BF16;
    assert_string_equal(dw_grouped_registry_pick(DW_DEVICE_CUDA, 90, &a, NULL, 0), "grouped_mxfp8_dequant_bf16");
    assert_null(dw_grouped_registry_pick(DW_DEVICE_CUDA, 100, &a, NULL, 0));
}

int main(void) {
    (void)rule_scale; /* test_grouped_fp8.h's fp8_block rule: not this recipe's */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantiser),
        cmocka_unit_test(test_weights_rows),
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_overwrite),
        cmocka_unit_test(test_rules),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
