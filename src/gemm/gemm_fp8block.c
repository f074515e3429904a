/* gemm_fp8block.c — registry entries (a table, see kernels.h) and host-side checks of Deepwell's
 * own sm_90a FP8 block-scaled kernel (fp8block_sm90.cu): fp8_block / fp8_block2d operands,
 * K-major, k % 128 == 0. The variants (tile, persistence, partial buffers) are separate entries;
 * docs/gemm.md ranks them. */
#include <stdint.h>

#include "core/ctx.h"
#include "core/error.h"
#include "gemm/kernels.h"

static bool is_blk(int32_t r) { return r == DW_RECIPE_FP8_BLOCK || r == DW_RECIPE_FP8_BLOCK2D; }

static bool fb_eligible(const dw_gemm_args *a, void *user, const char **why) {
    (void)user;
    if (!is_blk(a->a.recipe) || !is_blk(a->b.recipe)) return *why = "A and B must be fp8_block or fp8_block2d", false;
    if (!dw_gemm_sm90_own_eligible(a, 128, why)) return false;
    if (((uintptr_t)a->a.data | (uintptr_t)a->b.data) % 16) return *why = "A and B codes must be 16-byte aligned (TMA)", false;
    if ((uintptr_t)a->d % (a->out_type == DW_GEMM_OUT_BF16 ? 4 : 8))
        return *why = "D must be aligned to two output elements (paired stores)", false;
    return true;
}

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "gemm/gemm_cuda.h"

static dw_status fb_run(dw_ctx *ctx, const dw_gemm_args *a, void *user) {
    void *stream = NULL;
    DW_TRY(dw_ctx_stream(ctx, &stream));
    dw_fp8block_sm90_args p = {
        .a = a->a.data, .b = a->b.data, .sa = a->a.scales, .sb = a->b.scales,
        .a_2d = a->a.recipe == DW_RECIPE_FP8_BLOCK2D, .b_2d = a->b.recipe == DW_RECIPE_FP8_BLOCK2D,
        .m = a->m, .n = a->n, .k = a->k,
        .epi = dw_gemm_sm90_epi(a),
        .variant = user ? *(const int *)user : 0,
    };
    DW_CUDA_CHECK(ctx, (cudaError_t)dw_gemm_fp8block_sm90_launch(&p, stream));
    return DW_OK;
}
#else
static dw_status fb_run(dw_ctx *ctx, const dw_gemm_args *a, void *user) {
    (void)a, (void)user;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "gemm: this build has no CUDA");
}
#endif

/* The same entries in every build (the compiler plans CUDA programs with the predicates anywhere);
 * each variant passes its number (see gemm_cuda.h) in user.
 * All below cublaslt_fp8_sm90 (10), which measured faster at every shape (bench/RESULTS.md
 * "Own FP8 block GEMM, session 4"); among themselves 3wg first (the longest-tested, within the
 * run-to-run spread of the fastest at 8192^3), then the pipelined one, the multicast ones last. */
static int variants[] = {0, 1, 2, 3, 4, 5, 6};
#define FB_SM90(nm, prio, var)                                                                              \
    {.name = nm, .op = DW_KOP_GEMM, .recipe_a = -1, .recipe_b = -1, .device = DW_DEVICE_CUDA, .sm_min = 90, \
     .sm_max = 90, .priority = prio, .eligible = fb_eligible, .run = fb_run, .user = &variants[var]}
static const dw_kernel_desc fb_kernels[] = {
    FB_SM90("deepwell_fp8block_sm90", 5, 0),
    FB_SM90("deepwell_fp8block_sm90_3wg", 8, 1),
    FB_SM90("deepwell_fp8block_sm90_mc", 2, 2),
    FB_SM90("deepwell_fp8block_sm90_3wg_mc", 3, 3),
    FB_SM90("deepwell_fp8block_sm90_pipe", 6, 4),
    FB_SM90("deepwell_fp8block_sm90_n192", 1, 5),
    FB_SM90("deepwell_fp8block_sm90_n192_mc", 0, 6),
};
#undef FB_SM90

dw_kernel_table dw_gemm_fp8block_sm90_kernels(void) {
    return (dw_kernel_table){fb_kernels, (int)(sizeof fb_kernels / sizeof fb_kernels[0])};
}
