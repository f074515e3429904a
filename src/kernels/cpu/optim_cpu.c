/* optim_cpu.c — the CPU reference of the optimizer over flat FP32 pools: the gradients' sum of
 * squares in double and one AdamW step in double (kernels/adamw_args.h; the CUDA kernels in
 * kernels/cuda/adamw.cu follow the same order), alone or writing the BF16 working copies of the
 * updated masters in the same pass (the fused cast, in the passes of kernels/adamw_passes.h).
 * Elementwise steps are independent per element, so OpenMP cannot change the results; the sum
 * runs in one ascending order. */
#include <math.h>

#include "formats/formats.h"
#include "kernels/adamw_passes.h"
#include "kernels/cpu/ops_cpu.h"

double dw_cpu_sumsq(const float *g, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)g[i] * (double)g[i];
    return s;
}

/* Element i of one AdamW step (the contract of kernels/adamw_args.h) with the clipping factor. */
static inline void adamw_one(float *p, const float *g, float *m, float *v, int64_t i, double wd, double scale,
                             const dw_adamw_args *a) {
    const double gi = (double)g[i] * scale, b1 = a->beta1, b2 = a->beta2;
    double pi = (double)p[i];
    pi -= a->lr * wd * pi;
    const double mi = b1 * (double)m[i] + (1.0 - b1) * gi;
    const double vi = b2 * (double)v[i] + (1.0 - b2) * gi * gi;
    m[i] = (float)mi;
    v[i] = (float)vi;
    pi -= a->lr * (mi / a->c1) / (sqrt(vi / a->c2) + a->eps);
    p[i] = (float)pi;
}

static double clip_scale(double norm, const dw_adamw_args *a) {
    return (a->max_norm > 0.0 && norm > a->max_norm) ? a->max_norm / (norm + 1e-6) : 1.0;
}

void dw_cpu_adamw(float *p, const float *g, float *m, float *v, int64_t n, int64_t n_decay, double norm,
                  const dw_adamw_args *a) {
    if (!isfinite(norm)) return;
    const double scale = clip_scale(norm, a);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) adamw_one(p, g, m, v, i, i < n_decay ? a->weight_decay : 0.0, scale, a);
}

void dw_cpu_adamw_cast(float *p, const float *g, float *m, float *v, int64_t n, int64_t n_decay, double norm,
                       const dw_adamw_args *a, uint16_t *wb, const int64_t (*runs)[2], int n_runs, int64_t first,
                       int64_t lag) {
    const bool step = isfinite(norm); /* a non-finite norm: the masters stay, their copies are made */
    const double scale = step ? clip_scale(norm, a) : 1.0;
    dw_adamw_plan pl;
    dw_adamw_pass ps;
    dw_adamw_plan_init(&pl, n, runs, n_runs, first, lag);
    while (dw_adamw_pass_next(&pl, &ps)) { /* one pass after another (kernels/adamw_passes.h) */
        const bool upd = step && ps.update;
#pragma omp parallel for schedule(static)
        for (int64_t i = ps.lo; i < ps.hi; i++) {
            if (upd) adamw_one(p, g, m, v, i, i < n_decay ? a->weight_decay : 0.0, scale, a);
            if (i >= ps.c0 && i < ps.c1) wb[i] = dw_encode_bf16(p[i]);
        }
    }
}
