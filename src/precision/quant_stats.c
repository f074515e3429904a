/* quant_stats.c — quantisation error of one GEMM operand (quant_stats.h): the operand in the
 * quantised layout (x, or a transposed copy), the reference quantiser and its exact
 * dequantisation (io/safetensors_quant.c's helpers, so the counts mean what quant-report's do),
 * then the bulk sums without each block's largest element. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/safetensors_quant.h"
#include "precision/quant_stats.h"

dw_qstats dw_qstats_zero(void) { return (dw_qstats){.q = {.size = sizeof(dw_quant_stats)}}; }

/* mask [R, C] (x in the quantised layout): 1 at each block's first element of largest magnitude. */
static void mark_block_max(dw_recipe r, const float *x, int64_t R, int64_t C, uint8_t *mask) {
    int br, bc;
    dw_recipe_block(r, &br, &bc);
    const int64_t BR = br ? br : R, BC = bc ? bc : C;
    for (int64_t a0 = 0; a0 < R; a0 += BR)
        for (int64_t b0 = 0; b0 < C; b0 += BC) {
            int64_t best = -1;
            double most = -1;
            for (int64_t a = a0; a < a0 + BR && a < R; a++)
                for (int64_t b = b0; b < b0 + BC && b < C; b++) {
                    const double v = fabs((double)x[a * C + b]);
                    if (isfinite(v) && v > most) most = v, best = a * C + b;
                }
            if (best >= 0) mask[best] = 1;
        }
}

dw_status dw_qstats_measure(dw_ctx *ctx, dw_recipe r, const float *x, int64_t rows, int64_t cols, bool trans,
                            dw_qstats *s) {
    if (r == DW_RECIPE_BF16 || (int)r < 0 || r >= DW_RECIPE_COUNT)
        return dw_set_error(ctx, DW_ERR_INVALID, "quant stats: recipe %d has no quantised form", (int)r);
    const int64_t R = trans ? cols : rows, C = trans ? rows : cols, n = rows * cols;
    if (n <= 0) return DW_OK;
    float *xt = trans ? malloc((size_t)n * sizeof *xt) : NULL, *y = malloc((size_t)n * sizeof *y);
    uint8_t *mask = calloc((size_t)n, 1);
    if ((trans && !xt) || !y || !mask) {
        free(xt), free(y), free(mask);
        return dw_set_error(ctx, DW_ERR_NOMEM, "quant stats: out of memory");
    }
    for (int64_t i = 0; trans && i < rows; i++)
        for (int64_t j = 0; j < cols; j++) xt[j * rows + i] = x[i * cols + j];
    const float *v = trans ? xt : x; /* [R, C] */
    const dw_quant_opts o = {.recipe = r, .rounding = DW_SCALE_RCEIL, .pow2 = false};
    dw_qtensor q;
    dw_status st = dw_stq_quantize(ctx, &o, v, R, C, &q, y);
    if (st == DW_OK) {
        dw_stq_stats_add(&s->q, &q, v, y);
        dw_stq_free(&q);
        mark_block_max(r, v, R, C, mask);
        for (int64_t k = 0; k < n; k++) {
            const double e = (double)y[k] - v[k];
            if (mask[k] || !isfinite(v[k]) || !isfinite(y[k])) continue;
            s->bulk_e2 += e * e;
            s->bulk_x2 += (double)v[k] * v[k];
        }
    }
    free(xt);
    free(y);
    free(mask);
    return st;
}

double dw_qstats_rel_error(const dw_qstats *s) { return dw_quant_stats_rel_err(&s->q); }
double dw_qstats_bulk_error(const dw_qstats *s) { return s->bulk_x2 > 0 ? sqrt(s->bulk_e2 / s->bulk_x2) : 0.0; }

double dw_qstats_default_threshold(dw_recipe r) {
    if (r == DW_RECIPE_BF16 || (int)r < 0 || r >= DW_RECIPE_COUNT) return 0.0;
    return dw_recipe_elem_bits(r) == 4 ? 0.25 : 0.1;
}
