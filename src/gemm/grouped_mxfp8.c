/* grouped_mxfp8.c — the MXFP8 grouped expert GEMM in the registry (grouped_mxfp8.h): fprop, dgrad
 * and wgrad on E4M3 codes with a UE8M0 scale per 1x32 along the reduction dimension (wgrad's: the
 * tokens, each expert's rows padded to 32). Each entry's rule is stated once here: the CPU
 * reference (kernels/cpu/moe_cpu.c, grouped_mxfp8_cpu.c: the exact values' products and sums in
 * double) and, on Hopper (and Ampere), the dense mxfp8 recipe's route there — every code x scale
 * dequantised exactly to BF16 (an E4M3 code has 4 significant bits and a UE8M0 scale is a power of
 * two, so the product is a BF16 value unless the scale is below 2^-124 or the product overflows),
 * then the BF16 grouped GEMM (dgrad as an fprop on W^T's copy; wgrad on dy^T and x^T dequantised
 * back into rows). Not run on a GPU yet (tests/gpu/test_grouped_mxfp8.c is the check). */
#include <stdint.h>

#include "core/ctx.h"
#include "core/error.h"
#include "gemm/grouped.h"
#include "gemm/grouped_mxfp8.h"
#include "kernels/cpu/grouped_mxfp8_cpu.h"
#include "kernels/cpu/moe_fp8_cpu.h"

/* ---- the rules ------------------------------------------------------------------------------- */
static bool mx_shape(const dw_grouped_args *a, const char **why) {
    if (a->k % 32 || a->m % 32) return *why = "K and M must be multiples of 32 (one UE8M0 scale per 32)", false;
    return true;
}
static bool cpu_eligible(const dw_grouped_args *a, void *user, const char **why) {
    (void)user;
    return mx_shape(a, why);
}
static bool dequant_eligible(const dw_grouped_args *a, void *user, const char **why) {
    (void)user;
    if (!mx_shape(a, why)) return false;
    const int64_t n = a->pass == DW_GEMM_FPROP ? a->m : a->k;
    if (a->experts > 65535 || (n + 63) / 64 > 65535) return *why = "at most 65535 experts and column tiles", false;
    if (a->pass == DW_GEMM_WGRAD && (a->rows + 31) / 32 > 65535) return *why = "at most 65535 row tiles", false;
    return true;
}

/* ---- the CPU reference ----------------------------------------------------------------------- */
static dw_status cpu_run(dw_ctx *ctx, const dw_grouped_args *a, void *user) {
    (void)user;
    DW_TRY(dw_grouped_check_host_offsets(ctx, a));
    if (a->pass == DW_GEMM_WGRAD) { /* dy^T (m, P) against x^T (k, P), 32-padded per expert */
        dw_cpu_moe_linear_mxfp8_wgrad(a->out, a->dy, dw_grouped_mx_scales(a->dy_scales), a->x,
                                      dw_grouped_mx_scales(a->x_scales), a->offsets, a->experts, a->m, a->k,
                                      dw_grouped_mxfp8_wgrad_cols(a->rows, a->experts), a->overwrite);
        return DW_OK;
    }
    const bool fprop = a->pass == DW_GEMM_FPROP;
    dw_cpu_moe_linear_mxfp8(a->out, fprop ? a->x : a->dy, dw_grouped_mx_scales(fprop ? a->x_scales : a->dy_scales),
                            a->w, dw_grouped_mx_scales(a->w_scales), a->offsets, a->rows, a->experts,
                            fprop ? a->k : a->m, fprop ? a->m : a->k);
    return DW_OK;
}

/* ---- Hopper: exact BF16 dequantisation, then the BF16 grouped GEMM ---------------------------- */
#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "gemm/gemm_cuda.h"
#include "kernels/cuda/grouped_mxfp8_cuda.h"
#include "kernels/cuda/ops_cuda.h"

/* wgrad: dy^T (m, P) and x^T (k, P) dequantised back into BF16 rows dy [R, m], x [R, k] (rows past
 * the groups zero), then the BF16 grouped wgrad dW_e += dy_e^T x_e, FP32 accumulated (overwrite:
 * written over, as the BF16 kernels honour it). */
static dw_status dequant_wgrad(dw_ctx *ctx, const dw_grouped_args *a, cudaStream_t stream) {
    const int64_t R = a->rows, E = a->experts, M = a->m, K = a->k, P = dw_grouped_mxfp8_wgrad_cols(R, E);
    char *buf = NULL; /* pad (E+1) int64, then dy [R, M] and x [R, K] BF16 */
    const size_t pad_bytes = ((size_t)(E + 1) * 8 + 15) & ~(size_t)15;
    DW_CUDA_CHECK(ctx, cudaMallocAsync((void **)&buf, pad_bytes + (size_t)(R * (M + K)) * 2 + 16, stream));
    int64_t *pad = (int64_t *)buf;
    uint16_t *dy = (uint16_t *)(buf + pad_bytes), *x = dy + R * M;
    int err = dw_moe_mx_dequant_cols_bf16(a->dy, dw_grouped_mx_scales(a->dy_scales), a->offsets, R, E, M, P, pad, dy,
                                          stream);
    if (!err)
        err = dw_moe_mx_dequant_cols_bf16(a->x, dw_grouped_mx_scales(a->x_scales), a->offsets, R, E, K, P, pad, x,
                                          stream);
    dw_status s = err ? dw_set_error(ctx, DW_ERR_CUDA, "grouped mxfp8 wgrad: dequantising dy^T, x^T: %s",
                                     cudaGetErrorString((cudaError_t)err))
                      : DW_OK;
    if (s == DW_OK) {
        const dw_moe_gemm_args g = {.pass = DW_MOE_WGRAD, .x = x, .dy = dy, .out = a->out, .offsets = a->offsets,
                                    .R = R, .E = E, .K = K, .M = M, .kernel = DW_MOE_KERNEL_AUTO,
                                    .overwrite = a->overwrite};
        s = dw_cuda_moe_gemm(ctx, DW_ACT_BF16, &g, stream);
    }
    const cudaError_t f = cudaFreeAsync(buf, stream);
    if (s == DW_OK && f != cudaSuccess)
        s = dw_set_error(ctx, DW_ERR_CUDA, "grouped mxfp8 wgrad: cudaFreeAsync: %s", cudaGetErrorString(f));
    return s;
}

/* fprop y = x W^T and dgrad dx = dy (W^T's copy)^T are both "rows times W^T" over L (the reduction)
 * into N columns: the activation [rows, L] and W [experts N, L] dequantised into one stream-ordered
 * buffer, then the BF16 grouped fprop (rows past offsets[experts] zeroed by it). */
static dw_status dequant_run(dw_ctx *ctx, const dw_grouped_args *a, void *user) {
    (void)user;
    void *sp = NULL;
    DW_TRY(dw_ctx_stream(ctx, &sp));
    cudaStream_t stream = sp;
    if (a->pass == DW_GEMM_WGRAD) return dequant_wgrad(ctx, a, stream);
    const bool fprop = a->pass == DW_GEMM_FPROP;
    const int64_t L = fprop ? a->k : a->m, N = fprop ? a->m : a->k, R = a->rows, E = a->experts;
    uint16_t *buf = NULL; /* [R, L] then [E N, L], BF16 */
    DW_CUDA_CHECK(ctx, cudaMallocAsync((void **)&buf, (size_t)((R + E * N) * L) * 2 + 16, stream));
    dw_status s = DW_OK;
    if (R) {
        const int err = dw_gemm_cuda_dequant_bf16(0, 0, fprop ? a->x : a->dy,
                                                  dw_grouped_mx_scales(fprop ? a->x_scales : a->dy_scales), R, L, L,
                                                  L / 32, buf, stream);
        if (err) s = dw_set_error(ctx, DW_ERR_CUDA, "grouped mxfp8: dequantising the rows: %s",
                                  cudaGetErrorString((cudaError_t)err));
    }
    if (s == DW_OK) {
        const int err = dw_gemm_cuda_dequant_bf16(0, 0, a->w, dw_grouped_mx_scales(a->w_scales), E * N, L, L, L / 32,
                                                  buf + R * L, stream);
        if (err) s = dw_set_error(ctx, DW_ERR_CUDA, "grouped mxfp8: dequantising W: %s",
                                  cudaGetErrorString((cudaError_t)err));
    }
    if (s == DW_OK) { /* the BF16 fprop on the built-in CUDA kernel the registry's rules pick (AUTO) */
        const dw_moe_gemm_args g = {.pass = DW_MOE_FPROP, .x = buf, .w = buf + R * L, .out = a->out,
                                    .offsets = a->offsets, .R = R, .E = E, .K = L, .M = N,
                                    .kernel = DW_MOE_KERNEL_AUTO};
        s = dw_cuda_moe_gemm(ctx, DW_ACT_BF16, &g, sp);
    }
    const cudaError_t f = cudaFreeAsync(buf, stream);
    if (s == DW_OK && f != cudaSuccess)
        s = dw_set_error(ctx, DW_ERR_CUDA, "grouped mxfp8: cudaFreeAsync: %s", cudaGetErrorString(f));
    return s;
}
#else
static dw_status dequant_run(dw_ctx *ctx, const dw_grouped_args *a, void *user) {
    (void)a, (void)user;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "grouped gemm: this build has no CUDA");
}
#endif

/* Priorities: as the dense deepwell_mx_dequant_bf16 (40) on sm_80..99; the CPU has one kernel. */
static const dw_grouped_kernel_desc mx_kernels[] = {
    {.name = "grouped_cpu_mxfp8", .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_MXFP8, .device = DW_DEVICE_CPU,
     .priority = 0, .eligible = cpu_eligible, .run = cpu_run},
    {.name = "grouped_mxfp8_dequant_bf16", .dtype = DW_GROUPED_BF16, .recipe = DW_RECIPE_MXFP8,
     .device = DW_DEVICE_CUDA, .sm_min = 80, .sm_max = 99, .priority = 40, .eligible = dequant_eligible,
     .run = dequant_run},
};

int dw_grouped_mxfp8_kernels(const dw_grouped_kernel_desc **out, int cap) {
    const int n = (int)(sizeof mx_kernels / sizeof mx_kernels[0]);
    DW_ASSERT(n <= cap);
    for (int i = 0; i < n; i++) out[i] = &mx_kernels[i];
    return n;
}
