/* grouped_fp8.h — private: the fp8_block grouped expert GEMM's side of the registry
 * (grouped_fp8.c): its entries, and the quantisers of its operands — the layer's weights per
 * expert in 128x128 blocks with W^T's copy for dgrad, the activations and gradients in 1x128
 * blocks along their rows — on the CPU (FORMATS.md's rules, the reference) and on CUDA
 * (bit-identical: kernels/cuda/quant.h). M and K multiples of 128. */
#ifndef DW_GEMM_GROUPED_FP8_H
#define DW_GEMM_GROUPED_FP8_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"

/* The fp8_block entries (static storage) in registration order; n returned (at most cap). */
int dw_grouped_fp8_kernels(const dw_grouped_kernel_desc **out, int cap);

/* W (E, M, K) -> codes (E, M, K) E4M3 with scales (E, M/128, K/128) (fprop's W), and W^T's copy
 * codes_t (E, K, M) with scales_t (E, K/128, M/128) (dgrad's). Host memory; w FP32. */
dw_status dw_grouped_fp8_quantize_weights_cpu(dw_ctx *ctx, const float *w, int64_t E, int64_t M, int64_t K,
                                              uint8_t *codes, float *scales, uint8_t *codes_t, float *scales_t);
/* x (R, C) -> codes (R, C) with scales (R, C/128), every one of the R rows (each block lies in one
 * row, so no expert count is needed: rows past the groups are whatever they hold, zeros after a
 * dispatch). Host memory; x FP32. */
dw_status dw_grouped_fp8_quantize_rows_cpu(dw_ctx *ctx, const float *x, int64_t R, int64_t C, uint8_t *codes,
                                           float *scales);
/* The same two on the context's CUDA device, in its stream's order (no host synchronisation);
 * w and x FP32 (bf16 false) or BF16. DW_ERR_UNSUPPORTED in a build without CUDA. */
dw_status dw_grouped_fp8_quantize_weights_cuda(dw_ctx *ctx, const void *w, bool bf16, int64_t E, int64_t M,
                                               int64_t K, uint8_t *codes, float *scales, uint8_t *codes_t,
                                               float *scales_t);
dw_status dw_grouped_fp8_quantize_rows_cuda(dw_ctx *ctx, const void *x, bool bf16, int64_t R, int64_t C,
                                            uint8_t *codes, float *scales);

#endif /* DW_GEMM_GROUPED_FP8_H */
