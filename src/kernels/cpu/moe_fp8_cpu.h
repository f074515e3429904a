/* moe_fp8_cpu.h — private: the CPU reference of the fp8_block grouped expert GEMM
 * (kernels/cpu/moe_cpu.c), the oracle of kernels/cuda/moe_gemm_fp8_sm90.cu. */
#ifndef DW_KERNELS_CPU_MOE_FP8_CPU_H
#define DW_KERNELS_CPU_MOE_FP8_CPU_H

#include <stdint.h>

/* out (R, N) FP32: for row r of expert e ([offsets[e], offsets[e+1])) and column j,
 *   sum over the L/128 blocks kb of  (sa[r, kb] * sb[e, j/128, kb])  x  sum_{l in kb} a[r, l] b[e N + j, l]
 * with a (R, L) and b (E N, L) E4M3 codes decoded exactly, the inner sums and the accumulation in
 * double and the scale product in FP32 (as the kernel forms it); rows past offsets[E] are 0.
 * sa (R, L/128), sb (E, N/128, L/128) FP32; L and N multiples of 128. */
void dw_cpu_moe_linear_fp8(float *out, const uint8_t *a, const float *sa, const uint8_t *b, const float *sb,
                           const int32_t *offsets, int64_t R, int64_t E, int64_t L, int64_t N);

#endif /* DW_KERNELS_CPU_MOE_FP8_CPU_H */
