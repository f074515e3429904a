/* grouped_mxfp8_quant.c — the quantisers of the MXFP8 grouped expert GEMM's operands
 * (grouped_mxfp8.h): the layer's weights along K with W^T's copy along M, the activations and
 * gradients along their rows (fprop, dgrad), and wgrad's transposed copies along each expert's rows,
 * groups padded to 32 — on the CPU (FORMATS.md's mxfp8 through dw_quantize_cpu, rceil: the
 * reference) and on CUDA (dw_quantize_cuda, and kernels/cuda/grouped_mxfp8_quant.cu for the padded
 * copies), bit for bit alike. */
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "core/error.h"
#include "formats/formats.h"
#include "gemm/grouped.h"
#include "gemm/grouped_mxfp8.h"
#include "kernels/cpu/grouped_mxfp8_cpu.h"
#include "kernels/cpu/moe_fp8_cpu.h"

static const dw_quant_opts mx_opts = {.recipe = DW_RECIPE_MXFP8, .rounding = DW_SCALE_RCEIL};

static dw_qtensor mx_tensor(int64_t rows, int64_t cols, uint8_t *codes, uint8_t *scales) {
    return (dw_qtensor){.recipe = DW_RECIPE_MXFP8, .rows = rows, .cols = cols, .codes = codes, .scales = scales,
                        .tensor_scale = 1.0f};
}

int64_t dw_grouped_mxfp8_wgrad_cols(int64_t rows, int64_t experts) { return 32 * (rows / 32 + experts); }

/* ---- CPU ---------------------------------------------------------------------------------------- */
dw_status dw_grouped_mxfp8_quantize_weights_cpu(dw_ctx *ctx, const float *w, int64_t E, int64_t M, int64_t K,
                                                uint8_t *codes, uint8_t *scales, uint8_t *codes_t, uint8_t *scales_t) {
    dw_qtensor q = mx_tensor(E * M, K, codes, scales); /* 1x32 along K: the experts' rows one after another */
    DW_TRY(dw_quantize_cpu(ctx, &mx_opts, w, E * M, K, &q));
    for (int64_t e = 0; e < E; e++) { /* W_e^T [K, M] along M */
        dw_qtensor qt = mx_tensor(K, M, codes_t + e * M * K, scales_t + e * K * (M / 32));
        DW_TRY(dw_quantize_transposed_cpu(ctx, &mx_opts, w + e * M * K, M, K, &qt));
    }
    return DW_OK;
}

dw_status dw_grouped_mxfp8_quantize_rows_cpu(dw_ctx *ctx, const float *x, int64_t R, int64_t C, uint8_t *codes,
                                             uint8_t *scales) {
    dw_qtensor q = mx_tensor(R, C, codes, scales);
    return R ? dw_quantize_cpu(ctx, &mx_opts, x, R, C, &q) : DW_OK;
}

/* Column c of x laid out padded (one row of P values), then quantised as mxfp8 rows. */
dw_status dw_grouped_mxfp8_quantize_cols_cpu(dw_ctx *ctx, const float *x, const int32_t *offsets, int64_t R,
                                             int64_t E, int64_t C, uint8_t *codes_t, uint8_t *scales_t) {
    const dw_grouped_args chk = {.rows = R, .experts = E, .offsets = offsets};
    DW_TRY(dw_grouped_check_host_offsets(ctx, &chk));
    const int64_t P = dw_grouped_mxfp8_wgrad_cols(R, E);
    int64_t *pad = malloc((size_t)(E + 1) * sizeof *pad);
    float *row = malloc((size_t)P * sizeof *row);
    if (!pad || !row) {
        free(pad), free(row);
        return dw_set_error(ctx, DW_ERR_NOMEM, "grouped mxfp8 quantise: out of memory for %lld padded rows",
                            (long long)P);
    }
    dw_cpu_moe_pad_offsets(pad, offsets, E, 32);
    dw_status st = DW_OK;
    for (int64_t c = 0; c < C && st == DW_OK; c++) {
        memset(row, 0, (size_t)P * sizeof *row);
        for (int64_t e = 0; e < E; e++)
            for (int64_t r = offsets[e]; r < offsets[e + 1]; r++) row[pad[e] + r - offsets[e]] = x[r * C + c];
        dw_qtensor q = mx_tensor(1, P, codes_t + c * P, scales_t + c * (P / 32));
        st = dw_quantize_cpu(ctx, &mx_opts, row, 1, P, &q);
    }
    free(pad), free(row);
    return st;
}

/* ---- CUDA --------------------------------------------------------------------------------------- */
#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "kernels/cuda/grouped_mxfp8_cuda.h"
#include "kernels/cuda/quant.h"

static dw_status quantize_cuda(dw_ctx *ctx, const void *x, bool bf16, int64_t rows, int64_t cols,
                               const dw_quant_dev_out *out, const dw_quant_dev_out *out_t) {
    void *stream = NULL;
    DW_TRY(dw_ctx_stream(ctx, &stream));
    return dw_quantize_cuda(ctx, &mx_opts, bf16 ? DW_QUANT_IN_BF16 : DW_QUANT_IN_F32, x, rows, cols, out, out_t, NULL,
                            stream);
}

dw_status dw_grouped_mxfp8_quantize_weights_cuda(dw_ctx *ctx, const float *w, int64_t E, int64_t M, int64_t K,
                                                 uint8_t *codes, uint8_t *scales, uint8_t *codes_t, uint8_t *scales_t) {
    for (int64_t e = 0; e < E; e++) { /* one expert's [M, K] at a time: its rows and its transpose */
        const dw_quant_dev_out q = {.codes = codes + e * M * K, .scales = scales + e * M * (K / 32)};
        const dw_quant_dev_out qt = {.codes = codes_t + e * M * K, .scales = scales_t + e * K * (M / 32)};
        DW_TRY(quantize_cuda(ctx, w + e * M * K, false, M, K, &q, &qt));
    }
    return DW_OK;
}

dw_status dw_grouped_mxfp8_quantize_rows_cuda(dw_ctx *ctx, const void *x, bool bf16, int64_t R, int64_t C,
                                              uint8_t *codes, uint8_t *scales) {
    const dw_quant_dev_out q = {.codes = codes, .scales = scales};
    return R ? quantize_cuda(ctx, x, bf16, R, C, &q, NULL) : DW_OK;
}

dw_status dw_grouped_mxfp8_quantize_cols_cuda(dw_ctx *ctx, const void *x, bool bf16, const int32_t *offsets,
                                              int64_t R, int64_t E, int64_t C, uint8_t *codes_t, uint8_t *scales_t) {
    if (E < 1 || ((uintptr_t)codes_t & 15))
        return dw_set_error(ctx, DW_ERR_INVALID, "grouped mxfp8 quantise (wgrad operand): needs experts >= 1 and "
                            "16-byte aligned codes (experts %lld)", (long long)E);
    void *stream = NULL;
    DW_TRY(dw_ctx_stream(ctx, &stream));
    DW_CUDA_CHECK(ctx, (cudaError_t)dw_moe_mx_quantize_cols(x, bf16, offsets, E, C, dw_grouped_mxfp8_wgrad_cols(R, E),
                                                            codes_t, scales_t, stream));
    return DW_OK;
}
#else
dw_status dw_grouped_mxfp8_quantize_weights_cuda(dw_ctx *ctx, const float *w, int64_t E, int64_t M, int64_t K,
                                                 uint8_t *codes, uint8_t *scales, uint8_t *codes_t, uint8_t *scales_t) {
    (void)w, (void)E, (void)M, (void)K, (void)codes, (void)scales, (void)codes_t, (void)scales_t;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "grouped mxfp8 quantise: this build has no CUDA");
}
dw_status dw_grouped_mxfp8_quantize_rows_cuda(dw_ctx *ctx, const void *x, bool bf16, int64_t R, int64_t C,
                                              uint8_t *codes, uint8_t *scales) {
    (void)x, (void)bf16, (void)R, (void)C, (void)codes, (void)scales;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "grouped mxfp8 quantise: this build has no CUDA");
}
dw_status dw_grouped_mxfp8_quantize_cols_cuda(dw_ctx *ctx, const void *x, bool bf16, const int32_t *offsets,
                                              int64_t R, int64_t E, int64_t C, uint8_t *codes_t, uint8_t *scales_t) {
    (void)x, (void)bf16, (void)offsets, (void)R, (void)E, (void)C, (void)codes_t, (void)scales_t;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "grouped mxfp8 quantise: this build has no CUDA");
}
#endif
