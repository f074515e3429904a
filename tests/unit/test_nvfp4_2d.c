/* test_nvfp4_2d.c — NVFP4 weights with 16x16 block scales (kernels/cpu/nvfp4_train_cpu.c,
 * block2d): on fresh random matrices of ragged sizes, q(W)^T == q(W^T) exactly — the same tensor
 * scale, every code of one the transposed code of the other, every block's scale the transposed
 * block's, and the dequantised values transposed bit for bit — whether W^T is given as a copy or
 * quantised through the trans option. Each block's scale is checked against FORMATS.md's rule on
 * the block's amax, and 1x16 blocks are shown not to have the property (so the check can fail). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
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
static unsigned code_at(const dw_qtensor *q, int64_t i, int64_t j) {
    uint8_t b = q->codes[i * dw_quant_row_bytes(DW_RECIPE_NVFP4, q->cols) + j / 2];
    return (j & 1) ? b >> 4 : b & 0xFu;
}
static uint8_t scale_at(const dw_qtensor *q, int64_t i, int64_t j) {
    return ((const uint8_t *)q->scales)[i * ((q->cols + 15) / 16) + j / 16];
}

/* Whether a (of W [R,C]) and b (of W^T) are transposes in every code, scale and value. */
static bool transposed_equal(const dw_qtensor *a, const dw_qtensor *b, bool report) {
    if (a->rows != b->cols || a->cols != b->rows || memcmp(&a->tensor_scale, &b->tensor_scale, 4)) return false;
    float *da = malloc((size_t)(a->rows * a->cols) * sizeof *da), *db = malloc((size_t)(a->rows * a->cols) * sizeof *db);
    dw_dequantize_cpu(a, da), dw_dequantize_cpu(b, db);
    bool ok = true;
    for (int64_t i = 0; i < a->rows && ok; i++)
        for (int64_t j = 0; j < a->cols && ok; j++) {
            ok = code_at(a, i, j) == code_at(b, j, i) && scale_at(a, i, j) == scale_at(b, j, i) &&
                 !memcmp(&da[i * a->cols + j], &db[j * a->rows + i], 4);
            if (!ok && report)
                print_error("[%lld][%lld]: code %x/%x scale %02x/%02x value %a/%a\n", (long long)i, (long long)j,
                            code_at(a, i, j), code_at(b, j, i), scale_at(a, i, j), scale_at(b, j, i),
                            (double)da[i * a->cols + j], (double)db[j * a->rows + i]);
        }
    free(da), free(db);
    return ok;
}

static float *rand_w(int64_t n) {
    float *w = malloc((size_t)n * sizeof *w);
    for (int64_t i = 0; i < n; i++) w[i] = dw_test_normal(&g_rng) * ldexpf(1.0f, (int)(dw_test_next(&g_rng) % 10) - 7);
    return w;
}

static void test_2d_transpose_exact(void **state) {
    (void)state;
    int one_d_differs = 0;
    for (int trial = 0; trial < 60; trial++) {
        const int64_t R = trial < 10 ? 16 * dw_test_rnd(1, 6) : dw_test_rnd(1, 100), C = trial < 10 ? 16 * dw_test_rnd(1, 6) : dw_test_rnd(1, 100);
        float *w = rand_w(R * C), *wt = malloc((size_t)(R * C) * sizeof *wt);
        if (trial == 7) w[dw_test_rnd(0, R * C - 1)] = NAN;
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < C; j++) wt[j * R + i] = w[i * C + j];
        const uint64_t seed = dw_test_next(&g_rng);
        const dw_nvfp4_qopts o = {.block2d = true, .seed = seed}, ot = {.block2d = true, .trans = true, .seed = seed};
        dw_qtensor qw = qalloc(R, C), qwt = qalloc(C, R), qvia = qalloc(C, R);
        assert_int_equal(dw_nvfp4_quantize_cpu(NULL, &o, w, R, C, &qw), DW_OK);
        assert_int_equal(dw_nvfp4_quantize_cpu(NULL, &o, wt, C, R, &qwt), DW_OK);   /* W^T given as a copy */
        assert_int_equal(dw_nvfp4_quantize_cpu(NULL, &ot, w, R, C, &qvia), DW_OK);  /* W^T by the trans option */
        if (!transposed_equal(&qw, &qwt, true)) fail_msg("[%lld x %lld]: q(W)^T != q(W^T)", (long long)R, (long long)C);
        assert_memory_equal(qwt.codes, qvia.codes, dw_quant_codes_bytes(DW_RECIPE_NVFP4, C, R));
        assert_memory_equal(qwt.scales, qvia.scales, dw_quant_scales_bytes(DW_RECIPE_NVFP4, C, R));
        /* each 16x16 block's scale is FORMATS.md's rule on that block's amax */
        for (int64_t i0 = 0; i0 < R && trial != 7; i0 += 16)
            for (int64_t j0 = 0; j0 < C; j0 += 16) {
                float amax = 0;
                for (int64_t i = i0; i < R && i < i0 + 16; i++)
                    for (int64_t j = j0; j < C && j < j0 + 16; j++) amax = fmaxf(amax, fabsf(w[i * C + j]));
                const uint8_t want = dw_encode_ue4m3(amax / (6.0f * qw.tensor_scale));
                for (int64_t i = i0; i < R && i < i0 + 16; i++) assert_int_equal(scale_at(&qw, i, j0), want);
            }
        /* 1x16 blocks: generally not transposes of each other */
        const dw_nvfp4_qopts p = {0}, pt = {.trans = true};
        dw_qtensor pw = qalloc(R, C), pwt = qalloc(C, R);
        assert_int_equal(dw_nvfp4_quantize_cpu(NULL, &p, w, R, C, &pw), DW_OK);
        assert_int_equal(dw_nvfp4_quantize_cpu(NULL, &pt, w, R, C, &pwt), DW_OK);
        if (R >= 32 && C >= 32 && trial != 7) one_d_differs += !transposed_equal(&pw, &pwt, false);
        qfree(&qw), qfree(&qwt), qfree(&qvia), qfree(&pw), qfree(&pwt);
        free(w), free(wt);
    }
    assert_true(one_d_differs > 0);
}

int main(void) {
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x2D2Dull);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_2d_transpose_exact)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
