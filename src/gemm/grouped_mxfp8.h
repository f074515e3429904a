/* grouped_mxfp8.h — private: the MXFP8 grouped expert GEMM's side of the registry
 * (grouped_mxfp8.c). The operands are FORMATS.md's mxfp8: E4M3 codes with one UE8M0 scale per 1x32
 * block along the reduction dimension, the scales passed as bytes through dw_grouped_args's scale
 * pointers — fprop x [rows, k] with x_scales [rows, k/32], W [experts, m, k] with w_scales
 * [experts, m, k/32]; dgrad dy [rows, m] with dy_scales [rows, m/32] and W^T's copy [experts, k,
 * m] with w_scales [experts, k, m/32]. On Hopper they run as the dense mxfp8 recipe runs there
 * (gemm_cublaslt.c's deepwell_mx_dequant_bf16): every code times its scale dequantised exactly to
 * BF16 (gemm_cuda_util.cu), then the BF16 grouped GEMM the registry picks; the CPU reference
 * (kernels/cpu/moe_cpu.c) computes the same exact values' sums in double. No wgrad yet. */
#ifndef DW_GEMM_GROUPED_MXFP8_H
#define DW_GEMM_GROUPED_MXFP8_H

#include <stdint.h>

#include "deepwell.h"

/* The mxfp8 entries (static storage) in registration order; n returned (at most cap). */
int dw_grouped_mxfp8_kernels(const dw_grouped_kernel_desc **out, int cap);

/* A scale pointer of dw_grouped_args read as the UE8M0 bytes an mxfp8 problem passes there. */
static inline const uint8_t *dw_grouped_mx_scales(const float *p) { return (const uint8_t *)(const void *)p; }

#endif /* DW_GEMM_GROUPED_MXFP8_H */
