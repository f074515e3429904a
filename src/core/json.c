/* json.c — Jansson helpers (see json.h). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"

dw_status dw_json_load_file(dw_ctx *ctx, const char *path, json_t **out) {
    *out = NULL;
    /* Read through dw_read_file, not json_load_file: a FIFO, device or directory is refused by
     * name instead of read (or waited on) forever. */
    char *text;
    size_t n;
    DW_TRY(dw_read_file(ctx, path, &text, &n));
    dw_status s = dw_json_load_string(ctx, text, n, path, out);
    free(text);
    return s;
}

dw_status dw_json_load_string(dw_ctx *ctx, const char *text, size_t len, const char *what,
                              json_t **out) {
    *out = NULL;
    json_error_t e;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &e);
    if (!j)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", what, e.line,
                            e.column, e.text);
    *out = j;
    return DW_OK;
}

static dw_status field(dw_ctx *ctx, const json_t *obj, const char *key, const char *what,
                       bool required, json_t **v) {
    *v = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    if (!*v && required) return dw_set_error(ctx, DW_ERR_FORMAT, "%s: missing field '%s'", what, key);
    if (*v && json_is_null(*v)) *v = required ? *v : NULL;
    return DW_OK;
}

static dw_status type_error(dw_ctx *ctx, const char *what, const char *key, const char *want) {
    return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field '%s': expected %s", what, key, want);
}

static dw_status get_int(dw_ctx *ctx, const json_t *obj, const char *key, const char *what,
                         long long *out, bool required) {
    json_t *v;
    DW_TRY(field(ctx, obj, key, what, required, &v));
    if (!v) return DW_OK;
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return DW_OK;
    }
    /* Some writers emit 1e6 or 32.0 for integers; accept exact integral reals. */
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == (double)(long long)d) {
            *out = (long long)d;
            return DW_OK;
        }
    }
    return type_error(ctx, what, key, "an integer");
}

dw_status dw_json_get_int(dw_ctx *ctx, const json_t *obj, const char *key, const char *what,
                          long long *out) {
    return get_int(ctx, obj, key, what, out, true);
}
dw_status dw_json_get_int_opt(dw_ctx *ctx, const json_t *obj, const char *key, const char *what,
                              long long *out) {
    return get_int(ctx, obj, key, what, out, false);
}

static dw_status get_num(dw_ctx *ctx, const json_t *obj, const char *key, const char *what,
                         double *out, bool required) {
    json_t *v;
    DW_TRY(field(ctx, obj, key, what, required, &v));
    if (!v) return DW_OK;
    if (!json_is_number(v)) return type_error(ctx, what, key, "a number");
    *out = json_number_value(v);
    return DW_OK;
}

dw_status dw_json_get_num(dw_ctx *ctx, const json_t *obj, const char *key, const char *what,
                          double *out) {
    return get_num(ctx, obj, key, what, out, true);
}
dw_status dw_json_get_num_opt(dw_ctx *ctx, const json_t *obj, const char *key, const char *what,
                              double *out) {
    return get_num(ctx, obj, key, what, out, false);
}

dw_status dw_json_get_bool_opt(dw_ctx *ctx, const json_t *obj, const char *key, const char *what,
                               bool *out) {
    json_t *v;
    DW_TRY(field(ctx, obj, key, what, false, &v));
    if (!v) return DW_OK;
    if (!json_is_boolean(v)) return type_error(ctx, what, key, "true or false");
    *out = json_is_true(v);
    return DW_OK;
}

static dw_status get_str(dw_ctx *ctx, const json_t *obj, const char *key, const char *what,
                         const char **out, bool required) {
    json_t *v;
    DW_TRY(field(ctx, obj, key, what, required, &v));
    if (!v) return DW_OK;
    if (!json_is_string(v)) return type_error(ctx, what, key, "a string");
    *out = json_string_value(v);
    return DW_OK;
}

dw_status dw_json_get_str(dw_ctx *ctx, const json_t *obj, const char *key, const char *what,
                          const char **out) {
    return get_str(ctx, obj, key, what, out, true);
}
dw_status dw_json_get_str_opt(dw_ctx *ctx, const json_t *obj, const char *key, const char *what,
                              const char **out) {
    return get_str(ctx, obj, key, what, out, false);
}

char *dw_json_dump(const json_t *j, bool pretty) {
    /* Jansson's default 17 significant digits: reals round-trip exactly (tests compare them). */
    size_t flags = JSON_PRESERVE_ORDER;
    return json_dumps(j, pretty ? flags | JSON_INDENT(2) : flags | JSON_COMPACT);
}
