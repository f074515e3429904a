/* ops_embed.cu — CUDA token embedding and learned positional embedding, forward and backward.
 * FP32 tables and table gradients, FP32 or BF16 activations. The embedding backward is
 * deterministic (no atomics): tokens are split into buckets by tok % NB; each bucket's block
 * compacts its token positions in ascending n and its threads own columns, summing in that order;
 * positions holding the padding row (nn.Embedding padding_idx) are left out. Oracle: kernels/cpu/embed_cpu.c. */
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

/* grid (ceil(C/DW_EMB_COLS), NB): block (x, bucket) owns the rows dwte[t] with t % NB == bucket
 * and the columns [x*DW_EMB_COLS, +DW_EMB_COLS). It walks the tokens in chunks of
 * DW_EMB_THREADS, compacts the chunk's positions whose token is in its bucket into shared memory
 * in ascending n (a shuffle scan of the flags), then adds those rows of dout, in that order, into
 * dwte[t, c] (thread owns columns c = x*DW_EMB_COLS + tid + i*DW_EMB_THREADS). Each (t, c) is
 * updated by one thread in ascending n: deterministic, no atomics. One pass over the tokens per
 * block (NB * 4N bytes from L2) and one pass over dout, instead of NB token scans per column. */
#define DW_EMB_THREADS 256
#define DW_EMB_COLS 1024    /* columns per block: 4 per thread */
#define DW_EMB_BUCKETS 1024 /* blocks along y (fewer when V is smaller) */
template <typename T>
static __global__ void __launch_bounds__(DW_EMB_THREADS)
dw_embed_bwd_kernel(float *dwte, const T *dout, const int32_t *tok, int64_t N, int64_t C,
                    int64_t V, int64_t pad) {
    __shared__ int s_off[DW_EMB_THREADS];     /* chunk-relative positions, ascending */
    __shared__ int32_t s_tok[DW_EMB_THREADS]; /* their tokens */
    __shared__ int s_wcount[DW_EMB_THREADS / 32];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int bucket = blockIdx.y, nb = gridDim.y;
    const int64_t c0 = (int64_t)blockIdx.x * DW_EMB_COLS;
    const int64_t c1 = c0 + DW_EMB_COLS < C ? c0 + DW_EMB_COLS : C;
    for (int64_t base = 0; base < N; base += DW_EMB_THREADS) { /* uniform over the block */
        const int64_t n = base + tid;
        int32_t t = -1;
        bool mine = false;
        if (n < N) {
            t = tok[n];
            mine = t >= 0 && t < V && t != pad && t % nb == bucket; /* pad: the padding row */
        }
        /* inclusive scan of the flags over the warp (shuffles), then over the warps' totals */
        int incl = mine ? 1 : 0;
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_sync(0xffffffffu, incl, lane - o); /* lane - o < 0: unused */
            if (lane >= o) incl += v;
        }
        if (lane == 31) s_wcount[w] = incl;
        __syncthreads();
        int before = 0, total = 0;
        for (int i = 0; i < DW_EMB_THREADS / 32; i++) {
            const int k = s_wcount[i];
            before += i < w ? k : 0;
            total += k;
        }
        if (mine) {
            const int pos = before + incl - 1;
            s_off[pos] = tid;
            s_tok[pos] = t;
        }
        __syncthreads();
        for (int j = 0; j < total; j++) {
            const T *g = dout + (base + s_off[j]) * C;
            float *d = dwte + (int64_t)s_tok[j] * C;
            for (int64_t c = c0 + tid; c < c1; c += DW_EMB_THREADS) d[c] += dw_ld(g, c);
        }
        __syncthreads(); /* the list is rewritten by the next chunk */
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
                                int64_t C, int64_t V, int64_t pad, cudaStream_t s) {
    const int64_t nb = V < DW_EMB_BUCKETS ? V : DW_EMB_BUCKETS;
    const dim3 grid((unsigned)((C + DW_EMB_COLS - 1) / DW_EMB_COLS), (unsigned)nb);
    dw_embed_bwd_kernel<T><<<grid, DW_EMB_THREADS, 0, s>>>(dwte, (const T *)dout, tok, N, C, V, pad);
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
    return dw_cuda_embedding_bwd_pad(ctx, dt, dwte, dout, tok, N, C, V, -1, stream);
}

dw_status dw_cuda_embedding_bwd_pad(dw_ctx *ctx, dw_act_dtype dt, float *dwte, const void *dout,
                                    const int32_t *tok, int64_t N, int64_t C, int64_t V, int64_t pad,
                                    void *stream) {
    const char *op = "embedding_bwd";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N >= 0 && C > 0 && V > 0 && V <= INT32_MAX);
    DW_OPS_REQUIRE(ctx, op, pad >= -1 && pad < V);
    DW_OPS_REQUIRE(ctx, op, (C + DW_EMB_COLS - 1) / DW_EMB_COLS <= INT32_MAX);
    DW_OPS_REQUIRE(ctx, op, N == 0 || (dwte && dout && tok));
    if (N == 0) return DW_OK;
    if (dt == DW_ACT_F32)
        dw_embed_bwd_launch<float>(dwte, dout, tok, N, C, V, pad, (cudaStream_t)stream);
    else
        dw_embed_bwd_launch<dw_bf16>(dwte, dout, tok, N, C, V, pad, (cudaStream_t)stream);
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
