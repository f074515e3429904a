/* metrics.c — metrics.jsonl writer (see metrics.h). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "train/ckpt.h"
#include "train/metrics.h"

dw_status dw_metrics_open(dw_ctx *ctx, const char *dir, int64_t keep_upto, FILE **out) {
    return dw_jsonl_open(ctx, dir, "metrics.jsonl", keep_upto, out);
}

dw_status dw_jsonl_open(dw_ctx *ctx, const char *dir, const char *name, int64_t keep_upto, FILE **out) {
    *out = NULL;
    char *path = dw_path_join(dir, name);
    if (!path) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    char *old = NULL;
    size_t n = 0;
    dw_status st = DW_OK;
    size_t kept = 0;
    if (keep_upto > 0 && dw_read_file(ctx, path, &old, &n) == DW_OK) {
        /* keep whole lines whose step <= keep_upto; the kept lines stay in place in `old` */
        char *p = old;
        while (p < old + n) {
            char *nl = memchr(p, '\n', (size_t)(old + n - p));
            if (!nl) break; /* a partial last line (killed mid-write) is dropped */
            json_t *j = NULL;
            long long step = -1;
            if (dw_json_load_string(ctx, p, (size_t)(nl - p), path, &j) == DW_OK)
                (void)dw_json_get_int(ctx, j, "step", path, &step);
            json_decref(j);
            if (step < 1 || step > keep_upto) break;
            size_t len = (size_t)(nl + 1 - p);
            memmove(old + kept, p, len);
            kept += len;
            p = nl + 1;
        }
        dw_clear_error(ctx);
    }
    st = dw_write_file_atomic(ctx, path, old ? old : "", kept);
    free(old);
    if (st == DW_OK) {
        *out = fopen(path, "ab");
        if (!*out) st = dw_set_error(ctx, DW_ERR_IO, "%s: cannot open for appending: %s", path, strerror(errno));
    }
    free(path);
    return st;
}

static void num(char *buf, size_t cap, double v) {
    if (isfinite(v)) snprintf(buf, cap, "%.17g", v);
    else snprintf(buf, cap, "null");
}

/* ", \"comm_s\": [...], \"exposed_comm_s\": [...]" indexed by rank (several ranks), else ""; NULL: no memory. */
static char *per_rank(const dw_train_progress *p) {
    const int n = p->ranks > 1 && p->comm_s && p->exposed_comm_s ? p->ranks : 0;
    char *s = malloc((size_t)n * 64 + 64), *at = s;
    if (!s || !n) {
        if (s) *s = 0;
        return s;
    }
    for (int k = 0; k < 2; k++) {
        const double *v = k ? p->exposed_comm_s : p->comm_s;
        at += sprintf(at, ", \"%s\": [", k ? "exposed_comm_s" : "comm_s");
        for (int r = 0; r < n; r++) {
            char x[32];
            num(x, sizeof x, v[r]);
            at += sprintf(at, "%s%s", r ? ", " : "", x);
        }
        at += sprintf(at, "]");
    }
    return s;
}

dw_status dw_metrics_write(dw_ctx *ctx, FILE *f, const dw_train_progress *p, int64_t tokens_seen) {
    char loss[32], lr[32], gn[32], tps[32], el[32], vl[32], moe[400] = "", skip[64] = "";
    num(loss, sizeof loss, p->loss);
    num(lr, sizeof lr, p->lr);
    num(gn, sizeof gn, p->grad_norm);
    num(tps, sizeof tps, p->tokens_per_s);
    num(el, sizeof el, p->elapsed_s);
    num(vl, sizeof vl, p->val_loss);
    if (!isnan(p->expert_load)) { /* a mixture of experts with router losses */
        char al[32], zl[32];
        num(al, sizeof al, p->moe_aux_loss);
        num(zl, sizeof zl, p->moe_z_loss);
        snprintf(moe, sizeof moe, ", \"moe_aux_loss\": %s, \"moe_z_loss\": %s, \"expert_load\": %.17g", al, zl,
                 p->expert_load);
    }
    if (!isnan(p->moe_dropped)) { /* a mixture of experts: the assignments dropped past capacity */
        const size_t k = strlen(moe);
        snprintf(moe + k, sizeof moe - k, ", \"moe_dropped\": %.17g, \"moe_dropped_frac\": %.17g", p->moe_dropped,
                 p->moe_dropped_frac);
    }
    if (!isnan(p->moe_bias_max)) { /* the routers' selection bias (train/moe_bias.h) */
        const size_t k = strlen(moe);
        snprintf(moe + k, sizeof moe - k, ", \"moe_bias_max\": %.17g", p->moe_bias_max);
    }
    if (p->quant_overflow >= 0) { /* the quantisers' counters (train/guard.h) */
        const size_t k = strlen(moe);
        snprintf(moe + k, sizeof moe - k, ", \"quant_overflow\": %lld, \"quant_underflow\": %lld",
                 (long long)p->quant_overflow, (long long)p->quant_underflow);
    }
    if (p->skipped) snprintf(skip, sizeof skip, ", \"skipped\": \"%s\"", p->skipped); /* a fixed word pair */
    char *pc = NULL; /* layers switched to BF16 after this step, as a JSON string */
    if (p->precision_change) {
        json_t *j = json_string(p->precision_change);
        pc = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
        json_decref(j);
        if (!pc) return dw_set_error(ctx, DW_ERR_NOMEM, "metrics.jsonl: out of memory");
    }
    char *comm = per_rank(p); /* several ranks: each one's communication seconds */
    int rc = comm ? fprintf(f,
                     "{\"step\": %lld, \"loss\": %s, \"lr\": %s, \"grad_norm\": %s, \"tokens_per_s\": %s, "
                     "\"elapsed_s\": %s, \"tokens\": %lld%s%s%s%s%s%s%s}\n",
                     (long long)p->step, loss, lr, gn, tps, el, (long long)tokens_seen,
                     isnan(p->val_loss) ? "" : ", \"val_loss\": ", isnan(p->val_loss) ? "" : vl, moe, skip,
                     pc ? ", \"precision_change\": " : "", pc ? pc : "", comm) : -1;
    free(pc);
    free(comm);
    if (rc < 0 || fflush(f) != 0) return dw_set_error(ctx, DW_ERR_IO, "metrics.jsonl: write failed: %s", strerror(errno));
    return DW_OK;
}
