/* quant_counts.cu — the quantisers' counters on the GPU (quant_counts.h): after a quantiser wrote
 * an operand's codes and scales, one grid-stride pass decodes each element exactly as
 * dw_dequantize_cpu does (element value x block scale [x s_t], FP32 products left to right: nothing to contract) and
 * tests it with the header's definitions against the value the quantiser read; each CTA sums its
 * counts (warp shuffles, then shared memory) and adds them with one atomic per counter, none for
 * a zero. Stream-ordered, no host sync, recordable. Not the quantisation itself (kernels/cuda/quant*.cu). */
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "precision/quant_counts.h"

namespace {

constexpr int THREADS = 256;
constexpr int64_t MAX_CTAS = 1024;

struct Args {
    int64_t R, C;          /* q's shape: [rows, cols], or [cols, rows] for the transposed copy */
    int64_t row_bytes, scols;
    int br, bc;            /* the recipe's block (0: whole dimension) */
    int bits;              /* 8 or 4 */
    bool e5m2, fp32_scale, nv, bf16_in, trans;
    unsigned mask, top;
    double ratio;
};

/* The element value of an 8-bit E4M3 / E5M2 code or a 4-bit E2M1 code (NaN for NaN codes). */
__device__ __forceinline__ float elem(const Args &a, unsigned c) {
    if (a.bits == 4) { /* 0, 0.5, 1, 1.5, 2, 3, 4, 6: exponent c>>1 & 3, mantissa c & 1 */
        const unsigned e = (c >> 1) & 3u, m = c & 1u;
        const float v = e ? ldexpf((float)(2u + m), (int)e - 2) : 0.5f * (float)m;
        return (c & 8u) ? -v : v;
    }
    const unsigned m7 = c & 0x7Fu;
    float v;
    if (a.e5m2) {
        const unsigned e = m7 >> 2, m = m7 & 3u;
        if (e == 31u) v = m ? __int_as_float(0x7FC00000) : __int_as_float(0x7F800000);
        else v = e ? ldexpf((float)(4u + m), (int)e - 17) : ldexpf((float)m, -16);
    } else {
        const unsigned e = m7 >> 3, m = m7 & 7u;
        if (m7 == 0x7Fu) v = __int_as_float(0x7FC00000);
        else v = e ? ldexpf((float)(8u + m), (int)e - 10) : ldexpf((float)m, -9);
    }
    return (c & 0x80u) ? -v : v;
}

/* A 1-byte scale: UE4M3 (nvfp4; 0x7F NaN) or UE8M0 (MX; 0xFF NaN). */
__device__ __forceinline__ float scale8(const Args &a, unsigned s) {
    if (a.nv) {
        if (s == 0x7Fu) return __int_as_float(0x7FC00000);
        const unsigned e = s >> 3, m = s & 7u;
        return e ? ldexpf((float)(8u + m), (int)e - 10) : ldexpf((float)m, -9);
    }
    return s == 0xFFu ? __int_as_float(0x7FC00000) : ldexpf(1.0f, (int)s - 127);
}

__device__ __forceinline__ unsigned long long block_sum(unsigned long long v, unsigned long long *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    const int w = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    if (lane == 0) sh[w] = v;
    __syncthreads();
    unsigned long long t = 0;
    if (threadIdx.x == 0)
        for (int i = 0; i < THREADS / 32; i++) t += sh[i];
    __syncthreads();
    return t;
}

/* v: FP32 or BF16 [R, C] (or [C, R] when trans); codes, scales as formats.h; ts: nvfp4's s_t. */
__global__ void __launch_bounds__(THREADS) count_kernel(Args a, const void *__restrict__ v, const uint8_t *__restrict__ codes,
                                                        const void *__restrict__ scales, const float *__restrict__ ts,
                                                        unsigned long long *cnt) {
    __shared__ unsigned long long sh[THREADS / 32];
    const int64_t n = a.R * a.C;
    const float st = a.nv ? *ts : 1.0f;
    unsigned long long over = 0, under = 0;
    const int64_t stride = (int64_t)gridDim.x * THREADS, di = stride / a.C, dj = stride % a.C;
    int64_t k = (int64_t)blockIdx.x * THREADS + threadIdx.x, i = k / a.C, j = k % a.C; /* k = i C + j */
    for (; k < n; k += stride, i += di, j += dj) {
        if (j >= a.C) j -= a.C, i++;
        const int64_t src = a.trans ? j * a.R + i : k;
        const float x = a.bf16_in ? __int_as_float((int)((uint32_t)((const uint16_t *)v)[src] << 16)) : ((const float *)v)[src];
        const unsigned code = a.bits == 4 ? (codes[i * a.row_bytes + j / 2] >> (4 * (j & 1))) & 0xFu : codes[i * a.C + j];
        const int64_t s = (a.br ? i / a.br : 0) * a.scols + (a.bc ? j / a.bc : 0);
        const float e = elem(a, code);
        float y;
        if (a.fp32_scale) y = e * ((const float *)scales)[s];
        else if (a.nv) y = e * scale8(a, ((const uint8_t *)scales)[s]) * st;
        else y = e * scale8(a, ((const uint8_t *)scales)[s]);
        if (!isfinite(x) || !isfinite(y)) continue;
        over += dw_qc_overflow(code, a.mask, a.top, a.ratio, x, y);
        under += dw_qc_underflow(x, y);
    }
    over = block_sum(over, sh);
    under = block_sum(under, sh);
    if (threadIdx.x == 0) {
        if (over) atomicAdd(&cnt[DW_QC_OVER], over);
        if (under) atomicAdd(&cnt[DW_QC_UNDER], under);
    }
}

} /* namespace */

extern "C" dw_status dw_qcounts_add_cuda(dw_ctx *ctx, dw_recipe r, int in, const void *v, int64_t rows, int64_t cols,
                                         bool trans, const uint8_t *codes, const void *scales, const float *tensor_scale,
                                         uint64_t *cnt, void *stream) {
    if (r == DW_RECIPE_BF16 || (int)r < 0 || r >= DW_RECIPE_COUNT || !v || !codes || !scales || !cnt || rows < 0 ||
        cols < 0 || (r == DW_RECIPE_NVFP4 && !tensor_scale))
        return dw_set_error(ctx, DW_ERR_INVALID, "quant counts (cuda): bad arguments (recipe %d, %lld x %lld)", (int)r,
                            (long long)rows, (long long)cols);
    Args a = {};
    a.R = trans ? cols : rows, a.C = trans ? rows : cols;
    if (a.R * a.C == 0) return DW_OK;
    int64_t srows = 0;
    dw_quant_scale_shape(r, a.R, a.C, &srows, &a.scols);
    dw_recipe_block(r, &a.br, &a.bc);
    a.bits = dw_recipe_elem_bits(r);
    a.row_bytes = dw_quant_row_bytes(r, a.C);
    a.e5m2 = r == DW_RECIPE_MXFP8_E5M2;
    a.nv = r == DW_RECIPE_NVFP4;
    a.fp32_scale = r == DW_RECIPE_FP8_TENSOR || r == DW_RECIPE_FP8_ROW || r == DW_RECIPE_FP8_BLOCK ||
                   r == DW_RECIPE_FP8_BLOCK2D;
    a.bf16_in = in == 1, a.trans = trans;
    dw_qc_top(a.bits, a.e5m2, &a.mask, &a.top, &a.ratio);
    const int64_t need = (a.R * a.C + THREADS - 1) / THREADS;
    count_kernel<<<(unsigned)(need < MAX_CTAS ? need : MAX_CTAS), THREADS, 0, (cudaStream_t)stream>>>(
        a, v, codes, scales, tensor_scale, (unsigned long long *)cnt);
    DW_CUDA_CHECK_LAUNCH(ctx, "quant counts");
    return DW_OK;
}
