/* ops_rope.cu — CUDA rotary position embedding, Hugging Face llama rotate-half convention, forward
 * and backward (the transposed rotation). Angles t * inv_freq[i] (the rope type's inverse
 * frequencies, kernels/rope_freq.h; longrope's table chosen by the run's length T), cos and sin
 * times its attention factor, and the rotation itself are computed in double, as the CPU oracle
 * (kernels/cpu/rope_cpu.c); storage FP32 or BF16. Only the first R = dw_rope_dim of each head's D
 * dims rotate (partial_rotary_factor); the other D - R are copied.
 * A block owns P consecutive positions (b, t): it computes their cos/sin table once in shared
 * memory (R/2 powers and P * R/2 sincos, not one of each per element pair of every head), then
 * rotates all their heads with 16-byte accesses (VW elements of each half per thread).
 * Not here: q/k projections. */
#include "kernels/cuda/ops_common.cuh"

#define DW_ROPE_THREADS 256
#define DW_ROPE_MAX_HALF 1024        /* larger R/2: the per-pair kernel (a table of >= 16 KB) */

/* 16-byte vectors of VW elements: 8 BF16 or 4 FP32, converted to/from FP32 */
template <int VW>
static __device__ __forceinline__ void dw_rope_ldv(const dw_bf16 *p, int64_t i, float f[VW]) {
    if constexpr (VW == 8) dw_ld8(p, i, f);
    else
        for (int k = 0; k < VW; k++) f[k] = dw_ld(p, i + k);
}
template <int VW>
static __device__ __forceinline__ void dw_rope_ldv(const float *p, int64_t i, float f[VW]) {
    if constexpr (VW == 4) dw_ld4(p, i, f);
    else
        for (int k = 0; k < VW; k++) f[k] = p[i + k];
}
template <int VW>
static __device__ __forceinline__ void dw_rope_stv(dw_bf16 *p, int64_t i, const float f[VW]) {
    if constexpr (VW == 8) dw_st8(p, i, f);
    else
        for (int k = 0; k < VW; k++) dw_st(p, i + k, f[k]);
}
template <int VW>
static __device__ __forceinline__ void dw_rope_stv(float *p, int64_t i, const float f[VW]) {
    if constexpr (VW == 4) dw_st4(p, i, f);
    else
        for (int k = 0; k < VW; k++) p[i + k] = f[k];
}

/* x, out (BT,H,D) with BT = B*T rows of positions t = row % T; block: positions
 * [blockIdx.x * P, + P). The block builds the shared table (R/2 inverse frequencies, then (P, R/2)
 * of (cos, sign * sin), in double as the oracle), then rotates its groups of VW pairs and copies
 * the groups of VW passed-through dims (R..D) of each head. Every element is read before it is
 * written, by the same thread: out may equal x. (Loading the groups ahead of the table, to overlap
 * the two, measured slower: 109 registers, bench/RESULTS.md.) */
template <int VW>
static __device__ __forceinline__ void dw_rope_rot(const double *cs, float a[VW], float b[VW]) {
#pragma unroll
    for (int k = 0; k < VW; k++) {
        const double c = cs[2 * k], s = cs[2 * k + 1], x1 = a[k], x2 = b[k];
        a[k] = (float)(x1 * c - x2 * s);
        b[k] = (float)(x2 * c + x1 * s);
    }
}
template <typename T, int VW>
static __global__ void __launch_bounds__(DW_ROPE_THREADS, 4)
dw_rope_kernel(T *out, const T *x, int64_t BT, int64_t T_, int H, int D, double theta,
               dw_rope_scaling rs, double sign, int P) {
    extern __shared__ double dw_rope_tab[]; /* (P, R/2, 2), then inv_freq (R/2) */
    const int R = (int)dw_rope_dim(&rs, D), half = R / 2;
    const int64_t pos0 = (int64_t)blockIdx.x * P;
    const int np = (int)(BT - pos0 < P ? BT - pos0 : P);
    double *inv = dw_rope_tab + 2 * (int64_t)P * half;
    for (int i = threadIdx.x; i < half; i += blockDim.x)
        inv[i] = dw_rope_inv_freq(&rs, theta, R, i, T_);
    const double m = dw_rope_attention(&rs);
    __syncthreads();
    for (int k = threadIdx.x; k < np * half; k += blockDim.x) {
        const int p = k / half, i = k % half;
        double sn, cs;
        sincos((double)((pos0 + p) % T_) * inv[i], &sn, &cs);
        dw_rope_tab[2 * k] = m * cs;
        dw_rope_tab[2 * k + 1] = m * sign * sn;
    }
    __syncthreads();
    const int gph = half / VW;           /* VW-groups per head half (rotated) */
    const int gpr = gph + (D - R) / VW;  /* ... and those passed through: groups per head */
    const int ng = np * H * gpr;         /* groups of the block */
    for (int g = threadIdx.x; g < ng; g += blockDim.x) {
        const int j = g % gpr, r = g / gpr; /* r: (position, head) of the block */
        float a[VW], b[VW];
        if (j >= gph) { /* dims R + (j - gph) VW.. pass through */
            const int64_t at = (pos0 * H + r) * (int64_t)D + R + (int64_t)(j - gph) * VW;
            dw_rope_ldv<VW>(x, at, a);
            dw_rope_stv<VW>(out, at, a);
            continue;
        }
        const int i0 = j * VW;
        const int64_t base = (pos0 * H + r) * (int64_t)D + i0;
        dw_rope_ldv<VW>(x, base, a);
        dw_rope_ldv<VW>(x, base + half, b);
        dw_rope_rot<VW>(dw_rope_tab + 2 * ((int64_t)(r / H) * half + i0), a, b);
        dw_rope_stv<VW>(out, base, a);
        dw_rope_stv<VW>(out, base + half, b);
    }
}

/* R/2 > DW_ROPE_MAX_HALF: one thread per pair (i, i + R/2), its angle computed on the spot; D/2 slots
 * a head, slot i >= R/2 copying the two passed-through dims R + 2 (i - R/2), + 1 */
template <typename T>
static __global__ void dw_rope_pair_kernel(T *out, const T *x, int64_t T_, int64_t H, int64_t D,
                                           double theta, dw_rope_scaling rs, double sign, int64_t npairs) {
    const int64_t R = dw_rope_dim(&rs, D), half = R / 2, slots = D / 2;
    const double m = dw_rope_attention(&rs);
    DW_GRID_STRIDE(p, npairs) {
        const int64_t i = p % slots, row = p / slots; /* row over (B,T,H) */
        if (i >= half) {
            const int64_t at = row * D + R + 2 * (i - half);
            dw_st(out, at, dw_ld(x, at));
            dw_st(out, at + 1, dw_ld(x, at + 1));
            continue;
        }
        const double t = (double)((row / H) % T_);
        const double ang = t * dw_rope_inv_freq(&rs, theta, R, i, T_);
        double sn, cs;
        sincos(ang, &sn, &cs);
        cs *= m;
        sn *= m * sign;
        const int64_t base = row * D;
        const double x1 = dw_ld(x, base + i), x2 = dw_ld(x, base + i + half);
        dw_st(out, base + i, (float)(x1 * cs - x2 * sn));
        dw_st(out, base + i + half, (float)(x2 * cs + x1 * sn));
    }
}

/* P positions a block: 4 groups of VW pairs per thread (8192 pairs for BF16) */
template <typename T, int VW>
static void dw_rope_tab_launch(void *out, const void *x, int64_t BT, int64_t T_, int64_t H,
                               int64_t D, double theta, const dw_rope_scaling &rs, double sign, cudaStream_t s) {
    const int64_t half = dw_rope_dim(&rs, D) / 2, per_pos = H * (D / 2);
    int64_t P = (int64_t)DW_ROPE_THREADS * 4 * VW / per_pos;
    if (P > BT) P = BT;
    if (P * half > 2 * DW_ROPE_MAX_HALF) P = 2 * DW_ROPE_MAX_HALF / half; /* table <= 32 KB */
    if (P < 1) P = 1;
    const int64_t blocks = (BT + P - 1) / P;
    const size_t smem = (size_t)(2 * P * half + half) * sizeof(double);
    dw_rope_kernel<T, VW><<<(unsigned)blocks, DW_ROPE_THREADS, smem, s>>>(
        (T *)out, (const T *)x, BT, T_, (int)H, (int)D, theta, rs, sign, (int)P);
}

template <typename T>
static void dw_rope_launch(void *out, const void *x, int64_t B, int64_t T_, int64_t H, int64_t D,
                           double theta, const dw_rope_scaling &rs, double sign, cudaStream_t s) {
    const int64_t half = dw_rope_dim(&rs, D) / 2, BT = B * T_;
    const int vw = sizeof(T) == 2 ? 8 : 4; /* 16 bytes */
    if (half > DW_ROPE_MAX_HALF) {
        const int64_t npairs = BT * H * (D / 2);
        dw_rope_pair_kernel<T><<<dw_ew_blocks(npairs), DW_EW_THREADS, 0, s>>>(
            (T *)out, (const T *)x, T_, H, D, theta, rs, sign, npairs);
    } else if (half % vw == 0 && D % vw == 0 && dw_aligned16(out) && dw_aligned16(x)) {
        if constexpr (sizeof(T) == 2) dw_rope_tab_launch<T, 8>(out, x, BT, T_, H, D, theta, rs, sign, s);
        else dw_rope_tab_launch<T, 4>(out, x, BT, T_, H, D, theta, rs, sign, s);
    } else {
        dw_rope_tab_launch<T, 1>(out, x, BT, T_, H, D, theta, rs, sign, s);
    }
}

/* The per-block index arithmetic is 32-bit: one position's H * D elements at most 2^30 (its rotated
 * pairs and passed-through groups fewer). */
#define DW_ROPE_MAX_PER_POS (1LL << 30)

static dw_status dw_rope(dw_ctx *ctx, const char *op, dw_act_dtype dt, void *out, const void *x,
                         int64_t B, int64_t T, int64_t H, int64_t D, double theta,
                         const dw_rope_scaling *scaling, double sign, void *stream) {
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, B >= 0 && T >= 0 && H > 0 && D > 0 && D % 2 == 0 && theta > 0.0);
    DW_OPS_REQUIRE(ctx, op, !dw_rope_scaling_problem(scaling, theta, D));
    const dw_rope_scaling rs = scaling ? *scaling : dw_rope_scaling{};
    DW_OPS_REQUIRE(ctx, op, H <= DW_ROPE_MAX_PER_POS / D);
    DW_OPS_REQUIRE(ctx, op, B * T == 0 || (out && x));
    if (B * T == 0) return DW_OK;
    if (dt == DW_ACT_F32)
        dw_rope_launch<float>(out, x, B, T, H, D, theta, rs, sign, (cudaStream_t)stream);
    else
        dw_rope_launch<dw_bf16>(out, x, B, T, H, D, theta, rs, sign, (cudaStream_t)stream);
    DW_CUDA_CHECK_LAUNCH(ctx, op);
    return DW_OK;
}

extern "C" {

dw_status dw_cuda_rope_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *x, int64_t B,
                           int64_t T, int64_t H, int64_t D, double theta, const dw_rope_scaling *rs, void *stream) {
    return dw_rope(ctx, "rope_fwd", dt, out, x, B, T, H, D, theta, rs, 1.0, stream);
}
dw_status dw_cuda_rope_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, const void *dout, int64_t B,
                           int64_t T, int64_t H, int64_t D, double theta, const dw_rope_scaling *rs, void *stream) {
    return dw_rope(ctx, "rope_bwd", dt, dx, dout, B, T, H, D, theta, rs, -1.0, stream);
}

} /* extern "C" */
