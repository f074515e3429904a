/* ops_cuda_softcap.c — the CUDA backend's softcap op (Gemma 2's embedding normaliser and final logit
 * soft-capping): y = s x, or c tanh(s x / c) when c > 0 (attrs.scale, attrs.softcap), over the
 * output's N rows of C, one launch of kernels/cuda/ops_softcap.cu on the backend's stream; the input
 * gradient written. Oracle: runtime/cpu/ops_cpu_softcap.c. */
#include "core/error.h"
#include "runtime/backend.h"

#if DW_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#include "runtime/cuda/cuda.h"

dw_status dw_cuda_op_softcap_fwd(dw_backend *be, const dw_op_call *c) {
    const int64_t n = dw_exec_rows(c->x, c->n->out[0]) * dw_cuda_width(c, c->n->out[0]);
    return dw_cuda_softcap_fwd(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->out[0], c->in[0], n, c->n->attrs.scale,
                               c->n->attrs.softcap, DW_CUDA_STREAM(be));
}

dw_status dw_cuda_op_softcap_bwd(dw_backend *be, const dw_op_call *c) {
    const int64_t n = dw_exec_rows(c->x, c->n->out[0]) * dw_cuda_width(c, c->n->out[0]);
    if (!c->dx[0]) return DW_OK;
    return dw_cuda_softcap_bwd(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->dx[0], c->dout[0], c->in[0], n,
                               c->n->attrs.scale, c->n->attrs.softcap, DW_CUDA_STREAM(be));
}
#endif /* DW_HAVE_CUDA */
