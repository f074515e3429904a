/* kernels.h — private: what the built-in GEMM kernel files expose. Each describes its registry
 * entries as a static table (in its own registration order) and registers nothing itself;
 * builtins.c lists the tables, the registry adds them. Also the helpers tests and sibling
 * kernels share. Header only. */
#ifndef DW_GEMM_KERNELS_H
#define DW_GEMM_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"

/* A kernel file's registry entries: count descriptors at descs (static storage). */
typedef struct {
    const dw_kernel_desc *descs;
    int count;
} dw_kernel_table;

/* Every table is the same in every build (the compiler plans CUDA programs with the predicates
 * on any machine); without CUDA the CUDA entries' run functions return DW_ERR_UNSUPPORTED. */
dw_kernel_table dw_gemm_ref_kernels(void);           /* gemm_ref.c: the CPU reference */
dw_kernel_table dw_gemm_cublaslt_kernels(void);      /* gemm_cublaslt.c */
dw_kernel_table dw_gemm_mxfp8_sm90_kernels(void);    /* gemm_mxfp8.c */
dw_kernel_table dw_gemm_fp8block_sm90_kernels(void); /* gemm_fp8block.c */

/* The CPU reference's run function (gemm_ref.c). */
dw_status dw_gemm_ref_run(dw_ctx *ctx, const dw_gemm_args *args, void *user);
/* Shared checks of Deepwell's own sm_90a kernels (gemm_mxfp8.c): K-major operands (A [m,k],
 * B [n,k]), k a multiple of kmul, dimensions under 2^31, no BGRAD / DGELU epilogue. */
bool dw_gemm_sm90_own_eligible(const dw_gemm_args *a, int64_t kmul, const char **why);

#endif /* DW_GEMM_KERNELS_H */
