/* ops_cpu_loss.c — the CPU backend's cross-entropy: the mean loss over targets >= 0 into the
 * workspace's FP32 loss, and in a training step's forward the logits' gradient too, written over
 * the logits (ops.def: DX0_OVER_X0, BWD_IN_FWD), scaled by the step's dloss. */
#include "core/error.h"
#include "kernels/cpu/ops_cpu.h"
#include "runtime/cpu/cpu.h"

dw_status dw_cpu_op_cross_entropy_fwd(dw_backend *be, const dw_op_call *c) {
    const int64_t N = c->rows, V = dw_cpu_width(c, c->n->in[0]);
    const float *logits = dw_cpu_in(be, c, c->in[0], N * V, CPU_S_IN0);
    if (!logits) return DW_ERR_NOMEM;
    *(float *)c->out[0] = (float)dw_cpu_cross_entropy_fwd(logits, c->in[1], N, V);
    if (!c->train || !c->dx[0]) return DW_OK;
    float *d = dw_cpu_scratch(be, CPU_S_DX0, N * V);
    if (!d) return DW_ERR_NOMEM;
    dw_cpu_cross_entropy_bwd(d, logits, c->in[1], N, V, c->dloss);
    dw_cpu_deliver(c, 0, d, N * V);
    return DW_OK;
}

/* Done by the forward of the training step (ops.def BWD_IN_FWD): the program has no such step. */
dw_status dw_cpu_op_cross_entropy_bwd(dw_backend *be, const dw_op_call *c) {
    (void)c;
    return dw_set_error(be->ctx, DW_ERR_INVALID, "cpu backend: cross-entropy's backward runs in its forward");
}
