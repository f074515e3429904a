/* cpu.h — private to runtime/cpu/: the CPU backend's state and the helpers its op entries share.
 * The CPU backend runs any program exactly: FP32 programs straight on the reference kernels
 * (kernels/cpu/), BF16 programs with activations stored as BF16 in the pools like on the GPU —
 * inputs widened to FP32 (exact), the reference kernel run, results rounded to BF16 once (or added
 * in FP32 and rounded, where the program accumulates) — and linear layers through the exact
 * reference GEMM (dw_gemm on the CPU) with every recipe's FORMATS.md quantisation. */
#ifndef DW_RUNTIME_CPU_CPU_H
#define DW_RUNTIME_CPU_CPU_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/backend.h"
#include "runtime/exec.h"

/* Scratch slots (host FP32 buffers, grown on demand, kept for the backend's life). */
enum { CPU_S_IN0 = 0, CPU_S_IN1, CPU_S_IN2, CPU_S_OUT, CPU_S_DOUT, CPU_S_DX0, CPU_S_DX1, CPU_S_DX2, CPU_S_Q,
       CPU_S_K, CPU_S_V, CPU_S_W, CPU_S_COUNT };

typedef struct {
    float *buf[CPU_S_COUNT];
    int64_t cap[CPU_S_COUNT]; /* floats */
    double t0;                /* timers: the clock origin */
    double *marks;
    int n_marks;
} dw_cpu_state;

/* A scratch buffer of at least n floats (NULL when out of memory; the error is then on be->ctx). */
float *dw_cpu_scratch(dw_backend *be, int slot, int64_t n);

/* Whether the program stores activations as BF16. */
static inline bool dw_cpu_bf16(const dw_op_call *c) { return c->x->p->bf16; }

/* Activation values as FP32: the pointer itself in an FP32 program, else widened into scratch
 * slot `slot`. n elements. NULL when out of memory. */
const float *dw_cpu_in(dw_backend *be, const dw_op_call *c, const void *v, int64_t n, int slot);
/* A place for n FP32 results bound for an activation buffer v: v itself in an FP32 program
 * (written in place), else scratch slot `slot` (then dw_cpu_put rounds them into v). */
float *dw_cpu_out(dw_backend *be, const dw_op_call *c, void *v, int64_t n, int slot);
/* Stores n FP32 results r into activation buffer v: rounded to BF16 in a BF16 program; nothing to
 * do in an FP32 program when r is v. With acc: v += r (in FP32, then one rounding). */
void dw_cpu_put(const dw_op_call *c, void *v, const float *r, int64_t n, bool acc);
/* Delivers the FP32 gradient g of input slot s (rows x width elements) to c->dx[s] as the
 * program says (write or add); nothing when dx[s] is NULL. */
void dw_cpu_deliver(const dw_op_call *c, int s, const float *g, int64_t n);

/* The op entries (ops_cpu_*.c), declared from ops.def (_prepare exists where its column is 2). */
#define DW_OP(ID, name, min_in, max_in, outs, flags, cpu, cuda, summary)                                   \
    dw_status dw_cpu_op_##name##_fwd(dw_backend *be, const dw_op_call *c);                          \
    dw_status dw_cpu_op_##name##_bwd(dw_backend *be, const dw_op_call *c);                         \
    dw_status dw_cpu_op_##name##_prepare(dw_backend *be, const dw_op_call *c);
#include "ir/ops.def"
#undef DW_OP

/* The optimizer steps and the linear layers' weight caches (steps_cpu.c, ops_cpu_linear.c). */
dw_status dw_cpu_step_grad_norm(dw_backend *be, const dw_exec *x);
dw_status dw_cpu_step_adamw(dw_backend *be, const dw_exec *x, int n_runs, const int *quant_nodes, int n_quant);
dw_status dw_cpu_step_cast_bf16(dw_backend *be, const dw_exec *x, int64_t begin, int64_t end);
dw_status dw_cpu_step_quant_weight(dw_backend *be, const dw_exec *x, int node);

/* Width (last dimension) of graph tensor t. */
static inline int64_t dw_cpu_width(const dw_op_call *c, int t) {
    const dw_ir_tensor *x = &c->x->g->tensors[t];
    return x->shape[x->ndim - 1];
}

#endif /* DW_RUNTIME_CPU_CPU_H */
