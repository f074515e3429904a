/* linear_cpu.c — CPU reference for linear layers in torch.nn.Linear layout (W is out x in),
 * forward and backward. Naive loops with double accumulation in a fixed order: the oracle for
 * the GEMM kernels, not a fast path. */
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/ops_cpu.h"

/* out (N,M) = x (N,K) @ W^T + b    W (M,K), b (M) or NULL */
void dw_cpu_linear_fwd(float *out, const float *x, const float *w, const float *b, int64_t N,
                       int64_t K, int64_t M) {
    DW_ASSERT(N >= 0 && K >= 0 && M >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * K;
        for (int64_t m = 0; m < M; m++) {
            const float *wr = w + m * K;
            double acc = b ? (double)b[m] : 0.0;
            for (int64_t k = 0; k < K; k++) acc += (double)xr[k] * wr[k];
            out[n * M + m] = (float)acc;
        }
    }
}

/* dx (N,K) = dout @ W (written; may be NULL); dW (M,K) += dout^T @ x; db (M) += sum_n dout
 * (db may be NULL). Each output element is one double sum in ascending order of its index. */
void dw_cpu_linear_bwd(float *dx, float *dw, float *db, const float *dout, const float *x,
                       const float *w, int64_t N, int64_t K, int64_t M) {
    DW_ASSERT(N >= 0 && K >= 0 && M >= 0);
#pragma omp parallel
    {
        double *acc = malloc((size_t)(K > 0 ? K : 1) * sizeof *acc);
        DW_ASSERT_MSG(acc, "out of memory in dw_cpu_linear_bwd");
        if (dx) {
#pragma omp for schedule(static)
            for (int64_t n = 0; n < N; n++) {
                for (int64_t k = 0; k < K; k++) acc[k] = 0.0;
                for (int64_t m = 0; m < M; m++) {
                    const double g = dout[n * M + m];
                    const float *wr = w + m * K;
                    for (int64_t k = 0; k < K; k++) acc[k] += g * wr[k];
                }
                for (int64_t k = 0; k < K; k++) dx[n * K + k] = (float)acc[k];
            }
        }
        if (dw || db) {
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++) {
                double ab = 0.0;
                for (int64_t k = 0; k < K; k++) acc[k] = 0.0;
                for (int64_t n = 0; n < N; n++) {
                    const double g = dout[n * M + m];
                    const float *xr = x + n * K;
                    ab += g;
                    if (dw)
                        for (int64_t k = 0; k < K; k++) acc[k] += g * xr[k];
                }
                if (dw)
                    for (int64_t k = 0; k < K; k++) dw[m * K + k] = (float)((double)dw[m * K + k] + acc[k]);
                if (db) db[m] = (float)((double)db[m] + ab);
            }
        }
        free(acc);
    }
}
