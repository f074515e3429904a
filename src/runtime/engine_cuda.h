/* engine_cuda.h — private to runtime/: the CUDA engine's entry points, called by the engine
 * functions of engine_cpu.c / engine_weights.c when e->cuda is set (one code path for callers).
 * The state itself is in engine_cuda.c; its helper kernels are in engine_cuda_kern.{h,cu}. In a build without CUDA these are stubs (create refuses). */
#ifndef DW_RUNTIME_ENGINE_CUDA_H
#define DW_RUNTIME_ENGINE_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/engine.h"

struct dw_engine_cuda;
void dw_engine_cuda_free(struct dw_engine_cuda *c);
dw_status dw_engine_cuda_upload(dw_engine *e);               /* host mirrors -> device */
dw_status dw_engine_cuda_download(dw_engine *e, bool grads); /* device -> host mirrors */
void dw_engine_cuda_zero_grad(dw_engine *e);
dw_status dw_engine_cuda_forward(dw_engine *e, const int32_t *tokens, const int32_t *targets,
                                 int64_t B, int64_t T, float *logits, double *loss);
dw_status dw_engine_cuda_forward_backward(dw_engine *e, const int32_t *tokens,
                                          const int32_t *targets, int64_t B, int64_t T,
                                          double grad_scale, double *loss);
dw_status dw_engine_cuda_adamw(dw_engine *e, double lr, double beta1, double beta2, double eps,
                               double wd, double clip, int64_t step, double *grad_norm);
const dw_compiled *dw_engine_cuda_plan(const dw_engine *e);
dw_status dw_engine_cuda_moments(dw_engine *e, int i, float *m, float *v, bool to_device);

/* Profiling (`deepwell bench step --profile`): one training step run eagerly with a CUDA event
 * around every schedule step; fills out[i] for node i (its name, op and forward / backward
 * milliseconds; cross-entropy's backward is fused into its forward). *n_nodes: the node count;
 * at most `cap` entries are written. A captured graph stays valid (same buffers). */
typedef struct {
    const char *name;
    int op; /* dw_op */
    float fwd_ms, bwd_ms;
} dw_engine_prof;
dw_status dw_engine_cuda_profile_step(dw_engine *e, const int32_t *tokens, const int32_t *targets,
                                      int64_t B, int64_t T, double grad_scale, dw_engine_prof *out,
                                      int cap, int *n_nodes);

/* The optimizer step's phases, timed (`deepwell bench step --profile`): `reps` eager optimizer
 * steps with the given AdamW arguments (they change the weights and moments as real steps do),
 * a CUDA event between phases; ms[] gets the mean of each: zero_grad's memset, the gradient norm,
 * AdamW, the BF16 working copy, the quantised weights' cache. */
enum { DW_OPT_PHASE_ZERO, DW_OPT_PHASE_NORM, DW_OPT_PHASE_ADAMW, DW_OPT_PHASE_BF16, DW_OPT_PHASE_WCACHE,
       DW_OPT_PHASES };
extern const char *const dw_opt_phase_names[DW_OPT_PHASES];
dw_status dw_engine_cuda_profile_optimizer(dw_engine *e, double lr, double beta1, double beta2, double eps,
                                           double wd, double clip, int reps, double ms[DW_OPT_PHASES]);

#endif /* DW_RUNTIME_ENGINE_CUDA_H */
