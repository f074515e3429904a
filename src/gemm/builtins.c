/* builtins.c — the list of built-in GEMM kernels the registry starts with: the CPU reference,
 * cuBLASLt, Deepwell's own sm_90a MXFP8 and FP8 block kernels, in that order (the order breaks
 * priority ties: the earliest registered wins). A new kernel file adds its table here. */
#include "gemm/builtins.h"

#include "core/error.h"
#include "gemm/kernels.h"

int dw_gemm_builtin_kernels(const dw_kernel_desc **out, int cap) {
    const dw_kernel_table tables[] = {
        dw_gemm_ref_kernels(),
        dw_gemm_cublaslt_kernels(),
        dw_gemm_mxfp8_sm90_kernels(),
        dw_gemm_fp8block_sm90_kernels(),
    };
    int n = 0;
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
        for (int i = 0; i < tables[t].count; i++) {
            DW_ASSERT(n < cap);
            out[n++] = &tables[t].descs[i];
        }
    return n;
}
