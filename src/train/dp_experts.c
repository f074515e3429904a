/* dp_experts.c — data parallelism with expert parallelism (--ep K, ZeRO-0; ZeRO-1's by cells is
 * dp_ep_zero.c, set up here; dp.h): a rank computes
 * gradients only for its own experts (group j = rank mod K, train/ep.c), so those are reduced only
 * among the world / K ranks holding the same experts (averaged over the whole job, as the full
 * reduction of zeros from the others would), the dense parameters among all ranks, and the rank
 * steps its experts and the dense parameters alone; the other experts' weights and moments go
 * stale until dw_dp_gather_experts brings them from their owners (a checkpoint, the weight check,
 * a sample). The norm: the dense part's sum of squares plus each group's own, counted once. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "runtime/engine.h"
#include "train/dp.h"
#include "train/dp_ep_zero.h"
#include "train/ep.h"

static int by_begin(const void *a, const void *b) {
    const dw_dp_slice *x = a, *y = b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

dw_status dw_dp_set_experts(dw_dp *d, const dw_ep *ep) {
    const int K = dw_ep_group_size(ep);
    if (d->world == 1 || K == 1) return DW_OK;
    if (d->zero == 3)
        return dw_set_error(d->ctx, DW_ERR_UNSUPPORTED, "--ep %d with --zero 3: the expert layers' steps (train/ep.c) "
                            "read their weights whole; use --zero 0, 1 or 2 with expert parallelism", K);
    if (d->zero == 2) { /* its staged gradient shard is the world's range (dp_stage.c), not cells */
        DW_LOGI("expert parallel with ZeRO-2: the expert gradients are reduced over all %d ranks and every rank "
                "steps its shard of the whole pool (reducing and stepping them among the ranks holding the same "
                "experts is ZeRO-0's and ZeRO-1's)", d->world);
        return DW_OK;
    }
    const dw_ep_param *pr = NULL;
    const int n = dw_ep_params(ep, &pr);
    d->slices = calloc((size_t)(n * K) + 1, sizeof *d->slices);
    if (!d->slices) return dw_set_error(d->ctx, DW_ERR_NOMEM, "data parallel: out of memory");
    for (int k = 0; k < n; k++)
        for (int j = 0; j < K; j++)
            d->slices[k * K + j] = (dw_dp_slice){.begin = pr[k].off + j * (pr[k].numel / K),
                                                 .end = pr[k].off + (j + 1) * (pr[k].numel / K), .j = j};
    qsort(d->slices, (size_t)(n * K), sizeof *d->slices, by_begin);
    /* a bucket's pieces: at most one more per slice edge */
    dw_comm_async *more = realloc(d->async, ((size_t)d->buckets.n + 2 * (size_t)(n * K) + 1) * sizeof *more);
    if (!more) return dw_set_error(d->ctx, DW_ERR_NOMEM, "data parallel: out of memory");
    d->async = more;
    d->ep_k = K, d->ep_j = d->rank % K;
    DW_TRY(dw_comm_split(d->ctx, d->comm, d->ep_j, &d->replicas));
    d->n_slices = n * K; /* on from here */
    DW_LOGI("expert parallel: this rank's experts (slice %d of %d of %d parameters) reduced among the %d rank%s "
            "holding them, the dense parameters among all %d", d->ep_j, K, n, d->replicas->world,
            d->replicas->world == 1 ? "" : "s", d->world);
    return dw_dp_ep_zero_init(d, ep); /* the cells: ZeRO-1's optimizer shard, both stages' checkpoint layout */
}

/* The pieces of [lo, hi): fn on each dense part (j -1) and each slice part (its group). */
typedef dw_status (*piece_fn)(dw_dp *d, int64_t lo, int64_t hi, int j, void *arg);
static dw_status each_piece(dw_dp *d, int64_t lo, int64_t hi, piece_fn fn, void *arg) {
    int64_t at = lo;
    for (int s = 0; s < d->n_slices && at < hi; s++) {
        const dw_dp_slice *sl = &d->slices[s];
        if (sl->end <= at) continue;
        if (sl->begin >= hi) break;
        if (sl->begin > at) DW_TRY(fn(d, at, sl->begin, -1, arg));
        const int64_t a = sl->begin > at ? sl->begin : at, b = sl->end < hi ? sl->end : hi;
        DW_TRY(fn(d, a, b, sl->j, arg));
        at = b;
    }
    return at < hi ? fn(d, at, hi, -1, arg) : DW_OK;
}

/* A bucket's piece: dense over every rank, this rank's experts over their replicas (the sum over the
 * whole job's ranks: the others hold zeros), other experts not at all. */
static dw_status start_piece(dw_dp *d, int64_t lo, int64_t hi, int j, void *arg) {
    (void)arg;
    if (j >= 0 && j != d->ep_j) return DW_OK;
    dw_comm_async *a = &d->async[d->n_async++];
    *a = (dw_comm_async){.kind = DW_COMM_ASYNC_ALL_REDUCE, .buf = d->eng->x->grad + lo, .n = hi - lo,
                         .t = DW_COMM_F32, .op = DW_COMM_AVG, .divide_by = d->world};
    return dw_comm_start(d->ctx, j < 0 ? d->comm : d->replicas, a);
}

dw_status dw_dp_experts_start_bucket(dw_dp *d, int i) {
    return each_piece(d, d->buckets.b[i].begin, d->buckets.b[i].end, start_piece, NULL);
}

/* The sums of squares of the dense pieces ([0]) and of this rank's experts ([1]). */
static dw_status sumsq_piece(dw_dp *d, int64_t lo, int64_t hi, int j, void *arg) {
    double *sums = arg, s = 0;
    if (j >= 0 && j != d->ep_j) return DW_OK;
    DW_TRY(dw_dp_range_sumsq(d, lo, hi, &s));
    sums[j >= 0] += s;
    return DW_OK;
}

typedef struct {
    const dw_adamw_args *a;
    double norm;
} step_args;

static dw_status adamw_piece(dw_dp *d, int64_t lo, int64_t hi, int j, void *arg) {
    const step_args *s = arg;
    return j >= 0 && j != d->ep_j ? DW_OK : dw_dp_range_adamw(d, s->a, s->norm, lo, hi);
}

dw_status dw_dp_experts_step(dw_dp *d, const dw_adamw_opts *o, int64_t step, double *norm_out) {
    dw_adamw_args a;
    DW_TRY(dw_engine_adamw_args(d->eng, o, step, &a));
    double sums[2] = {0, 0};
    DW_TRY(each_piece(d, 0, d->floats, sumsq_piece, sums));
    /* every group's experts once: the first group's ranks hold one copy of each */
    double experts = d->rank < d->ep_k ? sums[1] : 0;
    DW_TRY(dw_comm_all_reduce(d->ctx, d->host, &experts, 1, DW_COMM_F64, DW_COMM_SUM));
    const double norm = sqrt(sums[0] + experts);
    *norm_out = norm;
    if (!isfinite(norm))
        return dw_set_error(d->ctx, DW_ERR_NUMERIC, "adamw step %lld: gradient norm %g is not finite; parameters "
                            "left unchanged", (long long)step, norm);
    step_args s = {.a = &a, .norm = norm};
    DW_TRY(each_piece(d, 0, d->floats, adamw_piece, &s));
    return dw_engine_refresh(d->eng); /* the BF16 copies and quantised weights of what changed */
}

dw_status dw_dp_gather_experts(dw_dp *d) {
    if (!d->n_slices) return DW_OK;
    dw_exec *x = d->eng->x;
    float *pools[3] = {x->w, x->m, x->v};
    const int n_pools = d->zero ? 1 : 3; /* ZeRO-1: the moments stay in their cells (dp_ep_zero.c) */
    for (int s = 0; s < d->n_slices; s++) {
        const dw_dp_slice *sl = &d->slices[s];
        for (int k = 0; k < n_pools; k++) /* from rank j, group j's owner in the first group */
            DW_TRY(dw_comm_broadcast(d->ctx, d->comm, pools[k] + sl->begin, sl->end - sl->begin, DW_COMM_F32, sl->j));
    }
    return dw_engine_refresh(d->eng);
}
