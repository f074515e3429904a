/* adamw.cu — the CUDA AdamW step and global gradient norm over a flat parameter pool (see
 * adamw_cuda.h). Arithmetic in double, in the CPU reference's order, so that a step differs from
 * dw_adamw_step_cpu only through the gradient norm's summation order (and FMA contraction).
 * The step loads and stores 16 bytes at a time when the four pools allow it. */
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

/* One element, in the CPU reference's order (dw_adamw_step_cpu). */
static __device__ __forceinline__ void aw_one(float &p, float g, float &m, float &v, double wd, double scale,
                                              const dw_adamw_args &a) {
    const double gi = (double)g * scale;
    double pi = (double)p;
    pi -= a.lr * wd * pi;
    const double mi = a.beta1 * (double)m + (1.0 - a.beta1) * gi;
    const double vi = a.beta2 * (double)v + (1.0 - a.beta2) * gi * gi;
    m = (float)mi;
    v = (float)vi;
    pi -= a.lr * (mi / a.c1) / (sqrt(vi / a.c2) + a.eps);
    p = (float)pi;
}

/* VEC: elements [0, n4*4) in 16-byte loads and stores (four independent chains per thread: the
 * kernel is bound by memory, and scalar loads left it at ~2.9 TB/s on the H200), the rest one
 * at a time; !VEC: every element one at a time (unaligned pools). */
template <bool VEC>
static __global__ void __launch_bounds__(AW_THREADS) aw_step_kernel(float *p, const float *g, float *m, float *v,
                                                                    int64_t n, int64_t n_decay, const double *norm,
                                                                    const dw_adamw_args *ap) {
    const double nrm = *norm;
    const dw_adamw_args a = *ap;
    if (!isfinite(nrm)) return;
    const double scale = (a.max_norm > 0.0 && nrm > a.max_norm) ? a.max_norm / (nrm + 1e-6) : 1.0;
    const int64_t n4 = VEC ? n / 4 : 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int64_t q = t0; q < n4; q += stride) {
        float4 pp = reinterpret_cast<float4 *>(p)[q], mm = reinterpret_cast<float4 *>(m)[q];
        float4 vv = reinterpret_cast<float4 *>(v)[q];
        const float4 gg = reinterpret_cast<const float4 *>(g)[q];
        const int64_t i = 4 * q;
        aw_one(pp.x, gg.x, mm.x, vv.x, i < n_decay ? a.weight_decay : 0.0, scale, a);
        aw_one(pp.y, gg.y, mm.y, vv.y, i + 1 < n_decay ? a.weight_decay : 0.0, scale, a);
        aw_one(pp.z, gg.z, mm.z, vv.z, i + 2 < n_decay ? a.weight_decay : 0.0, scale, a);
        aw_one(pp.w, gg.w, mm.w, vv.w, i + 3 < n_decay ? a.weight_decay : 0.0, scale, a);
        reinterpret_cast<float4 *>(p)[q] = pp;
        reinterpret_cast<float4 *>(m)[q] = mm;
        reinterpret_cast<float4 *>(v)[q] = vv;
    }
    for (int64_t i = 4 * n4 + t0; i < n; i += stride)
        aw_one(p[i], g[i], m[i], v[i], i < n_decay ? a.weight_decay : 0.0, scale, a);
}

static bool aligned16(const void *x) { return (uintptr_t)x % 16 == 0; }

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
                        int64_t n_decay, const double *norm, const dw_adamw_args *a,
                        void *stream) {
    const char *op = "adamw";
    DW_OPS_REQUIRE(ctx, op, n >= 0 && n_decay >= 0 && n_decay <= n && p && g && m && v && norm && a);
    if (n == 0) return DW_OK;
    cudaStream_t s = (cudaStream_t)stream;
    if (aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v))
        aw_step_kernel<true><<<dw_ew_blocks((n + 3) / 4), AW_THREADS, 0, s>>>(p, g, m, v, n, n_decay, norm, a);
    else
        aw_step_kernel<false><<<dw_ew_blocks(n), AW_THREADS, 0, s>>>(p, g, m, v, n, n_decay, norm, a);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

} /* extern "C" */
