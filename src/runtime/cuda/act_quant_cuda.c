/* act_quant_cuda.c — the CUDA backend's SwiGLU that quantises its own output (cuda.h:
 * dw_cuda_swiglu_quant_fwd), the norms and the GELU that do (dw_cuda_norm_quant_fwd,
 * dw_cuda_gelu_quant_fwd, below), and the SwiGLU's backward that writes its gradients as fp8_block operands
 * (dw_cuda_swiglu_quant_bwd, at the end). Where one linear layer alone reads the SwiGLU's output h as its x and
 * runs its fprop in fp8_block — the down projection of a Llama MLP (qlinear_cuda.c) or of a MoE
 * layer's experts (ops_cuda_moe.c) — the forward writes h's 1x128 rows into the rows slot in the
 * same kernel (kernels/cuda/swiglu_fp8.cu) and leaves the record a sibling layer's quantiser would
 * (dw_engine_opts.quant_reuse), so that layer reads them instead of reading h back to quantise it.
 * The same codes, scales and BF16 values as the two kernels. h itself is stored only where
 * something reads it later: not in a training forward where the program computes the SwiGLU again
 * for the backward (dw_compile_remat: selective recompute, or a MoE layer's moe_remat). Where the
 * quantisers' counters count the dense layer's x (deepwell train's guard), the kernel counts the
 * rows into that layer's own pair, as the layer's quantiser would (precision/quant_counts.h).
 * DW_SWIGLU_QUANT=0 keeps the separate kernels (an A/B knob). */
#include "core/error.h"
#include "runtime/backend.h"

#if DW_HAVE_CUDA
#include "compile/program.h"
#include "core/env.h"
#include "kernels/cuda/ops_cuda.h"
#include "precision/quant_counts.h"
#include "runtime/cuda/cuda.h"
#include "runtime/moe_fp8.h"

/* Where a kernel writing dense layer L's x rows counts them: L's own pair 0 in a training forward
 * whose quantisers' counters count L's x (deepwell train's guard), which L's x counts take when
 * the counters are read (qlinear_cuda.c); else NULL. */
static uint64_t *rows_own(const dw_op_call *c, int L) {
    dw_qcounts *qc = c->x->qcounts;
    return c->train && dw_qcounts_slot(qc, L, DW_QC_X) ? dw_qcounts_own(qc, L, 0) : NULL;
}
/* The rows slot now holds tensor t's rows in `recipe`, counted into L's own pair or not (own):
 * the record L's quantiser would leave, so L and its siblings read them. */
static void rows_written(dw_backend *be, const dw_exec *x, int t, int recipe, int L, const uint64_t *own) {
    dw_cuda_qlin_reset(be);
    DW_CUDA_ST(be)->rows_tensor = t, DW_CUDA_ST(be)->rows_recipe = recipe;
    dw_qcounts_note(x->qcounts, 0, L, own != NULL);
}

dw_status dw_cuda_swiglu_quant_fwd(dw_backend *be, const dw_op_call *c, bool *done) {
    *done = false;
    const dw_exec *x = c->x;
    if (!x->quant_reuse || c->recompute || !dw_env_flag("DW_SWIGLU_QUANT", true)) return DW_OK;
    const int h = c->n->out[0];
    const int64_t R = dw_exec_rows(x, h), F = dw_cuda_width(c, h);
    const int L = dw_compile_swiglu_quant_reader(x->p, c->node, R);
    if (L < 0) return DW_OK;
    const bool moe = x->g->nodes[L].op == DW_OP_MOE_LINEAR;
    /* expert parallelism exchanges the rows in between; more rows than the slot: the layer refuses
     * them, naming itself */
    if (moe && (x->moe_ep || R > x->p->tensor[h].rows_cap)) return DW_OK;
    uint64_t *own = moe ? NULL : rows_own(c, L); /* (the MoE quantisers count nothing) */
    const dw_moe_fp8_slot s = dw_moe_fp8_at(x, &x->p->work.q_rows); /* codes at off, scales at off + scales */
    /* h is stored unless a training forward drops it for the backward to compute again (the
     * quantisation guard measures it after its layer's step in an eval forward: train/guard_quant.c) */
    const bool keep = !c->train || !dw_compile_remat(x->p, c->node);
    DW_TRY(dw_cuda_swiglu_fwd_fp8(be->ctx, keep ? c->out[0] : NULL, c->in[0], c->in[1], R, F, s.codes, s.scales, own,
                                  DW_CUDA_STREAM(be)));
    rows_written(be, x, h, moe ? dw_cuda_moe_rows_mark(DW_RECIPE_FP8_BLOCK) : (int)DW_RECIPE_FP8_BLOCK, L, own);
    DW_CUDA_ST(be)->swiglu_quant[moe]++;
    *done = true;
    return DW_OK;
}

/* A norm (rmsnorm, layernorm) whose output only dense fp8_block linear layers read as their x
 * (dw_compile_norm_quant_reader: llama's q, k and v, or gate and up) writes its 1x128 rows into
 * the rows slot as the first of them would (kernels/cuda/ops_norm.cu), counted into that layer's
 * own pair where the quantisers' counters count its x, and leaves the record its quantiser would:
 * every layer reads them as a sibling's. The BF16 output is stored too: the wgrad's x^T is
 * quantised from it in the backward. Not when the forward runs again for the backward (selective
 * recompute: the layers' fprop does not). DW_NORM_QUANT=0 keeps the separate quantiser. */
dw_status dw_cuda_norm_quant_fwd(dw_backend *be, const dw_op_call *c, bool *done) {
    *done = false;
    const dw_exec *x = c->x;
    if (!x->quant_reuse || c->recompute || !dw_env_flag("DW_NORM_QUANT", true)) return DW_OK;
    const int y = c->n->out[0];
    const int64_t R = dw_exec_rows(x, y), C = dw_cuda_width(c, y);
    const int L = dw_compile_norm_quant_reader(x->p, c->node, R);
    if (L < 0) return DW_OK;
    uint64_t *own = rows_own(c, L);
    const dw_moe_fp8_slot s = dw_moe_fp8_at(x, &x->p->work.q_rows); /* codes at off, scales at off + scales */
    const bool rms = c->n->op == DW_OP_RMSNORM;
    DW_TRY(dw_cuda_norm_fwd_fp8(be->ctx, rms, c->out[0], rms ? NULL : c->aux[DW_AUX_STAT0],
                                c->aux[rms ? DW_AUX_STAT0 : DW_AUX_STAT1], c->in[0], c->in[1], rms ? NULL : c->in[2],
                                rms ? c->n->attrs.offset : 0.0, R, C, c->n->attrs.eps, s.codes, s.scales, own,
                                DW_CUDA_STREAM(be)));
    rows_written(be, x, y, (int)DW_RECIPE_FP8_BLOCK, L, own);
    DW_CUDA_ST(be)->norm_quant++;
    *done = true;
    return DW_OK;
}

/* The GELU a quantised linear layer runs after its GEMM (c: that layer's call; GPT-2's c_fc) where
 * only dense fp8_block linear layers read its output (dw_compile_gelu_quant_reader: c_proj): the
 * GELU writes their 1x128 rows too (kernels/cuda/swiglu_fp8.cu), counted and recorded as the norms'
 * are. The BF16 output is stored (the wgrad's x^T). DW_GELU_QUANT=0: the separate quantiser. */
dw_status dw_cuda_gelu_quant_fwd(dw_backend *be, const dw_op_call *c, bool *done) {
    *done = false;
    const dw_exec *x = c->x;
    if (!x->quant_reuse || c->recompute || !dw_env_flag("DW_GELU_QUANT", true)) return DW_OK;
    const int G = x->p->node[c->node].partner_fwd;
    const int64_t R = c->rows, C = dw_cuda_width(c, c->n->out[0]);
    const int L = G >= 0 ? dw_compile_gelu_quant_reader(x->p, G, R) : -1;
    if (L < 0) return DW_OK;
    uint64_t *own = rows_own(c, L);
    const dw_moe_fp8_slot s = dw_moe_fp8_at(x, &x->p->work.q_rows); /* the GEMM has read its x's rows: stream order */
    DW_TRY(dw_cuda_gelu_fwd_fp8(be->ctx, c->fuse_out, c->out[0], R, C, s.codes, s.scales, own, DW_CUDA_STREAM(be)));
    rows_written(be, x, x->g->nodes[G].out[0], (int)DW_RECIPE_FP8_BLOCK, L, own);
    DW_CUDA_ST(be)->gelu_quant++;
    *done = true;
    return DW_OK;
}

bool dw_cuda_bwd_quant_on(const dw_exec *x) {
    return x->quant_reuse && dw_env_flag("DW_SWIGLU_QUANT", true) && dw_env_flag("DW_SWIGLU_QUANT_BWD", true);
}

/* A MoE layer's experts (dw_compile_swiglu_bwd_moe_rows): the SwiGLU writes dgate and dup in BF16,
 * which the gate and up layers' BF16 wgrad read, and each one's fp8_block rows into work.glu_rows
 * (kernels/cuda/swiglu_bwd_rows_fp8.cu), which their dgrad reads (ops_cuda_moe.c) instead of
 * quantising dy again. The MoE quantisers count nothing, so neither does it. Not under expert
 * parallelism (the rows are exchanged in between). */
static dw_status moe_rows_bwd(dw_backend *be, const dw_op_call *c, bool *done) {
    const dw_exec *x = c->x;
    dw_cuda_state *st = DW_CUDA_ST(be);
    const int h = c->n->out[0];
    const int64_t R = dw_exec_rows(x, h), F = dw_cuda_width(c, h);
    int L[2];
    if (x->p->work.glu_rows < 0 || x->moe_ep || !dw_compile_swiglu_bwd_moe_rows(x->p, c->node, L)) return DW_OK;
    if (!c->dout[0] || !c->dx[0] || !c->dx[1] || c->dx_acc[0] || c->dx_acc[1]) return DW_OK;
    int64_t codes, scales;
    dw_compile_glu_rows_piece(R, F, &codes, &scales);
    if (2 * (codes + scales) > x->p->work.glu_rows_bytes) return DW_OK; /* more rows than planned */
    char *base = (char *)x->work + x->p->work.glu_rows;
    uint8_t *cd[2] = {(uint8_t *)base, (uint8_t *)base + codes};
    float *sc[2] = {(float *)(base + 2 * codes), (float *)(base + 2 * codes + scales)};
    DW_TRY(dw_cuda_swiglu_bwd_rows_fp8(be->ctx, c->dx[0], c->dx[1], c->dout[0], c->in[0], c->in[1], R, F, cd, sc,
                                       DW_CUDA_STREAM(be)));
    for (int k = 0; k < 2; k++)
        st->dy_fp8_node[k] = L[k], st->dy_fp8[k] = (dw_cuda_fp8_grad){.codes = cd[k], .scales = sc[k]};
    st->swiglu_quant_bwd[1]++;
    *done = true;
    return DW_OK;
}

/* Backward: where the gate and up layers run their dgrad and wgrad in fp8_block
 * (dw_compile_swiglu_bwd_quant), the SwiGLU writes dgate and dup only as those layers' operands
 * (kernels/cuda/swiglu_bwd_fp8.cu): each gradient's BF16 buffer takes its codes, dy [R, F] at
 * the start and dy^T [F, R] after it; the four scale arrays go to work.glu_scales. The layers'
 * backward (qlinear_cuda.c) reads them instead of quantising dy, and the kernel counts them into
 * the layers' dy counters as their quantisers would. Not on a check step of the quantisation
 * guard (the layers measure their BF16 dy then: guard_check_cuda.c). DW_SWIGLU_QUANT=0 or
 * DW_SWIGLU_QUANT_BWD=0: BF16 gradients, each layer quantising its own. A MoE layer's experts:
 * moe_rows_bwd, above. */
dw_status dw_cuda_swiglu_quant_bwd(dw_backend *be, const dw_op_call *c, bool *done) {
    *done = false;
    const dw_exec *x = c->x;
    dw_cuda_state *st = DW_CUDA_ST(be);
    st->dy_fp8_node[0] = st->dy_fp8_node[1] = -1; /* nothing pending from an earlier SwiGLU */
    if (!dw_cuda_bwd_quant_on(x)) return DW_OK;
    const int h = c->n->out[0];
    const int64_t R = dw_exec_rows(x, h), F = dw_cuda_width(c, h), ns = R * (F / 128);
    int L[2];
    if (x->p->work.glu_scales < 0 || !dw_compile_swiglu_bwd_quant(x->p, c->node, R, L)) return moe_rows_bwd(be, c, done);
    dw_qcounts *qc = x->qcounts;
    if ((qc && qc->measure_dy) || 4 * ns * 4 > x->p->work.glu_scales_bytes) return DW_OK;
    if (!c->dx[0] || !c->dx[1] || c->dx_acc[0] || c->dx_acc[1]) return DW_OK;
    uint64_t *cnt[2] = {dw_qcounts_slot(qc, L[0], DW_QC_DY), dw_qcounts_slot(qc, L[1], DW_QC_DY)};
    if (!cnt[0] != !cnt[1]) return DW_OK; /* the kernel counts both or neither */
    float *sc = (float *)(x->work + x->p->work.glu_scales);
    dw_cuda_fp8_grad g[2];
    for (int k = 0; k < 2; k++)
        g[k] = (dw_cuda_fp8_grad){.codes = c->dx[k], .codes_t = (uint8_t *)c->dx[k] + R * F, .scales = sc + 2 * k * ns,
                                  .scales_t = sc + (2 * k + 1) * ns, .counts = cnt[k]};
    DW_TRY(dw_cuda_swiglu_bwd_fp8(be->ctx, c->dout[0], c->in[0], c->in[1], R, F, &g[0], &g[1], DW_CUDA_STREAM(be)));
    for (int k = 0; k < 2; k++) st->dy_fp8_node[k] = L[k], st->dy_fp8[k] = g[k];
    st->swiglu_quant_bwd[0]++;
    *done = true;
    return DW_OK;
}
#endif /* DW_HAVE_CUDA */
