/* nvfp4_train_cpu.c — CPU reference of the NVFP4 training recipe's quantiser (nvfp4_train_cpu.h):
 * build the view (x or x^T, 16-point RHT of each whole block), take the tensor scale from its
 * amax, then FORMATS.md's block rule per 1x16 or 16x16 block with RNE or stochastic rounding.
 * Plain loops, one block at a time, exactly as written. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/nvfp4_train_cpu.h"

void dw_nvfp4_view_cpu(const dw_nvfp4_qopts *o, const float *x, int64_t rows, int64_t cols, float *v) {
    const int64_t R = o->trans ? cols : rows, C = o->trans ? rows : cols;
    for (int64_t i = 0; i < R; i++)
        for (int64_t j = 0; j < C; j++) v[i * C + j] = o->trans ? x[j * cols + i] : x[i * cols + j];
    if (!o->rht) return;
    const uint32_t signs = dw_nvfp4_rht_signs(o->seed);
    for (int64_t i = 0; i < R; i++)
        for (int64_t j = 0; j + DW_NVFP4_BLOCK <= C; j += DW_NVFP4_BLOCK) dw_nvfp4_rht16(&v[i * C + j], signs);
}

static uint32_t amax_bits(const float *v, int64_t C, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    uint32_t m = 0;
    for (int64_t i = r0; i < r1; i++)
        for (int64_t j = c0; j < c1; j++) {
            uint32_t a = dw_rule_f2u(v[i * C + j]) & 0x7FFFFFFFu;
            if (a > m) m = a;
        }
    return m;
}

/* One block [r0, r1) x [c0, c1) of the view: its scale code into every row's scale cell, codes. */
static void quantize_block(const dw_nvfp4_qopts *o, const float *v, int64_t C, int64_t r0, int64_t r1,
                           int64_t c0, int64_t c1, dw_qtensor *q) {
    float d;
    const uint32_t b = dw_nvfp4_block_scale(amax_bits(v, C, r0, r1, c0, c1), q->tensor_scale, &d);
    const int64_t scols = (C + DW_NVFP4_BLOCK - 1) / DW_NVFP4_BLOCK, rb = dw_quant_row_bytes(DW_RECIPE_NVFP4, C);
    for (int64_t i = r0; i < r1; i++) {
        ((uint8_t *)q->scales)[i * scols + c0 / DW_NVFP4_BLOCK] = (uint8_t)b;
        for (int64_t j = c0; j < c1; j++) {
            const uint64_t idx = (uint64_t)(i * C + j);
            const uint32_t bits = o->sr ? dw_nvfp4_sr_bits(o->seed, o->stream, o->step, idx) : 0u;
            const uint32_t code = dw_nvfp4_elem_code(v[idx], d, o->sr, bits);
            uint8_t *p = &q->codes[i * rb + j / 2];
            *p = (uint8_t)((j & 1) ? ((*p & 0x0Fu) | (code << 4)) : ((*p & 0xF0u) | code));
        }
    }
}

dw_status dw_nvfp4_quantize_cpu(dw_ctx *ctx, const dw_nvfp4_qopts *o, const float *x, int64_t rows, int64_t cols,
                                dw_qtensor *q) {
    if (!o || !x || !q || !q->codes || !q->scales)
        return dw_set_error(ctx, DW_ERR_INVALID, "nvfp4 quantize: NULL options or buffer");
    if (rows <= 0 || cols <= 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "nvfp4 quantize: bad shape [%lld, %lld]", (long long)rows,
                            (long long)cols);
    if (o->rht && o->block2d)
        return dw_set_error(ctx, DW_ERR_INVALID, "nvfp4 quantize: the Hadamard transform (rht) runs on 1x16 "
                            "blocks, not with 16x16 weight blocks (block2d)");
    const int64_t R = o->trans ? cols : rows, C = o->trans ? rows : cols;
    float *v = malloc((size_t)(rows * cols) * sizeof *v);
    if (!v) return dw_set_error(ctx, DW_ERR_NOMEM, "nvfp4 quantize: out of memory for [%lld, %lld]",
                                (long long)rows, (long long)cols);
    dw_nvfp4_view_cpu(o, x, rows, cols, v);
    q->recipe = DW_RECIPE_NVFP4;
    q->rows = R;
    q->cols = C;
    q->tensor_scale = dw_rule_nvfp4_tensor_scale(amax_bits(v, C, 0, R, 0, C));
    dw_nvfp4_qopts oo = *o;
    if (oo.step_from_scale) oo.step = dw_rule_f2u(q->tensor_scale);
    o = &oo;
    memset(q->codes, 0, dw_quant_codes_bytes(DW_RECIPE_NVFP4, R, C));
    const int64_t br = o->block2d ? DW_NVFP4_BLOCK : 1;
    for (int64_t r0 = 0; r0 < R; r0 += br)
        for (int64_t c0 = 0; c0 < C; c0 += DW_NVFP4_BLOCK) {
            const int64_t r1 = r0 + br < R ? r0 + br : R, c1 = c0 + DW_NVFP4_BLOCK < C ? c0 + DW_NVFP4_BLOCK : C;
            quantize_block(o, v, C, r0, r1, c0, c1, q);
        }
    free(v);
    return DW_OK;
}
