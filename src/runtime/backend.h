/* backend.h — private: the backend interface, in the spirit of ggml's ggml_backend_i. A backend
 * (runtime/cpu/, runtime/cuda/) owns memory of its device and the kernels that run there; the one
 * executor (exec.c) walks a program (compile/program.h) and calls it through this table. The
 * executor never branches on the device: what differs is behind these function pointers.
 *   - pools:     alloc / release one block of device memory
 *   - copies:    upload / download (download returns when the host has the bytes), zero
 *   - add:       dst += src over n activation elements (a gradient delivered through ACC<s>)
 *   - steps:     one op entry per ops.def row (forward, backward: NULL where the row says the
 *                backend lacks it), and the optimizer's steps (gradient norm, AdamW, BF16 copy,
 *                weight cache)
 *   - prepare:   optional: handles and plans made once the pools exist, never inside a step
 *   - phase:     told when a phase of the program starts (caches valid within one sweep)
 *   - sync:      wait until the device has done everything issued
 *   - record:    optional (NULL: none): capture what a step range issues for replay (CUDA graphs)
 *   - timing:    optional (NULL: none): markers between steps, for profiles
 * Errors are dw_status with the message on the backend's context. */
#ifndef DW_RUNTIME_BACKEND_H
#define DW_RUNTIME_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compile/program.h"
#include "deepwell.h"
#include "kernels/adamw_args.h"
#include "precision/quant_stats.h"

typedef struct dw_backend dw_backend;
typedef struct dw_exec dw_exec;

/* Everything one op step needs, resolved by the executor from the program and the pools. Shapes
 * are the call's: rows = b * t (<= the program's capacity). Slots follow the node's inputs. */
typedef struct {
    const dw_exec *x;             /* the executor (program, pools, batch) */
    int node;
    const dw_ir_node *n;
    bool train;                   /* forward of a training step: a BWD_IN_FWD op does its backward */
    int64_t b, t, rows;
    void *in[DW_IR_MAX_INPUTS];   /* values: activation (act dtype), parameter (FP32 master), or the
                                     int32 tokens / targets in the workspace */
    const uint16_t *in_bf16[DW_IR_MAX_INPUTS]; /* parameters in BF16 mode: the working copy */
    float *pgrad[DW_IR_MAX_INPUTS]; /* parameters: the FP32 gradient (ops accumulate into it) */
    bool pgrad_set[DW_IR_MAX_INPUTS]; /* write pgrad over instead (grad_arena's first writer of a
                                     linear's weight, program.h pgrad_set: nothing zeroed it) */
    void *dx[DW_IR_MAX_INPUTS];   /* activations: where the input gradient goes; NULL: not needed */
    bool dx_acc[DW_IR_MAX_INPUTS]; /* add into dx instead of writing it */
    void *out[DW_IR_MAX_OUTPUTS];  /* the output values (out[0] the main one; the node's n_out) */
    void *dout[DW_IR_MAX_OUTPUTS]; /* their gradients (NULL when one has none) */
    void *aux[DW_AUX_COUNT];      /* saved for backward (NULL: none) */
    void *tmp[DW_TMP_COUNT];      /* scratch of this step (NULL: none) */
    /* fusion (program.h DW_FUSED_*): a linear doing a GELU's forward writes GELU(y) to fuse_out;
     * one doing a GELU's backward writes the GELU input's gradient to fuse_dx, with the GELU's
     * input (the pre-activation) at fuse_x */
    void *fuse_out, *fuse_x, *fuse_dx;
    double dloss;                 /* the loss gradient's scale (1 / accumulation steps) */
    bool recompute;               /* a forward run again before its block's backward: it writes what
                                     its first run wrote; whatever a forward counts, it counts once */
} dw_op_call;

typedef dw_status (*dw_op_fn)(dw_backend *be, const dw_op_call *call);

typedef struct {
    dw_op_fn fwd, bwd;
    dw_op_fn prepare; /* optional: once per node when the engine is made (library plans, handles) */
} dw_op_entry;

typedef struct {
    const char *name; /* "cpu", "cuda" */
    void (*destroy)(dw_backend *be);
    dw_status (*alloc)(dw_backend *be, int64_t bytes, void **out);
    void (*release)(dw_backend *be, void *p);
    dw_status (*upload)(dw_backend *be, void *dst, const void *src, size_t bytes);
    dw_status (*download)(dw_backend *be, void *dst, const void *src, size_t bytes);
    dw_status (*zero)(dw_backend *be, void *dst, size_t bytes);
    dw_status (*add)(dw_backend *be, dw_act_type dt, void *dst, const void *src, int64_t n);
    dw_status (*sync)(dw_backend *be);
    /* optional: once the pools exist, make what the steps will need (library handles, plans), so
     * that no step creates anything */
    dw_status (*prepare)(dw_backend *be, const dw_exec *x);
    void (*begin_phase)(dw_backend *be, const dw_exec *x, dw_phase phase);
    /* optimizer steps (program.h DW_STEP_GRAD_NORM ... DW_STEP_QUANT_W) */
    dw_status (*grad_norm)(dw_backend *be, const dw_exec *x);
    /* AdamW over every parameter; n_runs > 0: also the BF16 copies of bf16_runs [0, n_runs) from
     * the updated masters, in the same pass (the executor then skips the CAST_BF16 steps after it);
     * n_quant > 0: also the weight caches of nodes quant_nodes[0, n_quant), each one adamw_quants
     * accepted (the executor then skips their QUANT_W steps) */
    dw_status (*adamw)(dw_backend *be, const dw_exec *x, int n_runs, const int *quant_nodes, int n_quant);
    /* optional (NULL: never): whether adamw can refresh node's weight cache in its own pass */
    bool (*adamw_quants)(dw_backend *be, const dw_exec *x, int node);
    dw_status (*cast_bf16)(dw_backend *be, const dw_exec *x, int64_t begin, int64_t end);
    dw_status (*quant_weight)(dw_backend *be, const dw_exec *x, int node);
    /* optional (NULL: the caller reads the operand back and measures it on the host): quant_stats.h's
     * dw_qstats_measure of v [rows, cols] in this backend's memory (bf16: BF16 codes, else FP32),
     * measured where it lives; returns once *s holds the sums (train/guard_quant.c's check) */
    dw_status (*qstats)(dw_backend *be, dw_recipe r, bool bf16, const void *v, int64_t rows, int64_t cols, bool trans,
                        dw_qstats *s);
    /* optional: record everything issued between record_begin and record_end into *graph; replay
     * issues it again (same pointers, values read when it runs) */
    dw_status (*record_begin)(dw_backend *be);
    dw_status (*record_end)(dw_backend *be, void **graph);
    dw_status (*replay)(dw_backend *be, void *graph);
    void (*drop)(dw_backend *be, void *graph);
    /* optional: `count` time markers; mark(k) records marker k in stream order; elapsed_ms(a, b)
     * after a sync */
    dw_status (*timers)(dw_backend *be, int count);
    void (*mark)(dw_backend *be, int k);
    double (*elapsed_ms)(dw_backend *be, int a, int b);
    const dw_op_entry *ops; /* DW_OP_COUNT entries */
} dw_backend_i;

struct dw_backend {
    const dw_backend_i *i;
    dw_ctx *ctx;
    int device;   /* dw_device_kind */
    int sm;       /* CUDA: compute capability x10 */
    void *impl;   /* the backend's own state */
};

/* The backend for ctx's device (runtime/cpu/backend_cpu.c, runtime/cuda/backend_cuda.c). CUDA in
 * a build without it: DW_ERR_UNSUPPORTED. */
dw_status dw_backend_cpu_create(dw_ctx *ctx, dw_backend **out);
dw_status dw_backend_cuda_create(dw_ctx *ctx, dw_backend **out);
void dw_backend_free(dw_backend *be);

_Static_assert(sizeof(dw_adamw_args) == DW_COMPILE_ADAMW_ARGS_BYTES, "workspace slot of the AdamW arguments");

#endif /* DW_RUNTIME_BACKEND_H */
