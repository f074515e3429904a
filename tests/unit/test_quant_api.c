/* test_quant_api.c — the public formats and safetensors-quantisation API of deepwell.h: recipe
 * and rounding names, growable options and results (size), dw_quant_error against sums computed
 * here from the CPU reference on fresh random tensors, merging, dw_quantize_file with its
 * callback and summary, dw_quant_report's table and JSON against dw_quant_error, and refusals of
 * bad arguments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "deepwell.h"
#include "formats/formats.h"
#include "io/safetensors.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)

static void expect_error(dw_status got, dw_status want, const char *needle) {
    assert_int_equal(got, want);
    if (needle && !strstr(dw_errmsg(CTX), needle)) fail_msg("message '%s' lacks '%s'", dw_errmsg(CTX), needle);
}

static void test_names(void **state) {
    (void)state;
    for (int r = 0; r < DW_RECIPE_COUNT; r++) {
        dw_recipe back = DW_RECIPE_COUNT;
        assert_true(dw_recipe_parse(dw_recipe_name((dw_recipe)r), &back));
        assert_int_equal(back, r);
        assert_int_equal(dw_recipe_is_mx((dw_recipe)r),
                         r == DW_RECIPE_MXFP8 || r == DW_RECIPE_MXFP8_E5M2 || r == DW_RECIPE_MXFP4);
        int sb = dw_recipe_scale_bytes((dw_recipe)r);
        assert_int_equal(sb, r == DW_RECIPE_BF16 ? 0 : r <= DW_RECIPE_FP8_BLOCK2D ? 4 : 1);
    }
    dw_recipe keep = DW_RECIPE_NVFP4;
    assert_false(dw_recipe_parse("fp16", &keep));
    assert_false(dw_recipe_parse(NULL, &keep));
    assert_false(dw_recipe_parse("MXFP8", &keep));
    assert_int_equal(keep, DW_RECIPE_NVFP4);
    assert_string_equal(dw_recipe_name(DW_RECIPE_COUNT), "unknown");
    assert_string_equal(dw_recipe_name((dw_recipe)-1), "unknown");
    dw_scale_rounding sr = DW_SCALE_RCEIL;
    assert_true(dw_scale_rounding_parse("floor", &sr) && sr == DW_SCALE_FLOOR);
    assert_true(dw_scale_rounding_parse("rceil", &sr) && sr == DW_SCALE_RCEIL);
    assert_false(dw_scale_rounding_parse("up", &sr));
    assert_false(dw_scale_rounding_parse(NULL, &sr));
    assert_string_equal(dw_scale_rounding_name(DW_SCALE_FLOOR), "floor");
    assert_string_equal(dw_scale_rounding_name((dw_scale_rounding)7), "unknown");
}

static void test_opts_init(void **state) {
    (void)state;
    dw_quantize_opts o;
    memset(&o, 0x5A, sizeof o);
    dw_quantize_opts_init(&o, sizeof o);
    assert_int_equal(o.size, sizeof o);
    assert_int_equal(o.recipe, DW_RECIPE_COUNT);
    assert_int_equal(o.rounding, DW_SCALE_RCEIL);
    assert_false(o.pow2);
    /* a caller built against a header that ended before `rounding`: the rest is not written */
    unsigned char buf[sizeof(dw_quantize_opts) + 16];
    memset(buf, 0x5A, sizeof buf);
    size_t old = offsetof(dw_quantize_opts, rounding);
    dw_quantize_opts_init((dw_quantize_opts *)(void *)buf, old);
    for (size_t i = old; i < sizeof buf; i++) assert_int_equal(buf[i], 0x5A);
    dw_quant_report_opts ro;
    dw_quant_report_opts_init(&ro, sizeof ro);
    assert_int_equal(ro.size, sizeof ro);
    assert_null(ro.recipes);
    assert_false(ro.json || ro.pow2);
    dw_quantize_opts_init(NULL, sizeof o); /* harmless */
}

static dw_recipe random_quantised(void) { return (dw_recipe)(1 + dw_test_next(RNG) % (DW_RECIPE_COUNT - 1)); }

/* The error sums of x against dequantise(quantise(x)), from the CPU reference, in this file. */
static void reference_sums(const dw_quant_opts *o, const float *x, int64_t R, int64_t C, double *sx, double *se,
                           double *mx, int64_t *flushed) {
    dw_qtensor q = {.codes = malloc(dw_quant_codes_bytes(o->recipe, R, C) + 1),
                    .scales = malloc(dw_quant_scales_bytes(o->recipe, R, C) + 1)};
    float *y = malloc((size_t)(R * C) * sizeof *y);
    assert_int_equal(dw_quantize_cpu(CTX, o, x, R, C, &q), DW_OK);
    dw_dequantize_cpu(&q, y);
    *sx = *se = *mx = 0;
    *flushed = 0;
    for (int64_t i = 0; i < R * C; i++) {
        double e = (double)x[i] - (double)y[i];
        *sx += (double)x[i] * x[i];
        *se += e * e;
        *mx = fmax(*mx, fabs(e));
        *flushed += x[i] != 0 && y[i] == 0;
    }
    free(q.codes);
    free(q.scales);
    free(y);
}

static float *random_tensor(int64_t n) {
    float *x = malloc((size_t)n * sizeof *x);
    float spread = dw_test_uniform(RNG, -6, 6);
    for (int64_t i = 0; i < n; i++) {
        x[i] = dw_test_normal(RNG) * exp2f(spread + dw_test_uniform(RNG, -3, 3));
        if (dw_test_next(RNG) % 17 == 0) x[i] = 0;
    }
    return x;
}

static void test_quant_error_random(void **state) {
    (void)state;
    for (int it = 0; it < 60; it++) {
        dw_quantize_opts o;
        dw_quantize_opts_init(&o, sizeof o);
        o.recipe = random_quantised();
        o.rounding = (int32_t)(dw_test_next(RNG) % 2);
        o.pow2 = dw_recipe_scale_bytes((dw_recipe)o.recipe) == 4 && dw_test_next(RNG) % 2;
        int64_t R = dw_test_rnd(1, o.recipe == DW_RECIPE_FP8_BLOCK2D ? 260 : 9), C = dw_test_rnd(1, 300);
        float *x = random_tensor(R * C);
        dw_quant_stats st = {.size = sizeof st};
        assert_int_equal(dw_quant_error(CTX, &o, x, R, C, &st), DW_OK);
        dw_quant_opts po = {.recipe = (dw_recipe)o.recipe, .rounding = (dw_scale_rounding)o.rounding, .pow2 = o.pow2};
        double sx, se, mx;
        int64_t flushed;
        reference_sums(&po, x, R, C, &sx, &se, &mx, &flushed);
        assert_int_equal(st.size, sizeof st);
        assert_int_equal(st.n, R * C);
        assert_int_equal(st.nonfinite, 0);
        assert_int_equal(st.flushed, flushed);
        assert_true(st.max_abs == mx);
        if (fabs(st.sum_x2 - sx) > 1e-12 * sx || fabs(st.sum_e2 - se) > 1e-12 * se)
            fail_msg("%s [%lld, %lld]: sums %.17g %.17g, expected %.17g %.17g", dw_recipe_name((dw_recipe)o.recipe),
                     (long long)R, (long long)C, st.sum_x2, st.sum_e2, sx, se);
        assert_true(st.saturated >= 0 && st.saturated <= st.n);
        if (!(o.recipe == DW_RECIPE_MXFP4 || o.rounding == DW_SCALE_FLOOR)) /* rceil/FP32 scales never clip */
            assert_int_equal(st.saturated, 0);
        if (se > 0 && sx > 0) {
            assert_true(fabs(dw_quant_stats_sqnr_db(&st) - 10 * log10(sx / se)) < 1e-9);
            assert_true(fabs(dw_quant_stats_rel_err(&st) - sqrt(se / sx)) < 1e-12 * fmax(1, sqrt(se / sx)));
        }
        /* an older, shorter result struct: nothing past its size is written */
        unsigned char buf[sizeof(dw_quant_stats) + 8];
        memset(buf, 0x77, sizeof buf);
        size_t old = offsetof(dw_quant_stats, saturated);
        memcpy(buf, &old, sizeof old);
        assert_int_equal(dw_quant_error(CTX, &o, x, R, C, (dw_quant_stats *)(void *)buf), DW_OK);
        dw_quant_stats head;
        memcpy(&head, buf, old);
        assert_int_equal(head.n, R * C);
        assert_true(head.sum_e2 == st.sum_e2);
        for (size_t i = old; i < sizeof buf; i++) assert_int_equal(buf[i], 0x77);
        free(x);
    }
}

static void test_quant_error_bad_args(void **state) {
    (void)state;
    float x[64] = {1, 2, 3};
    dw_quant_stats st = {.size = sizeof st};
    dw_quantize_opts o;
    dw_quantize_opts_init(&o, sizeof o);
    expect_error(dw_quant_error(CTX, &o, x, 1, 64, &st), DW_ERR_INVALID, "no recipe");
    expect_error(dw_quant_error(CTX, NULL, x, 1, 64, &st), DW_ERR_INVALID, "NULL options");
    o.recipe = DW_RECIPE_BF16;
    expect_error(dw_quant_error(CTX, &o, x, 1, 64, &st), DW_ERR_INVALID, "not a quantised recipe");
    o.recipe = 99;
    expect_error(dw_quant_error(CTX, &o, x, 1, 64, &st), DW_ERR_INVALID, "99");
    o.recipe = DW_RECIPE_MXFP8;
    o.rounding = 7;
    expect_error(dw_quant_error(CTX, &o, x, 1, 64, &st), DW_ERR_INVALID, "rounding 7");
    o.rounding = DW_SCALE_FLOOR;
    expect_error(dw_quant_error(CTX, &o, NULL, 1, 64, &st), DW_ERR_INVALID, "NULL");
    expect_error(dw_quant_error(CTX, &o, x, 1, 64, NULL), DW_ERR_INVALID, "NULL");
    expect_error(dw_quant_error(CTX, &o, x, 0, 64, &st), DW_ERR_INVALID, "[0, 64]");
    expect_error(dw_quant_error(CTX, &o, x, 1, -3, &st), DW_ERR_INVALID, "[1, -3]");
    dw_quant_stats unset = {0};
    expect_error(dw_quant_error(CTX, &o, x, 1, 64, &unset), DW_ERR_INVALID, "size");
    dw_quantize_opts zero = {0};
    zero.recipe = DW_RECIPE_MXFP8;
    expect_error(dw_quant_error(CTX, &zero, x, 1, 64, &st), DW_ERR_INVALID, "dw_quantize_opts_init");
    assert_int_equal(dw_quant_error(CTX, &o, x, 1, 64, &st), DW_OK);
    assert_true(isnan(dw_quant_stats_sqnr_db(NULL)) && isnan(dw_quant_stats_rel_err(NULL)));
}

static void test_merge(void **state) {
    (void)state;
    dw_quant_stats total = {.size = sizeof total}, parts[4];
    double sx = 0, se = 0, mx = 0;
    int64_t n = 0, sat = 0, fl = 0;
    for (int i = 0; i < 4; i++) {
        parts[i] = (dw_quant_stats){.size = sizeof parts[i], .n = dw_test_rnd(1, 1000),
                                    .sum_x2 = dw_test_uniform(RNG, 0, 100), .sum_e2 = dw_test_uniform(RNG, 0, 1),
                                    .max_abs = dw_test_uniform(RNG, 0, 2), .saturated = dw_test_rnd(0, 5),
                                    .flushed = dw_test_rnd(0, 5)};
        n += parts[i].n, sx += parts[i].sum_x2, se += parts[i].sum_e2, mx = fmax(mx, parts[i].max_abs);
        sat += parts[i].saturated, fl += parts[i].flushed;
        dw_quant_stats_merge(&total, &parts[i]);
    }
    assert_int_equal(total.n, n);
    assert_int_equal(total.saturated, sat);
    assert_int_equal(total.flushed, fl);
    assert_true(fabs(total.sum_x2 - sx) < 1e-9 && fabs(total.sum_e2 - se) < 1e-12 && total.max_abs == mx);
    dw_quant_stats bad = {.size = sizeof bad, .n = 1, .max_abs = NAN, .nonfinite = 1};
    dw_quant_stats_merge(&total, &bad);
    assert_true(isnan(total.max_abs));
    assert_int_equal(total.nonfinite, 1);
    dw_quant_stats_merge(&total, &parts[0]); /* NaN stays */
    assert_true(isnan(total.max_abs));
    dw_quant_stats_merge(NULL, &parts[0]);    /* harmless */
    dw_quant_stats_merge(&total, NULL);
    assert_int_equal(total.n, n + 1 + parts[0].n);
}

/* A checkpoint with a random F32 [R, C] "w" (C a multiple of 128), a BF16 [C] "b", an I64 "ids". */
typedef struct {
    char *dir, *path;
    int64_t R, C;
    float *w, *b;
} fixture;

static fixture make_file(void) {
    fixture f = {.dir = dw_test_tmpdir(), .R = 128 * dw_test_rnd(1, 2), .C = 128 * dw_test_rnd(1, 3)};
    f.path = dw_test_path(f.dir, "in.safetensors");
    f.w = random_tensor(f.R * f.C);
    f.b = random_tensor(f.C);
    uint16_t *bb = malloc((size_t)f.C * 2);
    for (int64_t i = 0; i < f.C; i++) {
        uint32_t u;
        memcpy(&u, &f.b[i], 4);
        u &= 0xFFFF0000u; /* exactly BF16 */
        memcpy(&f.b[i], &u, 4);
        bb[i] = (uint16_t)(u >> 16);
    }
    int64_t ids[3] = {1, 2, 3}, ws[2] = {f.R, f.C}, bs[1] = {f.C}, is[1] = {3};
    dw_st_writer *wr = NULL;
    assert_int_equal(dw_st_writer_create(CTX, &wr), DW_OK);
    assert_int_equal(dw_st_writer_add(CTX, wr, "w", DW_DT_F32, 2, ws, f.w, (size_t)(f.R * f.C) * 4), DW_OK);
    assert_int_equal(dw_st_writer_add(CTX, wr, "b", DW_DT_BF16, 1, bs, bb, (size_t)f.C * 2), DW_OK);
    assert_int_equal(dw_st_writer_add(CTX, wr, "ids", DW_DT_I64, 1, is, ids, sizeof ids), DW_OK);
    assert_int_equal(dw_st_writer_commit(CTX, wr, f.path), DW_OK);
    dw_st_writer_free(wr);
    free(bb);
    return f;
}

static void free_file(fixture *f) {
    dw_test_rmtree(f->dir);
    free(f->dir);
    free(f->path);
    free(f->w);
    free(f->b);
}

typedef struct {
    int quantised, copied;
    char copied_dtype[16];
} heard;

static void on_tensor(void *user, const dw_st_tensor_info *t, const char *why) {
    heard *h = user;
    assert_non_null(t->name);
    assert_true(t->ndim >= 0 && t->ndim <= 8);
    if (why) {
        h->copied++;
        snprintf(h->copied_dtype, sizeof h->copied_dtype, "%s", t->dtype);
        assert_string_equal(t->name, "ids");
        assert_int_equal(t->shape[0], 3);
    } else {
        h->quantised++;
    }
}

static void test_quantize_file(void **state) {
    (void)state;
    fixture f = make_file();
    char *out = dw_test_path(f.dir, "out.safetensors");
    dw_quantize_opts o;
    dw_quantize_opts_init(&o, sizeof o);
    o.recipe = dw_test_next(RNG) % 2 ? DW_RECIPE_MXFP8 : DW_RECIPE_FP8_BLOCK;
    heard h = {0};
    dw_quantize_summary sum = {.size = sizeof sum};
    assert_int_equal(dw_quantize_file(CTX, f.path, out, &o, on_tensor, &h, &sum), DW_OK);
    assert_int_equal(h.quantised, 2);
    assert_int_equal(h.copied, 1);
    assert_string_equal(h.copied_dtype, "I64");
    assert_int_equal(sum.quantized, 2);
    assert_int_equal(sum.copied, 1);
    assert_int_equal(sum.in_bytes, (uint64_t)(f.R * f.C * 4 + f.C * 2 + 24));
    uint64_t scales = o.recipe == DW_RECIPE_MXFP8 ? (uint64_t)((f.R + 1) * f.C / 32) : (uint64_t)((f.R + 1) * f.C / 128 * 4);
    assert_int_equal(sum.out_bytes, (uint64_t)((f.R + 1) * f.C) + scales + 24);
    dw_st_file *q = NULL;
    assert_int_equal(dw_st_open(CTX, out, &q), DW_OK);
    assert_string_equal(dw_st_metadata(q, "deepwell.recipe"), dw_recipe_name((dw_recipe)o.recipe));
    assert_int_equal(dw_st_find(q, "w")->dtype, DW_DT_F8_E4M3);
    dw_st_close(q);
    /* bad arguments: nothing written, the message says what */
    char *out2 = dw_test_path(f.dir, "out2.safetensors");
    expect_error(dw_quantize_file(CTX, NULL, out2, &o, NULL, NULL, NULL), DW_ERR_INVALID, "NULL path");
    expect_error(dw_quantize_file(CTX, f.path, NULL, &o, NULL, NULL, NULL), DW_ERR_INVALID, "NULL path");
    dw_quantize_summary unset = {0};
    expect_error(dw_quantize_file(CTX, f.path, out2, &o, NULL, NULL, &unset), DW_ERR_INVALID, "size");
    o.recipe = DW_RECIPE_BF16;
    expect_error(dw_quantize_file(CTX, f.path, out2, &o, NULL, NULL, NULL), DW_ERR_INVALID, "not a quantised");
    o.recipe = DW_RECIPE_NVFP4;
    char *missing = dw_test_path(f.dir, "missing.safetensors");
    expect_error(dw_quantize_file(CTX, missing, out2, &o, NULL, NULL, NULL), DW_ERR_IO, "missing.safetensors");
    expect_error(dw_quantize_file(CTX, out, out2, &o, NULL, NULL, NULL), DW_ERR_FORMAT, "already quantised");
    FILE *fp = fopen(out2, "rb");
    assert_null(fp);
    free(missing);
    free(out2);
    free(out);
    free_file(&f);
}

/* The report's figures for one tensor and recipe against dw_quant_error on the same values. */
static void check_entry(const json_t *res, const float *x, int64_t R, int64_t C, dw_recipe r, int32_t rounding) {
    dw_quantize_opts o;
    dw_quantize_opts_init(&o, sizeof o);
    o.recipe = r;
    o.rounding = rounding;
    dw_quant_stats st = {.size = sizeof st};
    assert_int_equal(dw_quant_error(CTX, &o, x, R, C, &st), DW_OK);
    assert_int_equal(json_integer_value(json_object_get(res, "elements")), R * C);
    const json_t *sq = json_object_get(res, "sqnr_db");
    double want = dw_quant_stats_sqnr_db(&st);
    if (isfinite(want)) assert_true(fabs(json_real_value(sq) - want) < 1e-12 * fabs(want) + 1e-12);
    else assert_true(json_is_null(sq));
    assert_true(json_real_value(json_object_get(res, "max_abs_err")) == st.max_abs);
    assert_true(fabs(json_real_value(json_object_get(res, "flushed_pct")) - 100.0 * st.flushed / st.n) < 1e-12);
}

static void test_report(void **state) {
    (void)state;
    fixture f = make_file();
    dw_quant_report_opts o;
    dw_quant_report_opts_init(&o, sizeof o);
    int32_t recipes[3] = {DW_RECIPE_NVFP4, DW_RECIPE_FP8_BLOCK2D, DW_RECIPE_NVFP4}; /* the repeat is dropped */
    o.recipes = recipes;
    o.n_recipes = 3;
    o.rounding = (int32_t)(dw_test_next(RNG) % 2);
    o.json = true;
    char *text = NULL;
    assert_int_equal(dw_quant_report(CTX, f.path, &o, &text), DW_OK);
    json_t *doc = NULL;
    assert_int_equal(dw_json_load_string(CTX, text, strlen(text), "report", &doc), DW_OK);
    const json_t *rs = json_object_get(doc, "recipes");
    assert_int_equal(json_array_size(rs), 2);
    assert_string_equal(json_string_value(json_array_get(rs, 0)), "nvfp4");
    assert_string_equal(json_string_value(json_array_get(rs, 1)), "fp8_block2d");
    assert_string_equal(json_string_value(json_object_get(json_object_get(doc, "options"), "scale_rounding")),
                        dw_scale_rounding_name((dw_scale_rounding)o.rounding));
    const json_t *ts = json_object_get(doc, "tensors");
    assert_int_equal(json_array_size(ts), 3);
    for (size_t i = 0; i < 3; i++) {
        const json_t *t = json_array_get(ts, i), *res = json_object_get(t, "results");
        const char *name = json_string_value(json_object_get(t, "name"));
        if (!strcmp(name, "w")) {
            check_entry(json_object_get(res, "nvfp4"), f.w, f.R, f.C, DW_RECIPE_NVFP4, o.rounding);
            check_entry(json_object_get(res, "fp8_block2d"), f.w, f.R, f.C, DW_RECIPE_FP8_BLOCK2D, o.rounding);
        } else if (!strcmp(name, "b")) {
            check_entry(json_object_get(res, "nvfp4"), f.b, 1, f.C, DW_RECIPE_NVFP4, o.rounding);
            assert_string_equal(json_string_value(json_object_get(json_object_get(res, "fp8_block2d"), "skipped")),
                                "rows not a multiple of 128");
        } else {
            assert_string_equal(name, "ids");
            assert_string_equal(json_string_value(json_object_get(json_object_get(res, "nvfp4"), "skipped")),
                                "not floating-point");
        }
    }
    const json_t *sum = json_object_get(json_object_get(doc, "summary"), "nvfp4");
    assert_int_equal(json_integer_value(json_object_get(sum, "tensors")), 2);
    assert_int_equal(json_integer_value(json_object_get(sum, "skipped")), 1);
    assert_int_equal(json_integer_value(json_object_get(sum, "elements")), (f.R + 1) * f.C);
    json_decref(doc);
    dw_free_string(text);
    /* the table: header, one row per tensor and recipe, a summary line per recipe */
    o.json = false;
    o.recipes = NULL;
    assert_int_equal(dw_quant_report(CTX, f.path, &o, &text), DW_OK);
    assert_non_null(strstr(text, "in.safetensors: 3 tensor(s)"));
    assert_non_null(strstr(text, "not quantised: not floating-point"));
    for (int r = 1; r < DW_RECIPE_COUNT; r++) {
        char line[32];
        snprintf(line, sizeof line, "\n%-12s ", dw_recipe_name((dw_recipe)r));
        if (!strstr(text, line)) fail_msg("no summary line for %s", dw_recipe_name((dw_recipe)r));
    }
    dw_free_string(text);
    /* bad arguments */
    text = (char *)1;
    recipes[0] = DW_RECIPE_BF16;
    o.recipes = recipes;
    expect_error(dw_quant_report(CTX, f.path, &o, &text), DW_ERR_INVALID, "recipe 0");
    assert_null(text);
    o.n_recipes = 0;
    expect_error(dw_quant_report(CTX, f.path, &o, &text), DW_ERR_INVALID, "0 recipes");
    o.recipes = NULL;
    o.rounding = 5;
    expect_error(dw_quant_report(CTX, f.path, &o, &text), DW_ERR_INVALID, "rounding 5");
    o.rounding = DW_SCALE_RCEIL;
    expect_error(dw_quant_report(CTX, NULL, &o, &text), DW_ERR_INVALID, "NULL");
    expect_error(dw_quant_report(CTX, f.path, NULL, &text), DW_ERR_INVALID, "NULL options");
    expect_error(dw_quant_report(CTX, f.path, &o, NULL), DW_ERR_INVALID, "NULL");
    char *missing = dw_test_path(f.dir, "nope.safetensors");
    expect_error(dw_quant_report(CTX, missing, &o, &text), DW_ERR_IO, "nope.safetensors");
    assert_null(text);
    free(missing);
    free_file(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_opts_init),
        cmocka_unit_test(test_quant_error_random),
        cmocka_unit_test(test_quant_error_bad_args),
        cmocka_unit_test(test_merge),
        cmocka_unit_test(test_quantize_file),
        cmocka_unit_test(test_report),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
