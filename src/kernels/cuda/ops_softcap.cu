/* ops_softcap.cu — CUDA softcap op (Gemma 2's embedding normaliser and final logit soft-capping):
 * y = s x, or c tanh(s x / c) when c > 0, forward and backward, FP32 or BF16 storage, FP32 math.
 * Not attention's score capping (ops_attention.cu caps the scores inside its kernels).
 * Oracle: kernels/cpu/softcap_cpu.c. */
#include "kernels/cuda/ops_common.cuh"

/* out (n) = s x, or c tanh(s x / c) (c > 0) */
template <typename T>
static __global__ void dw_softcap_fwd_kernel(T *out, const T *x, int64_t n, float s, float c) {
    DW_GRID_STRIDE(i, n) {
        const float v = s * dw_ld(x, i);
        dw_st(out, i, c > 0.0f ? c * tanhf(v / c) : v);
    }
}

/* dx (n) = dout s (1 - tanh^2(s x / c)), or dout s (c 0); dx may be dout */
template <typename T>
static __global__ void dw_softcap_bwd_kernel(T *dx, const T *dout, const T *x, int64_t n, float s, float c) {
    DW_GRID_STRIDE(i, n) {
        const float th = c > 0.0f ? tanhf(s * dw_ld(x, i) / c) : 0.0f;
        dw_st(dx, i, dw_ld(dout, i) * s * (1.0f - th * th));
    }
}

static dw_status dw_softcap_check(dw_ctx *ctx, const char *op, dw_act_dtype dt, int64_t n, double s, double c) {
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, n >= 0 && s != 0.0 && isfinite(s) && c >= 0.0 && isfinite(c));
    return DW_OK;
}

extern "C" {

dw_status dw_cuda_softcap_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *x, int64_t n, double s, double c,
                              void *stream) {
    const char *op = "softcap_fwd";
    DW_TRY(dw_softcap_check(ctx, op, dt, n, s, c));
    DW_OPS_REQUIRE(ctx, op, n == 0 || (out && x));
    if (n == 0) return DW_OK;
    cudaStream_t st = (cudaStream_t)stream;
    if (dt == DW_ACT_F32)
        dw_softcap_fwd_kernel<float><<<dw_ew_blocks(n), DW_EW_THREADS, 0, st>>>((float *)out, (const float *)x, n,
                                                                             (float)s, (float)c);
    else
        dw_softcap_fwd_kernel<dw_bf16><<<dw_ew_blocks(n), DW_EW_THREADS, 0, st>>>(
            (dw_bf16 *)out, (const dw_bf16 *)x, n, (float)s, (float)c);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

dw_status dw_cuda_softcap_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, const void *dout, const void *x, int64_t n,
                              double s, double c, void *stream) {
    const char *op = "softcap_bwd";
    DW_TRY(dw_softcap_check(ctx, op, dt, n, s, c));
    DW_OPS_REQUIRE(ctx, op, n == 0 || (dx && dout && x));
    if (n == 0) return DW_OK;
    cudaStream_t st = (cudaStream_t)stream;
    if (dt == DW_ACT_F32)
        dw_softcap_bwd_kernel<float><<<dw_ew_blocks(n), DW_EW_THREADS, 0, st>>>(
            (float *)dx, (const float *)dout, (const float *)x, n, (float)s, (float)c);
    else
        dw_softcap_bwd_kernel<dw_bf16><<<dw_ew_blocks(n), DW_EW_THREADS, 0, st>>>(
            (dw_bf16 *)dx, (const dw_bf16 *)dout, (const dw_bf16 *)x, n, (float)s, (float)c);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

} /* extern "C" */
