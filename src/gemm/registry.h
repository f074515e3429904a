/* registry.h — private: selection from the kernel registry (registry.c). Registering and
 * unregistering are public (dw_kernel_register / dw_kernel_unregister in deepwell.h). */
#ifndef DW_GEMM_REGISTRY_H
#define DW_GEMM_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>

#include "deepwell.h"

/* Fills out with the chosen entry (NULL + DW_ERR_UNSUPPORTED explaining every rejection). With
 * autotuning on and `tune`, a new problem on a CUDA context is timed first (autotune.c). */
dw_status dw_gemm_registry_select(dw_ctx *ctx, const dw_gemm_args *args, bool tune, const dw_kernel_desc **out);

/* The kernel the registry would select for a on `device` with compute capability sm x10 (0 on
 * the CPU), by priority (no autotuning, no context needed: the compiler plans with it), or NULL
 * when no kernel is eligible; then why (may be NULL) names the nearest kernel and its reason.
 * Pointers in a are only checked for alignment. */
const char *dw_gemm_registry_pick(dw_device_kind device, int sm, const dw_gemm_args *a, char *why, size_t why_len);

#endif /* DW_GEMM_REGISTRY_H */
