/* runtime_dp.c — data parallelism as Deepwell's runtime executes it (src/train/dp.c,
 * dp_overlap.c), priced for plans the engine runs over several GPUs. The FP32 gradients (4 bytes a
 * parameter) go in buckets (256 MiB; 16 MiB under ZeRO-2/3: compile/grad_stage.h), cut from the pool's end, each started as soon as the backward
 * step that last writes it has run (on the reducing micro-batch), on the communicator's stream:
 *   ZeRO-0: each bucket all-reduced; then every rank runs the full AdamW;
 *   ZeRO-1: each bucket's part in rank r's shard reduced to rank r, once, on the last micro-batch;
 *           each rank steps its shard; the FP32 masters all-gathered;
 *   ZeRO-2: the same reduces on every micro-batch;
 *   ZeRO-3: ZeRO-2's reduces and shard step, no all-gather after it; instead, on every micro-batch,
 *           each parameter broadcast into its gather slot before the forward and again before the
 *           backward (train/dp_zero3.c), each event step's gathers started at the sweep's previous
 *           event step (train/dp_zero3_gather.c): exposed where they outlast the compute between,
 *           and the first event step's of each sweep whole (dw_plan_engine_zero3); in a BF16
 *           program each gathered parameter is then cast to BF16 on the compute stream (cast_s,
 *           priced with the exposed time: nothing hides it).
 * Overlapped, a reduction is exposed where it outlasts the backward it runs under, and the last
 * bucket (the first parameters, final when the backward ends) always is; the all-gather after the
 * step always is. `--no-overlap` starts the same collectives after the backward: all exposed, and
 * overlap=false prices ZeRO-3's gathers unprefetched too (DW_Z3_PREFETCH=0).
 * (Sharing the GPU with the backward's kernels may slow both; not modelled.) Memory is the one-GPU
 * engine's pools but, under ZeRO-1/2/3, each rank's optimizer pool its shard's, and under ZeRO-3 its
 * weights pool its masters' shard plus the gather block (memory.c by compile/shard.h and
 * compile/z3_slots.h, the rules train/dp.c and dp_zero3.c allocate by). */
#include <math.h>

#include "compile/grad_stage.h"
#include "plan/layout.h"

/* train/dp_buckets.c's bucket under ZeRO stage `zero`. */
static double bucket_bytes(int zero) { return 4.0 * (double)dw_grad_bucket_default(zero); }

/* A reduce to one rank over n ranks: a ring's bandwidth term without reduce-scatter's (n-1)/n. */
static double reduce_time(const dw_hw *hw, int64_t n, double bytes) {
    return dw_plan_coll_time(hw, DW_COLL_REDUCESCATTER, n, 1, bytes) * (double)n / (double)(n - 1);
}

/* The gradients' reduction once: the buckets' collectives, in all and the last bucket's. */
static void reduce_once(const dw_plan_in *in, int64_t n, int zero, double bytes, double *all, double *last) {
    const double bb = bucket_bytes(zero), full = (double)(int64_t)(bytes / bb), rest = bytes - full * bb;
    const double one = zero ? reduce_time(in->hw, n, bb) : dw_plan_coll_time(in->hw, DW_COLL_ALLREDUCE, n, 1, bb);
    const double tail = rest <= 0 ? 0
                        : zero    ? reduce_time(in->hw, n, rest)
                                  : dw_plan_coll_time(in->hw, DW_COLL_ALLREDUCE, n, 1, rest);
    *all = full * one + tail;
    *last = rest > 0 ? tail : one; /* the pool's first floats: the bucket cut last */
}

void dw_plan_runtime_dp(const dw_plan_in *in, const dw_par *par, double engine_opt, double bwd, bool overlap,
                        double *all, double *exposed, double *opt) {
    *all = *exposed = 0, *opt = engine_opt;
    if (par->dp <= 1) return;
    dw_param_counts pc;
    dw_plan_params(in, &pc);
    const double bytes = 4.0 * pc.total;
    const int64_t n = par->dp;
    double red, last;
    reduce_once(in, n, par->zero, bytes, &red, &last);
    const double hidden_per = overlap ? fmax(0, fmin(red - last, bwd)) : 0; /* under one backward */
    const double times = par->zero >= 2 ? (double)par->grad_accum : 1.0;
    *all = times * red, *exposed = times * (red - hidden_per);
    if (par->zero == 3) {
        dw_engine_zero3 z;
        if (dw_plan_engine_zero3(NULL, in, par, &z) == DW_OK) /* else memory.c cannot price it either */
            *all += (double)par->grad_accum * z.gather_s,
                *exposed += (double)par->grad_accum * ((overlap ? z.gather_exposed_s : z.gather_s) + z.cast_s);
        *opt = engine_opt / (double)n;
    } else if (par->zero) {
        const double ag = dw_plan_coll_time(in->hw, DW_COLL_ALLGATHER, n, 1, bytes);
        *all += ag, *exposed += ag;
        *opt = engine_opt / (double)n; /* each rank's AdamW over its shard */
    }
}
