/* sample.c — generation (temperature, top-k) on any engine and the byte / id tokenizers (see
 * sample.h; dw_engine_generate, dw_tokenize and dw_detokenize are public in deepwell.h; a
 * tokenizer.json goes to io/tokenizer.h). Where the
 * engine can (runtime/kv_cache.h: the CPU engine, FP32 or BF16, MoE without drops) generation
 * decodes with a K/V cache;
 * elsewhere, or with DW_KV_CACHE=0, each token recomputes the forward over the last T tokens.
 * An engine whose weights are ZeRO-3 shards (train/dp_zero3.c) recomputes too: each forward
 * gathers every parameter into its gather slot as it reaches it, as a training forward does, so
 * the weights are never whole; every rank of the job generates with it (the gathers are
 * broadcasts), and the cache, which reads the masters in place, is left out.
 * dw_engine_generate_timed times the prefill (up to the first token) and the decode apart: each
 * step ends with its logits on the host, so wall-clock time is the device's too. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/env.h"
#include "core/error.h"
#include "core/sized.h"
#include "core/log.h"
#include "io/tokenizer.h"
#include "runtime/engine.h"
#include "runtime/exec.h"
#include "runtime/kv_cache.h"
#include "train/sample.h"

int32_t dw_sample_logits(const float *logits, int64_t V, const dw_sample_opts *o, dw_rng *rng,
                         double *work) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (o->temperature <= 0.0) return (int32_t)best;
    /* top-k: the k-th largest logit is the threshold (ties at it are kept) */
    double thresh = -INFINITY;
    if (o->top_k > 0 && o->top_k < V) {
        for (int64_t i = 0; i < V; i++) work[i] = logits[i];
        for (int k = 0; k < o->top_k; k++) { /* k partial selection passes: k is small */
            int64_t m = -1;
            for (int64_t i = 0; i < V; i++)
                if (work[i] != -INFINITY && (m < 0 || work[i] > work[m])) m = i;
            thresh = work[m];
            work[m] = -INFINITY;
        }
    }
    double mx = logits[best], sum = 0.0;
    for (int64_t i = 0; i < V; i++) {
        work[i] = logits[i] >= thresh ? exp(((double)logits[i] - mx) / o->temperature) : 0.0;
        sum += work[i];
    }
    double u = dw_rng_uniform(rng) * sum, c = 0.0;
    for (int64_t i = 0; i < V; i++) {
        c += work[i];
        if (u < c) return (int32_t)i;
    }
    return (int32_t)best; /* rounding at the very end of the CDF */
}

/* The next token by the full recompute: the forward over the last T tokens of tokens[0, len). */
static dw_status recompute(dw_engine *e, const int32_t *tokens, int64_t len, float *logits, float **last) {
    const int64_t T = e->g->seq, L = len < T ? len : T;
    *last = logits + (L - 1) * e->g->model.vocab;
    return dw_engine_forward(e, tokens + len - L, NULL, 1, L, logits, NULL);
}

/* ZeRO-3 sharded weights: each parameter gathered into its slot by the forward that reads it. */
static bool gathered_on_use(const dw_engine *e) { return e->x->param_at != NULL; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

dw_status dw_engine_generate(dw_engine *e, int32_t *tokens, int64_t np, int64_t n, double temperature, int top_k,
                             uint64_t *rng_state) {
    return dw_engine_generate_timed(e, tokens, np, n, temperature, top_k, rng_state, NULL);
}

dw_status dw_engine_generate_timed(dw_engine *e, int32_t *tokens, int64_t np, int64_t n, double temperature,
                                   int top_k, uint64_t *rng_state, dw_generate_stats *stats) {
    dw_ctx *ctx = e->ctx;
    if (stats && stats->size == 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "generation: stats->size is 0 (set it to sizeof the struct)");
    dw_sized_clear(stats);
    dw_generate_stats own = {.size = sizeof own, .prefill_tokens = np}, *ts = &own;
    if (np < 1) return dw_set_error(ctx, DW_ERR_INVALID, "generation needs a prompt of at least one token");
    if (n < 0 || top_k < 0) return dw_set_error(ctx, DW_ERR_INVALID, "generation: %lld tokens, top-k %d", (long long)n, top_k);
    const int64_t V = e->g->model.vocab, T = e->g->seq;
    const dw_sample_opts so = {.temperature = temperature, .top_k = top_k}, *o = &so;
    dw_rng r = {*rng_state}, *rng = &r;
    /* the cache serves while the window starts at position 0 (len <= T): past it every token is a
     * recompute over the last T, as without a cache, so the tokens are the same either way */
    dw_kv_cache *kv = NULL;
    const bool gathered = gathered_on_use(e);
    const bool cached = n > 0 && np <= T && !gathered && dw_env_flag("DW_KV_CACHE", true) && dw_kv_cache_supported(e);
    float *logits = malloc((size_t)(T * V) * sizeof(float));
    double *work = malloc((size_t)V * sizeof(double));
    dw_status st = (logits && work) ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    if (st == DW_OK && cached) st = dw_kv_cache_create(e, &kv);
    DW_LOGD("generate: %lld tokens after %lld, %s", (long long)n, (long long)np,
            kv ? "KV cache up to the program's seq"
            : gathered ? "full recompute per token, the ZeRO-3 shard's parameters gathered as each forward reaches them"
                       : "full recompute per token");
    ts->cached = kv != NULL;
    for (int64_t i = 0; i < n && st == DW_OK; i++) {
        const int64_t len = np + i;
        const double t0 = now_s();
        float *last = logits;
        if (kv && i == 0) st = dw_kv_cache_prefill(kv, tokens, np, logits);
        else if (kv && len <= T) st = dw_kv_cache_step(kv, tokens[len - 1], logits);
        else st = recompute(e, tokens, len, logits, &last);
        if (st == DW_OK) tokens[len] = dw_sample_logits(last, V, o, rng, work);
        if (i == 0) ts->prefill_s = now_s() - t0;
        else ts->decode_s += now_s() - t0, ts->decode_tokens += st == DW_OK;
    }
    dw_kv_cache_free(kv);
    free(logits);
    free(work);
    *rng_state = r.s;
    if (stats) dw_sized_write(stats, ts, sizeof *ts);
    return st;
}

const char *dw_tokenizer_name(dw_tokenizer t) { return t == DW_TOK_BYTES ? "bytes" : "ids"; }

bool dw_tokenizer_parse(const char *name, dw_tokenizer *out) {
    if (!strcmp(name, "bytes")) *out = DW_TOK_BYTES;
    else if (!strcmp(name, "ids")) *out = DW_TOK_IDS;
    else return false;
    return true;
}

/* dw_tokenize through a tokenizer.json: its ids, each checked against the model's vocabulary. */
static dw_status tokenize_hf(dw_ctx *ctx, const char *path, const char *text, int64_t vocab, int32_t **ids_out,
                             int64_t *n_out) {
    dw_hf_tokenizer *t = NULL;
    DW_TRY(dw_hf_tokenizer_open(ctx, path, &t));
    dw_status st = dw_hf_tokenizer_encode(ctx, t, text, ids_out, n_out);
    for (int64_t i = 0; st == DW_OK && i < *n_out; i++)
        if ((*ids_out)[i] >= vocab)
            st = dw_set_error(ctx, DW_ERR_INVALID, "tokenizer %s: the prompt's token %d ('%.40s') is outside the "
                              "model's vocab_size %lld", dw_hf_tokenizer_path(t), (*ids_out)[i],
                              dw_hf_tokenizer_token(t, (*ids_out)[i]), (long long)vocab);
    if (st != DW_OK) free(*ids_out), *ids_out = NULL, *n_out = 0;
    dw_hf_tokenizer_free(t);
    return st;
}

dw_status dw_tokenize(dw_ctx *ctx, const char *tokenizer, const char *text, int64_t vocab, int32_t **ids_out,
                      int64_t *n_out) {
    *ids_out = NULL;
    *n_out = 0;
    dw_tokenizer t;
    if (!tokenizer || !*tokenizer) return dw_set_error(ctx, DW_ERR_INVALID, "no tokenizer given (bytes, ids or a tokenizer.json)");
    if (!dw_tokenizer_parse(tokenizer, &t) && access(tokenizer, F_OK) != 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "unknown tokenizer '%s' (bytes, ids, or a tokenizer.json or a "
                            "directory holding one)", tokenizer);
    if (!dw_tokenizer_parse(tokenizer, &t)) return tokenize_hf(ctx, tokenizer, text, vocab, ids_out, n_out);
    size_t len = strlen(text);
    int32_t *ids = malloc((len + 1) * sizeof *ids);
    if (!ids) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    int64_t n = 0;
    if (t == DW_TOK_BYTES) {
        for (size_t i = 0; i < len; i++) ids[n++] = (unsigned char)text[i];
    } else {
        const char *p = text;
        while (*p) {
            while (*p == ' ' || *p == '\n' || *p == '\t' || *p == ',') p++;
            if (!*p) break;
            char *end = NULL;
            errno = 0;
            long long v = strtoll(p, &end, 10);
            if (end == p || errno || v < 0 || v >= vocab) {
                free(ids);
                return dw_set_error(ctx, DW_ERR_INVALID,
                                    "token ids: '%.20s' is not an integer in [0, %lld)", p, (long long)vocab);
            }
            ids[n++] = (int32_t)v;
            p = end;
        }
    }
    for (int64_t i = 0; t == DW_TOK_BYTES && i < n; i++)
        if (ids[i] >= vocab) {
            int32_t bad = ids[i];
            free(ids);
            return dw_set_error(ctx, DW_ERR_INVALID, "prompt byte %d is outside the model's vocab_size %lld",
                                bad, (long long)vocab);
        }
    *ids_out = ids;
    *n_out = n;
    return DW_OK;
}

/* dw_detokenize through a tokenizer.json (special tokens kept); NULL with dw_errmsg(NULL) set. */
static char *detokenize_hf(const char *path, const int32_t *ids, int64_t n) {
    dw_hf_tokenizer *t = NULL;
    char *text = NULL;
    if (dw_hf_tokenizer_open(NULL, path, &t) == DW_OK) dw_hf_tokenizer_decode(NULL, t, ids, n, false, &text, NULL);
    dw_hf_tokenizer_free(t);
    return text;
}

char *dw_detokenize(const char *tokenizer, const int32_t *ids, int64_t n) {
    dw_tokenizer t;
    if (!tokenizer || !*tokenizer) return NULL;
    if (!dw_tokenizer_parse(tokenizer, &t)) return detokenize_hf(tokenizer, ids, n);
    size_t cap = (size_t)n * 13 + 1, len = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    for (int64_t i = 0; i < n; i++) {
        if (t == DW_TOK_BYTES && ids[i] >= 0 && ids[i] < 256)
            s[len++] = (char)ids[i];
        else if (t == DW_TOK_BYTES)
            len += (size_t)snprintf(s + len, cap - len, "<%d>", ids[i]);
        else
            len += (size_t)snprintf(s + len, cap - len, "%s%d", i ? " " : "", ids[i]);
    }
    s[len] = '\0';
    return s;
}
