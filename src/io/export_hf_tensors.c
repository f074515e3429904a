/* export_hf_tensors.c — the weight files of a Hugging Face export (export_hf.h): each FP32 tensor
 * of the raw file converted to BF16 or F32, or for hf-fp8 to E4M3 codes with 128 x 128 block
 * scales, then packed into one model.safetensors or into shards with an index as transformers
 * writes them. Not the config (export_hf_files.c) nor the directory handling (export_hf.c). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "formats/formats.h"
#include "io/export_hf.h"
#include "runtime/engine_moe_bias.h"
#include "runtime/weights_layout.h"

#define FP8_MAX 448.0f /* largest finite E4M3 */

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

bool dw_export_fp8_quantised(const dw_st_tensor *t) {
    static const char *const proj[] = {".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight",
                                       ".gate_proj.weight", ".up_proj.weight", ".down_proj.weight",
                                       ".qkv_proj.weight", ".gate_up_proj.weight", /* Phi-3's fused ones */
                                       ".w1.weight", ".w2.weight", ".w3.weight"};
    if (t->ndim == 3) return dw_hf_fused_expert_name(t->name);
    if (t->ndim != 2) return false;
    for (size_t i = 0; i < sizeof proj / sizeof proj[0]; i++)
        if (ends_with(t->name, proj[i])) return true;
    return false;
}

/* One tensor of the output: a tensor's values, or its FP8 codes, or its block scales. */
typedef enum { ITEM_VALUES, ITEM_CODES, ITEM_SCALES } item_kind;

typedef struct {
    char *name; /* owned */
    const dw_st_tensor *src;
    item_kind kind;
    dw_dtype dtype;
    int ndim;
    int64_t shape[DW_ST_MAX_DIMS];
    size_t nbytes;
    int shard;
} item;

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static size_t numel(int ndim, const int64_t *shape) {
    size_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (size_t)shape[d];
    return n;
}

static void items_free(item *it, int n) {
    for (int i = 0; it && i < n; i++) free(it[i].name);
    free(it);
}

/* The output items of raw, in file order (codes then scales for a quantised tensor). */
static dw_status plan_items(dw_ctx *ctx, const dw_st_file *raw, dw_export_dtype dtype, bool fp8, item **out,
                            int *n_out) {
    const int n = dw_st_count(raw);
    item *it = calloc((size_t)(2 * n + 1), sizeof *it);
    dw_status st = it ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "export: out of memory");
    int k = 0;
    for (int i = 0; st == DW_OK && i < n; i++) {
        const dw_st_tensor *t = dw_st_get(raw, i);
        if (t->dtype != DW_DT_F32) { /* the raw file is the engine's own FP32 save */
            st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s' is %s, expected F32", dw_st_path(raw), t->name,
                              dw_dtype_name(t->dtype));
            break;
        }
        const bool q = fp8 && dw_export_fp8_quantised(t);
        item *v = &it[k++];
        v->name = strdup(t->name), v->src = t, v->ndim = t->ndim;
        memcpy(v->shape, t->shape, sizeof v->shape);
        v->kind = q ? ITEM_CODES : ITEM_VALUES;
        /* the routers' selection bias stays FP32, as DeepSeek-V3's checkpoints keep it */
        v->dtype = q ? DW_DT_F8_E4M3 : dtype == DW_EXPORT_F32 || dw_moe_bias_tensor_name(t->name) ? DW_DT_F32 : DW_DT_BF16;
        v->nbytes = numel(v->ndim, v->shape) * dw_dtype_size(v->dtype);
        bool ok = v->name != NULL;
        if (q) { /* [..., R, C] -> scales [..., ceil(R/128), ceil(C/128)] */
            item *s = &it[k++];
            s->name = dw_st_scale_inv_name(t->name), s->src = t, s->kind = ITEM_SCALES, s->dtype = DW_DT_F32, s->ndim = t->ndim;
            memcpy(s->shape, t->shape, sizeof s->shape);
            s->shape[t->ndim - 2] = cdiv(t->shape[t->ndim - 2], DW_EXPORT_BLOCK);
            s->shape[t->ndim - 1] = cdiv(t->shape[t->ndim - 1], DW_EXPORT_BLOCK);
            s->nbytes = numel(s->ndim, s->shape) * sizeof(float);
            ok = ok && s->name != NULL;
        }
        if (!ok) st = dw_set_error(ctx, DW_ERR_NOMEM, "export: out of memory");
    }
    if (st != DW_OK) {
        items_free(it, k);
        return st;
    }
    *out = it, *n_out = k;
    return DW_OK;
}

/* Shard of each item: a new file when the next tensor would pass the limit (a tensor larger than
 * the limit gets a file of its own), as transformers' save_pretrained splits. Returns the count. */
static int assign_shards(item *it, int n, int64_t max_bytes) {
    int shard = 0;
    uint64_t used = 0;
    for (int i = 0; i < n; i++) {
        if (used > 0 && used + it[i].nbytes > (uint64_t)max_bytes) shard++, used = 0;
        it[i].shard = shard;
        used += it[i].nbytes;
    }
    return n ? shard + 1 : 1;
}

/* Block-quantises x [lead, R, C]: codes (may be NULL) [lead, R, C] and scale_inv (may be NULL)
 * [lead, ceil(R/128), ceil(C/128)]. */
static void quantise_blocks(const float *x, int64_t lead, int64_t R, int64_t C, uint8_t *codes, float *scale_inv) {
    const int64_t BR = cdiv(R, DW_EXPORT_BLOCK), BC = cdiv(C, DW_EXPORT_BLOCK);
    for (int64_t l = 0; l < lead; l++)
        for (int64_t br = 0; br < BR; br++)
            for (int64_t bc = 0; bc < BC; bc++) {
                const int64_t r0 = br * DW_EXPORT_BLOCK, c0 = bc * DW_EXPORT_BLOCK;
                const int64_t r1 = r0 + DW_EXPORT_BLOCK < R ? r0 + DW_EXPORT_BLOCK : R;
                const int64_t c1 = c0 + DW_EXPORT_BLOCK < C ? c0 + DW_EXPORT_BLOCK : C;
                const float *xl = x + l * R * C;
                float amax = 0.0f;
                for (int64_t r = r0; r < r1; r++)
                    for (int64_t c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(xl[r * C + c]));
                const float scale = amax > 0.0f ? FP8_MAX / amax : 1.0f;
                if (scale_inv) scale_inv[(l * BR + br) * BC + bc] = 1.0f / scale;
                if (codes)
                    for (int64_t r = r0; r < r1; r++)
                        for (int64_t c = c0; c < c1; c++) codes[l * R * C + r * C + c] = dw_encode_e4m3(xl[r * C + c] * scale);
            }
}

/* The bytes of one item into buf (it->nbytes); x is scratch for the source's FP32 values. */
static dw_status fill_item(dw_ctx *ctx, const dw_st_file *raw, const item *it, float *x, void *buf) {
    const dw_st_tensor *t = it->src;
    DW_TRY(dw_st_read_f32(ctx, raw, t, x));
    const int64_t n = dw_st_numel(t);
    for (int64_t k = 0; k < n; k++)
        if (!isfinite(x[k]))
            return dw_set_error(ctx, DW_ERR_NUMERIC, "export: tensor '%s' has a non-finite value (%g) at element %lld",
                                t->name, (double)x[k], (long long)k);
    if (it->kind == ITEM_VALUES && it->dtype == DW_DT_F32) {
        memcpy(buf, x, it->nbytes);
    } else if (it->kind == ITEM_VALUES) {
        uint16_t *b = buf;
        for (int64_t k = 0; k < n; k++) b[k] = dw_encode_bf16(x[k]);
    } else {
        const int64_t R = t->shape[t->ndim - 2], C = t->shape[t->ndim - 1], lead = n / (R * C);
        quantise_blocks(x, lead, R, C, it->kind == ITEM_CODES ? buf : NULL, it->kind == ITEM_SCALES ? buf : NULL);
    }
    return DW_OK;
}

static void shard_file(char *buf, size_t cap, int shard, int n_shards) {
    if (n_shards == 1) snprintf(buf, cap, "model.safetensors");
    else snprintf(buf, cap, "model-%05d-of-%05d.safetensors", shard + 1, n_shards);
}

/* One weight file: the items of `shard` converted, added and committed. */
static dw_status write_shard(dw_ctx *ctx, const dw_st_file *raw, const item *it, int n, int shard, int n_shards,
                             const char *dir, float *x) {
    char name[64], path[4096 + 64];
    shard_file(name, sizeof name, shard, n_shards);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    void **bufs = calloc((size_t)(n ? n : 1), sizeof *bufs);
    dw_st_writer *w = NULL;
    dw_status s = bufs ? dw_st_writer_create(ctx, &w) : dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", path);
    if (s == DW_OK) s = dw_st_writer_set_metadata(ctx, w, "format", "pt");
    for (int i = 0; s == DW_OK && i < n; i++) {
        if (it[i].shard != shard) continue;
        if (!(bufs[i] = malloc(it[i].nbytes ? it[i].nbytes : 1))) {
            s = dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory for tensor '%s'", path, it[i].name);
            break;
        }
        s = fill_item(ctx, raw, &it[i], x, bufs[i]);
        if (s == DW_OK) s = dw_st_writer_add(ctx, w, it[i].name, it[i].dtype, it[i].ndim, it[i].shape, bufs[i], it[i].nbytes);
    }
    if (s == DW_OK) s = dw_st_writer_commit(ctx, w, path);
    dw_st_writer_free(w);
    for (int i = 0; bufs && i < n; i++) free(bufs[i]);
    free(bufs);
    return s;
}

/* model.safetensors.index.json: {"metadata": {"total_size"}, "weight_map": {name: file}}. */
static dw_status write_index(dw_ctx *ctx, const item *it, int n, int n_shards, const char *dir) {
    json_t *j = json_object(), *meta = json_object(), *map = json_object();
    uint64_t total = 0;
    for (int i = 0; j && meta && map && i < n; i++) {
        char name[64];
        shard_file(name, sizeof name, it[i].shard, n_shards);
        json_object_set_new(map, it[i].name, json_string(name));
        total += it[i].nbytes;
    }
    json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
    json_object_set_new(j, "metadata", meta);
    json_object_set_new(j, "weight_map", map);
    char *text = dw_json_dump(j, true);
    json_decref(j);
    char path[4096 + 64];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    dw_status s = text ? dw_write_file_atomic(ctx, path, text, strlen(text))
                       : dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", path);
    free(text);
    return s;
}

dw_status dw_export_write_tensors(dw_ctx *ctx, const dw_st_file *raw, const char *dir, dw_export_dtype dtype,
                                  bool fp8, int64_t max_shard_bytes, int *n_files) {
    item *it = NULL;
    int n = 0;
    DW_TRY(plan_items(ctx, raw, dtype, fp8, &it, &n));
    const int n_shards = assign_shards(it, n, max_shard_bytes);
    int64_t most = 1;
    for (int i = 0; i < dw_st_count(raw); i++)
        if (dw_st_numel(dw_st_get(raw, i)) > most) most = dw_st_numel(dw_st_get(raw, i));
    float *x = malloc((size_t)most * sizeof *x);
    dw_status s = x ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "export: out of memory");
    for (int k = 0; s == DW_OK && k < n_shards; k++) s = write_shard(ctx, raw, it, n, k, n_shards, dir, x);
    if (s == DW_OK && n_shards > 1) s = write_index(ctx, it, n, n_shards, dir);
    if (s == DW_OK && n_files) *n_files = n_shards;
    free(x);
    items_free(it, n);
    return s;
}
