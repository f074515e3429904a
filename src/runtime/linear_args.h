/* linear_args.h — private to runtime/: a linear node's three BF16 GEMMs as dw_gemm_args, the same
 * for every backend (each passes its BF16 weight copy w and runs dw_gemm). Shapes: x (N,K),
 * W (M,K), y and dy (N,M). */
#ifndef DW_RUNTIME_LINEAR_ARGS_H
#define DW_RUNTIME_LINEAR_ARGS_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"
#include "runtime/backend.h"

static inline dw_gemm_operand dw_linear_bf16(const void *data, int64_t rows, int64_t cols, bool trans) {
    return (dw_gemm_operand){.recipe = DW_RECIPE_BF16, .trans = trans, .rows = rows, .cols = cols, .data = data,
                             .tensor_scale = 1.0f};
}

/* fprop: y = x W^T (+ bias), and with a fused GELU (fuse_out) y the pre-activation (aux) and
 * fuse_out = GELU(y). */
static inline dw_gemm_args dw_linear_fprop_args(const dw_op_call *c, const uint16_t *w, int64_t N, int64_t K,
                                                int64_t M) {
    dw_gemm_args a = {.pass = DW_GEMM_FPROP, .m = N, .n = M, .k = K, .a = dw_linear_bf16(c->in[0], N, K, false),
                      .b = dw_linear_bf16(w, M, K, true), .alpha = 1.0f, .d = c->out[0], .out_type = DW_GEMM_OUT_BF16};
    if (c->n->n_in == 3) a.epilogue = DW_EPI_BIAS, a.bias = c->in_bf16[2];
    if (c->fuse_out) a.epilogue |= DW_EPI_GELU | DW_EPI_GELU_AUX, a.aux = c->out[0], a.d = c->fuse_out;
    return a;
}

/* dgrad: dx = dy W, written over dx, added into it (dx_acc), or with a fused GELU backward
 * (fuse_dx) the pre-activation's gradient (dy W) GELU'(fuse_x). */
static inline dw_gemm_args dw_linear_dgrad_args(const dw_op_call *c, const uint16_t *w, void *dx, int64_t N, int64_t K,
                                                int64_t M) {
    dw_gemm_args a = {.pass = DW_GEMM_DGRAD, .m = N, .n = K, .k = M, .a = dw_linear_bf16(c->dout[0], N, M, false),
                      .b = dw_linear_bf16(w, M, K, false), .alpha = 1.0f, .d = dx, .out_type = DW_GEMM_OUT_BF16};
    if (c->fuse_dx) a.epilogue = DW_EPI_DGELU, a.aux = c->fuse_x;
    else if (c->dx_acc[0]) a.beta = 1.0f, a.c = dx; /* into the gradient a sibling wrote */
    return a;
}

/* wgrad: dW += dy^T x in FP32 (beta 1); with bgrad (a biased node) the bias gradient written
 * there by the same GEMM's epilogue, for the caller to add into db. */
static inline dw_gemm_args dw_linear_wgrad_args(const dw_op_call *c, float *bgrad, int64_t N, int64_t K, int64_t M) {
    dw_gemm_args a = {.pass = DW_GEMM_WGRAD, .m = M, .n = K, .k = N, .a = dw_linear_bf16(c->dout[0], N, M, true),
                      .b = dw_linear_bf16(c->in[0], N, K, false), .alpha = 1.0f, .beta = 1.0f, .c = c->pgrad[1],
                      .d = c->pgrad[1], .out_type = DW_GEMM_OUT_F32};
    if (bgrad) a.epilogue = DW_EPI_BGRAD, a.bgrad = bgrad;
    return a;
}

/* Whether program p's fused LM head (program.h head_linear) runs quantised: a BF16 program whose
 * head has a quantised recipe (fuse.c fuses those that chunk exactly); its chunks then run
 * through the head linear's own op (dw_head_chunk_call). */
static inline bool dw_head_quantised(const dw_compiled *p) {
    return p->bf16 && p->head_linear >= 0 && dw_compile_quant_recipe(p->node[p->head_linear].bind.recipe);
}

/* The fused LM head's linear layer (program.h head_linear) as its own call over one chunk of a
 * head_xent call c: rows r0 .. r0 + nc of x (nc,K), their logits (nc,V) in `logits`, which the
 * cross-entropy overwrites with their gradient before the backward reads them there (dout); dx
 * the chunk's rows of c's; W's gradient added into after the first chunk. A quantised head runs
 * through the backend's own linear op on it, so each GEMM is quantised or falls back exactly as the
 * unfused head's would (ops_cpu_head_xent.c, ops_cuda_head_xent.c). */
static inline dw_op_call dw_head_chunk_call(const dw_op_call *c, int64_t r0, int64_t nc, void *logits) {
    const dw_compiled *p = c->x->p;
    const dw_ir_node *h = &c->x->g->nodes[p->head_linear];
    const dw_ir_tensor *xt = &c->x->g->tensors[h->in[0]];
    const int64_t K = xt->shape[xt->ndim - 1], as = p->act_size;
    dw_op_call l = {.x = c->x, .node = p->head_linear, .n = h, .train = c->train, .b = 1, .t = nc, .rows = nc,
                    .dloss = c->dloss};
    l.in[0] = (char *)c->in[0] + r0 * K * as;
    l.in[1] = c->in[1], l.in_bf16[1] = c->in_bf16[1];
    l.pgrad[1] = c->pgrad[1], l.pgrad_set[1] = c->pgrad_set[1] && r0 == 0;
    l.dx[0] = c->train && c->dx[0] ? (char *)c->dx[0] + r0 * K * as : NULL, l.dx_acc[0] = c->dx_acc[0];
    l.out[0] = l.dout[0] = logits;
    return l;
}

#endif /* DW_RUNTIME_LINEAR_ARGS_H */
