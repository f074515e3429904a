/* gemm.c — dw_gemm and dw_gemm_select: validation (gemm_args.c), selection through the registry
 * (registry.c) and dispatch. Kernels live in the backend files beside this one. */
#include "core/error.h"
#include "gemm/gemm_args.h"
#include "gemm/registry.h"

dw_status dw_gemm_select(dw_ctx *ctx, const dw_gemm_args *args, const char **name) {
    *name = NULL;
    DW_TRY(dw_gemm_validate(ctx, args));
    const dw_kernel_desc *k = NULL;
    DW_TRY(dw_gemm_registry_select(ctx, args, false, &k));
    *name = k->name;
    return DW_OK;
}

dw_status dw_gemm(dw_ctx *ctx, const dw_gemm_args *args) {
    DW_TRY(dw_gemm_validate(ctx, args));
    const dw_kernel_desc *k = NULL;
    DW_TRY(dw_gemm_registry_select(ctx, args, true, &k));
    dw_status s = k->run(ctx, args, k->user);
    if (s != DW_OK) return dw_prefix_error(ctx, s, "gemm %lldx%lldx%lld via %s", (long long)args->m,
                                           (long long)args->n, (long long)args->k, k->name);
    return DW_OK;
}
