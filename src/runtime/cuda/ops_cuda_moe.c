/* ops_cuda_moe.c — the CUDA backend's mixture-of-experts entries: the router (logits -> top-k
 * weights in the program's activation dtype and int32 experts; kernels/cuda/ops_moe.cu). Its
 * backward recomputes the scores from the logits and reads the experts the forward chose. */
#include "core/error.h"
#include "runtime/backend.h"

#if DW_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#include "runtime/cuda/cuda.h"

dw_status dw_cuda_op_moe_router_fwd(dw_backend *be, const dw_op_call *c) {
    const dw_ir_attrs *a = &c->n->attrs;
    return dw_cuda_moe_router_fwd(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->out[0], (int32_t *)c->out[1], c->in[0],
                                  c->rows, dw_cuda_width(c, c->n->in[0]), a->top_k, a->score, a->norm_topk,
                                  DW_CUDA_STREAM(be));
}

dw_status dw_cuda_op_moe_router_bwd(dw_backend *be, const dw_op_call *c) {
    if (!c->dx[0]) return DW_OK;
    const dw_ir_attrs *a = &c->n->attrs;
    return dw_cuda_moe_router_bwd(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->dx[0], c->dout[0], c->in[0],
                                  (const int32_t *)c->out[1], c->rows, dw_cuda_width(c, c->n->in[0]), a->top_k,
                                  a->score, a->norm_topk, DW_CUDA_STREAM(be));
}
#endif /* DW_HAVE_CUDA */
