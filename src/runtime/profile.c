/* profile.c — per-op time breakdown of a training step (see profile.h): runs the engine's timed
 * eager steps (a timer between every step of the program), sums step times per op kind and per
 * node role, sorts, prints and writes JSON; and the optimizer's steps, summed per step kind. */
#include "runtime/profile.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "ir/ir.h"
#include "runtime/engine.h"

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
    const dw_compiled *p = dw_engine_program(e);
    const int first = p->phase[DW_PHASE_FORWARD][0], last = p->phase[DW_PHASE_BACKWARD][1], n = last - first;
    double *ms = calloc((size_t)p->n_steps + 1, sizeof *ms), *sum = calloc((size_t)p->n_steps + 1, sizeof *sum);
    s->ops = calloc((size_t)(n + 1), sizeof *s->ops);
    s->roles = calloc((size_t)(n + 1), sizeof *s->roles);
    dw_status st = ms && sum && s->ops && s->roles ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "profile: out of memory");
    if (st == DW_OK) st = dw_engine_time_steps(e, tokens, targets, B, T, 1.0, ms); /* warm-up */
    for (int r = 0; st == DW_OK && r < steps; r++) {
        st = dw_engine_time_steps(e, tokens, targets, B, T, 1.0, ms);
        for (int k = first; st == DW_OK && k < last; k++) sum[k] += ms[k];
    }
    for (int k = first; st == DW_OK && k < last; k++) {
        const dw_step *step = &p->steps[k];
        const dw_ir_node *node = dw_compile_node(p, step->node); /* a fused LM head's loss: head_xent */
        const char *dir = step->kind == DW_STEP_FWD ? "fwd" : step->kind == DW_STEP_BWD ? "bwd" : "zero grad";
        char key[96], role[80];
        role_of(node->name, role, sizeof role);
        const double t = sum[k] / steps;
        s->total_ms += t;
        snprintf(key, sizeof key, "%s %s", dw_op_name(node->op), dir);
        add_row(s->ops, &s->n_ops, n, key, t);
        snprintf(key, sizeof key, "%s %s", role, dir);
        add_row(s->roles, &s->n_roles, n, key, t);
    }
    free(ms), free(sum);
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
    fprintf(f, "\n%s (eager step, timers between steps, mean of the timed steps; %.2f ms in all):\n", title, total);
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
    const dw_compiled *p = dw_engine_program(e);
    const int first = p->phase[DW_PHASE_OPTIMIZER][0], last = p->phase[DW_PHASE_OPTIMIZER][1];
    double *ms = calloc((size_t)p->n_steps + 1, sizeof *ms);
    if (!ms) return dw_set_error(ctx, DW_ERR_NOMEM, "profile: out of memory");
    dw_adamw_opts ao;
    dw_adamw_opts_init(&ao, sizeof ao);
    ao.lr = 3e-4;
    /* rows: zeroing the gradients, then one per optimizer step kind in program order */
    o->name[0] = "zero grad";
    o->n = 1;
    dw_status st = DW_OK;
    for (int r = 0; st == DW_OK && r < reps; r++) {
        double zero = 0;
        st = dw_engine_time_optimizer(e, &ao, 1000 + r, ms, &zero);
        o->ms[0] += zero / reps;
        for (int k = first; st == DW_OK && k < last; k++) {
            const char *name = dw_step_kind_name((dw_step_kind)p->steps[k].kind);
            int row = 1;
            while (row < o->n && strcmp(o->name[row], name)) row++;
            if (row == o->n && o->n < DW_PROF_OPT_ROWS) o->name[o->n++] = name;
            if (row < o->n) o->ms[row] += ms[k] / reps;
        }
    }
    free(ms);
    for (int k = 0; k < o->n; k++) o->total_ms += o->ms[k];
    return st;
}

void dw_prof_print_optimizer(FILE *f, const dw_prof_opt *o, bool json) {
    if (json) {
        fprintf(f, "  \"optimizer\": [");
        for (int k = 0; k < o->n; k++)
            fprintf(f, "%s{\"name\": \"%s\", \"ms\": %.4f}", k ? ", " : "", o->name[k], o->ms[k]);
        fprintf(f, "]\n");
        return;
    }
    fprintf(f, "\noptimizer step (eager, timers between its steps; %.2f ms in all):\n", o->total_ms);
    for (int k = 0; k < o->n; k++)
        fprintf(f, "  %-40s %9.3f ms %6.1f%%\n", o->name[k], o->ms[k], o->total_ms > 0 ? 100.0 * o->ms[k] / o->total_ms : 0.0);
}

/* ---- the public profile (deepwell.h): a summary and, optionally, the optimizer's rows ---------- */
struct dw_profile {
    dw_prof_summary s;
    dw_prof_opt o;
    bool has_opt;
};

dw_status dw_engine_profile(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T,
                            int steps, bool optimizer, dw_profile **out) {
    *out = NULL;
    dw_ctx *ctx = e->ctx;
    dw_profile *p = calloc(1, sizeof *p);
    if (!p) return dw_set_error(ctx, DW_ERR_NOMEM, "profile: out of memory");
    dw_status st = dw_prof_run(ctx, e, tokens, targets, B, T, steps, &p->s);
    if (st == DW_OK && optimizer) st = dw_prof_optimizer(ctx, e, 3, &p->o), p->has_opt = st == DW_OK;
    if (st != DW_OK) {
        dw_profile_free(p);
        return st;
    }
    *out = p;
    return DW_OK;
}

void dw_profile_free(dw_profile *p) {
    if (!p) return;
    dw_prof_free(&p->s);
    free(p);
}

double dw_profile_step_ms(const dw_profile *p) { return p->s.total_ms; }

/* What f-printing code writes, as a malloc'd string (NULL when out of memory). */
static char *to_string(void (*fn)(FILE *, const dw_profile *, int), const dw_profile *p, int top) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    fn(f, p, top);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void text(FILE *f, const dw_profile *p, int top) {
    dw_prof_print(f, &p->s, top);
    if (p->has_opt) dw_prof_print_optimizer(f, &p->o, false);
}

static void json_fields(FILE *f, const dw_profile *p, int top) {
    (void)top;
    fprintf(f, "  \"profile_eager_ms\": %.4f,\n", p->s.total_ms);
    dw_prof_print_json_fields(f, &p->s);
    if (p->has_opt) {
        fprintf(f, ",");
        dw_prof_print_optimizer(f, &p->o, true);
    }
}

char *dw_profile_text(const dw_profile *p, int top) { return to_string(text, p, top); }
char *dw_profile_json_fields(const dw_profile *p) { return to_string(json_fields, p, 0); }

dw_status dw_profile_save(dw_ctx *ctx, const dw_profile *p, const char *path) { return dw_prof_write_json(ctx, &p->s, path); }

dw_status dw_profile_load(dw_ctx *ctx, const char *path, dw_profile **out) {
    *out = NULL;
    dw_profile *p = calloc(1, sizeof *p);
    if (!p) return dw_set_error(ctx, DW_ERR_NOMEM, "profile: out of memory");
    dw_status st = dw_prof_read_json(ctx, path, &p->s);
    if (st != DW_OK) {
        free(p);
        return st;
    }
    *out = p;
    return DW_OK;
}
