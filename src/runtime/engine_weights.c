/* engine_weights.c — the CPU engine's parameters: initialisation as the reference
 * implementations do it (seeded, per-tensor streams so the result does not depend on order),
 * and Hugging Face safetensors load/save (GPT-2 Conv1D weights transposed on the way, tied LM
 * head stored once, sharded checkpoints through model.safetensors.index.json). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "capture/arch.h"
#include "core/error.h"
#include "core/json.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "runtime/engine_cpu.h"
#include "runtime/engine_cuda.h"

/* ---- initialisation ------------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t hash_name(const char *s) { /* FNV-1a */
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

dw_status dw_engine_init_weights(dw_engine *e, uint64_t seed) {
    for (int i = 0; i < e->n_params; i++) {
        dw_param *p = &e->params[i];
        const dw_ir_tensor *t = &e->g->tensors[dw_graph_find_tensor(e->g, p->name)];
        if (t->init != DW_INIT_NORMAL) { /* norm weights 1, biases 0 */
            float v = t->init == DW_INIT_ZEROS ? 0.0f : 1.0f;
            for (int64_t k = 0; k < p->numel; k++) p->data[k] = v;
            continue;
        }
        double std = t->init_std;
        uint64_t s = seed ^ hash_name(p->name);
        for (int64_t k = 0; k < p->numel; k += 2) { /* Box-Muller: two normals per pair */
            double u1 = ((double)(splitmix64(&s) >> 11) + 1.0) / 9007199254740993.0;
            double u2 = (double)(splitmix64(&s) >> 11) / 9007199254740992.0;
            double r = sqrt(-2.0 * log(u1));
            p->data[k] = (float)(std * r * cos(2.0 * M_PI * u2));
            if (k + 1 < p->numel) p->data[k + 1] = (float)(std * r * sin(2.0 * M_PI * u2));
        }
    }
    return e->cuda ? dw_engine_cuda_upload(e) : DW_OK; /* CUDA engine: params are host mirrors */
}

/* ---- Hugging Face layout ------------------------------------------------------------------ */

static const dw_ir_tensor *param_tensor(const dw_engine *e, const dw_param *p) {
    return &e->g->tensors[dw_graph_find_tensor(e->g, p->name)];
}

/* The shape as stored in the HF file (transposed for GPT-2's Conv1D). */
static void hf_shape(const dw_ir_tensor *t, int64_t *shape) {
    for (int d = 0; d < t->ndim; d++) shape[d] = t->shape[d];
    if (t->hf_transposed) {
        shape[0] = t->shape[1];
        shape[1] = t->shape[0];
    }
}

/* dst (cols x rows) = transpose of src (rows x cols) */
static void transpose(float *dst, const float *src, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * cols + c];
}

/* ---- save ------------------------------------------------------------------------------------- */

static dw_status out_path(dw_ctx *ctx, const char *path, char *buf, size_t n) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(buf, n, "%s/model.safetensors", path);
    else snprintf(buf, n, "%s", path);
    return DW_OK;
}

/* Writes every parameter (values, or gradients when `grads`) in HF names and layouts, plus the
 * optional logits/loss tensors of a parity dump. */
static dw_status write_params(dw_engine *e, const char *path, bool grads, const float *logits,
                              int64_t B, int64_t T, const float *loss) {
    if (e->cuda) DW_TRY(dw_engine_cuda_download(e, grads));
    dw_ctx *ctx = e->ctx;
    char file[4096];
    DW_TRY(out_path(ctx, path, file, sizeof file));
    dw_st_writer *w = NULL;
    DW_TRY(dw_st_writer_create(ctx, &w));
    float **tmp = calloc((size_t)e->n_params + 1, sizeof *tmp);
    dw_status s = tmp ? dw_st_writer_set_metadata(ctx, w, "format", "pt")
                      : dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", file);
    for (int i = 0; s == DW_OK && i < e->n_params; i++) {
        dw_param *p = &e->params[i];
        const dw_ir_tensor *t = param_tensor(e, p);
        const float *src = grads ? p->grad : p->data;
        int64_t shape[DW_IR_MAX_DIMS];
        hf_shape(t, shape);
        if (t->hf_transposed) {
            tmp[i] = malloc((size_t)p->numel * sizeof(float));
            if (!tmp[i]) {
                s = dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", file);
                break;
            }
            transpose(tmp[i], src, t->shape[0], t->shape[1]);
            src = tmp[i];
        }
        s = dw_st_writer_add(ctx, w, p->name, DW_DT_F32, t->ndim, shape, src,
                             (size_t)p->numel * sizeof(float));
    }
    if (s == DW_OK && logits) {
        int64_t shape[3] = {B, T, e->g->model.vocab};
        s = dw_st_writer_add(ctx, w, "logits", DW_DT_F32, 3, shape, logits,
                             (size_t)(B * T * shape[2]) * sizeof(float));
    }
    if (s == DW_OK && loss) s = dw_st_writer_add(ctx, w, "loss", DW_DT_F32, 0, NULL, loss, sizeof(float));
    if (s == DW_OK) s = dw_st_writer_commit(ctx, w, file);
    dw_st_writer_free(w);
    for (int i = 0; tmp && i < e->n_params; i++) free(tmp[i]);
    free(tmp);
    return s;
}

dw_status dw_engine_save_weights(dw_engine *e, const char *path) {
    return write_params(e, path, false, NULL, 0, 0, NULL);
}

dw_status dw_engine_dump_grads(dw_engine *e, const char *path, const float *logits, int64_t B,
                               int64_t T, double loss) {
    float l = (float)loss;
    return write_params(e, path, true, logits, B, T, &l);
}

/* ---- load ------------------------------------------------------------------------------------- */

typedef struct {
    dw_st_file **files;
    int n;
} shard_set;

static void shards_close(shard_set *s) {
    for (int i = 0; i < s->n; i++) dw_st_close(s->files[i]);
    free(s->files);
    s->files = NULL;
    s->n = 0;
}

static dw_status shards_add(dw_ctx *ctx, shard_set *s, const char *path) {
    dw_st_file **f = realloc(s->files, (size_t)(s->n + 1) * sizeof *f);
    if (!f) return dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", path);
    s->files = f;
    DW_TRY(dw_st_open(ctx, path, &s->files[s->n]));
    s->n++;
    return DW_OK;
}

/* path: a .safetensors file, or a directory with model.safetensors or a sharded index. */
static dw_status shards_open(dw_ctx *ctx, const char *path, shard_set *s) {
    struct stat st;
    if (stat(path, &st) != 0) return dw_set_error(ctx, DW_ERR_IO, "%s: no such file or directory", path);
    if (!S_ISDIR(st.st_mode)) return shards_add(ctx, s, path);
    char p[4096];
    snprintf(p, sizeof p, "%s/model.safetensors", path);
    if (stat(p, &st) == 0) return shards_add(ctx, s, p);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
    if (stat(p, &st) != 0)
        return dw_set_error(ctx, DW_ERR_IO, "%s: neither model.safetensors nor "
                            "model.safetensors.index.json found", path);
    json_t *j = NULL;
    DW_TRY(dw_json_load_file(ctx, p, &j));
    const json_t *map = json_object_get(j, "weight_map");
    dw_status r = json_is_object(map) ? DW_OK
                  : dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'weight_map': expected an object", p);
    const char *key;
    const json_t *v;
    char seen[64][256];
    int n_seen = 0;
    json_object_foreach((json_t *)map, key, v) {
        if (r != DW_OK) break;
        const char *file = json_string_value(v);
        if (!file || strchr(file, '/')) {
            r = dw_set_error(ctx, DW_ERR_FORMAT, "%s: weight_map['%s']: expected a file name", p, key);
            break;
        }
        bool dup = false;
        for (int i = 0; i < n_seen && !dup; i++) dup = !strcmp(seen[i], file);
        if (dup) continue;
        if (n_seen == 64) {
            r = dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: more than 64 shards", p);
            break;
        }
        snprintf(seen[n_seen++], sizeof seen[0], "%s", file);
        char fp[4096 + 256];
        snprintf(fp, sizeof fp, "%s/%s", path, file);
        r = shards_add(ctx, s, fp);
    }
    json_decref(j);
    return r;
}

static const dw_st_tensor *shards_find(const shard_set *s, const char *name, const dw_st_file **in) {
    for (int i = 0; i < s->n; i++) {
        const dw_st_tensor *t = dw_st_find(s->files[i], name);
        if (t) {
            *in = s->files[i];
            return t;
        }
    }
    return NULL;
}

/* Finds p's tensor under its name or under the name the architecture's original checkpoints use
 * (capture/archs.def: GPT-2's without "transformer."). */
static const dw_st_tensor *find_param(const dw_engine *e, const shard_set *s, const char *name,
                                      const dw_st_file **in) {
    const dw_st_tensor *t = shards_find(s, name, in);
    const dw_hf_arch *a = dw_hf_arch_find(e->g->model.model_type);
    size_t p = a ? strlen(a->ckpt_prefix) : 0;
    if (!t && p && !strncmp(name, a->ckpt_prefix, p)) t = shards_find(s, name + p, in);
    return t;
}

/* Tensors in checkpoints that are not parameters (capture/archs.def: attention masks, rope
 * caches, a tied LM head). */
static bool ignorable(const dw_engine *e, const char *name) {
    const dw_hf_arch *a = dw_hf_arch_find(e->g->model.model_type);
    return a && dw_hf_ignorable(a, name, e->g->model.tied_embeddings);
}

static bool is_param_name(const dw_engine *e, const char *name) {
    const dw_hf_arch *a = dw_hf_arch_find(e->g->model.model_type);
    for (int i = 0; i < e->n_params; i++)
        if (a ? dw_hf_name_matches(a, e->params[i].name, name) : !strcmp(e->params[i].name, name)) return true;
    return false;
}

static void fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t len = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && len < n; d++)
        len += (size_t)snprintf(buf + len, n - len, "%s%lld", d ? "," : "", (long long)shape[d]);
    if (len < n) snprintf(buf + len, n - len, "]");
}

static dw_status check_all(dw_engine *e, const shard_set *s, const char *path) {
    dw_ctx *ctx = e->ctx;
    for (int i = 0; i < e->n_params; i++) {
        const dw_param *p = &e->params[i];
        const dw_st_file *f;
        const dw_st_tensor *t = find_param(e, s, p->name, &f);
        if (!t) return dw_set_error(ctx, DW_ERR_FORMAT, "%s: missing tensor '%s'", path, p->name);
        int64_t want[DW_IR_MAX_DIMS];
        const dw_ir_tensor *it = param_tensor(e, p);
        hf_shape(it, want);
        bool same = t->ndim == it->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == want[d];
        if (!same) {
            char got[128], exp[128];
            fmt_shape(got, sizeof got, t->ndim, t->shape);
            fmt_shape(exp, sizeof exp, it->ndim, want);
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s%s",
                                dw_st_path(f), t->name, got, exp,
                                it->hf_transposed ? " (Hugging Face Conv1D layout: in x out)" : "");
        }
        if (!dw_dtype_is_float(t->dtype) || t->dtype == DW_DT_F8_E4M3 || t->dtype == DW_DT_F8_E5M2)
            return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s (F32, F16, "
                                "BF16 or F64 expected)", dw_st_path(f), t->name, dw_dtype_name(t->dtype));
    }
    for (int k = 0; k < s->n; k++)
        for (int i = 0; i < dw_st_count(s->files[k]); i++) {
            const char *name = dw_st_get(s->files[k], i)->name;
            if (!is_param_name(e, name) && !ignorable(e, name))
                return dw_set_error(ctx, DW_ERR_FORMAT, "%s: unexpected tensor '%s' (not a "
                                    "parameter of this %s model)", dw_st_path(s->files[k]), name,
                                    e->g->model.model_type);
        }
    return DW_OK;
}

dw_status dw_engine_load_weights(dw_engine *e, const char *path) {
    dw_ctx *ctx = e->ctx;
    shard_set s = {0};
    dw_status r = shards_open(ctx, path, &s);
    if (r == DW_OK) r = check_all(e, &s, path); /* nothing is overwritten unless all is well */
    float *tmp = NULL;
    for (int i = 0; r == DW_OK && i < e->n_params; i++) {
        dw_param *p = &e->params[i];
        const dw_ir_tensor *it = param_tensor(e, p);
        const dw_st_file *f;
        const dw_st_tensor *t = find_param(e, &s, p->name, &f);
        if (!it->hf_transposed) {
            r = dw_st_read_f32(ctx, f, t, p->data);
            continue;
        }
        float *nt = realloc(tmp, (size_t)p->numel * sizeof(float));
        if (!nt) {
            r = dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", path);
            break;
        }
        tmp = nt;
        r = dw_st_read_f32(ctx, f, t, tmp);
        if (r == DW_OK) transpose(p->data, tmp, it->shape[1], it->shape[0]);
    }
    free(tmp);
    shards_close(&s);
    if (r == DW_OK && e->cuda) r = dw_engine_cuda_upload(e);
    return r;
}
