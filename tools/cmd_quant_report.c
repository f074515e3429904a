/* cmd_quant_report.c — `deepwell quant-report`: how much error each recipe introduces on a
 * checkpoint's tensors (SQNR, max abs and relative error, saturation, flush to zero), per tensor
 * and element-weighted per recipe. Measures only; writes nothing. */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "io/safetensors_quant.h"
#include "cli.h"

static void help(void) {
    printf("Usage: deepwell quant-report MODEL.safetensors [--recipes LIST] [--scale-rounding rceil|floor]\n"
           "                             [--pow2] [--json]\n\n"
           "Quantises every tensor of MODEL with each recipe (exact CPU reference, the same rules as\n"
           "`deepwell quantize`), dequantises it again and compares with the original x:\n"
           "  SQNR dB      10 log10(sum x^2 / sum (x-q)^2)  (inf when exact)\n"
           "  max abs err  max |x - q|\n"
           "  rel err      ||x - q|| / ||x||\n"
           "  sat %%        elements clipped: |x| beyond what rounds to the largest value of its block\n"
           "               (above 464 x scale for E4M3, 61440 x scale for E5M2, 7 x scale for E2M1)\n"
           "  flushed %%    nonzero x whose q is 0\n"
           "then one summary line per recipe, element-weighted over the tensors the recipe applies to\n"
           "(F32, BF16 or F16; 1-D or 2-D; columns a multiple of the block; see deepwell quantize --help).\n"
           "Tensors a recipe does not apply to are listed with the reason.\n\n"
           "  --recipes LIST          comma-separated recipes (default: all of fp8_tensor, fp8_row,\n"
           "                          fp8_block, fp8_block2d, mxfp8, mxfp8_e5m2, mxfp4, nvfp4)\n"
           "  --scale-rounding MODE   for the MX recipes: rceil (default) or floor\n"
           "  --pow2                  for the fp8_* recipes: power-of-two scales\n"
           "  --json                  one JSON object: file, options, recipes, tensors[] with results per\n"
           "                          recipe (sqnr_db is null when exact or x is all zero), summary\n"
           "  -h, --help              this help\n\n"
           "Exit status: 0 reported, 2 bad arguments or unreadable/malformed input, 1 other failures.\n");
}

static bool parse_recipes(const char *text, dw_recipe *list, int *n) {
    *n = 0;
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, ",");
        char tok[32];
        dw_recipe r;
        snprintf(tok, sizeof tok, "%.*s", (int)(len < sizeof tok ? len : sizeof tok - 1), p);
        if (len == 0 || len >= sizeof tok || !dw_recipe_parse(tok, &r) || r == DW_RECIPE_BF16) {
            cli_error("quant-report", "unknown recipe '%.*s' in --recipes", (int)len, p);
            return false;
        }
        bool dup = false;
        for (int i = 0; i < *n; i++) dup |= list[i] == r;
        if (!dup) list[(*n)++] = r;
        p += len;
        if (*p == ',') p++;
    }
    if (*n == 0) {
        cli_error("quant-report", "--recipes is empty");
        return false;
    }
    return true;
}

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *stats_json(const dw_stq_stats *s) {
    double n = s->n > 0 ? (double)s->n : 1;
    return json_pack("{s:I, s:o, s:o, s:o, s:f, s:f, s:I}", "elements", (json_int_t)s->n, "sqnr_db",
                     num_or_null(dw_stq_sqnr_db(s)), "max_abs_err", num_or_null(s->max_abs), "rel_err",
                     num_or_null(dw_stq_rel_err(s)), "saturated_pct", 100.0 * s->saturated / n,
                     "flushed_pct", 100.0 * s->flushed / n, "nonfinite", (json_int_t)s->nonfinite);
}

static void print_stats(const dw_stq_stats *s) {
    double n = s->n > 0 ? (double)s->n : 1;
    printf(" %8.2f  %11.4e  %9.3e  %7.4f  %9.4f", dw_stq_sqnr_db(s), s->max_abs, dw_stq_rel_err(s),
           100.0 * s->saturated / n, 100.0 * s->flushed / n);
    if (s->nonfinite) printf("  (%lld non-finite)", (long long)s->nonfinite);
    printf("\n");
}

static void shape_text(const dw_st_tensor *t, char *buf, size_t cap) {
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

typedef struct {
    dw_recipe recipes[DW_RECIPE_COUNT];
    int n_recipes;
    dw_scale_rounding rounding;
    bool pow2, json;
} report_opts;

/* One tensor against every recipe: prints rows (text) or appends to jt (JSON). */
static dw_status report_tensor(dw_ctx *ctx, const dw_st_file *f, const dw_st_tensor *t,
                               const report_opts *ro, dw_stq_stats *totals, int *skipped, json_t *jt) {
    char shape[96];
    shape_text(t, shape, sizeof shape);
    float *x = NULL, *y = NULL;
    json_t *results = json_object();
    dw_status s = DW_OK;
    bool any = false;
    const char *why0 = NULL;
    for (int k = 0; k < ro->n_recipes; k++) {
        int64_t R, C;
        const char *why;
        any |= dw_stq_qualifies(t, ro->recipes[k], &R, &C, &why);
        if (!why0) why0 = why;
    }
    if (!any && !ro->json) { /* one line, not one per recipe */
        printf("%-40s %-14s %-12s not quantised: %s\n", t->name, shape, "(all)", why0);
        for (int k = 0; k < ro->n_recipes; k++) skipped[k]++;
        json_decref(results);
        return DW_OK;
    }
    for (int k = 0; k < ro->n_recipes && s == DW_OK; k++) {
        dw_recipe r = ro->recipes[k];
        int64_t R, C;
        const char *why;
        if (!ro->json) printf("%-40s %-14s %-12s", t->name, shape, dw_recipe_name(r));
        if (!dw_stq_qualifies(t, r, &R, &C, &why)) {
            skipped[k]++;
            if (ro->json) json_object_set_new(results, dw_recipe_name(r), json_pack("{s:s}", "skipped", why));
            else printf(" not quantised: %s\n", why);
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
        dw_quant_opts o = {.recipe = r, .rounding = ro->rounding, .pow2 = ro->pow2};
        dw_qtensor q;
        if ((s = dw_stq_quantize(ctx, &o, x, R, C, &q, y)) != DW_OK) break;
        dw_stq_stats st = {0};
        dw_stq_stats_add(&st, &q, x, y);
        dw_stq_free(&q);
        dw_stq_stats_merge(&totals[k], &st);
        if (ro->json) json_object_set_new(results, dw_recipe_name(r), stats_json(&st));
        else print_stats(&st);
    }
    free(x);
    free(y);
    if (ro->json && s == DW_OK) {
        json_t *dims = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(dims, json_integer(t->shape[d]));
        json_array_append_new(jt, json_pack("{s:s, s:s, s:o, s:o}", "name", t->name, "dtype",
                                            dw_dtype_name(t->dtype), "shape", dims, "results", results));
    } else {
        json_decref(results);
    }
    return s;
}

static dw_status report(dw_ctx *ctx, const char *path, const report_opts *ro) {
    dw_st_file *f = NULL;
    DW_TRY(dw_st_open(ctx, path, &f));
    dw_stq_stats totals[DW_RECIPE_COUNT] = {{0}};
    int skipped[DW_RECIPE_COUNT] = {0};
    json_t *jt = json_array();
    if (!ro->json) {
        printf("%s: %d tensor(s)", path, dw_st_count(f));
        const char *prev = dw_st_metadata(f, "deepwell.recipe");
        if (prev) printf(" (already quantised with %s: its quantised tensors are not floating-point and are skipped)", prev);
        printf("\n%-40s %-14s %-12s %8s  %11s  %9s  %7s  %9s\n", "tensor", "shape", "recipe", "SQNR dB",
               "max abs err", "rel err", "sat %", "flushed %");
    }
    dw_status s = DW_OK;
    for (int i = 0; i < dw_st_count(f) && s == DW_OK; i++)
        s = report_tensor(ctx, f, dw_st_get(f, i), ro, totals, skipped, jt);
    if (s == DW_OK && ro->json) {
        json_t *recipes = json_array(), *summary = json_object();
        for (int k = 0; k < ro->n_recipes; k++) {
            const char *name = dw_recipe_name(ro->recipes[k]);
            json_array_append_new(recipes, json_string(name));
            json_t *sj = stats_json(&totals[k]);
            json_object_set_new(sj, "tensors", json_integer(dw_st_count(f) - skipped[k]));
            json_object_set_new(sj, "skipped", json_integer(skipped[k]));
            json_object_set_new(summary, name, sj);
        }
        json_t *root = json_pack("{s:s, s:{s:s, s:b}, s:o, s:O, s:o}", "file", path, "options",
                                 "scale_rounding", ro->rounding == DW_SCALE_FLOOR ? "floor" : "rceil",
                                 "pow2", ro->pow2, "recipes", recipes, "tensors", jt, "summary", summary);
        char *text = root ? dw_json_dump(root, true) : NULL;
        if (text) printf("%s\n", text);
        else s = dw_set_error(ctx, DW_ERR_NOMEM, "%s: cannot build the JSON report", path);
        free(text);
        json_decref(root);
    } else if (s == DW_OK) {
        printf("\nsummary (element-weighted over the tensors each recipe applies to):\n");
        printf("%-12s %8s %8s %12s %8s  %11s  %9s  %7s  %9s\n", "recipe", "tensors", "skipped",
               "elements", "SQNR dB", "max abs err", "rel err", "sat %", "flushed %");
        for (int k = 0; k < ro->n_recipes; k++) {
            printf("%-12s %8d %8d %12lld", dw_recipe_name(ro->recipes[k]), dw_st_count(f) - skipped[k],
                   skipped[k], (long long)totals[k].n);
            print_stats(&totals[k]);
        }
    }
    json_decref(jt);
    dw_st_close(f);
    return s;
}

int cmd_quant_report(int argc, char **argv) {
    static const struct option opts[] = {{"recipes", required_argument, 0, 'r'},
                                         {"scale-rounding", required_argument, 0, 's'},
                                         {"pow2", no_argument, 0, 'p'},
                                         {"json", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    report_opts ro = {.rounding = DW_SCALE_RCEIL};
    for (int r = 0; r < DW_RECIPE_COUNT; r++)
        if (r != DW_RECIPE_BF16) ro.recipes[ro.n_recipes++] = (dw_recipe)r;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'r':
            if (!parse_recipes(optarg, ro.recipes, &ro.n_recipes)) return DW_EXIT_USAGE;
            break;
        case 's':
            if (!dw_stq_parse_rounding(optarg, &ro.rounding)) {
                cli_error("quant-report", "--scale-rounding expects rceil or floor, got '%s'", optarg);
                return DW_EXIT_USAGE;
            }
            break;
        case 'p': ro.pow2 = true; break;
        case 'j': ro.json = true; break;
        case 'h': help(); return DW_EXIT_OK;
        default: return cli_usage_error("quant-report");
        }
    }
    if (argc - optind != 1) {
        cli_error("quant-report", "expected one MODEL.safetensors, got %d argument(s)", argc - optind);
        return cli_usage_error("quant-report");
    }
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    dw_status s = dw_ctx_create(&co, &ctx);
    if (s != DW_OK) return cli_fail("quant-report", NULL, s);
    s = report(ctx, argv[optind], &ro);
    int rc = s == DW_OK ? DW_EXIT_OK : cli_fail("quant-report", ctx, s);
    dw_ctx_free(ctx);
    return rc;
}
