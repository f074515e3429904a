/* test_safetensors_quant.c — the quantize/quant-report helpers: which tensors qualify for which
 * recipe, the error statistics (saturation beyond the rounding boundary, flush to zero, exact and
 * all-zero inputs), and whole-file quantisation's refusals (name clashes, already quantised). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors_quant.h"
#include "deepwell.h"
#include "testutil.h"

static dw_ctx *new_ctx(void) {
    dw_ctx *ctx = NULL;
    dw_ctx_opts o = {.device = DW_DEVICE_CPU};
    assert_int_equal(dw_ctx_create(&o, &ctx), DW_OK);
    return ctx;
}

static void test_qualifies(void **state) {
    (void)state;
    static const struct {
        dw_dtype dt;
        int ndim;
        int64_t shape[3];
        dw_recipe r;
        bool ok;
        int64_t rows, cols;
    } cases[] = {
        {DW_DT_F32, 2, {4, 64}, DW_RECIPE_MXFP8, true, 4, 64},
        {DW_DT_BF16, 1, {32}, DW_RECIPE_MXFP4, true, 1, 32},
        {DW_DT_F16, 2, {3, 16}, DW_RECIPE_NVFP4, true, 3, 16},
        {DW_DT_F16, 2, {3, 24}, DW_RECIPE_NVFP4, false, 0, 0},
        {DW_DT_F32, 2, {3, 5}, DW_RECIPE_FP8_TENSOR, true, 3, 5},
        {DW_DT_F32, 2, {3, 5}, DW_RECIPE_FP8_ROW, true, 3, 5},
        {DW_DT_F32, 2, {3, 128}, DW_RECIPE_FP8_BLOCK, true, 3, 128},
        {DW_DT_F32, 2, {3, 64}, DW_RECIPE_FP8_BLOCK, false, 0, 0},
        {DW_DT_F32, 2, {128, 256}, DW_RECIPE_FP8_BLOCK2D, true, 128, 256},
        {DW_DT_F32, 2, {64, 256}, DW_RECIPE_FP8_BLOCK2D, false, 0, 0},
        {DW_DT_F32, 1, {128}, DW_RECIPE_FP8_BLOCK2D, false, 0, 0},
        {DW_DT_F32, 3, {2, 2, 32}, DW_RECIPE_MXFP8, false, 0, 0},
        {DW_DT_F32, 0, {0}, DW_RECIPE_FP8_TENSOR, false, 0, 0},
        {DW_DT_F32, 2, {0, 32}, DW_RECIPE_MXFP8, false, 0, 0},
        {DW_DT_F64, 2, {1, 32}, DW_RECIPE_MXFP8, false, 0, 0},
        {DW_DT_F8_E4M3, 2, {1, 32}, DW_RECIPE_MXFP8, false, 0, 0},
        {DW_DT_I32, 2, {1, 32}, DW_RECIPE_FP8_TENSOR, false, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dw_st_tensor t = {.name = "t", .dtype = cases[i].dt, .ndim = cases[i].ndim};
        memcpy(t.shape, cases[i].shape, sizeof cases[i].shape);
        int64_t R = 0, C = 0;
        const char *why = NULL;
        bool ok = dw_stq_qualifies(&t, cases[i].r, &R, &C, &why);
        if (ok != cases[i].ok) fail_msg("case %zu: qualifies=%d", i, ok);
        if (ok) {
            assert_int_equal(R, cases[i].rows);
            assert_int_equal(C, cases[i].cols);
        } else {
            assert_non_null(why);
        }
    }
}

static void test_stats(void **state) {
    (void)state;
    dw_ctx *ctx = new_ctx();
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed());
    /* mxfp8 with the OCP floor rule: amax = 509/256 gives e = -8, so 509 > 464 is clipped to 448
     * (saturated); 460/256 rounds to 448 within the boundary (not saturated); 1e-6 flushes. */
    float x[32], y[32];
    for (int i = 0; i < 32; i++) x[i] = dw_test_uniform(&rng, -1.0f, 1.0f);
    x[3] = 509.0f / 256;
    x[9] = -460.0f / 256;
    x[17] = 1e-6f;
    x[20] = 0;
    dw_quant_opts o = {.recipe = DW_RECIPE_MXFP8, .rounding = DW_SCALE_FLOOR};
    dw_qtensor q;
    assert_int_equal(dw_stq_quantize(ctx, &o, x, 1, 32, &q, y), DW_OK);
    dw_quant_stats s = {.size = sizeof s};
    dw_stq_stats_add(&s, &q, x, y);
    assert_int_equal(s.n, 32);
    assert_int_equal(s.saturated, 1);
    assert_true(y[3] == 448.0f / 256 && y[9] == -448.0f / 256);
    assert_true(s.flushed >= 1 && y[17] == 0);
    double sx = 0, se = 0, mx = 0;
    for (int i = 0; i < 32; i++) {
        double e = (double)x[i] - y[i];
        sx += (double)x[i] * x[i];
        se += e * e;
        mx = fmax(mx, fabs(e));
    }
    assert_true(fabs(dw_quant_stats_sqnr_db(&s) - 10 * log10(sx / se)) < 1e-9);
    assert_true(fabs(dw_quant_stats_rel_err(&s) - sqrt(se / sx)) < 1e-12);
    assert_true(s.max_abs == mx);
    dw_stq_free(&q);
    /* rceil never clips */
    o.rounding = DW_SCALE_RCEIL;
    assert_int_equal(dw_stq_quantize(ctx, &o, x, 1, 32, &q, y), DW_OK);
    dw_quant_stats r = {.size = sizeof r};
    dw_stq_stats_add(&r, &q, x, y);
    assert_int_equal(r.saturated, 0);
    dw_stq_free(&q);
    /* exactly representable: infinite SQNR, zero error; all zero: SQNR undefined */
    float ex[4] = {448, -1, 2, 0.5f}, ey[4];
    o = (dw_quant_opts){.recipe = DW_RECIPE_FP8_TENSOR};
    assert_int_equal(dw_stq_quantize(ctx, &o, ex, 1, 4, &q, ey), DW_OK);
    dw_quant_stats e = {.size = sizeof e};
    dw_stq_stats_add(&e, &q, ex, ey);
    dw_stq_free(&q);
    assert_true(isinf(dw_quant_stats_sqnr_db(&e)) && dw_quant_stats_rel_err(&e) == 0 && e.max_abs == 0);
    float zx[4] = {0}, zy[4];
    assert_int_equal(dw_stq_quantize(ctx, &o, zx, 1, 4, &q, zy), DW_OK);
    dw_quant_stats z = {.size = sizeof z};
    dw_stq_stats_add(&z, &q, zx, zy);
    dw_stq_free(&q);
    assert_true(isnan(dw_quant_stats_sqnr_db(&z)) && dw_quant_stats_rel_err(&z) == 0);
    /* merging is element-weighted */
    dw_quant_stats m = {.size = sizeof m};
    dw_quant_stats_merge(&m, &s);
    dw_quant_stats_merge(&m, &e);
    assert_int_equal(m.n, 36);
    assert_true(m.sum_e2 == s.sum_e2 && m.sum_x2 == s.sum_x2 + e.sum_x2 && m.saturated == 1);
    dw_ctx_free(ctx);
}

static char *write_file(dw_ctx *ctx, const char *dir, const char *name, const char *t2name,
                        const char *meta_key) {
    float w[32] = {1, 2, 3};
    uint8_t sc[1] = {127};
    int64_t shape[2] = {1, 32}, sshape[2] = {1, 1};
    dw_st_writer *wr = NULL;
    assert_int_equal(dw_st_writer_create(ctx, &wr), DW_OK);
    assert_int_equal(dw_st_writer_add(ctx, wr, "w", DW_DT_F32, 2, shape, w, sizeof w), DW_OK);
    if (t2name) assert_int_equal(dw_st_writer_add(ctx, wr, t2name, DW_DT_U8, 2, sshape, sc, 1), DW_OK);
    if (meta_key) assert_int_equal(dw_st_writer_set_metadata(ctx, wr, meta_key, "mxfp8"), DW_OK);
    char *path = dw_test_path(dir, name);
    assert_int_equal(dw_st_writer_commit(ctx, wr, path), DW_OK);
    dw_st_writer_free(wr);
    return path;
}

static void test_file_refusals(void **state) {
    (void)state;
    dw_ctx *ctx = new_ctx();
    char *dir = dw_test_tmpdir();
    char *out = dw_test_path(dir, "out.safetensors");
    dw_quantize_opts o;
    dw_quantize_opts_init(&o, sizeof o);
    o.recipe = DW_RECIPE_MXFP8;
    char *clash = write_file(ctx, dir, "clash.safetensors", "w.scale", NULL);
    assert_int_equal(dw_quantize_file(ctx, clash, out, &o, NULL, NULL, NULL), DW_ERR_FORMAT);
    assert_non_null(strstr(dw_errmsg(ctx), "clash.safetensors: tensor 'w'"));
    assert_non_null(strstr(dw_errmsg(ctx), "'w.scale' already exists"));
    char *done = write_file(ctx, dir, "done.safetensors", NULL, "deepwell.recipe");
    assert_int_equal(dw_quantize_file(ctx, done, out, &o, NULL, NULL, NULL), DW_ERR_FORMAT);
    assert_non_null(strstr(dw_errmsg(ctx), "already quantised"));
    char *fine = write_file(ctx, dir, "fine.safetensors", "w.other", NULL);
    dw_quantize_summary sum = {.size = sizeof sum};
    assert_int_equal(dw_quantize_file(ctx, fine, out, &o, NULL, NULL, &sum), DW_OK);
    assert_int_equal(sum.quantized, 1);
    assert_int_equal(sum.copied, 1);
    dw_st_file *f = NULL;
    assert_int_equal(dw_st_open(ctx, out, &f), DW_OK);
    assert_int_equal(dw_st_count(f), 3);
    assert_int_equal(dw_st_find(f, "w")->dtype, DW_DT_F8_E4M3);
    assert_int_equal(dw_st_find(f, "w.scale")->dtype, DW_DT_U8);
    assert_string_equal(dw_st_metadata(f, "deepwell.recipe"), "mxfp8");
    dw_st_close(f);
    free(clash);
    free(done);
    free(fine);
    free(out);
    dw_test_rmtree(dir);
    free(dir);
    dw_ctx_free(ctx);
}

int main(void) {
    dw_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qualifies),
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_file_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
