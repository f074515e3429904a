/* nvfp4_train_cpu.h — private: CPU reference of the NVFP4 training recipe's quantiser (random
 * Hadamard transform, 16x16 weight blocks, stochastic rounding; formats/nvfp4_rules.h), the oracle
 * of kernels/cuda/ops_nvfp4.cu. With every option off it is dw_quantize_cpu's nvfp4, bit for bit. */
#ifndef DW_KERNELS_CPU_NVFP4_TRAIN_CPU_H
#define DW_KERNELS_CPU_NVFP4_TRAIN_CPU_H

#include "deepwell.h"
#include "formats/formats.h"
#include "formats/nvfp4_rules.h"

/* Quantises x [rows, cols] (FP32), or x^T [cols, rows] with o->trans, to nvfp4 in q (a dw_qtensor
 * sized for the view by formats.h's functions: codes [R, ceil(C/2)], scales [R, ceil(C/16)] UE4M3,
 * tensor_scale s_t = amax of the view (after the transform) / 2688). DW_ERR_INVALID names a bad
 * shape, a NULL buffer or rht with block2d. */
dw_status dw_nvfp4_quantize_cpu(dw_ctx *ctx, const dw_nvfp4_qopts *o, const float *x, int64_t rows, int64_t cols,
                                dw_qtensor *q);

/* The view the quantiser sees: v [R, C] = x or x^T, with each whole 1x16 block transformed when
 * o->rht (v must hold rows * cols floats). For tests: (T a) . (T b) against a . b. */
void dw_nvfp4_view_cpu(const dw_nvfp4_qopts *o, const float *x, int64_t rows, int64_t cols, float *v);

#endif /* DW_KERNELS_CPU_NVFP4_TRAIN_CPU_H */
