/* layout.c — CPU reference of the layouts around a quantised tensor: the transposed (column-wise)
 * quantised copy that backward GEMMs need, and cuBLAS's 128x4 tiled layout of 1-byte block scales
 * (Blackwell VEC32_UE8M0 / VEC16_UE4M3). Plain loops; the oracle for kernels/cuda/quant*. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "formats/formats.h"

dw_status dw_quantize_transposed_cpu(dw_ctx *ctx, const dw_quant_opts *o, const float *x,
                                     int64_t rows, int64_t cols, dw_qtensor *qt) {
    if (!x || rows <= 0 || cols <= 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "quantize (transposed): bad input [%lld, %lld]",
                            (long long)rows, (long long)cols);
    float *xt = malloc((size_t)(rows * cols) * sizeof *xt); /* [cols, rows] */
    if (!xt)
        return dw_set_error(ctx, DW_ERR_NOMEM, "quantize (transposed): out of memory for [%lld, %lld]",
                            (long long)rows, (long long)cols);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) xt[j * rows + i] = x[i * cols + j];
    dw_status s = dw_quantize_cpu(ctx, o, xt, cols, rows, qt);
    free(xt);
    return s;
}

static int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

size_t dw_scale_swizzled_bytes(int64_t srows, int64_t scols) {
    return (size_t)(round_up(srows, 128) * round_up(scols, 4));
}

int64_t dw_scale_swizzle_offset(int64_t r, int64_t c, int64_t scols) {
    int64_t tiles_per_row = round_up(scols, 4) / 4;
    int64_t tile = (r / 128) * tiles_per_row + c / 4;
    int64_t rr = r % 128;
    return tile * 512 + (rr % 32) * 16 + (rr / 32) * 4 + c % 4;
}

void dw_scale_swizzle_cpu(const uint8_t *scales, int64_t srows, int64_t scols, uint8_t *out) {
    memset(out, 0, dw_scale_swizzled_bytes(srows, scols));
    for (int64_t r = 0; r < srows; r++)
        for (int64_t c = 0; c < scols; c++)
            out[dw_scale_swizzle_offset(r, c, scols)] = scales[r * scols + c];
}
