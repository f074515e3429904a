/* ops_moe_aux.cu — CUDA MoE router losses: transformers' load-balancing loss (load_balancing_loss_func
 * over all MoE layers) and the router z-loss: the per-layer statistics (softmax rows summed per
 * expert, then the rows' squared log-sum-exp; assignments counted per expert; added to the layers
 * before), their backward, and the losses with their gradient; FP32 or BF16 storage, FP32 math,
 * fixed-order block sums (deterministic). The statistics, given the scratch of ops_cuda.h, take
 * DW_MOE_AUX_PARTS blocks over shares of the rows (a warp a row, every exponential once) and one
 * block adding their parts in order. Without it (or past DW_MOE_AUX_PART_EXPERTS experts) a block
 * per expert (and one for the z sum), each recomputing the rows' softmax denominators with a warp
 * per row: N E^2 exponentials and only E + 1 blocks, 0.375 ms a layer for moe-e64 (N 8192, E 64;
 * bench/RESULTS.md, session 23). A thread per row (the first kernel) read each row's E logits
 * twice in a serial loop: 0.58 ms.
 * Oracle: kernels/cpu/moe_aux_cpu.c. */
#include "kernels/cuda/ops_common.cuh"

#define DW_AUX_THREADS 256

#define DW_AUX_STATS_THREADS 1024 /* the statistics kernel: 32 warps, each a row at a time */

/* block e < E: sums[e] = prev + sum_n p[n,e]; counts[e] = prev + #{(n,k): idx = e};
 * block E: sums[E] = prev + sum_n lse_n^2. Warp w takes rows w, w + 32, ... in order (lane 0 keeps
 * its sums), then the block adds the warps' in a fixed order. */
template <typename T>
static __global__ void __launch_bounds__(DW_AUX_STATS_THREADS)
dw_aux_stats_kernel(T *sums, int32_t *counts, const T *z, const int32_t *idx, const T *prev_sums,
                    const int32_t *prev_counts, int64_t N, int64_t E, int64_t K) {
    __shared__ float red[32];
    const int64_t e = blockIdx.x;
    const int lane = threadIdx.x & 31;
    float acc = 0.0f, cnt = 0.0f;
    for (int64_t n = threadIdx.x >> 5; n < N; n += DW_AUX_STATS_THREADS / 32) {
        const T *zr = z + n * E;
        float m, s;
        dw_warp_softmax_stats(zr, E, lane, m, s);
        if (e == E) {
            const float lse = m + logf(s);
            acc += lane == 0 ? lse * lse : 0.0f;
            continue;
        }
        if (lane == 0) acc += expf(dw_ld(zr, e) - m) / s;
        unsigned hits = 0;
        for (int64_t k = lane; k < K; k += 32) hits += idx[n * K + k] == (int32_t)e;
        cnt += (float)dw_warp_sum((float)hits) * (lane == 0); /* whole numbers: exact */
    }
    acc = dw_block_sum(acc, red);
    cnt = dw_block_sum(cnt, red); /* whole numbers below 2^24: exact */
    if (threadIdx.x == 0) {
        dw_st(sums, e, (prev_sums ? dw_ld(prev_sums, e) : 0.0f) + acc);
        if (e < E) counts[e] = (prev_counts ? prev_counts[e] : 0) + (int32_t)cnt;
    }
}

/* The statistics over DW_MOE_AUX_PARTS blocks, each a share of the rows (part: the scratch of
 * ops_cuda.h): block b's warp w takes rows 8 b + w, 8 b + w + 8 P, ..., each lane the softmax of
 * experts lane, lane + 32, ... (E <= 32 J) and lane 0 the squared log-sum-exp; the warps' sums
 * are added in order into part[b] (E + 1 floats), the block's counts (shared integers) into
 * cpart[b] (E); dw_aux_sum_parts adds the P parts in order. Every exponential once. */
#define DW_AUX_PART_THREADS 256
template <typename T, int J>
static __global__ void __launch_bounds__(DW_AUX_PART_THREADS)
dw_aux_part_kernel(float *part, int32_t *cpart, const T *z, const int32_t *idx, int64_t N, int64_t E, int64_t K) {
    constexpr int W = DW_AUX_PART_THREADS / 32;
    __shared__ float red[W][32 * J + 1];
    __shared__ int32_t cnt[32 * J];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int e = threadIdx.x; e < 32 * J; e += DW_AUX_PART_THREADS) cnt[e] = 0;
    __syncthreads();
    float acc[J], az = 0.0f;
#pragma unroll
    for (int j = 0; j < J; j++) acc[j] = 0.0f;
    for (int64_t n = (int64_t)blockIdx.x * W + w; n < N; n += (int64_t)gridDim.x * W) {
        const T *zr = z + n * E;
        float m, s;
        dw_warp_softmax_stats(zr, E, lane, m, s);
#pragma unroll
        for (int j = 0; j < J; j++)
            if (lane + 32 * j < E) acc[j] += expf(dw_ld(zr, lane + 32 * j) - m) / s;
        if (lane == 0) {
            const float lse = m + logf(s);
            az += lse * lse;
        }
        for (int64_t k = lane; k < K; k += 32) {
            const int32_t e = idx[n * K + k];
            if (e >= 0 && e < E) atomicAdd(&cnt[e], 1); /* integers: any order */
        }
    }
#pragma unroll
    for (int j = 0; j < J; j++) red[w][lane + 32 * j] = acc[j];
    if (lane == 0) red[w][32 * J] = az;
    __syncthreads();
    for (int64_t e = threadIdx.x; e <= E; e += DW_AUX_PART_THREADS) {
        const int col = e == E ? 32 * J : (int)e;
        float t = 0.0f;
        for (int q = 0; q < W; q++) t += red[q][col];
        part[blockIdx.x * (E + 1) + e] = t;
        if (e < E) cpart[blockIdx.x * E + e] = cnt[e];
    }
}

/* One block: sums[e] = prev + the parts' e in order (e <= E), counts[e] = prev + theirs. */
template <typename T>
static __global__ void __launch_bounds__(DW_AUX_PART_THREADS)
dw_aux_sum_parts(T *sums, int32_t *counts, const float *part, const int32_t *cpart, const T *prev_sums,
                 const int32_t *prev_counts, int64_t E) {
    for (int64_t e = threadIdx.x; e <= E; e += DW_AUX_PART_THREADS) {
        float t = 0.0f;
        int32_t c = 0;
        for (int b = 0; b < DW_MOE_AUX_PARTS; b++) {
            t += part[b * (E + 1) + e];
            if (e < E) c += cpart[b * E + e];
        }
        dw_st(sums, e, (prev_sums ? dw_ld(prev_sums, e) : 0.0f) + t);
        if (e < E) counts[e] = (prev_counts ? prev_counts[e] : 0) + c;
    }
}

template <typename T>
static void dw_aux_parts_launch(int J, float *part, int32_t *cpart, const T *z, const int32_t *idx, int64_t N,
                                int64_t E, int64_t K, cudaStream_t s) {
    const unsigned P = DW_MOE_AUX_PARTS;
    if (J <= 1) dw_aux_part_kernel<T, 1><<<P, DW_AUX_PART_THREADS, 0, s>>>(part, cpart, z, idx, N, E, K);
    else if (J <= 2) dw_aux_part_kernel<T, 2><<<P, DW_AUX_PART_THREADS, 0, s>>>(part, cpart, z, idx, N, E, K);
    else if (J <= 4) dw_aux_part_kernel<T, 4><<<P, DW_AUX_PART_THREADS, 0, s>>>(part, cpart, z, idx, N, E, K);
    else dw_aux_part_kernel<T, 8><<<P, DW_AUX_PART_THREADS, 0, s>>>(part, cpart, z, idx, N, E, K);
}

/* a warp per row: dz[n,j] = p_j (g_j - sum_e g_e p_e + 2 g_E lse_n) */
template <typename T>
static __global__ void __launch_bounds__(DW_AUX_THREADS)
dw_aux_stats_bwd_kernel(T *dz, const T *g, const T *z, int64_t N, int64_t E) {
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * (DW_AUX_THREADS / 32) + (threadIdx.x >> 5);
    if (n >= N) return;
    const T *zr = z + n * E;
    float m, s;
    dw_warp_softmax_stats(zr, E, lane, m, s);
    float dot = 0.0f;
    for (int64_t e = lane; e < E; e += 32) dot += (g ? dw_ld(g, e) : 0.0f) * (expf(dw_ld(zr, e) - m) / s);
    dot = dw_warp_sum(dot);
    const float zterm = g ? 2.0f * dw_ld(g, E) * (m + logf(s)) : 0.0f;
    for (int64_t j = lane; j < E; j += 32) {
        const float p = expf(dw_ld(zr, j) - m) / s;
        dw_st(dz, n * E + j, p * ((g ? dw_ld(g, j) : 0.0f) - dot + zterm));
    }
}

/* one block: L N = sum counts / K; aux = coef E sum_e counts_e sums_e / (L N)^2, z = zcoef sums_E / N;
 * aux + z into out and += loss, kept (aux, z — NaN where the coefficient is 0 — then the counts);
 * backward: dsums_e = dloss coef E counts_e / (L N)^2, dsums_E = dloss zcoef / N */
template <typename T>
static __global__ void __launch_bounds__(DW_AUX_THREADS)
dw_aux_loss_kernel(T *out, float *loss, float *kept, T *dsums, const T *sums, const int32_t *counts, int64_t E,
                   int64_t K, int64_t N, float coef, float zcoef, float dloss) {
    __shared__ float red[32];
    float total = 0.0f, dot = 0.0f;
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
        total += (float)counts[e];
        if (!dsums) dot += (float)counts[e] * dw_ld(sums, e);
    }
    total = dw_block_sum(total, red);
    const float LN = total / (float)K, scale = LN > 0 ? coef * (float)E / (LN * LN) : 0.0f;
    if (dsums) {
        for (int64_t e = threadIdx.x; e < E; e += blockDim.x) dw_st(dsums, e, dloss * scale * (float)counts[e]);
        if (threadIdx.x == 0) dw_st(dsums, E, N > 0 ? dloss * zcoef / (float)N : 0.0f);
        return;
    }
    dot = dw_block_sum(dot, red);
    const float aux = scale * dot, z = N > 0 ? zcoef * dw_ld(sums, E) / (float)N : 0.0f;
    if (threadIdx.x == 0) {
        dw_st(out, 0, aux + z);
        *loss += aux + z;
        kept[0] = coef > 0 ? aux : NAN, kept[1] = zcoef > 0 ? z : NAN; /* NaN: not configured */
    }
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) reinterpret_cast<int32_t *>(kept)[2 + e] = counts[e];
}

extern "C" dw_status dw_cuda_moe_aux_stats_fwd(dw_ctx *ctx, dw_act_dtype dt, void *sums, int32_t *counts, const void *z,
                                               const int32_t *idx, const void *prev_sums, const int32_t *prev_counts,
                                               int64_t N, int64_t E, int64_t K, void *part, void *stream) {
    const char *op = "moe_aux_stats";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N >= 0 && E >= 1 && E <= 65535 && K >= 1 && N * K < (1 << 24));
    DW_OPS_REQUIRE(ctx, op, sums && counts && (N == 0 || (z && idx)) && !prev_sums == !prev_counts);
    cudaStream_t s = (cudaStream_t)stream;
    if (part && E <= DW_MOE_AUX_PART_EXPERTS) { /* the parts: every row's softmax once */
        float *fp = (float *)part;
        int32_t *cp = (int32_t *)(fp + DW_MOE_AUX_PARTS * (E + 1));
        const int J = (int)((E + 31) / 32);
        if (dt == DW_ACT_F32) {
            dw_aux_parts_launch<float>(J, fp, cp, (const float *)z, idx, N, E, K, s);
            dw_aux_sum_parts<float><<<1, DW_AUX_PART_THREADS, 0, s>>>((float *)sums, counts, fp, cp,
                                                                      (const float *)prev_sums, prev_counts, E);
        } else {
            dw_aux_parts_launch<dw_bf16>(J, fp, cp, (const dw_bf16 *)z, idx, N, E, K, s);
            dw_aux_sum_parts<dw_bf16><<<1, DW_AUX_PART_THREADS, 0, s>>>((dw_bf16 *)sums, counts, fp, cp,
                                                                        (const dw_bf16 *)prev_sums, prev_counts, E);
        }
        DW_CUDA_CHECK_LAUNCH(ctx, op);
        return DW_OK;
    }
    if (dt == DW_ACT_F32)
        dw_aux_stats_kernel<float><<<(unsigned)E + 1, DW_AUX_STATS_THREADS, 0, s>>>(
            (float *)sums, counts, (const float *)z, idx, (const float *)prev_sums, prev_counts, N, E, K);
    else
        dw_aux_stats_kernel<dw_bf16><<<(unsigned)E + 1, DW_AUX_STATS_THREADS, 0, s>>>(
            (dw_bf16 *)sums, counts, (const dw_bf16 *)z, idx, (const dw_bf16 *)prev_sums, prev_counts, N, E, K);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

extern "C" dw_status dw_cuda_moe_aux_stats_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dz, const void *g, const void *z,
                                               int64_t N, int64_t E, void *stream) {
    const char *op = "moe_aux_stats backward";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N >= 0 && E >= 1 && (N == 0 || (dz && z)));
    if (N == 0) return DW_OK;
    cudaStream_t s = (cudaStream_t)stream;
    const unsigned blocks = (unsigned)((N + DW_AUX_THREADS / 32 - 1) / (DW_AUX_THREADS / 32));
    if (dt == DW_ACT_F32)
        dw_aux_stats_bwd_kernel<float><<<blocks, DW_AUX_THREADS, 0, s>>>((float *)dz, (const float *)g,
                                                                        (const float *)z, N, E);
    else
        dw_aux_stats_bwd_kernel<dw_bf16><<<blocks, DW_AUX_THREADS, 0, s>>>((dw_bf16 *)dz, (const dw_bf16 *)g,
                                                                          (const dw_bf16 *)z, N, E);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

extern "C" dw_status dw_cuda_moe_aux_loss(dw_ctx *ctx, dw_act_dtype dt, void *out, float *loss, float *kept,
                                          void *dsums, const void *sums, const int32_t *counts, int64_t E, int64_t K,
                                          int64_t N, double coef, double zcoef, double dloss, void *stream) {
    const char *op = dsums ? "moe_aux_loss backward" : "moe_aux_loss";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, E >= 1 && K >= 1 && N >= 0 && coef >= 0 && zcoef >= 0);
    DW_OPS_REQUIRE(ctx, op, counts && (dsums || (out && loss && kept && sums)));
    cudaStream_t s = (cudaStream_t)stream;
    if (dt == DW_ACT_F32)
        dw_aux_loss_kernel<float><<<1, DW_AUX_THREADS, 0, s>>>((float *)out, loss, kept, (float *)dsums,
                                                               (const float *)sums, counts, E, K, N, (float)coef,
                                                               (float)zcoef, (float)dloss);
    else
        dw_aux_loss_kernel<dw_bf16><<<1, DW_AUX_THREADS, 0, s>>>((dw_bf16 *)out, loss, kept, (dw_bf16 *)dsums,
                                                                 (const dw_bf16 *)sums, counts, E, K, N,
                                                                 (float)coef, (float)zcoef, (float)dloss);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}
