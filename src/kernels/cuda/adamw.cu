/* adamw.cu — the CUDA AdamW step and global gradient norm over a flat parameter pool (see
 * adamw_cuda.h). Arithmetic in double, in the CPU reference's order, so that a step differs from
 * dw_adamw_step_cpu only through the gradient norm's summation order. */
#include "kernels/cuda/adamw_cuda.h"
#include "kernels/cuda/ops_common.cuh"

#define AW_THREADS 256

/* partials[b] = sum over i = b*256 + t, stepping by nblk*256, of g[i]^2 (fixed order per thread,
 * fixed tree per block) */
static __global__ void __launch_bounds__(AW_THREADS) aw_sumsq_kernel(const float *g, int64_t n, double *partials) {
    __shared__ double sh[32];
    double s = 0.0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const double x = (double)g[i];
        s += x * x;
    }
    s = dw_block_sum_d(s, sh);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

/* one block: norm = sqrt(sum of partials), thread t adds t, t+256, ... then the block tree */
static __global__ void __launch_bounds__(AW_THREADS) aw_norm_kernel(const double *partials, int nblk, double *norm) {
    __shared__ double sh[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < nblk; i += blockDim.x) s += partials[i];
    s = dw_block_sum_d(s, sh);
    if (threadIdx.x == 0) *norm = sqrt(s);
}

static __global__ void aw_step_kernel(float *p, const float *g, float *m, float *v, int64_t n, int64_t n_decay,
                                      const double *norm, const dw_cuda_adamw_args *ap) {
    const double nrm = *norm;
    const dw_cuda_adamw_args a = *ap;
    if (!isfinite(nrm)) return;
    const double scale = (a.max_norm > 0.0 && nrm > a.max_norm) ? a.max_norm / (nrm + 1e-6) : 1.0;
    const double b1 = a.beta1, b2 = a.beta2;
    DW_GRID_STRIDE(i, n) {
        const double gi = (double)g[i] * scale;
        double pi = (double)p[i];
        pi -= a.lr * (i < n_decay ? a.weight_decay : 0.0) * pi;
        const double mi = b1 * (double)m[i] + (1.0 - b1) * gi;
        const double vi = b2 * (double)v[i] + (1.0 - b2) * gi * gi;
        m[i] = (float)mi;
        v[i] = (float)vi;
        pi -= a.lr * (mi / a.c1) / (sqrt(vi / a.c2) + a.eps);
        p[i] = (float)pi;
    }
}

extern "C" {

dw_status dw_cuda_grad_norm(dw_ctx *ctx, const float *g, int64_t n, double *partials, int nblk,
                            double *norm, void *stream) {
    const char *op = "grad_norm";
    DW_OPS_REQUIRE(ctx, op, n >= 0 && nblk >= 1 && nblk <= 65535 && g && partials && norm);
    cudaStream_t s = (cudaStream_t)stream;
    aw_sumsq_kernel<<<nblk, AW_THREADS, 0, s>>>(g, n, partials);
    aw_norm_kernel<<<1, AW_THREADS, 0, s>>>(partials, nblk, norm);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

dw_status dw_cuda_adamw(dw_ctx *ctx, float *p, const float *g, float *m, float *v, int64_t n,
                        int64_t n_decay, const double *norm, const dw_cuda_adamw_args *a,
                        void *stream) {
    const char *op = "adamw";
    DW_OPS_REQUIRE(ctx, op, n >= 0 && n_decay >= 0 && n_decay <= n && p && g && m && v && norm && a);
    if (n == 0) return DW_OK;
    aw_step_kernel<<<dw_ew_blocks(n), DW_EW_THREADS, 0, (cudaStream_t)stream>>>(p, g, m, v, n, n_decay, norm, a);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

} /* extern "C" */
