/* nvfp4_cuda.h — private C API of the NVFP4 training recipe's CUDA quantiser (ops_nvfp4.cu): a
 * BF16 or FP32 [rows, cols] tensor on the device, or its transpose, with the 16-point random
 * Hadamard transform, 16x16 weight blocks and stochastic rounding of formats/nvfp4_rules.h, into
 * the nvfp4 layout of formats.h (codes, row-major UE4M3 scales, s_t on the device). Bit-identical
 * to dw_nvfp4_quantize_cpu (kernels/cpu/nvfp4_train_cpu.h). Plain kernels (one thread per block of
 * 16 or 16x16), written for exactness on Hopper, where NVFP4 is emulated; not the Blackwell
 * GEMMs, which consume the result. */
#ifndef DW_KERNELS_CUDA_NVFP4_CUDA_H
#define DW_KERNELS_CUDA_NVFP4_CUDA_H

#include "deepwell.h"
#include "formats/nvfp4_rules.h"
#include "kernels/cuda/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device scratch of a call (the amax partials and the step word), whatever the shape. */
#define DW_NVFP4_CUDA_AMAX_BLOCKS 1024
#define DW_NVFP4_CUDA_WORKSPACE_BYTES ((DW_NVFP4_CUDA_AMAX_BLOCKS + 1) * 4)

/* Quantises x [rows, cols] (device, FP32 or BF16, row-major), or x^T with o->trans, into out
 * (codes, scales and tensor_scale required; scales_swizzled must be NULL). With o->sr and
 * o->step_from_scale the SR step word is the bits of the s_t this call computes, on the device.
 * workspace: DW_NVFP4_CUDA_WORKSPACE_BYTES of device memory. Asynchronous on `stream`.
 * DW_ERR_INVALID names a bad argument (rht with block2d, NULL buffers, bad shape); DW_ERR_CUDA
 * for a failed launch. */
dw_status dw_nvfp4_quantize_cuda(dw_ctx *ctx, const dw_nvfp4_qopts *o, dw_quant_in in, const void *x, int64_t rows,
                                 int64_t cols, const dw_quant_dev_out *out, void *workspace, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* DW_KERNELS_CUDA_NVFP4_CUDA_H */
