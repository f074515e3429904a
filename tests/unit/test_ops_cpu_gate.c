/* test_ops_cpu_gate.c — the CPU reference of the two ops the Qwen MoE families added: sigmoid_gate
 * (y = sigmoid(g) * x, one gate logit per row: Qwen2-MoE's shared-expert gate) and head_rmsnorm
 * (RMSNorm over each head's D channels with one weight for every head: Qwen3's q_norm / k_norm,
 * run by the rmsnorm kernel over N*H rows of D). Forward against independent double formulas
 * written here, backward against double central differences of them, on fresh random odd sizes,
 * large gate logits (saturated sigmoids) included. Tolerances: opcheck.h's (test_ops_cpu.c says
 * why). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops_cpu.h"
#include "opcheck.h"
#include "testutil.h"

static dw_test_rng g_rng;

static int setup(void **state) {
    (void)state;
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x6A7Eull);
    return 0;
}

/* ---- sigmoid_gate ------------------------------------------------------------------------------ */
typedef struct {
    int64_t N, C;
    double *x, *g, *dy, *y;
} gate_st;
static void gate_naive(gate_st *s) {
    for (int64_t n = 0; n < s->N; n++)
        for (int64_t c = 0; c < s->C; c++) s->y[n * s->C + c] = s->x[n * s->C + c] / (1.0 + exp(-s->g[n]));
}
static double gate_obj(void *p) { /* sum dy . y */
    gate_st *s = p;
    gate_naive(s);
    double L = 0.0;
    for (int64_t i = 0; i < s->N * s->C; i++) L += s->dy[i] * s->y[i];
    return L;
}

static void test_sigmoid_gate(void **state) {
    (void)state;
    for (int rep = 0; rep < 4; rep++) {
        const int64_t N = dw_test_rnd(1, 13), C = dw_test_rnd(1, 37), n = N * C;
        char op[64];
        snprintf(op, sizeof op, "sigmoid_gate[N=%lld C=%lld]", (long long)N, (long long)C);
        float *x = dw_oc_alloc(n), *g = dw_oc_alloc(N), *dy = dw_oc_alloc(n), *y = dw_oc_alloc(n);
        float *dx = dw_oc_alloc(n), *dg = dw_oc_alloc(N);
        dw_oc_fill(&g_rng, x, n, -2, 2);
        dw_oc_fill(&g_rng, g, N, -4, 4);
        if (rep == 3) g[0] = 30.0f, g[N - 1] = -30.0f; /* saturated: sigmoid 1 and ~1e-13 */
        dw_oc_fill(&g_rng, dy, n, -1, 1);
        for (int64_t i = 0; i < n; i++) y[i] = dx[i] = NAN;
        gate_st s = {N, C, dw_oc_to_double(x, n), dw_oc_to_double(g, N), dw_oc_to_double(dy, n), dw_oc_dalloc(n)};
        gate_naive(&s);
        dw_cpu_sigmoid_gate_fwd(y, x, g, N, C);
        assert_int_equal(dw_oc_fwd_check(op, "y", y, s.y, n), 0);
        dw_cpu_sigmoid_gate_bwd(dx, dg, dy, x, g, N, C);
        double *fd = dw_oc_dalloc(n);
        dw_oc_fd(gate_obj, &s, s.x, n, DW_OC_FD_H, fd);
        assert_int_equal(dw_oc_grad_check(op, "dx", dx, fd, NULL, n), 0);
        dw_oc_fd(gate_obj, &s, s.g, N, DW_OC_FD_H, fd);
        assert_int_equal(dw_oc_grad_check(op, "dg", dg, fd, NULL, N), 0);
        /* either gradient alone (the other NULL) is the same */
        float *dx2 = dw_oc_alloc(n), *dg2 = dw_oc_alloc(N);
        dw_cpu_sigmoid_gate_bwd(dx2, NULL, dy, x, g, N, C);
        dw_cpu_sigmoid_gate_bwd(NULL, dg2, dy, x, g, N, C);
        assert_int_equal(dw_oc_bitequal(op, "dx alone", dx2, dx, n), 0);
        assert_int_equal(dw_oc_bitequal(op, "dg alone", dg2, dg, N), 0);
        free(s.x), free(s.g), free(s.dy), free(s.y), free(fd);
        free(x), free(g), free(dy), free(y), free(dx), free(dg), free(dx2), free(dg2);
    }
}

/* ---- head_rmsnorm: rows of H heads x D channels, one weight (D) ----------------------------------- */
typedef struct {
    int64_t N, H, D;
    double eps;
    double *x, *w, *dy, *y;
} head_st;
static void head_naive(head_st *s) { /* per row n, head h: x * rsqrt(mean over D of x^2 + eps) * w */
    for (int64_t n = 0; n < s->N; n++)
        for (int64_t h = 0; h < s->H; h++) {
            const double *xr = s->x + (n * s->H + h) * s->D;
            double ms = 0.0;
            for (int64_t d = 0; d < s->D; d++) ms += xr[d] * xr[d];
            const double r = 1.0 / sqrt(ms / (double)s->D + s->eps);
            for (int64_t d = 0; d < s->D; d++) s->y[(n * s->H + h) * s->D + d] = xr[d] * r * s->w[d];
        }
}
static double head_obj(void *p) {
    head_st *s = p;
    head_naive(s);
    double L = 0.0;
    for (int64_t i = 0; i < s->N * s->H * s->D; i++) L += s->dy[i] * s->y[i];
    return L;
}

static void test_head_rmsnorm(void **state) {
    (void)state;
    for (int rep = 0; rep < 4; rep++) {
        /* D >= 3: at D 1 the norm is x / |x|, whose gradient is cancellation only */
        const int64_t N = dw_test_rnd(1, 9), H = dw_test_rnd(1, 5), D = dw_test_rnd(3, 19), n = N * H * D;
        const double eps = 1e-6;
        char op[80];
        snprintf(op, sizeof op, "head_rmsnorm[N=%lld H=%lld D=%lld]", (long long)N, (long long)H, (long long)D);
        float *x = dw_oc_alloc(n), *w = dw_oc_alloc(D), *dy = dw_oc_alloc(n), *y = dw_oc_alloc(n);
        float *rstd = dw_oc_alloc(N * H), *dx = dw_oc_alloc(n), *dw = dw_oc_alloc(D), *pw = dw_oc_alloc(D);
        dw_oc_fill(&g_rng, x, n, -2, 2);
        for (int64_t i = 0; i < n; i++) x[i] *= 1.0f + (float)((i / D) % 4); /* heads of different scales */
        dw_oc_fill(&g_rng, w, D, 0.5f, 1.5f);
        dw_oc_fill(&g_rng, dy, n, -1, 1);
        dw_oc_fill(&g_rng, pw, D, -1, 1);
        memcpy(dw, pw, (size_t)D * sizeof *dw); /* the weight gradient accumulates */
        for (int64_t i = 0; i < n; i++) y[i] = dx[i] = NAN;
        head_st s = {N, H, D, eps, dw_oc_to_double(x, n), dw_oc_to_double(w, D), dw_oc_to_double(dy, n),
                     dw_oc_dalloc(n)};
        head_naive(&s);
        dw_cpu_rmsnorm_fwd(y, rstd, x, w, N * H, D, eps); /* the op's CPU entry: N*H rows of D */
        assert_int_equal(dw_oc_fwd_check(op, "y", y, s.y, n), 0);
        dw_cpu_rmsnorm_bwd(dx, dw, dy, x, w, rstd, N * H, D);
        double *fd = dw_oc_dalloc(n);
        dw_oc_fd(head_obj, &s, s.x, n, DW_OC_FD_H, fd);
        assert_int_equal(dw_oc_grad_check(op, "dx", dx, fd, NULL, n), 0);
        dw_oc_fd(head_obj, &s, s.w, D, DW_OC_FD_H, fd); /* summed over every row and head */
        assert_int_equal(dw_oc_grad_check(op, "dw", dw, fd, pw, D), 0);
        free(s.x), free(s.w), free(s.dy), free(s.y), free(fd);
        free(x), free(w), free(dy), free(y), free(rstd), free(dx), free(dw), free(pw);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigmoid_gate),
        cmocka_unit_test(test_head_rmsnorm),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
