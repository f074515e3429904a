/* act_math.cuh — the per-element math of the CUDA activations (FP32, no fast-math intrinsics),
 * shared by the elementwise kernels (ops_act.cu) and the SwiGLU that quantises its own output
 * (swiglu_fp8.cu), so that both compute the same bits. Device code only. */
#ifndef DW_KERNELS_CUDA_ACT_MATH_CUH
#define DW_KERNELS_CUDA_ACT_MATH_CUH

#include <cuda_runtime.h>
#include <math.h>

#define DW_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define DW_GELU_A 0.044715f

enum { DW_EW_GELU = 0, DW_EW_SILU, DW_EW_SWIGLU, DW_EW_ADD, DW_EW_GEGLU, DW_EW_GELU_ERF, DW_EW_RELU };

static __device__ __forceinline__ float dw_sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }

static __device__ __forceinline__ float dw_geluf(float x) {
    return 0.5f * x * (1.0f + tanhf(DW_GELU_K * (x + DW_GELU_A * x * x * x)));
}

/* the per-element math, shared by the scalar and the 8-wide kernels (identical results) */
template <int OP>
static __device__ __forceinline__ float dw_ew_f(float x, float bv) {
    if (OP == DW_EW_GELU) return dw_geluf(x);
    if (OP == DW_EW_GEGLU) return dw_geluf(x) * bv;
    if (OP == DW_EW_SILU) return x * dw_sigmoidf(x);
    if (OP == DW_EW_SWIGLU) return x * dw_sigmoidf(x) * bv;
    if (OP == DW_EW_GELU_ERF) return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    if (OP == DW_EW_RELU) return x < 0.0f ? 0.0f : x;
    return x + bv;
}
/* da = dout * f'(a); the gated units also db = dout * act(a) (a = gate, b = up: bv) */
template <int OP>
static __device__ __forceinline__ void dw_ew_df(float x, float g, float bv, float &da, float &db) {
    if (OP == DW_EW_GELU || OP == DW_EW_GEGLU) {
        const float th = tanhf(DW_GELU_K * (x + DW_GELU_A * x * x * x));
        const float d = 0.5f * (1.0f + th) +
                        0.5f * x * (1.0f - th * th) * DW_GELU_K * (1.0f + 3.0f * DW_GELU_A * x * x);
        da = OP == DW_EW_GELU ? g * d : g * bv * d;
        db = OP == DW_EW_GELU ? 0.0f : g * 0.5f * x * (1.0f + th);
    } else if (OP == DW_EW_GELU_ERF) { /* Phi(x) + x phi(x) */
        da = g * (0.5f * (1.0f + erff(x * 0.70710678118654752f)) + x * expf(-0.5f * x * x) * 0.39894228040143268f);
        db = 0.0f;
    } else if (OP == DW_EW_RELU) {
        da = x > 0.0f ? g : 0.0f;
        db = 0.0f;
    } else {
        const float s = dw_sigmoidf(x), ds = s * (1.0f + x * (1.0f - s));
        da = OP == DW_EW_SILU ? g * ds : g * bv * ds;
        db = g * x * s;
    }
}
static __host__ __device__ __forceinline__ bool dw_ew_gated(int op) { return op == DW_EW_SWIGLU || op == DW_EW_GEGLU; }
/* __host__ too: dw_ew_fwd's argument check calls it on the host, where nvcc compiles a device-only
 * function's call into exit(1) without a word (GPT-2's un-fused GELU exited so: tests/abi/no_exit.sh) */
static __host__ __device__ __forceinline__ bool dw_ew_has_b(int op) { return dw_ew_gated(op) || op == DW_EW_ADD; }

#endif /* DW_KERNELS_CUDA_ACT_MATH_CUH */
