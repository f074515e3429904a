/* quant.cu — the CUDA quantisation entry point (quant.h): checks its arguments and takes the
 * bulk-copy kernels for BF16 mxfp8 / mxfp8_e5m2 / fp8_block (quant_bulk.cu) where they apply, else
 * the kernels of quant_kernels.cuh (built by quant_in_bf16.cu and quant_in_f32.cu; their launches
 * declared in quant_common.cuh, beside the bulk kernels'), then a counting pass for the copies the
 * kernel taken did not count. Also the process-wide tuning (dw_quantize_cuda_set_tuning). */
#include "kernels/cuda/quant_common.cuh"
#include "precision/quant_counts.h"

namespace {

using namespace dwq;

bool aligned(const void *ptr, size_t a) { return ((uintptr_t)ptr % a) == 0; }

dw_status check_out(dw_ctx *ctx, dw_recipe r, const dw_quant_dev_out *o, const char *which) {
    if (!o->codes || !o->scales)
        return dw_set_error(ctx, DW_ERR_INVALID, "quantize %s: %s output needs codes and scales",
                            dw_recipe_name(r), which);
    if (o->scales_swizzled && dw_recipe_scale_bytes(r) != 1)
        return dw_set_error(ctx, DW_ERR_INVALID,
                            "quantize %s: swizzled scales exist only for 1-byte block scales (mx*, nvfp4)",
                            dw_recipe_name(r));
    if (r == DW_RECIPE_NVFP4 && !o->tensor_scale)
        return dw_set_error(ctx, DW_ERR_INVALID, "quantize nvfp4: %s output needs tensor_scale", which);
    return DW_OK;
}

OutDesc make_desc(dw_recipe r, const dw_quant_dev_out *o, int64_t R, int64_t C) {
    OutDesc d = {};
    if (!o) return d;
    int64_t sr, sc;
    dw_quant_scale_shape(r, R, C, &sr, &sc);
    d.codes = o->codes;
    d.scales = o->scales;
    d.swz = o->scales_swizzled;
    d.tscale = o->tensor_scale;
    d.row_bytes = dw_quant_row_bytes(r, C);
    d.scols = sc;
    d.cnt = (unsigned long long *)o->counts;
    return d;
}

/* The counts of the copies whose kernel did not count them (quant.h): a counting pass each. */
dw_status count_after(dw_ctx *ctx, dw_recipe r, dw_quant_in in, const void *x, int64_t rows, int64_t cols,
                      const dw_quant_dev_out *out, const dw_quant_dev_out *out_t, cudaStream_t st) {
    if (out && out->counts)
        DW_TRY(dw_qcounts_add_cuda(ctx, r, in == DW_QUANT_IN_BF16, x, rows, cols, false, out->codes, out->scales,
                                   out->tensor_scale, out->counts, st));
    if (out_t && out_t->counts)
        DW_TRY(dw_qcounts_add_cuda(ctx, r, in == DW_QUANT_IN_BF16, x, rows, cols, true, out_t->codes, out_t->scales,
                                   out_t->tensor_scale, out_t->counts, st));
    return DW_OK;
}

} /* namespace */

dw_quant_tuning dwq::g_tuning = {};

extern "C" dw_status dw_quantize_cuda_set_tuning(dw_ctx *ctx, const dw_quant_tuning *t) {
    if (!t) {
        g_tuning = dw_quant_tuning{};
        return DW_OK;
    }
    if ((t->stages != 0 && (t->stages < 2 || t->stages > 6)) || t->ctas_per_sm < 0 || t->max_ctas < 0 ||
        t->t_store < 0 || t->t_store > 5 || t->kernel < 0 || t->kernel > 2 || t->load < 0 || t->load > 2 ||
        t->group < 0 || t->group > 64 || (t->tile_block != 0 && t->tile_block != 1 && t->tile_block != 2 && t->tile_block != 4))
        return dw_set_error(ctx, DW_ERR_INVALID, "quantize (cuda): tuning: stages must be 0 or 2..6, CTA counts >= 0, "
                                                 "t_store 0..5, kernel 0..2, load 0..2, group 0..64, tile_block 0, 1, 2 or 4");
    g_tuning = *t;
    return DW_OK;
}

extern "C" size_t dw_quantize_cuda_workspace_bytes(dw_recipe r, int64_t rows, int64_t cols) {
    if (r == DW_RECIPE_FP8_ROW) return (size_t)(1 + rows + cols) * sizeof(uint32_t);
    if (r == DW_RECIPE_FP8_TENSOR || r == DW_RECIPE_NVFP4) return sizeof(uint32_t);
    return 0;
}

extern "C" bool dw_quantize_cuda_transposed_only_ok(dw_recipe r, dw_quant_in in, int64_t rows, int64_t cols) {
    const bool recipe = r == DW_RECIPE_MXFP8 || r == DW_RECIPE_MXFP8_E5M2 || r == DW_RECIPE_FP8_BLOCK;
    return recipe && in == DW_QUANT_IN_BF16 && rows > 0 && cols > 0 && rows % TILE == 0 && cols % TILE == 0 &&
           g_tuning.kernel != 1;
}

extern "C" dw_status dw_quantize_cuda(dw_ctx *ctx, const dw_quant_opts *o, dw_quant_in in, const void *x,
                                      int64_t rows, int64_t cols, const dw_quant_dev_out *out,
                                      const dw_quant_dev_out *out_t, void *workspace, void *stream) {
    return dw_quantize_cuda_amax(ctx, o, in, x, rows, cols, out, out_t, workspace, stream, NULL, false);
}

extern "C" dw_status dw_quantize_cuda_amax(dw_ctx *ctx, const dw_quant_opts *o, dw_quant_in in, const void *x,
                                           int64_t rows, int64_t cols, const dw_quant_dev_out *out,
                                           const dw_quant_dev_out *out_t, void *workspace, void *stream,
                                           uint32_t *amax_h, bool amax_record) {
    if (!o || (int)o->recipe < 0 || o->recipe >= DW_RECIPE_COUNT)
        return dw_set_error(ctx, DW_ERR_INVALID, "quantize (cuda): unknown recipe");
    dw_recipe r = o->recipe;
    if (r == DW_RECIPE_BF16)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "quantize (cuda): bf16 is not a quantised recipe");
    if (rows <= 0 || cols <= 0 || !x || (!out && !out_t) || (in != DW_QUANT_IN_F32 && in != DW_QUANT_IN_BF16))
        return dw_set_error(ctx, DW_ERR_INVALID, "quantize %s (cuda): bad input [%lld, %lld]",
                            dw_recipe_name(r), (long long)rows, (long long)cols);
    if (!out && !dw_quantize_cuda_transposed_only_ok(r, in, rows, cols))
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED,
                            "quantize %s (cuda): the transposed copy alone needs BF16 input, mxfp8, mxfp8_e5m2 "
                            "or fp8_block, and whole 128x128 tiles ([%lld, %lld])",
                            dw_recipe_name(r), (long long)rows, (long long)cols);
    if (out) DW_TRY(check_out(ctx, r, out, "row-wise"));
    if (out_t) DW_TRY(check_out(ctx, r, out_t, "transposed"));
    if (dw_quantize_cuda_workspace_bytes(r, rows, cols) && !workspace)
        return dw_set_error(ctx, DW_ERR_INVALID, "quantize %s (cuda): workspace required", dw_recipe_name(r));
    cudaStream_t st = (cudaStream_t)stream;
    Params p = {};
    p.rows = rows;
    p.cols = cols;
    p.tiles_c = (cols + TILE - 1) / TILE;
    p.vec_in = cols % 8 == 0 && aligned(x, 16);
    p.vec_out = out && cols % 8 == 0 && aligned(out->codes, 8);
    p.vec_out_t = out_t && rows % (dw_recipe_elem_bits(r) == 4 ? 32 : 16) == 0 && aligned(out_t->codes, 16);
    p.t_smem = g_tuning.t_store != 1;
    p.pow2 = o->pow2;
    p.floor_rule = o->rounding == DW_SCALE_FLOOR;
    p.o = make_desc(r, out, rows, cols);
    p.t = make_desc(r, out_t, cols, rows);
    if (amax_h && r != DW_RECIPE_FP8_TENSOR)
        return dw_set_error(ctx, DW_ERR_INVALID, "quantize %s (cuda): an amax history is for fp8_tensor only", dw_recipe_name(r));
    p.amax_h = amax_h;
    p.amax_record = amax_record;
    int64_t sr, sc;
    dw_quant_scale_shape(r, rows, cols, &sr, &sc);
    if (out && out->scales_swizzled)
        DW_CUDA_CHECK(ctx, cudaMemsetAsync(out->scales_swizzled, 0, dw_scale_swizzled_bytes(sr, sc), st));
    if (out_t && out_t->scales_swizzled) {
        dw_quant_scale_shape(r, cols, rows, &sr, &sc);
        DW_CUDA_CHECK(ctx, cudaMemsetAsync(out_t->scales_swizzled, 0, dw_scale_swizzled_bytes(sr, sc), st));
    }
    uint32_t *ws = (uint32_t *)workspace;
    /* the bulk-copy ring kernels where eligible, both ways (kernel 1: the older kernels only) */
    const bool trans = out_t != nullptr, bulk = g_tuning.kernel != 1;
    if (!out && !(bulk && bulk_eligible(r, p, x, trans))) /* only the bulk kernel can leave the rows out */
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "quantize %s (cuda): the transposed copy alone needs a "
                            "16-byte aligned input and 8-byte aligned codes", dw_recipe_name(r));
    bool counted = false;
    if (in == DW_QUANT_IN_BF16 && bulk && bulk_eligible(r, p, x, trans))
        DW_TRY(launch_bulk(ctx, r, (const uint16_t *)x, p, trans,
                           BulkTune{g_tuning.t_store, g_tuning.load, g_tuning.group, g_tuning.tile_block, g_tuning.stages,
                                    g_tuning.ctas_per_sm ? g_tuning.ctas_per_sm : 2, g_tuning.max_ctas},
                           st, &counted));
    else if (in == DW_QUANT_IN_BF16) DW_TRY(launch_bf16(ctx, r, (const uint16_t *)x, p, out_t != nullptr, ws, st, &counted));
    else DW_TRY(launch_f32(ctx, r, (const float *)x, p, out_t != nullptr, ws, st, &counted));
    return counted ? DW_OK : count_after(ctx, r, in, x, rows, cols, out, out_t, st);
}
