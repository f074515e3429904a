/* autotune.c — the optional autotune cache: with autotuning on, the first dw_gemm of a problem
 * (device, shape, recipes, layouts, output type, epilogue) on a CUDA context times every eligible
 * kernel (one warm-up call, then 3 calls under CUDA events) and remembers the fastest; later calls
 * and dw_gemm_select/explain use the remembered winner. Off by default; DW_GEMM_AUTOTUNE=1 or
 * dw_gemm_set_autotune(true) turns it on. Process-wide, not thread-safe, not persisted. */
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "core/ctx.h"
#include "core/error.h"
#include "gemm/autotune.h"
#include "gemm/compute_capability.h"
#include "gemm/gemm_dev.h"

#define TUNE_CAP 256

typedef struct {
    int32_t dev, sm;
    int64_t m, n, k;
    int32_t ra, rb, out_type, epilogue;
    int32_t ta, tb, beta0;
} tune_key;

typedef struct {
    tune_key key;
    char name[64];
    double ms;
} tune_entry;

static tune_entry g_tune[TUNE_CAP];
static int g_ntune;
static int g_enabled = -1; /* -1: not yet read from the environment */

void dw_gemm_set_autotune(bool on) { g_enabled = on ? 1 : 0; }

bool dw_gemm_autotune_enabled(void) {
    if (g_enabled < 0) {
        const char *e = dw_env("DW_GEMM_AUTOTUNE"); /* any value but 0 turns it on */
        g_enabled = e && strcmp(e, "0") != 0;
    }
    return g_enabled == 1;
}

static tune_key make_key(dw_ctx *ctx, const dw_gemm_args *a) {
    tune_key k;
    memset(&k, 0, sizeof k); /* padding too: keys are compared with memcmp */
    k.dev = dw_ctx_device_index(ctx);
    k.sm = dw_gemm_ctx_sm(ctx);
    k.m = a->m, k.n = a->n, k.k = a->k;
    k.ra = a->a.recipe, k.rb = a->b.recipe, k.out_type = a->out_type, k.epilogue = a->epilogue;
    k.ta = a->a.trans, k.tb = a->b.trans, k.beta0 = a->beta == 0.0f;
    return k;
}

const char *dw_gemm_autotune_lookup(dw_ctx *ctx, const dw_gemm_args *a, double *ms) {
    tune_key k = make_key(ctx, a);
    for (int i = 0; i < g_ntune; i++)
        if (!memcmp(&g_tune[i].key, &k, sizeof k)) {
            if (ms) *ms = g_tune[i].ms;
            return g_tune[i].name;
        }
    return NULL;
}

typedef struct {
    dw_ctx *ctx;
    const dw_gemm_args *a;
    const dw_kernel_desc *k;
} tune_arg;

static dw_status tune_run(void *p, int i) {
    (void)i;
    tune_arg *t = p;
    return t->k->run(t->ctx, t->a, t->k->user);
}

const char *dw_gemm_autotune_pick(dw_ctx *ctx, const dw_gemm_args *a, const dw_kernel_desc *const *cands, int n) {
    const char *hit = dw_gemm_autotune_lookup(ctx, a, NULL);
    if (hit) return hit;
    /* timing runs write d (and aux, bgrad): not when d is also the input C */
    if (a->beta != 0.0f && a->c == a->d) return NULL;
    int best = -1;
    double best_ms = 0;
    for (int i = 0; i < n; i++) {
        tune_arg t = {ctx, a, cands[i]};
        double ms = 0;
        if (dw_gemm_dev_time(ctx, 1, tune_run, &t, &ms) != DW_OK ||
            dw_gemm_dev_time(ctx, 3, tune_run, &t, &ms) != DW_OK) {
            dw_clear_error(ctx); /* a candidate that fails simply does not win */
            continue;
        }
        if (best < 0 || ms < best_ms) best = i, best_ms = ms;
    }
    if (best < 0) return NULL;
    tune_entry *e = &g_tune[g_ntune < TUNE_CAP ? g_ntune++ : (int)(a->m % TUNE_CAP)];
    e->key = make_key(ctx, a);
    size_t len = strlen(cands[best]->name);
    if (len >= sizeof e->name) len = sizeof e->name - 1;
    memcpy(e->name, cands[best]->name, len);
    e->name[len] = 0;
    e->ms = best_ms / 3;
    return e->name;
}
