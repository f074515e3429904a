/* quant_stats.c — quantisation error of one GEMM operand (quant_stats.h): the operand in the
 * quantised layout (x, or a transposed copy), the reference quantiser and its exact
 * dequantisation (io/safetensors_quant.c's helpers, so the counts mean what quant-report's do),
 * then the bulk sums without each block's largest element. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
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

/* The whole operand: x [rows, cols], or (trans) x^T, quantised and its sums added to *s. */
static dw_status measure_all(dw_ctx *ctx, dw_recipe r, const float *x, int64_t rows, int64_t cols, bool trans,
                             dw_qstats *s) {
    const int64_t R = trans ? cols : rows, C = trans ? rows : cols, n = rows * cols;
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

/* Block row of the quantised layout [R, C] (rows of BR) holding the first element of largest
 * magnitude (NaN skipped), in layout order; x is [rows, cols], the layout x or (trans) x^T. */
static int64_t amax_group(const float *x, int64_t rows, int64_t cols, bool trans, int64_t BR) {
    int64_t best = 0, at = -1;
    double most = -1;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            const double v = fabs((double)x[i * cols + j]);
            const int64_t lr = trans ? j : i, pos = trans ? j * rows + i : i * cols + j; /* layout row, index */
            if (v > most || (v == most && pos < at)) most = v, at = pos, best = lr / BR;
        }
    return best;
}

int64_t dw_qstats_sample_size(dw_recipe r, int64_t R, int64_t C, int64_t cap, int64_t *group_rows) {
    int br;
    dw_recipe_block(r, &br, NULL);
    const int64_t BR = br > 0 ? br : 1, G = (R + BR - 1) / BR, per = BR * C;
    *group_rows = BR;
    if (cap <= 0 || R * C <= cap || G <= 1) return 0;
    const int64_t k = cap / per < 1 ? 1 : cap / per;
    return k >= G ? 0 : k;
}

void dw_qstats_sample_place(int64_t k, int64_t G, int64_t a, int64_t *group) {
    for (int64_t i = 0; i < k; i++) group[i] = i * G / k;
    int64_t i = k - 1;
    while (i > 0 && group[i] > a) i--; /* the slot whose stretch holds a */
    group[i] = a;
}

int64_t dw_qstats_sample(dw_recipe r, const float *x, int64_t rows, int64_t cols, bool trans, int64_t cap,
                         int64_t *group_rows, int64_t *group) {
    const int64_t R = trans ? cols : rows, C = trans ? rows : cols;
    const int64_t k = dw_qstats_sample_size(r, R, C, cap, group_rows), BR = *group_rows;
    if (k) dw_qstats_sample_place(k, (R + BR - 1) / BR, amax_group(x, rows, cols, trans, BR), group);
    return k;
}

dw_status dw_qstats_measure(dw_ctx *ctx, dw_recipe r, const float *x, int64_t rows, int64_t cols, bool trans,
                            dw_qstats *s) {
    if (r == DW_RECIPE_BF16 || (int)r < 0 || r >= DW_RECIPE_COUNT)
        return dw_set_error(ctx, DW_ERR_INVALID, "quant stats: recipe %d has no quantised form", (int)r);
    if (rows * cols <= 0) return DW_OK;
    s->elements += rows * cols;
    const int64_t R = trans ? cols : rows, C = trans ? rows : cols;
    /* groups the cap can hold, at most R (a cap of INT64_MAX, "none", would overflow the + 1) */
    int64_t BR = 1, cap_groups = s->cap > 0 ? (s->cap / C >= R ? R : s->cap / C + 1) : 0;
    int64_t *group = cap_groups ? malloc((size_t)(cap_groups < R ? cap_groups : R) * sizeof *group) : NULL;
    if (cap_groups && !group) return dw_set_error(ctx, DW_ERR_NOMEM, "quant stats: out of memory");
    const int64_t k = group ? dw_qstats_sample(r, x, rows, cols, trans, s->cap, &BR, group) : 0;
    if (!k) {
        free(group);
        return measure_all(ctx, r, x, rows, cols, trans, s);
    }
    int64_t m = 0; /* the sampled rows of the layout, gathered: sub [m, C] */
    for (int64_t i = 0; i < k; i++) m += (group[i] + 1) * BR <= R ? BR : R - group[i] * BR;
    float *sub = malloc((size_t)(m * C) * sizeof *sub);
    if (!sub) {
        free(group);
        return dw_set_error(ctx, DW_ERR_NOMEM, "quant stats: out of memory");
    }
    float *o = sub;
    for (int64_t i = 0; i < k; i++)
        for (int64_t a = group[i] * BR; a < (group[i] + 1) * BR && a < R; a++, o += C)
            for (int64_t b = 0; b < C; b++) o[b] = trans ? x[b * cols + a] : x[a * cols + b];
    const dw_status st = measure_all(ctx, r, sub, m, C, false, s);
    free(sub);
    free(group);
    return st;
}

double dw_qstats_rel_error(const dw_qstats *s) { return dw_quant_stats_rel_err(&s->q); }
double dw_qstats_bulk_error(const dw_qstats *s) { return s->bulk_x2 > 0 ? sqrt(s->bulk_e2 / s->bulk_x2) : 0.0; }

double dw_qstats_default_threshold(dw_recipe r) {
    if (r == DW_RECIPE_BF16 || (int)r < 0 || r >= DW_RECIPE_COUNT) return 0.0;
    return dw_recipe_elem_bits(r) == 4 ? 0.25 : 0.1;
}

bool dw_qstats_on_device(void) { return dw_env_flag("DW_QCHECK_DEVICE", true); }
