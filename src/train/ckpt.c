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

const char *const dw_ckpt_files[DW_CKPT_NFILES] = {"config.json", "model.safetensors",
                                                   "optimizer.safetensors"};

static json_t *hex64(uint64_t v) {
    char b[24];
    snprintf(b, sizeof b, "0x%016" PRIx64, v);
    return json_string(b);
}

/* state.json's document; files[i] = {size, crc32} of dw_ckpt_files[i]. */
static json_t *state_to_json(const dw_ckpt_state *s, const int64_t *sizes, const uint32_t *crcs) {
    json_t *files = json_object();
    for (int i = 0; i < DW_CKPT_NFILES; i++) {
        char crc[16];
        snprintf(crc, sizeof crc, "%08" PRIx32, crcs[i]);
        json_object_set_new(files, dw_ckpt_files[i],
                            json_pack("{s:I,s:s}", "size", (json_int_t)sizes[i], "crc32", crc));
    }
    json_t *j = json_object();
    json_object_set_new(j, "format_version", json_integer(DW_CKPT_FORMAT_VERSION));
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

static dw_status state_from_json(dw_ctx *ctx, const json_t *j, const char *what, dw_ckpt_state *s,
                                 int64_t *sizes, uint32_t *crcs) {
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
    json_t *files = NULL;
    DW_TRY(get_obj(ctx, j, "files", what, &files));
    for (int i = 0; i < DW_CKPT_NFILES; i++) {
        json_t *f = json_object_get(files, dw_ckpt_files[i]);
        if (!json_is_object(f))
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: files: no entry for %s", what, dw_ckpt_files[i]);
        DW_TRY(get_i64(ctx, f, "size", what, &sizes[i]));
        const char *crc = NULL;
        DW_TRY(dw_json_get_str(ctx, f, "crc32", what, &crc));
        char *end = NULL;
        unsigned long v = strtoul(crc, &end, 16);
        if (strlen(crc) != 8 || *end)
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: files.%s.crc32: expected 8 hex digits, got \"%s\"",
                                what, dw_ckpt_files[i], crc);
        crcs[i] = (uint32_t)v;
    }
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

dw_status dw_ckpt_save(dw_ctx *ctx, const char *run_dir, const dw_ckpt_state *state,
                       dw_ckpt_write_fn write, void *user, int keep, char **path_out) {
    if (path_out) *path_out = NULL;
    if (mkdir(run_dir, 0755) != 0 && errno != EEXIST)
        return dw_set_error(ctx, DW_ERR_IO, "%s: cannot create directory: %s", run_dir, strerror(errno));
    char name[64], tmp_name[96], old_name[96];
    snprintf(name, sizeof name, "ckpt-%lld", (long long)state->step);
    snprintf(tmp_name, sizeof tmp_name, ".tmp-%s.%ld", name, (long)getpid());
    snprintf(old_name, sizeof old_name, ".old-%s.%ld", name, (long)getpid());
    char *final = dw_path_join(run_dir, name), *tmp = dw_path_join(run_dir, tmp_name);
    char *old = dw_path_join(run_dir, old_name), *latest = dw_path_join(run_dir, "latest");
    char *state_path = tmp ? dw_path_join(tmp, "state.json") : NULL;
    dw_status st = DW_OK;
    if (!final || !tmp || !old || !latest || !state_path) st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    if (st == DW_OK) st = dw_rmtree(ctx, tmp);
    if (st == DW_OK && mkdir(tmp, 0755) != 0)
        st = dw_set_error(ctx, DW_ERR_IO, "%s: cannot create directory: %s", tmp, strerror(errno));
    if (st == DW_OK) st = write(ctx, tmp, user);
    int64_t sizes[DW_CKPT_NFILES] = {0};
    uint32_t crcs[DW_CKPT_NFILES] = {0};
    for (int i = 0; i < DW_CKPT_NFILES && st == DW_OK; i++) {
        char *p = dw_path_join(tmp, dw_ckpt_files[i]);
        st = p ? dw_fsync_path(ctx, p, false) : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
        if (st == DW_OK) st = dw_file_crc32(ctx, p, &crcs[i], &sizes[i]);
        free(p);
    }
    if (st == DW_OK) {
        json_t *j = state_to_json(state, sizes, crcs);
        /* 17 significant digits: every double in state.json reads back exactly */
        char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
        json_decref(j);
        char *digits = text ? self_crc_digits(text) : NULL;
        if (digits) { /* the CRC-32 of the text with its own digits as zeros, written over them */
            char hex[9];
            snprintf(hex, sizeof hex, "%08" PRIx32, dw_crc32(text, strlen(text)));
            memcpy(digits, hex, 8);
        }
        st = digits ? dw_write_file_atomic(ctx, state_path, text, strlen(text))
                    : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
        free(text);
    }
    if (st == DW_OK) st = dw_fsync_path(ctx, tmp, true);
    if (st == DW_OK) {
        struct stat sb;
        bool replace = stat(final, &sb) == 0;
        if (replace && rename(final, old) != 0)
            st = dw_set_error(ctx, DW_ERR_IO, "%s: cannot move aside: %s", final, strerror(errno));
        if (st == DW_OK && rename(tmp, final) != 0)
            st = dw_set_error(ctx, DW_ERR_IO, "%s: rename from %s failed: %s", final, tmp, strerror(errno));
        if (st == DW_OK) st = dw_fsync_path(ctx, run_dir, true);
        if (st == DW_OK && replace) st = dw_rmtree(ctx, old);
    }
    if (st == DW_OK) {
        char text[80];
        snprintf(text, sizeof text, "%s\n", name);
        st = dw_write_file_atomic(ctx, latest, text, strlen(text));
    }
    if (st == DW_OK) st = prune(ctx, run_dir, keep, state->step);
    if (st != DW_OK && tmp) {
        dw_ctx *quiet = NULL; /* keep the first error's message */
        (void)dw_rmtree(quiet, tmp);
    }
    if (st == DW_OK && path_out) {
        *path_out = final;
        final = NULL;
    }
    free(final);
    free(tmp);
    free(old);
    free(latest);
    free(state_path);
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
    int64_t sizes[DW_CKPT_NFILES];
    uint32_t crcs[DW_CKPT_NFILES];
    if (st == DW_OK) st = state_from_json(ctx, j, state_path, out, sizes, crcs);
    if (st == DW_OK) st = check_self_crc(ctx, state_path, j, text, n);
    json_decref(j);
    free(text);
    for (int i = 0; i < DW_CKPT_NFILES && st == DW_OK; i++) {
        char *p = dw_path_join(cdir, dw_ckpt_files[i]);
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
        if (st == DW_OK && size != sizes[i])
            st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: %lld bytes, but state.json records %lld: corrupt or truncated",
                              p, (long long)size, (long long)sizes[i]);
        if (st == DW_OK && crc != crcs[i])
            st = dw_set_error(ctx, DW_ERR_FORMAT, "%s: CRC-32 %08" PRIx32 ", but state.json records %08" PRIx32 ": corrupt",
                              p, crc, crcs[i]);
        free(p);
    }
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
