/* engine_cuda.c — the CUDA engine: executes a dw_compiled (compile/compile.h) on one GPU. Five
 * device allocations made at creation (weights: FP32 master + BF16 working copy, grads, AdamW
 * m/v, the activation arena, workspace) and nothing allocated in a step; forward and backward
 * through the CUDA op kernels (kernels/cuda/ops_cuda.h) and dw_gemm (BF16, or quantised operands
 * from engine_cuda_quant.c) or the FP32 reference GEMM; cross-entropy fused and in place; one
 * host sync per forward/backward (the loss readback) and one per optimizer step (the gradient
 * norm). A step whose shape was seen before is captured into a CUDA graph and replayed, and so is
 * the optimizer (kernels/cuda/adamw.cu) from its second call (eager fallback with a logged
 * reason). Stubs when built without CUDA. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "compile/compile.h"
#include "core/ctx.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/engine_cpu.h"
#include "runtime/engine_cuda.h"

const char *const dw_opt_phase_names[DW_OPT_PHASES] = {"zero grad", "grad norm", "adamw", "bf16 copy",
                                                        "weight cache"};

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "kernels/cuda/adamw_cuda.h"
#include "kernels/cuda/attn_packed.h"
#include "kernels/cuda/ops_cuda.h"
#include "runtime/engine_cuda_kern.h"
#include "runtime/engine_cuda_quant.h"

_Static_assert(sizeof(dw_cuda_adamw_args) == DW_COMPILE_ADAMW_ARGS_BYTES, "workspace slot of the AdamW arguments");

struct dw_engine_cuda {
    dw_compiled *cp;
    cudaStream_t stream;
    void *pool[DW_POOL_COUNT];
    float *w, *g, *m, *v;   /* (param_floats) each: master weights, grads, AdamW moments */
    uint16_t *wb;           /* (param_floats) BF16 working copy (BF16 mode), else NULL */
    char *arena;            /* activation arena */
    int32_t *tokens, *targets;
    float *loss;
    float *bgrad;           /* workspace: the wgrad epilogue's bias gradient (BF16 mode) */
    double *norm, *partials;
    float *host_loss;       /* pinned readback */
    double *host_norm;
    dw_cuda_adamw_args *adamw_args, *host_args; /* workspace / pinned staging copy */
    int *tparam;            /* (n_tensors) parameter index of a tensor, -1 otherwise */
    int64_t (*bf16_runs)[2]; /* ranges [begin, end) of floats the BF16 copy refreshes after an update: */
    int n_bf16_runs;         /* the parameters a BF16 GEMM reads (bf16_copy_plan) */
    bool *bf16_lazy;         /* (n_params) true: no standing BF16 copy; converted before each use */
    dw_act_dtype dt;
    int64_t b, t;           /* current batch */
    /* CUDA graph of one training step, keyed by its shape and grad_scale */
    cudaGraphExec_t exec;
    int64_t key_b, key_t;
    double key_scale;
    int key_seen;           /* calls with this key: 1 = ran eagerly (warm-up), then captured */
    bool graphs;            /* false: eager only (DW_CUDA_GRAPH=0 or a failed capture) */
    cudaGraphExec_t opt_exec; /* CUDA graph of the optimizer step (any shape), after one eager call */
    int opt_calls;
    dw_qlin ql;             /* quantised linear layers: scratch in the workspace pool */
};

#define CE (e->cuda)
#define STREAM ((void *)CE->stream)

/* ---- pointers ---------------------------------------------------------------------------- */
static void *act(dw_engine *e, int tensor) {
    return CE->arena + CE->cp->val_off[tensor];
}
static float *pval(dw_engine *e, int tensor) {
    return CE->w + CE->cp->param_off[CE->tparam[tensor]];
}
static float *pgrad(dw_engine *e, int tensor) {
    return CE->g + CE->cp->param_off[CE->tparam[tensor]];
}
static const uint16_t *pbf16(dw_engine *e, int tensor) {
    return CE->wb + CE->cp->param_off[CE->tparam[tensor]];
}
/* The BF16 copy of a linear layer's weight for a BF16 GEMM. A quantised layer keeps none standing
 * (its GEMMs read the FP8 cache): where one of them falls back to BF16 (a call shape the FP8
 * kernel refuses), the weight is converted here first, stream-ordered, every time (so a CUDA
 * graph that captured it replays the conversion too). */
static dw_status bf16_weight(dw_engine *e, int tensor, const uint16_t **out) {
    const int p = CE->tparam[tensor];
    *out = pbf16(e, tensor);
    if (!CE->bf16_lazy || !CE->bf16_lazy[p]) return DW_OK;
    const int64_t off = CE->cp->param_off[p];
    DW_CUDA_CHECK(e->ctx, (cudaError_t)dw_engine_cuda_to_bf16(CE->wb + off, CE->w + off, e->params[p].numel, STREAM));
    return DW_OK;
}
static void *dact(dw_engine *e, int tensor) { return CE->arena + CE->cp->grad_off[tensor]; }
static float *aux(dw_engine *e, int node, int part) {
    return (float *)(CE->arena + CE->cp->aux_off[node][part]);
}
static void *tmp(dw_engine *e, int node, int part) { return CE->arena + CE->cp->tmp_off[node][part]; }

static int64_t width(const dw_engine *e, int tensor) {
    const dw_ir_tensor *t = &e->g->tensors[tensor];
    return t->shape[t->ndim - 1];
}

/* A linear's dgrad that accumulates in its GEMM (beta = 1) gets the gradient itself. */
static bool gemm_accumulates(dw_engine *e, int ni, int slot) {
    return slot == 0 && dw_compile_dgrad_accumulates(CE->cp, ni);
}
/* Where node ni's backward writes the gradient of input `slot` (NULL: none needed). */
static void *in_grad(dw_engine *e, int ni, int slot) {
    switch (CE->cp->grad_mode[ni][slot]) {
    case DW_GRAD_WRITE: return dact(e, e->g->nodes[ni].in[slot]);
    case DW_GRAD_ACCUM:
        return gemm_accumulates(e, ni, slot) ? dact(e, e->g->nodes[ni].in[slot]) : tmp(e, ni, DW_TMP_ACC0 + slot);
    default: return NULL;
    }
}
/* Adds a gradient written to scratch into the tensor's gradient. */
static dw_status in_grad_done(dw_engine *e, int ni, int slot) {
    if (CE->cp->grad_mode[ni][slot] != DW_GRAD_ACCUM || gemm_accumulates(e, ni, slot)) return DW_OK;
    int t = e->g->nodes[ni].in[slot];
    void *g = dact(e, t);
    return dw_cuda_add_fwd(e->ctx, CE->dt, g, g, tmp(e, ni, DW_TMP_ACC0 + slot),
                           CE->b * CE->t * width(e, t), STREAM);
}

/* A norm's backward adds a later gradient of its input straight into it (accumulate). */
static bool norm_acc(dw_engine *e, int ni) { return CE->cp->grad_mode[ni][0] == DW_GRAD_ACCUM; }
static void *norm_dx(dw_engine *e, int ni) {
    return norm_acc(e, ni) ? dact(e, e->g->nodes[ni].in[0]) : in_grad(e, ni, 0);
}

/* ---- linear: FP32 reference GEMM or BF16 dw_gemm ------------------------------------------- */
static dw_gemm_operand bf16_op(const void *data, int64_t rows, int64_t cols, bool trans) {
    dw_gemm_operand o = {.recipe = DW_RECIPE_BF16, .trans = trans, .rows = rows, .cols = cols,
                         .data = data, .tensor_scale = 1.0f};
    return o;
}

static dw_status fwd_linear(dw_engine *e, int ni) {
    const dw_ir_node *n = &e->g->nodes[ni];
    int64_t N = CE->b * CE->t, K = width(e, n->in[0]), M = width(e, n->out);
    if (!CE->cp->bf16)
        return dw_cuda_linear_fwd(e->ctx, act(e, n->out), act(e, n->in[0]), pval(e, n->in[1]),
                                  n->n_in == 3 ? pval(e, n->in[2]) : NULL, N, K, M, STREAM);
    int gelu = dw_compile_fused_gelu_fwd(CE->cp, ni); /* GELU in the epilogue: out = GELU, aux = ours */
    if (dw_compile_quant_recipe(CE->cp->bind[ni].recipe)) { /* quantised; BF16 below when not eligible */
        bool done = false;
        DW_TRY(dw_qlin_fprop(&CE->ql, ni, act(e, n->out), gelu >= 0 ? act(e, e->g->nodes[gelu].out) : NULL,
                             act(e, n->in[0]), n->n_in == 3 ? pbf16(e, n->in[2]) : NULL, N, K, M, &done));
        if (done) return DW_OK;
    }
    const uint16_t *wb;
    DW_TRY(bf16_weight(e, n->in[1], &wb));
    dw_gemm_args a = {.pass = DW_GEMM_FPROP, .m = N, .n = M, .k = K,
                      .a = bf16_op(act(e, n->in[0]), N, K, false), .b = bf16_op(wb, M, K, true),
                      .alpha = 1.0f, .d = act(e, n->out), .out_type = DW_GEMM_OUT_BF16};
    if (n->n_in == 3) {
        a.epilogue = DW_EPI_BIAS;
        a.bias = pbf16(e, n->in[2]);
    }
    if (gelu >= 0) {
        a.epilogue |= DW_EPI_GELU | DW_EPI_GELU_AUX;
        a.aux = act(e, n->out);
        a.d = act(e, e->g->nodes[gelu].out);
    }
    return dw_gemm(e->ctx, &a);
}

static dw_status bwd_linear(dw_engine *e, int ni) {
    const dw_ir_node *n = &e->g->nodes[ni];
    int64_t N = CE->b * CE->t, K = width(e, n->in[0]), M = width(e, n->out);
    void *dx = in_grad(e, ni, 0), *dout = dact(e, n->out), *x = act(e, n->in[0]);
    float *dw = pgrad(e, n->in[1]), *db = n->n_in == 3 ? pgrad(e, n->in[2]) : NULL;
    if (!CE->cp->bf16) {
        DW_TRY(dw_cuda_linear_bwd(e->ctx, dx, dw, db, dout, x, pval(e, n->in[1]), N, K, M, STREAM));
        return in_grad_done(e, ni, 0);
    }
    bool dg_done = false, wg_done = false;
    if (dw_compile_quant_recipe(CE->cp->bind[ni].recipe)) { /* quantised; BF16 below for an ineligible GEMM */
        DW_TRY(dw_qlin_bwd(&CE->ql, ni, dx, dw, dout, x, N, K, M, &dg_done, &wg_done));
        if (dg_done) DW_TRY(in_grad_done(e, ni, 0));
    }
    int gelu = dw_compile_fused_gelu_bwd(CE->cp, ni); /* x = GELU(h): dgrad writes dh = (dout W) GELU'(h) */
    if (gelu >= 0) dx = in_grad(e, gelu, 0);
    if (dx && !dg_done) { /* dgrad: dx [N,K] = dout [N,M] W [M,K] */
        const uint16_t *wb;
        DW_TRY(bf16_weight(e, n->in[1], &wb));
        dw_gemm_args a = {.pass = DW_GEMM_DGRAD, .m = N, .n = K, .k = M,
                          .a = bf16_op(dout, N, M, false), .b = bf16_op(wb, M, K, false),
                          .alpha = 1.0f, .d = dx, .out_type = DW_GEMM_OUT_BF16};
        if (gelu >= 0) {
            a.epilogue = DW_EPI_DGELU;
            a.aux = act(e, e->g->nodes[gelu].in[0]);
        } else if (gemm_accumulates(e, ni, 0)) { /* dx += dout W, into the gradient a sibling wrote */
            a.beta = 1.0f;
            a.c = dx;
        }
        DW_TRY(dw_gemm(e->ctx, &a));
        DW_TRY(in_grad_done(e, gelu >= 0 ? gelu : ni, 0));
    }
    if (!wg_done) { /* wgrad: dW [M,K] += dout^T [M,N] x [N,K], FP32 output accumulated (beta = 1) */
        dw_gemm_args a = {.pass = DW_GEMM_WGRAD, .m = M, .n = K, .k = N,
                          .a = bf16_op(dout, N, M, true), .b = bf16_op(x, N, K, false),
                          .alpha = 1.0f, .beta = 1.0f, .c = dw, .d = dw, .out_type = DW_GEMM_OUT_F32};
        if (db) { /* the bias gradient (sum of dout^T's rows) in the same GEMM, then db += it */
            a.epilogue = DW_EPI_BGRAD;
            a.bgrad = CE->bgrad;
        }
        DW_TRY(dw_gemm(e->ctx, &a));
        if (db) return dw_cuda_add_fwd(e->ctx, DW_ACT_F32, db, db, CE->bgrad, M, STREAM);
    }
    /* db [M] += column sums of dout (N,M): the positions kernel's fixed-order column sum */
    if (db) DW_TRY(dw_cuda_pos_bwd(e->ctx, CE->dt, NULL, db, dout, N, 1, M, STREAM));
    return DW_OK;
}

/* ---- attention: packed qkv is split into the node's saved q, k, v ---------------------------- */
static void attn_qkv(dw_engine *e, int ni, const void **q, const void **k, const void **v) {
    const dw_ir_node *n = &e->g->nodes[ni];
    if (n->n_in == 3) {
        *q = act(e, n->in[0]), *k = act(e, n->in[1]), *v = act(e, n->in[2]);
    } else {
        *q = aux(e, ni, DW_AUX_Q), *k = aux(e, ni, DW_AUX_K), *v = aux(e, ni, DW_AUX_V);
    }
}

/* A packed-qkv node whose kernels read q, k, v in place (attn_packed.h): no split in forward, no
 * merge in backward. Decided from every pointer either direction touches, so both agree. */
static bool attn_packed(dw_engine *e, int ni) {
    const dw_ir_node *n = &e->g->nodes[ni];
    void *dqkv = in_grad(e, ni, 0);
    const void *ptrs[] = {act(e, n->in[0]), act(e, n->out), dact(e, n->out), dqkv};
    return n->n_in == 1 && dqkv && dw_cuda_attention_packed_ok(CE->dt, n->attrs.head_dim, ptrs, 4);
}

static dw_status fwd_attention(dw_engine *e, int ni) {
    const dw_ir_node *n = &e->g->nodes[ni];
    const dw_ir_attrs *at = &n->attrs;
    if (attn_packed(e, ni))
        return dw_cuda_attention_fwd_packed(e->ctx, act(e, n->out), aux(e, ni, DW_AUX_STAT0), act(e, n->in[0]),
                                            CE->b, CE->t, at->heads, at->kv_heads, at->head_dim, STREAM);
    if (n->n_in == 1)
        DW_CUDA_CHECK(e->ctx, (cudaError_t)dw_engine_cuda_qkv(
                                  act(e, n->in[0]), aux(e, ni, DW_AUX_Q), aux(e, ni, DW_AUX_K),
                                  aux(e, ni, DW_AUX_V), CE->b * CE->t, at->heads * at->head_dim,
                                  at->kv_heads * at->head_dim, dw_act_size(CE->dt), false, STREAM));
    const void *q, *k, *v;
    attn_qkv(e, ni, &q, &k, &v);
    return dw_cuda_attention_fwd(e->ctx, CE->dt, act(e, n->out), aux(e, ni, DW_AUX_STAT0), q, k, v,
                                 CE->b, CE->t, at->heads, at->kv_heads, at->head_dim, STREAM);
}

static dw_status bwd_attention(dw_engine *e, int ni) {
    const dw_ir_node *n = &e->g->nodes[ni];
    const dw_ir_attrs *at = &n->attrs;
    if (attn_packed(e, ni)) {
        DW_TRY(dw_cuda_attention_bwd_packed(e->ctx, in_grad(e, ni, 0), dact(e, n->out), act(e, n->in[0]),
                                            act(e, n->out), aux(e, ni, DW_AUX_STAT0), tmp(e, ni, DW_TMP_DELTA),
                                            CE->b, CE->t, at->heads, at->kv_heads, at->head_dim, STREAM));
        return in_grad_done(e, ni, 0);
    }
    const void *q, *k, *v;
    attn_qkv(e, ni, &q, &k, &v);
    bool packed = n->n_in == 1;
    void *dq = packed ? tmp(e, ni, DW_TMP_GQ) : in_grad(e, ni, 0);
    void *dk = packed ? tmp(e, ni, DW_TMP_GK) : in_grad(e, ni, 1);
    void *dv = packed ? tmp(e, ni, DW_TMP_GV) : in_grad(e, ni, 2);
    DW_TRY(dw_cuda_attention_bwd(e->ctx, CE->dt, dq, dk, dv, dact(e, n->out), q, k, v, act(e, n->out),
                                 aux(e, ni, DW_AUX_STAT0), tmp(e, ni, DW_TMP_DELTA), CE->b, CE->t,
                                 at->heads, at->kv_heads, at->head_dim, STREAM));
    if (!packed) {
        for (int s = 0; s < 3; s++) DW_TRY(in_grad_done(e, ni, s));
        return DW_OK;
    }
    DW_CUDA_CHECK(e->ctx, (cudaError_t)dw_engine_cuda_qkv(in_grad(e, ni, 0), dq, dk, dv, CE->b * CE->t,
                                                          at->heads * at->head_dim, at->kv_heads * at->head_dim,
                                                          dw_act_size(CE->dt), true, STREAM));
    return in_grad_done(e, ni, 0);
}

/* ---- every op, forward ------------------------------------------------------------------------ */
#define X(i) act(e, n->in[i])   /* input i's value (an activation) */
#define P(i) pval(e, n->in[i])  /* input i's FP32 master weight */
#define G(i) pgrad(e, n->in[i]) /* input i's FP32 gradient (a parameter) */
static dw_status fwd_node(dw_engine *e, int ni, bool train, double dloss) {
    const dw_ir_node *n = &e->g->nodes[ni];
    if (ni == 0) dw_qlin_reset(&CE->ql); /* a forward sweep starts: the quantisation slots hold nothing */
    dw_ctx *ctx = e->ctx;
    const dw_act_dtype dt = CE->dt;
    const int64_t N = CE->b * CE->t, C = width(e, n->out);
    void *out = n->op == DW_OP_CROSS_ENTROPY ? NULL : act(e, n->out), *s = STREAM;
    const dw_ir_attrs *a = &n->attrs;
    switch (n->op) {
    case DW_OP_EMBEDDING:
        return dw_cuda_embedding_fwd(ctx, dt, out, CE->tokens, P(1), N, C, e->g->model.vocab, s);
    case DW_OP_POSITION: return dw_cuda_pos_fwd(ctx, dt, out, X(0), P(1), CE->b, CE->t, C, s);
    case DW_OP_ROPE: return dw_cuda_rope_fwd(ctx, dt, out, X(0), CE->b, CE->t, a->heads, a->head_dim, a->theta, s);
    case DW_OP_LAYERNORM:
        return dw_cuda_layernorm_fwd(ctx, dt, out, aux(e, ni, DW_AUX_STAT0), aux(e, ni, DW_AUX_STAT1), X(0), P(1),
                                     P(2), N, C, a->eps, s);
    case DW_OP_RMSNORM: return dw_cuda_rmsnorm_fwd(ctx, dt, out, aux(e, ni, DW_AUX_STAT0), X(0), P(1), N, C, a->eps, s);
    case DW_OP_LINEAR: return fwd_linear(e, ni);
    case DW_OP_GELU: /* or computed by the producing linear's epilogue */
        if (CE->cp->fused[ni] & DW_FUSED_FWD) return DW_OK;
        return dw_cuda_gelu_fwd(ctx, dt, out, X(0), N * C, s);
    case DW_OP_SILU: return dw_cuda_silu_fwd(ctx, dt, out, X(0), N * C, s);
    case DW_OP_SWIGLU: return dw_cuda_swiglu_fwd(ctx, dt, out, X(0), X(1), N * C, s);
    case DW_OP_ADD: return dw_cuda_add_fwd(ctx, dt, out, X(0), X(1), N * C, s);
    case DW_OP_ATTENTION: return fwd_attention(e, ni);
    case DW_OP_CROSS_ENTROPY: /* fused: loss and (training) dlogits in place over the logits */
        return dw_cuda_cross_entropy(ctx, dt, CE->loss, NULL, train ? in_grad(e, ni, 0) : NULL, X(0),
                                     CE->targets, N, width(e, n->in[0]), (float)dloss,
                                     tmp(e, ni, DW_TMP_XENT), s);
    default: return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "cuda engine: op %s", dw_op_name(n->op));
    }
}

/* ---- every op, backward -------------------------------------------------------------------- */
static dw_status bwd_node(dw_engine *e, int ni) {
    if (ni == e->g->n_nodes - 1) dw_qlin_reset(&CE->ql); /* a backward sweep starts */
    const dw_ir_node *n = &e->g->nodes[ni];
    dw_ctx *ctx = e->ctx;
    const dw_act_dtype dt = CE->dt;
    const int64_t N = CE->b * CE->t, C = width(e, n->out);
    void *dout = n->op == DW_OP_CROSS_ENTROPY ? NULL : dact(e, n->out), *s = STREAM;
    const dw_ir_attrs *a = &n->attrs;
    switch (n->op) {
    case DW_OP_EMBEDDING:
        return dw_cuda_embedding_bwd(ctx, dt, G(1), dout, CE->tokens, N, C, e->g->model.vocab, s);
    case DW_OP_POSITION:
        DW_TRY(dw_cuda_pos_bwd(ctx, dt, in_grad(e, ni, 0), G(1), dout, CE->b, CE->t, C, s));
        return in_grad_done(e, ni, 0);
    case DW_OP_ROPE:
        DW_TRY(dw_cuda_rope_bwd(ctx, dt, in_grad(e, ni, 0), dout, CE->b, CE->t, a->heads, a->head_dim, a->theta, s));
        return in_grad_done(e, ni, 0);
    case DW_OP_LAYERNORM: /* one pass; a later gradient of x is added in place (ACC0 unused) */
        return dw_cuda_layernorm_bwd_ws(ctx, dt, norm_dx(e, ni), G(1), G(2), dout, X(0), P(1),
                                        aux(e, ni, DW_AUX_STAT0), aux(e, ni, DW_AUX_STAT1), N, C,
                                        norm_acc(e, ni), tmp(e, ni, DW_TMP_DELTA),
                                        dw_cuda_norm_bwd_ws_bytes(N, C), s);
    case DW_OP_RMSNORM:
        return dw_cuda_rmsnorm_bwd_ws(ctx, dt, norm_dx(e, ni), G(1), dout, X(0), P(1),
                                      aux(e, ni, DW_AUX_STAT0), N, C, norm_acc(e, ni),
                                      tmp(e, ni, DW_TMP_DELTA), dw_cuda_norm_bwd_ws_bytes(N, C), s);
    case DW_OP_LINEAR: return bwd_linear(e, ni);
    case DW_OP_GELU: /* or computed by the consuming linear's dgrad epilogue */
        if (CE->cp->fused[ni] & DW_FUSED_BWD) return DW_OK;
        DW_TRY(dw_cuda_gelu_bwd(ctx, dt, in_grad(e, ni, 0), dout, X(0), N * C, s));
        return in_grad_done(e, ni, 0);
    case DW_OP_SILU:
        DW_TRY(dw_cuda_silu_bwd(ctx, dt, in_grad(e, ni, 0), dout, X(0), N * C, s));
        return in_grad_done(e, ni, 0);
    case DW_OP_SWIGLU:
        DW_TRY(dw_cuda_swiglu_bwd(ctx, dt, in_grad(e, ni, 0), in_grad(e, ni, 1), dout, X(0), X(1), N * C, s));
        DW_TRY(in_grad_done(e, ni, 0));
        return in_grad_done(e, ni, 1);
    case DW_OP_ADD: /* identity: copy into a first gradient, add into a later one */
        for (int k = 0; k < 2; k++) {
            int mode = CE->cp->grad_mode[ni][k];
            void *gk = mode == DW_GRAD_NONE ? NULL : dact(e, n->in[k]);
            if (mode == DW_GRAD_WRITE && gk != dout) /* same buffer: shared through the add (compile.h) */
                DW_CUDA_CHECK(ctx, cudaMemcpyAsync(gk, dout, (size_t)(N * C * dw_act_size(dt)),
                                                   cudaMemcpyDeviceToDevice, CE->stream));
            else if (mode == DW_GRAD_ACCUM)
                DW_TRY(dw_cuda_add_fwd(ctx, dt, gk, gk, dout, N * C, s));
        }
        return DW_OK;
    case DW_OP_ATTENTION: return bwd_attention(e, ni);
    case DW_OP_CROSS_ENTROPY: return DW_OK; /* fused into the forward step */
    default: return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "cuda engine: op %s", dw_op_name(n->op));
    }
#undef X
#undef P
#undef G
}

/* Launches the whole schedule on the stream (no synchronisation). */
static dw_status launch_step(dw_engine *e, bool train, bool with_loss, double dloss) {
    const dw_graph *g = e->g;
    for (int i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].op == DW_OP_CROSS_ENTROPY && !with_loss) continue;
        dw_status s = fwd_node(e, i, train, dloss);
        if (s != DW_OK) return dw_prefix_error(e->ctx, s, "forward of node '%s'", g->nodes[i].name);
    }
    if (!train) return DW_OK;
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        dw_status s = bwd_node(e, i);
        if (s != DW_OK) return dw_prefix_error(e->ctx, s, "backward of node '%s'", g->nodes[i].name);
    }
    return DW_OK;
}

/* ---- CUDA graph of the training step ------------------------------------------------------- */
static void drop_graph(dw_engine *e) {
    if (CE->exec) cudaGraphExecDestroy(CE->exec);
    CE->exec = NULL;
}

static dw_status launch_training_step(dw_engine *e, const void *dloss) {
    return launch_step(e, true, true, *(const double *)dloss);
}

/* Captures what fn launches into *exec; false (with the reason logged) when capture is not
 * possible. Nothing runs: the caller launches the graph. */
static bool capture(dw_engine *e, dw_status (*fn)(dw_engine *, const void *), const void *arg, cudaGraphExec_t *exec,
                    const char *what) {
    cudaGraph_t graph = NULL;
    cudaError_t ce = cudaStreamBeginCapture(CE->stream, cudaStreamCaptureModeThreadLocal);
    if (ce != cudaSuccess) {
        DW_LOGW("cuda engine: CUDA graph capture unavailable (%s); running eagerly", cudaGetErrorString(ce));
        (void)cudaGetLastError();
        return false;
    }
    dw_status s = fn(e, arg);
    ce = cudaStreamEndCapture(CE->stream, &graph);
    if (s != DW_OK || ce != cudaSuccess) {
        DW_LOGW("cuda engine: CUDA graph capture failed (%s); running eagerly from now on",
                s != DW_OK ? dw_errmsg(e->ctx) : cudaGetErrorString(ce));
        if (graph) cudaGraphDestroy(graph);
        (void)cudaGetLastError();
        return false;
    }
    ce = cudaGraphInstantiate(exec, graph, 0);
    cudaGraphDestroy(graph);
    if (ce != cudaSuccess) {
        DW_LOGW("cuda engine: CUDA graph instantiation failed (%s); running eagerly from now on",
                cudaGetErrorString(ce));
        *exec = NULL;
        (void)cudaGetLastError();
        return false;
    }
    DW_LOGD("cuda engine: captured %s into a CUDA graph (batch %lld x %lld)", what, (long long)CE->b,
            (long long)CE->t);
    return true;
}

/* ---- public entry points ---------------------------------------------------------------------- */
static dw_status put_batch(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B,
                           int64_t T) {
    DW_TRY(dw_engine_begin(e, tokens, targets, B, T)); /* shape and vocabulary checks */
    e->tokens = e->targets = NULL;
    CE->b = B;
    CE->t = T;
    size_t bytes = (size_t)(B * T) * sizeof(int32_t);
    DW_CUDA_CHECK(e->ctx, cudaMemcpyAsync(CE->tokens, tokens, bytes, cudaMemcpyHostToDevice, CE->stream));
    if (targets)
        DW_CUDA_CHECK(e->ctx, cudaMemcpyAsync(CE->targets, targets, bytes, cudaMemcpyHostToDevice, CE->stream));
    return DW_OK;
}

/* The loss readback: the step's one host sync (none when the caller passes no loss). */
static dw_status read_loss(dw_engine *e, double *loss) {
    if (!loss) return DW_OK;
    DW_CUDA_CHECK(e->ctx, cudaMemcpyAsync(CE->host_loss, CE->loss, sizeof(float), cudaMemcpyDeviceToHost, CE->stream));
    DW_CUDA_CHECK(e->ctx, cudaStreamSynchronize(CE->stream));
    *loss = (double)*CE->host_loss;
    return DW_OK;
}

/* One eager training step with an event before every schedule step (engine_cuda.h). */
dw_status dw_engine_cuda_profile_step(dw_engine *e, const int32_t *tokens, const int32_t *targets,
                                      int64_t B, int64_t T, double grad_scale, dw_engine_prof *out,
                                      int cap, int *n_nodes) {
    const dw_graph *g = e->g;
    const int n = g->n_nodes;
    *n_nodes = n;
    DW_TRY(put_batch(e, tokens, targets, B, T));
    cudaEvent_t *ev = calloc((size_t)(2 * n + 1), sizeof *ev);
    if (!ev) return dw_set_error(e->ctx, DW_ERR_NOMEM, "profile: out of memory");
    dw_status s = DW_OK;
    int made = 0;
    for (; made < 2 * n + 1; made++)
        if (cudaEventCreate(&ev[made]) != cudaSuccess) {
            s = dw_set_error(e->ctx, DW_ERR_CUDA, "profile: cudaEventCreate failed");
            break;
        }
    for (int k = 0; s == DW_OK && k < 2 * n; k++) { /* step k: node k forward, then backward */
        int i = k < n ? k : 2 * n - 1 - k;
        cudaEventRecord(ev[k], CE->stream);
        s = k < n ? fwd_node(e, i, true, grad_scale) : bwd_node(e, i);
        if (s != DW_OK) s = dw_prefix_error(e->ctx, s, "profile: node '%s'", g->nodes[i].name);
    }
    if (s == DW_OK) {
        cudaEventRecord(ev[2 * n], CE->stream);
        if (cudaEventSynchronize(ev[2 * n]) != cudaSuccess)
            s = dw_set_error(e->ctx, DW_ERR_CUDA, "profile: step failed: %s", cudaGetErrorString(cudaGetLastError()));
    }
    for (int k = 0; s == DW_OK && k < 2 * n; k++) {
        int i = k < n ? k : 2 * n - 1 - k;
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, ev[k], ev[k + 1]);
        if (i >= cap) continue;
        out[i].name = g->nodes[i].name;
        out[i].op = (int)g->nodes[i].op;
        if (k < n) out[i].fwd_ms = ms;
        else out[i].bwd_ms = ms;
    }
    for (int k = 0; k < made; k++) cudaEventDestroy(ev[k]);
    free(ev);
    return s;
}

dw_status dw_engine_cuda_forward_backward(dw_engine *e, const int32_t *tokens, const int32_t *targets,
                                          int64_t B, int64_t T, double grad_scale, double *loss) {
    DW_TRY(put_batch(e, tokens, targets, B, T));
    bool same = CE->key_b == B && CE->key_t == T && CE->key_scale == grad_scale;
    if (!same) {
        drop_graph(e);
        CE->key_b = B, CE->key_t = T, CE->key_scale = grad_scale, CE->key_seen = 0;
    }
    CE->key_seen++;
    if (CE->graphs && !CE->exec && CE->key_seen >= 2 &&
        !capture(e, launch_training_step, &grad_scale, &CE->exec, "a training step"))
        CE->graphs = false;
    if (CE->exec)
        DW_CUDA_CHECK(e->ctx, cudaGraphLaunch(CE->exec, CE->stream));
    else /* eager: the first call of a shape (warms up cuBLASLt) or graphs off */
        DW_TRY(launch_step(e, true, true, grad_scale));
    return read_loss(e, loss);
}

dw_status dw_engine_cuda_forward(dw_engine *e, const int32_t *tokens, const int32_t *targets,
                                 int64_t B, int64_t T, float *logits, double *loss) {
    DW_TRY(put_batch(e, tokens, targets, B, T));
    DW_TRY(launch_step(e, false, targets != NULL, 1.0));
    if (logits) {
        int64_t n = B * T * e->g->model.vocab;
        if (CE->dt == DW_ACT_F32) {
            DW_CUDA_CHECK(e->ctx, cudaMemcpyAsync(logits, act(e, e->g->logits), (size_t)n * sizeof(float),
                                                  cudaMemcpyDeviceToHost, CE->stream));
        } else { /* BF16 codes into the upper halves, then widen in place from the end */
            uint16_t *h = (uint16_t *)logits + n;
            DW_CUDA_CHECK(e->ctx, cudaMemcpyAsync(h, act(e, e->g->logits), (size_t)n * 2,
                                                  cudaMemcpyDeviceToHost, CE->stream));
            DW_CUDA_CHECK(e->ctx, cudaStreamSynchronize(CE->stream));
            for (int64_t i = 0; i < n; i++) {
                uint32_t u = (uint32_t)h[i] << 16;
                memcpy(&logits[i], &u, 4);
            }
        }
    }
    if (targets && loss) return read_loss(e, loss);
    DW_CUDA_CHECK(e->ctx, cudaStreamSynchronize(CE->stream));
    return DW_OK;
}

void dw_engine_cuda_zero_grad(dw_engine *e) {
    cudaError_t ce = cudaMemsetAsync(CE->g, 0, (size_t)CE->cp->param_floats * sizeof(float), CE->stream);
    if (ce != cudaSuccess) DW_LOGE("cuda engine: zeroing gradients failed: %s", cudaGetErrorString(ce));
}

/* Which parameters keep a standing BF16 copy (BF16 mode): only linear layers read it (the other
 * ops read the FP32 masters), so every parameter but the weight of a quantised layer whose fprop
 * and dgrad both run quantised at the planned shape (those are converted on use: bf16_weight).
 * llama-1b under fp8_block: no weight matrix at all, 1.2e9 floats not converted per update.
 * Runs: consecutive kept parameters merged (the padding between them converted along). */
static int by_begin(const void *a, const void *b) {
    int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
    return x < y ? -1 : x > y;
}

static dw_status bf16_copy_plan(dw_engine *e) {
    const dw_compiled *cp = CE->cp;
    const dw_graph *g = e->g;
    const int np = cp->n_params;
    CE->bf16_lazy = calloc((size_t)(np ? np : 1), sizeof *CE->bf16_lazy);
    CE->bf16_runs = malloc((size_t)(np ? np : 1) * sizeof *CE->bf16_runs);
    if (!CE->bf16_lazy || !CE->bf16_runs) return dw_set_error(e->ctx, DW_ERR_NOMEM, "cuda engine: out of memory");
    const int64_t N = g->batch * g->seq;
    for (int i = 0; i < g->n_nodes; i++) { /* a weight read by another node than quantised linears stays */
        const dw_ir_node *n = &g->nodes[i];
        if (n->op != DW_OP_LINEAR || !dw_compile_quant_recipe(cp->bind[i].recipe)) continue;
        const dw_ir_tensor *x = &g->tensors[n->in[0]], *y = &g->tensors[n->out];
        const int64_t K = x->shape[x->ndim - 1], M = y->shape[y->ndim - 1];
        const dw_recipe r = cp->bind[i].recipe;
        if (dw_compile_quant_pass_ok(r, DW_QPASS_FPROP, N, K, M) && dw_compile_quant_pass_ok(r, DW_QPASS_DGRAD, N, K, M))
            CE->bf16_lazy[CE->tparam[n->in[1]]] = true;
    }
    for (int i = 0; i < g->n_nodes; i++) { /* ... unless a BF16 linear layer reads it too */
        const dw_ir_node *n = &g->nodes[i];
        if (n->op == DW_OP_LINEAR && !dw_compile_quant_recipe(cp->bind[i].recipe))
            CE->bf16_lazy[CE->tparam[n->in[1]]] = false;
    }
    int n = 0; /* kept parameters by offset, then merged where only padding (< 64 floats) separates them */
    for (int p = 0; p < np; p++)
        if (!CE->bf16_lazy[p])
            CE->bf16_runs[n][0] = cp->param_off[p], CE->bf16_runs[n++][1] = cp->param_off[p] + e->params[p].numel;
    qsort(CE->bf16_runs, (size_t)n, sizeof *CE->bf16_runs, by_begin);
    CE->n_bf16_runs = 0;
    for (int r = 0; r < n; r++) {
        int64_t *last = CE->n_bf16_runs ? CE->bf16_runs[CE->n_bf16_runs - 1] : NULL;
        if (last && CE->bf16_runs[r][0] - last[1] < 64) last[1] = CE->bf16_runs[r][1];
        else memmove(CE->bf16_runs[CE->n_bf16_runs++], CE->bf16_runs[r], sizeof *CE->bf16_runs);
    }
    return DW_OK;
}

/* After every change of the master weights: the BF16 working copy, and the quantised linear
 * layers' cached W and W^T (engine_cuda_quant.c). Stream-ordered; inside the optimizer's graph. */
static dw_status refresh_bf16(dw_engine *e) {
    for (int r = 0; CE->wb && r < CE->n_bf16_runs; r++) {
        const int64_t b = CE->bf16_runs[r][0], n = CE->bf16_runs[r][1] - b;
        DW_CUDA_CHECK(e->ctx, (cudaError_t)dw_engine_cuda_to_bf16(CE->wb + b, CE->w + b, n, STREAM));
    }
    return DW_OK;
}
static dw_status refresh_wcache(dw_engine *e) {
    for (int i = 0; CE->wb && i < e->g->n_nodes; i++) {
        if (CE->cp->wq[i][0].off < 0) continue;
        const dw_ir_node *n = &e->g->nodes[i];
        DW_TRY(dw_qlin_quantize_weight(&CE->ql, i, pval(e, n->in[1]), width(e, n->in[0]), width(e, n->out)));
    }
    return DW_OK;
}
static dw_status refresh_weights(dw_engine *e) {
    DW_TRY(refresh_bf16(e));
    return refresh_wcache(e);
}

dw_status dw_engine_cuda_upload(dw_engine *e) {
    for (int i = 0; i < e->n_params; i++) {
        dw_param *p = &e->params[i];
        DW_CUDA_CHECK(e->ctx, cudaMemcpyAsync(CE->w + CE->cp->param_off[i], p->data, (size_t)p->numel * sizeof(float),
                                              cudaMemcpyHostToDevice, CE->stream));
    }
    DW_TRY(refresh_weights(e));
    DW_CUDA_CHECK(e->ctx, cudaStreamSynchronize(CE->stream)); /* host buffers may change next */
    return DW_OK;
}

dw_status dw_engine_cuda_download(dw_engine *e, bool grads) {
    for (int i = 0; i < e->n_params; i++) {
        dw_param *p = &e->params[i];
        size_t bytes = (size_t)p->numel * sizeof(float);
        DW_CUDA_CHECK(e->ctx, cudaMemcpyAsync(p->data, CE->w + CE->cp->param_off[i], bytes, cudaMemcpyDeviceToHost,
                                              CE->stream));
        if (grads)
            DW_CUDA_CHECK(e->ctx, cudaMemcpyAsync(p->grad, CE->g + CE->cp->param_off[i], bytes,
                                                  cudaMemcpyDeviceToHost, CE->stream));
    }
    DW_CUDA_CHECK(e->ctx, cudaStreamSynchronize(CE->stream));
    return DW_OK;
}

/* The optimizer's kernels: global gradient norm, AdamW (arguments from the workspace), BF16 copy
 * and quantised weights; with ev (profiling), an event after each phase: ev[0] before, then
 * ev[DW_OPT_PHASE_NORM ..]. */
static dw_status optimizer_phases(dw_engine *e, cudaEvent_t *ev) {
    const dw_compiled *cp = CE->cp;
    if (ev) cudaEventRecord(ev[DW_OPT_PHASE_ZERO + 1], CE->stream);
    DW_TRY(dw_cuda_grad_norm(e->ctx, CE->g, cp->param_floats, CE->partials, DW_COMPILE_NORM_BLOCKS, CE->norm, STREAM));
    if (ev) cudaEventRecord(ev[DW_OPT_PHASE_NORM + 1], CE->stream);
    DW_TRY(dw_cuda_adamw(e->ctx, CE->w, CE->g, CE->m, CE->v, cp->param_floats, cp->decay_floats, CE->norm,
                         CE->adamw_args, STREAM));
    if (ev) cudaEventRecord(ev[DW_OPT_PHASE_ADAMW + 1], CE->stream);
    DW_TRY(refresh_bf16(e)); /* refresh_weights, a phase at a time */
    if (ev) cudaEventRecord(ev[DW_OPT_PHASE_BF16 + 1], CE->stream);
    DW_TRY(refresh_wcache(e));
    if (ev) cudaEventRecord(ev[DW_OPT_PHASE_WCACHE + 1], CE->stream);
    return DW_OK;
}

/* Step t's AdamW arguments to the workspace (from pinned memory, stream-ordered), where the
 * kernels read them. */
static dw_status stage_adamw_args(dw_engine *e, double lr, double beta1, double beta2, double eps, double wd,
                                  double clip, int64_t step) {
    *CE->host_args = (dw_cuda_adamw_args){.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = wd,
                                          .c1 = 1.0 - pow(beta1, (double)step), .c2 = 1.0 - pow(beta2, (double)step),
                                          .max_norm = clip};
    DW_CUDA_CHECK(e->ctx, cudaMemcpyAsync(CE->adamw_args, CE->host_args, sizeof *CE->host_args,
                                          cudaMemcpyHostToDevice, CE->stream));
    return DW_OK;
}

static dw_status launch_optimizer(dw_engine *e, const void *unused) {
    (void)unused;
    return optimizer_phases(e, NULL);
}

dw_status dw_engine_cuda_adamw(dw_engine *e, double lr, double beta1, double beta2, double eps, double wd,
                               double clip, int64_t step, double *grad_norm) {
    if (step < 1 || !(eps > 0) || !(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
        return dw_set_error(e->ctx, DW_ERR_INVALID, "adamw: step %lld, beta1 %g, beta2 %g, eps %g out of range",
                            (long long)step, beta1, beta2, eps);
    /* the kernels read the arguments from the workspace: the optimizer is one CUDA graph from its
     * second call on, whatever the values */
    DW_TRY(stage_adamw_args(e, lr, beta1, beta2, eps, wd, clip, step));
    if (CE->graphs && !CE->opt_exec && ++CE->opt_calls >= 2 &&
        !capture(e, launch_optimizer, NULL, &CE->opt_exec, "the optimizer step"))
        CE->graphs = false;
    if (CE->opt_exec)
        DW_CUDA_CHECK(e->ctx, cudaGraphLaunch(CE->opt_exec, CE->stream));
    else
        DW_TRY(launch_optimizer(e, NULL));
    DW_CUDA_CHECK(e->ctx, cudaMemcpyAsync(CE->host_norm, CE->norm, sizeof(double), cudaMemcpyDeviceToHost, CE->stream));
    DW_CUDA_CHECK(e->ctx, cudaStreamSynchronize(CE->stream));
    double norm = *CE->host_norm;
    if (grad_norm) *grad_norm = norm;
    if (!isfinite(norm))
        return dw_set_error(e->ctx, DW_ERR_NUMERIC, "adamw step %lld: gradient norm %g is not finite; parameters "
                            "left unchanged", (long long)step, norm);
    return DW_OK;
}

dw_status dw_engine_cuda_profile_optimizer(dw_engine *e, double lr, double beta1, double beta2, double eps,
                                           double wd, double clip, int reps, double ms[DW_OPT_PHASES]) {
    for (int k = 0; k < DW_OPT_PHASES; k++) ms[k] = 0;
    cudaEvent_t ev[DW_OPT_PHASES + 1];
    int made = 0;
    dw_status s = DW_OK;
    for (; made <= DW_OPT_PHASES; made++)
        if (cudaEventCreate(&ev[made]) != cudaSuccess) {
            s = dw_set_error(e->ctx, DW_ERR_CUDA, "profile: cudaEventCreate failed");
            break;
        }
    for (int r = 0; s == DW_OK && r < reps; r++) {
        s = stage_adamw_args(e, lr, beta1, beta2, eps, wd, clip, 1000 + r);
        if (s == DW_OK) {
            cudaEventRecord(ev[0], CE->stream);
            dw_engine_cuda_zero_grad(e);
            s = optimizer_phases(e, ev);
        }
        if (s == DW_OK && cudaEventSynchronize(ev[DW_OPT_PHASES]) != cudaSuccess)
            s = dw_set_error(e->ctx, DW_ERR_CUDA, "profile: optimizer step failed: %s",
                             cudaGetErrorString(cudaGetLastError()));
        for (int k = 0; s == DW_OK && k < DW_OPT_PHASES; k++) {
            float t = 0;
            cudaEventElapsedTime(&t, ev[k], ev[k + 1]);
            ms[k] += t / reps;
        }
    }
    for (int k = 0; k < made; k++) cudaEventDestroy(ev[k]);
    return s;
}

dw_status dw_engine_cuda_moments(dw_engine *e, int i, float *m, float *v, bool to_device) {
    size_t bytes = (size_t)e->params[i].numel * sizeof(float);
    int64_t off = CE->cp->param_off[i];
    enum cudaMemcpyKind k = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    DW_CUDA_CHECK(e->ctx, cudaMemcpyAsync(to_device ? (void *)(CE->m + off) : (void *)m,
                                          to_device ? (const void *)m : (const void *)(CE->m + off), bytes, k,
                                          CE->stream));
    DW_CUDA_CHECK(e->ctx, cudaMemcpyAsync(to_device ? (void *)(CE->v + off) : (void *)v,
                                          to_device ? (const void *)v : (const void *)(CE->v + off), bytes, k,
                                          CE->stream));
    DW_CUDA_CHECK(e->ctx, cudaStreamSynchronize(CE->stream));
    return DW_OK;
}

const dw_compiled *dw_engine_cuda_plan(const dw_engine *e) { return e->cuda->cp; }

void dw_engine_cuda_free(struct dw_engine_cuda *c) {
    if (!c) return;
    if (c->exec) cudaGraphExecDestroy(c->exec);
    if (c->opt_exec) cudaGraphExecDestroy(c->opt_exec);
    cudaFreeHost(c->host_args);
    for (int p = 0; p < DW_POOL_COUNT; p++) cudaFree(c->pool[p]);
    cudaFreeHost(c->host_loss);
    cudaFreeHost(c->host_norm);
    free(c->tparam);
    free(c->bf16_lazy);
    free(c->bf16_runs);
    dw_compiled_free(c->cp);
    free(c);
}

/* Allocates the pools and carves them by the plan. */
static dw_status build(dw_engine *e, const dw_policy *policy) {
    dw_ctx *ctx = e->ctx;
    void *sp = NULL;
    DW_TRY(dw_ctx_stream(ctx, &sp));
    e->cuda = calloc(1, sizeof *e->cuda);
    if (!e->cuda) return dw_set_error(ctx, DW_ERR_NOMEM, "cuda engine: out of memory");
    CE->stream = sp;
    const char *env = getenv("DW_CUDA_GRAPH");
    CE->graphs = !(env && !strcmp(env, "0"));
    DW_TRY(dw_compile(ctx, e->g, NULL, policy, &CE->cp));
    const dw_compiled *cp = CE->cp;
    if (cp->unsupported) return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "cuda engine: %s", cp->unsupported);
    CE->dt = cp->bf16 ? DW_ACT_BF16 : DW_ACT_F32;
    CE->tparam = malloc((size_t)e->g->n_tensors * sizeof *CE->tparam);
    if (!CE->tparam) return dw_set_error(ctx, DW_ERR_NOMEM, "cuda engine: out of memory");
    for (int t = 0; t < e->g->n_tensors; t++) CE->tparam[t] = -1;
    for (int p = 0; p < cp->n_params; p++) CE->tparam[cp->param_tensor[p]] = p;
    for (int p = 0; p < DW_POOL_COUNT; p++) {
        cudaError_t ce = cudaMalloc(&CE->pool[p], (size_t)cp->pool_bytes[p]);
        if (ce != cudaSuccess) {
            CE->pool[p] = NULL;
            (void)cudaGetLastError();
            return dw_set_error(ctx, DW_ERR_NOMEM, "cuda engine: cannot allocate the %s pool (%lld bytes): %s",
                                dw_pool_name((dw_pool_id)p), (long long)cp->pool_bytes[p], cudaGetErrorString(ce));
        }
    }
    const int64_t pf = cp->param_floats;
    CE->w = CE->pool[DW_POOL_WEIGHTS];
    CE->wb = cp->bf16 ? (uint16_t *)(CE->w + pf) : NULL;
    CE->g = CE->pool[DW_POOL_GRADS];
    CE->m = CE->pool[DW_POOL_OPTIM];
    CE->v = CE->m + pf;
    CE->arena = CE->pool[DW_POOL_ACT];
    char *w = CE->pool[DW_POOL_WORK];
    CE->tokens = (int32_t *)(w + cp->work.tokens);
    CE->targets = (int32_t *)(w + cp->work.targets);
    CE->loss = (float *)(w + cp->work.loss);
    CE->norm = (double *)(w + cp->work.norm);
    CE->partials = (double *)(w + cp->work.partials);
    const char *reuse = getenv("DW_QUANT_REUSE"); /* "0": quantise x at every use (tests compare) */
    CE->ql = (dw_qlin){.ctx = ctx, .stream = sp, .work = w, .cp = cp, .rows_tensor = -1, .xt_tensor = -1,
                       .reuse = !(reuse && !strcmp(reuse, "0"))};
    DW_CUDA_CHECK(ctx, cudaMallocHost((void **)&CE->host_loss, sizeof(float)));
    DW_CUDA_CHECK(ctx, cudaMallocHost((void **)&CE->host_norm, sizeof(double)));
    DW_CUDA_CHECK(ctx, cudaMallocHost((void **)&CE->host_args, sizeof *CE->host_args));
    CE->adamw_args = (dw_cuda_adamw_args *)(w + cp->work.adamw_args);
    CE->bgrad = cp->work.bgrad >= 0 ? (float *)(w + cp->work.bgrad) : NULL;
    if (cp->bf16) DW_TRY(bf16_copy_plan(e));
    /* zero everything once: padding between parameters stays 0 through AdamW */
    for (int p = 0; p < DW_POOL_COUNT; p++)
        DW_CUDA_CHECK(ctx, cudaMemsetAsync(CE->pool[p], 0, (size_t)cp->pool_bytes[p], CE->stream));
    if (cp->bf16) { /* one tiny GEMM on zeroed scratch: cuBLASLt's handle and workspace now, not in a step */
        dw_gemm_args a = {.m = 16, .n = 16, .k = 16, .a = bf16_op(CE->partials, 16, 16, false),
                          .b = bf16_op(CE->partials, 16, 16, true), .alpha = 1.0f,
                          .d = (char *)CE->partials + 2048, .out_type = DW_GEMM_OUT_F32};
        DW_TRY(dw_gemm(ctx, &a));
    }
    for (int ni = 0; ni < e->g->n_nodes; ni++) { /* attention's cuDNN plans now, not in a step */
        const dw_ir_node *n = &e->g->nodes[ni];
        if (n->op == DW_OP_ATTENTION)
            DW_TRY(dw_cuda_attention_prepare(ctx, CE->dt, e->cap_b, e->cap_t, n->attrs.heads, n->attrs.kv_heads,
                                             n->attrs.head_dim, attn_packed(e, ni)));
    }
    DW_CUDA_CHECK(ctx, cudaStreamSynchronize(CE->stream));
    return DW_OK;
}

dw_status dw_engine_create_cuda(dw_ctx *ctx, const dw_model_config *cfg, int64_t B, int64_t T,
                                const dw_policy *policy, dw_engine **out) {
    *out = NULL;
    if (dw_ctx_device(ctx) != DW_DEVICE_CUDA)
        return dw_set_error(ctx, DW_ERR_INVALID, "cuda engine: the context's device is not CUDA");
    dw_engine *e = calloc(1, sizeof *e);
    if (!e) return dw_set_error(ctx, DW_ERR_NOMEM, "engine: out of memory");
    e->ctx = ctx;
    e->cfg = *cfg;
    dw_status s = dw_capture_config(ctx, cfg, B, T, &e->g);
    if (s == DW_OK) {
        e->cap_b = e->b = B;
        e->cap_t = e->t = T;
        int np = 0;
        int64_t total = 0;
        for (int i = 0; i < e->g->n_tensors; i++)
            if (e->g->tensors[i].kind == DW_TENSOR_PARAM) np++, total += dw_ir_numel(&e->g->tensors[i]);
        e->params = calloc((size_t)(np ? np : 1), sizeof *e->params);
        e->blocks[0] = calloc((size_t)(total ? total : 1), sizeof(float)); /* host mirrors */
        e->blocks[1] = calloc((size_t)(total ? total : 1), sizeof(float));
        if (!e->params || !e->blocks[0] || !e->blocks[1])
            s = dw_set_error(ctx, DW_ERR_NOMEM, "engine: out of host memory for %lld parameters", (long long)total);
        float *hw = e->blocks[0], *hg = e->blocks[1];
        for (int i = 0; s == DW_OK && i < e->g->n_tensors; i++) {
            const dw_ir_tensor *t = &e->g->tensors[i];
            if (t->kind != DW_TENSOR_PARAM) continue;
            dw_param *q = &e->params[e->n_params++];
            q->name = t->name;
            q->ndim = t->ndim;
            for (int d = 0; d < t->ndim; d++) q->shape[d] = t->shape[d];
            q->numel = dw_ir_numel(t);
            q->data = hw;
            q->grad = hg;
            q->decay = t->decay;
            hw += q->numel;
            hg += q->numel;
        }
    }
    if (s == DW_OK) s = build(e, policy);
    if (s != DW_OK) {
        dw_engine_free(e);
        return s;
    }
    *out = e;
    return DW_OK;
}

#else /* !DW_HAVE_CUDA */

static dw_status no_cuda(dw_engine *e) {
    return dw_set_error(e->ctx, DW_ERR_UNSUPPORTED, "cuda engine: this build has no CUDA");
}
void dw_engine_cuda_free(struct dw_engine_cuda *c) { (void)c; }
dw_status dw_engine_cuda_upload(dw_engine *e) { return no_cuda(e); }
dw_status dw_engine_cuda_download(dw_engine *e, bool grads) {
    (void)grads;
    return no_cuda(e);
}
void dw_engine_cuda_zero_grad(dw_engine *e) { (void)e; }
dw_status dw_engine_cuda_forward(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B,
                                 int64_t T, float *logits, double *loss) {
    (void)tokens, (void)targets, (void)B, (void)T, (void)logits, (void)loss;
    return no_cuda(e);
}
dw_status dw_engine_cuda_forward_backward(dw_engine *e, const int32_t *tokens, const int32_t *targets,
                                          int64_t B, int64_t T, double grad_scale, double *loss) {
    (void)tokens, (void)targets, (void)B, (void)T, (void)grad_scale, (void)loss;
    return no_cuda(e);
}
dw_status dw_engine_cuda_adamw(dw_engine *e, double lr, double beta1, double beta2, double eps, double wd,
                               double clip, int64_t step, double *grad_norm) {
    (void)lr, (void)beta1, (void)beta2, (void)eps, (void)wd, (void)clip, (void)step, (void)grad_norm;
    return no_cuda(e);
}
const dw_compiled *dw_engine_cuda_plan(const dw_engine *e) {
    (void)e;
    return NULL;
}
dw_status dw_engine_cuda_profile_step(dw_engine *e, const int32_t *tokens, const int32_t *targets,
                                      int64_t B, int64_t T, double grad_scale, dw_engine_prof *out,
                                      int cap, int *n_nodes) {
    (void)tokens, (void)targets, (void)B, (void)T, (void)grad_scale, (void)out, (void)cap;
    *n_nodes = 0;
    return no_cuda(e);
}
dw_status dw_engine_cuda_profile_optimizer(dw_engine *e, double lr, double beta1, double beta2, double eps,
                                           double wd, double clip, int reps, double ms[DW_OPT_PHASES]) {
    (void)lr, (void)beta1, (void)beta2, (void)eps, (void)wd, (void)clip, (void)reps, (void)ms;
    return no_cuda(e);
}
dw_status dw_engine_cuda_moments(dw_engine *e, int i, float *m, float *v, bool to_device) {
    (void)i, (void)m, (void)v, (void)to_device;
    return no_cuda(e);
}
dw_status dw_engine_create_cuda(dw_ctx *ctx, const dw_model_config *cfg, int64_t B, int64_t T,
                                const dw_policy *policy, dw_engine **out) {
    (void)cfg, (void)B, (void)T, (void)policy;
    *out = NULL;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "cuda engine: this build has no CUDA (configure with "
                        "-DDW_CUDA=ON on a machine with nvcc)");
}

#endif /* DW_HAVE_CUDA */
