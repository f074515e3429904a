/* opcheck.h — header-only helpers for the op tests (CPU and GPU): random fills, comparisons that
 * print the op, the tensor, the worst error and the first bad index, and double-precision central
 * finite differences. Not a test framework: callers assert on the returned counts. */
#ifndef DW_OPCHECK_H
#define DW_OPCHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static inline void dw_oc_fill(dw_test_rng *r, float *x, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) x[i] = dw_test_uniform(r, lo, hi);
}
static inline void dw_oc_fill_normal(dw_test_rng *r, float *x, int64_t n, float sd) {
    for (int64_t i = 0; i < n; i++) x[i] = sd * dw_test_normal(r);
}
static inline float *dw_oc_alloc(int64_t n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    if (!p) abort();
    return p;
}
static inline double *dw_oc_dalloc(int64_t n) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
    if (!p) abort();
    return p;
}
static inline double *dw_oc_to_double(const float *x, int64_t n) {
    double *p = dw_oc_dalloc(n);
    for (int64_t i = 0; i < n; i++) p[i] = x[i];
    return p;
}

/* Compares got (float) with want (double): |got - want| <= atol + rtol*|want| elementwise; NaN in
 * either that is not in both counts as a mismatch. Prints the op, tensor, count, max error and the
 * first bad index. Returns the number of bad elements. */
static inline int64_t dw_oc_compare(const char *op, const char *what, const float *got,
                                    const double *want, int64_t n, double atol, double rtol) {
    int64_t bad = 0, first = -1, worst = -1;
    double maxerr = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double g = got[i], w = want[i];
        int ok;
        double e;
        if (isnan(g) || isnan(w)) {
            ok = isnan(g) && isnan(w);
            e = ok ? 0.0 : INFINITY;
        } else {
            e = fabs(g - w);
            ok = e <= atol + rtol * fabs(w);
        }
        if (e > maxerr || (worst < 0 && !ok)) {
            maxerr = e;
            worst = i;
        }
        if (!ok) {
            if (first < 0) first = i;
            bad++;
        }
    }
    if (bad)
        fprintf(stderr,
                "MISMATCH %s %s: %lld of %lld bad (atol %.3g rtol %.3g); max |err| %.6g at [%lld] "
                "(got %.9g want %.9g); first bad [%lld] got %.9g want %.9g\n",
                op, what, (long long)bad, (long long)n, atol, rtol, maxerr, (long long)worst,
                (double)got[worst], want[worst], (long long)first, (double)got[first], want[first]);
    return bad;
}

/* Same with a float reference (converted). */
static inline int64_t dw_oc_compare_f(const char *op, const char *what, const float *got,
                                      const float *want, int64_t n, double atol, double rtol) {
    double *w = dw_oc_to_double(want, n);
    int64_t bad = dw_oc_compare(op, what, got, w, n, atol, rtol);
    free(w);
    return bad;
}

/* Bitwise equality of two float arrays; prints the first difference. */
static inline int64_t dw_oc_bitequal(const char *op, const char *what, const float *a,
                                     const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            fprintf(stderr, "NOT BIT-EQUAL %s %s: first difference at [%lld]: %.9g vs %.9g\n", op,
                    what, (long long)i, (double)a[i], (double)b[i]);
            return 1;
        }
    return 0;
}

/* Central differences of a double objective with respect to x[0..n): grad[i] =
 * (f(x + h e_i) - f(x - h e_i)) / 2h; x is restored. */
typedef double (*dw_oc_objective)(void *state);
static inline void dw_oc_fd(dw_oc_objective f, void *state, double *x, int64_t n, double h,
                            double *grad) {
    for (int64_t i = 0; i < n; i++) {
        const double x0 = x[i];
        x[i] = x0 + h;
        const double fp = f(state);
        x[i] = x0 - h;
        const double fm = f(state);
        x[i] = x0;
        grad[i] = (fp - fm) / (2.0 * h);
    }
}

/* max |x_i| */
static inline double dw_oc_maxabs(const double *x, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

/* The CPU-reference tolerances (see test_ops_cpu.c for the reasoning): forward within 2 ulp of the
 * exact double formula; gradients rtol 1e-5 + 1e-6 * max|grad| against double central
 * differences with step DW_OC_FD_H. `prior` (may be NULL) is what an accumulating gradient held
 * before the call; its FP32 addition costs one more rounding, 1 ulp of |prior| <= 1. A floor of
 * DW_OC_FD_NOISE: where the exact gradient is 0 the central difference is the objective's rounding
 * noise, ~2.2e-16 |f| / DW_OC_FD_H = 2e-11 |f| (seed 31624728305292181 of test_ops_cpu_moe: -2.8e-12
 * against an exact 0), and max|fd| of that noise alone would set a tolerance of 1e-18. */
#define DW_OC_FWD_RTOL 2.4e-7
#define DW_OC_GRAD_RTOL 1e-5
#define DW_OC_GRAD_ATOL_FRAC 1e-6
#define DW_OC_FD_H 1e-5
#define DW_OC_FD_NOISE 1e-10
static inline int64_t dw_oc_fwd_check(const char *op, const char *what, const float *got,
                                      const double *want, int64_t n) {
    return dw_oc_compare(op, what, got, want, n, 1e-9 * dw_oc_maxabs(want, n) + 1e-30,
                         DW_OC_FWD_RTOL);
}
static inline int64_t dw_oc_grad_check(const char *op, const char *what, const float *got,
                                       const double *fd, const float *prior, int64_t n) {
    double *want = dw_oc_dalloc(n);
    for (int64_t i = 0; i < n; i++) want[i] = fd[i] + (prior ? (double)prior[i] : 0.0);
    const double atol = DW_OC_GRAD_ATOL_FRAC * dw_oc_maxabs(fd, n) + (prior ? 1.2e-7 : 0.0) + DW_OC_FD_NOISE;
    int64_t bad = dw_oc_compare(op, what, got, want, n, atol, DW_OC_GRAD_RTOL);
    free(want);
    return bad;
}

#endif /* DW_OPCHECK_H */
