/* ckpt.c — checkpoint directories: atomic save with checksums, validation on open, `latest`,
 * keeping the newest K (see ckpt.h). */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/log.h"
#include "train/ckpt.h"
#include "train/ckpt_fs.h"
#include "train/ckpt_shard.h"

const char *const dw_ckpt_files[DW_CKPT_NFILES] = {"config.json", "model.safetensors",
                                                   "optimizer.safetensors"};

/* The files a checkpoint holds besides state.json, with their sizes and CRC-32s. */
typedef struct {
    char name[64];
    int64_t size;
    uint32_t crc;
} ckpt_file;
typedef struct {
    ckpt_file *f;
    int n, cap;
} file_list;

static bool list_add(file_list *l, const char *name, int64_t size, uint32_t crc) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 8;
        ckpt_file *g = realloc(l->f, (size_t)cap * sizeof *g);
        if (!g) return false;
        l->f = g, l->cap = cap;
    }
    ckpt_file *f = &l->f[l->n++];
    snprintf(f->name, sizeof f->name, "%s", name);
    f->size = size, f->crc = crc;
    return true;
}

static const ckpt_file *list_find(const file_list *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->f[i].name, name)) return &l->f[i];
    return NULL;
}

static json_t *hex64(uint64_t v) {
    char b[24];
    snprintf(b, sizeof b, "0x%016" PRIx64, v);
    return json_string(b);
}

/* state.json's document; "files": {name: {size, crc32}} of every other file, in the list's order. */
static json_t *state_to_json(const dw_ckpt_state *s, const file_list *l) {
    json_t *files = json_object();
    for (int i = 0; i < l->n; i++) {
        char crc[16];
        snprintf(crc, sizeof crc, "%08" PRIx32, l->f[i].crc);
        json_object_set_new(files, l->f[i].name, json_pack("{s:I,s:s}", "size", (json_int_t)l->f[i].size, "crc32", crc));
    }
    json_t *j = json_object();
    const bool sharded = list_find(l, DW_CKPT_INDEX) != NULL;
    json_object_set_new(j, "format_version", json_integer(sharded ? DW_CKPT_FORMAT_VERSION : DW_CKPT_FORMAT_ONE_RANK));
    json_object_set_new(j, "step", json_integer(s->step));
    json_object_set_new(j, "total_steps", json_integer(s->total_steps));
    json_object_set_new(j, "tokens_seen", json_integer(s->tokens_seen));
    json_object_set_new(j, "data", json_pack("{s:s,s:o,s:s}", "pattern", s->data, "position",
                                             hex64(s->data_position), "tokenizer", s->tokenizer));
    json_object_set_new(j, "rng", json_pack("{s:o,s:o}", "seed", hex64(s->seed), "state",
                                            hex64(s->rng_state)));
    json_object_set_new(j, "schedule",
                        json_pack("{s:s,s:f,s:f,s:I,s:I}", "kind", dw_schedule_name(s->schedule.kind),
                                  "lr", s->schedule.lr, "min_lr", s->schedule.min_lr, "warmup",
                                  (json_int_t)s->schedule.warmup, "total",
                                  (json_int_t)s->schedule.total));
    json_object_set_new(j, "optimizer",
                        json_pack("{s:s,s:f,s:f,s:f,s:f,s:f}", "name", "adamw", "beta1", s->beta1,
                                  "beta2", s->beta2, "eps", s->eps, "weight_decay", s->weight_decay,
                                  "clip", s->clip));
    json_object_set_new(j, "batch", json_pack("{s:I,s:I,s:I}", "micro", (json_int_t)s->batch, "seq",
                                              (json_int_t)s->seq, "global", (json_int_t)s->global_batch));
    json_object_set_new(j, "precision", json_string(s->precision));
    if (s->has_run)
        json_object_set_new(j, "run", json_pack("{s:s,s:I,s:I,s:I,s:I,s:s}", "val", s->val, "eval_every",
                                                (json_int_t)s->eval_every, "eval_batches",
                                                (json_int_t)s->eval_batches, "ckpt_every",
                                                (json_int_t)s->ckpt_every, "keep", (json_int_t)s->keep,
                                                "device", s->device));
    json_t *pol = s->policy_json ? json_loads(s->policy_json, 0, NULL) : NULL;
    json_t *rec = s->recipes_json ? json_loads(s->recipes_json, 0, NULL) : NULL;
    json_object_set_new(j, "policy", pol ? pol : json_null());
    json_object_set_new(j, "recipes", rec ? rec : json_null());
    json_object_set_new(j, "plan", json_null());
    json_object_set_new(j, "quant_scales", json_object());
    if (s->spike_json) json_object_set_new(j, "spike", json_loads(s->spike_json, 0, NULL));
    if (s->amax_json) json_object_set_new(j, "fp8_amax_history", json_loads(s->amax_json, 0, NULL));
    if (s->moe_bias_json) json_object_set_new(j, "moe_bias", json_loads(s->moe_bias_json, 0, NULL));
    json_object_set_new(j, "files", files);
    json_object_set_new(j, DW_CKPT_SELF_CRC, json_string("00000000")); /* last: filled in after dumping */
    return j;
}

/* The 8 hex digits of state.json's own "state_crc32" in text: its last occurrence (the top-level
 * member, written last; the quote marks of a key never occur unescaped inside a string), or NULL. */
static char *self_crc_digits(char *text) {
    const char *key = "\"" DW_CKPT_SELF_CRC "\": \"";
    char *found = NULL;
    for (char *p = strstr(text, key); p; p = strstr(p + 1, key)) found = p;
    if (!found) return NULL;
    char *d = found + strlen(key);
    for (int i = 0; i < 8; i++)
        if (!d[i] || !strchr("0123456789abcdefABCDEF", d[i])) return NULL;
    return d[8] == '"' ? d : NULL;
}

/* Checks state.json's "state_crc32" (format_version 2): the CRC-32 of the file's bytes with those 8
 * digits read as zeros. A format_version 1 file (written before the field) is accepted with a note. */
static dw_status check_self_crc(dw_ctx *ctx, const char *path, const json_t *j, char *text, size_t n) {
    json_int_t ver = json_integer_value(json_object_get(j, "format_version"));
    json_t *field = json_object_get(j, DW_CKPT_SELF_CRC);
    if (ver < 2 && !field) {
        DW_LOGW("%s: format_version %lld has no \"%s\" of its own to check (written before it existed); "
                "its files' sizes and CRC-32s are still checked", path, (long long)ver, DW_CKPT_SELF_CRC);
        return DW_OK;
    }
    char *d = self_crc_digits(text);
    if (!json_is_string(field) || !d || strncmp(json_string_value(field), d, 8) || strlen(json_string_value(field)) != 8)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: no \"%s\" of 8 hex digits: damaged (format_version %lld records one)",
                            path, DW_CKPT_SELF_CRC, (long long)ver);
    char rec[9];
    memcpy(rec, d, 8);
    rec[8] = '\0';
    memcpy(d, "00000000", 8);
    uint32_t crc = dw_crc32(text, n);
    memcpy(d, rec, 8);
    if (strtoul(rec, NULL, 16) != crc)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: CRC-32 %08" PRIx32 ", but its \"%s\" records %s: corrupt "
                            "(the file was changed after it was written)", path, crc, DW_CKPT_SELF_CRC, rec);
    return DW_OK;
}

static dw_status get_hex64(dw_ctx *ctx, const json_t *o, const char *key, const char *what,
                           uint64_t *out) {
    const char *t = NULL;
    DW_TRY(dw_json_get_str(ctx, o, key, what, &t));
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(t, &end, 16);
    if (strncmp(t, "0x", 2) || *end || errno)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field '%s': expected a hex string \"0x...\", got \"%s\"",
                            what, key, t);
    *out = v;
    return DW_OK;
}

static dw_status get_obj(dw_ctx *ctx, const json_t *o, const char *key, const char *what, json_t **out) {
    *out = json_object_get(o, key);
    if (!json_is_object(*out))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field '%s': missing or not an object", what, key);
    return DW_OK;
}

static dw_status get_i64(dw_ctx *ctx, const json_t *o, const char *key, const char *what, int64_t *out) {
    long long v = 0;
    DW_TRY(dw_json_get_int(ctx, o, key, what, &v));
    *out = v;
    return DW_OK;
}

static dw_status copy_str(dw_ctx *ctx, const json_t *o, const char *key, const char *what, char *dst,
                          size_t cap) {
    const char *t = NULL;
    DW_TRY(dw_json_get_str(ctx, o, key, what, &t));
    if (strlen(t) >= cap) return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field '%s': too long", what, key);
    strcpy(dst, t);
    return DW_OK;
}

/* The files state.json lists are a checkpoint's: config.json and model.safetensors, then either
 * optimizer.safetensors (one rank) or the index and shards 0..N-1 of one N (*shards = N). */
static dw_status check_file_set(dw_ctx *ctx, const char *what, const file_list *l, int *shards) {
    *shards = 0;
    const bool one = list_find(l, dw_ckpt_files[2]) != NULL;
    const char *need[3] = {dw_ckpt_files[0], dw_ckpt_files[1], one ? dw_ckpt_files[2] : DW_CKPT_INDEX};
    for (int i = 0; i < 3; i++)
        if (!list_find(l, need[i]))
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: files: no entry for %s", what, need[i]);
    int world = 0, seen = 0;
    for (int i = 0; i < l->n; i++) {
        int r, w;
        bool known = !strcmp(l->f[i].name, DW_CKPT_TOKENIZER); /* optional (dw_run_set_tokenizer) */
        for (int k = 0; k < 3; k++) known = known || !strcmp(l->f[i].name, need[k]);
        if (known) continue;
        if (one || !dw_ckpt_shard_parse(l->f[i].name, &r, &w) || (world && w != world))
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: files: '%s' is not a file of this checkpoint's kind (%s)", what,
                                l->f[i].name, one ? "one rank's: config.json, model.safetensors, optimizer.safetensors"
                                                  : "sharded: one set of optimizer-<r>-of-<N>.safetensors");
        world = w, seen++;
    }
    if (!one && seen != world) /* names are unique keys, so N distinct ranks below N are all of them */
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: files: %d of the %d shards listed", what, seen, world);
    if (!one && !world) return dw_set_error(ctx, DW_ERR_FORMAT, "%s: files: an index but no shard", what);
    *shards = world;
    return DW_OK;
}

static dw_status state_from_json(dw_ctx *ctx, const json_t *j, const char *what, dw_ckpt_state *s,
                                 file_list *l) {
    memset(s, 0, sizeof *s);
    if (!json_is_object(j)) return dw_set_error(ctx, DW_ERR_FORMAT, "%s: not a JSON object", what);
    int64_t ver = 0;
    DW_TRY(get_i64(ctx, j, "format_version", what, &ver));
    if (ver < 1 || ver > DW_CKPT_FORMAT_VERSION)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: format_version %lld, this build reads 1 to %d", what,
                            (long long)ver, DW_CKPT_FORMAT_VERSION);
    DW_TRY(get_i64(ctx, j, "step", what, &s->step));
    DW_TRY(get_i64(ctx, j, "total_steps", what, &s->total_steps));
    DW_TRY(get_i64(ctx, j, "tokens_seen", what, &s->tokens_seen));
    json_t *o = NULL;
    DW_TRY(get_obj(ctx, j, "data", what, &o));
    DW_TRY(copy_str(ctx, o, "pattern", what, s->data, sizeof s->data));
    DW_TRY(get_hex64(ctx, o, "position", what, &s->data_position));
    DW_TRY(copy_str(ctx, o, "tokenizer", what, s->tokenizer, sizeof s->tokenizer));
    DW_TRY(get_obj(ctx, j, "rng", what, &o));
    DW_TRY(get_hex64(ctx, o, "seed", what, &s->seed));
    DW_TRY(get_hex64(ctx, o, "state", what, &s->rng_state));
    DW_TRY(get_obj(ctx, j, "schedule", what, &o));
    const char *kind = NULL;
    DW_TRY(dw_json_get_str(ctx, o, "kind", what, &kind));
    if (!dw_schedule_parse(kind, &s->schedule.kind))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: schedule kind '%s' is unknown", what, kind);
    DW_TRY(dw_json_get_num(ctx, o, "lr", what, &s->schedule.lr));
    DW_TRY(dw_json_get_num(ctx, o, "min_lr", what, &s->schedule.min_lr));
    DW_TRY(get_i64(ctx, o, "warmup", what, &s->schedule.warmup));
    DW_TRY(get_i64(ctx, o, "total", what, &s->schedule.total));
    DW_TRY(get_obj(ctx, j, "optimizer", what, &o));
    DW_TRY(dw_json_get_num(ctx, o, "beta1", what, &s->beta1));
    DW_TRY(dw_json_get_num(ctx, o, "beta2", what, &s->beta2));
    DW_TRY(dw_json_get_num(ctx, o, "eps", what, &s->eps));
    DW_TRY(dw_json_get_num(ctx, o, "weight_decay", what, &s->weight_decay));
    DW_TRY(dw_json_get_num(ctx, o, "clip", what, &s->clip));
    DW_TRY(get_obj(ctx, j, "batch", what, &o));
    DW_TRY(get_i64(ctx, o, "micro", what, &s->batch));
    DW_TRY(get_i64(ctx, o, "seq", what, &s->seq));
    DW_TRY(get_i64(ctx, o, "global", what, &s->global_batch));
    DW_TRY(copy_str(ctx, j, "precision", what, s->precision, sizeof s->precision));
    if (json_object_get(j, "run")) { /* absent before the run record existed: still readable */
        DW_TRY(get_obj(ctx, j, "run", what, &o));
        DW_TRY(copy_str(ctx, o, "val", what, s->val, sizeof s->val));
        DW_TRY(get_i64(ctx, o, "eval_every", what, &s->eval_every));
        DW_TRY(get_i64(ctx, o, "eval_batches", what, &s->eval_batches));
        DW_TRY(get_i64(ctx, o, "ckpt_every", what, &s->ckpt_every));
        DW_TRY(get_i64(ctx, o, "keep", what, &s->keep));
        DW_TRY(copy_str(ctx, o, "device", what, s->device, sizeof s->device));
        s->has_run = true;
    }
    json_t *files = NULL, *f;
    DW_TRY(get_obj(ctx, j, "files", what, &files));
    const char *name;
    json_object_foreach(files, name, f) {
        if (!json_is_object(f))
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: files.%s: expected {size, crc32}", what, name);
        if (strlen(name) >= sizeof l->f->name || strchr(name, '/') || !strcmp(name, "state.json") || name[0] == '.')
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: files: '%s' is not a checkpoint's file name", what, name);
        int64_t size = 0;
        DW_TRY(get_i64(ctx, f, "size", what, &size));
        const char *crc = NULL;
        DW_TRY(dw_json_get_str(ctx, f, "crc32", what, &crc));
        char *end = NULL;
        unsigned long v = strtoul(crc, &end, 16);
        if (strlen(crc) != 8 || *end)
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: files.%s.crc32: expected 8 hex digits, got \"%s\"",
                                what, name, crc);
        if (!list_add(l, name, size, (uint32_t)v)) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    }
    DW_TRY(check_file_set(ctx, what, l, &s->shards));
    s->has_tokenizer = list_find(l, DW_CKPT_TOKENIZER) != NULL;
    if (s->step < 0 || s->step > s->total_steps || s->batch < 1 || s->seq < 1 || s->global_batch < s->batch)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: inconsistent step/batch fields", what);
    return DW_OK;
}

static int ckpt_step_of(const char *name, int64_t *step) {
    char *end = NULL;
    if (strncmp(name, "ckpt-", 5) || !name[5]) return 0;
    long long v = strtoll(name + 5, &end, 10);
    if (*end || v < 0) return 0;
    *step = v;
    return 1;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Removes leftovers of interrupted saves and all but the newest `keep` checkpoints. */
static dw_status prune(dw_ctx *ctx, const char *run_dir, int keep, int64_t newest) {
    DIR *dir = opendir(run_dir);
    if (!dir) return dw_set_error(ctx, DW_ERR_IO, "%s: cannot list: %s", run_dir, strerror(errno));
    int64_t *steps = NULL;
    size_t n = 0, cap = 0;
    char pid_tag[32];
    snprintf(pid_tag, sizeof pid_tag, ".%ld", (long)getpid());
    dw_status st = DW_OK;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL && st == DW_OK) {
        int64_t s;
        if (ckpt_step_of(e->d_name, &s)) {
            if (n == cap) {
                cap = cap ? cap * 2 : 16;
                int64_t *grown = realloc(steps, cap * sizeof *steps);
                if (!grown) {
                    st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
                    break;
                }
                steps = grown;
            }
            steps[n++] = s;
        } else if (!strncmp(e->d_name, ".tmp-ckpt-", 10) || !strncmp(e->d_name, ".old-ckpt-", 10)) {
            char *p = dw_path_join(run_dir, e->d_name);
            st = p ? dw_rmtree(ctx, p) : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
            free(p);
        }
    }
    closedir(dir);
    if (st == DW_OK && keep > 0 && n > (size_t)keep) {
        qsort(steps, n, sizeof *steps, cmp_i64);
        for (size_t i = 0; i + (size_t)keep < n && st == DW_OK; i++) {
            if (steps[i] == newest) continue;
            char name[40];
            snprintf(name, sizeof name, "ckpt-%lld", (long long)steps[i]);
            char *p = dw_path_join(run_dir, name);
            st = p ? dw_rmtree(ctx, p) : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
            free(p);
        }
    }
    free(steps);
    return st;
}

/* fsync, size and CRC-32 of dir/name, added to the list. */
static dw_status add_file(dw_ctx *ctx, const char *dir, const char *name, file_list *l) {
    char *p = dw_path_join(dir, name);
    uint32_t crc = 0;
    int64_t size = 0;
    dw_status st = p ? dw_fsync_path(ctx, p, false) : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    if (st == DW_OK) st = dw_file_crc32(ctx, p, &crc, &size);
    if (st == DW_OK && !list_add(l, name, size, crc)) st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    free(p);
    return st;
}

/* run_dir's tokenizer.json (dw_run_set_tokenizer), when it has one, copied into the checkpoint's
 * temporary directory and added to the list: the checkpoint decodes with the tokenizer its run had. */
static dw_status copy_run_tokenizer(dw_ctx *ctx, const char *run_dir, const char *tmp, file_list *l) {
    char *src = dw_path_join(run_dir, DW_CKPT_TOKENIZER), *dst = dw_path_join(tmp, DW_CKPT_TOKENIZER);
    dw_status st = src && dst ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    const bool has = st == DW_OK && access(src, F_OK) == 0;
    if (has) st = dw_copy_file_atomic(ctx, src, dst);
    if (has && st == DW_OK) st = add_file(ctx, tmp, DW_CKPT_TOKENIZER, l);
    free(src);
    free(dst);
    return st;
}

/* state.json into tmp, its own CRC-32 written over its "state_crc32" digits. */
static dw_status write_state(dw_ctx *ctx, const char *tmp, const dw_ckpt_state *state, const file_list *l) {
    char *state_path = dw_path_join(tmp, "state.json");
    json_t *j = state_path ? state_to_json(state, l) : NULL;
    /* 17 significant digits: every double in state.json reads back exactly */
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(j);
    char *digits = text ? self_crc_digits(text) : NULL;
    if (digits) { /* the CRC-32 of the text with its own digits as zeros, written over them */
        char hex[9];
        snprintf(hex, sizeof hex, "%08" PRIx32, dw_crc32(text, strlen(text)));
        memcpy(digits, hex, 8);
    }
    dw_status st = digits ? dw_write_file_atomic(ctx, state_path, text, strlen(text))
                          : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    free(text);
    free(state_path);
    return st;
}

/* Rank 0's part after every file is written: state.json, the rename, `latest`, pruning. */
static dw_status publish(dw_ctx *ctx, const char *run_dir, const char *name, const char *tmp, const char *final,
                         const char *old, const dw_ckpt_state *state, const file_list *l, int keep) {
    DW_TRY(write_state(ctx, tmp, state, l));
    DW_TRY(dw_fsync_path(ctx, tmp, true));
    struct stat sb;
    bool replace = stat(final, &sb) == 0;
    if (replace && rename(final, old) != 0)
        return dw_set_error(ctx, DW_ERR_IO, "%s: cannot move aside: %s", final, strerror(errno));
    if (rename(tmp, final) != 0)
        return dw_set_error(ctx, DW_ERR_IO, "%s: rename from %s failed: %s", final, tmp, strerror(errno));
    DW_TRY(dw_fsync_path(ctx, run_dir, true));
    if (replace) DW_TRY(dw_rmtree(ctx, old));
    char *latest = dw_path_join(run_dir, "latest"), text[80];
    snprintf(text, sizeof text, "%s\n", name);
    dw_status st = latest ? dw_write_file_atomic(ctx, latest, text, strlen(text))
                          : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    free(latest);
    DW_TRY(st);
    return prune(ctx, run_dir, keep, state->step);
}

/* Several ranks: rank 0's status and an int64 value to every rank (ok[0]: 1 when it went well). A
 * failure on rank 0 becomes the others' error. */
static dw_status agree_root(dw_ctx *ctx, dw_comm *host, dw_status st, int64_t *value, const char *what) {
    int64_t b[2] = {st == DW_OK, value ? *value : 0};
    DW_TRY(dw_comm_broadcast(ctx, host, b, 2, DW_COMM_I64, 0));
    if (value) *value = b[1];
    if (host->rank != 0 && !b[0])
        return dw_set_error(ctx, DW_ERR_IO, "rank 0 could not %s (its own message says why)", what);
    return st;
}

/* Several ranks: every rank's shard fsynced and checksummed, (written, size, CRC-32) gathered; any
 * rank that did not write fails the checkpoint on all. Rank 0 adds the shards to the list. */
static dw_status gather_shards(dw_ctx *ctx, dw_comm *host, const char *tmp, int64_t step, dw_status st, file_list *l) {
    const int rank = host->rank, world = host->world;
    char name[64];
    dw_ckpt_shard_name(rank, world, name, sizeof name);
    file_list mine = {0};
    if (st == DW_OK) st = add_file(ctx, tmp, name, &mine);
    int64_t *all = calloc((size_t)world * 3, sizeof *all); /* (world, 3): written, size, crc */
    if (!all) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    if (st == DW_OK) all[3 * rank] = 1, all[3 * rank + 1] = mine.f[0].size, all[3 * rank + 2] = mine.f[0].crc;
    free(mine.f);
    dw_status cs = dw_comm_all_gather(ctx, host, all, 3, DW_COMM_I64);
    for (int r = 0; cs == DW_OK && st == DW_OK && r < world; r++) {
        if (!all[3 * r]) {
            st = dw_set_error(ctx, DW_ERR_IO, "checkpoint of step %lld: rank %d could not write its files (its own "
                              "message says why); the checkpoint is incomplete and `latest` is unchanged",
                              (long long)step, r);
        } else if (rank == 0) {
            dw_ckpt_shard_name(r, world, name, sizeof name);
            if (!list_add(l, name, all[3 * r + 1], (uint32_t)all[3 * r + 2]))
                st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
        }
    }
    free(all);
    return cs != DW_OK ? cs : st;
}

dw_status dw_ckpt_save(dw_ctx *ctx, const char *run_dir, const dw_ckpt_state *state,
                       dw_ckpt_write_fn write, void *user, int keep, char **path_out) {
    return dw_ckpt_save_ranks(ctx, NULL, run_dir, state, write, user, keep, path_out);
}

dw_status dw_ckpt_save_ranks(dw_ctx *ctx, dw_comm *host, const char *run_dir, const dw_ckpt_state *state,
                             dw_ckpt_write_fn write, void *user, int keep, char **path_out) {
    if (path_out) *path_out = NULL;
    const bool many = host && host->world > 1, lead = !many || host->rank == 0;
    dw_status st = DW_OK;
    if (lead && mkdir(run_dir, 0755) != 0 && errno != EEXIST)
        st = dw_set_error(ctx, DW_ERR_IO, "%s: cannot create directory: %s", run_dir, strerror(errno));
    int64_t pid = (int64_t)getpid(); /* the temporary directory carries rank 0's */
    char name[64], tmp_name[96], old_name[96];
    snprintf(name, sizeof name, "ckpt-%lld", (long long)state->step);
    snprintf(tmp_name, sizeof tmp_name, ".tmp-%s.%lld", name, (long long)pid);
    char *tmp = dw_path_join(run_dir, tmp_name);
    if (st == DW_OK && !tmp) st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    if (lead && st == DW_OK) st = dw_rmtree(ctx, tmp);
    if (lead && st == DW_OK && mkdir(tmp, 0755) != 0)
        st = dw_set_error(ctx, DW_ERR_IO, "%s: cannot create directory: %s", tmp, strerror(errno));
    if (many) {
        st = agree_root(ctx, host, st, &pid, "create the checkpoint's temporary directory");
        free(tmp);
        snprintf(tmp_name, sizeof tmp_name, ".tmp-%s.%lld", name, (long long)pid);
        tmp = dw_path_join(run_dir, tmp_name);
        if (st == DW_OK && !tmp) st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
        if (st != DW_OK) {
            free(tmp);
            return st;
        }
    }
    snprintf(old_name, sizeof old_name, ".old-%s.%lld", name, (long long)pid);
    char *final = dw_path_join(run_dir, name), *old = dw_path_join(run_dir, old_name);
    if (st == DW_OK && (!final || !old)) st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    if (st == DW_OK) st = write(ctx, tmp, user);
    file_list l = {0};
    const char *mine[3] = {dw_ckpt_files[0], dw_ckpt_files[1], many ? DW_CKPT_INDEX : dw_ckpt_files[2]};
    for (int i = 0; lead && i < 3 && st == DW_OK; i++) st = add_file(ctx, tmp, mine[i], &l);
    if (lead && st == DW_OK) st = copy_run_tokenizer(ctx, run_dir, tmp, &l);
    if (many) {
        dw_status gs = gather_shards(ctx, host, tmp, state->step, st, &l);
        if (st == DW_OK) st = gs; /* a failure of this rank keeps its own message */
    }
    const bool written = st == DW_OK; /* on every rank alike: every shard is there */
    if (lead && st == DW_OK) st = publish(ctx, run_dir, name, tmp, final, old, state, &l, keep);
    if (many && written) st = agree_root(ctx, host, st, NULL, "complete the checkpoint"); /* rank 0's outcome */
    if (st != DW_OK && lead && tmp) {
        dw_ctx *quiet = NULL; /* keep the first error's message */
        (void)dw_rmtree(quiet, tmp);
    }
    if (st == DW_OK && path_out && lead) {
        *path_out = final;
        final = NULL;
    }
    free(l.f);
    free(final);
    free(tmp);
    free(old);
    return st;
}

/* dir itself when it holds state.json, else the checkpoint its `latest` file names. */
static dw_status resolve(dw_ctx *ctx, const char *dir, char **out) {
    *out = NULL;
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return dw_set_error(ctx, DW_ERR_IO, "%s: no such checkpoint or run directory", dir);
    char *state = dw_path_join(dir, "state.json"), *latest = dw_path_join(dir, "latest");
    dw_status st = DW_OK;
    if (!state || !latest) {
        st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    } else if (access(latest, F_OK) == 0 && access(state, F_OK) != 0) {
        char *text = NULL;
        size_t n = 0;
        st = dw_read_file(ctx, latest, &text, &n);
        if (st == DW_OK) {
            while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == ' ')) text[--n] = '\0';
            int64_t step;
            if (!ckpt_step_of(text, &step) || strlen(text) != n) {
                char shown[256];
                dw_escape_bytes(text, n, shown, sizeof shown);
                st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: expected a checkpoint name like ckpt-100, got \"%s\"",
                                  latest, shown);
            }
            else if (!(*out = dw_path_join(dir, text)))
                st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
        }
        free(text);
    } else if (!(*out = strdup(dir))) {
        st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    }
    free(state);
    free(latest);
    return st;
}

/* The newest checkpoint of run_dir other than `skip` that validates, or NULL (free()). */
static char *newest_good(const char *run_dir, int64_t skip) {
    DIR *d = opendir(run_dir);
    if (!d) return NULL;
    int64_t best = -1, s;
    char *found = NULL;
    for (;;) { /* descending: each pass takes the newest step below the last one tried */
        rewinddir(d);
        int64_t next = -1;
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            if (ckpt_step_of(e->d_name, &s) && s != skip && (best < 0 || s < best) && s > next) next = s;
        if (next < 0) break;
        best = next;
        char name[40];
        snprintf(name, sizeof name, "ckpt-%lld", (long long)next);
        char *p = dw_path_join(run_dir, name), *cdir = NULL;
        dw_ckpt_state st;
        dw_ctx *quiet = NULL; /* the caller's message stays; this one goes to the thread's slot */
        if (p && dw_ckpt_open(quiet, p, &cdir, &st) == DW_OK) {
            free(cdir);
            found = p;
            break;
        }
        free(p);
    }
    closedir(d);
    return found;
}

/* A run directory's `latest` that cannot be used: the message names the newest good checkpoint. */
static dw_status name_good(dw_ctx *ctx, dw_status st, const char *run_dir, const char *bad_cdir) {
    int64_t skip = -1;
    const char *base = bad_cdir ? strrchr(bad_cdir, '/') : NULL;
    if (base) ckpt_step_of(base + 1, &skip);
    char *msg = strdup(dw_errmsg(ctx)), *good = newest_good(run_dir, skip);
    if (msg && good)
        st = dw_set_error(ctx, st, "%s; the newest good checkpoint is %s: resume from it with "
                                   "`deepwell train --resume %s --out %s`",
                          msg, good, good, run_dir);
    else if (msg)
        st = dw_set_error(ctx, st, "%s; %s has no other complete checkpoint", msg, run_dir);
    free(msg);
    free(good);
    return st;
}

/* A sharded checkpoint's index records as many ranks as state.json lists shards. */
static dw_status check_index_world(dw_ctx *ctx, const char *cdir, int shards) {
    char *p = dw_path_join(cdir, DW_CKPT_INDEX);
    json_t *j = NULL;
    dw_status st = p ? dw_json_load_file(ctx, p, &j) : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    const json_t *w = j ? json_object_get(j, "world") : NULL;
    if (st == DW_OK && (!json_is_integer(w) || json_integer_value(w) != shards))
        st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'world': expected %d, the shards its state.json lists", p, shards);
    json_decref(j);
    free(p);
    return st;
}

dw_status dw_ckpt_open(dw_ctx *ctx, const char *dir, char **ckpt_dir_out, dw_ckpt_state *out) {
    *ckpt_dir_out = NULL;
    memset(out, 0, sizeof *out);
    char *cdir = NULL;
    dw_status rs = resolve(ctx, dir, &cdir);
    if (rs == DW_ERR_FORMAT) return name_good(ctx, rs, dir, NULL); /* `latest` is garbage */
    DW_TRY(rs);
    char *state_path = dw_path_join(cdir, "state.json");
    dw_status st = state_path ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    if (st == DW_OK && access(state_path, F_OK) != 0)
        st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: missing: %s is not a complete checkpoint", state_path, cdir);
    json_t *j = NULL;
    char *text = NULL;
    size_t n = 0;
    if (st == DW_OK) st = dw_read_file(ctx, state_path, &text, &n);
    if (st == DW_OK) st = dw_json_load_string(ctx, text, n, state_path, &j);
    file_list l = {0};
    if (st == DW_OK) st = state_from_json(ctx, j, state_path, out, &l);
    if (st == DW_OK) st = check_self_crc(ctx, state_path, j, text, n);
    json_decref(j);
    free(text);
    for (int i = 0; i < l.n && st == DW_OK; i++) {
        char *p = dw_path_join(cdir, l.f[i].name);
        if (!p) {
            st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
            break;
        }
        uint32_t crc = 0;
        int64_t size = 0;
        if (access(p, F_OK) != 0)
            st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: missing: the checkpoint is incomplete", p);
        else
            st = dw_file_crc32(ctx, p, &crc, &size);
        if (st == DW_OK && size != l.f[i].size)
            st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: %lld bytes, but state.json records %lld: corrupt or truncated",
                              p, (long long)size, (long long)l.f[i].size);
        if (st == DW_OK && crc != l.f[i].crc)
            st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: CRC-32 %08" PRIx32 ", but state.json records %08" PRIx32 ": corrupt",
                              p, crc, l.f[i].crc);
        free(p);
    }
    free(l.f);
    if (st == DW_OK && out->shards) st = check_index_world(ctx, cdir, out->shards);
    free(state_path);
    if (st != DW_OK) {
        memset(out, 0, sizeof *out);
        if (strcmp(cdir, dir) != 0 && st != DW_ERR_NOMEM) st = name_good(ctx, st, dir, cdir); /* via `latest` */
        free(cdir);
        return st;
    }
    *ckpt_dir_out = cdir;
    return DW_OK;
}
