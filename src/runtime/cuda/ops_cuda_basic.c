/* ops_cuda_basic.c — the CUDA backend's entries for the row-wise and elementwise ops: embedding,
 * positions, rope, layernorm, rmsnorm (also per head; Gemma's offset weight), gelu, gelu_erf, relu, silu, swiglu,
 * geglu, add, the sigmoid gate:
 * one launch each of the kernels in kernels/cuda/ops_cuda.h on the backend's stream. Activations in
 * the program's dtype; parameters are FP32 masters, their gradients accumulated by the kernels;
 * input gradients written or, where the program says (dx_acc), added by the kernel itself. */
#include "core/error.h"
#include "runtime/backend.h"

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "kernels/cuda/ops_cuda.h"
#include "runtime/cuda/cuda.h"

#define DIMS                                                                                         \
    const int64_t N = dw_exec_rows(c->x, c->n->out[0]), C = dw_cuda_width(c, c->n->out[0]);          \
    const dw_act_dtype dt = (dw_act_dtype)dw_cuda_dt(c);                                              \
    void *s = DW_CUDA_STREAM(be);                                                                    \
    (void)N, (void)C, (void)dt, (void)s

/* ---- embedding (V,C), learned positions (maxT,C) ---------------------------------------------- */
dw_status dw_cuda_op_embedding_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    const int64_t V = c->x->g->tensors[c->n->in[1]].shape[0];
    return dw_cuda_embedding_fwd(be->ctx, dt, c->out[0], c->in[0], c->in[1], N, C, V, s);
}
dw_status dw_cuda_op_embedding_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    const int64_t V = c->x->g->tensors[c->n->in[1]].shape[0];
    const int64_t pad = c->n->attrs.has_pad ? c->n->attrs.pad : -1; /* nn.Embedding padding_idx */
    return dw_cuda_embedding_bwd_pad(be->ctx, dt, c->pgrad[1], c->dout[0], c->in[0], N, C, V, pad, s);
}
dw_status dw_cuda_op_position_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    return dw_cuda_pos_fwd(be->ctx, dt, c->out[0], c->in[0], c->in[1], c->b, c->t, C, s);
}
dw_status dw_cuda_op_position_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    return dw_cuda_pos_bwd(be->ctx, dt, c->dx[0], c->pgrad[1], c->dout[0], c->b, c->t, C, s);
}

/* ---- rope ------------------------------------------------------------------------------------- */
dw_status dw_cuda_op_rope_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    const dw_ir_attrs *a = &c->n->attrs;
    return dw_cuda_rope_fwd(be->ctx, dt, c->out[0], c->in[0], c->b, c->t, a->heads, a->head_dim, a->theta, &a->rope, s);
}
dw_status dw_cuda_op_rope_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    const dw_ir_attrs *a = &c->n->attrs;
    if (!c->dx[0]) return DW_OK;
    return dw_cuda_rope_bwd(be->ctx, dt, c->dx[0], c->dout[0], c->b, c->t, a->heads, a->head_dim, a->theta, &a->rope, s);
}

/* ---- norms: one-pass backward with DELTA's partial sums; a later gradient of x added in place - */
dw_status dw_cuda_op_layernorm_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    bool done = false; /* before fp8_block linear layers: their x rows quantised too */
    DW_TRY(dw_cuda_norm_quant_fwd(be, c, &done));
    if (done) return DW_OK;
    return dw_cuda_layernorm_fwd(be->ctx, dt, c->out[0], c->aux[DW_AUX_STAT0], c->aux[DW_AUX_STAT1], c->in[0], c->in[1],
                                 c->in[2], N, C, c->n->attrs.eps, s);
}
dw_status dw_cuda_op_layernorm_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    return dw_cuda_layernorm_bwd_ws(be->ctx, dt, c->dx[0], c->pgrad[1], c->pgrad[2], c->dout[0], c->in[0], c->in[1],
                                    c->aux[DW_AUX_STAT0], c->aux[DW_AUX_STAT1], N, C, c->dx_acc[0], c->tmp[DW_TMP_DELTA],
                                    dw_cuda_norm_bwd_ws_bytes(N, C), s);
}
/* rmsnorm applies its weight as attrs.offset + w (Gemma's 1 + w; offset 0: w) */
dw_status dw_cuda_op_rmsnorm_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    bool done = false; /* before fp8_block linear layers: their x rows quantised too */
    DW_TRY(dw_cuda_norm_quant_fwd(be, c, &done));
    if (done) return DW_OK;
    return dw_cuda_rmsnorm_fwd_offset(be->ctx, dt, c->out[0], c->aux[DW_AUX_STAT0], c->in[0], c->in[1],
                                      c->n->attrs.offset, N, C, c->n->attrs.eps, s);
}
dw_status dw_cuda_op_rmsnorm_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    return dw_cuda_rmsnorm_bwd_offset(be->ctx, dt, c->dx[0], c->pgrad[1], c->dout[0], c->in[0], c->in[1],
                                      c->n->attrs.offset, c->aux[DW_AUX_STAT0], N, C, c->dx_acc[0],
                                      c->tmp[DW_TMP_DELTA], dw_cuda_norm_bwd_ws_bytes(N, C), s);
}

/* ---- head_rmsnorm: rmsnorm over each head's D channels (N*H rows), one weight for all heads; aux
 * STAT0 = rstd (N*H), DELTA sized for N*H rows of D --------------------------------------------- */
dw_status dw_cuda_op_head_rmsnorm_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    const int64_t D = c->n->attrs.head_dim;
    return dw_cuda_head_rmsnorm_fwd(be->ctx, dt, c->out[0], c->aux[DW_AUX_STAT0], c->in[0], c->in[1], N, C / D, D,
                                    c->n->attrs.eps, s);
}
dw_status dw_cuda_op_head_rmsnorm_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    const int64_t D = c->n->attrs.head_dim;
    return dw_cuda_head_rmsnorm_bwd(be->ctx, dt, c->dx[0], c->pgrad[1], c->dout[0], c->in[0], c->in[1],
                                    c->aux[DW_AUX_STAT0], N, C / D, D, c->dx_acc[0], c->tmp[DW_TMP_DELTA],
                                    dw_cuda_norm_bwd_ws_bytes(N * (C / D), D), s);
}

/* ---- elementwise ------------------------------------------------------------------------------ */
dw_status dw_cuda_op_gelu_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    return dw_cuda_gelu_fwd(be->ctx, dt, c->out[0], c->in[0], N * C, s);
}
dw_status dw_cuda_op_gelu_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    return dw_cuda_gelu_bwd(be->ctx, dt, c->dx[0], c->dout[0], c->in[0], N * C, s);
}
dw_status dw_cuda_op_gelu_erf_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    return dw_cuda_gelu_erf_fwd(be->ctx, dt, c->out[0], c->in[0], N * C, s);
}
dw_status dw_cuda_op_gelu_erf_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    return dw_cuda_gelu_erf_bwd(be->ctx, dt, c->dx[0], c->dout[0], c->in[0], N * C, s);
}
dw_status dw_cuda_op_relu_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    return dw_cuda_relu_fwd(be->ctx, dt, c->out[0], c->in[0], N * C, s);
}
dw_status dw_cuda_op_relu_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    return dw_cuda_relu_bwd(be->ctx, dt, c->dx[0], c->dout[0], c->in[0], N * C, s);
}
dw_status dw_cuda_op_silu_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    return dw_cuda_silu_fwd(be->ctx, dt, c->out[0], c->in[0], N * C, s);
}
dw_status dw_cuda_op_silu_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    return dw_cuda_silu_bwd(be->ctx, dt, c->dx[0], c->dout[0], c->in[0], N * C, s);
}
dw_status dw_cuda_op_swiglu_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    bool done = false; /* before an fp8_block down projection: its rows quantised too */
    DW_TRY(dw_cuda_swiglu_quant_fwd(be, c, &done));
    if (done) return DW_OK;
    return dw_cuda_swiglu_fwd(be->ctx, dt, c->out[0], c->in[0], c->in[1], N * C, s);
}
dw_status dw_cuda_op_swiglu_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    bool done = false; /* before fp8_block gate and up layers: their dy and dy^T, not BF16 gradients */
    DW_TRY(dw_cuda_swiglu_quant_bwd(be, c, &done));
    if (done) return DW_OK;
    return dw_cuda_swiglu_bwd(be->ctx, dt, c->dx[0], c->dx[1], c->dout[0], c->in[0], c->in[1], N * C, s);
}
dw_status dw_cuda_op_geglu_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    return dw_cuda_geglu_fwd(be->ctx, dt, c->out[0], c->in[0], c->in[1], N * C, s);
}
dw_status dw_cuda_op_geglu_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    return dw_cuda_geglu_bwd(be->ctx, dt, c->dx[0], c->dx[1], c->dout[0], c->in[0], c->in[1], N * C, s);
}

/* ---- add: identity to both inputs: copied into a first gradient (nothing to do where it shares
 * the output's gradient buffer), added into a later one --------------------------------------- */
dw_status dw_cuda_op_add_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    return dw_cuda_add_fwd(be->ctx, dt, c->out[0], c->in[0], c->in[1], N * C, s);
}
dw_status dw_cuda_op_add_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    for (int k = 0; k < 2; k++) {
        void *g = c->dx[k];
        if (!g) continue;
        if (c->dx_acc[k]) DW_TRY(dw_cuda_add_fwd(be->ctx, dt, g, g, c->dout[0], N * C, s));
        else if (g != c->dout[0])
            DW_CUDA_CHECK(be->ctx, cudaMemcpyAsync(g, c->dout[0], (size_t)(N * C * dw_act_size(dt)), cudaMemcpyDeviceToDevice,
                                                   (cudaStream_t)s));
    }
    return DW_OK;
}

/* ---- sigmoid_gate: out (N,C) = sigmoid(g (N,1)) * x; backward adds into x's gradient where the
 * program says, writes the gate's -------------------------------------------------------------- */
dw_status dw_cuda_op_sigmoid_gate_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    return dw_cuda_sigmoid_gate_fwd(be->ctx, dt, c->out[0], c->in[0], c->in[1], N, C, s);
}
dw_status dw_cuda_op_sigmoid_gate_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    return dw_cuda_sigmoid_gate_bwd(be->ctx, dt, c->dx[0], c->dx[1], c->dout[0], c->in[0], c->in[1], N, C,
                                    c->dx_acc[0], s);
}
#endif /* DW_HAVE_CUDA */
