/* gemm.h — private: the GEMM layer's internals: the registry table, the backends (CPU reference,
 * cuBLASLt, Deepwell's own sm_90a MXFP8 and FP8 block kernels) and the Blackwell scale-layout emulation.
 * Not public: users see dw_gemm / dw_kernel_register in deepwell.h. */
#ifndef DW_GEMM_GEMM_H
#define DW_GEMM_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"
#include "formats/formats.h"

/* ---- validation and operand access --------------------------------------------------------- */
/* Checks shapes, pointers, recipes and flags of args (naming the bad field). */
dw_status dw_gemm_validate(dw_ctx *ctx, const dw_gemm_args *args);
/* Element (i, j) of op(X), dequantised exactly in double (codes x scales x tensor scale).
 * Host pointers only. */
double dw_gemm_operand_at(const dw_gemm_operand *x, int64_t i, int64_t j);
/* Bytes of the data / scale arrays of an operand. */
size_t dw_gemm_operand_data_bytes(const dw_gemm_operand *x);
size_t dw_gemm_operand_scale_bytes(const dw_gemm_operand *x);
/* GELU, tanh approximation, in double. */
double dw_gelu_tanh(double x);
double dw_gelu_tanh_grad(double x); /* d/dx of dw_gelu_tanh */
/* The compute capability x10 of the context's device (0 on a CPU context). */
int dw_gemm_ctx_sm(dw_ctx *ctx);

/* ---- registry ------------------------------------------------------------------------------- */
/* Fills out with the chosen entry (NULL + DW_ERR_UNSUPPORTED explaining every rejection). With
 * autotuning on and `tune`, a new problem on a CUDA context is timed first (autotune.c). */
dw_status dw_gemm_registry_select(dw_ctx *ctx, const dw_gemm_args *args, bool tune, const dw_kernel_desc **out);

/* The kernel the registry would select for a on `device` with compute capability sm x10 (0 on
 * the CPU), by priority (no autotuning, no context needed: the compiler plans with it), or NULL
 * when no kernel is eligible; then why (may be NULL) names the nearest kernel and its reason.
 * Pointers in a are only checked for alignment. */
const char *dw_gemm_registry_pick(dw_device_kind device, int sm, const dw_gemm_args *a, char *why, size_t why_len);

/* ---- autotune cache (autotune.c) ---------------------------------------------------------- */
bool dw_gemm_autotune_enabled(void);
/* The remembered winner for args (NULL when none); *ms its time per call. */
const char *dw_gemm_autotune_lookup(dw_ctx *ctx, const dw_gemm_args *args, double *ms);
/* The remembered winner, timing the n candidates now when there is none (runs them on args:
 * they write args->d). NULL when nothing could be timed. */
const char *dw_gemm_autotune_pick(dw_ctx *ctx, const dw_gemm_args *args, const dw_kernel_desc *const *cands, int n);

/* ---- backends (each registers itself from dw_gemm_register_builtins) ------------------------ */
void dw_gemm_register_builtins(void);
dw_status dw_gemm_ref_run(dw_ctx *ctx, const dw_gemm_args *args, void *user);
void dw_gemm_cublaslt_register(void);   /* no-op without CUDA */
void dw_gemm_mxfp8_sm90_register(void); /* no-op without CUDA */
void dw_gemm_fp8block_sm90_register(void); /* no-op without CUDA */
/* Shared checks of Deepwell's own sm_90a kernels (gemm_mxfp8.c): K-major operands (A [m,k],
 * B [n,k]), k a multiple of kmul, dimensions under 2^31, no BGRAD / DGELU epilogue. */
bool dw_gemm_sm90_own_eligible(const dw_gemm_args *a, int64_t kmul, const char **why);

#endif /* DW_GEMM_GEMM_H */
