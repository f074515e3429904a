/* rules.h — private: the per-block scale rules of shared/FORMATS.md as inline functions shared by
 * the CPU reference (src/formats) and the CUDA kernels (kernels/cuda/quant*.cu), so both compute
 * scales from an amax with the same FP32 operations. Element encoding is NOT here: the CPU encodes
 * with elem.c, the GPU with hardware conversions, and the tests compare the two. */
#ifndef DW_FORMATS_RULES_H
#define DW_FORMATS_RULES_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DW_RULE static inline __host__ __device__
#else
#define DW_RULE static inline
#endif

#define DW_F32_CANON_NAN 0x7FC00000u /* the NaN stored as an FP32 scale of a non-finite block */
#define DW_F32_ABS_INF 0x7F800000u

DW_RULE uint32_t dw_rule_f2u(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

DW_RULE float dw_rule_u2f(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

DW_RULE int dw_rule_clz32(uint32_t v) { /* v != 0 */
#ifdef __CUDA_ARCH__
    return __clz((int)v);
#else
    return __builtin_clz(v);
#endif
}

/* Block amax is tracked as the max of |x|'s bit pattern: NaN (> 0x7F800000) wins over Inf, Inf
 * over every finite value, so "non-finite block" is amax_bits >= 0x7F800000. */
DW_RULE bool dw_rule_nonfinite(uint32_t amax_bits) { return amax_bits >= DW_F32_ABS_INF; }

/* floor(log2 v) and ceil(log2 v) for a finite v > 0 (normal or subnormal), exactly. */
DW_RULE int dw_rule_floor_log2(float v) {
    uint32_t u = dw_rule_f2u(v) & 0x7FFFFFFFu;
    int ef = (int)(u >> 23);
    if (ef) return ef - 127;
    return (31 - dw_rule_clz32(u)) - 149; /* subnormal: u * 2^-149 */
}
DW_RULE int dw_rule_ceil_log2(float v) {
    uint32_t u = dw_rule_f2u(v) & 0x7FFFFFFFu;
    int ef = (int)(u >> 23);
    if (ef) return ef - 127 + ((u & 0x7FFFFFu) ? 1 : 0);
    return (u == 1u ? 0 : 32 - dw_rule_clz32(u - 1u)) - 149;
}

/* 2^k as an FP32 for k in [-149, 127] (subnormal below -126). */
DW_RULE float dw_rule_pow2f(int k) {
    if (k >= -126) return dw_rule_u2f((uint32_t)(k + 127) << 23);
    return dw_rule_u2f(1u << (k + 149));
}

/* FP8 recipes: s = amax/448 in FP32; s = 1 when that is 0 (amax = 0, or underflow); pow2 rounds s
 * up to a power of two; a non-finite block gets the canonical NaN. */
DW_RULE float dw_rule_fp8_scale(uint32_t amax_bits, bool pow2) {
    if (dw_rule_nonfinite(amax_bits)) return dw_rule_u2f(DW_F32_CANON_NAN);
    float s = dw_rule_u2f(amax_bits) / 448.0f;
    if (s == 0.0f) return 1.0f;
    return pow2 ? dw_rule_pow2f(dw_rule_ceil_log2(s)) : s;
}

/* fp8_block's arithmetic on BF16 data without divisions (the GPU's bulk quantiser), each claim
 * exhausted over its whole domain by tests/unit/test_formats_quot.c:
 *  - dw_rule_fp8_scale_bf16: RN(amax / 448) for a finite BF16 amax > 0 (an FP32 whose low 16
 *    bits are 0): t = RN(amax r), r = RN(1/448), corrected by Markstein's step
 *    RN(t + RN(amax - 448 t) r) — the division's result for all 32639 such amax.
 *  - dw_rule_recip_split (from s and RN(1/s), which the caller has), dw_rule_quot_split: x / s
 *    as RN(x hi + RN(x lo)) with hi = RD(1/s), lo = RN(RN(1 - s hi) hi) >= 0 (1 - s hi is exact
 *    in one FMA): two operations per element where a correctly rounded quotient takes three. Not always RN(x / s) in FP32, but for s =
 *    RN(amax / 448) of a finite BF16 amax (s not a power of two, s >= 2^-60) and every BF16 x with
 *    |x| <= amax, its E4M3 code is the code of RN(x / s); lo >= 0 keeps the sign of x = -0 (with
 *    lo < 0, RN(-0 + +0) would be +0). A power-of-two s is hi = 1/s, lo = 0: x hi, exact as the
 *    division. */
DW_RULE float dw_rule_mul(float a, float b) { /* one rounding, never fused into a neighbour */
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
DW_RULE float dw_rule_fp8_scale_bf16(uint32_t amax_bits) {
    const float r448 = 0x1.24924ap-9f; /* RN(1/448) */
    const float a = dw_rule_u2f(amax_bits), t = dw_rule_mul(a, r448);
    return fmaf(fmaf(-448.0f, t, a), r448, t);
}
DW_RULE void dw_rule_recip_split(float s, float r, float *hi, float *lo) { /* r = RN(1/s) */
    float e = fmaf(-s, r, 1.0f);
    if (e < 0.0f) { /* RN(1/s) above 1/s: its predecessor, so that lo >= 0 */
        r = dw_rule_u2f(dw_rule_f2u(r) - 1u);
        e = fmaf(-s, r, 1.0f);
    }
    *hi = r;
    *lo = dw_rule_mul(e, r);
}
DW_RULE float dw_rule_quot_split(float x, float hi, float lo) { return fmaf(x, hi, dw_rule_mul(x, lo)); }

/* MX rule: the UE8M0 scale code of a 32-block (0 for amax = 0, 0xFF for a non-finite block).
 * maxnorm/emax of the element format: E4M3 448/8, E5M2 57344/15, E2M1 6/2. */
DW_RULE uint8_t dw_rule_mx_scale_code(uint32_t amax_bits, float maxnorm, int emax, bool floor_rule) {
    if (dw_rule_nonfinite(amax_bits)) return 0xFF;
    if (amax_bits == 0) return 0;
    float amax = dw_rule_u2f(amax_bits);
    int e;
    if (floor_rule) {
        e = dw_rule_floor_log2(amax) - emax;
    } else {
        float q = amax / maxnorm;
        e = (q == 0.0f) ? -127 : dw_rule_ceil_log2(q);
    }
    if (e < -127) e = -127;
    if (e > 127) e = 127;
    return (uint8_t)(e + 127);
}

/* The FP32 multiplier 2^-e applied to elements of an MX block with finite scale code c (< 0xFF):
 * x * 2^-e equals x / 2^e exactly (both are one rounding of the same real). */
DW_RULE float dw_rule_mx_inv_scale(uint8_t c) { return dw_rule_pow2f(127 - (int)c); }

/* NVFP4 tensor scale s_t = amax/2688 (1 when that is 0; canonical NaN for a non-finite tensor). */
DW_RULE float dw_rule_nvfp4_tensor_scale(uint32_t amax_bits) {
    if (dw_rule_nonfinite(amax_bits)) return dw_rule_u2f(DW_F32_CANON_NAN);
    float s = dw_rule_u2f(amax_bits) / 2688.0f;
    return s == 0.0f ? 1.0f : s;
}

/* Byte offset of 1-byte block scale (r, c) of a row-major [srows, scols] scale matrix in cuBLAS's
 * 128x4 tiled layout (see dw_scale_swizzle_cpu in formats.h). */
DW_RULE int64_t dw_rule_swizzle_offset(int64_t r, int64_t c, int64_t scols) {
    int64_t tiles_per_row = (scols + 3) / 4;
    int64_t rr = r % 128;
    return ((r / 128) * tiles_per_row + c / 4) * 512 + (rr % 32) * 16 + (rr / 32) * 4 + c % 4;
}

#endif /* DW_FORMATS_RULES_H */
