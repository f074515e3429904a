/* spike.c — loss-spike detection (spike.h): the window of losses, the z-score, the pending skips
 * and their JSON in state.json. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/spike.h"

dw_status dw_spike_init(dw_ctx *ctx, dw_spike *s, double zscore, int64_t window, int64_t max_rollbacks) {
    memset(s, 0, sizeof *s);
    s->zscore = zscore;
    s->window = window;
    s->max_rollbacks = max_rollbacks;
    if (!(zscore > 0)) return DW_OK;
    if (window < 2) return dw_set_error(ctx, DW_ERR_INVALID, "--spike-window %lld: must be >= 2", (long long)window);
    s->loss = calloc((size_t)window, sizeof *s->loss);
    return s->loss ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "spike window: out of memory");
}

void dw_spike_free(dw_spike *s) {
    free(s->loss);
    free(s->skip);
    memset(s, 0, sizeof *s);
}

/* The i-th oldest loss of the window. */
static double at(const dw_spike *s, int64_t i) {
    return s->loss[(s->n < s->window ? i : s->head + i) % s->window];
}

bool dw_spike_test(const dw_spike *s, double loss, double *z) {
    *z = NAN;
    if (!(s->zscore > 0) || s->n < s->window) return false;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < s->window; i++) mean += at(s, i);
    mean /= (double)s->window;
    for (int64_t i = 0; i < s->window; i++) var += (at(s, i) - mean) * (at(s, i) - mean);
    const double sd = sqrt(var / (double)s->window), d = loss - mean;
    *z = sd > 0 ? d / sd : d == 0 ? 0.0 : copysign(INFINITY, d);
    return *z > s->zscore;
}

void dw_spike_push(dw_spike *s, double loss) {
    if (!s->loss) return;
    s->loss[s->head] = loss;
    s->head = (s->head + 1) % s->window;
    if (s->n < s->window) s->n++;
}

dw_status dw_spike_add_skip(dw_ctx *ctx, dw_spike *s, uint64_t from, uint64_t to) {
    if (s->n_skip == s->cap) {
        int cap = s->cap ? 2 * s->cap : 4;
        dw_spike_skip *grown = realloc(s->skip, (size_t)cap * sizeof *grown);
        if (!grown) return dw_set_error(ctx, DW_ERR_NOMEM, "spike skips: out of memory");
        s->skip = grown, s->cap = cap;
    }
    s->skip[s->n_skip++] = (dw_spike_skip){from, to};
    return DW_OK;
}

bool dw_spike_take_skip(dw_spike *s, uint64_t pos, uint64_t *to) {
    for (int i = 0; i < s->n_skip; i++)
        if (s->skip[i].from == pos) {
            *to = s->skip[i].to;
            s->skip[i] = s->skip[--s->n_skip];
            return true;
        }
    return false;
}

static json_t *hex64(uint64_t v) {
    char b[24];
    snprintf(b, sizeof b, "0x%016" PRIx64, v);
    return json_string(b);
}

char *dw_spike_state_json(const dw_spike *s) {
    if (!(s->zscore > 0)) return NULL;
    json_t *j = json_object(), *w = json_array(), *k = json_array();
    for (int64_t i = 0; w && i < s->n; i++) {
        char b[40];
        snprintf(b, sizeof b, "%a", at(s, i));
        json_array_append_new(w, json_string(b));
    }
    for (int i = 0; k && i < s->n_skip; i++)
        json_array_append_new(k, json_pack("[o,o]", hex64(s->skip[i].from), hex64(s->skip[i].to)));
    char *text = NULL;
    if (j && w && k) {
        json_object_set(j, "window", w);
        json_object_set(j, "skip", k);
        text = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    }
    json_decref(w);
    json_decref(k);
    json_decref(j);
    return text;
}

static dw_status parse_num(dw_ctx *ctx, const json_t *v, bool hex_int, const char *what, double *d, uint64_t *u) {
    const char *t = json_string_value(v);
    char *end = NULL;
    errno = 0;
    if (t && hex_int) *u = strtoull(t, &end, 16);
    else if (t) *d = strtod(t, &end);
    if (!t || !*t || *end || errno || (!hex_int && !isfinite(*d)) || (hex_int && strncmp(t, "0x", 2)))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: \"spike\": expected %s, got %s", what,
                            hex_int ? "a hex string \"0x...\"" : "a finite hex float string (\"0x1.8p+2\")",
                            t ? t : "a non-string");
    return DW_OK;
}

dw_status dw_spike_state_load(dw_ctx *ctx, dw_spike *s, const json_t *spike, const char *what) {
    s->n = s->head = 0;
    s->n_skip = 0;
    if (!spike || !s->loss) return DW_OK;
    const json_t *w = json_object_get(spike, "window"), *k = json_object_get(spike, "skip");
    if (!json_is_array(w) || !json_is_array(k))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: \"spike\" needs the arrays \"window\" and \"skip\"", what);
    const size_t nw = json_array_size(w), from = nw > (size_t)s->window ? nw - (size_t)s->window : 0;
    for (size_t i = from; i < nw; i++) { /* a narrower --spike-window keeps the newest */
        double d = 0;
        uint64_t u = 0;
        DW_TRY(parse_num(ctx, json_array_get(w, i), false, what, &d, &u));
        dw_spike_push(s, d);
    }
    for (size_t i = 0; i < json_array_size(k); i++) {
        const json_t *p = json_array_get(k, i);
        uint64_t a = 0, b = 0;
        double d = 0;
        if (!json_is_array(p) || json_array_size(p) != 2)
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: \"spike\".skip[%zu]: expected [from, to]", what, i);
        DW_TRY(parse_num(ctx, json_array_get(p, 0), true, what, &d, &a));
        DW_TRY(parse_num(ctx, json_array_get(p, 1), true, what, &d, &b));
        DW_TRY(dw_spike_add_skip(ctx, s, a, b));
    }
    return DW_OK;
}
