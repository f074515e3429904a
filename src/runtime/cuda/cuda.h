/* cuda.h — private to runtime/cuda/: the CUDA backend's state and what its files share. One
 * stream (the context's); pools in device memory; op entries that launch the kernels of
 * kernels/cuda/ and dw_gemm (BF16, or operands quantised on the device into the workspace's slots:
 * qlinear_cuda.c); the optimizer kernels; CUDA graphs for recording; events for timers. Nothing
 * synchronises but download and sync. Compiled with CUDA only (backend_cuda.c says so otherwise). */
#ifndef DW_RUNTIME_CUDA_CUDA_H
#define DW_RUNTIME_CUDA_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cuda/ops_cuda.h"
#include "runtime/backend.h"
#include "runtime/exec.h"

typedef struct {
    void *stream;            /* cudaStream_t: the context's */
    /* quantised linear layers: what the activation slots hold while a sweep is issued: the graph
     * tensor whose x codes are in q_rows / whose x^T codes are in q_xt (-1: none or a gradient),
     * and in which recipe. Linear nodes reading the same x (llama's q/k/v, gate/up) quantise it
     * once (with dw_exec.quant_reuse) */
    int rows_tensor, xt_tensor;
    int rows_recipe, xt_recipe; /* the recipe; a MoE layer's rows (grouped_fp8.h's layout): dw_cuda_moe_rows_mark */
    int64_t moe_rows_reused;    /* MoE fprops that read a sibling's quantised x (gate, up), since creation */
    int64_t swiglu_quant[2];    /* SwiGLU forwards that quantised their output for the linear layer reading
                                 * it (act_quant_cuda.c): [0] dense, [1] MoE, since creation */
    /* a SwiGLU backward's gradients written as fp8_block operands (act_quant_cuda.c): the gate and up
     * layers whose dy they are (-1: none pending) and where (a MoE layer's experts: the rows only,
     * codes_t NULL); taken by that layer's backward */
    int dy_fp8_node[2];
    dw_cuda_fp8_grad dy_fp8[2];
    int64_t swiglu_quant_bwd[2]; /* such SwiGLU backwards, since creation: [0] dense, [1] MoE */
    int64_t norm_quant;         /* norm forwards that quantised their output for its linear layers, since creation */
    int64_t gelu_quant;         /* GELU forwards (after a quantised GEMM) that did, since creation */
    int64_t combine_quant_bwd;  /* MoE combine backwards that wrote the down layer's dy rows, since creation */
    void **events;           /* timers: cudaEvent_t */
    int n_events;
} dw_cuda_state;

#define DW_CUDA_ST(be) ((dw_cuda_state *)(be)->impl)
#define DW_CUDA_STREAM(be) (DW_CUDA_ST(be)->stream)

/* The op entries (ops_cuda_*.c), declared from ops.def (_prepare exists where its column is 2). */
#define DW_OP(ID, name, min_in, max_in, outs, flags, cpu, cuda, summary)                                   \
    dw_status dw_cuda_op_##name##_fwd(dw_backend *be, const dw_op_call *c);                         \
    dw_status dw_cuda_op_##name##_bwd(dw_backend *be, const dw_op_call *c);                         \
    dw_status dw_cuda_op_##name##_prepare(dw_backend *be, const dw_op_call *c);
#include "ir/ops.def"
#undef DW_OP

/* The optimizer steps (steps_cuda.c) and the weight cache's refresh (qlinear_cuda.c). */
dw_status dw_cuda_step_grad_norm(dw_backend *be, const dw_exec *x);
dw_status dw_cuda_step_adamw(dw_backend *be, const dw_exec *x, int n_runs, const int *quant_nodes, int n_quant);
bool dw_cuda_adamw_quants(dw_backend *be, const dw_exec *x, int node);
dw_status dw_cuda_step_cast_bf16(dw_backend *be, const dw_exec *x, int64_t begin, int64_t end);
dw_status dw_cuda_step_quant_weight(dw_backend *be, const dw_exec *x, int node);

/* Quantised linear layers (qlinear_cuda.c). fprop: y = quant(x) quant(W)^T (+ bias), GELU into
 * c->fuse_out too when set, in the GEMM's epilogue where its kernel has one, else *gelu_after:
 * the caller runs it (ops_cuda_linear.c); *done false (nothing launched): the target runs this
 * GEMM in BF16. */
dw_status dw_cuda_qlin_fprop(dw_backend *be, const dw_op_call *c, bool *done, bool *gelu_after);
/* dgrad into dx (when dx is not NULL; added when c->dx_acc[0]) and wgrad into dW, each where the
 * target runs it quantised; *dg / *wg say which ran. */
dw_status dw_cuda_qlin_bwd(dw_backend *be, const dw_op_call *c, void *dx, bool *dg, bool *wg);
/* Forgets what the activation slots hold (a sweep starts). */
void dw_cuda_qlin_reset(dw_backend *be);
/* The rows slot's record (dw_cuda_state.rows_recipe) for a MoE layer's x in recipe r: a mark no
 * dense layer's recipe has (their layouts differ). */
static inline int dw_cuda_moe_rows_mark(dw_recipe r) { return -2 - (int)r; }
/* The SwiGLU forward that also writes its output's fp8_block rows for the linear layer, dense or
 * MoE, that alone reads it (act_quant_cuda.c); *done false (nothing launched) where that does not
 * apply. */
dw_status dw_cuda_swiglu_quant_fwd(dw_backend *be, const dw_op_call *c, bool *done);
/* The SwiGLU backward writing its gradients as the gate and up layers' fp8_block dy and dy^T where
 * dw_compile_swiglu_bwd_quant allows (with quant_reuse; not on a check step, which measures the
 * BF16 dy): *done when it did, noting them for those layers' backward (dw_cuda_state.dy_fp8). */
dw_status dw_cuda_swiglu_quant_bwd(dw_backend *be, const dw_op_call *c, bool *done);
/* Whether the backward fusions that write a layer's fp8_block dy may run (quant_reuse, and neither
 * DW_SWIGLU_QUANT=0 nor DW_SWIGLU_QUANT_BWD=0): the SwiGLU's and the MoE combine's. */
bool dw_cuda_bwd_quant_on(const dw_exec *x);
/* Takes the fp8_block dy a SwiGLU's or combine's backward wrote for `node` (dw_cuda_state.dy_fp8)
 * into *g, forgetting it: false when none is pending for that node. */
static inline bool dw_cuda_dy_fp8_take(dw_cuda_state *st, int node, dw_cuda_fp8_grad *g) {
    for (int k = 0; k < 2; k++)
        if (st->dy_fp8_node[k] == node) {
            *g = st->dy_fp8[k], st->dy_fp8_node[k] = -1;
            return true;
        }
    return false;
}
/* The rmsnorm or layernorm forward that also writes its output's fp8_block rows for the dense
 * linear layers reading it (dw_compile_norm_quant_reader; with quant_reuse): *done when it did. */
dw_status dw_cuda_norm_quant_fwd(dw_backend *be, const dw_op_call *c, bool *done);
/* The GELU a quantised linear layer (call c) runs after its GEMM, also writing its output's
 * fp8_block rows for the layers reading it (dw_compile_gelu_quant_reader): *done when it did. */
dw_status dw_cuda_gelu_quant_fwd(dw_backend *be, const dw_op_call *c, bool *done);

/* The guard's check (guard_check_cuda.c): the backend's qstats entry (backend.h), and a check
 * step's dy [N, M] (BF16, c->dout[0]) measured as the dgrad's (dg) and wgrad's (wg) operands in
 * ra into the node's dy statistics (precision/quant_counts.h; nothing when not asked for). */
dw_status dw_cuda_qstats(dw_backend *be, dw_recipe r, bool bf16, const void *v, int64_t rows, int64_t cols, bool trans,
                         dw_qstats *s);
dw_status dw_cuda_measure_dy(dw_backend *be, const dw_op_call *c, dw_recipe ra, int64_t N, int64_t M, bool dg,
                             bool wg);

/* Width (last dimension) of graph tensor t. */
static inline int64_t dw_cuda_width(const dw_op_call *c, int t) {
    const dw_ir_tensor *x = &c->x->g->tensors[t];
    return x->shape[x->ndim - 1];
}
/* The activation dtype of the program (kernels/cuda/ops_cuda.h's dw_act_dtype values). */
static inline int dw_cuda_dt(const dw_op_call *c) { return c->x->p->bf16 ? 1 : 0; }

#endif /* DW_RUNTIME_CUDA_CUDA_H */
