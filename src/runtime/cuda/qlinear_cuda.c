/* qlinear_cuda.c — the CUDA backend's quantised linear layers (cuda.h). Every operand is
 * quantised on the device (dw_quantize_cuda) from the current values (scales from the current
 * amax; no delayed scaling) into the workspace's slots, in the node's recipe (fp8_block and
 * fp8_block2d: W, W^T in 128x128 blocks, x and dy in 1x128, DESIGN.md's block recipe): fprop x
 * and W along K; dgrad dy along M and W^T along M; wgrad dy^T and x^T along the tokens (dy and
 * dy^T in one quantiser pass). W and W^T come from the node's weight cache, quantised once per
 * weight update (DW_STEP_QUANT_W), not per GEMM. NVFP4's tensor scale stays on the device
 * (dw_gemm_operand.tensor_scale_ptr): no host sync, recordable. Which GEMMs run quantised is the
 * program's (dw_compile_linear_quantised), the same answer the CPU backend mirrors. nvfp4 operands
 * the NVFP4 training recipe touches (runtime/nvfp4_operand.h: 16x16 weight blocks, the wgrad's
 * Hadamard transform, stochastic rounding of dy) go through its quantiser (kernels/cuda/
 * ops_nvfp4.cu), one pass per operand (its SR bits keyed by the operand's own tensor scale).
 * Each training quantisation's overflows and underflows go to the node's counters from inside the
 * quantiser (dw_quant_dev_out.counts); an x copy a sibling quantised takes that quantisation's
 * counts when the counters are read (dw_qcounts.from); the NVFP4 recipe's quantiser is followed by a counting pass
 * (precision/quant_counts.cu). A check step's backward measures dy on the device (guard_check_cuda.c).
 * A gate or up layer whose dy the SwiGLU's backward wrote as fp8_block operands (act_quant_cuda.c,
 * dw_cuda_state.dy_fp8) reads them there, already counted. */
#include <stdlib.h>

#include "core/error.h"
#include "runtime/backend.h"

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "kernels/cuda/nvfp4_cuda.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/quant.h"
#include "runtime/cuda/cuda.h"
#include "runtime/moe_fp8.h"
#include "runtime/nvfp4_operand.h"
#include "precision/amax_history.h"
#include "precision/quant_counts.h"

typedef dw_quant_dev_out qslot;

void dw_cuda_qlin_reset(dw_backend *be) { DW_CUDA_ST(be)->rows_tensor = DW_CUDA_ST(be)->xt_tensor = -1; }

static qslot slot(const dw_exec *x, const dw_qslot_layout *l) {
    char *base = x->work + l->off;
    qslot o = {.codes = (uint8_t *)base, .scales = base + l->scales, .tensor_scale = (float *)(base + l->tscale)};
    return o;
}

/* Quantises v [rows, cols] into a (and v^T into t when not NULL; a NULL: v^T alone), their
 * overflows and underflows added to the pairs ca, ct (NULL: not counted); node's operand k of an
 * fp8_tensor node under delayed scaling (--fp8-amax-history) from its history, noting v's amax
 * when `record` (training). */
static dw_status quant(dw_backend *be, const dw_exec *x, dw_recipe r, dw_quant_in in, const void *v, int64_t rows,
                       int64_t cols, const qslot *a, const qslot *t, uint64_t *ca, uint64_t *ct, int node,
                       dw_amax_kind k, bool record) {
    dw_quant_opts o = {.recipe = r, .rounding = DW_SCALE_RCEIL, .pow2 = false};
    uint32_t *h = r == DW_RECIPE_FP8_TENSOR ? dw_amax_slot(x->amax, node, k) : NULL; /* delayed scaling */
    qslot ac = a ? *a : (qslot){0}, tc = t ? *t : (qslot){0};
    ac.counts = ca, tc.counts = ct;
    return dw_quantize_cuda_amax(be->ctx, &o, in, v, rows, cols, a ? &ac : NULL, t ? &tc : NULL,
                                 x->work + x->p->work.quant_ws, DW_CUDA_STREAM(be), h, record);
}

/* Whether node's x quantised by a sibling can be reused: never under delayed scaling (each node
 * notes the amax in its own history). */
static bool may_reuse(const dw_exec *x, int node, dw_recipe r) {
    return x->quant_reuse && !(r == DW_RECIPE_FP8_TENSOR && dw_amax_slot(x->amax, node, DW_AMAX_X));
}

/* node's operand `role` of v [rows, cols] (or v^T) into s through the NVFP4 recipe's quantiser
 * (runtime/nvfp4_operand.h; the plain FORMATS.md rule where no piece applies). */
static dw_status quant_nv(dw_backend *be, const dw_exec *x, int node, dw_nvfp4_operand role, dw_quant_in in,
                         const void *v, int64_t rows, int64_t cols, qslot *s) {
    dw_nvfp4_qopts o;
    dw_nvfp4_operand_opts(x->p, node, DW_RECIPE_NVFP4, role, &o);
    return dw_nvfp4_quantize_cuda(be->ctx, &o, in, v, rows, cols, s, x->work + x->p->work.quant_ws, DW_CUDA_STREAM(be));
}

/* Whether the NVFP4 recipe changes any of node's operands in `roles` (recipe r). */
static bool recipe_applies(const dw_exec *x, int node, dw_recipe r, dw_nvfp4_operand a, dw_nvfp4_operand b,
                           dw_nvfp4_operand c) {
    dw_nvfp4_qopts o;
    return dw_nvfp4_operand_opts(x->p, node, r, a, &o) || dw_nvfp4_operand_opts(x->p, node, r, b, &o) ||
           dw_nvfp4_operand_opts(x->p, node, r, c, &o);
}

/* node's counter pair of kind k for its operand `role` (precision/quant_counts.h), NULL when not
 * counting or an operand the NVFP4 recipe passes through the Hadamard transform. */
static uint64_t *counts_of(const dw_exec *x, int node, dw_qc_kind k, dw_nvfp4_operand role, dw_recipe r) {
    uint64_t *cnt = dw_qcounts_slot(x->qcounts, node, k);
    dw_nvfp4_qopts nv;
    return cnt && !(dw_nvfp4_operand_opts(x->p, node, r, role, &nv) && nv.rht) ? cnt : NULL;
}

/* Adds to cnt (NULL: nothing) the overflows and underflows of slot s, the quantisation of v [rows,
 * cols] (or of v^T: trans), by a counting pass: the NVFP4 recipe's quantiser does not count. */
static dw_status count_pass(dw_backend *be, dw_recipe r, dw_quant_in in, const void *v, int64_t rows, int64_t cols,
                            bool trans, const qslot *s, uint64_t *cnt) {
    if (!cnt) return DW_OK;
    return dw_qcounts_add_cuda(be->ctx, r, in == DW_QUANT_IN_BF16, v, rows, cols, trans, s->codes, s->scales,
                               s->tensor_scale, cnt, DW_CUDA_STREAM(be));
}

/* Where the quantiser of x's copy k (0: row-wise, 1: x^T) puts its counts when cnt (node's x
 * counter) wants them: node's own pair k (precision/quant_counts.h), which siblings reusing the
 * copy fold in when the counters are read; NULL: not counted. */
static uint64_t *x_counts_own(const dw_exec *x, int node, int k, const uint64_t *cnt) {
    return cnt ? dw_qcounts_own(x->qcounts, node, k) : NULL;
}
/* The counts of x's copy k in slot s (v [rows, cols], or v^T: trans) for node's counter cnt (NULL:
 * nothing): the own pair of the layer whose quantiser counted the copy, folded in at the read,
 * else (a copy quantised without counting) a counting pass straight into cnt. */
static dw_status x_counts_add(dw_backend *be, const dw_exec *x, int node, int k, uint64_t *cnt, dw_recipe r,
                              const void *v, int64_t rows, int64_t cols, bool trans, const qslot *s) {
    if (!cnt) return DW_OK;
    dw_qcounts *q = x->qcounts;
    q->from[2 * q->slot[node] + k] = q->src[k];
    return q->src[k] >= 0 ? DW_OK : count_pass(be, r, DW_QUANT_IN_BF16, v, rows, cols, trans, s, cnt);
}
/* Copy k now in the workspace: counted into node's own pair (own not NULL) or not counted. */
static void x_counts_note(const dw_exec *x, int k, int node, const uint64_t *own) {
    dw_qcounts_note(x->qcounts, k, node, own != NULL);
}

static dw_gemm_operand op(dw_recipe r, const qslot *s, int64_t rows, int64_t cols, bool trans) {
    dw_gemm_operand o = {.recipe = r, .trans = trans, .rows = rows, .cols = cols, .data = s->codes,
                         .scales = s->scales, .tensor_scale = 1.0f,
                         .tensor_scale_ptr = r == DW_RECIPE_NVFP4 ? s->tensor_scale : NULL};
    return o;
}

static bool quantised(const dw_op_call *c, dw_qpass pass) {
    return dw_compile_linear_quantised(c->x->p, c->node, pass, c->rows, NULL, NULL, 0);
}

dw_status dw_cuda_step_quant_weight(dw_backend *be, const dw_exec *x, int node) {
    if (x->g->nodes[node].op == DW_OP_MOE_LINEAR) return dw_cuda_moe_quant_weight(be, x, node); /* its experts */
    const dw_prog_node *pn = &x->p->node[node];
    if (pn->wq[0].off < 0) return DW_OK;
    int64_t N, K, M;
    dw_compile_linear_dims(x->p, node, &N, &K, &M);
    const float *w = x->w + x->p->param_off[x->p->tensor[x->g->nodes[node].in[1]].param];
    qslot ws = slot(x, &pn->wq[0]), wt = slot(x, &pn->wq[1]);
    const dw_recipe rw = dw_compile_quant_weight_recipe(pn->bind.recipe);
    /* counted where a GEMM reads the copy — W where the fprop runs quantised, W^T where the dgrad
     * does (sm90's fp8_block dgrad of M % 128 != 0 runs BF16), as the guard measures w and w^T */
    uint64_t *cw = pn->bind.quantised[DW_QPASS_FPROP] ? counts_of(x, node, DW_QC_W, DW_NVOP_W, rw) : NULL,
             *cwt = pn->bind.quantised[DW_QPASS_DGRAD] ? counts_of(x, node, DW_QC_W, DW_NVOP_WT, rw) : NULL;
    if (recipe_applies(x, node, rw, DW_NVOP_W, DW_NVOP_WT, DW_NVOP_WT)) { /* 16x16 blocks: W and W^T alike */
        DW_TRY(quant_nv(be, x, node, DW_NVOP_W, DW_QUANT_IN_F32, w, M, K, &ws));
        DW_TRY(quant_nv(be, x, node, DW_NVOP_WT, DW_QUANT_IN_F32, w, M, K, &wt));
        DW_TRY(count_pass(be, rw, DW_QUANT_IN_F32, w, M, K, false, &ws, cw));
        return count_pass(be, rw, DW_QUANT_IN_F32, w, M, K, true, &wt, cwt);
    }
    return quant(be, x, rw, DW_QUANT_IN_F32, w, M, K, &ws, &wt, cw, cwt, node, DW_AMAX_W, true); /* W^T [K,M] along M */
}

dw_status dw_cuda_qlin_fprop(dw_backend *be, const dw_op_call *c, bool *done, bool *gelu_after) {
    *done = *gelu_after = false;
    if (!quantised(c, DW_QPASS_FPROP)) return DW_OK;
    dw_cuda_state *st = DW_CUDA_ST(be);
    const dw_exec *x = c->x;
    const int64_t N = c->rows, K = dw_cuda_width(c, c->n->in[0]), M = dw_cuda_width(c, c->n->out[0]);
    const dw_prog_node *pn = &x->p->node[c->node];
    const dw_recipe ra = dw_compile_quant_act_recipe(pn->bind.recipe), rw = dw_compile_quant_weight_recipe(pn->bind.recipe);
    qslot xs = slot(x, &x->p->work.q_rows), ws = slot(x, &pn->wq[0]);
    const int xi = c->n->in[0];
    /* counted per layer, also where a sibling quantised it */
    uint64_t *cx = c->train && !c->recompute ? counts_of(x, c->node, DW_QC_X, DW_NVOP_X, ra) : NULL;
    if (!may_reuse(x, c->node, ra) || st->rows_tensor != xi || st->rows_recipe != (int)ra) { /* else a sibling did */
        uint64_t *own = x_counts_own(x, c->node, 0, cx);
        DW_TRY(quant(be, x, ra, DW_QUANT_IN_BF16, c->in[0], N, K, &xs, NULL, own, NULL, c->node, DW_AMAX_X, c->train));
        x_counts_note(x, 0, c->node, own);
        st->rows_tensor = xi, st->rows_recipe = (int)ra;
    }
    DW_TRY(x_counts_add(be, x, c->node, 0, cx, ra, c->in[0], N, K, false, &xs));
    dw_gemm_args a = {.pass = DW_GEMM_FPROP, .m = N, .n = M, .k = K, .a = op(ra, &xs, N, K, false),
                      .b = op(rw, &ws, M, K, true), .alpha = 1.0f, .d = c->out[0], .out_type = DW_GEMM_OUT_BF16};
    if (c->n->n_in == 3) a.epilogue = DW_EPI_BIAS, a.bias = c->in_bf16[2];
    *done = true;
    if (c->fuse_out && dw_compile_gelu_epilogue(x->p, c->node, N)) { /* the kernel this GEMM gets anyway has it */
        dw_gemm_args g = a;
        g.epilogue |= DW_EPI_GELU | DW_EPI_GELU_AUX;
        g.aux = c->out[0];
        g.d = c->fuse_out;
        return dw_gemm(be->ctx, &g);
    }
    *gelu_after = c->fuse_out != NULL; /* the caller runs it (ops_cuda_linear.c) */
    return dw_gemm(be->ctx, &a);
}

dw_status dw_cuda_qlin_bwd(dw_backend *be, const dw_op_call *c, void *dx, bool *dg, bool *wg) {
    dw_cuda_state *st = DW_CUDA_ST(be);
    const dw_exec *x = c->x;
    const int64_t N = c->rows, K = dw_cuda_width(c, c->n->in[0]), M = dw_cuda_width(c, c->n->out[0]);
    const dw_prog_node *pn = &x->p->node[c->node];
    const dw_recipe ra = dw_compile_quant_act_recipe(pn->bind.recipe), rw = dw_compile_quant_weight_recipe(pn->bind.recipe);
    *dg = dx && quantised(c, DW_QPASS_DGRAD);
    *wg = quantised(c, DW_QPASS_WGRAD);
    if (!*dg && !*wg) return DW_OK;
    const dw_work_layout *l = &x->p->work;
    qslot rows = slot(x, &l->q_rows), dyt = slot(x, &l->q_dyt), xt = slot(x, &l->q_xt);
    qslot dy = rows; /* dy's row-wise copy: the rows slot, or where the SwiGLU wrote it */
    /* the NVFP4 recipe: dy (SR), dy^T (RHT, SR) and x^T (RHT) each by its own pass */
    const bool nv = recipe_applies(x, c->node, ra, DW_NVOP_DY, DW_NVOP_DYT, DW_NVOP_XT);
    uint64_t *cdy = *dg ? counts_of(x, c->node, DW_QC_DY, DW_NVOP_DY, ra) : NULL,
             *cdyt = *wg ? counts_of(x, c->node, DW_QC_DY, DW_NVOP_DYT, ra) : NULL;
    dw_cuda_fp8_grad f; /* dy and dy^T already quantised (and counted) by the SwiGLU reading this layer's output */
    if (dw_cuda_dy_fp8_take(st, c->node, &f)) {
        dy = (qslot){.codes = f.codes, .scales = f.scales};
        dyt = (qslot){.codes = f.codes_t, .scales = f.scales_t};
    } else if (nv) {
        if (*dg) DW_TRY(quant_nv(be, x, c->node, DW_NVOP_DY, DW_QUANT_IN_BF16, c->dout[0], N, M, &rows));
        if (*wg) DW_TRY(quant_nv(be, x, c->node, DW_NVOP_DYT, DW_QUANT_IN_BF16, c->dout[0], N, M, &dyt));
        DW_TRY(count_pass(be, ra, DW_QUANT_IN_BF16, c->dout[0], N, M, false, &rows, cdy));
        DW_TRY(count_pass(be, ra, DW_QUANT_IN_BF16, c->dout[0], N, M, true, &dyt, cdyt));
        st->rows_tensor = -1;
    } else {
        DW_TRY(quant(be, x, ra, DW_QUANT_IN_BF16, c->dout[0], N, M, &rows, *wg ? &dyt : NULL, cdy, cdyt, c->node,
                     DW_AMAX_DY, true)); /* along M; dy^T along N */
        st->rows_tensor = -1;
    }
    x_counts_note(x, 0, c->node, NULL);
    DW_TRY(dw_cuda_measure_dy(be, c, ra, N, M, *dg, *wg)); /* a check step's (guard_check_cuda.c) */
    if (*dg) { /* W^T [K,M] along M, from the last weight refresh; dx += where a sibling wrote it */
        qslot wt = slot(x, &pn->wq[1]);
        dw_gemm_args a = {.pass = DW_GEMM_DGRAD, .m = N, .n = K, .k = M, .a = op(ra, &dy, N, M, false),
                          .b = op(rw, &wt, K, M, true), .alpha = 1.0f, .d = dx, .out_type = DW_GEMM_OUT_BF16};
        if (c->dx_acc[0]) a.beta = 1.0f, a.c = dx;
        DW_TRY(dw_gemm(be->ctx, &a));
    }
    if (*wg) { /* x^T [K,N] along N, alone where the kernel allows (the wgrad reads nothing else), else
                * with x's row-wise copy where dy was (dgrad has read it, stream order) */
        const int xi = c->n->in[0];
        uint64_t *cxt = counts_of(x, c->node, DW_QC_X, DW_NVOP_XT, ra);
        if (nv && (!x->quant_reuse || st->xt_tensor != xi || st->xt_recipe != (int)ra)) {
            DW_TRY(quant_nv(be, x, c->node, DW_NVOP_XT, DW_QUANT_IN_BF16, c->in[0], N, K, &xt));
            x_counts_note(x, 1, c->node, NULL); /* counted by a pass below */
            st->xt_tensor = xi, st->xt_recipe = (int)ra;
        } else if (!may_reuse(x, c->node, ra) || st->xt_tensor != xi || st->xt_recipe != (int)ra) { /* else a sibling left it */
            const bool alone = dw_quantize_cuda_transposed_only_ok(ra, DW_QUANT_IN_BF16, N, K);
            uint64_t *own = x_counts_own(x, c->node, 1, cxt);
            DW_TRY(quant(be, x, ra, DW_QUANT_IN_BF16, c->in[0], N, K, alone ? NULL : &rows, &xt, NULL, own, c->node,
                         DW_AMAX_X, true));
            x_counts_note(x, 0, c->node, NULL), x_counts_note(x, 1, c->node, own); /* (the row-wise copy uncounted) */
            st->rows_tensor = alone ? -1 : xi, st->xt_tensor = xi, st->rows_recipe = st->xt_recipe = (int)ra;
        }
        DW_TRY(x_counts_add(be, x, c->node, 1, cxt, ra, c->in[0], N, K, true, &xt));
        dw_gemm_args a = {.pass = DW_GEMM_WGRAD, .m = M, .n = K, .k = N, .a = op(ra, &dyt, M, N, false),
                          .b = op(ra, &xt, K, N, true), .alpha = 1.0f, .beta = 1.0f, .c = c->pgrad[1],
                          .d = c->pgrad[1], .out_type = DW_GEMM_OUT_F32};
        if (c->pgrad_set[1]) a.beta = 0.0f, a.c = NULL; /* grad_arena's first writer: dW written over */
        DW_TRY(dw_gemm(be->ctx, &a));
    }
    return DW_OK;
}
#endif /* DW_HAVE_CUDA */
