/* runtime_dp.c — data parallelism as Deepwell's runtime executes it (src/train/dp.c), priced for
 * plans the engine runs over several GPUs: the FP32 gradients (4 bytes a parameter) are
 *   ZeRO-0: all-reduced in 16 MiB buckets after the whole backward, then every rank runs the
 *           full AdamW;
 *   ZeRO-1: reduce-scattered into per-rank shards once after the backward; each rank steps its
 *           shard; the FP32 masters all-gathered;
 *   ZeRO-2: reduce-scattered after every micro-batch, then as ZeRO-1.
 * No collective overlaps compute there yet, so all of it is exposed. The engine's pools are
 * allocated whole on every rank, so memory is the one-GPU engine's (memory.c). */
#include "plan/layout.h"

/* train/dp.c's bucket: 4 Mi FP32 values. */
#define RUNTIME_DP_BUCKET_BYTES (16.0 * 1024 * 1024)

void dw_plan_runtime_dp(const dw_plan_in *in, const dw_par *par, double engine_opt, double *all, double *exposed,
                        double *opt) {
    *all = *exposed = 0, *opt = engine_opt;
    if (par->dp <= 1) return;
    dw_param_counts pc;
    dw_plan_params(in, &pc);
    const double bytes = 4.0 * pc.total;
    const int64_t n = par->dp;
    double t = 0;
    if (par->zero == 0) {
        const double full = (double)(int64_t)(bytes / RUNTIME_DP_BUCKET_BYTES);
        t = full * dw_plan_coll_time(in->hw, DW_COLL_ALLREDUCE, n, 1, RUNTIME_DP_BUCKET_BYTES);
        const double rest = bytes - full * RUNTIME_DP_BUCKET_BYTES;
        if (rest > 0) t += dw_plan_coll_time(in->hw, DW_COLL_ALLREDUCE, n, 1, rest);
    } else {
        const double rs = dw_plan_coll_time(in->hw, DW_COLL_REDUCESCATTER, n, 1, bytes);
        const double ag = dw_plan_coll_time(in->hw, DW_COLL_ALLGATHER, n, 1, bytes);
        t = (par->zero == 2 ? (double)par->grad_accum : 1.0) * rs + ag;
        *opt = engine_opt / (double)n; /* each rank's AdamW over its shard */
    }
    *all = *exposed = t;
}
