// grouped_mxfp8_quant.cu — the MXFP8 grouped wgrad's device pieces (grouped_mxfp8_cuda.h): x (R, C)
// quantised into x^T's codes (C, P) in 1x32 blocks along each expert's rows (groups padded to 32,
// so no block holds two experts' rows), and for the Hopper route those codes dequantised exactly
// back into BF16 rows (R, C) for the BF16 grouped wgrad. The groups come from the device's offsets
// (no count to the host). Scale rule and element encoding are the bit-identical quantiser's
// (quant_common.cuh: mx_code, the exact power-of-two multiply, the hardware E4M3 conversion), so
// the codes equal the CPU's (gemm/grouped_mxfp8_quant.c) bit for bit. Not run on a GPU yet.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/grouped_mxfp8_cuda.h"
#include "kernels/cuda/quant_common.cuh"

namespace {

using namespace dwq;

constexpr int MQ_THREADS = 128; // columns of x per CTA of the quantiser

__device__ __forceinline__ float elem(const float *x, int64_t i) { return __ldg(x + i); }
__device__ __forceinline__ float elem(const uint16_t *x, int64_t i) {
    return __uint_as_float((uint32_t)__ldg(x + i) << 16); // BF16 -> FP32, exact
}

// The expert whose padded columns hold block pb (of 32) and the block's rows: *t0 the first row of
// x, *n how many (0: past the groups). Warp 0 of the CTA: lane l sums the blocks of experts
// [l per, (l+1) per), then an inclusive scan finds the lane, which walks its experts. static: a
// non-inline __device__ function with linkage gets a host stub that calls exit (tests/abi/no_exit.sh).
static __device__ void find_block(const int32_t *off, int64_t E, int64_t pb, int64_t *s_t0, int *s_n) {
    const int lane = threadIdx.x;
    const int64_t per = (E + 31) / 32, e0 = lane * per, e1 = e0 + per < E ? e0 + per : E;
    int64_t nb = 0;
    for (int64_t e = e0; e < e1; e++) nb += (off[e + 1] - off[e] + 31) / 32;
    int64_t inc = nb;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int64_t v = __shfl_up_sync(0xFFFFFFFFu, inc, o);
        if (lane >= o) inc += v;
    }
    if (lane == 0) *s_t0 = 0, *s_n = 0;
    __syncwarp();
    if (pb >= inc - nb && pb < inc) {
        int64_t start = inc - nb;
        for (int64_t e = e0; e < e1; e++) {
            const int64_t g0 = off[e], cnt = off[e + 1] - g0, b = (cnt + 31) / 32;
            if (pb < start + b) {
                const int64_t t0 = g0 + 32 * (pb - start);
                *s_t0 = t0, *s_n = (int)(g0 + cnt - t0 < 32 ? g0 + cnt - t0 : 32);
                break;
            }
            start += b;
        }
    }
}

// x (R, C) -> codes (C, P), scales (C, P/32); grid (P/32, ceil(C/128)), MQ_THREADS threads, one
// column c of x (a row of codes) per thread: its 32 values of block pb, their amax, the MX rule.
template <typename T>
__global__ void __launch_bounds__(MQ_THREADS)
    mx_quant_cols_kernel(const T *__restrict__ x, const int32_t *__restrict__ off, int64_t E, int64_t C, int64_t P,
                         uint8_t *__restrict__ codes, uint8_t *__restrict__ scales) {
    __shared__ int64_t s_t0;
    __shared__ int s_n;
    const int64_t pb = blockIdx.x;
    if (threadIdx.x < 32) find_block(off, E, pb, &s_t0, &s_n);
    __syncthreads();
    const int64_t t0 = s_t0, c = (int64_t)blockIdx.y * MQ_THREADS + threadIdx.x;
    const int n = s_n;
    if (c >= C) return;
    float v[32];
    uint32_t am = 0;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        v[i] = i < n ? elem(x, (t0 + i) * C + c) : 0.0f; // adjacent threads: adjacent columns
        am = max(am, abs_bits(v[i]));
    }
    const uint32_t s8 = mx_code<F_E4M3>(am, false); // rceil
    const Q q = s8 == 0xFFu ? Q{0.0f, 0.0f, 0, 0x7Fu}
                : am == 0   ? Q{0.0f, 0.0f, 0, 0}
                            : Q{dw_rule_mx_inv_scale((uint8_t)s8), 0.0f, 1, 0};
    uint32_t w[8];
    encode_n<F_E4M3, 32>(q, v, w);
    uint4 *dst = reinterpret_cast<uint4 *>(codes + c * P + pb * 32);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
    scales[c * (P / 32) + pb] = (uint8_t)s8;
}

// pad (E+1): 32 * the blocks of the experts before each (one thread: E is small; a scan would do
// for thousands of experts).
__global__ void mx_pad_kernel(const int32_t *off, int64_t E, int64_t *pad) {
    int64_t p = 0;
    pad[0] = 0;
    for (int64_t e = 0; e < E; e++) pad[e + 1] = p += (off[e + 1] - off[e] + 31) / 32 * 32;
}

__device__ __forceinline__ float dec_e4m3(uint32_t c) {
    const uint32_t e = (c >> 3) & 15, m = c & 7;
    const float v = (e == 15 && m == 7) ? __int_as_float(0x7fc00000)
                                        : (e ? ldexpf((float)(8 + m), (int)e - 10) : ldexpf((float)m, -9));
    return (c & 0x80) ? -v : v;
}
__device__ __forceinline__ float dec_ue8m0(uint32_t c) { return c == 255 ? __int_as_float(0x7fc00000) : ldexpf(1.0f, (int)c - 127); }

// out (R, C) BF16 <- codes (C, P) through the padded layout; 32 x 32 tiles, 32 x 8 threads: the
// rows' columns of codes found first (binary search of offsets), reads along the padded columns
// and writes along C both coalesce through shared memory.
__global__ void mx_dequant_cols_kernel(const uint8_t *__restrict__ codes, const uint8_t *__restrict__ scales,
                                       const int32_t *__restrict__ off, const int64_t *__restrict__ pad, int64_t R,
                                       int64_t E, int64_t C, int64_t P, __nv_bfloat16 *__restrict__ out) {
    __shared__ int64_t pos[32];
    __shared__ __nv_bfloat16 t[32][34]; // t[column][row]
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t r0 = (int64_t)blockIdx.x * 32, c0 = (int64_t)blockIdx.y * 32;
    if (ty == 0) {
        const int64_t r = r0 + tx;
        int64_t p = -1;
        if (r < off[E]) { // the last expert e with off[e] <= r (then off[e+1] > r)
            int64_t lo = 0, hi = E - 1;
            while (lo < hi) {
                const int64_t mid = (lo + hi + 1) / 2;
                if (off[mid] <= r) lo = mid;
                else hi = mid - 1;
            }
            p = pad[lo] + r - off[lo];
        }
        pos[tx] = p;
    }
    __syncthreads();
    const int64_t p = pos[tx];
    for (int i = ty; i < 32; i += 8) {
        const int64_t c = c0 + i;
        float v = 0.0f;
        if (p >= 0 && c < C) v = dec_e4m3(codes[c * P + p]) * dec_ue8m0(scales[c * (P / 32) + p / 32]);
        t[i][tx] = __float2bfloat16_rn(v);
    }
    __syncthreads();
    for (int i = ty; i < 32; i += 8) {
        const int64_t r = r0 + i, c = c0 + tx;
        if (r < R && c < C) out[r * C + c] = t[tx][i];
    }
}

} // namespace

extern "C" int dw_moe_mx_quantize_cols(const void *x, int bf16, const int32_t *offsets, int64_t E, int64_t C,
                                       int64_t P, uint8_t *codes_t, uint8_t *scales_t, void *stream) {
    if (P % 32 || ((uintptr_t)codes_t & 15) || E < 1 || (C + MQ_THREADS - 1) / MQ_THREADS > 65535)
        return (int)cudaErrorNotSupported;
    if (C == 0 || P == 0) return (int)cudaSuccess;
    const dim3 grid((unsigned)(P / 32), (unsigned)((C + MQ_THREADS - 1) / MQ_THREADS));
    const cudaStream_t st = (cudaStream_t)stream;
    if (bf16)
        mx_quant_cols_kernel<uint16_t><<<grid, MQ_THREADS, 0, st>>>((const uint16_t *)x, offsets, E, C, P, codes_t,
                                                                    scales_t);
    else mx_quant_cols_kernel<float><<<grid, MQ_THREADS, 0, st>>>((const float *)x, offsets, E, C, P, codes_t, scales_t);
    return (int)cudaGetLastError();
}

extern "C" int dw_moe_mx_dequant_cols_bf16(const uint8_t *codes_t, const uint8_t *scales_t, const int32_t *offsets,
                                           int64_t R, int64_t E, int64_t C, int64_t P, int64_t *pad, uint16_t *out,
                                           void *stream) {
    if (P % 32 || E < 1 || (C + 31) / 32 > 65535) return (int)cudaErrorNotSupported;
    const cudaStream_t st = (cudaStream_t)stream;
    mx_pad_kernel<<<1, 1, 0, st>>>(offsets, E, pad);
    if (R == 0 || C == 0) return (int)cudaGetLastError();
    const dim3 grid((unsigned)((R + 31) / 32), (unsigned)((C + 31) / 32)), block(32, 8);
    mx_dequant_cols_kernel<<<grid, block, 0, st>>>(codes_t, scales_t, offsets, pad, R, E, C, P,
                                                   (__nv_bfloat16 *)out);
    return (int)cudaGetLastError();
}
