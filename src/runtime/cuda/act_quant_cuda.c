/* act_quant_cuda.c — the CUDA backend's SwiGLU that quantises its own output (cuda.h:
 * dw_cuda_swiglu_quant_fwd). Where one linear layer alone reads the SwiGLU's output h as its x and
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
    /* a dense layer whose x the quantisers' counters count (deepwell train's guard; a training
     * forward, not one computing values again): the kernel counts the rows into the layer's own
     * pair 0, which the layer's x counts take when the counters are read (qlinear_cuda.c) */
    dw_qcounts *qc = x->qcounts;
    uint64_t *own = !moe && c->train && dw_qcounts_slot(qc, L, DW_QC_X)
                        ? qc->own + (int64_t)qc->slot[L] * 2 * DW_QC_WORDS : NULL;
    const dw_moe_fp8_slot s = dw_moe_fp8_at(x, &x->p->work.q_rows); /* codes at off, scales at off + scales */
    /* h is stored unless a training forward drops it for the backward to compute again (the
     * quantisation guard measures it after its layer's step in an eval forward: train/guard_quant.c) */
    const bool keep = !c->train || !dw_compile_remat(x->p, c->node);
    DW_TRY(dw_cuda_swiglu_fwd_fp8(be->ctx, keep ? c->out[0] : NULL, c->in[0], c->in[1], R, F, s.codes, s.scales, own,
                                  DW_CUDA_STREAM(be)));
    dw_cuda_qlin_reset(be);
    dw_cuda_state *st = DW_CUDA_ST(be);
    st->rows_tensor = h;
    st->rows_recipe = moe ? dw_cuda_moe_rows_mark(DW_RECIPE_FP8_BLOCK) : (int)DW_RECIPE_FP8_BLOCK;
    if (qc) qc->src[0] = own ? qc->slot[L] : -1; /* counted into L's own pair, or not (an eval forward, MoE) */
    st->swiglu_quant[moe]++;
    *done = true;
    return DW_OK;
}
#endif /* DW_HAVE_CUDA */
