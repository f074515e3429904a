/* ckpt_shard_io.c — the moments as per-rank shard files plus one index, and their loading on any
 * world size (ckpt_shard_io.h). Values travel through host buffers (downloads from the engine's
 * pools when writing; uploads straight from the shards' mappings when loading). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "runtime/engine.h"
#include "train/ckpt.h"
#include "train/ckpt_shard.h"
#include "train/ckpt_shard_io.h"

#define INDEX_FORMAT "deepwell optimizer shards"
static const char *const SUFFIX[2] = {".exp_avg", ".exp_avg_sq"}; /* m, v: as optimizer.safetensors */

static const dw_ir_tensor *ptensor(const dw_engine *e, int i) { return &e->g->tensors[e->p->param_tensor[i]]; }

static char *suffixed(const char *name, int k) {
    size_t n = strlen(name) + strlen(SUFFIX[k]) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s", name, SUFFIX[k]);
    return s;
}

dw_status dw_ckpt_shard_write(dw_engine *e, const char *dir, int rank, int world, int64_t lo, int64_t hi) {
    const int64_t range[2] = {lo, hi};
    return dw_ckpt_shard_write_ranges(e, dir, rank, world, 1, range);
}

dw_status dw_ckpt_shard_write_ranges(dw_engine *e, const char *dir, int rank, int world, int n_ranges,
                                     const int64_t *ranges) {
    dw_ctx *ctx = e->ctx;
    char name[64];
    dw_ckpt_shard_name(rank, world, name, sizeof name);
    char *path = dw_path_join(dir, name);
    const int n = e->p->n_params;
    int64_t total = 0; /* floats held */
    for (int q = 0; q < n_ranges; q++) total += ranges[2 * q + 1] - ranges[2 * q];
    int *mine = malloc((size_t)(n_ranges + 1) * sizeof *mine); /* every range this rank's */
    int64_t *lo = malloc((size_t)(2 * n_ranges + 1) * sizeof *lo), *hi = lo ? lo + n_ranges : NULL;
    for (int q = 0; mine && lo && q < n_ranges; q++) mine[q] = rank, lo[q] = ranges[2 * q], hi[q] = ranges[2 * q + 1];
    dw_ckpt_piece *pc = malloc((size_t)(n_ranges + 1) * sizeof *pc);
    float *h = malloc((size_t)(2 * total + 1) * sizeof *h); /* (2, total): m then v, the ranges in order */
    char **names = calloc((size_t)(2 * n + 1) * (size_t)n_ranges + 1, sizeof *names);
    dw_st_writer *w = NULL;
    dw_status st = path && h && names && mine && lo && pc ? dw_st_writer_create(ctx, &w)
                                                          : dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", dir);
    char meta[64];
    snprintf(meta, sizeof meta, "%d of %d", rank, world);
    if (st == DW_OK) st = dw_st_writer_set_metadata(ctx, w, "deepwell.optimizer", "adamw");
    if (st == DW_OK) st = dw_st_writer_set_metadata(ctx, w, "deepwell.shard", meta);
    for (int i = 0; st == DW_OK && i < n; i++) {
        /* the parameter's elements in this rank's ranges, each piece at its range's place in h */
        const int np = dw_ckpt_pieces_of(e->p->param_off[i], dw_ir_numel(ptensor(e, i)), n_ranges, mine, lo, hi, pc);
        for (int q = 0; q < np && st == DW_OK; q++) {
            const int64_t at = e->p->param_off[i] + pc[q].begin, count = pc[q].end - pc[q].begin, shape[1] = {count};
            int64_t before = 0; /* floats of the ranges before the one holding `at` */
            for (int r = 0; r < n_ranges && !(lo[r] <= at && at < hi[r]); r++) before += hi[r] - lo[r];
            for (int r = 0; r < n_ranges; r++)
                if (lo[r] <= at && at < hi[r]) before += at - lo[r];
            for (int k = 0; k < 2 && st == DW_OK; k++) {
                float *dst = h + k * total + before;
                int64_t skip = 0, held = 0; /* the engine holds this range's moments */
                const float *src = dw_exec_moments(e->x, k, at, count, &skip, &held);
                DW_ASSERT(skip == 0 && held == count);
                st = e->be->i->download(e->be, dst, src, (size_t)count * sizeof *dst);
                char *moment = st == DW_OK ? suffixed(ptensor(e, i)->name, k) : NULL;
                char **slot = &names[(size_t)(2 * i + k) * (size_t)n_ranges + (size_t)q];
                if (st == DW_OK && !(moment && (*slot = dw_ckpt_piece_name(moment, &pc[q]))))
                    st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
                free(moment);
                if (st == DW_OK)
                    st = dw_st_writer_add(ctx, w, *slot, DW_DT_F32, 1, shape, dst, (size_t)count * sizeof *dst);
            }
        }
    }
    if (st == DW_OK) st = dw_st_writer_commit(ctx, w, path);
    dw_st_writer_free(w);
    for (size_t i = 0; names && i < (size_t)(2 * n) * (size_t)n_ranges; i++) free(names[i]);
    free(names), free(h), free(path), free(mine), free(lo), free(pc);
    return st;
}

dw_status dw_ckpt_index_write(dw_engine *e, const char *dir, int world, int zero, const int64_t *ranges) {
    int *rank = malloc((size_t)world * sizeof *rank);
    if (!rank) return dw_set_error(e->ctx, DW_ERR_NOMEM, "%s: out of memory", dir);
    for (int r = 0; r < world; r++) rank[r] = r;
    const dw_status st = dw_ckpt_index_write_ranges(e, dir, world, zero, world, rank, ranges);
    free(rank);
    return st;
}

dw_status dw_ckpt_index_write_ranges(dw_engine *e, const char *dir, int world, int zero, int n_ranges,
                                     const int *rank, const int64_t *ranges) {
    dw_ctx *ctx = e->ctx;
    dw_ckpt_piece *pc = malloc((size_t)(n_ranges + 1) * sizeof *pc);
    int64_t *lo = malloc((size_t)(n_ranges + 1) * 2 * sizeof *lo), *hi = lo ? lo + n_ranges : NULL;
    for (int r = 0; lo && r < n_ranges; r++) lo[r] = ranges[2 * r], hi[r] = ranges[2 * r + 1];
    json_t *tensors = json_object(), *j = json_object();
    char *path = dw_path_join(dir, DW_CKPT_INDEX);
    bool ok = pc && lo && tensors && j && path;
    for (int i = 0; ok && i < e->p->n_params; i++) {
        const dw_ir_tensor *t = ptensor(e, i);
        const int np = dw_ckpt_pieces_of(e->p->param_off[i], dw_ir_numel(t), n_ranges, rank, lo, hi, pc);
        for (int k = 0; ok && k < 2; k++) {
            json_t *shape = json_array(), *pieces = json_array();
            char *name = suffixed(t->name, k);
            ok = name != NULL;
            for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
            for (int q = 0; ok && q < np; q++) {
                char file[64];
                dw_ckpt_shard_name(pc[q].rank, world, file, sizeof file);
                json_t *piece = json_pack("{s:s,s:I,s:I}", "file", file, "begin", (json_int_t)pc[q].begin, "end",
                                          (json_int_t)pc[q].end);
                char *stored = pc[q].nth ? dw_ckpt_piece_name(name, &pc[q]) : NULL; /* a rank's later piece */
                if (pc[q].nth) ok = stored && json_object_set_new(piece, "tensor", json_string(stored)) == 0;
                free(stored);
                json_array_append_new(pieces, piece);
            }
            ok = ok && json_object_set_new(tensors, name, json_pack("{s:o,s:o}", "shape", shape, "pieces", pieces)) == 0;
            free(name);
        }
    }
    dw_status st = DW_OK;
    if (ok) {
        json_object_set_new(j, "format", json_string(INDEX_FORMAT));
        json_object_set_new(j, "world", json_integer(world));
        json_object_set_new(j, "zero", json_integer(zero));
        json_object_set_new(j, "tensors", tensors);
        tensors = NULL;
        char *text = json_dumps(j, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
        st = text ? dw_write_file_atomic(ctx, path, text, strlen(text)) : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
        free(text);
    } else {
        st = dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", dir);
    }
    json_decref(tensors), json_decref(j);
    free(pc), free(lo), free(path);
    return st;
}

/* ---- loading ----------------------------------------------------------------------------------- */
typedef struct {
    dw_ctx *ctx;
    const char *index; /* its path, for messages */
    int world;
    dw_st_file **files; /* (world) */
    int *used;          /* (world) tensors of each shard the index names */
} shards;

/* The pieces the index records for `name` (a moment of parameter t), at most cap: shape, tiling and
 * each later piece of a rank's stored name ("tensor", dw_ckpt_piece_name) checked. */
static dw_status index_pieces(shards *s, const json_t *tensors, const dw_ir_tensor *t, const char *name,
                              dw_ckpt_piece *pc, int *np, int cap) {
    dw_ctx *ctx = s->ctx;
    const json_t *o = json_object_get(tensors, name);
    if (!json_is_object(o))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: no tensor '%s': the checkpoint is not of this model", s->index, name);
    const json_t *shape = json_object_get(o, "shape"), *pieces = json_object_get(o, "pieces");
    bool same = json_is_array(shape) && (int)json_array_size(shape) == t->ndim;
    for (int d = 0; same && d < t->ndim; d++) same = json_integer_value(json_array_get(shape, (size_t)d)) == t->shape[d];
    if (!same) {
        char *got = json_dumps(shape, JSON_COMPACT | JSON_ENCODE_ANY);
        dw_status st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s' has shape %s, but this model's parameter '%s' "
                                    "is %dD %lld elements: the checkpoint is not of this model", s->index, name,
                                    got ? got : "(none)", t->name, t->ndim, (long long)dw_ir_numel(t));
        free(got);
        return st;
    }
    if (!json_is_array(pieces) || json_array_size(pieces) > (size_t)cap)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s': 'pieces' is not an array of at most %d", s->index,
                            name, cap);
    *np = (int)json_array_size(pieces);
    for (int q = 0; q < *np; q++) {
        const json_t *p = json_array_get(pieces, (size_t)q);
        const char *file = json_string_value(json_object_get(p, "file"));
        const json_t *b = json_object_get(p, "begin"), *en = json_object_get(p, "end");
        int r = -1, w = -1;
        if (!file || !json_is_integer(b) || !json_is_integer(en))
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s' piece %d: expected {\"file\", \"begin\", \"end\"}",
                                s->index, name, q);
        if (!dw_ckpt_shard_parse(file, &r, &w) || w != s->world)
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s' piece %d names '%s', not one of the checkpoint's %d "
                                "shards", s->index, name, q, file, s->world);
        int nth = 0; /* this rank's pieces of the tensor before it */
        for (int k = 0; k < q; k++) nth += pc[k].rank == r;
        pc[q] = (dw_ckpt_piece){.rank = r, .begin = json_integer_value(b), .end = json_integer_value(en), .nth = nth};
        const json_t *tn = json_object_get(p, "tensor");
        char *want = tn || nth ? dw_ckpt_piece_name(name, &pc[q]) : NULL;
        const bool named = !tn || (json_is_string(tn) && want && !strcmp(json_string_value(tn), want));
        free(want);
        if (!named)
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s' piece %d: 'tensor' must name the piece as stored "
                                "(its rank's piece %d of the tensor)", s->index, name, q, nth);
    }
    char why[160];
    if (!dw_ckpt_pieces_check(pc, *np, dw_ir_numel(t), why, sizeof why))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s' (%lld elements): %s", s->index, name,
                            (long long)dw_ir_numel(t), why);
    return DW_OK;
}

/* Stored tensor t (`name` in shard file f) against piece pc: present, F32, 1-D of its size. */
static dw_status piece_check(shards *s, const dw_st_file *f, const char *name, const dw_st_tensor *t,
                             const dw_ckpt_piece *pc) {
    const int64_t want = pc->end - pc->begin;
    if (!t)
        return dw_set_error(s->ctx, DW_ERR_FORMAT, "%s: no tensor '%s', which %s places there (elements [%lld, %lld))",
                            dw_st_path(f), name, s->index, (long long)pc->begin, (long long)pc->end);
    if (t->dtype != DW_DT_F32 || t->ndim != 1 || t->shape[0] != want)
        return dw_set_error(s->ctx, DW_ERR_FORMAT, "%s: tensor '%s' is %s of %lld elements, but %s records %lld "
                            "(elements [%lld, %lld), F32): the shard and the index do not match", dw_st_path(f), name,
                            dw_dtype_name(t->dtype), (long long)(t->ndim == 1 ? t->shape[0] : -1), s->index,
                            (long long)want, (long long)pc->begin, (long long)pc->end);
    s->used[pc->rank]++;
    return DW_OK;
}

/* The shard tensor holding piece pc of moment `moment`: present under the piece's name, F32, 1-D of
 * the piece's size. */
static dw_status piece_tensor(shards *s, const char *moment, const dw_ckpt_piece *pc, const dw_st_tensor **out) {
    const dw_st_file *f = s->files[pc->rank];
    char *name = dw_ckpt_piece_name(moment, pc);
    if (!name) return dw_set_error(s->ctx, DW_ERR_NOMEM, "out of memory");
    const dw_st_tensor *t = dw_st_find(f, name);
    dw_status st = piece_check(s, f, name, t, pc);
    free(name);
    if (st == DW_OK) *out = t;
    return st;
}

/* Every shard file opened (a missing one named), the index's header checked. */
static dw_status open_all(shards *s, const char *cdir, const json_t *j) {
    dw_ctx *ctx = s->ctx;
    const char *fmt = json_string_value(json_object_get(j, "format"));
    const json_t *w = json_object_get(j, "world");
    if (!fmt || strcmp(fmt, INDEX_FORMAT))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'format': expected \"%s\"", s->index, INDEX_FORMAT);
    if (!json_is_integer(w) || json_integer_value(w) < 1 || json_integer_value(w) > 99999)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'world': expected the number of shards, 1 to 99999", s->index);
    const int expect = (int)json_integer_value(w);
    s->world = expect;
    s->files = calloc((size_t)expect, sizeof *s->files);
    s->used = calloc((size_t)expect, sizeof *s->used);
    if (!s->files || !s->used) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    for (int r = 0; r < expect; r++) {
        char name[64];
        dw_ckpt_shard_name(r, expect, name, sizeof name);
        char *p = dw_path_join(cdir, name);
        dw_status st = p ? dw_st_open(ctx, p, &s->files[r]) : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
        free(p);
        DW_TRY(st);
    }
    return DW_OK;
}

dw_status dw_ckpt_shards_load(dw_engine *e, const char *cdir) {
    dw_ctx *ctx = e->ctx;
    const int n = e->p->n_params;
    shards s = {.ctx = ctx};
    char *index = dw_path_join(cdir, DW_CKPT_INDEX);
    json_t *j = NULL;
    dw_ckpt_piece *pc = NULL; /* (2n, cap): each moment's pieces */
    const dw_st_tensor **src = NULL; /* (2n, cap): the shard tensor of each piece */
    dw_ckpt_copy *copies = NULL;     /* (cap) */
    int *np = calloc((size_t)(2 * n + 1), sizeof *np), cap = 0; /* the most pieces a tensor has */
    dw_status st = index && np ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    s.index = index;
    if (st == DW_OK) st = dw_json_load_file(ctx, index, &j);
    if (st == DW_OK) st = open_all(&s, cdir, j);
    const json_t *tensors = j ? json_object_get(j, "tensors") : NULL;
    if (st == DW_OK) { /* a piece a rank's range meets, or several a rank (several ranges) */
        cap = s.world;
        const char *key;
        const json_t *v;
        json_object_foreach((json_t *)tensors, key, v) {
            (void)key;
            const size_t k = json_array_size(json_object_get(v, "pieces"));
            if (k > (size_t)cap && k <= (size_t)INT32_MAX / 4) cap = (int)k;
        }
        pc = malloc((size_t)(2 * n + 1) * (size_t)cap * sizeof *pc);
        src = malloc((size_t)(2 * n + 1) * (size_t)cap * sizeof *src);
        copies = malloc((size_t)cap * sizeof *copies);
        if (!pc || !src || !copies) st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    }
    if (st == DW_OK && !json_is_object(tensors))
        st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'tensors': missing or not an object", index);
    if (st == DW_OK && json_object_size(tensors) != (size_t)(2 * n))
        st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: %zu tensors, but this model's %d parameters have %d moments: the "
                          "checkpoint is not of this model", index, json_object_size(tensors), n, 2 * n);
    for (int q = 0; st == DW_OK && q < 2 * n; q++) { /* everything checked before anything is uploaded */
        char *name = suffixed(ptensor(e, q / 2)->name, q % 2);
        st = name ? index_pieces(&s, tensors, ptensor(e, q / 2), name, pc + (size_t)q * cap, &np[q], cap)
                  : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
        for (int k = 0; st == DW_OK && k < np[q]; k++)
            st = piece_tensor(&s, name, &pc[(size_t)q * cap + k], &src[(size_t)q * cap + k]);
        free(name);
    }
    for (int r = 0; st == DW_OK && r < s.world; r++)
        if (dw_st_count(s.files[r]) != s.used[r])
            st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: %d tensors, but %s places %d there", dw_st_path(s.files[r]),
                              dw_st_count(s.files[r]), index, s.used[r]);
    for (int q = 0; st == DW_OK && q < 2 * n; q++) {
        int64_t skip = 0, count = 0; /* the tensor's elements whose moments the engine holds (ZeRO: its shard) */
        float *dst = dw_exec_moments(e->x, q % 2, e->p->param_off[q / 2], dw_ir_numel(ptensor(e, q / 2)), &skip, &count);
        if (!count) continue;
        dw_ckpt_copy *cp = copies; /* from whichever shards hold those elements */
        const int nc = dw_ckpt_copies(pc + (size_t)q * cap, np[q], skip, skip + count, cp);
        for (int k = 0; st == DW_OK && k < nc; k++)
            st = e->be->i->upload(e->be, dst + cp[k].dst, (const float *)src[(size_t)q * cap + cp[k].piece]->data + cp[k].src,
                                  (size_t)cp[k].count * sizeof(float));
    }
    if (st == DW_OK) st = e->be->i->sync(e->be); /* the mappings are read before the files close */
    if (st == DW_OK)
        DW_LOGI("%s: the moments from %d shards (ZeRO-%lld)", index, s.world,
                (long long)json_integer_value(json_object_get(j, "zero")));
    for (int r = 0; s.files && r < s.world; r++) dw_st_close(s.files[r]);
    free(s.files), free(s.used);
    json_decref(j);
    free(index), free(pc), free(np), free(src), free(copies);
    return st;
}
