/* guard_state.c — the guardrails' own keys of a checkpoint's state.json (guard.h): ckpt.c writes
 * them as its owners give them and validates the file; their owners read them back here. */
#include <stdlib.h>

#include "core/error.h"
#include "train/ckpt.h"
#include "train/guard.h"

dw_status dw_guard_state_key(dw_ctx *ctx, const char *cdir, const char *key, json_t **out) {
    *out = NULL;
    char *path = dw_path_join(cdir, "state.json");
    if (!path) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    json_t *j = NULL;
    dw_status st = dw_json_load_file(ctx, path, &j);
    free(path);
    DW_TRY(st);
    json_t *v = json_object_get(j, key);
    if (v && !json_is_null(v)) *out = json_incref(v);
    json_decref(j);
    return DW_OK;
}
