/* test_quant_counts.c — the quantisers' overflow / underflow counters on the CPU
 * (precision/quant_counts.c) against independent counts, on fresh random tensors with planted
 * values:
 *   - every recipe, row-wise and transposed, RCEIL and FLOOR MX scales (FLOOR saturates: planted
 *     block maxima with a mantissa above the format's largest), power-of-two FP8 scales, planted
 *     values 1e-12 of the spread (they flush in every format unless alone in a ragged block),
 *     exact zeros (never counted), ragged shapes: the counts equal dw_quant_error's `saturated`
 *     and `flushed` (its own quantisation and dequantisation, io/safetensors_quant.c);
 *   - fp8_tensor under delayed scaling (the history's amax below the tensor's): exactly the
 *     planted count of values beyond 464 x scale, and of those below the smallest code's half;
 *   - the NVFP4 training recipe's quantiser (16x16 weight blocks, stochastic rounding): the
 *     counts equal a brute-force count over its exact dequantisation written here.
 * The CUDA counters against these: tests/gpu/test_quant_counts_cuda.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deepwell.h"
#include "formats/formats.h"
#include "kernels/cpu/nvfp4_train_cpu.h"
#include "precision/amax_history.h"
#include "precision/quant_counts.h"
#include "testutil.h"

#define ctx dw_test_ctx
#define rng dw_test_group_rng

typedef struct {
    dw_qtensor q;
    float *y;
} quantised;

static quantised alloc_q(dw_recipe r, int64_t R, int64_t C) {
    quantised a = {.q = {.recipe = r, .rows = R, .cols = C}};
    a.q.codes = calloc(dw_quant_codes_bytes(r, R, C) + 1, 1);
    a.q.scales = calloc(dw_quant_scales_bytes(r, R, C) + 4, 1);
    a.y = malloc((size_t)(R * C) * sizeof *a.y);
    return a;
}
static void free_q(quantised *a) { free(a->q.codes), free(a->q.scales), free(a->y); }

/* x [rows, cols]: normal values with, per 16 elements, now and then a planted tiny value (1e-12 of
 * the largest magnitude around it), an exact zero, or (floor) a block maximum 1.9 x 2^k; *tiny
 * counts the planted tiny ones. */
static float *planted(int64_t rows, int64_t cols, int *tiny) {
    float *x = malloc((size_t)(rows * cols) * sizeof *x);
    *tiny = 0;
    const float spread = powf(2.0f, (float)dw_test_rnd(-20, 20));
    for (int64_t i = 0; i < rows * cols; i++) x[i] = spread * dw_test_normal(&rng);
    for (int64_t i = 0; i < rows * cols; i++) {
        const int64_t pick = dw_test_rnd(0, 40);
        if (pick == 0) x[i] = 0.0f;
        else if (pick == 1) x[i] = (dw_test_rnd(0, 1) ? 1e-12f : -1e-12f) * spread, ++*tiny;
        else if (pick == 2) x[i] = (dw_test_rnd(0, 1) ? 1.9f : -1.9f) * spread * 8.0f; /* mantissa 1.9: saturates FLOOR */
    }
    return x;
}

/* The planted tiny values of v [R, C] (0 < |v| <= 1e-11 of its largest) with a value over 1e-6 of
 * the largest in the same aligned run of 16 in their row. */
static int64_t planted_beside_normal(const float *v, int64_t R, int64_t C) {
    float amax = 0.0f;
    for (int64_t i = 0; i < R * C; i++) amax = fmaxf(amax, fabsf(v[i]));
    int64_t n = 0;
    for (int64_t i = 0; i < R; i++)
        for (int64_t j = 0; j < C; j++) {
            const float a = fabsf(v[i * C + j]);
            if (!(a > 0.0f && a <= 1e-11f * amax)) continue;
            bool normal = false;
            for (int64_t k = j / 16 * 16; k < j / 16 * 16 + 16 && k < C; k++) normal |= fabsf(v[i * C + k]) > 1e-6f * amax;
            n += normal;
        }
    return n;
}

static void test_recipes_against_quant_error(void **state) {
    (void)state;
    for (int r = 0; r < DW_RECIPE_COUNT; r++) {
        if (r == DW_RECIPE_BF16) continue;
        for (int variant = 0; variant < 4; variant++) {
            const bool trans = variant & 1, alt = variant & 2; /* alt: FLOOR MX scales / power-of-two FP8 scales */
            const int64_t rows = dw_test_rnd(1, 150), cols = dw_test_rnd(1, 150);
            int tiny = 0;
            float *x = planted(rows, cols, &tiny);
            const dw_quant_opts o = {.recipe = (dw_recipe)r, .rounding = alt ? DW_SCALE_FLOOR : DW_SCALE_RCEIL, .pow2 = alt};
            const int64_t R = trans ? cols : rows, C = trans ? rows : cols;
            quantised a = alloc_q((dw_recipe)r, R, C);
            if (trans) assert_int_equal(dw_quantize_transposed_cpu(ctx, &o, x, rows, cols, &a.q), DW_OK);
            else assert_int_equal(dw_quantize_cpu(ctx, &o, x, rows, cols, &a.q), DW_OK);
            uint64_t cnt[DW_QC_WORDS] = {0};
            dw_qcounts_add_cpu(&a.q, x, trans, a.y, cnt);
            /* the oracle: dw_quant_error on the view the quantiser saw */
            float *v = malloc((size_t)(R * C) * sizeof *v);
            for (int64_t i = 0; i < R; i++)
                for (int64_t j = 0; j < C; j++) v[i * C + j] = trans ? x[j * cols + i] : x[i * cols + j];
            dw_quantize_opts po;
            dw_quantize_opts_init(&po, sizeof po);
            po.recipe = r, po.rounding = o.rounding, po.pow2 = o.pow2;
            dw_quant_stats s = {.size = sizeof s};
            assert_int_equal(dw_quant_error(ctx, &po, v, R, C, &s), DW_OK);
            if (cnt[DW_QC_OVER] != (uint64_t)s.saturated || cnt[DW_QC_UNDER] != (uint64_t)s.flushed)
                fail_msg("%s %s%s [%lld, %lld]: counted %llu over, %llu under; dw_quant_error %lld, %lld",
                         dw_recipe_name((dw_recipe)r), trans ? "transposed " : "", alt ? "floor/pow2" : "rceil",
                         (long long)rows, (long long)cols, (unsigned long long)cnt[DW_QC_OVER],
                         (unsigned long long)cnt[DW_QC_UNDER], (long long)s.saturated, (long long)s.flushed);
            /* every recipe's block holds whole aligned 16-element runs of a row of the quantised view: a
             * planted tiny value (1e-12 of the spread) beside a normal one (over 1e-6 of the tensor's
             * largest) in its run shares a scale at least 1e6 times its own and must flush (one alone
             * in a ragged block sets its own scale and need not) */
            const int64_t flushable = planted_beside_normal(v, R, C);
            if ((int64_t)cnt[DW_QC_UNDER] < flushable)
                fail_msg("%s %s%s [%lld, %lld]: %lld planted tiny values beside a normal one, %llu counted as flushed",
                         dw_recipe_name((dw_recipe)r), trans ? "transposed " : "", alt ? "floor/pow2" : "rceil",
                         (long long)rows, (long long)cols, (long long)flushable, (unsigned long long)cnt[DW_QC_UNDER]);
            (void)tiny;
            assert_true(cnt[DW_QC_N] == (uint64_t)(R * C)); /* the elements, the guard's denominator */
            if (variant == 0 && r == DW_RECIPE_MXFP8)
                print_message("mxfp8 [%lld, %lld]: %llu over, %llu under (%d planted tiny)\n", (long long)rows,
                              (long long)cols, (unsigned long long)cnt[0], (unsigned long long)cnt[1], tiny);
            free(v), free(x);
            free_q(&a);
        }
    }
}

/* Floor MX scales saturate a block maximum whose mantissa lies above the format's largest:
 * planted such maxima are all counted (the check above is an equality; this makes it non-zero). */
static void test_floor_saturates(void **state) {
    (void)state;
    const int64_t rows = 4, cols = 64;
    float x[4 * 64];
    for (int i = 0; i < rows * cols; i++) x[i] = 0.25f * dw_test_uniform(&rng, -1.0f, 1.0f);
    int planted_max = 0;
    for (int b = 0; b < rows * cols / 32; b++) x[b * 32 + (int)dw_test_rnd(0, 31)] = 1.9f * 4.0f, planted_max++;
    const dw_quant_opts o = {.recipe = DW_RECIPE_MXFP8, .rounding = DW_SCALE_FLOOR};
    quantised a = alloc_q(DW_RECIPE_MXFP8, rows, cols);
    assert_int_equal(dw_quantize_cpu(ctx, &o, x, rows, cols, &a.q), DW_OK);
    uint64_t cnt[DW_QC_WORDS] = {0};
    dw_qcounts_add_cpu(&a.q, x, false, a.y, cnt);
    assert_int_equal(cnt[DW_QC_OVER], planted_max); /* 7.6 / 2^-6 = 486.4 > 464 */
    free_q(&a);
}

/* fp8_tensor under delayed scaling: the history's amax A, values of the bulk in (A/100, A/2),
 * planted overflows 2..3 A, planted underflows A x 1e-7 (x / s = 4.5e-5, below 2^-10), zeros. */
static void test_delayed_scaling(void **state) {
    (void)state;
    for (int trial = 0; trial < 20; trial++) {
        const int64_t rows = dw_test_rnd(1, 40), cols = dw_test_rnd(1, 40);
        const bool trans = dw_test_rnd(0, 1);
        const float A = powf(2.0f, (float)dw_test_rnd(-10, 10)) * dw_test_uniform(&rng, 1.0f, 2.0f);
        float *x = malloc((size_t)(rows * cols) * sizeof *x);
        uint64_t over = 0, under = 0;
        for (int64_t i = 0; i < rows * cols; i++) {
            const float sign = dw_test_rnd(0, 1) ? 1.0f : -1.0f;
            const int64_t pick = dw_test_rnd(0, 9);
            if (pick == 0) x[i] = sign * A * dw_test_uniform(&rng, 2.0f, 3.0f), over++;
            else if (pick == 1) x[i] = sign * A * 1e-7f, under++;
            else if (pick == 2) x[i] = 0.0f;
            else x[i] = sign * A * dw_test_uniform(&rng, 0.01f, 0.5f);
        }
        uint32_t h[DW_AMAX_WORDS(2)] = {0};
        memcpy(&h[DW_AMAX_HIST], &A, sizeof A);
        quantised a = alloc_q(DW_RECIPE_FP8_TENSOR, trans ? cols : rows, trans ? rows : cols);
        assert_int_equal(dw_amax_quantize_cpu(ctx, h, true, x, rows, cols, trans, &a.q), DW_OK);
        uint64_t cnt[DW_QC_WORDS] = {0};
        dw_qcounts_add_cpu(&a.q, x, trans, a.y, cnt);
        if (cnt[DW_QC_OVER] != over || cnt[DW_QC_UNDER] != under)
            fail_msg("delayed [%lld, %lld]%s: counted %llu over, %llu under; planted %llu, %llu", (long long)rows,
                     (long long)cols, trans ? " transposed" : "", (unsigned long long)cnt[0], (unsigned long long)cnt[1],
                     (unsigned long long)over, (unsigned long long)under);
        free(x);
        free_q(&a);
    }
}

/* The NVFP4 training recipe's quantiser (2-D weight blocks, stochastic rounding), counted against
 * a brute-force count over its exact dequantisation: the definitions spelled out here. */
static void test_nvfp4_recipe(void **state) {
    (void)state;
    for (int trial = 0; trial < 12; trial++) {
        const int64_t rows = 16 * dw_test_rnd(1, 6), cols = 16 * dw_test_rnd(1, 6);
        int tiny = 0;
        float *x = planted(rows, cols, &tiny);
        const dw_nvfp4_qopts o = {.trans = trial & 1, .block2d = trial & 2, .sr = trial & 4, .seed = dw_test_next(&rng),
                                  .stream = (uint32_t)trial, .step_from_scale = true};
        const int64_t R = o.trans ? cols : rows, C = o.trans ? rows : cols;
        quantised a = alloc_q(DW_RECIPE_NVFP4, R, C);
        assert_int_equal(dw_nvfp4_quantize_cpu(ctx, &o, x, rows, cols, &a.q), DW_OK);
        uint64_t cnt[DW_QC_WORDS] = {0};
        dw_qcounts_add_cpu(&a.q, x, o.trans, a.y, cnt);
        dw_dequantize_cpu(&a.q, a.y);
        uint64_t over = 0, under = 0;
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < C; j++) {
                const double v = o.trans ? x[j * cols + i] : x[i * cols + j], y = a.y[i * C + j];
                const unsigned code = (a.q.codes[i * ((C + 1) / 2) + j / 2] >> (4 * (j & 1))) & 7u;
                over += code == 7u && fabs(v) > fabs(y) * 7.0 / 6.0;
                under += v != 0 && y == 0;
            }
        if (cnt[0] != over || cnt[1] != under)
            fail_msg("nvfp4 recipe (trans %d, 2d %d, sr %d): counted %llu, %llu; brute force %llu, %llu", o.trans,
                     o.block2d, o.sr, (unsigned long long)cnt[0], (unsigned long long)cnt[1], (unsigned long long)over,
                     (unsigned long long)under);
        assert_true(cnt[1] >= (uint64_t)tiny);
        free(x);
        free_q(&a);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recipes_against_quant_error),
        cmocka_unit_test(test_floor_saturates),
        cmocka_unit_test(test_delayed_scaling),
        cmocka_unit_test(test_nvfp4_recipe),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
