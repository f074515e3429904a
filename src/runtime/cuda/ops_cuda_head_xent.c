/* ops_cuda_head_xent.c — the CUDA backend's fused LM head + cross-entropy (ops.def head_xent, put in
 * place of the head linear and the loss by compile/fuse.c), all on the compute stream without a
 * host sync: the valid rows of the whole batch counted once, then for each chunk of the program's
 * head_chunk rows the logits x_c W^T into the chunk buffer (the head's BF16 GEMM through dw_gemm,
 * or the FP32 reference linear), the cross-entropy's row kernel (each row's loss and, in a training
 * step, the logits' gradient over them), dx_c = dlogits_c W and dW += dlogits_c^T x_c (FP32,
 * accumulated across the chunks by the GEMM's beta); finally the mean over all rows. A quantised
 * head (fp8_block, ...: fuse.c) runs the head linear's own forward and backward on each chunk
 * (linear_args.h dw_head_chunk_call), operands quantised chunk by chunk, the passes its policy keeps
 * in BF16 falling back as the unfused head's do. The oracle is the CPU backend
 * (ops_cpu_head_xent.c); tests/gpu/test_head_xent_cuda.c compares the two paths. */
#include "core/error.h"
#include "runtime/backend.h"

#if DW_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#include "runtime/cuda/cuda.h"
#include "runtime/linear_args.h"

/* One chunk of nc rows from row r0: x_c (nc,K), logits (nc,V) in `chunk`. */
static dw_status one_chunk(dw_backend *be, const dw_op_call *c, void *ws, void *chunk, int64_t r0, int64_t nc,
                           int64_t K, int64_t V) {
    const dw_compiled *p = c->x->p;
    void *s = DW_CUDA_STREAM(be);
    const int64_t as = p->act_size;
    const void *xc = (const char *)c->in[0] + r0 * K * as;
    void *dx = c->train && c->dx[0] ? (char *)c->dx[0] + r0 * K * as : NULL;
    const int32_t *tg = (const int32_t *)c->in[2] + r0;
    if (!p->bf16) { /* FP32 program: the reference linear kernels */
        DW_TRY(dw_cuda_linear_fwd(be->ctx, chunk, xc, c->in[1], NULL, nc, K, V, s));
        DW_TRY(dw_cuda_cross_entropy_rows(be->ctx, DW_ACT_F32, ws, r0, c->train ? chunk : NULL, chunk, tg, nc, V,
                                          (float)c->dloss, s));
        if (!c->train) return DW_OK;
        return dw_cuda_linear_bwd(be->ctx, dx, c->dx_acc[0], c->pgrad[1], NULL, chunk, xc, c->in[1], nc, K, V, s);
    }
    if (dw_head_quantised(p)) { /* the head linear's own op on the rows */
        const dw_op_call l = dw_head_chunk_call(c, r0, nc, chunk);
        dw_cuda_qlin_reset(be); /* x's rows in the quantiser's slot are another chunk's */
        DW_TRY(dw_cuda_op_linear_fwd(be, &l));
        DW_TRY(dw_cuda_cross_entropy_rows(be->ctx, DW_ACT_BF16, ws, r0, c->train ? chunk : NULL, chunk, tg, nc, V,
                                          (float)c->dloss, s));
        return c->train ? dw_cuda_op_linear_bwd(be, &l) : DW_OK;
    }
    const uint16_t *w = c->in_bf16[1];
    const dw_gemm_args fp = {.pass = DW_GEMM_FPROP, .m = nc, .n = V, .k = K, .a = dw_linear_bf16(xc, nc, K, false),
                             .b = dw_linear_bf16(w, V, K, true), .alpha = 1.0f, .d = chunk, .out_type = DW_GEMM_OUT_BF16};
    DW_TRY(dw_gemm(be->ctx, &fp));
    DW_TRY(dw_cuda_cross_entropy_rows(be->ctx, DW_ACT_BF16, ws, r0, c->train ? chunk : NULL, chunk, tg, nc, V,
                                      (float)c->dloss, s));
    if (!c->train) return DW_OK;
    if (dx) { /* dgrad: dx_c [nc,K] = dlogits_c [nc,V] W [V,K] */
        dw_gemm_args dg = {.pass = DW_GEMM_DGRAD, .m = nc, .n = K, .k = V, .a = dw_linear_bf16(chunk, nc, V, false),
                           .b = dw_linear_bf16(w, V, K, false), .alpha = 1.0f, .d = dx, .out_type = DW_GEMM_OUT_BF16};
        if (c->dx_acc[0]) dg.beta = 1.0f, dg.c = dx;
        DW_TRY(dw_gemm(be->ctx, &dg));
    }
    /* wgrad: dW [V,K] += dlogits_c^T [V,nc] x_c [nc,K], FP32 */
    const dw_gemm_args wg = {.pass = DW_GEMM_WGRAD, .m = V, .n = K, .k = nc, .a = dw_linear_bf16(chunk, nc, V, true),
                             .b = dw_linear_bf16(xc, nc, K, false), .alpha = 1.0f, .beta = 1.0f, .c = c->pgrad[1],
                             .d = c->pgrad[1], .out_type = DW_GEMM_OUT_F32};
    return dw_gemm(be->ctx, &wg);
}

dw_status dw_cuda_op_head_xent_fwd(dw_backend *be, const dw_op_call *c) {
    const dw_compiled *p = c->x->p;
    const int64_t N = c->rows, K = dw_cuda_width(c, c->n->in[0]), V = c->x->g->tensors[c->n->in[1]].shape[0];
    if (p->bf16 && !c->in_bf16[1] && !dw_head_quantised(p))
        return dw_set_error(be->ctx, DW_ERR_INVALID, "cuda backend: the fused head's weight has no BF16 copy");
    void *ws = c->tmp[DW_TMP_XENT], *chunk = (char *)ws + dw_compile_head_logits_off(p->g->batch * p->g->seq);
    DW_TRY(dw_cuda_cross_entropy_begin(be->ctx, ws, c->in[2], N, DW_CUDA_STREAM(be)));
    for (int64_t r0 = 0; r0 < N; r0 += p->head_chunk)
        DW_TRY(one_chunk(be, c, ws, chunk, r0, N - r0 < p->head_chunk ? N - r0 : p->head_chunk, K, V));
    dw_cuda_qlin_reset(be); /* (a quantised head's chunks left theirs in the slots) */
    return dw_cuda_cross_entropy_end(be->ctx, c->out[0], ws, N, DW_CUDA_STREAM(be));
}

/* Done by the forward of the training step (ops.def BWD_IN_FWD): the program has no such step. */
dw_status dw_cuda_op_head_xent_bwd(dw_backend *be, const dw_op_call *c) {
    (void)c;
    return dw_set_error(be->ctx, DW_ERR_INVALID, "cuda backend: the fused head's backward runs in its forward");
}
#endif /* DW_HAVE_CUDA */
