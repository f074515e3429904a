/* ops_gate.cu — the CUDA sigmoid gate (Qwen2-MoE's shared-expert gate): y = sigmoid(g[n]) * x[n,:],
 * one gate logit per row; forward and backward, FP32 or BF16 activations, FP32 math. One warp per
 * row (the gate's sigmoid once per row, dg's dot product a fixed-order warp sum: deterministic, no
 * atomics); BF16 rows of C % 8 == 0 with 16-byte aligned pointers take 16-byte accesses.
 * Oracle: kernels/cpu/act_cpu.c (dw_cpu_sigmoid_gate_*). */
#include "kernels/cuda/ops_common.cuh"

#define DW_GATE_WARPS 8 /* rows per block */
#define DW_GATE_MAX_BLOCKS (1 << 20) /* the kernels stride over the rest */

static __device__ __forceinline__ float dw_gate_sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

/* Row n of this warp, striding by the grid's warps (uniform over the warp: no lane skips a shuffle). */
#define DW_GATE_ROWS(n, N)                                                                          \
    for (int64_t n = (int64_t)blockIdx.x * DW_GATE_WARPS + (threadIdx.x >> 5); n < (N);             \
         n += (int64_t)gridDim.x * DW_GATE_WARPS)

/* y (N,C) = sigmoid(g (N)) * x (N,C). VEC: BF16, C % 8 == 0, 16-byte aligned rows. y may equal x. */
template <typename T, bool VEC>
static __global__ void __launch_bounds__(32 * DW_GATE_WARPS)
dw_gate_fwd_kernel(T *y, const T *x, const T *g, int64_t N, int64_t C) {
    const int lane = threadIdx.x & 31;
    DW_GATE_ROWS(n, N) {
        const float s = dw_gate_sigmoid(dw_ld(g, n));
        if constexpr (VEC) {
            for (int64_t j = lane; j < C / 8; j += 32) {
                float v[8];
                dw_ld8(x, n * C + 8 * j, v);
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] *= s;
                dw_st8(y, n * C + 8 * j, v);
            }
        } else {
            for (int64_t c = lane; c < C; c += 32) dw_st(y, n * C + c, s * dw_ld(x, n * C + c));
        }
    }
}

/* dx (N,C) = s * dout (written, or added with acc), dg (N) = s (1 - s) sum_c dout x (written),
 * s = sigmoid(g); either output may be NULL. Each element of dout and x is read by the thread that
 * then writes dx there, so dx may equal dout or x unless acc. Per row: each lane sums its columns
 * in ascending order, then a butterfly over the warp. */
template <typename T, bool VEC>
static __global__ void __launch_bounds__(32 * DW_GATE_WARPS)
dw_gate_bwd_kernel(T *dx, T *dg, const T *dout, const T *x, const T *g, int64_t N, int64_t C, bool acc) {
    const int lane = threadIdx.x & 31;
    DW_GATE_ROWS(n, N) {
        const float s = dw_gate_sigmoid(dw_ld(g, n));
        float dot = 0.0f;
        if constexpr (VEC) {
            for (int64_t j = lane; j < C / 8; j += 32) {
                float d[8], v[8], o[8];
                dw_ld8(dout, n * C + 8 * j, d);
                dw_ld8(x, n * C + 8 * j, v);
#pragma unroll
                for (int k = 0; k < 8; k++) dot += d[k] * v[k];
                if (dx) {
                    if (acc) dw_ld8(dx, n * C + 8 * j, o);
#pragma unroll
                    for (int k = 0; k < 8; k++) o[k] = acc ? o[k] + s * d[k] : s * d[k];
                    dw_st8(dx, n * C + 8 * j, o);
                }
            }
        } else {
            for (int64_t c = lane; c < C; c += 32) {
                const int64_t i = n * C + c;
                const float d = dw_ld(dout, i);
                dot += d * dw_ld(x, i);
                if (dx) dw_st(dx, i, acc ? dw_ld(dx, i) + s * d : s * d);
            }
        }
        dot = dw_warp_sum(dot);
        if (dg && lane == 0) dw_st(dg, n, s * (1.0f - s) * dot);
    }
}

static unsigned dw_gate_blocks(int64_t N) {
    const int64_t b = (N + DW_GATE_WARPS - 1) / DW_GATE_WARPS;
    return (unsigned)(b < DW_GATE_MAX_BLOCKS ? b : DW_GATE_MAX_BLOCKS);
}

/* the 16-byte path applies: BF16 rows of C % 8 == 0, every given pointer 16-byte aligned */
static bool dw_gate_vec(dw_act_dtype dt, int64_t C, const void *a, const void *b, const void *c) {
    return dt == DW_ACT_BF16 && C % 8 == 0 && dw_aligned16(a) && dw_aligned16(b) && (!c || dw_aligned16(c));
}

extern "C" dw_status dw_cuda_sigmoid_gate_fwd(dw_ctx *ctx, dw_act_dtype dt, void *y, const void *x, const void *g,
                                              int64_t N, int64_t C, void *stream) {
    const char *op = "sigmoid_gate";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N >= 0 && C > 0);
    DW_OPS_REQUIRE(ctx, op, N == 0 || (y && x && g));
    if (N == 0) return DW_OK;
    const unsigned nb = dw_gate_blocks(N), nt = 32 * DW_GATE_WARPS;
    cudaStream_t s = (cudaStream_t)stream;
    if (dt == DW_ACT_F32)
        dw_gate_fwd_kernel<float, false><<<nb, nt, 0, s>>>((float *)y, (const float *)x, (const float *)g, N, C);
    else if (dw_gate_vec(dt, C, y, x, NULL))
        dw_gate_fwd_kernel<dw_bf16, true><<<nb, nt, 0, s>>>((dw_bf16 *)y, (const dw_bf16 *)x, (const dw_bf16 *)g, N, C);
    else
        dw_gate_fwd_kernel<dw_bf16, false><<<nb, nt, 0, s>>>((dw_bf16 *)y, (const dw_bf16 *)x, (const dw_bf16 *)g, N,
                                                             C);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

extern "C" dw_status dw_cuda_sigmoid_gate_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, void *dg, const void *dout,
                                              const void *x, const void *g, int64_t N, int64_t C, bool accumulate,
                                              void *stream) {
    const char *op = "sigmoid_gate backward";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N >= 0 && C > 0);
    DW_OPS_REQUIRE(ctx, op, N == 0 || (dout && x && g));
    DW_OPS_REQUIRE(ctx, op, !accumulate || (dx && dx != dout && dx != x));
    if (N == 0 || (!dx && !dg)) return DW_OK;
    const unsigned nb = dw_gate_blocks(N), nt = 32 * DW_GATE_WARPS;
    cudaStream_t s = (cudaStream_t)stream;
    if (dt == DW_ACT_F32)
        dw_gate_bwd_kernel<float, false><<<nb, nt, 0, s>>>((float *)dx, (float *)dg, (const float *)dout,
                                                           (const float *)x, (const float *)g, N, C, accumulate);
    else if (dw_gate_vec(dt, C, dout, x, dx))
        dw_gate_bwd_kernel<dw_bf16, true><<<nb, nt, 0, s>>>((dw_bf16 *)dx, (dw_bf16 *)dg, (const dw_bf16 *)dout,
                                                            (const dw_bf16 *)x, (const dw_bf16 *)g, N, C, accumulate);
    else
        dw_gate_bwd_kernel<dw_bf16, false><<<nb, nt, 0, s>>>((dw_bf16 *)dx, (dw_bf16 *)dg, (const dw_bf16 *)dout,
                                                             (const dw_bf16 *)x, (const dw_bf16 *)g, N, C, accumulate);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}
