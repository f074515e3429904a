/* comm.c — the checked entry points of the communicator (comm.h; started collectives too), the host
 * reductions the CPU backends share, and the "self" backend of a one-rank job (every collective the identity). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "core/error.h"

int dw_comm_type_size(dw_comm_type t) {
    static const int size[DW_COMM_TYPE_COUNT] = {4, 8, 8, 1};
    DW_ASSERT((unsigned)t < DW_COMM_TYPE_COUNT);
    return size[t];
}

void dw_comm_reduce_host(void *dst, const void *src, int64_t n, dw_comm_type t) {
    switch (t) {
    case DW_COMM_F32: {
        float *d = dst;
        const float *s = src;
        for (int64_t i = 0; i < n; i++) d[i] += s[i];
        break;
    }
    case DW_COMM_F64: {
        double *d = dst;
        const double *s = src;
        for (int64_t i = 0; i < n; i++) d[i] += s[i];
        break;
    }
    case DW_COMM_I64: {
        int64_t *d = dst;
        const int64_t *s = src;
        for (int64_t i = 0; i < n; i++) d[i] += s[i];
        break;
    }
    default: { /* bytes add modulo 256 */
        unsigned char *d = dst;
        const unsigned char *s = src;
        for (int64_t i = 0; i < n; i++) d[i] = (unsigned char)(d[i] + s[i]);
    }
    }
}

void dw_comm_divide_host(void *buf, int64_t n, dw_comm_type t, int divide_by) {
    DW_ASSERT(t == DW_COMM_F32 || t == DW_COMM_F64);
    if (t == DW_COMM_F32) {
        float *b = buf;
        for (int64_t i = 0; i < n; i++) b[i] /= (float)divide_by;
    } else {
        double *b = buf;
        for (int64_t i = 0; i < n; i++) b[i] /= (double)divide_by;
    }
}

/* One host rank: every collective is the identity, done here. A device communicator of one rank
 * (NCCL on one GPU) still runs its library, which keeps that path testable on one GPU. */
static bool solo(const dw_comm *c) { return c->world == 1 && !c->i->device_memory; }

static dw_status check(dw_ctx *ctx, const dw_comm *c, const char *what, int64_t n, dw_comm_type t, dw_comm_op op) {
    if (n < 0 || (unsigned)t >= DW_COMM_TYPE_COUNT || (op != DW_COMM_SUM && op != DW_COMM_AVG))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s %s: count %lld, type %d, op %d", c->i->name, what, (long long)n,
                            (int)t, (int)op);
    if (op == DW_COMM_AVG && t != DW_COMM_F32 && t != DW_COMM_F64)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s %s: an average needs a floating type", c->i->name, what);
    return DW_OK;
}

dw_status dw_comm_all_reduce(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n, dw_comm_type t, dw_comm_op op) {
    DW_TRY(check(ctx, c, "all-reduce", n, t, op));
    return solo(c) || n == 0 ? DW_OK : c->i->all_reduce(ctx, c, buf, n, t, op);
}

dw_status dw_comm_reduce_scatter(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n_each, dw_comm_type t, dw_comm_op op) {
    DW_TRY(check(ctx, c, "reduce-scatter", n_each, t, op));
    return solo(c) || n_each == 0 ? DW_OK : c->i->reduce_scatter(ctx, c, buf, n_each, t, op);
}

dw_status dw_comm_all_gather(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n_each, dw_comm_type t) {
    DW_TRY(check(ctx, c, "all-gather", n_each, t, DW_COMM_SUM));
    return solo(c) || n_each == 0 ? DW_OK : c->i->all_gather(ctx, c, buf, n_each, t);
}

dw_status dw_comm_broadcast(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n, dw_comm_type t, int root) {
    DW_TRY(check(ctx, c, "broadcast", n, t, DW_COMM_SUM));
    if (root < 0 || root >= c->world)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s broadcast: root %d of %d ranks", c->i->name, root, c->world);
    return solo(c) || n == 0 ? DW_OK : c->i->broadcast(ctx, c, buf, n, t, root);
}

dw_status dw_comm_barrier(dw_ctx *ctx, dw_comm *c) { return solo(c) ? DW_OK : c->i->barrier(ctx, c); }

dw_status dw_comm_all_to_all(dw_ctx *ctx, dw_comm *c, const void *send, const int64_t *send_counts, void *recv,
                             const int64_t *recv_counts, dw_comm_type t) {
    DW_TRY(check(ctx, c, "all-to-all", 0, t, DW_COMM_SUM));
    for (int r = 0; r < c->world; r++)
        if (send_counts[r] < 0 || recv_counts[r] < 0)
            return dw_set_error(ctx, DW_ERR_INVALID, "%s all-to-all: negative count for rank %d", c->i->name, r);
    if (solo(c)) { /* one rank sends to itself */
        if (send_counts[0] != recv_counts[0])
            return dw_set_error(ctx, DW_ERR_INVALID, "all-to-all: sends %lld elements to itself but expects %lld",
                                (long long)send_counts[0], (long long)recv_counts[0]);
        if (recv != send) memmove(recv, send, (size_t)send_counts[0] * (size_t)dw_comm_type_size(t));
        return DW_OK;
    }
    return c->i->all_to_all(ctx, c, send, send_counts, recv, recv_counts, t);
}

/* ---- started collectives ---------------------------------------------------------------------- */
double dw_comm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

dw_status dw_comm_start(dw_ctx *ctx, dw_comm *c, dw_comm_async *a) {
    const bool reduce = a->kind == DW_COMM_ASYNC_REDUCE, bcast = a->kind == DW_COMM_ASYNC_BROADCAST;
    if (a->kind != DW_COMM_ASYNC_ALL_REDUCE && !reduce && !bcast)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: started collective of kind %d", c->i->name, (int)a->kind);
    if (bcast) a->op = DW_COMM_SUM, a->divide_by = 1; /* nothing to reduce */
    DW_TRY(check(ctx, c, bcast ? "broadcast (started)" : reduce ? "reduce (started)" : "all-reduce (started)", a->n,
                 a->t, a->op));
    if ((reduce || bcast) && (a->root < 0 || a->root >= c->world))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s %s: root %d of %d ranks", c->i->name, bcast ? "broadcast" : "reduce",
                            a->root, c->world);
    if (a->divide_by < 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: average over %d ranks", c->i->name, a->divide_by);
    if (a->op == DW_COMM_AVG && !a->divide_by) a->divide_by = c->world;
    a->done = false, a->seconds = 0, a->started = dw_comm_now(), a->on = c;
    memset(a->impl, 0, sizeof a->impl);
    const bool divide = a->op == DW_COMM_AVG && a->divide_by != 1;
    if (solo(c) || a->n == 0) { /* this rank's values are the sum */
        if (divide) dw_comm_divide_host(a->buf, a->n, a->t, a->divide_by);
        a->done = true;
        return DW_OK;
    }
    if (c->i->start) return c->i->start(ctx, c, a);
    /* a backend without started collectives: the blocking one (for a reduce: an all-reduce, a superset), now */
    if (bcast) DW_TRY(c->i->broadcast(ctx, c, a->buf, a->n, a->t, a->root));
    else DW_TRY(c->i->all_reduce(ctx, c, a->buf, a->n, a->t, DW_COMM_SUM));
    if (divide) dw_comm_divide_host(a->buf, a->n, a->t, a->divide_by);
    a->done = true;
    a->seconds = dw_comm_now() - a->started;
    return DW_OK;
}

dw_status dw_comm_test(dw_ctx *ctx, dw_comm *c, dw_comm_async *a) {
    if (a->on) c = a->on; /* started on a split, perhaps */
    return a->done ? DW_OK : c->i->test(ctx, c, a);
}

dw_status dw_comm_wait(dw_ctx *ctx, dw_comm *c, dw_comm_async *a) {
    if (a->done) return DW_OK;
    if (a->on) c = a->on;
    DW_TRY(c->i->wait(ctx, c, a));
    a->done = true;
    return DW_OK;
}

/* ---- sub-communicators ------------------------------------------------------------------------ */
dw_status dw_comm_split(dw_ctx *ctx, dw_comm *c, int color, dw_comm **out) {
    *out = NULL;
    if (color < 0) return dw_set_error(ctx, DW_ERR_INVALID, "%s split: color %d is negative", c->i->name, color);
    int64_t *colors = calloc((size_t)c->world, sizeof *colors);
    if (!colors) return dw_set_error(ctx, DW_ERR_NOMEM, "%s split: out of memory", c->i->name);
    colors[c->rank] = color;
    dw_status st = dw_comm_all_gather(ctx, c->host, colors, 1, DW_COMM_I64);
    int sub_rank = 0, sub_world = 0;
    for (int r = 0; st == DW_OK && r < c->world; r++)
        if (colors[r] == color) sub_rank += r < c->rank, sub_world++;
    free(colors);
    DW_TRY(st);
    if (solo(c)) return dw_comm_self_create(ctx, out);
    return c->i->split(ctx, c, color, sub_rank, sub_world, out); /* every rank: it may exchange over c */
}

void dw_comm_free(dw_comm *c, bool orderly) {
    if (!c) return;
    dw_comm *host = c->host != c ? c->host : NULL;
    c->i->destroy(c, orderly);
    dw_comm_free(host, orderly);
}

/* ---- self: one rank ------------------------------------------------------------------------- */
static void self_destroy(dw_comm *c, bool orderly) {
    (void)orderly;
    free(c);
}

static const dw_comm_i self_i = {.name = "self", .destroy = self_destroy}; /* world 1: never called */

dw_status dw_comm_self_create(dw_ctx *ctx, dw_comm **out) {
    *out = NULL;
    dw_comm *c = calloc(1, sizeof *c);
    if (!c) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    *c = (dw_comm){.i = &self_i, .rank = 0, .world = 1, .local_rank = 0, .host = c};
    *out = c;
    return DW_OK;
}
