/* engine.h — private: the engine behind deepwell.h's dw_engine_* (engine.c): a backend for the
 * context's device, the executor over the program's pools, and what the trainer, the profiler and
 * the weight I/O (weights.c) need beyond the public calls. */
#ifndef DW_RUNTIME_ENGINE_H
#define DW_RUNTIME_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"
#include "kernels/adamw_args.h"
#include "runtime/exec.h"

struct dw_engine {
    dw_ctx *ctx;
    const dw_compiled *p;
    const dw_graph *g;
    dw_backend *be;
    dw_exec *x;
    dw_engine_opts opts;
    dw_weights_layout layout; /* of the last loaded weights (FUSED when none) */
    bool moe_bias_tensor;     /* the routers' selection bias came with the weights (engine_moe_bias.h) */
    /* grad_arena programs (program.h): the gradients live in the activation pool, so
     * grads_pending: a backward's gradients wait for the step (a second backward is refused);
     * grads_stale: a forward since the last backward took their memory (step and reads refused);
     * grads_zero_due: dw_engine_zero_grad's zeros not written yet (engine_grad_arena.h);
     * bf16_dirty: bf16_arena, a backward or zeros since the last refresh took some BF16 copies */
    bool grads_pending, grads_stale, grads_zero_due, bf16_dirty;
};

/* Re-derives what comes from the FP32 masters (BF16 copies, quantised weight caches) after they
 * changed outside the optimizer, and waits for the device. */
dw_status dw_engine_refresh(dw_engine *e);
/* dw_engine_save_weights (the layout loaded) with the values from `masters`, a host copy of every
 * FP32 master (param_floats floats at the pool offsets): ZeRO-3's checkpoint (train/dp_zero3.c
 * gathers them), whose engine holds a shard. */
dw_status dw_engine_save_weights_host(dw_engine *e, const char *path, const float *masters);
/* Checks B x T against the capacity and every token / target against the vocabulary. */
dw_status dw_engine_check_batch(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T);

/* Tests and debugging: activation tensor t's value (rows b x t of the current batch) as FP32 into
 * out (rows * width floats; int32 tensors converted); DW_ERR_INVALID when the program keeps no
 * value for t. Valid right after the step that wrote it (the arena reuses memory). */
dw_status dw_engine_read_value(dw_engine *e, int t, float *out);
/* dw_engine_forward without logits, with after(user, step) called after each of its steps: where a
 * value is read while it is live — one that recompute drops is gone once the forward ends (the
 * quantisation guard measures the layers' inputs so, train/guard_quant.c; the K/V cache's prefill
 * keeps the keys and values so, kv_cache.c). */
dw_status dw_engine_forward_each(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T,
                                 dw_exec_after_step after, void *user, double *loss);

/* The arguments one AdamW step at `step` (from 1) takes from opts (NULL: defaults), bias
 * corrections included; DW_ERR_INVALID naming every hyper-parameter when one is out of range.
 * dw_engine_step's, and the sharded step's of train/dp.c. */
dw_status dw_engine_adamw_args(dw_engine *e, const dw_adamw_opts *opts, int64_t step, dw_adamw_args *a);
/* Tests: the inverse, in's rows * width floats written as tensor t's value (int32 tensors from
 * whole floats, BF16 programs' tensors rounded to BF16), e.g. to give two engines the same routing. */
dw_status dw_engine_write_value(dw_engine *e, int t, const float *in);

/* Profiling: one eager training step of (tokens, targets) with a timer between every step of the
 * forward and backward phases; ms[s] gets step s's milliseconds (program step numbering; steps of
 * other phases untouched). Gradients accumulate as in a real step. DW_ERR_UNSUPPORTED where the
 * backend has no timers. */
dw_status dw_engine_time_steps(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T,
                               double grad_scale, double *ms);
/* The same for one optimizer step (zeroing the gradients first): ms[s] for the optimizer phase's
 * steps, ms_zero for the zeroing. The weights and moments change as in a real step. */
dw_status dw_engine_time_optimizer(dw_engine *e, const dw_adamw_opts *o, int64_t step, double *ms, double *ms_zero);

#endif /* DW_RUNTIME_ENGINE_H */
