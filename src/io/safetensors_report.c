/* safetensors_report.c — `deepwell quant-report` (deepwell.h: dw_quant_report): how much error
 * each recipe introduces on a checkpoint's tensors, as the table the command prints or as its
 * JSON document. Measures with safetensors_quant.c's helpers; writes no file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "core/sized.h"
#include "core/strbuf.h"
#include "io/safetensors_quant.h"

static const dw_quant_report_opts REPORT_DEFAULTS = {.size = sizeof(dw_quant_report_opts),
                                                     .rounding = DW_SCALE_RCEIL};

void dw_quant_report_opts_init(dw_quant_report_opts *o, size_t size) {
    if (o) dw_sized_init(o, size, &REPORT_DEFAULTS, sizeof REPORT_DEFAULTS);
}

typedef struct {
    dw_recipe recipes[DW_RECIPE_COUNT];
    int n_recipes;
    dw_scale_rounding rounding;
    bool pow2, json;
    dw_strbuf text; /* the table */
    json_t *tensors;  /* the JSON document's tensors[] */
    dw_quant_stats totals[DW_RECIPE_COUNT];
    int skipped[DW_RECIPE_COUNT];
} report;

static dw_status read_opts(dw_ctx *ctx, const dw_quant_report_opts *pub, report *r) {
    dw_quant_report_opts o = REPORT_DEFAULTS;
    if (!pub) return dw_set_error(ctx, DW_ERR_INVALID, "quant-report: NULL options");
    if (!dw_sized_read(&o, sizeof o, pub))
        return dw_set_error(ctx, DW_ERR_INVALID, "quant-report: options size is 0 (call dw_quant_report_opts_init)");
    if (o.rounding != DW_SCALE_RCEIL && o.rounding != DW_SCALE_FLOOR)
        return dw_set_error(ctx, DW_ERR_INVALID, "quant-report: scale rounding %d is not rceil (0) or floor (1)",
                            (int)o.rounding);
    if (o.recipes && o.n_recipes < 1)
        return dw_set_error(ctx, DW_ERR_INVALID, "quant-report: %d recipes given", o.n_recipes);
    int n = o.recipes ? o.n_recipes : DW_RECIPE_COUNT;
    for (int i = 0; i < n; i++) {
        int32_t rc = o.recipes ? o.recipes[i] : i;
        if (!o.recipes && rc == DW_RECIPE_BF16) continue;
        if (rc <= DW_RECIPE_BF16 || rc >= DW_RECIPE_COUNT)
            return dw_set_error(ctx, DW_ERR_INVALID, "quant-report: recipe %d is not a quantised recipe (fp8_tensor, "
                                "fp8_row, fp8_block, fp8_block2d, mxfp8, mxfp8_e5m2, mxfp4, nvfp4)", (int)rc);
        bool dup = false;
        for (int k = 0; k < r->n_recipes; k++) dup |= r->recipes[k] == (dw_recipe)rc;
        if (!dup) r->recipes[r->n_recipes++] = (dw_recipe)rc;
    }
    r->rounding = (dw_scale_rounding)o.rounding;
    r->pow2 = o.pow2;
    r->json = o.json;
    for (int k = 0; k < DW_RECIPE_COUNT; k++) r->totals[k] = (dw_quant_stats){.size = sizeof(dw_quant_stats)};
    return DW_OK;
}

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *stats_json(const dw_quant_stats *s) {
    double n = s->n > 0 ? (double)s->n : 1;
    return json_pack("{s:I, s:o, s:o, s:o, s:f, s:f, s:I}", "elements", (json_int_t)s->n, "sqnr_db",
                     num_or_null(dw_quant_stats_sqnr_db(s)), "max_abs_err", num_or_null(s->max_abs), "rel_err",
                     num_or_null(dw_quant_stats_rel_err(s)), "saturated_pct", 100.0 * s->saturated / n,
                     "flushed_pct", 100.0 * s->flushed / n, "nonfinite", (json_int_t)s->nonfinite);
}

static void print_stats(dw_strbuf *b, const dw_quant_stats *s) {
    double n = s->n > 0 ? (double)s->n : 1;
    dw_strbuf_printf(b, " %8.2f  %11.4e  %9.3e  %7.4f  %9.4f", dw_quant_stats_sqnr_db(s), s->max_abs,
                     dw_quant_stats_rel_err(s), 100.0 * s->saturated / n, 100.0 * s->flushed / n);
    if (s->nonfinite) dw_strbuf_printf(b, "  (%lld non-finite)", (long long)s->nonfinite);
    dw_strbuf_printf(b, "\n");
}

static void shape_text(const dw_st_tensor *t, char *buf, size_t cap) {
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* One tensor against every recipe: rows of the table, or an entry of tensors[]. */
static dw_status report_tensor(dw_ctx *ctx, const dw_st_file *f, const dw_st_tensor *t, report *r) {
    char shape[96];
    shape_text(t, shape, sizeof shape);
    dw_strbuf *b = &r->text;
    float *x = NULL, *y = NULL;
    json_t *results = json_object();
    dw_status s = DW_OK;
    bool any = false;
    const char *why0 = NULL;
    for (int k = 0; k < r->n_recipes; k++) {
        int64_t R, C;
        const char *why;
        any |= dw_stq_qualifies(t, r->recipes[k], &R, &C, &why);
        if (!why0) why0 = why;
    }
    if (!any && !r->json) { /* one line, not one per recipe */
        dw_strbuf_printf(b, "%-40s %-14s %-12s not quantised: %s\n", t->name, shape, "(all)", why0);
        for (int k = 0; k < r->n_recipes; k++) r->skipped[k]++;
        json_decref(results);
        return DW_OK;
    }
    for (int k = 0; k < r->n_recipes && s == DW_OK; k++) {
        dw_recipe rc = r->recipes[k];
        int64_t R, C;
        const char *why;
        if (!r->json) dw_strbuf_printf(b, "%-40s %-14s %-12s", t->name, shape, dw_recipe_name(rc));
        if (!dw_stq_qualifies(t, rc, &R, &C, &why)) {
            r->skipped[k]++;
            if (r->json) json_object_set_new(results, dw_recipe_name(rc), json_pack("{s:s}", "skipped", why));
            else dw_strbuf_printf(b, " not quantised: %s\n", why);
            continue;
        }
        if (!x) {
            x = malloc((size_t)(R * C) * sizeof *x);
            y = malloc((size_t)(R * C) * sizeof *y);
            if (!x || !y) {
                s = dw_set_error(ctx, DW_ERR_NOMEM, "%s: tensor '%s': out of memory", dw_st_path(f), t->name);
                break;
            }
            if ((s = dw_st_read_f32(ctx, f, t, x)) != DW_OK) break;
        }
        dw_quant_opts o = {.recipe = rc, .rounding = r->rounding, .pow2 = r->pow2};
        dw_qtensor q;
        if ((s = dw_stq_quantize(ctx, &o, x, R, C, &q, y)) != DW_OK) break;
        dw_quant_stats st = {.size = sizeof st};
        dw_stq_stats_add(&st, &q, x, y);
        dw_stq_free(&q);
        dw_quant_stats_merge(&r->totals[k], &st);
        if (r->json) json_object_set_new(results, dw_recipe_name(rc), stats_json(&st));
        else print_stats(b, &st);
    }
    free(x);
    free(y);
    if (r->json && s == DW_OK) {
        json_t *dims = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(dims, json_integer(t->shape[d]));
        json_array_append_new(r->tensors, json_pack("{s:s, s:s, s:o, s:o}", "name", t->name, "dtype",
                                                    dw_dtype_name(t->dtype), "shape", dims, "results", results));
    } else {
        json_decref(results);
    }
    return s;
}

static char *json_document(const char *path, const dw_st_file *f, report *r) {
    json_t *recipes = json_array(), *summary = json_object();
    for (int k = 0; k < r->n_recipes; k++) {
        const char *name = dw_recipe_name(r->recipes[k]);
        json_array_append_new(recipes, json_string(name));
        json_t *sj = stats_json(&r->totals[k]);
        json_object_set_new(sj, "tensors", json_integer(dw_st_count(f) - r->skipped[k]));
        json_object_set_new(sj, "skipped", json_integer(r->skipped[k]));
        json_object_set_new(summary, name, sj);
    }
    json_t *root = json_pack("{s:s, s:{s:s, s:b}, s:o, s:O, s:o}", "file", path, "options", "scale_rounding",
                             dw_scale_rounding_name(r->rounding), "pow2", r->pow2, "recipes", recipes, "tensors",
                             r->tensors, "summary", summary);
    char *text = root ? dw_json_dump(root, true) : NULL;
    json_decref(root);
    return text;
}

static void table_summary(const dw_st_file *f, report *r) {
    dw_strbuf *b = &r->text;
    dw_strbuf_printf(b, "\nsummary (element-weighted over the tensors each recipe applies to):\n");
    dw_strbuf_printf(b, "%-12s %8s %8s %12s %8s  %11s  %9s  %7s  %9s\n", "recipe", "tensors", "skipped", "elements",
                     "SQNR dB", "max abs err", "rel err", "sat %", "flushed %");
    for (int k = 0; k < r->n_recipes; k++) {
        dw_strbuf_printf(b, "%-12s %8d %8d %12lld", dw_recipe_name(r->recipes[k]), dw_st_count(f) - r->skipped[k],
                         r->skipped[k], (long long)r->totals[k].n);
        print_stats(b, &r->totals[k]);
    }
}

dw_status dw_quant_report(dw_ctx *ctx, const char *path, const dw_quant_report_opts *o, char **out) {
    if (out) *out = NULL;
    if (!path || !out) return dw_set_error(ctx, DW_ERR_INVALID, "dw_quant_report: NULL argument");
    report r = {.n_recipes = 0};
    DW_TRY(read_opts(ctx, o, &r));
    dw_st_file *f = NULL;
    DW_TRY(dw_st_open(ctx, path, &f));
    r.tensors = json_array();
    if (!r.json) {
        dw_strbuf_printf(&r.text, "%s: %d tensor(s)", path, dw_st_count(f));
        const char *prev = dw_st_metadata(f, "deepwell.recipe");
        if (prev)
            dw_strbuf_printf(&r.text, " (already quantised with %s: its quantised tensors are not floating-point "
                             "and are skipped)", prev);
        dw_strbuf_printf(&r.text, "\n%-40s %-14s %-12s %8s  %11s  %9s  %7s  %9s\n", "tensor", "shape", "recipe",
                         "SQNR dB", "max abs err", "rel err", "sat %", "flushed %");
    }
    dw_status s = r.tensors ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < dw_st_count(f) && s == DW_OK; i++) s = report_tensor(ctx, f, dw_st_get(f, i), &r);
    char *text = NULL;
    if (s == DW_OK && r.json) {
        text = json_document(path, f, &r);
    } else if (s == DW_OK) {
        table_summary(f, &r);
        if (!r.text.oom) text = r.text.s, r.text.s = NULL;
    }
    if (s == DW_OK && !text) s = dw_set_error(ctx, DW_ERR_NOMEM, "%s: cannot build the report", path);
    free(r.text.s);
    json_decref(r.tensors);
    dw_st_close(f);
    *out = text;
    return s;
}
