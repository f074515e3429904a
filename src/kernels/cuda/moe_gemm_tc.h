/* moe_gemm_tc.h — private to kernels/cuda: the BF16 tensor-core grouped expert GEMMs
 * (moe_gemm_tc.cu: mma.sync; moe_gemm_sm90.cu: wgmma), launched by ops_moe_gemm.cu's entry after its checks. Inline PTX: the host
 * emulator (tests/common/cuda_emu) links a stand-in instead and never calls it for BF16 there
 * (its device reports sm 0, where the registry picks the FMA tiles). */
#ifndef DW_KERNELS_MOE_GEMM_TC_H
#define DW_KERNELS_MOE_GEMM_TC_H

#include <cuda_runtime.h>

#include "kernels/cuda/ops_cuda.h"

/* One pass of a checked dw_moe_gemm_args with BF16 x, W, dy (and y, dx); the launch's error. */
cudaError_t dw_moe_gemm_tc(const dw_moe_gemm_args *a, cudaStream_t stream);
/* The same through TMA + wgmma (moe_gemm_sm90.cu); cudaErrorNotSupported, launching nothing, where
 * it cannot run (not an sm_90 device, K or M not a multiple of 8, more than 1024 experts, a
 * pointer not 16-byte aligned). *sumsq_done: whether its epilogue wrote a->sumsq (the TMA
 * epilogue's wgrad; the register epilogue's leaves it to the caller). */
cudaError_t dw_moe_gemm_sm90(const dw_moe_gemm_args *a, cudaStream_t stream, bool *sumsq_done);
/* The current device's compute capability x10 (moe_gemm_sm90.cu; 0 when the runtime cannot say),
 * for the entry's automatic choice through the registry. */
int dw_moe_gemm_device_sm(void);

#endif /* DW_KERNELS_MOE_GEMM_TC_H */
