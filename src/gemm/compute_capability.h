/* compute_capability.h — private: the compute capability of a context's device, as the GEMM
 * registry, autotune cache and compiler compare it with kernels' sm ranges. */
#ifndef DW_GEMM_COMPUTE_CAPABILITY_H
#define DW_GEMM_COMPUTE_CAPABILITY_H

#include "deepwell.h"

/* The compute capability x10 of the context's device (0 on a CPU context). */
int dw_gemm_ctx_sm(dw_ctx *ctx);

#endif /* DW_GEMM_COMPUTE_CAPABILITY_H */
