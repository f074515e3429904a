// moe_gemm_fp8_quant.cu — the quantiser of the fp8_block grouped wgrad's operands (API in
// moe_gemm_fp8.h): x (R, C) becomes x^T's E4M3 codes (C, P) in grouped_fp8.h's padded layout,
// 1x128 blocks along each expert's rows, so that no block holds two experts' rows. The groups come
// from the device's offsets (no count to the host): a CTA takes one padded block pb of 128 columns
// of the output and 64 of its rows (64 columns c of x), finds the expert whose rows pb holds (warp
// 0: a scan of the experts' block counts), reads the block's rows of x (zeros past the group),
// and writes 128 contiguous codes per c. Scale rule and element encoding are the bit-identical
// quantiser's (quant_common.cuh: dw_rule_fp8_scale, the reciprocal-corrected division, the
// hardware E4M3 conversion), so the codes equal the CPU's (grouped_fp8.c) bit for bit.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/moe_gemm_fp8.h"
#include "kernels/cuda/quant_common.cuh"

namespace {

using namespace dwq;

constexpr int QC_COLS = 64, QC_THREADS = 256, QC_ROWS = 32; // 4 groups of 32 of the block's 128 rows

__device__ __forceinline__ float elem(const float *x, int64_t i) { return __ldg(x + i); }
__device__ __forceinline__ float elem(const uint16_t *x, int64_t i) {
    return __uint_as_float((uint32_t)__ldg(x + i) << 16); // BF16 -> FP32, exact
}

// x (R, C) -> codes (C, P), scales (C, P/128); grid (P/128, C/64), QC_THREADS threads.
template <typename T>
__global__ void __launch_bounds__(QC_THREADS)
    quant_cols_kernel(const T *__restrict__ x, const int32_t *__restrict__ off, int64_t E, int64_t C, int64_t P,
                      uint8_t *__restrict__ codes, float *__restrict__ scales) {
    __shared__ int64_t s_t0;                // first row of x in block pb
    __shared__ int s_n;                     // rows of the group in it (0: past the groups)
    __shared__ uint32_t s_amax[4][QC_COLS]; // per row group, per column: max |x| bits
    const int64_t pb = blockIdx.x;
    const int tid = threadIdx.x;
    if (tid < 32) { // warp 0: lane l sums the blocks of experts [l per, (l+1) per), then a scan
        const int lane = tid;
        const int64_t per = (E + 31) / 32, e0 = lane * per, e1 = e0 + per < E ? e0 + per : E;
        int64_t nb = 0;
        for (int64_t e = e0; e < e1; e++) nb += (off[e + 1] - off[e] + 127) / 128;
        int64_t inc = nb;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int64_t v = __shfl_up_sync(0xFFFFFFFFu, inc, o);
            if (lane >= o) inc += v;
        }
        if (lane == 0) s_t0 = 0, s_n = 0;
        __syncwarp();
        if (pb >= inc - nb && pb < inc) { // this lane's experts hold block pb
            int64_t start = inc - nb;
            for (int64_t e = e0; e < e1; e++) {
                const int64_t g0 = off[e], cnt = off[e + 1] - g0, b = (cnt + 127) / 128;
                if (pb < start + b) {
                    const int64_t t0 = g0 + 128 * (pb - start);
                    s_t0 = t0, s_n = (int)(g0 + cnt - t0 < 128 ? g0 + cnt - t0 : 128);
                    break;
                }
                start += b;
            }
        }
    }
    __syncthreads();
    const int64_t t0 = s_t0;
    const int n = s_n, cl = tid % QC_COLS, g = tid / QC_COLS; // a warp: 32 adjacent columns of one row
    const int64_t c = (int64_t)blockIdx.y * QC_COLS + cl;
    float v[QC_ROWS];
    uint32_t am = 0;
#pragma unroll
    for (int i = 0; i < QC_ROWS; i++) {
        const int t = g * QC_ROWS + i;
        v[i] = t < n ? elem(x, (t0 + t) * C + c) : 0.0f;
        am = max(am, abs_bits(v[i]));
    }
    s_amax[g][cl] = am;
    __syncthreads();
    am = max(max(s_amax[0][cl], s_amax[1][cl]), max(s_amax[2][cl], s_amax[3][cl]));
    const float s = dw_rule_fp8_scale(am, false);
    uint32_t w[QC_ROWS / 4];
    encode_n<F_E4M3, QC_ROWS>(fp8_q(s), v, w);
    uint4 *dst = reinterpret_cast<uint4 *>(codes + c * P + pb * 128 + g * QC_ROWS);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
    if (g == 0) scales[c * (P / 128) + pb] = s;
}

} // namespace

extern "C" int dw_moe_fp8_quantize_cols(const void *x, int bf16, const int32_t *offsets, int64_t R, int64_t E,
                                        int64_t C, int64_t P, uint8_t *codes_t, float *scales_t, void *stream) {
    (void)R; // the rows past offsets[E] are never read
    if (C % QC_COLS || P % 128 || ((uintptr_t)codes_t & 15) || E < 1 || C / QC_COLS > 65535)
        return (int)cudaErrorNotSupported;
    if (C == 0 || P == 0) return (int)cudaSuccess;
    const dim3 grid((unsigned)(P / 128), (unsigned)(C / QC_COLS));
    const cudaStream_t st = (cudaStream_t)stream;
    if (bf16)
        quant_cols_kernel<uint16_t><<<grid, QC_THREADS, 0, st>>>((const uint16_t *)x, offsets, E, C, P, codes_t, scales_t);
    else quant_cols_kernel<float><<<grid, QC_THREADS, 0, st>>>((const float *)x, offsets, E, C, P, codes_t, scales_t);
    return (int)cudaGetLastError();
}
