/* guard_report.c — dw_quant_run_report (deepwell.h): a training run's quantised layers over time,
 * from the guard's files (guard_quant.c) — RUN/quant_stats.jsonl (one line per tensor and check,
 * and the quantisers' counters per layer since the last check: guard_counts.c) and
 * RUN/precision_decisions.jsonl (one per fallback) — and, when the run has a checkpoint, its
 * state.json (the recipes now, the checkpoint interval). Per layer: the recipe, each fallback
 * (step, tensor, reason), per tensor the first, last and largest bulk error with their steps, and
 * the counters' overflows and underflows of x, w and dy over the run; then the largest bulk error
 * of each layer per checkpoint interval. Reads only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/strbuf.h"
#include "train/ckpt.h"
#include "train/guard.h"

enum { NT = 6, NK = 3 };
static const char *const TENSOR[NT] = {"x", "x^T", "w", "w^T", "dy", "dy^T"};
static const char *const KIND[NK] = {"x", "w", "dy"}; /* the counters' operand kinds */

typedef struct {
    int64_t step;
    double bulk, rel;
} point;

typedef struct {
    char recipe[24];
    int64_t checks, overflow, underflow;
    point first, last, max;
} tstat;

typedef struct {
    int64_t overflow, underflow;
} count;

typedef struct {
    char *name;
    tstat t[NT];
    count c[NK];       /* the quantisers' counters over the run */
    int64_t counted;   /* the steps they cover */
    json_t *fallbacks; /* the decisions' lines, in order */
    double *imax;      /* (intervals) largest bulk error, NAN: no check */
} layer;

typedef struct {
    dw_ctx *ctx;
    layer *l;
    int n, cap;
    int64_t checks, first_step, last_step, every, intervals;
    json_t *now; /* {node: recipe} of the latest checkpoint, or NULL */
    char *ckpt;  /* that checkpoint, or NULL */
} report;

static layer *find(report *r, const char *name, bool add) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->l[i].name, name)) return &r->l[i];
    if (!add) return NULL;
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 16;
        layer *g = realloc(r->l, (size_t)cap * sizeof *g);
        if (!g) return NULL;
        r->l = g, r->cap = cap;
    }
    layer *l = &r->l[r->n];
    memset(l, 0, sizeof *l);
    if (!(l->name = strdup(name)) || !(l->fallbacks = json_array())) {
        free(l->name);
        return NULL;
    }
    r->n++;
    return l;
}

/* Calls fn on each whole line of dir/name parsed (a partial last line is dropped, as on resume). */
static dw_status each_line(report *r, const char *dir, const char *name, bool required,
                           dw_status (*fn)(report *, json_t *, const char *)) {
    char *path = dw_path_join(dir, name), *text = NULL;
    size_t n = 0;
    if (!path) return dw_set_error(r->ctx, DW_ERR_NOMEM, "out of memory");
    dw_status st = dw_read_file(r->ctx, path, &text, &n);
    if (st != DW_OK && !required) {
        dw_clear_error(r->ctx);
        free(path);
        return DW_OK;
    }
    if (st != DW_OK)
        st = dw_set_error(r->ctx, DW_ERR_IO, "%s: the run has no quant_stats.jsonl (no quantised layer, or trained "
                          "with --quant-check-every 0)", dir);
    for (char *p = text; st == DW_OK && p < text + n;) {
        char *nl = memchr(p, '\n', (size_t)(text + n - p));
        if (!nl) break;
        json_t *j = NULL;
        st = dw_json_load_string(r->ctx, p, (size_t)(nl - p), path, &j);
        if (st == DW_OK) st = fn(r, j, path);
        json_decref(j);
        p = nl + 1;
    }
    free(text);
    free(path);
    return st;
}

static int tensor_index(const char *t) {
    for (int i = 0; i < NT; i++)
        if (!strcmp(t, TENSOR[i])) return i;
    return -1;
}

static dw_status first_pass(report *r, json_t *j, const char *path) { /* steps and layers */
    long long step = 0;
    const char *name = NULL;
    DW_TRY(dw_json_get_int(r->ctx, j, "step", path, &step));
    DW_TRY(dw_json_get_str(r->ctx, j, "layer", path, &name));
    if (json_object_get(j, "counts")) /* the counters' line: no check */
        return find(r, name, true) ? DW_OK : dw_set_error(r->ctx, DW_ERR_NOMEM, "out of memory");
    if (!r->checks || step < r->first_step) r->first_step = step;
    if (step > r->last_step) r->last_step = step;
    r->checks++;
    return find(r, name, true) ? DW_OK : dw_set_error(r->ctx, DW_ERR_NOMEM, "out of memory");
}

static int64_t interval_of(const report *r, int64_t step) {
    return r->every > 0 && step > 0 ? (step - 1) / r->every : 0;
}

/* Interval k's steps [*lo, *hi] (the last one ends at the run's last check). */
static void interval_steps(const report *r, int64_t k, int64_t *lo, int64_t *hi) {
    *lo = r->every > 0 ? k * r->every + 1 : r->first_step;
    *hi = r->every > 0 && (k + 1) * r->every < r->last_step ? (k + 1) * r->every : r->last_step;
}

static int kind_index(const char *k) {
    for (int i = 0; i < NK; i++)
        if (!strcmp(k, KIND[i])) return i;
    return -1;
}

/* {"step", "layer", "counts": kind, "overflow", "underflow", "steps"} */
static dw_status count_line(report *r, json_t *j, const char *path) {
    long long over = 0, under = 0, steps = 0;
    const char *name = NULL, *kind = NULL;
    DW_TRY(dw_json_get_str(r->ctx, j, "layer", path, &name));
    DW_TRY(dw_json_get_str(r->ctx, j, "counts", path, &kind));
    DW_TRY(dw_json_get_int(r->ctx, j, "overflow", path, &over));
    DW_TRY(dw_json_get_int(r->ctx, j, "underflow", path, &under));
    DW_TRY(dw_json_get_int(r->ctx, j, "steps", path, &steps));
    const int k = kind_index(kind);
    if (k < 0) return dw_set_error(r->ctx, DW_ERR_FORMAT, "%s: counts '%s' is not x, w or dy", path, kind);
    layer *l = find(r, name, false);
    l->c[k].overflow += over, l->c[k].underflow += under;
    if (k == 0) l->counted += steps;
    return DW_OK;
}

static dw_status stat_line(report *r, json_t *j, const char *path) {
    if (json_object_get(j, "counts")) return count_line(r, j, path);
    long long step = 0, over = 0, under = 0;
    const char *name = NULL, *tensor = NULL, *recipe = NULL;
    double bulk = 0, rel = 0;
    DW_TRY(dw_json_get_int(r->ctx, j, "step", path, &step));
    DW_TRY(dw_json_get_str(r->ctx, j, "layer", path, &name));
    DW_TRY(dw_json_get_str(r->ctx, j, "tensor", path, &tensor));
    DW_TRY(dw_json_get_str(r->ctx, j, "recipe", path, &recipe));
    DW_TRY(dw_json_get_num(r->ctx, j, "bulk_error", path, &bulk));
    DW_TRY(dw_json_get_num(r->ctx, j, "rel_error", path, &rel));
    DW_TRY(dw_json_get_int(r->ctx, j, "overflow", path, &over));
    DW_TRY(dw_json_get_int(r->ctx, j, "underflow", path, &under));
    const int t = tensor_index(tensor);
    if (t < 0)
        return dw_set_error(r->ctx, DW_ERR_FORMAT, "%s: tensor '%s' is not x, x^T, w, w^T, dy or dy^T", path, tensor);
    layer *l = find(r, name, false);
    tstat *s = &l->t[t];
    const point p = {step, bulk, rel};
    snprintf(s->recipe, sizeof s->recipe, "%s", recipe);
    if (!s->checks) s->first = s->max = p;
    if (bulk > s->max.bulk) s->max = p;
    s->last = p;
    s->checks++;
    s->overflow += over, s->underflow += under;
    double *m = &l->imax[interval_of(r, step)];
    if (isnan(*m) || bulk > *m) *m = bulk;
    return DW_OK;
}

static dw_status decision_line(report *r, json_t *j, const char *path) {
    const char *name = NULL;
    DW_TRY(dw_json_get_str(r->ctx, j, "layer", path, &name));
    layer *l = find(r, name, true);
    if (!l) return dw_set_error(r->ctx, DW_ERR_NOMEM, "out of memory");
    json_array_append(l->fallbacks, j);
    return DW_OK;
}

/* The latest checkpoint (when the run has one): its recipes and its checkpoint interval. */
static dw_status checkpoint(report *r, const char *dir) {
    char *latest = dw_path_join(dir, "latest"), *cdir = NULL;
    if (!latest) return dw_set_error(r->ctx, DW_ERR_NOMEM, "out of memory");
    FILE *f = fopen(latest, "r");
    free(latest);
    if (!f) return DW_OK; /* no checkpoint yet */
    fclose(f);
    dw_ckpt_state s;
    DW_TRY(dw_ckpt_open(r->ctx, dir, &cdir, &s));
    r->ckpt = cdir;
    r->every = s.has_run ? s.ckpt_every : 0;
    return dw_guard_state_key(r->ctx, cdir, "recipes", &r->now);
}

/* "x fp8_block, w fp8_block2d", or the one recipe all measured tensors share. */
static void recipe_text(const layer *l, char *out, size_t cap) {
    const char *a = l->t[0].checks ? l->t[0].recipe : l->t[1].checks ? l->t[1].recipe : NULL;
    const char *w = l->t[2].checks ? l->t[2].recipe : l->t[3].checks ? l->t[3].recipe : NULL;
    if (a && w && strcmp(a, w)) snprintf(out, cap, "x %s, w %s", a, w);
    else snprintf(out, cap, "%s", a ? a : w ? w : "?");
}

static const char *now_text(const report *r, const layer *l) {
    const char *s = r->now ? json_string_value(json_object_get(r->now, l->name)) : NULL;
    return s ? s : json_array_size(l->fallbacks) ? "bf16" : "-";
}

static void text_report(const report *r, const char *dir, dw_strbuf *b) {
    int nfall = 0, w = 5;
    for (int i = 0; i < r->n; i++) {
        nfall += (int)json_array_size(r->l[i].fallbacks);
        if ((int)strlen(r->l[i].name) > w) w = (int)strlen(r->l[i].name);
    }
    dw_strbuf_printf(b, "run %s: %lld tensor checks, steps %lld..%lld; %d quantised layers, %d fallback(s)\n", dir,
                     (long long)r->checks, (long long)r->first_step, (long long)r->last_step, r->n, nfall);
    if (r->ckpt) dw_strbuf_printf(b, "latest checkpoint %s (recipes \"now\")\n", r->ckpt);
    dw_strbuf_printf(b, "\n%-*s  %-28s %-11s fallbacks\n", w, "layer", "recipe", "now");
    for (int i = 0; i < r->n; i++) {
        const layer *l = &r->l[i];
        char rec[64];
        recipe_text(l, rec, sizeof rec);
        dw_strbuf_printf(b, "%-*s  %-28s %-11s ", w, l->name, rec, now_text(r, l));
        if (!json_array_size(l->fallbacks)) dw_strbuf_printf(b, "-");
        for (size_t k = 0; k < json_array_size(l->fallbacks); k++) {
            const json_t *d = json_array_get(l->fallbacks, k);
            dw_strbuf_printf(b, "%sstep %lld: %s %s", k ? "; " : "",
                             (long long)json_integer_value(json_object_get(d, "step")),
                             json_string_value(json_object_get(d, "tensor")) ? json_string_value(json_object_get(d, "tensor")) : "?",
                             json_string_value(json_object_get(d, "reason")) ? json_string_value(json_object_get(d, "reason")) : "?");
        }
        dw_strbuf_printf(b, "\n");
    }
    dw_strbuf_printf(b, "\nbulk error (rel error) per tensor: first, last and largest, at step\n");
    dw_strbuf_printf(b, "%-*s  %-4s %-11s %6s %-22s %-22s %-22s %9s %10s\n", w, "layer", "", "recipe", "checks", "first",
                     "last", "max", "overflow", "underflow");
    for (int i = 0; i < r->n; i++)
        for (int t = 0; t < NT; t++) {
            const tstat *s = &r->l[i].t[t];
            if (!s->checks) continue;
            char f[3][40];
            const point *p[3] = {&s->first, &s->last, &s->max};
            for (int k = 0; k < 3; k++)
                snprintf(f[k], sizeof f[k], "%.3g (%.3g) @%lld", p[k]->bulk, p[k]->rel, (long long)p[k]->step);
            dw_strbuf_printf(b, "%-*s  %-4s %-11s %6lld %-22s %-22s %-22s %9lld %10lld\n", w, r->l[i].name, TENSOR[t],
                             s->recipe, (long long)s->checks, f[0], f[1], f[2], (long long)s->overflow,
                             (long long)s->underflow);
        }
    bool counted = false;
    for (int i = 0; i < r->n; i++) counted |= r->l[i].counted > 0;
    if (counted) {
        dw_strbuf_printf(b, "\noverflow / underflow counted by the quantisers at every training step\n");
        dw_strbuf_printf(b, "%-*s  %6s %21s %21s %21s\n", w, "layer", "steps", "x", "w", "dy");
        for (int i = 0; i < r->n; i++) {
            const layer *l = &r->l[i];
            if (!l->counted) continue;
            dw_strbuf_printf(b, "%-*s  %6lld", w, l->name, (long long)l->counted);
            for (int k = 0; k < NK; k++) {
                char c[48];
                snprintf(c, sizeof c, "%lld / %lld", (long long)l->c[k].overflow, (long long)l->c[k].underflow);
                dw_strbuf_printf(b, " %21s", c);
            }
            dw_strbuf_printf(b, "\n");
        }
    }
    if (r->every > 0)
        dw_strbuf_printf(b, "\nlargest bulk error per checkpoint interval (every %lld steps; - no check)\n",
                         (long long)r->every);
    else
        dw_strbuf_printf(b, "\nlargest bulk error over the run (no checkpoint interval known)\n");
    dw_strbuf_printf(b, "%-*s", w, "layer");
    for (int64_t k = 0; k < r->intervals; k++) {
        char h[48];
        int64_t lo, hi;
        interval_steps(r, k, &lo, &hi);
        snprintf(h, sizeof h, "%lld-%lld", (long long)lo, (long long)hi);
        dw_strbuf_printf(b, " %9s", h);
    }
    dw_strbuf_printf(b, "\n");
    for (int i = 0; i < r->n; i++) {
        dw_strbuf_printf(b, "%-*s", w, r->l[i].name);
        for (int64_t k = 0; k < r->intervals; k++)
            if (isnan(r->l[i].imax[k])) dw_strbuf_printf(b, " %9s", "-");
            else dw_strbuf_printf(b, " %9.4g", r->l[i].imax[k]);
        dw_strbuf_printf(b, "\n");
    }
}

static json_t *point_json(const point *p) {
    return json_pack("{s:I,s:f,s:f}", "step", (json_int_t)p->step, "bulk_error", p->bulk, "rel_error", p->rel);
}

static json_t *json_report(const report *r, const char *dir) {
    json_t *layers = json_array();
    for (int i = 0; layers && i < r->n; i++) {
        const layer *l = &r->l[i];
        char rec[64];
        recipe_text(l, rec, sizeof rec);
        json_t *ts = json_array(), *iv = json_array();
        for (int t = 0; ts && t < NT; t++) {
            const tstat *s = &l->t[t];
            if (!s->checks) continue;
            json_array_append_new(ts, json_pack("{s:s,s:s,s:I,s:o,s:o,s:o,s:I,s:I}", "tensor", TENSOR[t], "recipe",
                                                s->recipe, "checks", (json_int_t)s->checks, "first", point_json(&s->first),
                                                "last", point_json(&s->last), "max", point_json(&s->max), "overflow",
                                                (json_int_t)s->overflow, "underflow", (json_int_t)s->underflow));
        }
        for (int64_t k = 0; iv && k < r->intervals; k++) {
            int64_t lo, hi;
            interval_steps(r, k, &lo, &hi);
            json_array_append_new(iv, json_pack("{s:I,s:I,s:o}", "from", (json_int_t)lo, "to", (json_int_t)hi, "max_bulk_error",
                                                isnan(l->imax[k]) ? json_null() : json_real(l->imax[k])));
        }
        json_t *cn = l->counted ? json_pack("{s:I}", "steps", (json_int_t)l->counted) : json_null();
        for (int k = 0; l->counted && cn && k < NK; k++)
            json_object_set_new(cn, KIND[k], json_pack("{s:I,s:I}", "overflow", (json_int_t)l->c[k].overflow, "underflow",
                                                      (json_int_t)l->c[k].underflow));
        json_array_append_new(layers, json_pack("{s:s,s:s,s:s,s:O,s:o,s:o,s:o}", "layer", l->name, "recipe", rec, "now",
                                                now_text(r, l), "fallbacks", l->fallbacks, "tensors", ts, "counts", cn,
                                                "intervals", iv));
    }
    return json_pack("{s:s,s:s?,s:I,s:I,s:I,s:I,s:o}", "run", dir, "checkpoint", r->ckpt, "checks", (json_int_t)r->checks,
                     "first_step", (json_int_t)r->first_step, "last_step", (json_int_t)r->last_step, "ckpt_every",
                     (json_int_t)r->every, "layers", layers);
}

dw_status dw_quant_run_report(dw_ctx *ctx, const char *run_dir, bool json, char **out) {
    if (out) *out = NULL;
    if (!run_dir || !out) return dw_set_error(ctx, DW_ERR_INVALID, "quant-report: no run directory");
    report r = {.ctx = ctx};
    dw_status st = checkpoint(&r, run_dir);
    if (st == DW_OK) st = each_line(&r, run_dir, "quant_stats.jsonl", true, first_pass);
    r.intervals = interval_of(&r, r.last_step) + 1;
    for (int i = 0; st == DW_OK && i < r.n; i++) {
        if (!(r.l[i].imax = malloc((size_t)r.intervals * sizeof *r.l[i].imax))) {
            st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
            break;
        }
        for (int64_t k = 0; k < r.intervals; k++) r.l[i].imax[k] = NAN;
    }
    if (st == DW_OK) st = each_line(&r, run_dir, "quant_stats.jsonl", true, stat_line);
    if (st == DW_OK) st = each_line(&r, run_dir, "precision_decisions.jsonl", false, decision_line);
    for (int i = 0; st == DW_OK && i < r.n; i++) { /* a decision for a layer never measured: a row of dashes */
        if (r.l[i].imax) continue;
        if (!(r.l[i].imax = malloc((size_t)r.intervals * sizeof *r.l[i].imax))) {
            st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
            break;
        }
        for (int64_t k = 0; k < r.intervals; k++) r.l[i].imax[k] = NAN;
    }
    if (st == DW_OK) {
        dw_strbuf b = {0};
        if (json) {
            json_t *j = json_report(&r, run_dir);
            char *t = j ? json_dumps(j, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
            if (t) dw_strbuf_printf(&b, "%s", t);
            else b.oom = true;
            free(t);
            json_decref(j);
        } else {
            text_report(&r, run_dir, &b);
        }
        if (b.oom || !b.s) {
            free(b.s);
            st = dw_set_error(ctx, DW_ERR_NOMEM, "quant-report: out of memory");
        } else {
            *out = b.s;
        }
    }
    for (int i = 0; i < r.n; i++) {
        free(r.l[i].name);
        free(r.l[i].imax);
        json_decref(r.l[i].fallbacks);
    }
    free(r.l);
    free(r.ckpt);
    json_decref(r.now);
    return st;
}
