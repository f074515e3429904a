/* profile.c — per-op time breakdown of a CUDA training step (see profile.h): runs the engine's
 * event-timed eager step, sums node times per op kind and per node role, sorts, prints and
 * writes JSON. */
#include "runtime/profile.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "ir/ir.h"
#include "runtime/engine_cpu.h"
#include "runtime/engine_cuda.h"

/* Adds ms to the row named key (linear search: a few hundred rows at most). */
static void add_row(dw_prof_row *rows, int *n, int cap, const char *key, double ms) {
    for (int i = 0; i < *n; i++)
        if (!strcmp(rows[i].key, key)) {
            rows[i].ms += ms;
            return;
        }
    if (*n >= cap) return;
    snprintf(rows[*n].key, sizeof rows[*n].key, "%s", key);
    rows[(*n)++].ms = ms;
}

static int by_time(const void *a, const void *b) {
    double x = ((const dw_prof_row *)a)->ms, y = ((const dw_prof_row *)b)->ms;
    return x > y ? -1 : x < y;
}

/* "h.11.attn.c_proj" -> "h.#.attn.c_proj" */
static void role_of(const char *name, char *out, size_t cap) {
    size_t o = 0;
    for (const char *p = name; *p && o + 1 < cap; p++) {
        if (*p >= '0' && *p <= '9') {
            out[o++] = '#';
            while (p[1] >= '0' && p[1] <= '9') p++;
        } else {
            out[o++] = *p;
        }
    }
    out[o] = 0;
}

dw_status dw_prof_run(dw_ctx *ctx, dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B,
                      int64_t T, int steps, dw_prof_summary *s) {
    memset(s, 0, sizeof *s);
    if (steps < 1) return dw_set_error(ctx, DW_ERR_INVALID, "profile: steps must be >= 1");
    if (!e->cuda) return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "profile: needs the CUDA engine (--device cuda)");
    int n = 0;
    dw_engine_prof probe;
    DW_TRY(dw_engine_cuda_profile_step(e, tokens, targets, B, T, 1.0, &probe, 0, &n)); /* warm-up, node count */
    dw_engine_prof *p = calloc((size_t)(n ? n : 1), sizeof *p);
    double *fwd = calloc((size_t)(n ? n : 1), sizeof *fwd), *bwd = calloc((size_t)(n ? n : 1), sizeof *bwd);
    s->ops = calloc((size_t)(2 * n + 1), sizeof *s->ops);
    s->roles = calloc((size_t)(2 * n + 1), sizeof *s->roles);
    dw_status st = p && fwd && bwd && s->ops && s->roles ? DW_OK
                                                          : dw_set_error(ctx, DW_ERR_NOMEM, "profile: out of memory");
    for (int r = 0; st == DW_OK && r < steps; r++) {
        st = dw_engine_cuda_profile_step(e, tokens, targets, B, T, 1.0, p, n, &n);
        for (int i = 0; st == DW_OK && i < n; i++) fwd[i] += p[i].fwd_ms, bwd[i] += p[i].bwd_ms;
    }
    for (int i = 0; st == DW_OK && i < n; i++) {
        char key[96], role[80];
        role_of(p[i].name, role, sizeof role);
        const char *op = dw_op_name((dw_op)p[i].op);
        for (int d = 0; d < 2; d++) {
            double ms = (d ? bwd[i] : fwd[i]) / steps;
            s->total_ms += ms;
            snprintf(key, sizeof key, "%s %s", op, d ? "bwd" : "fwd");
            add_row(s->ops, &s->n_ops, 2 * n, key, ms);
            snprintf(key, sizeof key, "%s %s", role, d ? "bwd" : "fwd");
            add_row(s->roles, &s->n_roles, 2 * n, key, ms);
        }
    }
    free(p), free(fwd), free(bwd);
    if (st != DW_OK) {
        dw_prof_free(s);
        return st;
    }
    s->steps = steps;
    qsort(s->ops, (size_t)s->n_ops, sizeof *s->ops, by_time);
    qsort(s->roles, (size_t)s->n_roles, sizeof *s->roles, by_time);
    return DW_OK;
}

void dw_prof_free(dw_prof_summary *s) {
    free(s->ops);
    free(s->roles);
    memset(s, 0, sizeof *s);
}

static void print_table(FILE *f, const char *title, const dw_prof_row *rows, int n, double total, int top) {
    int shown = top > 0 && top < n ? top : n;
    double rest = 0;
    for (int i = shown; i < n; i++) rest += rows[i].ms;
    fprintf(f, "\n%s (eager step, CUDA events, mean of the timed steps; %.2f ms in all):\n", title, total);
    for (int i = 0; i < shown; i++)
        fprintf(f, "  %-40s %9.3f ms %6.1f%%\n", rows[i].key, rows[i].ms, 100.0 * rows[i].ms / total);
    if (shown < n) fprintf(f, "  %-40s %9.3f ms %6.1f%%\n", "(the other rows)", rest, 100.0 * rest / total);
}

void dw_prof_print(FILE *f, const dw_prof_summary *s, int top) {
    print_table(f, "per op", s->ops, s->n_ops, s->total_ms, top);
    print_table(f, "per node role", s->roles, s->n_roles, s->total_ms, top);
}

static json_t *rows_json(const dw_prof_row *rows, int n, double total) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        json_array_append_new(a, json_pack("{s:s, s:f, s:f}", "name", rows[i].key, "ms", rows[i].ms, "share",
                                           total > 0 ? rows[i].ms / total : 0.0));
    return a;
}

dw_status dw_prof_write_json(dw_ctx *ctx, const dw_prof_summary *s, const char *path) {
    json_t *j = json_pack("{s:i, s:f, s:o, s:o}", "steps", s->steps, "step_ms", s->total_ms, "per_op",
                          rows_json(s->ops, s->n_ops, s->total_ms), "per_role",
                          rows_json(s->roles, s->n_roles, s->total_ms));
    char *text = j ? dw_json_dump(j, true) : NULL;
    json_decref(j);
    if (!text) return dw_set_error(ctx, DW_ERR_NOMEM, "profile: out of memory writing %s", path);
    dw_status st = dw_write_file_atomic(ctx, path, text, strlen(text));
    free(text);
    return st;
}

static dw_status rows_from_json(dw_ctx *ctx, const json_t *j, const char *key, const char *path, dw_prof_row **rows,
                                int *n) {
    const json_t *a = json_object_get(j, key);
    if (!json_is_array(a)) return dw_set_error(ctx, DW_ERR_FORMAT, "%s: \"%s\" is missing or not an array", path, key);
    *n = (int)json_array_size(a);
    *rows = calloc((size_t)*n + 1, sizeof **rows);
    if (!*rows) return dw_set_error(ctx, DW_ERR_NOMEM, "profile: out of memory reading %s", path);
    for (int i = 0; i < *n; i++) {
        const json_t *r = json_array_get(a, (size_t)i);
        const char *name = NULL;
        char what[4200];
        snprintf(what, sizeof what, "%s: %s[%d]", path, key, i);
        DW_TRY(dw_json_get_str(ctx, r, "name", what, &name));
        DW_TRY(dw_json_get_num(ctx, r, "ms", what, &(*rows)[i].ms));
        snprintf((*rows)[i].key, sizeof (*rows)[i].key, "%s", name);
    }
    return DW_OK;
}

dw_status dw_prof_read_json(dw_ctx *ctx, const char *path, dw_prof_summary *s) {
    memset(s, 0, sizeof *s);
    json_t *j = NULL;
    DW_TRY(dw_json_load_file(ctx, path, &j));
    long long steps = 0;
    dw_status st = dw_json_get_int(ctx, j, "steps", path, &steps);
    if (st == DW_OK) st = dw_json_get_num(ctx, j, "step_ms", path, &s->total_ms);
    if (st == DW_OK) st = rows_from_json(ctx, j, "per_op", path, &s->ops, &s->n_ops);
    if (st == DW_OK) st = rows_from_json(ctx, j, "per_role", path, &s->roles, &s->n_roles);
    json_decref(j);
    if (st != DW_OK) {
        dw_prof_free(s);
        return st;
    }
    s->steps = (int)steps;
    return DW_OK;
}

void dw_prof_print_json_fields(FILE *f, const dw_prof_summary *s) {
    const char *names[2] = {"per_op", "per_role"};
    const dw_prof_row *rows[2] = {s->ops, s->roles};
    const int n[2] = {s->n_ops, s->n_roles};
    for (int t = 0; t < 2; t++) { /* the same rows as profile.json, through the same serialiser */
        json_t *a = rows_json(rows[t], n[t], s->total_ms);
        char *text = a ? dw_json_dump(a, false) : NULL;
        fprintf(f, "  \"%s\": %s%s\n", names[t], text ? text : "null", t ? "" : ",");
        free(text);
        json_decref(a);
    }
}

dw_status dw_prof_optimizer(dw_ctx *ctx, dw_engine *e, int reps, dw_prof_opt *o) {
    memset(o, 0, sizeof *o);
    if (reps < 1) return dw_set_error(ctx, DW_ERR_INVALID, "profile: reps must be >= 1");
    if (!e->cuda) return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "profile: needs the CUDA engine (--device cuda)");
    _Static_assert(DW_PROF_OPT_PHASES == DW_OPT_PHASES, "one row per optimizer phase");
    DW_TRY(dw_engine_cuda_profile_optimizer(e, 3e-4, 0.9, 0.95, 1e-8, 0.1, 1.0, reps, o->ms));
    for (int k = 0; k < DW_PROF_OPT_PHASES; k++) o->name[k] = dw_opt_phase_names[k], o->total_ms += o->ms[k];
    return DW_OK;
}

void dw_prof_print_optimizer(FILE *f, const dw_prof_opt *o, bool json) {
    if (json) {
        fprintf(f, "  \"optimizer\": [");
        for (int k = 0; k < DW_PROF_OPT_PHASES; k++)
            fprintf(f, "%s{\"name\": \"%s\", \"ms\": %.4f}", k ? ", " : "", o->name[k], o->ms[k]);
        fprintf(f, "]\n");
        return;
    }
    fprintf(f, "\noptimizer step (eager, CUDA events between phases; %.2f ms in all):\n", o->total_ms);
    for (int k = 0; k < DW_PROF_OPT_PHASES; k++)
        fprintf(f, "  %-40s %9.3f ms %6.1f%%\n", o->name[k], o->ms[k], o->total_ms > 0 ? 100.0 * o->ms[k] / o->total_ms : 0.0);
}
