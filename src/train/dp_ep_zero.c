/* dp_ep_zero.c — ZeRO-1 with expert parallelism (dp_ep_zero.h): each rank's optimizer pool holds
 * its cells' moments, the gradients of each cell are reduced to its holder (dense over every rank,
 * experts over the ranks holding them), the holder steps them, and broadcasts the new weights back
 * over the same ranks. Also the moments' checkpoint files by cells (ZeRO-0 and 1 under --ep). */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/log.h"
#include "compile/shard.h"
#include "runtime/engine.h"
#include "train/ckpt_shard_io.h"
#include "train/dp.h"
#include "train/dp_ep_zero.h"

/* This rank's cells as ascending ranges (n, 2), adjacent ones merged; their count. */
static int own_ranges(const dw_dp *d, int64_t *out) {
    int n = 0;
    for (int i = 0; i < d->n_cells; i++) {
        const dw_dp_cell *c = &d->cells[i];
        if (c->rank != d->rank) continue;
        if (n && out[2 * n - 1] == c->begin) out[2 * n - 1] = c->end;
        else out[2 * n] = c->begin, out[2 * n + 1] = c->end, n++;
    }
    return n;
}

dw_status dw_dp_ep_zero_init(dw_dp *d, const dw_ep *ep) {
    const dw_ep_param *pr = NULL;
    const int n = dw_ep_params(ep, &pr), K = dw_ep_group_size(ep);
    const int nc = dw_dp_ep_cells(d->floats, pr, n, d->world, K, &d->cells);
    if (nc < 0) return dw_set_error(d->ctx, DW_ERR_NOMEM, "data parallel: out of memory");
    d->n_cells = nc;
    if (d->zero != 1) return DW_OK; /* ZeRO-0: the cells lay out its checkpoint's moments alone */
    int64_t *seg = malloc((size_t)(2 * nc + 2) * sizeof *seg);
    /* a bucket's pieces: at most one more per cell edge */
    dw_comm_async *more = realloc(d->async, ((size_t)d->buckets.n + (size_t)nc + 1) * sizeof *more);
    if (more) d->async = more;
    if (!seg || !more) {
        free(seg);
        return dw_set_error(d->ctx, DW_ERR_NOMEM, "data parallel: out of memory");
    }
    const int ns = own_ranges(d, seg);
    if (!ns) {
        free(seg);
        return dw_set_error(d->ctx, DW_ERR_UNSUPPORTED, "--ep %d --zero 1 on %d ranks: rank %d would step none of the "
                            "model's %lld parameter floats (too few to shard); use --zero 0", K, d->world, d->rank,
                            (long long)d->floats);
    }
    dw_status st = dw_exec_shard_optimizer_segments(d->eng->x, ns, seg);
    free(seg);
    DW_TRY(st);
    int64_t dense = 0, expert = 0, lo = 0, hi = 0;
    for (int i = 0; i < nc; i++)
        if (d->cells[i].rank == d->rank) *(d->cells[i].j < 0 ? &dense : &expert) += d->cells[i].end - d->cells[i].begin;
    dw_shard_range(d->floats, d->world, d->rank, &lo, &hi);
    DW_LOGI("ZeRO-1 with --ep %d: optimizer state of %lld floats in %d range%s (%lld dense of every rank's, %lld of "
            "experts %d's over their %d holders): %lld bytes on this rank (the world shard's: %lld)", K,
            (long long)(dense + expert), ns, ns == 1 ? "" : "s", (long long)dense, (long long)expert, d->ep_j,
            d->replicas->world, (long long)d->eng->x->pool_bytes[DW_POOL_OPTIM], (long long)(8 * (hi - lo)));
    return DW_OK;
}

dw_status dw_dp_ep_zero_start_bucket(dw_dp *d, int i) {
    const dw_dp_bucket *b = &d->buckets.b[i];
    for (int k = 0; k < d->n_cells; k++) {
        const dw_dp_cell *c = &d->cells[k];
        const int64_t lo = c->begin > b->begin ? c->begin : b->begin, hi = c->end < b->end ? c->end : b->end;
        if (hi <= lo || (c->j >= 0 && c->j != d->ep_j)) continue; /* other groups' experts: no gradient here */
        dw_comm_async *a = &d->async[d->n_async++];
        *a = (dw_comm_async){.kind = DW_COMM_ASYNC_REDUCE, .buf = dw_dp_grad_at(d, i, lo), .n = hi - lo,
                             .t = DW_COMM_F32, .op = DW_COMM_AVG, .divide_by = d->world,
                             .root = c->j < 0 ? c->rank : c->part};
        DW_TRY(dw_comm_start(d->ctx, c->j < 0 ? d->comm : d->replicas, a));
    }
    return DW_OK;
}

dw_status dw_dp_ep_zero_step(dw_dp *d, const dw_adamw_opts *o, int64_t step, double *norm_out) {
    dw_adamw_args a;
    DW_TRY(dw_engine_adamw_args(d->eng, o, step, &a));
    double sumsq = 0; /* every float is one rank's: the sum over the ranks counts each once */
    for (int k = 0; k < d->n_cells; k++) {
        double s = 0;
        if (d->cells[k].rank != d->rank) continue;
        DW_TRY(dw_dp_range_sumsq(d, d->cells[k].begin, d->cells[k].end, &s));
        sumsq += s;
    }
    DW_TRY(dw_comm_all_reduce(d->ctx, d->host, &sumsq, 1, DW_COMM_F64, DW_COMM_SUM));
    const double norm = sqrt(sumsq);
    *norm_out = norm;
    if (!isfinite(norm))
        return dw_set_error(d->ctx, DW_ERR_NUMERIC, "adamw step %lld: gradient norm %g is not finite; parameters "
                            "left unchanged", (long long)step, norm);
    for (int k = 0; k < d->n_cells; k++)
        if (d->cells[k].rank == d->rank) DW_TRY(dw_dp_range_adamw(d, &a, norm, d->cells[k].begin, d->cells[k].end));
    float *w = d->eng->x->w;
    for (int k = 0; k < d->n_cells; k++) { /* the dense cells over every rank ... */
        const dw_dp_cell *c = &d->cells[k];
        if (c->j < 0) DW_TRY(dw_comm_broadcast(d->ctx, d->comm, w + c->begin, c->end - c->begin, DW_COMM_F32, c->rank));
    }
    for (int k = 0; k < d->n_cells; k++) { /* ... then this group's over its holders */
        const dw_dp_cell *c = &d->cells[k];
        if (c->j == d->ep_j)
            DW_TRY(dw_comm_broadcast(d->ctx, d->replicas, w + c->begin, c->end - c->begin, DW_COMM_F32, c->part));
    }
    return dw_engine_refresh(d->eng); /* BF16 copies and quantised weights of what changed */
}

dw_status dw_dp_write_moments(dw_dp *d, const char *dir, const int64_t *ranges) {
    dw_engine *e = d->eng;
    if (!d->n_cells) {
        if (d->rank == 0) DW_TRY(dw_ckpt_index_write(e, dir, d->world, d->zero, ranges));
        return dw_ckpt_shard_write(e, dir, d->rank, d->world, d->lo, d->hi);
    }
    const int nc = d->n_cells;
    int *rank = malloc((size_t)nc * sizeof *rank);
    int64_t *all = malloc((size_t)(2 * nc) * sizeof *all), *own = malloc((size_t)(2 * nc) * sizeof *own);
    dw_status st = rank && all && own ? DW_OK : dw_set_error(d->ctx, DW_ERR_NOMEM, "%s: out of memory", dir);
    for (int i = 0; st == DW_OK && i < nc; i++)
        rank[i] = d->cells[i].rank, all[2 * i] = d->cells[i].begin, all[2 * i + 1] = d->cells[i].end;
    if (st == DW_OK && d->rank == 0) st = dw_ckpt_index_write_ranges(e, dir, d->world, d->zero, nc, rank, all);
    if (st == DW_OK) st = dw_ckpt_shard_write_ranges(e, dir, d->rank, d->world, own_ranges(d, own), own);
    free(rank), free(all), free(own);
    return st;
}
