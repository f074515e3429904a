/* registry.c — the kernel registry: a table of candidate kernels (built-in and user-registered)
 * and the selection rule (matching fields, predicate, highest priority, earliest on ties) with
 * an explanation of every decision. Not thread-safe: register before concurrent use. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "core/error.h"
#include "gemm/autotune.h"
#include "gemm/builtins.h"
#include "gemm/compute_capability.h"
#include "gemm/gemm_args.h"
#include "gemm/registry.h"

#define DW_REGISTRY_CAP 256
#define DW_KNAME_CAP 64

typedef struct {
    dw_kernel_desc d;
    char name[DW_KNAME_CAP];
} entry;

static entry g_table[DW_REGISTRY_CAP];
static int g_count;
static bool g_builtins;

/* Adds the built-in kernels (builtins.c) before the first use of the table. */
static void ensure_builtins(void) {
    if (g_builtins) return;
    g_builtins = true;
    const dw_kernel_desc *builtin[DW_REGISTRY_CAP];
    int n = dw_gemm_builtin_kernels(builtin, DW_REGISTRY_CAP);
    for (int i = 0; i < n; i++) {
        dw_status s = dw_kernel_register(builtin[i]);
        DW_ASSERT(s == DW_OK);
    }
}

static int find(const char *name) {
    for (int i = 0; i < g_count; i++)
        if (!strcmp(g_table[i].name, name)) return i;
    return -1;
}

dw_status dw_kernel_register(const dw_kernel_desc *k) {
    ensure_builtins();
    if (!k || !k->name || !k->name[0] || !k->run)
        return dw_set_error(NULL, DW_ERR_INVALID, "kernel_register: a kernel needs a name and a run function");
    if (strlen(k->name) >= DW_KNAME_CAP)
        return dw_set_error(NULL, DW_ERR_INVALID, "kernel_register: name '%s' is longer than %d bytes", k->name,
                            DW_KNAME_CAP - 1);
    if (k->op != DW_KOP_GEMM)
        return dw_set_error(NULL, DW_ERR_INVALID, "kernel_register %s: unknown op %d", k->name, (int)k->op);
    if (k->device != DW_DEVICE_CPU && k->device != DW_DEVICE_CUDA)
        return dw_set_error(NULL, DW_ERR_INVALID, "kernel_register %s: device must be CPU or CUDA", k->name);
    int i = find(k->name);
    if (i < 0) {
        if (g_count == DW_REGISTRY_CAP)
            return dw_set_error(NULL, DW_ERR_NOMEM, "kernel_register %s: the table is full (%d)", k->name,
                                DW_REGISTRY_CAP);
        i = g_count++;
    }
    g_table[i].d = *k;
    snprintf(g_table[i].name, sizeof g_table[i].name, "%s", k->name);
    g_table[i].d.name = g_table[i].name;
    return DW_OK;
}

bool dw_kernel_unregister(const char *name) {
    ensure_builtins();
    int i = name ? find(name) : -1;
    if (i < 0) return false;
    memmove(&g_table[i], &g_table[i + 1], (size_t)(g_count - i - 1) * sizeof g_table[0]);
    g_count--;
    for (int j = i; j < g_count; j++) g_table[j].d.name = g_table[j].name; /* re-point after move */
    return true;
}

/* Why entry e cannot run args on ctx (NULL when it can). */
static const char *reject_reason(const entry *e, const dw_gemm_args *a, dw_device_kind dev, int sm,
                                 char *buf, size_t n) {
    const dw_kernel_desc *d = &e->d;
    if (d->op != DW_KOP_GEMM) return "not a GEMM kernel";
    if (a->backend && strcmp(a->backend, e->name)) return "not the requested backend";
    if ((int)dev != d->device) return d->device == DW_DEVICE_CPU ? "CPU kernel, CUDA context" : "CUDA kernel, CPU context";
    if (d->device == DW_DEVICE_CUDA && (d->sm_min || d->sm_max) && (sm < d->sm_min || sm > d->sm_max)) {
        snprintf(buf, n, "needs sm_%d..sm_%d, device is sm_%d", d->sm_min, d->sm_max, sm);
        return buf;
    }
    if (d->recipe_a >= 0 && d->recipe_a != a->a.recipe) {
        snprintf(buf, n, "A must be %s", dw_recipe_name((dw_recipe)d->recipe_a));
        return buf;
    }
    if (d->recipe_b >= 0 && d->recipe_b != a->b.recipe) {
        snprintf(buf, n, "B must be %s", dw_recipe_name((dw_recipe)d->recipe_b));
        return buf;
    }
    const char *why = NULL;
    if (d->eligible && !d->eligible(a, d->user, &why)) return why ? why : "predicate rejected";
    return NULL;
}

/* Selection for a device and compute capability; appends the account to `log` (may be NULL). */
static const entry *select_on(dw_device_kind dev, int sm, const dw_gemm_args *a, char *log, size_t logn) {
    ensure_builtins();
    const entry *best = NULL;
    size_t used = log ? strlen(log) : 0;
    for (int i = 0; i < g_count; i++) {
        char buf[160];
        const char *why = reject_reason(&g_table[i], a, dev, sm, buf, sizeof buf);
        if (!why && (!best || g_table[i].d.priority > best->d.priority)) best = &g_table[i];
        if (log && used < logn) {
            int w = snprintf(log + used, logn - used, "  %-28s prio %3d  %s%s\n", g_table[i].name,
                             (int)g_table[i].d.priority, why ? "rejected: " : "eligible", why ? why : "");
            if (w > 0) used += (size_t)w;
            if (used >= logn) used = logn - 1;
        }
    }
    return best;
}

static const entry *select_entry(dw_ctx *ctx, const dw_gemm_args *a, char *log, size_t logn) {
    return select_on(dw_ctx_device(ctx), dw_gemm_ctx_sm(ctx), a, log, logn);
}

const char *dw_gemm_registry_pick(dw_device_kind device, int sm, const dw_gemm_args *a, char *why, size_t why_len) {
    const entry *e = select_on(device, sm, a, NULL, 0);
    if (why && why_len) why[0] = '\0';
    if (e || !why || !why_len) return e ? e->name : NULL;
    /* every kernel of this device and sm whose predicate refused, in registration order, each
     * distinct reason once: the kernels' own rules say why (no guess at which one "should" run) */
    size_t used = 0;
    for (int i = 0; i < g_count; i++) {
        const dw_kernel_desc *d = &g_table[i].d;
        const bool here = d->device == (int)device && (!(d->sm_min || d->sm_max) || (sm >= d->sm_min && sm <= d->sm_max));
        const bool fields = (d->recipe_a < 0 || d->recipe_a == a->a.recipe) && (d->recipe_b < 0 || d->recipe_b == a->b.recipe);
        const char *w = NULL;
        if (!here || !fields || !d->eligible || d->eligible(a, d->user, &w) || !w || strstr(why, w)) continue;
        int n = snprintf(why + used, why_len - used, "%s%s: %s", used ? "; " : "", g_table[i].name, w);
        if (n < 0 || (size_t)n >= why_len - used) { /* cut: say so */
            if (why_len > 4) memcpy(why + why_len - 4, "...", 4);
            return NULL;
        }
        used += (size_t)n;
    }
    if (!used)
        snprintf(why, why_len, "no kernel takes A=%s B=%s on %s sm_%d", dw_recipe_name((dw_recipe)a->a.recipe),
                 dw_recipe_name((dw_recipe)a->b.recipe), device == DW_DEVICE_CUDA ? "cuda" : "cpu", sm);
    return NULL;
}

/* The eligible entries for a on ctx (at most cap), highest priority first. */
static int eligible_entries(dw_ctx *ctx, const dw_gemm_args *a, const dw_kernel_desc **out, int cap) {
    dw_device_kind dev = dw_ctx_device(ctx);
    int sm = dw_gemm_ctx_sm(ctx), n = 0;
    for (int i = 0; i < g_count && n < cap; i++) {
        char buf[160];
        if (!reject_reason(&g_table[i], a, dev, sm, buf, sizeof buf)) out[n++] = &g_table[i].d;
    }
    for (int i = 1; i < n; i++) /* stable insertion sort by priority, descending */
        for (int j = i; j > 0 && out[j]->priority > out[j - 1]->priority; j--) {
            const dw_kernel_desc *t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    return n;
}

/* The autotuned choice for a, if autotuning applies and has (or, with tune, makes) one. */
static const dw_kernel_desc *tuned_choice(dw_ctx *ctx, const dw_gemm_args *a, bool tune) {
    if (!dw_gemm_autotune_enabled() || a->backend || dw_ctx_device(ctx) != DW_DEVICE_CUDA) return NULL;
    const dw_kernel_desc *cands[DW_REGISTRY_CAP];
    int n = eligible_entries(ctx, a, cands, DW_REGISTRY_CAP);
    if (n < 2) return NULL;
    const char *name = tune ? dw_gemm_autotune_pick(ctx, a, cands, n) : dw_gemm_autotune_lookup(ctx, a, NULL);
    for (int i = 0; name && i < n; i++)
        if (!strcmp(cands[i]->name, name)) return cands[i];
    return NULL; /* the winner was unregistered or is no longer eligible: fall back to priority */
}

dw_status dw_gemm_registry_select(dw_ctx *ctx, const dw_gemm_args *a, bool tune, const dw_kernel_desc **out) {
    *out = NULL;
    ensure_builtins();
    const dw_kernel_desc *t = tuned_choice(ctx, a, tune);
    if (t) {
        *out = t;
        return DW_OK;
    }
    const entry *e = select_entry(ctx, a, NULL, 0);
    if (e) {
        *out = &e->d;
        return DW_OK;
    }
    char log[4096] = "";
    select_entry(ctx, a, log, sizeof log);
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "gemm: no kernel for A=%s%s B=%s%s on %s:\n%s",
                        dw_recipe_name((dw_recipe)a->a.recipe), a->a.trans ? "^T" : "",
                        dw_recipe_name((dw_recipe)a->b.recipe), a->b.trans ? "^T" : "",
                        dw_ctx_device(ctx) == DW_DEVICE_CUDA ? "cuda" : "cpu", log);
}

dw_status dw_gemm_explain(dw_ctx *ctx, const dw_gemm_args *a, char **out) {
    *out = NULL;
    DW_TRY(dw_gemm_validate(ctx, a));
    size_t cap = 16384;
    char *s = malloc(cap);
    if (!s) return dw_set_error(ctx, DW_ERR_NOMEM, "gemm_explain: out of memory");
    int sm = dw_gemm_ctx_sm(ctx);
    int w = snprintf(s, cap, "gemm %lldx%lldx%lld A=%s%s B=%s%s epilogue=0x%x on %s (sm_%d)\n", (long long)a->m,
                     (long long)a->n, (long long)a->k, dw_recipe_name((dw_recipe)a->a.recipe),
                     a->a.trans ? "^T" : "", dw_recipe_name((dw_recipe)a->b.recipe), a->b.trans ? "^T" : "",
                     (unsigned)a->epilogue, dw_ctx_device(ctx) == DW_DEVICE_CUDA ? "cuda" : "cpu", sm);
    (void)w;
    const entry *e = select_entry(ctx, a, s, cap - 256);
    size_t used = strlen(s);
    const dw_kernel_desc *t = tuned_choice(ctx, a, false);
    double ms = 0;
    if (t && dw_gemm_autotune_lookup(ctx, a, &ms))
        snprintf(s + used, cap - used, "selected: %s (autotuned: fastest eligible, %.4f ms per call; by priority: %s)\n",
                 t->name, ms, e ? e->name : "(none)");
    else
        snprintf(s + used, cap - used, "selected: %s%s\n", e ? e->name : "(none)",
                 dw_gemm_autotune_enabled() && dw_ctx_device(ctx) == DW_DEVICE_CUDA ? " (autotune on, not yet timed)" : "");
    *out = s;
    return DW_OK;
}
