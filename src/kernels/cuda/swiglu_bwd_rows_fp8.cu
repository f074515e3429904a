/* swiglu_bwd_rows_fp8.cu — the SwiGLU backward that writes its two BF16 gradients and also their
 * fp8_block rows (ops_cuda.h: dw_cuda_swiglu_bwd_rows_fp8), for a MoE layer's experts: their gate
 * and up layers take the dgrad's dy as 1x128 rows in fp8_block and keep the wgrad's in BF16 (by
 * default; docs/precision.md), so the BF16 gradients stay and each layer's rows quantiser reading
 * one of them back goes (runtime/cuda/act_quant_cuda.c). A 1x128 block of a row is 16 threads of
 * 8 elements: dgate and dup in act_math.cuh's arithmetic (ops_act.cu's dw_cuda_swiglu_bwd), rounded
 * to BF16 and stored, each block's amax by shuffles, then quant_common.cuh's scale rule and E4M3
 * encoding: the bits of dw_cuda_swiglu_bwd followed by dw_quantize_cuda's fp8_block rows of each
 * gradient (tests/gpu/test_swiglu_bwd_fp8.c). Any row count: the grid runs whole warps, and the
 * chunks past the end compute zeros and store nothing. */
#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/act_math.cuh"
#include "kernels/cuda/quant_common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace {

/* dgate, dup, dout, gate, up, codes[t] [R, F]; scales[t] [R, F/128]; n8 = R F / 8 chunks of 8
 * elements. F % 128 == 0: a block never spans two rows, and its scale sits at chunk / 16. */
__global__ void __launch_bounds__(DW_EW_THREADS)
    swiglu_bwd_rows_kernel(dw_bf16 *__restrict__ dgate, dw_bf16 *__restrict__ dup, const dw_bf16 *__restrict__ dout,
                           const dw_bf16 *__restrict__ gate, const dw_bf16 *__restrict__ up, int64_t n8,
                           uint8_t *__restrict__ codes0, float *__restrict__ scales0, uint8_t *__restrict__ codes1,
                           float *__restrict__ scales1) {
    const int64_t end = (n8 + 31) / 32 * 32, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < end; j += stride) {
        const bool in = j < n8;
        float v[2][8] = {};
        if (in) {
            float g[8], d[8], u[8];
            dw_ld8(gate, 8 * j, g);
            dw_ld8(dout, 8 * j, d);
            dw_ld8(up, 8 * j, u);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float da, db;
                dw_ew_df<DW_EW_SWIGLU>(g[k], d[k], u[k], da, db);
                v[0][k] = __bfloat162float(__float2bfloat16_rn(da));
                v[1][k] = __bfloat162float(__float2bfloat16_rn(db));
            }
            dw_st8(dgate, 8 * j, v[0]); /* BF16 values already: the stores' rounding is exact */
            dw_st8(dup, 8 * j, v[1]);
        }
        uint8_t *const codes[2] = {codes0, codes1};
        float *const scales[2] = {scales0, scales1};
#pragma unroll
        for (int t = 0; t < 2; t++) {
            const uint32_t am = dwq::chunk_amax<128>(v[t]); /* lanes 0-15 and 16-31: one block each */
            const float s = dw_rule_fp8_scale(am, false);
            uint32_t w[2];
            dwq::encode8<dwq::F_E4M3>(dwq::fp8_q(s), v[t], w);
            if (in) {
                *reinterpret_cast<uint2 *>(codes[t] + 8 * j) = make_uint2(w[0], w[1]);
                if (j % 16 == 0) scales[t][j / 16] = s;
            }
        }
    }
}

} // namespace

extern "C" dw_status dw_cuda_swiglu_bwd_rows_fp8(dw_ctx *ctx, void *dgate, void *dup, const void *dout,
                                                const void *gate, const void *up, int64_t rows, int64_t cols,
                                                uint8_t *const codes[2], float *const scales[2], void *stream) {
    const char *op = "swiglu_bwd_rows_fp8";
    DW_OPS_REQUIRE(ctx, op, rows >= 0 && cols >= 0 && cols % 128 == 0);
    if (rows == 0 || cols == 0) return DW_OK;
    DW_OPS_REQUIRE(ctx, op, dgate && dup && dout && gate && up && codes && scales);
    DW_OPS_REQUIRE(ctx, op, dw_aligned16(dgate) && dw_aligned16(dup) && dw_aligned16(dout) && dw_aligned16(gate) &&
                                dw_aligned16(up));
    for (int t = 0; t < 2; t++)
        DW_OPS_REQUIRE(ctx, op, codes[t] && scales[t] && ((uintptr_t)codes[t] & 7u) == 0 &&
                                    ((uintptr_t)scales[t] & 3u) == 0);
    const int64_t n8 = rows * cols / 8;
    swiglu_bwd_rows_kernel<<<dw_ew_blocks((n8 + 31) / 32 * 32), DW_EW_THREADS, 0, (cudaStream_t)stream>>>(
        (dw_bf16 *)dgate, (dw_bf16 *)dup, (const dw_bf16 *)dout, (const dw_bf16 *)gate, (const dw_bf16 *)up, n8,
        codes[0], scales[0], codes[1], scales[1]);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}
