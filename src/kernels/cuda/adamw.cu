/* adamw.cu — the CUDA AdamW step and global gradient norm over a flat parameter pool (see
 * adamw_cuda.h). Arithmetic in double, in the CPU reference's order with every operation rounded
 * on its own (adamw_step.cuh), so that a step differs from dw_adamw_step_cpu only through the
 * gradient norm's summation order.
 * The step loads and stores 16 bytes at a time when the four pools allow it, and can write the
 * BF16 working copies of the updated masters in the same pass (dw_cuda_adamw_cast, one launch
 * per pass of kernels/adamw_passes.h). The norm can skip pool ranges whose squares the experts'
 * wgrad already summed (dw_cuda_grad_norm_segs). */
#include <cuda_bf16.h>

#include "kernels/adamw_passes.h"
#include "kernels/cuda/adamw_cuda.h"
#include "kernels/cuda/adamw_step.cuh"
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

/* The segments of the pool, then the parts: each thread's elements in order, a fixed tree per block. */
struct aw_segs {
    int n;
    int64_t lo[DW_CUDA_NORM_SEGS], hi[DW_CUDA_NORM_SEGS];
};
static __global__ void __launch_bounds__(AW_THREADS) aw_sumsq_segs_kernel(const float *g, const aw_segs sg,
                                                                          const double *parts, int64_t n_parts,
                                                                          double *partials) {
    __shared__ double sh[32];
    double s = 0.0;
    const int64_t t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    for (int k = 0; k < sg.n; k++)
        for (int64_t i = sg.lo[k] + t0; i < sg.hi[k]; i += stride) {
            const double x = (double)g[i];
            s += x * x;
        }
    for (int64_t i = t0; i < n_parts; i += stride) s += parts[i];
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

/* VEC: elements [0, n4*4) in 16-byte loads and stores (four independent chains per thread: the
 * kernel is bound by memory, and scalar loads left it at ~2.9 TB/s on the H200), the rest one
 * at a time; !VEC: every element one at a time (unaligned pools). CAST: the BF16 copy of each
 * updated master i in [c0, c1) written too, wb[i] = bf16_rn(p[i]) as kern.cu's cast (a group of
 * four inside the range in one 8-byte store); a non-finite norm then leaves p, m, v and still
 * writes the copies (bf16_arena's copies may have been overwritten since the last step);
 * !update: the copies alone (a cast-only pass of kernels/adamw_passes.h). */
template <bool VEC, bool CAST>
static __global__ void __launch_bounds__(AW_THREADS) aw_step_kernel(float *p, const float *g, float *m, float *v,
                                                                    int64_t n, int64_t n_decay, const double *norm,
                                                                    const dw_adamw_args *ap, __nv_bfloat16 *wb,
                                                                    int64_t c0, int64_t c1, bool update) {
    const double nrm = *norm;
    const dw_adamw_args a = *ap;
    const bool step = update && isfinite(nrm);
    if (!CAST && !step) return;
    const double scale = aw_scale(nrm, a);
    const int64_t n4 = VEC ? n / 4 : 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int64_t q = t0; q < n4; q += stride) {
        float4 pp = reinterpret_cast<float4 *>(p)[q];
        const int64_t i = 4 * q;
        if (step) {
            float4 mm = reinterpret_cast<float4 *>(m)[q], vv = reinterpret_cast<float4 *>(v)[q];
            const float4 gg = reinterpret_cast<const float4 *>(g)[q];
            aw_one(pp.x, gg.x, mm.x, vv.x, i < n_decay ? a.weight_decay : 0.0, scale, a);
            aw_one(pp.y, gg.y, mm.y, vv.y, i + 1 < n_decay ? a.weight_decay : 0.0, scale, a);
            aw_one(pp.z, gg.z, mm.z, vv.z, i + 2 < n_decay ? a.weight_decay : 0.0, scale, a);
            aw_one(pp.w, gg.w, mm.w, vv.w, i + 3 < n_decay ? a.weight_decay : 0.0, scale, a);
            reinterpret_cast<float4 *>(p)[q] = pp;
            reinterpret_cast<float4 *>(m)[q] = mm;
            reinterpret_cast<float4 *>(v)[q] = vv;
        }
        if (CAST && i + 4 > c0 && i < c1) {
            const __nv_bfloat162 lo = __floats2bfloat162_rn(pp.x, pp.y), hi = __floats2bfloat162_rn(pp.z, pp.w);
            if (i >= c0 && i + 4 <= c1) { /* the whole group: one 8-byte store (wb + i is 8-byte aligned) */
                uint2 u;
                u.x = *reinterpret_cast<const uint32_t *>(&lo), u.y = *reinterpret_cast<const uint32_t *>(&hi);
                *reinterpret_cast<uint2 *>(wb + i) = u;
            } else { /* a run's edge inside the group */
                const __nv_bfloat16 b[4] = {lo.x, lo.y, hi.x, hi.y};
                for (int k = 0; k < 4; k++)
                    if (i + k >= c0 && i + k < c1) wb[i + k] = b[k];
            }
        }
    }
    for (int64_t i = 4 * n4 + t0; i < n; i += stride) {
        if (step) aw_one(p[i], g[i], m[i], v[i], i < n_decay ? a.weight_decay : 0.0, scale, a);
        if (CAST && i >= c0 && i < c1) wb[i] = __float2bfloat16_rn(p[i]);
    }
}

static bool aligned16(const void *x) { return (uintptr_t)x % 16 == 0; }

/* One launch of the step over [lo, lo + len) with the copies [c0, c1) (relative to lo). */
static void aw_launch(float *p, const float *g, float *m, float *v, int64_t lo, int64_t len, int64_t n_decay,
                      const double *norm, const dw_adamw_args *a, uint16_t *wb, int64_t c0, int64_t c1, bool update,
                      cudaStream_t s) {
    const int64_t nd = n_decay <= lo ? 0 : n_decay - lo < len ? n_decay - lo : len;
    __nv_bfloat16 *w = wb ? reinterpret_cast<__nv_bfloat16 *>(wb) + lo : NULL;
    const bool vec = aligned16(p + lo) && aligned16(g + lo) && aligned16(m + lo) && aligned16(v + lo) &&
                     (uintptr_t)w % 8 == 0;
    if (c0 >= c1 && vec)
        aw_step_kernel<true, false><<<dw_ew_blocks((len + 3) / 4), AW_THREADS, 0, s>>>(p + lo, g + lo, m + lo, v + lo,
                                                                                      len, nd, norm, a, NULL, 0, 0,
                                                                                      update);
    else if (c0 >= c1)
        aw_step_kernel<false, false><<<dw_ew_blocks(len), AW_THREADS, 0, s>>>(p + lo, g + lo, m + lo, v + lo, len, nd,
                                                                             norm, a, NULL, 0, 0, update);
    else if (vec)
        aw_step_kernel<true, true><<<dw_ew_blocks((len + 3) / 4), AW_THREADS, 0, s>>>(p + lo, g + lo, m + lo, v + lo,
                                                                                     len, nd, norm, a, w, c0, c1,
                                                                                     update);
    else
        aw_step_kernel<false, true><<<dw_ew_blocks(len), AW_THREADS, 0, s>>>(p + lo, g + lo, m + lo, v + lo, len, nd,
                                                                            norm, a, w, c0, c1, update);
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

dw_status dw_cuda_grad_norm_segs(dw_ctx *ctx, const float *g, const int64_t (*segs)[2], int n_segs,
                                 const double *parts, int64_t n_parts, double *partials, int nblk, double *norm,
                                 void *stream) {
    const char *op = "grad_norm";
    DW_OPS_REQUIRE(ctx, op, n_segs >= 0 && n_segs <= DW_CUDA_NORM_SEGS && n_parts >= 0 && (parts || !n_parts));
    DW_OPS_REQUIRE(ctx, op, nblk >= 1 && nblk <= 65535 && g && partials && norm);
    aw_segs sg;
    sg.n = n_segs;
    for (int k = 0; k < n_segs; k++) {
        DW_OPS_REQUIRE(ctx, op, segs[k][0] <= segs[k][1] && (k == 0 || segs[k - 1][1] <= segs[k][0]));
        sg.lo[k] = segs[k][0], sg.hi[k] = segs[k][1];
    }
    cudaStream_t s = (cudaStream_t)stream;
    aw_sumsq_segs_kernel<<<nblk, AW_THREADS, 0, s>>>(g, sg, parts, n_parts, partials);
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
    aw_launch(p, g, m, v, 0, n, n_decay, norm, a, NULL, 0, 0, true, (cudaStream_t)stream);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

static int64_t job_end(const dw_adamw_quant_job *j) { return j->off + j->experts * j->m * j->k; }

dw_status dw_cuda_adamw_cast(dw_ctx *ctx, float *p, const float *g, float *m, float *v, int64_t n, int64_t n_decay,
                             const double *norm, const dw_adamw_args *a, uint16_t *wb, const int64_t (*runs)[2],
                             int n_runs, int64_t first, int64_t lag, const dw_adamw_quant_job *jobs, int n_jobs,
                             void *stream) {
    const char *op = "adamw (with the BF16 copies)";
    DW_OPS_REQUIRE(ctx, op, n >= 0 && n_decay >= 0 && n_decay <= n && p && g && m && v && norm && a);
    DW_OPS_REQUIRE(ctx, op, n_runs >= 0 && (n_runs == 0 || (runs && wb)) && first >= 0 && n_jobs >= 0);
    for (int r = 0; r < n_runs; r++) /* ascending, disjoint, inside the pool */
        DW_OPS_REQUIRE(ctx, op, runs[r][0] <= runs[r][1] && runs[r][1] <= n && (r == 0 || runs[r - 1][1] <= runs[r][0]));
    for (int h = 0; h < n_jobs; h++) /* ascending, disjoint, inside the pool, apart from every run */
        DW_OPS_REQUIRE(ctx, op, job_end(&jobs[h]) <= n && (h == 0 || job_end(&jobs[h - 1]) <= jobs[h].off));
    cudaStream_t s = (cudaStream_t)stream;
    dw_adamw_plan pl;
    dw_adamw_pass ps;
    dw_adamw_plan_init(&pl, n, runs, n_runs, first, lag);
    int done = 0; /* the jobs run so far: those below the passes' elements */
    while (dw_adamw_pass_next(&pl, &ps)) { /* one launch a pass, in order (kernels/adamw_passes.h) */
        int64_t lo = ps.lo;
        int h = 0;
        while (h < n_jobs && job_end(&jobs[h]) <= lo) h++;
        while (lo < ps.hi) { /* the pass less the jobs' elements, piece by piece */
            const bool hole = h < n_jobs && jobs[h].off < ps.hi;
            const int64_t hi = hole ? (jobs[h].off > lo ? jobs[h].off : lo) : ps.hi;
            if (hi > lo) {
                const int64_t c0 = (ps.c0 > lo ? ps.c0 : lo) - lo, c1 = (ps.c1 < hi ? ps.c1 : hi) - lo;
                aw_launch(p, g, m, v, lo, hi - lo, n_decay, norm, a, wb, c0, c1 > c0 ? c1 : c0, ps.update, s);
                DW_CUDA_CHECK_LAUNCH(ctx, op);
            }
            if (!hole) break;
            if (h == done) { /* first reached: every element below it stepped */
                DW_TRY(dw_cuda_adamw_quant(ctx, p, g, m, v, n_decay, norm, a, &jobs[h], 1, stream));
                done++;
            }
            lo = job_end(&jobs[h]) > hi ? job_end(&jobs[h]) : hi, h++; /* past the job */
        }
    }
    for (; done < n_jobs; done++) /* past every pass (none reached it: n == 0 or cast-only ends) */
        DW_TRY(dw_cuda_adamw_quant(ctx, p, g, m, v, n_decay, norm, a, &jobs[done], 1, stream));
    return DW_OK;
}

} /* extern "C" */
