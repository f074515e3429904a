/* formats.h — private: element formats and quantisation recipes of shared/FORMATS.md, bit-exact.
 * This is the numerics contract: the CPU reference here, the CUDA kernels (kernels/cuda/quant*)
 * and every GEMM backend produce and consume exactly these codes and scales.
 * CONTRACT HEADER: the signatures below are used by other stages (safetensors commands, GEMM,
 * precision); extend, but change only with everyone's callers. */
#ifndef DW_FORMATS_H
#define DW_FORMATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "deepwell.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- element formats -------------------------------------------------------------------- */
typedef enum {
    DW_FMT_E4M3 = 0, /* FP8 e4m3fn: bias 7, max 448, NaN = s.1111.111, no Inf */
    DW_FMT_E5M2,     /* FP8 e5m2: bias 15, max 57344, Inf and NaN */
    DW_FMT_E2M1,     /* FP4: ±{0,0.5,1,1.5,2,3,4,6}, no specials (4-bit code in the low nibble) */
    DW_FMT_UE8M0,    /* scale: 2^(code-127), 0xFF = NaN */
    DW_FMT_UE4M3,    /* scale: E4M3 without sign, 0x7F = NaN */
    DW_FMT_BF16,     /* 16-bit code */
    DW_FMT_COUNT
} dw_elem_format;

/* Encode with round-to-nearest-even. `saturate`: out-of-range finite values clamp to ±max
 * (E4M3, E2M1, UE4M3 always saturate; E5M2 saturates only when asked, else overflows to Inf).
 * NaN encodes to the format's NaN (E2M1 has none: encodes NaN as +0; callers mark the block). */
uint8_t dw_encode_e4m3(float x);
uint8_t dw_encode_e5m2(float x, bool saturate);
uint8_t dw_encode_e2m1(float x);
uint8_t dw_encode_ue4m3(float x);
uint16_t dw_encode_bf16(float x);
float dw_decode_e4m3(uint8_t c);
float dw_decode_e5m2(uint8_t c);
float dw_decode_e2m1(uint8_t c);
float dw_decode_ue8m0(uint8_t c); /* 2^(c-127); NaN for 0xFF; c=0 gives 2^-127 */
float dw_decode_ue4m3(uint8_t c);
float dw_decode_bf16(uint16_t c);

/* ---- recipes ----------------------------------------------------------------------------
 * dw_recipe, dw_scale_rounding and the recipe names are public (deepwell.h, [section: formats]). */

typedef struct {
    dw_recipe recipe;
    dw_scale_rounding rounding; /* MX recipes only */
    bool pow2;                  /* FP8 recipes: round FP32 scales up to a power of two */
} dw_quant_opts;

/* The private options of a valid public dw_quantize_opts (DW_ERR_INVALID naming the bad field:
 * size never set, bf16, an unknown recipe or rounding). */
dw_status dw_quant_opts_from_public(dw_ctx *ctx, const dw_quantize_opts *pub, dw_quant_opts *out);

/* Block geometry of a recipe: block_rows x block_cols elements share one scale
 * (fp8_tensor: 0 x 0 meaning whole tensor; fp8_row: 1 x 0 meaning whole row). */
void dw_recipe_block(dw_recipe r, int *block_rows, int *block_cols);
/* Element bits (8 or 4) and scale bytes (4 for FP32, 1 for UE8M0/UE4M3). */
int dw_recipe_elem_bits(dw_recipe r);

/* A quantised 2-D tensor [rows, cols] (row-major), the layout FORMATS.md writes to disk:
 *   codes:  rows x dw_quant_row_bytes(recipe, cols): cols bytes (8-bit), ceil(cols/2) (FP4, even
 *           column in the low nibble), 2*cols (BF16 recipe)
 *   scales: row-major, unswizzled; FP32 or 1-byte codes; shape per dw_quant_scale_shape
 *   tensor_scale: NVFP4's FP32 s_t (1.0 for others) */
typedef struct {
    dw_recipe recipe;
    int64_t rows, cols;
    uint8_t *codes;
    void *scales;
    float tensor_scale;
} dw_qtensor;

/* Shape of the scale array for [rows, cols]; ragged last blocks are allowed where a recipe's
 * block does not divide cols (ceil division). fp8_tensor: 1 x 1. */
void dw_quant_scale_shape(dw_recipe r, int64_t rows, int64_t cols, int64_t *srows, int64_t *scols);
size_t dw_quant_codes_bytes(dw_recipe r, int64_t rows, int64_t cols);
size_t dw_quant_scales_bytes(dw_recipe r, int64_t rows, int64_t cols);

/* Bytes of one row of codes: cols (8-bit), ceil(cols/2) (FP4: an odd last column leaves the high
 * nibble 0), 2*cols (BF16). Rows are contiguous: codes bytes = rows * row bytes. */
int64_t dw_quant_row_bytes(dw_recipe r, int64_t cols);

/* CPU reference quantisation of x [rows, cols] (FP32) into q (buffers sized by the functions
 * above, caller-owned). Exact, simple, single-threaded per block; the oracle for the CUDA kernels. */
dw_status dw_quantize_cpu(dw_ctx *ctx, const dw_quant_opts *o, const float *x, int64_t rows,
                          int64_t cols, dw_qtensor *q);
/* Same from BF16 codes. */
dw_status dw_quantize_bf16_cpu(dw_ctx *ctx, const dw_quant_opts *o, const uint16_t *x, int64_t rows,
                               int64_t cols, dw_qtensor *q);
/* Dequantise exactly (codes x scales x tensor scale, in FP32) into y [rows, cols]. */
void dw_dequantize_cpu(const dw_qtensor *q, float *y);

/* Edge cases the contract leaves to us (docs/formats.md): a block whose amax is NaN or Inf gets
 * a NaN scale — FP32 0x7FC00000 with codes 0x7F (FP8 recipes), UE8M0 0xFF with codes 0x7F
 * (E4M3/E5M2) or 0 (E2M1) (MX), and for NVFP4 a non-finite tensor gives s_t = NaN, every block
 * scale 0x7F and codes 0. An FP32 scale that underflows to 0 is replaced by 1 (like amax = 0).
 * NVFP4 element codes are 0 whenever decode(b)*s_t is 0. The BF16 recipe stores BF16 codes
 * (2 bytes per element) and no scales. */

/* ---- transposed copy and GEMM scale layouts (layout.c) ----------------------------------- */

/* Quantises x^T: x is [rows, cols]; qt describes [cols, rows] (blocks along x's columns), sized by
 * the functions above with rows and cols swapped. What backward GEMMs consume. */
dw_status dw_quantize_transposed_cpu(dw_ctx *ctx, const dw_quant_opts *o, const float *x,
                                     int64_t rows, int64_t cols, dw_qtensor *qt);

/* cuBLAS's tiled layout of 1-byte block scales (VEC32_UE8M0, VEC16_UE4M3) for a row-major scale
 * matrix [srows, scols]: padded to [ceil(srows/128)*128, ceil(scols/4)*4] (padding bytes 0) and cut
 * into 128x4 tiles of 512 contiguous bytes, tiles ordered row-major (along scols first); inside
 * a tile, scale (r, c) sits at (r % 32) * 16 + (r / 32) * 4 + c. */
size_t dw_scale_swizzled_bytes(int64_t srows, int64_t scols);
int64_t dw_scale_swizzle_offset(int64_t r, int64_t c, int64_t scols);
void dw_scale_swizzle_cpu(const uint8_t *scales, int64_t srows, int64_t scols, uint8_t *out);

#ifdef __cplusplus
}
#endif

#endif /* DW_FORMATS_H */
