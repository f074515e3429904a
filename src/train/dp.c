/* dp.c — data parallelism over an engine's flat FP32 pools (dp.h): the weights broadcast from
 * rank 0, the optimizer step after the gradients were reduced bucket by bucket (dp_overlap.c;
 * ZeRO-0: the engine's step; ZeRO-1/2: AdamW on the rank's shard (dp_range.c), the weights gathered
 * after; --ep: dp_experts.c), and the check that every rank holds the same weights. Pointers
 * are the engine's (host on the CPU, device memory on a GPU, where the communicator is NCCL). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compile/program.h"
#include "compile/shard.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/adamw_args.h"
#include "kernels/cpu/ops_cpu.h"
#include "runtime/engine.h"
#include "train/dp.h"
#include "train/dp_ep_zero.h"
#if DW_HAVE_CUDA
#include "core/ctx.h"
#include "kernels/cuda/adamw_cuda.h"
#endif

/* ZeRO-1/2/3: the engine keeps the moments of this rank's shard only (compile/shard.h: the pools'
 * bytes the planner reports, asserted here against what the executor allocated): from its creation
 * when it was made for this stage (dw_engine_opts.zero), else cut now (the whole pool released). */
static dw_status shard_memory(dw_dp *d) {
    dw_exec *x = d->eng->x;
    const dw_compiled *p = d->eng->p;
    const bool born = x->opt_lo == d->lo && x->opt_hi == d->hi;
    if (!born) DW_TRY(dw_exec_shard_optimizer(x, d->lo, d->hi));
    int64_t planned[DW_POOL_COUNT];
    dw_shard_pool_bytes(p->pool_bytes, p->param_floats, d->world, d->zero, planned);
    DW_ASSERT(x->pool_bytes[DW_POOL_OPTIM] <= planned[DW_POOL_OPTIM]); /* the largest shard's */
    DW_LOGI("ZeRO-%d: optimizer state of floats [%lld, %lld): %lld bytes on this rank (%lld planned per rank, %lld "
            "whole), %s", d->zero, (long long)d->lo, (long long)d->hi, (long long)x->pool_bytes[DW_POOL_OPTIM],
            (long long)planned[DW_POOL_OPTIM], (long long)p->pool_bytes[DW_POOL_OPTIM],
            born ? "allocated at engine creation" : "cut after engine creation (dw_engine_opts.zero was not set)");
    return DW_OK;
}

/* The engine's shards against this run's stage: what it was made for must not be less than it
 * (a stage that needs the whole moments or gradients cannot run on a shard of them). */
static dw_status check_engine(dw_dp *d) {
    const dw_exec *x = d->eng->x;
    const int64_t pf = d->floats;
    const bool opt_cut = x->opt_hi - x->opt_lo != pf, grad_cut = x->grad_hi - x->grad_lo != pf;
    const bool w_cut = !x->param_at && x->w_hi - x->w_lo != pf; /* ZeRO-3 from creation */
    if ((opt_cut && (d->world == 1 || d->zero < 1)) || (grad_cut && (d->world == 1 || d->zero < 2)) ||
        (w_cut && (d->world == 1 || d->zero < 3)))
        return dw_set_error(d->ctx, DW_ERR_INVALID, "--zero %d on %d rank%s: the engine was made for a higher ZeRO "
                            "stage (dw_engine_opts.zero) and holds only its shard of the %s; train it with that stage",
                            d->zero, d->world, d->world == 1 ? "" : "s",
                            w_cut ? "weights" : grad_cut ? "gradients" : "optimizer state");
    if ((opt_cut && (x->opt_lo != d->lo || x->opt_hi != d->hi)) || (grad_cut && (x->grad_lo != d->lo || x->grad_hi != d->hi)) ||
        (w_cut && (x->w_lo != d->lo || x->w_hi != d->hi)))
        return dw_set_error(d->ctx, DW_ERR_INVALID, "data parallel: the engine holds floats [%lld, %lld) as its shard, "
                            "rank %d of %d's is [%lld, %lld): it was made for another job", (long long)x->opt_lo,
                            (long long)x->opt_hi, d->rank, d->world, (long long)d->lo, (long long)d->hi);
    return DW_OK;
}

dw_status dw_dp_init(dw_dp *d, dw_engine *e, int zero, bool overlap) {
    memset(d, 0, sizeof *d);
    d->ctx = e->ctx;
    d->eng = e;
    if (zero < 0 || zero > 3)
        return dw_set_error(e->ctx, DW_ERR_INVALID, "--zero %d: the ZeRO stage is 0, 1, 2 or 3", zero);
    DW_TRY(dw_comm_world(e->ctx, &d->comm));
    d->host = d->comm->host;
    d->rank = d->comm->rank;
    d->world = d->comm->world;
    d->zero = zero;
    d->floats = e->p->param_floats;
    dw_shard_range(d->floats, d->world, d->rank, &d->lo, &d->hi); /* compile/shard.h */
    d->block = d->floats / ((int64_t)d->world * DW_SHARD_ALIGN) * DW_SHARD_ALIGN;
    d->overlap = overlap;
    DW_TRY(check_engine(d));
    if (d->world == 1) return DW_OK;
    dw_exec_share_grads(e->x); /* the norm reads the reduced gradients, not the backward's partials */
    if (zero > 0) DW_TRY(shard_memory(d));
    int64_t size = 0;
    DW_TRY(dw_dp_bucket_floats(e->ctx, zero, &size));
    DW_TRY(dw_dp_buckets_plan(e->ctx, e->p, size, &d->buckets));
    const dw_exec *x = e->x;
    if (zero >= 2 && x->grad_hi - x->grad_lo != d->floats) { /* dp_stage.c: the gradients' shard and staging */
        dw_status st = dw_dp_stage_init(d, size);
        if (st != DW_OK) {
            dw_dp_free(d);
            return st;
        }
    } else if (zero >= 2) {
        DW_LOGI("ZeRO-%d: the engine holds the whole gradient pool (dw_engine_opts.zero was not set): the backward "
                "writes it in place, only the shard kept between micro-batches", zero);
    }
    d->async = calloc((size_t)d->buckets.n * (size_t)d->world + 1, sizeof *d->async);
    d->times = calloc((size_t)(4 * d->world), sizeof *d->times);
    dw_status st = d->async && d->times ? dw_dp_overlap_attach(d)
                                        : dw_set_error(e->ctx, DW_ERR_NOMEM, "data parallel: out of memory");
    if (st == DW_OK && zero == 3) st = dw_dp_z3_init(d); /* dp_zero3.c: the weights gathered around their use */
    if (st != DW_OK) {
        dw_dp_free(d);
        return st;
    }
    int early = 0; /* buckets final before the backward's last step: those that can overlap */
    for (int i = 0; i < d->buckets.n; i++) early += d->buckets.b[i].ready < e->p->phase[DW_PHASE_BACKWARD][1] - 1;
    DW_LOGI("data parallel: ZeRO-%d, %d gradient bucket%s of up to %lld floats, %d final before backward ends; "
            "reduced %s", zero, d->buckets.n, d->buckets.n == 1 ? "" : "s", (long long)size, early,
            overlap ? "as backward finishes them" : "after backward (no overlap)");
    return DW_OK;
}

void dw_dp_free(dw_dp *d) {
    if (d->world > 1 && d->overlap)
        DW_LOGI("data parallel: %lld bucket reductions started during backward", (long long)d->overlapped);
    dw_dp_overlap_detach(d);
    dw_dp_z3_free(d);
    dw_dp_stage_free(d);
    dw_dp_buckets_free(&d->buckets);
    dw_comm_free(d->replicas, true);
    free(d->slices);
    free(d->cells);
    d->replicas = NULL, d->slices = NULL, d->n_slices = 0, d->cells = NULL, d->n_cells = 0;
    free(d->async);
    free(d->times);
    d->async = NULL, d->times = NULL;
}

dw_status dw_dp_report_times(dw_dp *d, dw_train_progress *p) {
    if (d->world == 1) return DW_OK;
    const int W = d->world;
    double *pairs = d->times, *comm = pairs + 2 * W, *exposed = comm + W;
    dw_dp_take_times(d, &pairs[2 * d->rank], &pairs[2 * d->rank + 1]);
    DW_TRY(dw_comm_all_gather(d->ctx, d->host, pairs, 2, DW_COMM_F64));
    for (int r = 0; r < W; r++) comm[r] = pairs[2 * r], exposed[r] = pairs[2 * r + 1];
    p->ranks = W, p->comm_s = comm, p->exposed_comm_s = exposed;
    return DW_OK;
}

dw_status dw_dp_broadcast_weights(dw_dp *d) {
    if (d->world == 1) return DW_OK;
    const dw_exec *x = d->eng->x;
    if (x->w_hi - x->w_lo != d->floats) { /* ZeRO-3: each rank's shard from the job's one seed or file */
        DW_LOGI("ZeRO-3: each rank's masters of floats [%lld, %lld) came from the same seed or file; nothing to "
                "broadcast", (long long)x->w_lo, (long long)x->w_hi);
        return DW_OK;
    }
    DW_TRY(dw_comm_broadcast(d->ctx, d->comm, d->eng->x->w, d->floats, DW_COMM_F32, 0));
    return dw_engine_refresh(d->eng);
}

/* Every rank's blocks of a pool to every rank: the blocks by all-gather, the tail from the last rank. */
double dw_dp_grad_scale(const dw_dp *d, int64_t accum) {
    return 1.0 / (double)(d->zero >= 2 ? accum * d->world : accum);
}

/* ZeRO-1/2: the shard's step (the gradients already reduced into the shards: dp_overlap.c). */
static dw_status shard_step(dw_dp *d, const dw_adamw_opts *o, int64_t step, double *norm_out) {
    dw_adamw_args a;
    DW_TRY(dw_engine_adamw_args(d->eng, o, step, &a)); /* what dw_engine_step would take */
    double sumsq = 0;
    DW_TRY(dw_dp_range_sumsq(d, d->lo, d->hi, &sumsq));
    DW_TRY(dw_comm_all_reduce(d->ctx, d->host, &sumsq, 1, DW_COMM_F64, DW_COMM_SUM));
    const double norm = sqrt(sumsq);
    *norm_out = norm;
    if (!isfinite(norm))
        return dw_set_error(d->ctx, DW_ERR_NUMERIC, "adamw step %lld: gradient norm %g is not finite; parameters "
                            "left unchanged", (long long)step, norm);
    DW_TRY(dw_dp_range_adamw(d, &a, norm, d->lo, d->hi));
    if (d->zero == 3 && !d->z3_whole) return DW_OK; /* the shard's masters are the weights; gathered on use */
    DW_TRY(dw_dp_gather_pool(d, d->eng->x->w));
    return dw_engine_refresh(d->eng); /* BF16 copies and quantised weights from the gathered masters */
}

dw_status dw_dp_step(dw_dp *d, const dw_adamw_opts *o, int64_t step, double *norm) {
    *norm = 0;
    if (d->world == 1) return dw_engine_step(d->eng, o, step, norm);
    if (d->zero > 0 && d->n_cells) return dw_dp_ep_zero_step(d, o, step, norm); /* --ep: by cells */
    if (d->zero > 0) return shard_step(d, o, step, norm);
    if (d->n_slices) return dw_dp_experts_step(d, o, step, norm); /* --ep: each rank its own experts */
    return dw_engine_step(d->eng, o, step, norm); /* the gradients averaged already */
}

/* FNV-1a over the bytes of the masters. */
static uint64_t fnv1a(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

dw_status dw_dp_check_weights(dw_dp *d, int64_t step) {
    if (d->world == 1) return DW_OK;
    if (d->zero == 3 && !d->z3_whole) return dw_dp_z3_checkpoint(d); /* one copy of each weight */
    DW_TRY(dw_dp_gather_experts(d)); /* --ep: every expert current everywhere, as a checkpoint needs */
    const size_t bytes = (size_t)d->floats * sizeof(float);
    float *w = d->eng->x->w;
    float *host = NULL;
    if (d->comm->i->device_memory) { /* the masters live on the GPU */
        if (!(host = malloc(bytes))) return dw_set_error(d->ctx, DW_ERR_NOMEM, "weight check: out of memory");
        dw_status st = d->eng->be->i->download(d->eng->be, host, w, bytes);
        if (st != DW_OK) {
            free(host);
            return st;
        }
        w = host;
    }
    int64_t *hashes = calloc((size_t)d->world, sizeof *hashes);
    dw_status st = hashes ? DW_OK : dw_set_error(d->ctx, DW_ERR_NOMEM, "weight check: out of memory");
    if (st == DW_OK) {
        uint64_t h = fnv1a(w, bytes);
        memcpy(&hashes[d->rank], &h, sizeof h);
        st = dw_comm_all_gather(d->ctx, d->host, hashes, 1, DW_COMM_I64);
    }
    for (int r = 1; st == DW_OK && r < d->world; r++)
        if (hashes[r] != hashes[0])
            st = dw_set_error(d->ctx, DW_ERR_NUMERIC, "after step %lld rank %d's weights differ from rank 0's: the ranks "
                              "no longer train one model", (long long)step, r);
    free(hashes);
    free(host);
    return st;
}
