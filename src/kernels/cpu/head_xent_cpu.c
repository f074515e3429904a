/* head_xent_cpu.c — CPU reference pieces of the fused LM head + cross-entropy (ops.def head_xent):
 * one chunk of rows' loss and logit gradient, and the head's weight gradient accumulated across
 * chunks in double. Each is the arithmetic of the unfused path in the same order (xent_cpu.c's
 * rows, linear_cpu.c's wgrad), so the fused program's loss and gradients are those of the unfused
 * one bit for bit. The chunk loop itself is the CPU backend's (runtime/cpu/ops_cpu_head_xent.c). */
#include <math.h>

#include "core/error.h"
#include "kernels/cpu/ops_cpu.h"

void dw_cpu_head_xent_rows(float *g, double *loss_sum, const float *logits, const int32_t *targets, int64_t rows,
                           int64_t V, double scale) {
    DW_ASSERT(rows >= 0 && V > 0);
    for (int64_t n = 0; n < rows; n++) { /* sequential: the loss sums in row order */
        const float *x = logits + n * V;
        float *d = g ? g + n * V : NULL;
        const int32_t t = targets[n];
        DW_ASSERT_MSG(t < V, "cross-entropy target >= V");
        if (t < 0) { /* ignored row */
            for (int64_t i = 0; d && i < V; i++) d[i] = 0.0f;
            continue;
        }
        const double l = dw_row_lse(x, V);
        *loss_sum += l - (double)x[t];
        if (!d) continue;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < V; i++) { /* x[i] read before d[i] (which may be x[i]) is written */
            const double p = exp((double)x[i] - l) - (i == t ? 1.0 : 0.0);
            d[i] = (float)(p * scale);
        }
    }
}

void dw_cpu_head_xent_wgrad(double *acc, const float *dy, const float *x, int64_t rows, int64_t K, int64_t M) {
    DW_ASSERT(rows >= 0 && K >= 0 && M >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; m++) {
        double *a = acc + m * K;
        for (int64_t n = 0; n < rows; n++) {
            const double gm = dy[n * M + m];
            const float *xr = x + n * K;
            for (int64_t k = 0; k < K; k++) a[k] += gm * xr[k];
        }
    }
}

void dw_cpu_head_xent_wgrad_end(float *dw, const double *acc, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) dw[i] = (float)((double)dw[i] + acc[i]);
}
