/* grouped_fp8.c — the fp8_block grouped expert GEMM in the registry: fprop, dgrad and wgrad on
 * E4M3 operands with DeepSeek-V3's block scales (1x128 along the rows of x and dy, 128x128 per
 * expert for W and W^T's copy; wgrad: 1x128 along each expert's rows of dy^T and x^T, groups
 * padded to 128), each entry's rule stated once here — the CPU reference (kernels/cpu/moe_cpu.c:
 * the same block arithmetic in double) and the sm_90a wgmma kernel
 * (kernels/cuda/moe_gemm_fp8_sm90.cu), offered by default since it passed tests/gpu/test_grouped_fp8.c
 * on an H100 (DW_MOE_FP8=0 withdraws it: the experts' grouped GEMMs stay BF16 under an fp8 policy)
 * — and the quantisers of the operands (grouped_fp8.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "core/env.h"
#include "core/error.h"
#include "formats/formats.h"
#include "gemm/grouped.h"
#include "gemm/grouped_fp8.h"
#include "kernels/cpu/moe_fp8_cpu.h"

/* ---- the rules ------------------------------------------------------------------------------- */
static bool fp8_shape(const dw_grouped_args *a, const char **why) {
    if (a->k % 128 || a->m % 128) return *why = "K and M must be multiples of 128 (128x128 weight blocks)", false;
    return true;
}
static bool cpu_eligible(const dw_grouped_args *a, void *user, const char **why) {
    (void)user;
    return fp8_shape(a, why);
}
static bool aligned(const void *p, uintptr_t n) { return ((uintptr_t)p & (n - 1)) == 0; }
static bool sm90_eligible(const dw_grouped_args *a, void *user, const char **why) {
    (void)user;
    if (!dw_env_flag("DW_MOE_FP8", true)) return *why = "switched off by DW_MOE_FP8=0", false;
    if (!fp8_shape(a, why)) return false;
    if (a->experts > 1024) return *why = "at most 1024 experts (offsets in shared memory)", false;
    if (a->pass == DW_GEMM_WGRAD) { /* dy^T (m, P) and x^T (k, P) */
        if (dw_grouped_fp8_wgrad_cols(a->rows, a->experts) >= (int64_t)1 << 31)
            return *why = "padded rows (rows + 128 experts) under 2^31 (TMA coordinates)", false;
        if (!aligned(a->dy, 16) || !aligned(a->x, 16) || !aligned(a->out, 8))
            return *why = "codes must be 16-byte aligned (TMA), out 8-byte", false;
        return true;
    }
    const int64_t n = a->pass == DW_GEMM_FPROP ? a->m : a->k;
    if (a->rows >= (int64_t)1 << 31 || a->experts * n >= (int64_t)1 << 31)
        return *why = "rows and experts x N under 2^31 (TMA coordinates)", false;
    const void *act = a->pass == DW_GEMM_FPROP ? a->x : a->dy;
    if (!aligned(act, 16) || !aligned(a->w, 16) || !aligned(a->out, 8))
        return *why = "codes must be 16-byte aligned (TMA), out 8-byte", false;
    return true;
}

/* ---- the CPU reference ----------------------------------------------------------------------- */
static dw_status cpu_run(dw_ctx *ctx, const dw_grouped_args *a, void *user) {
    (void)user;
    DW_TRY(dw_grouped_check_host_offsets(ctx, a));
    if (a->pass == DW_GEMM_WGRAD) {
        dw_cpu_moe_linear_fp8_wgrad(a->out, a->dy, a->dy_scales, a->x, a->x_scales, a->offsets, a->experts, a->m,
                                    a->k, dw_grouped_fp8_wgrad_cols(a->rows, a->experts), a->overwrite);
        return DW_OK;
    }
    const bool fprop = a->pass == DW_GEMM_FPROP;
    dw_cpu_moe_linear_fp8(a->out, fprop ? a->x : a->dy, fprop ? a->x_scales : a->dy_scales, a->w, a->w_scales,
                          a->offsets, a->rows, a->experts, fprop ? a->k : a->m, fprop ? a->m : a->k);
    return DW_OK;
}

/* ---- the sm_90a kernel ----------------------------------------------------------------------- */
#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "kernels/cuda/moe_gemm_fp8.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/quant.h"

static dw_status sm90_run(dw_ctx *ctx, const dw_grouped_args *a, void *user) {
    (void)user;
    void *stream = NULL;
    DW_TRY(dw_ctx_stream(ctx, &stream));
    if (a->pass == DW_GEMM_WGRAD) { /* dW (E, m, k) += (overwrite: =) dy^T's codes (m, P) against x^T's (k, P) */
        const dw_moe_fp8_args f = {.a = a->dy, .sa = a->dy_scales, .b = a->x, .sb = a->x_scales, .out = a->out,
                                   .out_f32 = 1, .offsets = a->offsets, .R = a->rows, .E = a->experts, .N = a->k,
                                   .L = dw_grouped_fp8_wgrad_cols(a->rows, a->experts), .wgrad = 1, .M = a->m,
                                   .overwrite = a->overwrite};
        DW_CUDA_CHECK(ctx, (cudaError_t)dw_moe_gemm_fp8_sm90(&f, stream));
        return DW_OK;
    }
    const bool fprop = a->pass == DW_GEMM_FPROP;
    const int64_t N = fprop ? a->m : a->k, L = fprop ? a->k : a->m;
    const dw_act_dtype dt = a->dtype == DW_GROUPED_BF16 ? DW_ACT_BF16 : DW_ACT_F32;
    DW_TRY(dw_cuda_moe_zero_tail(ctx, dt, a->out, a->offsets, a->experts, a->rows, N, stream)); /* rows past the groups */
    const dw_moe_fp8_args f = {.a = fprop ? a->x : a->dy, .sa = fprop ? a->x_scales : a->dy_scales, .b = a->w,
                               .sb = a->w_scales, .out = a->out, .out_f32 = dt == DW_ACT_F32,
                               .offsets = a->offsets, .R = a->rows, .E = a->experts, .N = N, .L = L};
    DW_CUDA_CHECK(ctx, (cudaError_t)dw_moe_gemm_fp8_sm90(&f, stream));
    return DW_OK;
}

static dw_status quantize_cuda(dw_ctx *ctx, dw_recipe r, const void *x, bool bf16, int64_t rows, int64_t cols,
                               const dw_quant_dev_out *out, const dw_quant_dev_out *out_t) {
    void *stream = NULL;
    DW_TRY(dw_ctx_stream(ctx, &stream));
    const dw_quant_opts o = {.recipe = r};
    return dw_quantize_cuda(ctx, &o, bf16 ? DW_QUANT_IN_BF16 : DW_QUANT_IN_F32, x, rows, cols, out, out_t, NULL, stream);
}

dw_status dw_grouped_fp8_quantize_weights_cuda(dw_ctx *ctx, const void *w, bool bf16, int64_t E, int64_t M,
                                               int64_t K, uint8_t *codes, float *scales, uint8_t *codes_t,
                                               float *scales_t) {
    const int64_t blocks = (M / 128) * (K / 128);
    for (int64_t e = 0; e < E; e++) { /* one expert's [M, K] at a time: its own 128x128 blocks and transpose */
        const dw_quant_dev_out q = {.codes = codes + e * M * K, .scales = scales + e * blocks};
        const dw_quant_dev_out qt = {.codes = codes_t + e * M * K, .scales = scales_t + e * blocks};
        DW_TRY(quantize_cuda(ctx, DW_RECIPE_FP8_BLOCK2D, (const char *)w + e * M * K * (bf16 ? 2 : 4), bf16, M, K,
                             &q, &qt));
    }
    return DW_OK;
}

dw_status dw_grouped_fp8_quantize_rows_cuda(dw_ctx *ctx, const void *x, bool bf16, int64_t R, int64_t C,
                                            uint8_t *codes, float *scales) {
    const dw_quant_dev_out q = {.codes = codes, .scales = scales};
    return R ? quantize_cuda(ctx, DW_RECIPE_FP8_BLOCK, x, bf16, R, C, &q, NULL) : DW_OK;
}

dw_status dw_grouped_fp8_quantize_cols_cuda(dw_ctx *ctx, const void *x, bool bf16, const int32_t *offsets, int64_t R,
                                            int64_t E, int64_t C, uint8_t *codes_t, float *scales_t) {
    if (E < 1 || C % 128 || ((uintptr_t)codes_t & 15))
        return dw_set_error(ctx, DW_ERR_INVALID, "grouped fp8 quantise (wgrad operand): needs experts >= 1, columns "
                            "a multiple of 128 and 16-byte aligned codes (experts %lld, columns %lld)", (long long)E,
                            (long long)C);
    void *stream = NULL;
    DW_TRY(dw_ctx_stream(ctx, &stream));
    DW_CUDA_CHECK(ctx, (cudaError_t)dw_moe_fp8_quantize_cols(x, bf16, offsets, R, E, C, dw_grouped_fp8_wgrad_cols(R, E),
                                                             codes_t, scales_t, stream));
    return DW_OK;
}
#else
static dw_status sm90_run(dw_ctx *ctx, const dw_grouped_args *a, void *user) {
    (void)a, (void)user;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "grouped gemm: this build has no CUDA");
}
dw_status dw_grouped_fp8_quantize_weights_cuda(dw_ctx *ctx, const void *w, bool bf16, int64_t E, int64_t M,
                                               int64_t K, uint8_t *codes, float *scales, uint8_t *codes_t,
                                               float *scales_t) {
    (void)w, (void)bf16, (void)E, (void)M, (void)K, (void)codes, (void)scales, (void)codes_t, (void)scales_t;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "grouped fp8 quantise: this build has no CUDA");
}
dw_status dw_grouped_fp8_quantize_rows_cuda(dw_ctx *ctx, const void *x, bool bf16, int64_t R, int64_t C,
                                            uint8_t *codes, float *scales) {
    (void)x, (void)bf16, (void)R, (void)C, (void)codes, (void)scales;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "grouped fp8 quantise: this build has no CUDA");
}
dw_status dw_grouped_fp8_quantize_cols_cuda(dw_ctx *ctx, const void *x, bool bf16, const int32_t *offsets, int64_t R,
                                            int64_t E, int64_t C, uint8_t *codes_t, float *scales_t) {
    (void)x, (void)bf16, (void)offsets, (void)R, (void)E, (void)C, (void)codes_t, (void)scales_t;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "grouped fp8 quantise: this build has no CUDA");
}
#endif

/* ---- CPU quantisers ---------------------------------------------------------------------------- */
dw_status dw_grouped_fp8_quantize_weights_cpu(dw_ctx *ctx, const float *w, int64_t E, int64_t M, int64_t K,
                                              uint8_t *codes, float *scales, uint8_t *codes_t, float *scales_t) {
    const dw_quant_opts o = {.recipe = DW_RECIPE_FP8_BLOCK2D};
    const int64_t blocks = (M / 128) * (K / 128);
    for (int64_t e = 0; e < E; e++) {
        dw_qtensor q = {.recipe = o.recipe, .rows = M, .cols = K, .codes = codes + e * M * K, .scales = scales + e * blocks};
        dw_qtensor qt = {.recipe = o.recipe, .rows = K, .cols = M, .codes = codes_t + e * M * K,
                         .scales = scales_t + e * blocks};
        DW_TRY(dw_quantize_cpu(ctx, &o, w + e * M * K, M, K, &q));
        DW_TRY(dw_quantize_transposed_cpu(ctx, &o, w + e * M * K, M, K, &qt));
    }
    return DW_OK;
}

dw_status dw_grouped_fp8_quantize_rows_cpu(dw_ctx *ctx, const float *x, int64_t R, int64_t C, uint8_t *codes,
                                           float *scales) {
    const dw_quant_opts o = {.recipe = DW_RECIPE_FP8_BLOCK};
    dw_qtensor q = {.recipe = o.recipe, .rows = R, .cols = C, .codes = codes, .scales = scales};
    return R ? dw_quantize_cpu(ctx, &o, x, R, C, &q) : DW_OK;
}

int64_t dw_grouped_fp8_wgrad_cols(int64_t rows, int64_t experts) { return 128 * (rows / 128 + experts); }

/* Column c of x laid out padded (one row of P values), then quantised as fp8_block rows. */
dw_status dw_grouped_fp8_quantize_cols_cpu(dw_ctx *ctx, const float *x, const int32_t *offsets, int64_t R, int64_t E,
                                           int64_t C, uint8_t *codes_t, float *scales_t) {
    const dw_grouped_args chk = {.rows = R, .experts = E, .offsets = offsets};
    DW_TRY(dw_grouped_check_host_offsets(ctx, &chk));
    const int64_t P = dw_grouped_fp8_wgrad_cols(R, E);
    int64_t *pad = malloc((size_t)(E + 1) * sizeof *pad);
    float *row = malloc((size_t)P * sizeof *row);
    if (!pad || !row) {
        free(pad), free(row);
        return dw_set_error(ctx, DW_ERR_NOMEM, "grouped fp8 quantise: out of memory for %lld padded rows", (long long)P);
    }
    dw_cpu_moe_pad_offsets(pad, offsets, E, 128);
    const dw_quant_opts o = {.recipe = DW_RECIPE_FP8_BLOCK};
    dw_status st = DW_OK;
    for (int64_t c = 0; c < C && st == DW_OK; c++) {
        memset(row, 0, (size_t)P * sizeof *row);
        for (int64_t e = 0; e < E; e++)
            for (int64_t r = offsets[e]; r < offsets[e + 1]; r++) row[pad[e] + r - offsets[e]] = x[r * C + c];
        dw_qtensor q = {.recipe = o.recipe, .rows = 1, .cols = P, .codes = codes_t + c * P, .scales = scales_t + c * (P / 128)};
        st = dw_quantize_cpu(ctx, &o, row, 1, P, &q);
    }
    free(pad), free(row);
    return st;
}

/* ---- the entries ------------------------------------------------------------------------------- */
/* The CPU reference computes FP32 outputs; the kernel writes the dtype (BF16 or FP32) it is given. */
static const dw_grouped_kernel_desc fp8_kernels[] = {
    {.name = "grouped_cpu_fp8_block", .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_FP8_BLOCK,
     .device = DW_DEVICE_CPU, .priority = 0, .eligible = cpu_eligible, .run = cpu_run},
    {.name = "grouped_fp8block_sm90", .dtype = -1, .recipe = DW_RECIPE_FP8_BLOCK, .device = DW_DEVICE_CUDA,
     .sm_min = 90, .sm_max = 90, .priority = 40, .eligible = sm90_eligible, .run = sm90_run},
};

int dw_grouped_fp8_kernels(const dw_grouped_kernel_desc **out, int cap) {
    const int n = (int)(sizeof fp8_kernels / sizeof fp8_kernels[0]);
    DW_ASSERT(n <= cap);
    for (int i = 0; i < n; i++) out[i] = &fp8_kernels[i];
    return n;
}
