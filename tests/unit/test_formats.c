/* test_formats.c — element formats of formats.h: every code round-trips, decoding matches values
 * written out by hand, and encoding is the nearest code (ties to even, saturation, specials)
 * checked by brute force over the code table on fresh random inputs. The CUDA-oracle comparison
 * is test_formats_oracle.cpp; recipes are test_formats_recipes.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "formats/formats.h"
#include "formats/rules.h"
#include "testutil.h"


/* Value of a code from its fields, written independently of elem.c. */
static double field_value(unsigned code, int ebits, int mbits, int bias) {
    unsigned e = (code >> mbits) & ((1u << ebits) - 1u), m = code & ((1u << mbits) - 1u);
    double frac = (double)m / (double)(1u << mbits);
    double v = e ? (1.0 + frac) * pow(2.0, (double)e - bias) : frac * pow(2.0, 1.0 - bias);
    return (code >> (ebits + mbits)) & 1u ? -v : v;
}

static void test_decode_tables(void **state) {
    (void)state;
    for (unsigned c = 0; c < 256; c++) {
        float v = dw_decode_e4m3((uint8_t)c);
        if ((c & 0x7F) == 0x7F) assert_true(isnan(v));
        else assert_true((double)v == field_value(c, 4, 3, 7));
        float w = dw_decode_e5m2((uint8_t)c);
        if ((c & 0x7F) > 0x7C) assert_true(isnan(w));
        else if ((c & 0x7F) == 0x7C) assert_true(isinf(w) && (w < 0) == (c >> 7));
        else assert_true((double)w == field_value(c, 5, 2, 15));
        float s = dw_decode_ue8m0((uint8_t)c);
        if (c == 0xFF) assert_true(isnan(s));
        else assert_true((double)s == ldexp(1.0, (int)c - 127));
        if (c < 128) {
            float u = dw_decode_ue4m3((uint8_t)c);
            if (c == 0x7F) assert_true(isnan(u));
            else assert_true((double)u == field_value(c, 4, 3, 7));
        }
    }
    static const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (unsigned c = 0; c < 16; c++) {
        float v = dw_decode_e2m1((uint8_t)c);
        assert_true(v == ((c & 8) ? -e2m1[c & 7] : e2m1[c & 7]));
        assert_int_equal(signbit(v) != 0, (c & 8) != 0);
    }
    /* landmarks from FORMATS.md */
    assert_true(dw_decode_e4m3(0x7E) == 448.0f && dw_decode_e4m3(0x01) == ldexpf(1, -9));
    assert_true(dw_decode_e5m2(0x7B) == 57344.0f && dw_decode_e4m3(0x38) == 1.0f);
    assert_true(dw_decode_ue8m0(0) == ldexpf(1, -127) && dw_decode_ue8m0(127) == 1.0f);
    for (uint32_t c = 0; c < 65536; c++) {
        float v = dw_decode_bf16((uint16_t)c);
        assert_true(dw_rule_f2u(v) == (c << 16));
    }
}

static void test_round_trip_all_codes(void **state) {
    (void)state;
    for (unsigned c = 0; c < 256; c++) {
        uint8_t e4 = dw_encode_e4m3(dw_decode_e4m3((uint8_t)c));
        assert_int_equal(e4, (c & 0x7F) == 0x7F ? 0x7F : c); /* NaN -> canonical 0x7F */
        unsigned a = c & 0x7F;
        uint8_t e5 = dw_encode_e5m2(dw_decode_e5m2((uint8_t)c), false);
        assert_int_equal(e5, a > 0x7C ? 0x7F : c);
        uint8_t e5s = dw_encode_e5m2(dw_decode_e5m2((uint8_t)c), true);
        assert_int_equal(e5s, a > 0x7C ? 0x7F : a == 0x7C ? (c & 0x80) | 0x7B : c);
        if (c < 128) assert_int_equal(dw_encode_ue4m3(dw_decode_ue4m3((uint8_t)c)), c);
    }
    for (unsigned c = 0; c < 16; c++) assert_int_equal(dw_encode_e2m1(dw_decode_e2m1((uint8_t)c)), c);
    for (uint32_t c = 0; c < 65536; c++) {
        uint16_t r = dw_encode_bf16(dw_decode_bf16((uint16_t)c));
        bool nan = (c & 0x7FFF) > 0x7F80;
        assert_int_equal(r, nan ? 0x7FFF : c);
    }
}

/* Brute-force nearest code: the finite code whose value is nearest to x, ties to the code with an
 * even mantissa LSB; out-of-range values go to ±max (saturating formats). */
typedef float (*decode_fn)(uint8_t);
static unsigned nearest_code(decode_fn dec, unsigned ncodes, float x) {
    double best = INFINITY;
    unsigned bc = 0;
    for (unsigned c = 0; c < ncodes; c++) {
        float v = dec((uint8_t)c);
        if (!isfinite(v)) continue;
        if (v == 0.0f && (signbit(v) != signbit(x))) continue; /* keep the sign of zero */
        double d = fabs((double)v - (double)x);
        if (d < best || (d == best && !(c & 1))) best = d, bc = c;
    }
    return bc;
}
static float e2m1_dec8(uint8_t c) { return dw_decode_e2m1(c); }

static float random_float_near(dw_test_rng *r, int lo_exp, int hi_exp) {
    /* random sign, exponent in [lo_exp, hi_exp], random mantissa; a quarter are exact midpoints
     * between E4M3/E5M2/E2M1 neighbours (few low mantissa bits set). */
    int e = lo_exp + (int)(dw_test_next(r) % (uint64_t)(hi_exp - lo_exp + 1));
    uint32_t mant = (uint32_t)dw_test_next(r) & 0x7FFFFF;
    if ((dw_test_next(r) & 3) == 0) mant &= 0x7F0000; /* 7 leading bits only: ties occur */
    float v = ldexpf(1.0f + (float)mant / 8388608.0f, e);
    return (dw_test_next(r) & 1) ? -v : v;
}

static void test_encode_is_nearest(void **state) {
    (void)state;
    dw_test_rng r;
    dw_test_rng_init(&r, dw_test_seed());
    for (int i = 0; i < 60000; i++) {
        float x = random_float_near(&r, -12, 10);
        unsigned want = nearest_code(dw_decode_e4m3, 256, x);
        if (dw_encode_e4m3(x) != want) fail_msg("e4m3(%a) = %#x, nearest %#x", x, dw_encode_e4m3(x), want);
        float y = random_float_near(&r, -18, 17);
        unsigned want5 = nearest_code(dw_decode_e5m2, 256, y);
        if (dw_encode_e5m2(y, true) != want5)
            fail_msg("e5m2(%a) = %#x, nearest %#x", y, dw_encode_e5m2(y, true), want5);
        /* non-saturating: beyond max + half ulp (61440, a tie that rounds to even = Inf) is Inf */
        uint8_t ns = dw_encode_e5m2(y, false);
        if (fabsf(y) >= 61440.0f) assert_int_equal(ns, (y < 0 ? 0x80 : 0) | 0x7C);
        else assert_int_equal(ns, want5);
        float z = random_float_near(&r, -4, 4);
        unsigned want2 = nearest_code(e2m1_dec8, 16, z);
        if (dw_encode_e2m1(z) != want2) fail_msg("e2m1(%a) = %#x, nearest %#x", z, dw_encode_e2m1(z), want2);
        float u = fabsf(x);
        assert_int_equal(dw_encode_ue4m3(u), nearest_code(dw_decode_ue4m3, 128, u));
    }
}

static void test_encode_edges(void **state) {
    (void)state;
    /* E4M3 */
    assert_int_equal(dw_encode_e4m3(448.0f), 0x7E);
    assert_int_equal(dw_encode_e4m3(464.0f), 0x7E);   /* tie 448|480 -> even (448) */
    assert_int_equal(dw_encode_e4m3(464.01f), 0x7E);  /* above: saturates */
    assert_int_equal(dw_encode_e4m3(-1e30f), 0xFE);
    assert_int_equal(dw_encode_e4m3(INFINITY), 0x7E);
    assert_int_equal(dw_encode_e4m3(-INFINITY), 0xFE);
    assert_int_equal(dw_encode_e4m3(NAN), 0x7F);
    assert_int_equal(dw_encode_e4m3(-NAN), 0x7F);
    assert_int_equal(dw_encode_e4m3(0.0f), 0x00);
    assert_int_equal(dw_encode_e4m3(-0.0f), 0x80);
    assert_int_equal(dw_encode_e4m3(ldexpf(1, -10)), 0x00);          /* half min subnormal: tie to 0 */
    assert_int_equal(dw_encode_e4m3(ldexpf(1.01f, -10)), 0x01);
    assert_int_equal(dw_encode_e4m3(ldexpf(3, -10)), 0x02);          /* 1.5 quanta: tie to even 2 */
    assert_int_equal(dw_encode_e4m3(ldexpf(1, -6)), 0x08);           /* min normal */
    assert_int_equal(dw_encode_e4m3(ldexpf(15, -10)), 0x08);         /* 7.5 quanta -> 8 (even) */
    assert_int_equal(dw_encode_e4m3(dw_rule_u2f(1)), 0x00);                  /* FP32 subnormal */
    assert_int_equal(dw_encode_e4m3(1.0625f), 0x38);                 /* 1 + 1/16: tie to even */
    assert_int_equal(dw_encode_e4m3(1.1875f), 0x3A);                 /* 1 + 3/16 -> 1.25 */
    /* E5M2 */
    assert_int_equal(dw_encode_e5m2(57344.0f, false), 0x7B);
    assert_int_equal(dw_encode_e5m2(61439.996f, false), 0x7B);
    assert_int_equal(dw_encode_e5m2(61440.0f, false), 0x7C);
    assert_int_equal(dw_encode_e5m2(61440.0f, true), 0x7B);
    assert_int_equal(dw_encode_e5m2(-INFINITY, false), 0xFC);
    assert_int_equal(dw_encode_e5m2(-INFINITY, true), 0xFB);
    assert_int_equal(dw_encode_e5m2(NAN, false), 0x7F);
    assert_int_equal(dw_encode_e5m2(ldexpf(1, -16), false), 0x01);
    assert_int_equal(dw_encode_e5m2(ldexpf(1, -17), false), 0x00);
    assert_int_equal(dw_encode_e5m2(-0.0f, true), 0x80);
    /* E2M1 */
    static const struct { float x; uint8_t c; } e2[] = {
        {0.25f, 0}, {0.2501f, 1}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4}, {3.5f, 6},
        {5.0f, 6}, {5.01f, 7}, {6.0f, 7}, {100.0f, 7}, {-6.5f, 0xF}, {-0.0f, 8}, {-0.3f, 9}};
    for (size_t i = 0; i < sizeof e2 / sizeof e2[0]; i++) assert_int_equal(dw_encode_e2m1(e2[i].x), e2[i].c);
    assert_int_equal(dw_encode_e2m1(INFINITY), 7);
    assert_int_equal(dw_encode_e2m1(NAN), 0); /* contract: NaN -> +0, the block is marked */
    /* UE4M3 */
    assert_int_equal(dw_encode_ue4m3(448.0f), 0x7E);
    assert_int_equal(dw_encode_ue4m3(1e9f), 0x7E);
    assert_int_equal(dw_encode_ue4m3(NAN), 0x7F);
    assert_int_equal(dw_encode_ue4m3(-1.0f), 0x00);
    assert_int_equal(dw_encode_ue4m3(-0.0f), 0x00);
    /* BF16 */
    assert_int_equal(dw_encode_bf16(1.0f), 0x3F80);
    assert_int_equal(dw_encode_bf16(dw_rule_u2f(0x3F808000)), 0x3F80); /* tie, even stays */
    assert_int_equal(dw_encode_bf16(dw_rule_u2f(0x3F818000)), 0x3F82); /* tie, odd rounds up */
    assert_int_equal(dw_encode_bf16(dw_rule_u2f(0x3F808001)), 0x3F81);
    assert_int_equal(dw_encode_bf16(dw_rule_u2f(0x7F7FFFFF)), 0x7F80); /* FLT_MAX rounds to Inf */
    assert_int_equal(dw_encode_bf16(-INFINITY), 0xFF80);
    assert_int_equal(dw_encode_bf16(-NAN), 0x7FFF);
    assert_int_equal(dw_encode_bf16(dw_rule_u2f(0x80000001)), 0x8000);
}

static void test_recipe_names(void **state) {
    (void)state;
    for (int i = 0; i < DW_RECIPE_COUNT; i++) {
        dw_recipe r;
        assert_true(dw_recipe_parse(dw_recipe_name((dw_recipe)i), &r));
        assert_int_equal(r, i);
    }
    assert_string_equal(dw_recipe_name(DW_RECIPE_MXFP8), "mxfp8");
    assert_string_equal(dw_recipe_name(DW_RECIPE_FP8_BLOCK2D), "fp8_block2d");
    dw_recipe r = DW_RECIPE_NVFP4;
    assert_false(dw_recipe_parse("mxfp6", &r));
    assert_false(dw_recipe_parse(NULL, &r));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_tables),
        cmocka_unit_test(test_round_trip_all_codes),
        cmocka_unit_test(test_encode_is_nearest),
        cmocka_unit_test(test_encode_edges),
        cmocka_unit_test(test_recipe_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
