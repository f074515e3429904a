/* quant.h — private C API of the CUDA quantisation kernels (quant.cu; the kernels in quant_kernels.cuh): a BF16 or FP32 [rows, cols]
 * tensor on the device → codes and scales of any recipe of formats.h, bit-identical to
 * dw_quantize_cpu, optionally with the transposed (column-wise) copy in the same pass and the
 * block scales also in cuBLAS's 128x4 tiled layout. C-callable; CUDA types only as void *.
 * Not the GEMMs that consume the result, and not the BF16 "recipe" (nothing to quantise). */
#ifndef DW_KERNELS_CUDA_QUANT_H
#define DW_KERNELS_CUDA_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "deepwell.h"
#include "formats/formats.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DW_QUANT_IN_F32 = 0, DW_QUANT_IN_BF16 } dw_quant_in;

/* One quantised output on the device, for a tensor [R, C] (R, C = rows, cols for the row-wise
 * copy; cols, rows for the transposed copy), in the layouts of formats.h:
 *   codes            R x dw_quant_row_bytes(recipe, C) bytes
 *   scales           row-major, dw_quant_scales_bytes(recipe, R, C) bytes (FP32 or 1-byte codes)
 *   scales_swizzled  optional (NULL: not written), 1-byte-scale recipes only (mx*, nvfp4):
 *                    dw_scale_swizzled_bytes(srows, scols) bytes, padding written as 0
 *   tensor_scale     NVFP4 only (required there): 1 float, s_t
 *   counts           optional (NULL: not counted): an (overflow, underflow, elements) counter of
 *                    device uint64 (precision/quant_counts.h) this copy's counts are added to, atomically, in
 *                    stream order. The kernels count as they quantise (one atomic per CTA and
 *                    counter); where the kernel taken has no counting build (the one-tile-per-CTA
 *                    kernel of rows not 16-byte aligned, the bulk transposing kernel tuned to
 *                    t_store 2..4 or 3 CTAs per SM) the call adds a counting pass after it
 *                    (dw_qcounts_add_cuda): the same counts either way. */
typedef struct {
    uint8_t *codes;
    void *scales;
    uint8_t *scales_swizzled;
    float *tensor_scale;
    uint64_t *counts;
} dw_quant_dev_out;

/* Tuning of the ring kernels, for benchmarks and tests; 0 in a field = the built-in choice.
 * BF16 input quantised to mxfp8, mxfp8_e5m2 or fp8_block: with the transposed copy, in whole
 * 128x128 tiles, the bulk-copy tile kernel (quant_bulk.cu); row-wise only with cols a multiple of
 * the block, the bulk-copy ring too (both measured faster on the H200: bench/RESULTS.md). Other
 * transposed copies, fp8_block2d and ragged shapes: the cp.async tile kernel; other row-wise
 * cases: the flat grid-stride kernel (quant_kernels.cuh).
 *   kernel       1: never the bulk-copy kernels (the older kernels instead, for A/B); 2: the
 *                default (kept for scripts that name it)
 *   stages       buffers in the shared-memory ring, 2..6: bulk 32 KiB (33 KiB transposed with
 *                staged in place; default 3 row-wise; transposed 2 with t_store 1 or 5 (the
 *                default), fp8_block with 4, or 3 CTAs per SM; 4 for MX with t_store 3 or 4,
 *                else 3), cp.async one tile (default 2 for BF16, 3 for FP32); a ring that does
 *                not fit is DW_ERR_UNSUPPORTED (t_store 5, the default: at most 5)
 *   ctas_per_sm  at most this many CTAs per SM (default: bulk 2, cp.async as many as fit); 3 or
 *                more takes the bulk transposing kernel built for 3 (72 registers)
 *   max_ctas     at most this many CTAs in all (tests use it to make each CTA loop over many tiles)
 *   t_store      how the codes of a transposing tile kernel leave. cp.async kernel, transposed
 *                8-bit codes: 1 from registers (32 bytes per thread), 2 or 3 (default) through
 *                shared memory as whole rows. Bulk kernel, both copies' codes and scales: 1 from
 *                registers (8-byte stores, scales one at a time), 2 staged in shared memory and
 *                written by bulk copies (one 128-byte row each), 3 staged and written by 16-byte
 *                stores, 4 staged over the tile's ring buffer and written by tensor stores, 5
 *                (default) the same from a staging buffer of the CTA's own (with tile_block 1
 *                by default); 2..5 need 16-byte aligned outputs (else
 *                1), 4 and 5 a tensor map of the codes (else 3)
 *   load         bulk transposing kernel, how a tile arrives: 1 as 128 row copies, 2 (default) as
 *                one tensor-map copy (row copies where the driver cannot make the map)
 *   group        bulk transposing kernel with tile blocks of 1, tile order: bands of `group` tile
 *                rows (1..64), taken column by column within a band; 1 (default) is row by row
 *   tile_block   bulk transposing kernel: a CTA takes blocks of tile_block x tile_block tiles
 *                (1, 2 or 4) and writes their scales as runs of 4 tile_block bytes per row
 *                instead of 4 bytes per tile; default the largest that leaves no CTA more tiles
 *                than blocks of 1; always 1 with a swizzled scale copy
 * Process-wide, not thread-safe; NULL restores the defaults. DW_ERR_INVALID for values out of range. */
typedef struct {
    int stages, ctas_per_sm, max_ctas, t_store, kernel, load, group, tile_block;
} dw_quant_tuning;
dw_status dw_quantize_cuda_set_tuning(dw_ctx *ctx, const dw_quant_tuning *t);

/* Device scratch the call needs (0 for the recipes whose scales are per block). */
size_t dw_quantize_cuda_workspace_bytes(dw_recipe r, int64_t rows, int64_t cols);

/* Whether dw_quantize_cuda can write the transposed copy alone (out NULL): BF16 input, mxfp8,
 * mxfp8_e5m2 or fp8_block, whole 128x128 tiles, and the bulk-copy kernels not tuned away (a
 * wgrad reads only x^T; the row-wise copy would be written for nobody). The call also needs a
 * 16-byte aligned x and 8-byte aligned codes. */
bool dw_quantize_cuda_transposed_only_ok(dw_recipe r, dw_quant_in in, int64_t rows, int64_t cols);

/* Quantises x [rows, cols] (device, FP32 or BF16 codes, row-major) with o's recipe into `out`,
 * and, when out_t is not NULL, x^T [cols, rows] into out_t in the same pass; out NULL: the
 * transposed copy alone (dw_quantize_cuda_transposed_only_ok, else DW_ERR_UNSUPPORTED). `workspace`: device
 * memory of dw_quantize_cuda_workspace_bytes (may be NULL when that is 0). Asynchronous on
 * `stream` (a cudaStream_t; NULL = the legacy default stream). Errors: DW_ERR_INVALID for bad
 * arguments, DW_ERR_UNSUPPORTED for the BF16 recipe, DW_ERR_CUDA for launch failures. */
dw_status dw_quantize_cuda(dw_ctx *ctx, const dw_quant_opts *o, dw_quant_in in, const void *x,
                           int64_t rows, int64_t cols, const dw_quant_dev_out *out,
                           const dw_quant_dev_out *out_t, void *workspace, void *stream);

/* dw_quantize_cuda of an fp8_tensor operand under delayed scaling (precision/amax_rules.h): the
 * scale from the history amax_h (device memory, DW_AMAX_WORDS(N) words) instead of x's own amax,
 * x's amax noted in it with amax_record, all in stream order (no host sync). amax_h NULL: exactly
 * dw_quantize_cuda; another recipe with a history: DW_ERR_INVALID. */
dw_status dw_quantize_cuda_amax(dw_ctx *ctx, const dw_quant_opts *o, dw_quant_in in, const void *x,
                                int64_t rows, int64_t cols, const dw_quant_dev_out *out,
                                const dw_quant_dev_out *out_t, void *workspace, void *stream,
                                uint32_t *amax_h, bool amax_record);

#ifdef __cplusplus
}
#endif

#endif /* DW_KERNELS_CUDA_QUANT_H */
