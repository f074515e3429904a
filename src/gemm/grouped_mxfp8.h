/* grouped_mxfp8.h — private: the MXFP8 grouped expert GEMM's side of the registry
 * (grouped_mxfp8.c). The operands are FORMATS.md's mxfp8: E4M3 codes with one UE8M0 scale per 1x32
 * block along the reduction dimension, the scales passed as bytes through dw_grouped_args's scale
 * pointers — fprop x [rows, k] with x_scales [rows, k/32], W [experts, m, k] with w_scales
 * [experts, m, k/32]; dgrad dy [rows, m] with dy_scales [rows, m/32] and W^T's copy [experts, k,
 * m] with w_scales [experts, k, m/32]. On Hopper they run as the dense mxfp8 recipe runs there
 * (gemm_cublaslt.c's deepwell_mx_dequant_bf16): every code times its scale dequantised exactly to
 * BF16 (gemm_cuda_util.cu), then the BF16 grouped GEMM the registry picks; the CPU reference
 * (kernels/cpu/moe_cpu.c) computes the same exact values' sums in double. wgrad reads dy^T and x^T
 * in 1x32 blocks along each expert's rows, groups padded to 32 (below; its reference
 * kernels/cpu/grouped_mxfp8_cpu.c), and on Hopper dequantises them back into BF16 rows for the
 * BF16 grouped wgrad. The quantisers of every operand (grouped_mxfp8_quant.c) are what the MoE
 * layer (runtime/moe_fp8.c) runs: the CPU ones the reference of the CUDA ones, bit for bit. */
#ifndef DW_GEMM_GROUPED_MXFP8_H
#define DW_GEMM_GROUPED_MXFP8_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"

/* The mxfp8 entries (static storage) in registration order; n returned (at most cap). */
int dw_grouped_mxfp8_kernels(const dw_grouped_kernel_desc **out, int cap);

/* A scale pointer of dw_grouped_args read as the UE8M0 bytes an mxfp8 problem passes there. */
static inline const uint8_t *dw_grouped_mx_scales(const float *p) { return (const uint8_t *)(const void *)p; }

/* ---- the operands (grouped_mxfp8_quant.c): FORMATS.md's mxfp8, E4M3 with rceil UE8M0 scales ---- */
/* W (E, M, K) FP32 -> codes (E, M, K) with scales (E, M, K/32) along K (fprop's W), and W^T's copy
 * codes_t (E, K, M) with scales_t (E, K, M/32) along M (dgrad's). Host memory. */
dw_status dw_grouped_mxfp8_quantize_weights_cpu(dw_ctx *ctx, const float *w, int64_t E, int64_t M, int64_t K,
                                                uint8_t *codes, uint8_t *scales, uint8_t *codes_t, uint8_t *scales_t);
/* x (R, C) -> codes (R, C) with scales (R, C/32), every one of the R rows. Host memory; x FP32. */
dw_status dw_grouped_mxfp8_quantize_rows_cpu(dw_ctx *ctx, const float *x, int64_t R, int64_t C, uint8_t *codes,
                                             uint8_t *scales);
/* wgrad's operand: x (R, C) as x^T's codes_t (C, P) with scales_t (C, P/32), expert e's rows the
 * columns from pad[e] = 32 * sum over e' < e of ceil(count_e' / 32) on, zeros up to the group's next
 * multiple of 32; columns past the last group zero codes with scale code 0.
 * P = dw_grouped_mxfp8_wgrad_cols(R, E) = 32 (R/32 + E), fixed by the capacity. The registry's
 * wgrad takes dy = dy^T's codes (m, P), dy_scales (m, P/32), x = x^T's codes (k, P), x_scales
 * (k, P/32) with P from rows, experts. Host memory; offsets (E+1) checked (DW_ERR_INVALID). */
int64_t dw_grouped_mxfp8_wgrad_cols(int64_t rows, int64_t experts);
dw_status dw_grouped_mxfp8_quantize_cols_cpu(dw_ctx *ctx, const float *x, const int32_t *offsets, int64_t R,
                                             int64_t E, int64_t C, uint8_t *codes_t, uint8_t *scales_t);
/* The same three on the context's CUDA device, in its stream's order (no host synchronisation;
 * offsets on the device), bit for bit the CPU ones; x FP32 (bf16 false) or BF16, w FP32;
 * codes_t of the columns 16-byte aligned. DW_ERR_UNSUPPORTED in a build without CUDA. */
dw_status dw_grouped_mxfp8_quantize_weights_cuda(dw_ctx *ctx, const float *w, int64_t E, int64_t M, int64_t K,
                                                 uint8_t *codes, uint8_t *scales, uint8_t *codes_t, uint8_t *scales_t);
dw_status dw_grouped_mxfp8_quantize_rows_cuda(dw_ctx *ctx, const void *x, bool bf16, int64_t R, int64_t C,
                                              uint8_t *codes, uint8_t *scales);
dw_status dw_grouped_mxfp8_quantize_cols_cuda(dw_ctx *ctx, const void *x, bool bf16, const int32_t *offsets,
                                              int64_t R, int64_t E, int64_t C, uint8_t *codes_t, uint8_t *scales_t);

#endif /* DW_GEMM_GROUPED_MXFP8_H */
