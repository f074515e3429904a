/* test_moe_group.c — DeepSeek-V3's router variants in the CPU reference (kernels/cpu/router_cpu.c,
 * kernels/router_desc.h): group-limited selection, the routed scaling factor, sigmoid or softmax
 * scores, renormalised or not, with and without a selection bias. The forward against a brute-force
 * oracle written here (groups ranked by sorting on the sum of their two largest keys in double,
 * then the kept groups' experts sorted on their keys; ties to the lower group and expert), on
 * fresh random sizes, with exact ties and rows where the groups must change the choice; one group
 * (or every group kept) equals the plain router bit for bit. The backward against central finite
 * differences of a double oracle of the weights for the chosen experts. */
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
#include "testutil.h"

#define RNG (&dw_test_group_rng)
#define MAXE 256

/* Row z's scores in double (softmax or sigmoid). */
static void oracle_scores(const float *z, int64_t E, int score, double *p) {
    double m = -INFINITY, s = 0.0;
    for (int64_t e = 0; e < E; e++) m = fmax(m, (double)z[e]);
    for (int64_t e = 0; e < E; e++) s += exp((double)z[e] - m);
    for (int64_t e = 0; e < E; e++) p[e] = score ? 1.0 / (1.0 + exp(-(double)z[e])) : exp((double)z[e] - m) / s;
}

/* Sorts items[0..n) by key descending, then by index ascending (insertion sort). */
static void sort_desc(int64_t *items, int64_t n, const double *key) {
    for (int64_t i = 1; i < n; i++) {
        const int64_t v = items[i];
        int64_t j = i;
        while (j > 0 && (key[items[j - 1]] < key[v] || (key[items[j - 1]] == key[v] && items[j - 1] > v))) {
            items[j] = items[j - 1];
            j--;
        }
        items[j] = v;
    }
}

/* The oracle's K experts of row z (finite logits): keys p + bias (or the logits without a bias,
 * which order p the same way), groups by the sum of their two largest keys p + bias. */
static void oracle_choose(const float *z, const float *bias, int64_t E, int64_t K, const dw_router_desc *d,
                          int32_t *out) {
    double p[MAXE], key[MAXE], gkey[64];
    oracle_scores(z, E, d->score, p);
    for (int64_t e = 0; e < E; e++) key[e] = p[e] + (bias ? (double)bias[e] : 0.0);
    const int64_t G = d->n_group > 1 ? d->n_group : 1, S = E / G;
    const int64_t kept = d->topk_group > 0 && d->topk_group < G ? d->topk_group : G;
    int64_t groups[64], cand[MAXE], nc = 0;
    for (int64_t g = 0; g < G; g++) {
        int64_t in[MAXE];
        for (int64_t i = 0; i < S; i++) in[i] = g * S + i;
        sort_desc(in, S, key);
        gkey[g] = S == 1 ? key[in[0]] : key[in[0]] + key[in[1]];
        groups[g] = g;
    }
    sort_desc(groups, G, gkey);
    double rank[MAXE]; /* what the experts are ranked by */
    for (int64_t e = 0; e < E; e++) rank[e] = bias ? key[e] : (double)z[e];
    for (int64_t i = 0; i < kept; i++)
        for (int64_t e = groups[i] * S; e < (groups[i] + 1) * S; e++) cand[nc++] = e;
    sort_desc(cand, nc, rank);
    for (int64_t k = 0; k < K; k++) out[k] = (int32_t)cand[k];
}

/* The weights of experts idx (K) of row z in double: scale p / sum (renorm) or scale p. */
static void oracle_weights(const double *z, int64_t E, int64_t K, const int32_t *idx, const dw_router_desc *d,
                           double *w) {
    double p[MAXE], m = -INFINITY, s = 0.0, sum = 0.0;
    for (int64_t e = 0; e < E; e++) m = fmax(m, z[e]);
    for (int64_t e = 0; e < E; e++) s += exp(z[e] - m);
    for (int64_t e = 0; e < E; e++) p[e] = d->score ? 1.0 / (1.0 + exp(-z[e])) : exp(z[e] - m) / s;
    for (int64_t k = 0; k < K; k++) sum += p[idx[k]];
    const double c = d->scale > 0 ? d->scale : 1.0;
    for (int64_t k = 0; k < K; k++) w[k] = c * (d->renorm ? p[idx[k]] / sum : p[idx[k]]);
}

/* A random router description over E experts with K chosen: n_group a divisor of E (at most 64),
 * topk_group in [1, n_group] with K within reach. */
static dw_router_desc random_desc(int64_t E, int64_t *K, int score, int renorm) {
    int64_t divs[64], nd = 0;
    for (int64_t g = 1; g <= E && g <= DW_ROUTER_MAX_GROUPS; g++)
        if (E % g == 0) divs[nd++] = g;
    const int64_t G = divs[dw_test_rnd(0, nd - 1)], tg = dw_test_rnd(1, G);
    const int64_t reach = tg * (E / G);
    *K = dw_test_rnd(1, reach);
    const double scale = dw_test_rnd(0, 2) == 0 ? 1.0 : (double)dw_test_uniform(RNG, 0.1f, 4.0f);
    const dw_router_desc d = {.score = score, .renorm = renorm, .n_group = G, .topk_group = tg, .scale = scale};
    return d;
}

/* One case: experts equal the oracle's, weights within an FP32 rounding of the double oracle's.
 * kind 0: random; 1: exact ties (pairs of equal logits, and biases); 2: groups that matter (the
 * largest logit of each row in group 0, whose other logits are the smallest). Returns the
 * mismatches; *moved counts rows whose experts differ from the ungrouped router's. */
static int64_t run_case(int64_t N, int64_t E, int64_t K, const dw_router_desc *d, int biased, int kind,
                        int64_t *moved) {
    float *z = malloc((size_t)(N * E) * 4), bias[MAXE], *w = malloc((size_t)(N * K) * 4), *w0 = malloc((size_t)(N * K) * 4);
    int32_t *idx = malloc((size_t)(N * K) * 4), *idx0 = malloc((size_t)(N * K) * 4), want[MAXE];
    for (int64_t i = 0; i < N * E; i++) z[i] = dw_test_uniform(RNG, -3.0f, 3.0f);
    for (int64_t e = 0; e < E; e++) bias[e] = dw_test_uniform(RNG, -0.3f, 0.3f);
    if (kind == 1)
        for (int64_t n = 0; n < N; n++)
            for (int64_t e = 1; e < E; e += 2) {
                z[n * E + e] = z[n * E + e - 1];
                bias[e] = bias[e - 1];
            }
    const int64_t S = d->n_group > 1 ? E / d->n_group : E;
    if (kind == 2 && S > 1 && S < E)
        for (int64_t n = 0; n < N; n++) { /* group 0: the largest logit, the rest the smallest; its key */
            float *zr = z + n * E;            /* below every other group's by either score */
            zr[0] = 2.0f;
            for (int64_t e = 1; e < S; e++) zr[e] = -3.0f - 0.001f * (float)e;
            for (int64_t e = S; e < E; e++) zr[e] = dw_test_uniform(RNG, 1.5f, 1.9f);
        }
    const float *b = biased ? bias : NULL;
    dw_cpu_moe_router_fwd_desc(w, idx, z, b, N, E, K, d);
    const dw_router_desc plain = {.score = d->score, .renorm = d->renorm, .scale = d->scale};
    dw_cpu_moe_router_fwd_desc(w0, idx0, z, b, N, E, K, &plain);
    int64_t bad = 0;
    for (int64_t n = 0; n < N; n++) {
        oracle_choose(z + n * E, b, E, K, d, want);
        double zd[MAXE], ww[MAXE];
        for (int64_t e = 0; e < E; e++) zd[e] = z[n * E + e];
        oracle_weights(zd, E, K, want, d, ww);
        for (int64_t k = 0; k < K; k++) {
            const int64_t i = n * K + k;
            if (idx[i] != want[k] || fabs((double)w[i] - ww[k]) > 2e-7 * fabs(ww[k]) + 1e-30) {
                if (bad++ < 5)
                    fprintf(stderr, "kind %d %s%s%s E=%lld K=%lld groups %lld keep %lld scale %g: row %lld k %lld "
                            "expert %d weight %.9g, oracle %d %.9g\n", kind, d->score ? "sigmoid" : "softmax",
                            d->renorm ? " renorm" : "", biased ? " biased" : "", (long long)E, (long long)K,
                            (long long)d->n_group, (long long)d->topk_group, d->scale, (long long)n, (long long)k,
                            idx[i], w[i], want[k], ww[k]);
            }
        }
        moved[0] += memcmp(idx + n * K, idx0 + n * K, (size_t)K * 4) != 0;
    }
    free(z), free(w), free(w0), free(idx), free(idx0);
    return bad;
}

static void test_forward_oracle(void **state) {
    (void)state;
    int64_t bad = 0, moved_kind2 = 0, grouped_kind2 = 0;
    for (int rep = 0; rep < 6; rep++)
        for (int score = 0; score < 2; score++)
            for (int renorm = 0; renorm < 2; renorm++)
                for (int biased = 0; biased < 2; biased++)
                    for (int kind = 0; kind < 3; kind++) {
                        const int64_t E = dw_test_rnd(2, 48) * (kind == 2 ? 2 : 1), N = dw_test_rnd(1, 17);
                        int64_t K, moved = 0;
                        dw_router_desc d = random_desc(E, &K, score, renorm);
                        if (kind == 2) { /* group 0 must lose: keep at most half the groups, 2+ per group */
                            int64_t G = 2;
                            for (int64_t g = 2; g <= E / 2 && g <= 64; g++)
                                if (E % g == 0 && dw_test_rnd(0, 1)) G = g;
                            d.n_group = G, d.topk_group = dw_test_rnd(1, G / 2), K = dw_test_rnd(2, d.topk_group * (E / G));
                        }
                        bad += run_case(N, E, K, &d, biased, kind, &moved);
                        if (kind == 2 && !biased && dw_router_grouped(&d)) grouped_kind2 += N, moved_kind2 += moved;
                    }
    assert_int_equal(bad, 0);
    /* rows whose largest logit sits in a group of the smallest: the groups moved most of them */
    if (!(grouped_kind2 > 0 && moved_kind2 * 2 > grouped_kind2))
        fail_msg("the groups moved %lld of %lld rows", (long long)moved_kind2, (long long)grouped_kind2);
}

/* One group, or every group kept, with scale 1: the plain router's bits (weights and experts). */
static void test_one_group_is_plain(void **state) {
    (void)state;
    for (int score = 0; score < 2; score++)
        for (int renorm = 0; renorm < 2; renorm++) {
            const int64_t E = dw_test_rnd(1, 40), K = dw_test_rnd(1, E), N = dw_test_rnd(1, 33);
            float *z = malloc((size_t)(N * E) * 4), *w0 = malloc((size_t)(N * K) * 4), *w1 = malloc((size_t)(N * K) * 4);
            int32_t *i0 = malloc((size_t)(N * K) * 4), *i1 = malloc((size_t)(N * K) * 4);
            for (int64_t i = 0; i < N * E; i++) z[i] = dw_test_uniform(RNG, -4.0f, 4.0f);
            dw_cpu_moe_router_fwd(w0, i0, z, N, E, K, score, renorm);
            const dw_router_desc one = {.score = score, .renorm = renorm, .n_group = 1, .topk_group = 1, .scale = 1.0};
            dw_cpu_moe_router_fwd_desc(w1, i1, z, NULL, N, E, K, &one);
            assert_memory_equal(w0, w1, (size_t)(N * K) * 4);
            assert_memory_equal(i0, i1, (size_t)(N * K) * 4);
            const dw_router_desc all = {.score = score, .renorm = renorm, .n_group = E, .topk_group = E};
            dw_cpu_moe_router_fwd_desc(w1, i1, z, NULL, N, E, K, &all);
            assert_memory_equal(w0, w1, (size_t)(N * K) * 4);
            assert_memory_equal(i0, i1, (size_t)(N * K) * 4);
            free(z), free(w0), free(w1), free(i0), free(i1);
        }
}

/* The backward: dz against central differences of sum_k c_k w_k(z) over the chosen experts (the
 * selection held fixed), in double, for random c. */
static void test_backward_fd(void **state) {
    (void)state;
    int64_t bad = 0;
    for (int score = 0; score < 2; score++)
        for (int renorm = 0; renorm < 2; renorm++)
            for (int rep = 0; rep < 3; rep++) {
                const int64_t E = dw_test_rnd(2, 32), N = dw_test_rnd(1, 6);
                int64_t K;
                const dw_router_desc d = random_desc(E, &K, score, renorm);
                float *z = malloc((size_t)(N * E) * 4), *w = malloc((size_t)(N * K) * 4), *c = malloc((size_t)(N * K) * 4);
                float *dz = malloc((size_t)(N * E) * 4), bias[MAXE];
                int32_t *idx = malloc((size_t)(N * K) * 4);
                for (int64_t i = 0; i < N * E; i++) z[i] = dw_test_uniform(RNG, -2.0f, 2.0f);
                for (int64_t i = 0; i < N * K; i++) c[i] = dw_test_uniform(RNG, -1.0f, 1.0f);
                for (int64_t e = 0; e < E; e++) bias[e] = dw_test_uniform(RNG, -0.5f, 0.5f);
                dw_cpu_moe_router_fwd_desc(w, idx, z, rep == 2 ? bias : NULL, N, E, K, &d);
                dw_cpu_moe_router_bwd_desc(dz, c, z, idx, N, E, K, &d);
                const double h = 1e-5;
                for (int64_t n = 0; n < N; n++)
                    for (int64_t e = 0; e < E; e++) {
                        double zd[MAXE], wp[MAXE], wm[MAXE], lp = 0.0, lm = 0.0;
                        for (int64_t x = 0; x < E; x++) zd[x] = z[n * E + x];
                        zd[e] += h;
                        oracle_weights(zd, E, K, idx + n * K, &d, wp);
                        zd[e] -= 2 * h;
                        oracle_weights(zd, E, K, idx + n * K, &d, wm);
                        for (int64_t k = 0; k < K; k++) lp += c[n * K + k] * wp[k], lm += c[n * K + k] * wm[k];
                        const double fd = (lp - lm) / (2 * h), got = dz[n * E + e];
                        if (fabs(got - fd) > 1e-6 + 1e-5 * fabs(fd)) {
                            if (bad++ < 5)
                                fprintf(stderr, "%s%s E=%lld K=%lld groups %lld/%lld scale %g: dz[%lld,%lld] %.9g, "
                                        "finite differences %.9g\n", score ? "sigmoid" : "softmax", renorm ? " renorm" : "",
                                        (long long)E, (long long)K, (long long)d.topk_group, (long long)d.n_group,
                                        d.scale, (long long)n, (long long)e, got, fd);
                        }
                    }
                free(z), free(w), free(c), free(dz), free(idx);
            }
    assert_int_equal(bad, 0);
}

/* A NaN logit is never chosen; a row whose kept groups hold fewer than K finite experts gets -1
 * and NaN weights past them, as the plain router. */
static void test_nan_rows(void **state) {
    (void)state;
    const int64_t E = 8, K = 3;
    float z[8] = {1.0f, NAN, 0.5f, 0.25f, -1.0f, -2.0f, NAN, NAN}, w[3];
    int32_t idx[3];
    const dw_router_desc d = {.score = 1, .renorm = 1, .n_group = 4, .topk_group = 2, .scale = 2.5};
    dw_cpu_moe_router_fwd_desc(w, idx, z, NULL, 1, E, K, &d);
    /* group keys (sigmoid): {1, NaN} -> -inf, {0.5, 0.25} finite, {-1, -2} finite, {NaN, NaN} -inf */
    assert_int_equal(idx[0], 2);
    assert_int_equal(idx[1], 3);
    assert_int_equal(idx[2], 4);
    const double p2 = 1 / (1 + exp(-0.5)), p3 = 1 / (1 + exp(-0.25)), p4 = 1 / (1 + exp(1.0));
    assert_float_equal(w[0], (float)(2.5 * p2 / (p2 + p3 + p4)), 1e-6);
    const dw_router_desc d1 = {.score = 1, .renorm = 0, .n_group = 4, .topk_group = 1};
    dw_cpu_moe_router_fwd_desc(w, idx, z, NULL, 1, E, K, &d1); /* group 1 only: two experts for three */
    assert_int_equal(idx[0], 2);
    assert_int_equal(idx[1], 3);
    assert_int_equal(idx[2], -1);
    assert_true(isnan(w[2]));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_oracle), cmocka_unit_test(test_one_group_is_plain),
        cmocka_unit_test(test_backward_fd),    cmocka_unit_test(test_nan_rows),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
