/* attention_cpu.c — CPU reference for causal self-attention with grouped-query heads (GQA),
 * forward (saves log-sum-exp) and backward, with an optional sliding window (query t sees keys
 * t-W+1..t, as transformers' sliding_window masks) and optional score soft-capping (Gemma 2). Naive per-row softmax in double; the oracle
 * for the flash-attention kernels. Query head h reads KV head h / (H/Hkv). Scale 1/sqrt(D). */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/attention_row.h"
#include "kernels/cpu/ops_cpu.h"

/* q (B,T,H,D) row of query head h at t */
#define DW_Q(p, b, t, h) ((p) + (((b) * T + (t)) * H + (h)) * D)
/* k, v (B,T,Hkv,D) */
#define DW_KV(p, b, t, g) ((p) + (((b) * T + (t)) * Hkv + (g)) * D)

static double dw_dot(const float *a, const float *b, int64_t D) {
    double s = 0.0;
    for (int64_t d = 0; d < D; d++) s += (double)a[d] * b[d];
    return s;
}

/* d cap(z) / dz at the capped score s: 1 - (s / cap)^2 (1 without a cap) */
static double dcap(double s, double cap) { return cap > 0 ? 1.0 - (s / cap) * (s / cap) : 1.0; }

/* The first key query t sees: 0, or t-W+1 under a window of W keys (W 0: none). */
static int64_t first_key(int64_t t, int64_t W) { return W > 0 && t - W + 1 > 0 ? t - W + 1 : 0; }

/* out (B,T,H,D), lse (B,H,T); scores soft-capped to cap tanh(s / cap) when cap > 0 */
void dw_cpu_attention_softcap_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                                  int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t W, double cap) {
    DW_ASSERT(B >= 0 && T >= 0 && H > 0 && Hkv > 0 && D > 0 && H % Hkv == 0 && W >= 0 && cap >= 0);
    const int64_t group = H / Hkv;
    const double scale = 1.0 / sqrt((double)D);
#pragma omp parallel
    {
        double *s = malloc((size_t)(T > 0 ? T : 1) * sizeof *s);
        double *o = malloc((size_t)D * sizeof *o);
        DW_ASSERT_MSG(s && o, "out of memory in dw_cpu_attention_fwd");
#pragma omp for schedule(static)
        for (int64_t row = 0; row < B * H * T; row++) {
            const int64_t b = row / (H * T), h = (row / T) % H, t = row % T, g = h / group;
            const float *qr = DW_Q(q, b, t, h);
            const double l = dw_cpu_attention_row(DW_Q(out, b, t, h), qr, DW_KV(k, b, 0, g), DW_KV(v, b, 0, g),
                                                  Hkv * D, first_key(t, W), t, D, scale, cap, s, o);
            if (lse) lse[(b * H + h) * T + t] = (float)l;
        }
        free(o);
        free(s);
    }
}

/* With p_tj = exp(s_tj - lse_t), Di_t = dout_t . out_t, ds_tj = p_tj (dout_t . v_j - Di_t):
 *   dq_t = scale sum_{j<=t} ds_tj k_j
 *   dk_j = scale sum_{h in group} sum_{t>=j} ds_tj q_t,   dv_j = sum_{h in group} sum_{t>=j} p_tj dout_t
 * (under a window of W: j > t-W in every sum, so key j is seen by queries j..j+W-1; with the scores
 * soft-capped, s_tj = cap tanh(z_tj / cap) of z_tj = scale q_t.k_j, ds_tj also carries
 * ds/dz = 1 - (s_tj / cap)^2)
 * Two passes (query rows, then key rows) recompute p so that every output row is one fixed-order
 * double sum, independent of the thread count. All three gradients are written. */
void dw_cpu_attention_softcap_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                  const float *k, const float *v, const float *out, const float *lse,
                                  int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t W, double cap) {
    DW_ASSERT(B >= 0 && T >= 0 && H > 0 && Hkv > 0 && D > 0 && H % Hkv == 0 && W >= 0 && cap >= 0);
    const int64_t group = H / Hkv;
    const double scale = 1.0 / sqrt((double)D);
    double *di = malloc((size_t)(B * H * T > 0 ? B * H * T : 1) * sizeof *di); /* (B,H,T) */
    DW_ASSERT_MSG(di, "out of memory in dw_cpu_attention_bwd");
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < B * H * T; row++) {
        const int64_t b = row / (H * T), h = (row / T) % H, t = row % T;
        di[row] = dw_dot(DW_Q(dout, b, t, h), DW_Q(out, b, t, h), D);
    }
#pragma omp parallel
    {
        double *acc = malloc((size_t)D * 2 * sizeof *acc);
        DW_ASSERT_MSG(acc, "out of memory in dw_cpu_attention_bwd");
        /* dq: one query row (b,h,t) per iteration */
#pragma omp for schedule(static)
        for (int64_t row = 0; row < B * H * T; row++) {
            const int64_t b = row / (H * T), h = (row / T) % H, t = row % T, g = h / group;
            const float *qr = DW_Q(q, b, t, h), *gr = DW_Q(dout, b, t, h);
            for (int64_t d = 0; d < D; d++) acc[d] = 0.0;
            for (int64_t j = first_key(t, W); j <= t; j++) {
                const float *kr = DW_KV(k, b, j, g);
                const double sc = dw_cpu_attention_cap(dw_dot(qr, kr, D) * scale, cap);
                const double p = exp(sc - (double)lse[row]);
                const double ds = p * (dw_dot(gr, DW_KV(v, b, j, g), D) - di[row]) * dcap(sc, cap);
                for (int64_t d = 0; d < D; d++) acc[d] += ds * kr[d];
            }
            float *dqr = DW_Q(dq, b, t, h);
            for (int64_t d = 0; d < D; d++) dqr[d] = (float)(acc[d] * scale);
        }
        /* dk, dv: one key row (b,g,j) per iteration, summed over the group's heads and t >= j */
#pragma omp for schedule(static)
        for (int64_t krow = 0; krow < B * Hkv * T; krow++) {
            const int64_t b = krow / (Hkv * T), g = (krow / T) % Hkv, j = krow % T;
            const float *kr = DW_KV(k, b, j, g), *vr = DW_KV(v, b, j, g);
            double *ak = acc, *av = acc + D;
            for (int64_t d = 0; d < 2 * D; d++) acc[d] = 0.0;
            for (int64_t h = g * group; h < (g + 1) * group; h++) {
                for (int64_t t = j; t < T && (W == 0 || t < j + W); t++) { /* the queries that see j */
                    const int64_t row = (b * H + h) * T + t;
                    const float *qr = DW_Q(q, b, t, h), *gr = DW_Q(dout, b, t, h);
                    const double sc = dw_cpu_attention_cap(dw_dot(qr, kr, D) * scale, cap);
                    const double p = exp(sc - (double)lse[row]);
                    const double ds = p * (dw_dot(gr, vr, D) - di[row]) * dcap(sc, cap);
                    for (int64_t d = 0; d < D; d++) {
                        ak[d] += ds * qr[d];
                        av[d] += p * gr[d];
                    }
                }
            }
            float *dkr = DW_KV(dk, b, j, g), *dvr = DW_KV(dv, b, j, g);
            for (int64_t d = 0; d < D; d++) {
                dkr[d] = (float)(ak[d] * scale);
                dvr[d] = (float)av[d];
            }
        }
        free(acc);
    }
    free(di);
}

void dw_cpu_attention_window_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                                 int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t W) {
    dw_cpu_attention_softcap_fwd(out, lse, q, k, v, B, T, H, Hkv, D, W, 0.0);
}

void dw_cpu_attention_window_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                 const float *k, const float *v, const float *out, const float *lse,
                                 int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t W) {
    dw_cpu_attention_softcap_bwd(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, Hkv, D, W, 0.0);
}

void dw_cpu_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                          int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
    dw_cpu_attention_window_fwd(out, lse, q, k, v, B, T, H, Hkv, D, 0);
}

void dw_cpu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                          const float *k, const float *v, const float *out, const float *lse,
                          int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
    dw_cpu_attention_window_bwd(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, Hkv, D, 0);
}
