/* moe_bias.c — auxiliary-loss-free load balancing (moe_bias.h): γ from the flag, the checkpoint
 * or config.json; the sign update after each step; state.json's "moe_bias" in hex floats. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "runtime/engine.h"
#include "runtime/engine_moe_bias.h"
#include "train/ckpt.h"
#include "train/moe_bias.h"

void dw_moe_bias_free(dw_moe_bias *b) {
    free(b->bias);
    free(b->json);
    memset(b, 0, sizeof *b);
}

void dw_moe_bias_update(float *bias, const double *load, int64_t E, float gamma) {
    double total = 0.0; /* whole counts: exact in double below 2^53 */
    for (int64_t x = 0; x < E; x++) total += load[x];
    for (int64_t x = 0; x < E; x++) {
        const double above = (double)E * load[x]; /* E·load vs the sum: the sign of mean − load */
        if (total > above) bias[x] = bias[x] + gamma;
        else if (total < above) bias[x] = bias[x] - gamma;
    }
}

double dw_moe_bias_max_abs(const dw_moe_bias *b) {
    if (!b->layers) return NAN;
    double m = 0.0;
    for (int64_t i = 0; i < b->layers * b->experts; i++) m = fabs((double)b->bias[i]) > m ? fabs((double)b->bias[i]) : m;
    return m;
}

dw_status dw_moe_bias_step(dw_ctx *ctx, dw_engine *e, const dw_moe_routing *m, dw_moe_bias *b) {
    if (!b->layers) return DW_OK;
    if (m->layers != b->layers || m->experts != b->experts)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "train: the MoE selection bias needs one dispatch per router "
                            "(%lld routers of %lld experts, %lld dispatches of %lld)", (long long)b->layers,
                            (long long)b->experts, (long long)m->layers, (long long)m->experts);
    double *load = malloc((size_t)b->experts * sizeof *load);
    if (!load) return dw_set_error(ctx, DW_ERR_NOMEM, "train: out of memory");
    for (int64_t l = 0; l < b->layers; l++) {
        for (int64_t x = 0; x < b->experts; x++) load[x] = dw_moe_routing_load(m, l, x);
        dw_moe_bias_update(b->bias + l * b->experts, load, b->experts, b->gamma);
    }
    free(load);
    return dw_engine_moe_bias_set(e, b->bias);
}

static json_t *hexf(double v) {
    char t[40];
    snprintf(t, sizeof t, "%a", v);
    return json_string(t);
}

const char *dw_moe_bias_json(dw_moe_bias *b) {
    free(b->json);
    b->json = NULL;
    if (!b->layers) return NULL;
    json_t *rows = json_array(), *j = json_object();
    for (int64_t l = 0; rows && l < b->layers; l++) {
        json_t *row = json_array();
        for (int64_t x = 0; row && x < b->experts; x++) json_array_append_new(row, hexf(b->bias[l * b->experts + x]));
        json_array_append_new(rows, row);
    }
    if (j && rows) {
        json_object_set_new(j, "update_speed", hexf(b->gamma));
        json_object_set_new(j, "layers", json_integer(b->layers));
        json_object_set_new(j, "experts", json_integer(b->experts));
        json_object_set_new(j, "values", rows);
        rows = NULL;
    }
    b->json = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(rows);
    json_decref(j);
    return b->json;
}

/* A hex float string of state.json that is a finite FP32 value. */
static dw_status get_hexf(dw_ctx *ctx, const json_t *v, const char *what, const char *field, float *out) {
    const char *t = json_is_string(v) ? json_string_value(v) : NULL;
    char *end = NULL;
    const double d = t ? strtod(t, &end) : NAN;
    if (!t || end == t || *end || !isfinite(d) || (double)(float)d != d)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: moe_bias.%s: expected a finite FP32 value as a hex float string "
                            "(\"0x1.0624dep-10\")", what, field);
    *out = (float)d;
    return DW_OK;
}

/* ckpt_dir's state.json "moe_bias" into b (shaped as the engine's routers); *found false when
 * the run had none. */
static dw_status load_state(dw_ctx *ctx, const char *ckpt_dir, dw_moe_bias *b, bool *found) {
    *found = false;
    char *path = dw_path_join(ckpt_dir, "state.json");
    if (!path) return dw_set_error(ctx, DW_ERR_NOMEM, "train: out of memory");
    json_t *doc = NULL;
    dw_status st = dw_json_load_file(ctx, path, &doc);
    const json_t *mb = st == DW_OK ? json_object_get(doc, "moe_bias") : NULL;
    long long L = 0, E = 0;
    if (mb) {
        *found = true;
        if (!json_is_object(mb)) st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: moe_bias: not an object", path);
        if (st == DW_OK) st = dw_json_get_int(ctx, mb, "layers", path, &L);
        if (st == DW_OK) st = dw_json_get_int(ctx, mb, "experts", path, &E);
        if (st == DW_OK && (L != b->layers || E != b->experts))
            st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: moe_bias is %lld routers x %lld experts, the model has %lld x %lld",
                              path, L, E, (long long)b->layers, (long long)b->experts);
        if (st == DW_OK) st = get_hexf(ctx, json_object_get(mb, "update_speed"), path, "update_speed", &b->gamma);
        if (st == DW_OK && !(b->gamma > 0))
            st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: moe_bias.update_speed must be > 0", path);
        const json_t *rows = json_object_get(mb, "values");
        if (st == DW_OK && !(json_is_array(rows) && (long long)json_array_size(rows) == L))
            st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: moe_bias.values: expected %lld rows", path, L);
        for (long long l = 0; st == DW_OK && l < L; l++) {
            const json_t *row = json_array_get(rows, (size_t)l);
            char field[64];
            snprintf(field, sizeof field, "values[%lld]", l);
            if (!(json_is_array(row) && (long long)json_array_size(row) == E))
                st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: moe_bias.%s: expected %lld values", path, field, E);
            for (long long x = 0; st == DW_OK && x < E; x++) {
                snprintf(field, sizeof field, "values[%lld][%lld]", l, x);
                st = get_hexf(ctx, json_array_get(row, (size_t)x), path, field, &b->bias[l * E + x]);
            }
        }
    }
    json_decref(doc);
    free(path);
    return st;
}

/* The model config's moe_bias_update_speed (0: none) from the graph's config.json text. */
static dw_status config_speed(dw_ctx *ctx, const dw_engine *e, double *out) {
    *out = 0.0;
    const char *text = e->g->model.config_json;
    if (!text) return DW_OK;
    json_t *j = NULL;
    DW_TRY(dw_json_load_string(ctx, text, strlen(text), "the model's config.json", &j));
    dw_status st = dw_json_get_num_opt(ctx, j, "moe_bias_update_speed", "the model's config.json", out);
    json_decref(j);
    return st;
}

dw_status dw_moe_bias_reload(dw_ctx *ctx, dw_engine *e, const char *ckpt_dir, dw_moe_bias *b) {
    if (!b->layers) return DW_OK;
    const float gamma = b->gamma;
    bool found = false;
    memset(b->bias, 0, (size_t)(b->layers * b->experts) * sizeof *b->bias);
    DW_TRY(load_state(ctx, ckpt_dir, b, &found));
    b->gamma = gamma;
    return dw_engine_moe_bias_set(e, b->bias);
}

dw_status dw_moe_bias_init(dw_ctx *ctx, dw_engine *e, double gamma_opt, const char *ckpt_dir, dw_moe_bias *b) {
    memset(b, 0, sizeof *b);
    if (!(isfinite(gamma_opt) && gamma_opt >= 0 && gamma_opt <= 1) || (gamma_opt > 0 && !((float)gamma_opt > 0)))
        return dw_set_error(ctx, DW_ERR_INVALID, "--moe-bias-update %g: the bias update speed must be a finite "
                            "number in [0, 1] (0: the model's; off unless its config.json asks)", gamma_opt);
    int64_t L = 0, E = 0;
    dw_engine_moe_bias_shape(e, &L, &E);
    if (!L) {
        if (gamma_opt > 0)
            return dw_set_error(ctx, DW_ERR_INVALID, "--moe-bias-update %g: the model has no MoE router to bias",
                                gamma_opt);
        return DW_OK;
    }
    b->layers = L, b->experts = E;
    b->bias = calloc((size_t)(L * E), sizeof *b->bias);
    if (!b->bias) return dw_set_error(ctx, DW_ERR_NOMEM, "train: out of memory");
    bool resumed = false;
    dw_status st = ckpt_dir ? load_state(ctx, ckpt_dir, b, &resumed) : DW_OK;
    const bool tensor = dw_engine_moe_bias_is_tensor(e); /* the weights brought it (e_score_correction_bias) */
    double speed = 0.0;
    if (st == DW_OK && !resumed) st = config_speed(ctx, e, &speed);
    if (st == DW_OK && !resumed && tensor) st = dw_engine_moe_bias_get(e, b->bias, NULL); /* it starts there */
    if (st == DW_OK) {
        if (gamma_opt > 0) b->gamma = (float)gamma_opt;
        else if (!resumed) b->gamma = (float)speed;
        if (!(b->gamma > 0)) { /* no update: the weights' bias stays as loaded, else the routers choose by the logits */
            dw_moe_bias_free(b);
            return tensor ? DW_OK : dw_engine_moe_bias_set(e, NULL);
        }
        st = dw_engine_moe_bias_set(e, b->bias);
    }
    if (st != DW_OK) dw_moe_bias_free(b);
    return st;
}
