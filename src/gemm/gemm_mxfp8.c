/* gemm_mxfp8.c — registry entries (a table, see kernels.h) and host-side checks of Deepwell's own
 * sm_90a MXFP8 kernel (mxfp8_sm90.cu): Blackwell MXFP8 numerics on Hopper's FP8 wgmma with per-32
 * promotion. Its K-major checks and epilogue fields are shared with gemm_fp8block.c. */
#include <stdio.h>

#include "core/ctx.h"
#include "core/error.h"
#include "gemm/kernels.h"

static bool is_mx8(int32_t r) { return r == DW_RECIPE_MXFP8 || r == DW_RECIPE_MXFP8_E5M2; }

static bool mx_sm90_eligible(const dw_gemm_args *a, void *user, const char **why) {
    (void)user;
    if (!is_mx8(a->a.recipe) || !is_mx8(a->b.recipe)) return *why = "A and B must be mxfp8 or mxfp8_e5m2", false;
    return dw_gemm_sm90_own_eligible(a, 32, why);
}

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "gemm/gemm_cuda.h"

/* The epilogue fields of a, as the own kernels' launchers take them. */
dw_sm90_epi dw_gemm_sm90_epi(const dw_gemm_args *a) {
    return (dw_sm90_epi){.alpha = a->alpha, .beta = a->beta, .c = a->c, .d = a->d,
                         .out_bf16 = a->out_type == DW_GEMM_OUT_BF16,
                         .bias = (a->epilogue & DW_EPI_BIAS) ? a->bias : NULL,
                         .aux = (a->epilogue & DW_EPI_GELU_AUX) ? a->aux : NULL,
                         .gelu = (a->epilogue & DW_EPI_GELU) != 0};
}

static dw_status mx_sm90_run(dw_ctx *ctx, const dw_gemm_args *a, void *user) {
    void *stream = NULL;
    DW_TRY(dw_ctx_stream(ctx, &stream));
    dw_mxfp8_sm90_args p = {
        .a = a->a.data, .b = a->b.data, .sa = a->a.scales, .sb = a->b.scales,
        .m = a->m, .n = a->n, .k = a->k,
        .e5m2_a = a->a.recipe == DW_RECIPE_MXFP8_E5M2, .e5m2_b = a->b.recipe == DW_RECIPE_MXFP8_E5M2,
        .epi = dw_gemm_sm90_epi(a),
        .variant = user ? *(const int *)user : 0,
    };
    DW_CUDA_CHECK(ctx, (cudaError_t)dw_gemm_mxfp8_sm90_launch(&p, stream));
    return DW_OK;
}
#else
static dw_status mx_sm90_run(dw_ctx *ctx, const dw_gemm_args *a, void *user) {
    (void)a, (void)user;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "gemm: this build has no CUDA");
}
#endif

bool dw_gemm_sm90_own_eligible(const dw_gemm_args *a, int64_t kmul, const char **why) {
    static char buf[64];
    if (a->a.trans || !a->b.trans)
        return *why = "needs K-major operands: A stored [m,k], B stored [n,k] (trans_b)", false;
    if (a->k % kmul) {
        snprintf(buf, sizeof buf, "k must be a multiple of %lld (one scale per %lld of K)", (long long)kmul,
                 (long long)kmul);
        return *why = buf, false;
    }
    if (a->m > INT32_MAX || a->n > INT32_MAX || a->k > INT32_MAX) return *why = "dimensions over 2^31", false;
    if (a->epilogue & (DW_EPI_BGRAD | DW_EPI_DGELU))
        return *why = "no bias-gradient or GELU-gradient epilogue in this kernel", false;
    return true;
}

/* The same entries in every build (the compiler plans CUDA programs with the predicates anywhere);
 * variants (see gemm_cuda.h; docs/gemm.md has their measured speeds) pass theirs in user. */
static int variant_db = 1, variant_3wg = 2;
#define MX_SM90(nm, prio, var)                                                                              \
    {.name = nm, .op = DW_KOP_GEMM, .recipe_a = -1, .recipe_b = -1, .device = DW_DEVICE_CUDA, .sm_min = 90, \
     .sm_max = 90, .priority = prio, .eligible = mx_sm90_eligible, .run = mx_sm90_run, .user = var}
static const dw_kernel_desc mx_kernels[] = {
    MX_SM90("deepwell_mxfp8_wgmma_sm90", 30, NULL),
    MX_SM90("deepwell_mxfp8_wgmma_sm90_db", 29, &variant_db),
    MX_SM90("deepwell_mxfp8_wgmma_sm90_3wg", 31, &variant_3wg), /* fastest of the three (docs/gemm.md) */
};
#undef MX_SM90

dw_kernel_table dw_gemm_mxfp8_sm90_kernels(void) {
    return (dw_kernel_table){mx_kernels, (int)(sizeof mx_kernels / sizeof mx_kernels[0])};
}
