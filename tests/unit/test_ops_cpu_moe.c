/* test_ops_cpu_moe.c — the CPU reference MoE router (kernels/cpu/router_cpu.c): forward against an
 * independent double formula written here (selection by sorting, not by the kernel's repeated
 * arg-max), backward against double central differences of that formula with the experts held
 * at the forward's choice; softmax and sigmoid scores, renormalised or not, on fresh random sizes
 * including K = E and E = 1; ties go to the lower expert, a NaN logit is never chosen, and a
 * missing weight gradient counts as zeros. Tolerances: opcheck.h's (test_ops_cpu.c says why). */
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
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x5EEDE4ull);
    return 0;
}

/* The experts of row z (E) in rank order (larger logit, then lower index), by insertion sort. */
static void rank(const double *z, int64_t E, int64_t *order) {
    for (int64_t e = 0; e < E; e++) {
        int64_t j = e;
        while (j > 0 && (z[order[j - 1]] < z[e] || (z[order[j - 1]] == z[e] && order[j - 1] > e))) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = e;
    }
}

/* Weights of the K experts sel (given) of row z: scores, then renormalised or not. */
static void weights(const double *z, int64_t E, const int32_t *sel, int64_t K, int score, int renorm, double *w) {
    double m = z[0], s = 0.0, sum = 0.0;
    for (int64_t e = 1; e < E; e++) m = fmax(m, z[e]);
    for (int64_t e = 0; e < E; e++) s += exp(z[e] - m);
    for (int64_t k = 0; k < K; k++) {
        const double v = z[sel[k]];
        w[k] = score ? 1.0 / (1.0 + exp(-v)) : exp(v - m) / s;
        sum += w[k];
    }
    if (renorm)
        for (int64_t k = 0; k < K; k++) w[k] /= sum;
}

typedef struct {
    double *z, *g;
    const int32_t *sel;
    int64_t N, E, K;
    int score, renorm;
} obj_st;
static double objective(void *p) { /* sum g . w(z) with the experts fixed */
    obj_st *o = p;
    double L = 0.0, w[64];
    for (int64_t n = 0; n < o->N; n++) {
        weights(o->z + n * o->E, o->E, o->sel + n * o->K, o->K, o->score, o->renorm, w);
        for (int64_t k = 0; k < o->K; k++) L += o->g[n * o->K + k] * w[k];
    }
    return L;
}

static int64_t run(int64_t N, int64_t E, int64_t K, int score, int renorm, bool with_ties) {
    char name[96];
    snprintf(name, sizeof name, "moe_router[%s%s N=%lld E=%lld K=%lld]", score ? "sigmoid" : "softmax",
             renorm ? " renorm" : "", (long long)N, (long long)E, (long long)K);
    float *z = dw_oc_alloc(N * E), *w = dw_oc_alloc(N * K), *dw = dw_oc_alloc(N * K), *dz = dw_oc_alloc(N * E);
    int32_t *idx = malloc((size_t)(N * K) * sizeof *idx), *want_idx = malloc((size_t)(N * K) * sizeof *want_idx);
    dw_oc_fill(&g_rng, z, N * E, -3.0f, 3.0f);
    dw_oc_fill(&g_rng, dw, N * K, -1.0f, 1.0f);
    if (with_ties) /* every row repeats one logit: the lower expert must come first */
        for (int64_t n = 0; n < N && E > 1; n++) z[n * E + E - 1] = z[n * E + (n % (E - 1))];
    double *zd = dw_oc_to_double(z, N * E), *ww = dw_oc_dalloc(N * K), *gd = dw_oc_to_double(dw, N * K);
    int64_t order[64];
    for (int64_t n = 0; n < N; n++) {
        rank(zd + n * E, E, order);
        for (int64_t k = 0; k < K; k++) want_idx[n * K + k] = (int32_t)order[k];
        weights(zd + n * E, E, want_idx + n * K, K, score, renorm, ww + n * K);
    }
    dw_cpu_moe_router_fwd(w, idx, z, N, E, K, score, renorm);
    int64_t bad = memcmp(idx, want_idx, (size_t)(N * K) * sizeof *idx) != 0;
    if (bad) fprintf(stderr, "%s: experts differ from the sorted order\n", name);
    bad += dw_oc_fwd_check(name, "weights", w, ww, N * K);
    dw_cpu_moe_router_bwd(dz, dw, z, idx, N, E, K, score, renorm);
    double *fd = dw_oc_dalloc(N * E);
    obj_st o = {.z = zd, .g = gd, .sel = idx, .N = N, .E = E, .K = K, .score = score, .renorm = renorm};
    dw_oc_fd(objective, &o, zd, N * E, DW_OC_FD_H, fd);
    /* renormalised weights of one expert are 1 whatever the logit: the gradient cancels in double
     * (dw - dw.w) / s to ~1e-17, where the differences give 0; hence the absolute floor */
    bad += dw_oc_compare(name, "dlogits", dz, fd, N * E, DW_OC_GRAD_ATOL_FRAC * dw_oc_maxabs(fd, N * E) + 1e-12,
                         DW_OC_GRAD_RTOL);
    /* no weight gradient: zeros */
    dw_cpu_moe_router_bwd(dz, NULL, z, idx, N, E, K, score, renorm);
    for (int64_t i = 0; i < N * E; i++) bad += dz[i] != 0.0f;
    free(z), free(w), free(dw), free(dz), free(idx), free(want_idx), free(zd), free(ww), free(gd), free(fd);
    return bad;
}

static void test_router(void **state) {
    (void)state;
    int64_t bad = 0;
    for (int score = 0; score < 2; score++)
        for (int renorm = 0; renorm < 2; renorm++) {
            const int64_t E = 2 + (int64_t)(dw_test_next(&g_rng) % 30), K = 1 + (int64_t)(dw_test_next(&g_rng) % E);
            const int64_t N = 1 + (int64_t)(dw_test_next(&g_rng) % 13);
            bad += run(N, E, K, score, renorm, false);
            bad += run(N, E, E, score, renorm, false); /* every expert */
            bad += run(N, 1, 1, score, renorm, false);
            bad += run(N, E, K, score, renorm, true);
        }
    assert_int_equal(bad, 0);
}

/* A NaN logit is never chosen; a row with fewer than K other logits gets -1 and a NaN weight. */
static void test_router_nan(void **state) {
    (void)state;
    const float z[4] = {NAN, 0.5f, -1.0f, 2.0f};
    float w[4];
    int32_t idx[4];
    dw_cpu_moe_router_fwd(w, idx, z, 1, 4, 3, 0, 1);
    assert_int_equal(idx[0], 3);
    assert_int_equal(idx[1], 1);
    assert_int_equal(idx[2], 2);
    dw_cpu_moe_router_fwd(w, idx, z, 1, 4, 4, 1, 0);
    assert_int_equal(idx[3], -1);
    assert_true(isnan(w[3]) && isfinite(w[0]));
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_router), cmocka_unit_test(test_router_nan)};
    return cmocka_run_group_tests(tests, setup, NULL);
}
