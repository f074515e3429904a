/* grouped_mxfp8_cpu.c — the CPU reference of the MXFP8 grouped expert wgrad (grouped_mxfp8_cpu.h):
 * dW_e += dy_e^T x_e over each expert's 32-padded blocks of tokens, exact products in double.
 * Threads split the rows of dW (independent sums), so they cannot change results. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "formats/formats.h"
#include "kernels/cpu/grouped_mxfp8_cpu.h"
#include "kernels/cpu/moe_fp8_cpu.h"

void dw_cpu_moe_linear_mxfp8_wgrad(float *dw, const uint8_t *a, const uint8_t *sa, const uint8_t *b, const uint8_t *sb,
                                   const int32_t *offsets, int64_t E, int64_t M, int64_t K, int64_t P, bool overwrite) {
    DW_ASSERT(E >= 1 && P % 32 == 0);
    int64_t *pad = malloc((size_t)(E + 1) * sizeof *pad);
    DW_ASSERT(pad);
    dw_cpu_moe_pad_offsets(pad, offsets, E, 32); /* wgrad's layout, kernels/cpu/moe_fp8_cpu.h */
    DW_ASSERT(pad[E] <= P);
    double dec[256], sc[256];
    for (int c = 0; c < 256; c++) dec[c] = dw_decode_e4m3((uint8_t)c), sc[c] = dw_decode_ue8m0((uint8_t)c);
    const int64_t PB = P / 32;
    for (int64_t e = 0; e < E; e++) {
        if (pad[e + 1] == pad[e]) { /* no rows: nothing added, or zeros written over */
            if (overwrite) memset(dw + e * M * K, 0, (size_t)(M * K) * sizeof *dw);
            continue;
        }
#pragma omp parallel for schedule(static)
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++) {
                const uint8_t *am = a + m * P, *bk = b + k * P;
                double acc = 0.0;
                for (int64_t pb = pad[e] / 32; pb < pad[e + 1] / 32; pb++) {
                    double part = 0.0;
                    for (int64_t l = pb * 32; l < pb * 32 + 32; l++) part += dec[am[l]] * dec[bk[l]];
                    acc += part * (sc[sa[m * PB + pb]] * sc[sb[k * PB + pb]]);
                }
                float *d = dw + (e * M + m) * K + k;
                *d = (float)((overwrite ? 0.0 : (double)*d) + acc); /* 0 + acc: a zeroed dW's bits */
            }
    }
    free(pad);
}
