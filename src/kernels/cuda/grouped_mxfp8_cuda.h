/* grouped_mxfp8_cuda.h — private C API of the MXFP8 grouped expert wgrad's device pieces
 * (grouped_mxfp8_quant.cu), called by the grouped registry's mxfp8 side (src/gemm/grouped_mxfp8.c,
 * grouped_mxfp8_quant.c): the quantiser of wgrad's padded operands and, for the Hopper route,
 * their exact dequantisation back into BF16 rows. The padded layout is grouped_mxfp8.h's (each
 * expert's rows padded to 32, kernels/cpu/grouped_mxfp8_cpu.h the oracle). C-callable; CUDA types
 * only as void * and int. Any sm. */
#ifndef DW_KERNELS_CUDA_GROUPED_MXFP8_CUDA_H
#define DW_KERNELS_CUDA_GROUPED_MXFP8_CUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* x (R, C) FP32 (bf16 0) or BF16 -> codes_t (C, P) E4M3 and scales_t (C, P/32) UE8M0 (rceil): each
 * 1x32 block of a row of codes_t FORMATS.md's mxfp8 over one expert's rows (zeros past its count),
 * the columns past the groups zero codes with scale code 0, the groups found from the device's
 * offsets (E+1). cudaErrorNotSupported for P not a multiple of 32, E < 1 or codes_t not 16-byte
 * aligned. Returns the launch's cudaError_t. */
int dw_moe_mx_quantize_cols(const void *x, int bf16, const int32_t *offsets, int64_t E, int64_t C, int64_t P,
                            uint8_t *codes_t, uint8_t *scales_t, void *stream);

/* The inverse layout, dequantised: out (R, C) BF16, row r of expert e the column pad[e] + r -
 * offsets[e] of codes_t (C, P) times its UE8M0 scale (exact: an E4M3 code times a power of two is
 * a BF16 value unless the scale is below 2^-124), rows past offsets[E] zeros. pad (E+1) int64
 * device scratch the call fills first. Returns the last launch's cudaError_t. */
int dw_moe_mx_dequant_cols_bf16(const uint8_t *codes_t, const uint8_t *scales_t, const int32_t *offsets, int64_t R,
                                int64_t E, int64_t C, int64_t P, int64_t *pad, uint16_t *out, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* DW_KERNELS_CUDA_GROUPED_MXFP8_CUDA_H */
