/* moe_gemm_fp8.h — private C API of the fp8_block grouped expert GEMM for Hopper
 * (moe_gemm_fp8_sm90.cu): fprop and dgrad of the MoE linear layer on E4M3 operands with
 * DeepSeek-V3's block scales, called by the grouped registry's entry (src/gemm/grouped_fp8.c).
 * C-callable; CUDA types only as void * and int. */
#ifndef DW_KERNELS_MOE_GEMM_FP8_H
#define DW_KERNELS_MOE_GEMM_FP8_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[r, j] = sum over the L/128 blocks kb of (sa[r, kb] * sb[e, j/128, kb]) * (a_r . b_{eN+j})
 * restricted to the block, for the rows r of expert e ([offsets[e], offsets[e+1])):
 *   a    (R, L) E4M3 codes, rows grouped by expert     sa (R, L/128) FP32: 1x128 blocks
 *   b    (E*N, L) E4M3 codes, expert e's N rows         sb (E, N/128, L/128) FP32: 128x128 blocks
 *   out  (R, N) BF16 (out_f32 0) or FP32; rows past offsets[E] untouched (the caller zeroes them)
 * fprop: a = x, L = K, b = W (E, M, K), N = M. dgrad: a = dy, L = M, b = W^T's copy (E, K, M),
 * N = K. */
typedef struct {
    const uint8_t *a, *b;
    const float *sa, *sb;
    void *out;
    int out_f32;
    const int32_t *offsets; /* (E+1), device */
    int64_t R, E, N, L;
} dw_moe_fp8_args;

/* Launches on `stream` (a cudaStream_t) and returns the cudaError_t; cudaErrorNotSupported (801),
 * launching nothing, where the kernel cannot run: not an sm_90 device, N or L not a multiple of
 * 128, more than 1024 experts, codes not 16-byte aligned, coordinates past 2^31. */
int dw_moe_gemm_fp8_sm90(const dw_moe_fp8_args *a, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* DW_KERNELS_MOE_GEMM_FP8_H */
