/* swiglu_fp8.cu — the SwiGLU forward that also writes its output's fp8_block rows (ops_cuda.h:
 * dw_cuda_swiglu_fwd_fp8), for the down projection (dense or MoE experts) under fp8_block, and the
 * GELU's (dw_cuda_gelu_fwd_fp8, GPT-2's c_proj: the same kernel on one input), whose
 * input quantiser it replaces (runtime/cuda/act_quant_cuda.c): the output is read once, in registers,
 * instead of written, read back and quantised by a second kernel. A 1x128 block of a row is 16
 * threads of 8 elements: h = silu(gate) * up in act_math.cuh's arithmetic (ops_act.cu's), rounded
 * to BF16 (and stored where the BF16 output is wanted), the block's amax by shuffles, then
 * quant_common.cuh's scale rule and E4M3 encoding — the codes and scales dw_quantize_cuda writes
 * for the BF16 output, bit for bit (tests/gpu/test_moe_fp8_engine_cuda.c). Where the quantisers'
 * counters count the layer's x (deepwell train's guard), the kernel counts the rows' overflows and
 * underflows as the rows quantiser would (precision/quant_counts.cuh: each element against its
 * code and the block's scale, one flush per CTA). */
#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/act_math.cuh"
#include "kernels/cuda/quant_common.cuh"

namespace {

/* out, codes [R, F] (out may be NULL), scales [R, F/128]; n8 = R F / 8 chunks of 8 elements. The
 * loop runs whole warps to the next multiple of 32 chunks (the shuffles need every lane); chunks
 * past n8 compute zeros and store nothing. F % 128 == 0, so a block never spans two rows and its
 * scale sits at chunk / 16. CNT: the rows' counts added to cnt (overflow, underflow, elements). */
template <int OP, bool CNT>
__global__ void __launch_bounds__(DW_EW_THREADS)
    swiglu_fp8_kernel(dw_bf16 *__restrict__ out, const dw_bf16 *__restrict__ gate, const dw_bf16 *__restrict__ up,
                      int64_t n8, uint8_t *__restrict__ codes, float *__restrict__ scales, unsigned long long *cnt) {
    const int64_t end = (n8 + 31) / 32 * 32, stride = (int64_t)gridDim.x * blockDim.x;
    dwqc::Acc acc[2] = {};
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < end; j += stride) {
        const bool in = j < n8;
        float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (in) {
            float g[8], u[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            dw_ld8(gate, 8 * j, g);
            if (OP == DW_EW_SWIGLU) dw_ld8(up, 8 * j, u); /* GELU: one input */
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = __bfloat162float(__float2bfloat16_rn(dw_ew_f<OP>(g[k], u[k])));
            if (out) dw_st8(out, 8 * j, v); /* BF16 values already: the store's rounding is exact */
        }
        const uint32_t am = dwq::chunk_amax<128>(v); /* lanes 0-15 and 16-31: one block each */
        const float s = dw_rule_fp8_scale(am, false);
        uint32_t w[2];
        dwq::encode8<dwq::F_E4M3>(dwq::fp8_q(s), v, w);
        if (in) {
            *reinterpret_cast<uint2 *>(codes + 8 * j) = make_uint2(w[0], w[1]);
            if (j % 16 == 0) scales[j / 16] = s;
            if constexpr (CNT) dwqc::test_n<8>(dwqc::Fmt{8, false}, false, v, w, s, 1.0f, acc[0]);
        }
    }
    if constexpr (CNT) { /* every thread of the CTA gets here: the loop's bound is the grid's */
        __shared__ unsigned long long qsh[4 * (DW_EW_THREADS / 32)];
        unsigned long long *const pairs[2] = {cnt, nullptr};
        dwqc::flush<DW_EW_THREADS / 32>(acc, pairs, (unsigned long long)(8 * n8), qsh, threadIdx.x >> 5, threadIdx.x & 31,
                                        [] { __syncthreads(); });
    }
}

template <int OP>
void launch(void *out, const void *gate, const void *up, int64_t n8, uint8_t *codes, float *scales, uint64_t *counts,
            cudaStream_t st) {
    const unsigned blocks = dw_ew_blocks((n8 + 31) / 32 * 32);
    if (counts)
        swiglu_fp8_kernel<OP, true><<<blocks, DW_EW_THREADS, 0, st>>>(
            (dw_bf16 *)out, (const dw_bf16 *)gate, (const dw_bf16 *)up, n8, codes, scales, (unsigned long long *)counts);
    else
        swiglu_fp8_kernel<OP, false><<<blocks, DW_EW_THREADS, 0, st>>>((dw_bf16 *)out, (const dw_bf16 *)gate,
                                                                      (const dw_bf16 *)up, n8, codes, scales, nullptr);
}

} // namespace

extern "C" dw_status dw_cuda_swiglu_fwd_fp8(dw_ctx *ctx, void *out, const void *gate, const void *up, int64_t rows,
                                           int64_t cols, uint8_t *codes, float *scales, uint64_t *counts,
                                           void *stream) {
    const char *op = "swiglu_fp8";
    DW_OPS_REQUIRE(ctx, op, rows >= 0 && cols >= 0 && cols % 128 == 0);
    if (rows == 0 || cols == 0) return DW_OK;
    DW_OPS_REQUIRE(ctx, op, gate && up && codes && scales);
    DW_OPS_REQUIRE(ctx, op, dw_aligned16(gate) && dw_aligned16(up) && (!out || dw_aligned16(out)));
    DW_OPS_REQUIRE(ctx, op, ((uintptr_t)codes & 7u) == 0 && ((uintptr_t)scales & 3u) == 0);
    launch<DW_EW_SWIGLU>(out, gate, up, rows * cols / 8, codes, scales, counts, (cudaStream_t)stream);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

extern "C" dw_status dw_cuda_gelu_fwd_fp8(dw_ctx *ctx, void *out, const void *x, int64_t rows, int64_t cols,
                                         uint8_t *codes, float *scales, uint64_t *counts, void *stream) {
    const char *op = "gelu_fp8";
    DW_OPS_REQUIRE(ctx, op, rows >= 0 && cols >= 0 && cols % 128 == 0);
    if (rows == 0 || cols == 0) return DW_OK;
    DW_OPS_REQUIRE(ctx, op, x && codes && scales);
    DW_OPS_REQUIRE(ctx, op, dw_aligned16(x) && (!out || dw_aligned16(out)));
    DW_OPS_REQUIRE(ctx, op, ((uintptr_t)codes & 7u) == 0 && ((uintptr_t)scales & 3u) == 0);
    launch<DW_EW_GELU>(out, x, nullptr, rows * cols / 8, codes, scales, counts, (cudaStream_t)stream);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}
