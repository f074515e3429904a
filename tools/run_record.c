/* run_record.c — reads what a run recorded in state.json and, for its sampling options, the run
 * directory's sampling.json (run_record.h). A `latest` file is followed; every text echoed from a
 * file goes through cli_escape. */
#define _POSIX_C_SOURCE 200809L /* strdup, mkstemp */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "run_record.h"

static char *join(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", a, b);
    return p;
}

static bool is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* The checkpoint name in DIR/latest ("ckpt-<step>"), or NULL with a message. */
static char *read_latest(const char *dir, char *err, size_t cap) {
    char *path = join(dir, "latest"), buf[256] = "";
    FILE *f = path ? fopen(path, "rb") : NULL;
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) buf[--n] = '\0';
    size_t digits = strspn(buf + (n > 5 ? 5 : n), "0123456789");
    char *name = NULL;
    if (!f) {
        snprintf(err, cap, "%s: cannot read: %s", path ? path : dir, strerror(errno));
    } else if (strncmp(buf, "ckpt-", 5) || n <= 5 || 5 + digits != n || strlen(buf) != n) {
        char shown[1024];
        cli_escape(buf, n, shown, sizeof shown);
        snprintf(err, cap, "%s: expected a checkpoint name like ckpt-100, got \"%s\"", path, shown);
    } else {
        name = strdup(buf);
    }
    free(path);
    return name;
}

static bool resolve(const char *run, run_record *r, char *err, size_t cap) {
    char *state = join(run, "state.json"), *latest = join(run, "latest");
    bool ok = state && latest;
    if (ok && is_file(state)) { /* a checkpoint: its run directory when that one's latest names it */
        r->ckpt_dir = strdup(run);
        char *parent = join(run, ".."), *base = strrchr(r->ckpt_dir, '/');
        char *pl = parent ? join(parent, "latest") : NULL, *name = NULL;
        if (pl && is_file(pl) && (name = read_latest(parent, err, cap)) && !strcmp(name, base ? base + 1 : run))
            r->run_dir = strdup(parent);
        free(parent), free(pl), free(name);
    } else if (ok && is_file(latest)) {
        char *name = read_latest(run, err, cap);
        r->ckpt_dir = name ? join(run, name) : NULL;
        r->run_dir = name ? strdup(run) : NULL;
        ok = name != NULL;
        free(name);
    } else if (ok) {
        snprintf(err, cap, "%s: not a checkpoint (%s: missing) or run directory (%s: missing)", run, state, latest);
        ok = false;
    }
    free(state), free(latest);
    return ok && r->ckpt_dir;
}

/* The sampling options from DIR/sampling.json beside the checkpoint (its run directory, else the
 * checkpoint's parent); absent: has_sampling stays false. */
static bool read_sampling(run_record *r, char *err, size_t cap) {
    char *parent = r->run_dir ? NULL : join(r->ckpt_dir, "..");
    char *path = join(r->run_dir ? r->run_dir : parent, "sampling.json");
    free(parent);
    if (!path || !is_file(path)) {
        free(path);
        return true;
    }
    json_error_t e;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &e), *prompt = NULL;
    json_int_t every = 0, tokens = 0;
    int bad = !j || json_unpack_ex(j, &e, 0, "{s:I, s:I, s:F, s:o}", "sample_every", &every, "sample_tokens",
                                   &tokens, "sample_temp", &r->sample_temp, "sample_prompt", &prompt);
    if (!bad && (every < 0 || tokens < 0 || !(r->sample_temp >= 0) || !(json_is_null(prompt) || json_is_string(prompt)))) {
        snprintf(e.text, sizeof e.text, "a negative count or temperature, or a prompt that is not a string or null");
        e.line = e.column = 0;
        bad = 1;
    }
    if (bad) snprintf(err, cap, "%s:%d:%d: %s", path, e.line, e.column, e.text);
    else {
        r->has_sampling = true;
        r->sample_every = every, r->sample_tokens = tokens;
        r->sample_prompt = json_is_string(prompt) ? strdup(json_string_value(prompt)) : NULL;
    }
    json_decref(j);
    free(path);
    return !bad;
}

bool run_record_write_sampling(const char *dir, int64_t every, int64_t tokens, double temp, const char *prompt,
                               char *err, size_t cap) {
    json_t *j = json_pack("{s:I, s:I, s:f, s:o}", "sample_every", (json_int_t)every, "sample_tokens",
                          (json_int_t)tokens, "sample_temp", temp, "sample_prompt",
                          prompt ? json_string(prompt) : json_null());
    char *path = join(dir, "sampling.json"), *tmp = join(dir, ".sampling.json.tmp");
    bool ok = j && path && tmp && json_dump_file(j, tmp, JSON_INDENT(2) | JSON_SORT_KEYS) == 0 &&
              rename(tmp, path) == 0;
    if (!ok) {
        snprintf(err, cap, "%s: cannot write: %s", path ? path : dir, strerror(errno));
        if (tmp) unlink(tmp);
    }
    json_decref(j);
    free(path), free(tmp);
    return ok;
}

bool run_record_read(const char *run, run_record *r, char *err, size_t cap) {
    memset(r, 0, sizeof *r);
    *err = '\0';
    if (!resolve(run, r, err, cap)) return false;
    char *path = join(r->ckpt_dir, "state.json");
    json_error_t e;
    json_t *j = path ? json_load_file(path, JSON_REJECT_DUPLICATES, &e) : NULL;
    if (!j) {
        snprintf(err, cap, "%s:%d:%d: %s", path ? path : r->ckpt_dir, e.line, e.column, e.text);
        free(path);
        run_record_free(r); /* what resolve() found */
        return false;
    }
    const char *data = NULL, *sched = NULL, *seed = NULL, *prec = NULL, *val = NULL, *dev = NULL;
    json_int_t step = 0, total = 0, warm = 0, horizon = 0, b = 0, t = 0, gb = 0;
    json_int_t ee = 0, eb = 0, ce = 0, keep = 0;
    json_t *pol = NULL, *run_obj = NULL;
    int bad = json_unpack_ex(j, &e, 0,
                             "{s:I, s:I, s:{s:s}, s:{s:s}, s:{s:s, s:F, s:F, s:I, s:I}, s:{s:F, s:F, s:F, s:F},"
                             " s:{s:I, s:I, s:I}, s:s, s?o, s?o}",
                             "step", &step, "total_steps", &total, "data", "pattern", &data, "rng", "seed", &seed,
                             "schedule", "kind", &sched, "lr", &r->lr, "min_lr", &r->min_lr, "warmup", &warm, "total",
                             &horizon, "optimizer", "beta1", &r->beta1, "beta2", &r->beta2, "weight_decay",
                             &r->weight_decay, "clip", &r->clip, "batch", "micro", &b, "seq", &t, "global", &gb,
                             "precision", &prec, "policy", &pol, "run", &run_obj);
    if (!bad && run_obj)
        bad = json_unpack_ex(run_obj, &e, 0, "{s:s, s:I, s:I, s:I, s:I, s:s}", "val", &val, "eval_every", &ee,
                             "eval_batches", &eb, "ckpt_every", &ce, "keep", &keep, "device", &dev);
    char *end = NULL;
    if (!bad) r->seed = strtoull(seed, &end, 16);
    if (bad || !end || *end) {
        snprintf(err, cap, "%s: %s", path, bad ? e.text : "rng.seed is not a hex number");
        json_decref(j);
        free(path);
        run_record_free(r);
        return false;
    }
    r->step = step, r->total_steps = total, r->warmup = warm, r->horizon = horizon;
    r->batch = b, r->seq = t, r->global_batch = gb;
    r->data = strdup(data), r->schedule = strdup(sched), r->precision = strdup(prec);
    r->policy_json = json_is_object(pol) ? json_dumps(pol, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    if ((r->has_run = run_obj != NULL)) {
        r->val = strdup(val), r->device = strdup(dev);
        r->eval_every = ee, r->eval_batches = eb, r->ckpt_every = ce, r->keep = keep;
    }
    json_decref(j);
    free(path);
    if (!read_sampling(r, err, cap)) {
        run_record_free(r);
        return false;
    }
    return true;
}

void run_record_free(run_record *r) {
    free(r->ckpt_dir), free(r->run_dir), free(r->data), free(r->val), free(r->schedule);
    free(r->precision), free(r->policy_json), free(r->device), free(r->sample_prompt);
    memset(r, 0, sizeof *r);
}
