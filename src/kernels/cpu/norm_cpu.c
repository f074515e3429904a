/* norm_cpu.c — CPU reference for layernorm and rmsnorm over the last dimension C, forward and
 * backward (see ops_cpu.h). Statistics in double (two-pass mean/variance); parameter gradients
 * are summed per column over rows in ascending n, so results do not depend on the thread count. */
#include <math.h>
#include <stddef.h>

#include "core/error.h"
#include "kernels/cpu/ops_cpu.h"

/* out (N,C) = (x - mean) * rstd * w + b; mean, rstd (N) saved (either may be NULL); b may be NULL.
 * var is the biased variance (as torch.nn.LayerNorm). */
void dw_cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w,
                          const float *b, int64_t N, int64_t C, double eps) {
    DW_ASSERT(N >= 0 && C > 0);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C;
        double m = 0.0, v = 0.0;
        for (int64_t c = 0; c < C; c++) m += xr[c];
        m /= (double)C;
        for (int64_t c = 0; c < C; c++) v += ((double)xr[c] - m) * ((double)xr[c] - m);
        v /= (double)C;
        const double rs = 1.0 / sqrt(v + eps);
        for (int64_t c = 0; c < C; c++) {
            double y = ((double)xr[c] - m) * rs * (double)w[c];
            if (b) y += b[c];
            out[n * C + c] = (float)y;
        }
        if (mean) mean[n] = (float)m;
        if (rstd) rstd[n] = (float)rs;
    }
}

/* With xhat = (x-mean)*rstd, g = dout*w:
 *   dx = rstd * (g - mean_c(g) - xhat * mean_c(g*xhat))   (written)
 *   dw += sum_n dout*xhat,  db += sum_n dout               (accumulated; dw, db may be NULL) */
void dw_cpu_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x,
                          const float *w, const float *mean, const float *rstd, int64_t N,
                          int64_t C) {
    DW_ASSERT(N >= 0 && C > 0);
    if (dx) {
#pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            const float *xr = x + n * C, *gr = dout + n * C;
            const double m = mean[n], rs = rstd[n];
            double sg = 0.0, sgx = 0.0;
            for (int64_t c = 0; c < C; c++) {
                const double g = (double)gr[c] * w[c], xh = ((double)xr[c] - m) * rs;
                sg += g;
                sgx += g * xh;
            }
            sg /= (double)C;
            sgx /= (double)C;
            for (int64_t c = 0; c < C; c++) {
                const double g = (double)gr[c] * w[c], xh = ((double)xr[c] - m) * rs;
                dx[n * C + c] = (float)(rs * (g - sg - xh * sgx));
            }
        }
    }
    if (!dw && !db) return;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < C; c++) {
        double aw = 0.0, ab = 0.0;
        for (int64_t n = 0; n < N; n++) {
            const double g = dout[n * C + c];
            aw += g * (((double)x[n * C + c] - mean[n]) * rstd[n]);
            ab += g;
        }
        if (dw) dw[c] = (float)((double)dw[c] + aw);
        if (db) db[c] = (float)((double)db[c] + ab);
    }
}

/* out (N,C) = x * rstd * w, rstd = 1/sqrt(mean_c(x^2) + eps) saved (N) (may be NULL) */
void dw_cpu_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int64_t N,
                        int64_t C, double eps) {
    DW_ASSERT(N >= 0 && C > 0);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C;
        double ss = 0.0;
        for (int64_t c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
        const double rs = 1.0 / sqrt(ss / (double)C + eps);
        for (int64_t c = 0; c < C; c++) out[n * C + c] = (float)((double)xr[c] * rs * w[c]);
        if (rstd) rstd[n] = (float)rs;
    }
}

/* With xhat = x*rstd, g = dout*w:  dx = rstd * (g - xhat * mean_c(g*xhat)) (written);
 * dw += sum_n dout*xhat (accumulated; dw may be NULL) */
void dw_cpu_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w,
                        const float *rstd, int64_t N, int64_t C) {
    DW_ASSERT(N >= 0 && C > 0);
    if (dx) {
#pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            const float *xr = x + n * C, *gr = dout + n * C;
            const double rs = rstd[n];
            double sgx = 0.0;
            for (int64_t c = 0; c < C; c++) sgx += (double)gr[c] * w[c] * ((double)xr[c] * rs);
            sgx /= (double)C;
            for (int64_t c = 0; c < C; c++) {
                const double g = (double)gr[c] * w[c], xh = (double)xr[c] * rs;
                dx[n * C + c] = (float)(rs * (g - xh * sgx));
            }
        }
    }
    if (!dw) return;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < C; c++) {
        double aw = 0.0;
        for (int64_t n = 0; n < N; n++) aw += (double)dout[n * C + c] * ((double)x[n * C + c] * rstd[n]);
        dw[c] = (float)((double)dw[c] + aw);
    }
}
