/* ops_norm.cu — CUDA layernorm and rmsnorm over the last dimension C, forward and backward;
 * FP32 or BF16 activations, FP32 weights, statistics and parameter gradients. One block per row
 * with deterministic block sums; parameter gradients by the fixed-order column sum
 * (ops_common.cuh). Oracle: kernels/cpu/norm_cpu.c. */
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

template <typename T, bool RMS>
static void dw_norm_fwd_launch(void *out, float *mean, float *rstd, const void *x, const float *w,
                               const float *b, int64_t N, int64_t C, float eps, cudaStream_t s) {
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
    if (dx)
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
