/* infer.c — per-op shape/dtype inference and FLOP counts (one pair of functions per op, wired by
 * ops.def), and whole-graph verification. Every error names the node and its op.
 * Letters: N = B*T rows; matmul FLOPs are exact (2 per multiply-add), elementwise ones are
 * nominal per-element costs (docs/ir.md). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "ir/ir.h"

#define IN(i) (&g->tensors[n->in[(i)]])

static dw_status bad(dw_ctx *ctx, const dw_ir_node *n, const char *fmt, ...) DW_PRINTF(3, 4);
static dw_status bad(dw_ctx *ctx, const dw_ir_node *n, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dw_set_error(ctx, DW_ERR_FORMAT, "node '%s' (%s): %s", n->name, dw_op_name(n->op), msg);
}

static void shape_str(const dw_ir_tensor *t, char *buf, size_t cap) {
    size_t len = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < t->ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? "," : "", (long long)t->shape[i]);
    if (len < cap) snprintf(buf + len, cap - len, ")");
}

/* Input i must be an activation-like (B,T,...) tensor of rank `ndim` and dtype `dt`. */
static dw_status want(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, int i, int ndim,
                      dw_ir_dtype dt) {
    const dw_ir_tensor *t = IN(i);
    char s[96];
    shape_str(t, s, sizeof s);
    if (t->ndim != ndim || t->dtype != dt)
        return bad(ctx, n, "input %d '%s' is %s %s; expected rank %d %s", i, t->name,
                   dw_ir_dtype_name(t->dtype), s, ndim, dw_ir_dtype_name(dt));
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] <= 0) return bad(ctx, n, "input %d '%s' has shape %s", i, t->name, s);
    return DW_OK;
}

static dw_status same_as(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, int i, int j) {
    const dw_ir_tensor *a = IN(i), *b = IN(j);
    bool same = a->ndim == b->ndim && a->dtype == b->dtype;
    for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
    if (same) return DW_OK;
    char sa[96], sb[96];
    shape_str(a, sa, sizeof sa);
    shape_str(b, sb, sizeof sb);
    return bad(ctx, n, "inputs '%s' %s and '%s' %s differ in shape or dtype", a->name, sa, b->name, sb);
}

/* out = copy of input i's shape and dtype */
static void like(const dw_graph *g, const dw_ir_node *n, int i, dw_ir_tensor *out) {
    *out = *IN(i);
    out->kind = DW_TENSOR_ACT;
}

static int64_t rows(const dw_ir_tensor *t) { return t->shape[0] * t->shape[1]; }
static int64_t last(const dw_ir_tensor *t) { return t->shape[t->ndim - 1]; }

/* ---- per-op inference ---------------------------------------------------------------------- */

static dw_status infer_embedding(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 2, DW_IR_I32));
    DW_TRY(want(ctx, g, n, 1, 2, DW_IR_F32));
    like(g, n, 0, o);
    o->ndim = 3;
    o->dtype = DW_IR_F32;
    o->shape[2] = IN(1)->shape[1];
    return DW_OK;
}

static dw_status infer_position(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    DW_TRY(want(ctx, g, n, 1, 2, DW_IR_F32));
    if (IN(1)->shape[1] != last(IN(0)) || IN(1)->shape[0] < IN(0)->shape[1])
        return bad(ctx, n, "position table '%s' (%lld,%lld) does not cover T=%lld, C=%lld",
                   IN(1)->name, (long long)IN(1)->shape[0], (long long)IN(1)->shape[1],
                   (long long)IN(0)->shape[1], (long long)last(IN(0)));
    like(g, n, 0, o);
    return DW_OK;
}

static dw_status infer_rope(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    const dw_ir_attrs *a = &n->attrs;
    if (a->heads <= 0 || a->head_dim <= 0 || a->head_dim % 2 || !(a->theta > 0) ||
        a->heads * a->head_dim != last(IN(0)))
        return bad(ctx, n, "heads %lld x head_dim %lld (even) must equal the width %lld, theta %g > 0",
                   (long long)a->heads, (long long)a->head_dim, (long long)last(IN(0)), a->theta);
    like(g, n, 0, o);
    return DW_OK;
}

static dw_status check_vec(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, int i, int64_t C) {
    DW_TRY(want(ctx, g, n, i, 1, DW_IR_F32));
    if (IN(i)->shape[0] != C)
        return bad(ctx, n, "'%s' has %lld elements; expected %lld", IN(i)->name,
                   (long long)IN(i)->shape[0], (long long)C);
    return DW_OK;
}

static dw_status infer_layernorm(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    DW_TRY(check_vec(ctx, g, n, 1, last(IN(0))));
    DW_TRY(check_vec(ctx, g, n, 2, last(IN(0))));
    if (!(n->attrs.eps > 0)) return bad(ctx, n, "eps %g must be positive", n->attrs.eps);
    like(g, n, 0, o);
    return DW_OK;
}

static dw_status infer_rmsnorm(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    DW_TRY(check_vec(ctx, g, n, 1, last(IN(0))));
    if (!(n->attrs.eps > 0)) return bad(ctx, n, "eps %g must be positive", n->attrs.eps);
    like(g, n, 0, o);
    return DW_OK;
}

static dw_status infer_linear(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    DW_TRY(want(ctx, g, n, 1, 2, DW_IR_F32));
    if (IN(1)->shape[1] != last(IN(0)))
        return bad(ctx, n, "weight '%s' (%lld,%lld) does not take input width %lld", IN(1)->name,
                   (long long)IN(1)->shape[0], (long long)IN(1)->shape[1], (long long)last(IN(0)));
    if (n->n_in == 3) DW_TRY(check_vec(ctx, g, n, 2, IN(1)->shape[0]));
    like(g, n, 0, o);
    o->shape[2] = IN(1)->shape[0];
    return DW_OK;
}

static dw_status infer_unary(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    like(g, n, 0, o);
    return DW_OK;
}
static dw_status infer_gelu(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    return infer_unary(ctx, g, n, o);
}
static dw_status infer_silu(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    return infer_unary(ctx, g, n, o);
}

static dw_status infer_binary(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    DW_TRY(same_as(ctx, g, n, 0, 1));
    like(g, n, 0, o);
    return DW_OK;
}
static dw_status infer_swiglu(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    return infer_binary(ctx, g, n, o);
}
static dw_status infer_add(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    return infer_binary(ctx, g, n, o);
}

static dw_status infer_attention(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    const dw_ir_attrs *a = &n->attrs;
    if (a->heads <= 0 || a->kv_heads <= 0 || a->head_dim <= 0 || a->heads % a->kv_heads)
        return bad(ctx, n, "heads %lld must be a positive multiple of kv_heads %lld (head_dim %lld)",
                   (long long)a->heads, (long long)a->kv_heads, (long long)a->head_dim);
    if (n->n_in == 2) return bad(ctx, n, "takes q, k, v or one packed qkv, not 2 inputs");
    int64_t q = a->heads * a->head_dim, kv = a->kv_heads * a->head_dim;
    for (int i = 0; i < n->n_in; i++) {
        DW_TRY(want(ctx, g, n, i, 3, DW_IR_F32));
        int64_t w = n->n_in == 1 ? q + 2 * kv : i == 0 ? q : kv;
        if (last(IN(i)) != w)
            return bad(ctx, n, "input '%s' has width %lld; expected %lld", IN(i)->name,
                       (long long)last(IN(i)), (long long)w);
        if (i) DW_TRY(IN(i)->shape[0] == IN(0)->shape[0] && IN(i)->shape[1] == IN(0)->shape[1]
                          ? DW_OK : bad(ctx, n, "q, k and v differ in batch or sequence"));
    }
    like(g, n, 0, o);
    o->shape[2] = q;
    return DW_OK;
}

static dw_status infer_cross_entropy(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n,
                                     dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    DW_TRY(want(ctx, g, n, 1, 2, DW_IR_I32));
    if (IN(1)->shape[0] != IN(0)->shape[0] || IN(1)->shape[1] != IN(0)->shape[1])
        return bad(ctx, n, "targets '%s' do not match the logits' batch and sequence", IN(1)->name);
    like(g, n, 0, o);
    o->ndim = 0;
    return DW_OK;
}

/* ---- per-op FLOPs (forward; backward = input and parameter gradients) ---------------------- */

static void flops_embedding(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    *f = 0;
    *b = (double)rows(IN(0)) * (double)IN(1)->shape[1]; /* scatter-add into dwte */
}
static void flops_position(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    *f = *b = (double)dw_ir_numel(IN(0));
}
static void flops_rope(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    *f = *b = 3.0 * (double)dw_ir_numel(IN(0));
}
static void flops_layernorm(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    *f = 7.0 * (double)dw_ir_numel(IN(0));
    *b = 12.0 * (double)dw_ir_numel(IN(0));
}
static void flops_rmsnorm(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    *f = 4.0 * (double)dw_ir_numel(IN(0));
    *b = 8.0 * (double)dw_ir_numel(IN(0));
}
static void flops_linear(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    double N = (double)rows(IN(0)), K = (double)last(IN(0)), M = (double)IN(1)->shape[0];
    *f = 2 * N * K * M + (n->n_in == 3 ? N * M : 0);
    *b = 4 * N * K * M + (n->n_in == 3 ? N * M : 0); /* dx and dW; db */
}
static void flops_gelu(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    *f = 8.0 * (double)dw_ir_numel(IN(0));
    *b = 16.0 * (double)dw_ir_numel(IN(0));
}
static void flops_silu(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    *f = 4.0 * (double)dw_ir_numel(IN(0));
    *b = 8.0 * (double)dw_ir_numel(IN(0));
}
static void flops_swiglu(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    *f = 5.0 * (double)dw_ir_numel(IN(0));
    *b = 10.0 * (double)dw_ir_numel(IN(0));
}
static void flops_add(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    *f = (double)dw_ir_numel(IN(0));
    *b = 0;
}
/* Causal: only the T(T+1)/2 query-key pairs at or below the diagonal are computed. Forward:
 * q k^T and p v (2 FLOPs per pair per channel each) + softmax (5 per pair); backward: dv, dp,
 * dq, dk (4 matmuls) + the softmax gradient. */
static void flops_attention(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    double B = (double)IN(0)->shape[0], T = (double)IN(0)->shape[1];
    double H = (double)n->attrs.heads, D = (double)n->attrs.head_dim;
    double pairs = B * H * T * (T + 1) / 2;
    *f = 4 * pairs * D + 5 * pairs;
    *b = 8 * pairs * D + 5 * pairs;
}
static void flops_cross_entropy(const dw_graph *g, const dw_ir_node *n, double *f, double *b) {
    *f = 4.0 * (double)dw_ir_numel(IN(0));
    *b = 3.0 * (double)dw_ir_numel(IN(0));
}

typedef dw_status (*infer_fn)(dw_ctx *, const dw_graph *, const dw_ir_node *, dw_ir_tensor *);
typedef void (*flops_fn)(const dw_graph *, const dw_ir_node *, double *, double *);
static const struct {
    infer_fn infer;
    flops_fn flops;
    int min_in, max_in;
} ops[] = {
#define DW_OP(ID, name, min_in, max_in, summary) {infer_##name, flops_##name, min_in, max_in},
#include "ir/ops.def"
#undef DW_OP
};
_Static_assert(sizeof ops / sizeof ops[0] == DW_OP_COUNT, "op table vs ops.def");

dw_status dw_ir_infer(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *out) {
    memset(out, 0, sizeof *out);
    if ((unsigned)n->op >= DW_OP_COUNT) return bad(ctx, n, "unknown op %d", (int)n->op);
    if (n->n_in < ops[n->op].min_in || n->n_in > ops[n->op].max_in)
        return bad(ctx, n, "has %d inputs; takes %d to %d", n->n_in, ops[n->op].min_in,
                   ops[n->op].max_in);
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] < 0 || n->in[i] >= g->n_tensors)
            return bad(ctx, n, "input %d refers to tensor %d of %d", i, n->in[i], g->n_tensors);
    return ops[n->op].infer(ctx, g, n, out);
}

void dw_ir_flops(const dw_graph *g, const dw_ir_node *n, double *fwd, double *bwd) {
    ops[n->op].flops(g, n, fwd, bwd);
}

dw_status dw_graph_verify(dw_ctx *ctx, const dw_graph *g) {
    for (int i = 0; i < g->n_tensors; i++) {
        const dw_ir_tensor *t = &g->tensors[i];
        if (!t->name || !*t->name) return dw_set_error(ctx, DW_ERR_FORMAT, "tensor %d has no name", i);
        if (t->kind != DW_TENSOR_ACT && t->producer != -1)
            return dw_set_error(ctx, DW_ERR_FORMAT, "tensor '%s': %s tensors have no producer",
                                t->name, dw_tensor_kind_name(t->kind));
        if (t->kind == DW_TENSOR_ACT &&
            (t->producer < 0 || t->producer >= g->n_nodes || g->nodes[t->producer].out != i))
            return dw_set_error(ctx, DW_ERR_FORMAT, "tensor '%s': activation without a producing node",
                                t->name);
        for (int j = 0; j < i; j++)
            if (!strcmp(g->tensors[j].name, t->name))
                return dw_set_error(ctx, DW_ERR_FORMAT, "tensor name '%s' is used twice", t->name);
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const dw_ir_node *n = &g->nodes[i];
        if (!n->name || !*n->name) return dw_set_error(ctx, DW_ERR_FORMAT, "node %d has no name", i);
        for (int j = 0; j < i; j++)
            if (!strcmp(g->nodes[j].name, n->name))
                return bad(ctx, n, "node name used twice (nodes %d and %d)", j, i);
        dw_ir_tensor t;
        DW_TRY(dw_ir_infer(ctx, g, n, &t));
        for (int k = 0; k < n->n_in; k++) {
            const dw_ir_tensor *x = IN(k);
            if (x->kind == DW_TENSOR_ACT && x->producer >= i)
                return bad(ctx, n, "input '%s' is computed later (not in topological order)", x->name);
        }
        if (n->out < 0 || n->out >= g->n_tensors || g->tensors[n->out].producer != i)
            return bad(ctx, n, "output tensor %d is not this node's", n->out);
        const dw_ir_tensor *o = &g->tensors[n->out];
        bool same = o->ndim == t.ndim && o->dtype == t.dtype;
        for (int d = 0; same && d < t.ndim; d++) same = o->shape[d] == t.shape[d];
        if (!same) {
            char so[96], st[96];
            shape_str(o, so, sizeof so);
            shape_str(&t, st, sizeof st);
            return bad(ctx, n, "output '%s' is %s %s; its inputs give %s %s", o->name,
                       dw_ir_dtype_name(o->dtype), so, dw_ir_dtype_name(t.dtype), st);
        }
    }
    const struct {
        const char *what;
        int idx;
        dw_tensor_kind kind;
    } roles[] = {{"tokens", g->tokens, DW_TENSOR_INPUT}, {"targets", g->targets, DW_TENSOR_INPUT},
                 {"logits", g->logits, DW_TENSOR_ACT},   {"loss", g->loss, DW_TENSOR_ACT}};
    for (size_t r = 0; r < sizeof roles / sizeof roles[0]; r++)
        if (roles[r].idx < 0 || roles[r].idx >= g->n_tensors ||
            g->tensors[roles[r].idx].kind != roles[r].kind)
            return dw_set_error(ctx, DW_ERR_FORMAT, "graph: no %s tensor '%s'", roles[r].what,
                                roles[r].what);
    return DW_OK;
}
