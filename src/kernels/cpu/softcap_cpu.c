/* softcap_cpu.c — CPU reference for the softcap op (Gemma 2): y = s x, or soft-capped
 * y = c tanh(s x / c) when c > 0, forward and backward, each element in double and rounded once.
 * Not attention's score capping (attention_cpu.c applies the same formula to the scores). */
#include <math.h>

#include "core/error.h"
#include "kernels/cpu/ops_cpu.h"

/* out (n) = s x, or c tanh(s x / c) when c > 0 */
void dw_cpu_softcap_fwd(float *out, const float *x, int64_t n, double s, double c) {
    DW_ASSERT(n >= 0 && c >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const double v = s * (double)x[i];
        out[i] = (float)(c > 0 ? c * tanh(v / c) : v);
    }
}

/* dx (n) = dout s (1 - tanh^2(s x / c)), or dout s when c is 0 (written) */
void dw_cpu_softcap_bwd(float *dx, const float *dout, const float *x, int64_t n, double s, double c) {
    DW_ASSERT(n >= 0 && c >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const double th = c > 0 ? tanh(s * (double)x[i] / c) : 0.0;
        dx[i] = (float)((double)dout[i] * s * (1.0 - th * th));
    }
}
