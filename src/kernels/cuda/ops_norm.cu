/* ops_norm.cu — CUDA layernorm and rmsnorm over the last dimension C, forward and backward;
 * FP32 or BF16 activations, FP32 weights, statistics and parameter gradients. One block per row
 * with deterministic block sums (BF16 rows of C % 8 == 0, C <= 8192: one to eight warps per row,
 * the row in registers, 16-byte accesses); parameter gradients by the fixed-order column sum
 * (ops_common.cuh).
 * Oracle: kernels/cpu/norm_cpu.c. */
#include "kernels/cuda/ops_common.cuh"

#define DW_NORM_THREADS 256

/* out (N,C) = (x - mean) * rstd * w (+ b); RMS: mean = 0 and var = mean(x^2). mean/rstd (N) may
 * be NULL. Two passes over the row (mean, then the centred variance) as the CPU oracle. */
template <typename T, bool RMS>
static __global__ void dw_norm_fwd_kernel(T *out, float *mean, float *rstd, const T *x,
                                          const float *w, const float *b, int64_t C, float eps) {
    __shared__ float sh[32];
    const int64_t row = blockIdx.x;
    const T *xr = x + row * C;
    float m = 0.0f;
    if (!RMS) {
        float s = 0.0f;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += dw_ld(xr, c);
        m = dw_block_sum(s, sh) / (float)C;
    }
    float v = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        const float d = dw_ld(xr, c) - m;
        v += d * d;
    }
    const float rs = 1.0f / sqrtf(dw_block_sum(v, sh) / (float)C + eps);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float y = (dw_ld(xr, c) - m) * rs * w[c];
        if (!RMS && b) y += b[c];
        dw_st(out, row * C + c, y);
    }
    if (threadIdx.x == 0) {
        if (!RMS && mean) mean[row] = m;
        if (rstd) rstd[row] = rs;
    }
}

/* dx (N,C) = rstd * (g - mean_c(g) - xhat * mean_c(g*xhat)), g = dout*w (RMS: no mean_c(g)) */
template <typename T, bool RMS>
static __global__ void dw_norm_bwd_dx_kernel(T *dx, const T *dout, const T *x, const float *w,
                                             const float *mean, const float *rstd, int64_t C) {
    __shared__ float sh[32];
    const int64_t row = blockIdx.x;
    const T *xr = x + row * C, *gr = dout + row * C;
    const float m = RMS ? 0.0f : mean[row], rs = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        const float g = dw_ld(gr, c) * w[c];
        sg += g;
        sgx += g * ((dw_ld(xr, c) - m) * rs);
    }
    sg = RMS ? 0.0f : dw_block_sum(sg, sh) / (float)C;
    sgx = dw_block_sum(sgx, sh) / (float)C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        const float g = dw_ld(gr, c) * w[c], xh = (dw_ld(xr, c) - m) * rs;
        dw_st(dx, row * C + c, rs * (g - sg - xh * sgx));
    }
}

/* BF16 rows with C % 8 == 0 and C <= DW_NW_MAXC, 16-byte aligned: TPR threads per row (one to
 * eight warps, DW_NW_THREADS / TPR rows per block), the row held in registers (thread tr owns the
 * 8-element groups tr, tr + TPR, ...), 16-byte loads and stores, one read and one write of each
 * element; the same formulas as the block kernels above. TPR = 32: warp sums only. */
#define DW_NW_VPL 4                      /* 8-element groups per thread */
#define DW_NW_THREADS 256                /* threads per block */
#define DW_NW_MAXC (DW_NW_THREADS * 8 * DW_NW_VPL) /* 8192 */

/* Sum over the TPR threads of this thread's row (all threads of the block call it). sh: one float
 * per warp of the block. */
template <int TPR>
static __device__ __forceinline__ float dw_norm_row_sum(float v, float *sh) {
    v = dw_warp_sum(v);
    if (TPR == 32) return v;
    __syncthreads(); /* a previous call's readers are done with sh */
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    const int w0 = (int)(threadIdx.x / TPR) * (TPR / 32);
    float t = 0.0f;
#pragma unroll
    for (int i = 0; i < TPR / 32; i++) t += sh[w0 + i];
    return t;
}

template <bool RMS, int TPR>
static __global__ void __launch_bounds__(DW_NW_THREADS)
dw_norm_fwd_rows_kernel(dw_bf16 *out, float *mean, float *rstd, const dw_bf16 *x, const float *w,
                        const float *b, int64_t N, int64_t C, float eps) {
    __shared__ float sh[DW_NW_THREADS / 32];
    const int tr = (int)(threadIdx.x % TPR);
    const int64_t row = (int64_t)blockIdx.x * (DW_NW_THREADS / TPR) + threadIdx.x / TPR;
    if (TPR == 32 && row >= N) return; /* uniform over the warp; wider rows: no barrier skipped */
    const int64_t C8 = row < N ? C / 8 : 0;
    float v[DW_NW_VPL][8];
    float s = 0.0f;
#pragma unroll
    for (int q = 0; q < DW_NW_VPL; q++) {
        const int64_t j = tr + TPR * q;
        if (j < C8) {
            dw_ld8(x, row * C + 8 * j, v[q]);
#pragma unroll
            for (int k = 0; k < 8; k++) s += v[q][k];
        }
    }
    const float m = RMS ? 0.0f : dw_norm_row_sum<TPR>(s, sh) / (float)C;
    float var = 0.0f;
#pragma unroll
    for (int q = 0; q < DW_NW_VPL; q++) {
        if (tr + TPR * q >= C8) continue;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float d = v[q][k] - m;
            var += d * d;
        }
    }
    const float rs = 1.0f / sqrtf(dw_norm_row_sum<TPR>(var, sh) / (float)C + eps);
#pragma unroll
    for (int q = 0; q < DW_NW_VPL; q++) {
        const int64_t j = tr + TPR * q;
        if (j < C8) {
            float y[8];
#pragma unroll
            for (int k = 0; k < 8; k++) {
                y[k] = (v[q][k] - m) * rs * w[8 * j + k];
                if (!RMS && b) y[k] += b[8 * j + k];
            }
            dw_st8(out, row * C + 8 * j, y);
        }
    }
    if (tr == 0 && row < N) {
        if (!RMS && mean) mean[row] = m;
        if (rstd) rstd[row] = rs;
    }
}

/* dx may be dout: every thread reads its groups before the row sums, writes them after */
template <bool RMS, int TPR>
static __global__ void __launch_bounds__(DW_NW_THREADS)
dw_norm_bwd_dx_rows_kernel(dw_bf16 *dx, const dw_bf16 *dout, const dw_bf16 *x, const float *w,
                           const float *mean, const float *rstd, int64_t N, int64_t C) {
    __shared__ float sh[DW_NW_THREADS / 32];
    const int tr = (int)(threadIdx.x % TPR);
    const int64_t row = (int64_t)blockIdx.x * (DW_NW_THREADS / TPR) + threadIdx.x / TPR;
    if (TPR == 32 && row >= N) return; /* uniform over the warp */
    const bool ok = row < N;
    const int64_t C8 = ok ? C / 8 : 0;
    const float m = RMS || !ok ? 0.0f : mean[row], rs = ok ? rstd[row] : 0.0f;
    float g[DW_NW_VPL][8], xh[DW_NW_VPL][8];
    float sg = 0.0f, sgx = 0.0f;
#pragma unroll
    for (int q = 0; q < DW_NW_VPL; q++) {
        const int64_t j = tr + TPR * q;
        if (j < C8) {
            dw_ld8(dout, row * C + 8 * j, g[q]);
            dw_ld8(x, row * C + 8 * j, xh[q]);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                g[q][k] *= w[8 * j + k];
                xh[q][k] = (xh[q][k] - m) * rs;
                sg += g[q][k];
                sgx += g[q][k] * xh[q][k];
            }
        }
    }
    sg = RMS ? 0.0f : dw_norm_row_sum<TPR>(sg, sh) / (float)C;
    sgx = dw_norm_row_sum<TPR>(sgx, sh) / (float)C;
#pragma unroll
    for (int q = 0; q < DW_NW_VPL; q++) {
        const int64_t j = tr + TPR * q;
        if (j < C8) {
            float o[8];
#pragma unroll
            for (int k = 0; k < 8; k++) o[k] = rs * (g[q][k] - sg - xh[q][k] * sgx);
            dw_st8(dx, row * C + 8 * j, o);
        }
    }
}

/* the row kernels apply (BF16 only; the pointers' row starts 16-byte aligned) */
static bool dw_norm_rows_ok(int64_t C, const void *a, const void *b, const void *c) {
    return C % 8 == 0 && C <= DW_NW_MAXC && dw_aligned16(a) && dw_aligned16(b) && dw_aligned16(c);
}
/* threads per row: the fewest (32, 64, 128, 256) that hold C in DW_NW_VPL groups each */
static int dw_norm_tpr(int64_t C) {
    int tpr = 32;
    while ((int64_t)tpr * 8 * DW_NW_VPL < C) tpr *= 2;
    return tpr;
}
#define DW_NW_LAUNCH(KERNEL, RMS, C, N, s, ...)                                                 \
    do {                                                                                       \
        const int tpr_ = dw_norm_tpr(C);                                                       \
        const int rpb_ = DW_NW_THREADS / tpr_;                                                 \
        const unsigned nb_ = (unsigned)(((N) + rpb_ - 1) / rpb_);                              \
        if (tpr_ == 32) KERNEL<RMS, 32><<<nb_, DW_NW_THREADS, 0, s>>>(__VA_ARGS__);            \
        else if (tpr_ == 64) KERNEL<RMS, 64><<<nb_, DW_NW_THREADS, 0, s>>>(__VA_ARGS__);       \
        else if (tpr_ == 128) KERNEL<RMS, 128><<<nb_, DW_NW_THREADS, 0, s>>>(__VA_ARGS__);     \
        else KERNEL<RMS, 256><<<nb_, DW_NW_THREADS, 0, s>>>(__VA_ARGS__);                      \
    } while (0)

template <typename T, bool RMS>
static void dw_norm_fwd_launch(void *out, float *mean, float *rstd, const void *x, const float *w,
                               const float *b, int64_t N, int64_t C, float eps, cudaStream_t s) {
    if (sizeof(T) == 2 && dw_norm_rows_ok(C, out, x, x)) {
        DW_NW_LAUNCH(dw_norm_fwd_rows_kernel, RMS, C, N, s, (dw_bf16 *)out, mean, rstd,
                     (const dw_bf16 *)x, w, b, N, C, eps);
        return;
    }
    dw_norm_fwd_kernel<T, RMS><<<(unsigned)N, DW_NORM_THREADS, 0, s>>>(
        (T *)out, mean, rstd, (const T *)x, w, b, C, eps);
}

template <typename T, bool RMS>
static void dw_norm_bwd_launch(void *dx, float *dw, float *db, const void *dout, const void *x,
                               const float *w, const float *mean, const float *rstd, int64_t N,
                               int64_t C, cudaStream_t s) {
    /* parameter gradients first, so that dx may overwrite dout (in place) */
    if (RMS && dw)
        dw_colsum_launch<T, DW_CS_RMS>(dw, NULL, (const T *)dout, (const T *)x, NULL, rstd, N, C, s);
    if (!RMS && (dw || db))
        dw_colsum_launch<T, DW_CS_LN>(dw, db, (const T *)dout, (const T *)x, mean, rstd, N, C, s);
    if (dx && sizeof(T) == 2 && dw_norm_rows_ok(C, dx, dout, x))
        DW_NW_LAUNCH(dw_norm_bwd_dx_rows_kernel, RMS, C, N, s, (dw_bf16 *)dx, (const dw_bf16 *)dout,
                     (const dw_bf16 *)x, w, mean, rstd, N, C);
    else if (dx)
        dw_norm_bwd_dx_kernel<T, RMS><<<(unsigned)N, DW_NORM_THREADS, 0, s>>>(
            (T *)dx, (const T *)dout, (const T *)x, w, mean, rstd, C);
}

/* N is a grid dimension (one block per row): at most 2^31 - 1 rows. */
#define DW_NORM_MAX_ROWS 2147483647LL

extern "C" {

dw_status dw_cuda_layernorm_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, float *mean, float *rstd,
                                const void *x, const float *w, const float *b, int64_t N,
                                int64_t C, double eps, void *stream) {
    const char *op = "layernorm_fwd";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N >= 0 && N <= DW_NORM_MAX_ROWS && C > 0 && eps >= 0.0);
    DW_OPS_REQUIRE(ctx, op, N == 0 || (out && x && w));
    if (N == 0) return DW_OK;
    if (dt == DW_ACT_F32)
        dw_norm_fwd_launch<float, false>(out, mean, rstd, x, w, b, N, C, (float)eps, (cudaStream_t)stream);
    else
        dw_norm_fwd_launch<dw_bf16, false>(out, mean, rstd, x, w, b, N, C, (float)eps, (cudaStream_t)stream);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

dw_status dw_cuda_layernorm_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, float *dw, float *db,
                                const void *dout, const void *x, const float *w, const float *mean,
                                const float *rstd, int64_t N, int64_t C, void *stream) {
    const char *op = "layernorm_bwd";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N >= 0 && N <= DW_NORM_MAX_ROWS && C > 0);
    DW_OPS_REQUIRE(ctx, op, N == 0 || (dout && x && w && mean && rstd));
    if (N == 0) return DW_OK;
    if (dt == DW_ACT_F32)
        dw_norm_bwd_launch<float, false>(dx, dw, db, dout, x, w, mean, rstd, N, C, (cudaStream_t)stream);
    else
        dw_norm_bwd_launch<dw_bf16, false>(dx, dw, db, dout, x, w, mean, rstd, N, C, (cudaStream_t)stream);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

dw_status dw_cuda_rmsnorm_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, float *rstd, const void *x,
                              const float *w, int64_t N, int64_t C, double eps, void *stream) {
    const char *op = "rmsnorm_fwd";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N >= 0 && N <= DW_NORM_MAX_ROWS && C > 0 && eps >= 0.0);
    DW_OPS_REQUIRE(ctx, op, N == 0 || (out && x && w));
    if (N == 0) return DW_OK;
    if (dt == DW_ACT_F32)
        dw_norm_fwd_launch<float, true>(out, NULL, rstd, x, w, NULL, N, C, (float)eps, (cudaStream_t)stream);
    else
        dw_norm_fwd_launch<dw_bf16, true>(out, NULL, rstd, x, w, NULL, N, C, (float)eps, (cudaStream_t)stream);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

dw_status dw_cuda_rmsnorm_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, float *dw, const void *dout,
                              const void *x, const float *w, const float *rstd, int64_t N,
                              int64_t C, void *stream) {
    const char *op = "rmsnorm_bwd";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N >= 0 && N <= DW_NORM_MAX_ROWS && C > 0);
    DW_OPS_REQUIRE(ctx, op, N == 0 || (dout && x && w && rstd));
    if (N == 0) return DW_OK;
    if (dt == DW_ACT_F32)
        dw_norm_bwd_launch<float, true>(dx, dw, NULL, dout, x, w, NULL, rstd, N, C, (cudaStream_t)stream);
    else
        dw_norm_bwd_launch<dw_bf16, true>(dx, dw, NULL, dout, x, w, NULL, rstd, N, C, (cudaStream_t)stream);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

} /* extern "C" */
