/* test_train_optim.c — AdamW against closed forms (first step, constant gradients, pure decay),
 * gradient-norm clipping and the learning-rate schedules against hand-computed values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>

#include "testutil.h"
#include "train/optim.h"

static dw_test_rng rng;

static void near(double got, double want, double rel, double abs_tol) {
    if (!(fabs(got - want) <= abs_tol + rel * fabs(want)))
        fail_msg("got %.9g, want %.9g", got, want);
}

/* Step 1 from m = v = 0: m^ = g', v^ = g'^2, so p1 = p (1 - lr wd) - lr g' / (|g'| + eps). */
static void test_adamw_first_step(void **state) {
    (void)state;
    int64_t n = 1000 + (int64_t)(dw_test_next(&rng) % 1000);
    float *p = malloc((size_t)n * 4), *g = malloc((size_t)n * 4), *m = calloc((size_t)n, 4),
          *v = calloc((size_t)n, 4), *p0 = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        p[i] = p0[i] = dw_test_normal(&rng);
        g[i] = dw_test_normal(&rng) * 0.01f;
    }
    dw_adamw_hparams h = {.lr = dw_test_uniform(&rng, 1e-4f, 1e-2f), .beta1 = 0.9, .beta2 = 0.95,
                          .eps = 1e-8, .weight_decay = dw_test_uniform(&rng, 0.0f, 0.2f)};
    double scale = dw_test_uniform(&rng, 0.25f, 1.0f);
    bool decay = dw_test_next(&rng) & 1;
    dw_adamw_step_cpu(p, g, m, v, n, &h, 1, decay, scale);
    for (int64_t i = 0; i < n; i++) {
        double gs = (double)g[i] * scale;
        double want = (double)p0[i] * (1.0 - h.lr * (decay ? h.weight_decay : 0.0)) -
                      h.lr * gs / (fabs(gs) + h.eps);
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
    dw_adamw_hparams h = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.5};
    for (int64_t t = 1; t <= K; t++) dw_adamw_step_cpu(p, g, m, v, n, &h, t, false, 1.0);
    for (int64_t i = 0; i < n; i++) {
        double step = h.lr * g[i] / (fabs(g[i]) + h.eps);
        near(p0[i] - p[i], (double)K * step, 1e-4, 1e-7);
        near(m[i], (1.0 - pow(0.9, (double)K)) * g[i], 1e-5, 1e-9);
        near(v[i], (1.0 - pow(0.999, (double)K)) * g[i] * g[i], 1e-5, 1e-12);
    }
    free(p); free(g); free(m); free(v); free(p0);
}

/* Zero gradients: only decoupled decay moves p (by the factor 1 - lr wd per step), and only where
 * decay applies. */
static void test_adamw_pure_decay(void **state) {
    (void)state;
    int64_t n = 64;
    float p[64], q[64], g[64] = {0}, m[64] = {0}, v[64] = {0}, m2[64] = {0}, v2[64] = {0}, p0[64];
    for (int64_t i = 0; i < n; i++) p[i] = q[i] = p0[i] = dw_test_normal(&rng);
    dw_adamw_hparams h = {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    for (int t = 1; t <= 3; t++) {
        dw_adamw_step_cpu(p, g, m, v, n, &h, t, true, 1.0);
        dw_adamw_step_cpu(q, g, m2, v2, n, &h, t, false, 1.0);
    }
    for (int64_t i = 0; i < n; i++) {
        near(p[i], p0[i] * pow(1 - 0.001, 3), 1e-6, 0);
        assert_true(q[i] == p0[i]);
    }
}

static void test_clip(void **state) {
    (void)state;
    int64_t n = 100 + (int64_t)(dw_test_next(&rng) % 100);
    float *g = malloc((size_t)n * 4);
    double want = 0;
    for (int64_t i = 0; i < n; i++) {
        g[i] = dw_test_normal(&rng);
        want += (double)g[i] * g[i];
    }
    near(dw_sumsq_cpu(g, n), want, 1e-12, 0);
    double norm = sqrt(want);
    assert_true(dw_clip_factor(norm, 0.0) == 1.0);        /* disabled */
    assert_true(dw_clip_factor(norm, norm * 2) == 1.0);   /* within */
    double f = dw_clip_factor(norm, norm / 4);
    near(f * norm, norm / 4, 1e-5, 0);                    /* clipped to max_norm */
    free(g);
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
        cmocka_unit_test(test_adamw_first_step),
        cmocka_unit_test(test_adamw_constant_gradient),
        cmocka_unit_test(test_adamw_pure_decay),
        cmocka_unit_test(test_clip),
        cmocka_unit_test(test_schedules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
