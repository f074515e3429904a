/* op_cost.c — the one cost model of every op, wired by ops.def: FLOPs (flops_<name>: matmul
 * FLOPs exact, 2 per multiply-add; elementwise ones nominal per-element costs, docs/ir.md) and
 * memory traffic (passes_<name>: activation elements read or written, as the engine's kernels
 * run them; the planner's time model reads them). */
#include <stdbool.h>

#include "ir/ir.h"

#define IN(i) (&g->tensors[n->in[(i)]])

static int64_t rows(const dw_ir_tensor *t) { return t->shape[0] * t->shape[1]; }
static int64_t last(const dw_ir_tensor *t) { return t->shape[t->ndim - 1]; }

/* ---- per-op FLOPs (forward; backward = input and parameter gradients) ----------------------
 * Two conventions: as executed (palm false: every op, causal attention counted over the pairs at
 * or below the diagonal) and PaLM's model FLOPs (palm true: the MFU convention of bench/ and the
 * anchors: 6 per weight element per token for matmuls, no biases or elementwise ops, attention
 * over the full T x T square: 12 H D T per layer per token). */
#define ELEMENTWISE(fwd, bwd, numel)                                                                 \
    do {                                                                                             \
        const double e_ = palm ? 0.0 : (double)(numel);                                              \
        *f = (fwd) * e_, *b = (bwd) * e_;                                                            \
    } while (0)

static void flops_embedding(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(0, 1, rows(IN(0)) * IN(1)->shape[1]); /* scatter-add into dwte */
}
static void flops_position(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(1, 1, dw_ir_numel(IN(0)));
}
static void flops_rope(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    const int64_t D = n->attrs.head_dim > 0 ? n->attrs.head_dim : 1; /* the rotating share R/D only */
    ELEMENTWISE(3, 3, (double)dw_ir_numel(IN(0)) * (double)dw_rope_dim(&n->attrs.rope, D) / (double)D);
}
static void flops_layernorm(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(7, 12, dw_ir_numel(IN(0)));
}
static void flops_rmsnorm(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(4, 8, dw_ir_numel(IN(0)));
}
static void flops_linear(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    double N = (double)rows(IN(0)), K = (double)last(IN(0)), M = (double)IN(1)->shape[0];
    const double bias = n->n_in == 3 && !palm ? N * M : 0;
    *f = 2 * N * K * M + bias;
    *b = 4 * N * K * M + bias; /* dx and dW; db */
}
static void flops_gelu(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(8, 16, dw_ir_numel(IN(0)));
}
static void flops_silu(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(4, 8, dw_ir_numel(IN(0)));
}
static void flops_gelu_erf(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(8, 16, dw_ir_numel(IN(0))); /* erf counted as tanh is */
}
static void flops_relu(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(1, 1, dw_ir_numel(IN(0)));
}
static void flops_swiglu(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(5, 10, dw_ir_numel(IN(0)));
}
static void flops_add(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(1, 0, dw_ir_numel(IN(0)));
}
/* Executed: the T(T+1)/2 query-key pairs at or below the diagonal. Forward: q k^T and p v (2
 * FLOPs per pair per channel each) + softmax (5 per pair); backward: dv, dp, dq, dk (4 matmuls) +
 * the softmax gradient. PaLM: the T^2 square, matmuls only. */
static void flops_attention(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    double B = (double)IN(0)->shape[0], T = (double)IN(0)->shape[1];
    double H = (double)n->attrs.heads, D = (double)n->attrs.head_dim;
    double pairs = palm ? B * H * T * T : B * H * T * (T + 1) / 2, soft = palm ? 0 : 5 * pairs;
    *f = 4 * pairs * D + soft;
    *b = 8 * pairs * D + soft;
}
/* moe_router: scores (exp, sum, divide), K selection passes over E, the weights; backward the
 * score gradient. Elementwise in PaLM's convention (0). */
static void flops_moe_router(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    const double K = (double)n->attrs.top_k;
    ELEMENTWISE(4 + K, 6, dw_ir_numel(IN(0)));
}
/* moe_dispatch: copies; the backward sums each token's K row gradients */
static void flops_moe_dispatch(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(0, 1, dw_ir_numel(&g->tensors[n->out[0]]));
}
/* moe_linear: a matmul per expert group: R rows x K x M in all (R = tokens x top_k), the active
 * expert weights in PaLM's convention */
static void flops_moe_linear(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    const double R = (double)rows(IN(0)), K = (double)last(IN(0)), M = (double)IN(1)->shape[1];
    *f = 2 * R * K * M;
    *b = 4 * R * K * M;
}
/* moe_aux_stats: each row's softmax (exp, sum, divide) and its sum; backward a dot and a scale */
static void flops_moe_aux_stats(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(5, 4, dw_ir_numel(IN(0)));
}
/* moe_aux_loss: E products */
static void flops_moe_aux_loss(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(2, 1, dw_ir_numel(IN(0)));
}
/* moe_combine: a multiply-add per row element; backward the row gradients and the weights' dots */
static void flops_moe_combine(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(2, 4, dw_ir_numel(IN(0)));
}
static void flops_head_rmsnorm(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(4, 8, dw_ir_numel(IN(0)));
}
/* sigmoid_gate: a multiply per element (the sigmoid per token is negligible); backward dx and the
 * gate's dot product */
static void flops_sigmoid_gate(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(1, 3, dw_ir_numel(IN(0)));
}
static void flops_cross_entropy(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(4, 3, dw_ir_numel(IN(0)));
}
/* head_xent: the head linear's three GEMMs (N rows, C in, V out) and the cross-entropy over the
 * (N,V) logits, all in the forward of a training step (counted there as the backward's share) */
static void flops_head_xent(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    const double N = (double)rows(IN(0)), C = (double)last(IN(0)), V = (double)IN(1)->shape[0];
    ELEMENTWISE(4, 3, N * V);
    *f += 2 * N * C * V;
    *b += 4 * N * C * V;
}

/* ---- memory traffic: activation elements read or written, forward / backward, as the engine's
 * kernels run them (linear, attention: 0, their traffic is the planner's GEMM and flash models) */
#define OUT (&g->tensors[n->out[0]])
#define PASSES(fwd, bwd, numel)                                                                      \
    do {                                                                                             \
        const double e_ = (double)(numel);                                                           \
        *f = (fwd) * e_, *b = (bwd) * e_;                                                            \
    } while (0)

static void passes_embedding(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    PASSES(2, 5, dw_ir_numel(OUT)); /* gather; scatter-add into FP32 grads (read dy, read-modify-write 4 B) */
}
static void passes_position(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    PASSES(3, 3, dw_ir_numel(OUT)); /* x + wpe; dx = dy and wpe's column sum */
}
static void passes_rope(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    PASSES(2, 2, dw_ir_numel(OUT));
}
static void passes_layernorm(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    PASSES(2, 5, dw_ir_numel(OUT)); /* bwd: x, dy -> dx, then column sums over x, dy */
}
static void passes_rmsnorm(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    PASSES(2, 5, dw_ir_numel(OUT));
}
static void passes_linear(const dw_graph *g, const dw_ir_node *n, double *f, double *b) { PASSES(0, 0, 0); }
static void passes_gelu(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    PASSES(2, 3, dw_ir_numel(OUT));
}
static void passes_silu(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    PASSES(2, 3, dw_ir_numel(OUT));
}
static void passes_gelu_erf(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    PASSES(2, 3, dw_ir_numel(OUT));
}
static void passes_relu(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    PASSES(2, 3, dw_ir_numel(OUT));
}
static void passes_swiglu(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    PASSES(3, 5, dw_ir_numel(OUT)); /* over the (B,T,F) output */
}
static void passes_add(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    PASSES(3, 4, dw_ir_numel(OUT)); /* bwd: dy to both inputs (copy or accumulate) */
}
static void passes_attention(const dw_graph *g, const dw_ir_node *n, double *f, double *b) { PASSES(0, 0, 0); }
static void passes_moe_router(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    const double NE = (double)dw_ir_numel(IN(0)), NK = (double)dw_ir_numel(OUT);
    *f = NE + 2 * NK; /* logits in; weights, experts out */
    *b = 2 * NE + 2 * NK; /* logits, experts, dweights in; dlogits out */
}
static void passes_moe_dispatch(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    const double NC = (double)dw_ir_numel(IN(0)), R = (double)dw_ir_numel(&g->tensors[n->out[0]]);
    *f = NC + R, *b = R + NC; /* x in, rows out; row gradients in, dx out */
}
static void passes_moe_linear(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    const double X = (double)dw_ir_numel(IN(0)), Y = (double)dw_ir_numel(OUT);
    *f = X + Y, *b = 2 * X + Y; /* x in, y out; dy, x in, dx out (the weights: parameter traffic) */
}
static void passes_moe_aux_stats(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    const double NE = (double)dw_ir_numel(IN(0)), NK = (double)dw_ir_numel(IN(1));
    *f = NE + NK, *b = 2 * NE; /* logits and experts in; logits in, dlogits out */
}
static void passes_moe_aux_loss(const dw_graph *g, const dw_ir_node *n, double *f, double *b) { *f = *b = 0; }
static void passes_moe_combine(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    const double R = (double)dw_ir_numel(IN(0)), Y = (double)dw_ir_numel(OUT);
    *f = R + Y, *b = Y + 2 * R; /* rows in, out; dout and rows in, row gradients out */
}
static void passes_head_rmsnorm(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    PASSES(2, 5, dw_ir_numel(OUT));
}
static void passes_sigmoid_gate(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    PASSES(2, 3, dw_ir_numel(OUT)); /* x in, y out; dy, x in, dx out (the gate: a value per token) */
}
static void passes_cross_entropy(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    PASSES(3, 0, dw_ir_numel(IN(0))); /* fused: logits read twice, dlogits written in place */
}
static void passes_head_xent(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    PASSES(3, 0, rows(IN(0)) * IN(1)->shape[0]); /* cross-entropy's passes over each chunk's logits */
}
static void flops_softcap(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(4, 4, dw_ir_numel(IN(0)));
}
static void passes_softcap(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    PASSES(2, 3, dw_ir_numel(OUT));
}
static void flops_geglu(const dw_graph *g, const dw_ir_node *n, bool palm, double *f, double *b) {
    ELEMENTWISE(9, 18, dw_ir_numel(IN(0)));
}
static void passes_geglu(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    PASSES(3, 5, dw_ir_numel(OUT)); /* as swiglu */
}

typedef void (*flops_fn)(const dw_graph *, const dw_ir_node *, bool, double *, double *);
typedef void (*passes_fn)(const dw_graph *, const dw_ir_node *, double *, double *);
static const struct {
    flops_fn flops;
    passes_fn passes;
} ops[] = {
#define DW_OP(ID, name, min_in, max_in, outs, flags, cpu, cuda, summary) {flops_##name, passes_##name},
#include "ir/ops.def"
#undef DW_OP
};
_Static_assert(sizeof ops / sizeof ops[0] == DW_OP_COUNT, "cost table vs ops.def");

void dw_ir_flops(const dw_graph *g, const dw_ir_node *n, double *fwd, double *bwd) {
    ops[n->op].flops(g, n, false, fwd, bwd);
}

void dw_ir_model_flops(const dw_graph *g, const dw_ir_node *n, double *fwd, double *bwd) {
    ops[n->op].flops(g, n, true, fwd, bwd);
}

void dw_ir_traffic(const dw_graph *g, const dw_ir_node *n, double *fwd, double *bwd) {
    ops[n->op].passes(g, n, fwd, bwd);
}
