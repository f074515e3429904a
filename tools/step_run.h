/* step_run.h — run an engine for a few training steps and measure them: the step time (warm-up
 * excluded) and the device memory the engine takes. Shared by `deepwell bench step` and
 * `deepwell dryrun --run`; not a benchmark report of its own (callers print). Public API only. */
#ifndef DW_TOOLS_STEP_RUN_H
#define DW_TOOLS_STEP_RUN_H

#include <stdint.h>

#include "deepwell.h"

typedef struct {
    int64_t micro_batch, seq; /* batch shape B x T (at most the program's) */
    int64_t grad_accum;       /* micro-batches per optimizer step (>= 1), grad_scale 1/grad_accum */
    long warmup;              /* untimed steps (>= 2 lets the CUDA graph be captured) */
    long steps;               /* timed steps (>= 1) */
} dw_step_run_opts;

typedef struct {
    double *times;            /* (steps) seconds per optimizer step, in run order */
    double *fwd_bwd;          /* (steps) of which forward_backward (all micro-batches) */
    double mean, median, min, fb_median;
    double loss_first, loss_last;
    /* cudaMemGetInfo on the engine's device: `context` = total - free just before the engine is
     * created (the CUDA context and anything else already resident); `engine` = free before
     * creation - the least free seen after creation and after every step (the engine's pools,
     * the GEMM layer's cuBLASLt workspace, CUDA-graph and lazily loaded kernel memory). */
    int64_t mem_context, mem_engine, mem_total;
    int64_t pools;            /* the allocator's view: sum of the compiled plan's five pools */
    const char *why;          /* a failure of the measurement itself (no library message), or NULL */
} dw_step_run_result;

/* Creates the engine for program c on ctx (a CUDA context), initialises the weights, runs
 * warmup + steps optimizer steps (zero_grad; grad_accum x forward_backward on random tokens
 * with the loss read back; AdamW lr 3e-4, betas 0.9/0.95, wd 0.1, clip 1.0), and fills *r.
 * With keep non-NULL the engine is handed back (caller dw_engine_free; c must outlive it), else
 * freed. Free r with dw_step_run_result_free. */
dw_status dw_step_run(dw_ctx *ctx, const dw_compiled *c, const dw_step_run_opts *o, dw_step_run_result *r,
                      dw_engine **keep);
void dw_step_run_result_free(dw_step_run_result *r);

/* Random tokens (xorshift64 from a fixed seed) of n + 1 entries below vocab: tokens are t[0..n),
 * targets t[1..n]. NULL when out of memory. */
int32_t *dw_step_run_tokens(int64_t n, int64_t vocab);

#endif /* DW_TOOLS_STEP_RUN_H */
