/* export_hf.c — dw_export_hf (deepwell.h): a run, checkpoint or model directory's weights as a
 * Hugging Face model directory. The model is opened as `deepwell eval` opens it (dw_model_open:
 * the checkpoint validated, every tensor checked against the graph), its FP32 weights saved in the
 * chosen expert layout into a temporary directory beside the destination, converted there
 * (export_hf_tensors.c) with config.json and the tokenizer files (export_hf_files.c), and the
 * directory renamed into place at the end: an error leaves nothing behind. */
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#include "capture/arch.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "io/export_hf.h"
#include "ir/ir.h"
#include "runtime/weights_layout.h"
#include "train/ckpt.h"

#define RAW_NAME ".deepwell-f32.safetensors" /* the engine's FP32 save, removed before the rename */

void dw_export_opts_init(dw_export_opts *o, size_t size) {
    dw_export_opts d = {.size = sizeof d, .format = DW_EXPORT_HF, .dtype = DW_EXPORT_BF16,
                        .layout = DW_WEIGHTS_LAYOUT_AS_LOADED, .max_shard_bytes = 5000000000LL, .hf_dir = NULL};
    memset(o, 0, size);
    memcpy(o, &d, size < sizeof d ? size : sizeof d);
    o->size = size;
}

static bool has_file(const char *dir, const char *name) {
    char path[4096 + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* src is a run directory with checkpoints, a checkpoint, or a model directory (*model_dir). */
static dw_status check_source(dw_ctx *ctx, const char *src, bool *model_dir) {
    struct stat sb;
    if (stat(src, &sb) != 0) return dw_set_error(ctx, DW_ERR_IO, "%s: %s", src, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: not a directory (expected a run directory, a checkpoint or a "
                            "Hugging Face model directory with weights)", src);
    const bool ckpt = has_file(src, "state.json") || has_file(src, "latest");
    *model_dir = !ckpt;
    if (ckpt || has_file(src, "config.json")) return DW_OK;
    if (has_file(src, "metrics.jsonl"))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: a run directory without checkpoints (no 'latest' file): nothing "
                            "to export yet (checkpoints come with --ckpt-every and at the end of a run)", src);
    return dw_set_error(ctx, DW_ERR_INVALID, "%s: neither a run directory ('latest'), a checkpoint ('state.json') nor "
                        "a Hugging Face model directory ('config.json')", src);
}

/* out_dir may not exist yet, or be an empty directory. */
static dw_status check_out(dw_ctx *ctx, const char *out) {
    struct stat sb;
    if (lstat(out, &sb) != 0) {
        if (errno == ENOENT) return DW_OK;
        return dw_set_error(ctx, DW_ERR_IO, "--out %s: cannot create it there: %s", out, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode)) return dw_set_error(ctx, DW_ERR_IO, "--out %s: exists and is not a directory", out);
    DIR *d = opendir(out);
    if (!d) return dw_set_error(ctx, DW_ERR_IO, "--out %s: cannot read: %s", out, strerror(errno));
    const struct dirent *e;
    bool empty = true;
    while (empty && (e = readdir(d)))
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty ? DW_OK
                 : dw_set_error(ctx, DW_ERR_IO, "--out %s: exists and is not empty (export never overwrites; "
                                "remove it or name a new directory)", out);
}

/* A new directory beside out (same file system, so the final rename is atomic). */
static dw_status make_temp(dw_ctx *ctx, const char *out, char **tmp) {
    char *a = strdup(out), *b = strdup(out);
    size_t n = strlen(out) + 64;
    *tmp = a && b ? malloc(n) : NULL;
    if (!*tmp) {
        free(a), free(b);
        return dw_set_error(ctx, DW_ERR_NOMEM, "export: out of memory");
    }
    snprintf(*tmp, n, "%s/.%s.export-XXXXXX", dirname(a), basename(b));
    free(a), free(b);
    if (mkdtemp(*tmp)) return DW_OK;
    dw_status s = dw_set_error(ctx, DW_ERR_IO, "--out %s: cannot create a temporary directory beside it (%s): %s", out,
                               *tmp, strerror(errno));
    free(*tmp);
    *tmp = NULL;
    return s;
}

static dw_status check_opts(dw_ctx *ctx, const dw_export_opts *o) {
    if ((unsigned)o->format > DW_EXPORT_HF_FP8) return dw_set_error(ctx, DW_ERR_INVALID, "export: unknown format %d", (int)o->format);
    if ((unsigned)o->dtype > DW_EXPORT_F32) return dw_set_error(ctx, DW_ERR_INVALID, "export: unknown dtype %d", (int)o->dtype);
    if ((unsigned)o->layout > DW_WEIGHTS_LAYOUT_PER_EXPERT)
        return dw_set_error(ctx, DW_ERR_INVALID, "export: unknown expert layout %d", (int)o->layout);
    if (o->max_shard_bytes < 1)
        return dw_set_error(ctx, DW_ERR_INVALID, "export: max shard size %lld bytes (must be >= 1)", (long long)o->max_shard_bytes);
    if (o->hf_dir && !(is_dir(o->hf_dir) && has_file(o->hf_dir, "config.json")))
        return dw_set_error(ctx, DW_ERR_INVALID, "--hf-dir %s: not a directory with config.json", o->hf_dir);
    return DW_OK;
}

/* The expert layout of hf_dir's weights, read from the names alone (model.safetensors' header or
 * the index's weight_map): per-expert names give PER_EXPERT, fused ones FUSED; *known false when
 * it has no weights or no expert tensors. */
static dw_status layout_of_dir(dw_ctx *ctx, const char *hf_dir, dw_weights_layout *L, bool *known) {
    *known = false;
    char *single = dw_path_join(hf_dir, "model.safetensors"), *index = dw_path_join(hf_dir, "model.safetensors.index.json");
    dw_status s = single && index ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "export: out of memory");
    bool per = false, fused = false;
    if (s == DW_OK && access(single, F_OK) == 0) {
        dw_st_file *f = NULL;
        s = dw_st_open(ctx, single, &f);
        for (int i = 0; s == DW_OK && i < dw_st_count(f); i++) {
            const char *n = dw_st_get(f, i)->name;
            per |= dw_hf_per_expert_name(n), fused |= dw_hf_fused_expert_name(n);
        }
        dw_st_close(f);
    } else if (s == DW_OK && access(index, F_OK) == 0) {
        json_t *j = NULL;
        s = dw_json_load_file(ctx, index, &j);
        const char *n;
        const json_t *v;
        json_object_foreach(json_object_get(j, "weight_map"), n, v) {
            (void)v;
            per |= dw_hf_per_expert_name(n), fused |= dw_hf_fused_expert_name(n);
        }
        json_decref(j);
    }
    if (per || fused) *known = true, *L = per ? DW_WEIGHTS_LAYOUT_PER_EXPERT : DW_WEIGHTS_LAYOUT_FUSED;
    free(single), free(index);
    return s;
}

/* The expert layout to write when none is asked for: a model directory's own (as loaded), else
 * that of --hf-dir's weights, else per-expert (a checkpoint's fused file says only how Deepwell
 * keeps them, not what the model came as; per-expert is what transformers 4 and 5 both load). */
static dw_status default_layout(dw_ctx *ctx, bool model_dir, const char *hf_dir, dw_weights_layout *L) {
    *L = model_dir ? DW_WEIGHTS_LAYOUT_AS_LOADED : DW_WEIGHTS_LAYOUT_PER_EXPERT;
    bool known = false;
    if (!model_dir && hf_dir) DW_TRY(layout_of_dir(ctx, hf_dir, L, &known));
    return DW_OK;
}

/* A checkpoint's own tokenizer.json (dw_run_set_tokenizer) into tmp when the model directory
 * (--hf-dir) gave none: the export decodes as the run did. */
static dw_status copy_run_tokenizer(dw_ctx *ctx, const dw_model *m, const char *tmp) {
    const char *tok = dw_model_tokenizer(m);
    if (!strcmp(tok, "bytes") || !strcmp(tok, "ids")) return DW_OK; /* no file */
    char *to = dw_path_join(tmp, "tokenizer.json");
    if (!to) return dw_set_error(ctx, DW_ERR_NOMEM, "export: out of memory");
    dw_status s = access(to, F_OK) != 0 ? dw_copy_file_atomic(ctx, tok, to) : DW_OK;
    free(to);
    return s;
}

/* Everything into tmp: the FP32 save, the converted weights, config.json, the copied files. */
static dw_status export_into(dw_ctx *ctx, dw_model *m, const dw_export_opts *o, const char *hf_dir, const char *tmp) {
    const dw_graph *g = dw_model_graph(m);
    const bool fp8 = o->format == DW_EXPORT_HF_FP8;
    char *raw_path = dw_path_join(tmp, RAW_NAME), *hf_config = hf_dir ? dw_path_join(hf_dir, "config.json") : NULL;
    dw_status s = raw_path && (!hf_dir || hf_config) ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "export: out of memory");
    if (s == DW_OK) s = dw_engine_save_weights_layout(dw_model_engine(m), raw_path, o->layout);
    dw_st_file *raw = NULL;
    if (s == DW_OK) s = dw_st_open(ctx, raw_path, &raw);
    if (s == DW_OK) s = dw_export_write_tensors(ctx, raw, tmp, o->dtype, fp8, o->max_shard_bytes, NULL);
    if (s == DW_OK) s = dw_export_write_config(ctx, g->model.config_json, hf_config, raw, tmp, o->dtype, fp8);
    if (s == DW_OK && hf_dir) s = dw_export_copy_extras(ctx, hf_dir, tmp, NULL);
    if (s == DW_OK) s = copy_run_tokenizer(ctx, m, tmp);
    dw_st_close(raw);
    if (raw_path && unlink(raw_path) != 0 && errno != ENOENT && s == DW_OK)
        s = dw_set_error(ctx, DW_ERR_IO, "%s: cannot remove: %s", raw_path, strerror(errno));
    free(raw_path), free(hf_config);
    return s;
}

dw_status dw_export_hf(dw_ctx *ctx, const char *src, const char *out_dir, const dw_export_opts *opts) {
    dw_export_opts o;
    dw_export_opts_init(&o, sizeof o);
    if (opts) memcpy(&o, opts, opts->size < sizeof o ? opts->size : sizeof o);
    if (!src || !*src) return dw_set_error(ctx, DW_ERR_INVALID, "export: no source given");
    if (!out_dir || !*out_dir) return dw_set_error(ctx, DW_ERR_INVALID, "export: no output directory given");
    DW_TRY(check_opts(ctx, &o));
    bool model_dir = false;
    DW_TRY(check_source(ctx, src, &model_dir));
    const char *hf_dir = o.hf_dir ? o.hf_dir : model_dir ? src : NULL;
    DW_TRY(check_out(ctx, out_dir));
    if (o.layout == DW_WEIGHTS_LAYOUT_AS_LOADED) DW_TRY(default_layout(ctx, model_dir, hf_dir, &o.layout));
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.batch = 1, mo.seq = 1, mo.weights = DW_WEIGHTS_FILE; /* the smallest engine that holds the weights */
    dw_model *m = NULL;
    DW_TRY(dw_model_open(ctx, src, &mo, &m));
    const dw_hf_arch *a = dw_hf_arch_find(dw_model_graph(m)->model.model_type);
    dw_status s = DW_OK;
    if (o.format == DW_EXPORT_HF_FP8 && a && !strcmp(a->family, "gpt2"))
        s = dw_set_error(ctx, DW_ERR_UNSUPPORTED, "export --format hf-fp8: %s is a GPT-2 model, whose Conv1D layers "
                         "transformers' fine-grained FP8 does not load; use --format hf", src);
    char *tmp = NULL;
    if (s == DW_OK) s = make_temp(ctx, out_dir, &tmp);
    if (s == DW_OK) s = export_into(ctx, m, &o, hf_dir, tmp);
    if (s == DW_OK && rename(tmp, out_dir) != 0)
        s = dw_set_error(ctx, DW_ERR_IO, "--out %s: cannot rename %s into place: %s", out_dir, tmp, strerror(errno));
    if (s == DW_OK) s = dw_fsync_parent_dir(ctx, out_dir);
    else if (tmp) dw_rmtree(NULL, tmp); /* best effort: the error above is the one to report */
    free(tmp);
    dw_model_free(m);
    return s;
}
