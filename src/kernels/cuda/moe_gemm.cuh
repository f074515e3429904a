/* moe_gemm.cuh — private to the grouped expert GEMM kernels (ops_moe_gemm.cu, moe_gemm_tc.cu): each
 * pass of the MoE linear layer as one product C[i,j] (+)= sum_l A(i,l) B(j,l) per expert, with the
 * operands' strides, and the mapping of a CTA to its expert and tile read from the device's group
 * offsets (so the launch needs no counts from the host). Shapes: x (R,K) rows grouped by expert,
 * W (E,M,K), y and dy (R,M); expert e owns rows [off[e], off[e+1]).
 *   fprop  y_e  = x_e W_e^T   I = rows, J = M, L = K    A = x (l unit), B = W (l unit)
 *   dgrad  dx_e = dy_e W_e    I = rows, J = K, L = M    A = dy (l unit), B = W (j unit)
 *   wgrad  dW_e += dy_e^T x_e I = M,    J = K, L = rows A = dy (i unit), B = x (j unit) */
#ifndef DW_KERNELS_MOE_GEMM_CUH
#define DW_KERNELS_MOE_GEMM_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/ops_cuda.h"

template <typename T> struct dw_moe_prob {
    const T *a, *b;
    int64_t sai, sal, sbj, sbl; /* A(i,l) = a[i*sai + l*sal], B(j,l) = b[j*sbj + l*sbl] */
    int64_t I, J, L;
    void *c; /* C(i,j) at c[i*ldc + j]: T for fprop and dgrad, FP32 for wgrad (added into unless g.overwrite) */
    int64_t ldc;
};

/* The product of expert e, whose rows are [g0, g0 + cnt). */
template <typename T>
static __device__ __forceinline__ dw_moe_prob<T> dw_moe_problem(const dw_moe_gemm_args &g, int64_t e, int64_t g0,
                                                               int64_t cnt) {
    dw_moe_prob<T> p;
    const int64_t K = g.K, M = g.M;
    const T *x = (const T *)g.x, *w = (const T *)g.w + e * M * K, *dy = (const T *)g.dy;
    if (g.pass == DW_MOE_FPROP) {
        p.a = x + g0 * K, p.sai = K, p.sal = 1, p.b = w, p.sbj = K, p.sbl = 1;
        p.I = cnt, p.J = M, p.L = K, p.c = (T *)g.out + g0 * M, p.ldc = M;
    } else if (g.pass == DW_MOE_DGRAD) {
        p.a = dy + g0 * M, p.sai = M, p.sal = 1, p.b = w, p.sbj = 1, p.sbl = K;
        p.I = cnt, p.J = K, p.L = M, p.c = (T *)g.out + g0 * K, p.ldc = K;
    } else {
        p.a = dy + g0 * M, p.sai = 1, p.sal = M, p.b = x + g0 * K, p.sbj = 1, p.sbl = K;
        p.I = M, p.J = K, p.L = cnt, p.c = (float *)g.out + e * M * K, p.ldc = K;
    }
    return p;
}

/* This CTA's expert, first row of the group and the tile's first i. fprop/dgrad: blockIdx.x counts
 * the row tiles of the groups in expert order (a grid of ceil(R/BM) + E covers any routing; the
 * rest return false); wgrad: blockIdx.z is the expert, blockIdx.x the tile of M. */
static __device__ __forceinline__ bool dw_moe_tile(const dw_moe_gemm_args &g, int64_t BM, int64_t &e, int64_t &g0,
                                                   int64_t &cnt, int64_t &i0) {
    const int32_t *off = g.offsets;
    if (g.pass == DW_MOE_WGRAD) {
        e = blockIdx.z, g0 = off[e], cnt = off[e + 1] - g0, i0 = (int64_t)blockIdx.x * BM;
        return cnt > 0 || g.overwrite; /* overwrite: an expert without rows gets zeros */
    }
    int64_t t = blockIdx.x;
    for (e = 0; e < g.E; e++) {
        g0 = off[e], cnt = off[e + 1] - g0;
        const int64_t tiles = (cnt + BM - 1) / BM;
        if (t < tiles) {
            i0 = t * BM;
            return true;
        }
        t -= tiles;
    }
    return false;
}

/* The expert whose row tiles hold row tile gm of the persistent kernels' (moe_gemm_sm90.cu,
 * moe_gemm_fp8_sm90.cu) tile list: s_mt[0..E] is the prefix of the experts' row-tile counts in
 * shared memory, gm < s_mt[E]; an empty expert owns no tile. A binary search, log2(E) reads: the
 * linear walk it replaces read up to E per work unit and thread (moe-e64's fp8_block dgrad: ~12% of
 * the kernel's warp stall samples in it, bench/RESULTS.md session 32). */
static __device__ __forceinline__ int64_t dw_moe_expert_of_tile(const int32_t *s_mt, int64_t E, int64_t gm) {
    int64_t lo = 0, hi = E; /* s_mt[lo] <= gm < s_mt[hi] */
    while (hi - lo > 1) {
        const int64_t mid = (lo + hi) >> 1;
        if (s_mt[mid] <= gm) lo = mid;
        else hi = mid;
    }
    return lo;
}

#endif /* DW_KERNELS_MOE_GEMM_CUH */
