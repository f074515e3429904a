/* metrics.h — private: DIR/metrics.jsonl, one JSON object per optimizer step. A resumed run
 * keeps the lines up to the step it resumes from and appends after them. */
#ifndef DW_TRAIN_METRICS_H
#define DW_TRAIN_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "deepwell.h"

/* Opens dir/metrics.jsonl for appending; keeps only lines with "step" <= keep_upto (a fresh run
 * passes 0: the file starts empty). The rewrite is atomic. */
dw_status dw_metrics_open(dw_ctx *ctx, const char *dir, int64_t keep_upto, FILE **out);
/* The same for dir/name, any JSON-lines file whose objects carry "step" in increasing order
 * (the guardrails' quant_stats.jsonl and precision_decisions.jsonl). */
dw_status dw_jsonl_open(dw_ctx *ctx, const char *dir, const char *name, int64_t keep_upto, FILE **out);
/* {"step", "loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s", "tokens"[, "val_loss"][,
 * "moe_aux_loss", "moe_z_loss" (null: not configured), "expert_load"][, "skipped": "nonfinite
 * loss" | "nonfinite grad" (the step changed nothing: train/guard.h)][, "quant_overflow",
 * "quant_underflow": the step's quantiser counters (quantised layers)][, "precision_change": the
 * layers switched to BF16 after this step (dw_train_progress.precision_change)][, "comm_s" and
 * "exposed_comm_s": several ranks' communication seconds, arrays indexed by rank]};
 * floating-point values with 17 significant digits (exact round trip). */
dw_status dw_metrics_write(dw_ctx *ctx, FILE *f, const dw_train_progress *p, int64_t tokens_seen);

#endif /* DW_TRAIN_METRICS_H */
