/* json.h — private: Jansson helpers with errors that name the file, line and column, and typed
 * field getters whose errors name the field ("config.json: field 'n_layer': expected integer"). */
#ifndef DW_CORE_JSON_H
#define DW_CORE_JSON_H

#include <jansson.h>

#include "deepwell.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parses a JSON file; on error "path:line:column: message". */
dw_status dw_json_load_file(dw_ctx *ctx, const char *path, json_t **out);
/* Parses a JSON text; `what` names it in errors. */
dw_status dw_json_load_string(dw_ctx *ctx, const char *text, size_t len, const char *what,
                              json_t **out);

/* Typed field getters. `what` names the document in errors. A missing field is an error unless
 * the *_opt variant is used, which leaves *out untouched when the field is absent. */
dw_status dw_json_get_int(dw_ctx *ctx, const json_t *obj, const char *key, const char *what,
                          long long *out);
dw_status dw_json_get_int_opt(dw_ctx *ctx, const json_t *obj, const char *key, const char *what,
                              long long *out);
dw_status dw_json_get_num(dw_ctx *ctx, const json_t *obj, const char *key, const char *what,
                          double *out);
dw_status dw_json_get_num_opt(dw_ctx *ctx, const json_t *obj, const char *key, const char *what,
                              double *out);
dw_status dw_json_get_bool_opt(dw_ctx *ctx, const json_t *obj, const char *key, const char *what,
                               bool *out);
/* *out points into obj (valid while obj lives). */
dw_status dw_json_get_str(dw_ctx *ctx, const json_t *obj, const char *key, const char *what,
                          const char **out);
dw_status dw_json_get_str_opt(dw_ctx *ctx, const json_t *obj, const char *key, const char *what,
                              const char **out);

/* Serialises with sorted=false, compact or indented; caller frees with free(). */
char *dw_json_dump(const json_t *j, bool pretty);

#ifdef __cplusplus
}
#endif

#endif /* DW_CORE_JSON_H */
