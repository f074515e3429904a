/* grouped.h — private: the grouped GEMM kind of the kernel registry (grouped_registry.c) as the
 * compiler, the runtime and the CUDA entry ask it, and the built-in grouped kernels
 * (grouped_kernels.c). Registering is public (dw_grouped_kernel_register in deepwell.h). */
#ifndef DW_GEMM_GROUPED_H
#define DW_GEMM_GROUPED_H

#include <stdbool.h>
#include <stddef.h>

#include "deepwell.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The kernel the registry selects for a on `device` with compute capability sm x10 (0 on the
 * CPU), by priority, or NULL when none is eligible. log (may be NULL) gets one line per
 * registered grouped kernel: eligible, or rejected and why. Pointers in a are only checked for
 * alignment (the compiler passes aligned placeholders). No context needed. */
const char *dw_grouped_registry_pick(dw_device_kind device, int sm, const dw_grouped_args *a, char *log, size_t logn);

/* The problem's own checks (pass, dtype, sizes, the pointers a pass reads); DW_ERR_INVALID naming
 * the field. */
dw_status dw_grouped_validate(dw_ctx *ctx, const dw_grouped_args *a);

/* The built-in grouped kernels (static storage) in registration order; n returned. */
int dw_grouped_builtin_kernels(const dw_grouped_kernel_desc **out, int cap);
/* The host offsets of a on a CPU context: 0 first, non-decreasing, at most rows (DW_ERR_INVALID
 * naming the first bad one). */
dw_status dw_grouped_check_host_offsets(dw_ctx *ctx, const dw_grouped_args *a);
/* Which built-in CUDA kernel d is: 1 FP32-FMA tiles, 2 mma.sync, 3 wgmma (the values of
 * kernels/cuda's dw_moe_kernel), 0 for any other entry. */
int dw_grouped_builtin_cuda_id(const dw_grouped_kernel_desc *d);
/* Built-in CUDA kernel `id` (as dw_grouped_builtin_cuda_id numbers it) on a BF16 wgrad written over
 * (a->overwrite), also writing the sums of squares of dW's 64x128 blocks into sumsq (device;
 * kernels/cuda/ops_cuda.h's dw_moe_sumsq_parts doubles). */
dw_status dw_grouped_builtin_run_sumsq(dw_ctx *ctx, const dw_grouped_args *a, int id, double *sumsq);
/* dw_grouped_gemm (validated, the kernel a->backend names or the registry's choice) for a wgrad
 * written over that also wants dW's 64x128 blocks' sums of squares in sumsq (NULL: none): a
 * built-in CUDA kernel writes them as it stores dW and *written is true; another kernel leaves
 * them to the caller (*written false). */
dw_status dw_grouped_gemm_sumsq(dw_ctx *ctx, const dw_grouped_args *a, double *sumsq, bool *written);
/* For kernels/cuda's grouped entry asked for its automatic choice: the built-in CUDA kernel (as
 * dw_grouped_builtin_cuda_id numbers it) the registry selects for a on sm among the built-in
 * CUDA entries; 0 when none is eligible. */
int dw_grouped_builtin_pick(int sm, const dw_grouped_args *a);

#ifdef __cplusplus
}
#endif

#endif /* DW_GEMM_GROUPED_H */
