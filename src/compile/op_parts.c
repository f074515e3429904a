/* op_parts.c — what each op keeps for its backward (aux) and the scratch its steps need (tmp), in
 * bytes at the graph's capacity: one parts_<name> rule per ops.def row. Sizes cover every
 * backend's kernels (the CUDA norm backward's partial sums, cross-entropy's reduction scratch);
 * a backend may leave a part unused. The ACC temporaries come from the gradient modes, not here. */
#include <string.h>

#include "compile/passes.h"
#include "kernels/cuda/ops_cuda.h"

typedef int64_t parts[DW_AUX_COUNT + DW_TMP_COUNT];
#define AUX(k) p[(k)]
#define TMP(k) p[DW_AUX_COUNT + (k)]

static int64_t rows_of(const dw_graph *g) { return g->batch * g->seq; }
static int64_t width_of(const dw_graph *g, int t) { return g->tensors[t].shape[g->tensors[t].ndim - 1]; }

static void parts_embedding(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {}
static void parts_position(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {}
static void parts_rope(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {}
/* layernorm: mean and rstd (N) FP32; DELTA: the one-pass backward's partial column sums */
static void parts_layernorm(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {
    const int64_t N = rows_of(c->g);
    AUX(DW_AUX_STAT0) = AUX(DW_AUX_STAT1) = N * 4;
    TMP(DW_TMP_DELTA) = (int64_t)dw_cuda_norm_bwd_ws_bytes(N, width_of(c->g, n->out[0]));
}
/* rmsnorm: rstd (N) FP32; DELTA as layernorm */
static void parts_rmsnorm(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {
    const int64_t N = rows_of(c->g);
    AUX(DW_AUX_STAT0) = N * 4;
    TMP(DW_TMP_DELTA) = (int64_t)dw_cuda_norm_bwd_ws_bytes(N, width_of(c->g, n->out[0]));
}
static void parts_linear(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {}
static void parts_gelu(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {}
static void parts_silu(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {}
static void parts_gelu_erf(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {}
static void parts_relu(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {}
static void parts_swiglu(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {}
static void parts_add(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {}
/* attention: lse (B,H,T) FP32 saved, DELTA (B,H,T) FP32; a packed qkv also keeps q, k, v
 * unpacked (act dtype) and its backward the unpacked gradients GQ, GK, GV */
static void parts_attention(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {
    const int64_t N = rows_of(c->g), as = c->act_size;
    const dw_ir_attrs *a = &n->attrs;
    AUX(DW_AUX_STAT0) = N * a->heads * 4;
    TMP(DW_TMP_DELTA) = N * a->heads * 4;
    if (n->n_in == 1) {
        AUX(DW_AUX_Q) = TMP(DW_TMP_GQ) = N * a->heads * a->head_dim * as;
        AUX(DW_AUX_K) = AUX(DW_AUX_V) = TMP(DW_TMP_GK) = TMP(DW_TMP_GV) = N * a->kv_heads * a->head_dim * as;
    }
}
static void parts_moe_router(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {} /* recomputes scores */
static void parts_moe_dispatch(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {}
static void parts_moe_linear(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {}
static void parts_moe_combine(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {}
static void parts_moe_aux_stats(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {} /* recomputes scores */
static void parts_moe_aux_loss(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {}
/* head_rmsnorm: rstd per head (N*H) FP32; DELTA as rmsnorm over N*H rows of D */
static void parts_head_rmsnorm(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {
    const int64_t D = n->attrs.head_dim, NH = rows_of(c->g) * (width_of(c->g, n->out[0]) / D);
    AUX(DW_AUX_STAT0) = NH * 4;
    TMP(DW_TMP_DELTA) = (int64_t)dw_cuda_norm_bwd_ws_bytes(NH, D);
}
static void parts_sigmoid_gate(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {}
/* cross-entropy: the loss reduction's scratch (dw_cuda_cross_entropy_ws_bytes: 16 + N * 4) */
static void parts_cross_entropy(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {
    TMP(DW_TMP_XENT) = 16 + rows_of(c->g) * 4;
}
/* head_xent (fuse.c): the cross-entropy's scratch, then head_chunk rows of logits (act dtype) */
static void parts_head_xent(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {
    const int64_t V = c->g->tensors[n->in[1]].shape[0];
    TMP(DW_TMP_XENT) = dw_compile_head_logits_off(rows_of(c->g)) + c->head_chunk * V * c->act_size;
}
static void parts_softcap(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {}
static void parts_geglu(const dw_compiled *c, const dw_ir_node *n, int64_t *p) {}

typedef void (*parts_fn)(const dw_compiled *, const dw_ir_node *, int64_t *);
static const parts_fn rules[] = {
#define DW_OP(ID, name, min_in, max_in, outs, flags, cpu, cuda, summary) parts_##name,
#include "ir/ops.def"
#undef DW_OP
};
_Static_assert(sizeof rules / sizeof rules[0] == DW_OP_COUNT, "parts rules vs ops.def");

void dw_compile_node_parts(const dw_compiled *c, int i, int64_t aux[DW_AUX_COUNT], int64_t tmp[DW_TMP_COUNT]) {
    const dw_ir_node *n = dw_compile_node(c, i);
    parts p;
    memset(p, 0, sizeof p);
    rules[n->op](c, n, p);
    for (int s = 0; s < n->n_in; s++) /* an input gradient the executor adds in after the op */
        if (c->node[i].grad_mode[s] == DW_GRAD_ACCUM_TMP)
            TMP(DW_TMP_ACC0 + s) = dw_compile_act_numel(c, n->in[s]) * c->act_size;
    memcpy(aux, p, sizeof(int64_t) * DW_AUX_COUNT);
    memcpy(tmp, p + DW_AUX_COUNT, sizeof(int64_t) * DW_TMP_COUNT);
}
