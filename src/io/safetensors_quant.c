/* safetensors_quant.c — quantising safetensors checkpoints into FORMATS.md's on-disk layout and
 * the error statistics of quant-report (see safetensors_quant.h). The numerics are all in
 * formats/ (the CPU reference); this file only chooses tensors, lays out names/dtypes/shapes
 * and measures. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/sized.h"
#include "io/safetensors_quant.h"

bool dw_stq_qualifies(const dw_st_tensor *t, dw_recipe r, int64_t *rows, int64_t *cols,
                      const char **why) {
    if (t->dtype != DW_DT_F32 && t->dtype != DW_DT_BF16 && t->dtype != DW_DT_F16) {
        *why = dw_dtype_is_float(t->dtype) ? "dtype is not F32, BF16 or F16" : "not floating-point";
        return false;
    }
    if (t->ndim != 1 && t->ndim != 2) {
        *why = t->ndim == 0 ? "a scalar" : "more than 2 dimensions";
        return false;
    }
    int64_t R = t->ndim == 2 ? t->shape[0] : 1, C = t->shape[t->ndim - 1];
    if (R == 0 || C == 0) {
        *why = "empty";
        return false;
    }
    int br, bc;
    dw_recipe_block(r, &br, &bc);
    if (bc > 0 && C % bc != 0) {
        *why = bc == 16 ? "columns not a multiple of 16"
             : bc == 32 ? "columns not a multiple of 32" : "columns not a multiple of 128";
        return false;
    }
    if (br > 1 && R % br != 0) {
        *why = "rows not a multiple of 128";
        return false;
    }
    *rows = R;
    *cols = C;
    return true;
}

/* Saturation test per element format: the largest magnitude code (sign bit clear), the mask of
 * the magnitude bits, and the ratio between the rounding boundary above the largest value (the
 * midpoint to the next value the format would have were its range wider) and that value:
 * E4M3 448 -> 464, E5M2 57344 -> 61440, E2M1 6 -> 7. An element is saturated (clipped) when its
 * code is the largest and |x| lies beyond that boundary: |x| > |y| * ratio. Elements that merely
 * round down to the largest value are not. */
static void max_code(dw_recipe r, unsigned *mag_mask, unsigned *max, double *ratio) {
    if (dw_recipe_elem_bits(r) == 4) *mag_mask = 0x7, *max = 0x7, *ratio = 7.0 / 6.0;
    else if (r == DW_RECIPE_MXFP8_E5M2) *mag_mask = 0x7F, *max = 0x7B, *ratio = 61440.0 / 57344.0;
    else *mag_mask = 0x7F, *max = 0x7E, *ratio = 464.0 / 448.0;
}

void dw_stq_stats_add(dw_quant_stats *s, const dw_qtensor *q, const float *x, const float *y) {
    unsigned mask, top;
    double ratio;
    max_code(q->recipe, &mask, &top, &ratio);
    bool fp4 = dw_recipe_elem_bits(q->recipe) == 4;
    int64_t row_bytes = dw_quant_row_bytes(q->recipe, q->cols);
    for (int64_t r = 0; r < q->rows; r++)
        for (int64_t c = 0; c < q->cols; c++) {
            int64_t i = r * q->cols + c;
            double xv = x[i], yv = y[i], e = xv - yv;
            s->n++;
            if (!isfinite(xv) || !isfinite(yv)) {
                s->nonfinite++;
                s->max_abs = NAN;
                continue;
            }
            s->sum_x2 += xv * xv;
            s->sum_e2 += e * e;
            if (fabs(e) > s->max_abs) s->max_abs = fabs(e); /* stays NaN once NaN */
            if (xv != 0 && yv == 0) s->flushed++;
            unsigned code = fp4 ? (q->codes[r * row_bytes + c / 2] >> (4 * (c & 1))) & 0xF
                                : q->codes[i];
            if ((code & mask) == top && fabs(xv) > fabs(yv) * ratio) s->saturated++;
        }
}

static void stats_merge(dw_quant_stats *into, const dw_quant_stats *s) {
    into->n += s->n;
    into->sum_x2 += s->sum_x2;
    into->sum_e2 += s->sum_e2;
    if (isnan(s->max_abs) || s->max_abs > into->max_abs) into->max_abs = s->max_abs;
    into->saturated += s->saturated;
    into->flushed += s->flushed;
    into->nonfinite += s->nonfinite;
}

void dw_quant_stats_merge(dw_quant_stats *into, const dw_quant_stats *s) {
    dw_quant_stats a = {.size = sizeof a}, b = {.size = sizeof b};
    if (!into || !s || !dw_sized_read(&a, sizeof a, into) || !dw_sized_read(&b, sizeof b, s)) return;
    stats_merge(&a, &b);
    dw_sized_write(into, &a, sizeof a);
}

double dw_quant_stats_sqnr_db(const dw_quant_stats *s) {
    if (!s) return NAN;
    if (s->sum_x2 == 0) return NAN;
    if (s->sum_e2 == 0) return INFINITY;
    return 10.0 * log10(s->sum_x2 / s->sum_e2);
}

double dw_quant_stats_rel_err(const dw_quant_stats *s) {
    if (!s) return NAN;
    return s->sum_x2 == 0 ? (s->sum_e2 == 0 ? 0.0 : INFINITY) : sqrt(s->sum_e2 / s->sum_x2);
}

void dw_stq_free(dw_qtensor *q) {
    if (!q) return;
    free(q->codes);
    free(q->scales);
    q->codes = NULL;
    q->scales = NULL;
}

dw_status dw_stq_quantize(dw_ctx *ctx, const dw_quant_opts *o, const float *x, int64_t rows,
                          int64_t cols, dw_qtensor *q, float *y) {
    memset(q, 0, sizeof *q);
    q->recipe = o->recipe;
    q->rows = rows;
    q->cols = cols;
    size_t cb = dw_quant_codes_bytes(o->recipe, rows, cols), sb = dw_quant_scales_bytes(o->recipe, rows, cols);
    q->codes = malloc(cb ? cb : 1);
    q->scales = malloc(sb ? sb : 1);
    if (!q->codes || !q->scales) {
        dw_stq_free(q);
        return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory quantising [%lld, %lld]",
                            (long long)rows, (long long)cols);
    }
    dw_status s = dw_quantize_cpu(ctx, o, x, rows, cols, q);
    if (s != DW_OK) {
        dw_stq_free(q);
        return s;
    }
    if (y) dw_dequantize_cpu(q, y);
    return DW_OK;
}

dw_status dw_quant_error(dw_ctx *ctx, const dw_quantize_opts *opts, const float *x, int64_t rows,
                         int64_t cols, dw_quant_stats *out) {
    dw_quant_stats st = {.size = sizeof st};
    if (!x || !out) return dw_set_error(ctx, DW_ERR_INVALID, "dw_quant_error: NULL argument");
    if (!dw_sized_write(out, &st, sizeof st))
        return dw_set_error(ctx, DW_ERR_INVALID, "dw_quant_error: out->size is 0 (set it to sizeof the struct)");
    dw_quant_opts o;
    DW_TRY(dw_quant_opts_from_public(ctx, opts, &o));
    if (rows < 1 || cols < 1 || rows > (INT64_MAX / 8) / cols)
        return dw_set_error(ctx, DW_ERR_INVALID, "dw_quant_error: bad shape [%lld, %lld]", (long long)rows,
                            (long long)cols);
    float *y = malloc((size_t)(rows * cols) * sizeof *y);
    if (!y) return dw_set_error(ctx, DW_ERR_NOMEM, "dw_quant_error: out of memory for [%lld, %lld]",
                                (long long)rows, (long long)cols);
    dw_qtensor q;
    dw_status s = dw_stq_quantize(ctx, &o, x, rows, cols, &q, y);
    if (s == DW_OK) {
        dw_stq_stats_add(&st, &q, x, y);
        dw_stq_free(&q);
        dw_sized_write(out, &st, sizeof st);
    }
    free(y);
    return s;
}

dw_st_tensor_info dw_stq_tensor_info(const dw_st_tensor *t) {
    return (dw_st_tensor_info){.name = t->name, .dtype = dw_dtype_name(t->dtype), .ndim = t->ndim, .shape = t->shape};
}

/* ---- whole files ---------------------------------------------------------------------------- */

typedef struct {
    dw_qtensor q;
    char *scale_name, *scale2_name;
} qitem;

static dw_status add_quantized(dw_ctx *ctx, dw_st_writer *w, const dw_st_tensor *t, qitem *it) {
    const dw_qtensor *q = &it->q;
    dw_recipe r = q->recipe;
    int64_t R = q->rows, C = q->cols;
    int64_t cshape[2] = {R, dw_recipe_elem_bits(r) == 4 ? C / 2 : C};
    dw_dtype cdt = dw_recipe_elem_bits(r) == 4 ? DW_DT_U8
                 : r == DW_RECIPE_MXFP8_E5M2 ? DW_DT_F8_E5M2 : DW_DT_F8_E4M3;
    DW_TRY(dw_st_writer_add(ctx, w, t->name, cdt, 2, cshape, q->codes,
                            dw_quant_codes_bytes(r, R, C)));
    int64_t sr, sc;
    dw_quant_scale_shape(r, R, C, &sr, &sc);
    int64_t sshape[2] = {sr, sc};
    int sndim = 2;
    if (r == DW_RECIPE_FP8_TENSOR) sndim = 0; /* F32 [] */
    else if (r == DW_RECIPE_FP8_ROW) sndim = 1; /* F32 [R] */
    DW_TRY(dw_st_writer_add(ctx, w, it->scale_name, dw_recipe_scale_bytes(r) == 4 ? DW_DT_F32 : DW_DT_U8,
                            sndim, sshape, q->scales, dw_quant_scales_bytes(r, R, C)));
    if (r == DW_RECIPE_NVFP4)
        DW_TRY(dw_st_writer_add(ctx, w, it->scale2_name, DW_DT_F32, 0, NULL, &it->q.tensor_scale, 4));
    return DW_OK;
}

static char *concat(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s", a, b);
    return s;
}

static dw_status quantize_all(dw_ctx *ctx, const dw_st_file *f, dw_st_writer *w, const char *out,
                              const dw_quant_opts *o, qitem *items, dw_quantize_notify notify, void *user,
                              dw_quantize_summary *sum) {
    const char *in = dw_st_path(f);
    for (int i = 0; i < dw_st_count(f); i++) {
        const dw_st_tensor *t = dw_st_get(f, i);
        int64_t R, C;
        const char *why = NULL;
        sum->in_bytes += t->nbytes;
        if (!dw_stq_qualifies(t, o->recipe, &R, &C, &why)) {
            dw_status s = dw_st_writer_add(ctx, w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes);
            if (s != DW_OK) return dw_prefix_error(ctx, s, "%s", out);
            sum->copied++;
            sum->out_bytes += t->nbytes;
            if (notify) {
                dw_st_tensor_info ti = dw_stq_tensor_info(t);
                notify(user, &ti, why);
            }
            continue;
        }
        qitem *it = &items[i];
        it->scale_name = concat(t->name, ".scale");
        it->scale2_name = concat(t->name, ".scale_2");
        if (!it->scale_name || !it->scale2_name) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
        if (dw_st_find(f, it->scale_name) || (o->recipe == DW_RECIPE_NVFP4 && dw_st_find(f, it->scale2_name)))
            return dw_set_error(ctx, DW_ERR_FORMAT,
                                "%s: tensor '%s': a tensor named '%s' already exists, so the scales "
                                "cannot be stored under that name (already quantised?)",
                                in, t->name, it->scale_name);
        float *x = malloc((size_t)(R * C) * sizeof *x);
        if (!x) return dw_set_error(ctx, DW_ERR_NOMEM, "%s: tensor '%s': out of memory", in, t->name);
        dw_status s = dw_st_read_f32(ctx, f, t, x);
        if (s == DW_OK) s = dw_stq_quantize(ctx, o, x, R, C, &it->q, NULL);
        free(x);
        if (s != DW_OK) return dw_prefix_error(ctx, s, "%s: tensor '%s'", in, t->name);
        if ((s = add_quantized(ctx, w, t, it)) != DW_OK) return dw_prefix_error(ctx, s, "%s", out);
        sum->quantized++;
        sum->out_bytes += dw_quant_codes_bytes(o->recipe, R, C) + dw_quant_scales_bytes(o->recipe, R, C) +
                          (o->recipe == DW_RECIPE_NVFP4 ? 4 : 0);
        if (notify) {
            dw_st_tensor_info ti = dw_stq_tensor_info(t);
            notify(user, &ti, NULL);
        }
    }
    return DW_OK;
}

dw_status dw_quantize_file(dw_ctx *ctx, const char *in, const char *out, const dw_quantize_opts *opts,
                           dw_quantize_notify notify, void *user, dw_quantize_summary *summary) {
    dw_quantize_summary sum = {.size = sizeof sum};
    if (summary && !dw_sized_write(summary, &sum, sizeof sum))
        return dw_set_error(ctx, DW_ERR_INVALID, "dw_quantize_file: summary->size is 0 (set it to sizeof the struct)");
    if (!in || !out) return dw_set_error(ctx, DW_ERR_INVALID, "dw_quantize_file: NULL path");
    dw_quant_opts oo;
    DW_TRY(dw_quant_opts_from_public(ctx, opts, &oo));
    const dw_quant_opts *o = &oo;
    dw_st_file *f = NULL;
    DW_TRY(dw_st_open(ctx, in, &f));
    const char *prev = dw_st_metadata(f, "deepwell.recipe");
    if (prev) {
        dw_status s = dw_set_error(ctx, DW_ERR_FORMAT,
                                   "%s: already quantised (__metadata__ deepwell.recipe = '%s')", in, prev);
        dw_st_close(f);
        return s;
    }
    dw_st_writer *w = NULL;
    qitem *items = calloc((size_t)dw_st_count(f) + 1, sizeof *items);
    dw_status s = items ? dw_st_writer_create(ctx, &w) : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    for (int i = 0; s == DW_OK && i < dw_st_metadata_count(f); i++) {
        const char *k, *v;
        dw_st_metadata_at(f, i, &k, &v);
        s = dw_st_writer_set_metadata(ctx, w, k, v);
    }
    if (s == DW_OK) s = dw_st_writer_set_metadata(ctx, w, "deepwell.recipe", dw_recipe_name(o->recipe));
    if (s == DW_OK)
        s = dw_st_writer_set_metadata(ctx, w, "deepwell.scale_rounding",
                                      dw_scale_rounding_name(o->rounding));
    if (s == DW_OK) s = dw_st_writer_set_metadata(ctx, w, "deepwell.pow2", o->pow2 ? "true" : "false");
    if (s == DW_OK) s = quantize_all(ctx, f, w, out, o, items, notify, user, &sum);
    if (s == DW_OK) s = dw_st_writer_commit(ctx, w, out);
    dw_st_writer_free(w);
    for (int i = 0; items && i < dw_st_count(f); i++) {
        dw_stq_free(&items[i].q);
        free(items[i].scale_name);
        free(items[i].scale2_name);
    }
    free(items);
    dw_st_close(f);
    if (s == DW_OK && summary) dw_sized_write(summary, &sum, sizeof sum);
    return s;
}
