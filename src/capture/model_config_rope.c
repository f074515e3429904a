/* model_config_rope.c — RoPE's base, frequency type and rotary width in a Hugging Face config.json,
 * both ways: transformers 4's rope_theta beside rope_scaling {"rope_type" (or "type"), "factor", ...}
 * and transformers 5's rope_parameters {"rope_type", "rope_theta", ...} (read last: it wins when a
 * config has both). Types default, linear, llama3, yarn and longrope ("su" its old name)
 * (kernels/rope_freq.h computes their frequencies); dynamic and any other type are refused by name.
 * partial_rotary_factor (top level or in the rope object) below 1 for phi3 only, whose attention
 * rotates the first int(head_dim x factor) dims and passes the rest (transformers' other families
 * here rotate the whole head). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "capture/model_config_impl.h"
#include "core/error.h"
#include "core/json.h"

#define PHI3_ORIGINAL_MAX 4096.0 /* transformers' Phi3Config default of original_max_position_embeddings */

/* Yarn's attention factor from the magnitude scale: 1 up to factor 1, else 0.1 m ln(factor) + 1. */
static double yarn_mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * log(factor) + 1.0; }

/* Longrope's attention factor when the config gives none: 1 up to factor 1, else
 * sqrt(1 + ln(factor) / ln(original)) (transformers' _compute_longrope_parameters, the LongRoPE paper). */
static double longrope_attention(double factor, double original) {
    return factor <= 1 ? 1.0 : sqrt(1.0 + log(factor) / log(original));
}

/* partial_rotary_factor of o (the top level or a rope object) into *partial when present. */
static dw_status read_partial(dw_ctx *ctx, const json_t *o, const char *what, double *partial) {
    return dw_json_get_num_opt(ctx, o, "partial_rotary_factor", what, partial);
}

/* c->rope_scaling.rotary_dim from the factor: int(head_dim x factor) as transformers truncates, 0 when
 * the whole head rotates; below 1 for phi3 only, an even width of at least 2. */
static dw_status set_rotary_dim(dw_ctx *ctx, double partial, const char *what, dw_model_config *c) {
    if (partial == 1.0) return DW_OK;
    if (c->arch != DW_ARCH_PHI3)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: partial_rotary_factor %g is not supported for %s (1 only: "
                            "RoPE over the whole head; phi3 reads it)", what, partial, c->model_type);
    const double r = floor((double)c->head_dim * partial);
    if (!(partial > 0 && partial <= 1) || r < 2 || fmod(r, 2.0) != 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: partial_rotary_factor %g: int(head_dim %lld x %g) = %g rotary "
                            "dims, need an even number of at least 2 and a factor in (0, 1]", what, partial,
                            (long long)c->head_dim, partial, r);
    c->rope_scaling.rotary_dim = r == (double)c->head_dim ? 0 : (int32_t)r;
    return DW_OK;
}

/* longrope's list `key` of o into f: n positive finite numbers (n = rotary dims / 2). */
static dw_status read_factors(dw_ctx *ctx, const json_t *o, const char *key, const char *what, const char *type,
                              int64_t n, double *f) {
    const json_t *a = json_object_get(o, key);
    if (!json_is_array(a) || (int64_t)json_array_size(a) != n) {
        char got[64] = "none";
        if (json_is_array(a)) snprintf(got, sizeof got, "a list of %zu", json_array_size(a));
        else if (a) snprintf(got, sizeof got, "no list");
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: rope type '%s': '%s' must be a list of %lld numbers (one per "
                            "rotary dimension pair: rotary dims %lld / 2), got %s", what, type, key, (long long)n,
                            (long long)(2 * n), got);
    }
    if (n > DW_ROPE_MAX_FACTORS)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: rope type '%s': '%s' of %lld entries: at most %d rotary "
                            "dimension pairs are supported", what, type, key, (long long)n, DW_ROPE_MAX_FACTORS);
    for (int64_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, (size_t)i);
        f[i] = json_is_number(v) ? json_number_value(v) : NAN;
        if (!(f[i] > 0 && isfinite(f[i])))
            return dw_set_error(ctx, DW_ERR_INVALID, "%s: rope type '%s': '%s'[%lld] must be a positive finite "
                                "number", what, type, key, (long long)i);
    }
    return DW_OK;
}

/* Longrope (transformers' _compute_longrope_parameters): the lists, the original positions
 * (config.json's top-level original_max_position_embeddings as Phi-3 writes it, else the rope
 * object's, else phi3's default 4096, else max_position_embeddings) and the attention factor (given,
 * else from the extension max_position_embeddings / original when an original was named, else the
 * object's factor). */
static dw_status parse_longrope(dw_ctx *ctx, const json_t *j, const json_t *o, const char *what, const char *type,
                                const dw_model_config *c, dw_rope_scaling *r) {
    const int64_t pairs = dw_rope_dim(r, c->head_dim) / 2;
    DW_TRY(read_factors(ctx, o, "short_factor", what, type, pairs, r->short_factor));
    DW_TRY(read_factors(ctx, o, "long_factor", what, type, pairs, r->long_factor));
    r->n_factors = (int32_t)pairs;
    double original = 0, factor = 1;
    DW_TRY(dw_json_get_num_opt(ctx, j, "original_max_position_embeddings", what, &original));
    if (!original) DW_TRY(dw_json_get_num_opt(ctx, o, "original_max_position_embeddings", what, &original));
    if (!original && c->arch == DW_ARCH_PHI3) original = PHI3_ORIGINAL_MAX;
    if (original) {
        factor = (double)c->max_seq / original;
    } else {
        original = (double)c->max_seq;
        DW_TRY(dw_json_get_num_opt(ctx, o, "factor", what, &factor));
    }
    r->original_max = original;
    r->attention_factor = original >= 1 && factor > 0 ? longrope_attention(factor, original) : 0;
    return dw_json_get_num_opt(ctx, o, "attention_factor", what, &r->attention_factor);
}

/* The fields of one rope object `o` (the config's key `key`, j the whole config) into c; its
 * rotary width already set. */
static dw_status parse_rope_object(dw_ctx *ctx, const json_t *j, const json_t *o, const char *key, const char *file,
                                   dw_model_config *c) {
    char what[600];
    snprintf(what, sizeof what, "%s: field '%s'", file, key); /* errors: "config.json: field 'rope_scaling': ..." */
    const char *type = NULL;
    DW_TRY(dw_json_get_str_opt(ctx, o, "rope_type", what, &type));
    if (!type) DW_TRY(dw_json_get_str_opt(ctx, o, "type", what, &type)); /* transformers before 4.43 */
    if (!type) type = "default";
    dw_rope_scaling r = {.type = -1, .rotary_dim = c->rope_scaling.rotary_dim};
    for (int32_t t = 0; t < DW_ROPE_TYPE_COUNT; t++)
        if (!strcmp(type, dw_rope_type_name(t))) r.type = t;
    if (!strcmp(type, "su")) r.type = DW_ROPE_LONGROPE; /* Phi-3's first name for it */
    if (r.type < 0)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: rope type '%s' is not supported (supported: default, linear, "
                            "llama3, yarn, longrope)", what, type);
    DW_TRY(dw_json_get_num_opt(ctx, o, "rope_theta", what, &c->rope_theta));
    if (r.type == DW_ROPE_YARN) { /* factor optional: the ratio of the positions then */
        r.original_max = (double)c->max_seq;
        DW_TRY(dw_json_get_num_opt(ctx, o, "original_max_position_embeddings", what, &r.original_max));
        r.factor = r.original_max > 0 ? (double)c->max_seq / r.original_max : 0;
        DW_TRY(dw_json_get_num_opt(ctx, o, "factor", what, &r.factor));
        r.beta_fast = 32, r.beta_slow = 1, r.truncate = true;
        DW_TRY(dw_json_get_num_opt(ctx, o, "beta_fast", what, &r.beta_fast));
        DW_TRY(dw_json_get_num_opt(ctx, o, "beta_slow", what, &r.beta_slow));
        DW_TRY(dw_json_get_bool_opt(ctx, o, "truncate", what, &r.truncate));
        double mscale = 0, mscale_all_dim = 0;
        DW_TRY(dw_json_get_num_opt(ctx, o, "mscale", what, &mscale));
        DW_TRY(dw_json_get_num_opt(ctx, o, "mscale_all_dim", what, &mscale_all_dim));
        r.attention_factor = mscale && mscale_all_dim
                                 ? yarn_mscale(r.factor, mscale) / yarn_mscale(r.factor, mscale_all_dim)
                                 : yarn_mscale(r.factor, 1.0);
        DW_TRY(dw_json_get_num_opt(ctx, o, "attention_factor", what, &r.attention_factor));
    } else if (r.type == DW_ROPE_LONGROPE) {
        DW_TRY(parse_longrope(ctx, j, o, what, type, c, &r));
    } else if (r.type != DW_ROPE_DEFAULT) {
        DW_TRY(dw_json_get_num(ctx, o, "factor", what, &r.factor));
    }
    if (r.type == DW_ROPE_LLAMA3) {
        DW_TRY(dw_json_get_num(ctx, o, "low_freq_factor", what, &r.low_freq_factor));
        DW_TRY(dw_json_get_num(ctx, o, "high_freq_factor", what, &r.high_freq_factor));
        DW_TRY(dw_json_get_num(ctx, o, "original_max_position_embeddings", what, &r.original_max));
    }
    if (r.type == DW_ROPE_DEFAULT) r = (dw_rope_scaling){.rotary_dim = r.rotary_dim};
    const char *bad = dw_rope_scaling_problem(&r, c->rope_theta, c->head_dim);
    if (bad) return dw_set_error(ctx, DW_ERR_INVALID, "%s: rope type '%s': %s", what, type, bad);
    c->rope_scaling = r;
    return DW_OK;
}

dw_status dw_model_config_parse_rope(dw_ctx *ctx, const json_t *j, const char *what, dw_model_config *c) {
    c->rope_scaling = (dw_rope_scaling){0};
    DW_TRY(dw_json_get_num_opt(ctx, j, "rope_theta", what, &c->rope_theta));
    static const char *const keys[] = {"rope_scaling", "rope_parameters"};
    double partial = 1.0; /* first the rotary width, which longrope's lists are measured against */
    DW_TRY(read_partial(ctx, j, what, &partial));
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const json_t *o = json_object_get(j, keys[k]);
        if (!o || json_is_null(o)) continue;
        if (!json_is_object(o))
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field '%s': expected an object or null", what, keys[k]);
        DW_TRY(read_partial(ctx, o, what, &partial));
    }
    DW_TRY(set_rotary_dim(ctx, partial, what, c));
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const json_t *o = json_object_get(j, keys[k]);
        if (o && !json_is_null(o)) DW_TRY(parse_rope_object(ctx, j, o, keys[k], what, c));
    }
    return DW_OK;
}

json_t *dw_json_whole(double v) {
    return v == floor(v) && v >= 0 && v < 9e15 ? json_integer((json_int_t)v) : json_real(v);
}

/* partial_rotary_factor R / head_dim, nudged up until transformers' int(head_dim x factor) gives R. */
static double partial_factor(int64_t R, int64_t D) {
    double f = (double)R / (double)D;
    while (floor((double)D * f) < (double)R) f = nextafter(f, 2.0);
    return f;
}

/* [v[0], ..., v[n-1]] */
static json_t *reals(const double *v, int32_t n) {
    json_t *a = json_array();
    for (int32_t i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

/* Longrope as the family's transformers reads it: Phi3Config (4.x) wants exactly type, short_factor and
 * long_factor in rope_scaling and original_max_position_embeddings at the top level; the attention
 * factor is written only when it is not the one those imply. */
static void write_longrope(json_t *j, json_t *o, const dw_model_config *c) {
    const dw_rope_scaling *r = &c->rope_scaling;
    json_object_set_new(o, c->arch == DW_ARCH_PHI3 ? "type" : "rope_type", json_string("longrope"));
    json_object_set_new(o, "short_factor", reals(r->short_factor, r->n_factors));
    json_object_set_new(o, "long_factor", reals(r->long_factor, r->n_factors));
    json_object_set_new(j, "original_max_position_embeddings", dw_json_whole(r->original_max));
    if (r->attention_factor != longrope_attention((double)c->max_seq / r->original_max, r->original_max))
        json_object_set_new(o, "attention_factor", json_real(r->attention_factor));
}

void dw_model_config_write_rope(json_t *j, const dw_model_config *c) {
    json_object_set_new(j, "rope_theta", json_real(c->rope_theta));
    const dw_rope_scaling *r = &c->rope_scaling;
    if (r->rotary_dim)
        json_object_set_new(j, "partial_rotary_factor", json_real(partial_factor(r->rotary_dim, c->head_dim)));
    if (r->type == DW_ROPE_DEFAULT) {
        json_object_set_new(j, "rope_scaling", json_null());
        return;
    }
    json_t *o = json_object(); /* transformers 4's form, which transformers 5 also reads */
    if (r->type == DW_ROPE_LONGROPE) {
        write_longrope(j, o, c);
        json_object_set_new(j, "rope_scaling", o);
        return;
    }
    json_object_set_new(o, "rope_type", json_string(dw_rope_type_name(r->type)));
    json_object_set_new(o, "factor", json_real(r->factor));
    if (r->type != DW_ROPE_LINEAR) /* an integer, as transformers writes it */
        json_object_set_new(o, "original_max_position_embeddings", dw_json_whole(r->original_max));
    if (r->type == DW_ROPE_LLAMA3) {
        json_object_set_new(o, "low_freq_factor", json_real(r->low_freq_factor));
        json_object_set_new(o, "high_freq_factor", json_real(r->high_freq_factor));
    }
    if (r->type == DW_ROPE_YARN) {
        json_object_set_new(o, "beta_fast", json_real(r->beta_fast));
        json_object_set_new(o, "beta_slow", json_real(r->beta_slow));
        json_object_set_new(o, "attention_factor", json_real(r->attention_factor));
        json_object_set_new(o, "truncate", json_boolean(r->truncate));
    }
    json_object_set_new(j, "rope_scaling", o);
}
