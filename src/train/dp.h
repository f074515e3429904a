/* dp.h — private: data parallelism for the trainer (train/dp.c): every rank holds the whole model,
 * reads its own part of each global batch (train/data.c dw_data_next_rank) and, after backward,
 * the ranks' gradients are averaged so that every rank takes the same optimizer step.
 *   ZeRO-0: gradients all-reduced (averaged) in buckets, then the engine's own AdamW step.
 *   ZeRO-1: gradients reduce-scattered (averaged); each rank runs AdamW on its shard of the flat
 *           parameter pools (global gradient norm from the shards' sums of squares); the updated
 *           weights all-gathered. The moments are current only in the rank's shard until
 *           dw_dp_gather_optimizer (before a checkpoint), so checkpoints are the same files as one
 *           rank writes and resume on any number of ranks and any stage.
 *   ZeRO-2: as ZeRO-1, but the gradients are reduce-scattered after every micro-batch (each rank's
 *           loss gradient scaled by 1/ranks, the shards summed) and everything outside the rank's
 *           shard is cleared, so only the shard accumulates over the micro-batches.
 * The engine's pools are not yet shard-sized (the compile's memory plan allocates them whole):
 * ZeRO-1 here is the algorithm and its communication, not yet its memory saving. Not the
 * communicator (comm/). */
#ifndef DW_TRAIN_DP_H
#define DW_TRAIN_DP_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "deepwell.h"

typedef struct {
    dw_ctx *ctx;
    dw_engine *eng;
    dw_comm *comm;        /* the engine's memory (nccl on a GPU) */
    dw_comm *host;        /* host values: losses, flags, norms */
    int rank, world;
    int zero;             /* 0, 1 or 2 */
    int64_t floats;       /* of one parameter-shaped pool */
    int64_t block;        /* ZeRO-1/2: floats per rank reduce-scattered, a multiple of 64; the tail
                             [world x block, floats) is all-reduced and owned by the last rank */
    int64_t lo, hi;       /* ZeRO-1/2: this rank's shard of the pools */
} dw_dp;

/* The job's communicator for the engine's device and the shard ranges. zero 3: DW_ERR_UNSUPPORTED
 * naming the stage. One rank: everything below is the single-process path. */
dw_status dw_dp_init(dw_dp *d, dw_engine *e, int zero);
/* Rank 0's FP32 masters to every rank (the start of a run, fresh or resumed), then the derived
 * copies refreshed: the ranks start identical whatever their seeds. */
dw_status dw_dp_broadcast_weights(dw_dp *d);
/* The optimizer step after the accumulation: the gradients averaged over the ranks (ZeRO-0:
 * all-reduce in buckets; ZeRO-1: reduce-scatter; ZeRO-2: done per micro-batch), clipping by the global norm, AdamW; *norm is
 * the global gradient norm before clipping (DW_ERR_NUMERIC, weights unchanged, when not finite). */
dw_status dw_dp_step(dw_dp *d, const dw_adamw_opts *o, int64_t step, double *norm);
/* The loss-gradient scale of each of the step's `accum` micro-batches: 1/accum (ZeRO-2: 1/(accum
 * x ranks), since the ranks' shards are summed). */
double dw_dp_grad_scale(const dw_dp *d, int64_t accum);
/* After each micro-batch's backward: ZeRO-2 reduces the gradients into the ranks' shards and
 * clears the rest; the other stages do nothing here. */
dw_status dw_dp_after_backward(dw_dp *d);
/* ZeRO-1/2: every rank's shard of the moments to every rank (before a checkpoint). */
dw_status dw_dp_gather_optimizer(dw_dp *d);
/* The debug check that the ranks' weights are identical: a hash of the FP32 masters compared with
 * rank 0's; DW_ERR_NUMERIC naming the first rank that differs. */
dw_status dw_dp_check_weights(dw_dp *d, int64_t step);

#endif /* DW_TRAIN_DP_H */
