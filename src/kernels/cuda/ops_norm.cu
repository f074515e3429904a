/* ops_norm.cu — CUDA layernorm and rmsnorm over the last dimension C (head_rmsnorm: rmsnorm over
 * each head's D channels), forward and backward; FP32 or BF16 activations, FP32 weights,
 * statistics and parameter gradients. One block per row with deterministic block sums (BF16 rows
 * of C % 8 == 0, C <= 8192: one to eight warps per row, the row in registers, 16-byte accesses);
 * parameter gradients by the fixed-order column sum (ops_common.cuh), or, with a workspace
 * (..._bwd_ws), in the same pass as dx from per-block partials. rmsnorm may apply its weight as
 * woff + w (Gemma's 1 + w, rounded to FP32 as the CPU oracle does). Oracle: kernels/cpu/norm_cpu.c.
 * dw_cuda_norm_fwd_fp8 also writes the BF16 output's fp8_block rows from the registers (and counts
 * them), for the quantised linear layers that read it (runtime/cuda/act_quant_cuda.c): the bits
 * dw_quantize_cuda writes for the stored output (tests/gpu/test_norm_fp8.c). */
#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/quant_common.cuh"
#include "kernels/cuda/ops_cuda.h"

#define DW_NORM_THREADS 256

/* The weight a norm applies at column c: w[c], or woff + w[c] rounded to FP32 (woff 0: w itself) */
static __device__ __forceinline__ float dw_norm_w(const float *w, int64_t c, float woff) {
    return woff != 0.0f ? woff + w[c] : w[c];
}
/* 4 weights from w + c (16-byte aligned), each offset as dw_norm_w */
static __device__ __forceinline__ void dw_norm_w4(const float *w, int64_t c, float woff, float *v) {
    dw_ld4(w, c, v);
    if (woff != 0.0f)
        for (int k = 0; k < 4; k++) v[k] = woff + v[k];
}

/* out (N,C) = (x - mean) * rstd * w (+ b); RMS: mean = 0 and var = mean(x^2). mean/rstd (N) may
 * be NULL. Two passes over the row (mean, then the centred variance) as the CPU oracle. */
template <typename T, bool RMS>
static __global__ void dw_norm_fwd_kernel(T *out, float *mean, float *rstd, const T *x,
                                          const float *w, const float *b, int64_t C, float eps,
                                          float woff) {
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
        float y = (dw_ld(xr, c) - m) * rs * dw_norm_w(w, c, woff);
        if (!RMS && b) y += b[c];
        dw_st(out, row * C + c, y);
    }
    if (threadIdx.x == 0) {
        if (!RMS && mean) mean[row] = m;
        if (rstd) rstd[row] = rs;
    }
}

/* dx (N,C) = rstd * (g - mean_c(g) - xhat * mean_c(g*xhat)), g = dout*w (RMS: no mean_c(g));
 * acc: dx += that instead (dx must not alias dout then) */
template <typename T, bool RMS>
static __global__ void dw_norm_bwd_dx_kernel(T *dx, const T *dout, const T *x, const float *w,
                                             const float *mean, const float *rstd, int64_t C,
                                             bool acc, float woff) {
    __shared__ float sh[32];
    const int64_t row = blockIdx.x;
    const T *xr = x + row * C, *gr = dout + row * C;
    const float m = RMS ? 0.0f : mean[row], rs = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        const float g = dw_ld(gr, c) * dw_norm_w(w, c, woff);
        sg += g;
        sgx += g * ((dw_ld(xr, c) - m) * rs);
    }
    sg = RMS ? 0.0f : dw_block_sum(sg, sh) / (float)C;
    sgx = dw_block_sum(sgx, sh) / (float)C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        const float g = dw_ld(gr, c) * dw_norm_w(w, c, woff), xh = (dw_ld(xr, c) - m) * rs;
        const float o = rs * (g - sg - xh * sgx);
        dw_st(dx, row * C + c, acc ? dw_ld(dx, row * C + c) + o : o);
    }
}

/* BF16 rows with C % 8 == 0 and C <= DW_NW_MAXC, 16-byte aligned: TPR threads per row (one to
 * eight warps, DW_NW_THREADS / TPR rows per block), the row held in registers (thread tr owns the
 * 8-element groups tr, tr + TPR, ...), 16-byte loads and stores, one read and one write of each
 * element; the same formulas as the block kernels above. TPR = 32: warp sums only. */
#define DW_NW_VPL 4                      /* 8-element groups per thread */
#define DW_NW_THREADS 256                /* threads per block */
#define DW_NW_MAXC (DW_NW_THREADS * 8 * DW_NW_VPL) /* 8192 */
#define DW_NF_VPL 2                      /* the fused backward: groups per thread */
#define DW_NF_MAXC (DW_NW_THREADS * 8 * DW_NF_VPL) /* 4096 */

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

/* The output's fp8_block rows as the norm writes it (QM 1; QM 2 also counted: dw_cuda_norm_fwd_fp8):
 * codes [N, C] E4M3, scales [N, C/128]; cnt the counter pair the rows' counts go to. */
struct DwNormQ {
    uint8_t *codes;
    float *scales;
    unsigned long long *cnt;
};

template <bool RMS, int TPR, int QM = 0>
static __global__ void __launch_bounds__(DW_NW_THREADS)
dw_norm_fwd_rows_kernel(dw_bf16 *out, float *mean, float *rstd, const dw_bf16 *x, const float *w,
                        const float *b, int64_t N, int64_t C, float eps, float woff, DwNormQ nq = {}) {
    __shared__ float sh[DW_NW_THREADS / 32];
    const int tr = (int)(threadIdx.x % TPR);
    const int64_t row = (int64_t)blockIdx.x * (DW_NW_THREADS / TPR) + threadIdx.x / TPR;
    /* uniform over the warp; wider rows: no barrier skipped; quantising: every warp meets the
     * shuffles and the counters' flush */
    if (QM == 0 && TPR == 32 && row >= N) return;
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
    dwqc::Acc acc[2] = {};
#pragma unroll
    for (int q = 0; q < DW_NW_VPL; q++) {
        const int64_t j = tr + TPR * q;
        float y[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (j < C8) {
            float wv[8], bv[8];
            dw_norm_w4(w, 8 * j, woff, wv); /* 16-byte loads: 8x fewer L1 wavefronts than 8 scalar ones */
            dw_norm_w4(w, 8 * j + 4, woff, wv + 4);
            if (!RMS && b) {
                dw_ld4(b, 8 * j, bv);
                dw_ld4(b, 8 * j + 4, bv + 4);
            }
#pragma unroll
            for (int k = 0; k < 8; k++) {
                y[k] = (v[q][k] - m) * rs * wv[k];
                if (!RMS && b) y[k] += bv[k];
            }
            dw_st8(out, row * C + 8 * j, y);
        }
        if constexpr (QM > 0) { /* a 1x128 block: 16 lanes of one q (C % 128 == 0); every lane shuffles */
#pragma unroll
            for (int k = 0; k < 8; k++) y[k] = __bfloat162float(__float2bfloat16_rn(y[k])); /* as stored */
            const uint32_t am = dwq::chunk_amax<128>(y);
            const float sc = dw_rule_fp8_scale(am, false);
            uint32_t wd[2];
            dwq::encode8<dwq::F_E4M3>(dwq::fp8_q(sc), y, wd);
            if (j < C8) {
                *reinterpret_cast<uint2 *>(nq.codes + row * C + 8 * j) = make_uint2(wd[0], wd[1]);
                if (j % 16 == 0) nq.scales[row * (C / 128) + j / 16] = sc;
                if constexpr (QM == 2) dwqc::test_n<8>(dwqc::Fmt{8, false}, false, y, wd, sc, 1.0f, acc[0]);
            }
        }
    }
    if (tr == 0 && row < N) {
        if (!RMS && mean) mean[row] = m;
        if (rstd) rstd[row] = rs;
    }
    if constexpr (QM == 2) {
        __shared__ unsigned long long qsh[4 * (DW_NW_THREADS / 32)];
        unsigned long long *const pairs[2] = {nq.cnt, nullptr};
        dwqc::flush<DW_NW_THREADS / 32>(acc, pairs, (unsigned long long)(N * C), qsh, (int)(threadIdx.x >> 5),
                                        (int)(threadIdx.x & 31), [] { __syncthreads(); });
    }
}

/* dx as dw_norm_bwd_dx_kernel; the grid strides over groups of DW_NW_THREADS / TPR rows (one
 * group per block without PART). dx may be dout unless acc: every thread reads its groups before
 * the row sums, writes them after. PART (the fused backward): the block also sums dout * xhat
 * (and dout) of its rows per column, in a fixed order (its rows in ascending group, then its row
 * slots in ascending order), into pdw[blockIdx.x, :] (and pdb) (gridDim.x, C): the column sums
 * over the blocks are left to the caller. VPL 8-element groups per thread. */
template <bool RMS, int TPR, int VPL, bool PART>
static __global__ void __launch_bounds__(DW_NW_THREADS)
dw_norm_bwd_rows_kernel(dw_bf16 *dx, float *pdw, float *pdb, const dw_bf16 *dout, const dw_bf16 *x,
                        const float *w, const float *mean, const float *rstd, int64_t N, int64_t C,
                        bool acc, float woff) {
    constexpr int RPB = DW_NW_THREADS / TPR; /* rows per group */
    __shared__ float sh[DW_NW_THREADS / 32];
    const int tr = (int)(threadIdx.x % TPR), slot = (int)(threadIdx.x / TPR);
    float adw[PART ? VPL : 1][8], adb[PART ? VPL : 1][8];
    if constexpr (PART)
        for (int q = 0; q < VPL; q++)
            for (int k = 0; k < 8; k++) adw[q][k] = adb[q][k] = 0.0f;
    const int64_t ngroups = (N + RPB - 1) / RPB;
    for (int64_t rg = blockIdx.x; rg < ngroups; rg += gridDim.x) { /* uniform over the block */
        const int64_t row = rg * RPB + slot;
        const bool ok = row < N;
        const int64_t C8 = ok ? C / 8 : 0;
        const float m = RMS || !ok ? 0.0f : mean[row], rs = ok ? rstd[row] : 0.0f;
        float g[VPL][8], xh[VPL][8];
        float sg = 0.0f, sgx = 0.0f;
#pragma unroll
        for (int q = 0; q < VPL; q++) {
            const int64_t j = tr + TPR * q;
            if (j < C8) {
                float wv[8];
                dw_ld8(dout, row * C + 8 * j, g[q]);
                dw_ld8(x, row * C + 8 * j, xh[q]);
                dw_norm_w4(w, 8 * j, woff, wv);
                dw_norm_w4(w, 8 * j + 4, woff, wv + 4);
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    xh[q][k] = (xh[q][k] - m) * rs;
                    if constexpr (PART) {
                        adw[q][k] += g[q][k] * xh[q][k];
                        adb[q][k] += g[q][k];
                    }
                    g[q][k] *= wv[k];
                    sg += g[q][k];
                    sgx += g[q][k] * xh[q][k];
                }
            }
        }
        sg = RMS ? 0.0f : dw_norm_row_sum<TPR>(sg, sh) / (float)C;
        sgx = dw_norm_row_sum<TPR>(sgx, sh) / (float)C;
#pragma unroll
        for (int q = 0; q < VPL; q++) {
            const int64_t j = tr + TPR * q;
            if (j < C8) {
                float o[8], old[8];
                if (acc) dw_ld8(dx, row * C + 8 * j, old);
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    o[k] = rs * (g[q][k] - sg - xh[q][k] * sgx);
                    if (acc) o[k] += old[k];
                }
                dw_st8(dx, row * C + 8 * j, o);
            }
        }
    }
    if constexpr (PART) {
        /* the block's column sums: slots in ascending order, through shared memory */
        __shared__ float red[DW_NW_THREADS * VPL * 8];
        for (int pass = 0; pass < (RMS ? 1 : 2); pass++) {
            float *dst = pass ? pdb : pdw;
            __syncthreads(); /* the previous pass's readers are done */
#pragma unroll
            for (int q = 0; q < VPL; q++)
#pragma unroll
                for (int k = 0; k < 8; k++)
                    red[(q * 8 + k) * DW_NW_THREADS + threadIdx.x] = pass ? adb[q][k] : adw[q][k];
            __syncthreads();
            if (slot == 0 && dst) {
#pragma unroll
                for (int q = 0; q < VPL; q++) {
                    const int64_t j = tr + TPR * q;
                    if (j >= C / 8) continue;
                    for (int k = 0; k < 8; k++) {
                        float t = 0.0f;
                        for (int r = 0; r < RPB; r++) t += red[(q * 8 + k) * DW_NW_THREADS + r * TPR + tr];
                        dst[(int64_t)blockIdx.x * C + 8 * j + k] = t;
                    }
                }
            }
        }
    }
}

/* the row kernels apply (BF16 only; the pointers' row starts, w and b 16-byte aligned) */
static bool dw_norm_rows_ok(int64_t C, const void *a, const void *b, const void *c, const float *w,
                            const float *bias) {
    return C % 8 == 0 && C <= DW_NW_MAXC && dw_aligned16(a) && dw_aligned16(b) && dw_aligned16(c) &&
           dw_aligned16(w) && (!bias || dw_aligned16(bias));
}
/* threads per row: the fewest (32, 64, 128, 256) that hold C in vpl groups each */
static int dw_norm_tpr(int64_t C, int vpl) {
    int tpr = 32;
    while ((int64_t)tpr * 8 * vpl < C) tpr *= 2;
    return tpr;
}
#define DW_NW_LAUNCH(KERNEL, RMS, C, N, s, ...)                                                 \
    do {                                                                                       \
        const int tpr_ = dw_norm_tpr(C, DW_NW_VPL);                                            \
        const int rpb_ = DW_NW_THREADS / tpr_;                                                 \
        const unsigned nb_ = (unsigned)(((N) + rpb_ - 1) / rpb_);                              \
        if (tpr_ == 32) KERNEL<RMS, 32><<<nb_, DW_NW_THREADS, 0, s>>>(__VA_ARGS__);            \
        else if (tpr_ == 64) KERNEL<RMS, 64><<<nb_, DW_NW_THREADS, 0, s>>>(__VA_ARGS__);       \
        else if (tpr_ == 128) KERNEL<RMS, 128><<<nb_, DW_NW_THREADS, 0, s>>>(__VA_ARGS__);     \
        else KERNEL<RMS, 256><<<nb_, DW_NW_THREADS, 0, s>>>(__VA_ARGS__);                      \
    } while (0)

/* dw_norm_bwd_rows_kernel with TPR from C and VPL on `blocks` blocks; PART: at most as many as
 * are resident at once on the device (a second, partial wave of equal blocks would leave SMs
 * idle). Returns the blocks launched. */
template <bool RMS, int VPL, bool PART>
static int64_t dw_norm_bwd_rows_launch(int64_t blocks, dw_bf16 *dx, float *pdw, float *pdb,
                                       const dw_bf16 *dout, const dw_bf16 *x, const float *w,
                                       const float *mean, const float *rstd, int64_t N, int64_t C,
                                       bool acc, float woff, cudaStream_t s) {
    void (*k)(dw_bf16 *, float *, float *, const dw_bf16 *, const dw_bf16 *, const float *,
              const float *, const float *, int64_t, int64_t, bool, float);
    switch (dw_norm_tpr(C, VPL)) {
    case 32: k = dw_norm_bwd_rows_kernel<RMS, 32, VPL, PART>; break;
    case 64: k = dw_norm_bwd_rows_kernel<RMS, 64, VPL, PART>; break;
    case 128: k = dw_norm_bwd_rows_kernel<RMS, 128, VPL, PART>; break;
    default: k = dw_norm_bwd_rows_kernel<RMS, 256, VPL, PART>; break;
    }
#ifdef __CUDACC__
    if (PART) {
        int dev = 0, sms = 0, per_sm = 0;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, DW_NW_THREADS, 0) == cudaSuccess) {
            if ((int64_t)sms * per_sm > 0 && (int64_t)sms * per_sm < blocks) blocks = (int64_t)sms * per_sm;
        } else {
            (void)cudaGetLastError(); /* no query: all the blocks asked for */
        }
    }
#endif
    k<<<(unsigned)blocks, DW_NW_THREADS, 0, s>>>(dx, pdw, pdb, dout, x, w, mean, rstd, N, C, acc, woff);
    return blocks;
}

template <typename T, bool RMS>
static void dw_norm_fwd_launch(void *out, float *mean, float *rstd, const void *x, const float *w,
                               const float *b, int64_t N, int64_t C, float eps, cudaStream_t s,
                               float woff = 0.0f) {
    if (sizeof(T) == 2 && dw_norm_rows_ok(C, out, x, x, w, b)) {
        DW_NW_LAUNCH(dw_norm_fwd_rows_kernel, RMS, C, N, s, (dw_bf16 *)out, mean, rstd,
                     (const dw_bf16 *)x, w, b, N, C, eps, woff);
        return;
    }
    dw_norm_fwd_kernel<T, RMS><<<(unsigned)N, DW_NORM_THREADS, 0, s>>>(
        (T *)out, mean, rstd, (const T *)x, w, b, C, eps, woff);
}

/* The fused backward (ws given, BF16 rows, C <= DW_NF_MAXC): one pass over dout and x writes (or
 * adds to) dx and per-block partial column sums into ws, then two small fixed-order column sums
 * over those blocks give dw, db. Otherwise: dw/db by the column-sum kernel over dout and x, then
 * dx. Deterministic either way. */
template <typename T, bool RMS>
static void dw_norm_bwd_launch(void *dx, float *dw, float *db, const void *dout, const void *x,
                               const float *w, const float *mean, const float *rstd, int64_t N,
                               int64_t C, bool acc, float *ws, cudaStream_t s, float woff = 0.0f) {
    const bool params = RMS ? dw != NULL : (dw || db);
    if (sizeof(T) == 2 && ws && dx && params && C <= DW_NF_MAXC && dw_norm_rows_ok(C, dx, dout, x, w, NULL)) {
        const int64_t gmax = (int64_t)(dw_cuda_norm_bwd_ws_bytes(N, C) / (2 * sizeof(float) * (size_t)C));
        float *pdw = ws, *pdb = ws + gmax * C;
        const int64_t G = dw_norm_bwd_rows_launch<RMS, DW_NF_VPL, true>(
            gmax, (dw_bf16 *)dx, pdw, pdb, (const dw_bf16 *)dout, (const dw_bf16 *)x, w, mean, rstd,
            N, C, acc, woff, s);
        if (dw) dw_colsum_launch<float, DW_CS_PLAIN>(dw, NULL, pdw, NULL, NULL, NULL, G, C, s);
        if (!RMS && db) dw_colsum_launch<float, DW_CS_PLAIN>(db, NULL, pdb, NULL, NULL, NULL, G, C, s);
        return;
    }
    /* parameter gradients first, so that dx may overwrite dout (in place) */
    if (RMS && dw)
        dw_colsum_launch<T, DW_CS_RMS>(dw, NULL, (const T *)dout, (const T *)x, NULL, rstd, N, C, s);
    if (!RMS && (dw || db))
        dw_colsum_launch<T, DW_CS_LN>(dw, db, (const T *)dout, (const T *)x, mean, rstd, N, C, s);
    if (dx && sizeof(T) == 2 && dw_norm_rows_ok(C, dx, dout, x, w, NULL)) {
        const int rpb = DW_NW_THREADS / dw_norm_tpr(C, DW_NW_VPL);
        dw_norm_bwd_rows_launch<RMS, DW_NW_VPL, false>(
            (N + rpb - 1) / rpb, (dw_bf16 *)dx, NULL, NULL, (const dw_bf16 *)dout,
            (const dw_bf16 *)x, w, mean, rstd, N, C, acc, woff, s);
    } else if (dx) {
        dw_norm_bwd_dx_kernel<T, RMS><<<(unsigned)N, DW_NORM_THREADS, 0, s>>>(
            (T *)dx, (const T *)dout, (const T *)x, w, mean, rstd, C, acc, woff);
    }
}

/* N is a grid dimension (one block per row): at most 2^31 - 1 rows. */
#define DW_NORM_MAX_ROWS 2147483647LL

template <bool RMS, int QM>
static void dw_norm_fwd_fp8_launch(void *out, float *mean, float *rstd, const void *x, const float *w, const float *b,
                                   int64_t N, int64_t C, float eps, float woff, DwNormQ q, cudaStream_t s) {
    const int tpr = dw_norm_tpr(C, DW_NW_VPL), rpb = DW_NW_THREADS / tpr;
    const unsigned nb = (unsigned)((N + rpb - 1) / rpb);
    auto k = dw_norm_fwd_rows_kernel<RMS, 256, QM>;
    if (tpr == 32) k = dw_norm_fwd_rows_kernel<RMS, 32, QM>;
    else if (tpr == 64) k = dw_norm_fwd_rows_kernel<RMS, 64, QM>;
    else if (tpr == 128) k = dw_norm_fwd_rows_kernel<RMS, 128, QM>;
    k<<<nb, DW_NW_THREADS, 0, s>>>((dw_bf16 *)out, mean, rstd, (const dw_bf16 *)x, w, b, N, C, eps, woff, q);
}

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

/* both norms' backward entries: arguments checked, then dw_norm_bwd_launch */
static dw_status dw_norm_bwd(dw_ctx *ctx, const char *op, bool rms, dw_act_dtype dt, void *dx,
                             float *dw, float *db, const void *dout, const void *x, const float *w,
                             const float *mean, const float *rstd, int64_t N, int64_t C,
                             bool accumulate, void *ws, size_t ws_bytes, void *stream, float woff = 0.0f) {
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N >= 0 && N <= DW_NORM_MAX_ROWS && C > 0);
    DW_OPS_REQUIRE(ctx, op, N == 0 || (dout && x && w && (rms || mean) && rstd));
    DW_OPS_REQUIRE(ctx, op, !accumulate || (dx && dx != dout));
    DW_OPS_REQUIRE(ctx, op, !ws || (ws_bytes >= dw_cuda_norm_bwd_ws_bytes(N, C) && ((uintptr_t)ws & 3u) == 0));
    if (N == 0) return DW_OK;
    cudaStream_t s = (cudaStream_t)stream;
    if (dt == DW_ACT_F32 && rms)
        dw_norm_bwd_launch<float, true>(dx, dw, NULL, dout, x, w, NULL, rstd, N, C, accumulate, (float *)ws, s, woff);
    else if (dt == DW_ACT_F32)
        dw_norm_bwd_launch<float, false>(dx, dw, db, dout, x, w, mean, rstd, N, C, accumulate, (float *)ws, s);
    else if (rms)
        dw_norm_bwd_launch<dw_bf16, true>(dx, dw, NULL, dout, x, w, NULL, rstd, N, C, accumulate, (float *)ws, s,
                                          woff);
    else
        dw_norm_bwd_launch<dw_bf16, false>(dx, dw, db, dout, x, w, mean, rstd, N, C, accumulate, (float *)ws, s);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

dw_status dw_cuda_layernorm_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, float *dw, float *db,
                                const void *dout, const void *x, const float *w, const float *mean,
                                const float *rstd, int64_t N, int64_t C, void *stream) {
    return dw_norm_bwd(ctx, "layernorm_bwd", false, dt, dx, dw, db, dout, x, w, mean, rstd, N, C,
                       false, NULL, 0, stream);
}
dw_status dw_cuda_layernorm_bwd_ws(dw_ctx *ctx, dw_act_dtype dt, void *dx, float *dw, float *db,
                                   const void *dout, const void *x, const float *w,
                                   const float *mean, const float *rstd, int64_t N, int64_t C,
                                   bool accumulate, void *ws, size_t ws_bytes, void *stream) {
    return dw_norm_bwd(ctx, "layernorm_bwd", false, dt, dx, dw, db, dout, x, w, mean, rstd, N, C,
                       accumulate, ws, ws_bytes, stream);
}

dw_status dw_cuda_rmsnorm_fwd_offset(dw_ctx *ctx, dw_act_dtype dt, void *out, float *rstd, const void *x,
                                     const float *w, double woff, int64_t N, int64_t C, double eps, void *stream) {
    const char *op = "rmsnorm_fwd";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N >= 0 && N <= DW_NORM_MAX_ROWS && C > 0 && eps >= 0.0 && isfinite(woff));
    DW_OPS_REQUIRE(ctx, op, N == 0 || (out && x && w));
    if (N == 0) return DW_OK;
    cudaStream_t s = (cudaStream_t)stream;
    if (dt == DW_ACT_F32)
        dw_norm_fwd_launch<float, true>(out, NULL, rstd, x, w, NULL, N, C, (float)eps, s, (float)woff);
    else
        dw_norm_fwd_launch<dw_bf16, true>(out, NULL, rstd, x, w, NULL, N, C, (float)eps, s, (float)woff);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}
dw_status dw_cuda_rmsnorm_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, float *rstd, const void *x,
                              const float *w, int64_t N, int64_t C, double eps, void *stream) {
    return dw_cuda_rmsnorm_fwd_offset(ctx, dt, out, rstd, x, w, 0.0, N, C, eps, stream);
}

dw_status dw_cuda_norm_fwd_fp8(dw_ctx *ctx, bool rms, void *out, float *mean, float *rstd, const void *x,
                               const float *w, const float *b, double woff, int64_t N, int64_t C, double eps,
                               uint8_t *codes, float *scales, uint64_t *counts, void *stream) {
    const char *op = rms ? "rmsnorm_fwd_fp8" : "layernorm_fwd_fp8";
    DW_OPS_REQUIRE(ctx, op, N >= 0 && N <= DW_NORM_MAX_ROWS && C > 0 && C % 128 == 0 && C <= DW_NW_MAXC && eps >= 0.0 &&
                                isfinite(woff) && (rms || woff == 0.0));
    if (N == 0) return DW_OK;
    DW_OPS_REQUIRE(ctx, op, out && x && w && codes && scales && dw_norm_rows_ok(C, out, x, x, w, rms ? NULL : b));
    DW_OPS_REQUIRE(ctx, op, ((uintptr_t)codes & 7u) == 0 && ((uintptr_t)scales & 3u) == 0);
    const DwNormQ q = {codes, scales, (unsigned long long *)counts};
    cudaStream_t s = (cudaStream_t)stream;
    if (rms && counts) dw_norm_fwd_fp8_launch<true, 2>(out, NULL, rstd, x, w, NULL, N, C, (float)eps, (float)woff, q, s);
    else if (rms) dw_norm_fwd_fp8_launch<true, 1>(out, NULL, rstd, x, w, NULL, N, C, (float)eps, (float)woff, q, s);
    else if (counts) dw_norm_fwd_fp8_launch<false, 2>(out, mean, rstd, x, w, b, N, C, (float)eps, 0.0f, q, s);
    else dw_norm_fwd_fp8_launch<false, 1>(out, mean, rstd, x, w, b, N, C, (float)eps, 0.0f, q, s);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

dw_status dw_cuda_rmsnorm_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, float *dw, const void *dout,
                              const void *x, const float *w, const float *rstd, int64_t N,
                              int64_t C, void *stream) {
    return dw_norm_bwd(ctx, "rmsnorm_bwd", true, dt, dx, dw, NULL, dout, x, w, NULL, rstd, N, C,
                       false, NULL, 0, stream);
}
dw_status dw_cuda_rmsnorm_bwd_ws(dw_ctx *ctx, dw_act_dtype dt, void *dx, float *dw,
                                 const void *dout, const void *x, const float *w,
                                 const float *rstd, int64_t N, int64_t C, bool accumulate,
                                 void *ws, size_t ws_bytes, void *stream) {
    return dw_norm_bwd(ctx, "rmsnorm_bwd", true, dt, dx, dw, NULL, dout, x, w, NULL, rstd, N, C,
                       accumulate, ws, ws_bytes, stream);
}
dw_status dw_cuda_rmsnorm_bwd_offset(dw_ctx *ctx, dw_act_dtype dt, void *dx, float *dw, const void *dout,
                                     const void *x, const float *w, double woff, const float *rstd, int64_t N,
                                     int64_t C, bool accumulate, void *ws, size_t ws_bytes, void *stream) {
    DW_OPS_REQUIRE(ctx, "rmsnorm_bwd", isfinite(woff));
    return dw_norm_bwd(ctx, "rmsnorm_bwd", true, dt, dx, dw, NULL, dout, x, w, NULL, rstd, N, C, accumulate, ws,
                       ws_bytes, stream, (float)woff);
}

/* head_rmsnorm: the rmsnorm above over N*H rows of D (each head's channels are contiguous); the
 * weight's column sums run over all N*H rows, so dw sums every head's contribution. */
dw_status dw_cuda_head_rmsnorm_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, float *rstd, const void *x,
                                   const float *w, int64_t N, int64_t H, int64_t D, double eps, void *stream) {
    const char *op = "head_rmsnorm_fwd";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N >= 0 && H > 0 && D > 0 && N <= DW_NORM_MAX_ROWS / H && eps >= 0.0);
    DW_OPS_REQUIRE(ctx, op, N == 0 || (out && x && w));
    if (N == 0) return DW_OK;
    if (dt == DW_ACT_F32)
        dw_norm_fwd_launch<float, true>(out, NULL, rstd, x, w, NULL, N * H, D, (float)eps, (cudaStream_t)stream);
    else
        dw_norm_fwd_launch<dw_bf16, true>(out, NULL, rstd, x, w, NULL, N * H, D, (float)eps, (cudaStream_t)stream);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}
dw_status dw_cuda_head_rmsnorm_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, float *dw, const void *dout,
                                   const void *x, const float *w, const float *rstd, int64_t N, int64_t H,
                                   int64_t D, bool accumulate, void *ws, size_t ws_bytes, void *stream) {
    const char *op = "head_rmsnorm_bwd";
    DW_OPS_REQUIRE(ctx, op, N >= 0 && H > 0 && N <= DW_NORM_MAX_ROWS / H);
    return dw_norm_bwd(ctx, op, true, dt, dx, dw, NULL, dout, x, w, NULL, rstd, N * H, D, accumulate, ws,
                       ws_bytes, stream);
}

} /* extern "C" */
