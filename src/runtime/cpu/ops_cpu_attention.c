/* ops_cpu_attention.c — the CPU backend's causal GQA attention (with the node's sliding window,
 * attrs.window, and score soft-cap, attrs.softcap, when it has them): q (B,T,H,D), k, v (B,T,Hkv,D)
 * given separately or as one packed qkv (B,T,(H+2Hkv)D) that is split into scratch here (forward
 * and backward; the program's unpacked aux copies are the GPU kernels' business). lse (B,H,T)
 * is the saved FP32 aux STAT0. */
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/ops_cpu.h"
#include "runtime/cpu/cpu.h"

/* q, k, v as FP32: the three inputs, or the packed one split into scratch. NULL on NOMEM. */
static bool qkv(dw_backend *be, const dw_op_call *c, const float **q, const float **k, const float **v) {
    const dw_ir_attrs *a = &c->n->attrs;
    const int64_t N = c->rows, dq = a->heads * a->head_dim, dkv = a->kv_heads * a->head_dim;
    if (c->n->n_in == 3) {
        *q = dw_cpu_in(be, c, c->in[0], N * dq, CPU_S_IN0);
        *k = dw_cpu_in(be, c, c->in[1], N * dkv, CPU_S_IN1);
        *v = dw_cpu_in(be, c, c->in[2], N * dkv, CPU_S_IN2);
        return *q && *k && *v;
    }
    const int64_t w = dq + 2 * dkv;
    const float *x = dw_cpu_in(be, c, c->in[0], N * w, CPU_S_IN0);
    float *fq = dw_cpu_scratch(be, CPU_S_Q, N * dq), *fk = dw_cpu_scratch(be, CPU_S_K, N * dkv);
    float *fv = dw_cpu_scratch(be, CPU_S_V, N * dkv);
    if (!x || !fq || !fk || !fv) return false;
    for (int64_t r = 0; r < N; r++) {
        memcpy(fq + r * dq, x + r * w, (size_t)dq * sizeof(float));
        memcpy(fk + r * dkv, x + r * w + dq, (size_t)dkv * sizeof(float));
        memcpy(fv + r * dkv, x + r * w + dq + dkv, (size_t)dkv * sizeof(float));
    }
    *q = fq, *k = fk, *v = fv;
    return true;
}

dw_status dw_cpu_op_attention_fwd(dw_backend *be, const dw_op_call *c) {
    const dw_ir_attrs *a = &c->n->attrs;
    const int64_t N = c->rows, dq = a->heads * a->head_dim;
    const float *q, *k, *v;
    float *y;
    if (!qkv(be, c, &q, &k, &v) || !(y = dw_cpu_out(be, c, c->out[0], N * dq, CPU_S_OUT))) return DW_ERR_NOMEM;
    dw_cpu_attention_softcap_fwd(y, c->aux[DW_AUX_STAT0], q, k, v, c->b, c->t, a->heads, a->kv_heads, a->head_dim,
                                 a->window, a->softcap);
    dw_cpu_put(c, c->out[0], y, N * dq, false);
    return DW_OK;
}

dw_status dw_cpu_op_attention_bwd(dw_backend *be, const dw_op_call *c) {
    const dw_ir_attrs *a = &c->n->attrs;
    const int64_t N = c->rows, dq = a->heads * a->head_dim, dkv = a->kv_heads * a->head_dim;
    const float *q, *k, *v, *y, *dy;
    if (!qkv(be, c, &q, &k, &v)) return DW_ERR_NOMEM;
    y = dw_cpu_in(be, c, c->out[0], N * dq, CPU_S_OUT);
    dy = dw_cpu_in(be, c, c->dout[0], N * dq, CPU_S_DOUT);
    float *gq = dw_cpu_scratch(be, CPU_S_DX0, N * dq), *gk = dw_cpu_scratch(be, CPU_S_DX1, N * dkv);
    float *gv = dw_cpu_scratch(be, CPU_S_DX2, N * dkv);
    if (!y || !dy || !gq || !gk || !gv) return DW_ERR_NOMEM;
    dw_cpu_attention_softcap_bwd(gq, gk, gv, dy, q, k, v, y, c->aux[DW_AUX_STAT0], c->b, c->t, a->heads,
                                 a->kv_heads, a->head_dim, a->window, a->softcap);
    if (c->n->n_in == 3) {
        dw_cpu_deliver(c, 0, gq, N * dq);
        dw_cpu_deliver(c, 1, gk, N * dkv);
        dw_cpu_deliver(c, 2, gv, N * dkv);
        return DW_OK;
    }
    if (!c->dx[0]) return DW_OK;
    const int64_t w = dq + 2 * dkv; /* merge into the packed gradient (CPU_S_Q is free again) */
    float *g = dw_cpu_scratch(be, CPU_S_Q, N * w);
    if (!g) return DW_ERR_NOMEM;
    for (int64_t r = 0; r < N; r++) {
        memcpy(g + r * w, gq + r * dq, (size_t)dq * sizeof(float));
        memcpy(g + r * w + dq, gk + r * dkv, (size_t)dkv * sizeof(float));
        memcpy(g + r * w + dq + dkv, gv + r * dkv, (size_t)dkv * sizeof(float));
    }
    dw_cpu_deliver(c, 0, g, N * w);
    return DW_OK;
}
