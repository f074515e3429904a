/* test_rope_freq.c — RoPE's inverse-frequency tables (kernels/rope_freq.h) for the types default,
 * linear, llama3, yarn and longrope, over the whole head or a random partial rotary width R, against
 * an oracle written here in the array form of transformers' modeling_rope_utils (masks and a ramp
 * over whole tables, not per index; longrope's table picked by the run's length on each side of
 * original_max_position_embeddings), on random parameters; golden values of Llama 3.2's table
 * (transformers' formulas evaluated in float64 with torch); the CPU rope kernel with each type
 * against a naive rotation of the first R dims by the oracle's table (the rest copied bit for bit),
 * and its backward as the exact adjoint of the forward (<R x, g> = <x, R^T g>). */
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

/* longrope: inv_freq = 1 / (ext_factors * base ** (arange(0, dim, 2) / dim)), ext_factors the long
 * list when seq > original_max_position_embeddings, else the short one */
static void oracle_longrope(const dw_rope_scaling *s, double theta, int64_t R, int64_t seq, double *out) {
    const double *ext = (double)seq > s->original_max ? s->long_factor : s->short_factor;
    for (int64_t k = 0; k < R; k += 2) out[k / 2] = 1.0 / (ext[k / 2] * pow(theta, (double)k / (double)R));
}

/* The table over the rotary width R (the whole head D unless s->rotary_dim) for a run of seq positions. */
static void oracle(const dw_rope_scaling *s, double theta, int64_t D, int64_t seq, double *out) {
    const int64_t R = s->rotary_dim ? s->rotary_dim : D;
    switch (s->type) {
    case DW_ROPE_DEFAULT: oracle_default(theta, R, out); break;
    case DW_ROPE_LINEAR:
        oracle_default(theta, R, out);
        for (int64_t i = 0; i < R / 2; i++) out[i] /= s->factor;
        break;
    case DW_ROPE_LLAMA3: oracle_llama3(s, theta, R, out); break;
    case DW_ROPE_YARN: oracle_yarn(s, theta, R, out); break;
    default: oracle_longrope(s, theta, R, seq, out); break;
    }
}

/* Random parameters of each type, bands placed so that every branch is taken for some i; half the
 * time a partial rotary width R < D (an even number of dims from 2). */
static dw_rope_scaling random_scaling(int32_t type, double *theta, int64_t *D) {
    *theta = uni(0, 1) < 0.5 ? 10000.0 : uni(1000, 2e6);
    *D = 2 * (int64_t)uni(2, 129);
    dw_rope_scaling s = {.type = type};
    if (type == DW_ROPE_LONGROPE && *D / 2 > DW_ROPE_MAX_FACTORS) /* the lists' bound: a narrower head */
        *D = 2 * (int64_t)uni(2, DW_ROPE_MAX_FACTORS + 1);
    if (uni(0, 1) < 0.5) s.rotary_dim = 2 * (int32_t)uni(1, (double)(*D / 2)); /* 2 .. D - 2 */
    if (type == DW_ROPE_LONGROPE) {
        s.n_factors = (int32_t)(dw_rope_dim(&s, *D) / 2);
        for (int32_t i = 0; i < s.n_factors; i++) s.short_factor[i] = uni(0.5, 3), s.long_factor[i] = uni(1, 80);
        s.original_max = floor(uni(2, 64));
        s.attention_factor = uni(0.8, 1.5);
        return s;
    }
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
    int64_t long_runs = 0, short_runs = 0;
    for (int32_t type = 0; type < DW_ROPE_TYPE_COUNT; type++)
        for (int rep = 0; rep < 200; rep++) {
            double theta;
            int64_t D;
            const dw_rope_scaling s = random_scaling(type, &theta, &D);
            assert_null(dw_rope_scaling_problem(&s, theta, D));
            const int64_t R = dw_rope_dim(&s, D), seq = (int64_t)uni(1, 2 * s.original_max + 2);
            if (type == DW_ROPE_LONGROPE && dw_rope_long(&s, seq)) long_runs++;
            else if (type == DW_ROPE_LONGROPE) short_runs++;
            double want[MAXH];
            oracle(&s, theta, D, seq, want);
            for (int64_t i = 0; i < R / 2; i++) {
                const double got = dw_rope_inv_freq(&s, theta, R, i, seq);
                if (!(fabs(got - want[i]) <= 1e-13 * want[i]))
                    fail_msg("%s theta %g D %lld R %lld seq %lld factor %g: inv_freq[%lld] = %.17g, oracle %.17g",
                             dw_rope_type_name(type), theta, (long long)D, (long long)R, (long long)seq, s.factor,
                             (long long)i, got, want[i]);
            }
        }
    assert_true(long_runs > 10 && short_runs > 10); /* both of longrope's tables were checked */
}

/* longrope's boundary: a run of exactly original_max positions takes the short table, one more the
 * long; the attention factor scales cos and sin (Phi-3-mini-128k's: sqrt(1 + ln 32 / ln 4096)). */
static void test_longrope_boundary(void **state) {
    (void)state;
    dw_rope_scaling s = {.type = DW_ROPE_LONGROPE, .rotary_dim = 6, .original_max = 16, .n_factors = 3,
                         .attention_factor = sqrt(1 + log(32.0) / log(4096.0))};
    for (int i = 0; i < 3; i++) s.short_factor[i] = 1.0 + i, s.long_factor[i] = 10.0 * (i + 1);
    assert_null(dw_rope_scaling_problem(&s, 1e4, 8));
    assert_false(dw_rope_long(&s, 16));
    assert_true(dw_rope_long(&s, 17));
    assert_true(dw_rope_inv_freq(&s, 1e4, 6, 2, 16) == pow(1e4, -4.0 / 6) / 3.0);
    assert_true(dw_rope_inv_freq(&s, 1e4, 6, 2, 17) == pow(1e4, -4.0 / 6) / 30.0);
    assert_true(fabs(dw_rope_attention(&s) - 1.1902380714238083) < 1e-15);
    dw_rope_scaling y = s;
    y.type = DW_ROPE_YARN; /* only longrope reads the lists and the length */
    assert_false(dw_rope_long(&y, 17));
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
        const double got = dw_rope_inv_freq(&s, 500000.0, 64, golden[k].i, 100);
        if (!(fabs(got - golden[k].inv) <= 1e-14 * golden[k].inv))
            fail_msg("Llama 3.2 inv_freq[%d] = %.17g, transformers %.17g", golden[k].i, got, golden[k].inv);
    }
    assert_true(dw_rope_attention(&s) == 1.0);
    /* Qwen-style yarn: factor 4 over 32768 positions, head 128, theta 1e6: attention 0.1 ln 4 + 1 */
    const dw_rope_scaling y = {.type = DW_ROPE_YARN, .factor = 4, .original_max = 32768, .beta_fast = 32,
                               .beta_slow = 1, .truncate = true, .attention_factor = 0.1 * log(4.0) + 1};
    assert_true(fabs(dw_rope_attention(&y) - 1.138629436111989) < 1e-15);
    assert_true(dw_rope_inv_freq(&y, 1e6, 128, 0, 100) == 1.0);                            /* extrapolated */
    assert_true(fabs(dw_rope_inv_freq(&y, 1e6, 128, 63, 100) * 4 - pow(1e6, -126.0 / 128)) < 1e-25); /* interpolated */
}

/* Nothing but a positive factor, a band and betas makes a usable type; longrope needs R/2 positive
 * finite entries in each list; a rotary width is even, from 2 to the head. */
static void test_problems(void **state) {
    (void)state;
    assert_null(dw_rope_scaling_problem(NULL, 10000, 8));
    dw_rope_scaling s = {.type = DW_ROPE_LINEAR};
    assert_non_null(dw_rope_scaling_problem(&s, 10000, 8));
    s.factor = 2;
    assert_null(dw_rope_scaling_problem(&s, 10000, 8));
    s = (dw_rope_scaling){.type = DW_ROPE_LLAMA3, .factor = 8, .low_freq_factor = 4, .high_freq_factor = 4,
                          .original_max = 8192};
    assert_non_null(dw_rope_scaling_problem(&s, 10000, 8));
    s = (dw_rope_scaling){.type = DW_ROPE_YARN, .factor = 8, .original_max = 4096, .beta_fast = 32, .beta_slow = 1};
    assert_non_null(dw_rope_scaling_problem(&s, 10000, 8)); /* attention factor 0 */
    s.attention_factor = 1.2;
    assert_null(dw_rope_scaling_problem(&s, 10000, 8));
    s.type = 9;
    assert_non_null(dw_rope_scaling_problem(&s, 10000, 8));
    const int32_t widths[] = {0, 2, 6, 8}, bad_widths[] = {1, 5, 10, -2};
    for (int k = 0; k < 4; k++) {
        s = (dw_rope_scaling){.rotary_dim = widths[k]};
        assert_null(dw_rope_scaling_problem(&s, 10000, 8));
        s.rotary_dim = bad_widths[k];
        assert_non_null(dw_rope_scaling_problem(&s, 10000, 8));
    }
    s = (dw_rope_scaling){.type = DW_ROPE_LONGROPE, .rotary_dim = 6, .original_max = 4096, .attention_factor = 1.19,
                          .n_factors = 3, .short_factor = {1, 1, 1}, .long_factor = {2, 3, 4}};
    assert_null(dw_rope_scaling_problem(&s, 10000, 8));
    const double bad_entries[] = {0, -1, NAN, INFINITY};
    for (int k = 0; k < 4; k++) {
        dw_rope_scaling b = s;
        b.long_factor[k % 3] = bad_entries[k];
        assert_non_null(dw_rope_scaling_problem(&b, 10000, 8));
        b = s;
        b.short_factor[k % 3] = bad_entries[k];
        assert_non_null(dw_rope_scaling_problem(&b, 10000, 8));
    }
    s.rotary_dim = 0; /* the whole head of 8: 4 pairs, 3 entries */
    assert_non_null(dw_rope_scaling_problem(&s, 10000, 8));
    s.rotary_dim = 6, s.attention_factor = 0;
    assert_non_null(dw_rope_scaling_problem(&s, 10000, 8));
    s.attention_factor = 1, s.original_max = 0;
    assert_non_null(dw_rope_scaling_problem(&s, 10000, 8));
}

/* The kernel rotates pair (i, i + R/2) of each head at position t by t * inv_freq[i] (the table of a
 * run of T positions) and scales by the attention factor, copying dims R..D; backward is the adjoint. */
static void test_kernel(void **state) {
    (void)state;
    for (int rep = 0; rep < 4; rep++)
        for (int32_t type = 0; type < DW_ROPE_TYPE_COUNT; type++) {
            double theta;
            int64_t D;
            const dw_rope_scaling s = random_scaling(type, &theta, &D);
            const int64_t B = (int64_t)uni(1, 3), T = (int64_t)uni(1, 40), H = (int64_t)uni(1, 4), n = B * T * H * D;
            const int64_t R = dw_rope_dim(&s, D), half = R / 2;
            float *x = malloc((size_t)n * sizeof *x), *g = malloc((size_t)n * sizeof *g);
            float *y = malloc((size_t)n * sizeof *y), *dx = malloc((size_t)n * sizeof *dx);
            double inv[MAXH];
            assert_true(x && g && y && dx);
            for (int64_t k = 0; k < n; k++)
                x[k] = dw_test_uniform(&g_rng, -2, 2), g[k] = dw_test_uniform(&g_rng, -1, 1);
            oracle(&s, theta, D, T, inv);
            const double m = type == DW_ROPE_YARN || type == DW_ROPE_LONGROPE ? s.attention_factor : 1.0;
            dw_cpu_rope_fwd(y, x, B, T, H, D, theta, &s);
            dw_cpu_rope_bwd(dx, g, B, T, H, D, theta, &s);
            double yg = 0, xdx = 0, worst = 0;
            int64_t passed_changed = 0;
            for (int64_t r = 0; r < B * T * H; r++) {
                const double t = (double)((r / H) % T);
                for (int64_t i = 0; i < half; i++) {
                    const int64_t a = r * D + i, b = a + half;
                    const double c = cos(t * inv[i]), sn = sin(t * inv[i]);
                    const double want_a = m * (x[a] * c - x[b] * sn), want_b = m * (x[b] * c + x[a] * sn);
                    worst = fmax(worst, fmax(fabs(y[a] - want_a), fabs(y[b] - want_b)));
                }
                for (int64_t k = r * D + R; k < (r + 1) * D; k++) passed_changed += y[k] != x[k] || dx[k] != g[k];
            }
            for (int64_t k = 0; k < n; k++) yg += (double)y[k] * g[k], xdx += (double)x[k] * dx[k];
            if (worst > 2e-6 * m * 2 || fabs(yg - xdx) > 1e-5 * (fabs(yg) + 1) || passed_changed)
                fail_msg("rope %s B %lld T %lld H %lld D %lld R %lld: worst |y - oracle| %.3g, <Rx,g> %.9g vs "
                         "<x,R'g> %.9g, %lld passed-through values changed", dw_rope_type_name(type), (long long)B,
                         (long long)T, (long long)H, (long long)D, (long long)R, worst, yg, xdx,
                         (long long)passed_changed);
            free(x), free(g), free(y), free(dx);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables_vs_oracle),
        cmocka_unit_test(test_longrope_boundary),
        cmocka_unit_test(test_llama32_golden),
        cmocka_unit_test(test_problems),
        cmocka_unit_test(test_kernel),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
