/* weights.c — an engine's parameters and optimizer state in files and from seeds: initialisation
 * as the reference implementations do it (the graph's per-parameter rule, seeded per tensor so
 * the values do not depend on order or backend), Hugging Face safetensors load/save (names and
 * layouts from the graph, capture/archs.def and weights_layout.c: GPT-2's Conv1D weights
 * transposed, expert weights fused or per expert, optional checkpoint prefixes, ignorable tensors,
 * sharded index files), the AdamW moments' file, and the
 * parity dump of gradients. Values travel through host staging buffers; the engine refreshes
 * what derives from the masters afterwards. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "capture/arch.h"
#include "core/error.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "runtime/engine.h"
#include "runtime/engine_moe_bias.h"
#include "runtime/weights_layout.h"

static const dw_ir_tensor *ptensor(const dw_engine *e, int i) { return &e->g->tensors[e->p->param_tensor[i]]; }
static int64_t pnumel(const dw_engine *e, int i) { return dw_ir_numel(ptensor(e, i)); }
static const dw_hf_arch *arch(const dw_engine *e) { return dw_hf_arch_find(e->g->model.model_type); }

/* Host buffers for every parameter (one block; freed by the caller), at the host offsets off[]. */
static float *host_block(dw_engine *e, int64_t **off) {
    const int n = e->p->n_params;
    *off = malloc((size_t)(n + 1) * sizeof **off);
    if (!*off) return NULL;
    int64_t total = 0;
    for (int i = 0; i < n; i++) (*off)[i] = total, total += pnumel(e, i);
    (*off)[n] = total;
    float *b = malloc((size_t)(total ? total : 1) * sizeof(float));
    if (!b) free(*off), *off = NULL;
    return b;
}

/* ---- initialisation ---------------------------------------------------------------------------- */
static uint64_t splitmix64(uint64_t *s) { /* one draw; the state moves by a constant */
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

/* Parameter t's initial values (numel floats) from seed. */
static void init_values(const dw_ir_tensor *t, uint64_t seed, float *v) {
    const int64_t n = dw_ir_numel(t);
    if (t->init != DW_INIT_NORMAL) { /* norm weights 1, biases 0 */
        const float c = t->init == DW_INIT_ZEROS ? 0.0f : 1.0f;
        for (int64_t k = 0; k < n; k++) v[k] = c;
        return;
    }
    /* splitmix64 advances its state by a constant per call, so pair p (calls 2p+1 and 2p+2) starts
     * from s0 + 2p x that constant: the pairs are drawn in parallel, the values independent of the
     * thread count (llama-1b's 1.2e9 normals took ~30 s on one thread) */
    const uint64_t s0 = seed ^ hash_name(t->name);
    const int64_t pairs = (n + 1) / 2;
#pragma omp parallel for schedule(static) if (pairs > (1 << 16))
    for (int64_t p = 0; p < pairs; p++) { /* Box-Muller: two normals per pair */
        uint64_t s = s0 + (uint64_t)(2 * p) * 0x9E3779B97F4A7C15ULL;
        double u1 = ((double)(splitmix64(&s) >> 11) + 1.0) / 9007199254740993.0;
        double u2 = (double)(splitmix64(&s) >> 11) / 9007199254740992.0;
        double r = sqrt(-2.0 * log(u1));
        const int64_t k = 2 * p;
        v[k] = (float)(t->init_std * r * cos(2.0 * M_PI * u2));
        if (k + 1 < n) v[k + 1] = (float)(t->init_std * r * sin(2.0 * M_PI * u2));
    }
}

/* Parameter i's values (host) into the masters the engine holds: all of them, or the part in its
 * ZeRO-3 shard (runtime/exec.h dw_exec_masters). */
static dw_status upload_master(dw_engine *e, int i, const float *values) {
    int64_t skip = 0, count = 0;
    float *dst = dw_exec_masters(e->x, e->p->param_off[i], pnumel(e, i), &skip, &count);
    return count ? e->be->i->upload(e->be, dst, values + skip, (size_t)count * sizeof(float)) : DW_OK;
}

dw_status dw_engine_init_weights(dw_engine *e, uint64_t seed) {
    int64_t *off;
    float *h = host_block(e, &off);
    if (!h) return dw_set_error(e->ctx, DW_ERR_NOMEM, "engine: out of host memory initialising the weights");
    dw_status s = DW_OK;
    for (int i = 0; s == DW_OK && i < e->p->n_params; i++) {
        init_values(ptensor(e, i), seed, h + off[i]);
        s = upload_master(e, i, h + off[i]);
    }
    if (s == DW_OK) s = dw_engine_refresh(e); /* also: the uploads are done before h is freed */
    free(h), free(off);
    return s;
}

/* ---- Hugging Face layout: every parameter as pieces of stored tensors (weights_layout.h) ---- */
/* dst (cols x rows) = transpose of src (rows x cols) */
static void transpose(float *dst, const float *src, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * cols + c];
}

static void out_path(const char *path, char *buf, size_t n) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(buf, n, "%s/model.safetensors", path);
    else snprintf(buf, n, "%s", path);
}

/* Stored names -> their index (open addressing over FNV-1a; the names are borrowed). */
typedef struct {
    const char **key;
    int *val;
    size_t cap;
} name_map;

static bool map_init(name_map *m, size_t n) {
    m->cap = 16;
    while (m->cap < 2 * n + 1) m->cap <<= 1;
    m->key = calloc(m->cap, sizeof *m->key);
    m->val = malloc(m->cap * sizeof *m->val);
    return m->key && m->val;
}
static int map_get(const name_map *m, const char *k) {
    for (size_t i = hash_name(k) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->key[i]) return -1;
        if (!strcmp(m->key[i], k)) return m->val[i];
    }
}
static void map_put(name_map *m, const char *k, int v) {
    size_t i = hash_name(k) & (m->cap - 1);
    while (m->key[i] && strcmp(m->key[i], k)) i = (i + 1) & (m->cap - 1);
    m->key[i] = k, m->val[i] = v;
}
static void map_free(name_map *m) { free(m->key), free(m->val); }

/* Every parameter's pieces in one layout, and the distinct stored tensors they name (each known by
 * its first piece). */
typedef struct {
    dw_hf_piece **pc;
    int *npc;
    int n_params, n_stored;
    const dw_hf_piece **stored; /* (n_stored) */
    name_map map;
} hf_layout;

static void layout_free(hf_layout *h) {
    for (int i = 0; h->pc && i < h->n_params; i++) dw_hf_pieces_free(h->pc[i], h->npc[i]);
    free(h->pc), free(h->npc), free(h->stored);
    map_free(&h->map);
    memset(h, 0, sizeof *h);
}

static dw_status layout_build(dw_engine *e, dw_weights_layout L, hf_layout *h) {
    memset(h, 0, sizeof *h);
    const int n = e->p->n_params;
    h->n_params = n;
    h->pc = calloc((size_t)(n ? n : 1), sizeof *h->pc);
    h->npc = calloc((size_t)(n ? n : 1), sizeof *h->npc);
    size_t total = 0;
    for (int i = 0; h->pc && h->npc && i < n; i++) {
        if (!(h->pc[i] = dw_hf_pieces(e->g, ptensor(e, i), L, arch(e), &h->npc[i]))) break;
        total += (size_t)h->npc[i];
    }
    bool ok = h->pc && h->npc && (n == 0 || h->pc[n - 1]) && map_init(&h->map, total);
    h->stored = ok ? malloc((total ? total : 1) * sizeof *h->stored) : NULL;
    if (!h->stored) {
        layout_free(h);
        return dw_set_error(e->ctx, DW_ERR_NOMEM, "engine: out of memory laying out the weights");
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < h->npc[i]; k++)
            if (map_get(&h->map, h->pc[i][k].stored) < 0) {
                map_put(&h->map, h->pc[i][k].stored, h->n_stored);
                h->stored[h->n_stored++] = &h->pc[i][k];
            }
    return DW_OK;
}

static int64_t piece_numel(const dw_hf_piece *q) {
    int64_t n = 1;
    for (int d = 0; d < q->ndim; d++) n *= q->shape[d];
    return n;
}

/* Adds each router's selection bias as NAME.e_score_correction_bias [E] FP32 to w; *rows holds the
 * values until the commit (free()). */
static dw_status add_moe_bias(dw_engine *e, dw_st_writer *w, const char *file, float **rows) {
    int64_t L = 0, E = 0;
    dw_engine_moe_bias_shape(e, &L, &E);
    if (!(*rows = malloc((size_t)(L * E) * sizeof **rows)))
        return dw_set_error(e->ctx, DW_ERR_NOMEM, "%s: out of host memory", file);
    dw_status s = dw_engine_moe_bias_get(e, *rows, NULL);
    for (int64_t l = 0; s == DW_OK && l < L; l++) {
        char *name = dw_engine_moe_bias_name(e, l);
        s = name ? dw_st_writer_add(e->ctx, w, name, DW_DT_F32, 1, &E, *rows + l * E, (size_t)E * sizeof **rows)
                 : dw_set_error(e->ctx, DW_ERR_NOMEM, "%s: out of memory", file);
        free(name);
    }
    return s;
}

/* Writes every parameter (values, or gradients when `grads`) in HF names and the layout, plus the
 * optional logits/loss tensors of a parity dump. host_w: the values from this host copy of the
 * masters (param_floats, pool offsets) instead of the engine's pool (ZeRO-3's gathered copy). */
static dw_status write_params(dw_engine *e, const char *path, bool grads, const float *logits, int64_t B, int64_t T,
                              const float *loss, dw_weights_layout L, const float *host_w) {
    if (!host_w) DW_TRY(grads ? dw_exec_grads_whole(e->x, path) : dw_exec_weights_whole(e->x, path));
    dw_ctx *ctx = e->ctx;
    char file[4096];
    out_path(path, file, sizeof file);
    hf_layout hl;
    DW_TRY(layout_build(e, L, &hl));
    int64_t *off, *soff = malloc((size_t)(hl.n_stored + 1) * sizeof *soff);
    float *h = host_block(e, &off), *out = NULL;
    if (soff) {
        soff[0] = 0;
        for (int s = 0; s < hl.n_stored; s++) soff[s + 1] = soff[s] + piece_numel(hl.stored[s]);
        out = malloc((size_t)(soff[hl.n_stored] ? soff[hl.n_stored] : 1) * sizeof *out);
    }
    dw_status s = h && out ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of host memory", file);
    for (int i = 0; s == DW_OK && i < e->p->n_params; i++) {
        const dw_ir_tensor *t = ptensor(e, i);
        float *src = h + off[i];
        if (host_w) memcpy(src, host_w + e->p->param_off[i], (size_t)pnumel(e, i) * sizeof(float));
        else s = e->be->i->download(e->be, src, (grads ? e->x->grad : e->x->w) + e->p->param_off[i],
                                    (size_t)pnumel(e, i) * sizeof(float));
        for (int k = 0; s == DW_OK && k < hl.npc[i]; k++) {
            const dw_hf_piece *q = &hl.pc[i][k];
            float *dst = out + soff[map_get(&hl.map, q->stored)];
            if (q->transposed) transpose(dst, src, t->shape[0], t->shape[1]);
            else memcpy(dst + q->stored_off, src + q->param_off, (size_t)q->count * sizeof(float));
        }
    }
    dw_st_writer *w = NULL;
    if (s == DW_OK) s = dw_st_writer_create(ctx, &w);
    if (s == DW_OK) s = dw_st_writer_set_metadata(ctx, w, "format", "pt");
    for (int k = 0; s == DW_OK && k < hl.n_stored; k++) {
        const dw_hf_piece *q = hl.stored[k];
        s = dw_st_writer_add(ctx, w, q->stored, DW_DT_F32, q->ndim, q->shape, out + soff[k],
                             (size_t)piece_numel(q) * sizeof(float));
    }
    float *bias = NULL; /* the routers' selection bias, when it is a tensor of the model (engine_moe_bias.h) */
    if (s == DW_OK && !grads && dw_engine_moe_bias_is_tensor(e)) s = add_moe_bias(e, w, file, &bias);
    if (s == DW_OK && logits) {
        int64_t shape[3] = {B, T, e->g->model.vocab};
        s = dw_st_writer_add(ctx, w, "logits", DW_DT_F32, 3, shape, logits, (size_t)(B * T * shape[2]) * sizeof(float));
    }
    if (s == DW_OK && loss) s = dw_st_writer_add(ctx, w, "loss", DW_DT_F32, 0, NULL, loss, sizeof(float));
    if (s == DW_OK) s = dw_st_writer_commit(ctx, w, file);
    dw_st_writer_free(w);
    layout_free(&hl);
    free(out), free(soff), free(h), free(off), free(bias);
    return s;
}

dw_status dw_engine_save_weights_layout(dw_engine *e, const char *path, dw_weights_layout layout) {
    if (layout != DW_WEIGHTS_LAYOUT_AS_LOADED && layout != DW_WEIGHTS_LAYOUT_FUSED &&
        layout != DW_WEIGHTS_LAYOUT_PER_EXPERT)
        return dw_set_error(e->ctx, DW_ERR_INVALID, "%s: unknown weights layout %d", path, (int)layout);
    return write_params(e, path, false, NULL, 0, 0, NULL, layout == DW_WEIGHTS_LAYOUT_AS_LOADED ? e->layout : layout,
                        NULL);
}

dw_status dw_engine_save_weights_host(dw_engine *e, const char *path, const float *masters) {
    return write_params(e, path, false, NULL, 0, 0, NULL, e->layout, masters);
}

dw_status dw_engine_save_weights(dw_engine *e, const char *path) {
    return dw_engine_save_weights_layout(e, path, DW_WEIGHTS_LAYOUT_AS_LOADED);
}

dw_status dw_engine_dump(dw_engine *e, const char *path, const float *logits, int64_t B, int64_t T, double loss) {
    float l = (float)loss;
    return write_params(e, path, true, logits, B, T, &l, e->layout, NULL);
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
        return dw_set_error(ctx, DW_ERR_IO, "%s: neither model.safetensors nor model.safetensors.index.json found", path);
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


/* A stored tensor under its name or under the name the architecture's original checkpoints use
 * (capture/archs.def: GPT-2's without "transformer."). */
static const dw_st_tensor *find_stored(const dw_engine *e, const shard_set *s, const char *name, const dw_st_file **in) {
    const dw_st_tensor *t = shards_find(s, name, in);
    const dw_hf_arch *a = arch(e);
    size_t p = a ? strlen(a->ckpt_prefix) : 0;
    if (!t && p && !strncmp(name, a->ckpt_prefix, p)) t = shards_find(s, name + p, in);
    return t;
}

/* Whether a file's tensor is one the layout names (or it without the checkpoint prefix). */
static bool in_layout(const dw_engine *e, const hf_layout *hl, const char *stored) {
    if (map_get(&hl->map, stored) >= 0) return true;
    const dw_hf_arch *a = arch(e);
    if (!a || !*a->ckpt_prefix) return false;
    char full[512];
    snprintf(full, sizeof full, "%s%s", a->ckpt_prefix, stored);
    return map_get(&hl->map, full) >= 0;
}

static void fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t len = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && len < n; d++) len += (size_t)snprintf(buf + len, n - len, "%s%lld", d ? "," : "", (long long)shape[d]);
    if (len < n) snprintf(buf + len, n - len, "]");
}

/* The layout of the checkpoint's expert weights: per-expert when it has experts.<e>. tensors, else
 * fused; both in one checkpoint are refused, naming a tensor of each. */
static dw_status detect_layout(dw_ctx *ctx, const shard_set *s, const char *path, dw_weights_layout *L) {
    const char *per = NULL, *fused = NULL;
    for (int k = 0; k < s->n; k++)
        for (int i = 0; i < dw_st_count(s->files[k]); i++) {
            const char *name = dw_st_get(s->files[k], i)->name;
            if (dw_hf_per_expert_name(name)) per = name;
            if (dw_hf_fused_expert_name(name)) fused = name;
        }
    if (per && fused)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: mixes the per-expert layout ('%s') with the fused one ('%s')", path,
                            per, fused);
    *L = per ? DW_WEIGHTS_LAYOUT_PER_EXPERT : DW_WEIGHTS_LAYOUT_FUSED;
    return DW_OK;
}

/* NAME_scale_inv of an FP8 tensor of the checkpoint (NULL: none). */
static const dw_st_tensor *scale_of(const dw_engine *e, const shard_set *s, const dw_st_tensor *t,
                                    const dw_st_file **in) {
    char *name = dw_st_scale_inv_name(t->name);
    const dw_st_tensor *sc = name ? find_stored(e, s, name, in) : NULL;
    free(name);
    return sc;
}

/* Whether a file's tensor is the block scales (NAME_scale_inv) of an FP8 tensor the layout names. */
static bool scales_fp8_weight(const dw_engine *e, const shard_set *s, const hf_layout *hl, const char *stored) {
    static const char suffix[] = "_scale_inv";
    const size_t n = strlen(stored), k = sizeof suffix - 1;
    if (n <= k || strcmp(stored + n - k, suffix)) return false;
    char base[512];
    if (n - k >= sizeof base) return false;
    memcpy(base, stored, n - k);
    base[n - k] = 0;
    const dw_st_file *f = NULL;
    const dw_st_tensor *t = shards_find(s, base, &f);
    return t && t->dtype == DW_DT_F8_E4M3 && in_layout(e, hl, base);
}

/* Every stored tensor present with its shape and a floating dtype (FP8 with its block scales), and
 * no tensor unaccounted for. */
static dw_status check_all(dw_engine *e, const shard_set *s, const hf_layout *hl, const char *path) {
    dw_ctx *ctx = e->ctx;
    for (int k = 0; k < hl->n_stored; k++) {
        const dw_hf_piece *q = hl->stored[k];
        const dw_st_file *f = NULL;
        const dw_st_tensor *t = find_stored(e, s, q->stored, &f);
        if (!t) return dw_set_error(ctx, DW_ERR_FORMAT, "%s: missing tensor '%s'", path, q->stored);
        bool same = t->ndim == q->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == q->shape[d];
        if (!same) {
            char got[128], exp[128];
            fmt_shape(got, sizeof got, t->ndim, t->shape);
            fmt_shape(exp, sizeof exp, q->ndim, q->shape);
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s%s", dw_st_path(f),
                                t->name, got, exp, q->transposed ? " (Hugging Face Conv1D layout: in x out)" : "");
        }
        if (t->dtype == DW_DT_F8_E4M3) { /* fine-grained FP8: its 128 x 128 block scales beside it */
            const dw_st_file *sf = NULL;
            const dw_st_tensor *sc = scale_of(e, s, t, &sf);
            DW_TRY(dw_st_check_block_fp8(ctx, f, t, sf, sc));
        } else if (!dw_dtype_is_float(t->dtype) || t->dtype == DW_DT_F8_E5M2)
            return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s (F32, F16, BF16, F64, or F8_E4M3 "
                                "with 128 x 128 block scales expected)", dw_st_path(f), t->name, dw_dtype_name(t->dtype));
    }
    const dw_hf_arch *a = arch(e);
    for (int k = 0; k < s->n; k++)
        for (int i = 0; i < dw_st_count(s->files[k]); i++) {
            const char *name = dw_st_get(s->files[k], i)->name;
            if (!in_layout(e, hl, name) && !(a && dw_hf_ignorable(a, name, e->g->model.tied_embeddings)) &&
                !scales_fp8_weight(e, s, hl, name) && dw_engine_moe_bias_row(e, name) < 0)
                return dw_set_error(ctx, DW_ERR_FORMAT, "%s: unexpected tensor '%s' (not a parameter of this %s model)",
                                    dw_st_path(s->files[k]), name, e->g->model.model_type);
        }
    return DW_OK;
}

/* The routers' selection bias from the file (engine_moe_bias.h), when it holds it: every router's
 * NAME.e_score_correction_bias, [E] of a floating dtype, finite values, into *rows (layers x
 * experts; free()); NULL when the file has none. Read before any weight is overwritten. */
static dw_status read_moe_bias(dw_engine *e, const shard_set *s, const char *path, float **rows) {
    dw_ctx *ctx = e->ctx;
    int64_t L = 0, E = 0, found = 0;
    dw_engine_moe_bias_shape(e, &L, &E);
    *rows = NULL;
    char *missing = NULL;
    dw_status r = DW_OK;
    for (int64_t l = 0; r == DW_OK && l < L; l++) {
        char *name = dw_engine_moe_bias_name(e, l);
        const dw_st_file *f = NULL;
        const dw_st_tensor *t = name ? find_stored(e, s, name, &f) : NULL;
        if (!name || (!*rows && t && !(*rows = calloc((size_t)(L * E), sizeof **rows)))) {
            free(name);
            r = dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", path);
            break;
        }
        if (!t) {
            if (!missing) missing = name, name = NULL;
            free(name);
            continue;
        }
        found++;
        if (t->ndim != 1 || t->shape[0] != E || !dw_dtype_is_float(t->dtype) || t->dtype == DW_DT_F8_E4M3 ||
            t->dtype == DW_DT_F8_E5M2)
            r = dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s' (the router's selection bias) must be [%lld] of F32, "
                             "BF16, F16 or F64", dw_st_path(f), name, (long long)E);
        if (r == DW_OK) r = dw_st_read_f32(ctx, f, t, *rows + l * E);
        for (int64_t x = 0; r == DW_OK && x < E; x++)
            if (!isfinite((*rows)[l * E + x]))
                r = dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s': value %lld is %g (must be finite)", dw_st_path(f),
                                 name, (long long)x, (double)(*rows)[l * E + x]);
        free(name);
    }
    if (r == DW_OK && found && missing)
        r = dw_set_error(ctx, DW_ERR_FORMAT, "%s: missing tensor '%s' (the file has the selection bias of %lld of the "
                         "%lld routers)", path, missing, (long long)found, (long long)L);
    free(missing);
    if (r != DW_OK || !found) free(*rows), *rows = NULL;
    return r;
}

dw_status dw_engine_load_weights(dw_engine *e, const char *path) {
    dw_ctx *ctx = e->ctx;
    shard_set s = {0};
    hf_layout hl = {0};
    dw_weights_layout L = DW_WEIGHTS_LAYOUT_FUSED;
    dw_status r = shards_open(ctx, path, &s);
    if (r == DW_OK && s.n == 0) r = dw_set_error(ctx, DW_ERR_FORMAT, "%s: the index names no shard", path);
    if (r == DW_OK) r = detect_layout(ctx, &s, path, &L);
    if (r == DW_OK) r = layout_build(e, L, &hl);
    if (r == DW_OK) r = check_all(e, &s, &hl, path); /* nothing is overwritten unless all is well */
    float *bias = NULL;
    if (r == DW_OK) r = read_moe_bias(e, &s, path, &bias);
    int64_t *off = NULL, cap = 0;
    float *h = r == DW_OK ? host_block(e, &off) : NULL, *tmp = NULL;
    if (r == DW_OK && !h) r = dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of host memory", path);
    const dw_st_tensor *cached = NULL; /* the stored tensor tmp holds */
    for (int i = 0; r == DW_OK && i < e->p->n_params; i++) {
        const dw_ir_tensor *it = ptensor(e, i);
        float *dst = h + off[i];
        for (int k = 0; r == DW_OK && k < hl.npc[i]; k++) {
            const dw_hf_piece *q = &hl.pc[i][k];
            const dw_st_file *f;
            const dw_st_tensor *t = find_stored(e, &s, q->stored, &f);
            const int64_t n = piece_numel(q);
            if (t != cached) {
                if (n > cap) {
                    float *nt = realloc(tmp, (size_t)n * sizeof(float));
                    if (!nt) {
                        r = dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", path);
                        break;
                    }
                    tmp = nt, cap = n;
                }
                if (t->dtype == DW_DT_F8_E4M3) {
                    const dw_st_file *sf = NULL;
                    const dw_st_tensor *sc = scale_of(e, &s, t, &sf);
                    r = dw_st_read_block_fp8(ctx, f, t, sf, sc, tmp);
                } else {
                    r = dw_st_read_f32(ctx, f, t, tmp);
                }
                cached = r == DW_OK ? t : NULL;
            }
            if (r != DW_OK) break;
            if (q->transposed) transpose(dst, tmp, it->shape[1], it->shape[0]);
            else memcpy(dst + q->param_off, tmp + q->stored_off, (size_t)q->count * sizeof(float));
        }
    }
    for (int i = 0; r == DW_OK && i < e->p->n_params; i++)
        r = upload_master(e, i, h + off[i]);
    if (r == DW_OK) r = dw_engine_refresh(e);
    if (r == DW_OK) e->layout = L;
    if (r == DW_OK) r = dw_engine_moe_bias_load(e, bias); /* NULL: the file has none */
    layout_free(&hl);
    free(tmp), free(h), free(off), free(bias);
    shards_close(&s);
    return r;
}

/* ---- the AdamW moments: NAME.exp_avg and NAME.exp_avg_sq ------------------------------------- */
#define M_SUFFIX ".exp_avg"
#define V_SUFFIX ".exp_avg_sq"

static char *suffixed(const char *name, const char *suffix) {
    size_t n = strlen(name) + strlen(suffix) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s", name, suffix);
    return s;
}

dw_status dw_engine_save_optimizer(dw_engine *e, const char *path) {
    dw_ctx *ctx = e->ctx;
    if (!dw_exec_moments_whole(e->x)) /* ZeRO: train/ckpt_shard_io.c writes each rank's */
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: the engine holds a ZeRO shard of the optimizer state "
                            "(floats [%lld, %lld)), not all of it", path, (long long)e->x->opt_lo, (long long)e->x->opt_hi);
    int64_t *off;
    float *h = host_block(e, &off), *h2 = h ? malloc((size_t)(off[e->p->n_params] + 1) * sizeof(float)) : NULL;
    if (!h || !h2) {
        free(h), free(h2), free(off);
        return dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of host memory", path);
    }
    dw_st_writer *w = NULL;
    dw_status st = dw_st_writer_create(ctx, &w);
    if (st == DW_OK) st = dw_st_writer_set_metadata(ctx, w, "deepwell.optimizer", "adamw");
    if (st == DW_OK)
        st = dw_st_writer_set_metadata(ctx, w, "deepwell.layout", "Deepwell's (torch.nn.Linear out x in for every linear)");
    for (int i = 0; i < e->p->n_params && st == DW_OK; i++) {
        const dw_ir_tensor *t = ptensor(e, i);
        const size_t bytes = (size_t)pnumel(e, i) * sizeof(float);
        for (int k = 0; k < 2 && st == DW_OK; k++) {
            float *dst = (k ? h2 : h) + off[i];
            st = e->be->i->download(e->be, dst, (k ? e->x->v : e->x->m) + e->p->param_off[i], bytes);
            char *name = st == DW_OK ? suffixed(t->name, k ? V_SUFFIX : M_SUFFIX) : NULL;
            if (st == DW_OK && !name) st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
            if (st == DW_OK) st = dw_st_writer_add(ctx, w, name, DW_DT_F32, t->ndim, t->shape, dst, bytes);
            free(name);
        }
    }
    if (st == DW_OK) st = dw_st_writer_commit(ctx, w, path);
    dw_st_writer_free(w);
    free(h), free(h2), free(off);
    return st;
}

/* The tensor NAME+suffix of f, checked to be F32 with t's shape. */
static dw_status find_checked(dw_ctx *ctx, const dw_st_file *f, const char *path, const dw_ir_tensor *p,
                              const char *suffix, const dw_st_tensor **out) {
    char *name = suffixed(p->name, suffix);
    if (!name) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    const dw_st_tensor *t = dw_st_find(f, name);
    dw_status st = DW_OK;
    if (!t) {
        st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s' is missing", path, name);
    } else if (t->dtype != DW_DT_F32) {
        st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s' is %s, expected F32", path, name, dw_dtype_name(t->dtype));
    } else {
        bool same = t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
        if (!same) st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s' has a shape other than the model's parameter",
                                     path, name);
    }
    free(name);
    *out = t;
    return st;
}

dw_status dw_engine_load_optimizer(dw_engine *e, const char *path) {
    dw_ctx *ctx = e->ctx;
    dw_st_file *f = NULL;
    DW_TRY(dw_st_open(ctx, path, &f));
    const int n = e->p->n_params;
    dw_status st = DW_OK;
    if (dw_st_count(f) != 2 * n)
        st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: %d tensors, expected %d (two per parameter)", path, dw_st_count(f), 2 * n);
    const dw_st_tensor *t;
    for (int i = 0; i < n && st == DW_OK; i++) { /* all checked before anything changes */
        st = find_checked(ctx, f, path, ptensor(e, i), M_SUFFIX, &t);
        if (st == DW_OK) st = find_checked(ctx, f, path, ptensor(e, i), V_SUFFIX, &t);
    }
    for (int i = 0; i < n && st == DW_OK; i++)
        for (int k = 0; k < 2 && st == DW_OK; k++) {
            st = find_checked(ctx, f, path, ptensor(e, i), k ? V_SUFFIX : M_SUFFIX, &t);
            int64_t skip = 0, count = 0; /* a ZeRO shard holds part of the moments (runtime/exec.h) */
            float *dst = st == DW_OK ? dw_exec_moments(e->x, k, e->p->param_off[i], pnumel(e, i), &skip, &count) : NULL;
            if (dst) st = e->be->i->upload(e->be, dst, (const float *)t->data + skip, (size_t)count * sizeof(float));
        }
    if (st == DW_OK) st = e->be->i->sync(e->be); /* the file's pages are read before it is closed */
    dw_st_close(f);
    return st;
}
