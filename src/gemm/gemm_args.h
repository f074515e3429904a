/* gemm_args.h — private: checks and exact reads of a GEMM call's arguments (dw_gemm_args in
 * deepwell.h): validation that names the bad field, operand byte counts, and one element of an
 * operand dequantised exactly. The bottom of src/gemm/: calls nothing else of the GEMM layer. */
#ifndef DW_GEMM_GEMM_ARGS_H
#define DW_GEMM_GEMM_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include "deepwell.h"

/* Checks shapes, pointers, recipes and flags of args (naming the bad field). */
dw_status dw_gemm_validate(dw_ctx *ctx, const dw_gemm_args *args);
/* Element (i, j) of op(X), dequantised exactly in double (codes x scales x tensor scale).
 * Host pointers only. */
double dw_gemm_operand_at(const dw_gemm_operand *x, int64_t i, int64_t j);
/* Bytes of the data / scale arrays of an operand. */
size_t dw_gemm_operand_data_bytes(const dw_gemm_operand *x);
size_t dw_gemm_operand_scale_bytes(const dw_gemm_operand *x);

#endif /* DW_GEMM_GEMM_ARGS_H */
