// moe_gemm_stub.cpp — the emulator's stand-in for src/kernels/cuda/moe_gemm_tc.cu, whose inline PTX
// (mma.sync) a host build cannot run. The emulated tests run BF16 on the FMA tiles (simt set); a
// call that reaches the tensor-core path fails loudly. Not linked into Deepwell.
#include "kernels/cuda/moe_gemm_tc.h"

cudaError_t dw_moe_gemm_tc(const dw_moe_gemm_args *, cudaStream_t) { return cudaErrorInvalidConfiguration; }
