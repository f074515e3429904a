/* ops_moe.cu — CUDA MoE router: softmax or sigmoid scores, top-k by the logits (or, with a
 * selection bias switched on, by score + bias in FP32), optionally among the best groups only
 * (DeepSeek-V3's group-limited routing), weights (optionally renormalised, times the routed scaling
 * factor) from the unbiased scores, forward and backward; FP32 or BF16 storage, FP32 math. One
 * warp per row, lanes striding over the experts; the kept groups are one 64-bit mask (lanes g and
 * g + 32 score group g by its two largest keys, topk_group warp-wide arg-max rounds pick them);
 * selection is K warp-wide arg-max rounds, each over the allowed experts that rank below the
 * previous pick in the order (key descending, expert ascending), so no per-row state is kept.
 * Oracle: kernels/cpu/router_cpu.c (which selects the same way; its biased keys and group keys are
 * doubles, so a near-tie within FP32 rounding may go the other way). */
#include "kernels/cuda/ops_common.cuh"

#define DW_ROUTER_WARPS 4 /* rows per block */

/* Whether expert a (logit za) ranks before expert b (logit zb): larger logit, then lower index;
 * a NaN logit ranks after everything. */
static __device__ __forceinline__ bool dw_rt_before(float za, int a, float zb, int b) {
    if (za != za) return false;
    if (zb != zb) return true;
    return za > zb || (za == zb && a < b);
}

static __device__ __forceinline__ float dw_rt_score(float z, int score, float m, float s) {
    return score ? 1.0f / (1.0f + expf(-z)) : expf(z - m) / s;
}

/* The selection key of expert e with logit ze: the logit, or with a bias its score + bias. */
static __device__ __forceinline__ float dw_rt_key(float ze, int64_t e, const float *bias, int score, float m, float s) {
    return bias ? dw_rt_score(ze, score, m, s) + bias[e] : ze;
}

/* The groups row zr keeps (bit g: group g of S experts): its topk_group best by the sum of the
 * group's two largest keys score + bias (a NaN key as -inf; its one key for S = 1), ties to the
 * lower group. Lane l scores groups l and l + 32; every lane returns the same mask. */
template <typename T>
static __device__ uint64_t dw_rt_groups(const T *zr, const float *bias, int score, float m, float s, int64_t G,
                                        int64_t S, int64_t topk_group, int lane) {
    float gk[2] = {-INFINITY, -INFINITY};
    for (int h = 0; h < 2; h++) {
        const int64_t g = lane + 32 * h;
        if (g >= G) break;
        float t1 = -INFINITY, t2 = -INFINITY;
        for (int64_t e = g * S; e < (g + 1) * S; e++) {
            float k = dw_rt_score(dw_ld(zr, e), score, m, s) + (bias ? bias[e] : 0.0f);
            if (k != k) k = -INFINITY;
            if (k > t1) t2 = t1, t1 = k;
            else if (k > t2) t2 = k;
        }
        gk[h] = S == 1 ? t1 : t1 + t2;
    }
    uint64_t kept = 0;
    for (int64_t r = 0; r < topk_group; r++) {
        float bk = -INFINITY;
        int bg = -1;
        for (int h = 0; h < 2; h++) {
            const int g = lane + 32 * h;
            if (g < G && !(kept >> g & 1) && (bg < 0 || gk[h] > bk)) bk = gk[h], bg = g;
        }
        for (int o = 16; o > 0; o >>= 1) { /* larger key, then the lower group */
            const float ok = __shfl_xor_sync(0xffffffffu, bk, o);
            const int og = __shfl_xor_sync(0xffffffffu, bg, o);
            if (og >= 0 && (bg < 0 || ok > bk || (ok == bk && og < bg))) bk = ok, bg = og;
        }
        kept |= 1ull << bg;
    }
    return kept;
}

/* bias (E) FP32 or NULL; bias_on: a device flag read by every row (the bias is used where it is
 * non-zero), so that switching it needs no new launch arguments and a recorded step replays. */
template <typename T>
static __global__ void dw_router_fwd_kernel(T *w, int32_t *idx, const T *z, const float *bias, const int32_t *bias_on,
                                            int64_t N, int64_t E, int64_t K, dw_router_desc d) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * DW_ROUTER_WARPS + (threadIdx.x >> 5);
    if (row >= N) return;
    if (bias && !(bias_on && *bias_on)) bias = NULL;
    const int score = d.score, renorm = d.renorm;
    const float scale = (float)dw_router_scale(&d);
    const T *zr = z + row * E;
    float m = 0.0f, s = 1.0f;
    if (!score) dw_warp_softmax_stats(zr, E, lane, m, s);
    const bool grouped = dw_router_grouped(&d);
    const int64_t S = grouped ? E / d.n_group : E; /* experts per group */
    const uint64_t kept = grouped ? dw_rt_groups(zr, bias, score, m, s, d.n_group, S, d.topk_group, lane) : 1;
    float prev_z = INFINITY, sum = 0.0f; /* prev_z: the previous pick's key */
    int prev = -1;
    for (int64_t k = 0; k < K; k++) {
        float bz = NAN;
        int be = -1;
        for (int64_t e = lane; e < E; e += 32) {
            const float ze = dw_rt_key(dw_ld(zr, e), e, bias, score, m, s);
            const bool eligible = (kept >> (e / S) & 1) && (prev < 0 || dw_rt_before(prev_z, prev, ze, (int)e));
            if (eligible && ze == ze && (be < 0 || dw_rt_before(ze, (int)e, bz, be))) bz = ze, be = (int)e;
        }
        for (int o = 16; o > 0; o >>= 1) { /* warp arg-max in the same order */
            const float oz = __shfl_xor_sync(0xffffffffu, bz, o);
            const int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (oe >= 0 && (be < 0 || dw_rt_before(oz, oe, bz, be))) bz = oz, be = oe;
        }
        const float p = be >= 0 ? dw_rt_score(bias ? dw_ld(zr, be) : bz, score, m, s) : NAN;
        if (lane == 0) {
            idx[row * K + k] = be;
            if (!renorm) dw_st(w, row * K + k, p * scale); /* else written below */
        }
        sum += p;
        if (be >= 0) prev = be, prev_z = bz;
        else prev_z = -INFINITY; /* nothing ranks below: the rest stay -1 */
    }
    if (!renorm) return;
    __syncwarp();
    for (int64_t k = lane; k < K; k += 32) { /* each lane re-derives its pick's score: no re-read of w */
        const int e = idx[row * K + k];
        dw_st(w, row * K + k, e >= 0 ? dw_rt_score(dw_ld(zr, e), score, m, s) / sum * scale : NAN);
    }
}

/* g_k = scale dw_k: the gradient of the unscaled weights. */
template <typename T>
static __global__ void dw_router_bwd_kernel(T *dz, const T *dw, const T *z, const int32_t *idx, int64_t N,
                                            int64_t E, int64_t K, dw_router_desc d) {
    const int score = d.score, renorm = d.renorm;
    const float scale = (float)dw_router_scale(&d);
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * DW_ROUTER_WARPS + (threadIdx.x >> 5);
    if (row >= N) return;
    const T *zr = z + row * E;
    const int32_t *ix = idx + row * K;
    float m = 0.0f, s = 1.0f;
    if (!score) dw_warp_softmax_stats(zr, E, lane, m, s);
    /* s_k = sum of the chosen scores, dot = sum_k dw_k w_k (w_k = p_k / s_k) */
    float ssum = 0.0f, dwp = 0.0f;
    for (int64_t k = lane; k < K; k += 32) {
        const int e = ix[k];
        const float p = e >= 0 ? dw_rt_score(dw_ld(zr, e), score, m, s) : NAN;
        ssum += p;
        dwp += e >= 0 ? (dw ? scale * dw_ld(dw, row * K + k) : 0.0f) * p : 0.0f;
    }
    ssum = dw_warp_sum(ssum);
    const float dot = dw_warp_sum(dwp) / ssum;
    /* dp of chosen expert e: (dw_k - dot) / ssum with renorm, else dw_k; pdp = sum_k p_k dp_k */
    float pdp = 0.0f;
    for (int64_t k = lane; k < K; k += 32) {
        const int e = ix[k];
        if (e < 0) continue;
        const float g = dw ? scale * dw_ld(dw, row * K + k) : 0.0f, p = dw_rt_score(dw_ld(zr, e), score, m, s);
        pdp += p * (renorm ? (g - dot) / ssum : g);
    }
    pdp = dw_warp_sum(pdp);
    for (int64_t e = lane; e < E; e += 32) {
        float dp = 0.0f;
        for (int64_t k = 0; k < K; k++)
            if (ix[k] == (int)e) {
                const float g = dw ? scale * dw_ld(dw, row * K + k) : 0.0f;
                dp = renorm ? (g - dot) / ssum : g;
            }
        const float p = dw_rt_score(dw_ld(zr, e), score, m, s);
        dw_st(dz, row * E + e, score ? dp * p * (1.0f - p) : p * (dp - pdp));
    }
}

static dw_status dw_router_check(dw_ctx *ctx, const char *op, dw_act_dtype dt, int64_t N, int64_t E, int64_t K,
                                 const dw_router_desc *d) {
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N >= 0 && E >= 1 && E <= 4096 && K >= 1 && K <= E);
    DW_OPS_REQUIRE(ctx, op, d->score == 0 || d->score == 1);
    DW_OPS_REQUIRE(ctx, op, !dw_router_grouped(d) || (d->n_group <= DW_ROUTER_MAX_GROUPS && E % d->n_group == 0 &&
                                                      K <= d->topk_group * (E / d->n_group)));
    DW_OPS_REQUIRE(ctx, op, d->scale >= 0 && d->scale < INFINITY);
    return DW_OK;
}

extern "C" dw_status dw_cuda_moe_router_fwd_desc(dw_ctx *ctx, dw_act_dtype dt, void *w, int32_t *idx, const void *z,
                                                 const float *bias, const int32_t *bias_on, int64_t N, int64_t E,
                                                 int64_t K, const dw_router_desc *d, void *stream) {
    const char *op = "moe_router";
    DW_TRY(dw_router_check(ctx, op, dt, N, E, K, d));
    DW_OPS_REQUIRE(ctx, op, N == 0 || (w && idx && z));
    if (N == 0) return DW_OK;
    const unsigned blocks = (unsigned)((N + DW_ROUTER_WARPS - 1) / DW_ROUTER_WARPS);
    cudaStream_t s = (cudaStream_t)stream;
    if (dt == DW_ACT_F32)
        dw_router_fwd_kernel<float><<<blocks, 32 * DW_ROUTER_WARPS, 0, s>>>((float *)w, idx, (const float *)z, bias,
                                                                             bias_on, N, E, K, *d);
    else
        dw_router_fwd_kernel<dw_bf16><<<blocks, 32 * DW_ROUTER_WARPS, 0, s>>>(
            (dw_bf16 *)w, idx, (const dw_bf16 *)z, bias, bias_on, N, E, K, *d);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

extern "C" dw_status dw_cuda_moe_router_fwd_biased(dw_ctx *ctx, dw_act_dtype dt, void *w, int32_t *idx,
                                                   const void *z, const float *bias, const int32_t *bias_on,
                                                   int64_t N, int64_t E, int64_t K, int score, int renorm,
                                                   void *stream) {
    const dw_router_desc d = {score, renorm, 0, 0, 0.0};
    return dw_cuda_moe_router_fwd_desc(ctx, dt, w, idx, z, bias, bias_on, N, E, K, &d, stream);
}

extern "C" dw_status dw_cuda_moe_router_fwd(dw_ctx *ctx, dw_act_dtype dt, void *w, int32_t *idx, const void *z,
                                            int64_t N, int64_t E, int64_t K, int score, int renorm, void *stream) {
    return dw_cuda_moe_router_fwd_biased(ctx, dt, w, idx, z, NULL, NULL, N, E, K, score, renorm, stream);
}

extern "C" dw_status dw_cuda_moe_router_bwd_desc(dw_ctx *ctx, dw_act_dtype dt, void *dz, const void *dw,
                                                 const void *z, const int32_t *idx, int64_t N, int64_t E, int64_t K,
                                                 const dw_router_desc *d, void *stream) {
    const char *op = "moe_router backward";
    DW_TRY(dw_router_check(ctx, op, dt, N, E, K, d));
    DW_OPS_REQUIRE(ctx, op, N == 0 || (dz && z && idx));
    if (N == 0) return DW_OK;
    const unsigned blocks = (unsigned)((N + DW_ROUTER_WARPS - 1) / DW_ROUTER_WARPS);
    cudaStream_t s = (cudaStream_t)stream;
    if (dt == DW_ACT_F32)
        dw_router_bwd_kernel<float><<<blocks, 32 * DW_ROUTER_WARPS, 0, s>>>(
            (float *)dz, (const float *)dw, (const float *)z, idx, N, E, K, *d);
    else
        dw_router_bwd_kernel<dw_bf16><<<blocks, 32 * DW_ROUTER_WARPS, 0, s>>>(
            (dw_bf16 *)dz, (const dw_bf16 *)dw, (const dw_bf16 *)z, idx, N, E, K, *d);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

extern "C" dw_status dw_cuda_moe_router_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dz, const void *dw, const void *z,
                                            const int32_t *idx, int64_t N, int64_t E, int64_t K, int score,
                                            int renorm, void *stream) {
    const dw_router_desc d = {score, renorm, 0, 0, 0.0};
    return dw_cuda_moe_router_bwd_desc(ctx, dt, dz, dw, z, idx, N, E, K, &d, stream);
}
