/* grouped_fp8.h — private: the fp8_block grouped expert GEMM's side of the registry
 * (grouped_fp8.c): its entries, and the quantisers of its operands — the layer's weights per
 * expert in 128x128 blocks with W^T's copy for dgrad, the activations and gradients in 1x128
 * blocks along their rows (fprop, dgrad) or, for wgrad, along each expert's rows in a transposed
 * copy padded per expert — on the CPU (FORMATS.md's rules, the reference) and on CUDA
 * (bit-identical: kernels/cuda/quant.h, kernels/cuda/moe_gemm_fp8_quant.cu). M and K multiples
 * of 128. */
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

/* wgrad (dW_e += dy_e^T x_e, the reduction over expert e's rows) reads dy and x transposed, in
 * 1x128 blocks along the rows of each expert: x (R, C) becomes codes_t (C, P) with scales_t
 * (C, P/128), expert e's rows [offsets[e], offsets[e+1]) the columns from pad[e] = 128 * sum over
 * e' < e of ceil(count_e' / 128) on, zeros up to the group's next multiple of 128 (so no block
 * holds two experts' rows), each 1x128 block of a row of codes_t FORMATS.md's fp8_block; columns
 * past the last group are zero codes with scale 1. P = dw_grouped_fp8_wgrad_cols(R, E), fixed by
 * the capacity (no count comes to the host). The registry's wgrad takes dy = dy^T's codes (m, P),
 * dy_scales (m, P/128), x = x^T's codes (k, P), x_scales (k, P/128) with P from rows, experts. */
int64_t dw_grouped_fp8_wgrad_cols(int64_t rows, int64_t experts);
/* Host memory; x FP32, offsets (E+1) checked as dw_grouped_gemm checks them (DW_ERR_INVALID). */
dw_status dw_grouped_fp8_quantize_cols_cpu(dw_ctx *ctx, const float *x, const int32_t *offsets, int64_t R, int64_t E,
                                           int64_t C, uint8_t *codes_t, float *scales_t);
/* The same on the context's CUDA device, in its stream's order, offsets on the device (never read
 * by the host); x FP32 or BF16; C a multiple of 128, codes_t 16-byte aligned. */
dw_status dw_grouped_fp8_quantize_cols_cuda(dw_ctx *ctx, const void *x, bool bf16, const int32_t *offsets, int64_t R,
                                            int64_t E, int64_t C, uint8_t *codes_t, float *scales_t);

#endif /* DW_GEMM_GROUPED_FP8_H */
