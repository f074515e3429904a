/* moe_gemm_fp8.h — private C API of the fp8_block grouped expert GEMM for Hopper
 * (moe_gemm_fp8_sm90.cu): fprop, dgrad and wgrad of the MoE linear layer on E4M3 operands with
 * DeepSeek-V3's block scales, and the quantiser of wgrad's padded operands
 * (moe_gemm_fp8_quant.cu), called by the grouped registry's side (src/gemm/grouped_fp8.c).
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
 * N = K.
 * wgrad (wgrad 1): dW[e, m, j] += sum over expert e's padded blocks pb of (sa[m, pb] * sb[j, pb])
 * * (a_m . b_j) restricted to the block, the blocks of grouped_fp8.h's padded layout (expert e's
 * from 128 * sum_{e'<e} ceil(count_e'/128) on):
 *   a    (M, L) dy^T's codes   sa (M, L/128)     b (N, L) x^T's codes   sb (N, L/128): 1x128 blocks
 *   out  dW (E, M, N) FP32, added into; experts without rows add nothing. L = P, N = K.
 *   overwrite 1: dW written instead (0 + the sum: a zeroed dW's bits), experts without rows zeros. */
typedef struct {
    const uint8_t *a, *b;
    const float *sa, *sb;
    void *out;
    int out_f32;
    const int32_t *offsets; /* (E+1), device */
    int64_t R, E, N, L;
    int wgrad;  /* 1: the wgrad above */
    int64_t M;  /* wgrad: rows of dW per expert (a multiple of 128) */
    int overwrite; /* wgrad: 1 writes dW over instead of adding into it */
} dw_moe_fp8_args;

/* Launches on `stream` (a cudaStream_t) and returns the cudaError_t; cudaErrorNotSupported (801),
 * launching nothing, where the kernel cannot run: not an sm_90 device, N or L not a multiple of
 * 128, more than 1024 experts, codes not 16-byte aligned, coordinates past 2^31. */
int dw_moe_gemm_fp8_sm90(const dw_moe_fp8_args *a, void *stream);

/* wgrad's operand: x (R, C) FP32 (bf16 0) or BF16 -> codes_t (C, P) E4M3 and scales_t (C, P/128)
 * in grouped_fp8.h's padded layout (each 1x128 block of a row FORMATS.md's fp8_block, the
 * padding zeros, the columns past the groups zero codes with scale 1), the groups found from the
 * device's offsets (E+1). Any sm; cudaErrorNotSupported for C not a multiple of 64, P not a
 * multiple of 128 or codes_t not 16-byte aligned. Returns the launch's cudaError_t. */
int dw_moe_fp8_quantize_cols(const void *x, int bf16, const int32_t *offsets, int64_t R, int64_t E, int64_t C,
                             int64_t P, uint8_t *codes_t, float *scales_t, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* DW_KERNELS_MOE_GEMM_FP8_H */
