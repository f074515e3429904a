/* step_run.c — the measured training step (see step_run.h): engine creation, warm-up, timed
 * optimizer steps on the host clock (every step ends synchronised: the loss and the gradient
 * norm are read back), device memory by dw_ctx_mem_info. No printing. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "step_run.h"

int32_t *dw_step_run_tokens(int64_t n, int64_t vocab) {
    int32_t *tok = malloc((size_t)(n + 1) * sizeof *tok);
    if (!tok || vocab < 1) {
        free(tok);
        return NULL;
    }
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i <= n; i++) { /* xorshift64; targets are the next tokens */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tok[i] = (int32_t)(x % (uint64_t)vocab);
    }
    return tok;
}

void dw_step_run_result_free(dw_step_run_result *r) {
    if (!r) return;
    free(r->times);
    free(r->fwd_bwd);
    r->times = r->fwd_bwd = NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of n values (sorts a copy). */
static double median(const double *v, long n) {
    double *c = malloc((size_t)n * sizeof *c);
    if (!c) return v[n / 2];
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    double m = c[n / 2];
    free(c);
    return m;
}

/* Lowest free device memory seen so far. */
static void note_free(dw_ctx *ctx, int64_t *least) {
    int64_t f = 0, t = 0;
    if (dw_ctx_mem_info(ctx, &f, &t) == DW_OK && f < *least) *least = f;
}

dw_status dw_step_run(dw_ctx *ctx, const dw_compiled *c, const dw_step_run_opts *o, dw_step_run_result *r,
                      dw_engine **keep) {
    memset(r, 0, sizeof *r);
    if (keep) *keep = NULL;
    if (o->micro_batch < 1 || o->seq < 1 || o->grad_accum < 1 || o->steps < 1 || o->warmup < 0)
        return r->why = "micro-batch, seq, grad_accum, steps or warm-up out of range", DW_ERR_INVALID;
    int64_t free0 = 0, total = 0;
    dw_status s = dw_ctx_mem_info(ctx, &free0, &total);
    if (s != DW_OK) return s;
    r->mem_total = total;
    r->mem_context = total - free0;
    int64_t least = free0;
    const int64_t B = o->micro_batch, T = o->seq;
    int32_t *tok = NULL;
    dw_engine *e = NULL;
    r->times = malloc((size_t)o->steps * sizeof *r->times);
    r->fwd_bwd = malloc((size_t)o->steps * sizeof *r->fwd_bwd);
    if (!r->times || !r->fwd_bwd) s = DW_ERR_NOMEM, r->why = "out of host memory";
    if (s == DW_OK) s = dw_engine_create(ctx, c, NULL, &e);
    if (s == DW_OK) {
        note_free(ctx, &least);
        for (int p = 0; p < 5; p++) r->pools += dw_compiled_pool_bytes(c, p);
        s = dw_engine_init_weights(e, 1234);
    }
    if (s == DW_OK && !(tok = dw_step_run_tokens(B * T, dw_graph_vocab(dw_engine_graph(e)))))
        s = DW_ERR_NOMEM, r->why = "out of host memory";
    dw_adamw_opts ao;
    dw_adamw_opts_init(&ao, sizeof ao);
    ao.lr = 3e-4, ao.beta1 = 0.9, ao.beta2 = 0.95, ao.eps = 1e-8, ao.weight_decay = 0.1, ao.clip = 1.0;
    const double scale = 1.0 / (double)o->grad_accum;
    for (long i = 0; s == DW_OK && i < o->warmup + o->steps; i++) {
        double loss = 0, norm = 0, t0 = now_s();
        s = dw_engine_zero_grad(e);
        for (int64_t a = 0; s == DW_OK && a < o->grad_accum; a++)
            s = dw_engine_forward_backward(e, tok, tok + 1, B, T, scale, &loss);
        double t1 = now_s();
        if (s == DW_OK) s = dw_engine_step(e, &ao, i + 1, &norm);
        double t2 = now_s();
        note_free(ctx, &least);
        if (i == 0) r->loss_first = loss;
        r->loss_last = loss;
        if (i >= o->warmup) r->times[i - o->warmup] = t2 - t0, r->fwd_bwd[i - o->warmup] = t1 - t0;
    }
    free(tok);
    if (s != DW_OK) {
        const char *why = r->why;
        dw_engine_free(e);
        dw_step_run_result_free(r);
        r->why = why;
        return s;
    }
    double sum = 0;
    r->min = r->times[0];
    for (long i = 0; i < o->steps; i++) {
        sum += r->times[i];
        if (r->times[i] < r->min) r->min = r->times[i];
    }
    r->mean = sum / (double)o->steps;
    r->median = median(r->times, o->steps);
    r->fb_median = median(r->fwd_bwd, o->steps);
    r->mem_engine = free0 - least;
    if (keep) *keep = e;
    else dw_engine_free(e);
    return DW_OK;
}
