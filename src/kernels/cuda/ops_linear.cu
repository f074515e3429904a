/* ops_linear.cu — CUDA reference linear layer (torch.nn.Linear layout), forward and backward,
 * FP32 in and out with FP32 accumulation: a plain shared-memory tiled GEMM with arbitrary strides,
 * correct for any shape. Not the fast path: cuBLASLt / low-precision GEMMs live in gemm*.
 * Oracle: kernels/cpu/linear_cpu.c. */
#include "kernels/cuda/ops_common.cuh"

#define DW_LT 16 /* tile edge */

/* out[i*ldo + j] (R x S) = sum_l A[i*a_i + l*a_l] * Bm[l*b_l + j*b_j]  (+ out if ACC) (+ bias[j])
 * grid (ceil(R/16), ceil(S/16)), block 16 x 16; one output element per thread. */
template <bool ACC>
static __global__ void dw_gemm_ref_kernel(float *out, int64_t ldo, const float *A, int64_t a_i,
                                          int64_t a_l, const float *Bm, int64_t b_l, int64_t b_j,
                                          const float *bias, int64_t R, int64_t S, int64_t L) {
    __shared__ float As[DW_LT][DW_LT + 1], Bs[DW_LT][DW_LT + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t i = (int64_t)blockIdx.x * DW_LT + ty, j = (int64_t)blockIdx.y * DW_LT + tx;
    float acc = 0.0f;
    for (int64_t l0 = 0; l0 < L; l0 += DW_LT) {
        /* As[ty][tx] = A(i, l0+tx); Bs[ty][tx] = Bm(l0+ty, j) */
        const int64_t la = l0 + tx, lb = l0 + ty;
        As[ty][tx] = (i < R && la < L) ? A[i * a_i + la * a_l] : 0.0f;
        Bs[ty][tx] = (lb < L && j < S) ? Bm[lb * b_l + j * b_j] : 0.0f;
        __syncthreads();
        for (int l = 0; l < DW_LT; l++) acc = fmaf(As[ty][l], Bs[l][tx], acc);
        __syncthreads();
    }
    if (i < R && j < S) {
        if (bias) acc += bias[j];
        if (ACC) acc += out[i * ldo + j];
        out[i * ldo + j] = acc;
    }
}

template <bool ACC>
static void dw_gemm_ref_launch(float *out, int64_t ldo, const float *A, int64_t a_i, int64_t a_l,
                               const float *Bm, int64_t b_l, int64_t b_j, const float *bias,
                               int64_t R, int64_t S, int64_t L, cudaStream_t s) {
    const dim3 block(DW_LT, DW_LT);
    const dim3 grid((unsigned)((R + DW_LT - 1) / DW_LT), (unsigned)((S + DW_LT - 1) / DW_LT));
    dw_gemm_ref_kernel<ACC><<<grid, block, 0, s>>>(out, ldo, A, a_i, a_l, Bm, b_l, b_j, bias, R, S, L);
}

/* grid limits: R tiles in x (< 2^31), S tiles in y (<= 65535) */
static bool dw_gemm_ref_fits(int64_t R, int64_t S) {
    return (R + DW_LT - 1) / DW_LT <= INT32_MAX && (S + DW_LT - 1) / DW_LT <= 65535;
}

extern "C" {

/* out (N,M) = x (N,K) W^T + b:  A = x (i=n, l=k), Bm(l=k, j=m) = W[m*K + k] */
dw_status dw_cuda_linear_fwd(dw_ctx *ctx, float *out, const float *x, const float *w,
                             const float *b, int64_t N, int64_t K, int64_t M, void *stream) {
    const char *op = "linear_fwd";
    DW_OPS_REQUIRE(ctx, op, N >= 0 && K > 0 && M > 0 && dw_gemm_ref_fits(N, M));
    DW_OPS_REQUIRE(ctx, op, N == 0 || (out && x && w));
    if (N == 0) return DW_OK;
    dw_gemm_ref_launch<false>(out, M, x, K, 1, w, 1, K, b, N, M, K, (cudaStream_t)stream);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

/* dx (N,K) = dout (N,M) W (M,K):     A = dout (i=n, l=m),  Bm(l=m, j=k) = W[m*K + k]
 * (or dx += with dx_acc)
 * dW (M,K) += dout^T x:             A(i=m, l=n) = dout[n*M + m],  Bm(l=n, j=k) = x[n*K + k]
 * db (M) += column sums of dout (fixed order) */
dw_status dw_cuda_linear_bwd(dw_ctx *ctx, float *dx, bool dx_acc, float *dw, float *db, const float *dout,
                             const float *x, const float *w, int64_t N, int64_t K, int64_t M,
                             void *stream) {
    const char *op = "linear_bwd";
    cudaStream_t s = (cudaStream_t)stream;
    DW_OPS_REQUIRE(ctx, op, N >= 0 && K > 0 && M > 0);
    DW_OPS_REQUIRE(ctx, op, dw_gemm_ref_fits(N, K) && dw_gemm_ref_fits(M, K) && (M + 31) / 32 <= INT32_MAX);
    DW_OPS_REQUIRE(ctx, op, N == 0 || (dout && (!dx || w) && (!dw || x)));
    if (N == 0) return DW_OK;
    if (dw) dw_gemm_ref_launch<true>(dw, K, dout, 1, M, x, K, 1, NULL, M, K, N, s);
    if (db) dw_colsum_launch<float, DW_CS_PLAIN>(db, NULL, dout, NULL, NULL, NULL, N, M, s);
    if (dx && dx_acc) dw_gemm_ref_launch<true>(dx, K, dout, M, 1, w, K, 1, NULL, N, K, M, s);
    else if (dx) dw_gemm_ref_launch<false>(dx, K, dout, M, 1, w, K, 1, NULL, N, K, M, s);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

} /* extern "C" */
