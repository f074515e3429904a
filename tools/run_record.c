/* run_record.c — reads what a run recorded in state.json (run_record.h). A `latest` file is
 * followed; every text echoed from a file goes through cli_escape. */
#define _POSIX_C_SOURCE 200809L /* strdup, mkstemp */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
    return true;
}

void run_record_free(run_record *r) {
    free(r->ckpt_dir), free(r->run_dir), free(r->data), free(r->val), free(r->schedule);
    free(r->precision), free(r->policy_json), free(r->device);
    memset(r, 0, sizeof *r);
}
