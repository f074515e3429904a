/* ops_cuda_moe.c — the CUDA backend's mixture-of-experts entries: the router (logits -> top-k
 * weights in the program's activation dtype and int32 experts; kernels/cuda/ops_moe.cu; its
 * backward recomputes the scores from the logits and reads the experts the forward chose),
 * dispatch and combine (kernels/cuda/ops_moe_dispatch.cu: counts, offsets and rows computed on the
 * device) and the grouped expert linear layer (dw_grouped_gemm with the kernel the compiler bound:
 * src/gemm/grouped_kernels.c; a BF16 program reads the standing BF16 weight copy, which expert
 * weights always have). No host synchronisation: a recorded step replays whatever the routing. An output gradient no consumer sent (dout NULL)
 * counts as zeros; no MoE op adds into an input gradient (ops.def gives them no ACC flag). */
#include "core/error.h"
#include "runtime/backend.h"

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "kernels/cuda/ops_cuda.h"
#include "runtime/cuda/cuda.h"

dw_status dw_cuda_op_moe_router_fwd(dw_backend *be, const dw_op_call *c) {
    const dw_ir_attrs *a = &c->n->attrs;
    const int64_t bo = dw_compile_moe_bias_of(c->x->p, c->node); /* the kernel reads the switch: no sync */
    const dw_router_desc d = dw_ir_router_desc(a);
    return dw_cuda_moe_router_fwd_desc(
        be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->out[0], (int32_t *)c->out[1], c->in[0],
        bo >= 0 ? (const float *)(c->x->work + bo) : NULL,
        bo >= 0 ? (const int32_t *)(c->x->work + c->x->p->work.moe_bias) : NULL, c->rows,
        dw_cuda_width(c, c->n->in[0]), a->top_k, &d, DW_CUDA_STREAM(be));
}

dw_status dw_cuda_op_moe_router_bwd(dw_backend *be, const dw_op_call *c) {
    if (!c->dx[0]) return DW_OK;
    const dw_ir_attrs *a = &c->n->attrs;
    const dw_router_desc d = dw_ir_router_desc(a);
    return dw_cuda_moe_router_bwd_desc(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->dx[0], c->dout[0], c->in[0],
                                       (const int32_t *)c->out[1], c->rows, dw_cuda_width(c, c->n->in[0]), a->top_k,
                                       &d, DW_CUDA_STREAM(be));
}

/* ---- dispatch: x's rows grouped by expert, the offsets, each (token, k)'s row ------------------ */
/* The capacity comes from the call's token count on the host: no synchronisation. A third input
 * (the router's weights) drops by weight instead of by position. */
dw_status dw_cuda_op_moe_dispatch_fwd(dw_backend *be, const dw_op_call *c) {
    const int64_t N = c->rows, K = dw_cuda_width(c, c->n->in[1]), E = c->n->attrs.experts;
    const int64_t cnt = c->train && !c->recompute ? dw_compile_moe_counts_of(c->x->p, c->node) : -1; /* training forwards, once */
    if (cnt >= 0)
        DW_TRY(dw_cuda_moe_count(be->ctx, (int64_t *)(c->x->work + cnt), (const int32_t *)c->in[1],
                                 (const int32_t *)c->out[1], N * K, E, DW_CUDA_STREAM(be)));
    return dw_cuda_moe_dispatch_fwd(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->out[0], (int32_t *)c->out[1],
                                    (int32_t *)c->out[2], c->in[0], (const int32_t *)c->in[1],
                                    c->n->n_in > 2 ? c->in[2] : NULL, N, dw_cuda_width(c, c->n->in[0]), K, E,
                                    dw_moe_capacity(c->n->attrs.capacity_factor, N, K, E), DW_CUDA_STREAM(be));
}
/* Each token's sum of its rows' gradients: the combine with unit weights. */
dw_status dw_cuda_op_moe_dispatch_bwd(dw_backend *be, const dw_op_call *c) {
    if (c->n->n_in > 2 && c->dx[2] && !c->dx_acc[2]) /* the weights only ranked the assignments */
        DW_CUDA_CHECK(be->ctx, cudaMemsetAsync(c->dx[2], 0, (size_t)(c->rows * dw_cuda_width(c, c->n->in[1])) *
                                                                (size_t)dw_act_size((dw_act_dtype)dw_cuda_dt(c)),
                                               DW_CUDA_STREAM(be)));
    if (!c->dx[0]) return DW_OK;
    return dw_cuda_moe_combine_fwd(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->dx[0], c->dout[0], NULL,
                                   (const int32_t *)c->out[2], c->rows, dw_cuda_width(c, c->n->in[0]),
                                   dw_cuda_width(c, c->n->in[1]), DW_CUDA_STREAM(be));
}

/* ---- grouped linear: each expert's rows times its weight^T ------------------------------------ */
/* One pass as dw_grouped_gemm takes it, with the kernel the compiler bound for it (bind_grouped.c;
 * a program compiled for the CPU names none: the registry picks). */
static dw_grouped_args moe_gemm_args(const dw_op_call *c, int pass) {
    const dw_ir_tensor *wt = &c->x->g->tensors[c->n->in[1]];
    const dw_compiled *p = c->x->p;
    return (dw_grouped_args){
        .pass = pass, .dtype = dw_cuda_dt(c) == DW_ACT_BF16 ? DW_GROUPED_BF16 : DW_GROUPED_F32,
        .recipe = DW_RECIPE_BF16, .rows = dw_exec_rows(c->x, c->n->in[0]), .experts = wt->shape[0],
        .m = wt->shape[1], .k = wt->shape[2], .x = c->in[0], .w = p->bf16 ? (const void *)c->in_bf16[1] : c->in[1],
        .offsets = (const int32_t *)c->in[2],
        .backend = p->target.device == DW_DEVICE_CUDA ? p->node[c->node].bind.kernel[pass] : NULL};
}

dw_status dw_cuda_op_moe_linear_fwd(dw_backend *be, const dw_op_call *c) {
    dw_grouped_args a = moe_gemm_args(c, DW_GEMM_FPROP);
    a.out = c->out[0];
    return dw_grouped_gemm(be->ctx, &a);
}

dw_status dw_cuda_op_moe_linear_bwd(dw_backend *be, const dw_op_call *c) {
    const dw_act_dtype dt = (dw_act_dtype)dw_cuda_dt(c);
    dw_grouped_args a = moe_gemm_args(c, DW_GEMM_DGRAD);
    a.dy = c->dout[0];
    if (!c->dout[0]) { /* no gradient reached y: none leaves */
        if (c->dx[0])
            DW_CUDA_CHECK(be->ctx, cudaMemsetAsync(c->dx[0], 0, (size_t)(a.rows * a.k) * (size_t)dw_act_size(dt),
                                                   DW_CUDA_STREAM(be)));
        return DW_OK;
    }
    if (c->dx[0]) { /* dx_e = dy_e W_e */
        a.out = c->dx[0];
        DW_TRY(dw_grouped_gemm(be->ctx, &a));
    }
    if (!c->pgrad[1]) return DW_OK;
    a = moe_gemm_args(c, DW_GEMM_WGRAD); /* dW_e += dy_e^T x_e, FP32 */
    a.dy = c->dout[0], a.out = c->pgrad[1];
    return dw_grouped_gemm(be->ctx, &a);
}

/* ---- combine: each token's weighted sum of its K expert rows ---------------------------------- */
dw_status dw_cuda_op_moe_combine_fwd(dw_backend *be, const dw_op_call *c) {
    return dw_cuda_moe_combine_fwd(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->out[0], c->in[0], c->in[1],
                                   (const int32_t *)c->in[2], c->rows, dw_cuda_width(c, c->n->out[0]),
                                   dw_cuda_width(c, c->n->in[1]), DW_CUDA_STREAM(be));
}
dw_status dw_cuda_op_moe_combine_bwd(dw_backend *be, const dw_op_call *c) {
    const int64_t N = c->rows, K = dw_cuda_width(c, c->n->in[1]);
    return dw_cuda_moe_combine_bwd(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->dx[0], c->dx[1], c->dout[0], c->in[0],
                                   c->in[1], (const int32_t *)c->in[2], N, dw_cuda_width(c, c->n->out[0]), K,
                                   dw_exec_rows(c->x, c->n->in[0]), DW_CUDA_STREAM(be));
}

/* ---- load-balancing loss: statistics per layer, summed; the loss once, after the last layer ---- */
dw_status dw_cuda_op_moe_aux_stats_fwd(dw_backend *be, const dw_op_call *c) {
    const bool chained = c->n->n_in == 4;
    return dw_cuda_moe_aux_stats_fwd(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->out[0], (int32_t *)c->out[1], c->in[0],
                                     (const int32_t *)c->in[1], chained ? c->in[2] : NULL,
                                     chained ? (const int32_t *)c->in[3] : NULL, c->rows, dw_cuda_width(c, c->n->in[0]),
                                     dw_cuda_width(c, c->n->in[1]), DW_CUDA_STREAM(be));
}
dw_status dw_cuda_op_moe_aux_stats_bwd(dw_backend *be, const dw_op_call *c) {
    const dw_act_dtype dt = (dw_act_dtype)dw_cuda_dt(c);
    const int64_t E = dw_cuda_width(c, c->n->in[0]);
    if (c->dx[0])
        DW_TRY(dw_cuda_moe_aux_stats_bwd(be->ctx, dt, c->dx[0], c->dout[0], c->in[0], c->rows, E, DW_CUDA_STREAM(be)));
    if (c->n->n_in == 4 && c->dx[2]) { /* the layers before: the same gradient */
        const size_t bytes = (size_t)(E + 1) * (size_t)dw_act_size(dt);
        if (c->dout[0])
            DW_CUDA_CHECK(be->ctx, cudaMemcpyAsync(c->dx[2], c->dout[0], bytes, cudaMemcpyDeviceToDevice,
                                                   DW_CUDA_STREAM(be)));
        else DW_CUDA_CHECK(be->ctx, cudaMemsetAsync(c->dx[2], 0, bytes, DW_CUDA_STREAM(be)));
    }
    return DW_OK;
}

dw_status dw_cuda_op_moe_aux_loss_fwd(dw_backend *be, const dw_op_call *c) {
    const dw_work_layout *w = &c->x->p->work;
    const dw_ir_attrs *a = &c->n->attrs;
    return dw_cuda_moe_aux_loss(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->out[0], (float *)(c->x->work + w->loss),
                                (float *)(c->x->work + w->moe_aux), NULL, c->in[0], (const int32_t *)c->in[1],
                                dw_cuda_width(c, c->n->in[1]), a->top_k, c->rows, a->coef, a->zcoef, 0.0,
                                DW_CUDA_STREAM(be));
}
dw_status dw_cuda_op_moe_aux_loss_bwd(dw_backend *be, const dw_op_call *c) {
    if (!c->dx[0]) return DW_OK;
    const dw_ir_attrs *a = &c->n->attrs;
    return dw_cuda_moe_aux_loss(be->ctx, (dw_act_dtype)dw_cuda_dt(c), NULL, NULL, NULL, c->dx[0], NULL,
                                (const int32_t *)c->in[1], dw_cuda_width(c, c->n->in[1]), a->top_k, c->rows, a->coef,
                                a->zcoef, c->dloss, DW_CUDA_STREAM(be));
}
#endif /* DW_HAVE_CUDA */
