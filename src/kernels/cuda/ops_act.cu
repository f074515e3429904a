/* ops_act.cu — CUDA elementwise ops: gelu (tanh approximation, GPT-2 / HF gelu_new), silu,
 * swiglu, add; forward and backward; FP32 or BF16 storage, FP32 math (no fast-math intrinsics).
 * Oracle: kernels/cpu/act_cpu.c. */
#include "kernels/cuda/ops_common.cuh"

#define DW_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define DW_GELU_A 0.044715f

int dw_act_size(dw_act_dtype dt) { return dt == DW_ACT_BF16 ? 2 : 4; }

enum { DW_EW_GELU = 0, DW_EW_SILU, DW_EW_SWIGLU, DW_EW_ADD };
static const char *const dw_ew_name[] = {"gelu", "silu", "swiglu", "add"};

static __device__ __forceinline__ float dw_sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }

/* out (n) = f(a) or f(a, b) */
template <typename T, int OP>
static __global__ void dw_ew_fwd_kernel(T *out, const T *a, const T *b, int64_t n) {
    DW_GRID_STRIDE(i, n) {
        const float x = dw_ld(a, i);
        float y;
        if (OP == DW_EW_GELU) {
            y = 0.5f * x * (1.0f + tanhf(DW_GELU_K * (x + DW_GELU_A * x * x * x)));
        } else if (OP == DW_EW_SILU) {
            y = x * dw_sigmoidf(x);
        } else if (OP == DW_EW_SWIGLU) {
            y = x * dw_sigmoidf(x) * dw_ld(b, i);
        } else {
            y = x + dw_ld(b, i);
        }
        dw_st(out, i, y);
    }
}

/* da (n) = dout * f'(a); swiglu also db = dout * silu(a) (a = gate, b = up) */
template <typename T, int OP>
static __global__ void dw_ew_bwd_kernel(T *da, T *db, const T *dout, const T *a, const T *b,
                                        int64_t n) {
    DW_GRID_STRIDE(i, n) {
        const float x = dw_ld(a, i), g = dw_ld(dout, i);
        if (OP == DW_EW_GELU) {
            const float th = tanhf(DW_GELU_K * (x + DW_GELU_A * x * x * x));
            const float d = 0.5f * (1.0f + th) +
                            0.5f * x * (1.0f - th * th) * DW_GELU_K * (1.0f + 3.0f * DW_GELU_A * x * x);
            dw_st(da, i, g * d);
        } else {
            const float s = dw_sigmoidf(x), ds = s * (1.0f + x * (1.0f - s));
            if (OP == DW_EW_SILU) {
                dw_st(da, i, g * ds);
            } else { /* swiglu: read up before writing (dgate/dup may alias gate/up) */
                const float u = dw_ld(b, i);
                dw_st(da, i, g * u * ds);
                dw_st(db, i, g * x * s);
            }
        }
    }
}

template <typename T, int OP>
static void dw_ew_fwd_launch(void *out, const void *a, const void *b, int64_t n, cudaStream_t s) {
    dw_ew_fwd_kernel<T, OP><<<dw_ew_blocks(n), DW_EW_THREADS, 0, s>>>((T *)out, (const T *)a,
                                                                       (const T *)b, n);
}
template <typename T, int OP>
static void dw_ew_bwd_launch(void *da, void *db, const void *dout, const void *a, const void *b,
                             int64_t n, cudaStream_t s) {
    dw_ew_bwd_kernel<T, OP><<<dw_ew_blocks(n), DW_EW_THREADS, 0, s>>>(
        (T *)da, (T *)db, (const T *)dout, (const T *)a, (const T *)b, n);
}

template <int OP>
static dw_status dw_ew_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *a, const void *b,
                           int64_t n, void *stream) {
    const char *op = dw_ew_name[OP];
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, n >= 0);
    DW_OPS_REQUIRE(ctx, op, n == 0 || (out && a && (b || OP == DW_EW_GELU || OP == DW_EW_SILU)));
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
    DW_OPS_REQUIRE(ctx, op, n == 0 || (da && dout && a && (OP != DW_EW_SWIGLU || (db && b))));
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
dw_status dw_cuda_add_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *a, const void *b,
                          int64_t n, void *stream) {
    return dw_ew_fwd<DW_EW_ADD>(ctx, dt, out, a, b, n, stream);
}

} /* extern "C" */
