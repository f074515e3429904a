/* xent_cpu.c — CPU reference for softmax cross-entropy over V with mean reduction over the rows
 * whose target >= 0 (target < 0 is ignored, as torch's ignore_index), forward and backward.
 * With no valid row the loss is 0 and the gradient is 0 (torch would give NaN). */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/ops_cpu.h"

/* log(sum_v exp(x_v)) of one row, in double */
double dw_row_lse(const float *x, int64_t V) {
    double mx = -INFINITY, s = 0.0;
    for (int64_t i = 0; i < V; i++)
        if (x[i] > mx) mx = x[i];
    for (int64_t i = 0; i < V; i++) s += exp((double)x[i] - mx);
    return mx + log(s);
}

int64_t dw_count_valid(const int32_t *targets, int64_t N, int64_t V) {
    int64_t nv = 0;
    for (int64_t n = 0; n < N; n++) {
        DW_ASSERT_MSG(targets[n] < V, "cross-entropy target >= V");
        nv += targets[n] >= 0;
    }
    return nv;
}

/* logits (N,V), targets (N) -> mean over valid rows of lse(row) - row[target] */
double dw_cpu_cross_entropy_fwd(const float *logits, const int32_t *targets, int64_t N, int64_t V) {
    DW_ASSERT(N >= 0 && V > 0);
    const int64_t nv = dw_count_valid(targets, N, V);
    if (nv == 0) return 0.0;
    double *row = malloc((size_t)N * sizeof *row);
    DW_ASSERT_MSG(row, "out of memory in dw_cpu_cross_entropy_fwd");
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *x = logits + n * V;
        row[n] = targets[n] >= 0 ? dw_row_lse(x, V) - (double)x[targets[n]] : 0.0;
    }
    double sum = 0.0; /* sequential: the same order for any thread count */
    for (int64_t n = 0; n < N; n++) sum += row[n];
    free(row);
    return sum / (double)nv;
}

/* dlogits (N,V) = dloss * (softmax(row) - onehot(target)) / n_valid; ignored rows get 0 (written) */
void dw_cpu_cross_entropy_bwd(float *dlogits, const float *logits, const int32_t *targets,
                              int64_t N, int64_t V, double dloss) {
    DW_ASSERT(N >= 0 && V > 0);
    const int64_t nv = dw_count_valid(targets, N, V);
    const double scale = nv > 0 ? dloss / (double)nv : 0.0;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *x = logits + n * V;
        float *g = dlogits + n * V;
        if (targets[n] < 0 || nv == 0) {
            for (int64_t i = 0; i < V; i++) g[i] = 0.0f;
            continue;
        }
        const double l = dw_row_lse(x, V);
        for (int64_t i = 0; i < V; i++) {
            const double p = exp((double)x[i] - l) - (i == targets[n] ? 1.0 : 0.0);
            g[i] = (float)(p * scale);
        }
    }
}
