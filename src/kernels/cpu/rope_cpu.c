/* rope_cpu.c — CPU reference for rotary position embeddings in the rotate-half convention of
 * Hugging Face llama (cos/sin over the first and second halves of the rotary width R), forward and
 * backward. Only the first R = dw_rope_dim dims of each head rotate (partial_rotary_factor); the
 * other D - R are copied. Angles are computed in double: t * inv_freq[i], i in [0, R/2), positions
 * 0..T-1, the inverse frequencies of the rope type (kernels/rope_freq.h: default theta^(-2i/R),
 * linear, llama3, yarn, longrope with its table chosen by the run's length), cos and sin multiplied
 * by the type's attention factor (yarn, longrope; else 1). */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/decode_cpu.h"
#include "kernels/cpu/ops_cpu.h"

/* Rotates every head vector of x (B,T,H,D) by the position angle; sign = +1 forward, -1 for the
 * transpose (backward: the map is a rotation times the attention factor, so dx = m R^T dout; the
 * passed-through dims are the identity both ways). Row t of each batch is position pos0 + t; seq:
 * the run's length, which picks longrope's table. */
static void dw_rope_apply(float *out, const float *x, int64_t B, int64_t T, int64_t pos0, int64_t seq, int64_t H,
                          int64_t D, double theta, const dw_rope_scaling *rs, double sign) {
    DW_ASSERT(B >= 0 && T >= 0 && H >= 0 && D > 0 && D % 2 == 0 && theta > 0.0);
    DW_ASSERT(!dw_rope_scaling_problem(rs, theta, D));
    const int64_t R = dw_rope_dim(rs, D), half = R / 2;
    const double m = dw_rope_attention(rs);
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < B * T; bt++) {
        const double t = (double)(pos0 + bt % T);
        for (int64_t i = 0; i < half; i++) {
            const double inv = dw_rope_inv_freq(rs, theta, R, i, seq);
            const double c = m * cos(t * inv), s = m * sign * sin(t * inv);
            for (int64_t h = 0; h < H; h++) {
                const int64_t base = (bt * H + h) * D;
                const double x1 = x[base + i], x2 = x[base + i + half];
                out[base + i] = (float)(x1 * c - x2 * s);
                out[base + i + half] = (float)(x2 * c + x1 * s);
            }
        }
        if (R < D && out != x)
            for (int64_t h = 0; h < H; h++) {
                const int64_t base = (bt * H + h) * D;
                memcpy(out + base + R, x + base + R, (size_t)(D - R) * sizeof *out);
            }
    }
}

void dw_cpu_rope_fwd(float *out, const float *x, int64_t B, int64_t T, int64_t H, int64_t D, double theta,
                     const dw_rope_scaling *rs) {
    dw_rope_apply(out, x, B, T, 0, T, H, D, theta, rs, 1.0);
}

void dw_cpu_rope_bwd(float *dx, const float *dout, int64_t B, int64_t T, int64_t H, int64_t D, double theta,
                     const dw_rope_scaling *rs) {
    dw_rope_apply(dx, dout, B, T, 0, T, H, D, theta, rs, -1.0);
}

/* One position of a decode: the run so far is pos + 1 positions long (transformers' choice of
 * longrope's table for that step; the K/V cache recomputes where the choice changes). */
void dw_cpu_rope_fwd_at(float *out, const float *x, int64_t pos, int64_t H, int64_t D, double theta,
                        const dw_rope_scaling *rs) {
    dw_rope_apply(out, x, 1, 1, pos, pos + 1, H, D, theta, rs, 1.0);
}
