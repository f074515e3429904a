/* grouped_mxfp8_cpu.h — private: the CPU reference of the MXFP8 grouped expert wgrad
 * (grouped_mxfp8_cpu.c; fprop and dgrad are moe_fp8_cpu.h's dw_cpu_moe_linear_mxfp8) and the padded
 * layout of its operands: dy^T and x^T with each expert's rows padded to 32, so that no 1x32 block
 * along the tokens holds two experts' rows (FORMATS.md's mxfp8 along the reduction, which wgrad
 * runs over the tokens). The oracle of gemm/grouped_mxfp8.c's Hopper route and of the quantisers
 * in gemm/grouped_mxfp8_quant.c. */
#ifndef DW_KERNELS_CPU_GROUPED_MXFP8_CPU_H
#define DW_KERNELS_CPU_GROUPED_MXFP8_CPU_H

#include <stdbool.h>
#include <stdint.h>

/* dW (E, M, K) FP32, added into: for expert e and (m, k),
 *   dW[e, m, k] += sum over e's padded 32-blocks pb of (2^sa[m, pb] 2^sb[k, pb]) x sum_{l in pb} a[m, l] b[k, l]
 * with a = dy^T's codes (M, P), b = x^T's codes (K, P) in the padded layout (32-row blocks:
 * dw_cpu_moe_pad_offsets, kernels/cpu/moe_fp8_cpu.h), E4M3 decoded exactly
 * and sa (M, P/32), sb (K, P/32) UE8M0 bytes (2^(code - 127); 0xFF NaN), each block's products
 * summed in double and scaled by the scales' product (exact), the blocks summed in double, one
 * rounding when added to dW. P a multiple of 32 holding pad[E]. Experts without rows add nothing.
 * overwrite: dW = 0 + the sum instead (whatever dW held; zeros for an expert without rows). */
void dw_cpu_moe_linear_mxfp8_wgrad(float *dw, const uint8_t *a, const uint8_t *sa, const uint8_t *b, const uint8_t *sb,
                                   const int32_t *offsets, int64_t E, int64_t M, int64_t K, int64_t P, bool overwrite);

#endif /* DW_KERNELS_CPU_GROUPED_MXFP8_CPU_H */
