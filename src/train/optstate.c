/* optstate.c — AdamW moments for a parameter list, the step over all of them, and their
 * safetensors file (see optstate.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "train/optstate.h"

struct dw_optim {
    int n;
    dw_param **params; /* (n) borrowed */
    float **m, **v;    /* (n) each numel floats, carved from `store` */
    float *store;
};

dw_status dw_optim_create(dw_ctx *ctx, dw_param *const *params, int n, dw_optim **out) {
    *out = NULL;
    dw_optim *o = calloc(1, sizeof *o);
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += params[i]->numel;
    if (o) {
        o->n = n;
        o->params = malloc((size_t)(n ? n : 1) * sizeof *o->params);
        o->m = malloc((size_t)(n ? n : 1) * sizeof *o->m);
        o->v = malloc((size_t)(n ? n : 1) * sizeof *o->v);
        o->store = calloc((size_t)(2 * total + 1), sizeof(float));
    }
    if (!o || !o->params || !o->m || !o->v || !o->store) {
        dw_optim_free(o);
        return dw_set_error(ctx, DW_ERR_NOMEM, "cannot allocate optimizer state (%lld floats)",
                            (long long)(2 * total));
    }
    float *p = o->store;
    for (int i = 0; i < n; i++) {
        o->params[i] = params[i];
        o->m[i] = p;
        p += params[i]->numel;
        o->v[i] = p;
        p += params[i]->numel;
    }
    *out = o;
    return DW_OK;
}

void dw_optim_free(dw_optim *o) {
    if (!o) return;
    free(o->params);
    free(o->m);
    free(o->v);
    free(o->store);
    free(o);
}

void dw_optim_moments(dw_optim *o, int i, float **m, float **v) {
    *m = o->m[i];
    *v = o->v[i];
}

double dw_optim_grad_norm(const dw_optim *o) {
    double s = 0.0;
    for (int i = 0; i < o->n; i++) s += dw_sumsq_cpu(o->params[i]->grad, o->params[i]->numel);
    return sqrt(s);
}

void dw_optim_step(dw_optim *o, const dw_adamw_hparams *h, int64_t t, double grad_scale) {
    for (int i = 0; i < o->n; i++) {
        dw_param *p = o->params[i];
        dw_adamw_step_cpu(p->data, p->grad, o->m[i], o->v[i], p->numel, h, t, p->decay, grad_scale);
    }
}

static char *suffixed(const char *name, const char *suffix) {
    size_t n = strlen(name) + strlen(suffix) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s", name, suffix);
    return s;
}

dw_status dw_optim_save(dw_ctx *ctx, const dw_optim *o, const char *path) {
    dw_st_writer *w = NULL;
    DW_TRY(dw_st_writer_create(ctx, &w));
    dw_status st = dw_st_writer_set_metadata(ctx, w, "deepwell.optimizer", "adamw");
    if (st == DW_OK)
        st = dw_st_writer_set_metadata(ctx, w, "deepwell.layout",
                                       "Deepwell's (torch.nn.Linear out x in for every linear)");
    for (int i = 0; i < o->n && st == DW_OK; i++) {
        const dw_param *p = o->params[i];
        for (int k = 0; k < 2 && st == DW_OK; k++) {
            char *name = suffixed(p->name, k ? DW_OPTIM_V_SUFFIX : DW_OPTIM_M_SUFFIX);
            if (!name) {
                st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
                break;
            }
            st = dw_st_writer_add(ctx, w, name, DW_DT_F32, p->ndim, p->shape, k ? o->v[i] : o->m[i],
                                  (size_t)p->numel * sizeof(float));
            free(name);
        }
    }
    if (st == DW_OK) st = dw_st_writer_commit(ctx, w, path);
    dw_st_writer_free(w);
    return st;
}

/* The tensor `name` of f, checked to be F32 with p's shape. */
static dw_status find_checked(dw_ctx *ctx, const dw_st_file *f, const char *path, const dw_param *p,
                              const char *suffix, const dw_st_tensor **out) {
    char *name = suffixed(p->name, suffix);
    if (!name) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    const dw_st_tensor *t = dw_st_find(f, name);
    dw_status st = DW_OK;
    if (!t) {
        st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s' is missing", path, name);
    } else if (t->dtype != DW_DT_F32) {
        st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s' is %s, expected F32", path, name,
                          dw_dtype_name(t->dtype));
    } else {
        bool same = t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
        if (!same)
            st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s' has a shape other than the model's parameter",
                              path, name);
    }
    free(name);
    *out = t;
    return st;
}

dw_status dw_optim_load(dw_ctx *ctx, dw_optim *o, const char *path) {
    dw_st_file *f = NULL;
    DW_TRY(dw_st_open(ctx, path, &f));
    dw_status st = DW_OK;
    if (dw_st_count(f) != 2 * o->n)
        st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: %d tensors, expected %d (two per parameter)", path,
                          dw_st_count(f), 2 * o->n);
    const dw_st_tensor *t;
    for (int i = 0; i < o->n && st == DW_OK; i++) {
        st = find_checked(ctx, f, path, o->params[i], DW_OPTIM_M_SUFFIX, &t);
        if (st == DW_OK) st = find_checked(ctx, f, path, o->params[i], DW_OPTIM_V_SUFFIX, &t);
    }
    for (int i = 0; i < o->n && st == DW_OK; i++) {
        st = find_checked(ctx, f, path, o->params[i], DW_OPTIM_M_SUFFIX, &t);
        if (st == DW_OK) memcpy(o->m[i], t->data, t->nbytes);
        if (st == DW_OK) st = find_checked(ctx, f, path, o->params[i], DW_OPTIM_V_SUFFIX, &t);
        if (st == DW_OK) memcpy(o->v[i], t->data, t->nbytes);
    }
    dw_st_close(f);
    return st;
}
