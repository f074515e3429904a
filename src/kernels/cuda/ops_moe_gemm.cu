/* ops_moe_gemm.cu — the grouped expert GEMMs of the MoE linear layer (fprop, dgrad, wgrad; the
 * products of moe_gemm.cuh): the entry that checks and launches the kernel it is asked for, and the
 * FP32-FMA tile kernel that runs FP32 programs (and BF16 ones when asked: the tensor-core kernels'
 * own check, and the host emulator's path). Which kernel runs is the registry's decision
 * (src/gemm/grouped_kernels.c states each one's rule); asked for AUTO, this entry asks it. Counts
 * and offsets stay on the device. Each output element is one CTA's: no atomics, deterministic.
 * wgrad adds into dW, or with a->overwrite stores it (zeros for experts without rows), and then
 * can write the sums of squares of its 64 x 128 blocks (a->sumsq: the gradient norm's share,
 * compile/wgrad_sumsq.h), from the sm_90 kernel's epilogue or by a block kernel after. */
#include "gemm/grouped.h"
#include "kernels/cuda/moe_gemm.cuh"
#include "kernels/cuda/moe_gemm_tc.h"
#include "kernels/cuda/ops_common.cuh"

#define DW_MG_BM 64
#define DW_MG_BN 64
#define DW_MG_BK 16
#define DW_MG_THREADS 256 /* 16 x 16 threads, 4 x 4 outputs each */

/* One BM x BK (or BN x BK) tile of an operand, X(i,l) = p[i*si + l*sl], into s[l][i] as FP32;
 * outside [0,I) x [0,L): zero. Consecutive threads walk the operand's unit-stride dimension. */
template <typename T, int BI>
static __device__ __forceinline__ void dw_mg_load(float (*s)[BI + 1], const T *p, int64_t si, int64_t sl, int64_t i0,
                                                  int64_t I, int64_t l0, int64_t L) {
    for (int v = threadIdx.x; v < BI * DW_MG_BK; v += DW_MG_THREADS) {
        int i, l;
        if (sl == 1) i = v / DW_MG_BK, l = v % DW_MG_BK;
        else l = v / BI, i = v % BI;
        const int64_t gi = i0 + i, gl = l0 + l;
        s[l][i] = gi < I && gl < L ? dw_ld(p, gi * si + gl * sl) : 0.0f;
    }
}

template <typename T>
static __global__ void __launch_bounds__(DW_MG_THREADS) dw_moe_gemm_simt_kernel(dw_moe_gemm_args g) {
    __shared__ float As[DW_MG_BK][DW_MG_BM + 1], Bs[DW_MG_BK][DW_MG_BN + 1];
    int64_t e, g0, cnt, i0;
    if (!dw_moe_tile(g, DW_MG_BM, e, g0, cnt, i0)) return;
    const dw_moe_prob<T> p = dw_moe_problem<T>(g, e, g0, cnt);
    const int64_t j0 = (int64_t)blockIdx.y * DW_MG_BN;
    if (j0 >= p.J) return;
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
    float acc[4][4] = {};
    for (int64_t l0 = 0; l0 < p.L; l0 += DW_MG_BK) {
        dw_mg_load<T, DW_MG_BM>(As, p.a, p.sai, p.sal, i0, p.I, l0, p.L);
        dw_mg_load<T, DW_MG_BN>(Bs, p.b, p.sbj, p.sbl, j0, p.J, l0, p.L);
        __syncthreads();
        for (int l = 0; l < DW_MG_BK; l++) {
            float av[4], bv[4];
            for (int u = 0; u < 4; u++) av[u] = As[l][ty * 4 + u], bv[u] = Bs[l][tx * 4 + u];
            for (int u = 0; u < 4; u++)
                for (int v = 0; v < 4; v++) acc[u][v] += av[u] * bv[v];
        }
        __syncthreads();
    }
    for (int u = 0; u < 4; u++)
        for (int v = 0; v < 4; v++) {
            const int64_t i = i0 + ty * 4 + u, j = j0 + tx * 4 + v;
            if (i >= p.I || j >= p.J) continue;
            if (g.pass == DW_MOE_WGRAD) {
                float *c = (float *)p.c + i * p.ldc + j;
                *c = g.overwrite ? acc[u][v] : *c + acc[u][v];
            }
            else dw_st((T *)p.c, i * p.ldc + j, acc[u][v]);
        }
}

/* One block per 64 x 128 block of dW (blockIdx.x = (e * MB + mb) * KB + kb): thread t reads rows
 * t / 32 + 8 r (r = 0..7) at columns 4 (t % 32) .. + 3, squares in double, in that order. */
static_assert(DW_MOE_SUMSQ_BM == 64 && DW_MOE_SUMSQ_BN == 128, "256 threads: 8 rows of 32 x 4 columns a pass");
static __global__ void __launch_bounds__(256) dw_moe_block_sumsq_kernel(const float *dw, int64_t M, int64_t K,
                                                                         int64_t MB, int64_t KB, double *sumsq) {
    __shared__ double sh[32];
    const int64_t b = blockIdx.x, kb = b % KB, mb = (b / KB) % MB, e = b / (KB * MB);
    const int c0 = 4 * (threadIdx.x % 32);
    double s = 0.0;
    for (int r = threadIdx.x / 32; r < 64; r += 8) {
        const int64_t i = mb * 64 + r;
        if (i >= M) break;
        for (int c = c0; c < c0 + 4; c++) {
            const int64_t j = kb * 128 + c;
            if (j < K) {
                const double v = (double)dw[(e * M + i) * K + j];
                s += v * v;
            }
        }
    }
    s = dw_block_sum_d(s, sh);
    if (threadIdx.x == 0) sumsq[b] = s;
}

extern "C" dw_status dw_cuda_moe_block_sumsq(dw_ctx *ctx, const float *dw, int64_t E, int64_t M, int64_t K,
                                             double *sumsq, void *stream) {
    const char *op = "moe_linear wgrad sumsq";
    const int64_t MB = dw_moe_sumsq_mb(M), KB = dw_moe_sumsq_kb(K);
    DW_OPS_REQUIRE(ctx, op, dw && sumsq && E >= 1 && M >= 1 && K >= 1 && E * MB * KB < ((int64_t)1 << 31));
    dw_moe_block_sumsq_kernel<<<(unsigned)(E * MB * KB), 256, 0, (cudaStream_t)stream>>>(dw, M, K, MB, KB, sumsq);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

static const char *dw_moe_pass_name(dw_moe_pass pass) {
    return pass == DW_MOE_FPROP ? "moe_linear" : pass == DW_MOE_DGRAD ? "moe_linear dgrad" : "moe_linear wgrad";
}

extern "C" dw_status dw_cuda_moe_gemm(dw_ctx *ctx, dw_act_dtype dt, const dw_moe_gemm_args *a, void *stream) {
    const char *op = a ? dw_moe_pass_name(a->pass) : "moe_linear";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, a && (a->pass == DW_MOE_FPROP || a->pass == DW_MOE_DGRAD || a->pass == DW_MOE_WGRAD));
    DW_OPS_REQUIRE(ctx, op, a->R >= 0 && a->E >= 1 && a->E <= 65535 && a->K >= 1 && a->M >= 1);
    DW_OPS_REQUIRE(ctx, op, a->out && a->offsets && (a->pass == DW_MOE_FPROP || a->dy));
    DW_OPS_REQUIRE(ctx, op, (a->pass == DW_MOE_WGRAD || a->w) && (a->pass == DW_MOE_DGRAD || a->x));
    cudaStream_t s = (cudaStream_t)stream;
    const int64_t R = a->R, J = a->pass == DW_MOE_FPROP ? a->M : a->K;
    if (a->pass != DW_MOE_WGRAD) /* rows past the assigned ones: zero, whatever the kernel covers */
        DW_TRY(dw_cuda_moe_zero_tail(ctx, dt, a->out, a->offsets, a->E, R, J, stream));
    const bool sumsq = a->pass == DW_MOE_WGRAD && a->overwrite && a->sumsq; /* blocks of the dW written */
    DW_OPS_REQUIRE(ctx, op, !a->sumsq || sumsq);
    if (R == 0) { /* nothing to multiply; an overwritten dW is zeros */
        if (a->pass == DW_MOE_WGRAD && a->overwrite)
            DW_CUDA_CHECK(ctx, cudaMemsetAsync(a->out, 0, (size_t)(a->E * a->M * a->K) * sizeof(float), s));
        if (sumsq)
            DW_CUDA_CHECK(ctx, cudaMemsetAsync(a->sumsq, 0, (size_t)dw_moe_sumsq_parts(a->E, a->M, a->K) * sizeof(double), s));
        return DW_OK;
    }
    dw_moe_kernel k = a->kernel;
    if (k == DW_MOE_KERNEL_AUTO) { /* the registry's choice among the built-in CUDA kernels */
        const dw_grouped_args ga = {.pass = a->pass == DW_MOE_FPROP ? DW_GEMM_FPROP : a->pass == DW_MOE_DGRAD ? DW_GEMM_DGRAD
                                                                                                         : DW_GEMM_WGRAD,
                                    .dtype = dt == DW_ACT_BF16 ? DW_GROUPED_BF16 : DW_GROUPED_F32,
                                    .recipe = DW_RECIPE_BF16, .rows = R, .experts = a->E, .k = a->K, .m = a->M,
                                    .x = a->x, .w = a->w, .dy = a->dy, .out = a->out, .offsets = a->offsets};
        k = (dw_moe_kernel)dw_grouped_builtin_pick(dw_moe_gemm_device_sm(), &ga);
        if (k == DW_MOE_KERNEL_AUTO)
            return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: no built-in grouped kernel can run %lld experts, K %lld, "
                                "M %lld here (`deepwell bench grouped --explain` says why)", op, (long long)a->E,
                                (long long)a->K, (long long)a->M);
    }
    DW_OPS_REQUIRE(ctx, op, k == DW_MOE_KERNEL_SIMT || dt == DW_ACT_BF16);
    /* the block sums after the kernel, unless the sm_90 kernel's epilogue wrote them */
    const auto block_sumsq = [&]() -> dw_status {
        return sumsq ? dw_cuda_moe_block_sumsq(ctx, (const float *)a->out, a->E, a->M, a->K, a->sumsq, stream) : DW_OK;
    };
    if (k == DW_MOE_KERNEL_WGMMA) {
        bool fused = false;
        const cudaError_t err = dw_moe_gemm_sm90(a, s, &fused);
        if (err == cudaErrorNotSupported)
            return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: the wgmma kernel cannot run here (an sm_90 device, K "
                                "and M multiples of 8, at most 1024 experts and 16-byte aligned operands are needed)", op);
        DW_CUDA_CHECK(ctx, err);
        return fused ? DW_OK : block_sumsq();
    }
    if (k == DW_MOE_KERNEL_MMA) {
        DW_CUDA_CHECK(ctx, dw_moe_gemm_tc(a, s));
        return block_sumsq();
    }
    dim3 grid;
    if (a->pass == DW_MOE_WGRAD)
        grid = dim3((unsigned)((a->M + DW_MG_BM - 1) / DW_MG_BM), (unsigned)((a->K + DW_MG_BN - 1) / DW_MG_BN),
                    (unsigned)a->E);
    else
        grid = dim3((unsigned)((R + DW_MG_BM - 1) / DW_MG_BM + a->E), (unsigned)((J + DW_MG_BN - 1) / DW_MG_BN), 1);
    DW_OPS_REQUIRE(ctx, op, grid.y <= 65535);
    if (dt == DW_ACT_F32) dw_moe_gemm_simt_kernel<float><<<grid, DW_MG_THREADS, 0, s>>>(*a);
    else dw_moe_gemm_simt_kernel<dw_bf16><<<grid, DW_MG_THREADS, 0, s>>>(*a);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return block_sumsq();
}
