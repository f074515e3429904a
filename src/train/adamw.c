/* adamw.c — CPU reference AdamW step, gradient norm and clipping factor (see optim.h).
 * Elementwise and independent per element, so OpenMP cannot change the results. */
#include <math.h>

#include "train/optim.h"

void dw_adamw_step_cpu(float *p, const float *g, float *m, float *v, int64_t n,
                       const dw_adamw_hparams *h, int64_t t, bool decay, double grad_scale) {
    const double b1 = h->beta1, b2 = h->beta2, lr = h->lr, eps = h->eps;
    const double c1 = 1.0 - pow(b1, (double)t), c2 = 1.0 - pow(b2, (double)t);
    const double wd = decay ? h->weight_decay : 0.0;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        double gi = (double)g[i] * grad_scale;
        double pi = (double)p[i];
        pi -= lr * wd * pi;
        double mi = b1 * (double)m[i] + (1.0 - b1) * gi;
        double vi = b2 * (double)v[i] + (1.0 - b2) * gi * gi;
        m[i] = (float)mi;
        v[i] = (float)vi;
        pi -= lr * (mi / c1) / (sqrt(vi / c2) + eps);
        p[i] = (float)pi;
    }
}

double dw_sumsq_cpu(const float *g, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)g[i] * (double)g[i];
    return s;
}

double dw_clip_factor(double norm, double max_norm) {
    if (max_norm <= 0.0 || !(norm > max_norm)) return 1.0;
    return max_norm / (norm + 1e-6);
}
