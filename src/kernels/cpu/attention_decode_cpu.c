/* attention_decode_cpu.c — CPU reference attention for cached decoding: the query of the newest
 * position against the cached keys and values. The arithmetic is attention_cpu.c's forward row
 * (double dot products, max, exp, sum, weighted values, one division), in the same order, so the
 * output is bit for bit the row a whole-sequence forward computes (tests/cli/test_sample_cache.sh
 * holds sampling to it). */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/decode_cpu.h"

void dw_cpu_attention_decode(float *out, const float *q, const float *kc, const float *vc, int64_t n, int64_t H,
                             int64_t Hkv, int64_t D, int64_t W) {
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
            const float *qr = q + h * D;
            double mx = -INFINITY;
            for (int64_t j = j0; j <= t; j++) {
                const float *kr = kc + (j * Hkv + g) * D;
                double dot = 0.0;
                for (int64_t d = 0; d < D; d++) dot += (double)qr[d] * kr[d];
                s[j] = dot * scale;
                if (s[j] > mx) mx = s[j];
            }
            double sum = 0.0;
            for (int64_t j = j0; j <= t; j++) {
                s[j] = exp(s[j] - mx);
                sum += s[j];
            }
            for (int64_t d = 0; d < D; d++) o[d] = 0.0;
            for (int64_t j = j0; j <= t; j++) {
                const float *vr = vc + (j * Hkv + g) * D;
                for (int64_t d = 0; d < D; d++) o[d] += s[j] * vr[d];
            }
            for (int64_t d = 0; d < D; d++) out[h * D + d] = (float)(o[d] / sum);
        }
        free(o);
        free(s);
    }
}
