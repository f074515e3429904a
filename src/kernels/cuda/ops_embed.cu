/* ops_embed.cu — CUDA token embedding and learned positional embedding, forward and backward.
 * FP32 tables and table gradients, FP32 or BF16 activations. The embedding backward is
 * deterministic (no atomics): tokens are split into buckets by tok % NB and each (bucket,
 * column) thread owns its rows, summing in ascending n. Oracle: kernels/cpu/embed_cpu.c. */
#include "kernels/cuda/ops_common.cuh"

/* out (N,C) = wte[tok[n]] ; a token outside [0,V) gives NaN (no out-of-bounds read) */
template <typename T>
static __global__ void dw_embed_fwd_kernel(T *out, const int32_t *tok, const float *wte,
                                           int64_t N, int64_t C, int64_t V) {
    DW_GRID_STRIDE(i, N * C) {
        const int64_t n = i / C, c = i % C;
        const int32_t t = tok[n];
        dw_st(out, i, (t >= 0 && t < V) ? wte[(int64_t)t * C + c] : __int_as_float(0x7fc00000));
    }
}

/* grid (ceil(C/128), NB): thread (c, bucket) adds dout[n,c] into dwte[tok[n],c] for every n
 * (ascending) whose token falls in its bucket. */
#define DW_EMB_THREADS 128
template <typename T>
static __global__ void dw_embed_bwd_kernel(float *dwte, const T *dout, const int32_t *tok,
                                           int64_t N, int64_t C, int64_t V) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int bucket = blockIdx.y, nb = gridDim.y;
    if (c >= C) return;
    for (int64_t n = 0; n < N; n++) {
        const int32_t t = tok[n];
        if (t < 0 || t >= V || t % nb != bucket) continue;
        dwte[(int64_t)t * C + c] += dw_ld(dout, n * C + c);
    }
}

/* out (B,T,C) = x + wpe[t] */
template <typename T>
static __global__ void dw_pos_fwd_kernel(T *out, const T *x, const float *wpe, int64_t T_,
                                         int64_t C, int64_t n) {
    DW_GRID_STRIDE(i, n) dw_st(out, i, dw_ld(x, i) + wpe[((i / C) % T_) * C + i % C]);
}

template <typename T>
static void dw_embed_fwd_launch(void *out, const int32_t *tok, const float *wte, int64_t N,
                                int64_t C, int64_t V, cudaStream_t s) {
    dw_embed_fwd_kernel<T><<<dw_ew_blocks(N * C), DW_EW_THREADS, 0, s>>>((T *)out, tok, wte, N, C, V);
}
template <typename T>
static void dw_embed_bwd_launch(float *dwte, const void *dout, const int32_t *tok, int64_t N,
                                int64_t C, int64_t V, cudaStream_t s) {
    const int64_t nb = V < 256 ? V : 256;
    const dim3 grid((unsigned)((C + DW_EMB_THREADS - 1) / DW_EMB_THREADS), (unsigned)nb);
    dw_embed_bwd_kernel<T><<<grid, DW_EMB_THREADS, 0, s>>>(dwte, (const T *)dout, tok, N, C, V);
}
template <typename T>
static void dw_pos_fwd_launch(void *out, const void *x, const float *wpe, int64_t B, int64_t T_,
                              int64_t C, cudaStream_t s) {
    const int64_t n = B * T_ * C;
    dw_pos_fwd_kernel<T><<<dw_ew_blocks(n), DW_EW_THREADS, 0, s>>>((T *)out, (const T *)x, wpe, T_, C, n);
}

extern "C" {

dw_status dw_cuda_embedding_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const int32_t *tok,
                                const float *wte, int64_t N, int64_t C, int64_t V, void *stream) {
    const char *op = "embedding_fwd";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N >= 0 && C > 0 && V > 0 && V <= INT32_MAX);
    DW_OPS_REQUIRE(ctx, op, N == 0 || (out && tok && wte));
    if (N == 0) return DW_OK;
    if (dt == DW_ACT_F32)
        dw_embed_fwd_launch<float>(out, tok, wte, N, C, V, (cudaStream_t)stream);
    else
        dw_embed_fwd_launch<dw_bf16>(out, tok, wte, N, C, V, (cudaStream_t)stream);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

dw_status dw_cuda_embedding_bwd(dw_ctx *ctx, dw_act_dtype dt, float *dwte, const void *dout,
                                const int32_t *tok, int64_t N, int64_t C, int64_t V, void *stream) {
    const char *op = "embedding_bwd";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N >= 0 && C > 0 && V > 0 && V <= INT32_MAX);
    DW_OPS_REQUIRE(ctx, op, (C + DW_EMB_THREADS - 1) / DW_EMB_THREADS <= INT32_MAX);
    DW_OPS_REQUIRE(ctx, op, N == 0 || (dwte && dout && tok));
    if (N == 0) return DW_OK;
    if (dt == DW_ACT_F32)
        dw_embed_bwd_launch<float>(dwte, dout, tok, N, C, V, (cudaStream_t)stream);
    else
        dw_embed_bwd_launch<dw_bf16>(dwte, dout, tok, N, C, V, (cudaStream_t)stream);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

dw_status dw_cuda_pos_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *x, const float *wpe,
                          int64_t B, int64_t T, int64_t C, void *stream) {
    const char *op = "pos_fwd";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, B >= 0 && T > 0 && C > 0);
    DW_OPS_REQUIRE(ctx, op, B == 0 || (out && x && wpe));
    if (B == 0) return DW_OK;
    if (dt == DW_ACT_F32)
        dw_pos_fwd_launch<float>(out, x, wpe, B, T, C, (cudaStream_t)stream);
    else
        dw_pos_fwd_launch<dw_bf16>(out, x, wpe, B, T, C, (cudaStream_t)stream);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

/* dwpe (T*C columns) += column sums over the B rows of dout viewed as (B, T*C); then dx = dout */
dw_status dw_cuda_pos_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, float *dwpe, const void *dout,
                          int64_t B, int64_t T, int64_t C, void *stream) {
    const char *op = "pos_bwd";
    cudaStream_t s = (cudaStream_t)stream;
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, B >= 0 && T > 0 && C > 0 && (T * C + 31) / 32 <= INT32_MAX);
    DW_OPS_REQUIRE(ctx, op, B == 0 || dout);
    if (B == 0) return DW_OK;
    if (dwpe) {
        if (dt == DW_ACT_F32)
            dw_colsum_launch<float, DW_CS_PLAIN>(dwpe, NULL, (const float *)dout, NULL, NULL, NULL, B, T * C, s);
        else
            dw_colsum_launch<dw_bf16, DW_CS_PLAIN>(dwpe, NULL, (const dw_bf16 *)dout, NULL, NULL, NULL, B, T * C, s);
        DW_CUDA_CHECK_LAUNCH(ctx, op);
    }
    if (dx && dx != dout)
        DW_CUDA_CHECK(ctx, cudaMemcpyAsync(dx, dout, (size_t)(B * T * C) * (size_t)dw_act_size(dt),
                                           cudaMemcpyDeviceToDevice, s));
    return DW_OK;
}

} /* extern "C" */
