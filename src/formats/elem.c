/* elem.c — CPU reference encode/decode of the element and scale formats of shared/FORMATS.md
 * (E4M3, E5M2, E2M1, UE4M3, UE8M0, BF16). Exact and simple: rounding is done in double, where
 * every FP32 input scaled by a power of two is exact. Not the recipes (recipe.c). */
#include <math.h>
#include <string.h>

#include "formats/formats.h"
#include "formats/rules.h"

/* A small binary float format: `mbits` mantissa bits, exponent bias, largest finite value. */
typedef struct {
    int mbits, bias;
    double maxv;
} small_fmt;

static const small_fmt FMT_E4M3 = {3, 7, 448.0};
static const small_fmt FMT_E5M2 = {2, 15, 57344.0};
static const small_fmt FMT_E2M1 = {1, 1, 6.0};

/* Encodes a finite a >= 0 as the unsigned bit pattern exp|mantissa, RNE; *overflow is set when
 * the rounded value exceeds maxv (the caller saturates or produces Inf/NaN). */
static unsigned enc_abs(const small_fmt *f, double a, bool *overflow) {
    *overflow = false;
    if (a == 0.0) return 0;
    int emin = 1 - f->bias, e2;
    (void)frexp(a, &e2); /* a = m * 2^e2, m in [0.5, 1) */
    int e = e2 - 1;      /* floor(log2 a) */
    if (e < emin) e = emin;
    double quantum = ldexp(1.0, e - f->mbits);
    double m = nearbyint(a / quantum); /* RNE (default rounding mode), exact division */
    double v = m * quantum;
    if (v > f->maxv) {
        *overflow = true;
        return 0;
    }
    if (v == 0.0) return 0;
    (void)frexp(v, &e2);
    e = e2 - 1;
    if (e < emin) /* subnormal: exponent field 0, mantissa counts 2^(emin - mbits) */
        return (unsigned)ldexp(v, f->mbits - emin);
    unsigned mant = (unsigned)(ldexp(v, f->mbits - e) - ldexp(1.0, f->mbits));
    return ((unsigned)(e + f->bias) << f->mbits) | mant;
}

static unsigned max_code(const small_fmt *f) {
    bool ov;
    return enc_abs(f, f->maxv, &ov);
}

static bool is_nan(float x) { return (dw_rule_f2u(x) & 0x7FFFFFFFu) > 0x7F800000u; }
static unsigned sign_bit(float x) { return dw_rule_f2u(x) >> 31; }

uint8_t dw_encode_e4m3(float x) {
    if (is_nan(x)) return 0x7F;
    unsigned s = sign_bit(x) << 7;
    double a = fabs((double)x);
    if (isinf(a)) return (uint8_t)(s | max_code(&FMT_E4M3));
    bool ov;
    unsigned c = enc_abs(&FMT_E4M3, a, &ov);
    return (uint8_t)(s | (ov ? max_code(&FMT_E4M3) : c));
}

uint8_t dw_encode_e5m2(float x, bool saturate) {
    if (is_nan(x)) return 0x7F;
    unsigned s = sign_bit(x) << 7;
    double a = fabs((double)x);
    bool ov = isinf(a);
    unsigned c = ov ? 0 : enc_abs(&FMT_E5M2, a, &ov);
    if (ov) c = saturate ? max_code(&FMT_E5M2) : 0x7Cu; /* ±57344 or ±Inf */
    return (uint8_t)(s | c);
}

uint8_t dw_encode_e2m1(float x) {
    if (is_nan(x)) return 0; /* no NaN in E2M1: callers mark the block's scale */
    unsigned s = sign_bit(x) << 3;
    double a = fabs((double)x);
    bool ov = isinf(a);
    unsigned c = ov ? 0 : enc_abs(&FMT_E2M1, a, &ov);
    return (uint8_t)(s | (ov ? max_code(&FMT_E2M1) : c));
}

/* UE4M3: E4M3 without the sign; NaN -> 0x7F; no negative values: x <= 0 encodes as 0. */
uint8_t dw_encode_ue4m3(float x) {
    if (is_nan(x)) return 0x7F;
    if (!(x > 0.0f)) return 0;
    return dw_encode_e4m3(x);
}

uint16_t dw_encode_bf16(float x) {
    if (is_nan(x)) return 0x7FFF; /* canonical NaN, as CUDA's conversions produce */
    uint32_t u = dw_rule_f2u(x);
    u += 0x7FFFu + ((u >> 16) & 1u); /* RNE on the dropped 16 bits; overflow carries into Inf */
    return (uint16_t)(u >> 16);
}

/* Decodes exp|mantissa (no sign) of a small format; NaN/Inf codes are handled by the callers. */
static float dec_abs(const small_fmt *f, unsigned c) {
    unsigned e = c >> f->mbits, m = c & ((1u << f->mbits) - 1u);
    if (e == 0) return (float)ldexp((double)m, 1 - f->bias - f->mbits);
    return (float)ldexp((double)((1u << f->mbits) | m), (int)e - f->bias - f->mbits);
}

float dw_decode_e4m3(uint8_t c) {
    if ((c & 0x7F) == 0x7F) return NAN;
    float v = dec_abs(&FMT_E4M3, c & 0x7Fu);
    return (c & 0x80) ? -v : v;
}

float dw_decode_e5m2(uint8_t c) {
    unsigned a = c & 0x7Fu;
    float v;
    if (a > 0x7C) v = NAN;
    else if (a == 0x7C) v = INFINITY;
    else v = dec_abs(&FMT_E5M2, a);
    return (c & 0x80) ? -v : v;
}

float dw_decode_e2m1(uint8_t c) {
    float v = dec_abs(&FMT_E2M1, c & 0x7u);
    return (c & 0x8) ? -v : v;
}

float dw_decode_ue8m0(uint8_t c) {
    if (c == 0xFF) return NAN;
    return dw_rule_pow2f((int)c - 127);
}

/* UE4M3 codes have 7 bits; bit 7 is ignored. */
float dw_decode_ue4m3(uint8_t c) { return dw_decode_e4m3(c & 0x7Fu); }

float dw_decode_bf16(uint16_t c) { return dw_rule_u2f((uint32_t)c << 16); }
