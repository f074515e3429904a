/* grouped_registry.c — the grouped GEMM kind of the kernel registry: a table of candidate grouped
 * expert GEMMs (built-in and user-registered), the selection rule (matching fields, predicate,
 * highest priority, earliest on ties) with an account of every decision, and dw_grouped_gemm,
 * which runs the selected one. Not thread-safe: register before concurrent use. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "core/error.h"
#include "gemm/compute_capability.h"
#include "gemm/grouped.h"
#include "gemm/grouped_fp8.h"
#include "gemm/grouped_mxfp8.h"

#define DW_GROUPED_CAP 64
#define DW_GNAME_CAP 64

typedef struct {
    dw_grouped_kernel_desc d;
    char name[DW_GNAME_CAP];
} gentry;

static gentry g_table[DW_GROUPED_CAP];
static int g_count;
static bool g_builtins;

static void ensure_builtins(void) {
    if (g_builtins) return;
    g_builtins = true;
    const dw_grouped_kernel_desc *b[DW_GROUPED_CAP];
    int n = dw_grouped_builtin_kernels(b, DW_GROUPED_CAP);
    n += dw_grouped_fp8_kernels(b + n, DW_GROUPED_CAP - n);   /* grouped_fp8.c */
    n += dw_grouped_mxfp8_kernels(b + n, DW_GROUPED_CAP - n); /* grouped_mxfp8.c */
    for (int i = 0; i < n; i++) {
        dw_status s = dw_grouped_kernel_register(b[i]);
        DW_ASSERT(s == DW_OK);
    }
}

static int find(const char *name) {
    for (int i = 0; i < g_count; i++)
        if (!strcmp(g_table[i].name, name)) return i;
    return -1;
}

dw_status dw_grouped_kernel_register(const dw_grouped_kernel_desc *k) {
    ensure_builtins();
    if (!k || !k->name || !k->name[0] || !k->run)
        return dw_set_error(NULL, DW_ERR_INVALID, "grouped_kernel_register: a kernel needs a name and a run function");
    if (strlen(k->name) >= DW_GNAME_CAP)
        return dw_set_error(NULL, DW_ERR_INVALID, "grouped_kernel_register: name '%s' is longer than %d bytes",
                            k->name, DW_GNAME_CAP - 1);
    if (k->device != DW_DEVICE_CPU && k->device != DW_DEVICE_CUDA)
        return dw_set_error(NULL, DW_ERR_INVALID, "grouped_kernel_register %s: device must be CPU or CUDA", k->name);
    int i = find(k->name);
    if (i < 0) {
        if (g_count == DW_GROUPED_CAP)
            return dw_set_error(NULL, DW_ERR_NOMEM, "grouped_kernel_register %s: the table is full (%d)", k->name,
                                DW_GROUPED_CAP);
        i = g_count++;
    }
    g_table[i].d = *k;
    snprintf(g_table[i].name, sizeof g_table[i].name, "%s", k->name);
    g_table[i].d.name = g_table[i].name;
    return DW_OK;
}

bool dw_grouped_kernel_unregister(const char *name) {
    ensure_builtins();
    const int i = name ? find(name) : -1;
    if (i < 0) return false;
    memmove(&g_table[i], &g_table[i + 1], (size_t)(g_count - i - 1) * sizeof g_table[0]);
    g_count--;
    for (int j = i; j < g_count; j++) g_table[j].d.name = g_table[j].name; /* re-point after the move */
    return true;
}

static const char *dtype_name(int32_t dt) { return dt == DW_GROUPED_BF16 ? "bf16" : dt == DW_GROUPED_F32 ? "fp32" : "?"; }
static const char *pass_name(int32_t p) { return p == DW_GEMM_FPROP ? "fprop" : p == DW_GEMM_DGRAD ? "dgrad" : "wgrad"; }

/* Why entry d cannot run a on dev / sm (NULL when it can). */
static const char *reject_reason(const dw_grouped_kernel_desc *d, const dw_grouped_args *a, dw_device_kind dev, int sm,
                                 char *buf, size_t n) {
    if (a->backend && strcmp(a->backend, d->name)) return "not the requested backend";
    if ((int)dev != d->device) return d->device == DW_DEVICE_CPU ? "CPU kernel, CUDA target" : "CUDA kernel, CPU target";
    if (d->device == DW_DEVICE_CUDA && (sm < d->sm_min || (d->sm_max && sm > d->sm_max))) {
        if (d->sm_max == d->sm_min) snprintf(buf, n, "needs sm_%d, device is sm_%d", d->sm_min, sm);
        else if (d->sm_max) snprintf(buf, n, "needs sm_%d..sm_%d, device is sm_%d", d->sm_min, d->sm_max, sm);
        else snprintf(buf, n, "needs sm_%d or later, device is sm_%d", d->sm_min, sm);
        return buf;
    }
    if (d->dtype >= 0 && d->dtype != a->dtype) {
        snprintf(buf, n, "operands must be %s, not %s", dtype_name(d->dtype), dtype_name(a->dtype));
        return buf;
    }
    if (d->recipe >= 0 && d->recipe != a->recipe) {
        snprintf(buf, n, "recipe must be %s, not %s", dw_recipe_name((dw_recipe)d->recipe), dw_recipe_name((dw_recipe)a->recipe));
        return buf;
    }
    const char *why = NULL;
    if (d->eligible && !d->eligible(a, d->user, &why)) return why ? why : "predicate rejected";
    return NULL;
}

/* The selection on dev / sm among the entries keep accepts (NULL: all); its account appended to
 * log (may be NULL). */
static const gentry *select_on(dw_device_kind dev, int sm, const dw_grouped_args *a,
                               bool (*keep)(const dw_grouped_kernel_desc *), char *log, size_t logn) {
    ensure_builtins();
    const gentry *best = NULL;
    size_t used = log ? strlen(log) : 0;
    for (int i = 0; i < g_count; i++) {
        if (keep && !keep(&g_table[i].d)) continue;
        char buf[160];
        const char *why = reject_reason(&g_table[i].d, a, dev, sm, buf, sizeof buf);
        if (!why && (!best || g_table[i].d.priority > best->d.priority)) best = &g_table[i];
        if (log && used + 1 < logn) {
            const int w = snprintf(log + used, logn - used, "  %-28s prio %3d  %s%s\n", g_table[i].name,
                                   (int)g_table[i].d.priority, why ? "rejected: " : "eligible", why ? why : "");
            if (w > 0) used += (size_t)w;
            if (used >= logn) used = logn - 1;
        }
    }
    return best;
}

const char *dw_grouped_registry_pick(dw_device_kind device, int sm, const dw_grouped_args *a, char *log, size_t logn) {
    const gentry *e = select_on(device, sm, a, NULL, log, logn);
    return e ? e->name : NULL;
}

static bool builtin_cuda(const dw_grouped_kernel_desc *d) { return dw_grouped_builtin_cuda_id(d) > 0; }

int dw_grouped_builtin_pick(int sm, const dw_grouped_args *a) {
    const gentry *e = select_on(DW_DEVICE_CUDA, sm, a, builtin_cuda, NULL, 0);
    return e ? dw_grouped_builtin_cuda_id(&e->d) : 0;
}

dw_status dw_grouped_validate(dw_ctx *ctx, const dw_grouped_args *a) {
    if (!a) return dw_set_error(ctx, DW_ERR_INVALID, "grouped gemm: no arguments");
    if (a->pass < DW_GEMM_FPROP || a->pass > DW_GEMM_WGRAD)
        return dw_set_error(ctx, DW_ERR_INVALID, "grouped gemm: pass %d is not fprop, dgrad or wgrad", (int)a->pass);
    if (a->dtype != DW_GROUPED_F32 && a->dtype != DW_GROUPED_BF16)
        return dw_set_error(ctx, DW_ERR_INVALID, "grouped gemm: dtype %d is not fp32 or bf16", (int)a->dtype);
    if (a->recipe < 0 || a->recipe >= DW_RECIPE_COUNT)
        return dw_set_error(ctx, DW_ERR_INVALID, "grouped gemm: unknown recipe %d", (int)a->recipe);
    if (a->rows < 0 || a->experts < 1 || a->k < 1 || a->m < 1)
        return dw_set_error(ctx, DW_ERR_INVALID, "grouped gemm %s: needs rows >= 0, experts, k and m >= 1 (rows %lld, "
                            "experts %lld, k %lld, m %lld)", pass_name(a->pass), (long long)a->rows,
                            (long long)a->experts, (long long)a->k, (long long)a->m);
    const bool need_x = a->pass != DW_GEMM_DGRAD, need_w = a->pass != DW_GEMM_WGRAD, need_dy = a->pass != DW_GEMM_FPROP;
    if (!a->out || !a->offsets || (need_x && !a->x) || (need_w && !a->w) || (need_dy && !a->dy))
        return dw_set_error(ctx, DW_ERR_INVALID, "grouped gemm %s: needs out, offsets%s%s%s", pass_name(a->pass),
                            need_x ? ", x" : "", need_w ? ", w" : "", need_dy ? ", dy" : "");
    if ((a->recipe == DW_RECIPE_FP8_BLOCK || a->recipe == DW_RECIPE_MXFP8) &&
        ((need_x && !a->x_scales) || (need_w && !a->w_scales) || (need_dy && !a->dy_scales)))
        return dw_set_error(ctx, DW_ERR_INVALID, "grouped gemm %s in %s: needs%s%s%s", pass_name(a->pass),
                            dw_recipe_name((dw_recipe)a->recipe), need_x ? " x_scales" : "", need_w ? " w_scales" : "",
                            need_dy ? " dy_scales" : "");
    return DW_OK;
}

static const gentry *select_ctx(dw_ctx *ctx, const dw_grouped_args *a, char *log, size_t logn) {
    return select_on(dw_ctx_device(ctx), dw_gemm_ctx_sm(ctx), a, NULL, log, logn);
}

/* The header line of an account: the problem and the target. */
static int header(char *s, size_t n, dw_ctx *ctx, const dw_grouped_args *a) {
    return snprintf(s, n, "grouped %s: rows %lld, %lld experts, k %lld -> m %lld, %s, recipe %s on %s (sm_%d)\n",
                    pass_name(a->pass), (long long)a->rows, (long long)a->experts, (long long)a->k, (long long)a->m,
                    dtype_name(a->dtype), dw_recipe_name((dw_recipe)a->recipe),
                    dw_ctx_device(ctx) == DW_DEVICE_CUDA ? "cuda" : "cpu", dw_gemm_ctx_sm(ctx));
}

static dw_status select_or_explain(dw_ctx *ctx, const dw_grouped_args *a, const gentry **out) {
    *out = select_ctx(ctx, a, NULL, 0);
    if (*out) return DW_OK;
    char log[4096];
    header(log, sizeof log, ctx, a);
    select_ctx(ctx, a, log, sizeof log);
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "no grouped kernel can run this: %s", log);
}

dw_status dw_grouped_select(dw_ctx *ctx, const dw_grouped_args *a, const char **name) {
    *name = NULL;
    DW_TRY(dw_grouped_validate(ctx, a));
    const gentry *e = NULL;
    DW_TRY(select_or_explain(ctx, a, &e));
    *name = e->name;
    return DW_OK;
}

/* The selected kernel on a; sumsq (a wgrad written over): a built-in CUDA kernel also writes dW's
 * blocks' sums of squares, *written says so (written may be NULL without sumsq). */
static dw_status run_selected(dw_ctx *ctx, const dw_grouped_args *a, double *sumsq, bool *written) {
    DW_TRY(dw_grouped_validate(ctx, a));
    const gentry *e = NULL;
    DW_TRY(select_or_explain(ctx, a, &e));
    const int id = sumsq && a->pass == DW_GEMM_WGRAD && a->overwrite ? dw_grouped_builtin_cuda_id(&e->d) : 0;
    const dw_status s = id ? dw_grouped_builtin_run_sumsq(ctx, a, id, sumsq) : e->d.run(ctx, a, e->d.user);
    if (s != DW_OK)
        return dw_prefix_error(ctx, s, "grouped %s rows %lld, %lld experts, %lldx%lld via %s", pass_name(a->pass),
                               (long long)a->rows, (long long)a->experts, (long long)a->k, (long long)a->m, e->name);
    if (written) *written = id != 0;
    return DW_OK;
}

dw_status dw_grouped_gemm(dw_ctx *ctx, const dw_grouped_args *a) { return run_selected(ctx, a, NULL, NULL); }

dw_status dw_grouped_gemm_sumsq(dw_ctx *ctx, const dw_grouped_args *a, double *sumsq, bool *written) {
    *written = false;
    return run_selected(ctx, a, sumsq, written);
}

dw_status dw_grouped_explain(dw_ctx *ctx, const dw_grouped_args *a, char **out) {
    *out = NULL;
    DW_TRY(dw_grouped_validate(ctx, a));
    const size_t cap = 8192;
    char *s = malloc(cap);
    if (!s) return dw_set_error(ctx, DW_ERR_NOMEM, "grouped_explain: out of memory");
    header(s, cap, ctx, a);
    const gentry *e = select_ctx(ctx, a, s, cap - 128);
    const size_t used = strlen(s);
    snprintf(s + used, cap - used, "selected: %s\n", e ? e->name : "(none)");
    *out = s;
    return DW_OK;
}
