/* cmd_report.c — `deepwell report RUN [--out FILE]`: one self-contained HTML page (inline CSS and
 * SVG, no scripts, fonts or network) for a training run directory: a summary table and plots of
 * what RUN/metrics.jsonl records (docs/training.md "Run reports"). Reads files the trainer wrote;
 * the plots are report_svg.c's. Not a live dashboard: the page is written once, atomically. */
#define _POSIX_C_SOURCE 200809L /* getline, open_memstream, mkstemp, fsync */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "report_svg.h"
#include "run_record.h"

static void help(void) {
    printf("Usage: deepwell report RUN [--out FILE]\n\n"
           "Writes one self-contained HTML page (inline CSS and SVG: no scripts, fonts or network) for\n"
           "the training run directory RUN (what `deepwell train --out RUN` wrote):\n"
           "  a summary   steps, last and best loss and validation loss, learning rate, gradient norm,\n"
           "              tokens/s, tokens seen, elapsed time; model and precision from the newest\n"
           "              checkpoint when RUN has one\n"
           "  plots       loss and validation loss, learning rate, gradient norm and tokens/s against\n"
           "              step; for a mixture of experts also the load-balancing loss (moe_aux_loss),\n"
           "              the router z-loss (moe_z_loss) and the expert load (max/mean tokens per\n"
           "              expert). A plot whose key RUN/metrics.jsonl never records (or only as\n"
           "              null) is left out; null points are skipped.\n\n"
           "  --out FILE   where to write the page (default RUN/report.html); written to a temporary\n"
           "               name and renamed, so an existing FILE is replaced whole or not at all\n"
           "  -h, --help   this help\n\n"
           "Exit status: 0 written; 2 bad arguments or a malformed metrics.jsonl line (named by file\n"
           "and line); 3 RUN or its metrics.jsonl missing or unreadable, or FILE not writable.\n");
}

/* The numeric keys of a metrics.jsonl line (docs/training.md); NAN where absent or null. */
#define METRIC_KEYS(X)                                                                                                 \
    X(loss) X(val_loss) X(lr) X(grad_norm) X(tokens_per_s) X(elapsed_s) X(tokens) X(moe_aux_loss) X(moe_z_loss)         \
        X(expert_load)
enum {
#define X(k) M_##k,
    METRIC_KEYS(X)
#undef X
        M_COUNT
};
static const char *const metric_names[M_COUNT] = {
#define X(k) #k,
    METRIC_KEYS(X)
#undef X
};

typedef struct {
    size_t n, cap;
    double *step;        /* (n,) */
    double *v[M_COUNT];  /* (n,) each, NAN where a line lacks the key or records null */
    size_t seen[M_COUNT]; /* lines with a finite value of each key */
} metrics;

static void metrics_free(metrics *m) {
    free(m->step);
    for (int k = 0; k < M_COUNT; k++) free(m->v[k]);
}

static bool metrics_grow(metrics *m) {
    if (m->n < m->cap) return true;
    size_t cap = m->cap ? 2 * m->cap : 256;
    double *p = realloc(m->step, cap * sizeof *p);
    if (!p) return false;
    m->step = p;
    for (int k = 0; k < M_COUNT; k++) {
        if (!(p = realloc(m->v[k], cap * sizeof *p))) return false;
        m->v[k] = p;
    }
    m->cap = cap;
    return true;
}

/* One line into m; on a malformed line writes what is wrong into why. */
static bool parse_line(const char *line, metrics *m, char *why, size_t cap) {
    json_error_t e;
    json_t *j = json_loads(line, JSON_REJECT_DUPLICATES, &e);
    bool ok = false;
    if (!j) {
        snprintf(why, cap, "column %d: %s", e.column, e.text);
    } else if (!json_is_object(j)) {
        snprintf(why, cap, "expected a JSON object");
    } else if (!json_is_integer(json_object_get(j, "step")) || json_integer_value(json_object_get(j, "step")) < 0) {
        snprintf(why, cap, "\"step\": expected a non-negative integer");
    } else if (!metrics_grow(m)) {
        snprintf(why, cap, "out of memory");
    } else {
        ok = true;
        m->step[m->n] = (double)json_integer_value(json_object_get(j, "step"));
        for (int k = 0; k < M_COUNT && ok; k++) {
            json_t *x = json_object_get(j, metric_names[k]);
            m->v[k][m->n] = json_is_number(x) ? json_number_value(x) : NAN;
            if (x && !json_is_number(x) && !json_is_null(x)) {
                snprintf(why, cap, "\"%s\": expected a number or null", metric_names[k]);
                ok = false;
            }
            m->seen[k] += isfinite(m->v[k][m->n]);
        }
        m->n += ok;
    }
    json_decref(j);
    return ok;
}

/* Reads RUN/metrics.jsonl; on failure prints why and returns the exit status (else DW_EXIT_OK). */
static int read_metrics(const char *path, metrics *m) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        cli_error("report", "%s: cannot read: %s", path, strerror(errno));
        return DW_EXIT_IO;
    }
    if (!S_ISREG(sb.st_mode)) { /* a FIFO would block */
        cli_error("report", "%s: not a regular file", path);
        return DW_EXIT_USAGE;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        cli_error("report", "%s: cannot open: %s", path, strerror(errno));
        return DW_EXIT_IO;
    }
    char *line = NULL, why[256];
    size_t cap = 0;
    ssize_t len;
    int rc = DW_EXIT_OK;
    for (long no = 1; rc == DW_EXIT_OK && (len = getline(&line, &cap, f)) != -1; no++) {
        if (strspn(line, " \t\r\n") == (size_t)len) continue; /* a blank line */
        if (strlen(line) != (size_t)len) {
            cli_error("report", "%s:%ld: malformed line: a NUL byte", path, no);
            rc = DW_EXIT_USAGE;
        } else if (!parse_line(line, m, why, sizeof why)) {
            if (line[len - 1] != '\n' && feof(f)) { /* the trainer is writing it now, or was killed mid-line */
                fprintf(stderr, "deepwell report: %s:%ld: ignoring an unfinished last line\n", path, no);
                break;
            }
            char shown[96];
            cli_escape(line, (size_t)len - (line[len - 1] == '\n'), shown, sizeof shown);
            cli_error("report", "%s:%ld: malformed line (%s): %s", path, no, why, shown);
            rc = DW_EXIT_USAGE;
        }
    }
    if (rc == DW_EXIT_OK && ferror(f)) {
        cli_error("report", "%s: read error: %s", path, strerror(errno));
        rc = DW_EXIT_IO;
    }
    if (rc == DW_EXIT_OK && m->n == 0) {
        cli_error("report", "%s: no metrics lines yet", path);
        rc = DW_EXIT_USAGE;
    }
    free(line);
    fclose(f);
    return rc;
}

/* Text from a file or the command line, escaped for HTML. */
static void html_text(FILE *out, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '&': fputs("&amp;", out); break;
        case '"': fputs("&quot;", out); break;
        default: fputc(*s, out);
        }
    }
}

/* Index of the last line with a finite value of key k, or of its smallest value; -1 if none. */
static long last_of(const metrics *m, int k) {
    for (size_t i = m->n; i-- > 0;)
        if (isfinite(m->v[k][i])) return (long)i;
    return -1;
}
static long best_of(const metrics *m, int k) {
    long b = -1;
    for (size_t i = 0; i < m->n; i++)
        if (isfinite(m->v[k][i]) && (b < 0 || m->v[k][i] < m->v[k][b])) b = (long)i;
    return b;
}

/* A summary row: data-key and data-value carry the exact number for tools (and the tests). */
static void row(FILE *out, const char *key, const char *label, double v, const char *fmt, const char *note) {
    fprintf(out, "<tr data-key=\"%s\" data-value=\"%.17g\"><th>%s</th><td>", key, v, label);
    fprintf(out, fmt, v);
    fprintf(out, "%s</td></tr>\n", note ? note : "");
}

static void metric_rows(FILE *out, const metrics *m, int k, const char *label, const char *fmt, bool best) {
    long i = last_of(m, k);
    if (i < 0) return;
    char note[64];
    snprintf(note, sizeof note, " <span class=\"at\">(step %.0f)</span>", m->step[i]);
    row(out, metric_names[k], label, m->v[k][i], fmt, (size_t)i + 1 == m->n ? NULL : note);
    long b = best ? best_of(m, k) : -1;
    if (b < 0) return;
    char key[32], lab[48];
    snprintf(key, sizeof key, "best_%s", metric_names[k]);
    snprintf(lab, sizeof lab, "best %s", label);
    snprintf(note, sizeof note, " <span class=\"at\">(step %.0f)</span>", m->step[b]);
    row(out, key, lab, m->v[k][b], fmt, note);
}

/* model_type from the checkpoint's config.json, NULL when it has none. Caller frees. */
static char *model_type(const char *ckpt_dir) {
    size_t n = strlen(ckpt_dir) + sizeof "/config.json";
    char *path = malloc(n), *s = NULL;
    if (!path) return NULL;
    snprintf(path, n, "%s/config.json", ckpt_dir);
    json_t *j = json_load_file(path, 0, NULL);
    const char *t = json_string_value(json_object_get(j, "model_type"));
    if (t) s = strdup(t);
    json_decref(j);
    free(path);
    return s;
}

static void write_page(FILE *out, const char *run, const metrics *m) {
    static const char css[] =
        "body{font:14px/1.4 sans-serif;margin:24px;color:#222;background:#fff}"
        "h1{font-size:20px;margin:0 0 12px}"
        "table.summary{border-collapse:collapse;margin-bottom:20px}"
        "table.summary th,table.summary td{border:1px solid #ccc;padding:3px 10px;text-align:left}"
        "table.summary th{background:#f4f4f4;font-weight:normal}"
        "td{font-family:monospace}.at{color:#777}"
        ".plots{display:flex;flex-wrap:wrap;gap:12px}"
        "svg{border:1px solid #ddd;background:#fff}"
        "svg .frame{fill:none;stroke:#999}svg .grid{stroke:#eee}"
        "svg text{font:11px sans-serif;fill:#444}svg .title{font-size:13px;font-weight:bold;fill:#222}"
        "svg .tx{text-anchor:middle}svg .ty{text-anchor:end}"
        "svg polyline{stroke-width:1.5;stroke-linejoin:round}"
        "p.foot{color:#777;font-size:12px}";
    fprintf(out, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>deepwell report: ");
    html_text(out, run);
    fprintf(out, "</title>\n<style>%s</style>\n</head>\n<body>\n<h1>Training run ", css);
    html_text(out, run);
    fprintf(out, "</h1>\n<table class=\"summary\">\n");
    size_t z = m->n - 1;
    row(out, "step", "steps", m->step[z], "%.0f", NULL);
    metric_rows(out, m, M_loss, "loss", "%.6g", true);
    metric_rows(out, m, M_val_loss, "val loss", "%.6g", true);
    metric_rows(out, m, M_lr, "learning rate", "%.4g", false);
    metric_rows(out, m, M_grad_norm, "grad norm", "%.4g", false);
    metric_rows(out, m, M_tokens_per_s, "tokens/s", "%.0f", false);
    metric_rows(out, m, M_tokens, "tokens seen", "%.0f", false);
    long e = last_of(m, M_elapsed_s);
    if (e >= 0) {
        double s = m->v[M_elapsed_s][e];
        fprintf(out, "<tr data-key=\"elapsed_s\" data-value=\"%.17g\"><th>elapsed</th><td>%.1f s", s, s);
        if (s >= 60) fprintf(out, " (%dh %02dm %02ds)", (int)(s / 3600), (int)fmod(s / 60, 60), (int)fmod(s, 60));
        fprintf(out, "</td></tr>\n");
    }
    metric_rows(out, m, M_moe_aux_loss, "load-balancing loss", "%.6g", false);
    metric_rows(out, m, M_moe_z_loss, "router z-loss", "%.6g", false);
    metric_rows(out, m, M_expert_load, "expert load (max/mean)", "%.4g", false);
    run_record r;
    char err[512];
    if (run_record_read(run, &r, err, sizeof err)) { /* a run with a checkpoint: what it records */
        char *mt = model_type(r.ckpt_dir);
        if (mt) {
            fprintf(out, "<tr data-key=\"model\"><th>model</th><td>");
            html_text(out, mt);
            fprintf(out, "</td></tr>\n");
        }
        fprintf(out, "<tr data-key=\"precision\"><th>precision</th><td>");
        html_text(out, r.precision);
        fprintf(out, "</td></tr>\n<tr data-key=\"checkpoint\"><th>newest checkpoint</th><td>");
        html_text(out, r.ckpt_dir);
        fprintf(out, "</td></tr>\n");
        free(mt);
        run_record_free(&r);
    }
    fprintf(out, "</table>\n<div class=\"plots\">\n");
    struct plot {
        const char *id, *title;
        int keys[2];
        const char *labels[2], *colors[2];
    } plots[] = {
        {"loss", "loss", {M_loss, M_val_loss}, {"train", "validation"}, {"#1f77b4", "#d62728"}},
        {"lr", "learning rate", {M_lr, -1}, {"lr"}, {"#2ca02c"}},
        {"grad_norm", "gradient norm", {M_grad_norm, -1}, {"grad norm"}, {"#9467bd"}},
        {"tokens_per_s", "tokens/s", {M_tokens_per_s, -1}, {"tokens/s"}, {"#8c564b"}},
        {"moe_aux_loss", "load-balancing loss", {M_moe_aux_loss, -1}, {"aux loss"}, {"#e377c2"}},
        {"moe_z_loss", "router z-loss", {M_moe_z_loss, -1}, {"z-loss"}, {"#7f7f7f"}},
        {"expert_load", "expert load (max/mean)", {M_expert_load, -1}, {"max/mean"}, {"#bcbd22"}},
    };
    for (size_t p = 0; p < sizeof plots / sizeof plots[0]; p++) {
        svg_series s[2];
        int ns = 0;
        for (int k = 0; k < 2 && plots[p].keys[k] >= 0; k++)
            s[ns++] = (svg_series){.key = metric_names[plots[p].keys[k]], .label = plots[p].labels[k],
                                   .color = plots[p].colors[k], .x = m->step, .y = m->v[plots[p].keys[k]],
                                   .n = m->n};
        svg_plot(out, plots[p].id, plots[p].title, s, ns, 560, 300);
    }
    fprintf(out, "</div>\n<p class=\"foot\">deepwell %s report of ", dw_version_string());
    html_text(out, run);
    fprintf(out, "/metrics.jsonl: %zu lines, steps %.0f to %.0f.</p>\n</body>\n</html>\n", m->n, m->step[0],
            m->step[z]);
}

/* Writes data to path through a temporary beside it, fsync and rename; an existing path that is
 * not a regular file (a device such as /dev/full) is refused rather than replaced. */
static int write_atomic(const char *path, const char *data, size_t size) {
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        cli_error("report", "%s: cannot write: not a regular file", path);
        return DW_EXIT_IO;
    }
    size_t n = strlen(path) + sizeof ".tmp.XXXXXX";
    char *tmp = malloc(n);
    if (!tmp) return DW_EXIT_FAIL;
    snprintf(tmp, n, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp), rc = DW_EXIT_OK;
    if (fd < 0) {
        cli_error("report", "%s: cannot write: %s", path, strerror(errno));
        free(tmp);
        return DW_EXIT_IO;
    }
    mode_t mask = umask(0);
    umask(mask);
    bool ok = fchmod(fd, 0666 & ~mask) == 0;
    for (size_t done = 0; ok && done < size;) {
        ssize_t w = write(fd, data + done, size - done);
        if (w < 0 && errno == EINTR) continue;
        ok = w > 0;
        done += ok ? (size_t)w : 0;
    }
    ok = ok && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    ok = ok && rename(tmp, path) == 0;
    if (!ok) {
        cli_error("report", "%s: cannot write: %s", path, strerror(errno ? errno : EIO));
        unlink(tmp);
        rc = DW_EXIT_IO;
    } else { /* make the rename durable; a failure here leaves a complete file */
        char *slash = strrchr(path, '/');
        char dir[4096];
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path + 1) : 1, slash ? path : ".");
        int dfd = open(dir, O_RDONLY);
        if (dfd >= 0) fsync(dfd), close(dfd);
    }
    free(tmp);
    return rc;
}

int cmd_report(int argc, char **argv) {
    static const struct option opts[] = {
        {"out", required_argument, 0, 'o'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *out_path = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'o': out_path = optarg; break;
        case 'h': help(); return DW_EXIT_OK;
        default: return cli_usage_error("report");
        }
    }
    if (argc - optind != 1) {
        cli_error("report", "expected one run directory RUN, got %d argument(s)", argc - optind);
        return cli_usage_error("report");
    }
    const char *run = argv[optind];
    struct stat sb;
    if (stat(run, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        cli_error("report", "%s: not a run directory: %s", run, stat(run, &sb) ? strerror(errno) : "not a directory");
        return DW_EXIT_IO;
    }
    size_t n = strlen(run) + sizeof "/metrics.jsonl";
    char *mpath = malloc(n), *dpath = malloc(n + sizeof "/report.html");
    if (!mpath || !dpath) return free(mpath), free(dpath), DW_EXIT_FAIL;
    snprintf(mpath, n, "%s/metrics.jsonl", run);
    snprintf(dpath, n + sizeof "/report.html", "%s/report.html", run);
    metrics m = {0};
    int rc = read_metrics(mpath, &m);
    char *page = NULL;
    size_t size = 0;
    FILE *mem = rc == DW_EXIT_OK ? open_memstream(&page, &size) : NULL;
    if (rc == DW_EXIT_OK && !mem) rc = DW_EXIT_FAIL;
    if (mem) {
        write_page(mem, run, &m);
        rc = fclose(mem) == 0 ? write_atomic(out_path ? out_path : dpath, page, size) : DW_EXIT_FAIL;
    }
    if (rc == DW_EXIT_OK) fprintf(stderr, "deepwell report: wrote %s\n", out_path ? out_path : dpath);
    free(page);
    metrics_free(&m);
    free(mpath), free(dpath);
    return rc;
}
