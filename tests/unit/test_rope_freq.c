/* test_rope_freq.c — RoPE's inverse-frequency tables (kernels/rope_freq.h) for the types default,
 * linear, llama3 and yarn against an oracle written here in the array form of transformers'
 * modeling_rope_utils (masks and a ramp over whole tables, not per index), on random parameters;
 * golden values of Llama 3.2's table (transformers' formulas evaluated in float64 with torch);
 * the CPU rope kernel with each type against a naive rotation by the oracle's table, and its
 * backward as the exact adjoint of the forward (<R x, g> = <x, R^T g>). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cpu/ops_cpu.h"
#include "kernels/rope_freq.h"
#include "testutil.h"

#define MAXH 2048 /* D/2 of the largest head tested */

static dw_test_rng g_rng;

static int setup(void **state) {
    (void)state;
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x40E3ull);
    return 0;
}

static double uni(double lo, double hi) { return lo + (hi - lo) * (double)dw_test_uniform(&g_rng, 0, 1); }

/* ---- the oracle: transformers' computations over whole tables ------------------------------- */
static void oracle_default(double theta, int64_t D, double *inv) {
    for (int64_t k = 0; k < D; k += 2) inv[k / 2] = 1.0 / pow(theta, (double)k / (double)D);
}

static void oracle_llama3(const dw_rope_scaling *s, double theta, int64_t D, double *out) {
    double inv[MAXH], wl[MAXH], lla[MAXH];
    const int64_t n = D / 2;
    oracle_default(theta, D, inv);
    const double low_wl = s->original_max / s->low_freq_factor, high_wl = s->original_max / s->high_freq_factor;
    for (int64_t i = 0; i < n; i++) wl[i] = 2 * M_PI / inv[i];
    for (int64_t i = 0; i < n; i++) lla[i] = wl[i] > low_wl ? inv[i] / s->factor : inv[i]; /* torch.where */
    for (int64_t i = 0; i < n; i++) {
        const double smooth = (s->original_max / wl[i] - s->low_freq_factor) /
                              (s->high_freq_factor - s->low_freq_factor);
        const double smoothed = (1 - smooth) * lla[i] / s->factor + smooth * lla[i];
        const bool medium = !(wl[i] < high_wl) && !(wl[i] > low_wl);
        out[i] = medium ? smoothed : lla[i];
    }
}

static double correction_dim(double rot, int64_t D, double theta, double maxpos) {
    return ((double)D * log(maxpos / (rot * 2 * M_PI))) / (2 * log(theta));
}

static void oracle_yarn(const dw_rope_scaling *s, double theta, int64_t D, double *out) {
    const int64_t n = D / 2;
    double low = correction_dim(s->beta_fast, D, theta, s->original_max);
    double high = correction_dim(s->beta_slow, D, theta, s->original_max);
    if (s->truncate) low = floor(low), high = ceil(high);
    low = fmax(low, 0), high = fmin(high, (double)D - 1);
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < n; i++) {
        const double pos = pow(theta, (double)(2 * i) / (double)D);
        const double extrap = 1.0 / pos, interp = 1.0 / (s->factor * pos);
        const double ramp = fmin(fmax(((double)i - low) / (high - low), 0), 1);
        const double ef = 1 - ramp; /* inv_freq_extrapolation_factor */
        out[i] = interp * (1 - ef) + extrap * ef;
    }
}

static void oracle(const dw_rope_scaling *s, double theta, int64_t D, double *out) {
    switch (s->type) {
    case DW_ROPE_DEFAULT: oracle_default(theta, D, out); break;
    case DW_ROPE_LINEAR:
        oracle_default(theta, D, out);
        for (int64_t i = 0; i < D / 2; i++) out[i] /= s->factor;
        break;
    case DW_ROPE_LLAMA3: oracle_llama3(s, theta, D, out); break;
    default: oracle_yarn(s, theta, D, out); break;
    }
}

/* Random parameters of each type, bands placed so that every branch is taken for some i. */
static dw_rope_scaling random_scaling(int32_t type, double *theta, int64_t *D) {
    *theta = uni(0, 1) < 0.5 ? 10000.0 : uni(1000, 2e6);
    *D = 2 * (int64_t)uni(2, 129);
    dw_rope_scaling s = {.type = type};
    if (type == DW_ROPE_DEFAULT) return s;
    s.factor = uni(1.0, 64.0);
    if (type == DW_ROPE_LINEAR) return s;
    s.original_max = floor(uni(16, 32768));
    if (type == DW_ROPE_LLAMA3) {
        s.low_freq_factor = uni(0.5, 2), s.high_freq_factor = s.low_freq_factor * uni(1.5, 8);
        return s;
    }
    s.beta_fast = uni(8, 64), s.beta_slow = uni(0.5, 2), s.truncate = uni(0, 1) < 0.5;
    s.attention_factor = 0.1 * log(s.factor) + 1;
    return s;
}

static void test_tables_vs_oracle(void **state) {
    (void)state;
    for (int32_t type = 0; type < DW_ROPE_TYPE_COUNT; type++)
        for (int rep = 0; rep < 200; rep++) {
            double theta;
            int64_t D;
            const dw_rope_scaling s = random_scaling(type, &theta, &D);
            assert_null(dw_rope_scaling_problem(&s, theta));
            double want[MAXH];
            oracle(&s, theta, D, want);
            for (int64_t i = 0; i < D / 2; i++) {
                const double got = dw_rope_inv_freq(&s, theta, D, i);
                if (!(fabs(got - want[i]) <= 1e-13 * want[i]))
                    fail_msg("%s theta %g D %lld factor %g: inv_freq[%lld] = %.17g, oracle %.17g",
                             dw_rope_type_name(type), theta, (long long)D, s.factor, (long long)i, got, want[i]);
            }
        }
}

/* Llama-3.2-1B (theta 500000, head_dim 64, llama3: factor 32, low 1, high 4, original 8192):
 * transformers' _compute_llama3_parameters evaluated in float64 with torch 1.13. */
static void test_llama32_golden(void **state) {
    (void)state;
    const dw_rope_scaling s = {.type = DW_ROPE_LLAMA3, .factor = 32, .low_freq_factor = 1, .high_freq_factor = 4,
                               .original_max = 8192};
    const struct {
        int i;
        double inv;
    } golden[] = {{0, 1.0},                       /* high frequency: kept */
                  {10, 0.016560440080994446},
                  {16, 0.00042955679655936815},      /* the band between: blended */
                  {17, 9.70828780262767e-05},
                  {18, 1.9461638184831125e-05},      /* low frequency: divided by 32 */
                  {24, 1.661967467795309e-06},
                  {31, 9.418306725434909e-08}};
    for (size_t k = 0; k < sizeof golden / sizeof golden[0]; k++) {
        const double got = dw_rope_inv_freq(&s, 500000.0, 64, golden[k].i);
        if (!(fabs(got - golden[k].inv) <= 1e-14 * golden[k].inv))
            fail_msg("Llama 3.2 inv_freq[%d] = %.17g, transformers %.17g", golden[k].i, got, golden[k].inv);
    }
    assert_true(dw_rope_attention(&s) == 1.0);
    /* Qwen-style yarn: factor 4 over 32768 positions, head 128, theta 1e6: attention 0.1 ln 4 + 1 */
    const dw_rope_scaling y = {.type = DW_ROPE_YARN, .factor = 4, .original_max = 32768, .beta_fast = 32,
                               .beta_slow = 1, .truncate = true, .attention_factor = 0.1 * log(4.0) + 1};
    assert_true(fabs(dw_rope_attention(&y) - 1.138629436111989) < 1e-15);
    assert_true(dw_rope_inv_freq(&y, 1e6, 128, 0) == 1.0);                            /* extrapolated */
    assert_true(fabs(dw_rope_inv_freq(&y, 1e6, 128, 63) * 4 - pow(1e6, -126.0 / 128)) < 1e-25); /* interpolated */
}

/* Nothing but a positive factor, a band and betas makes a usable type. */
static void test_problems(void **state) {
    (void)state;
    assert_null(dw_rope_scaling_problem(NULL, 10000));
    dw_rope_scaling s = {.type = DW_ROPE_LINEAR};
    assert_non_null(dw_rope_scaling_problem(&s, 10000));
    s.factor = 2;
    assert_null(dw_rope_scaling_problem(&s, 10000));
    s = (dw_rope_scaling){.type = DW_ROPE_LLAMA3, .factor = 8, .low_freq_factor = 4, .high_freq_factor = 4,
                          .original_max = 8192};
    assert_non_null(dw_rope_scaling_problem(&s, 10000));
    s = (dw_rope_scaling){.type = DW_ROPE_YARN, .factor = 8, .original_max = 4096, .beta_fast = 32, .beta_slow = 1};
    assert_non_null(dw_rope_scaling_problem(&s, 10000)); /* attention factor 0 */
    s.attention_factor = 1.2;
    assert_null(dw_rope_scaling_problem(&s, 10000));
    s.type = 9;
    assert_non_null(dw_rope_scaling_problem(&s, 10000));
}

/* The kernel rotates pair (i, i + D/2) of each head at position t by t * inv_freq[i] and scales
 * by the attention factor; backward is the adjoint. */
static void test_kernel(void **state) {
    (void)state;
    for (int32_t type = 0; type < DW_ROPE_TYPE_COUNT; type++) {
        double theta;
        int64_t D;
        const dw_rope_scaling s = random_scaling(type, &theta, &D);
        const int64_t B = (int64_t)uni(1, 3), T = (int64_t)uni(1, 40), H = (int64_t)uni(1, 4), n = B * T * H * D;
        float *x = malloc((size_t)n * sizeof *x), *g = malloc((size_t)n * sizeof *g);
        float *y = malloc((size_t)n * sizeof *y), *dx = malloc((size_t)n * sizeof *dx);
        double inv[MAXH];
        assert_true(x && g && y && dx);
        for (int64_t k = 0; k < n; k++) x[k] = dw_test_uniform(&g_rng, -2, 2), g[k] = dw_test_uniform(&g_rng, -1, 1);
        oracle(&s, theta, D, inv);
        const double m = type == DW_ROPE_YARN ? s.attention_factor : 1.0;
        dw_cpu_rope_fwd(y, x, B, T, H, D, theta, &s);
        dw_cpu_rope_bwd(dx, g, B, T, H, D, theta, &s);
        double yg = 0, xdx = 0, worst = 0;
        for (int64_t r = 0; r < B * T * H; r++) {
            const double t = (double)((r / H) % T);
            for (int64_t i = 0; i < D / 2; i++) {
                const int64_t a = r * D + i, b = a + D / 2;
                const double c = cos(t * inv[i]), sn = sin(t * inv[i]);
                const double want_a = m * (x[a] * c - x[b] * sn), want_b = m * (x[b] * c + x[a] * sn);
                worst = fmax(worst, fmax(fabs(y[a] - want_a), fabs(y[b] - want_b)));
            }
        }
        for (int64_t k = 0; k < n; k++) yg += (double)y[k] * g[k], xdx += (double)x[k] * dx[k];
        if (worst > 2e-6 * m * 2 || fabs(yg - xdx) > 1e-5 * (fabs(yg) + 1))
            fail_msg("rope %s B %lld T %lld H %lld D %lld: worst |y - oracle| %.3g, <Rx,g> %.9g vs <x,R'g> %.9g",
                     dw_rope_type_name(type), (long long)B, (long long)T, (long long)H, (long long)D, worst, yg, xdx);
        free(x), free(g), free(y), free(dx);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables_vs_oracle),
        cmocka_unit_test(test_llama32_golden),
        cmocka_unit_test(test_problems),
        cmocka_unit_test(test_kernel),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
