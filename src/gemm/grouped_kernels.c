/* grouped_kernels.c — the built-in grouped expert GEMMs as registry entries, each with its
 * eligibility rule stated once, here: the CPU reference (kernels/cpu/moe_cpu.c, FP32, double
 * accumulation), and the CUDA kernels behind kernels/cuda's dw_cuda_moe_gemm: FP32-FMA tiles
 * (ops_moe_gemm.cu), mma.sync (moe_gemm_tc.cu) and TMA + wgmma (moe_gemm_sm90.cu) (the fp8_block
 * ones are grouped_fp8.c's; the registry takes both). The same table
 * in every build (the compiler plans CUDA programs anywhere); without CUDA the CUDA entries' run
 * functions return DW_ERR_UNSUPPORTED. */
#include <stdint.h>
#include <string.h>

#include "core/ctx.h"
#include "core/error.h"
#include "gemm/grouped.h"
#include "kernels/cpu/ops_cpu.h"

/* ---- the CPU reference ------------------------------------------------------------------------ */
dw_status dw_grouped_check_host_offsets(dw_ctx *ctx, const dw_grouped_args *a) {
    const int32_t *off = a->offsets;
    int64_t prev = 0;
    for (int64_t e = 0; e <= a->experts; e++) { /* host offsets: checked before any row is read */
        if (off[e] < prev || off[e] > a->rows || (e == 0 && off[0] != 0))
            return dw_set_error(ctx, DW_ERR_INVALID, "grouped gemm: offsets[%lld] = %d (must start at 0, not decrease "
                                "and stay within rows %lld)", (long long)e, off[e], (long long)a->rows);
        prev = off[e];
    }
    return DW_OK;
}

static dw_status cpu_run(dw_ctx *ctx, const dw_grouped_args *a, void *user) {
    (void)user;
    DW_TRY(dw_grouped_check_host_offsets(ctx, a));
    const int32_t *off = a->offsets;
    const float *x = a->x, *w = a->w, *dy = a->dy;
    if (a->pass == DW_GEMM_FPROP) dw_cpu_moe_linear_fwd(a->out, x, w, off, a->rows, a->experts, a->k, a->m);
    else if (a->pass == DW_GEMM_DGRAD) dw_cpu_moe_linear_bwd(a->out, NULL, dy, NULL, w, off, a->rows, a->experts, a->k, a->m);
    else dw_cpu_moe_linear_wgrad(a->out, dy, x, off, a->rows, a->experts, a->k, a->m, a->overwrite);
    return DW_OK;
}

/* ---- CUDA: the rules of each kernel ---------------------------------------------------------- */
/* The launch grids of the FMA and mma.sync kernels: experts and column tiles in 16-bit grid sizes. */
static bool grid_fits(const dw_grouped_args *a, int64_t tile, const char **why) {
    const int64_t cols = a->pass == DW_GEMM_FPROP ? a->m : a->k;
    if (a->experts > 65535) return *why = "at most 65535 experts (grid.z)", false;
    if ((cols + tile - 1) / tile > 65535) return *why = "too many output column tiles (grid.y)", false;
    return true;
}
static bool simt_eligible(const dw_grouped_args *a, void *user, const char **why) {
    (void)user;
    return grid_fits(a, 64, why);
}
static bool mma_eligible(const dw_grouped_args *a, void *user, const char **why) {
    (void)user;
    return grid_fits(a, 128, why);
}
static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
/* TMA: rows of 16-byte multiples at 16-byte aligned bases; the offsets of up to 1024 experts in
 * shared memory; 32-bit tile coordinates. */
static bool wgmma_eligible(const dw_grouped_args *a, void *user, const char **why) {
    (void)user;
    if (a->k % 8 || a->m % 8) return *why = "K and M must be multiples of 8 (TMA rows of 16 bytes)", false;
    if (a->experts > 1024) return *why = "at most 1024 experts (offsets in shared memory)", false;
    if (a->rows >= (int64_t)1 << 30 || a->experts * a->m >= (int64_t)1 << 31)
        return *why = "rows under 2^30 and experts x M under 2^31 (TMA coordinates)", false;
    if (!aligned16(a->x) || !aligned16(a->w) || !aligned16(a->dy) || !aligned16(a->out))
        return *why = "x, W, dy and out must be 16-byte aligned (TMA)", false;
    return true;
}

/* user: the kernel's number in kernels/cuda's dw_moe_kernel (1 SIMT, 2 MMA, 3 WGMMA) */
static int ids[] = {1, 2, 3};

#if DW_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"

_Static_assert(DW_MOE_KERNEL_SIMT == 1 && DW_MOE_KERNEL_MMA == 2 && DW_MOE_KERNEL_WGMMA == 3,
               "ids[] are dw_moe_kernel values");

/* Built-in kernel `id` on a; sumsq (a wgrad written over, or NULL): dW's 64x128 blocks' sums of
 * squares too (ops_cuda.h's layout). */
static dw_status run_builtin(dw_ctx *ctx, const dw_grouped_args *a, int id, double *sumsq) {
    void *stream = NULL;
    DW_TRY(dw_ctx_stream(ctx, &stream));
    const dw_moe_pass p = a->pass == DW_GEMM_FPROP ? DW_MOE_FPROP : a->pass == DW_GEMM_DGRAD ? DW_MOE_DGRAD : DW_MOE_WGRAD;
    const dw_moe_gemm_args g = {.pass = p, .x = a->x, .w = a->w, .dy = a->dy, .out = a->out, .offsets = a->offsets,
                                .R = a->rows, .E = a->experts, .K = a->k, .M = a->m, .kernel = (dw_moe_kernel)id,
                                .overwrite = p == DW_MOE_WGRAD && a->overwrite, /* wgrad: dW written over */
                                .sumsq = sumsq};
    return dw_cuda_moe_gemm(ctx, a->dtype == DW_GROUPED_BF16 ? DW_ACT_BF16 : DW_ACT_F32, &g, stream);
}
static dw_status cuda_run(dw_ctx *ctx, const dw_grouped_args *a, void *user) {
    return run_builtin(ctx, a, *(const int *)user, NULL);
}
#else
static dw_status run_builtin(dw_ctx *ctx, const dw_grouped_args *a, int id, double *sumsq) {
    (void)a, (void)id, (void)sumsq;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "grouped gemm: this build has no CUDA");
}
static dw_status cuda_run(dw_ctx *ctx, const dw_grouped_args *a, void *user) {
    (void)user;
    return run_builtin(ctx, a, 0, NULL);
}
#endif

/* Priorities: wgmma (persistent, TMA) over mma.sync over the FMA tiles; the CPU has one kernel. */
static const dw_grouped_kernel_desc builtins[] = {
    {.name = "grouped_cpu_reference", .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_BF16, .device = DW_DEVICE_CPU,
     .priority = 0, .run = cpu_run},
    {.name = "grouped_cuda_simt", .dtype = -1, .recipe = DW_RECIPE_BF16, .device = DW_DEVICE_CUDA, .priority = 10,
     .eligible = simt_eligible, .run = cuda_run, .user = &ids[0]},
    {.name = "grouped_mma_sm80", .dtype = DW_GROUPED_BF16, .recipe = DW_RECIPE_BF16, .device = DW_DEVICE_CUDA,
     .sm_min = 80, .priority = 20, .eligible = mma_eligible, .run = cuda_run, .user = &ids[1]},
    {.name = "grouped_wgmma_sm90", .dtype = DW_GROUPED_BF16, .recipe = DW_RECIPE_BF16, .device = DW_DEVICE_CUDA,
     .sm_min = 90, .sm_max = 90, .priority = 30, .eligible = wgmma_eligible, .run = cuda_run, .user = &ids[2]},
};

int dw_grouped_builtin_kernels(const dw_grouped_kernel_desc **out, int cap) {
    const int n = (int)(sizeof builtins / sizeof builtins[0]);
    DW_ASSERT(n <= cap);
    for (int i = 0; i < n; i++) out[i] = &builtins[i];
    return n;
}

int dw_grouped_builtin_cuda_id(const dw_grouped_kernel_desc *d) {
    for (int i = 0; i < 3; i++)
        if (d->run == cuda_run && d->user == &ids[i]) return ids[i];
    return 0;
}

dw_status dw_grouped_builtin_run_sumsq(dw_ctx *ctx, const dw_grouped_args *a, int id, double *sumsq) {
    DW_ASSERT(id >= 1 && id <= 3 && a->pass == DW_GEMM_WGRAD && a->overwrite);
    return run_builtin(ctx, a, id, sumsq);
}
