/* engine_cpu.h — private to runtime/: the CPU engine's state. One buffer per graph tensor
 * (parameters carved from one weight and one gradient block, activations from one block sized
 * for the capacity B x T), per-node saved statistics, and scratch for accumulating gradients of
 * tensors read by several nodes. Not the kernels (kernels/cpu/) nor the graph (ir/). */
#ifndef DW_RUNTIME_ENGINE_CPU_H
#define DW_RUNTIME_ENGINE_CPU_H

#include "ir/ir.h"
#include "runtime/engine.h"

struct dw_engine {
    dw_ctx *ctx;
    dw_graph *g;               /* captured at the capacity B x T */
    dw_model_config cfg;       /* what it was captured from */
    int64_t cap_b, cap_t;      /* capacity */
    int64_t b, t;              /* shape of the current batch (<= capacity) */
    float **val;               /* per tensor: values (NULL for the int32 inputs) */
    float **grad;              /* per tensor: gradients (params: accumulated across calls) */
    bool *grad_ready;          /* per activation: gradient written during this backward */
    float **aux;               /* per node: saved statistics (mean/rstd, lse, unpacked q/k/v) */
    float *scratch[DW_IR_MAX_INPUTS]; /* one per input slot, each the largest activation */
    float *blocks[4];          /* weights, gradients, activations (+grads), aux: owned */
    const int32_t *tokens, *targets; /* the current batch, borrowed during a call */
    double loss;
    dw_param *params;
    int n_params;
    struct dw_engine_cuda *cuda; /* non-NULL: the CUDA engine (engine_cuda.h); params are host
                                    mirrors and blocks[2..3], val, grad, aux are unused */
};

/* Checks B x T against the capacity and every token/target against the vocabulary; makes the
 * batch current (engine_cpu.c; the CUDA engine validates with it too). */
dw_status dw_engine_begin(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B,
                          int64_t T);

/* Runs node n forward / backward on the current batch (engine_ops.c, dispatched by ops.def). */
void dw_engine_cpu_fwd(dw_engine *e, const dw_ir_node *n);
void dw_engine_cpu_bwd(dw_engine *e, const dw_ir_node *n, double dloss);
/* Floats of saved statistics node n needs at capacity (engine_ops.c). */
int64_t dw_engine_cpu_aux_size(const dw_graph *g, const dw_ir_node *n);

/* Debugging/parity: writes the logits ("logits", (B,T,V)), the loss ("loss", a scalar) and
 * every parameter's gradient under its Hugging Face name and layout to a safetensors file. */
dw_status dw_engine_dump_grads(dw_engine *e, const char *path, const float *logits, int64_t B,
                               int64_t T, double loss);

#endif /* DW_RUNTIME_ENGINE_CPU_H */
