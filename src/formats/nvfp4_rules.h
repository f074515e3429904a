/* nvfp4_rules.h — private: the arithmetic of the NVFP4 training recipe (NVIDIA's NVFP4 pretraining
 * paper, 2025) as inline host/device functions shared by the CPU reference
 * (kernels/cpu/nvfp4_train_cpu.c) and the CUDA kernels (kernels/cuda/ops_nvfp4.cu), so both produce
 * the same bits: Philox4x32-10, the 16-point random Hadamard transform, stochastic rounding to
 * E2M1, and portable RNE encoders for E2M1 and UE4M3 (the GPU's PTX conversions are not used, so
 * the host emulator runs the same code). The NVFP4 block rule itself is FORMATS.md's (rules.h).
 * Not the scale layouts or the GEMMs. */
#ifndef DW_FORMATS_NVFP4_RULES_H
#define DW_FORMATS_NVFP4_RULES_H

#include <stdbool.h>
#include <stdint.h>

#include "formats/rules.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Options of one NVFP4 quantisation beyond FORMATS.md's 1x16 RNE rule. The "view" is the tensor
 * being quantised: x [rows, cols], or x^T [cols, rows] with trans. */
typedef struct {
    bool trans;      /* quantise x^T (blocks run along x's rows: the tokens, for wgrad operands) */
    bool block2d;    /* 16x16 blocks share a scale (weights): q(W)^T == q(W^T) bit for bit; the
                        scale array keeps the 1x16 layout [R, ceil(C/16)], each of a block's 16
                        rows holding the block's code */
    bool rht;        /* each whole 1x16 block of the view is multiplied by T = H16 diag(s) / 4
                        before quantising (s: the seed's random signs); a ragged last block is
                        left as is. Not with block2d */
    bool sr;         /* elements stochastically rounded (Philox of seed, stream, step, index) */
    uint64_t seed;   /* RHT signs (the seed alone) and SR key */
    uint32_t stream; /* SR: which tensor of the step (node and operand) */
    uint32_t step;   /* SR: the training step (unless step_from_scale) */
    bool step_from_scale; /* SR: the step word is the bits of the view's tensor scale s_t instead — a
                             value of the data, so fresh every training step yet the same on a
                             resumed run and on every backend, with no counter to keep */
} dw_nvfp4_qopts;

#define DW_NVFP4_BLOCK 16

/* ---- Philox4x32-10 (Salmon et al., SC'11; Random123's constants) -------------------------- */
typedef struct {
    uint32_t v[4];
} dw_philox4;

DW_RULE dw_philox4 dw_philox4x32_10(dw_philox4 ctr, uint64_t key) {
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * ctr.v[0], p1 = (uint64_t)0xCD9E8D57u * ctr.v[2];
        dw_philox4 n = {{(uint32_t)(p1 >> 32) ^ ctr.v[1] ^ k0, (uint32_t)p1, (uint32_t)(p0 >> 32) ^ ctr.v[3] ^ k1,
                         (uint32_t)p0}};
        ctr = n;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return ctr;
}

/* The 32 random bits of element `idx` of a view: word idx % 4 of Philox(idx / 4, stream, step). */
DW_RULE uint32_t dw_nvfp4_sr_bits(uint64_t seed, uint32_t stream, uint32_t step, uint64_t idx) {
    uint64_t c = idx >> 2;
    dw_philox4 ctr = {{(uint32_t)c, (uint32_t)(c >> 32), stream, step}};
    dw_philox4 o = dw_philox4x32_10(ctr, seed);
    return o.v[idx & 3u];
}

/* The RHT's 16 random signs as a bit mask (bit i set: s_i = -1): Philox(0, 0, ~0, ~0) of the seed,
 * a counter SR never uses (its step word would have to be ~0 with stream ~0). */
DW_RULE uint32_t dw_nvfp4_rht_signs(uint64_t seed) {
    dw_philox4 ctr = {{0u, 0u, 0xFFFFFFFFu, 0xFFFFFFFFu}};
    return dw_philox4x32_10(ctr, seed).v[0] & 0xFFFFu;
}

/* ---- 16-point random Hadamard transform ----------------------------------------------------- */
/* v <- H16 diag(s) v / 4 in place, H16 the Sylvester Hadamard matrix (H[i][j] = (-1)^popcount(i&j)):
 * signs by flipping sign bits (exact), four butterfly stages of FP32 additions in a fixed order,
 * then one exact multiplication by 1/4 (a power of two; rounds only in the subnormal range). T is
 * orthogonal: T T^T = H D D H^T / 16 = I, so (T a) . (T b) = a . b in exact arithmetic. */
DW_RULE void dw_nvfp4_rht16(float v[DW_NVFP4_BLOCK], uint32_t signs) {
    for (int i = 0; i < DW_NVFP4_BLOCK; i++)
        if ((signs >> i) & 1u) v[i] = dw_rule_u2f(dw_rule_f2u(v[i]) ^ 0x80000000u);
    for (int h = 1; h < DW_NVFP4_BLOCK; h <<= 1)
        for (int i = 0; i < DW_NVFP4_BLOCK; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
    for (int i = 0; i < DW_NVFP4_BLOCK; i++) v[i] = dw_rule_mul(v[i], 0.25f);
}

/* ---- element and scale encoders ------------------------------------------------------------- */
/* E2M1 with round to nearest even (comparisons with the midpoints), saturating at 6; NaN -> +0;
 * the sign of a (signed) zero result is x's. FORMATS.md's E2M1 row; elem.c is the oracle. */
DW_RULE uint32_t dw_nvfp4_e2m1_rne(float x) {
    float a = fabsf(x);
    uint32_t c = (uint32_t)(a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) +
                 (a > 5.0f);
    uint32_t s = (dw_rule_f2u(x) >> 31) & (uint32_t)(a == a);
    return c | (s << 3);
}

/* E2M1 with stochastic rounding: |x| (clamped to 6) lies between grid points lo <= |x| <= hi;
 * the code rounds up to hi when u24 < (|x| - lo) / (hi - lo) * 2^24, u24 = bits >> 8 uniform in
 * [0, 2^24): P(up) = ceil(f 2^24) / 2^24 for the exact fraction f, so E[value] = |x| to within
 * 2^-24 (hi - lo). Every step is exact in FP32 (power-of-two scalings, Sterbenz subtractions).
 * NaN -> +0 as in RNE; above 6 saturates to 6. */
DW_RULE uint32_t dw_nvfp4_e2m1_sr(float x, uint32_t bits) {
    float a = fabsf(x);
    if (!(a == a)) return 0u;
    if (a > 6.0f) a = 6.0f;
    float t;
    uint32_t base;
    if (a < 2.0f) t = dw_rule_mul(a, 2.0f), base = 0u;      /* grid step 0.5: codes 0..4 */
    else if (a < 4.0f) t = a - 2.0f, base = 4u;             /* step 1: codes 4..6 */
    else t = dw_rule_mul(a - 4.0f, 0.5f), base = 6u;        /* step 2: codes 6..7 */
    float k = floorf(t), f = t - k;
    uint32_t up = (float)(bits >> 8) < dw_rule_mul(f, 16777216.0f) ? 1u : 0u;
    return (base + (uint32_t)k + up) | ((dw_rule_f2u(x) >> 31) << 3);
}

/* UE4M3 of v >= 0 (not NaN) with round to nearest even, saturating to 448 (code 0x7E): the
 * subnormal range (v < 2^-6) counts units of 2^-9; above, v 2^(3-E) in [8, 16) rounded to an
 * integer, a carry to 16 stepping into the next binade by the code's own arithmetic. */
DW_RULE uint32_t dw_nvfp4_ue4m3_rne(float v) {
    if (v >= 448.0f) return 0x7Eu;
    if (v < 0.015625f) return (uint32_t)rintf(dw_rule_mul(v, 512.0f)); /* 0..8; 8 is 2^-6's code */
    int e = dw_rule_floor_log2(v);
    uint32_t k = (uint32_t)rintf(dw_rule_mul(v, dw_rule_pow2f(3 - e)));
    uint32_t c = ((uint32_t)(e + 7) << 3) + (k - 8u);
    return c > 0x7Eu ? 0x7Eu : c;
}

/* The exact value of a UE4M3 code below 0x7F. */
DW_RULE float dw_nvfp4_ue4m3_value(uint32_t c) {
    uint32_t e = c >> 3, m = c & 7u;
    return e ? dw_rule_u2f(((e + 120u) << 23) | (m << 20)) : dw_rule_mul((float)m, 0.001953125f);
}

/* One block of the NVFP4 rule (FORMATS.md) given its amax bits and the tensor scale st:
 * returns the block's UE4M3 code and sets *d = decode(b) * st (0: every element code is 0). A NaN
 * st (non-finite tensor) gives code 0x7F and d = 0. */
DW_RULE uint32_t dw_nvfp4_block_scale(uint32_t amax_bits, float st, float *d) {
    if (dw_rule_nonfinite(dw_rule_f2u(st) & 0x7FFFFFFFu)) {
        *d = 0.0f;
        return 0x7Fu;
    }
    uint32_t b = dw_nvfp4_ue4m3_rne(dw_rule_u2f(amax_bits) / dw_rule_mul(6.0f, st));
    *d = dw_rule_mul(dw_nvfp4_ue4m3_value(b), st);
    return b;
}

/* The code of element value x of a block with d = decode(b) * st (RNE, or SR with bits). */
DW_RULE uint32_t dw_nvfp4_elem_code(float x, float d, bool sr, uint32_t bits) {
    if (d == 0.0f) return 0u;
    float q = x / d;
    return sr ? dw_nvfp4_e2m1_sr(q, bits) : dw_nvfp4_e2m1_rne(q);
}

#ifdef __cplusplus
}
#endif

#endif /* DW_FORMATS_NVFP4_RULES_H */
