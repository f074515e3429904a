/* quant_counts.c — the counters' slots and the CPU count (quant_counts.h): q dequantised exactly
 * by the FORMATS.md reference (formats/recipe.c), then each element tested with the header's two
 * definitions against the value the quantiser read. The CUDA count is quant_counts.cu. */
#include "precision/quant_counts.h"

uint64_t *dw_qcounts_slot(const dw_qcounts *c, int node, dw_qc_kind k) {
    if (!c || c->slot[node] < 0) return NULL;
    return c->dev + ((int64_t)c->slot[node] * DW_QC_KINDS + k) * DW_QC_WORDS;
}

dw_qstats *dw_qcounts_dy(const dw_qcounts *c, int node) {
    if (!c || !c->measure_dy || c->slot[node] < 0) return NULL;
    return c->dy + 2 * c->slot[node];
}

void dw_qcounts_add_cpu(const dw_qtensor *q, const float *v, bool trans, float *y, uint64_t *cnt) {
    const int64_t R = q->rows, C = q->cols;
    const bool fp4 = dw_recipe_elem_bits(q->recipe) == 4;
    const int64_t row_bytes = dw_quant_row_bytes(q->recipe, C);
    unsigned mask, top;
    double ratio;
    dw_qc_top(dw_recipe_elem_bits(q->recipe), q->recipe == DW_RECIPE_MXFP8_E5M2, &mask, &top, &ratio);
    dw_dequantize_cpu(q, y);
    uint64_t over = 0, under = 0;
#pragma omp parallel for schedule(static) reduction(+ : over, under)
    for (int64_t i = 0; i < R; i++)
        for (int64_t j = 0; j < C; j++) {
            const float x = trans ? v[j * R + i] : v[i * C + j], yv = y[i * C + j];
            if (!isfinite(x) || !isfinite(yv)) continue;
            const unsigned code = fp4 ? (q->codes[i * row_bytes + j / 2] >> (4 * (j & 1))) & 0xFu : q->codes[i * C + j];
            over += dw_qc_overflow(code, mask, top, ratio, x, yv);
            under += dw_qc_underflow(x, yv);
        }
    cnt[DW_QC_OVER] += over;
    cnt[DW_QC_UNDER] += under;
    cnt[DW_QC_N] += (uint64_t)(R * C);
}
