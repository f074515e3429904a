/* optstate.h — private: AdamW state (first and second moments, FP32, one pair per parameter)
 * for a list of parameters, the optimizer step over all of them (global-norm clipping, decay on
 * dw_param.decay only), and its safetensors file. Host memory: the CPU engine's optimizer; with
 * the CUDA engine only the staging of the device's moments for checkpoints. */
#ifndef DW_TRAIN_OPTSTATE_H
#define DW_TRAIN_OPTSTATE_H

#include <stdint.h>

#include "deepwell.h"
#include "runtime/engine.h"
#include "train/optim.h"

typedef struct dw_optim dw_optim;

/* params: n borrowed pointers that must outlive the optimizer. m and v start at zero. */
dw_status dw_optim_create(dw_ctx *ctx, dw_param *const *params, int n, dw_optim **out);
void dw_optim_free(dw_optim *o);

/* The host arrays of parameter i's moments (numel floats each): the CUDA trainer stages the
 * device's moments here for checkpoints (dw_engine_adamw_moments). */
void dw_optim_moments(dw_optim *o, int i, float **m, float **v);
/* Global L2 norm of all gradients (double accumulation). */
double dw_optim_grad_norm(const dw_optim *o);
/* One AdamW step t (1-based) on every parameter with gradients multiplied by grad_scale (the
 * clipping factor). */
void dw_optim_step(dw_optim *o, const dw_adamw_hparams *h, int64_t t, double grad_scale);

/* optimizer.safetensors: NAME.exp_avg and NAME.exp_avg_sq (F32, the parameter's shape in
 * Deepwell's layout) for every parameter NAME, metadata deepwell.optimizer = "adamw". */
#define DW_OPTIM_M_SUFFIX ".exp_avg"
#define DW_OPTIM_V_SUFFIX ".exp_avg_sq"
dw_status dw_optim_save(dw_ctx *ctx, const dw_optim *o, const char *path);
/* Checks every tensor (present, F32, shape) before copying any: on error nothing changed. */
dw_status dw_optim_load(dw_ctx *ctx, dw_optim *o, const char *path);

#endif /* DW_TRAIN_OPTSTATE_H */
