/* ops_cpu_linear.c — the CPU backend's linear layers y = x W^T (+ b), exactly as the program's
 * target runs them, through the reference GEMM (dw_gemm on a CPU context: every operand decoded
 * exactly, products summed in double, one rounding):
 *   FP32 program: the FP32 reference linear (kernels/cpu/linear_cpu.c);
 *   BF16 layers:  BF16 x, the BF16 working copy of W, the GEMM's epilogues (bias, GELU fused into
 *                 the fprop, GELU' into the dgrad, the bias gradient in the wgrad) as on the GPU;
 *   quantised:    each GEMM the target runs quantised (compile/program.h) with its operands
 *                 quantised by the FORMATS.md reference (x, dy along the row; dy^T, x^T along the
 *                 tokens; W, W^T from the weight cache of the last refresh), the others in BF16;
 *                 nvfp4 operands through the NVFP4 recipe's quantiser where a piece applies
 *                 (runtime/nvfp4_operand.h: 16x16 weight blocks, the wgrad's Hadamard transform,
 *                 stochastic rounding of dy).
 * Also the weight cache's refresh (DW_STEP_QUANT_W). Operand slots are the program's workspace
 * slots, as on the GPU. Every training quantisation adds its overflows and underflows to the
 * node's counters, and a check step's backward measures dy and dy^T (precision/quant_counts.h). */
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/ops_cpu.h"
#include "runtime/cpu/cpu.h"
#include "runtime/linear_args.h"
#include "runtime/moe_fp8.h"
#include "kernels/cpu/nvfp4_train_cpu.h"
#include "runtime/nvfp4_operand.h"
#include "precision/amax_history.h"
#include "precision/quant_counts.h"

/* ---- quantised operands in the workspace's slots ------------------------------------------------ */
static dw_qtensor slot(const dw_exec *x, const dw_qslot_layout *l, dw_recipe r, int64_t rows, int64_t cols) {
    char *base = x->work + l->off;
    return (dw_qtensor){.recipe = r, .rows = rows, .cols = cols, .codes = (uint8_t *)base,
                        .scales = base + l->scales, .tensor_scale = *(float *)(base + l->tscale)};
}

/* The counter pair (precision/quant_counts.h) of node's operand `role`, NULL when not counted:
 * no counters, a forward that is not training's first (validation, a recompute), or an operand
 * the NVFP4 recipe passes through the Hadamard transform. */
static uint64_t *counter(const dw_exec *x, int node, dw_nvfp4_operand role, dw_recipe r, bool count) {
    dw_nvfp4_qopts nv;
    if (!count || (dw_nvfp4_operand_opts(x->p, node, r, role, &nv) && nv.rht)) return NULL;
    const dw_qc_kind k = role == DW_NVOP_W || role == DW_NVOP_WT ? DW_QC_W
                         : role == DW_NVOP_DY || role == DW_NVOP_DYT ? DW_QC_DY : DW_QC_X;
    return dw_qcounts_slot(x->qcounts, node, k);
}

/* Quantises v [rows, cols] (FP32) into slot l, row-wise or (trans) as v^T [cols, rows]; node's
 * operand `role` of an nvfp4 node through the NVFP4 recipe's quantiser where a piece applies
 * (runtime/nvfp4_operand.h); of an fp8_tensor node under delayed scaling (--fp8-amax-history)
 * from its history, noting v's amax when `record` (training). `count`: its overflows and
 * underflows go to the node's counters (dw_exec.qcounts) when there are any. */
static dw_status quant(dw_backend *be, const dw_exec *x, const dw_qslot_layout *l, dw_recipe r, const float *v,
                       int64_t rows, int64_t cols, bool trans, dw_qtensor *q, int node, dw_nvfp4_operand role,
                       bool record, bool count) {
    const dw_quant_opts o = {.recipe = r, .rounding = DW_SCALE_RCEIL, .pow2 = false};
    *q = slot(x, l, r, trans ? cols : rows, trans ? rows : cols);
    dw_nvfp4_qopts nv;
    const dw_amax_kind k = role == DW_NVOP_W || role == DW_NVOP_WT ? DW_AMAX_W
                           : role == DW_NVOP_DY || role == DW_NVOP_DYT ? DW_AMAX_DY : DW_AMAX_X;
    uint32_t *h = r == DW_RECIPE_FP8_TENSOR ? dw_amax_slot(x->amax, node, k) : NULL; /* delayed scaling */
    if (h) {
        DW_TRY(dw_amax_quantize_cpu(be->ctx, h, record, v, rows, cols, trans, q));
    } else if (dw_nvfp4_operand_opts(x->p, node, r, role, &nv)) {
        DW_TRY(dw_nvfp4_quantize_cpu(be->ctx, &nv, v, rows, cols, q));
    } else {
        DW_TRY(trans ? dw_quantize_transposed_cpu(be->ctx, &o, v, rows, cols, q)
                     : dw_quantize_cpu(be->ctx, &o, v, rows, cols, q));
    }
    *(float *)(x->work + l->off + l->tscale) = q->tensor_scale;
    uint64_t *cnt = counter(x, node, role, r, count);
    float *y = cnt ? dw_cpu_scratch(be, CPU_S_Q, rows * cols) : NULL;
    if (cnt && !y) return DW_ERR_NOMEM;
    if (cnt) dw_qcounts_add_cpu(q, v, trans, y, cnt);
    return DW_OK;
}

static dw_gemm_operand qop(const dw_qtensor *q, bool trans) {
    return (dw_gemm_operand){.recipe = q->recipe, .trans = trans, .rows = q->rows, .cols = q->cols,
                             .data = q->codes, .scales = q->scales, .tensor_scale = q->tensor_scale};
}

dw_status dw_cpu_step_quant_weight(dw_backend *be, const dw_exec *x, int node) {
    if (x->g->nodes[node].op == DW_OP_MOE_LINEAR) return dw_cpu_moe_quant_weight(be, x, node); /* its experts */
    const dw_compiled *p = x->p;
    const dw_prog_node *pn = &p->node[node];
    if (pn->wq[0].off < 0) return DW_OK;
    int64_t N, K, M;
    dw_compile_linear_dims(p, node, &N, &K, &M);
    const float *w = x->w + p->param_off[p->tensor[p->g->nodes[node].in[1]].param]; /* [M,K] */
    const dw_recipe r = dw_compile_quant_weight_recipe(pn->bind.recipe);
    dw_qtensor q; /* each copy counted where a GEMM reads it, as the guard measures w and w^T */
    const bool *read = pn->bind.quantised;
    DW_TRY(quant(be, x, &pn->wq[0], r, w, M, K, false, &q, node, DW_NVOP_W, true, read[DW_QPASS_FPROP])); /* W along K */
    return quant(be, x, &pn->wq[1], r, w, M, K, true, &q, node, DW_NVOP_WT, true, read[DW_QPASS_DGRAD]); /* W^T [K,M] along M */
}

/* The BF16 copy of parameter slot s: the standing one, or (a weight only quantised GEMMs read)
 * converted now into scratch. */
static const uint16_t *weight_bf16(dw_backend *be, const dw_op_call *c, int s) {
    const dw_compiled *p = c->x->p;
    if (!p->bf16_lazy[p->tensor[c->n->in[s]].param]) return c->in_bf16[s];
    const int64_t n = dw_ir_numel(&c->x->g->tensors[c->n->in[s]]);
    uint16_t *h = (uint16_t *)dw_cpu_scratch(be, CPU_S_W, (n + 1) / 2);
    const float *w = c->in[s];
    if (h)
        for (int64_t i = 0; i < n; i++) h[i] = dw_encode_bf16(w[i]);
    return h;
}

static bool quantised(const dw_op_call *c, dw_qpass pass) {
    return dw_compile_linear_quantised(c->x->p, c->node, pass, c->rows, NULL, NULL, 0);
}

/* ---- forward ---------------------------------------------------------------------------------- */
static dw_status fprop_quantised(dw_backend *be, const dw_op_call *c, int64_t N, int64_t K, int64_t M) {
    const dw_exec *x = c->x;
    const dw_prog_node *pn = &x->p->node[c->node];
    const dw_recipe ra = dw_compile_quant_act_recipe(pn->bind.recipe), rw = dw_compile_quant_weight_recipe(pn->bind.recipe);
    const float *xf = dw_cpu_in(be, c, c->in[0], N * K, CPU_S_IN0);
    if (!xf) return DW_ERR_NOMEM;
    dw_qtensor qx, qw = slot(x, &pn->wq[0], rw, M, K);
    DW_TRY(quant(be, x, &x->p->work.q_rows, ra, xf, N, K, false, &qx, c->node, DW_NVOP_X, c->train,
                 c->train && !c->recompute));
    dw_gemm_args a = {.pass = DW_GEMM_FPROP, .m = N, .n = M, .k = K, .a = qop(&qx, false), .b = qop(&qw, true),
                      .alpha = 1.0f, .d = c->out[0], .out_type = DW_GEMM_OUT_BF16};
    if (c->n->n_in == 3) a.epilogue = DW_EPI_BIAS, a.bias = c->in_bf16[2];
    if (c->fuse_out) { /* GELU in the epilogue when the target's kernel for this GEMM has it, else a pass */
        dw_gemm_args g = a;
        g.epilogue |= DW_EPI_GELU | DW_EPI_GELU_AUX;
        g.aux = c->out[0];
        g.d = c->fuse_out;
        const char *plain = dw_compile_target_pick(x->p, &a), *fused = dw_compile_target_pick(x->p, &g);
        if (plain && fused && !strcmp(plain, fused)) return dw_gemm(be->ctx, &g);
    }
    DW_TRY(dw_gemm(be->ctx, &a));
    if (!c->fuse_out) return DW_OK;
    const float *y = dw_cpu_in(be, c, c->out[0], N * M, CPU_S_OUT);
    float *gy = dw_cpu_scratch(be, CPU_S_DX0, N * M);
    if (!y || !gy) return DW_ERR_NOMEM;
    dw_cpu_gelu_fwd(gy, y, N * M);
    dw_cpu_put(c, c->fuse_out, gy, N * M, false);
    return DW_OK;
}

dw_status dw_cpu_op_linear_fwd(dw_backend *be, const dw_op_call *c) {
    const int64_t N = c->rows, K = dw_cpu_width(c, c->n->in[0]), M = dw_cpu_width(c, c->n->out[0]);
    const bool bias = c->n->n_in == 3;
    if (!dw_cpu_bf16(c)) { /* FP32 program: the FP32 reference linear */
        dw_cpu_linear_fwd(c->out[0], c->in[0], c->in[1], bias ? c->in[2] : NULL, N, K, M);
        return DW_OK;
    }
    if (quantised(c, DW_QPASS_FPROP)) return fprop_quantised(be, c, N, K, M);
    const uint16_t *w = weight_bf16(be, c, 1);
    if (!w) return DW_ERR_NOMEM;
    const dw_gemm_args a = dw_linear_fprop_args(c, w, N, K, M);
    return dw_gemm(be->ctx, &a);
}

/* ---- backward --------------------------------------------------------------------------------- */
/* db [M] += column sums of dy (N,M), in double, row order. */
static dw_status bias_colsum(dw_backend *be, const dw_op_call *c, float *db, int64_t N, int64_t M) {
    const float *dy = dw_cpu_in(be, c, c->dout[0], N * M, CPU_S_DOUT);
    if (!dy) return DW_ERR_NOMEM;
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < M; j++) {
        double s = 0;
        for (int64_t i = 0; i < N; i++) s += dy[i * M + j];
        db[j] = (float)((double)db[j] + s);
    }
    return DW_OK;
}

static dw_status bwd_fp32(dw_backend *be, const dw_op_call *c, int64_t N, int64_t K, int64_t M) {
    DW_ASSERT(!c->pgrad_set[1]); /* the FP32 reference adds into dW: the compiler keeps its zeroing */
    float *dx = c->dx[0] ? dw_cpu_scratch(be, CPU_S_DX0, N * K) : NULL;
    if (c->dx[0] && !dx) return DW_ERR_NOMEM;
    dw_cpu_linear_bwd(dx, c->pgrad[1], c->n->n_in == 3 ? c->pgrad[2] : NULL, c->dout[0], c->in[0], c->in[1], N, K, M);
    if (dx) dw_cpu_deliver(c, 0, dx, N * K);
    return DW_OK;
}

/* The quantised dgrad and wgrad where the target runs them quantised; *dg / *wg say which ran. */
static dw_status bwd_quantised(dw_backend *be, const dw_op_call *c, int64_t N, int64_t K, int64_t M, bool *dg, bool *wg) {
    const dw_exec *x = c->x;
    const dw_prog_node *pn = &x->p->node[c->node];
    const dw_work_layout *l = &x->p->work;
    const dw_recipe ra = dw_compile_quant_act_recipe(pn->bind.recipe), rw = dw_compile_quant_weight_recipe(pn->bind.recipe);
    *dg = c->dx[0] && quantised(c, DW_QPASS_DGRAD);
    *wg = quantised(c, DW_QPASS_WGRAD);
    if (!*dg && !*wg) return DW_OK;
    const float *dy = dw_cpu_in(be, c, c->dout[0], N * M, CPU_S_DOUT);
    if (!dy) return DW_ERR_NOMEM;
    dw_qstats *ds = dw_qcounts_dy(x->qcounts, c->node); /* a check step: dy and dy^T measured (guard.h) */
    if (ds && *dg) DW_TRY(dw_qstats_measure(be->ctx, ra, dy, N, M, false, &ds[0]));
    if (ds && *wg) DW_TRY(dw_qstats_measure(be->ctx, ra, dy, N, M, true, &ds[1]));
    if (*dg) { /* dx [N,K] (+)= quant(dy) [N,M] . quant(W^T)^T, W^T [K,M] from the weight cache */
        dw_qtensor qdy, qwt = slot(x, &pn->wq[1], rw, K, M);
        DW_TRY(quant(be, x, &l->q_rows, ra, dy, N, M, false, &qdy, c->node, DW_NVOP_DY, true, true));
        dw_gemm_args a = {.pass = DW_GEMM_DGRAD, .m = N, .n = K, .k = M, .a = qop(&qdy, false), .b = qop(&qwt, true),
                          .alpha = 1.0f, .d = c->dx[0], .out_type = DW_GEMM_OUT_BF16};
        if (c->dx_acc[0]) a.beta = 1.0f, a.c = c->dx[0];
        DW_TRY(dw_gemm(be->ctx, &a));
    }
    if (*wg) { /* dW [M,K] += quant(dy^T) [M,N] . quant(x^T)^T, x^T [K,N] (written over: pgrad_set) */
        const float *xf = dw_cpu_in(be, c, c->in[0], N * K, CPU_S_IN0);
        if (!xf) return DW_ERR_NOMEM;
        dw_qtensor qdyt, qxt;
        DW_TRY(quant(be, x, &l->q_dyt, ra, dy, N, M, true, &qdyt, c->node, DW_NVOP_DYT, true, true));
        DW_TRY(quant(be, x, &l->q_xt, ra, xf, N, K, true, &qxt, c->node, DW_NVOP_XT, true, true));
        dw_gemm_args a = {.pass = DW_GEMM_WGRAD, .m = M, .n = K, .k = N, .a = qop(&qdyt, false), .b = qop(&qxt, true),
                          .alpha = 1.0f, .beta = 1.0f, .c = c->pgrad[1], .d = c->pgrad[1], .out_type = DW_GEMM_OUT_F32};
        if (c->pgrad_set[1]) a.beta = 0.0f, a.c = NULL;
        DW_TRY(dw_gemm(be->ctx, &a));
    }
    return DW_OK;
}

dw_status dw_cpu_op_linear_bwd(dw_backend *be, const dw_op_call *c) {
    const int64_t N = c->rows, K = dw_cpu_width(c, c->n->in[0]), M = dw_cpu_width(c, c->n->out[0]);
    if (!dw_cpu_bf16(c)) return bwd_fp32(be, c, N, K, M);
    float *db = c->n->n_in == 3 ? c->pgrad[2] : NULL;
    bool dg = false, wg = false;
    if (dw_compile_quant_recipe(c->x->p->node[c->node].bind.recipe)) DW_TRY(bwd_quantised(be, c, N, K, M, &dg, &wg));
    void *dx = c->fuse_dx ? c->fuse_dx : c->dx[0]; /* x = GELU(h): the dgrad writes dh = (dy W) GELU'(h) */
    if (dx && !dg) { /* dgrad: dx [N,K] = dy [N,M] W [M,K] */
        const uint16_t *w = weight_bf16(be, c, 1);
        if (!w) return DW_ERR_NOMEM;
        const dw_gemm_args a = dw_linear_dgrad_args(c, w, dx, N, K, M);
        DW_TRY(dw_gemm(be->ctx, &a));
    }
    if (!wg) { /* wgrad: dW [M,K] += dy^T [M,N] x [N,K] in FP32 (written over: pgrad_set); the bias
                * gradient in the same GEMM */
        float *bgrad = db ? (float *)(c->x->work + c->x->p->work.bgrad) : NULL;
        dw_gemm_args a = dw_linear_wgrad_args(c, bgrad, N, K, M);
        if (c->pgrad_set[1]) a.beta = 0.0f, a.c = NULL;
        DW_TRY(dw_gemm(be->ctx, &a));
        for (int64_t j = 0; db && j < M; j++) db[j] += bgrad[j];
        return DW_OK;
    }
    return db ? bias_colsum(be, c, db, N, M) : DW_OK;
}
