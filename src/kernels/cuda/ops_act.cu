/* ops_act.cu — CUDA elementwise ops: gelu (tanh approximation, GPT-2 / HF gelu_new), the exact
 * (erf) GELU, relu, silu,
 * swiglu, geglu (Gemma's gelu_tanh(gate) * up), add; forward and backward; FP32 or BF16 storage, FP32 math (no fast-math intrinsics).
 * The per-element math is act_math.cuh's. Oracle: kernels/cpu/act_cpu.c. */
#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/act_math.cuh"

int dw_act_size(dw_act_dtype dt) { return dt == DW_ACT_BF16 ? 2 : 4; }

static const char *const dw_ew_name[] = {"gelu", "silu", "swiglu", "add", "geglu", "gelu_erf", "relu"};

/* out (n) = f(a) or f(a, b) */
template <typename T, int OP>
static __global__ void dw_ew_fwd_kernel(T *out, const T *a, const T *b, int64_t n) {
    DW_GRID_STRIDE(i, n) dw_st(out, i, dw_ew_f<OP>(dw_ld(a, i), dw_ew_has_b(OP) ? dw_ld(b, i) : 0.0f));
}

/* da (n) = dout * f'(a); the gated units also db = dout * act(a). Everything of element i is read before
 * it is written (dgate/dup may alias gate/up). */
template <typename T, int OP>
static __global__ void dw_ew_bwd_kernel(T *da, T *db, const T *dout, const T *a, const T *b,
                                        int64_t n) {
    DW_GRID_STRIDE(i, n) {
        float d0, d1;
        dw_ew_df<OP>(dw_ld(a, i), dw_ld(dout, i), dw_ew_gated(OP) ? dw_ld(b, i) : 0.0f, d0, d1);
        dw_st(da, i, d0);
        if (dw_ew_gated(OP)) dw_st(db, i, d1);
    }
}

/* BF16, 8 elements per thread with 16-byte accesses: elements [0, 8*n8); the launcher runs the
 * scalar kernel on the remaining n % 8. */
template <int OP>
static __global__ void dw_ew_fwd_vec_kernel(dw_bf16 *out, const dw_bf16 *a, const dw_bf16 *b,
                                            int64_t n8) {
    DW_GRID_STRIDE(j, n8) {
        float x[8], bv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        dw_ld8(a, 8 * j, x);
        if (dw_ew_has_b(OP)) dw_ld8(b, 8 * j, bv);
#pragma unroll
        for (int k = 0; k < 8; k++) x[k] = dw_ew_f<OP>(x[k], bv[k]);
        dw_st8(out, 8 * j, x);
    }
}
template <int OP>
static __global__ void dw_ew_bwd_vec_kernel(dw_bf16 *da, dw_bf16 *db, const dw_bf16 *dout,
                                            const dw_bf16 *a, const dw_bf16 *b, int64_t n8) {
    DW_GRID_STRIDE(j, n8) {
        float x[8], g[8], bv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, d0[8], d1[8];
        dw_ld8(a, 8 * j, x);
        dw_ld8(dout, 8 * j, g);
        if (dw_ew_gated(OP)) dw_ld8(b, 8 * j, bv);
#pragma unroll
        for (int k = 0; k < 8; k++) dw_ew_df<OP>(x[k], g[k], bv[k], d0[k], d1[k]);
        dw_st8(da, 8 * j, d0);
        if (dw_ew_gated(OP)) dw_st8(db, 8 * j, d1);
    }
}

/* offset of a possibly NULL pointer */
template <typename T>
static inline T *dw_ew_off(T *p, int64_t o) { return p ? p + o : p; }

template <typename T, int OP>
static void dw_ew_fwd_launch(void *out, const void *a, const void *b, int64_t n, cudaStream_t s) {
    int64_t head = 0; /* elements done by the 8-wide kernel */
    if (sizeof(T) == 2 && n >= 8 && dw_aligned16(out) && dw_aligned16(a) && (!b || dw_aligned16(b))) {
        head = n / 8 * 8;
        dw_ew_fwd_vec_kernel<OP><<<dw_ew_blocks(n / 8), DW_EW_THREADS, 0, s>>>(
            (dw_bf16 *)out, (const dw_bf16 *)a, (const dw_bf16 *)b, n / 8);
    }
    if (head < n)
        dw_ew_fwd_kernel<T, OP><<<dw_ew_blocks(n - head), DW_EW_THREADS, 0, s>>>(
            (T *)out + head, (const T *)a + head, dw_ew_off((const T *)b, head), n - head);
}
template <typename T, int OP>
static void dw_ew_bwd_launch(void *da, void *db, const void *dout, const void *a, const void *b,
                             int64_t n, cudaStream_t s) {
    int64_t head = 0;
    if (sizeof(T) == 2 && n >= 8 && dw_aligned16(da) && dw_aligned16(dout) && dw_aligned16(a) &&
        (!b || dw_aligned16(b)) && (!db || dw_aligned16(db))) {
        head = n / 8 * 8;
        dw_ew_bwd_vec_kernel<OP><<<dw_ew_blocks(n / 8), DW_EW_THREADS, 0, s>>>(
            (dw_bf16 *)da, (dw_bf16 *)db, (const dw_bf16 *)dout, (const dw_bf16 *)a,
            (const dw_bf16 *)b, n / 8);
    }
    if (head < n)
        dw_ew_bwd_kernel<T, OP><<<dw_ew_blocks(n - head), DW_EW_THREADS, 0, s>>>(
            (T *)da + head, dw_ew_off((T *)db, head), (const T *)dout + head, (const T *)a + head,
            dw_ew_off((const T *)b, head), n - head);
}

template <int OP>
static dw_status dw_ew_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *a, const void *b,
                           int64_t n, void *stream) {
    const char *op = dw_ew_name[OP];
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, n >= 0);
    DW_OPS_REQUIRE(ctx, op, n == 0 || (out && a && (b || !dw_ew_has_b(OP))));
    if (n == 0) return DW_OK;
    if (dt == DW_ACT_F32)
        dw_ew_fwd_launch<float, OP>(out, a, b, n, (cudaStream_t)stream);
    else
        dw_ew_fwd_launch<dw_bf16, OP>(out, a, b, n, (cudaStream_t)stream);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

template <int OP>
static dw_status dw_ew_bwd(dw_ctx *ctx, dw_act_dtype dt, void *da, void *db, const void *dout,
                           const void *a, const void *b, int64_t n, void *stream) {
    const char *op = dw_ew_name[OP];
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, n >= 0);
    DW_OPS_REQUIRE(ctx, op, n == 0 || (da && dout && a && (!dw_ew_gated(OP) || (db && b))));
    if (n == 0) return DW_OK;
    if (dt == DW_ACT_F32)
        dw_ew_bwd_launch<float, OP>(da, db, dout, a, b, n, (cudaStream_t)stream);
    else
        dw_ew_bwd_launch<dw_bf16, OP>(da, db, dout, a, b, n, (cudaStream_t)stream);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

extern "C" {

dw_status dw_cuda_gelu_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *x, int64_t n,
                           void *stream) {
    return dw_ew_fwd<DW_EW_GELU>(ctx, dt, out, x, NULL, n, stream);
}
dw_status dw_cuda_gelu_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, const void *dout, const void *x,
                           int64_t n, void *stream) {
    return dw_ew_bwd<DW_EW_GELU>(ctx, dt, dx, NULL, dout, x, NULL, n, stream);
}
dw_status dw_cuda_gelu_erf_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *x, int64_t n,
                               void *stream) {
    return dw_ew_fwd<DW_EW_GELU_ERF>(ctx, dt, out, x, NULL, n, stream);
}
dw_status dw_cuda_gelu_erf_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, const void *dout, const void *x,
                               int64_t n, void *stream) {
    return dw_ew_bwd<DW_EW_GELU_ERF>(ctx, dt, dx, NULL, dout, x, NULL, n, stream);
}
dw_status dw_cuda_relu_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *x, int64_t n, void *stream) {
    return dw_ew_fwd<DW_EW_RELU>(ctx, dt, out, x, NULL, n, stream);
}
dw_status dw_cuda_relu_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, const void *dout, const void *x, int64_t n,
                           void *stream) {
    return dw_ew_bwd<DW_EW_RELU>(ctx, dt, dx, NULL, dout, x, NULL, n, stream);
}
dw_status dw_cuda_silu_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *x, int64_t n,
                           void *stream) {
    return dw_ew_fwd<DW_EW_SILU>(ctx, dt, out, x, NULL, n, stream);
}
dw_status dw_cuda_silu_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, const void *dout, const void *x,
                           int64_t n, void *stream) {
    return dw_ew_bwd<DW_EW_SILU>(ctx, dt, dx, NULL, dout, x, NULL, n, stream);
}
dw_status dw_cuda_swiglu_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *gate,
                             const void *up, int64_t n, void *stream) {
    return dw_ew_fwd<DW_EW_SWIGLU>(ctx, dt, out, gate, up, n, stream);
}
dw_status dw_cuda_swiglu_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dgate, void *dup,
                             const void *dout, const void *gate, const void *up, int64_t n,
                             void *stream) {
    return dw_ew_bwd<DW_EW_SWIGLU>(ctx, dt, dgate, dup, dout, gate, up, n, stream);
}
dw_status dw_cuda_geglu_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *gate, const void *up, int64_t n,
                            void *stream) {
    return dw_ew_fwd<DW_EW_GEGLU>(ctx, dt, out, gate, up, n, stream);
}
dw_status dw_cuda_geglu_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dgate, void *dup, const void *dout, const void *gate,
                            const void *up, int64_t n, void *stream) {
    return dw_ew_bwd<DW_EW_GEGLU>(ctx, dt, dgate, dup, dout, gate, up, n, stream);
}
dw_status dw_cuda_add_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *a, const void *b,
                          int64_t n, void *stream) {
    return dw_ew_fwd<DW_EW_ADD>(ctx, dt, out, a, b, n, stream);
}

} /* extern "C" */
