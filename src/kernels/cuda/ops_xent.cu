/* ops_xent.cu — CUDA softmax cross-entropy, fused: one block per row makes one online pass over
 * V for (max, sum exp) and, when asked, a second pass that writes the gradient in place of or
 * beside the logits (BF16 rows with 16-byte accesses); probabilities are never stored. Mean over valid rows (target >= 0) with a
 * fixed-order reduction, so the loss is deterministic. Oracle: kernels/cpu/xent_cpu.c. */
#include "kernels/cuda/ops_common.cuh"

/* ws layout: [0,16) int32 count of valid rows; [16, 16 + 4N) FP32 row losses (when the caller
 * passes no row_loss) */
#define DW_XENT_WS_HEAD 16

/* (m, s) pairs of a running log-sum-exp: value = m + log(s). -inf m means "empty". (s sums
 * 2^((x - m) log2 e) = e^(x - m): the same quantity as the row kernel's base-2 sums.) */
static __device__ __forceinline__ void dw_lse_merge(float &m, float &s, float m2, float s2) {
    if (m2 == -INFINITY) return;
    if (m == -INFINITY) {
        m = m2;
        s = s2;
        return;
    }
    const float mn = fmaxf(m, m2);
    s = s * expf(m - mn) + s2 * expf(m2 - mn);
    m = mn;
}

/* one block: count[0] = #rows with target >= 0 */
static __global__ void __launch_bounds__(1024)
dw_xent_count_kernel(int32_t *count, const int32_t *targets, int64_t N) {
    __shared__ double sh[32];
    int64_t ci = 0;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) ci += targets[n] >= 0;
    const double tot = dw_block_sum_d((double)ci, sh); /* exact: counts are far below 2^53 */
    if (threadIdx.x == 0) count[0] = (int32_t)tot;
}

/* Visits the row x[0, V) over the block's threads: y = f(i, x[i]), and dx[i] = y when dx is not
 * NULL (dx may be x: element i is read before it is written, by the same thread). BF16 rows go
 * through 16-byte accesses of 8 elements on their 16-byte-aligned middle (when dx has x's
 * alignment, or is NULL), the unaligned head and tail element by element. Each thread visits
 * its elements in a fixed order, so the per-thread accumulations in f are deterministic. */
template <typename T, typename F>
static __device__ __forceinline__ void dw_xent_row_map(const T *x, T *dx, int64_t V, F f) {
    int64_t h = V, m8 = 0; /* head elements, then m8 groups of 8 */
    if (sizeof(T) == 2 && (!dx || (((uintptr_t)dx - (uintptr_t)x) & 15u) == 0)) {
        const int64_t mis = (int64_t)(((uintptr_t)x >> 1) & 7u); /* elements past a 16-byte line */
        h = mis ? 8 - mis : 0;
        if (h > V) h = V;
        m8 = (V - h) / 8;
    }
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
        const float y = f(i, dw_ld(x, i));
        if (dx) dw_st(dx, i, y);
    }
    const dw_bf16 *xm = (const dw_bf16 *)(x + h);
    dw_bf16 *dxm = dx ? (dw_bf16 *)(dx + h) : NULL;
    for (int64_t j = threadIdx.x; j < m8; j += blockDim.x) {
        float v[8];
        dw_ld8(xm, 8 * j, v);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = f(h + 8 * j + k, v[k]);
        if (dxm) dw_st8(dxm, 8 * j, v);
    }
    for (int64_t i = h + 8 * m8 + threadIdx.x; i < V; i += blockDim.x) {
        const float y = f(i, dw_ld(x, i));
        if (dx) dw_st(dx, i, y);
    }
}

/* 2^x on the SFU (ex2.approx.ftz: ~2 ulp; results below 2^-126 flush to 0, far below what a
 * softmax sum or a BF16 gradient resolves). The row kernel works in base 2: exp(x - m) =
 * 2^(x L - m L) with L = log2(e), one FFMA and one MUFU per element instead of expf's ~10
 * instructions (the kernel was compute-bound: ncu 86% SM throughput at 0.46 of copy bandwidth). */
static __device__ __forceinline__ float dw_exp2(float x) {
#ifdef __CUDA_ARCH__
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else /* the host emulator (tests/common/cuda_emu) */
    return exp2f(x);
#endif
}
#define DW_XENT_L2E 1.4426950408889634f

/* One logit into the running (m, s) of sum 2^((x - m) L): -inf contributes nothing; a NaN falls
 * into the sum and poisons it (NaN in, NaN out); m only grows. */
static __device__ __forceinline__ void dw_xent_add1(float &m, float &s, float xi) {
    if (xi == -INFINITY) return;
    if (xi > m) {
        s = (m == -INFINITY ? 0.0f : s * dw_exp2((m - xi) * DW_XENT_L2E)) + 1.0f;
        m = xi;
    } else {
        s += dw_exp2((xi - m) * DW_XENT_L2E);
    }
}

/* Eight logits at once: the new maximum first, one rescale of s, then one FFMA + MUFU each. A
 * group whose maximum is not finite (everything -inf so far, or a +inf) goes element by element. */
static __device__ __forceinline__ void dw_xent_add8(float &m, float &s, const float v[8]) {
    float c = fmaxf(fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3])), fmaxf(fmaxf(v[4], v[5]), fmaxf(v[6], v[7])));
    const float mn = fmaxf(m, c);
    if (!(mn > -INFINITY && mn < INFINITY)) {
#pragma unroll
        for (int k = 0; k < 8; k++) dw_xent_add1(m, s, v[k]);
        return;
    }
    if (mn > m) s = m == -INFINITY ? 0.0f : s * dw_exp2((m - mn) * DW_XENT_L2E);
    m = mn;
    const float ml = mn * DW_XENT_L2E;
    float a = 0.0f, b = 0.0f; /* two chains, added in a fixed order */
#pragma unroll
    for (int k = 0; k < 8; k += 2) {
        a += dw_exp2(fmaf(v[k], DW_XENT_L2E, -ml));
        b += dw_exp2(fmaf(v[k + 1], DW_XENT_L2E, -ml));
    }
    s += a + b;
}

/* grid N, one block per row. row_loss[n] = lse - x[target] (0 if ignored, NaN if target >= V);
 * if dlogits: dlogits[n,:] = (softmax - onehot) * dloss / count (0 if ignored). The first pass
 * keeps a running (max, sum) per thread (8 logits at a time on BF16 rows' aligned middle), the
 * second writes the gradient; each thread visits its elements in a fixed order: deterministic. */
template <typename T>
static __global__ void __launch_bounds__(1024)
dw_xent_row_kernel(float *row_loss, T *dlogits, const T *logits,
                   const int32_t *targets, const int32_t *count, int64_t V,
                   float dloss) {
    __shared__ float shm[32], shs[32];
    const int64_t n = blockIdx.x;
    const int32_t tgt = targets[n];
    const T *x = logits + n * V;
    T *dx = dlogits ? dlogits + n * V : NULL;
    if (tgt < 0) { /* ignored row: uniform over the block */
        if (threadIdx.x == 0) row_loss[n] = 0.0f;
        if (dx)
            for (int64_t i = threadIdx.x; i < V; i += blockDim.x) dw_st(dx, i, 0.0f);
        return;
    }
    const bool tgt_ok = tgt < V;
    const float xt = tgt_ok ? dw_ld(x, tgt) : 0.0f; /* read before any in-place write */
    float m = -INFINITY, s = 0.0f; /* sum of 2^((x - m) L) */
    if (sizeof(T) == 2) {
        const int64_t mis = (int64_t)(((uintptr_t)x >> 1) & 7u); /* elements before a 16-byte line */
        const int64_t h = mis ? (8 - mis < V ? 8 - mis : V) : 0, m8 = (V - h) / 8;
        for (int64_t i = threadIdx.x; i < h; i += blockDim.x) dw_xent_add1(m, s, dw_ld(x, i));
        const dw_bf16 *xm = (const dw_bf16 *)(x + h);
        for (int64_t j = threadIdx.x; j < m8; j += blockDim.x) {
            float v[8];
            dw_ld8(xm, 8 * j, v);
            dw_xent_add8(m, s, v);
        }
        for (int64_t i = h + 8 * m8 + threadIdx.x; i < V; i += blockDim.x) dw_xent_add1(m, s, dw_ld(x, i));
    } else {
        for (int64_t i = threadIdx.x; i < V; i += blockDim.x) dw_xent_add1(m, s, dw_ld(x, i));
    }
    /* block merge of (m, s): warps by butterfly, then across warps through shared memory */
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        dw_lse_merge(m, s, m2, s2);
    }
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        shm[w] = m;
        shs[w] = s;
    }
    __syncthreads();
    m = -INFINITY;
    s = 0.0f;
    for (int i = 0; i < nw; i++) dw_lse_merge(m, s, shm[i], shs[i]); /* same order everywhere */
    const float lse = m + logf(s);
    if (threadIdx.x == 0) row_loss[n] = tgt_ok ? lse - xt : __int_as_float(0x7fc00000);
    if (!dx) return;
    const int32_t nv = count[0];
    const float scale = tgt_ok ? dloss / (float)(nv > 0 ? nv : 1) : __int_as_float(0x7fc00000);
    const float ll = lse * DW_XENT_L2E;
    dw_xent_row_map(x, dx, V, [&](int64_t i, float xi) {
        return (dw_exp2(fmaf(xi, DW_XENT_L2E, -ll)) - (i == tgt ? 1.0f : 0.0f)) * scale;
    });
}

/* one block: loss[0] = sum_n row_loss[n] / count (0 when count is 0), summed in double */
static __global__ void __launch_bounds__(1024)
dw_xent_mean_kernel(float *loss, const float *row_loss,
                    const int32_t *count, int64_t N) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) acc += row_loss[n];
    acc = dw_block_sum_d(acc, sh);
    if (threadIdx.x == 0) loss[0] = count[0] > 0 ? (float)(acc / (double)count[0]) : 0.0f;
}

template <typename T>
static void dw_xent_rows_launch(float *row_loss, void *dlogits, const void *logits, const int32_t *targets,
                                const int32_t *count, int64_t N, int64_t V, float dloss, cudaStream_t s) {
    const int threads = V >= 8192 ? 1024 : V >= 1024 ? 512 : 128;
    dw_xent_row_kernel<T><<<(unsigned)N, threads, 0, s>>>(row_loss, (T *)dlogits, (const T *)logits,
                                                          targets, count, V, dloss);
}

static void dw_xent_launch(dw_act_dtype dt, float *loss, float *row_loss, void *dlogits, const void *logits,
                           const int32_t *targets, int32_t *count, int64_t N, int64_t V,
                           float dloss, cudaStream_t s) {
    dw_xent_count_kernel<<<1, 1024, 0, s>>>(count, targets, N);
    if (dt == DW_ACT_F32) dw_xent_rows_launch<float>(row_loss, dlogits, logits, targets, count, N, V, dloss, s);
    else dw_xent_rows_launch<dw_bf16>(row_loss, dlogits, logits, targets, count, N, V, dloss, s);
    dw_xent_mean_kernel<<<1, 1024, 0, s>>>(loss, row_loss, count, N);
}

extern "C" {

size_t dw_cuda_cross_entropy_ws_bytes(int64_t N) {
    return DW_XENT_WS_HEAD + (size_t)(N > 0 ? N : 0) * sizeof(float);
}

dw_status dw_cuda_cross_entropy(dw_ctx *ctx, dw_act_dtype dt, float *loss, float *row_loss,
                                void *dlogits, const void *logits, const int32_t *targets,
                                int64_t N, int64_t V, float dloss, void *ws, void *stream) {
    const char *op = "cross_entropy";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, N > 0 && N <= INT32_MAX && V > 0 && V <= INT32_MAX);
    DW_OPS_REQUIRE(ctx, op, loss && logits && targets && ws);
    int32_t *count = (int32_t *)ws;
    float *rl = row_loss ? row_loss : (float *)((char *)ws + DW_XENT_WS_HEAD);
    dw_xent_launch(dt, loss, rl, dlogits, logits, targets, count, N, V, dloss, (cudaStream_t)stream);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

/* The three launches one at a time, for a caller that has the logits a chunk of rows at a time (the
 * fused LM head): count over all N rows, the row kernel per chunk, the mean over all N. */
dw_status dw_cuda_cross_entropy_begin(dw_ctx *ctx, void *ws, const int32_t *targets, int64_t N, void *stream) {
    DW_OPS_REQUIRE(ctx, "cross_entropy", N > 0 && N <= INT32_MAX && ws && targets);
    dw_xent_count_kernel<<<1, 1024, 0, (cudaStream_t)stream>>>((int32_t *)ws, targets, N);
    DW_CUDA_CHECK_LAUNCH(ctx, "cross_entropy");
    return DW_OK;
}

dw_status dw_cuda_cross_entropy_rows(dw_ctx *ctx, dw_act_dtype dt, void *ws, int64_t row0, void *dlogits,
                                     const void *logits, const int32_t *targets, int64_t rows, int64_t V, float dloss,
                                     void *stream) {
    const char *op = "cross_entropy";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, rows > 0 && rows <= INT32_MAX && V > 0 && V <= INT32_MAX && row0 >= 0);
    DW_OPS_REQUIRE(ctx, op, logits && targets && ws);
    const int32_t *count = (const int32_t *)ws;
    float *rl = (float *)((char *)ws + DW_XENT_WS_HEAD) + row0;
    if (dt == DW_ACT_F32)
        dw_xent_rows_launch<float>(rl, dlogits, logits, targets, count, rows, V, dloss, (cudaStream_t)stream);
    else
        dw_xent_rows_launch<dw_bf16>(rl, dlogits, logits, targets, count, rows, V, dloss, (cudaStream_t)stream);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

dw_status dw_cuda_cross_entropy_end(dw_ctx *ctx, float *loss, void *ws, int64_t N, void *stream) {
    DW_OPS_REQUIRE(ctx, "cross_entropy", N > 0 && N <= INT32_MAX && loss && ws);
    dw_xent_mean_kernel<<<1, 1024, 0, (cudaStream_t)stream>>>(loss, (const float *)((char *)ws + DW_XENT_WS_HEAD),
                                                              (const int32_t *)ws, N);
    DW_CUDA_CHECK_LAUNCH(ctx, "cross_entropy");
    return DW_OK;
}

} /* extern "C" */
