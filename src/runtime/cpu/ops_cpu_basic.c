/* ops_cpu_basic.c — the CPU backend's entries for the row-wise and elementwise ops: embedding,
 * positions, rope, layernorm, rmsnorm (also per head; Gemma's offset weight), gelu, gelu_erf, relu, silu, swiglu, geglu,
 * add, the sigmoid gate.
 * Each widens what it reads (cpu.h), runs the reference kernel (kernels/cpu/ops_cpu.h) and stores
 * or delivers the result as the program says. Parameters are FP32 masters; their gradients are accumulated by the kernels. */
#include "core/error.h"
#include "kernels/cpu/ops_cpu.h"
#include "runtime/cpu/cpu.h"

#define CHECK(p)                                                                                     \
    do {                                                                                             \
        if (!(p)) return DW_ERR_NOMEM;                                                               \
    } while (0)

/* N rows of node n's output width C. */
#define DIMS                                                                                         \
    const int64_t N = dw_exec_rows(c->x, c->n->out[0]), C = dw_cpu_width(c, c->n->out[0]);           \
    (void)N, (void)C

/* ---- embedding: out (N,C) = wte[tokens] ------------------------------------------------------ */
dw_status dw_cpu_op_embedding_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    float *y = dw_cpu_out(be, c, c->out[0], N * C, CPU_S_OUT);
    CHECK(y);
    dw_cpu_embedding_fwd(y, c->in[0], c->in[1], N, C);
    dw_cpu_put(c, c->out[0], y, N * C, false);
    return DW_OK;
}
dw_status dw_cpu_op_embedding_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    const float *dy = dw_cpu_in(be, c, c->dout[0], N * C, CPU_S_DOUT);
    CHECK(dy);
    const int64_t pad = c->n->attrs.has_pad ? c->n->attrs.pad : -1; /* nn.Embedding padding_idx */
    dw_cpu_embedding_bwd_pad(c->pgrad[1], dy, c->in[0], N, C, pad);
    return DW_OK;
}

/* ---- learned positions: out (B,T,C) = x + wpe[0:T] -------------------------------------------- */
dw_status dw_cpu_op_position_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    const float *x = dw_cpu_in(be, c, c->in[0], N * C, CPU_S_IN0);
    float *y = dw_cpu_out(be, c, c->out[0], N * C, CPU_S_OUT);
    CHECK(x && y);
    dw_cpu_pos_fwd(y, x, c->in[1], c->b, c->t, C);
    dw_cpu_put(c, c->out[0], y, N * C, false);
    return DW_OK;
}
dw_status dw_cpu_op_position_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    const float *dy = dw_cpu_in(be, c, c->dout[0], N * C, CPU_S_DOUT);
    float *dx = dw_cpu_scratch(be, CPU_S_DX0, N * C);
    CHECK(dy && dx);
    dw_cpu_pos_bwd(dx, c->pgrad[1], dy, c->b, c->t, C);
    dw_cpu_deliver(c, 0, dx, N * C);
    return DW_OK;
}

/* ---- rope over (B,T,H,D) ---------------------------------------------------------------------- */
dw_status dw_cpu_op_rope_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    const dw_ir_attrs *a = &c->n->attrs;
    const float *x = dw_cpu_in(be, c, c->in[0], N * C, CPU_S_IN0);
    float *y = dw_cpu_out(be, c, c->out[0], N * C, CPU_S_OUT);
    CHECK(x && y);
    dw_cpu_rope_fwd(y, x, c->b, c->t, a->heads, a->head_dim, a->theta, &a->rope);
    dw_cpu_put(c, c->out[0], y, N * C, false);
    return DW_OK;
}
dw_status dw_cpu_op_rope_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    if (!c->dx[0]) return DW_OK;
    const dw_ir_attrs *a = &c->n->attrs;
    const float *dy = dw_cpu_in(be, c, c->dout[0], N * C, CPU_S_DOUT);
    float *dx = dw_cpu_scratch(be, CPU_S_DX0, N * C);
    CHECK(dy && dx);
    dw_cpu_rope_bwd(dx, dy, c->b, c->t, a->heads, a->head_dim, a->theta, &a->rope);
    dw_cpu_deliver(c, 0, dx, N * C);
    return DW_OK;
}

/* ---- norms: aux STAT0 = mean (layernorm) / rstd (rmsnorm), STAT1 = rstd (layernorm), FP32 ---- */
dw_status dw_cpu_op_layernorm_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    const float *x = dw_cpu_in(be, c, c->in[0], N * C, CPU_S_IN0);
    float *y = dw_cpu_out(be, c, c->out[0], N * C, CPU_S_OUT);
    CHECK(x && y);
    dw_cpu_layernorm_fwd(y, c->aux[DW_AUX_STAT0], c->aux[DW_AUX_STAT1], x, c->in[1], c->in[2], N, C, c->n->attrs.eps);
    dw_cpu_put(c, c->out[0], y, N * C, false);
    return DW_OK;
}
dw_status dw_cpu_op_layernorm_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    const float *x = dw_cpu_in(be, c, c->in[0], N * C, CPU_S_IN0);
    const float *dy = dw_cpu_in(be, c, c->dout[0], N * C, CPU_S_DOUT);
    float *dx = dw_cpu_scratch(be, CPU_S_DX0, N * C);
    CHECK(x && dy && dx);
    dw_cpu_layernorm_bwd(dx, c->pgrad[1], c->pgrad[2], dy, x, c->in[1], c->aux[DW_AUX_STAT0], c->aux[DW_AUX_STAT1],
                         N, C);
    dw_cpu_deliver(c, 0, dx, N * C);
    return DW_OK;
}
/* The weight rmsnorm applies (C): w, or offset + w rounded to FP32 (Gemma's 1 + w, as transformers
 * adds it in FP32) in scratch. NULL when out of memory. */
static const float *rms_weight(dw_backend *be, const dw_op_call *c, int64_t C) {
    const float *w = c->in[1];
    const double off = c->n->attrs.offset;
    if (!off) return w;
    float *w1 = dw_cpu_scratch(be, CPU_S_W, C);
    for (int64_t i = 0; w1 && i < C; i++) w1[i] = (float)(off + (double)w[i]);
    return w1;
}
dw_status dw_cpu_op_rmsnorm_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    const float *x = dw_cpu_in(be, c, c->in[0], N * C, CPU_S_IN0), *w = rms_weight(be, c, C);
    float *y = dw_cpu_out(be, c, c->out[0], N * C, CPU_S_OUT);
    CHECK(x && y && w);
    dw_cpu_rmsnorm_fwd(y, c->aux[DW_AUX_STAT0], x, w, N, C, c->n->attrs.eps);
    dw_cpu_put(c, c->out[0], y, N * C, false);
    return DW_OK;
}
dw_status dw_cpu_op_rmsnorm_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    const float *x = dw_cpu_in(be, c, c->in[0], N * C, CPU_S_IN0);
    const float *dy = dw_cpu_in(be, c, c->dout[0], N * C, CPU_S_DOUT), *w = rms_weight(be, c, C);
    float *dx = dw_cpu_scratch(be, CPU_S_DX0, N * C);
    CHECK(x && dy && dx && w);
    dw_cpu_rmsnorm_bwd(dx, c->pgrad[1], dy, x, w, c->aux[DW_AUX_STAT0], N, C); /* dw: d(offset + w) = dw */
    dw_cpu_deliver(c, 0, dx, N * C);
    return DW_OK;
}

/* ---- head_rmsnorm: rmsnorm over each head's D channels, N*H rows; aux STAT0 = rstd (N*H) ---------- */
dw_status dw_cpu_op_head_rmsnorm_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    const int64_t D = c->n->attrs.head_dim;
    const float *x = dw_cpu_in(be, c, c->in[0], N * C, CPU_S_IN0);
    float *y = dw_cpu_out(be, c, c->out[0], N * C, CPU_S_OUT);
    CHECK(x && y);
    dw_cpu_rmsnorm_fwd(y, c->aux[DW_AUX_STAT0], x, c->in[1], N * (C / D), D, c->n->attrs.eps);
    dw_cpu_put(c, c->out[0], y, N * C, false);
    return DW_OK;
}
dw_status dw_cpu_op_head_rmsnorm_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    const int64_t D = c->n->attrs.head_dim;
    const float *x = dw_cpu_in(be, c, c->in[0], N * C, CPU_S_IN0);
    const float *dy = dw_cpu_in(be, c, c->dout[0], N * C, CPU_S_DOUT);
    float *dx = dw_cpu_scratch(be, CPU_S_DX0, N * C);
    CHECK(x && dy && dx);
    dw_cpu_rmsnorm_bwd(dx, c->pgrad[1], dy, x, c->in[1], c->aux[DW_AUX_STAT0], N * (C / D), D);
    dw_cpu_deliver(c, 0, dx, N * C);
    return DW_OK;
}

/* ---- elementwise ------------------------------------------------------------------------------ */
typedef void (*unary_fwd)(float *out, const float *x, int64_t n);
typedef void (*unary_bwd)(float *dx, const float *dout, const float *x, int64_t n);

static dw_status unary_f(dw_backend *be, const dw_op_call *c, unary_fwd f) {
    DIMS;
    const float *x = dw_cpu_in(be, c, c->in[0], N * C, CPU_S_IN0);
    float *y = dw_cpu_out(be, c, c->out[0], N * C, CPU_S_OUT);
    CHECK(x && y);
    f(y, x, N * C);
    dw_cpu_put(c, c->out[0], y, N * C, false);
    return DW_OK;
}
static dw_status unary_b(dw_backend *be, const dw_op_call *c, unary_bwd f) {
    DIMS;
    const float *x = dw_cpu_in(be, c, c->in[0], N * C, CPU_S_IN0);
    const float *dy = dw_cpu_in(be, c, c->dout[0], N * C, CPU_S_DOUT);
    float *dx = dw_cpu_scratch(be, CPU_S_DX0, N * C);
    CHECK(x && dy && dx);
    f(dx, dy, x, N * C);
    dw_cpu_deliver(c, 0, dx, N * C);
    return DW_OK;
}
dw_status dw_cpu_op_gelu_fwd(dw_backend *be, const dw_op_call *c) { return unary_f(be, c, dw_cpu_gelu_fwd); }
dw_status dw_cpu_op_gelu_bwd(dw_backend *be, const dw_op_call *c) { return unary_b(be, c, dw_cpu_gelu_bwd); }
dw_status dw_cpu_op_silu_fwd(dw_backend *be, const dw_op_call *c) { return unary_f(be, c, dw_cpu_silu_fwd); }
dw_status dw_cpu_op_silu_bwd(dw_backend *be, const dw_op_call *c) { return unary_b(be, c, dw_cpu_silu_bwd); }
dw_status dw_cpu_op_gelu_erf_fwd(dw_backend *be, const dw_op_call *c) { return unary_f(be, c, dw_cpu_gelu_erf_fwd); }
dw_status dw_cpu_op_gelu_erf_bwd(dw_backend *be, const dw_op_call *c) { return unary_b(be, c, dw_cpu_gelu_erf_bwd); }
dw_status dw_cpu_op_relu_fwd(dw_backend *be, const dw_op_call *c) { return unary_f(be, c, dw_cpu_relu_fwd); }
dw_status dw_cpu_op_relu_bwd(dw_backend *be, const dw_op_call *c) { return unary_b(be, c, dw_cpu_relu_bwd); }

/* out = f(a, b) elementwise over two inputs of the output's shape (swiglu, add) */
typedef void (*binary_fwd)(float *, const float *, const float *, int64_t);
static dw_status binary_f(dw_backend *be, const dw_op_call *c, binary_fwd f) {
    DIMS;
    const float *a = dw_cpu_in(be, c, c->in[0], N * C, CPU_S_IN0), *b = dw_cpu_in(be, c, c->in[1], N * C, CPU_S_IN1);
    float *y = dw_cpu_out(be, c, c->out[0], N * C, CPU_S_OUT);
    CHECK(a && b && y);
    f(y, a, b, N * C);
    dw_cpu_put(c, c->out[0], y, N * C, false);
    return DW_OK;
}

/* The backward of a gated unit act(gate) * up (swiglu, geglu): both gradients delivered. */
typedef void (*gated_bwd)(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n);
static dw_status gated_b(dw_backend *be, const dw_op_call *c, gated_bwd f) {
    DIMS;
    const float *g = dw_cpu_in(be, c, c->in[0], N * C, CPU_S_IN0), *u = dw_cpu_in(be, c, c->in[1], N * C, CPU_S_IN1);
    const float *dy = dw_cpu_in(be, c, c->dout[0], N * C, CPU_S_DOUT);
    float *dg = dw_cpu_scratch(be, CPU_S_DX0, N * C), *du = dw_cpu_scratch(be, CPU_S_DX1, N * C);
    CHECK(g && u && dy && dg && du);
    f(dg, du, dy, g, u, N * C);
    dw_cpu_deliver(c, 0, dg, N * C);
    dw_cpu_deliver(c, 1, du, N * C);
    return DW_OK;
}

dw_status dw_cpu_op_swiglu_fwd(dw_backend *be, const dw_op_call *c) { return binary_f(be, c, dw_cpu_swiglu_fwd); }
dw_status dw_cpu_op_swiglu_bwd(dw_backend *be, const dw_op_call *c) { return gated_b(be, c, dw_cpu_swiglu_bwd); }

dw_status dw_cpu_op_geglu_fwd(dw_backend *be, const dw_op_call *c) { return binary_f(be, c, dw_cpu_geglu_fwd); }
dw_status dw_cpu_op_geglu_bwd(dw_backend *be, const dw_op_call *c) { return gated_b(be, c, dw_cpu_geglu_bwd); }

/* ---- add: the residual stream; backward hands dy to both inputs (in place where a gradient
 * buffer is shared with the output's) ------------------------------------------------------------ */
dw_status dw_cpu_op_add_fwd(dw_backend *be, const dw_op_call *c) { return binary_f(be, c, dw_cpu_add_fwd); }
dw_status dw_cpu_op_add_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    const float *dy = dw_cpu_in(be, c, c->dout[0], N * C, CPU_S_DOUT);
    CHECK(dy);
    for (int s = 0; s < 2; s++) {
        if (!c->dx[s] || (c->dx[s] == c->dout[0] && !c->dx_acc[s])) continue; /* shared buffer: already there */
        dw_cpu_deliver(c, s, dy, N * C);
    }
    return DW_OK;
}

/* ---- sigmoid_gate: out (N,C) = sigmoid(g (N,1)) * x ------------------------------------------ */
dw_status dw_cpu_op_sigmoid_gate_fwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    const float *x = dw_cpu_in(be, c, c->in[0], N * C, CPU_S_IN0), *g = dw_cpu_in(be, c, c->in[1], N, CPU_S_IN1);
    float *y = dw_cpu_out(be, c, c->out[0], N * C, CPU_S_OUT);
    CHECK(x && g && y);
    dw_cpu_sigmoid_gate_fwd(y, x, g, N, C);
    dw_cpu_put(c, c->out[0], y, N * C, false);
    return DW_OK;
}
dw_status dw_cpu_op_sigmoid_gate_bwd(dw_backend *be, const dw_op_call *c) {
    DIMS;
    if (!c->dx[0] && !c->dx[1]) return DW_OK;
    const float *x = dw_cpu_in(be, c, c->in[0], N * C, CPU_S_IN0), *g = dw_cpu_in(be, c, c->in[1], N, CPU_S_IN1);
    const float *dy = dw_cpu_in(be, c, c->dout[0], N * C, CPU_S_DOUT);
    float *dx = dw_cpu_scratch(be, CPU_S_DX0, N * C), *dg = dw_cpu_scratch(be, CPU_S_DX1, N);
    CHECK(x && g && dy && dx && dg);
    dw_cpu_sigmoid_gate_bwd(dx, dg, dy, x, g, N, C);
    dw_cpu_deliver(c, 0, dx, N * C);
    dw_cpu_deliver(c, 1, dg, N);
    return DW_OK;
}
