/* autotune.h — private: the autotune cache the registry consults (autotune.c). Switching it on
 * is public (dw_gemm_set_autotune in deepwell.h). */
#ifndef DW_GEMM_AUTOTUNE_H
#define DW_GEMM_AUTOTUNE_H

#include <stdbool.h>

#include "deepwell.h"

bool dw_gemm_autotune_enabled(void);
/* The remembered winner for args (NULL when none); *ms its time per call. */
const char *dw_gemm_autotune_lookup(dw_ctx *ctx, const dw_gemm_args *args, double *ms);
/* The remembered winner, timing the n candidates now when there is none (runs them on args:
 * they write args->d). NULL when nothing could be timed. */
const char *dw_gemm_autotune_pick(dw_ctx *ctx, const dw_gemm_args *args, const dw_kernel_desc *const *cands, int n);

#endif /* DW_GEMM_AUTOTUNE_H */
