/* amax_history.cu — the GPU's per-step roll of the fp8_tensor amax histories (amax_history.h):
 * one thread per operand runs dw_amax_roll (precision/amax_rules.h, the CPU's rule) on its state
 * in device memory, in stream order. Not the quantiser that reads the histories (kernels/cuda/quant_kernels.cuh). */
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "precision/amax_rules.h" /* (amax_history.h declares dw_amax_roll_cuda for C) */

static __global__ void roll_kernel(uint32_t *state, int n_slots, uint32_t n) { /* state (n_slots, WORDS(n)) */
    const int s = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (s < n_slots) dw_amax_roll(state + (size_t)s * DW_AMAX_WORDS(n), n);
}

extern "C" dw_status dw_amax_roll_cuda(dw_ctx *ctx, uint32_t *state, int n_slots, int64_t n, void *stream) {
    if (!state || n_slots <= 0 || n <= 0 || n > 0x7FFFFFFF)
        return dw_set_error(ctx, DW_ERR_INVALID, "amax history (cuda): bad state (%d operands, length %lld)", n_slots,
                            (long long)n);
    roll_kernel<<<(unsigned)((n_slots + 127) / 128), 128, 0, (cudaStream_t)stream>>>(state, n_slots, (uint32_t)n);
    DW_CUDA_CHECK_LAUNCH(ctx, "amax history roll");
    return DW_OK;
}
