/* guard_check_cuda.c — the CUDA backend's side of the guard's quantisation-error check
 * (train/guard_quant.c, docs/precision.md "Guardrails"): operands measured where they live
 * (kernels/cuda/quant_check.h: the same sample and sums as quant_stats.h's reference), so a check
 * copies a few words per operand back instead of the operand. The backend's qstats entry (x and
 * W, asked by the guard) and a check step's dy and dy^T (asked by the quantised linear's
 * backward, qlinear_cuda.c), unless DW_QCHECK_DEVICE=0: then dy is read back and measured on the
 * host, and the guard reads x and W back likewise. Not the decisions. */
#include <stdlib.h>

#include "core/error.h"
#include "runtime/backend.h"

#if DW_HAVE_CUDA
#include "formats/formats.h"
#include "kernels/cuda/quant_check.h"
#include "precision/quant_counts.h"
#include "precision/quant_stats.h"
#include "runtime/cuda/cuda.h"

dw_status dw_cuda_qstats(dw_backend *be, dw_recipe r, bool bf16, const void *v, int64_t rows, int64_t cols, bool trans,
                         dw_qstats *s) {
    return dw_qcheck_cuda(be->ctx, r, bf16 ? DW_QUANT_IN_BF16 : DW_QUANT_IN_F32, v, rows, cols, trans, s,
                          DW_CUDA_STREAM(be));
}

/* dy [N, M] (BF16, device) read back and measured with the reference quantiser on the host: the
 * default until the device check has passed its GPU test. A host sync, on check steps only. */
static dw_status measure_dy_host(dw_backend *be, const dw_op_call *c, dw_recipe ra, int64_t N, int64_t M, bool dg,
                                 bool wg, dw_qstats *ds) {
    uint16_t *h = malloc((size_t)(N * M) * sizeof *h);
    float *f = malloc((size_t)(N * M) * sizeof *f);
    dw_status st = h && f ? DW_OK : dw_set_error(be->ctx, DW_ERR_NOMEM, "quant check: out of memory");
    if (st == DW_OK) st = be->i->download(be, h, c->dout[0], (size_t)(N * M) * sizeof *h);
    for (int64_t i = 0; st == DW_OK && i < N * M; i++) f[i] = dw_decode_bf16(h[i]);
    if (st == DW_OK && dg) st = dw_qstats_measure(be->ctx, ra, f, N, M, false, &ds[0]);
    if (st == DW_OK && wg) st = dw_qstats_measure(be->ctx, ra, f, N, M, true, &ds[1]);
    free(h);
    free(f);
    return st;
}

dw_status dw_cuda_measure_dy(dw_backend *be, const dw_op_call *c, dw_recipe ra, int64_t N, int64_t M, bool dg,
                             bool wg) {
    dw_qstats *ds = dw_qcounts_dy(c->x->qcounts, c->node);
    if (!ds || (!dg && !wg)) return DW_OK;
    if (!dw_qstats_on_device()) return measure_dy_host(be, c, ra, N, M, dg, wg, ds);
    if (dg) DW_TRY(dw_qcheck_cuda(be->ctx, ra, DW_QUANT_IN_BF16, c->dout[0], N, M, false, &ds[0], DW_CUDA_STREAM(be)));
    if (wg) DW_TRY(dw_qcheck_cuda(be->ctx, ra, DW_QUANT_IN_BF16, c->dout[0], N, M, true, &ds[1], DW_CUDA_STREAM(be)));
    return DW_OK;
}
#endif /* DW_HAVE_CUDA */
