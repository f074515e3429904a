/* quant_check.h — private C API of the guard's quantisation-error check on the device
 * (quant_check.cu): quant_stats.h's dw_qstats_measure of an operand that lives in device memory,
 * the same sample (whole block rows, the amax's always among them) quantised by the CUDA
 * quantiser (bit-identical to the CPU reference) and the sums reduced there; a few words come
 * back per operand instead of the operand. Not the guard's bookkeeping (train/guard_quant.c). */
#ifndef DW_KERNELS_CUDA_QUANT_CHECK_H
#define DW_KERNELS_CUDA_QUANT_CHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"
#include "kernels/cuda/quant.h"
#include "precision/quant_stats.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dw_qstats_measure(ctx, r, x, rows, cols, trans, s) of x [rows, cols] on the device (FP32 or
 * BF16 codes, row-major): the rows dw_qstats_sample picks when rows * cols > s->cap > 0, else all
 * of x (or x^T), quantised with the backends' options (RCEIL, FP32 scales not rounded), their
 * sums added to *s. The counts, max_abs and which elements count are the reference's exactly;
 * the double sums are the same terms added in another order. Issued on `stream` (a cudaStream_t),
 * returns once *s holds the result (two small copies back when sampling, one otherwise).
 * DW_ERR_INVALID: bf16 or an unknown recipe; DW_ERR_UNSUPPORTED: 2^33 elements or more. */
dw_status dw_qcheck_cuda(dw_ctx *ctx, dw_recipe r, dw_quant_in in, const void *x, int64_t rows, int64_t cols,
                         bool trans, dw_qstats *s, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* DW_KERNELS_CUDA_QUANT_CHECK_H */
