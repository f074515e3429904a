/* moe_aux_cpu.c — CPU reference for the MoE load-balancing loss as transformers computes it
 * (load_balancing_loss_func over the concatenated router logits of all MoE layers) and the router
 * z-loss (ST-MoE: each layer's mean squared log-sum-exp of the logits, summed over layers): the
 * per-layer statistics (each row's softmax summed per expert, then the rows' squared log-sum-exp,
 * E + 1 sums; the assignments counted per expert; all added to the layers before), the losses
 * coef E sum_e counts_e sums_e / (L N)^2 + zcoef sums_E / N and the gradients.
 * Sums in double, one rounding per output; rows in ascending order (deterministic). */
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/ops_cpu.h"

void dw_cpu_moe_aux_stats_fwd(float *sums, int32_t *counts, const float *z, const int32_t *idx, const float *prev_sums,
                              const int32_t *prev_counts, int64_t N, int64_t E, int64_t K) {
    DW_ASSERT(N >= 0 && E >= 1 && K >= 1);
    double *acc = calloc((size_t)E + 1, sizeof *acc), *p = malloc((size_t)E * sizeof *p);
    DW_ASSERT(acc && p);
    for (int64_t e = 0; e < E; e++) counts[e] = prev_counts ? prev_counts[e] : 0;
    for (int64_t n = 0; n < N; n++) {
        const double lse = dw_cpu_softmax_row(p, z + n * E, E);
        for (int64_t e = 0; e < E; e++) acc[e] += p[e];
        acc[E] += lse * lse;
        for (int64_t k = 0; k < K; k++)
            if (idx[n * K + k] >= 0 && idx[n * K + k] < E) counts[idx[n * K + k]]++;
    }
    for (int64_t e = 0; e <= E; e++) sums[e] = (float)((prev_sums ? (double)prev_sums[e] : 0.0) + acc[e]);
    free(acc), free(p);
}

/* The sums are of softmax rows: d sums_e / d z[n,j] = p_e (delta_ej - p_j), and of squared
 * log-sum-exps: d lse^2 / d z[n,j] = 2 lse p_j; so for the sums' gradient g (E + 1)
 * dz[n,j] = p_j (g_j - sum_e g_e p_e + 2 g_E lse_n). */
void dw_cpu_moe_aux_stats_bwd(float *dz, const float *g, const float *z, int64_t N, int64_t E) {
    DW_ASSERT(N >= 0 && E >= 1);
#pragma omp parallel
    {
        double *p = malloc((size_t)E * sizeof *p);
        DW_ASSERT(p);
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            const double lse = dw_cpu_softmax_row(p, z + n * E, E);
            double dot = 0.0;
            for (int64_t e = 0; e < E; e++) dot += (double)g[e] * p[e];
            const double zterm = 2.0 * (double)g[E] * lse;
            for (int64_t j = 0; j < E; j++) dz[n * E + j] = (float)(p[j] * ((double)g[j] - dot + zterm));
        }
        free(p);
    }
}

/* L N: the rows the statistics cover, counts summed over experts / K (every assignment valid) */
static double layer_rows(const int32_t *counts, int64_t E, int64_t K) {
    double total = 0.0;
    for (int64_t e = 0; e < E; e++) total += counts[e];
    return total / (double)K;
}

double dw_cpu_moe_aux_loss(const float *sums, const int32_t *counts, int64_t E, int64_t K, int64_t N, double coef,
                           double zcoef, double *z_loss) {
    const double LN = layer_rows(counts, E, K);
    *z_loss = N > 0 ? zcoef * (double)sums[E] / (double)N : 0.0;
    if (LN <= 0) return 0.0;
    double s = 0.0;
    for (int64_t e = 0; e < E; e++) s += (double)counts[e] * sums[e];
    return coef * (double)E * s / (LN * LN);
}

void dw_cpu_moe_aux_loss_bwd(float *dsums, const int32_t *counts, int64_t E, int64_t K, int64_t N, double coef,
                             double zcoef, double dloss) {
    const double LN = layer_rows(counts, E, K);
    for (int64_t e = 0; e < E; e++) dsums[e] = LN > 0 ? (float)(dloss * coef * (double)E * counts[e] / (LN * LN)) : 0.0f;
    dsums[E] = N > 0 ? (float)(dloss * zcoef / (double)N) : 0.0f;
}
