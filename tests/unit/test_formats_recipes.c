/* test_formats_recipes.c — the quantisation recipes of formats.h on the CPU: scale rules against
 * hand-computed cases (amax = 0, NaN/Inf blocks, power-of-two scales, floor vs rceil, NVFP4's two
 * levels), ragged last blocks against the same block quantised alone, the transposed copy,
 * dequantisation error bounds on fresh random data, and the 128x4 swizzled scale layout. */
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
#include "formats/rules.h"
#include "testutil.h"

/* A quantised tensor with its own buffers. */
typedef struct {
    dw_qtensor q;
    int64_t srows, scols;
} owned_q;

static owned_q *qalloc(dw_recipe r, int64_t rows, int64_t cols) {
    owned_q *o = calloc(1, sizeof *o);
    o->q.codes = malloc(dw_quant_codes_bytes(r, rows, cols) + 1);
    o->q.scales = malloc(dw_quant_scales_bytes(r, rows, cols) + 4);
    dw_quant_scale_shape(r, rows, cols, &o->srows, &o->scols);
    return o;
}
static void qfree(owned_q *o) {
    free(o->q.codes);
    free(o->q.scales);
    free(o);
}

static owned_q *quant(dw_recipe r, dw_scale_rounding rnd, bool pow2, const float *x, int64_t rows,
                      int64_t cols) {
    owned_q *o = qalloc(r, rows, cols);
    dw_quant_opts opts = {.recipe = r, .rounding = rnd, .pow2 = pow2};
    assert_int_equal(dw_quantize_cpu(NULL, &opts, x, rows, cols, &o->q), DW_OK);
    return o;
}

static float scale_f32(const owned_q *o, int64_t i) { return ((const float *)o->q.scales)[i]; }
static uint8_t scale_u8(const owned_q *o, int64_t i) { return ((const uint8_t *)o->q.scales)[i]; }
static unsigned code4(const owned_q *o, int64_t r, int64_t c) {
    uint8_t b = o->q.codes[r * dw_quant_row_bytes(o->q.recipe, o->q.cols) + c / 2];
    return (c & 1) ? b >> 4 : b & 0xF;
}

static void test_shapes(void **state) {
    (void)state;
    int64_t sr, sc;
    dw_quant_scale_shape(DW_RECIPE_FP8_TENSOR, 7, 9, &sr, &sc);
    assert_true(sr == 1 && sc == 1);
    dw_quant_scale_shape(DW_RECIPE_FP8_ROW, 7, 9, &sr, &sc);
    assert_true(sr == 7 && sc == 1);
    dw_quant_scale_shape(DW_RECIPE_FP8_BLOCK, 3, 129, &sr, &sc);
    assert_true(sr == 3 && sc == 2);
    dw_quant_scale_shape(DW_RECIPE_FP8_BLOCK2D, 129, 256, &sr, &sc);
    assert_true(sr == 2 && sc == 2);
    dw_quant_scale_shape(DW_RECIPE_MXFP4, 5, 33, &sr, &sc);
    assert_true(sr == 5 && sc == 2);
    dw_quant_scale_shape(DW_RECIPE_NVFP4, 5, 33, &sr, &sc);
    assert_true(sr == 5 && sc == 3);
    assert_int_equal(dw_quant_codes_bytes(DW_RECIPE_NVFP4, 5, 33), 5 * 17);
    assert_int_equal(dw_quant_codes_bytes(DW_RECIPE_MXFP8, 5, 33), 5 * 33);
    assert_int_equal(dw_quant_scales_bytes(DW_RECIPE_FP8_BLOCK, 3, 129), 3 * 2 * 4);
    assert_int_equal(dw_quant_scales_bytes(DW_RECIPE_MXFP8, 5, 33), 10);
    int br, bc;
    dw_recipe_block(DW_RECIPE_FP8_BLOCK2D, &br, &bc);
    assert_true(br == 128 && bc == 128);
    dw_recipe_block(DW_RECIPE_NVFP4, &br, &bc);
    assert_true(br == 1 && bc == 16);
    assert_int_equal(dw_recipe_elem_bits(DW_RECIPE_MXFP4), 4);
    assert_int_equal(dw_recipe_scale_bytes(DW_RECIPE_FP8_ROW), 4);
    assert_int_equal(dw_recipe_scale_bytes(DW_RECIPE_NVFP4), 1);
}

static void test_fp8_scales_by_hand(void **state) {
    (void)state;
    /* amax 896 -> s = 2: 896/2 = 448 (0x7E), -448/2 = -224 (0xF6), 1/2 (0x30), 0 */
    float x[4] = {896.0f, -448.0f, 1.0f, 0.0f};
    owned_q *o = quant(DW_RECIPE_FP8_TENSOR, DW_SCALE_RCEIL, false, x, 1, 4);
    assert_true(scale_f32(o, 0) == 2.0f);
    const uint8_t want[4] = {0x7E, 0xF6, 0x30, 0x00};
    assert_memory_equal(o->q.codes, want, 4);
    qfree(o);
    /* amax 1000: s = 1000/448 in FP32; pow2 rounds it up to 4 */
    float y[2] = {1000.0f, -3.0f};
    o = quant(DW_RECIPE_FP8_TENSOR, DW_SCALE_RCEIL, false, y, 1, 2);
    assert_true(scale_f32(o, 0) == 1000.0f / 448.0f);
    assert_int_equal(o->q.codes[0], 0x7E); /* 1000/s rounds to 448 */
    qfree(o);
    o = quant(DW_RECIPE_FP8_TENSOR, DW_SCALE_RCEIL, true, y, 1, 2);
    assert_true(scale_f32(o, 0) == 4.0f);
    assert_int_equal(o->q.codes[0], dw_encode_e4m3(250.0f));
    assert_int_equal(o->q.codes[1], dw_encode_e4m3(-0.75f));
    qfree(o);
    /* pow2 keeps an exact power of two: amax 448*8 -> s = 8 */
    float z[1] = {3584.0f};
    o = quant(DW_RECIPE_FP8_ROW, DW_SCALE_RCEIL, true, z, 1, 1);
    assert_true(scale_f32(o, 0) == 8.0f);
    qfree(o);
    /* all zero -> s = 1, codes keep the sign of zero; amax tiny enough that amax/448 underflows -> 1 */
    float zero[3] = {0.0f, -0.0f, 0.0f};
    o = quant(DW_RECIPE_FP8_BLOCK, DW_SCALE_RCEIL, false, zero, 1, 3);
    assert_true(scale_f32(o, 0) == 1.0f);
    assert_int_equal(o->q.codes[1], 0x80);
    qfree(o);
    float tiny[2] = {ldexpf(1, -149), 0.0f};
    o = quant(DW_RECIPE_FP8_BLOCK, DW_SCALE_RCEIL, true, tiny, 1, 2);
    assert_true(scale_f32(o, 0) == 1.0f);
    assert_int_equal(o->q.codes[0], 0);
    qfree(o);
    /* rows: one scale per row; NaN in row 1 and Inf in row 2 -> NaN scale and NaN codes there only */
    float rows[3 * 4] = {1, 2, 3, 4, 5, NAN, 7, 8, -INFINITY, 1, 1, 1};
    o = quant(DW_RECIPE_FP8_ROW, DW_SCALE_RCEIL, false, rows, 3, 4);
    assert_true(scale_f32(o, 0) == 4.0f / 448.0f);
    assert_int_equal(o->q.codes[3], 0x7E);
    for (int r = 1; r < 3; r++) {
        assert_int_equal(dw_rule_f2u(scale_f32(o, r)), 0x7FC00000u);
        for (int c = 0; c < 4; c++) assert_int_equal(o->q.codes[r * 4 + c], 0x7F);
    }
    qfree(o);
}

static void test_fp8_block2d_by_hand(void **state) {
    (void)state;
    /* 130 x 130: four blocks (128+2 each way); put a distinct amax in each block */
    const int64_t n = 130;
    float *x = calloc((size_t)(n * n), sizeof *x);
    x[5 * n + 7] = 448.0f * 2;     /* block (0,0) s = 2 */
    x[3 * n + 129] = -448.0f * 4;  /* block (0,1) s = 4 */
    x[129 * n + 0] = 448.0f / 2;   /* block (1,0) s = 0.5 */
    /* block (1,1) all zero: s = 1 */
    owned_q *o = quant(DW_RECIPE_FP8_BLOCK2D, DW_SCALE_RCEIL, false, x, n, n);
    assert_true(o->srows == 2 && o->scols == 2);
    assert_true(scale_f32(o, 0) == 2.0f && scale_f32(o, 1) == 4.0f);
    assert_true(scale_f32(o, 2) == 0.5f && scale_f32(o, 3) == 1.0f);
    assert_int_equal(o->q.codes[5 * n + 7], 0x7E);
    assert_int_equal(o->q.codes[3 * n + 129], 0xFE);
    assert_int_equal(o->q.codes[129 * n + 0], 0x7E);
    qfree(o);
    free(x);
}

static void test_mx_rules_by_hand(void **state) {
    (void)state;
    /* One row, 5 blocks of 32 (last one ragged: 8 elements). */
    const int cols = 4 * 32 + 8;
    float x[4 * 32 + 8];
    for (int i = 0; i < cols; i++) x[i] = 0.0f;
    x[0] = 480.0f;     /* block 0: amax 480: rceil e = ceil(log2(480/448)) = 1; floor e = 8-8 = 0 */
    x[1] = -1.0f;
    x[32] = 256.0f;    /* block 1: rceil ceil(log2(0.571..)) = 0; floor 8-8 = 0: both 127 */
    x[33] = -0.0f;
    x[64] = -0.0f;     /* block 2 is all zero (one -0): scale code 0 and +0 codes */
    x[96] = NAN;       /* block 3: NaN */
    x[97] = 3.0f;
    x[128] = 3.0f * ldexpf(1, -20); /* ragged block 4: amax 3*2^-20 */
    owned_q *rc = quant(DW_RECIPE_MXFP8, DW_SCALE_RCEIL, false, x, 1, cols);
    owned_q *fl = quant(DW_RECIPE_MXFP8, DW_SCALE_FLOOR, false, x, 1, cols);
    assert_int_equal(rc->scols, 5);
    assert_int_equal(scale_u8(rc, 0), 128);
    assert_int_equal(scale_u8(fl, 0), 127);
    assert_int_equal(rc->q.codes[0], 0x77);          /* 480/2 = 240 = 1.875*2^7 */
    assert_int_equal(fl->q.codes[0], 0x7E);          /* 480 saturates to 448 under floor */
    assert_int_equal(rc->q.codes[1], dw_encode_e4m3(-0.5f));
    assert_int_equal(fl->q.codes[1], dw_encode_e4m3(-1.0f));
    assert_int_equal(scale_u8(rc, 1), 127);
    assert_int_equal(scale_u8(fl, 1), 127);
    assert_int_equal(rc->q.codes[33], 0x80);         /* -0 in a non-zero block keeps its sign */
    assert_int_equal(scale_u8(rc, 2), 0);            /* all-zero block: code 0 ... */
    assert_int_equal(rc->q.codes[64], 0x00);         /* ... and +0 codes, even for -0 */
    assert_int_equal(scale_u8(rc, 3), 0xFF);
    assert_int_equal(scale_u8(fl, 3), 0xFF);
    for (int i = 96; i < 128; i++) assert_int_equal(rc->q.codes[i], 0x7F);
    /* ragged block 4: rceil: 3*2^-20/448 -> ceil(log2) = -20 + ceil(log2(3/448)) = -20-7 = -27;
     * floor: floor(log2(3*2^-20)) - 8 = -19 - 8 = -27 */
    assert_int_equal(scale_u8(rc, 4), 127 - 27);
    assert_int_equal(scale_u8(fl, 4), 127 - 27);
    assert_int_equal(rc->q.codes[128], dw_encode_e4m3(3.0f * ldexpf(1, 7)));
    qfree(rc);
    qfree(fl);
    /* rceil vs floor where rceil is smaller: amax = 300 = 1.17*2^8: floor 8-8 = 0, rceil
     * ceil(log2(300/448)) = 0 -> equal; amax = 449: floor 0, rceil 1 */
    float y[32] = {449.0f};
    rc = quant(DW_RECIPE_MXFP8, DW_SCALE_RCEIL, false, y, 1, 32);
    fl = quant(DW_RECIPE_MXFP8, DW_SCALE_FLOOR, false, y, 1, 32);
    assert_int_equal(scale_u8(rc, 0), 128);
    assert_int_equal(scale_u8(fl, 0), 127);
    qfree(rc);
    qfree(fl);
    /* E5M2: amax 2*57344 -> e = 1 under both rules (floor: 16 - 15); Inf block -> 0xFF, codes 0x7F */
    float z[64] = {114688.0f, -1.0f};
    z[40] = INFINITY;
    rc = quant(DW_RECIPE_MXFP8_E5M2, DW_SCALE_RCEIL, false, z, 1, 64);
    fl = quant(DW_RECIPE_MXFP8_E5M2, DW_SCALE_FLOOR, false, z, 1, 64);
    assert_int_equal(scale_u8(rc, 0), 128);
    assert_int_equal(scale_u8(fl, 0), 128);
    assert_int_equal(rc->q.codes[0], 0x7B);
    assert_int_equal(scale_u8(rc, 1), 0xFF);
    assert_int_equal(rc->q.codes[33], 0x7F);
    qfree(rc);
    qfree(fl);
    /* MXFP4: amax 6 -> e = 0; amax 7: rceil e = 1 (7/6 > 1), floor e = 2-2 = 0 (7 saturates to 6);
     * NaN block -> 0xFF with codes 0; a ragged block of 3 */
    float w[3 * 32 + 3] = {6.0f, -3.0f, 1.25f, 0.2f};
    w[32] = 7.0f;
    w[33] = -1.0f;
    w[64] = NAN;
    w[65] = 1.0f;
    w[96] = 0.75f;
    w[98] = -0.5f;
    rc = quant(DW_RECIPE_MXFP4, DW_SCALE_RCEIL, false, w, 1, 99);
    fl = quant(DW_RECIPE_MXFP4, DW_SCALE_FLOOR, false, w, 1, 99);
    assert_int_equal(scale_u8(rc, 0), 127);
    assert_int_equal(code4(rc, 0, 0), 0x7);
    assert_int_equal(code4(rc, 0, 1), 0xD);
    assert_int_equal(code4(rc, 0, 2), 0x2); /* 1.25 ties to 1.0 */
    assert_int_equal(code4(rc, 0, 3), 0x0); /* 0.2 -> 0 */
    assert_int_equal(scale_u8(rc, 1), 128);
    assert_int_equal(scale_u8(fl, 1), 127);
    assert_int_equal(code4(rc, 0, 32), 0x6);  /* 3.5 ties to 4 */
    assert_int_equal(code4(fl, 0, 32), 0x7);  /* saturates */
    assert_int_equal(code4(rc, 0, 33), 0x9);  /* -0.5 */
    assert_int_equal(scale_u8(rc, 2), 0xFF);
    assert_int_equal(code4(rc, 0, 65), 0x0);
    /* ragged: amax 0.75: rceil ceil(log2(0.125)) = -3; floor: -1 - 2 = -3 */
    assert_int_equal(scale_u8(rc, 3), 124);
    assert_int_equal(scale_u8(fl, 3), 124);
    assert_int_equal(code4(rc, 0, 96), 0x7);  /* 0.75*8 = 6 */
    assert_int_equal(code4(rc, 0, 98), 0xE);  /* -4 */
    assert_int_equal(rc->q.codes[49] >> 4, 0); /* odd cols: the last byte's high nibble is 0 */
    qfree(rc);
    qfree(fl);
}

static void test_nvfp4_two_levels(void **state) {
    (void)state;
    /* amax_tensor 168 -> s_t = 168/2688 = 1/16.
     * block 0 amax 168: b = UE4M3(168/(6/16)) = UE4M3(448) = 0x7E; d = 448/16 = 28
     * block 1 amax 3:   b = UE4M3(8) = 0x50; d = 0.5: 3 -> 6 (0x7), 1 -> 2 (0x4), -0.25 -> -0.5 (0x9)
     * block 2 all zero: b = 0, codes 0
     * block 3 ragged (2 elements), amax 0.01: b = UE4M3(0.01*16/6) */
    float x[16 * 3 + 2] = {168.0f, -14.0f, 42.0f};
    x[16] = 3.0f;
    x[17] = 1.0f;
    x[18] = -0.25f;
    x[48] = 0.01f;
    x[49] = -0.004f;
    owned_q *o = quant(DW_RECIPE_NVFP4, DW_SCALE_RCEIL, false, x, 1, 50);
    assert_true(o->q.tensor_scale == 0.0625f);
    assert_int_equal(o->scols, 4);
    assert_int_equal(scale_u8(o, 0), 0x7E);
    assert_int_equal(code4(o, 0, 0), 0x7);  /* 168/28 = 6 */
    assert_int_equal(code4(o, 0, 1), 0x9);  /* -14/28 = -0.5 */
    assert_int_equal(code4(o, 0, 2), 0x3);  /* 42/28 = 1.5 */
    assert_int_equal(scale_u8(o, 1), 0x50);
    assert_int_equal(code4(o, 0, 16), 0x7);
    assert_int_equal(code4(o, 0, 17), 0x4);
    assert_int_equal(code4(o, 0, 18), 0x9);
    assert_int_equal(scale_u8(o, 2), 0x00);
    assert_int_equal(code4(o, 0, 32), 0x0);
    float bq = 0.01f / (6.0f * 0.0625f);
    assert_int_equal(scale_u8(o, 3), dw_encode_ue4m3(bq));
    float d = dw_decode_ue4m3(scale_u8(o, 3)) * 0.0625f;
    assert_int_equal(code4(o, 0, 48), dw_encode_e2m1(0.01f / d));
    assert_int_equal(code4(o, 0, 49), dw_encode_e2m1(-0.004f / d));
    qfree(o);
    /* all-zero tensor: s_t = 1, scales 0, codes 0; NaN anywhere: s_t NaN, scales 0x7F, codes 0 */
    float z[20] = {0};
    o = quant(DW_RECIPE_NVFP4, DW_SCALE_RCEIL, false, z, 1, 20);
    assert_true(o->q.tensor_scale == 1.0f);
    assert_int_equal(scale_u8(o, 0), 0);
    assert_int_equal(scale_u8(o, 1), 0);
    qfree(o);
    z[3] = NAN;
    z[17] = 2.0f;
    o = quant(DW_RECIPE_NVFP4, DW_SCALE_RCEIL, false, z, 1, 20);
    assert_int_equal(dw_rule_f2u(o->q.tensor_scale), 0x7FC00000u);
    assert_int_equal(scale_u8(o, 0), 0x7F);
    assert_int_equal(scale_u8(o, 1), 0x7F);
    for (int c = 0; c < 20; c++) assert_int_equal(code4(o, 0, c), 0);
    qfree(o);
}

/* Ragged last blocks: the last block of a ragged row equals that piece quantised alone (for the
 * recipes whose scale depends only on the block). */
static void test_ragged_equals_alone(void **state) {
    (void)state;
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0x51);
    const dw_recipe rs[] = {DW_RECIPE_FP8_BLOCK, DW_RECIPE_MXFP8, DW_RECIPE_MXFP8_E5M2, DW_RECIPE_MXFP4};
    for (size_t k = 0; k < sizeof rs / sizeof rs[0]; k++) {
        int br, bc;
        dw_recipe_block(rs[k], &br, &bc);
        int64_t rows = 3, cols = bc * 2 + 1 + (int64_t)(dw_test_next(&rng) % (uint64_t)(bc - 1));
        float *x = malloc((size_t)(rows * cols) * sizeof *x);
        for (int64_t i = 0; i < rows * cols; i++) x[i] = dw_test_normal(&rng) * 10.0f;
        owned_q *o = quant(rs[k], DW_SCALE_RCEIL, false, x, rows, cols);
        int64_t tail = cols - 2 * bc;
        for (int64_t r = 0; r < rows; r++) {
            owned_q *t = quant(rs[k], DW_SCALE_RCEIL, false, x + r * cols + 2 * bc, 1, tail);
            if (dw_recipe_scale_bytes(rs[k]) == 4) assert_true(scale_f32(o, r * 3 + 2) == scale_f32(t, 0));
            else assert_int_equal(scale_u8(o, r * 3 + 2), scale_u8(t, 0));
            for (int64_t c = 0; c < tail; c++) {
                if (dw_recipe_elem_bits(rs[k]) == 4) assert_int_equal(code4(o, r, 2 * bc + c), code4(t, 0, c));
                else assert_int_equal(o->q.codes[r * cols + 2 * bc + c], t->q.codes[c]);
            }
            qfree(t);
        }
        qfree(o);
        free(x);
    }
}

/* Half an ulp of the element format at |v| (saturating at max), times the block's scale. */
static double elem_err_bound(dw_recipe r, double v) {
    int mbits = r == DW_RECIPE_MXFP8_E5M2 ? 2 : (r == DW_RECIPE_MXFP4 || r == DW_RECIPE_NVFP4) ? 1 : 3;
    int emin = r == DW_RECIPE_MXFP8_E5M2 ? -14 : (r == DW_RECIPE_MXFP4 || r == DW_RECIPE_NVFP4) ? 0 : -6;
    double maxv = r == DW_RECIPE_MXFP8_E5M2 ? 57344 : (r == DW_RECIPE_MXFP4 || r == DW_RECIPE_NVFP4) ? 6 : 448;
    double a = fabs(v);
    if (a > maxv) return a - maxv;
    int e = a > 0 ? (int)floor(log2(a)) : emin;
    if (e < emin) e = emin;
    return ldexp(1.0, e - mbits - 1);
}

static void test_dequant_error_bounds(void **state) {
    (void)state;
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0xE77);
    const int64_t rows = 37, cols = 300; /* ragged for every block size */
    float *x = malloc((size_t)(rows * cols) * sizeof *x), *y = malloc((size_t)(rows * cols) * sizeof *y);
    for (int i = 0; i < rows * cols; i++)
        x[i] = dw_test_normal(&rng) * ldexpf(1.0f, (int)(dw_test_next(&rng) % 21) - 10);
    for (int ri = 1; ri < DW_RECIPE_COUNT; ri++) {
        for (int variant = 0; variant < 2; variant++) {
            dw_recipe r = (dw_recipe)ri;
            dw_scale_rounding rnd = variant ? DW_SCALE_FLOOR : DW_SCALE_RCEIL;
            owned_q *o = quant(r, rnd, variant == 1, x, rows, cols);
            dw_dequantize_cpu(&o->q, y);
            int br, bc;
            dw_recipe_block(r, &br, &bc);
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < cols; j++) {
                    int64_t s = (br ? i / br : 0) * o->scols + (bc ? j / bc : 0);
                    double scale;
                    if (dw_recipe_scale_bytes(r) == 4) scale = scale_f32(o, s);
                    else if (r == DW_RECIPE_NVFP4)
                        scale = (double)dw_decode_ue4m3(scale_u8(o, s)) * o->q.tensor_scale;
                    else scale = dw_decode_ue8m0(scale_u8(o, s));
                    double xv = x[i * cols + j], err = fabs((double)y[i * cols + j] - xv);
                    double bound = scale > 0 ? scale * elem_err_bound(r, xv / scale) : fabs(xv);
                    /* + FP32 rounding of the quotient and of the dequantised product */
                    bound += fabs(xv) * 1e-6 + 1e-30;
                    if (!(err <= bound))
                        fail_msg("%s%s: x[%lld,%lld] = %g -> %g (err %g > %g)", dw_recipe_name(r),
                                 variant ? " floor/pow2" : "", (long long)i, (long long)j, xv,
                                 (double)y[i * cols + j], err, bound);
                }
            /* relative error of the whole tensor, as a sanity level per format */
            double num = 0, den = 0;
            for (int64_t k = 0; k < rows * cols; k++) {
                num += ((double)y[k] - x[k]) * ((double)y[k] - x[k]);
                den += (double)x[k] * x[k];
            }
            double rel = sqrt(num / den);
            double lim = dw_recipe_elem_bits(r) == 4 ? 0.2 : r == DW_RECIPE_MXFP8_E5M2 ? 0.1 : 0.05;
            if (r == DW_RECIPE_FP8_TENSOR || r == DW_RECIPE_FP8_ROW) lim = 0.5; /* wide range, one scale */
            if (!(rel < lim)) fail_msg("%s: relative error %g", dw_recipe_name(r), rel);
            qfree(o);
        }
    }
    free(x);
    free(y);
}

static void test_transposed_copy(void **state) {
    (void)state;
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0x7A);
    const int64_t rows = 70, cols = 150;
    float *x = malloc((size_t)(rows * cols) * sizeof *x);
    for (int i = 0; i < rows * cols; i++) x[i] = dw_test_normal(&rng);
    /* fp8_tensor / block2d: same blocks both ways, so codes and scales are exact transposes */
    const dw_recipe same[] = {DW_RECIPE_FP8_TENSOR, DW_RECIPE_FP8_BLOCK2D};
    for (size_t k = 0; k < 2; k++) {
        owned_q *o = quant(same[k], DW_SCALE_RCEIL, false, x, rows, cols);
        owned_q *t = qalloc(same[k], cols, rows);
        dw_quant_opts opts = {.recipe = same[k]};
        assert_int_equal(dw_quantize_transposed_cpu(NULL, &opts, x, rows, cols, &t->q), DW_OK);
        assert_true(t->q.rows == cols && t->q.cols == rows);
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++)
                assert_int_equal(o->q.codes[i * cols + j], t->q.codes[j * rows + i]);
        assert_true(t->srows == o->scols && t->scols == o->srows);
        for (int64_t i = 0; i < o->srows; i++)
            for (int64_t j = 0; j < o->scols; j++)
                assert_true(scale_f32(o, i * o->scols + j) == scale_f32(t, j * t->scols + i));
        qfree(o);
        qfree(t);
    }
    /* mxfp8: the copy's scale (j, b) is the MX rule over x[32b .. 32b+31, j] (a column piece) */
    owned_q *t = qalloc(DW_RECIPE_MXFP8, cols, rows);
    dw_quant_opts opts = {.recipe = DW_RECIPE_MXFP8};
    assert_int_equal(dw_quantize_transposed_cpu(NULL, &opts, x, rows, cols, &t->q), DW_OK);
    assert_int_equal(t->scols, 3);
    float piece[32];
    for (int64_t j = 0; j < cols; j += 7)
        for (int64_t b = 0; b < 3; b++) {
            int64_t n = b == 2 ? rows - 64 : 32;
            for (int64_t k = 0; k < n; k++) piece[k] = x[(32 * b + k) * cols + j];
            owned_q *p = quant(DW_RECIPE_MXFP8, DW_SCALE_RCEIL, false, piece, 1, n);
            assert_int_equal(scale_u8(t, j * 3 + b), scale_u8(p, 0));
            assert_memory_equal(t->q.codes + j * rows + 32 * b, p->q.codes, (size_t)n);
            qfree(p);
        }
    qfree(t);
    free(x);
}

static void test_swizzle_layout(void **state) {
    (void)state;
    /* Worked values from the cuBLAS block-scale layout: operand [128, 128] NVFP4 -> scales
     * [128, 8]: scale (5, 2) at byte 82, scale (5, 5) at byte 593 (second 128x4 tile). */
    assert_int_equal(dw_scale_swizzle_offset(5, 2, 8), 82);
    assert_int_equal(dw_scale_swizzle_offset(5, 5, 8), 593);
    assert_int_equal(dw_scale_swizzle_offset(33, 1, 4), 16 + 4 + 1);
    assert_int_equal(dw_scale_swizzle_offset(130, 0, 8), 2 * 512 + 2 * 16);
    assert_int_equal(dw_scale_swizzle_offset(127, 3, 3), 31 * 16 + 3 * 4 + 3);
    /* ragged: [200, 6] pads to [256, 8]; every offset distinct and in range; padding is 0 */
    const int64_t sr = 200, sc = 6;
    size_t n = dw_scale_swizzled_bytes(sr, sc);
    assert_int_equal(n, 256 * 8);
    uint8_t *in = malloc((size_t)(sr * sc)), *out = malloc(n), *seen = calloc(n, 1);
    for (int64_t i = 0; i < sr * sc; i++) in[i] = (uint8_t)(1 + i % 251);
    dw_scale_swizzle_cpu(in, sr, sc, out);
    size_t nonzero = 0;
    for (int64_t r = 0; r < sr; r++)
        for (int64_t c = 0; c < sc; c++) {
            int64_t off = dw_scale_swizzle_offset(r, c, sc);
            assert_true(off >= 0 && (size_t)off < n);
            assert_int_equal(seen[off], 0);
            seen[off] = 1;
            assert_int_equal(out[off], in[r * sc + c]);
        }
    for (size_t i = 0; i < n; i++) nonzero += out[i] != 0;
    assert_int_equal(nonzero, (size_t)(sr * sc));
    free(in);
    free(out);
    free(seen);
}

static void test_bf16_recipe_and_input(void **state) {
    (void)state;
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0xB16);
    const int64_t rows = 5, cols = 77;
    float x[5 * 77];
    uint16_t xb[5 * 77];
    for (int i = 0; i < rows * cols; i++) {
        xb[i] = dw_encode_bf16(dw_test_normal(&rng) * 3.0f);
        x[i] = dw_decode_bf16(xb[i]);
    }
    for (int ri = 0; ri < DW_RECIPE_COUNT; ri++) {
        dw_recipe r = (dw_recipe)ri;
        owned_q *a = quant(r, DW_SCALE_RCEIL, false, x, rows, cols);
        owned_q *b = qalloc(r, rows, cols);
        dw_quant_opts opts = {.recipe = r};
        assert_int_equal(dw_quantize_bf16_cpu(NULL, &opts, xb, rows, cols, &b->q), DW_OK);
        assert_memory_equal(a->q.codes, b->q.codes, dw_quant_codes_bytes(r, rows, cols));
        if (dw_quant_scales_bytes(r, rows, cols))
            assert_memory_equal(a->q.scales, b->q.scales, dw_quant_scales_bytes(r, rows, cols));
        qfree(a);
        qfree(b);
    }
    /* the BF16 recipe stores BF16 codes */
    owned_q *o = quant(DW_RECIPE_BF16, DW_SCALE_RCEIL, false, x, rows, cols);
    assert_memory_equal(o->q.codes, xb, sizeof xb);
    qfree(o);
}

static void test_bad_arguments(void **state) {
    (void)state;
    float x[4] = {0};
    owned_q *o = qalloc(DW_RECIPE_MXFP8, 1, 4);
    dw_quant_opts opts = {.recipe = DW_RECIPE_MXFP8};
    assert_int_equal(dw_quantize_cpu(NULL, &opts, x, 0, 4, &o->q), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(NULL), "mxfp8"));
    opts.recipe = (dw_recipe)99;
    assert_int_equal(dw_quantize_cpu(NULL, &opts, x, 1, 4, &o->q), DW_ERR_INVALID);
    qfree(o);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_fp8_scales_by_hand),
        cmocka_unit_test(test_fp8_block2d_by_hand),
        cmocka_unit_test(test_mx_rules_by_hand),
        cmocka_unit_test(test_nvfp4_two_levels),
        cmocka_unit_test(test_ragged_equals_alone),
        cmocka_unit_test(test_dequant_error_bounds),
        cmocka_unit_test(test_transposed_copy),
        cmocka_unit_test(test_swizzle_layout),
        cmocka_unit_test(test_bf16_recipe_and_input),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
