/* ops_attention.cu — CUDA causal self-attention with GQA, flash-attention style: K/V (or Q/dO)
 * tiles in shared memory, online softmax, no T x T matrix. Forward saves the log-sum-exp; backward
 * recomputes the probabilities from it in two kernels (dQ over query rows; dK, dV over key rows,
 * looping over the group's query heads), so every gradient is written once without atomics.
 * These are the reference kernels (one warp per row, one lane per key of a tile, FP32 FMA): FP32
 * activations, BF16 that neither faster path takes, and DW_ATTN=ref. BF16 with D <= 128 goes to
 * cuDNN's fused flash attention (attn_cudnn.c) when DW_ATTN picks it (dw_att_use_cudnn) and its
 * plan builds, else with D = 64 or 128 to the tensor-core kernels of attn_mma.cu (whose dQ kernel
 * computes delta itself). All paths save the same lse, so forward and backward may differ. A
 * sliding window or soft-capped scores (Gemma 2) take the same order: cuDNN where its plan for the
 * mask builds (attn_cudnn.c), the mma kernels where they apply, else these.
 * Oracle: kernels/cpu/attention_cpu.c. Layouts: q, out (B,T,H,D); k, v (B,T,Hkv,D); lse (B,H,T). */
#include "core/log.h"
#include "kernels/cuda/attn_cudnn.h"
#include "kernels/cuda/attn_mma.h"
#include "kernels/cuda/attn_packed.h"
#include "kernels/cuda/ops_common.cuh"

#define DW_ATT_BR 8  /* rows (warps) per block */
#define DW_ATT_BC 32 /* keys (or queries) per tile: one per lane */
#define DW_ATT_THREADS (32 * DW_ATT_BR)
#define DW_FULL 0xffffffffu

/* offset of row t, head h of a (B,T,heads,D) tensor */
static __device__ __forceinline__ int64_t dw_att_off(int64_t b, int64_t t, int64_t h, int64_t T_,
                                                     int64_t heads, int64_t D) {
    return ((b * T_ + t) * heads + h) * D;
}
static __device__ __forceinline__ float dw_dotf(const float *a, const float *b, int64_t D) {
    float acc = 0.0f;
    for (int64_t d = 0; d < D; d++) acc = fmaf(a[d], b[d], acc);
    return acc;
}
/* The first key query t sees: 0, or t-W+1 under a sliding window of W keys (W 0: none), as the CPU
 * oracle (kernels/cpu/attention_cpu.c). */
static __device__ __forceinline__ int64_t dw_att_first_key(int64_t t, int64_t W) {
    return W > 0 && t - W + 1 > 0 ? t - W + 1 : 0;
}
/* The score of a scaled dot product z: z, or cap tanh(z / cap) soft-capped (cap > 0, Gemma 2); and
 * d score / dz at the score s: 1 - (s / cap)^2 (1 without a cap), as the CPU oracle. */
static __device__ __forceinline__ float dw_att_cap(float z, float cap) { return cap > 0.0f ? cap * tanhf(z / cap) : z; }
static __device__ __forceinline__ float dw_att_dcap(float s, float cap) {
    return cap > 0.0f ? 1.0f - (s / cap) * (s / cap) : 1.0f;
}
/* Loads rows r0..r0+DW_ATT_BC-1 (head hd) of a (B,T,heads,D) tensor into dst[row][D+1]; rows past
 * T are zero. Whole block. */
template <typename T>
static __device__ __forceinline__ void dw_att_load_tile(float *dst, const T *src, int64_t b,
                                                        int64_t r0, int64_t hd, int64_t T_,
                                                        int64_t heads, int64_t D) {
    for (int64_t e = threadIdx.x; e < DW_ATT_BC * D; e += blockDim.x) {
        const int64_t rr = e / D, d = e % D, r = r0 + rr;
        dst[rr * (D + 1) + d] = r < T_ ? dw_ld(src, dw_att_off(b, r, hd, T_, heads, D) + d) : 0.0f;
    }
}

/* grid (ceil(T/BR), H, B). Warp w owns query row t = blockIdx.x*BR + w; lane owns output dims
 * lane, lane+32, ... (NR = ceil(D/32) registers). smem: Qs[BR][D], Ks[BC][D+1], Vs[BC][D+1]. */
template <typename T, int NR>
static __global__ void __launch_bounds__(DW_ATT_THREADS)
dw_att_fwd_kernel(T *out, float *lse, const T *q, const T *k, const T *v, int64_t T_, int64_t H,
                  int64_t Hkv, int64_t D, float scale, int64_t W, float cap) {
    extern __shared__ float sm[];
    const int64_t DP = D + 1;
    float *Qs = sm, *Ks = Qs + DW_ATT_BR * D, *Vs = Ks + DW_ATT_BC * DP;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (H / Hkv);
    const int64_t t0 = (int64_t)blockIdx.x * DW_ATT_BR, t = t0 + w;
    const bool row_ok = t < T_;
    float *qs = Qs + w * D;
    for (int64_t d = lane; d < D; d += 32)
        qs[d] = row_ok ? dw_ld(q, dw_att_off(b, t, h, T_, H, D) + d) : 0.0f;
    float m = -INFINITY, l = 0.0f, o[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) o[r] = 0.0f;
    const int64_t t_hi = (t0 + DW_ATT_BR < T_ ? t0 + DW_ATT_BR : T_) - 1;
    const int64_t lo = dw_att_first_key(t0, W), lo_t = dw_att_first_key(t, W); /* the block's, the row's */
    for (int64_t j0 = lo / DW_ATT_BC * DW_ATT_BC; j0 <= t_hi; j0 += DW_ATT_BC) {
        __syncthreads(); /* the previous tile is consumed (and qs is visible) */
        dw_att_load_tile(Ks, k, b, j0, g, T_, Hkv, D);
        dw_att_load_tile(Vs, v, b, j0, g, T_, Hkv, D);
        __syncthreads();
        if (row_ok && j0 <= t && j0 + DW_ATT_BC > lo_t) { /* uniform over the warp: a key it sees */
            const int64_t j = j0 + lane;
            const bool seen = j <= t && j >= lo_t;
            const float s = seen ? dw_att_cap(dw_dotf(qs, Ks + lane * DP, D) * scale, cap) : -INFINITY;
            const float mn = fmaxf(m, dw_warp_max(s)); /* finite: some lane sees its key */
            const float p = seen ? expf(s - mn) : 0.0f;
            const float alpha = expf(m - mn); /* 0 on the first tile (m = -inf) */
            l = l * alpha + dw_warp_sum(p);
#pragma unroll
            for (int r = 0; r < NR; r++) o[r] *= alpha;
            const int nj = (int)(t - j0 + 1 < DW_ATT_BC ? t - j0 + 1 : DW_ATT_BC);
            for (int jj = 0; jj < nj; jj++) {
                const float pj = __shfl_sync(DW_FULL, p, jj);
                const float *vr = Vs + jj * DP;
#pragma unroll
                for (int r = 0; r < NR; r++) {
                    const int64_t d = lane + 32 * r;
                    if (d < D) o[r] = fmaf(pj, vr[d], o[r]);
                }
            }
            m = mn;
        }
    }
    if (row_ok) {
        const float inv = 1.0f / l;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const int64_t d = lane + 32 * r;
            if (d < D) dw_st(out, dw_att_off(b, t, h, T_, H, D) + d, o[r] * inv);
        }
        if (lane == 0) lse[(b * H + h) * T_ + t] = m + logf(l);
    }
}

/* delta (B,H,T) = rowsum(dout * out); one warp per row */
template <typename T>
static __global__ void dw_att_delta_kernel(float *delta, const T *dout, const T *out, int64_t T_,
                                           int64_t H, int64_t D, int64_t rows) {
    const int64_t row = (int64_t)blockIdx.x * DW_ATT_BR + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return; /* whole warp */
    const int64_t b = row / (H * T_), h = (row / T_) % H, t = row % T_;
    const int64_t base = dw_att_off(b, t, h, T_, H, D);
    float s = 0.0f;
    for (int64_t d = lane; d < D; d += 32) s = fmaf(dw_ld(dout, base + d), dw_ld(out, base + d), s);
    s = dw_warp_sum(s);
    if (lane == 0) delta[row] = s;
}

/* dq: grid (ceil(T/BR), H, B), warp per query row t:
 *   p_j = exp(q.k_j*scale - lse_t), ds_j = p_j (dout_t.v_j - delta_t), dq_t = scale sum_j ds_j k_j
 * smem: Qs[BR][D], Gs[BR][D] (dout rows), Ks[BC][D+1], Vs[BC][D+1]. */
template <typename T, int NR>
static __global__ void __launch_bounds__(DW_ATT_THREADS)
dw_att_bwd_dq_kernel(T *dq, const T *dout, const T *q, const T *k, const T *v, const float *lse,
                     const float *delta, int64_t T_, int64_t H, int64_t Hkv, int64_t D,
                     float scale, int64_t W, float cap) {
    extern __shared__ float sm[];
    const int64_t DP = D + 1;
    float *Qs = sm, *Gs = Qs + DW_ATT_BR * D, *Ks = Gs + DW_ATT_BR * D, *Vs = Ks + DW_ATT_BC * DP;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (H / Hkv);
    const int64_t t0 = (int64_t)blockIdx.x * DW_ATT_BR, t = t0 + w;
    const bool row_ok = t < T_;
    float *qs = Qs + w * D, *gs = Gs + w * D;
    for (int64_t d = lane; d < D; d += 32) {
        qs[d] = row_ok ? dw_ld(q, dw_att_off(b, t, h, T_, H, D) + d) : 0.0f;
        gs[d] = row_ok ? dw_ld(dout, dw_att_off(b, t, h, T_, H, D) + d) : 0.0f;
    }
    const float lse_t = row_ok ? lse[(b * H + h) * T_ + t] : 0.0f;
    const float del_t = row_ok ? delta[(b * H + h) * T_ + t] : 0.0f;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
    const int64_t t_hi = (t0 + DW_ATT_BR < T_ ? t0 + DW_ATT_BR : T_) - 1;
    const int64_t lo = dw_att_first_key(t0, W), lo_t = dw_att_first_key(t, W);
    for (int64_t j0 = lo / DW_ATT_BC * DW_ATT_BC; j0 <= t_hi; j0 += DW_ATT_BC) {
        __syncthreads();
        dw_att_load_tile(Ks, k, b, j0, g, T_, Hkv, D);
        dw_att_load_tile(Vs, v, b, j0, g, T_, Hkv, D);
        __syncthreads();
        if (row_ok && j0 <= t && j0 + DW_ATT_BC > lo_t) {
            const int64_t j = j0 + lane;
            float ds = 0.0f;
            if (j <= t && j >= lo_t) {
                const float sc = dw_att_cap(dw_dotf(qs, Ks + lane * DP, D) * scale, cap);
                const float p = expf(sc - lse_t);
                ds = p * (dw_dotf(gs, Vs + lane * DP, D) - del_t) * dw_att_dcap(sc, cap);
            }
            const int nj = (int)(t - j0 + 1 < DW_ATT_BC ? t - j0 + 1 : DW_ATT_BC);
            for (int jj = 0; jj < nj; jj++) {
                const float dsj = __shfl_sync(DW_FULL, ds, jj);
                const float *kr = Ks + jj * DP;
#pragma unroll
                for (int r = 0; r < NR; r++) {
                    const int64_t d = lane + 32 * r;
                    if (d < D) acc[r] = fmaf(dsj, kr[d], acc[r]);
                }
            }
        }
    }
    if (row_ok) {
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const int64_t d = lane + 32 * r;
            if (d < D) dw_st(dq, dw_att_off(b, t, h, T_, H, D) + d, acc[r] * scale);
        }
    }
}

/* dk, dv: grid (ceil(T/BR), Hkv, B), warp per key row j of KV head g; loops over the group's query
 * heads (ascending) and query tiles t >= j:
 *   dv_j = sum p_tj dout_t,  dk_j = scale sum ds_tj q_t
 * smem: Kw[BR][D], Vw[BR][D], Qs[BC][D+1], Gs[BC][D+1], Ls[BC], Dl[BC]. */
template <typename T, int NR>
static __global__ void __launch_bounds__(DW_ATT_THREADS)
dw_att_bwd_dkv_kernel(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v,
                      const float *lse, const float *delta, int64_t T_, int64_t H, int64_t Hkv,
                      int64_t D, float scale, int64_t W, float cap) {
    extern __shared__ float sm[];
    const int64_t DP = D + 1;
    float *Kw = sm, *Vw = Kw + DW_ATT_BR * D, *Qs = Vw + DW_ATT_BR * D, *Gs = Qs + DW_ATT_BC * DP;
    float *Ls = Gs + DW_ATT_BC * DP, *Dl = Ls + DW_ATT_BC;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t b = blockIdx.z, g = blockIdx.y, group = H / Hkv;
    const int64_t j0b = (int64_t)blockIdx.x * DW_ATT_BR, j = j0b + w;
    const bool key_ok = j < T_;
    float *kw = Kw + w * D, *vw = Vw + w * D;
    for (int64_t d = lane; d < D; d += 32) {
        kw[d] = key_ok ? dw_ld(k, dw_att_off(b, j, g, T_, Hkv, D) + d) : 0.0f;
        vw[d] = key_ok ? dw_ld(v, dw_att_off(b, j, g, T_, Hkv, D) + d) : 0.0f;
    }
    float ak[NR], av[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) ak[r] = av[r] = 0.0f;
    /* queries that see the block's keys: up to its last key's + W - 1 under a window */
    const int64_t i_end = W > 0 && j0b + DW_ATT_BR - 1 + W < T_ ? j0b + DW_ATT_BR - 1 + W : T_;
    for (int64_t h = g * group; h < (g + 1) * group; h++) {
        for (int64_t i0 = j0b; i0 < i_end; i0 += DW_ATT_BC) {
            __syncthreads();
            dw_att_load_tile(Qs, q, b, i0, h, T_, H, D);
            dw_att_load_tile(Gs, dout, b, i0, h, T_, H, D);
            for (int e = threadIdx.x; e < DW_ATT_BC; e += blockDim.x) {
                const int64_t tq = i0 + e;
                Ls[e] = tq < T_ ? lse[(b * H + h) * T_ + tq] : 0.0f;
                Dl[e] = tq < T_ ? delta[(b * H + h) * T_ + tq] : 0.0f;
            }
            __syncthreads();
            if (key_ok) {
                const int64_t tq = i0 + lane;
                float p = 0.0f, ds = 0.0f;
                if (tq < T_ && tq >= j && (W <= 0 || tq < j + W)) {
                    const float sc = dw_att_cap(dw_dotf(Qs + lane * DP, kw, D) * scale, cap);
                    p = expf(sc - Ls[lane]);
                    ds = p * (dw_dotf(Gs + lane * DP, vw, D) - Dl[lane]) * dw_att_dcap(sc, cap);
                }
                const int ni = (int)(T_ - i0 < DW_ATT_BC ? T_ - i0 : DW_ATT_BC);
                for (int ii = 0; ii < ni; ii++) {
                    const float pi = __shfl_sync(DW_FULL, p, ii), dsi = __shfl_sync(DW_FULL, ds, ii);
                    const float *qr = Qs + ii * DP, *gr = Gs + ii * DP;
#pragma unroll
                    for (int r = 0; r < NR; r++) {
                        const int64_t d = lane + 32 * r;
                        if (d < D) {
                            av[r] = fmaf(pi, gr[d], av[r]);
                            ak[r] = fmaf(dsi, qr[d], ak[r]);
                        }
                    }
                }
            }
        }
    }
    if (key_ok) {
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const int64_t d = lane + 32 * r;
            if (d < D) {
                dw_st(dk, dw_att_off(b, j, g, T_, Hkv, D) + d, ak[r] * scale);
                dw_st(dv, dw_att_off(b, j, g, T_, Hkv, D) + d, av[r]);
            }
        }
    }
}

/* ---- launchers ----------------------------------------------------------------------------- */
template <typename KernelT>
static cudaError_t dw_att_prepare(KernelT kernel, size_t smem) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
}

template <typename T, int NR>
static cudaError_t dw_att_fwd_launch(void *out, float *lse, const void *q, const void *k,
                                     const void *v, int64_t B, int64_t T_, int64_t H, int64_t Hkv,
                                     int64_t D, int64_t W, float cap, cudaStream_t s) {
    const size_t smem = (size_t)(DW_ATT_BR * D + 2 * DW_ATT_BC * (D + 1)) * sizeof(float);
    cudaError_t e = dw_att_prepare(dw_att_fwd_kernel<T, NR>, smem);
    if (e != cudaSuccess) return e;
    const dim3 grid((unsigned)((T_ + DW_ATT_BR - 1) / DW_ATT_BR), (unsigned)H, (unsigned)B);
    dw_att_fwd_kernel<T, NR><<<grid, DW_ATT_THREADS, smem, s>>>(
        (T *)out, lse, (const T *)q, (const T *)k, (const T *)v, T_, H, Hkv, D,
        (float)(1.0 / sqrt((double)D)), W, cap);
    return cudaGetLastError();
}

template <typename T, int NR>
static cudaError_t dw_att_bwd_launch(void *dq, void *dk, void *dv, const void *dout, const void *q,
                                     const void *k, const void *v, const void *out,
                                     const float *lse, float *delta, int64_t B, int64_t T_,
                                     int64_t H, int64_t Hkv, int64_t D, int64_t W, float cap, cudaStream_t s) {
    const float scale = (float)(1.0 / sqrt((double)D));
    const int64_t rows = B * H * T_;
    dw_att_delta_kernel<T><<<(unsigned)((rows + DW_ATT_BR - 1) / DW_ATT_BR), DW_ATT_THREADS, 0, s>>>(
        delta, (const T *)dout, (const T *)out, T_, H, D, rows);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const size_t smem_q = (size_t)(2 * DW_ATT_BR * D + 2 * DW_ATT_BC * (D + 1)) * sizeof(float);
    const size_t smem_kv = smem_q + 2 * DW_ATT_BC * sizeof(float);
    if ((e = dw_att_prepare(dw_att_bwd_dq_kernel<T, NR>, smem_q)) != cudaSuccess) return e;
    if ((e = dw_att_prepare(dw_att_bwd_dkv_kernel<T, NR>, smem_kv)) != cudaSuccess) return e;
    const unsigned tiles = (unsigned)((T_ + DW_ATT_BR - 1) / DW_ATT_BR);
    dw_att_bwd_dq_kernel<T, NR><<<dim3(tiles, (unsigned)H, (unsigned)B), DW_ATT_THREADS, smem_q, s>>>(
        (T *)dq, (const T *)dout, (const T *)q, (const T *)k, (const T *)v, lse, delta, T_, H, Hkv,
        D, scale, W, cap);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    dw_att_bwd_dkv_kernel<T, NR><<<dim3(tiles, (unsigned)Hkv, (unsigned)B), DW_ATT_THREADS, smem_kv, s>>>(
        (T *)dk, (T *)dv, (const T *)dout, (const T *)q, (const T *)k, (const T *)v, lse, delta, T_,
        H, Hkv, D, scale, W, cap);
    return cudaGetLastError();
}

/* NR = registers per lane for one D-vector: 1, 2, 4 or 8 (D <= 32, 64, 128, 256) */
#define DW_ATT_DISPATCH(T, D, call)                                                            \
    ((D) <= 32 ? call<T, 1> : (D) <= 64 ? call<T, 2> : (D) <= 128 ? call<T, 4> : call<T, 8>)

static dw_status dw_att_check(dw_ctx *ctx, const char *op, dw_act_dtype dt, int64_t B, int64_t T,
                              int64_t H, int64_t Hkv, int64_t D) {
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, B >= 0 && T >= 0 && H > 0 && Hkv > 0 && H % Hkv == 0);
    DW_OPS_REQUIRE(ctx, op, D > 0 && D <= DW_CUDA_ATTN_MAX_D);
    DW_OPS_REQUIRE(ctx, op, B <= 65535 && H <= 65535 && (T + DW_ATT_BR - 1) / DW_ATT_BR <= INT32_MAX);
    return DW_OK;
}

/* Default path for BF16 when DW_ATTN is unset: 1 cuDNN, 0 the mma kernels. cuDNN is about twice
 * as fast on the H200 (bench/RESULTS.md "Attention through cuDNN") with the numerics of every
 * flash attention (P and dS in one BF16 term, as torch SDPA) and a non-deterministic backward;
 * DW_ATTN=mma gives the deterministic two-term kernels (docs/kernels.md). */
#define DW_ATT_DEFAULT_CUDNN 1

/* Whether BF16 attention tries cuDNN first, from DW_ATTN (attn_mma.h's dw_attn_mode). */
static bool dw_att_use_cudnn(void) {
    const int m = dw_attn_mode();
    return m == DW_ATTN_CUDNN || (m == DW_ATTN_AUTO && DW_ATT_DEFAULT_CUDNN);
}

/* After a cuDNN attempt that did not run: DW_ATTN=cudnn makes it an error, else fall through. */
static dw_status dw_att_cudnn_declined(dw_ctx *ctx, const char *op) {
    if (dw_attn_mode() != DW_ATTN_CUDNN) return DW_OK;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: DW_ATTN=cudnn but %s", op, dw_attn_cudnn_why());
}

/* The one selection rule, both directions, every entry: BF16 tries cuDNN first when DW_ATTN picks
 * it; *done when cuDNN ran, else the caller's next path (mma, then the reference kernels) runs. */
static dw_status dw_att_cudnn_fwd_try(dw_ctx *ctx, const char *op, bool *done, dw_act_dtype dt,
                                      const dw_attn_cudnn_shape *sh, void *out, float *lse, const void *q,
                                      const void *k, const void *v, void *stream) {
    *done = false;
    if (dt != DW_ACT_BF16 || !dw_att_use_cudnn()) return DW_OK;
    DW_TRY(dw_attn_cudnn_fwd(ctx, done, out, lse, q, k, v, sh, stream));
    return *done ? DW_OK : dw_att_cudnn_declined(ctx, op);
}
static dw_status dw_att_cudnn_bwd_try(dw_ctx *ctx, const char *op, bool *done, dw_act_dtype dt,
                                      const dw_attn_cudnn_shape *sh, void *dq, void *dk, void *dv, const void *dout,
                                      const void *q, const void *k, const void *v, const void *out, const float *lse,
                                      float *delta, void *stream) {
    *done = false;
    if (dt != DW_ACT_BF16 || !dw_att_use_cudnn()) return DW_OK;
    DW_TRY(dw_attn_cudnn_bwd(ctx, done, dq, dk, dv, dout, q, k, v, out, lse, delta, sh, stream));
    return *done ? DW_OK : dw_att_cudnn_declined(ctx, op);
}

extern "C" {

dw_status dw_cuda_attention_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, float *lse,
                                const void *q, const void *k, const void *v, int64_t B, int64_t T,
                                int64_t H, int64_t Hkv, int64_t D, void *stream) {
    const char *op = "attention_fwd";
    DW_TRY(dw_att_check(ctx, op, dt, B, T, H, Hkv, D));
    DW_OPS_REQUIRE(ctx, op, B * T == 0 || (out && lse && q && k && v));
    if (B * T == 0) return DW_OK;
    const dw_attn_cudnn_shape sh = {B, T, H, Hkv, D, H * D, Hkv * D, 0, 0.0f};
    bool done = false;
    DW_TRY(dw_att_cudnn_fwd_try(ctx, op, &done, dt, &sh, out, lse, q, k, v, stream));
    if (done) return DW_OK;
    cudaStream_t s = (cudaStream_t)stream;
    const void *ptrs[] = {out, q, k, v};
    cudaError_t e = dt == DW_ACT_BF16 && dw_attn_mma_eligible(D, ptrs, 4)
                        ? dw_attn_mma_fwd(out, lse, q, k, v, B, T, H, Hkv, D, H * D, Hkv * D, 0, 0.0f, s)
                    : dt == DW_ACT_F32
                        ? DW_ATT_DISPATCH(float, D, dw_att_fwd_launch)(out, lse, q, k, v, B, T, H, Hkv, D, 0, 0.0f, s)
                        : DW_ATT_DISPATCH(dw_bf16, D, dw_att_fwd_launch)(out, lse, q, k, v, B, T, H, Hkv, D, 0, 0.0f, s);
    if (e != cudaSuccess)
        return dw_set_error(ctx, DW_ERR_CUDA, "%s (B=%lld T=%lld H=%lld Hkv=%lld D=%lld): %s", op,
                            (long long)B, (long long)T, (long long)H, (long long)Hkv, (long long)D,
                            cudaGetErrorString(e));
    return DW_OK;
}

dw_status dw_cuda_attention_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dq, void *dk, void *dv,
                                const void *dout, const void *q, const void *k, const void *v,
                                const void *out, const float *lse, float *delta, int64_t B,
                                int64_t T, int64_t H, int64_t Hkv, int64_t D, void *stream) {
    const char *op = "attention_bwd";
    DW_TRY(dw_att_check(ctx, op, dt, B, T, H, Hkv, D));
    DW_OPS_REQUIRE(ctx, op, B * T == 0 || (dq && dk && dv && dout && q && k && v && out && lse && delta));
    if (B * T == 0) return DW_OK;
    const dw_attn_cudnn_shape sh = {B, T, H, Hkv, D, H * D, Hkv * D, 0, 0.0f};
    bool done = false;
    DW_TRY(dw_att_cudnn_bwd_try(ctx, op, &done, dt, &sh, dq, dk, dv, dout, q, k, v, out, lse, delta, stream));
    if (done) return DW_OK;
    cudaStream_t s = (cudaStream_t)stream;
    const void *ptrs[] = {dq, dk, dv, dout, q, k, v, out};
    cudaError_t e =
        dt == DW_ACT_BF16 && dw_attn_mma_eligible(D, ptrs, 8)
            ? dw_attn_mma_bwd(dq, dk, dv, dout, q, k, v, out, lse, delta, B, T, H, Hkv, D, H * D, Hkv * D, 0, 0.0f, s)
        : dt == DW_ACT_F32
            ? DW_ATT_DISPATCH(float, D, dw_att_bwd_launch)(dq, dk, dv, dout, q, k, v, out, lse, delta, B, T, H, Hkv, D, 0, 0.0f, s)
            : DW_ATT_DISPATCH(dw_bf16, D, dw_att_bwd_launch)(dq, dk, dv, dout, q, k, v, out, lse, delta, B, T, H, Hkv, D, 0, 0.0f, s);
    if (e != cudaSuccess)
        return dw_set_error(ctx, DW_ERR_CUDA, "%s (B=%lld T=%lld H=%lld Hkv=%lld D=%lld): %s", op,
                            (long long)B, (long long)T, (long long)H, (long long)Hkv, (long long)D,
                            cudaGetErrorString(e));
    return DW_OK;
}

/* ---- sliding window and score cap: cuDNN first (BF16, as above, its plan keyed by the window and
 * the cap; it declines what the loaded version cannot fuse), then the tensor-core kernels where they
 * apply (BF16, D 64 or 128, aligned; whole key tiles outside the window skipped), else the reference
 * kernels -------------------------------------------------------------------------------------------- */
static dw_status dw_att_masked_err(dw_ctx *ctx, const char *op, cudaError_t e, int64_t B, int64_t T, int64_t H,
                                   int64_t Hkv, int64_t D, int64_t W, double cap) {
    if (e == cudaSuccess) return DW_OK;
    return dw_set_error(ctx, DW_ERR_CUDA, "%s (B=%lld T=%lld H=%lld Hkv=%lld D=%lld window %lld cap %g): %s", op,
                        (long long)B, (long long)T, (long long)H, (long long)Hkv, (long long)D, (long long)W, cap,
                        cudaGetErrorString(e));
}

dw_status dw_cuda_attention_window_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, float *lse, const void *q,
                                       const void *k, const void *v, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                       int64_t D, int64_t W, double cap, void *stream) {
    const char *op = "attention_fwd (window/cap)";
    DW_TRY(dw_att_check(ctx, op, dt, B, T, H, Hkv, D));
    DW_OPS_REQUIRE(ctx, op, W >= 0 && cap >= 0.0 && isfinite(cap));
    DW_OPS_REQUIRE(ctx, op, B * T == 0 || (out && lse && q && k && v));
    if (B * T == 0) return DW_OK;
    const float c = (float)cap;
    const dw_attn_cudnn_shape sh = {B, T, H, Hkv, D, H * D, Hkv * D, W, c};
    bool done = false;
    DW_TRY(dw_att_cudnn_fwd_try(ctx, op, &done, dt, &sh, out, lse, q, k, v, stream));
    if (done) return DW_OK;
    cudaStream_t s = (cudaStream_t)stream;
    const void *ptrs[] = {out, q, k, v};
    return dw_att_masked_err(
        ctx, op,
        dt == DW_ACT_BF16 && dw_attn_mma_eligible(D, ptrs, 4)
            ? dw_attn_mma_fwd(out, lse, q, k, v, B, T, H, Hkv, D, H * D, Hkv * D, W, c, s)
        : dt == DW_ACT_F32 ? DW_ATT_DISPATCH(float, D, dw_att_fwd_launch)(out, lse, q, k, v, B, T, H, Hkv, D, W, c, s)
                           : DW_ATT_DISPATCH(dw_bf16, D, dw_att_fwd_launch)(out, lse, q, k, v, B, T, H, Hkv, D, W, c, s),
        B, T, H, Hkv, D, W, cap);
}

dw_status dw_cuda_attention_window_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dq, void *dk, void *dv, const void *dout,
                                       const void *q, const void *k, const void *v, const void *out, const float *lse,
                                       float *delta, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                                       int64_t W, double cap, void *stream) {
    const char *op = "attention_bwd (window/cap)";
    DW_TRY(dw_att_check(ctx, op, dt, B, T, H, Hkv, D));
    DW_OPS_REQUIRE(ctx, op, W >= 0 && cap >= 0.0 && isfinite(cap));
    DW_OPS_REQUIRE(ctx, op, B * T == 0 || (dq && dk && dv && dout && q && k && v && out && lse && delta));
    if (B * T == 0) return DW_OK;
    const float c = (float)cap;
    const dw_attn_cudnn_shape sh = {B, T, H, Hkv, D, H * D, Hkv * D, W, c};
    bool done = false;
    DW_TRY(dw_att_cudnn_bwd_try(ctx, op, &done, dt, &sh, dq, dk, dv, dout, q, k, v, out, lse, delta, stream));
    if (done) return DW_OK;
    cudaStream_t s = (cudaStream_t)stream;
    const void *ptrs[] = {dq, dk, dv, dout, q, k, v, out};
    return dw_att_masked_err(
        ctx, op,
        dt == DW_ACT_BF16 && dw_attn_mma_eligible(D, ptrs, 8)
            ? dw_attn_mma_bwd(dq, dk, dv, dout, q, k, v, out, lse, delta, B, T, H, Hkv, D, H * D, Hkv * D, W, c, s)
        : dt == DW_ACT_F32
            ? DW_ATT_DISPATCH(float, D, dw_att_bwd_launch)(dq, dk, dv, dout, q, k, v, out, lse, delta, B, T, H, Hkv, D, W,
                                                           c, s)
            : DW_ATT_DISPATCH(dw_bf16, D, dw_att_bwd_launch)(dq, dk, dv, dout, q, k, v, out, lse, delta, B, T, H, Hkv, D,
                                                             W, c, s),
        B, T, H, Hkv, D, W, cap);
}

/* ---- packed qkv (attn_packed.h): the tensor-core kernels reading q, k, v in place ---------------- */
bool dw_cuda_attention_packed_ok(dw_act_dtype dt, int64_t D, const void *const *ptrs, int n) {
    return dt == DW_ACT_BF16 && dw_attn_mma_eligible(D, ptrs, n);
}

static dw_status dw_att_packed_err(dw_ctx *ctx, const char *op, cudaError_t e, int64_t B, int64_t T, int64_t H,
                                   int64_t Hkv, int64_t D) {
    if (e == cudaSuccess) return DW_OK;
    return dw_set_error(ctx, DW_ERR_CUDA, "%s (B=%lld T=%lld H=%lld Hkv=%lld D=%lld): %s", op, (long long)B,
                        (long long)T, (long long)H, (long long)Hkv, (long long)D, cudaGetErrorString(e));
}

dw_status dw_cuda_attention_fwd_packed(dw_ctx *ctx, void *out, float *lse, const void *qkv, int64_t B, int64_t T,
                                       int64_t H, int64_t Hkv, int64_t D, void *stream) {
    const char *op = "attention_fwd_packed";
    DW_TRY(dw_att_check(ctx, op, DW_ACT_BF16, B, T, H, Hkv, D));
    const void *ptrs[] = {out, qkv};
    DW_OPS_REQUIRE(ctx, op, B * T == 0 || (lse && dw_cuda_attention_packed_ok(DW_ACT_BF16, D, ptrs, 2)));
    if (B * T == 0) return DW_OK;
    const dw_bf16 *x = (const dw_bf16 *)qkv;
    const int64_t rs = (H + 2 * Hkv) * D;
    const dw_attn_cudnn_shape sh = {B, T, H, Hkv, D, rs, rs, 0, 0.0f};
    bool done = false;
    DW_TRY(dw_att_cudnn_fwd_try(ctx, op, &done, DW_ACT_BF16, &sh, out, lse, x, x + H * D, x + (H + Hkv) * D, stream));
    if (done) return DW_OK;
    return dw_att_packed_err(ctx, op,
                             dw_attn_mma_fwd(out, lse, x, x + H * D, x + (H + Hkv) * D, B, T, H, Hkv, D, rs, rs, 0,
                                             0.0f, (cudaStream_t)stream),
                             B, T, H, Hkv, D);
}

dw_status dw_cuda_attention_bwd_packed(dw_ctx *ctx, void *dqkv, const void *dout, const void *qkv, const void *out,
                                       const float *lse, float *delta, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                       int64_t D, void *stream) {
    const char *op = "attention_bwd_packed";
    DW_TRY(dw_att_check(ctx, op, DW_ACT_BF16, B, T, H, Hkv, D));
    const void *ptrs[] = {dqkv, dout, qkv, out};
    DW_OPS_REQUIRE(ctx, op, B * T == 0 || (lse && delta && dw_cuda_attention_packed_ok(DW_ACT_BF16, D, ptrs, 4)));
    if (B * T == 0) return DW_OK;
    const dw_bf16 *x = (const dw_bf16 *)qkv;
    dw_bf16 *g = (dw_bf16 *)dqkv;
    const int64_t rs = (H + 2 * Hkv) * D;
    const dw_attn_cudnn_shape sh = {B, T, H, Hkv, D, rs, rs, 0, 0.0f};
    bool done = false;
    DW_TRY(dw_att_cudnn_bwd_try(ctx, op, &done, DW_ACT_BF16, &sh, g, g + H * D, g + (H + Hkv) * D, dout, x, x + H * D,
                                x + (H + Hkv) * D, out, lse, delta, stream));
    if (done) return DW_OK;
    return dw_att_packed_err(ctx, op,
                             dw_attn_mma_bwd(g, g + H * D, g + (H + Hkv) * D, dout, x, x + H * D, x + (H + Hkv) * D,
                                             out, lse, delta, B, T, H, Hkv, D, rs, rs, 0, 0.0f, (cudaStream_t)stream),
                             B, T, H, Hkv, D);
}

void dw_cuda_attention_use(const char *path) { dw_attn_mode_set(path ? dw_attn_mode_parse(path) : -1); }

dw_status dw_cuda_attention_prepare(dw_ctx *ctx, dw_act_dtype dt, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                    int64_t D, bool packed, int64_t W, double cap) {
    (void)ctx;
    if (dt != DW_ACT_BF16 || !dw_att_use_cudnn() || B * T <= 0 || H <= 0 || Hkv <= 0 || H % Hkv) return DW_OK;
    const int64_t rs = (H + 2 * Hkv) * D;
    const dw_attn_cudnn_shape sh = {B, T, H, Hkv, D, packed ? rs : H * D, packed ? rs : Hkv * D, W, (float)cap};
    if (!dw_attn_cudnn_prepare(&sh)) DW_LOGD("attention: no cuDNN plans prepared: %s", dw_attn_cudnn_why());
    return DW_OK;
}

} /* extern "C" */
