/* ops_cpu_moe.c — the CPU backend's mixture-of-experts entries: the router (logits -> top-k
 * weights in the program's activation dtype and int32 experts; its backward recomputes the scores
 * and reads the experts the forward chose), dispatch, the grouped expert linear layer (through
 * dw_grouped_gemm; BF16 programs read the BF16 weight copies, as the dense linear does; passes
 * the compiler bound to fp8_block or mxfp8 quantise x and dy (1x128 or 1x32) per call and read
 * the node's weight cache, which dw_cpu_moe_quant_weight refreshes) and combine. An output gradient no consumer sent (dout NULL) counts as zeros. */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "formats/formats.h"
#include "kernels/cpu/ops_cpu.h"
#include "gemm/grouped_fp8.h"
#include "gemm/grouped_mxfp8.h"
#include "runtime/cpu/cpu.h"
#include "runtime/moe_fp8.h"

dw_status dw_cpu_op_moe_router_fwd(dw_backend *be, const dw_op_call *c) {
    const dw_ir_attrs *a = &c->n->attrs;
    const int64_t N = c->rows, E = dw_cpu_width(c, c->n->in[0]), K = a->top_k;
    const float *z = dw_cpu_in(be, c, c->in[0], N * E, CPU_S_IN0);
    float *w = dw_cpu_out(be, c, c->out[0], N * K, CPU_S_OUT);
    if (!z || !w) return DW_ERR_NOMEM;
    const int64_t bo = dw_compile_moe_bias_of(c->x->p, c->node); /* the selection bias, when switched on */
    const bool biased = bo >= 0 && *(const int32_t *)(c->x->work + c->x->p->work.moe_bias);
    const dw_router_desc d = dw_ir_router_desc(a);
    dw_cpu_moe_router_fwd_desc(w, (int32_t *)c->out[1], z, biased ? (const float *)(c->x->work + bo) : NULL, N, E, K,
                               &d);
    dw_cpu_put(c, c->out[0], w, N * K, false);
    return DW_OK;
}

dw_status dw_cpu_op_moe_router_bwd(dw_backend *be, const dw_op_call *c) {
    if (!c->dx[0]) return DW_OK;
    const dw_ir_attrs *a = &c->n->attrs;
    const int64_t N = c->rows, E = dw_cpu_width(c, c->n->in[0]), K = a->top_k;
    const float *z = dw_cpu_in(be, c, c->in[0], N * E, CPU_S_IN0);
    const float *dw = c->dout[0] ? dw_cpu_in(be, c, c->dout[0], N * K, CPU_S_DOUT) : NULL;
    float *dz = dw_cpu_scratch(be, CPU_S_DX0, N * E);
    if (!z || !dz || (c->dout[0] && !dw)) return DW_ERR_NOMEM;
    const dw_router_desc d = dw_ir_router_desc(a);
    dw_cpu_moe_router_bwd_desc(dz, dw, z, (const int32_t *)c->out[1], N, E, K, &d);
    dw_cpu_deliver(c, 0, dz, N * E);
    return DW_OK;
}

/* ---- dispatch: x's rows grouped by expert, the offsets, each (token, k)'s row ------------------ */
/* A third input (the router's weights) drops by weight instead of by position. */
dw_status dw_cpu_op_moe_dispatch_fwd(dw_backend *be, const dw_op_call *c) {
    const int64_t N = c->rows, C = dw_cpu_width(c, c->n->in[0]), K = dw_cpu_width(c, c->n->in[1]);
    const float *x = dw_cpu_in(be, c, c->in[0], N * C, CPU_S_IN0);
    const float *prio = c->n->n_in > 2 ? dw_cpu_in(be, c, c->in[2], N * K, CPU_S_IN2) : NULL;
    const int64_t R = dw_exec_rows(c->x, c->n->out[0]); /* N K, or the experts' capacities below it */
    float *xs = dw_cpu_out(be, c, c->out[0], R * C, CPU_S_OUT);
    if (!x || !xs || (c->n->n_in > 2 && !prio)) return DW_ERR_NOMEM;
    const int64_t E = c->n->attrs.experts;
    dw_cpu_moe_dispatch_fwd(xs, (int32_t *)c->out[1], (int32_t *)c->out[2], x, (const int32_t *)c->in[1], prio, N, C,
                            K, E, dw_moe_capacity(c->n->attrs.capacity_factor, N, K, E));
    const int64_t cnt = c->train && !c->recompute ? dw_compile_moe_counts_of(c->x->p, c->node) : -1; /* training forwards, once */
    if (cnt >= 0)
        dw_cpu_moe_count((int64_t *)(c->x->work + cnt), (const int32_t *)c->in[1], (const int32_t *)c->out[1], N * K,
                         E);
    dw_cpu_put(c, c->out[0], xs, R * C, false); /* copies of BF16 values: exact */
    return DW_OK;
}
dw_status dw_cpu_op_moe_dispatch_bwd(dw_backend *be, const dw_op_call *c) {
    if (c->n->n_in > 2 && c->dx[2] && !c->dx_acc[2]) { /* the weights only ranked the assignments */
        float *z = dw_cpu_scratch(be, CPU_S_DX2, c->rows * dw_cpu_width(c, c->n->in[1]));
        if (!z) return DW_ERR_NOMEM;
        memset(z, 0, (size_t)(c->rows * dw_cpu_width(c, c->n->in[1])) * sizeof *z);
        dw_cpu_deliver(c, 2, z, c->rows * dw_cpu_width(c, c->n->in[1]));
    }
    if (!c->dx[0]) return DW_OK;
    const int64_t N = c->rows, C = dw_cpu_width(c, c->n->in[0]), K = dw_cpu_width(c, c->n->in[1]);
    float *dx = dw_cpu_scratch(be, CPU_S_DX0, N * C);
    const int64_t R = dw_exec_rows(c->x, c->n->out[0]);
    const float *dxs = c->dout[0] ? dw_cpu_in(be, c, c->dout[0], R * C, CPU_S_DOUT) : NULL;
    if (!dx || (c->dout[0] && !dxs)) return DW_ERR_NOMEM;
    if (dxs) dw_cpu_moe_dispatch_bwd(dx, dxs, (const int32_t *)c->out[2], N, C, K);
    else memset(dx, 0, (size_t)(N * C) * sizeof *dx);
    dw_cpu_deliver(c, 0, dx, N * C);
    return DW_OK;
}

/* ---- grouped linear: each expert's rows times its weight^T ------------------------------------ */
/* The weights as the GEMM reads them: the FP32 masters, or in a BF16 program the BF16 copy widened. */
static const float *expert_weights(dw_backend *be, const dw_op_call *c, int64_t n) {
    if (!c->in_bf16[1]) return c->in[1];
    float *w = dw_cpu_scratch(be, CPU_S_W, n);
    if (w)
        for (int64_t i = 0; i < n; i++) w[i] = dw_decode_bf16(c->in_bf16[1][i]);
    return w;
}

/* One pass of the grouped linear as dw_grouped_gemm takes it: FP32, as the CPU computes, in the
 * recipe the compiler bound (a program compiled for CUDA runs its fp8 passes here in the same
 * arithmetic, through the CPU reference the registry picks). */
static dw_grouped_args moe_gemm_args(const dw_op_call *c, int pass) {
    dw_grouped_args a = dw_moe_linear_args(c, pass, DW_DEVICE_CPU);
    a.dtype = DW_GROUPED_F32;
    return a;
}

/* Quantised operands in recipe r (fp8_block or mxfp8): v [R, C] along its rows (every one of the R
 * rows, as the CUDA quantiser does) into the rows slot (moe_fp8.h). */
static dw_status quant_rows(dw_backend *be, const dw_op_call *c, dw_recipe r, const float *v, int64_t R, int64_t C,
                            const void **codes, const float **scales) {
    dw_moe_fp8_slot s;
    DW_TRY(dw_moe_fp8_operand(be->ctx, c, DW_MOE_FP8_ROWS, R, C, &s));
    *codes = s.codes, *scales = s.scales;
    if (r == DW_RECIPE_MXFP8) return dw_grouped_mxfp8_quantize_rows_cpu(be->ctx, v, R, C, s.codes, dw_moe_mx_scales(s));
    return dw_grouped_fp8_quantize_rows_cpu(be->ctx, v, R, C, s.codes, s.scales);
}
/* A quantised wgrad's operand: v [R, C] as v^T [C, P] with each expert's rows padded to the block
 * (grouped_fp8.h, grouped_mxfp8.h), blocks along them, into the slot of `role` (dy^T, x^T). */
static dw_status quant_cols(dw_backend *be, const dw_op_call *c, dw_recipe r, dw_moe_fp8_role role, const float *v,
                            int64_t R, int64_t C, const void **codes, const float **scales) {
    dw_moe_fp8_slot s;
    DW_TRY(dw_moe_fp8_operand(be->ctx, c, role, R, C, &s));
    *codes = s.codes, *scales = s.scales;
    const int64_t E = c->x->g->tensors[c->n->in[1]].shape[0];
    const int32_t *off = (const int32_t *)c->in[2];
    if (r == DW_RECIPE_MXFP8)
        return dw_grouped_mxfp8_quantize_cols_cpu(be->ctx, v, off, R, E, C, s.codes, dw_moe_mx_scales(s));
    return dw_grouped_fp8_quantize_cols_cpu(be->ctx, v, off, R, E, C, s.codes, s.scales);
}

dw_status dw_cpu_moe_quant_weight(dw_backend *be, const dw_exec *x, int node) {
    dw_moe_fp8_weight_job j;
    if (!dw_moe_fp8_weight_job_of(x, node, &j)) return DW_OK;
    if (j.recipe == DW_RECIPE_MXFP8)
        return dw_grouped_mxfp8_quantize_weights_cpu(be->ctx, j.w, j.experts, j.m, j.k, j.q.codes,
                                                     dw_moe_mx_scales(j.q), j.qt.codes, dw_moe_mx_scales(j.qt));
    return dw_grouped_fp8_quantize_weights_cpu(be->ctx, j.w, j.experts, j.m, j.k, j.q.codes, j.q.scales, j.qt.codes,
                                               j.qt.scales);
}

dw_status dw_cpu_op_moe_linear_fwd(dw_backend *be, const dw_op_call *c) {
    dw_grouped_args a = moe_gemm_args(c, DW_GEMM_FPROP);
    const int64_t R = a.rows, E = a.experts, M = a.m, K = a.k;
    const float *x = dw_cpu_in(be, c, c->in[0], R * K, CPU_S_IN0);
    float *y = dw_cpu_out(be, c, c->out[0], R * M, CPU_S_OUT);
    if (!x || !y) return DW_ERR_NOMEM;
    if (a.recipe != DW_RECIPE_BF16) { /* x quantised now, W from the weight cache */
        DW_TRY(quant_rows(be, c, a.recipe, x, R, K, &a.x, &a.x_scales));
        dw_moe_fp8_cached_weight(c, 0, &a);
    } else if (!(a.x = x, a.w = expert_weights(be, c, E * M * K))) {
        return DW_ERR_NOMEM;
    }
    a.out = y;
    DW_TRY(dw_grouped_gemm(be->ctx, &a));
    dw_cpu_put(c, c->out[0], y, R * M, false);
    return DW_OK;
}
dw_status dw_cpu_op_moe_linear_bwd(dw_backend *be, const dw_op_call *c) {
    dw_grouped_args a = moe_gemm_args(c, DW_GEMM_DGRAD);
    const int64_t R = a.rows, E = a.experts, M = a.m, K = a.k;
    float *dx = c->dx[0] ? dw_cpu_scratch(be, CPU_S_DX0, R * K) : NULL;
    if (c->dx[0] && !dx) return DW_ERR_NOMEM;
    if (!c->dout[0]) { /* no gradient reached y: none leaves (a dW written over: zeros) */
        if (dx) memset(dx, 0, (size_t)(R * K) * sizeof *dx), dw_cpu_deliver(c, 0, dx, R * K);
        if (c->pgrad[1] && c->pgrad_set[1]) memset(c->pgrad[1], 0, (size_t)(E * M * K) * sizeof(float));
        return DW_OK;
    }
    const float *dy = dw_cpu_in(be, c, c->dout[0], R * M, CPU_S_DOUT);
    const float *x = dw_cpu_in(be, c, c->in[0], R * K, CPU_S_IN0);
    if (!dy || !x) return DW_ERR_NOMEM;
    if (dx) { /* dx_e = dy_e W_e */
        if (a.recipe != DW_RECIPE_BF16) {
            DW_TRY(quant_rows(be, c, a.recipe, dy, R, M, &a.dy, &a.dy_scales));
            dw_moe_fp8_cached_weight(c, 1, &a);
        } else if (!(a.dy = dy, a.w = expert_weights(be, c, E * M * K))) {
            return DW_ERR_NOMEM;
        }
        a.out = dx;
        DW_TRY(dw_grouped_gemm(be->ctx, &a));
    }
    if (c->pgrad[1]) { /* dW_e += dy_e^T x_e, or = (grad_arena's first writer: pgrad_set) */
        a = moe_gemm_args(c, DW_GEMM_WGRAD);
        a.dy = dy, a.x = x, a.out = c->pgrad[1], a.overwrite = c->pgrad_set[1];
        if (a.recipe != DW_RECIPE_BF16) { /* dy^T and x^T along each expert's rows, padded */
            DW_TRY(quant_cols(be, c, a.recipe, DW_MOE_FP8_DYT, dy, R, M, &a.dy, &a.dy_scales));
            DW_TRY(quant_cols(be, c, a.recipe, DW_MOE_FP8_XT, x, R, K, &a.x, &a.x_scales));
        }
        DW_TRY(dw_grouped_gemm(be->ctx, &a));
    }
    if (dx) dw_cpu_deliver(c, 0, dx, R * K); /* after every read of x and dy, as before */
    return DW_OK;
}

/* ---- combine: each token's weighted sum of its K expert rows ---------------------------------- */
dw_status dw_cpu_op_moe_combine_fwd(dw_backend *be, const dw_op_call *c) {
    const int64_t N = c->rows, C = dw_cpu_width(c, c->n->out[0]), K = dw_cpu_width(c, c->n->in[1]);
    const int64_t R = dw_exec_rows(c->x, c->n->in[0]);
    const float *ys = dw_cpu_in(be, c, c->in[0], R * C, CPU_S_IN0), *wt = dw_cpu_in(be, c, c->in[1], N * K, CPU_S_IN1);
    float *out = dw_cpu_out(be, c, c->out[0], N * C, CPU_S_OUT);
    if (!ys || !wt || !out) return DW_ERR_NOMEM;
    dw_cpu_moe_combine_fwd(out, ys, wt, (const int32_t *)c->in[2], N, C, K);
    dw_cpu_put(c, c->out[0], out, N * C, false);
    return DW_OK;
}
dw_status dw_cpu_op_moe_combine_bwd(dw_backend *be, const dw_op_call *c) {
    const int64_t N = c->rows, C = dw_cpu_width(c, c->n->out[0]), K = dw_cpu_width(c, c->n->in[1]);
    const int64_t R = dw_exec_rows(c->x, c->n->in[0]);
    float *dys = c->dx[0] ? dw_cpu_scratch(be, CPU_S_DX0, R * C) : NULL;
    float *dwt = c->dx[1] ? dw_cpu_scratch(be, CPU_S_DX1, N * K) : NULL;
    if ((c->dx[0] && !dys) || (c->dx[1] && !dwt)) return DW_ERR_NOMEM;
    if (c->dout[0]) {
        const float *dout = dw_cpu_in(be, c, c->dout[0], N * C, CPU_S_DOUT);
        const float *ys = dw_cpu_in(be, c, c->in[0], R * C, CPU_S_IN0), *wt = dw_cpu_in(be, c, c->in[1], N * K, CPU_S_IN1);
        if (!dout || !ys || !wt) return DW_ERR_NOMEM;
        dw_cpu_moe_combine_bwd(dys, dwt, dout, ys, wt, (const int32_t *)c->in[2], N, C, K, R);
    } else { /* no gradient reached the output */
        if (dys) memset(dys, 0, (size_t)(R * C) * sizeof *dys);
        if (dwt) memset(dwt, 0, (size_t)(N * K) * sizeof *dwt);
    }
    if (dys) dw_cpu_deliver(c, 0, dys, R * C);
    if (dwt) dw_cpu_deliver(c, 1, dwt, N * K);
    return DW_OK;
}

/* ---- load-balancing loss: statistics per layer, summed; the loss once, after the last layer ---- */
dw_status dw_cpu_op_moe_aux_stats_fwd(dw_backend *be, const dw_op_call *c) {
    const int64_t N = c->rows, E = dw_cpu_width(c, c->n->in[0]), K = dw_cpu_width(c, c->n->in[1]);
    const bool chained = c->n->n_in == 4;
    const float *z = dw_cpu_in(be, c, c->in[0], N * E, CPU_S_IN0);
    const float *ps = chained ? dw_cpu_in(be, c, c->in[2], E + 1, CPU_S_IN2) : NULL;
    float *s = dw_cpu_out(be, c, c->out[0], E + 1, CPU_S_OUT);
    if (!z || !s || (chained && !ps)) return DW_ERR_NOMEM;
    dw_cpu_moe_aux_stats_fwd(s, (int32_t *)c->out[1], z, (const int32_t *)c->in[1], ps,
                             chained ? (const int32_t *)c->in[3] : NULL, N, E, K);
    dw_cpu_put(c, c->out[0], s, E + 1, false);
    return DW_OK;
}
dw_status dw_cpu_op_moe_aux_stats_bwd(dw_backend *be, const dw_op_call *c) {
    const int64_t N = c->rows, E = dw_cpu_width(c, c->n->in[0]);
    const float *g = c->dout[0] ? dw_cpu_in(be, c, c->dout[0], E + 1, CPU_S_DOUT) : NULL;
    float *zero = NULL;
    if (!g) { /* no gradient reached the sums */
        if (!(zero = dw_cpu_scratch(be, CPU_S_DX1, E + 1))) return DW_ERR_NOMEM;
        memset(zero, 0, (size_t)(E + 1) * sizeof *zero);
        g = zero;
    }
    if (c->dx[0]) {
        const float *z = dw_cpu_in(be, c, c->in[0], N * E, CPU_S_IN0);
        float *dz = dw_cpu_scratch(be, CPU_S_DX0, N * E);
        if (!z || !dz) return DW_ERR_NOMEM;
        dw_cpu_moe_aux_stats_bwd(dz, g, z, N, E);
        dw_cpu_deliver(c, 0, dz, N * E);
    }
    if (c->n->n_in == 4) dw_cpu_deliver(c, 2, g, E + 1); /* the layers before: the same gradient */
    return DW_OK;
}

dw_status dw_cpu_op_moe_aux_loss_fwd(dw_backend *be, const dw_op_call *c) {
    const int64_t E = dw_cpu_width(c, c->n->in[1]);
    const dw_ir_attrs *a = &c->n->attrs;
    const float *s = dw_cpu_in(be, c, c->in[0], E + 1, CPU_S_IN0);
    float *out = dw_cpu_out(be, c, c->out[0], 1, CPU_S_OUT);
    if (!s || !out) return DW_ERR_NOMEM;
    const int32_t *counts = (const int32_t *)c->in[1];
    double z = 0.0;
    const double aux = dw_cpu_moe_aux_loss(s, counts, E, a->top_k, c->rows, a->coef, a->zcoef, &z);
    out[0] = (float)(aux + z);
    dw_cpu_put(c, c->out[0], out, 1, false);
    const dw_work_layout *w = &c->x->p->work;
    float *loss = (float *)(c->x->work + w->loss), *kept = (float *)(c->x->work + w->moe_aux);
    *loss = (float)((double)*loss + aux + z); /* the cross-entropy wrote the loss before */
    kept[0] = a->coef > 0 ? (float)aux : NAN, kept[1] = a->zcoef > 0 ? (float)z : NAN; /* NaN: not configured */
    memcpy(kept + 2, counts, (size_t)E * sizeof *counts);
    return DW_OK;
}
dw_status dw_cpu_op_moe_aux_loss_bwd(dw_backend *be, const dw_op_call *c) {
    const int64_t E = dw_cpu_width(c, c->n->in[1]);
    const dw_ir_attrs *a = &c->n->attrs;
    float *ds = dw_cpu_scratch(be, CPU_S_DX0, E + 1);
    if (!ds) return DW_ERR_NOMEM;
    dw_cpu_moe_aux_loss_bwd(ds, (const int32_t *)c->in[1], E, a->top_k, c->rows, a->coef, a->zcoef, c->dloss);
    dw_cpu_deliver(c, 0, ds, E + 1);
    return DW_OK;
}
