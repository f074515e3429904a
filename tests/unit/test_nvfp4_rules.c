/* test_nvfp4_rules.c — the arithmetic of the NVFP4 training recipe (formats/nvfp4_rules.h) and its
 * CPU quantiser (kernels/cpu/nvfp4_train_cpu.c) on 1x16 blocks:
 *  - Philox4x32-10 against Random123's known-answer vectors;
 *  - the portable E2M1 and UE4M3 encoders against formats/elem.c over sweeps of FP32 bit patterns
 *    and every midpoint +-2 ulps;
 *  - the 16-point Hadamard matrix: H H^T = 16 I exactly in the +-1 form, and T T^T = I exactly for
 *    the scaled, randomly signed T of random seeds;
 *  - with every option off, dw_nvfp4_quantize_cpu is FORMATS.md's nvfp4 (dw_quantize_cpu,
 *    dw_quantize_transposed_cpu) bit for bit;
 *  - the wgrad dW = dy^T x with the RHT on both operands along the tokens equals the plain wgrad:
 *    unquantised, within FP32 rounding (|diff| <= 2^-20 sum over 16-token blocks of
 *    (sum |dy|)(sum |x|) per entry); quantised to NVFP4, each entry within the bound the elements'
 *    quantisation errors give (sum_n ea |b| + |a| eb + ea eb, ea <= max(d, amax - 6d) per block of
 *    the transformed views), plus that rounding. The relative Frobenius errors with and without
 *    the transform are printed, not asserted (on i.i.d. data the transform need not help). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"
#include "formats/nvfp4_rules.h"
#include "kernels/cpu/nvfp4_train_cpu.h"
#include "testutil.h"

static dw_test_rng g_rng;

static void test_philox_known_answers(void **state) {
    (void)state;
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t k = 0; k < sizeof kat / sizeof kat[0]; k++) {
        dw_philox4 c = {{kat[k].ctr[0], kat[k].ctr[1], kat[k].ctr[2], kat[k].ctr[3]}};
        dw_philox4 o = dw_philox4x32_10(c, (uint64_t)kat[k].key[0] | (uint64_t)kat[k].key[1] << 32);
        for (int i = 0; i < 4; i++) {
            if (o.v[i] != kat[k].out[i]) fail_msg("philox vector %zu word %d: %08x, expected %08x", k, i, o.v[i], kat[k].out[i]);
        }
    }
}

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static void check_e2m1(float x) {
    uint32_t a = dw_nvfp4_e2m1_rne(x), b = dw_encode_e2m1(x);
    if (a != b) fail_msg("E2M1 of %a (%08x): %x, elem.c %x", (double)x, f2u(x), a, b);
}
static void check_ue4m3(float x) {
    uint32_t a = dw_nvfp4_ue4m3_rne(x), b = dw_encode_ue4m3(x);
    if (a != b) fail_msg("UE4M3 of %a (%08x): %x, elem.c %x", (double)x, f2u(x), a, b);
}

static void test_encoders_match_elem(void **state) {
    (void)state;
    const uint32_t stride = 0x101u + (uint32_t)(dw_test_next(&g_rng) % 64); /* fresh phase each run */
    for (uint32_t u = (uint32_t)(dw_test_next(&g_rng) % stride); u < 0x7F800000u; u += stride) {
        check_e2m1(u2f(u));
        check_e2m1(-u2f(u));
        if (u2f(u) < 500.0f) check_ue4m3(u2f(u));
    }
    for (uint32_t c = 0; c < 0x7E; c++) { /* every UE4M3 midpoint and code value, +-2 ulps */
        const float lo = dw_decode_ue4m3((uint8_t)c), hi = dw_decode_ue4m3((uint8_t)(c + 1));
        const float pts[] = {lo, (float)(((double)lo + hi) / 2)};
        for (int p = 0; p < 2; p++)
            for (int d = -2; d <= 2; d++) {
                float v = u2f(f2u(pts[p]) + (uint32_t)d);
                if (pts[p] == 0.0f && d < 0) continue;
                check_ue4m3(v);
            }
    }
    for (uint32_t c = 0; c < 7; c++) { /* E2M1 midpoints */
        const float m = (dw_decode_e2m1((uint8_t)c) + dw_decode_e2m1((uint8_t)(c + 1))) / 2;
        for (int d = -2; d <= 2; d++) check_e2m1(u2f(f2u(m) + (uint32_t)d)), check_e2m1(-u2f(f2u(m) + (uint32_t)d));
    }
    check_ue4m3(448.0f), check_ue4m3(460.0f), check_ue4m3(1e30f), check_ue4m3(0.0f);
    check_e2m1(NAN), check_e2m1(INFINITY), check_e2m1(-INFINITY), check_e2m1(-0.0f), check_e2m1(7.0f);
}

/* Column j of T: the transform of the unit vector e_j. */
static void rht_matrix(uint32_t signs, double T[16][16]) {
    for (int j = 0; j < 16; j++) {
        float v[16] = {0};
        v[j] = 1.0f;
        dw_nvfp4_rht16(v, signs);
        for (int i = 0; i < 16; i++) T[i][j] = v[i];
    }
}

static void test_hadamard_orthogonal(void **state) {
    (void)state;
    double T[16][16];
    rht_matrix(0, T); /* no signs: T = H / 4, so 4T is the +-1 Hadamard matrix */
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            const int h = (int)(4 * T[i][j]);
            assert_true(h == 1 || h == -1);
            assert_int_equal(h, (__builtin_popcount((unsigned)(i & j)) & 1) ? -1 : 1); /* Sylvester */
        }
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) { /* H H^T = 16 I in integers */
            int s = 0;
            for (int k = 0; k < 16; k++) s += (int)(4 * T[i][k]) * (int)(4 * T[j][k]);
            assert_int_equal(s, i == j ? 16 : 0);
        }
    for (int trial = 0; trial < 64; trial++) { /* T T^T = I exactly for random signed T */
        const uint64_t seed = dw_test_next(&g_rng);
        const uint32_t signs = dw_nvfp4_rht_signs(seed);
        rht_matrix(signs, T);
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++) {
                double s = 0;
                for (int k = 0; k < 16; k++) s += T[i][k] * T[j][k];
                if (s != (i == j ? 1.0 : 0.0)) fail_msg("seed %llx: (T T^T)[%d][%d] = %g", (unsigned long long)seed, i, j, s);
                assert_true(fabs(T[i][j]) == 0.25);
            }
        for (int j = 0; j < 16; j++) /* the signs are diag(s): column j of T is H's column j times s_j */
            assert_true(T[0][j] == (((signs >> j) & 1u) ? -0.25 : 0.25));
    }
    assert_int_equal(dw_nvfp4_rht_signs(42), dw_nvfp4_rht_signs(42));
}

static dw_qtensor qalloc(int64_t rows, int64_t cols) {
    dw_qtensor q = {0};
    q.codes = malloc(dw_quant_codes_bytes(DW_RECIPE_NVFP4, rows, cols) + 1);
    q.scales = malloc(dw_quant_scales_bytes(DW_RECIPE_NVFP4, rows, cols) + 1);
    return q;
}
static void qfree(dw_qtensor *q) {
    free(q->codes);
    free(q->scales);
}
static void assert_q_equal(const dw_qtensor *a, const dw_qtensor *b, const char *what) {
    if (a->rows != b->rows || a->cols != b->cols) fail_msg("%s: shapes differ", what);
    if (f2u(a->tensor_scale) != f2u(b->tensor_scale)) fail_msg("%s: s_t %a vs %a", what, (double)a->tensor_scale, (double)b->tensor_scale);
    if (memcmp(a->codes, b->codes, dw_quant_codes_bytes(DW_RECIPE_NVFP4, a->rows, a->cols)))
        fail_msg("%s: codes differ", what);
    if (memcmp(a->scales, b->scales, dw_quant_scales_bytes(DW_RECIPE_NVFP4, a->rows, a->cols)))
        fail_msg("%s: scales differ", what);
}

static float *rand_matrix(int64_t n, float outlier_p) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) {
        x[i] = dw_test_normal(&g_rng) * ldexpf(1.0f, (int)(dw_test_next(&g_rng) % 6) - 3);
        if (dw_test_uniform(&g_rng, 0, 1) < outlier_p) x[i] *= 64.0f;
    }
    return x;
}

static void test_plain_options_are_formats_nvfp4(void **state) {
    (void)state;
    for (int trial = 0; trial < 40; trial++) {
        const int64_t rows = dw_test_rnd(1, 70), cols = dw_test_rnd(1, 90);
        float *x = rand_matrix(rows * cols, 0.02f);
        if (trial % 5 == 0) x[dw_test_rnd(0, rows * cols - 1)] = trial % 10 ? INFINITY : NAN;
        for (int t = 0; t < 2; t++) {
            const int64_t R = t ? cols : rows, C = t ? rows : cols;
            dw_qtensor a = qalloc(R, C), b = qalloc(R, C);
            const dw_quant_opts fo = {.recipe = DW_RECIPE_NVFP4};
            const dw_nvfp4_qopts no = {.trans = t, .seed = dw_test_next(&g_rng)};
            assert_int_equal(dw_nvfp4_quantize_cpu(NULL, &no, x, rows, cols, &a), DW_OK);
            assert_int_equal(t ? dw_quantize_transposed_cpu(NULL, &fo, x, rows, cols, &b)
                               : dw_quantize_cpu(NULL, &fo, x, rows, cols, &b),
                             DW_OK);
            char what[96];
            snprintf(what, sizeof what, "[%lld x %lld]%s", (long long)rows, (long long)cols, t ? "^T" : "");
            assert_q_equal(&a, &b, what);
            qfree(&a), qfree(&b);
        }
        free(x);
    }
    const dw_nvfp4_qopts bad = {.rht = true, .block2d = true};
    float x[16] = {0};
    dw_qtensor q = qalloc(1, 16);
    assert_int_equal(dw_nvfp4_quantize_cpu(NULL, &bad, x, 1, 16, &q), DW_ERR_INVALID);
    qfree(&q);
}

/* dW [M,K] = A B^T in double for A [M,N], B [K,N] (the views dy^T, x^T). */
static double *matmul_nt(const float *A, const float *B, int64_t M, int64_t K, int64_t N) {
    double *d = calloc((size_t)(M * K), sizeof *d);
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) {
            double s = 0;
            for (int64_t n = 0; n < N; n++) s += (double)A[m * N + n] * B[k * N + n];
            d[m * K + k] = s;
        }
    return d;
}

static double rel_fro(const double *a, const double *ref, int64_t n) {
    double e = 0, r = 0;
    for (int64_t i = 0; i < n; i++) e += (a[i] - ref[i]) * (a[i] - ref[i]), r += ref[i] * ref[i];
    return sqrt(e / r);
}

/* Bound on each element's quantisation error in view v [R,C] of q (1x16 blocks): an element with
 * |v| <= 6d is off by at most half the largest E2M1 gap, d (d = decode(b) s_t); above 6d it
 * saturates, off by at most amax - 6d; d = 0 zeroes the block, off by at most amax. */
static float *elem_err_bound(const dw_qtensor *q, const float *v) {
    const int64_t R = q->rows, C = q->cols, scols = (C + 15) / 16;
    float *eb = malloc((size_t)(R * C) * sizeof *eb);
    for (int64_t i = 0; i < R; i++)
        for (int64_t c0 = 0; c0 < C; c0 += 16) {
            float amax = 0;
            for (int64_t j = c0; j < C && j < c0 + 16; j++) amax = fmaxf(amax, fabsf(v[i * C + j]));
            const float d = dw_decode_ue4m3(((const uint8_t *)q->scales)[i * scols + c0 / 16]) * q->tensor_scale;
            const float e = d == 0 ? amax : fmaxf(d, amax - 6 * d);
            for (int64_t j = c0; j < C && j < c0 + 16; j++) eb[i * C + j] = e;
        }
    return eb;
}

/* The wgrad of dy [N,M], x [N,K] through the NVFP4 quantiser with options o, dequantised, in
 * double; *bound: per entry, sum_n (ea |b| + |a| eb + ea eb) over the views a, b the quantiser saw. */
static double *wgrad_q(const dw_nvfp4_qopts *o, const float *dy, const float *x, int64_t N, int64_t M, int64_t K,
                       double **bound) {
    dw_qtensor qa = qalloc(M, N), qb = qalloc(K, N);
    assert_int_equal(dw_nvfp4_quantize_cpu(NULL, o, dy, N, M, &qa), DW_OK);
    assert_int_equal(dw_nvfp4_quantize_cpu(NULL, o, x, N, K, &qb), DW_OK);
    float *a = malloc((size_t)(M * N) * sizeof *a), *b = malloc((size_t)(K * N) * sizeof *b);
    float *va = malloc((size_t)(M * N) * sizeof *va), *vb = malloc((size_t)(K * N) * sizeof *vb);
    dw_dequantize_cpu(&qa, a);
    dw_dequantize_cpu(&qb, b);
    dw_nvfp4_view_cpu(o, dy, N, M, va), dw_nvfp4_view_cpu(o, x, N, K, vb);
    float *ea = elem_err_bound(&qa, va), *eb = elem_err_bound(&qb, vb);
    *bound = calloc((size_t)(M * K), sizeof **bound);
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) {
            double s = 0;
            for (int64_t n = 0; n < N; n++) {
                const double xa = ea[m * N + n], xb = eb[k * N + n];
                s += xa * fabs(vb[k * N + n]) + fabs(va[m * N + n]) * xb + xa * xb;
            }
            (*bound)[m * K + k] = s;
        }
    double *d = matmul_nt(a, b, M, K, N);
    free(a), free(b), free(va), free(vb), free(ea), free(eb), qfree(&qa), qfree(&qb);
    return d;
}

static void test_wgrad_with_rht(void **state) {
    (void)state;
    double sum_rht[2] = {0}, sum_plain[2] = {0};
    for (int trial = 0; trial < 12; trial++) {
        const int64_t N = 16 * dw_test_rnd(2, 12) + (trial % 3 ? 0 : dw_test_rnd(1, 15)), M = dw_test_rnd(3, 40),
                      K = dw_test_rnd(3, 40);
        const int outliers = trial % 2;
        float *dy = rand_matrix(N * M, outliers ? 0.01f : 0), *x = rand_matrix(N * K, outliers ? 0.01f : 0);
        const uint64_t seed = dw_test_next(&g_rng);
        const dw_nvfp4_qopts rht = {.trans = true, .rht = true, .seed = seed}, plain = {.trans = true};
        /* unquantised: the transformed views' product is the plain product to FP32 rounding */
        float *a = malloc((size_t)(M * N) * sizeof *a), *b = malloc((size_t)(K * N) * sizeof *b);
        float *a0 = malloc((size_t)(M * N) * sizeof *a0), *b0 = malloc((size_t)(K * N) * sizeof *b0);
        dw_nvfp4_view_cpu(&rht, dy, N, M, a), dw_nvfp4_view_cpu(&rht, x, N, K, b);
        dw_nvfp4_view_cpu(&plain, dy, N, M, a0), dw_nvfp4_view_cpu(&plain, x, N, K, b0);
        double *ref = matmul_nt(a0, b0, M, K, N), *got = matmul_nt(a, b, M, K, N), *bound;
        double *qr = wgrad_q(&rht, dy, x, N, M, K, &bound);
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++) {
                double mag = 0; /* sum over blocks of (sum |dy|) (sum |x|): the transform's rounding scale */
                for (int64_t n0 = 0; n0 < N; n0 += 16) {
                    double sa = 0, sb = 0;
                    for (int64_t n = n0; n < N && n < n0 + 16; n++) sa += fabs(a0[m * N + n]), sb += fabs(b0[k * N + n]);
                    mag += sa * sb;
                }
                const double e = ref[m * K + k], diff = fabs(got[m * K + k] - e);
                if (diff > ldexp(mag, -20))
                    fail_msg("N=%lld: RHT wgrad[%lld][%lld] %.9g vs %.9g", (long long)N, (long long)m, (long long)k, got[m * K + k], e);
                const double qdiff = fabs(qr[m * K + k] - e), qb = bound[m * K + k] * (1 + 1e-5) + ldexp(mag, -20);
                if (qdiff > qb)
                    fail_msg("N=%lld: NVFP4+RHT wgrad[%lld][%lld] %.9g vs %.9g: off by %g > bound %g", (long long)N,
                             (long long)m, (long long)k, qr[m * K + k], e, qdiff, qb);
            }
        double *bp, *qp = wgrad_q(&plain, dy, x, N, M, K, &bp);
        sum_rht[outliers] += rel_fro(qr, ref, M * K) / 6, sum_plain[outliers] += rel_fro(qp, ref, M * K) / 6;
        free(a), free(b), free(a0), free(b0), free(ref), free(got), free(qr), free(qp), free(bound), free(bp);
        free(dy), free(x);
    }
    printf("NVFP4 wgrad, mean relative Frobenius error vs FP64 (information): Gaussian %.3f with RHT, %.3f "
           "without; 1%% outliers x64 %.3f with RHT, %.3f without\n", sum_rht[0], sum_plain[0], sum_rht[1], sum_plain[1]);
}

int main(void) {
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0xF4F4ull);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_encoders_match_elem),
        cmocka_unit_test(test_hadamard_orthogonal),
        cmocka_unit_test(test_plain_options_are_formats_nvfp4),
        cmocka_unit_test(test_wgrad_with_rht),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
