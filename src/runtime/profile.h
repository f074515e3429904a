/* profile.h — private: per-op time breakdown of a training step (`deepwell bench step
 * --profile`, `deepwell train --profile`): eager steps with a timer between every step of the
 * program (engine.h dw_engine_time_steps: CUDA events, or the host clock on the CPU), summed per
 * op kind and per node role ("h.#.attn.c_proj"), forward and backward apart, sorted by time. Not
 * a tracer: one aggregate table, no timeline. */
#ifndef DW_RUNTIME_PROFILE_H
#define DW_RUNTIME_PROFILE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "deepwell.h"

typedef struct {
    char key[96]; /* "attention bwd" (per op) or "h.#.attn.c_proj fwd" (per role) */
    double ms;    /* mean over the timed steps */
} dw_prof_row;

typedef struct {
    dw_prof_row *ops, *roles; /* sorted by ms, largest first */
    int n_ops, n_roles;
    double total_ms;          /* one eager step: the sum of all rows of either table */
    int steps;                /* steps timed (after one untimed warm-up) */
} dw_prof_summary;

/* Runs 1 + steps eager training steps of (tokens, targets) [B, T] and fills s with the mean of
 * the timed ones. Gradients accumulate into the engine's buffers (call it when they are not
 * needed, or zero them after). */
dw_status dw_prof_run(dw_ctx *ctx, dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B,
                      int64_t T, int steps, dw_prof_summary *s);
void dw_prof_free(dw_prof_summary *s);

/* The two tables, at most `top` rows each (0: all), as aligned text. */
void dw_prof_print(FILE *f, const dw_prof_summary *s, int top);
/* Writes {"steps": n, "step_ms": t, "per_op": [{"name", "ms", "share"}...], "per_role": [...]}
 * to path atomically. */
dw_status dw_prof_write_json(dw_ctx *ctx, const dw_prof_summary *s, const char *path);
/* Reads what dw_prof_write_json wrote (errors name the file and the field). */
dw_status dw_prof_read_json(dw_ctx *ctx, const char *path, dw_prof_summary *s);
/* The same two arrays as JSON text fragments ("per_op": [...], "per_role": [...]) on f, for
 * callers that print a larger JSON object (bench step --json). */
void dw_prof_print_json_fields(FILE *f, const dw_prof_summary *s);

/* The optimizer step outside the forward/backward: zero_grad, then the program's optimizer steps
 * summed per kind (gradient norm, AdamW, BF16 copy, weight cache), each the mean of `reps` eager
 * optimizer steps with timers between them. The weights and moments change as in real steps
 * (bench step runs it last). */
#define DW_PROF_OPT_ROWS 8
typedef struct {
    const char *name[DW_PROF_OPT_ROWS];
    double ms[DW_PROF_OPT_ROWS];
    int n;
    double total_ms;
} dw_prof_opt;
dw_status dw_prof_optimizer(dw_ctx *ctx, dw_engine *e, int reps, dw_prof_opt *o);
/* Text: one table; JSON: the field "optimizer": [{"name", "ms"}...] (no trailing comma). */
void dw_prof_print_optimizer(FILE *f, const dw_prof_opt *o, bool json);

#endif /* DW_RUNTIME_PROFILE_H */
