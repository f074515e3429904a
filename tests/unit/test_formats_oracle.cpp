/* test_formats_oracle.cpp — the element codecs of formats.h against an independent oracle: the
 * host-side conversion functions of CUDA's cuda_fp8.h / cuda_fp4.h / cuda_bf16.h (plain C++, no
 * GPU needed). Millions of fresh random floats plus edge cases (subnormals, ties, max, just above
 * max, overflow, ±0, NaN, Inf); all codes decoded; the MX scale rules against __nv_cvt_float_to_e8m0.
 * Built only where the CUDA headers exist (tests/CMakeLists.txt). Exits non-zero on a mismatch. */
#include <cuda_bf16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

extern "C" {
#include "formats/formats.h"
#include "formats/rules.h"
#include "testutil.h"
}

static long failures = 0;
#define CHECK_EQ(got, want, fmt, ...)                                                             \
    do {                                                                                          \
        if ((unsigned)(got) != (unsigned)(want)) {                                                \
            if (failures++ < 20)                                                                  \
                fprintf(stderr, "MISMATCH %s:%d: got %#x want %#x: " fmt "\n", __FILE__, __LINE__, \
                        (unsigned)(got), (unsigned)(want), __VA_ARGS__);                          \
        }                                                                                         \
    } while (0)

static bool isnan_f(float x) { return (dw_rule_f2u(x) & 0x7FFFFFFFu) > 0x7F800000u; }

static void check_encoders(float x) {
    uint8_t o_e4 = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    uint8_t o_e4n = __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3);
    uint8_t o_e5 = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
    uint8_t o_e5n = __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2);
    uint8_t o_f4 = __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
    __nv_bfloat16 b = __float2bfloat16_rn(x);
    uint16_t o_bf;
    memcpy(&o_bf, &b, 2);

    uint8_t e4 = dw_encode_e4m3(x);
    CHECK_EQ(e4, o_e4, "e4m3 satfinite x=%a", x);
    /* NOSAT E4M3 turns overflow into NaN; ours always saturates, so compare where it did not. */
    bool e4_overflow = !isnan_f(x) && (o_e4n & 0x7F) == 0x7F;
    CHECK_EQ(e4_overflow ? (unsigned)((o_e4n & 0x80) | 0x7E) : o_e4n, e4, "e4m3 nosat x=%a", x);
    CHECK_EQ(dw_encode_e5m2(x, true), o_e5, "e5m2 satfinite x=%a", x);
    CHECK_EQ(dw_encode_e5m2(x, false), o_e5n, "e5m2 nosat x=%a", x);
    /* E2M1: CUDA maps NaN to +6 (0x7); the contract maps it to +0 and marks the block. */
    CHECK_EQ(dw_encode_e2m1(x), isnan_f(x) ? 0u : o_f4, "e2m1 x=%a", x);
    CHECK_EQ(dw_encode_bf16(x), o_bf, "bf16 x=%a", x);
    if (x > 0.0f || isnan_f(x)) CHECK_EQ(dw_encode_ue4m3(x), o_e4, "ue4m3 x=%a", x);
}

static float half_raw_to_float(__half_raw h) { return __half2float(__half(h)); }

static void check_decoders(void) {
    for (unsigned c = 0; c < 256; c++) {
        float o4 = half_raw_to_float(__nv_cvt_fp8_to_halfraw((uint8_t)c, __NV_E4M3));
        float o5 = half_raw_to_float(__nv_cvt_fp8_to_halfraw((uint8_t)c, __NV_E5M2));
        float d4 = dw_decode_e4m3((uint8_t)c), d5 = dw_decode_e5m2((uint8_t)c);
        CHECK_EQ(std::isnan(d4), std::isnan(o4), "e4m3 decode nan code=%#x", c);
        if (!std::isnan(o4)) CHECK_EQ(dw_rule_f2u(d4), dw_rule_f2u(o4), "e4m3 decode code=%#x", c);
        CHECK_EQ(std::isnan(d5), std::isnan(o5), "e5m2 decode nan code=%#x", c);
        if (!std::isnan(o5)) CHECK_EQ(dw_rule_f2u(d5), dw_rule_f2u(o5), "e5m2 decode code=%#x", c);
        if (c < 128) {
            float du = dw_decode_ue4m3((uint8_t)c);
            CHECK_EQ(std::isnan(du), std::isnan(o4), "ue4m3 decode nan code=%#x", c);
            if (!std::isnan(o4)) CHECK_EQ(dw_rule_f2u(du), dw_rule_f2u(o4), "ue4m3 decode code=%#x", c);
        }
        if (c < 16) {
            float of = half_raw_to_float(__nv_cvt_fp4_to_halfraw((uint8_t)c, __NV_E2M1));
            CHECK_EQ(dw_rule_f2u(dw_decode_e2m1((uint8_t)c)), dw_rule_f2u(of), "e2m1 decode code=%#x", c);
        }
        __nv_bfloat16_raw br = __nv_cvt_e8m0_to_bf16raw((uint8_t)c);
        float o8 = __bfloat162float(__nv_bfloat16(br));
        float d8 = dw_decode_ue8m0((uint8_t)c);
        CHECK_EQ(std::isnan(d8), std::isnan(o8), "ue8m0 decode nan code=%#x", c);
        if (!std::isnan(o8)) CHECK_EQ(dw_rule_f2u(d8), dw_rule_f2u(o8), "ue8m0 decode code=%#x", c);
    }
    for (uint32_t c = 0; c < 65536; c++) {
        __nv_bfloat16_raw r;
        r.x = (unsigned short)c;
        float o = __bfloat162float(__nv_bfloat16(r));
        CHECK_EQ(dw_rule_f2u(dw_decode_bf16((uint16_t)c)), dw_rule_f2u(o), "bf16 decode code=%#x", c);
    }
}

/* MX scale codes vs CUDA's UE8M0 conversion: rceil = round q = amax/maxnorm up to a power of two
 * (cudaRoundPosInf); floor = floor(log2 amax) (cudaRoundZero) minus emax. Normal range only:
 * outside it the contract clamps. */
static void check_mx_rule(float amax) {
    static const struct { float maxnorm; int emax; } f[3] = {{448.0f, 8}, {57344.0f, 15}, {6.0f, 2}};
    for (int k = 0; k < 3; k++) {
        float q = amax / f[k].maxnorm;
        if (q >= ldexpf(1, -126) && q <= ldexpf(1, 126)) {
            unsigned o = __nv_cvt_float_to_e8m0(q, __NV_SATFINITE, cudaRoundPosInf);
            CHECK_EQ(dw_rule_mx_scale_code(dw_rule_f2u(amax), f[k].maxnorm, f[k].emax, false), o,
                     "mx rceil amax=%a maxnorm=%g", amax, f[k].maxnorm);
        }
        if (amax >= ldexpf(1, -126) && amax <= ldexpf(1, 126)) {
            int o = (int)__nv_cvt_float_to_e8m0(amax, __NV_SATFINITE, cudaRoundZero) - f[k].emax;
            if (o >= 0)
                CHECK_EQ(dw_rule_mx_scale_code(dw_rule_f2u(amax), f[k].maxnorm, f[k].emax, true), (unsigned)o,
                         "mx floor amax=%a emax=%d", amax, f[k].emax);
        }
    }
}

static std::vector<float> edge_cases(void) {
    std::vector<float> v = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, dw_rule_u2f(0x7F800001u),
                            dw_rule_u2f(0xFFC00000u), dw_rule_u2f(1), dw_rule_u2f(0x807FFFFFu), dw_rule_u2f(0x00800000u),
                            3.4028235e38f, -3.4028235e38f};
    const double maxes[] = {448.0, 57344.0, 6.0};
    const int subexp[] = {-9, -16, -1}; /* min subnormal of E4M3, E5M2, E2M1 */
    const int ulpexp[] = {5, 13, 1};    /* ulp at max */
    for (int k = 0; k < 3; k++) {
        double m = maxes[k], ulp = ldexp(1.0, ulpexp[k]);
        const double around[] = {m, m + ulp / 2, m + ulp / 2 - ulp / 64, m + ulp / 2 + ulp / 64,
                                 m + ulp, m * 2, m * 1000, m - ulp / 2, m - ulp / 4};
        for (double a : around) v.push_back((float)a), v.push_back(-(float)a);
        double s = ldexp(1.0, subexp[k]);
        const double small[] = {s, s / 2, s / 2 * 1.0001, s / 2 * 0.9999, s * 1.5, s * 2.5, s * 3.5,
                                s / 4, s * 7.5, s * 8, s * 8.5};
        for (double a : small) v.push_back((float)a), v.push_back(-(float)a);
    }
    /* every midpoint between adjacent E4M3 / E5M2 / E2M1 values, and its FP32 neighbours */
    for (unsigned c = 0; c < 0x7E; c++) {
        float lo = dw_decode_e4m3((uint8_t)c), hi = dw_decode_e4m3((uint8_t)(c + 1));
        float mid = (float)(((double)lo + hi) / 2);
        v.insert(v.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), -mid});
    }
    for (unsigned c = 0; c < 0x7B; c++) {
        float lo = dw_decode_e5m2((uint8_t)c), hi = dw_decode_e5m2((uint8_t)(c + 1));
        float mid = (float)(((double)lo + hi) / 2);
        v.insert(v.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), -mid});
    }
    for (unsigned c = 0; c < 7; c++) {
        float mid = (dw_decode_e2m1((uint8_t)c) + dw_decode_e2m1((uint8_t)(c + 1))) / 2;
        v.insert(v.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), -mid});
    }
    return v;
}

int main(void) {
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed());
    check_decoders();
    std::vector<float> edges = edge_cases();
    for (float x : edges) check_encoders(x);
    /* 1M uniformly random bit patterns (every exponent, NaNs, Infs, subnormals) ... */
    for (int i = 0; i < 1000000; i++) check_encoders(dw_rule_u2f((uint32_t)dw_test_next(&rng)));
    /* ... and 2M in the formats' ranges, a quarter with short mantissas (many exact ties) */
    for (int i = 0; i < 2000000; i++) {
        int e = -20 + (int)(dw_test_next(&rng) % 38);
        uint32_t mant = (uint32_t)dw_test_next(&rng) & 0x7FFFFF;
        if ((dw_test_next(&rng) & 3) == 0) mant &= 0x7E0000;
        float x = ldexpf(1.0f + (float)mant / 8388608.0f, e);
        check_encoders((dw_test_next(&rng) & 1) ? -x : x);
    }
    for (int i = 0; i < 300000; i++) {
        int e = -120 + (int)(dw_test_next(&rng) % 240);
        uint32_t mant = (uint32_t)dw_test_next(&rng) & 0x7FFFFF;
        if ((dw_test_next(&rng) & 3) == 0) mant = 0; /* exact powers of two */
        check_mx_rule(ldexpf(1.0f + (float)mant / 8388608.0f, e));
    }
    long n = (long)edges.size() + 3000000;
    if (failures) {
        fprintf(stderr, "test_formats_oracle: %ld mismatches against CUDA's host conversions\n", failures);
        return 1;
    }
    printf("test_formats_oracle: %ld inputs x 7 encoders, all codes decoded, 300000 MX scales: "
           "identical to CUDA's host conversions\n", n);
    return 0;
}
