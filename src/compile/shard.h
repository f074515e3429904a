/* shard.h — private: ZeRO's cut of the flat parameter pools (params.c) over the ranks of a
 * data-parallel job, and the bytes each rank's pools take under a stage. One rule, read by the
 * runtime (train/dp.c shards and allocates by it: runtime/exec.c dw_exec_shard_optimizer) and by
 * the planner (plan/runtime_dp.c prices memory by it), so report and allocation cannot drift. */
#ifndef DW_COMPILE_SHARD_H
#define DW_COMPILE_SHARD_H

#include <stdint.h>

#include "compile/program.h"

enum { DW_SHARD_ALIGN = 64 }; /* floats: shards start on 256-byte boundaries, as parameters do */

/* Rank `rank` of `world`'s range [lo, hi) of a pool of `floats` floats: blocks of
 * floats / (world x 64) x 64 floats in rank order, the last rank's reaching the end (it also holds
 * the tail of fewer than world x 64 floats). */
void dw_shard_range(int64_t floats, int world, int rank, int64_t *lo, int64_t *hi);

/* The floats of the largest shard (the last rank's): what every rank's sharded pool is planned at. */
int64_t dw_shard_max_floats(int64_t floats, int world);

/* The bytes of each pool one rank allocates, from the whole pools' bytes `whole` (a program's
 * pool_bytes, param_floats parameter floats) under ZeRO stage `zero` over `world` ranks, as the
 * engine allocates them when made for that stage (runtime/engine.c, dw_engine_opts.zero):
 *   ZeRO-0: the whole pools;
 *   ZeRO-1: the optimizer pool (AdamW m and v, 8 bytes a float) for the largest shard only. The
 *     FP32 masters stay whole (the forward reads them: every non-linear op, and the quantised
 *     weights converted on use), and so do the gradients (each rank accumulates all of them);
 *   ZeRO-2/3: the gradient pool too, 4 bytes a float of the largest shard: the shard's
 *     accumulator. The backward writes through the staging slots of compile/grad_stage.h, which
 *     train/dp_stage.c allocates beside it (the planner adds dw_grad_stage_bytes).
 * out may be whole. */
void dw_shard_pool_bytes(const int64_t whole[DW_POOL_COUNT], int64_t param_floats, int world, int zero,
                         int64_t out[DW_POOL_COUNT]);

#endif /* DW_COMPILE_SHARD_H */
