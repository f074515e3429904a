/* dp.h — private: data parallelism for the trainer (train/dp.c): every rank holds the whole model,
 * reads its own part of each global batch (train/data.c dw_data_next_rank) and, after backward,
 * the ranks' gradients are averaged so that every rank takes the same optimizer step.
 *   Buckets: the flat gradient pool cut into buckets of DW_DP_BUCKET_FLOATS floats from its end
 *           (dp_buckets.c); each is reduced as soon as the backward step that last writes its
 *           gradients has run on the step's last micro-batch (every micro-batch for ZeRO-2): the
 *           executor's after_step hook (runtime/exec.h) starts its collectives (comm.h
 *           dw_comm_start; dp_overlap.c) while backward goes on, and all are waited for before the
 *           optimizer. Without overlap (dw_train_opts.no_overlap) the same collectives start, in
 *           the same order, after backward: the same bits.
 *   ZeRO-0: each bucket all-reduced (averaged), then the engine's own AdamW step.
 *   ZeRO-1: each bucket's part in rank r's shard reduced (averaged) to rank r; each rank runs
 *           AdamW on its shard of the flat parameter pools (global gradient norm from the shards'
 *           sums of squares); the updated weights all-gathered. The moments exist only for the
 *           rank's shard: each rank writes its own range into the checkpoint (ckpt_shard_io.c),
 *           which resumes on any number of ranks and any stage.
 *   ZeRO-2: as ZeRO-1, but the buckets are reduced after every micro-batch (each rank's loss
 *           gradient scaled by 1/ranks, the shards summed). An engine made for it holds only its
 *           shard's gradients: the backward writes through staging slots (dp_stage.c), each
 *           bucket's reduction added into the shard before its slot serves a later bucket. An
 *           engine made whole (dw_engine_opts.zero unset) writes the whole pool in place and
 *           everything outside the rank's shard is cleared after each micro-batch.
 *   ZeRO-3: as ZeRO-2, and the weights sharded: each parameter gathered before the first step of
 *           each sweep that reads it (dp_zero3.c), a sample's forwards too (on every rank); a
 *           checkpoint's weights gathered into rank 0's host memory. An engine made for it holds
 *           only its shard of the masters from creation (no BF16 copies: each made in its gather
 *           slot).
 * Memory (ZeRO-1/2/3): the engine's optimizer pool holds the moments of the rank's shard alone,
 * from its creation when made for the stage (runtime/engine.c dw_engine_opts.zero), else cut here
 * (runtime/exec.h dw_exec_shard_optimizer); sized by compile/shard.h as the planner reports it.
 * The FP32 masters stay whole under ZeRO-1/2 (the forward reads them; ZeRO-3 keeps its shard and
 * a gather block, from creation when made for it); the gradients are whole under ZeRO-1 and the shard plus the staging slots
 * (compile/grad_stage.h) under ZeRO-2/3. Not the communicator (comm/). */
#ifndef DW_TRAIN_DP_H
#define DW_TRAIN_DP_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "deepwell.h"
#include "kernels/adamw_args.h"

#include "train/dp_state.h"

/* The buckets of a program's pools in the order they start (dw_dp_buckets): cut every
 * bucket_floats (rounded up to 64) from the end (dp_buckets.c). */
dw_status dw_dp_buckets_plan(dw_ctx *ctx, const dw_compiled *p, int64_t bucket_floats, dw_dp_buckets *out);
void dw_dp_buckets_free(dw_dp_buckets *b);
/* DW_DP_BUCKET_FLOATS, or the default for ZeRO stage `zero` (compile/grad_stage.h: 256 MiB, 16 MiB
 * under ZeRO-2/3); DW_ERR_INVALID naming it when not a positive count. */
dw_status dw_dp_bucket_floats(dw_ctx *ctx, int zero, int64_t *out);

/* The job's communicator for the engine's device, the buckets and their shards; overlap: the
 * reductions start from backward (several ranks: the executor's after_step hook is attached and
 * its recording turned off, as the collectives run between its steps); ZeRO-1/2/3 on several
 * ranks: the engine's optimizer pool the shard's (made so, dw_engine_opts.zero, or replaced now,
 * zeroed: call it before moments are loaded; the engine's own step is then refused), ZeRO-2/3 with
 * an engine made for it the gradient staging (dp_stage.c); an engine made for a higher stage, or
 * for another rank's shard: DW_ERR_INVALID; ZeRO-3 also plans its gathers (dp_zero3.c; a program
 * that quantises linear layers: DW_ERR_UNSUPPORTED naming it). One rank: everything below is the
 * single-process path. */
dw_status dw_dp_init(dw_dp *d, dw_engine *e, int zero, bool overlap);
/* Detaches the hooks and frees the buckets (the communicator is the job's). */
void dw_dp_free(dw_dp *d);
/* Rank 0's FP32 masters to every rank (the start of a run, fresh or resumed), then the derived
 * copies refreshed: the ranks start identical whatever their seeds. */
dw_status dw_dp_broadcast_weights(dw_dp *d);
/* The optimizer step after the accumulation (the gradients already averaged by
 * dw_dp_after_backward): clipping by the global norm, AdamW (ZeRO-1/2: on the rank's shards, the
 * weights gathered after; ZeRO-3: on the shard, nothing gathered); *norm is the global gradient norm before clipping (DW_ERR_NUMERIC,
 * weights unchanged, when not finite). */
dw_status dw_dp_step(dw_dp *d, const dw_adamw_opts *o, int64_t step, double *norm);
/* The loss-gradient scale of each of the step's `accum` micro-batches: 1/accum (ZeRO-2/3: 1/(accum
 * x ranks), since the ranks' shards are summed). */
double dw_dp_grad_scale(const dw_dp *d, int64_t accum);
/* Before each micro-batch's forward and backward: last, whether it is the step's last (ZeRO-3:
 * the weights sharded from the micro-batch's first step on). */
void dw_dp_before_backward(dw_dp *d, bool last);
/* After each micro-batch's backward: when it reduces (the last; ZeRO-2/3: each), every bucket not
 * yet started starts and all are waited for (the time waited is the step's exposed
 * communication); ZeRO-2/3 then clear what lies outside the rank's shard. */
dw_status dw_dp_after_backward(dw_dp *d);
/* This step's communication (several ranks): the gradient collectives' own seconds, and the wall
 * seconds waited for them after backward; both reset. */
void dw_dp_take_times(dw_dp *d, double *comm_s, double *exposed_s);
/* Several ranks: every rank's times of this step (dw_dp_take_times) gathered into p's ranks,
 * comm_s and exposed_comm_s (pointing into d, valid until the next call); one rank: nothing. */
dw_status dw_dp_report_times(dw_dp *d, dw_train_progress *p);
/* --ep K (ep not NULL, several ranks): ZeRO-0 reduces each rank's experts' gradients only among the
 * ranks holding the same experts (a split of the communicator by rank mod K) and steps only them
 * and the dense parameters; ZeRO-1 does the same by cells, each rank holding the moments of its
 * share of the dense floats and of its experts (dp_ep_zero.h); both write their checkpoint's
 * moments by those cells; ZeRO-2 keeps reducing the whole pool (logged); ZeRO-3:
 * DW_ERR_UNSUPPORTED (the expert steps read their weights whole). */
dw_status dw_dp_set_experts(dw_dp *d, const dw_ep *ep);
/* --ep with ZeRO-0: every expert's weights and moments (ZeRO-1: weights) from the first group's owner to every rank,
 * the derived copies refreshed (before a checkpoint, the weight check, what rank 0 runs alone);
 * otherwise nothing (ZeRO-3's samples gather on use: dw_dp_z3_samples_everywhere). Every rank calls it. */
dw_status dw_dp_gather_experts(dw_dp *d);
/* Several ranks (dp_ep_zero.c): this rank's moments into checkpoint dir, and rank 0's the index: by
 * cells when expert parallel with ZeRO-0 or 1 (so both write the same files), else the world shard
 * [lo, hi), every rank's of which (world, 2) rank 0 passes as ranges. */
dw_status dw_dp_write_moments(dw_dp *d, const char *dir, const int64_t *ranges);

/* dp_range.c, for dp.c and dp_experts.c: the sum of squares of gradients [lo, hi) and AdamW over
 * [lo, hi) of the pools with the global norm (decay parameters first in the pools). */
dw_status dw_dp_range_sumsq(dw_dp *d, int64_t lo, int64_t hi, double *out);
dw_status dw_dp_range_adamw(dw_dp *d, const dw_adamw_args *a, double norm, int64_t lo, int64_t hi);
/* dp_experts.c: the optimizer step of --ep with ZeRO-0; bucket i's collectives (its dense parts
 * over every rank, its part of this rank's experts over the replicas). */
dw_status dw_dp_experts_step(dw_dp *d, const dw_adamw_opts *o, int64_t step, double *norm);
dw_status dw_dp_experts_start_bucket(dw_dp *d, int i);

/* dp_zero3.c, for dp.c: ZeRO-3's gather plan and the executor's before_step hook (FP32 and BF16
 * programs; DW_ERR_UNSUPPORTED naming a quantised one), detached and freed by dw_dp_z3_free;
 * dw_dp_z3_train: the next training step runs sharded (the weights' shard kept, the gather block
 * used); dw_dp_z3_whole: the whole weights again on every rank (every rank calls it; ZeRO-3 only,
 * else nothing). dw_dp_gather_pool: every rank's blocks of a pool (ZeRO-1/2/3) to every rank. */
dw_status dw_dp_z3_init(dw_dp *d);
void dw_dp_z3_free(dw_dp *d);
void dw_dp_z3_train(dw_dp *d);
dw_status dw_dp_z3_whole(dw_dp *d);
dw_status dw_dp_gather_pool(dw_dp *d, float *pool);
/* ZeRO-3 sharded (every rank calls it; otherwise nothing): every master gathered, one parameter at
 * a time, into rank 0's host memory for the checkpoint (dw_dp_check_weights calls it), the
 * engine's weights left sharded. dw_dp_save_weights (rank 0): the weights file from that copy
 * when there is one, else the engine's (dw_engine_save_weights). dw_dp_z3_end (every rank, after
 * training): the weights whole again when `whole` is asked or the engine was made whole; an engine
 * made for ZeRO-3 (dw_engine_opts.zero) stays sharded; each rank logs its weights pool at its
 * largest and how often it was made whole. dw_dp_z3_samples_everywhere: ZeRO-3 sharded on several
 * ranks, where a sample's forwards gather each parameter as they reach it, so every rank generates
 * (the same on every rank: call it on all). */
dw_status dw_dp_z3_checkpoint(dw_dp *d);
bool dw_dp_z3_samples_everywhere(const dw_dp *d);
/* dp_zero3_gather.c, for dp_zero3.c: the prefetch's plan (each step's next event step, room for
 * its started broadcasts; DW_Z3_PREFETCH) and its release; before step `step` (the executor's
 * hook): its gathers (prefetched or now) and the next event step's started; settle: a started
 * prefetch waited for (before anything else writes or frees the slots); gather_to: parameter k's
 * parts into slot, run to the end. */
dw_status dw_dp_z3_prefetch_plan(dw_dp *d);
void dw_dp_z3_prefetch_free(dw_dp *d);
dw_status dw_dp_z3_gathers(dw_dp *d, int step);
dw_status dw_dp_z3_settle(dw_dp *d);
dw_status dw_dp_z3_gather_to(dw_dp *d, int k, float *slot);
dw_status dw_dp_save_weights(dw_dp *d, const char *path);
dw_status dw_dp_z3_end(dw_dp *d, bool whole);

/* dp_stage.c, for dp.c and dp_overlap.c: ZeRO-2/3's gradient staging when the engine holds only
 * its shard of the gradients: init plans the slots (compile/grad_stage.h), allocates them and
 * points the executor's grad_at into them; dw_dp_grad_at: where floats from lo of bucket i's
 * gradients are (its slot, else the whole pool); stage_next: before `step`, every bucket whose
 * slot a bucket first written there takes over waited for and added into the shard, the slot
 * zeroed; stage_end (after backward, every reduction waited for): the rest added, the slots
 * zeroed. Each does nothing unless staged. */
dw_status dw_dp_stage_init(dw_dp *d, int64_t bucket_floats);
void dw_dp_stage_free(dw_dp *d);
float *dw_dp_grad_at(const dw_dp *d, int i, int64_t lo);
dw_status dw_dp_stage_next(dw_dp *d, int step);
dw_status dw_dp_stage_end(dw_dp *d);

/* dp_overlap.c, for dp.c: the executor's after_step hook attached (several ranks, overlap on) or
 * detached (recording as the engine's options say again, unless expert parallelism holds it off). */
dw_status dw_dp_overlap_attach(dw_dp *d);
void dw_dp_overlap_detach(dw_dp *d);
/* The debug check that the ranks' weights are identical: a hash of the FP32 masters compared with
 * rank 0's; DW_ERR_NUMERIC naming the first rank that differs. ZeRO-3 sharded: one copy of each
 * weight, nothing to compare; dw_dp_z3_checkpoint gathers them for the checkpoint instead. */
dw_status dw_dp_check_weights(dw_dp *d, int64_t step);

#endif /* DW_TRAIN_DP_H */
