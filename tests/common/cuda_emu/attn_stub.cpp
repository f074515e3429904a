// attn_stub.cpp — the emulator's stand-in for src/kernels/cuda/attn_mma.cu, whose inline PTX
// (mma.sync, ldmatrix) a host build cannot run: the tensor-core path reports itself ineligible,
// so ops_attention.cu runs its reference kernels under the emulator. Not linked into Deepwell.
#include "kernels/cuda/attn_mma.h"

bool dw_attn_mma_eligible(int64_t, const void *const *, int) { return false; }
int dw_attn_mode(void) { return DW_ATTN_MMA; } // never cuDNN under the emulator
void dw_attn_mode_set(int mode) { (void)mode; }
int dw_attn_mode_parse(const char *v) { return (void)v, DW_ATTN_MMA; }

cudaError_t dw_attn_mma_fwd(void *, float *, const void *, const void *, const void *, int64_t, int64_t, int64_t,
                            int64_t, int64_t, int64_t, int64_t, int64_t, float, cudaStream_t) {
    return cudaErrorInvalidConfiguration; // never called: ineligible
}

cudaError_t dw_attn_mma_bwd(void *, void *, void *, const void *, const void *, const void *, const void *,
                            const void *, const float *, float *, int64_t, int64_t, int64_t, int64_t, int64_t,
                            int64_t, int64_t, int64_t, float, cudaStream_t) {
    return cudaErrorInvalidConfiguration; // never called: ineligible
}
