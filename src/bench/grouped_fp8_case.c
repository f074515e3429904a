/* grouped_fp8_case.c — the fp8_block operands of one `deepwell bench grouped` case
 * (grouped_fp8_case.h): buffers for every pass's codes and scales, W's quantised once, the
 * activation operands' quantised by bench_fp8_quantize through gemm/grouped_fp8.h's quantisers
 * (the CUDA ones on a GPU, stream-ordered, offsets on the device; the CPU's FORMATS.md rules on
 * the CPU). */
#include <stdlib.h>
#include <string.h>

#include "bench/grouped_fp8_case.h"
#include "core/error.h"
#include "gemm/gemm_dev.h"
#include "gemm/grouped_fp8.h"

static dw_status alloc(bench_fp8 *f, int64_t bytes, void **out) {
    if (f->gpu) return dw_gemm_dev_alloc(f->ctx, (size_t)(bytes > 0 ? bytes : 1), out);
    *out = malloc((size_t)(bytes > 0 ? bytes : 1));
    return *out ? DW_OK : dw_set_error(f->ctx, DW_ERR_NOMEM, "bench grouped fp8_block: out of memory for %lld bytes",
                                       (long long)bytes);
}

void bench_fp8_free(bench_fp8 *f) {
    void *all[] = {f->wc, f->wct, f->xc, f->dyc, f->xtc, f->dytc, f->ws, f->wst, f->xs, f->dys, f->xts, f->dyts};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (f->gpu) dw_gemm_dev_free(all[i]);
        else free(all[i]);
    memset(f, 0, sizeof *f);
}

dw_status bench_fp8_make(dw_ctx *ctx, bench_fp8 *f, bool gpu, const void *w, const void *x, const void *dy,
                         int64_t R, int64_t E, int64_t K, int64_t M) {
    memset(f, 0, sizeof *f);
    if (K % 128 || M % 128)
        return dw_set_error(ctx, DW_ERR_INVALID, "bench grouped --recipe fp8_block: k %lld and m %lld must be "
                            "multiples of 128 (128x128 weight blocks)", (long long)K, (long long)M);
    *f = (bench_fp8){.ctx = ctx, .gpu = gpu, .R = R, .E = E, .K = K, .M = M, .P = dw_grouped_fp8_wgrad_cols(R, E),
                     .x = x, .dy = dy};
    const int64_t P = f->P;
    struct {
        void **p;
        int64_t bytes;
    } want[] = {{(void **)&f->wc, E * M * K}, {(void **)&f->wct, E * M * K}, {(void **)&f->ws, E * M * K / 16384 * 4},
                {(void **)&f->wst, E * M * K / 16384 * 4}, {(void **)&f->xc, R * K}, {(void **)&f->xs, R * K / 128 * 4},
                {(void **)&f->dyc, R * M}, {(void **)&f->dys, R * M / 128 * 4}, {(void **)&f->xtc, K * P},
                {(void **)&f->xts, K * P / 128 * 4}, {(void **)&f->dytc, M * P}, {(void **)&f->dyts, M * P / 128 * 4}};
    dw_status st = DW_OK;
    for (size_t i = 0; i < sizeof want / sizeof want[0] && st == DW_OK; i++) st = alloc(f, want[i].bytes, want[i].p);
    if (st == DW_OK)
        st = gpu ? dw_grouped_fp8_quantize_weights_cuda(ctx, w, true, E, M, K, f->wc, f->ws, f->wct, f->wst)
                 : dw_grouped_fp8_quantize_weights_cpu(ctx, w, E, M, K, f->wc, f->ws, f->wct, f->wst);
    if (st != DW_OK) bench_fp8_free(f);
    return st;
}

dw_status bench_fp8_quantize(const bench_fp8 *f, int pass) {
    if (pass != DW_GEMM_WGRAD) { /* x for fprop, dy for dgrad: every row, 1x128 along it */
        const bool fp = pass == DW_GEMM_FPROP;
        const int64_t C = fp ? f->K : f->M;
        uint8_t *c = fp ? f->xc : f->dyc;
        float *s = fp ? f->xs : f->dys;
        return f->gpu ? dw_grouped_fp8_quantize_rows_cuda(f->ctx, fp ? f->x : f->dy, true, f->R, C, c, s)
                      : dw_grouped_fp8_quantize_rows_cpu(f->ctx, fp ? f->x : f->dy, f->R, C, c, s);
    }
    if (f->gpu) { /* dy^T and x^T padded per expert */
        DW_TRY(dw_grouped_fp8_quantize_cols_cuda(f->ctx, f->dy, true, f->off, f->R, f->E, f->M, f->dytc, f->dyts));
        return dw_grouped_fp8_quantize_cols_cuda(f->ctx, f->x, true, f->off, f->R, f->E, f->K, f->xtc, f->xts);
    }
    DW_TRY(dw_grouped_fp8_quantize_cols_cpu(f->ctx, f->dy, f->off, f->R, f->E, f->M, f->dytc, f->dyts));
    return dw_grouped_fp8_quantize_cols_cpu(f->ctx, f->x, f->off, f->R, f->E, f->K, f->xtc, f->xts);
}

dw_grouped_args bench_fp8_args(const bench_fp8 *f, int pass, void *out) {
    dw_grouped_args a = {.pass = pass, .dtype = f->gpu ? DW_GROUPED_BF16 : DW_GROUPED_F32,
                         .recipe = DW_RECIPE_FP8_BLOCK, .rows = f->R, .experts = f->E, .k = f->K, .m = f->M,
                         .offsets = f->off, .out = out};
    if (pass == DW_GEMM_FPROP) a.x = f->xc, a.x_scales = f->xs, a.w = f->wc, a.w_scales = f->ws;
    else if (pass == DW_GEMM_DGRAD) a.dy = f->dyc, a.dy_scales = f->dys, a.w = f->wct, a.w_scales = f->wst;
    else a.dy = f->dytc, a.dy_scales = f->dyts, a.x = f->xtc, a.x_scales = f->xts;
    return a;
}
