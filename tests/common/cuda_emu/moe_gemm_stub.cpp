// moe_gemm_stub.cpp — the emulator's stand-in for src/kernels/cuda/moe_gemm_tc.cu and
// moe_gemm_sm90.cu, whose inline PTX (mma.sync, wgmma) a host build cannot run. The emulated tests
// run BF16 on the FMA tiles (kernel SIMT); a call that reaches the mma.sync path fails loudly. Not
// linked into Deepwell.
#include "kernels/cuda/moe_gemm_tc.h"

cudaError_t dw_moe_gemm_tc(const dw_moe_gemm_args *, cudaStream_t) { return cudaErrorInvalidConfiguration; }
// moe_gemm_sm90.cu (wgmma) never runs here: the entry falls back as on a device that is not sm_90
cudaError_t dw_moe_gemm_sm90(const dw_moe_gemm_args *, cudaStream_t, bool *) { return cudaErrorNotSupported; }
// no device to ask: sm 0, where the registry's automatic choice is the FMA tiles
int dw_moe_gemm_device_sm(void) { return 0; }
