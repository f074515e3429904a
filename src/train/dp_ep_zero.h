/* dp_ep_zero.h — private: ZeRO-1 with expert parallelism (--ep K on W ranks, R = W / K replicas of
 * each expert group; dp.h). The flat pools are cut into cells, each one rank's share of one space:
 *   the dense space: every float outside the expert parameters (padding included), in pool order,
 *     sharded over all W ranks (compile/shard.h dw_shard_range on its length);
 *   group j's space: slice j of every expert parameter (experts [j E/K, (j+1) E/K), train/ep.h), in
 *     pool order, sharded over the R ranks holding those experts (world ranks q K + j, q < R).
 * A rank's optimizer pool holds the moments of its cells alone (runtime/exec.h segments): about
 * dense / W + experts / W floats. Its dense cells are reduced to it over every rank and its expert
 * cells over the replicas only (the others computed no gradient there), stepped by it, and
 * broadcast back over the same ranks; other groups' experts go stale until dw_dp_gather_experts
 * (a checkpoint, the weight check, a sample). Not ZeRO-0's expert step (dp_experts.c). */
#ifndef DW_TRAIN_DP_EP_ZERO_H
#define DW_TRAIN_DP_EP_ZERO_H

#include <stdint.h>

#include "deepwell.h"
#include "kernels/adamw_args.h"
#include "train/dp_state.h"
#include "train/ep.h"

/* One cell: pool floats [begin, end) of space j (-1: dense, else expert group j), part `part` of
 * that space's shard, held by world rank `rank` (dense: part; group j: part x K + j). */
typedef struct dw_dp_cell {
    int64_t begin, end;
    int j, part, rank;
} dw_dp_cell;

/* The cells of a pool of `floats` floats with n expert parameters pr (each [off, off + numel),
 * numel a multiple of k, inside the pool, disjoint) over `world` ranks in groups of k: *out (owned,
 * by begin, tiling [0, floats)) and their count, or -1 when out of memory. Pure arithmetic. */
int dw_dp_ep_cells(int64_t floats, const dw_ep_param *pr, int n, int world, int k, dw_dp_cell **out);
/* The floats rank `rank` holds of cells c (n): its optimizer pool's length. */
int64_t dw_dp_ep_cells_held(const dw_dp_cell *c, int n, int rank);

/* --ep with ZeRO-0 or 1 (dp_experts.c dw_dp_set_experts calls it, after the replicas' communicator
 * is split): the cells (ZeRO-0: for its checkpoint's layout alone); ZeRO-1 also the optimizer pool
 * replaced by this rank's cells' moments (zeroed; before moments are loaded) and the collectives'
 * room, and logs the floats held against the world shard's; DW_ERR_UNSUPPORTED naming --ep and
 * --zero where a rank would hold no cell. */
dw_status dw_dp_ep_zero_init(dw_dp *d, const dw_ep *ep);
/* Bucket i's collectives: each cell part a reduce (averaged over the job) to its holder, dense over
 * every rank, this rank's group over the replicas, other groups none. */
dw_status dw_dp_ep_zero_start_bucket(dw_dp *d, int i);
/* The step: the global norm from every rank's cells, AdamW on this rank's, then each cell broadcast
 * from its holder (dense over every rank, experts over the replicas) and the derived copies
 * refreshed. */
dw_status dw_dp_ep_zero_step(dw_dp *d, const dw_adamw_opts *o, int64_t step, double *norm);

#endif /* DW_TRAIN_DP_EP_ZERO_H */
