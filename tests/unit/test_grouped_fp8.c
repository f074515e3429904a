/* test_grouped_fp8.c — the fp8_block grouped expert GEMM on the CPU (src/gemm/grouped_fp8.c,
 * kernels/cpu/moe_cpu.c): the quantisers of the grouped operands against FORMATS.md's fp8_block
 * rule written again here (s = amax/448, 1 for an all-zero block; code = E4M3(x / s)), W^T's copy
 * the exact transpose of W's codes and block scales; the reference product (fprop and dgrad through
 * dw_grouped_gemm) against the dequantised operands' product in double, with skewed routings
 * (every row to one expert, empty experts, a single row, rows past the groups); the registry's
 * rules (K and M multiples of 128, the sm_90 kernel by default and not with DW_MOE_FP8=0). wgrad's
 * padded operands and product: test_grouped_fp8_wgrad.c. */
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

static void test_quantisers(void **state) {
    (void)state;
    for (int trial = 0; trial < 3; trial++) {
        const int64_t E = dw_test_rnd(1, 3), M = 128 * dw_test_rnd(1, 2), K = 128 * dw_test_rnd(1, 2);
        const int64_t MB = M / 128, KB = K / 128;
        float *w = randv(E * M * K, true);
        uint8_t *c = malloc((size_t)(E * M * K)), *ct = malloc((size_t)(E * M * K));
        float *s = malloc((size_t)(E * MB * KB) * 4), *st = malloc((size_t)(E * MB * KB) * 4);
        assert_int_equal(dw_grouped_fp8_quantize_weights_cpu(CTX, w, E, M, K, c, s, ct, st), DW_OK);
        int64_t bad = 0;
        for (int64_t e = 0; e < E; e++)
            for (int64_t bm = 0; bm < MB; bm++)
                for (int64_t bk = 0; bk < KB; bk++) {
                    float amax = 0;
                    for (int64_t i = 0; i < 128; i++)
                        for (int64_t k = 0; k < 128; k++)
                            amax = fmaxf(amax, fabsf(w[(e * M + bm * 128 + i) * K + bk * 128 + k]));
                    const float sc = rule_scale(amax);
                    bad += s[(e * MB + bm) * KB + bk] != sc || st[(e * KB + bk) * MB + bm] != sc;
                    for (int64_t i = 0; i < 128; i++)
                        for (int64_t k = 0; k < 128; k++) {
                            const int64_t m = bm * 128 + i, kk = bk * 128 + k;
                            const uint8_t want = dw_encode_e4m3(w[(e * M + m) * K + kk] / sc);
                            bad += c[(e * M + m) * K + kk] != want || ct[(e * K + kk) * M + m] != want;
                        }
                }
        const int64_t R = dw_test_rnd(1, 20);
        float *x = randv(R * K, true), *xs = malloc((size_t)(R * KB) * 4);
        uint8_t *xc = malloc((size_t)(R * K));
        assert_int_equal(dw_grouped_fp8_quantize_rows_cpu(CTX, x, R, K, xc, xs), DW_OK);
        for (int64_t r = 0; r < R; r++)
            for (int64_t bk = 0; bk < KB; bk++) {
                float amax = 0;
                for (int64_t k = 0; k < 128; k++) amax = fmaxf(amax, fabsf(x[r * K + bk * 128 + k]));
                const float sc = rule_scale(amax);
                bad += xs[r * KB + bk] != sc;
                for (int64_t k = 0; k < 128; k++) bad += xc[r * K + bk * 128 + k] != dw_encode_e4m3(x[r * K + bk * 128 + k] / sc);
            }
        if (bad) fprintf(stderr, "E %lld M %lld K %lld R %lld: %lld codes or scales differ\n", (long long)E,
                         (long long)M, (long long)K, (long long)R, (long long)bad);
        assert_int_equal(bad, 0);
        free(w), free(c), free(ct), free(s), free(st), free(x), free(xs), free(xc);
    }
}

/* One pass through dw_grouped_gemm against the dequantised operands' product in double: the
 * reference rounds each block's scale product to FP32, so it may differ from the oracle by 2^-24
 * of the sum of |terms| (and one FP32 rounding of the result). Also against the unquantised
 * product, loosely: quantisation is small. */
static void check_pass(int pass, int kind) {
    const bool fprop = pass == DW_GEMM_FPROP;
    const int64_t E = dw_test_rnd(1, 5), M = 128 * dw_test_rnd(1, 2), K = 128 * dw_test_rnd(1, 2);
    const int64_t R = kind == 3 ? dw_test_rnd(1, 4) : dw_test_rnd(2, 40), L = fprop ? K : M, N = fprop ? M : K;
    int32_t *off = malloc((size_t)(E + 1) * 4);
    route(kind, E, R, off);
    float *w = randv(E * M * K, false), *act = randv(R * L, true);
    uint8_t *wc = malloc((size_t)(E * M * K)), *wct = malloc((size_t)(E * M * K)), *ac = malloc((size_t)(R * L));
    float *ws = malloc((size_t)(E * M * K / 16384) * 4), *wst = malloc((size_t)(E * M * K / 16384) * 4);
    float *as = malloc((size_t)(R * L / 128) * 4), *out = malloc((size_t)(R * N) * 4);
    assert_int_equal(dw_grouped_fp8_quantize_weights_cpu(CTX, w, E, M, K, wc, ws, wct, wst), DW_OK);
    assert_int_equal(dw_grouped_fp8_quantize_rows_cpu(CTX, act, R, L, ac, as), DW_OK);
    for (int64_t i = 0; i < R * N; i++) out[i] = NAN; /* poisoned: every element must be written */
    dw_grouped_args a = {.pass = pass, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_FP8_BLOCK, .rows = R,
                         .experts = E, .k = K, .m = M, .w = fprop ? wc : wct, .w_scales = fprop ? ws : wst,
                         .offsets = off, .out = out};
    if (fprop) a.x = ac, a.x_scales = as;
    else a.dy = ac, a.dy_scales = as;
    const char *name = NULL;
    assert_int_equal(dw_grouped_select(CTX, &a, &name), DW_OK);
    assert_string_equal(name, "grouped_cpu_fp8_block");
    assert_int_equal(dw_grouped_gemm(CTX, &a), DW_OK);
    /* B as the product reads it: W (E, N=M, L=K) for fprop, W^T (E, N=K, L=M) for dgrad */
    const uint8_t *bc = fprop ? wc : wct;
    const float *bs = fprop ? ws : wst;
    int64_t bad = 0;
    double err2 = 0, ref2 = 0;
    for (int64_t e = 0; e < E; e++)
        for (int64_t r = off[e]; r < off[e + 1]; r++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0, mag = 0, exact = 0;
                for (int64_t l = 0; l < L; l++) {
                    const double av = (double)dw_decode_e4m3(ac[r * L + l]) * as[r * (L / 128) + l / 128];
                    const double bv = (double)dw_decode_e4m3(bc[(e * N + j) * L + l]) *
                                      bs[(e * (N / 128) + j / 128) * (L / 128) + l / 128];
                    s += av * bv, mag += fabs(av * bv);
                    exact += (double)act[r * L + l] * (fprop ? w[(e * M + j) * K + l] : w[(e * M + l) * K + j]);
                }
                const double got = out[r * N + j];
                if (!(fabs(got - s) <= 0x1p-23 * mag + 0x1p-24 * fabs(s) + 1e-30)) {
                    if (!bad) fprintf(stderr, "pass %d routing %d (%lld, %lld): %.9g, oracle %.9g\n", pass, kind,
                                      (long long)r, (long long)j, got, s);
                    bad++;
                }
                err2 += (got - exact) * (got - exact), ref2 += exact * exact;
            }
    for (int64_t i = (int64_t)off[E] * N; i < R * N; i++) bad += out[i] != 0.0f; /* rows past the groups */
    if (ref2 > 0 && sqrt(err2 / ref2) > 0.1) {
        fprintf(stderr, "pass %d: relative error %.3g against the unquantised product\n", pass, sqrt(err2 / ref2));
        bad++;
    }
    assert_int_equal(bad, 0);
    free(off), free(w), free(act), free(wc), free(wct), free(ac), free(ws), free(wst), free(as), free(out);
}

static void test_reference(void **state) {
    (void)state;
    for (int kind = 0; kind < 4; kind++) {
        check_pass(DW_GEMM_FPROP, kind);
        check_pass(DW_GEMM_DGRAD, kind);
    }
}

static void test_rules(void **state) {
    (void)state;
    const void *ph = (const void *)(uintptr_t)4096;
    dw_grouped_args a = {.pass = DW_GEMM_FPROP, .dtype = DW_GROUPED_BF16, .recipe = DW_RECIPE_FP8_BLOCK,
                         .rows = dw_test_rnd(0, 5000), .experts = dw_test_rnd(1, 1024), .k = 128 * dw_test_rnd(1, 40),
                         .m = 128 * dw_test_rnd(1, 40), .x = ph, .w = ph, .dy = ph, .out = (void *)ph,
                         .offsets = ph, .x_scales = ph, .w_scales = ph, .dy_scales = ph};
    char log[4096] = "";
    unsetenv("DW_MOE_FP8");
    assert_string_equal(dw_grouped_registry_pick(DW_DEVICE_CUDA, 90, &a, NULL, 0), "grouped_fp8block_sm90"); /* default */
    setenv("DW_MOE_FP8", "0", 1); /* the off switch: no fp8_block kernel on the GPU, the reason names it */
    for (int pass = DW_GEMM_FPROP; pass <= DW_GEMM_WGRAD; pass++) {
        a.pass = pass, log[0] = '\0';
        assert_null(dw_grouped_registry_pick(DW_DEVICE_CUDA, 90, &a, log, sizeof log));
        assert_non_null(strstr(log, "grouped_fp8block_sm90        prio  40  rejected: switched off by DW_MOE_FP8=0"));
        assert_non_null(strstr(log, "grouped_wgmma_sm90           prio  30  rejected: recipe must be bf16, not fp8_block"));
    }
    a.pass = DW_GEMM_FPROP;
    setenv("DW_MOE_FP8", "1", 1); /* on, as by default */
    assert_string_equal(dw_grouped_registry_pick(DW_DEVICE_CUDA, 90, &a, NULL, 0), "grouped_fp8block_sm90");
    unsetenv("DW_MOE_FP8");
    a.pass = DW_GEMM_DGRAD;
    assert_string_equal(dw_grouped_registry_pick(DW_DEVICE_CUDA, 90, &a, NULL, 0), "grouped_fp8block_sm90");
    assert_null(dw_grouped_registry_pick(DW_DEVICE_CUDA, 100, &a, NULL, 0)); /* sm_90a only */
    log[0] = '\0';
    a.k += 8 * dw_test_rnd(1, 15);
    assert_null(dw_grouped_registry_pick(DW_DEVICE_CUDA, 90, &a, log, sizeof log));
    assert_non_null(strstr(log, "K and M must be multiples of 128"));
    a.k -= a.k % 128, a.pass = DW_GEMM_WGRAD; /* dy^T and x^T padded per expert (test_grouped_fp8_wgrad.c) */
    assert_string_equal(dw_grouped_registry_pick(DW_DEVICE_CUDA, 90, &a, NULL, 0), "grouped_fp8block_sm90");
    a.dy = (const char *)ph + 8, log[0] = '\0';
    assert_null(dw_grouped_registry_pick(DW_DEVICE_CUDA, 90, &a, log, sizeof log));
    assert_non_null(strstr(log, "16-byte aligned"));
    a.dy = ph;
    a.pass = DW_GEMM_FPROP, a.experts = dw_test_rnd(1025, 4096), log[0] = '\0';
    assert_null(dw_grouped_registry_pick(DW_DEVICE_CUDA, 90, &a, log, sizeof log));
    assert_non_null(strstr(log, "at most 1024 experts"));
    a.experts = 4, a.x = (const char *)ph + 8, log[0] = '\0';
    assert_null(dw_grouped_registry_pick(DW_DEVICE_CUDA, 90, &a, log, sizeof log));
    assert_non_null(strstr(log, "16-byte aligned"));
    /* bad input: a scale pointer the pass reads is missing */
    float v[4] = {0};
    int32_t off[2] = {0, 0};
    dw_grouped_args b = {.pass = DW_GEMM_DGRAD, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_FP8_BLOCK, .rows = 0,
                         .experts = 1, .k = 128, .m = 128, .dy = v, .w = v, .w_scales = v, .offsets = off, .out = v};
    assert_int_equal(dw_grouped_gemm(CTX, &b), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "dy_scales"));
    b.dy_scales = v;
    assert_int_equal(dw_grouped_gemm(CTX, &b), DW_OK); /* no rows: nothing to do */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantisers),
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_rules),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
