/* test_grouped_mxfp8.c — the MXFP8 grouped expert GEMM on the CPU (src/gemm/grouped_mxfp8.c,
 * kernels/cpu/moe_cpu.c): fprop and dgrad through dw_grouped_gemm on operands the library's MX
 * quantiser made (FORMATS.md's mxfp8: E4M3 codes, a UE8M0 scale per 1x32 — x and dy along their
 * rows, W [E, M, K] along K, W^T's copy [E, K, M] along M), against those operands dequantised by
 * dw_dequantize_cpu and multiplied in double, bit for bit after the one rounding to FP32 (every
 * product of two MX values is exact in double; the sums differ at most in double's last bits),
 * with skewed routings (every row to one expert, empty
 * experts, a single row, rows past the groups, which must come back 0 from a NaN-poisoned output),
 * blocks of one scale each and a 2^40 spread of scales within a row. The registry's rules: the CPU
 * entry selected on a CPU context (wgrad too; its own test is test_mxfp8_grouped_wgrad.c); K or M
 * not a multiple of 32 refused with the reason; missing scales refused naming them; on CUDA the dequantising entry on sm_80..99 (as the
 * dense mxfp8 recipe's deepwell_mx_dequant_bf16) and no mxfp8 entry on sm_100. */
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
#include "test_grouped_fp8.h"
#include "testutil.h"

/* x [rows, cols] quantised to mxfp8 along its rows: codes (rows, cols), UE8M0 bytes (rows, cols/32). */
static void mx_quant(const float *x, int64_t rows, int64_t cols, uint8_t **codes, uint8_t **scales, float **deq) {
    const dw_quant_opts o = {.recipe = DW_RECIPE_MXFP8};
    *codes = malloc((size_t)(rows * cols) + 1), *scales = malloc((size_t)(rows * cols / 32) + 1);
    dw_qtensor q = {.recipe = DW_RECIPE_MXFP8, .rows = rows, .cols = cols, .codes = *codes, .scales = *scales,
                    .tensor_scale = 1.0f};
    assert_int_equal(dw_quantize_cpu(CTX, &o, x, rows, cols, &q), DW_OK);
    *deq = malloc((size_t)(rows * cols + 1) * sizeof **deq);
    dw_dequantize_cpu(&q, *deq);
}

/* Values whose 32-blocks each have a scale of their own, spread over 2^-20..2^20 by block. */
static float *spread(int64_t n) {
    float *v = malloc((size_t)(n + 1) * sizeof *v);
    for (int64_t b = 0; b < n / 32; b++) {
        const int sh = (int)dw_test_rnd(-20, 20);
        for (int64_t i = 0; i < 32; i++) v[b * 32 + i] = ldexpf(dw_test_uniform(RNG, -1, 1), sh);
    }
    return v;
}

/* One fprop or dgrad of E experts (L the reduction, N the output columns) through dw_grouped_gemm
 * against the dequantised product in double; the elements that differ. */
static int64_t one_case(int pass, int kind, int64_t E, int64_t R, int64_t L, int64_t N) {
    int32_t *off = malloc((size_t)(E + 1) * sizeof *off);
    route(kind, E, R, off);
    float *a = kind == 0 ? spread(R * L) : randv(R * L, false), *b = randv(E * N * L, false);
    uint8_t *ac, *as, *bc, *bs;
    float *ad, *bd;
    mx_quant(a, R, L, &ac, &as, &ad);
    mx_quant(b, E * N, L, &bc, &bs, &bd); /* fprop: W [E, M=N, K=L]; dgrad: W^T's copy [E, K=N, M=L] */
    float *out = malloc((size_t)(R * N + 1) * sizeof *out);
    for (int64_t i = 0; i < R * N; i++) out[i] = NAN;
    const bool fprop = pass == DW_GEMM_FPROP;
    dw_grouped_args g = {.pass = pass, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_MXFP8, .rows = R, .experts = E,
                         .k = fprop ? L : N, .m = fprop ? N : L, .w = bc, .w_scales = (const float *)(void *)bs,
                         .out = out, .offsets = off};
    if (fprop) g.x = ac, g.x_scales = (const float *)(void *)as;
    else g.dy = ac, g.dy_scales = (const float *)(void *)as;
    const char *name = NULL;
    assert_int_equal(dw_grouped_select(CTX, &g, &name), DW_OK);
    assert_string_equal(name, "grouped_cpu_mxfp8");
    if (dw_grouped_gemm(CTX, &g) != DW_OK) fail_msg("%s", dw_errmsg(CTX));
    int64_t bad = 0;
    for (int64_t e = 0; e < E; e++)
        for (int64_t r = off[e]; r < off[e + 1]; r++)
            for (int64_t j = 0; j < N; j++) {
                double acc = 0;
                for (int64_t l = 0; l < L; l++) acc += (double)ad[r * L + l] * bd[(e * N + j) * L + l];
                const float want = (float)acc;
                if (memcmp(&out[r * N + j], &want, sizeof want) && !bad++)
                    fprintf(stderr, "%s kind %d E %lld R %lld L %lld N %lld: row %lld col %lld is %.9g, want %.9g\n",
                            fprop ? "fprop" : "dgrad", kind, (long long)E, (long long)R, (long long)L, (long long)N,
                            (long long)r, (long long)j, out[r * N + j], want);
            }
    for (int64_t i = (int64_t)off[E] * N; i < R * N; i++) bad += out[i] != 0.0f; /* rows past the groups */
    free(off), free(a), free(b), free(ac), free(as), free(bc), free(bs), free(ad), free(bd), free(out);
    return bad;
}

static void test_product(void **state) {
    (void)state;
    for (int pass = DW_GEMM_FPROP; pass <= DW_GEMM_DGRAD; pass++)
        for (int kind = 0; kind < 4; kind++) {
            const int64_t E = dw_test_rnd(1, 5), R = dw_test_rnd(1, 40), L = 32 * dw_test_rnd(1, 6),
                          N = 32 * dw_test_rnd(1, 3);
            assert_int_equal(one_case(pass, kind, E, R, L, N), 0);
        }
}

/* The account of a (CPU context) names `want` in it. */
static void explains(const dw_grouped_args *a, const char *want) {
    char *s = NULL;
    assert_int_equal(dw_grouped_explain(CTX, a, &s), DW_OK);
    if (!strstr(s, want)) fail_msg("explain lacks '%s':\n%s", want, s);
    dw_free_string(s);
}

static void test_rules(void **state) {
    (void)state;
    static uint8_t buf[4096];
    int32_t off[3] = {0, 2, 4};
    float out[4 * 64];
    dw_grouped_args a = {.pass = DW_GEMM_FPROP, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_MXFP8, .rows = 4,
                         .experts = 2, .k = 48, .m = 64, .x = buf, .w = buf, .out = out, .offsets = off,
                         .x_scales = (const float *)(void *)buf, .w_scales = (const float *)(void *)buf};
    const char *name = (const char *)1;
    assert_int_equal(dw_grouped_select(CTX, &a, &name), DW_ERR_UNSUPPORTED); /* K 48 */
    assert_null(name);
    explains(&a, "K and M must be multiples of 32");
    a.k = 64, a.pass = DW_GEMM_WGRAD, a.dy = buf, a.dy_scales = (const float *)(void *)buf;
    assert_int_equal(dw_grouped_select(CTX, &a, &name), DW_OK); /* wgrad: test_mxfp8_grouped_wgrad.c */
    assert_string_equal(name, "grouped_cpu_mxfp8");
    a.pass = DW_GEMM_DGRAD, a.dy_scales = NULL;
    assert_int_equal(dw_grouped_gemm(CTX, &a), DW_ERR_INVALID);
    if (!strstr(dw_errmsg(CTX), "in mxfp8: needs w_scales dy_scales")) fail_msg("missing scales: %s", dw_errmsg(CTX));
    /* CUDA targets (pointers are only checked for alignment): BF16 operands on sm_80..99 */
    a.pass = DW_GEMM_FPROP, a.dtype = DW_GROUPED_BF16;
    char log[4096] = "";
    const char *pick = dw_grouped_registry_pick(DW_DEVICE_CUDA, 90, &a, log, sizeof log);
    if (!pick || strcmp(pick, "grouped_mxfp8_dequant_bf16")) fail_msg("sm_90 picked %s:\n%s", pick ? pick : "none", log);
    assert_string_equal(dw_grouped_registry_pick(DW_DEVICE_CUDA, 80, &a, NULL, 0), "grouped_mxfp8_dequant_bf16");
    log[0] = '\0';
    assert_null(dw_grouped_registry_pick(DW_DEVICE_CUDA, 100, &a, log, sizeof log));
    if (!strstr(log, "needs sm_80..sm_99, device is sm_100")) fail_msg("sm_100 account:\n%s", log);
    a.dtype = DW_GROUPED_F32; /* the BF16 grouped GEMMs write BF16 */
    assert_null(dw_grouped_registry_pick(DW_DEVICE_CUDA, 90, &a, NULL, 0));
}

int main(void) {
    (void)rule_scale; /* test_grouped_fp8.h's fp8_block rule: not this recipe's */
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_product), cmocka_unit_test(test_rules)};
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
