/* ops_cuda_linear.c — the CUDA backend's linear layers y = x W^T (+ b): in an FP32 program the
 * FP32 reference GEMM kernel; else dw_gemm with BF16 operands (the BF16 working copy of W, GELU
 * fused into the fprop's epilogue, GELU' into the dgrad's, the bias gradient into the wgrad's), or
 * with operands quantised on the device for each GEMM the target runs quantised (qlinear_cuda.c),
 * the others in BF16. A quantised layer keeps no standing BF16 weight (program.h bf16_lazy): a GEMM
 * falling back to BF16 converts it first, stream-ordered, so a recorded step replays that too. */
#include "core/error.h"
#include "runtime/backend.h"

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "kernels/cuda/ops_cuda.h"
#include "runtime/cuda/cuda.h"
#include "runtime/cuda/kern.h"
#include "runtime/linear_args.h"

/* The BF16 copy of the weight (slot 1): the standing one, or converted now where none stands. */
static dw_status weight_bf16(dw_backend *be, const dw_op_call *c, const uint16_t **out) {
    const dw_compiled *p = c->x->p;
    const int k = p->tensor[c->n->in[1]].param;
    *out = c->in_bf16[1];
    if (!p->bf16_lazy[k]) return DW_OK;
    const int64_t n = dw_ir_numel(&c->x->g->tensors[c->n->in[1]]);
    DW_CUDA_CHECK(be->ctx, (cudaError_t)dw_cuda_be_to_bf16((uint16_t *)c->in_bf16[1], c->in[1], n, DW_CUDA_STREAM(be)));
    return DW_OK;
}

dw_status dw_cuda_op_linear_fwd(dw_backend *be, const dw_op_call *c) {
    const int64_t N = c->rows, K = dw_cuda_width(c, c->n->in[0]), M = dw_cuda_width(c, c->n->out[0]);
    const bool bias = c->n->n_in == 3;
    if (!c->x->p->bf16)
        return dw_cuda_linear_fwd(be->ctx, c->out[0], c->in[0], c->in[1], bias ? c->in[2] : NULL, N, K, M, DW_CUDA_STREAM(be));
    if (dw_compile_quant_recipe(c->x->p->node[c->node].bind.recipe)) { /* quantised; BF16 below when not run so */
        bool done = false, gelu_after = false;
        DW_TRY(dw_cuda_qlin_fprop(be, c, &done, &gelu_after));
        if (gelu_after) { /* no GELU epilogue on the quantised GEMM: a pass, which may write its readers' rows */
            bool fused = false;
            DW_TRY(dw_cuda_gelu_quant_fwd(be, c, &fused));
            return fused ? DW_OK : dw_cuda_gelu_fwd(be->ctx, DW_ACT_BF16, c->fuse_out, c->out[0], N * M, DW_CUDA_STREAM(be));
        }
        if (done) return DW_OK;
    }
    const uint16_t *wb;
    DW_TRY(weight_bf16(be, c, &wb));
    const dw_gemm_args a = dw_linear_fprop_args(c, wb, N, K, M);
    return dw_gemm(be->ctx, &a);
}

dw_status dw_cuda_op_linear_bwd(dw_backend *be, const dw_op_call *c) {
    const int64_t N = c->rows, K = dw_cuda_width(c, c->n->in[0]), M = dw_cuda_width(c, c->n->out[0]);
    void *s = DW_CUDA_STREAM(be);
    float *dw = c->pgrad[1], *db = c->n->n_in == 3 ? c->pgrad[2] : NULL;
    if (!c->x->p->bf16) {
        DW_ASSERT(!c->pgrad_set[1]); /* the FP32 kernel adds into dW: the compiler keeps its zeroing */
        return dw_cuda_linear_bwd(be->ctx, c->dx[0], c->dx_acc[0], dw, db, c->dout[0], c->in[0], c->in[1], N, K, M, s);
    }
    void *dx = c->fuse_dx ? c->fuse_dx : c->dx[0]; /* x = GELU(h): the dgrad writes dh = (dy W) GELU'(h) */
    bool dg = false, wg = false;
    if (dw_compile_quant_recipe(c->x->p->node[c->node].bind.recipe)) /* quantised; BF16 below for the others */
        DW_TRY(dw_cuda_qlin_bwd(be, c, dx, &dg, &wg));
    if (dx && !dg) { /* dgrad: dx [N,K] = dy [N,M] W [M,K] */
        const uint16_t *wb;
        DW_TRY(weight_bf16(be, c, &wb));
        const dw_gemm_args a = dw_linear_dgrad_args(c, wb, dx, N, K, M);
        DW_TRY(dw_gemm(be->ctx, &a));
    }
    if (!wg) { /* wgrad: dW [M,K] += dy^T [M,N] x [N,K], FP32 output accumulated (beta = 1), or
                * written over (beta 0) by grad_arena's first writer (pgrad_set) */
        float *bgrad = db ? (float *)(c->x->work + c->x->p->work.bgrad) : NULL; /* then db += it */
        dw_gemm_args a = dw_linear_wgrad_args(c, bgrad, N, K, M);
        if (c->pgrad_set[1]) a.beta = 0.0f, a.c = NULL;
        DW_TRY(dw_gemm(be->ctx, &a));
        return db ? dw_cuda_add_fwd(be->ctx, DW_ACT_F32, db, db, bgrad, M, s) : DW_OK;
    }
    /* db [M] += column sums of dy (N,M): the positions kernel's fixed-order column sum */
    return db ? dw_cuda_pos_bwd(be->ctx, (dw_act_dtype)dw_cuda_dt(c), NULL, db, c->dout[0], N, 1, M, s) : DW_OK;
}
#endif /* DW_HAVE_CUDA */
