/* safetensors_quant.h — private: quantising a safetensors checkpoint into the on-disk layout of
 * shared/FORMATS.md (NAME, NAME.scale, NAME.scale_2) with the formats CPU reference, and the
 * error statistics `deepwell quant-report` prints. Used by tools/cmd_quantize.c and
 * tools/cmd_quant_report.c. Not the reader/writer (safetensors.h) nor the numerics (formats.h). */
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

/* "rceil" / "floor" (the --scale-rounding flag); false for anything else. */
bool dw_stq_parse_rounding(const char *text, dw_scale_rounding *out);

/* Error of y = dequant(quant(x)) against x, accumulated over tensors. */
typedef struct {
    int64_t n;          /* elements */
    double sum_x2;      /* sum x^2 */
    double sum_e2;      /* sum (x - y)^2 */
    double max_abs;     /* max |x - y| (NaN when any x or y is NaN) */
    int64_t saturated;  /* clipped: code +-max and |x| beyond the rounding boundary above max */
    int64_t flushed;    /* x != 0 but y == 0 */
    int64_t nonfinite;  /* x or y NaN/Inf */
} dw_stq_stats;

/* Adds the elements of x and y [rows, cols] (q the quantised tensor behind y) to s. */
void dw_stq_stats_add(dw_stq_stats *s, const dw_qtensor *q, const float *x, const float *y);
void dw_stq_stats_merge(dw_stq_stats *into, const dw_stq_stats *s);
/* Derived figures: SQNR = 10 log10(sum_x2 / sum_e2) dB (+Inf when exact, NaN when x is all 0),
 * relative error = sqrt(sum_e2 / sum_x2), percentages of n. */
double dw_stq_sqnr_db(const dw_stq_stats *s);
double dw_stq_rel_err(const dw_stq_stats *s);

/* Quantises x [rows, cols] into a freshly allocated q (free with dw_stq_free), and optionally
 * dequantises into y [rows, cols] (caller-owned, may be NULL). */
dw_status dw_stq_quantize(dw_ctx *ctx, const dw_quant_opts *o, const float *x, int64_t rows,
                          int64_t cols, dw_qtensor *q, float *y);
void dw_stq_free(dw_qtensor *q);

/* What dw_stq_quantize_file reports per tensor: quantised (why == NULL) or copied (why says so). */
typedef void (*dw_stq_notify)(void *user, const dw_st_tensor *t, const char *why);

typedef struct {
    int quantized, copied;
    uint64_t in_bytes, out_bytes; /* tensor data */
} dw_stq_file_summary;

/* Reads `in`, quantises every qualifying tensor with o, copies the others unchanged, records the
 * options in __metadata__ (deepwell.recipe, deepwell.scale_rounding, deepwell.pow2; the input's
 * other metadata is kept) and writes `out` atomically. An input that already holds deepwell.recipe
 * metadata, or a NAME.scale / NAME.scale_2 next to a qualifying NAME, is refused (DW_ERR_FORMAT). */
dw_status dw_stq_quantize_file(dw_ctx *ctx, const char *in, const char *out, const dw_quant_opts *o,
                               dw_stq_notify notify, void *user, dw_stq_file_summary *summary);

#endif /* DW_IO_SAFETENSORS_QUANT_H */
