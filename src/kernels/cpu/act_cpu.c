/* act_cpu.c — CPU reference for the elementwise ops: gelu (tanh approximation, GPT-2 / HF
 * "gelu_new"), its gated form geglu, the exact (erf) GELU, relu, silu, swiglu, add and the
 * per-token sigmoid gate, forward and backward. Each element
 * is computed in double and rounded once; every output element (and the gate's per-row sum) is
 * independent, so threads cannot change results. */
#include <math.h>

#include "core/error.h"
#include "kernels/cpu/ops_cpu.h"

#define DW_GELU_K 0.7978845608028654 /* sqrt(2/pi) */
#define DW_GELU_A 0.044715

/* gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
void dw_cpu_gelu_fwd(float *out, const float *x, int64_t n) {
    DW_ASSERT(n >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const double v = x[i];
        out[i] = (float)(0.5 * v * (1.0 + tanh(DW_GELU_K * (v + DW_GELU_A * v * v * v))));
    }
}

/* d gelu/dx = 0.5 (1 + th) + 0.5 x (1 - th^2) sqrt(2/pi) (1 + 3*0.044715 x^2), th = tanh(u) */
void dw_cpu_gelu_bwd(float *dx, const float *dout, const float *x, int64_t n) {
    DW_ASSERT(n >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const double v = x[i];
        const double th = tanh(DW_GELU_K * (v + DW_GELU_A * v * v * v));
        const double d = 0.5 * (1.0 + th) +
                         0.5 * v * (1.0 - th * th) * DW_GELU_K * (1.0 + 3.0 * DW_GELU_A * v * v);
        dx[i] = (float)((double)dout[i] * d);
    }
}

/* out = gelu(gate) * up (Gemma's GeGLU) */
void dw_cpu_geglu_fwd(float *out, const float *gate, const float *up, int64_t n) {
    DW_ASSERT(n >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const double v = gate[i];
        out[i] = (float)(0.5 * v * (1.0 + tanh(DW_GELU_K * (v + DW_GELU_A * v * v * v))) * (double)up[i]);
    }
}

/* dgate = dout * up * gelu'(gate), dup = dout * gelu(gate)   (both written) */
void dw_cpu_geglu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n) {
    DW_ASSERT(n >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const double v = gate[i], d = dout[i];
        const double th = tanh(DW_GELU_K * (v + DW_GELU_A * v * v * v));
        const double dg = 0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * DW_GELU_K * (1.0 + 3.0 * DW_GELU_A * v * v);
        dgate[i] = (float)(d * (double)up[i] * dg);
        dup[i] = (float)(d * 0.5 * v * (1.0 + th));
    }
}

static double dw_sigmoid(double v) { return 1.0 / (1.0 + exp(-v)); }

void dw_cpu_silu_fwd(float *out, const float *x, int64_t n) {
    DW_ASSERT(n >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = (float)((double)x[i] * dw_sigmoid(x[i]));
}

/* d silu/dx = s (1 + x (1 - s)), s = sigmoid(x) */
void dw_cpu_silu_bwd(float *dx, const float *dout, const float *x, int64_t n) {
    DW_ASSERT(n >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const double v = x[i], s = dw_sigmoid(v);
        dx[i] = (float)((double)dout[i] * s * (1.0 + v * (1.0 - s)));
    }
}

/* gelu_erf(x) = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (torch's nn.GELU(), approximate='none') */
void dw_cpu_gelu_erf_fwd(float *out, const float *x, int64_t n) {
    DW_ASSERT(n >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const double v = x[i];
        out[i] = (float)(0.5 * v * (1.0 + erf(v * M_SQRT1_2)));
    }
}

/* d gelu_erf/dx = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi) */
void dw_cpu_gelu_erf_bwd(float *dx, const float *dout, const float *x, int64_t n) {
    DW_ASSERT(n >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const double v = x[i];
        const double d = 0.5 * (1.0 + erf(v * M_SQRT1_2)) + v * exp(-0.5 * v * v) * (0.5 * M_2_SQRTPI * M_SQRT1_2);
        dx[i] = (float)((double)dout[i] * d);
    }
}

/* relu(x) = max(x, 0); NaN stays NaN (as torch) */
void dw_cpu_relu_fwd(float *out, const float *x, int64_t n) {
    DW_ASSERT(n >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = x[i] < 0.0f ? 0.0f : x[i];
}

/* d relu/dx = 1 where x > 0, else 0 (torch's choice at 0) */
void dw_cpu_relu_bwd(float *dx, const float *dout, const float *x, int64_t n) {
    DW_ASSERT(n >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) dx[i] = x[i] > 0.0f ? dout[i] : 0.0f;
}

/* out = silu(gate) * up */
void dw_cpu_swiglu_fwd(float *out, const float *gate, const float *up, int64_t n) {
    DW_ASSERT(n >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const double g = gate[i];
        out[i] = (float)(g * dw_sigmoid(g) * (double)up[i]);
    }
}

/* dgate = dout * up * silu'(gate), dup = dout * silu(gate)   (both written) */
void dw_cpu_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate,
                       const float *up, int64_t n) {
    DW_ASSERT(n >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const double g = gate[i], s = dw_sigmoid(g), d = dout[i], u = up[i];
        const double dg = d * u * s * (1.0 + g * (1.0 - s)), du = d * g * s;
        dgate[i] = (float)dg;
        dup[i] = (float)du;
    }
}

void dw_cpu_sigmoid_gate_fwd(float *out, const float *x, const float *g, int64_t N, int64_t C) {
    DW_ASSERT(N >= 0 && C >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const double s = dw_sigmoid(g[n]);
        for (int64_t c = 0; c < C; c++) out[n * C + c] = (float)(s * (double)x[n * C + c]);
    }
}

/* dx = s dout, dg = s (1 - s) sum_c dout x,  s = sigmoid(g) */
void dw_cpu_sigmoid_gate_bwd(float *dx, float *dg, const float *dout, const float *x, const float *g, int64_t N,
                             int64_t C) {
    DW_ASSERT(N >= 0 && C >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const double s = dw_sigmoid(g[n]);
        double dot = 0.0;
        for (int64_t c = 0; c < C; c++) {
            const double d = dout[n * C + c];
            dot += d * (double)x[n * C + c];
            if (dx) dx[n * C + c] = (float)(s * d);
        }
        if (dg) dg[n] = (float)(s * (1.0 - s) * dot);
    }
}

void dw_cpu_add_fwd(float *out, const float *a, const float *b, int64_t n) {
    DW_ASSERT(n >= 0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
