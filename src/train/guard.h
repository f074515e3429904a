/* guard.h — private: the trainer's run-time guardrails (docs/precision.md, "Guardrails").
 *   guard.c:       a step whose loss or gradient norm is not finite is skipped (weights and
 *                  optimizer state untouched); --max-skips consecutive ones stop the run.
 *   guard_quant.c: every K steps the relative error, overflow and underflow of each quantised
 *                  GEMM input, dy and dy^T from the step's own backward (DIR/quant_stats.jsonl);
 *                  a layer over its threshold for M checks in a row switches to BF16 for the rest
 *                  of the run (DIR/precision_decisions.jsonl, replayed on resume); so does a layer
 *                  whose counted overflow or underflow fraction is over its maximum in N steps in
 *                  a row (dw_qcount_rule).
 *   guard_counts.c: the quantisers' overflow and underflow counters, read once per step.
 *   guard_state.c: the guardrails' own keys of a checkpoint's state.json, read back.
 * Every rank decides alike: the inputs to each decision are all-reduced first. */
#ifndef DW_TRAIN_GUARD_H
#define DW_TRAIN_GUARD_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "core/json.h"
#include "deepwell.h"
#include "precision/quant_counts.h"

/* ---- non-finite steps (guard.c) ---------------------------------------------------------------- */
/* Why a step with this (rank-averaged) loss and global gradient norm is skipped: "nonfinite loss",
 * "nonfinite grad", or NULL (it is not). */
const char *dw_guard_nonfinite(double loss, double norm);

typedef struct {
    int64_t max_skips;   /* the run stops at this many skips in a row (0 like 1: at the first) */
    int64_t consecutive; /* skipped steps since the last applied one (this process's run) */
    int64_t total;       /* skipped steps of this process's run */
} dw_guard_skips;

/* Counts step `step` as skipped (why) or applied (why NULL); logs a skip on stderr. True when the
 * run must stop: max_skips skips in a row. */
bool dw_guard_count(dw_guard_skips *g, int64_t step, const char *why, double loss, double norm);

/* ---- quantised layers (guard_quant.c) ---------------------------------------------------------- */
typedef struct dw_qguard dw_qguard;

/* The counters' fallback rule (dw_train_opts.quant_overflow_max, quant_underflow_max,
 * quant_counts_after): a maximum fraction per counter (negative: off) and the steps in a row
 * (0: off). */
typedef struct {
    double overflow_max, underflow_max;
    int64_t after;
} dw_qcount_rule;

/* The guard of engine e's quantised linear layers (*out NULL when no layer is quantised). every:
 * steps between checks (0: none); after: checks in a row over the threshold before a layer falls
 * back (0: statistics only). The thresholds: the policy's "max_rel_error", else
 * dw_qstats_default_threshold. lead (rank 0) writes dir/quant_stats.jsonl and
 * dir/precision_decisions.jsonl, keeping the lines up to resumed_step (0: a fresh run); every rank
 * re-applies the kept decisions, so a resumed run keeps its fallbacks whatever every and after. */
dw_status dw_qguard_open(dw_ctx *ctx, dw_engine *e, dw_comm *host, bool lead, const char *dir, int64_t every,
                         int64_t after, int64_t check_elements, const dw_qcount_rule *rule, int64_t resumed_step,
                         dw_qguard **out);
void dw_qguard_free(dw_qguard *g);
/* Whether step `step` is a check step. */
bool dw_qguard_due(const dw_qguard *g, int64_t step);
/* The check after optimizer step `step`: a forward of the micro-batch (tokens, targets) (B, T)
 * with the updated weights, each quantised input measured, with dy and dy^T as the step's
 * backward measured them, the sums all-reduced, written, and the fallbacks due applied.
 * *changed: a layer fell back (its recipe is now bf16). */
dw_status dw_qguard_check(dw_qguard *g, int64_t step, const int32_t *tokens, const int32_t *targets, int64_t B,
                          int64_t T, bool *changed);
/* "L1 w 0.86 > 0.25, L2 overflow x 0.3% > 0.1% for 3 steps": the layers that fell back after the
 * last step that changed any (its check and its counters' rule), or NULL. Owned by g. */
const char *dw_qguard_last_decisions(const dw_qguard *g);
/* A rollback to the checkpoint of step `step` (train/spike.h): the layers that fell back after it
 * run their compiled recipe again (the caller loads the checkpoint's weights after this, which
 * refreshes their weight caches), every count of checks in a row starts again at 0, and the
 * lead's two files keep their lines up to `step`. */
dw_status dw_qguard_rewind(dw_qguard *g, const char *dir, int64_t step);

/* After optimizer step `step` (every rank, every step, a skipped one too; after its check): the
 * quantisers' counters read back and zeroed, this step's overflows and underflows summed over
 * the layers and ranks into *overflow, *underflow (-1 both when g is NULL: nothing counted); the
 * counters' rule applied (*fell: a layer fell back by it, recorded as the check's are); on a
 * check step rank 0 writes each layer's sums since the last one to quant_stats.jsonl; and the next
 * step's backward measures dy when that step is a check step (unrecorded: recorded steps are
 * dropped and recording waits until the check is done). */
dw_status dw_qguard_step_end(dw_qguard *g, int64_t step, int64_t *overflow, int64_t *underflow, bool *fell);

/* ---- the counters behind it (guard_counts.c; precision/quant_counts.h) --------------------------- */
typedef struct dw_qcounter dw_qcounter;
/* A zeroed counter block in e's backend memory for the n linear nodes `nodes` (borrowed, layer i =
 * nodes[i]), attached to e's executor; a check step's dy statistics sample past cap elements. */
dw_status dw_qcounter_open(dw_ctx *ctx, dw_engine *e, const int *nodes, int n, int64_t cap, dw_qcounter **out);
void dw_qcounter_free(dw_qcounter *q);
dw_qcounts *dw_qcounter_counts(dw_qcounter *q);
/* Reads the block back, zeroes it, folds the reused x copies' counts into the layers that reused
 * them, adds it to the layers' sums; the step's totals over the ranks. */
dw_status dw_qcounter_read(dw_qcounter *q, dw_comm *host, int64_t *overflow, int64_t *underflow);
/* The last read's counters per layer, (n_layers, DW_QC_KINDS, DW_QC_WORDS), summed over the ranks
 * into out. */
dw_status dw_qcounter_step_all(dw_qcounter *q, dw_comm *host, int64_t *out);
/* The sums all-reduced and (f not NULL) written as step `step`'s lines, three per layer (none for
 * a layer with skip[i] whose sums are all 0); then reset. */
dw_status dw_qcounter_write(dw_qcounter *q, dw_comm *host, FILE *f, int64_t step, const bool *skip);
void dw_qcounter_reset(dw_qcounter *q);
/* Layer `layer` (of the n) reuses no x copy from now on: it runs BF16 (its x counts would take a
 * sibling's otherwise, until it is issued again). */
void dw_qcounter_forget(dw_qcounter *q, int layer);
/* A rollback: the sums reset and the block zeroed. */
dw_status dw_qcounter_discard(dw_qcounter *q);
/* dy measured by the backward from now on (on) or not, its accumulators zeroed. */
void dw_qcounter_arm_dy(dw_qcounter *q, bool on);

/* ---- the guardrails' keys of a checkpoint's state.json (guard_state.c) ------------------------- */
/* *out: the member `key` of cdir/state.json (a new reference, json_decref it), NULL when absent. */
dw_status dw_guard_state_key(dw_ctx *ctx, const char *cdir, const char *key, json_t **out);

#endif /* DW_TRAIN_GUARD_H */
