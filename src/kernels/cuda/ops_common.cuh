/* ops_common.cuh — private to kernels/cuda/ops_*.cu: FP32/BF16 load-store, deterministic warp and
 * block reductions, a fixed-order column-sum kernel (parameter gradients), launch-shape helpers
 * and argument checks. Device code only; no exported symbols. */
#ifndef DW_KERNELS_OPS_COMMON_CUH
#define DW_KERNELS_OPS_COMMON_CUH

#ifdef __CUDACC__
#include <cooperative_groups.h>
#endif
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

/* 16-byte accesses of 8 BF16 values (p + i must be 16-byte aligned): one vector load/store per
 * thread instead of eight 2-byte ones; the values and roundings are those of dw_ld/dw_st. */
struct alignas(16) dw_bf16x8 {
    dw_bf16 v[8];
};
static __device__ __forceinline__ void dw_ld8(const dw_bf16 *p, int64_t i, float f[8]) {
    const dw_bf16x8 u = *reinterpret_cast<const dw_bf16x8 *>(p + i);
#pragma unroll
    for (int k = 0; k < 8; k++) f[k] = __bfloat162float(u.v[k]);
}
static __device__ __forceinline__ void dw_st8(dw_bf16 *p, int64_t i, const float f[8]) {
    dw_bf16x8 u;
#pragma unroll
    for (int k = 0; k < 8; k++) u.v[k] = __float2bfloat16_rn(f[k]);
    *reinterpret_cast<dw_bf16x8 *>(p + i) = u;
}
/* 16-byte accesses of 4 FP32 values (p + i 16-byte aligned). */
struct alignas(16) dw_f32x4 {
    float v[4];
};
static __device__ __forceinline__ void dw_ld4(const float *p, int64_t i, float f[4]) {
    const dw_f32x4 u = *reinterpret_cast<const dw_f32x4 *>(p + i);
#pragma unroll
    for (int k = 0; k < 4; k++) f[k] = u.v[k];
}
static __device__ __forceinline__ void dw_st4(float *p, int64_t i, const float f[4]) {
    dw_f32x4 u;
#pragma unroll
    for (int k = 0; k < 4; k++) u.v[k] = f[k];
    *reinterpret_cast<dw_f32x4 *>(p + i) = u;
}
static inline bool dw_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

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

/* A row zr (E) of logits read by one warp: its max and softmax denominator (sum of exp(z - max));
 * every lane gets both. */
template <typename T>
static __device__ __forceinline__ void dw_warp_softmax_stats(const T *zr, int64_t E, int lane, float &m, float &s) {
    m = -INFINITY;
    for (int64_t e = lane; e < E; e += 32) m = fmaxf(m, dw_ld(zr, e));
    m = dw_warp_max(m);
    s = 0.0f;
    for (int64_t e = lane; e < E; e += 32) s += expf(dw_ld(zr, e) - m);
    s = dw_warp_sum(s);
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

/* Column sums over rows, accumulated (+=) into FP32 gradients, in a fixed order. With many rows
 * (R >= DW_CS_SPLIT_MIN_ROWS) the kernel runs as clusters of SPLIT = 8 blocks (sm_90 thread-block
 * clusters) per 32 columns, so the rows are spread over C/32 * 8 blocks instead of C/32 (24 for
 * C = 768: latency-bound); with few rows, SPLIT = 1 (one block per 32 columns, no cluster).
 * Thread (lane, wy) of the cluster's block k sums rows k*DW_CS_ROWS + wy + j*SPLIT*DW_CS_ROWS
 * (ascending j) of column c; each block adds its DW_CS_ROWS partials in ascending wy; block 0
 * adds the SPLIT block partials in ascending k, read from the other blocks' shared memory
 * (distributed shared memory), and adds the total to the gradient. No atomics, no workspace:
 * deterministic (bit-identical reruns) for any input.
 *   DW_CS_PLAIN:  acc0[c] += sum_r dout[r,c]
 *   DW_CS_LN:     acc0[c] += sum_r dout*(x-mean[r])*rstd[r]; acc1[c] += sum_r dout (either NULL)
 *   DW_CS_RMS:    acc0[c] += sum_r dout*x*rstd[r]
 * dout, x (R,C) of activation type T. */
enum { DW_CS_PLAIN = 0, DW_CS_LN, DW_CS_RMS };
#define DW_CS_ROWS 32
#define DW_CS_SPLIT 8              /* blocks per cluster (8: the portable cluster size) */
#define DW_CS_SPLIT_MIN_ROWS 512LL /* fewer rows: SPLIT = 1 */
template <typename T, int MODE, int SPLIT>
static __global__ void __launch_bounds__(32 * DW_CS_ROWS)
dw_colsum_kernel(float *acc0, float *acc1, const T *dout, const T *x,
                 const float *mean, const float *rstd, int64_t R,
                 int64_t C) {
    __shared__ float s0[DW_CS_ROWS][33], s1[DW_CS_ROWS][33];
    __shared__ float p0[32], p1[32]; /* this block's partial sums, read by the cluster's block 0 */
#ifdef __CUDACC__
    /* SPLIT > 1: launched with cluster dimension (1, SPLIT, 1) and gridDim.y == SPLIT */
    const int k = SPLIT > 1 ? (int)cooperative_groups::this_cluster().block_rank() : 0;
#else /* host emulator (tests/common/cuda_emu): no clusters, only SPLIT = 1 is launched */
    const int k = 0;
#endif
    const int lane = threadIdx.x, wy = threadIdx.y;
    const int64_t c = (int64_t)blockIdx.x * 32 + lane;
    float a0 = 0.0f, a1 = 0.0f;
    if (c < C) {
#pragma unroll 4
        for (int64_t r = (int64_t)k * DW_CS_ROWS + wy; r < R; r += SPLIT * DW_CS_ROWS) {
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
    if (wy == 0) {
        float t0 = 0.0f, t1 = 0.0f;
        for (int i = 0; i < DW_CS_ROWS; i++) {
            t0 += s0[i][lane];
            t1 += s1[i][lane];
        }
        p0[lane] = t0;
        p1[lane] = t1;
    }
#ifdef __CUDACC__
    if (SPLIT > 1) cooperative_groups::this_cluster().sync(); /* all partials written, visible */
    else __syncthreads();
#else
    __syncthreads();
#endif
    if (k == 0 && wy == 0 && c < C) {
        float t0 = 0.0f, t1 = 0.0f;
        for (int j = 0; j < SPLIT; j++) {
#ifdef __CUDACC__
            const float *q0 = SPLIT > 1 ? cooperative_groups::this_cluster().map_shared_rank(p0, (unsigned)j) : p0;
            const float *q1 = SPLIT > 1 ? cooperative_groups::this_cluster().map_shared_rank(p1, (unsigned)j) : p1;
#else
            const float *q0 = p0, *q1 = p1;
#endif
            t0 += q0[lane];
            t1 += q1[lane];
        }
        if (acc0) acc0[c] += t0;
        if (MODE == DW_CS_LN && acc1) acc1[c] += t1;
    }
#ifdef __CUDACC__
    /* no block exits (freeing its shared memory) before block 0 has read it */
    if (SPLIT > 1) cooperative_groups::this_cluster().sync();
#endif
}

template <typename T, int MODE>
static void dw_colsum_launch(float *acc0, float *acc1, const T *dout, const T *x,
                             const float *mean, const float *rstd, int64_t R, int64_t C,
                             cudaStream_t s) {
    const dim3 block(32, DW_CS_ROWS);
    const unsigned gx = (unsigned)((C + 31) / 32);
#ifdef __CUDACC__
    if (R >= DW_CS_SPLIT_MIN_ROWS) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = 1;
        attr[0].val.clusterDim.y = DW_CS_SPLIT;
        attr[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3(gx, DW_CS_SPLIT);
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = 0;
        cfg.stream = s;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        if (cudaLaunchKernelEx(&cfg, dw_colsum_kernel<T, MODE, DW_CS_SPLIT>, acc0, acc1, dout, x,
                               mean, rstd, R, C) == cudaSuccess)
            return;
        (void)cudaGetLastError(); /* no cluster launch here: the single-block form below */
    }
#endif
    dw_colsum_kernel<T, MODE, 1><<<dim3(gx, 1), block, 0, s>>>(acc0, acc1, dout, x, mean, rstd, R, C);
}

/* Argument checks for the exported entries: DW_ERR_INVALID naming the op and the condition. */
#define DW_OPS_REQUIRE(ctx, op, cond)                                                          \
    do {                                                                                       \
        if (!(cond))                                                                           \
            return dw_set_error((ctx), DW_ERR_INVALID, "%s: invalid argument: %s", (op), #cond); \
    } while (0)
#define DW_OPS_REQUIRE_DT(ctx, op, dt) DW_OPS_REQUIRE(ctx, op, (dt) == DW_ACT_F32 || (dt) == DW_ACT_BF16)

#endif /* DW_KERNELS_OPS_COMMON_CUH */
