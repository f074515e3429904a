/* builtins.h — private: the built-in GEMM kernels, in the order the registry adds them
 * (builtins.c). */
#ifndef DW_GEMM_BUILTINS_H
#define DW_GEMM_BUILTINS_H

#include "deepwell.h"

/* Points out[0..n) at every built-in kernel's descriptor (static storage) in registration order
 * and returns n; DW_ASSERT when more than cap. */
int dw_gemm_builtin_kernels(const dw_kernel_desc **out, int cap);

#endif /* DW_GEMM_BUILTINS_H */
