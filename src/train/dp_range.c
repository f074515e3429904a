/* dp_range.c — data parallelism's work on a range [lo, hi) of the engine's flat pools (dp.h): the
 * gradients' sum of squares (the shard's part of the global norm), AdamW with the global norm,
 * on the CPU or the GPU, and the ranks' blocks of a pool gathered to every rank. Used by the
 * sharded step (dp.c), the expert step (dp_experts.c) and ZeRO-3 (dp_zero3.c). */
#include "compile/program.h"
#include "core/error.h"
#include "kernels/adamw_args.h"
#include "kernels/cpu/ops_cpu.h"
#include "runtime/engine.h"
#include "train/dp.h"
#if DW_HAVE_CUDA
#include "core/ctx.h"
#include "kernels/cuda/adamw_cuda.h"
#endif

dw_status dw_dp_range_sumsq(dw_dp *d, int64_t lo, int64_t hi, double *out) {
    dw_exec *x = d->eng->x;
    *out = 0;
    if (hi <= lo) return DW_OK;
    if (dw_ctx_device(d->ctx) != DW_DEVICE_CUDA) {
        *out = dw_cpu_sumsq(x->grad + (lo - x->grad_lo), hi - lo);
        return DW_OK;
    }
#if DW_HAVE_CUDA
    const dw_compiled *p = d->eng->p;
    void *stream = NULL;
    double norm = 0;
    double *dnorm = (double *)(x->work + p->work.norm);
    DW_TRY(dw_ctx_stream(d->ctx, &stream));
    DW_TRY(dw_cuda_grad_norm(d->ctx, x->grad + (lo - x->grad_lo), hi - lo, (double *)(x->work + p->work.partials),
                             DW_COMPILE_NORM_BLOCKS, dnorm, stream));
    DW_TRY(d->eng->be->i->download(d->eng->be, &norm, dnorm, sizeof norm));
    *out = norm * norm;
    return DW_OK;
#else
    return dw_set_error(d->ctx, DW_ERR_UNSUPPORTED, "sharded adamw: a CUDA context in a build without CUDA");
#endif
}

dw_status dw_dp_range_adamw(dw_dp *d, const dw_adamw_args *a, double norm, int64_t lo, int64_t hi) {
    dw_exec *x = d->eng->x;
    const int64_t n = hi - lo, decay = d->eng->p->decay_floats;
    const int64_t n_decay = decay <= lo ? 0 : decay - lo < n ? decay - lo : n;
    if (n <= 0) return DW_OK;
    int64_t skip = 0, held = 0; /* the moments this rank holds (ZeRO: its shard, or its cells under --ep) */
    float *m = dw_exec_moments(x, 0, lo, n, &skip, &held), *v = dw_exec_moments(x, 1, lo, n, &skip, &held);
    DW_ASSERT(skip == 0 && held == n);
    DW_ASSERT(x->w_lo <= lo && hi <= x->w_hi); /* the masters it holds (ZeRO-3: its shard) */
    DW_ASSERT(x->grad_lo <= lo && hi <= x->grad_hi); /* the gradients (ZeRO-2/3 from creation: its shard) */
    float *w = x->w + (lo - x->w_lo);
    float *g = x->grad + (lo - x->grad_lo);
    if (dw_ctx_device(d->ctx) != DW_DEVICE_CUDA) {
        dw_cpu_adamw(w, g, m, v, n, n_decay, norm, a);
        return DW_OK;
    }
#if DW_HAVE_CUDA
    const dw_compiled *p = d->eng->p;
    dw_backend *be = d->eng->be;
    void *stream = NULL;
    DW_TRY(dw_ctx_stream(d->ctx, &stream));
    DW_TRY(be->i->upload(be, x->work + p->work.norm, &norm, sizeof norm));
    DW_TRY(be->i->upload(be, x->work + p->work.adamw_args, a, sizeof *a));
    return dw_cuda_adamw(d->ctx, w, g, m, v, n, n_decay,
                         (const double *)(x->work + p->work.norm), (const dw_adamw_args *)(x->work + p->work.adamw_args),
                         stream);
#else
    return dw_set_error(d->ctx, DW_ERR_UNSUPPORTED, "sharded adamw: a CUDA context in a build without CUDA");
#endif
}

dw_status dw_dp_gather_pool(dw_dp *d, float *pool) {
    const int64_t full = d->block * d->world;
    DW_TRY(dw_comm_all_gather(d->ctx, d->comm, pool, d->block, DW_COMM_F32));
    return dw_comm_broadcast(d->ctx, d->comm, pool + full, d->floats - full, DW_COMM_F32, d->world - 1);
}
