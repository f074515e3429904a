/* test_formats_quot.c — the division-free fp8_block arithmetic of formats/rules.h that the GPU's
 * bulk quantiser uses on BF16 data, exhausted over its whole domain against the CPU reference:
 * the scale RN(amax / 448) for every finite BF16 amax, and the E4M3 code of every BF16 element
 * under every such scale (about 4e8 pairs; the ones far below a block's amax by an argument and
 * one check per block, see test_quot_split_every_pair). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "formats/formats.h"
#include "formats/rules.h"
#include "testutil.h"

static float bf16(uint32_t bits) { return dw_rule_u2f(bits << 16); }

/* Every finite BF16 amax > 0: the division-free scale is the reference rule's, bit for bit. */
static void test_scale_every_bf16_amax(void **state) {
    (void)state;
    int bad = 0;
    for (uint32_t b = 1; b < 0x7F80u; b++) {
        const float ref = dw_rule_fp8_scale(b << 16, false), got = dw_rule_fp8_scale_bf16(b << 16);
        if (dw_rule_f2u(got) != dw_rule_f2u(ref) && bad++ < 5)
            fprintf(stderr, "amax %a: scale %a, reference %a\n", (double)bf16(b), (double)got, (double)ref);
    }
    assert_int_equal(bad, 0);
}

/* Every block scale s = RN(amax / 448) of a finite BF16 amax > 0 with s >= 2^-60 (below, the
 * kernel divides), and every BF16 x with 0 <= x <= amax: the E4M3 code of dw_rule_quot_split(x)
 * is the code of RN(x / s) — with hi, lo from dw_rule_recip_split, or hi = 1/s, lo = 0 where s is
 * a power of two. Negative x: both sides are odd functions of x (round to nearest even is
 * symmetric, E4M3 is sign-magnitude), checked on -0 and one random x per block.
 * Elements below amax 2^-20 are not enumerated: their quotients lie below 2^-11, and both sides
 * are nondecreasing in x (a correctly rounded quotient is; RN(x hi + RN(x lo)) grows by about
 * hi ulp(x) per step of x while RN(x lo) moves by at most one ulp of a term 2^22 times smaller),
 * so checking that the largest of them gives both values below 2^-10 (E4M3 code 0) covers the
 * rest. Enumerating them would only measure the host's slow subnormal arithmetic. */
static void test_quot_split_every_pair(void **state) {
    (void)state;
    const uint64_t seed = dw_test_seed();
    dw_test_rng rng;
    dw_test_rng_init(&rng, seed);
    uint64_t pairs = 0, f32_differ = 0;
    int bad = 0;
    for (uint32_t ab = 1; ab < 0x7F80u; ab++) {
        const float amax = bf16(ab), s = dw_rule_fp8_scale(ab << 16, false);
        if (s < 0x1p-60f) continue;
        const uint32_t su = dw_rule_f2u(s);
        float hi, lo;
        if ((su & 0x7FFFFFu) == 0) hi = dw_rule_pow2f(127 - (int)(su >> 23)), lo = 0.0f;
        else dw_rule_recip_split(s, 1.0f / s, &hi, &lo);
        uint32_t x0 = 0; /* the first element enumerated: the least BF16 >= amax 2^-20 */
        while (x0 < ab && bf16(x0 + 1024u) < amax * 0x1p-20f) x0 += 1024u;
        while (bf16(x0) < amax * 0x1p-20f) x0++;
        if (x0 > 0) { /* the largest one skipped: code 0 on both sides */
            const float x = bf16(x0 - 1u), q = dw_rule_quot_split(x, hi, lo), ref = x / s;
            if (!(q < 0x1p-10f && ref < 0x1p-10f) && bad++ < 5)
                fprintf(stderr, "amax %a: skipped x %a gives %a / %a\n", (double)amax, (double)x, (double)q, (double)ref);
        }
        for (uint32_t xb = x0; xb <= ab; xb++) {
            const float x = bf16(xb), q = dw_rule_quot_split(x, hi, lo), ref = x / s;
            if (dw_rule_f2u(q) == dw_rule_f2u(ref)) continue;
            f32_differ++;
            if (dw_encode_e4m3(q) != dw_encode_e4m3(ref) && bad++ < 5)
                fprintf(stderr, "amax %a, x %a: code %02x, reference %02x\n", (double)amax, (double)x,
                        dw_encode_e4m3(q), dw_encode_e4m3(ref));
        }
        pairs += ab + 1u - x0;
        const float xn[2] = {-0.0f, -bf16((uint32_t)(dw_test_next(&rng) % (ab + 1u)))};
        for (int i = 0; i < 2; i++)
            if (dw_encode_e4m3(dw_rule_quot_split(xn[i], hi, lo)) != dw_encode_e4m3(xn[i] / s) && bad++ < 5)
                fprintf(stderr, "amax %a, x %a: negative element's code differs\n", (double)amax, (double)xn[i]);
    }
    printf("%llu pairs (seed %llu): %llu FP32 quotients differ from RN(x/s), no E4M3 code does\n",
           (unsigned long long)pairs, (unsigned long long)seed, (unsigned long long)f32_differ);
    assert_true(pairs > 50000000u); /* 22764 blocks x 20 binades of elements */
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scale_every_bf16_amax),
        cmocka_unit_test(test_quot_split_every_pair),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
