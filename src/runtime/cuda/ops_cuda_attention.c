/* ops_cuda_attention.c — the CUDA backend's causal GQA attention. A packed qkv whose kernels can
 * read it in place (kernels/cuda/attn_packed.h: BF16, every pointer of both directions aligned)
 * runs without copies; else it is split into the node's saved q, k, v (aux Q/K/V) in the forward
 * and the gradients merged back from GQ/GK/GV in the backward. lse is aux STAT0, DELTA scratch.
 * A sliding window shorter than the sequence (mistral, qwen2, Gemma 2) or soft-capped scores (Gemma 2)
 * run dw_cuda_attention_window_* (cuDNN where its plan for the mask builds, else the tensor-core
 * kernels where they apply, else the reference ones), split like an unaligned packed qkv. */
#include "core/error.h"
#include "runtime/backend.h"

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "kernels/cuda/attn_packed.h"
#include "kernels/cuda/ops_cuda.h"
#include "runtime/cuda/cuda.h"
#include "runtime/cuda/kern.h"

/* The node's sliding window when it is shorter than the sequence (a longer one is the causal
 * mask), else 0. */
static int64_t window(const dw_op_call *c) {
    const int64_t w = c->n->attrs.window;
    return w > 0 && w < c->t ? w : 0;
}

/* Whether the node masks a window or caps its scores (dw_cuda_attention_window_*). */
static bool masked(const dw_op_call *c) { return window(c) || c->n->attrs.softcap > 0; }

/* Whether a packed-qkv node runs in place: decided from every pointer either direction touches
 * (the same call in both, and at creation: the prepare entry). */
static bool packed(const dw_op_call *c) {
    const void *ptrs[] = {c->in[0], c->out[0], c->dout[0], c->dx[0]};
    return c->n->n_in == 1 && c->dx[0] && !masked(c) &&
           dw_cuda_attention_packed_ok((dw_act_dtype)dw_cuda_dt(c), c->n->attrs.head_dim, ptrs, 4);
}

static void qkv(const dw_op_call *c, const void **q, const void **k, const void **v) {
    if (c->n->n_in == 3) *q = c->in[0], *k = c->in[1], *v = c->in[2];
    else *q = c->aux[DW_AUX_Q], *k = c->aux[DW_AUX_K], *v = c->aux[DW_AUX_V];
}

/* At engine creation: the cuDNN plans (and their buffers) for the node's shape, window and cap,
 * built outside any recorded step. */
dw_status dw_cuda_op_attention_prepare(dw_backend *be, const dw_op_call *c) {
    const dw_ir_attrs *a = &c->n->attrs;
    return dw_cuda_attention_prepare(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->b, c->t, a->heads, a->kv_heads,
                                     a->head_dim, packed(c), window(c), a->softcap);
}

dw_status dw_cuda_op_attention_fwd(dw_backend *be, const dw_op_call *c) {
    const dw_ir_attrs *a = &c->n->attrs;
    const dw_act_dtype dt = (dw_act_dtype)dw_cuda_dt(c);
    void *s = DW_CUDA_STREAM(be);
    if (packed(c))
        return dw_cuda_attention_fwd_packed(be->ctx, c->out[0], c->aux[DW_AUX_STAT0], c->in[0], c->b, c->t, a->heads,
                                            a->kv_heads, a->head_dim, s);
    if (c->n->n_in == 1)
        DW_CUDA_CHECK(be->ctx, (cudaError_t)dw_cuda_be_qkv(c->in[0], c->aux[DW_AUX_Q], c->aux[DW_AUX_K], c->aux[DW_AUX_V],
                                                           c->rows, a->heads * a->head_dim, a->kv_heads * a->head_dim,
                                                           dw_act_size(dt), false, s));
    const void *q, *k, *v;
    qkv(c, &q, &k, &v);
    if (masked(c))
        return dw_cuda_attention_window_fwd(be->ctx, dt, c->out[0], c->aux[DW_AUX_STAT0], q, k, v, c->b, c->t, a->heads,
                                            a->kv_heads, a->head_dim, window(c), a->softcap, s);
    return dw_cuda_attention_fwd(be->ctx, dt, c->out[0], c->aux[DW_AUX_STAT0], q, k, v, c->b, c->t, a->heads, a->kv_heads,
                                 a->head_dim, s);
}

dw_status dw_cuda_op_attention_bwd(dw_backend *be, const dw_op_call *c) {
    const dw_ir_attrs *a = &c->n->attrs;
    const dw_act_dtype dt = (dw_act_dtype)dw_cuda_dt(c);
    void *s = DW_CUDA_STREAM(be);
    if (packed(c))
        return dw_cuda_attention_bwd_packed(be->ctx, c->dx[0], c->dout[0], c->in[0], c->out[0], c->aux[DW_AUX_STAT0],
                                            c->tmp[DW_TMP_DELTA], c->b, c->t, a->heads, a->kv_heads, a->head_dim, s);
    const void *q, *k, *v;
    qkv(c, &q, &k, &v);
    const bool pk = c->n->n_in == 1;
    void *dq = pk ? c->tmp[DW_TMP_GQ] : c->dx[0], *dk = pk ? c->tmp[DW_TMP_GK] : c->dx[1];
    void *dv = pk ? c->tmp[DW_TMP_GV] : c->dx[2];
    if (masked(c))
        DW_TRY(dw_cuda_attention_window_bwd(be->ctx, dt, dq, dk, dv, c->dout[0], q, k, v, c->out[0],
                                            c->aux[DW_AUX_STAT0], c->tmp[DW_TMP_DELTA], c->b, c->t, a->heads,
                                            a->kv_heads, a->head_dim, window(c), a->softcap, s));
    else
        DW_TRY(dw_cuda_attention_bwd(be->ctx, dt, dq, dk, dv, c->dout[0], q, k, v, c->out[0], c->aux[DW_AUX_STAT0],
                                     c->tmp[DW_TMP_DELTA], c->b, c->t, a->heads, a->kv_heads, a->head_dim, s));
    if (!pk || !c->dx[0]) return DW_OK;
    DW_CUDA_CHECK(be->ctx, (cudaError_t)dw_cuda_be_qkv(c->dx[0], dq, dk, dv, c->rows, a->heads * a->head_dim,
                                                       a->kv_heads * a->head_dim, dw_act_size(dt), true, s));
    return DW_OK;
}
#endif /* DW_HAVE_CUDA */
