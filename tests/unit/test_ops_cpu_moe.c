/* test_ops_cpu_moe.c — the CPU reference MoE kernels. Dispatch, grouped linear and combine
 * (kernels/cpu/moe_cpu.c): the dispatch's grouping checked property by property, the others
 * against naive formulas and central differences, with skewed routing (half the assignments to
 * one expert), an empty expert and an invalid assignment. The router (kernels/cpu/router_cpu.c): forward against an
 * independent double formula written here (selection by sorting, not by the kernel's repeated
 * arg-max), backward against double central differences of that formula with the experts held
 * at the forward's choice; softmax and sigmoid scores, renormalised or not, on fresh random sizes
 * including K = E and E = 1; ties go to the lower expert, a NaN logit is never chosen, and a
 * missing weight gradient counts as zeros. The router losses (kernels/cpu/moe_aux_cpu.c): the
 * load-balancing loss and the z-loss of two chained layers against a double formula written here,
 * both layers' logit gradients against its central differences. Tolerances: opcheck.h's
 * (test_ops_cpu.c says why). */
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

/* ---- dispatch, grouped linear, combine --------------------------------------------------------- */
static int32_t *random_experts(int64_t N, int64_t K, int64_t E, bool invalid) {
    int32_t *idx = malloc((size_t)(N * K) * sizeof *idx);
    for (int64_t a = 0; a < N * K; a++) /* skewed: half the assignments to expert 0 */
        idx[a] = dw_test_next(&g_rng) % 2 ? 0 : (int32_t)(dw_test_next(&g_rng) % (uint64_t)E);
    if (invalid) idx[N * K / 2] = -1; /* a router row short of candidates */
    return idx;
}

/* Dispatch: offsets are the prefix counts, every valid assignment has its own row holding its
 * token, rows within a group keep (token, k) order, unused rows are 0; the backward sums rows. */
static int64_t run_dispatch(int64_t N, int64_t C, int64_t K, int64_t E, bool invalid) {
    int64_t bad = 0;
    float *x = dw_oc_alloc(N * C), *xs = dw_oc_alloc(N * K * C), *dxs = dw_oc_alloc(N * K * C), *dx = dw_oc_alloc(N * C);
    int32_t *idx = random_experts(N, K, E, invalid), *off = malloc((size_t)(E + 1) * 4), *pos = malloc((size_t)(N * K) * 4);
    dw_oc_fill(&g_rng, x, N * C, -1, 1);
    dw_oc_fill(&g_rng, dxs, N * K * C, -1, 1);
    for (int64_t i = 0; i < N * K * C; i++) xs[i] = NAN;
    dw_cpu_moe_dispatch_fwd(xs, off, pos, x, idx, NULL, N, C, K, E, 0);
    int64_t valid = 0;
    for (int64_t e = 0; e < E; e++) {
        int64_t count = 0, last = -1;
        for (int64_t a = 0; a < N * K; a++)
            if (idx[a] == e) {
                count++;
                bad += pos[a] < off[e] || pos[a] >= off[e + 1] || pos[a] <= last; /* in its group, in order */
                last = pos[a];
                bad += memcmp(xs + (int64_t)pos[a] * C, x + (a / K) * C, (size_t)C * 4) != 0;
            }
        bad += off[e] != valid || off[e + 1] - off[e] != count;
        valid += count;
    }
    bad += off[E] != valid;
    for (int64_t a = 0; a < N * K; a++) bad += (idx[a] < 0) != (pos[a] < 0);
    for (int64_t i = valid * C; i < N * K * C; i++) bad += xs[i] != 0.0f;
    dw_cpu_moe_dispatch_bwd(dx, dxs, pos, N, C, K);
    double *want = dw_oc_dalloc(N * C);
    for (int64_t a = 0; a < N * K; a++)
        for (int64_t c = 0; pos[a] >= 0 && c < C; c++) want[(a / K) * C + c] += dxs[(int64_t)pos[a] * C + c];
    bad += dw_oc_fwd_check("moe_dispatch", "dx", dx, want, N * C);
    if (bad) fprintf(stderr, "moe_dispatch N=%lld C=%lld K=%lld E=%lld: %lld bad\n", (long long)N, (long long)C,
                     (long long)K, (long long)E, (long long)bad);
    free(x), free(xs), free(dxs), free(dx), free(idx), free(off), free(pos), free(want);
    return bad;
}

typedef struct {
    double *x, *w, *g;
    const int32_t *off;
    int64_t R, E, K, M;
} glin_st;
static double glin_obj(void *p) { /* sum g . y */
    glin_st *o = p;
    double L = 0.0;
    for (int64_t e = 0; e < o->E; e++)
        for (int64_t r = o->off[e]; r < o->off[e + 1]; r++)
            for (int64_t m = 0; m < o->M; m++) {
                double y = 0.0;
                for (int64_t k = 0; k < o->K; k++) y += o->x[r * o->K + k] * o->w[(e * o->M + m) * o->K + k];
                L += o->g[r * o->M + m] * y;
            }
    return L;
}

/* Grouped linear: forward against the per-group formula; dx and dw against differences of
 * sum g . y (an empty group included; unused rows give 0). */
static int64_t run_glinear(int64_t N, int64_t K0, int64_t E, int64_t Kin, int64_t M) {
    int64_t bad = 0;
    const int64_t R = N * K0;
    int32_t *idx = random_experts(N, K0, E, false), *off = malloc((size_t)(E + 1) * 4), *pos = malloc((size_t)R * 4);
    idx[0] = (int32_t)(E - 1); /* expert E-2 may be empty: fine */
    float *dummy = dw_oc_alloc(N), *xsd = dw_oc_alloc(R);
    for (int64_t i = 0; i < N; i++) dummy[i] = 0.0f;
    dw_cpu_moe_dispatch_fwd(xsd, off, pos, dummy, idx, NULL, N, 1, K0, E, 0); /* only the offsets are needed */
    float *x = dw_oc_alloc(R * Kin), *w = dw_oc_alloc(E * M * Kin), *y = dw_oc_alloc(R * M), *g = dw_oc_alloc(R * M);
    float *dx = dw_oc_alloc(R * Kin), *dw = dw_oc_alloc(E * M * Kin), *prior = dw_oc_alloc(E * M * Kin);
    dw_oc_fill(&g_rng, x, R * Kin, -1, 1);
    dw_oc_fill(&g_rng, w, E * M * Kin, -1, 1);
    dw_oc_fill(&g_rng, g, R * M, -1, 1);
    dw_oc_fill(&g_rng, prior, E * M * Kin, -1, 1);
    memcpy(dw, prior, (size_t)(E * M * Kin) * 4);
    dw_cpu_moe_linear_fwd(y, x, w, off, R, E, Kin, M);
    dw_cpu_moe_linear_bwd(dx, dw, g, x, w, off, R, E, Kin, M);
    glin_st o = {.x = dw_oc_to_double(x, R * Kin), .w = dw_oc_to_double(w, E * M * Kin), .g = dw_oc_to_double(g, R * M),
                 .off = off, .R = R, .E = E, .K = Kin, .M = M};
    double *want = dw_oc_dalloc(R * M), *fdx = dw_oc_dalloc(R * Kin), *fdw = dw_oc_dalloc(E * M * Kin);
    for (int64_t e = 0; e < E; e++)
        for (int64_t r = off[e]; r < off[e + 1]; r++)
            for (int64_t m = 0; m < M; m++)
                for (int64_t k = 0; k < Kin; k++) want[r * M + m] += o.x[r * Kin + k] * o.w[(e * M + m) * Kin + k];
    bad += dw_oc_fwd_check("moe_linear", "y", y, want, R * M);
    dw_oc_fd(glin_obj, &o, o.x, R * Kin, DW_OC_FD_H, fdx);
    dw_oc_fd(glin_obj, &o, o.w, E * M * Kin, DW_OC_FD_H, fdw);
    bad += dw_oc_grad_check("moe_linear", "dx", dx, fdx, NULL, R * Kin);
    bad += dw_oc_grad_check("moe_linear", "dw", dw, fdw, prior, E * M * Kin);
    free(idx), free(off), free(pos), free(dummy), free(xsd), free(x), free(w), free(y), free(g), free(dx), free(dw);
    free(prior), free(o.x), free(o.w), free(o.g), free(want), free(fdx), free(fdw);
    return bad;
}

typedef struct {
    double *ys, *wt, *g;
    const int32_t *pos;
    int64_t N, C, K;
} comb_st;
static double comb_obj(void *p) {
    comb_st *o = p;
    double L = 0.0;
    for (int64_t n = 0; n < o->N; n++)
        for (int64_t k = 0; k < o->K; k++) {
            const int32_t r = o->pos[n * o->K + k];
            for (int64_t c = 0; r >= 0 && c < o->C; c++)
                L += o->g[n * o->C + c] * o->wt[n * o->K + k] * o->ys[(int64_t)r * o->C + c];
        }
    return L;
}

/* Combine: forward against the weighted sums; dys and dwt against differences of sum g . out. */
static int64_t run_combine(int64_t N, int64_t C, int64_t K, int64_t E) {
    int64_t bad = 0;
    const int64_t R = N * K;
    int32_t *idx = random_experts(N, K, E, true), *off = malloc((size_t)(E + 1) * 4), *pos = malloc((size_t)R * 4);
    float *dummy = dw_oc_alloc(N), *xsd = dw_oc_alloc(R);
    for (int64_t i = 0; i < N; i++) dummy[i] = 0.0f;
    dw_cpu_moe_dispatch_fwd(xsd, off, pos, dummy, idx, NULL, N, 1, K, E, 0);
    float *ys = dw_oc_alloc(R * C), *wt = dw_oc_alloc(N * K), *g = dw_oc_alloc(N * C), *out = dw_oc_alloc(N * C);
    float *dys = dw_oc_alloc(R * C), *dwt = dw_oc_alloc(N * K);
    dw_oc_fill(&g_rng, ys, R * C, -1, 1);
    dw_oc_fill(&g_rng, wt, N * K, 0, 1);
    dw_oc_fill(&g_rng, g, N * C, -1, 1);
    dw_cpu_moe_combine_fwd(out, ys, wt, pos, N, C, K);
    dw_cpu_moe_combine_bwd(dys, dwt, g, ys, wt, pos, N, C, K, R);
    comb_st o = {.ys = dw_oc_to_double(ys, R * C), .wt = dw_oc_to_double(wt, N * K), .g = dw_oc_to_double(g, N * C),
                 .pos = pos, .N = N, .C = C, .K = K};
    double *want = dw_oc_dalloc(N * C), *fdy = dw_oc_dalloc(R * C), *fdw = dw_oc_dalloc(N * K);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++)
            for (int64_t c = 0; pos[n * K + k] >= 0 && c < C; c++)
                want[n * C + c] += o.wt[n * K + k] * o.ys[(int64_t)pos[n * K + k] * C + c];
    bad += dw_oc_fwd_check("moe_combine", "out", out, want, N * C);
    dw_oc_fd(comb_obj, &o, o.ys, R * C, DW_OC_FD_H, fdy);
    dw_oc_fd(comb_obj, &o, o.wt, N * K, DW_OC_FD_H, fdw);
    bad += dw_oc_grad_check("moe_combine", "dys", dys, fdy, NULL, R * C);
    bad += dw_oc_grad_check("moe_combine", "dweights", dwt, fdw, NULL, N * K);
    free(idx), free(off), free(pos), free(dummy), free(xsd), free(ys), free(wt), free(g), free(out), free(dys);
    free(dwt), free(o.ys), free(o.wt), free(o.g), free(want), free(fdy), free(fdw);
    return bad;
}

static void test_dispatch_linear_combine(void **state) {
    (void)state;
    int64_t bad = 0;
    for (int rep = 0; rep < 3; rep++) {
        const int64_t E = 2 + (int64_t)(dw_test_next(&g_rng) % 7), K = 1 + (int64_t)(dw_test_next(&g_rng) % E);
        const int64_t N = 1 + (int64_t)(dw_test_next(&g_rng) % 11), C = 1 + (int64_t)(dw_test_next(&g_rng) % 9);
        bad += run_dispatch(N, C, K, E, false);
        bad += run_dispatch(N, C, K, E, true);
        bad += run_glinear(N, K, E, C, 1 + (int64_t)(dw_test_next(&g_rng) % 7));
        bad += run_combine(N, C, K, E);
    }
    bad += run_dispatch(1, 3, 1, 1, false); /* one token, one expert */
    assert_int_equal(bad, 0);
}

/* Router losses over two chained layers, restated in double: coef E sum_e C_e (S0_e + S1_e) / (LN)^2
 * + zcoef (sum_n lse0_n^2 + sum_n lse1_n^2) / N, with the counts C of both layers' fixed experts. */
typedef struct {
    double *z[2];
    const int32_t *counts;
    int64_t N, E, K;
    double coef, zcoef;
} aux_st;
static double aux_obj(void *p) {
    aux_st *o = p;
    double LN = 0.0, dot = 0.0, zs = 0.0;
    for (int64_t e = 0; e < o->E; e++) LN += o->counts[e];
    LN /= (double)o->K;
    for (int l = 0; l < 2; l++)
        for (int64_t n = 0; n < o->N; n++) {
            const double *r = o->z[l] + n * o->E;
            double m = -INFINITY, s = 0.0;
            for (int64_t e = 0; e < o->E; e++) m = r[e] > m ? r[e] : m;
            for (int64_t e = 0; e < o->E; e++) s += exp(r[e] - m);
            for (int64_t e = 0; e < o->E; e++) dot += o->counts[e] * exp(r[e] - m) / s;
            zs += (m + log(s)) * (m + log(s));
        }
    return o->coef * (double)o->E * dot / (LN * LN) + o->zcoef * zs / (double)o->N;
}

/* The statistics chain and the losses: values against aux_obj, both layers' dz against its
 * differences (the loss's gradient handed back through the chain unchanged). */
static int64_t run_aux(int64_t N, int64_t E, int64_t K, double coef, double zcoef) {
    int64_t bad = 0;
    int32_t *idx0 = random_experts(N, K, E, false), *idx1 = random_experts(N, K, E, false);
    int32_t *c0 = malloc((size_t)E * 4), *c1 = malloc((size_t)E * 4);
    float *z0 = dw_oc_alloc(N * E), *z1 = dw_oc_alloc(N * E), *s0 = dw_oc_alloc(E + 1), *s1 = dw_oc_alloc(E + 1);
    float *ds = dw_oc_alloc(E + 1), *dz0 = dw_oc_alloc(N * E), *dz1 = dw_oc_alloc(N * E);
    dw_oc_fill(&g_rng, z0, N * E, -3, 3);
    dw_oc_fill(&g_rng, z1, N * E, -3, 3);
    dw_cpu_moe_aux_stats_fwd(s0, c0, z0, idx0, NULL, NULL, N, E, K);
    dw_cpu_moe_aux_stats_fwd(s1, c1, z1, idx1, s0, c0, N, E, K);
    double zl = 0.0;
    const double aux = dw_cpu_moe_aux_loss(s1, c1, E, K, N, coef, zcoef, &zl);
    dw_cpu_moe_aux_loss_bwd(ds, c1, E, K, N, coef, zcoef, 1.0);
    dw_cpu_moe_aux_stats_bwd(dz1, ds, z1, N, E);
    dw_cpu_moe_aux_stats_bwd(dz0, ds, z0, N, E);
    aux_st o = {.z = {dw_oc_to_double(z0, N * E), dw_oc_to_double(z1, N * E)}, .counts = c1, .N = N, .E = E, .K = K,
                .coef = coef, .zcoef = zcoef};
    const double want = aux_obj(&o);
    if (!(fabs(aux + zl - want) <= 1e-6 * fabs(want) + 1e-9)) {
        printf("MISMATCH moe_aux_loss value %.9g + %.9g vs %.9g\n", aux, zl, want);
        bad++;
    }
    double *fd0 = dw_oc_dalloc(N * E), *fd1 = dw_oc_dalloc(N * E);
    dw_oc_fd(aux_obj, &o, o.z[0], N * E, DW_OC_FD_H, fd0);
    dw_oc_fd(aux_obj, &o, o.z[1], N * E, DW_OC_FD_H, fd1);
    bad += dw_oc_grad_check("moe_aux", "dz layer 0", dz0, fd0, NULL, N * E);
    bad += dw_oc_grad_check("moe_aux", "dz layer 1", dz1, fd1, NULL, N * E);
    free(idx0), free(idx1), free(c0), free(c1), free(z0), free(z1), free(s0), free(s1), free(ds), free(dz0);
    free(dz1), free(o.z[0]), free(o.z[1]), free(fd0), free(fd1);
    return bad;
}

static void test_router_losses(void **state) {
    (void)state;
    int64_t bad = 0;
    for (int rep = 0; rep < 3; rep++) {
        const int64_t E = 2 + (int64_t)(dw_test_next(&g_rng) % 7), K = 1 + (int64_t)(dw_test_next(&g_rng) % E);
        const int64_t N = 1 + (int64_t)(dw_test_next(&g_rng) % 9);
        bad += run_aux(N, E, K, 0.5, 0.0);
        bad += run_aux(N, E, K, 0.0, 0.3);
        bad += run_aux(N, E, K, 0.01, 0.1);
    }
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_router), cmocka_unit_test(test_router_nan),
                                       cmocka_unit_test(test_dispatch_linear_combine),
                                       cmocka_unit_test(test_router_losses)};
    return cmocka_run_group_tests(tests, setup, NULL);
}
