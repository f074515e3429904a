/* optim_cpu.c — the CPU reference of the optimizer over flat FP32 pools: the gradients' sum of
 * squares in double and one AdamW step in double (kernels/adamw_args.h; the CUDA kernels in
 * kernels/cuda/adamw.cu follow the same order). Elementwise steps are independent per element, so
 * OpenMP cannot change the results; the sum runs in one ascending order. */
#include <math.h>

#include "kernels/cpu/ops_cpu.h"

double dw_cpu_sumsq(const float *g, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)g[i] * (double)g[i];
    return s;
}

void dw_cpu_adamw(float *p, const float *g, float *m, float *v, int64_t n, int64_t n_decay, double norm,
                  const dw_adamw_args *a) {
    if (!isfinite(norm)) return;
    const double scale = (a->max_norm > 0.0 && norm > a->max_norm) ? a->max_norm / (norm + 1e-6) : 1.0;
    const double b1 = a->beta1, b2 = a->beta2;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const double gi = (double)g[i] * scale, wd = i < n_decay ? a->weight_decay : 0.0;
        double pi = (double)p[i];
        pi -= a->lr * wd * pi;
        const double mi = b1 * (double)m[i] + (1.0 - b1) * gi;
        const double vi = b2 * (double)v[i] + (1.0 - b2) * gi * gi;
        m[i] = (float)mi;
        v[i] = (float)vi;
        pi -= a->lr * (mi / a->c1) / (sqrt(vi / a->c2) + a->eps);
        p[i] = (float)pi;
    }
}
