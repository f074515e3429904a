/* ops_cuda_loss.c — the CUDA backend's cross-entropy: loss (reduced on the device into the
 * workspace) and, in a training step's forward, dlogits written in place over the logits (ops.def:
 * DX0_OVER_X0, BWD_IN_FWD), scaled by dloss; one fused pass per row. */
#include "core/error.h"
#include "runtime/backend.h"

#if DW_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#include "runtime/cuda/cuda.h"

dw_status dw_cuda_op_cross_entropy_fwd(dw_backend *be, const dw_op_call *c) {
    const int64_t V = dw_cuda_width(c, c->n->in[0]);
    return dw_cuda_cross_entropy(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->out[0], NULL, c->train ? c->dx[0] : NULL,
                                 c->in[0], c->in[1], c->rows, V, (float)c->dloss, c->tmp[DW_TMP_XENT],
                                 DW_CUDA_STREAM(be));
}

/* Done by the forward of the training step (ops.def BWD_IN_FWD): the program has no such step. */
dw_status dw_cuda_op_cross_entropy_bwd(dw_backend *be, const dw_op_call *c) {
    (void)c;
    return dw_set_error(be->ctx, DW_ERR_INVALID, "cuda backend: cross-entropy's backward runs in its forward");
}
#endif /* DW_HAVE_CUDA */
