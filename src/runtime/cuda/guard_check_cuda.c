/* guard_check_cuda.c — the CUDA backend's side of the guard's quantisation-error check
 * (train/guard_quant.c, docs/precision.md "Guardrails"): operands measured where they live
 * (kernels/cuda/quant_check.h: the same sample and sums as quant_stats.h's reference), so a check
 * copies a few words per operand back instead of the operand. The backend's qstats entry (x and
 * W, asked by the guard) and a check step's dy and dy^T (asked by the quantised linear's
 * backward, qlinear_cuda.c). Not the decisions. */
#include "core/error.h"
#include "runtime/backend.h"

#if DW_HAVE_CUDA
#include "kernels/cuda/quant_check.h"
#include "precision/quant_counts.h"
#include "runtime/cuda/cuda.h"

dw_status dw_cuda_qstats(dw_backend *be, dw_recipe r, bool bf16, const void *v, int64_t rows, int64_t cols, bool trans,
                         dw_qstats *s) {
    return dw_qcheck_cuda(be->ctx, r, bf16 ? DW_QUANT_IN_BF16 : DW_QUANT_IN_F32, v, rows, cols, trans, s,
                          DW_CUDA_STREAM(be));
}

dw_status dw_cuda_measure_dy(dw_backend *be, const dw_op_call *c, dw_recipe ra, int64_t N, int64_t M, bool dg,
                             bool wg) {
    dw_qstats *ds = dw_qcounts_dy(c->x->qcounts, c->node);
    if (!ds) return DW_OK;
    if (dg) DW_TRY(dw_qcheck_cuda(be->ctx, ra, DW_QUANT_IN_BF16, c->dout[0], N, M, false, &ds[0], DW_CUDA_STREAM(be)));
    if (wg) DW_TRY(dw_qcheck_cuda(be->ctx, ra, DW_QUANT_IN_BF16, c->dout[0], N, M, true, &ds[1], DW_CUDA_STREAM(be)));
    return DW_OK;
}
#endif /* DW_HAVE_CUDA */
