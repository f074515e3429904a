/* dp_zero3_gather.c — ZeRO-3's gathers (dp.h): a parameter's parts broadcast into its slot from the
 * ranks whose shards hold them, its BF16 working copy made beside it, and the prefetch: before the
 * first step of a sweep that gathers (an event step), the gathers of the next event step of the
 * same sweep are started (the communicator's started broadcasts, on its own stream on a GPU) and
 * waited for just before that step, so that they run while the steps in between compute. The slots
 * are planned for it: a parameter's lifetime starts at the event before its own
 * (compile/z3_slots.h). DW_Z3_PREFETCH=0 gathers each step's parameters just before it (the same
 * slots, the same bits). Not the plan nor when the weights are whole (dp_zero3.c). */
#include <stdlib.h>
#include <string.h>

#include "compile/program.h"
#include "compile/shard.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/engine.h"
#include "train/dp.h"
#if DW_HAVE_CUDA
#include <cuda_runtime.h>

#include "core/ctx.h"
#include "core/cuda_check.h"
#endif

/* n floats from src to dst, both the engine's memory. */
static dw_status copy_floats(dw_dp *d, float *dst, const float *src, int64_t n) {
    if (dw_ctx_device(d->ctx) != DW_DEVICE_CUDA) {
        memcpy(dst, src, (size_t)n * sizeof *dst);
        return DW_OK;
    }
#if DW_HAVE_CUDA
    void *stream = NULL;
    DW_TRY(dw_ctx_stream(d->ctx, &stream));
    DW_CUDA_CHECK(d->ctx, cudaMemcpyAsync(dst, src, (size_t)n * sizeof *dst, cudaMemcpyDeviceToDevice,
                                          (cudaStream_t)stream));
    return DW_OK;
#else
    return dw_set_error(d->ctx, DW_ERR_UNSUPPORTED, "ZeRO-3: a CUDA context in a build without CUDA");
#endif
}

static int64_t numel(const dw_dp *d, int k) {
    const dw_compiled *p = d->eng->p;
    return dw_ir_numel(&p->g->tensors[p->param_tensor[k]]);
}

/* Parameter k's parts into slot (the engine's memory, its numel floats): this rank's copied, each
 * rank's broadcast from it; started (into d->z3_async) when `started`, else run to the end. */
static dw_status parts(dw_dp *d, int k, float *slot, bool started) {
    const int64_t a = d->eng->p->param_off[k], n = numel(d, k);
    for (int r = 0; r < d->world; r++) {
        int64_t rlo, rhi;
        dw_shard_range(d->floats, d->world, r, &rlo, &rhi);
        const int64_t lo = a > rlo ? a : rlo, hi = a + n < rhi ? a + n : rhi;
        if (hi <= lo) continue;
        if (r == d->rank) DW_TRY(copy_floats(d, slot + (lo - a), d->eng->x->w + (lo - d->lo), hi - lo));
        if (!started) {
            DW_TRY(dw_comm_broadcast(d->ctx, d->comm, slot + (lo - a), hi - lo, DW_COMM_F32, r));
            continue;
        }
        DW_ASSERT(d->z3_n_async < d->z3_async_cap); /* planned: the most parts an event step gathers */
        dw_comm_async *as = &d->z3_async[d->z3_n_async++];
        *as = (dw_comm_async){.kind = DW_COMM_ASYNC_BROADCAST, .buf = slot + (lo - a), .n = hi - lo,
                              .t = DW_COMM_F32, .root = r};
        DW_TRY(dw_comm_start(d->ctx, d->comm, as));
    }
    return DW_OK;
}

dw_status dw_dp_z3_gather_to(dw_dp *d, int k, float *slot) { return parts(d, k, slot, false); }

/* Parameter k's BF16 working copy beside its gathered values (a BF16 program), else nothing: the
 * backend's cast of floats [0, n) of an executor view whose pools are the two slots. */
static dw_status working_copy(dw_dp *d, int k) {
    uint16_t *slot16 = d->eng->x->param_bf16_at ? d->eng->x->param_bf16_at[k] : NULL;
    if (!slot16) return DW_OK;
    dw_exec view = *d->eng->x;
    view.w = d->eng->x->param_at[k], view.wb = slot16;
    return d->eng->be->i->cast_bf16(d->eng->be, &view, 0, numel(d, k));
}

/* The prefetched gathers waited for and their working copies made. */
dw_status dw_dp_z3_settle(dw_dp *d) {
    if (d->z3_pre < 0) return DW_OK;
    const int t = d->z3_pre;
    d->z3_pre = -1;
    for (int i = 0; i < d->z3_n_async; i++) DW_TRY(dw_comm_wait(d->ctx, d->comm, &d->z3_async[i]));
    d->z3_n_async = 0;
    for (int e = d->z3_ev_at[t]; e < d->z3_ev_at[t + 1]; e++) DW_TRY(working_copy(d, d->z3_ev[e]));
    return DW_OK;
}

dw_status dw_dp_z3_gathers(dw_dp *d, int step) {
    const bool event = d->z3_ev_at[step] < d->z3_ev_at[step + 1];
    bool ready = false;
    /* a prefetch due now or passed (its step skipped), or of a sweep left behind: finished first */
    if (d->z3_pre >= 0 && (d->z3_pre <= step || step < d->z3_pre_at)) {
        ready = d->z3_pre == step;
        DW_TRY(dw_dp_z3_settle(d));
    }
    for (int e = d->z3_ev_at[step]; event && !ready && e < d->z3_ev_at[step + 1]; e++) {
        const int k = d->z3_ev[e];
        DW_TRY(parts(d, k, d->eng->x->param_at[k], false));
        DW_TRY(working_copy(d, k));
    }
    const int t = d->z3_next[step];
    if (!event || t < 0 || !d->z3_prefetch) return DW_OK;
    d->z3_pre = t, d->z3_pre_at = step; /* the next event step's, started now */
    for (int e = d->z3_ev_at[t]; e < d->z3_ev_at[t + 1]; e++)
        DW_TRY(parts(d, d->z3_ev[e], d->eng->x->param_at[d->z3_ev[e]], true));
    return DW_OK;
}

dw_status dw_dp_z3_prefetch_plan(dw_dp *d) {
    const dw_compiled *p = d->eng->p;
    const int ns = p->n_steps;
    d->z3_pre = -1;
    d->z3_prefetch = dw_env_flag("DW_Z3_PREFETCH", true);
    d->z3_next = malloc((size_t)(ns ? ns : 1) * sizeof *d->z3_next);
    if (!d->z3_next) return dw_set_error(d->ctx, DW_ERR_NOMEM, "ZeRO-3: out of memory");
    int most = 1; /* the parts one event step gathers, at most */
    for (int ph = DW_PHASE_FORWARD; ph <= DW_PHASE_BACKWARD; ph++) {
        int next = -1; /* from the sweep's end back: the next event step after s */
        for (int s = p->phase[ph][1] - 1; s >= p->phase[ph][0]; s--) {
            d->z3_next[s] = next;
            if (d->z3_ev_at[s] == d->z3_ev_at[s + 1]) continue;
            next = s;
            int count = 0;
            for (int e = d->z3_ev_at[s]; e < d->z3_ev_at[s + 1]; e++) {
                const int64_t a = p->param_off[d->z3_ev[e]], n = numel(d, d->z3_ev[e]);
                for (int r = 0; r < d->world; r++) {
                    int64_t rlo, rhi;
                    dw_shard_range(d->floats, d->world, r, &rlo, &rhi);
                    count += (a > rlo ? a : rlo) < (a + n < rhi ? a + n : rhi);
                }
            }
            most = count > most ? count : most;
        }
    }
    for (int s = 0; s < ns; s++)
        if (s < p->phase[DW_PHASE_FORWARD][0] || s >= p->phase[DW_PHASE_BACKWARD][1]) d->z3_next[s] = -1;
    d->z3_async = calloc((size_t)most, sizeof *d->z3_async);
    if (!d->z3_async) return dw_set_error(d->ctx, DW_ERR_NOMEM, "ZeRO-3: out of memory");
    d->z3_async_cap = most;
    int events = 0;
    for (int s = 0; s < ns; s++) events += d->z3_ev_at[s] < d->z3_ev_at[s + 1];
    if (d->z3_prefetch)
        DW_LOGI("ZeRO-3: gathers of %d event steps a micro-batch, each started at the event before its own in its "
                "sweep (up to %d broadcasts in flight)", events, most);
    else
        DW_LOGI("ZeRO-3: gathers of %d event steps a micro-batch, each just before its step (DW_Z3_PREFETCH=0)", events);
    return DW_OK;
}

void dw_dp_z3_prefetch_free(dw_dp *d) {
    /* a prefetch still running (an error: the other ranks may be gone) is left to the process's end */
    free(d->z3_next), free(d->z3_async);
    d->z3_next = NULL, d->z3_async = NULL, d->z3_async_cap = 0, d->z3_n_async = 0, d->z3_pre = -1;
}
