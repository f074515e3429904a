/* dp_overlap.c — the gradient reduction of data parallelism (dp.h), bucket by bucket: the
 * executor's after_step hook starts every bucket whose gradients the step just finished (on the
 * step's reducing micro-batch), so the collectives run while backward goes on; after backward the
 * rest start and all are waited for, the wait timed as the step's exposed communication. Without
 * overlap nothing starts from the hook: the same collectives, in the same order, after backward.
 * ZeRO-0: each bucket all-reduced (averaged); ZeRO-1: each part of a bucket in rank r's shard
 * reduced (averaged) to rank r; ZeRO-2: the same summed (the loss gradients carry 1/ranks). */
#include <string.h>

#include "core/error.h"
#include "runtime/engine.h"
#include "train/dp.h"
#include "train/dp_ep_zero.h"

/* Bucket i's collectives: ZeRO-0 its all-reduce; ZeRO-1/2 a reduce of its part in each rank's
 * shard, to that rank. */
static dw_status start_bucket(dw_dp *d, int i) {
    if (d->zero && d->n_cells) return dw_dp_ep_zero_start_bucket(d, i); /* --ep ZeRO-1: by cells */
    if (d->n_slices) return dw_dp_experts_start_bucket(d, i); /* --ep: experts among their replicas */
    const dw_dp_bucket *b = &d->buckets.b[i];
    const dw_comm_op op = d->zero >= 2 ? DW_COMM_SUM : DW_COMM_AVG;
    if (d->stage_mem) d->stage_async[2 * i] = d->n_async; /* ZeRO-2/3 staged (dp_stage.c): waited per bucket */
    for (int r = 0; r < d->world; r++) {
        int64_t lo = b->begin, hi = b->end;
        if (d->zero) { /* rank r's shard: [r block, (r+1) block), the last rank's to the end */
            const int64_t slo = (int64_t)r * d->block, shi = r == d->world - 1 ? d->floats : slo + d->block;
            lo = lo > slo ? lo : slo, hi = hi < shi ? hi : shi;
        }
        if (hi <= lo) continue;
        dw_comm_async *a = &d->async[d->n_async++];
        *a = (dw_comm_async){.kind = d->zero ? DW_COMM_ASYNC_REDUCE : DW_COMM_ASYNC_ALL_REDUCE,
                             .buf = dw_dp_grad_at(d, i, lo), .n = hi - lo, .t = DW_COMM_F32, .op = op, .root = r};
        DW_TRY(dw_comm_start(d->ctx, d->comm, a));
        if (!d->zero) break;
    }
    if (d->stage_mem) d->stage_async[2 * i + 1] = d->n_async;
    return DW_OK;
}

/* The executor's hook (exec.h after_step): the buckets ready after `step` start; the oldest one not
 * finished is tested (MPI advances its collectives only inside its calls; a GPU needs no help). */
static dw_status after_step(void *arg, dw_exec *x, int step) {
    (void)x;
    dw_dp *d = arg;
    if (!d->armed) return DW_OK;
    for (; d->started < d->buckets.n && d->buckets.b[d->started].ready <= step; d->started++, d->overlapped++)
        DW_TRY(start_bucket(d, d->started));
    DW_TRY(dw_dp_stage_next(d, step + 1)); /* ZeRO-2/3 staged: slots the next step writes anew */
    for (int i = 0; i < d->n_async; i++)
        if (!d->async[i].done) return dw_comm_test(d->ctx, d->comm, &d->async[i]);
    return DW_OK;
}

dw_status dw_dp_overlap_attach(dw_dp *d) {
    dw_exec *x = d->eng->x;
    if (d->world == 1 || !d->overlap) return DW_OK;
    dw_exec_stop_recording(x); /* the collectives run between the steps: a replayed step would skip them */
    x->after_step = after_step, x->after_user = d;
    return DW_OK;
}

void dw_dp_overlap_detach(dw_dp *d) {
    dw_exec *x = d->eng ? d->eng->x : NULL;
    if (!x || x->after_user != d) return;
    x->after_step = NULL, x->after_user = NULL;
    x->record = d->eng->opts.record && x->be->i->record_begin && !x->ep_step;
}

void dw_dp_before_backward(dw_dp *d, bool last) {
    d->armed = d->world > 1 && (last || d->zero >= 2);
    dw_dp_z3_train(d); /* ZeRO-3: this micro-batch runs on the shard and gathered parameters */
    d->started = d->n_async = 0;
}

/* Seconds during which a collective of this reduction ran: on a GPU the sum of their times (one
 * after another on the comm stream); on the host the union of their [start, seen finished)
 * intervals (MPI runs several at once; the ends are when a test or the wait saw them finish). */
static double busy_seconds(const dw_dp *d) {
    double total = 0, covered = 0; /* covered: the end of the union so far (starts are in order) */
    for (int i = 0; i < d->n_async; i++) {
        const dw_comm_async *a = &d->async[i];
        if (d->comm->i->device_memory) {
            total += a->seconds;
            continue;
        }
        const double from = a->started > covered ? a->started : covered, to = a->started + a->seconds;
        if (to > from) total += to - from;
        if (to > covered) covered = to;
    }
    return total;
}

dw_status dw_dp_after_backward(dw_dp *d) {
    if (!d->armed) return DW_OK;
    d->armed = false;
    const double t0 = dw_comm_now();
    for (; d->started < d->buckets.n; d->started++) DW_TRY(start_bucket(d, d->started));
    for (int i = 0; i < d->n_async; i++) DW_TRY(dw_comm_wait(d->ctx, d->comm, &d->async[i]));
    d->exposed_s += dw_comm_now() - t0;
    d->comm_s += busy_seconds(d);
    if (d->stage_mem) return dw_dp_stage_end(d); /* ZeRO-2/3 staged: this rank's parts into its shard */
    if (d->zero < 2) return DW_OK;
    /* ZeRO-2/3: the next micro-batch adds only its own gradients outside the shard */
    dw_backend *be = d->eng->be;
    float *g = d->eng->x->grad;
    DW_TRY(be->i->zero(be, g, (size_t)d->lo * sizeof *g));
    return be->i->zero(be, g + d->hi, (size_t)(d->floats - d->hi) * sizeof *g);
}

void dw_dp_take_times(dw_dp *d, double *comm_s, double *exposed_s) {
    *comm_s = d->comm_s, *exposed_s = d->exposed_s;
    d->comm_s = d->exposed_s = 0;
}
