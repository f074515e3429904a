/* quant_common.cuh — private device-side pieces shared by the CUDA quantisers (quant_kernels.cuh:
 * the row-wise and cp.async tile kernels; quant_bulk.cu: the bulk-copy transposing kernel) and the
 * kernels that quantise what they compute (swiglu_fp8.cu, swiglu_bwd_fp8.cu): recipe traits, the
 * kernel parameters, the exact element encoders and block-scale rules. Not an API: C callers use
 * quant.h. */
#ifndef DW_KERNELS_CUDA_QUANT_COMMON_CUH
#define DW_KERNELS_CUDA_QUANT_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

extern "C" { /* core/ headers are C without linkage guards */
#include "core/cuda_check.h"
#include "core/error.h"
}
#include "formats/rules.h"
#include "kernels/cuda/fp8_cvt.cuh"
#include "kernels/cuda/quant.h"
#include "precision/quant_counts.cuh"

namespace dwq {

constexpr int TILE = 128;                   /* a CTA quantises x[r0 : r0+128, c0 : c0+128] */
constexpr int THREADS = 256;                /* 16 threads x 8 elements cover one tile row */
constexpr int ROWS_PER_PASS = THREADS / 16; /* 16 */
constexpr int PASSES = TILE / ROWS_PER_PASS; /* 8 */

enum Kind { K_TENSOR, K_ROW, K_BLOCK, K_BLOCK2D, K_MX, K_NV };
enum Fmt { F_E4M3, F_E5M2, F_E2M1 };

/* Per recipe: how scales are found, the block length along the blocked dimension, the element
 * format and the MX element parameters. */
template <int R> struct Traits;
template <> struct Traits<DW_RECIPE_FP8_TENSOR> { static constexpr int kind = K_TENSOR, B = 0, fmt = F_E4M3; };
template <> struct Traits<DW_RECIPE_FP8_ROW> { static constexpr int kind = K_ROW, B = 0, fmt = F_E4M3; };
template <> struct Traits<DW_RECIPE_FP8_BLOCK> { static constexpr int kind = K_BLOCK, B = 128, fmt = F_E4M3; };
template <> struct Traits<DW_RECIPE_FP8_BLOCK2D> { static constexpr int kind = K_BLOCK2D, B = 128, fmt = F_E4M3; };
template <> struct Traits<DW_RECIPE_MXFP8> { static constexpr int kind = K_MX, B = 32, fmt = F_E4M3; };
template <> struct Traits<DW_RECIPE_MXFP8_E5M2> { static constexpr int kind = K_MX, B = 32, fmt = F_E5M2; };
template <> struct Traits<DW_RECIPE_MXFP4> { static constexpr int kind = K_MX, B = 32, fmt = F_E2M1; };
template <> struct Traits<DW_RECIPE_NVFP4> { static constexpr int kind = K_NV, B = 16, fmt = F_E2M1; };

struct OutDesc {             /* one output copy ([R, C] = [rows, cols] or [cols, rows]) */
    uint8_t *codes;          /* R x row_bytes */
    void *scales;            /* row-major [srows, scols] */
    uint8_t *swz;            /* 128x4 tiled copy of 1-byte scales, or NULL */
    float *tscale;           /* NVFP4 s_t */
    int64_t row_bytes, scols;
    unsigned long long *cnt; /* (overflow, underflow) this copy's counts go to (kernels built to count), or NULL */
};

struct Params {
    int64_t rows, cols, tiles_c;
    bool vec_in, vec_out, vec_out_t; /* 16-byte loads, 8/4-byte row-wise and 16-byte transposed code stores */
    bool pow2, floor_rule;
    bool t_smem; /* tile kernel: transposed 8-bit codes of whole tiles leave through shared memory */
    bool tma_in; /* bulk transposing kernel: tiles arrive by one tensor-map copy (else row by row) */
    int group;   /* bulk transposing kernel: tile order, bands of `group` tile rows (1: row by row) */
    int tblock;  /* bulk transposing kernel: a CTA's unit of tblock x tblock tiles (1, 2, 4; set by launch_bulk) */
    OutDesc o, t;
    uint32_t *amax_h;  /* fp8_tensor under delayed scaling: the operand's history (precision/amax_rules.h), or NULL */
    bool amax_record;  /* ... and its amax noted (training) */
};

/* ---- element encoding ------------------------------------------------------------------- */

/* E2M1, RNE by comparison with the midpoints (ties go to the even code); NaN -> +0. */
__device__ __forceinline__ uint32_t enc_e2m1(float v) {
    float a = fabsf(v);
    uint32_t c = (uint32_t)(a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                 (a >= 3.5f) + (a > 5.0f);
    uint32_t s = (__float_as_uint(v) >> 31) & (uint32_t)(a == a);
    return c | (s << 3);
}
/* Two codes: 8-bit formats -> lo | hi << 8; E2M1 -> lo | hi << 4. */
template <int FMT> __device__ __forceinline__ uint32_t enc_x2(float lo, float hi) {
    if constexpr (FMT == F_E4M3) return dw_cvt_e4m3x2(lo, hi); /* fp8_cvt.cuh */
    else if constexpr (FMT == F_E5M2) return dw_cvt_e5m2x2(lo, hi);
    else return enc_e2m1(lo) | (enc_e2m1(hi) << 4);
}

/* UE4M3 of a value >= 0 (never NaN here), and its exact decode. */
__device__ __forceinline__ uint32_t enc_ue4m3(float v) { return dw_cvt_e4m3x2(v, 0.0f) & 0xFFu; }
__device__ __forceinline__ float dec_ue4m3(uint32_t c) {
    uint32_t e = c >> 3, m = c & 7u;
    return e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : (float)m * 0.001953125f;
}

/* How one block's elements become element values: a constant code (non-finite or all-zero
 * blocks), x * f (f an exact power of two: same rounding as x / 2^-k), x / f computed without a
 * division (mode 3, see quot_q), or x / f by IEEE division (mode 2, tiny divisors only). */
struct Q {
    float f, r; /* multiplier or divisor; r = RN(1/f) in mode 3 */
    int mode;   /* 0 constant, 1 multiply, 2 divide, 3 divide through the reciprocal */
    uint32_t konst;
};

/* x / s for s > 0 finite, as one FP32 rounding. s a normal power of two: multiply by 2^-k (exact
 * inverse, same rounding). s >= 2^-60: Markstein's correction with r = RN(1/s) — t = RN(x r) is
 * within 2 ulp of x/s, the residual x - s t is exact in one FMA, and RN(t + (x - s t) r) = RN(x/s)
 * (Markstein 1990; no underflow for |x/s| >= 2^-12, and below that E4M3/E5M2/E2M1 give a signed
 * zero either way; the sign is copied from x so that -0 stays -0 whatever the compiler does with
 * the negations). Tinier s: IEEE division. */
__device__ __forceinline__ Q quot_q(float s) {
    uint32_t u = __float_as_uint(s), e = u >> 23;
    if ((u & 0x7FFFFFu) == 0 && e >= 1 && e <= 254) return Q{dw_rule_pow2f(127 - (int)e), 0.0f, 1, 0};
    if (s >= 0x1p-60f) return Q{s, __frcp_rn(s), 3, 0};
    return Q{s, 0.0f, 2, 0};
}
__device__ __forceinline__ float div_q3(float x, float s, float r) {
    float t = x * r;
    float e = fmaf(s, t, -x);
    return copysignf(fmaf(-e, r, t), x);
}

/* FP8 recipes: the scale s (NaN for a non-finite block: constant NaN code). */
__device__ __forceinline__ Q fp8_q(float s) {
    if ((__float_as_uint(s) & 0x7FFFFFFFu) > DW_F32_ABS_INF) return Q{0.0f, 0.0f, 0, 0x7Fu};
    return quot_q(s);
}

/* The MX scale code, as dw_rule_mx_scale_code, without its FP32 division where the quotient
 * amax / maxnorm is a normal float: maxnorm = mu * 2^K (mu = 1.75 or 1.5), and
 * ceil(log2(fl(amax / maxnorm))) = E - K + (mantissa(amax) > mantissa(mu)) — the rounding of the
 * quotient never reaches the power of two above (checked: the nearest mantissa lies over half an
 * ulp away). Tiny amax takes the shared rule. */
template <int FMT> __device__ __forceinline__ uint32_t mx_code(uint32_t amax, bool floor_rule) {
    constexpr float maxnorm = FMT == F_E4M3 ? 448.0f : FMT == F_E5M2 ? 57344.0f : 6.0f;
    constexpr int emax = FMT == F_E4M3 ? 8 : FMT == F_E5M2 ? 15 : 2;
    constexpr uint32_t mu_bits = FMT == F_E2M1 ? 0x400000u : 0x600000u;
    uint32_t ef = amax >> 23;
    if (amax >= DW_F32_ABS_INF || ef < (uint32_t)emax + 2u) return dw_rule_mx_scale_code(amax, maxnorm, emax, floor_rule);
    int e = (int)ef - 127 - emax + (floor_rule ? 0 : (int)((amax & 0x7FFFFFu) > mu_bits));
    return (uint32_t)((e > 127 ? 127 : e) + 127);
}

/* The block rule of recipe R for a block with amax bits `amax`; writes the scale to *s32 / *s8.
 * ext: the precomputed FP32 scale (fp8_tensor, fp8_row) or s_t (nvfp4). */
template <int R> __device__ __forceinline__ Q block_q(uint32_t amax, float ext, const Params &p,
                                                      float *s32, uint32_t *s8) {
    constexpr int kind = Traits<R>::kind, fmt = Traits<R>::fmt;
    if constexpr (kind == K_TENSOR || kind == K_ROW) {
        *s32 = ext;
        return fp8_q(ext);
    } else if constexpr (kind == K_BLOCK || kind == K_BLOCK2D) {
        float s = dw_rule_fp8_scale(amax, p.pow2);
        *s32 = s;
        return fp8_q(s);
    } else if constexpr (kind == K_MX) {
        uint32_t c = mx_code<fmt>(amax, p.floor_rule);
        *s8 = c;
        if (c == 0xFFu) return Q{0.0f, 0.0f, 0, fmt == F_E2M1 ? 0u : 0x7Fu};
        if (amax == 0) return Q{0.0f, 0.0f, 0, 0};
        return Q{dw_rule_mx_inv_scale((uint8_t)c), 0.0f, 1, 0};
    } else { /* NVFP4: ext = s_t */
        bool st_nan = (__float_as_uint(ext) & 0x7FFFFFFFu) > DW_F32_ABS_INF;
        uint32_t b = st_nan ? 0x7Fu : enc_ue4m3(__uint_as_float(amax) / (6.0f * ext));
        *s8 = b;
        float d = st_nan ? 0.0f : dec_ue4m3(b) * ext;
        if (d == 0.0f) return Q{0.0f, 0.0f, 0, 0};
        return quot_q(d);
    }
}

/* Codes of N consecutive elements under block rule q, one branch on the mode per group: N/4
 * words of 8-bit codes, or (E2M1) N/8 words of nibbles, element 0 in the lowest bits. */
template <int FMT, int N> __device__ __forceinline__ void encode_n(const Q &q, const float *v, uint32_t *w) {
    float t[N];
    if (q.mode == 3) {
#pragma unroll
        for (int i = 0; i < N; i++) t[i] = div_q3(v[i], q.f, q.r);
    } else if (q.mode == 2) {
#pragma unroll
        for (int i = 0; i < N; i++) t[i] = __fdiv_rn(v[i], q.f);
    } else { /* mode 1; mode 0 multiplies by 0 and is replaced below */
#pragma unroll
        for (int i = 0; i < N; i++) t[i] = v[i] * q.f;
    }
    if constexpr (FMT == F_E2M1) {
#pragma unroll
        for (int j = 0; j < N / 8; j++)
            w[j] = enc_x2<FMT>(t[8 * j], t[8 * j + 1]) | enc_x2<FMT>(t[8 * j + 2], t[8 * j + 3]) << 8 |
                   enc_x2<FMT>(t[8 * j + 4], t[8 * j + 5]) << 16 | enc_x2<FMT>(t[8 * j + 6], t[8 * j + 7]) << 24;
    } else {
#pragma unroll
        for (int j = 0; j < N / 4; j++)
            w[j] = enc_x2<FMT>(t[4 * j], t[4 * j + 1]) | enc_x2<FMT>(t[4 * j + 2], t[4 * j + 3]) << 16;
    }
    if (q.mode == 0) {
        const uint32_t k = q.konst * (FMT == F_E2M1 ? 0x11111111u : 0x01010101u);
#pragma unroll
        for (int j = 0; j < (FMT == F_E2M1 ? N / 8 : N / 4); j++) w[j] = k;
    }
}

template <int LANES> __device__ __forceinline__ uint32_t group_max(uint32_t v) {
#pragma unroll
    for (int o = 1; o < LANES; o <<= 1) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}

__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7FFFFFFFu; }

/* amax bits of a block of B elements spread over B/8 consecutive lanes, 8 per lane. */
template <int B> __device__ __forceinline__ uint32_t chunk_amax(const float v[8]) {
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) m = max(m, abs_bits(v[i]));
    return group_max<B / 8>(m);
}

/* Codes of 8 consecutive elements: 8 bytes in w[0..1], or (E2M1) 8 nibbles in w[0]. */
template <int FMT> __device__ __forceinline__ void encode8(const Q &q, const float v[8], uint32_t w[2]) {
    w[1] = 0;
    encode_n<FMT, 8>(q, v, w);
}

/* ---- counting (precision/quant_counts.cuh): what a block's codes are dequantised with ------ */

template <int R> __host__ __device__ constexpr dwqc::Fmt count_fmt() {
    return dwqc::Fmt{Traits<R>::fmt == F_E2M1 ? 4 : 8, Traits<R>::fmt == F_E5M2};
}
/* The block scale as stored (block_q's *s32, or the 1-byte code *s8 decoded); nvfp4's s_t apart. */
template <int R> __device__ __forceinline__ float count_scale(float s32, uint32_t s8) {
    constexpr int kind = Traits<R>::kind;
    if constexpr (kind == K_MX || kind == K_NV) return dwqc::scale8(kind == K_NV, s8);
    else return s32;
}

/* The SM count and how many CTAs of `threads` threads and `smem` dynamic bytes of kernel k fit
 * per SM, cached per device in `cache` (one per kernel and shared-memory size, zero-initialised)
 * so that repeated launches skip the runtime queries. k's shared-memory limit is raised to the
 * device's opt-in maximum, not to smem: a kernel launched with several sizes (the transposing
 * kernel's tile blocks) must not have a later, smaller fit lower it under a cached larger one. */
inline dw_status kernel_fit(dw_ctx *ctx, const void *k, int threads, size_t smem, std::atomic<uint64_t> (&cache)[16],
                            int *sms, int *per_sm) {
    int dev = 0;
    DW_CUDA_CHECK(ctx, cudaGetDevice(&dev));
    const uint64_t c = dev < 16 ? cache[dev].load(std::memory_order_relaxed) : 0;
    if (c && c >> 24 == smem) {
        *sms = (int)(c >> 8 & 0xFFFFu), *per_sm = (int)(c & 0xFFu);
        return DW_OK;
    }
    DW_CUDA_CHECK(ctx, cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev));
    if (smem > 48 * 1024) { /* the opt-in maximum less k's static shared memory */
        int optin = 0;
        cudaFuncAttributes fa;
        DW_CUDA_CHECK(ctx, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        DW_CUDA_CHECK(ctx, cudaFuncGetAttributes(&fa, k));
        const size_t dyn_max = (size_t)optin > fa.sharedSizeBytes ? (size_t)optin - fa.sharedSizeBytes : 0;
        if (dyn_max < smem) { /* more than a CTA may have: none fits (the callers say so) */
            *per_sm = 0;
            return DW_OK;
        }
        DW_CUDA_CHECK(ctx, cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn_max));
    }
    if (smem > 0) DW_CUDA_CHECK(ctx, cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    DW_CUDA_CHECK(ctx, cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, k, threads, smem));
    if (dev < 16 && *sms < 65536 && *per_sm < 256)
        cache[dev].store((uint64_t)smem << 24 | (uint64_t)*sms << 8 | (uint64_t)*per_sm, std::memory_order_relaxed);
    return DW_OK;
}

/* The bulk-copy kernels (quant_bulk.cu), BF16 input only (the caller's check): whether they take
 * this call (mxfp8 / mxfp8_e5m2 / fp8_block, aligned buffers; row-wise only: cols a multiple of
 * the block; transposed: whole 128x128 tiles), and their launch. Tuning, 0 = the default in each:
 *   store   transposed only, how the codes leave (1 from registers, 2 staged in shared memory +
 *           bulk copies, 3 staged + 16-byte stores; 2 and 3 fall back to 1 for outputs not
 *           16-byte aligned)
 *   load    transposed only, how tiles arrive (1 row by row, 2 one tensor-map copy where the
 *           driver makes the map)
 *   group   transposed, tile blocks of 1: the tile order (bands of `group` tile rows taken column
 *           by column, 1..64)
 *   tblock  transposed only, a CTA's unit of tblock x tblock tiles (1, 2 or 4) whose scales leave
 *           as runs of 4 tblock bytes per row (default: the largest that keeps the grid as busy;
 *           1 with swizzled scale copies or scales not 4-byte aligned)
 *   stages  2..6 ring buffers (32 KiB, staged 33 KiB)
 *   ctas_per_sm, max_ctas  CTA caps (0 = none) */
struct BulkTune {
    int store, load, group, tblock, stages, ctas_per_sm, max_ctas;
};
bool bulk_eligible(dw_recipe r, const Params &p, const void *x, bool trans);
/* *counted: whether the kernel taken added the copies' counts (p.o.cnt, p.t.cnt; kernels built to
 * count: the row-wise ring and the transposing kernel with stores from registers or tensor stores
 * from its own staging, 2 CTAs per SM), else the caller counts. */
dw_status launch_bulk(dw_ctx *ctx, dw_recipe r, const uint16_t *x, const Params &p, bool trans, const BulkTune &t,
                      cudaStream_t st, bool *counted);

/* Tuning of the persistent tile kernel (dw_quantize_cuda_set_tuning, quant.cu); 0 = built-in choice. */
extern dw_quant_tuning g_tuning;
/* quant_kernels.cuh's launch for recipe r of input x [p.rows, p.cols] (BF16: quant_in_bf16.cu,
 * FP32: quant_in_f32.cu), with the transposed copy when `trans`; *counted: whether the kernel taken
 * counted the copies. */
dw_status launch_bf16(dw_ctx *ctx, dw_recipe r, const uint16_t *x, const Params &p, bool trans, uint32_t *ws,
                      cudaStream_t st, bool *counted);
dw_status launch_f32(dw_ctx *ctx, dw_recipe r, const float *x, const Params &p, bool trans, uint32_t *ws,
                     cudaStream_t st, bool *counted);

} /* namespace dwq */

#endif /* DW_KERNELS_CUDA_QUANT_COMMON_CUH */
