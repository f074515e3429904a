/* safetensors_quant.h — private: quantising a safetensors checkpoint into the on-disk layout of
 * shared/FORMATS.md (NAME, NAME.scale, NAME.scale_2) with the formats CPU reference, and the
 * error statistics `deepwell quant-report` prints, behind deepwell.h's dw_quantize_file,
 * dw_quant_error and dw_quant_report. Not the reader/writer (safetensors.h) nor the numerics
 * (formats.h). */
#ifndef DW_IO_SAFETENSORS_QUANT_H
#define DW_IO_SAFETENSORS_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "formats/formats.h"
#include "io/safetensors.h"

/* Whether recipe r applies to t: dtype F32, BF16 or F16; 2-D [R, C] or 1-D [C] (seen as [1, C]);
 * R, C > 0; C a multiple of the recipe's block columns and R of its block rows (fp8_block2d).
 * On true, *rows and *cols are the 2-D view; on false, *why says why (static string). */
bool dw_stq_qualifies(const dw_st_tensor *t, dw_recipe r, int64_t *rows, int64_t *cols,
                      const char **why);

/* Adds the elements of x and y [rows, cols] (q the quantised tensor behind y) to s, a full
 * dw_quant_stats (deepwell.h). */
void dw_stq_stats_add(dw_quant_stats *s, const dw_qtensor *q, const float *x, const float *y);

/* Quantises x [rows, cols] into a freshly allocated q (free with dw_stq_free), and optionally
 * dequantises into y [rows, cols] (caller-owned, may be NULL). */
dw_status dw_stq_quantize(dw_ctx *ctx, const dw_quant_opts *o, const float *x, int64_t rows,
                          int64_t cols, dw_qtensor *q, float *y);
void dw_stq_free(dw_qtensor *q);

/* The public view of a tensor for callbacks (points into t, valid while its file is open). */
dw_st_tensor_info dw_stq_tensor_info(const dw_st_tensor *t);

#endif /* DW_IO_SAFETENSORS_QUANT_H */
