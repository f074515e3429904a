/* quant_in_bf16.cu — quant_kernels.cuh's kernels and launchers built for BF16 input, in a translation
 * unit of their own (quant.cu calls it; the other input type is quant_in_f32.cu). */
#include "kernels/cuda/quant_kernels.cuh"

dw_status dwq::launch_bf16(dw_ctx *ctx, dw_recipe r, const uint16_t *x, const Params &p, bool trans, uint32_t *ws,
                   cudaStream_t st, bool *counted) {
    return launch<uint16_t>(ctx, r, x, p, trans, ws, st, counted);
}
