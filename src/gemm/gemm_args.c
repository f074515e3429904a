/* gemm_args.c — checks and exact reads of a GEMM call's arguments (see gemm_args.h): validation
 * naming the bad field, operand byte counts, and the exact element access the CPU reference uses. */
#include <math.h>

#include "core/error.h"
#include "formats/formats.h"
#include "gemm/gemm_args.h"

size_t dw_gemm_operand_data_bytes(const dw_gemm_operand *x) {
    return (size_t)x->rows * (size_t)dw_quant_row_bytes((dw_recipe)x->recipe, x->cols);
}

size_t dw_gemm_operand_scale_bytes(const dw_gemm_operand *x) {
    if (x->recipe == DW_RECIPE_BF16) return 0;
    int64_t sr, sc;
    dw_quant_scale_shape((dw_recipe)x->recipe, x->rows, x->cols, &sr, &sc);
    return (size_t)(sr * sc) * (size_t)dw_recipe_scale_bytes((dw_recipe)x->recipe);
}

double dw_gemm_operand_at(const dw_gemm_operand *x, int64_t i, int64_t j) {
    int64_t r = x->trans ? j : i, c = x->trans ? i : j;
    const uint8_t *d = x->data;
    if (x->recipe == DW_RECIPE_BF16) return dw_decode_bf16(((const uint16_t *)x->data)[r * x->cols + c]);
    int64_t sr, sc;
    dw_quant_scale_shape((dw_recipe)x->recipe, x->rows, x->cols, &sr, &sc);
    const float *fs = x->scales;
    const uint8_t *bs = x->scales;
    switch ((dw_recipe)x->recipe) {
    case DW_RECIPE_FP8_TENSOR: return (double)dw_decode_e4m3(d[r * x->cols + c]) * fs[0];
    case DW_RECIPE_FP8_ROW: return (double)dw_decode_e4m3(d[r * x->cols + c]) * fs[r];
    case DW_RECIPE_FP8_BLOCK: return (double)dw_decode_e4m3(d[r * x->cols + c]) * fs[r * sc + c / 128];
    case DW_RECIPE_FP8_BLOCK2D:
        return (double)dw_decode_e4m3(d[r * x->cols + c]) * fs[(r / 128) * sc + c / 128];
    case DW_RECIPE_MXFP8:
        return (double)dw_decode_e4m3(d[r * x->cols + c]) * dw_decode_ue8m0(bs[r * sc + c / 32]);
    case DW_RECIPE_MXFP8_E5M2:
        return (double)dw_decode_e5m2(d[r * x->cols + c]) * dw_decode_ue8m0(bs[r * sc + c / 32]);
    case DW_RECIPE_MXFP4:
    case DW_RECIPE_NVFP4: {
        uint8_t byte = d[r * dw_quant_row_bytes((dw_recipe)x->recipe, x->cols) + c / 2];
        uint8_t code = (c & 1) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 15);
        if (x->recipe == DW_RECIPE_MXFP4)
            return (double)dw_decode_e2m1(code) * dw_decode_ue8m0(bs[r * sc + c / 32]);
        return (double)dw_decode_e2m1(code) * dw_decode_ue4m3(bs[r * sc + c / 16]) *
               (double)(x->tensor_scale_ptr ? *x->tensor_scale_ptr : x->tensor_scale);
    }
    default: return NAN;
    }
}

static dw_status check_operand(dw_ctx *ctx, const char *name, const dw_gemm_operand *x, int64_t want_r,
                               int64_t want_c) {
    if (x->recipe < 0 || x->recipe >= DW_RECIPE_COUNT)
        return dw_set_error(ctx, DW_ERR_INVALID, "gemm: operand %s has unknown recipe %d", name, (int)x->recipe);
    int64_t r = x->trans ? x->cols : x->rows, c = x->trans ? x->rows : x->cols;
    if (r != want_r || c != want_c)
        return dw_set_error(ctx, DW_ERR_INVALID,
                            "gemm: op(%s) is [%lld, %lld] (stored [%lld, %lld]%s) but must be [%lld, %lld]",
                            name, (long long)r, (long long)c, (long long)x->rows, (long long)x->cols,
                            x->trans ? ", transposed" : "", (long long)want_r, (long long)want_c);
    if (!x->data) return dw_set_error(ctx, DW_ERR_INVALID, "gemm: operand %s has no data", name);
    if (x->recipe != DW_RECIPE_BF16 && !x->scales)
        return dw_set_error(ctx, DW_ERR_INVALID, "gemm: operand %s (%s) has no scales", name,
                            dw_recipe_name((dw_recipe)x->recipe));
    return DW_OK;
}

dw_status dw_gemm_validate(dw_ctx *ctx, const dw_gemm_args *a) {
    if (!a) return dw_set_error(ctx, DW_ERR_INVALID, "gemm: args is NULL");
    if (a->m <= 0 || a->n <= 0 || a->k <= 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "gemm: m, n, k must be positive (got %lld, %lld, %lld)",
                            (long long)a->m, (long long)a->n, (long long)a->k);
    DW_TRY(check_operand(ctx, "A", &a->a, a->m, a->k));
    DW_TRY(check_operand(ctx, "B", &a->b, a->k, a->n));
    if (a->out_type != DW_GEMM_OUT_F32 && a->out_type != DW_GEMM_OUT_BF16)
        return dw_set_error(ctx, DW_ERR_INVALID, "gemm: unknown out_type %d", (int)a->out_type);
    if (!a->d) return dw_set_error(ctx, DW_ERR_INVALID, "gemm: output d is NULL");
    if (a->beta != 0.0f && !a->c) return dw_set_error(ctx, DW_ERR_INVALID, "gemm: beta != 0 but c is NULL");
    if (a->epilogue & ~(DW_EPI_BIAS | DW_EPI_GELU | DW_EPI_GELU_AUX | DW_EPI_BGRAD | DW_EPI_DGELU))
        return dw_set_error(ctx, DW_ERR_INVALID, "gemm: unknown epilogue flags 0x%x", (unsigned)a->epilogue);
    if ((a->epilogue & DW_EPI_BIAS) && !a->bias)
        return dw_set_error(ctx, DW_ERR_INVALID, "gemm: epilogue BIAS but bias is NULL");
    if ((a->epilogue & DW_EPI_GELU_AUX) && (!(a->epilogue & DW_EPI_GELU) || !a->aux))
        return dw_set_error(ctx, DW_ERR_INVALID, "gemm: epilogue GELU_AUX needs GELU and an aux buffer");
    if ((a->epilogue & DW_EPI_BGRAD) && !a->bgrad)
        return dw_set_error(ctx, DW_ERR_INVALID, "gemm: epilogue BGRAD but bgrad is NULL");
    if ((a->epilogue & DW_EPI_BGRAD) && (a->epilogue & (DW_EPI_BIAS | DW_EPI_GELU)))
        return dw_set_error(ctx, DW_ERR_INVALID, "gemm: epilogue BGRAD does not combine with BIAS or GELU");
    if ((a->epilogue & DW_EPI_DGELU) && a->epilogue != DW_EPI_DGELU)
        return dw_set_error(ctx, DW_ERR_INVALID, "gemm: epilogue DGELU does not combine with other epilogues");
    if ((a->epilogue & DW_EPI_DGELU) && !a->aux)
        return dw_set_error(ctx, DW_ERR_INVALID, "gemm: epilogue DGELU needs the pre-activation in aux");
    return DW_OK;
}
