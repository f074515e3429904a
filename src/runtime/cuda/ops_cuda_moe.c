/* ops_cuda_moe.c — the CUDA backend's mixture-of-experts entries: the router (logits -> top-k
 * weights in the program's activation dtype and int32 experts; kernels/cuda/ops_moe.cu; its
 * backward recomputes the scores from the logits and reads the experts the forward chose),
 * dispatch and combine (kernels/cuda/ops_moe_dispatch.cu: counts, offsets and rows computed on the
 * device) and the grouped expert linear layer (dw_grouped_gemm with the kernel the compiler bound:
 * src/gemm/grouped_kernels.c; a BF16 program reads the standing BF16 weight copy, which expert
 * weights always have; passes bound to fp8_block or mxfp8 quantise x and dy on the device per call
 * (x once for the gate and up layers that read it, with dw_exec.quant_reuse) and read the node's
 * weight cache, which moe_fp8_cuda.c refreshes after each weight update; a BF16 wgrad
 * written over can also write its share of the gradient norm, compile/wgrad_sumsq.h). No
 * host synchronisation: a recorded step replays whatever the routing. Where the experts' SwiGLU
 * has written the down projection's fp8_block rows itself (act_quant_cuda.c), its fprop reads them;
 * where its backward has written the gate and up layers' dy rows, their dgrad does, as the down
 * layer's reads the rows the combine's backward wrote. An output gradient no
 * consumer sent (dout NULL) counts as zeros; no MoE op adds into an input gradient (ops.def gives
 * them no ACC flag). */
#include "core/error.h"
#include "runtime/backend.h"

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>


#include "compile/wgrad_sumsq.h"
#include "core/cuda_check.h"
#include "gemm/grouped.h"
#include "gemm/grouped_fp8.h"
#include "gemm/grouped_mxfp8.h"
#include "kernels/cuda/ops_cuda.h"
#include "runtime/cuda/cuda.h"
#include "runtime/exec.h"
#include "runtime/moe_fp8.h"

dw_status dw_cuda_op_moe_router_fwd(dw_backend *be, const dw_op_call *c) {
    const dw_ir_attrs *a = &c->n->attrs;
    const int64_t bo = dw_compile_moe_bias_of(c->x->p, c->node); /* the kernel reads the switch: no sync */
    const dw_router_desc d = dw_ir_router_desc(a);
    return dw_cuda_moe_router_fwd_desc(
        be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->out[0], (int32_t *)c->out[1], c->in[0],
        bo >= 0 ? (const float *)(c->x->work + bo) : NULL,
        bo >= 0 ? (const int32_t *)(c->x->work + c->x->p->work.moe_bias) : NULL, c->rows,
        dw_cuda_width(c, c->n->in[0]), a->top_k, &d, DW_CUDA_STREAM(be));
}

dw_status dw_cuda_op_moe_router_bwd(dw_backend *be, const dw_op_call *c) {
    if (!c->dx[0]) return DW_OK;
    const dw_ir_attrs *a = &c->n->attrs;
    const dw_router_desc d = dw_ir_router_desc(a);
    return dw_cuda_moe_router_bwd_desc(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->dx[0], c->dout[0], c->in[0],
                                       (const int32_t *)c->out[1], c->rows, dw_cuda_width(c, c->n->in[0]), a->top_k,
                                       &d, DW_CUDA_STREAM(be));
}

/* ---- dispatch: x's rows grouped by expert, the offsets, each (token, k)'s row ------------------ */
/* The capacity comes from the call's token count on the host: no synchronisation. A third input
 * (the router's weights) drops by weight instead of by position. */
dw_status dw_cuda_op_moe_dispatch_fwd(dw_backend *be, const dw_op_call *c) {
    const int64_t N = c->rows, K = dw_cuda_width(c, c->n->in[1]), E = c->n->attrs.experts;
    DW_TRY(dw_cuda_moe_dispatch_fwd(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->out[0], (int32_t *)c->out[1],
                                    (int32_t *)c->out[2], c->in[0], (const int32_t *)c->in[1],
                                    c->n->n_in > 2 ? c->in[2] : NULL, N, dw_cuda_width(c, c->n->in[0]), K, E,
                                    dw_moe_capacity(c->n->attrs.capacity_factor, N, K, E), DW_CUDA_STREAM(be)));
    /* the counters read the offsets the dispatch has just written (training forwards, once) */
    const int64_t cnt = c->train && !c->recompute ? dw_compile_moe_counts_of(c->x->p, c->node) : -1;
    if (cnt < 0) return DW_OK;
    return dw_cuda_moe_count(be->ctx, (int64_t *)(c->x->work + cnt), (const int32_t *)c->in[1],
                             (const int32_t *)c->out[1], N * K, E, DW_CUDA_STREAM(be));
}
/* Each token's sum of its rows' gradients: the combine with unit weights. */
dw_status dw_cuda_op_moe_dispatch_bwd(dw_backend *be, const dw_op_call *c) {
    if (c->n->n_in > 2 && c->dx[2] && !c->dx_acc[2]) /* the weights only ranked the assignments */
        DW_CUDA_CHECK(be->ctx, cudaMemsetAsync(c->dx[2], 0, (size_t)(c->rows * dw_cuda_width(c, c->n->in[1])) *
                                                                (size_t)dw_act_size((dw_act_dtype)dw_cuda_dt(c)),
                                               DW_CUDA_STREAM(be)));
    if (!c->dx[0]) return DW_OK;
    return dw_cuda_moe_combine_fwd(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->dx[0], c->dout[0], NULL,
                                   (const int32_t *)c->out[2], c->rows, dw_cuda_width(c, c->n->in[0]),
                                   dw_cuda_width(c, c->n->in[1]), DW_CUDA_STREAM(be));
}

/* ---- grouped linear: each expert's rows times its weight^T ------------------------------------ */
/* One pass as dw_grouped_gemm takes it: the program's activation type, the standing BF16 weight
 * copy (or the FP32 masters) where the pass runs BF16. */
static dw_grouped_args moe_gemm_args(const dw_op_call *c, int pass) {
    dw_grouped_args a = dw_moe_linear_args(c, pass, DW_DEVICE_CUDA);
    a.dtype = dw_cuda_dt(c) == DW_ACT_BF16 ? DW_GROUPED_BF16 : DW_GROUPED_F32;
    a.w = c->x->p->bf16 ? (const void *)c->in_bf16[1] : c->in[1], a.x = c->in[0];
    return a;
}

/* Where node c's BF16 wgrad writes its blocks' sums of squares (compile/wgrad_sumsq.h), or NULL:
 * not an eligible layer, or the executor does not take them this step. */
static double *wgrad_sumsq(const dw_op_call *c) {
    const int64_t o = dw_exec_wsumsq_on(c->x) ? dw_compile_wsumsq_of(c->x->p, c->node) : -1;
    if (o < 0) return NULL;
    DW_ASSERT(c->pgrad_set[1] && !c->x->p->node[c->node].bind.quantised[DW_QPASS_WGRAD]);
    return (double *)(c->x->work + o);
}

/* Quantised operands (recipe r: fp8_block or mxfp8) on the device, in the stream's order: v [R, C]
 * along its rows (role rows) or, for wgrad, v^T [C, P] with each expert's rows padded to the block
 * (dy^T, x^T; grouped_fp8.h, grouped_mxfp8.h), into the role's slot (moe_fp8.h). */
static dw_status quant_act(dw_backend *be, const dw_op_call *c, dw_recipe r, dw_moe_fp8_role role, const void *v,
                           int64_t R, int64_t C, const void **codes, const float **scales) {
    dw_moe_fp8_slot s;
    DW_TRY(dw_moe_fp8_operand(be->ctx, c, role, R, C, &s));
    dw_cuda_qlin_reset(be); /* the dense layers' record of which x the slots hold (quant_reuse) is void now */
    *codes = s.codes, *scales = s.scales;
    const bool bf16 = dw_cuda_dt(c) == DW_ACT_BF16;
    if (r == DW_RECIPE_MXFP8) {
        uint8_t *sc = dw_moe_mx_scales(s);
        if (role == DW_MOE_FP8_ROWS) return dw_grouped_mxfp8_quantize_rows_cuda(be->ctx, v, bf16, R, C, s.codes, sc);
        return dw_grouped_mxfp8_quantize_cols_cuda(be->ctx, v, bf16, (const int32_t *)c->in[2], R,
                                                   c->x->g->tensors[c->n->in[1]].shape[0], C, s.codes, sc);
    }
    if (role == DW_MOE_FP8_ROWS) return dw_grouped_fp8_quantize_rows_cuda(be->ctx, v, bf16, R, C, s.codes, s.scales);
    return dw_grouped_fp8_quantize_cols_cuda(be->ctx, v, bf16, (const int32_t *)c->in[2], R,
                                             c->x->g->tensors[c->n->in[1]].shape[0], C, s.codes, s.scales);
}

dw_status dw_cuda_op_moe_linear_fwd(dw_backend *be, const dw_op_call *c) {
    dw_grouped_args a = moe_gemm_args(c, DW_GEMM_FPROP);
    if (a.recipe != DW_RECIPE_BF16) { /* x quantised now (or by the sibling just before: gate, up), W from the cache */
        dw_cuda_state *st = DW_CUDA_ST(be);
        const int xi = c->n->in[0];
        if (c->x->quant_reuse && !c->x->moe_ep && st->rows_tensor == xi && st->rows_recipe == dw_cuda_moe_rows_mark(a.recipe)) {
            dw_moe_fp8_slot s; /* the same rows (one tensor), nothing quantised since */
            DW_TRY(dw_moe_fp8_operand(be->ctx, c, DW_MOE_FP8_ROWS, a.rows, a.k, &s));
            a.x = s.codes, a.x_scales = s.scales;
            st->moe_rows_reused++;
        } else {
            DW_TRY(quant_act(be, c, a.recipe, DW_MOE_FP8_ROWS, c->in[0], a.rows, a.k, &a.x, &a.x_scales));
            if (!c->x->moe_ep) st->rows_tensor = xi, st->rows_recipe = dw_cuda_moe_rows_mark(a.recipe);
        }
        dw_moe_fp8_cached_weight(c, 0, &a);
    }
    a.out = c->out[0];
    return dw_grouped_gemm(be->ctx, &a);
}

dw_status dw_cuda_op_moe_linear_bwd(dw_backend *be, const dw_op_call *c) {
    const dw_act_dtype dt = (dw_act_dtype)dw_cuda_dt(c);
    dw_grouped_args a = moe_gemm_args(c, DW_GEMM_DGRAD);
    a.dy = c->dout[0];
    if (!c->dout[0]) { /* no gradient reached y: none leaves (a dW written over: zeros) */
        if (c->dx[0])
            DW_CUDA_CHECK(be->ctx, cudaMemsetAsync(c->dx[0], 0, (size_t)(a.rows * a.k) * (size_t)dw_act_size(dt),
                                                   DW_CUDA_STREAM(be)));
        if (c->pgrad[1] && c->pgrad_set[1])
            DW_CUDA_CHECK(be->ctx, cudaMemsetAsync(c->pgrad[1], 0, (size_t)(a.experts * a.m * a.k) * sizeof(float),
                                                   DW_CUDA_STREAM(be)));
        double *sq = wgrad_sumsq(c);
        if (sq)
            DW_CUDA_CHECK(be->ctx, cudaMemsetAsync(sq, 0, (size_t)dw_moe_sumsq_parts(a.experts, a.m, a.k) * sizeof(double),
                                                   DW_CUDA_STREAM(be)));
        return DW_OK;
    }
    if (c->dx[0]) { /* dx_e = dy_e W_e */
        if (a.recipe != DW_RECIPE_BF16) { /* dy quantised (or its rows by the SwiGLU), W^T from the weight cache */
            dw_cuda_fp8_grad f;
            if (a.recipe == DW_RECIPE_FP8_BLOCK && dw_cuda_dy_fp8_take(DW_CUDA_ST(be), c->node, &f))
                a.dy = f.codes, a.dy_scales = f.scales;
            else
                DW_TRY(quant_act(be, c, a.recipe, DW_MOE_FP8_ROWS, c->dout[0], a.rows, a.m, &a.dy, &a.dy_scales));
            dw_moe_fp8_cached_weight(c, 1, &a);
        }
        a.out = c->dx[0];
        DW_TRY(dw_grouped_gemm(be->ctx, &a));
    }
    if (!c->pgrad[1]) return DW_OK;
    a = moe_gemm_args(c, DW_GEMM_WGRAD); /* dW_e += dy_e^T x_e, FP32; = for grad_arena's first writer */
    a.dy = c->dout[0], a.out = c->pgrad[1], a.overwrite = c->pgrad_set[1];
    if (a.recipe != DW_RECIPE_BF16) { /* dy^T and x^T along each expert's rows, padded */
        DW_TRY(quant_act(be, c, a.recipe, DW_MOE_FP8_DYT, c->dout[0], a.rows, a.m, &a.dy, &a.dy_scales));
        DW_TRY(quant_act(be, c, a.recipe, DW_MOE_FP8_XT, c->in[0], a.rows, a.k, &a.x, &a.x_scales));
    }
    double *sq = wgrad_sumsq(c);
    if (!sq) return dw_grouped_gemm(be->ctx, &a);
    /* the gradient norm's share (BF16 wgrad written over: compile/wgrad_sumsq.h): a built-in CUDA
     * kernel makes it with dW (the sm_90 one from its epilogue's registers); another, after it */
    bool written = false;
    DW_TRY(dw_grouped_gemm_sumsq(be->ctx, &a, sq, &written));
    return written ? DW_OK
                   : dw_cuda_moe_block_sumsq(be->ctx, (const float *)a.out, a.experts, a.m, a.k, sq, DW_CUDA_STREAM(be));
}

/* ---- combine: each token's weighted sum of its K expert rows ---------------------------------- */
dw_status dw_cuda_op_moe_combine_fwd(dw_backend *be, const dw_op_call *c) {
    return dw_cuda_moe_combine_fwd(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->out[0], c->in[0], c->in[1],
                                   (const int32_t *)c->in[2], c->rows, dw_cuda_width(c, c->n->out[0]),
                                   dw_cuda_width(c, c->n->in[1]), DW_CUDA_STREAM(be));
}
/* Whether the combine's rows are each one assignment's: its pos comes from a dropless dispatch
 * (no capacity) of a router's choices (every one an expert in [0, E)) and the rows are N K. */
static bool combine_covered(const dw_op_call *c, int64_t N, int64_t K, int64_t R) {
    const dw_graph *g = c->x->g;
    const int d = g->tensors[c->n->in[2]].producer;
    if (R != N * K || d < 0 || g->nodes[d].op != DW_OP_MOE_DISPATCH || g->nodes[d].attrs.capacity_factor > 0)
        return false;
    const int r = g->tensors[g->nodes[d].in[1]].producer;
    return r >= 0 && g->nodes[r].op == DW_OP_MOE_ROUTER;
}
/* The combine's backward that also writes the down layer's dgrad dy rows (dw_compile_combine_bwd_
 * moe_rows; with quant_reuse, dropless, no expert parallelism): into work.glu_rows, noted for that
 * layer's backward (dw_cuda_state.dy_fp8), which reads them instead of quantising dy; *done when it
 * did. DW_SWIGLU_QUANT_BWD=0 (the MoE layers' backward fusions' A/B knob) keeps the quantiser. */
static dw_status combine_rows_bwd(dw_backend *be, const dw_op_call *c, int64_t N, int64_t K, int64_t R, bool *done) {
    *done = false;
    const dw_exec *x = c->x;
    dw_cuda_state *st = DW_CUDA_ST(be);
    const int64_t C = dw_cuda_width(c, c->n->out[0]);
    if (x->moe_ep || x->p->work.glu_rows < 0 || dw_cuda_dt(c) != DW_ACT_BF16 || K > 16 || !dw_cuda_bwd_quant_on(x))
        return DW_OK;
    const int L = dw_compile_combine_bwd_moe_rows(x->p, c->node);
    if (L < 0 || !c->dout[0] || !c->dx[0] || c->dx_acc[0] || !combine_covered(c, N, K, R)) return DW_OK;
    int64_t codes, scales;
    dw_compile_glu_rows_piece(R, C, &codes, &scales);
    if (codes + scales > x->p->work.glu_rows_bytes) return DW_OK;
    uint8_t *cd = (uint8_t *)(x->work + x->p->work.glu_rows);
    float *sc = (float *)(x->work + x->p->work.glu_rows + codes);
    DW_TRY(dw_cuda_moe_combine_bwd_rows_fp8(be->ctx, c->dx[0], c->dx[1], c->dout[0], c->in[0], c->in[1],
                                            (const int32_t *)c->in[2], N, C, K, cd, sc, DW_CUDA_STREAM(be)));
    st->dy_fp8_node[0] = L, st->dy_fp8_node[1] = -1;
    st->dy_fp8[0] = (dw_cuda_fp8_grad){.codes = cd, .scales = sc};
    st->combine_quant_bwd++;
    *done = true;
    return DW_OK;
}

dw_status dw_cuda_op_moe_combine_bwd(dw_backend *be, const dw_op_call *c) {
    const int64_t N = c->rows, K = dw_cuda_width(c, c->n->in[1]), R = dw_exec_rows(c->x, c->n->in[0]);
    bool done = false;
    DW_TRY(combine_rows_bwd(be, c, N, K, R, &done));
    if (done) return DW_OK;
    return dw_cuda_moe_combine_bwd(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->dx[0], c->dx[1], c->dout[0], c->in[0],
                                   c->in[1], (const int32_t *)c->in[2], N, dw_cuda_width(c, c->n->out[0]), K, R,
                                   combine_covered(c, N, K, R), DW_CUDA_STREAM(be));
}

/* ---- load-balancing loss: statistics per layer, summed; the loss once, after the last layer ---- */
dw_status dw_cuda_op_moe_aux_stats_fwd(dw_backend *be, const dw_op_call *c) {
    const bool chained = c->n->n_in == 4;
    return dw_cuda_moe_aux_stats_fwd(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->out[0], (int32_t *)c->out[1], c->in[0],
                                     (const int32_t *)c->in[1], chained ? c->in[2] : NULL,
                                     chained ? (const int32_t *)c->in[3] : NULL, c->rows, dw_cuda_width(c, c->n->in[0]),
                                     dw_cuda_width(c, c->n->in[1]),
                                     c->x->p->work.moe_aux_part >= 0 ? c->x->work + c->x->p->work.moe_aux_part : NULL,
                                     DW_CUDA_STREAM(be));
}
dw_status dw_cuda_op_moe_aux_stats_bwd(dw_backend *be, const dw_op_call *c) {
    const dw_act_dtype dt = (dw_act_dtype)dw_cuda_dt(c);
    const int64_t E = dw_cuda_width(c, c->n->in[0]);
    if (c->dx[0])
        DW_TRY(dw_cuda_moe_aux_stats_bwd(be->ctx, dt, c->dx[0], c->dout[0], c->in[0], c->rows, E, DW_CUDA_STREAM(be)));
    if (c->n->n_in == 4 && c->dx[2]) { /* the layers before: the same gradient */
        const size_t bytes = (size_t)(E + 1) * (size_t)dw_act_size(dt);
        if (c->dout[0])
            DW_CUDA_CHECK(be->ctx, cudaMemcpyAsync(c->dx[2], c->dout[0], bytes, cudaMemcpyDeviceToDevice,
                                                   DW_CUDA_STREAM(be)));
        else DW_CUDA_CHECK(be->ctx, cudaMemsetAsync(c->dx[2], 0, bytes, DW_CUDA_STREAM(be)));
    }
    return DW_OK;
}

dw_status dw_cuda_op_moe_aux_loss_fwd(dw_backend *be, const dw_op_call *c) {
    const dw_work_layout *w = &c->x->p->work;
    const dw_ir_attrs *a = &c->n->attrs;
    return dw_cuda_moe_aux_loss(be->ctx, (dw_act_dtype)dw_cuda_dt(c), c->out[0], (float *)(c->x->work + w->loss),
                                (float *)(c->x->work + w->moe_aux), NULL, c->in[0], (const int32_t *)c->in[1],
                                dw_cuda_width(c, c->n->in[1]), a->top_k, c->rows, a->coef, a->zcoef, 0.0,
                                DW_CUDA_STREAM(be));
}
dw_status dw_cuda_op_moe_aux_loss_bwd(dw_backend *be, const dw_op_call *c) {
    if (!c->dx[0]) return DW_OK;
    const dw_ir_attrs *a = &c->n->attrs;
    return dw_cuda_moe_aux_loss(be->ctx, (dw_act_dtype)dw_cuda_dt(c), NULL, NULL, NULL, c->dx[0], NULL,
                                (const int32_t *)c->in[1], dw_cuda_width(c, c->n->in[1]), a->top_k, c->rows, a->coef,
                                a->zcoef, c->dloss, DW_CUDA_STREAM(be));
}
#endif /* DW_HAVE_CUDA */
