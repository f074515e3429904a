/* ops_common.cuh — private to kernels/cuda/ops_*.cu: FP32/BF16 load-store, deterministic warp and
 * block reductions, a fixed-order column-sum kernel (parameter gradients), launch-shape helpers
 * and argument checks. Device code only; no exported symbols. */
#ifndef DW_KERNELS_OPS_COMMON_CUH
#define DW_KERNELS_OPS_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "core/error.h"
}
#include "core/cuda_check.h"
#include "kernels/cuda/ops_cuda.h"

typedef __nv_bfloat16 dw_bf16;

/* Activation storage: FP32 or BF16, computed in FP32; BF16 stores round to nearest even. */
static __device__ __forceinline__ float dw_ld(const float *p, int64_t i) { return p[i]; }
static __device__ __forceinline__ float dw_ld(const dw_bf16 *p, int64_t i) {
    return __bfloat162float(p[i]);
}
static __device__ __forceinline__ void dw_st(float *p, int64_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void dw_st(dw_bf16 *p, int64_t i, float v) {
    p[i] = __float2bfloat16_rn(v);
}

/* Butterfly sums: every lane ends with the same value, computed in the same order each run. */
static __device__ __forceinline__ float dw_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ double dw_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float dw_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the total.
 * sh: 32 floats of shared memory, reusable right after the call returns. */
static __device__ __forceinline__ float dw_block_sum(float v, float *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = dw_warp_sum(v);
    __syncthreads(); /* a previous call's readers are done with sh */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    return dw_warp_sum(lane < nw ? sh[lane] : 0.0f);
}
static __device__ __forceinline__ double dw_block_sum_d(double v, double *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = dw_warp_sum_d(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    return dw_warp_sum_d(lane < nw ? sh[lane] : 0.0);
}

/* Grid-stride launch shape for n independent elements. */
#define DW_EW_THREADS 256
static inline unsigned dw_ew_blocks(int64_t n) {
    int64_t b = (n + DW_EW_THREADS - 1) / DW_EW_THREADS;
    if (b > (1 << 20)) b = 1 << 20; /* the kernels loop over the rest */
    return (unsigned)(b > 0 ? b : 1);
}
#define DW_GRID_STRIDE(i, n)                                                                   \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                  \
         i += (int64_t)gridDim.x * blockDim.x)

/* Column sums over rows, accumulated (+=) into FP32 gradients, in a fixed order: thread (lane,
 * wy) of a 32 x DW_CS_ROWS block sums rows wy, wy + DW_CS_ROWS, ... of column c, then the
 * DW_CS_ROWS partial sums are added in ascending wy. Deterministic for any input.
 *   DW_CS_PLAIN:  acc0[c] += sum_r dout[r,c]
 *   DW_CS_LN:     acc0[c] += sum_r dout*(x-mean[r])*rstd[r]; acc1[c] += sum_r dout (either NULL)
 *   DW_CS_RMS:    acc0[c] += sum_r dout*x*rstd[r]
 * dout, x (R,C) of activation type T. */
enum { DW_CS_PLAIN = 0, DW_CS_LN, DW_CS_RMS };
#define DW_CS_ROWS 32
template <typename T, int MODE>
static __global__ void __launch_bounds__(32 * DW_CS_ROWS)
dw_colsum_kernel(float *acc0, float *acc1, const T *dout, const T *x,
                 const float *mean, const float *rstd, int64_t R,
                 int64_t C) {
    __shared__ float s0[DW_CS_ROWS][33], s1[DW_CS_ROWS][33];
    const int lane = threadIdx.x, wy = threadIdx.y;
    const int64_t c = (int64_t)blockIdx.x * 32 + lane;
    float a0 = 0.0f, a1 = 0.0f;
    if (c < C) {
        for (int64_t r = wy; r < R; r += DW_CS_ROWS) {
            const float g = dw_ld(dout, r * C + c);
            if (MODE == DW_CS_PLAIN) {
                a0 += g;
            } else if (MODE == DW_CS_LN) {
                a0 += g * ((dw_ld(x, r * C + c) - mean[r]) * rstd[r]);
                a1 += g;
            } else {
                a0 += g * (dw_ld(x, r * C + c) * rstd[r]);
            }
        }
    }
    s0[wy][lane] = a0;
    s1[wy][lane] = a1;
    __syncthreads();
    if (wy == 0 && c < C) {
        float t0 = 0.0f, t1 = 0.0f;
        for (int i = 0; i < DW_CS_ROWS; i++) {
            t0 += s0[i][lane];
            t1 += s1[i][lane];
        }
        if (acc0) acc0[c] += t0;
        if (MODE == DW_CS_LN && acc1) acc1[c] += t1;
    }
}

template <typename T, int MODE>
static void dw_colsum_launch(float *acc0, float *acc1, const T *dout, const T *x,
                             const float *mean, const float *rstd, int64_t R, int64_t C,
                             cudaStream_t s) {
    const dim3 block(32, DW_CS_ROWS), grid((unsigned)((C + 31) / 32));
    dw_colsum_kernel<T, MODE><<<grid, block, 0, s>>>(acc0, acc1, dout, x, mean, rstd, R, C);
}

/* Argument checks for the exported entries: DW_ERR_INVALID naming the op and the condition. */
#define DW_OPS_REQUIRE(ctx, op, cond)                                                          \
    do {                                                                                       \
        if (!(cond))                                                                           \
            return dw_set_error((ctx), DW_ERR_INVALID, "%s: invalid argument: %s", (op), #cond); \
    } while (0)
#define DW_OPS_REQUIRE_DT(ctx, op, dt) DW_OPS_REQUIRE(ctx, op, (dt) == DW_ACT_F32 || (dt) == DW_ACT_BF16)

#endif /* DW_KERNELS_OPS_COMMON_CUH */
