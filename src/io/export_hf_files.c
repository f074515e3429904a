/* export_hf_files.c — the files of a Hugging Face export besides the weights (export_hf.h):
 * config.json (the source's Hugging Face config with the checkpoint's own keys over it, the
 * export's torch_dtype, and hf-fp8's quantization_config) and the tokenizer and generation files
 * copied from the model directory the weights started from. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "io/export_hf.h"

/* The files transformers' tokenizers and generate() read from a model directory. */
static const char *const extras[] = {"generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                     "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt",
                                     "added_tokens.json", "chat_template.jinja", "chat_template.json"};

/* {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size":
 * [128, 128], "modules_to_not_convert": the LM head and every 2-D weight's module left
 * unquantised (embeddings, routers, gates)}. */
static json_t *quantization_config(const dw_st_file *raw) {
    json_t *q = json_object(), *block = json_array(), *skip = json_array();
    json_object_set_new(q, "quant_method", json_string("fp8"));
    json_object_set_new(q, "fmt", json_string("e4m3"));
    json_object_set_new(q, "activation_scheme", json_string("dynamic"));
    json_array_append_new(block, json_integer(DW_EXPORT_BLOCK));
    json_array_append_new(block, json_integer(DW_EXPORT_BLOCK));
    json_object_set_new(q, "weight_block_size", block);
    json_array_append_new(skip, json_string("lm_head"));
    for (int i = 0; i < dw_st_count(raw); i++) {
        const dw_st_tensor *t = dw_st_get(raw, i);
        const size_t n = strlen(t->name), k = strlen(".weight");
        if (t->ndim != 2 || n <= k || strcmp(t->name + n - k, ".weight") || dw_export_fp8_quantised(t)) continue;
        if (!strcmp(t->name, "lm_head.weight")) continue;
        json_array_append_new(skip, json_stringn(t->name, n - k));
    }
    json_object_set_new(q, "modules_to_not_convert", skip);
    return q;
}

dw_status dw_export_write_config(dw_ctx *ctx, const char *own, const char *hf_config, const dw_st_file *raw,
                                 const char *dir, dw_export_dtype dtype, bool fp8) {
    json_t *mine = NULL, *base = NULL;
    DW_TRY(dw_json_load_string(ctx, own, strlen(own), "the checkpoint's config.json", &mine));
    dw_status s = DW_OK;
    if (hf_config) s = dw_json_load_file(ctx, hf_config, &base);
    else if (!(base = json_object())) s = dw_set_error(ctx, DW_ERR_NOMEM, "export: out of memory");
    if (s == DW_OK && (!json_is_object(base) || !json_is_object(mine)))
        s = dw_set_error(ctx, DW_ERR_FORMAT, "%s: expected a JSON object", hf_config ? hf_config : "config.json");
    if (s == DW_OK) {
        const char *a = json_string_value(json_object_get(base, "model_type"));
        const char *b = json_string_value(json_object_get(mine, "model_type"));
        if (a && b && strcmp(a, b))
            s = dw_set_error(ctx, DW_ERR_INVALID, "%s: model_type '%s', but the exported weights are a '%s' model "
                             "(--hf-dir names another model's directory?)", hf_config, a, b);
    }
    char *text = NULL;
    if (s == DW_OK) {
        json_object_update(base, mine); /* the checkpoint's keys are the model the weights fit */
        json_object_set_new(base, "torch_dtype", json_string(dtype == DW_EXPORT_F32 ? "float32" : "bfloat16"));
        json_object_del(base, "quantization_config");
        if (fp8) json_object_set_new(base, "quantization_config", quantization_config(raw));
        text = dw_json_dump(base, true);
        if (!text) s = dw_set_error(ctx, DW_ERR_NOMEM, "export: out of memory");
    }
    if (s == DW_OK) {
        size_t n = strlen(text);
        char *line = realloc(text, n + 2);
        if (line) text = line, text[n++] = '\n', text[n] = '\0';
        char path[4096 + 16];
        snprintf(path, sizeof path, "%s/config.json", dir);
        s = line ? dw_write_file_atomic(ctx, path, text, n) : dw_set_error(ctx, DW_ERR_NOMEM, "export: out of memory");
    }
    free(text);
    json_decref(mine);
    json_decref(base);
    return s;
}

dw_status dw_export_copy_extras(dw_ctx *ctx, const char *hf_dir, const char *dir, int *n_copied) {
    int copied = 0;
    for (size_t i = 0; i < sizeof extras / sizeof extras[0]; i++) {
        char from[4096 + 64], to[4096 + 64];
        snprintf(from, sizeof from, "%s/%s", hf_dir, extras[i]);
        snprintf(to, sizeof to, "%s/%s", dir, extras[i]);
        struct stat sb;
        if (stat(from, &sb) != 0) {
            if (errno == ENOENT) continue;
            return dw_set_error(ctx, DW_ERR_IO, "%s: cannot examine: %s", from, strerror(errno));
        }
        DW_TRY(dw_copy_file_atomic(ctx, from, to));
        copied++;
    }
    if (n_copied) *n_copied = copied;
    return DW_OK;
}
