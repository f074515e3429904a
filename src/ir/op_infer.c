/* op_infer.c — shape and dtype inference for every op, one infer_<name> function per ops.def
 * row, and the dispatch dw_ir_infer. Every error names the node and its op. Whole-graph checks
 * are in verify.c; FLOPs and memory passes in op_cost.c. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "ir/ir.h"

#define IN(i) (&g->tensors[n->in[(i)]])

dw_status dw_ir_node_error(dw_ctx *ctx, const dw_ir_node *n, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dw_set_error(ctx, DW_ERR_FORMAT, "node '%s' (%s): %s", n->name, dw_op_name(n->op), msg);
}

void dw_ir_shape_str(const dw_ir_tensor *t, char *buf, size_t cap) {
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
    dw_ir_shape_str(t, s, sizeof s);
    if (t->ndim != ndim || t->dtype != dt)
        return dw_ir_node_error(ctx, n, "input %d '%s' is %s %s; expected rank %d %s", i, t->name,
                   dw_ir_dtype_name(t->dtype), s, ndim, dw_ir_dtype_name(dt));
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] <= 0) return dw_ir_node_error(ctx, n, "input %d '%s' has shape %s", i, t->name, s);
    return DW_OK;
}

static dw_status same_as(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, int i, int j) {
    const dw_ir_tensor *a = IN(i), *b = IN(j);
    bool same = a->ndim == b->ndim && a->dtype == b->dtype;
    for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
    if (same) return DW_OK;
    char sa[96], sb[96];
    dw_ir_shape_str(a, sa, sizeof sa);
    dw_ir_shape_str(b, sb, sizeof sb);
    return dw_ir_node_error(ctx, n, "inputs '%s' %s and '%s' %s differ in shape or dtype", a->name, sa, b->name, sb);
}

/* out = copy of input i's shape and dtype */
static void like(const dw_graph *g, const dw_ir_node *n, int i, dw_ir_tensor *out) {
    *out = *IN(i);
    out->kind = DW_TENSOR_ACT;
}

static int64_t last(const dw_ir_tensor *t) { return t->shape[t->ndim - 1]; }

/* ---- per-op inference ---------------------------------------------------------------------- */

static dw_status infer_embedding(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 2, DW_IR_I32));
    DW_TRY(want(ctx, g, n, 1, 2, DW_IR_F32));
    like(g, n, 0, o);
    o->ndim = 3;
    o->dtype = DW_IR_F32;
    o->shape[2] = IN(1)->shape[1];
    if (n->attrs.has_pad && !(n->attrs.pad >= 0 && n->attrs.pad < IN(1)->shape[0]))
        return dw_ir_node_error(ctx, n, "padding row %lld is outside the table '%s' of %lld rows (need 0 <= pad < V)",
                                (long long)n->attrs.pad, IN(1)->name, (long long)IN(1)->shape[0]);
    return DW_OK;
}

static dw_status infer_position(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    DW_TRY(want(ctx, g, n, 1, 2, DW_IR_F32));
    if (IN(1)->shape[1] != last(IN(0)) || IN(1)->shape[0] < IN(0)->shape[1])
        return dw_ir_node_error(ctx, n, "position table '%s' (%lld,%lld) does not cover T=%lld, C=%lld",
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
        return dw_ir_node_error(ctx, n, "heads %lld x head_dim %lld (even) must equal the width %lld, theta %g > 0",
                   (long long)a->heads, (long long)a->head_dim, (long long)last(IN(0)), a->theta);
    const char *bad = dw_rope_scaling_problem(&a->rope, a->theta, a->head_dim);
    if (bad)
        return dw_ir_node_error(ctx, n, "rope type %d, rotary dim %d: %s", (int)a->rope.type, (int)a->rope.rotary_dim,
                                bad);
    like(g, n, 0, o);
    return DW_OK;
}

static dw_status check_vec(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, int i, int64_t C) {
    DW_TRY(want(ctx, g, n, i, 1, DW_IR_F32));
    if (IN(i)->shape[0] != C)
        return dw_ir_node_error(ctx, n, "'%s' has %lld elements; expected %lld", IN(i)->name,
                   (long long)IN(i)->shape[0], (long long)C);
    return DW_OK;
}

static dw_status infer_layernorm(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    DW_TRY(check_vec(ctx, g, n, 1, last(IN(0))));
    DW_TRY(check_vec(ctx, g, n, 2, last(IN(0))));
    if (!(n->attrs.eps > 0)) return dw_ir_node_error(ctx, n, "eps %g must be positive", n->attrs.eps);
    like(g, n, 0, o);
    return DW_OK;
}

static dw_status infer_rmsnorm(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    DW_TRY(check_vec(ctx, g, n, 1, last(IN(0))));
    if (!(n->attrs.eps > 0)) return dw_ir_node_error(ctx, n, "eps %g must be positive", n->attrs.eps);
    like(g, n, 0, o);
    return DW_OK;
}

/* head_rmsnorm: x (B,T,H*D), weight (D) with D = attrs.head_dim dividing the width */
static dw_status infer_head_rmsnorm(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    const int64_t D = n->attrs.head_dim;
    if (D < 1 || last(IN(0)) % D)
        return dw_ir_node_error(ctx, n, "head_dim %lld must divide the width %lld", (long long)D,
                                (long long)last(IN(0)));
    DW_TRY(check_vec(ctx, g, n, 1, D));
    if (!(n->attrs.eps > 0)) return dw_ir_node_error(ctx, n, "eps %g must be positive", n->attrs.eps);
    like(g, n, 0, o);
    return DW_OK;
}

/* sigmoid_gate: x (B,T,C), gate logits (B,T,1) -> (B,T,C) */
static dw_status infer_sigmoid_gate(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    DW_TRY(want(ctx, g, n, 1, 3, DW_IR_F32));
    const dw_ir_tensor *x = IN(0), *gt = IN(1);
    if (gt->shape[0] != x->shape[0] || gt->shape[1] != x->shape[1] || gt->shape[2] != 1)
        return dw_ir_node_error(ctx, n, "gate '%s' must be (%lld,%lld,1): one logit per token of '%s'", gt->name,
                                (long long)x->shape[0], (long long)x->shape[1], x->name);
    like(g, n, 0, o);
    return DW_OK;
}

static dw_status infer_linear(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    DW_TRY(want(ctx, g, n, 1, 2, DW_IR_F32));
    if (IN(1)->shape[1] != last(IN(0)))
        return dw_ir_node_error(ctx, n, "weight '%s' (%lld,%lld) does not take input width %lld", IN(1)->name,
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
static dw_status infer_gelu_erf(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    return infer_unary(ctx, g, n, o);
}
static dw_status infer_relu(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
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
        return dw_ir_node_error(ctx, n, "heads %lld must be a positive multiple of kv_heads %lld (head_dim %lld)",
                   (long long)a->heads, (long long)a->kv_heads, (long long)a->head_dim);
    if (n->n_in == 2) return dw_ir_node_error(ctx, n, "takes q, k, v or one packed qkv, not 2 inputs");
    if (a->window < 0)
        return dw_ir_node_error(ctx, n, "sliding window %lld: must be positive (0: none)", (long long)a->window);
    if (!(a->softcap >= 0 && isfinite(a->softcap)))
        return dw_ir_node_error(ctx, n, "score soft-cap %g: must be finite and >= 0 (0: none)", a->softcap);
    int64_t q = a->heads * a->head_dim, kv = a->kv_heads * a->head_dim;
    for (int i = 0; i < n->n_in; i++) {
        DW_TRY(want(ctx, g, n, i, 3, DW_IR_F32));
        int64_t w = n->n_in == 1 ? q + 2 * kv : i == 0 ? q : kv;
        if (last(IN(i)) != w)
            return dw_ir_node_error(ctx, n, "input '%s' has width %lld; expected %lld", IN(i)->name,
                       (long long)last(IN(i)), (long long)w);
        if (i) DW_TRY(IN(i)->shape[0] == IN(0)->shape[0] && IN(i)->shape[1] == IN(0)->shape[1]
                          ? DW_OK : dw_ir_node_error(ctx, n, "q, k and v differ in batch or sequence"));
    }
    like(g, n, 0, o);
    o->shape[2] = q;
    return DW_OK;
}

/* moe_router: logits (B,T,E) -> weights (B,T,K) and experts (B,T,K) i32 */
static dw_status infer_moe_router(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    const dw_ir_attrs *a = &n->attrs;
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    const int64_t E = last(IN(0));
    if (E > DW_ROUTER_MAX_EXPERTS)
        return dw_ir_node_error(ctx, n, "%lld experts; at most %d", (long long)E, DW_ROUTER_MAX_EXPERTS);
    if (a->top_k < 1 || a->top_k > E)
        return dw_ir_node_error(ctx, n, "top_k %lld must be in [1, %lld] (the experts)", (long long)a->top_k,
                                (long long)E);
    if (a->score != DW_ROUTER_SOFTMAX && a->score != DW_ROUTER_SIGMOID)
        return dw_ir_node_error(ctx, n, "score %d is neither softmax (0) nor sigmoid (1)", (int)a->score);
    const int64_t G = a->n_group > 1 ? a->n_group : 1, kept = a->topk_group > 0 && a->topk_group < G ? a->topk_group : G;
    if (a->n_group < 0 || a->topk_group < 0 || G > DW_ROUTER_MAX_GROUPS || E % G || a->topk_group > G ||
        a->top_k > kept * (E / G))
        return dw_ir_node_error(ctx, n, "n_group %lld, topk_group %lld: need n_group in [1, %d] dividing the %lld "
                                "experts, topk_group <= n_group and top_k %lld <= the experts of topk_group groups",
                                (long long)a->n_group, (long long)a->topk_group, DW_ROUTER_MAX_GROUPS, (long long)E,
                                (long long)a->top_k);
    if (!(a->scale >= 0 && isfinite(a->scale)))
        return dw_ir_node_error(ctx, n, "routed scaling factor %g must be finite and > 0 (0: 1)", a->scale);
    like(g, n, 0, &o[0]);
    o[0].shape[2] = a->top_k;
    o[1] = o[0];
    o[1].dtype = DW_IR_I32;
    return DW_OK;
}

/* moe_dispatch: x (B,T,C), experts (B,T,K) i32[, weights (B,T,K): drop by weight] -> rows
 * (B,T*K,C), offsets (E+1) i32, rows of (token, k) (B,T,K) i32 */
static dw_status infer_moe_dispatch(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    DW_TRY(want(ctx, g, n, 1, 3, DW_IR_I32));
    if (IN(1)->shape[0] != IN(0)->shape[0] || IN(1)->shape[1] != IN(0)->shape[1])
        return dw_ir_node_error(ctx, n, "experts '%s' do not match x's batch and sequence", IN(1)->name);
    if (n->n_in > 2) {
        DW_TRY(want(ctx, g, n, 2, 3, DW_IR_F32));
        for (int d = 0; d < 3; d++)
            if (IN(2)->shape[d] != IN(1)->shape[d])
                return dw_ir_node_error(ctx, n, "weights '%s' and experts '%s' differ in shape", IN(2)->name,
                                        IN(1)->name);
    }
    const int64_t E = n->attrs.experts, K = last(IN(1));
    if (E < 1 || E > DW_ROUTER_MAX_EXPERTS || K > E)
        return dw_ir_node_error(ctx, n, "experts %lld must be in [top_k %lld, %d]", (long long)E, (long long)K,
                                DW_ROUTER_MAX_EXPERTS);
    like(g, n, 0, &o[0]);
    o[0].shape[1] = IN(0)->shape[1] * K;
    o[1] = (dw_ir_tensor){.kind = DW_TENSOR_ACT, .dtype = DW_IR_I32, .ndim = 1, .shape = {E + 1}};
    like(g, n, 1, &o[2]);
    return DW_OK;
}

/* moe_linear: rows (B,R,K), weights (E,M,K), offsets (E+1) i32 -> (B,R,M) */
static dw_status infer_moe_linear(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    DW_TRY(want(ctx, g, n, 1, 3, DW_IR_F32));
    DW_TRY(want(ctx, g, n, 2, 1, DW_IR_I32));
    const dw_ir_tensor *w = IN(1);
    if (w->shape[2] != last(IN(0)))
        return dw_ir_node_error(ctx, n, "weights '%s' take width %lld; the rows are %lld wide", w->name,
                                (long long)w->shape[2], (long long)last(IN(0)));
    if (IN(2)->shape[0] != w->shape[0] + 1)
        return dw_ir_node_error(ctx, n, "offsets '%s' have %lld entries; %lld experts need %lld", IN(2)->name,
                                (long long)IN(2)->shape[0], (long long)w->shape[0], (long long)w->shape[0] + 1);
    like(g, n, 0, o);
    o->shape[2] = w->shape[1];
    return DW_OK;
}

/* moe_combine: rows (B,T*K,C), weights (B,T,K), rows of (token, k) (B,T,K) i32 -> (B,T,C) */
static dw_status infer_moe_combine(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    DW_TRY(want(ctx, g, n, 1, 3, DW_IR_F32));
    DW_TRY(want(ctx, g, n, 2, 3, DW_IR_I32));
    const dw_ir_tensor *y = IN(0), *w = IN(1), *p = IN(2);
    for (int d = 0; d < 3; d++)
        if (p->shape[d] != w->shape[d])
            return dw_ir_node_error(ctx, n, "rows '%s' and weights '%s' differ in shape", p->name, w->name);
    if (y->shape[0] != w->shape[0] || y->shape[1] != w->shape[1] * w->shape[2])
        return dw_ir_node_error(ctx, n, "expert rows '%s' are not batch x (sequence x top_k %lld)", y->name,
                                (long long)w->shape[2]);
    like(g, n, 1, o);
    o->shape[2] = last(y);
    return DW_OK;
}

/* moe_aux_stats: logits (B,T,E), experts (B,T,K) i32[, sums (E+1), counts (E) i32] -> sums (E+1),
 * counts (E) i32 */
static dw_status infer_moe_aux_stats(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    DW_TRY(want(ctx, g, n, 1, 3, DW_IR_I32));
    const int64_t E = last(IN(0));
    if (IN(1)->shape[0] != IN(0)->shape[0] || IN(1)->shape[1] != IN(0)->shape[1] || last(IN(1)) > E)
        return dw_ir_node_error(ctx, n, "experts '%s' do not match the logits' batch, sequence and experts", IN(1)->name);
    if (n->n_in == 3) return dw_ir_node_error(ctx, n, "the sums of the layers before come with their counts");
    if (n->n_in == 4) {
        DW_TRY(want(ctx, g, n, 2, 1, DW_IR_F32));
        DW_TRY(want(ctx, g, n, 3, 1, DW_IR_I32));
        if (IN(2)->shape[0] != E + 1 || IN(3)->shape[0] != E)
            return dw_ir_node_error(ctx, n, "sums '%s' and counts '%s' must have the %lld experts (+1 sums)",
                                    IN(2)->name, IN(3)->name, (long long)E);
    }
    like(g, n, 0, &o[0]);
    o[0].ndim = 1, o[0].shape[0] = E + 1, o[0].shape[1] = o[0].shape[2] = 0;
    o[1] = o[0];
    o[1].shape[0] = E, o[1].dtype = DW_IR_I32;
    return DW_OK;
}

/* moe_aux_loss: sums (E+1), counts (E) i32 -> () */
static dw_status infer_moe_aux_loss(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 1, DW_IR_F32));
    DW_TRY(want(ctx, g, n, 1, 1, DW_IR_I32));
    if (IN(0)->shape[0] != IN(1)->shape[0] + 1)
        return dw_ir_node_error(ctx, n, "sums '%s' must have one more entry than counts '%s'", IN(0)->name,
                                IN(1)->name);
    const dw_ir_attrs *a = &n->attrs;
    if (a->top_k < 1 || !(a->coef >= 0) || !(a->zcoef >= 0) || !(a->coef + a->zcoef > 0))
        return dw_ir_node_error(ctx, n, "top_k %lld must be positive, coef %g and zcoef %g not negative, one of "
                                "them positive", (long long)a->top_k, a->coef, a->zcoef);
    like(g, n, 0, o);
    o->ndim = 0, o->shape[0] = 0;
    return DW_OK;
}

static dw_status infer_cross_entropy(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n,
                                     dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    DW_TRY(want(ctx, g, n, 1, 2, DW_IR_I32));
    if (IN(1)->shape[0] != IN(0)->shape[0] || IN(1)->shape[1] != IN(0)->shape[1])
        return dw_ir_node_error(ctx, n, "targets '%s' do not match the logits' batch and sequence", IN(1)->name);
    like(g, n, 0, o);
    o->ndim = 0;
    return DW_OK;
}

/* head_xent: x (B,T,C), weight (V,C), targets (B,T) -> the scalar loss */
static dw_status infer_head_xent(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    DW_TRY(want(ctx, g, n, 0, 3, DW_IR_F32));
    DW_TRY(want(ctx, g, n, 1, 2, DW_IR_F32));
    DW_TRY(want(ctx, g, n, 2, 2, DW_IR_I32));
    if (IN(1)->shape[1] != IN(0)->shape[2])
        return dw_ir_node_error(ctx, n, "weight '%s' has %lld inputs, x '%s' %lld channels", IN(1)->name,
                                (long long)IN(1)->shape[1], IN(0)->name, (long long)IN(0)->shape[2]);
    if (IN(2)->shape[0] != IN(0)->shape[0] || IN(2)->shape[1] != IN(0)->shape[1])
        return dw_ir_node_error(ctx, n, "targets '%s' do not match x's batch and sequence", IN(2)->name);
    like(g, n, 0, o);
    o->ndim = 0;
    return DW_OK;
}

/* softcap: x scaled by attrs.scale (non-zero), then capped when attrs.softcap > 0 */
static dw_status infer_softcap(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    const dw_ir_attrs *a = &n->attrs;
    if (!(a->scale != 0 && isfinite(a->scale)) || !(a->softcap >= 0 && isfinite(a->softcap)))
        return dw_ir_node_error(ctx, n, "scale %g must be finite and non-zero, softcap %g finite and >= 0 (0: none)",
                                a->scale, a->softcap);
    return infer_unary(ctx, g, n, o);
}
static dw_status infer_geglu(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *o) {
    return infer_binary(ctx, g, n, o);
}

/* infer_<name> fills out[0 .. the op's outputs). */
typedef dw_status (*infer_fn)(dw_ctx *, const dw_graph *, const dw_ir_node *, dw_ir_tensor *);
static const struct {
    infer_fn infer;
    int min_in, max_in;
} ops[] = {
#define DW_OP(ID, name, min_in, max_in, outs, flags, cpu, cuda, summary) {infer_##name, min_in, max_in},
#include "ir/ops.def"
#undef DW_OP
};
_Static_assert(sizeof ops / sizeof ops[0] == DW_OP_COUNT, "op table vs ops.def");

dw_status dw_ir_infer(dw_ctx *ctx, const dw_graph *g, const dw_ir_node *n, dw_ir_tensor *out) {
    if ((unsigned)n->op >= DW_OP_COUNT) return dw_ir_node_error(ctx, n, "unknown op %d", (int)n->op);
    memset(out, 0, (size_t)dw_op_outputs(n->op) * sizeof *out);
    if (n->n_in < ops[n->op].min_in || n->n_in > ops[n->op].max_in)
        return dw_ir_node_error(ctx, n, "has %d inputs; takes %d to %d", n->n_in, ops[n->op].min_in,
                   ops[n->op].max_in);
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] < 0 || n->in[i] >= g->n_tensors)
            return dw_ir_node_error(ctx, n, "input %d refers to tensor %d of %d", i, n->in[i], g->n_tensors);
    return ops[n->op].infer(ctx, g, n, out);
}
