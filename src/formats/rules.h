/* rules.h — private: the per-block scale rules of shared/FORMATS.md as inline functions shared by
 * the CPU reference (src/formats) and the CUDA kernels (kernels/cuda/quant*.cu), so both compute
 * scales from an amax with the same FP32 operations. Element encoding is NOT here: the CPU encodes
 * with elem.c, the GPU with hardware conversions, and the tests compare the two. */
#ifndef DW_FORMATS_RULES_H
#define DW_FORMATS_RULES_H

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

#endif /* DW_FORMATS_RULES_H */
