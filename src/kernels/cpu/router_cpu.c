/* router_cpu.c — CPU reference for the MoE router (ops_cpu.h): scores, top-k selection and the
 * weights, forward and backward, per row in double and rounded once. Selection compares the
 * logits themselves (the scores are increasing in them), so every backend chooses the same experts
 * from the same stored logits; with a selection bias (DeepSeek-V3's auxiliary-loss-free
 * balancing) it compares score + bias instead, the weights still the unbiased scores. Rows are
 * independent, so threads cannot change results. */
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

void dw_cpu_moe_router_fwd_biased(float *w, int32_t *idx, const float *z, const float *bias, int64_t N, int64_t E,
                                  int64_t K, int score, int renorm) {
    DW_ASSERT(N >= 0 && K >= 1 && K <= E && (score == 0 || score == 1));
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        double p[E], sel[K];
        unsigned char taken[E];
        scores(p, z + n * E, E, score);
        for (int64_t e = 0; e < E; e++) taken[e] = 0;
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
        for (int64_t k = 0; k < K; k++) w[n * K + k] = (float)(renorm ? sel[k] / sum : sel[k]);
    }
}

void dw_cpu_moe_router_fwd(float *w, int32_t *idx, const float *z, int64_t N, int64_t E, int64_t K, int score,
                           int renorm) {
    dw_cpu_moe_router_fwd_biased(w, idx, z, NULL, N, E, K, score, renorm);
}

/* w_k = p_k / s (s = sum over the chosen): dp_k = (dw_k - sum_j dw_j w_j) / s; without renorm
 * dp_k = dw_k. Unchosen experts: dp = 0. Then softmax: dz = p (dp - sum p dp); sigmoid:
 * dz = dp p (1 - p). */
void dw_cpu_moe_router_bwd(float *dz, const float *dw, const float *z, const int32_t *idx, int64_t N, int64_t E,
                           int64_t K, int score, int renorm) {
    DW_ASSERT(N >= 0 && K >= 1 && K <= E && (score == 0 || score == 1));
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        double p[E], dp[E];
        scores(p, z + n * E, E, score);
        for (int64_t e = 0; e < E; e++) dp[e] = 0.0;
        const int32_t *ix = idx + n * K;
        double s = 0.0, dot = 0.0;
        for (int64_t k = 0; k < K; k++) s += ix[k] >= 0 ? p[ix[k]] : NAN;
        for (int64_t k = 0; k < K; k++) dot += ix[k] >= 0 ? (dw ? dw[n * K + k] : 0.0) * p[ix[k]] / s : 0.0;
        for (int64_t k = 0; k < K; k++) {
            const double g = dw ? dw[n * K + k] : 0.0;
            if (ix[k] >= 0) dp[ix[k]] = renorm ? (g - dot) / s : g;
        }
        float *d = dz + n * E;
        if (score == 1) {
            for (int64_t e = 0; e < E; e++) d[e] = (float)(dp[e] * p[e] * (1.0 - p[e]));
        } else {
            double pdp = 0.0;
            for (int64_t e = 0; e < E; e++) pdp += p[e] * dp[e];
            for (int64_t e = 0; e < E; e++) d[e] = (float)(p[e] * (dp[e] - pdp));
        }
    }
}
