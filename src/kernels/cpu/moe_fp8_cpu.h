/* moe_fp8_cpu.h — private: the CPU references of the quantised grouped expert GEMMs
 * (kernels/cpu/moe_cpu.c): fp8_block, the oracle of kernels/cuda/moe_gemm_fp8_sm90.cu (fprop and
 * dgrad on row-blocked operands, wgrad on transposed copies whose expert groups are padded to 128),
 * and mxfp8's fprop and dgrad, the oracle of gemm/grouped_mxfp8.c's Hopper route. */
#ifndef DW_KERNELS_CPU_MOE_FP8_CPU_H
#define DW_KERNELS_CPU_MOE_FP8_CPU_H

#include <stdbool.h>
#include <stdint.h>

/* out (R, N) FP32: for row r of expert e ([offsets[e], offsets[e+1])) and column j,
 *   sum over the L/128 blocks kb of  (sa[r, kb] * sb[e, j/128, kb])  x  sum_{l in kb} a[r, l] b[e N + j, l]
 * with a (R, L) and b (E N, L) E4M3 codes decoded exactly, the inner sums and the accumulation in
 * double and the scale product in FP32 (as the kernel forms it); rows past offsets[E] are 0.
 * sa (R, L/128), sb (E, N/128, L/128) FP32; L and N multiples of 128. */
void dw_cpu_moe_linear_fp8(float *out, const uint8_t *a, const float *sa, const uint8_t *b, const float *sb,
                           const int32_t *offsets, int64_t R, int64_t E, int64_t L, int64_t N);

/* wgrad's padded layout, blocks of `block` rows (fp8_block 128, mxfp8 32): expert e's rows
 * [offsets[e], offsets[e+1]) are the columns [pad[e], pad[e] + count_e) of a transposed copy,
 * pad[e] = block * sum over e' < e of ceil(count_e' / block), the rest of each group's last block
 * zeros: no 1 x block block holds two experts' rows. pad (E+1); pad[E] <= block (R/block + E) for
 * R >= offsets[E] (grouped_fp8.h's and grouped_mxfp8.h's column counts). */
void dw_cpu_moe_pad_offsets(int64_t *pad, const int32_t *offsets, int64_t E, int64_t block);

/* dW (E, M, K) FP32, added into (overwrite: written over, whatever it held): for expert e and (m, k),
 *   dW[e, m, k] += sum over e's padded blocks pb of (sa[m, pb] * sb[k, pb]) x sum_{l in pb} a[m, l] b[k, l]
 * with a = dy^T's codes (M, P), b = x^T's codes (K, P) in the padded layout, E4M3 decoded exactly,
 * the inner sums and the accumulation in double, the scale product in FP32, one rounding when
 * added to dW (to 0 when overwrite: a zeroed dW's bits). sa (M, P/128), sb (K, P/128) FP32; P a
 * multiple of 128 holding pad[E]. Experts without rows add nothing (overwrite: get zeros). */
void dw_cpu_moe_linear_fp8_wgrad(float *dw, const uint8_t *a, const float *sa, const uint8_t *b, const float *sb,
                                 const int32_t *offsets, int64_t E, int64_t M, int64_t K, int64_t P, bool overwrite);

/* out (R, N) FP32: for row r of expert e ([offsets[e], offsets[e+1])) and column j,
 *   sum over l of  (a[r, l] sa[r, l/32]) x (b[e N + j, l] sb[e N + j, l/32])
 * with a (R, L) and b (E N, L) E4M3 codes and sa (R, L/32), sb (E N, L/32) UE8M0 scale bytes
 * (FORMATS.md's mxfp8) decoded exactly, each 32-block's products summed in double and scaled by the
 * two scales' product (a power of two: exact), the blocks summed in double, one rounding; rows past
 * offsets[E] are 0. L a multiple of 32. */
void dw_cpu_moe_linear_mxfp8(float *out, const uint8_t *a, const uint8_t *sa, const uint8_t *b, const uint8_t *sb,
                             const int32_t *offsets, int64_t R, int64_t E, int64_t L, int64_t N);

#endif /* DW_KERNELS_CPU_MOE_FP8_CPU_H */
