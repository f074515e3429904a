/* test_train_optim.c — the optimizer's CPU reference (kernels/cpu/ops_cpu.h dw_cpu_adamw and
 * dw_cpu_sumsq, the contract of kernels/adamw_args.h) against an independent double-precision
 * reimplementation on fresh random inputs, and against closed forms (first step, constant
 * gradients, pure decay): decay only below n_decay, the clipping scale, a non-finite norm that
 * changes nothing; and the trainer's learning-rate schedules against hand-computed values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops_cpu.h"
#include "testutil.h"
#include "train/optim.h"

static dw_test_rng rng;

static void near(double got, double want, double rel, double abs_tol) {
    if (!(fabs(got - want) <= abs_tol + rel * fabs(want)))
        fail_msg("got %.9g, want %.9g", got, want);
}

/* got is want (a double) rounded to FP32, within one unit in the last place: the reference
 * computes in double and stores FP32 once, so only the final rounding may differ. */
static void ulp1(float got, double want, const char *what, int64_t i) {
    const float w = (float)want;
    const float ulp = nextafterf(fabsf(w), INFINITY) - fabsf(w);
    if (!(fabs((double)got - want) <= (double)ulp))
        fail_msg("%s[%lld]: got %.9g, want %.12g (1 ulp = %g)", what, (long long)i, (double)got, want, (double)ulp);
}

static dw_adamw_args args_at(double lr, double b1, double b2, double eps, double wd, int64_t t, double max_norm) {
    return (dw_adamw_args){.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd,
                           .c1 = 1.0 - pow(b1, (double)t), .c2 = 1.0 - pow(b2, (double)t), .max_norm = max_norm};
}

/* Random p, g, m >= any, v >= 0, n_decay, arguments and norm (clipping on, off or not reached):
 * every element of p, m, v equals the double-precision contract rounded once to FP32. */
static void test_adamw_reference(void **state) {
    (void)state;
    for (int rep = 0; rep < 20; rep++) {
        const int64_t n = 1 + (int64_t)(dw_test_next(&rng) % 3000);
        const int64_t n_decay = (int64_t)(dw_test_next(&rng) % (uint64_t)(n + 1));
        float *p = malloc((size_t)n * 4), *g = malloc((size_t)n * 4), *m = malloc((size_t)n * 4),
              *v = malloc((size_t)n * 4), *p0 = malloc((size_t)n * 4), *m0 = malloc((size_t)n * 4),
              *v0 = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) {
            p[i] = p0[i] = dw_test_normal(&rng);
            g[i] = dw_test_normal(&rng) * dw_test_uniform(&rng, 1e-4f, 3.0f);
            m[i] = m0[i] = dw_test_normal(&rng) * 0.1f;
            v[i] = v0[i] = fabsf(dw_test_normal(&rng)) * 0.01f;
        }
        const int64_t t = 1 + (int64_t)(dw_test_next(&rng) % 1000);
        const double norm = dw_test_uniform(&rng, 0.01f, 10.0f);
        const int clip_case = (int)(dw_test_next(&rng) % 3); /* off, not reached, clipping */
        const double max_norm = clip_case == 0   ? 0.0
                                : clip_case == 1 ? norm * 1.5
                                                 : norm * dw_test_uniform(&rng, 0.05f, 0.9f);
        const dw_adamw_args a = args_at(dw_test_uniform(&rng, 1e-5f, 1e-1f), dw_test_uniform(&rng, 0.5f, 0.99f),
                                        dw_test_uniform(&rng, 0.9f, 0.9999f), dw_test_uniform(&rng, 1e-10f, 1e-6f),
                                        dw_test_uniform(&rng, 0.0f, 0.3f), t, max_norm);
        dw_cpu_adamw(p, g, m, v, n, n_decay, norm, &a);
        const double scale = clip_case == 2 ? max_norm / (norm + 1e-6) : 1.0;
        for (int64_t i = 0; i < n; i++) {
            const double gi = (double)g[i] * scale;
            const double mi = a.beta1 * (double)m0[i] + (1.0 - a.beta1) * gi;
            const double vi = a.beta2 * (double)v0[i] + (1.0 - a.beta2) * gi * gi;
            double pi = (double)p0[i] * (1.0 - a.lr * (i < n_decay ? a.weight_decay : 0.0));
            pi -= a.lr * (mi / a.c1) / (sqrt(vi / a.c2) + a.eps);
            ulp1(m[i], mi, "m", i);
            ulp1(v[i], vi, "v", i);
            ulp1(p[i], pi, "p", i);
        }
        free(p), free(g), free(m), free(v), free(p0), free(m0), free(v0);
    }
}

/* Step 1 from m = v = 0: m^ = g', v^ = g'^2, so p1 = p (1 - lr wd) - lr g' / (|g'| + eps), with
 * g' = g * max_norm / (norm + 1e-6) when clipping; decay only for i < n_decay. */
static void test_adamw_first_step(void **state) {
    (void)state;
    int64_t n = 1000 + (int64_t)(dw_test_next(&rng) % 1000), n_decay = (int64_t)(dw_test_next(&rng) % (uint64_t)n);
    float *p = malloc((size_t)n * 4), *g = malloc((size_t)n * 4), *m = calloc((size_t)n, 4),
          *v = calloc((size_t)n, 4), *p0 = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        p[i] = p0[i] = dw_test_normal(&rng);
        g[i] = dw_test_normal(&rng) * 0.01f;
    }
    const double norm = sqrt(dw_cpu_sumsq(g, n)), max_norm = norm * dw_test_uniform(&rng, 0.25f, 1.0f);
    const dw_adamw_args a = args_at(dw_test_uniform(&rng, 1e-4f, 1e-2f), 0.9, 0.95, 1e-8,
                                    dw_test_uniform(&rng, 0.0f, 0.2f), 1, max_norm);
    const double scale = max_norm < norm ? max_norm / (norm + 1e-6) : 1.0;
    dw_cpu_adamw(p, g, m, v, n, n_decay, norm, &a);
    for (int64_t i = 0; i < n; i++) {
        double gs = (double)g[i] * scale;
        double want = (double)p0[i] * (1.0 - a.lr * (i < n_decay ? a.weight_decay : 0.0)) -
                      a.lr * gs / (fabs(gs) + a.eps);
        near(p[i], want, 1e-6, 1e-7);
        near(m[i], 0.1 * gs, 1e-6, 0);
        near(v[i], 0.05 * gs * gs, 1e-6, 0);
    }
    free(p); free(g); free(m); free(v); free(p0);
}

/* A constant gradient: bias correction makes m^ = g and v^ = g^2 at every step, so without decay
 * each step moves p by exactly lr g / (|g| + eps). */
static void test_adamw_constant_gradient(void **state) {
    (void)state;
    int64_t n = 257, K = 2 + (int64_t)(dw_test_next(&rng) % 20);
    float *p = malloc((size_t)n * 4), *g = malloc((size_t)n * 4), *m = calloc((size_t)n, 4),
          *v = calloc((size_t)n, 4), *p0 = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        p[i] = p0[i] = dw_test_normal(&rng);
        g[i] = dw_test_normal(&rng);
    }
    for (int64_t t = 1; t <= K; t++) {
        const dw_adamw_args a = args_at(1e-3, 0.9, 0.999, 1e-8, 0.5, t, 0.0);
        dw_cpu_adamw(p, g, m, v, n, 0, sqrt(dw_cpu_sumsq(g, n)), &a);
    }
    for (int64_t i = 0; i < n; i++) {
        double step = 1e-3 * g[i] / (fabs(g[i]) + 1e-8);
        near(p0[i] - p[i], (double)K * step, 1e-4, 1e-7);
        near(m[i], (1.0 - pow(0.9, (double)K)) * g[i], 1e-5, 1e-9);
        near(v[i], (1.0 - pow(0.999, (double)K)) * g[i] * g[i], 1e-5, 1e-12);
    }
    free(p); free(g); free(m); free(v); free(p0);
}

/* Zero gradients: only decoupled decay moves p (by the factor 1 - lr wd per step), and only below
 * n_decay; the rest is bit-identical. */
static void test_adamw_pure_decay(void **state) {
    (void)state;
    enum { n = 64 };
    float p[n], g[n] = {0}, m[n] = {0}, v[n] = {0}, p0[n];
    for (int64_t i = 0; i < n; i++) p[i] = p0[i] = dw_test_normal(&rng);
    const int64_t n_decay = 1 + (int64_t)(dw_test_next(&rng) % (n - 1));
    for (int t = 1; t <= 3; t++) {
        const dw_adamw_args a = args_at(0.01, 0.9, 0.95, 1e-8, 0.1, t, 1.0);
        dw_cpu_adamw(p, g, m, v, n, n_decay, 0.0, &a);
    }
    for (int64_t i = 0; i < n; i++) {
        if (i < n_decay) near(p[i], p0[i] * pow(1 - 0.001, 3), 1e-6, 0);
        else assert_true(p[i] == p0[i]);
        assert_true(m[i] == 0.0f && v[i] == 0.0f);
    }
}

/* Clipping: the gradient AdamW sees (m / (1 - beta1) after one step from zero) has the norm
 * max_norm when the norm exceeds it, and is the raw gradient when clipping is off or not needed. */
static void test_clip(void **state) {
    (void)state;
    const int64_t n = 100 + (int64_t)(dw_test_next(&rng) % 100);
    float *g = malloc((size_t)n * 4), *p = calloc((size_t)n, 4), *m = calloc((size_t)n, 4), *v = calloc((size_t)n, 4);
    for (int64_t i = 0; i < n; i++) g[i] = dw_test_normal(&rng);
    const double norm = sqrt(dw_cpu_sumsq(g, n));
    const double cases[3] = {norm / 4, 0.0, norm * 2}; /* clipped, disabled, within */
    for (int c = 0; c < 3; c++) {
        memset(m, 0, (size_t)n * 4), memset(v, 0, (size_t)n * 4), memset(p, 0, (size_t)n * 4);
        const dw_adamw_args a = args_at(1e-3, 0.5, 0.9, 1e-8, 0.0, 1, cases[c]);
        dw_cpu_adamw(p, g, m, v, n, 0, norm, &a);
        double s2 = 0;
        for (int64_t i = 0; i < n; i++) s2 += ((double)m[i] / 0.5) * ((double)m[i] / 0.5);
        near(sqrt(s2), c == 0 ? norm / 4 * norm / (norm + 1e-6) : norm, 1e-6, 0);
        if (c) /* unscaled: m = (1 - beta1) g exactly (a power-of-two factor) */
            for (int64_t i = 0; i < n; i++) assert_true(m[i] == 0.5f * g[i]);
    }
    free(g), free(p), free(m), free(v);
}

/* A non-finite norm (NaN, +inf, or the NaN the sum of a NaN gradient gives) leaves p, m and v
 * bit-identical. */
static void test_nonfinite_norm(void **state) {
    (void)state;
    const int64_t n = 33 + (int64_t)(dw_test_next(&rng) % 100);
    float *p = malloc((size_t)n * 4), *g = malloc((size_t)n * 4);
    float *m = malloc((size_t)n * 4), *v = malloc((size_t)n * 4);
    float *p0 = malloc((size_t)n * 4), *m0 = malloc((size_t)n * 4), *v0 = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        p[i] = p0[i] = dw_test_normal(&rng);
        g[i] = dw_test_normal(&rng);
        m[i] = m0[i] = dw_test_normal(&rng);
        v[i] = v0[i] = fabsf(dw_test_normal(&rng));
    }
    g[dw_test_next(&rng) % (uint64_t)n] = NAN;
    const double sum_nan = dw_cpu_sumsq(g, n);
    assert_true(isnan(sum_nan));
    const double norms[3] = {NAN, INFINITY, sqrt(sum_nan)};
    for (int c = 0; c < 3; c++) {
        const dw_adamw_args a = args_at(1e-2, 0.9, 0.95, 1e-8, 0.1, 3, c == 1 ? 1.0 : 0.0);
        dw_cpu_adamw(p, g, m, v, n, n / 2, norms[c], &a);
        assert_memory_equal(p, p0, (size_t)n * 4);
        assert_memory_equal(m, m0, (size_t)n * 4);
        assert_memory_equal(v, v0, (size_t)n * 4);
    }
    free(p), free(g), free(m), free(v), free(p0), free(m0), free(v0);
}

/* dw_cpu_sumsq: the sum of squares in double, in ascending order (so bit-equal to that loop), and
 * close to a compensated sum. */
static void test_sumsq(void **state) {
    (void)state;
    for (int rep = 0; rep < 10; rep++) {
        const int64_t n = (int64_t)(dw_test_next(&rng) % 5000);
        float *g = malloc((size_t)(n ? n : 1) * 4);
        double asc = 0, kahan = 0, comp = 0;
        for (int64_t i = 0; i < n; i++) g[i] = dw_test_normal(&rng) * dw_test_uniform(&rng, 1e-3f, 1e3f);
        for (int64_t i = 0; i < n; i++) {
            const double sq = (double)g[i] * (double)g[i];
            asc += sq;
            const double y = sq - comp, t = kahan + y;
            comp = (t - kahan) - y;
            kahan = t;
        }
        const double got = dw_cpu_sumsq(g, n);
        assert_memory_equal(&got, &asc, sizeof got);
        near(got, kahan, 1e-12, 0);
        free(g);
    }
}

static void test_schedules(void **state) {
    (void)state;
    dw_schedule s = {.kind = DW_SCHED_COSINE, .lr = 1.0, .min_lr = 0.1, .warmup = 10, .total = 111};
    near(dw_schedule_lr(&s, 0), 0.1, 1e-12, 0);
    near(dw_schedule_lr(&s, 4), 0.5, 1e-12, 0);
    near(dw_schedule_lr(&s, 9), 1.0, 1e-12, 0);
    near(dw_schedule_lr(&s, 10), 1.0, 1e-12, 0);
    near(dw_schedule_lr(&s, 60), 0.55, 1e-12, 0);               /* half way: (1 + 0.1) / 2 */
    near(dw_schedule_lr(&s, 35), 0.1 + 0.9 * (1 + sqrt(0.5)) / 2, 1e-12, 0); /* a quarter */
    near(dw_schedule_lr(&s, 110), 0.1, 1e-12, 0);                /* last step: min_lr */
    s.kind = DW_SCHED_LINEAR;
    near(dw_schedule_lr(&s, 60), 0.55, 1e-12, 0);
    near(dw_schedule_lr(&s, 35), 0.775, 1e-12, 0);
    near(dw_schedule_lr(&s, 110), 0.1, 1e-12, 0);
    s.kind = DW_SCHED_CONSTANT;
    near(dw_schedule_lr(&s, 3), 0.4, 1e-12, 0);
    near(dw_schedule_lr(&s, 110), 1.0, 1e-12, 0);
    s.warmup = 0;
    s.kind = DW_SCHED_COSINE;
    near(dw_schedule_lr(&s, 0), 1.0, 1e-12, 0);
    dw_schedule_kind k;
    assert_true(dw_schedule_parse("linear", &k) && k == DW_SCHED_LINEAR);
    assert_true(dw_schedule_parse("constant", &k) && k == DW_SCHED_CONSTANT);
    assert_false(dw_schedule_parse("step", &k));
    assert_string_equal(dw_schedule_name(DW_SCHED_COSINE), "cosine");
}

int main(void) {
    dw_test_rng_init(&rng, dw_test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_reference),
        cmocka_unit_test(test_adamw_first_step),
        cmocka_unit_test(test_adamw_constant_gradient),
        cmocka_unit_test(test_adamw_pure_decay),
        cmocka_unit_test(test_clip),
        cmocka_unit_test(test_nonfinite_norm),
        cmocka_unit_test(test_sumsq),
        cmocka_unit_test(test_schedules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
