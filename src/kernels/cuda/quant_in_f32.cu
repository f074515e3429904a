/* quant_in_f32.cu — quant_kernels.cuh's kernels and launchers built for FP32 input, in a translation
 * unit of their own (quant.cu calls it; the other input type is quant_in_bf16.cu). */
#include "kernels/cuda/quant_kernels.cuh"

dw_status dwq::launch_f32(dw_ctx *ctx, dw_recipe r, const float *x, const Params &p, bool trans, uint32_t *ws,
                   cudaStream_t st, bool *counted) {
    return launch<float>(ctx, r, x, p, trans, ws, st, counted);
}
