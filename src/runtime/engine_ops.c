/* engine_ops.c — the CPU engine's forward and backward rule for every IR op, each a thin call
 * of the CPU reference kernels (kernels/cpu/ops_cpu.h), wired by ops.def. Activations are
 * (b, t, width) for the current batch; gradients of activations read by several nodes are
 * accumulated here (the kernels write input gradients). Not the graph walk (engine_cpu.c). */
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/ops_cpu.h"
#include "runtime/engine_cpu.h"

#define X(i) (e->val[n->in[(i)]])
#define W(i) (e->val[n->in[(i)]])
#define DW(i) (e->grad[n->in[(i)]]) /* parameter gradient (accumulated by the kernels) */
#define OUT (e->val[n->out])
#define DOUT (e->grad[n->out])
#define ROWS (e->b * e->t)

static int64_t width(const dw_engine *e, int tensor) {
    const dw_ir_tensor *t = &e->g->tensors[tensor];
    return t->shape[t->ndim - 1];
}

/* Where to write the gradient of input `slot` (NULL when it needs none: token inputs, or a
 * parameter, whose gradient the kernels accumulate themselves). The first writer writes the
 * activation's gradient directly; later ones write scratch that in_grad_done() adds in. */
static float *in_grad(dw_engine *e, const dw_ir_node *n, int slot) {
    int t = n->in[slot];
    if (e->g->tensors[t].kind != DW_TENSOR_ACT) return NULL;
    return e->grad_ready[t] ? e->scratch[slot] : e->grad[t];
}
static void in_grad_done(dw_engine *e, const dw_ir_node *n, int slot) {
    int t = n->in[slot];
    if (e->g->tensors[t].kind != DW_TENSOR_ACT) return;
    if (!e->grad_ready[t]) {
        e->grad_ready[t] = true;
        return;
    }
    int64_t cnt = ROWS * width(e, t);
    float *g = e->grad[t];
    const float *s = e->scratch[slot];
    for (int64_t i = 0; i < cnt; i++) g[i] += s[i];
}

/* ---- embedding, positions ---- */
static void fwd_embedding(dw_engine *e, const dw_ir_node *n) {
    dw_cpu_embedding_fwd(OUT, e->tokens, W(1), ROWS, width(e, n->out));
}
static void bwd_embedding(dw_engine *e, const dw_ir_node *n, double dloss) {
    dw_cpu_embedding_bwd(DW(1), DOUT, e->tokens, ROWS, width(e, n->out));
}
static void fwd_position(dw_engine *e, const dw_ir_node *n) {
    dw_cpu_pos_fwd(OUT, X(0), W(1), e->b, e->t, width(e, n->out));
}
static void bwd_position(dw_engine *e, const dw_ir_node *n, double dloss) {
    dw_cpu_pos_bwd(in_grad(e, n, 0), DW(1), DOUT, e->b, e->t, width(e, n->out));
    in_grad_done(e, n, 0);
}

/* ---- rope ---- */
static void fwd_rope(dw_engine *e, const dw_ir_node *n) {
    const dw_ir_attrs *a = &n->attrs;
    dw_cpu_rope_fwd(OUT, X(0), e->b, e->t, a->heads, a->head_dim, a->theta);
}
static void bwd_rope(dw_engine *e, const dw_ir_node *n, double dloss) {
    const dw_ir_attrs *a = &n->attrs;
    float *dx = in_grad(e, n, 0);
    if (!dx) return;
    dw_cpu_rope_bwd(dx, DOUT, e->b, e->t, a->heads, a->head_dim, a->theta);
    in_grad_done(e, n, 0);
}

/* ---- norms: aux = mean (N) then rstd (N) for layernorm; rstd (N) for rmsnorm ---- */
static void fwd_layernorm(dw_engine *e, const dw_ir_node *n) {
    float *mean = e->aux[n - e->g->nodes], *rstd = mean + e->cap_b * e->cap_t;
    dw_cpu_layernorm_fwd(OUT, mean, rstd, X(0), W(1), W(2), ROWS, width(e, n->out), n->attrs.eps);
}
static void bwd_layernorm(dw_engine *e, const dw_ir_node *n, double dloss) {
    float *mean = e->aux[n - e->g->nodes], *rstd = mean + e->cap_b * e->cap_t;
    dw_cpu_layernorm_bwd(in_grad(e, n, 0), DW(1), DW(2), DOUT, X(0), W(1), mean, rstd, ROWS,
                         width(e, n->out));
    in_grad_done(e, n, 0);
}
static void fwd_rmsnorm(dw_engine *e, const dw_ir_node *n) {
    dw_cpu_rmsnorm_fwd(OUT, e->aux[n - e->g->nodes], X(0), W(1), ROWS, width(e, n->out),
                       n->attrs.eps);
}
static void bwd_rmsnorm(dw_engine *e, const dw_ir_node *n, double dloss) {
    dw_cpu_rmsnorm_bwd(in_grad(e, n, 0), DW(1), DOUT, X(0), W(1), e->aux[n - e->g->nodes], ROWS,
                       width(e, n->out));
    in_grad_done(e, n, 0);
}

/* ---- linear ---- */
static void fwd_linear(dw_engine *e, const dw_ir_node *n) {
    dw_cpu_linear_fwd(OUT, X(0), W(1), n->n_in == 3 ? W(2) : NULL, ROWS, width(e, n->in[0]),
                      width(e, n->out));
}
static void bwd_linear(dw_engine *e, const dw_ir_node *n, double dloss) {
    dw_cpu_linear_bwd(in_grad(e, n, 0), DW(1), n->n_in == 3 ? DW(2) : NULL, DOUT, X(0), W(1), ROWS,
                      width(e, n->in[0]), width(e, n->out));
    in_grad_done(e, n, 0);
}

/* ---- activations ---- */
static void fwd_gelu(dw_engine *e, const dw_ir_node *n) {
    dw_cpu_gelu_fwd(OUT, X(0), ROWS * width(e, n->out));
}
static void bwd_gelu(dw_engine *e, const dw_ir_node *n, double dloss) {
    dw_cpu_gelu_bwd(in_grad(e, n, 0), DOUT, X(0), ROWS * width(e, n->out));
    in_grad_done(e, n, 0);
}
static void fwd_silu(dw_engine *e, const dw_ir_node *n) {
    dw_cpu_silu_fwd(OUT, X(0), ROWS * width(e, n->out));
}
static void bwd_silu(dw_engine *e, const dw_ir_node *n, double dloss) {
    dw_cpu_silu_bwd(in_grad(e, n, 0), DOUT, X(0), ROWS * width(e, n->out));
    in_grad_done(e, n, 0);
}
static void fwd_swiglu(dw_engine *e, const dw_ir_node *n) {
    dw_cpu_swiglu_fwd(OUT, X(0), X(1), ROWS * width(e, n->out));
}
static void bwd_swiglu(dw_engine *e, const dw_ir_node *n, double dloss) {
    dw_cpu_swiglu_bwd(in_grad(e, n, 0), in_grad(e, n, 1), DOUT, X(0), X(1), ROWS * width(e, n->out));
    in_grad_done(e, n, 0);
    in_grad_done(e, n, 1);
}
static void fwd_add(dw_engine *e, const dw_ir_node *n) {
    dw_cpu_add_fwd(OUT, X(0), X(1), ROWS * width(e, n->out));
}
static void bwd_add(dw_engine *e, const dw_ir_node *n, double dloss) {
    size_t bytes = (size_t)(ROWS * width(e, n->out)) * sizeof(float);
    for (int s = 0; s < 2; s++) {
        float *d = in_grad(e, n, s);
        if (!d) continue;
        memcpy(d, DOUT, bytes);
        in_grad_done(e, n, s);
    }
}

/* ---- attention: aux = lse (B,H,T) [+ q (N,H*D), k, v (N,Hkv*D) unpacked from a packed qkv] ---- */
static void qkv_parts(dw_engine *e, const dw_ir_node *n, float **q, float **k, float **v) {
    const dw_ir_attrs *a = &n->attrs;
    float *base = e->aux[n - e->g->nodes] + e->cap_b * e->cap_t * a->heads;
    int64_t N = ROWS;
    *q = base;
    *k = *q + N * a->heads * a->head_dim;
    *v = *k + N * a->kv_heads * a->head_dim;
}
static void fwd_attention(dw_engine *e, const dw_ir_node *n) {
    const dw_ir_attrs *a = &n->attrs;
    float *lse = e->aux[n - e->g->nodes];
    if (n->n_in == 3) {
        dw_cpu_attention_fwd(OUT, lse, X(0), X(1), X(2), e->b, e->t, a->heads, a->kv_heads, a->head_dim);
        return;
    }
    float *q, *k, *v;
    qkv_parts(e, n, &q, &k, &v);
    int64_t dq = a->heads * a->head_dim, dkv = a->kv_heads * a->head_dim, w = dq + 2 * dkv;
    const float *x = X(0);
    for (int64_t r = 0; r < ROWS; r++) {
        memcpy(q + r * dq, x + r * w, (size_t)dq * sizeof(float));
        memcpy(k + r * dkv, x + r * w + dq, (size_t)dkv * sizeof(float));
        memcpy(v + r * dkv, x + r * w + dq + dkv, (size_t)dkv * sizeof(float));
    }
    dw_cpu_attention_fwd(OUT, lse, q, k, v, e->b, e->t, a->heads, a->kv_heads, a->head_dim);
}
static void bwd_attention(dw_engine *e, const dw_ir_node *n, double dloss) {
    const dw_ir_attrs *a = &n->attrs;
    float *lse = e->aux[n - e->g->nodes];
    if (n->n_in == 3) {
        dw_cpu_attention_bwd(in_grad(e, n, 0), in_grad(e, n, 1), in_grad(e, n, 2), DOUT, X(0), X(1),
                             X(2), OUT, lse, e->b, e->t, a->heads, a->kv_heads, a->head_dim);
        for (int s = 0; s < 3; s++) in_grad_done(e, n, s);
        return;
    }
    float *q, *k, *v;
    qkv_parts(e, n, &q, &k, &v);
    int64_t N = ROWS, dq = a->heads * a->head_dim, dkv = a->kv_heads * a->head_dim, w = dq + 2 * dkv;
    float *gq = e->scratch[1], *gk = gq + N * dq, *gv = gk + N * dkv; /* scratch[1] holds N*w */
    dw_cpu_attention_bwd(gq, gk, gv, DOUT, q, k, v, OUT, lse, e->b, e->t, a->heads, a->kv_heads,
                         a->head_dim);
    float *dx = in_grad(e, n, 0);
    if (!dx) return;
    for (int64_t r = 0; r < N; r++) {
        memcpy(dx + r * w, gq + r * dq, (size_t)dq * sizeof(float));
        memcpy(dx + r * w + dq, gk + r * dkv, (size_t)dkv * sizeof(float));
        memcpy(dx + r * w + dq + dkv, gv + r * dkv, (size_t)dkv * sizeof(float));
    }
    in_grad_done(e, n, 0);
}

/* ---- loss ---- */
static void fwd_cross_entropy(dw_engine *e, const dw_ir_node *n) {
    e->loss = dw_cpu_cross_entropy_fwd(X(0), e->targets, ROWS, width(e, n->in[0]));
    OUT[0] = (float)e->loss;
}
static void bwd_cross_entropy(dw_engine *e, const dw_ir_node *n, double dloss) {
    dw_cpu_cross_entropy_bwd(in_grad(e, n, 0), X(0), e->targets, ROWS, width(e, n->in[0]), dloss);
    in_grad_done(e, n, 0);
}

typedef void (*fwd_fn)(dw_engine *, const dw_ir_node *);
typedef void (*bwd_fn)(dw_engine *, const dw_ir_node *, double);
static const struct {
    fwd_fn fwd;
    bwd_fn bwd;
} rules[] = {
#define DW_OP(ID, name, min_in, max_in, flags, cpu, cuda, summary) {fwd_##name, bwd_##name},
#include "ir/ops.def"
#undef DW_OP
};
_Static_assert(sizeof rules / sizeof rules[0] == DW_OP_COUNT, "engine rules vs ops.def");

void dw_engine_cpu_fwd(dw_engine *e, const dw_ir_node *n) { rules[n->op].fwd(e, n); }
void dw_engine_cpu_bwd(dw_engine *e, const dw_ir_node *n, double dloss) { rules[n->op].bwd(e, n, dloss); }

int64_t dw_engine_cpu_aux_size(const dw_graph *g, const dw_ir_node *n) {
    int64_t N = g->batch * g->seq;
    switch (n->op) {
    case DW_OP_LAYERNORM: return 2 * N;
    case DW_OP_RMSNORM: return N;
    case DW_OP_ATTENTION:
        return N * n->attrs.heads +
               (n->n_in == 1 ? N * (n->attrs.heads + 2 * n->attrs.kv_heads) * n->attrs.head_dim : 0);
    default: return 0;
    }
}
