/* gemm_cuda.h — private: C-callable helpers of the CUDA GEMM backends (scale re-layout kernels,
 * the launchers of the sm_90a MXFP8 and FP8 block-scaled kernels). Plain C types only; streams passed as void*. */
#ifndef DW_GEMM_GEMM_CUDA_H
#define DW_GEMM_GEMM_CUDA_H

#include <stdint.h>

#include "deepwell.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst [cols][ld] = src [rows, cols]^T (FP32), rows padded to ld with 0: cuBLASLt's
 * VEC128_32F / BLK128x128_32F scale layout (outer dimension fastest). Returns a cudaError_t. */
int dw_gemm_cuda_transpose_scales(const float *src, int64_t rows, int64_t cols, int64_t ld, float *dst,
                                  void *stream);
/* Same, dst row r reading source row r >> shift (shift 7: one scale per 128 rows, expanded to every
 * row; the source then has ceil(rows / 128) rows). */
int dw_gemm_cuda_transpose_scales_rows(const float *src, int64_t rows, int shift, int64_t cols, int64_t ld,
                                       float *dst, void *stream);
/* dst [rows][ld] = src [rows, cols] (FP32), columns padded to ld with 0 (BLK128x128_32F layout). */
int dw_gemm_cuda_pad_scales(const float *src, int64_t rows, int64_t cols, int64_t ld, float *dst, void *stream);
/* dst = the 128x4-tiled layout of src [rows, scols] (bytes): see dw_scale_swizzle_offset (formats.h). */
int dw_gemm_cuda_tile_scales(const uint8_t *src, int64_t rows, int64_t scols, uint8_t *dst, void *stream);

/* out [rows, cols] BF16 = codes x scales exactly (element kind 0 E4M3, 1 E5M2, 2 E2M1 packed;
 * scale kind 0 UE8M0 per 32, 1 UE4M3 per 16; row_bytes per code row, scols scales per row). */
int dw_gemm_cuda_dequant_bf16(int ekind, int skind, const uint8_t *codes, const uint8_t *scales, int64_t rows,
                              int64_t cols, int64_t row_bytes, int64_t scols, uint16_t *out, void *stream);

/* out[0] = (alpha * ta) * tb with ta = pa ? *pa : va (tb likewise), out[1] = beta: cuBLASLt's alpha
 * and beta in device pointer mode when NVFP4 tensor scales live on the device. One thread. */
int dw_gemm_cuda_alpha_beta(float alpha, float beta, const float *pa, float va, const float *pb, float vb,
                            float *out, void *stream);

/* The epilogue of Deepwell's own sm_90a kernels: D = GELU?(alpha acc + beta C + bias), the
 * pre-activation to aux when set (NULL: none). out_bf16 selects BF16 (else FP32) for d, c, bias, aux. */
typedef struct {
    float alpha, beta;
    const void *c;
    void *d;
    int out_bf16;
    const void *bias;
    void *aux;
    int gelu;
} dw_sm90_epi;
/* The epilogue fields of a GEMM call (gemm_mxfp8.c). */
dw_sm90_epi dw_gemm_sm90_epi(const dw_gemm_args *a);

/* Deepwell's sm_90a MXFP8 GEMM (FP8 wgmma with per-32 UE8M0 promotion in FP32):
 *   D [m, n] = epi(alpha * sum_kb sa[i, kb] sb[j, kb] (A[i, kb*32:+32] . B[j, kb*32:+32]) + beta C)
 * A codes [m, k], B codes [n, k] (E4M3, or E5M2 when e5m2_a / e5m2_b), scales [m, k/32], [n, k/32]
 * UE8M0. k % 32 == 0, k % 16 bytes.
 * Returns a cudaError_t (0 = launched). */
typedef struct {
    const uint8_t *a, *b, *sa, *sb;
    int64_t m, n, k;
    int e5m2_a, e5m2_b;
    dw_sm90_epi epi;
    int variant; /* 0: 2 warpgroups (128x128 tile); 1: same with two partial accumulators (chunk c+1 in
                    flight during c's promotion); 2: 3 warpgroups (192x128 tile), one partial */
} dw_mxfp8_sm90_args;
int dw_gemm_mxfp8_sm90_launch(const dw_mxfp8_sm90_args *p, void *stream);

/* Deepwell's sm_90a FP8 block-scaled GEMM (DeepSeek-V3 recipe; FP8 wgmma, promotion per 128 of K):
 *   D [m, n] = epi(alpha * sum_kb sa(i, kb) sb(j, kb) (A[i, kb*128:+128] . B[j, kb*128:+128]) + beta C)
 * A codes [m, k], B codes [n, k] (E4M3, 16-byte aligned). Scales FP32 as FORMATS.md stores them:
 * 1x128 (x_2d = 0): [rows, k/128]; 128x128 (x_2d = 1): [ceil(rows/128), k/128]. k % 128 == 0;
 * m, n any. Returns a cudaError_t. */
typedef struct {
    const uint8_t *a, *b;
    const float *sa, *sb;
    int a_2d, b_2d;
    int64_t m, n, k;
    dw_sm90_epi epi;
    int variant; /* bit 0: 3 consumer warpgroups (192x128 tile), else 2 (128x128); bit 1: clusters of
                    2 CTAs sharing B through TMA multicast; bit 2 (2 warpgroups only): two partial
                    accumulators, K tiles in pairs (the second's wgmmas in flight during the first's
                    promotion); 5: 2 warpgroups, 128x192 tiles; 6: the same with clusters of 2.
                    Built: 0 to 6. Always persistent; every K tile's scales reach shared
                    memory by TMA beside its codes (from K-block-major copies made per call). */
} dw_fp8block_sm90_args;
int dw_gemm_fp8block_sm90_launch(const dw_fp8block_sm90_args *p, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* DW_GEMM_GEMM_CUDA_H */
