/* attention_row.h — private to kernels/cpu: one query row of the reference attention, shared by the
 * whole-sequence forward (attention_cpu.c) and cached decoding (attention_decode_cpu.c) so that
 * both compute it with the same arithmetic in the same order (decoding is held bit for bit to the
 * forward). Double dot products, max, exp, sum, weighted values, one division. */
#ifndef DW_KERNELS_CPU_ATTENTION_ROW_H
#define DW_KERNELS_CPU_ATTENTION_ROW_H

#include <math.h>
#include <stdint.h>

/* A scaled score z soft-capped to cap tanh(z / cap) (Gemma 2's attn_logit_softcapping); cap 0: z. */
static inline double dw_cpu_attention_cap(double z, double cap) { return cap > 0 ? cap * tanh(z / cap) : z; }

/* orow (D) = softmax_j(cap(scale q.k_j)) v_j over keys j0..t, key and value j at k0 + j*stride and
 * v0 + j*stride (cap 0: no soft-capping); s (t+1) and o (D) are scratch. Returns the log-sum-exp of
 * the (capped) scores. */
static inline double dw_cpu_attention_row(float *orow, const float *qr, const float *k0, const float *v0,
                                          int64_t stride, int64_t j0, int64_t t, int64_t D, double scale,
                                          double cap, double *s, double *o) {
    double mx = -INFINITY;
    for (int64_t j = j0; j <= t; j++) {
        const float *kr = k0 + j * stride;
        double dot = 0.0;
        for (int64_t d = 0; d < D; d++) dot += (double)qr[d] * kr[d];
        s[j] = dw_cpu_attention_cap(dot * scale, cap);
        if (s[j] > mx) mx = s[j];
    }
    double sum = 0.0;
    for (int64_t j = j0; j <= t; j++) {
        s[j] = exp(s[j] - mx);
        sum += s[j];
    }
    for (int64_t d = 0; d < D; d++) o[d] = 0.0;
    for (int64_t j = j0; j <= t; j++) {
        const float *vr = v0 + j * stride;
        for (int64_t d = 0; d < D; d++) o[d] += s[j] * vr[d];
    }
    for (int64_t d = 0; d < D; d++) orow[d] = (float)(o[d] / sum);
    return mx + log(sum);
}

#endif /* DW_KERNELS_CPU_ATTENTION_ROW_H */
