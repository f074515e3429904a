/* ckpt_shard_io.h — private: the AdamW moments of a checkpoint written by several ranks. Rank r
 * writes optimizer-<r>-of-<N>.safetensors: for every parameter that meets its range [lo, hi) of
 * the flat pools, NAME.exp_avg and NAME.exp_avg_sq of that piece (1-D, F32). A rank may hold
 * several ranges (the _ranges calls): a later piece of the same tensor is stored as
 * NAME.exp_avg@BEGIN (ckpt_shard.h dw_ckpt_piece_name), which its index entry names ("tensor").
 * Rank 0 writes optimizer.safetensors.index.json, the global layout: every moment tensor's shape
 * and which shard holds which range of its elements (ckpt_shard.h). Loading reads each tensor's ranges from
 * whichever shards hold them, so any world size and ZeRO stage resumes any other. Not the
 * directory's atomicity (ckpt.c) nor the weights (rank 0's model.safetensors, as one rank's). */
#ifndef DW_TRAIN_CKPT_SHARD_IO_H
#define DW_TRAIN_CKPT_SHARD_IO_H

#include <stdint.h>

#include "deepwell.h"

/* This rank's shard file into dir: the moments in [lo, hi) of the pools; _ranges: in each of its
 * n_ranges ranges (n_ranges, 2) = [lo, hi), whose moments the engine holds. */
dw_status dw_ckpt_shard_write(dw_engine *e, const char *dir, int rank, int world, int64_t lo, int64_t hi);
dw_status dw_ckpt_shard_write_ranges(dw_engine *e, const char *dir, int rank, int world, int n_ranges,
                                     const int64_t *ranges);

/* The index into dir, from every rank's range of the pools: ranges (world, 2) = [lo, hi) per rank
 * (zero: the stage, recorded for people); _ranges: n_ranges ranges (n_ranges, 2), range i held by
 * rank[i], tiling the pools (several a rank, any order). */
dw_status dw_ckpt_index_write(dw_engine *e, const char *dir, int world, int zero, const int64_t *ranges);
dw_status dw_ckpt_index_write_ranges(dw_engine *e, const char *dir, int world, int zero, int n_ranges,
                                     const int *rank, const int64_t *ranges);

/* The moments of checkpoint directory cdir (opened by dw_ckpt_open, which checked that state.json
 * lists the index's `world` shards and their sizes and CRC-32s), those the engine holds: all, or
 * under ZeRO-1/2 its shard's range (runtime/exec.h dw_exec_moments). The index is checked against the model (every parameter's two moments, their shapes, pieces that tile each
 * exactly once) and every piece against its shard (present, F32, the recorded size) before
 * anything is uploaded; errors name the file and the tensor. */
dw_status dw_ckpt_shards_load(dw_engine *e, const char *cdir);

#endif /* DW_TRAIN_CKPT_SHARD_IO_H */
