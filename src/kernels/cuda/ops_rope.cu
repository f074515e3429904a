/* ops_rope.cu — CUDA rotary position embedding, Hugging Face llama rotate-half convention, forward
 * and backward (the transposed rotation). Angles t * theta^(-2i/D) and the rotation itself are
 * computed in double, as the CPU oracle (kernels/cpu/rope_cpu.c); storage FP32 or BF16. */
#include "kernels/cuda/ops_common.cuh"

/* x, out (B,T,H,D); one thread per pair (i, i + D/2) of one head vector; sign -1: transpose */
template <typename T>
static __global__ void dw_rope_kernel(T *out, const T *x, int64_t T_, int64_t H, int64_t D,
                                      double theta, double sign, int64_t npairs) {
    const int64_t half = D / 2;
    DW_GRID_STRIDE(p, npairs) {
        const int64_t i = p % half, row = p / half; /* row over (B,T,H) */
        const double t = (double)((row / H) % T_);
        const double ang = t * pow(theta, -2.0 * (double)i / (double)D);
        double sn, cs;
        sincos(ang, &sn, &cs);
        sn *= sign;
        const int64_t base = row * D;
        const double x1 = dw_ld(x, base + i), x2 = dw_ld(x, base + i + half);
        dw_st(out, base + i, (float)(x1 * cs - x2 * sn));
        dw_st(out, base + i + half, (float)(x2 * cs + x1 * sn));
    }
}

template <typename T>
static void dw_rope_launch(void *out, const void *x, int64_t B, int64_t T_, int64_t H, int64_t D,
                           double theta, double sign, cudaStream_t s) {
    const int64_t npairs = B * T_ * H * (D / 2);
    dw_rope_kernel<T><<<dw_ew_blocks(npairs), DW_EW_THREADS, 0, s>>>((T *)out, (const T *)x, T_, H,
                                                                      D, theta, sign, npairs);
}

static dw_status dw_rope(dw_ctx *ctx, const char *op, dw_act_dtype dt, void *out, const void *x,
                         int64_t B, int64_t T, int64_t H, int64_t D, double theta, double sign,
                         void *stream) {
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, B >= 0 && T >= 0 && H > 0 && D > 0 && D % 2 == 0 && theta > 0.0);
    DW_OPS_REQUIRE(ctx, op, B * T == 0 || (out && x));
    if (B * T == 0) return DW_OK;
    if (dt == DW_ACT_F32)
        dw_rope_launch<float>(out, x, B, T, H, D, theta, sign, (cudaStream_t)stream);
    else
        dw_rope_launch<dw_bf16>(out, x, B, T, H, D, theta, sign, (cudaStream_t)stream);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

extern "C" {

dw_status dw_cuda_rope_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *x, int64_t B,
                           int64_t T, int64_t H, int64_t D, double theta, void *stream) {
    return dw_rope(ctx, "rope_fwd", dt, out, x, B, T, H, D, theta, 1.0, stream);
}
dw_status dw_cuda_rope_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, const void *dout, int64_t B,
                           int64_t T, int64_t H, int64_t D, double theta, void *stream) {
    return dw_rope(ctx, "rope_bwd", dt, dx, dout, B, T, H, D, theta, -1.0, stream);
}

} /* extern "C" */
