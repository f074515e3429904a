/* attention_decode_cpu.c — CPU reference attention for cached decoding: the query of the newest
 * position against the cached keys and values, through attention_row.h's row, the one the
 * whole-sequence forward (attention_cpu.c) computes, so the output is bit for bit that forward's
 * (tests/cli/test_sample_cache.sh holds sampling to it). */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/attention_row.h"
#include "kernels/cpu/decode_cpu.h"

void dw_cpu_attention_decode(float *out, const float *q, const float *kc, const float *vc, int64_t n, int64_t H,
                             int64_t Hkv, int64_t D, int64_t W, double cap) {
    DW_ASSERT(n > 0 && H > 0 && Hkv > 0 && D > 0 && H % Hkv == 0 && W >= 0);
    const int64_t group = H / Hkv, t = n - 1, j0 = W > 0 && t - W + 1 > 0 ? t - W + 1 : 0;
    const double scale = 1.0 / sqrt((double)D);
#pragma omp parallel
    {
        double *s = malloc((size_t)n * sizeof *s), *o = malloc((size_t)D * sizeof *o);
        DW_ASSERT_MSG(s && o, "out of memory in dw_cpu_attention_decode");
#pragma omp for schedule(static)
        for (int64_t h = 0; h < H; h++) {
            const int64_t g = h / group;
            dw_cpu_attention_row(out + h * D, q + h * D, kc + g * D, vc + g * D, Hkv * D, j0, t, D, scale, cap, s, o);
        }
        free(o);
        free(s);
    }
}
