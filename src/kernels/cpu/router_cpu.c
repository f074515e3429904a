/* router_cpu.c — CPU reference for the MoE router (ops_cpu.h): scores, top-k selection and the
 * weights, forward and backward, per row in double and rounded once. Selection compares the
 * logits themselves (the scores are increasing in them), so every backend chooses the same experts
 * from the same stored logits; with a selection bias (DeepSeek-V3's auxiliary-loss-free
 * balancing) it compares score + bias instead, the weights still the unbiased scores. Group-limited
 * selection (DeepSeek-V3) first keeps a row's best groups by their two largest keys
 * (kernels/router_desc.h). Rows are independent, so threads cannot change results. */
#include <math.h>

#include "core/error.h"
#include "kernels/cpu/ops_cpu.h"

double dw_cpu_softmax_row(double *p, const float *z, int64_t E) {
    double m = z[0], s = 0.0;
    for (int64_t e = 1; e < E; e++) m = z[e] > m ? z[e] : m;
    for (int64_t e = 0; e < E; e++) s += (p[e] = exp((double)z[e] - m));
    for (int64_t e = 0; e < E; e++) p[e] /= s;
    return m + log(s);
}

/* Scores of one row: softmax (max-subtracted) or elementwise sigmoid. */
static void scores(double *p, const float *z, int64_t E, int score) {
    if (score == 1) {
        for (int64_t e = 0; e < E; e++) p[e] = 1.0 / (1.0 + exp(-(double)z[e]));
        return;
    }
    dw_cpu_softmax_row(p, z, E);
}

/* Whether expert a ranks before expert b (-1: none yet) in row zr: by the logits, or with a bias
 * by the scores plus the bias (in double); ties: the lower expert (scanned first, kept unless
 * beaten); a NaN logit or key never ranks. */
static int ranks_before(const float *zr, const double *p, const float *bias, int64_t a, int64_t b) {
    if (zr[a] != zr[a]) return 0;
    if (!bias) return b < 0 || zr[a] > zr[b];
    const double ka = p[a] + (double)bias[a];
    return ka == ka && (b < 0 || ka > p[b] + (double)bias[b]);
}

/* Group-limited selection: allowed[e] = 1 for the experts of the row's topk_group best groups
 * (group key: the sum of its two largest keys p + bias, a NaN key as -inf; ties: the lower group),
 * else 0. Without groups every expert is allowed. */
static void allowed_experts(unsigned char *allowed, const double *p, const float *bias, int64_t E,
                            const dw_router_desc *d) {
    if (!dw_router_grouped(d)) {
        for (int64_t e = 0; e < E; e++) allowed[e] = 1;
        return;
    }
    const int64_t G = d->n_group, S = E / G;
    double gk[G];
    unsigned char kept[G];
    for (int64_t g = 0; g < G; g++) {
        double t1 = -INFINITY, t2 = -INFINITY; /* the two largest keys */
        for (int64_t e = g * S; e < (g + 1) * S; e++) {
            double k = p[e] + (bias ? (double)bias[e] : 0.0);
            if (k != k) k = -INFINITY;
            if (k > t1) t2 = t1, t1 = k;
            else if (k > t2) t2 = k;
        }
        gk[g] = S == 1 ? t1 : t1 + t2;
        kept[g] = 0;
    }
    for (int64_t r = 0; r < d->topk_group; r++) {
        int64_t best = -1;
        for (int64_t g = 0; g < G; g++)
            if (!kept[g] && (best < 0 || gk[g] > gk[best])) best = g;
        if (best >= 0) kept[best] = 1;
    }
    for (int64_t e = 0; e < E; e++) allowed[e] = kept[e / S];
}

void dw_cpu_moe_router_fwd_desc(float *w, int32_t *idx, const float *z, const float *bias, int64_t N, int64_t E,
                                int64_t K, const dw_router_desc *d) {
    DW_ASSERT(N >= 0 && K >= 1 && K <= E && (d->score == 0 || d->score == 1));
    DW_ASSERT(d->n_group <= 1 || (E % d->n_group == 0 && d->n_group <= DW_ROUTER_MAX_GROUPS));
    const double scale = dw_router_scale(d);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        double p[E], sel[K];
        unsigned char taken[E];
        scores(p, z + n * E, E, d->score);
        allowed_experts(taken, p, bias, E, d);
        for (int64_t e = 0; e < E; e++) taken[e] = !taken[e]; /* an expert outside the kept groups: as taken */
        const float *zr = z + n * E;
        double sum = 0.0;
        /* the largest logit not yet taken (the scores rise with the logits, so this is the largest
         * score, without the rounding of the scores deciding), or the largest score + bias */
        for (int64_t k = 0; k < K; k++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++)
                if (!taken[e] && ranks_before(zr, p, bias, e, best)) best = e;
            idx[n * K + k] = (int32_t)best;
            if (best >= 0) taken[best] = 1;
            sum += (sel[k] = best >= 0 ? p[best] : NAN);
        }
        for (int64_t k = 0; k < K; k++) w[n * K + k] = (float)(scale * (d->renorm ? sel[k] / sum : sel[k]));
    }
}

void dw_cpu_moe_router_fwd_biased(float *w, int32_t *idx, const float *z, const float *bias, int64_t N, int64_t E,
                                  int64_t K, int score, int renorm) {
    const dw_router_desc d = {.score = score, .renorm = renorm};
    dw_cpu_moe_router_fwd_desc(w, idx, z, bias, N, E, K, &d);
}

void dw_cpu_moe_router_fwd(float *w, int32_t *idx, const float *z, int64_t N, int64_t E, int64_t K, int score,
                           int renorm) {
    dw_cpu_moe_router_fwd_biased(w, idx, z, NULL, N, E, K, score, renorm);
}

/* w_k = c p_k / s (c the scale, s = sum over the chosen): with g_k = c dw_k, dp_k = (g_k - sum_j
 * g_j p_j / s) / s; without renorm dp_k = g_k. Unchosen experts: dp = 0 (the selection, groups
 * included, has no gradient). Then softmax: dz = p (dp - sum p dp); sigmoid: dz = dp p (1 - p). */
void dw_cpu_moe_router_bwd_desc(float *dz, const float *dw, const float *z, const int32_t *idx, int64_t N, int64_t E,
                                int64_t K, const dw_router_desc *d) {
    DW_ASSERT(N >= 0 && K >= 1 && K <= E && (d->score == 0 || d->score == 1));
    const double scale = dw_router_scale(d);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        double p[E], dp[E];
        scores(p, z + n * E, E, d->score);
        for (int64_t e = 0; e < E; e++) dp[e] = 0.0;
        const int32_t *ix = idx + n * K;
        double s = 0.0, dot = 0.0;
        for (int64_t k = 0; k < K; k++) s += ix[k] >= 0 ? p[ix[k]] : NAN;
        for (int64_t k = 0; k < K; k++) dot += ix[k] >= 0 ? (dw ? scale * dw[n * K + k] : 0.0) * p[ix[k]] / s : 0.0;
        for (int64_t k = 0; k < K; k++) {
            const double g = dw ? scale * dw[n * K + k] : 0.0;
            if (ix[k] >= 0) dp[ix[k]] = d->renorm ? (g - dot) / s : g;
        }
        float *dr = dz + n * E;
        if (d->score == 1) {
            for (int64_t e = 0; e < E; e++) dr[e] = (float)(dp[e] * p[e] * (1.0 - p[e]));
        } else {
            double pdp = 0.0;
            for (int64_t e = 0; e < E; e++) pdp += p[e] * dp[e];
            for (int64_t e = 0; e < E; e++) dr[e] = (float)(p[e] * (dp[e] - pdp));
        }
    }
}

void dw_cpu_moe_router_bwd(float *dz, const float *dw, const float *z, const int32_t *idx, int64_t N, int64_t E,
                           int64_t K, int score, int renorm) {
    const dw_router_desc d = {.score = score, .renorm = renorm};
    dw_cpu_moe_router_bwd_desc(dz, dw, z, idx, N, E, K, &d);
}
