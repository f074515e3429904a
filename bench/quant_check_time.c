/* quant_check_time.c — the CPU time of one quantisation-guard check's measurements
 * (precision/quant_stats.c) on the accuracy bench's model (bench/accuracy.sh: 8 layers, width 512,
 * SwiGLU 1536, 4 K/V heads of 64, batch 16 x seq 256 = 4096 tokens; mxfp8): every decoder linear
 * layer's x, x^T, W, W^T, dy, dy^T as guard_quant.c measures them, whole (cap 0) and at the caps
 * given (quant_check_elements). Random normal values (x sd 1, W sd 0.02, dy sd 1e-4). Not built by
 * CMake; from the repository root, after a CPU build in BUILD:
 *   cc -O2 -fopenmp -Iinclude -Isrc bench/quant_check_time.c BUILD/libdeepwell.a -ljansson -lpcre2-8 \
 *      -lutf8proc -L/usr/lib/x86_64-linux-gnu/openmpi/lib -lmpi -lm -ldl -o /tmp/qct
 *   OMP_NUM_THREADS=1 /tmp/qct [LAYERS [CAP ...]]      (default: 8 layers, caps 0 1048576 65536) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "precision/quant_stats.h"
#include "quant_check_model.h"

static float *fill(int64_t n, float sd) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; x && i < n; i++) x[i] = qcm_normal(sd);
    return x;
}

int main(int argc, char **argv) {
    const int layers = argc > 1 ? atoi(argv[1]) : 8;
    int64_t caps[16];
    const int nc = qcm_caps(argc, argv, 2, caps);
    const int64_t N = QCM_N, *K = qcm_k, *M = qcm_m; /* q k v o gate up down */
    dw_ctx *ctx = NULL;
    dw_ctx_opts o = {.device = DW_DEVICE_CPU};
    if (dw_ctx_create(&o, &ctx) != DW_OK) return 1;
    float *x[7], *w[7], *dy[7];
    for (int j = 0; j < 7; j++) x[j] = fill(N * K[j], 1), w[j] = fill(M[j] * K[j], 0.02f), dy[j] = fill(N * M[j], 1e-4f);
    for (int c = 0; c < nc; c++) {
        int64_t elems = 0, measured = 0;
        double bulk = 0;
        const double t0 = qcm_now();
        for (int l = 0; l < layers; l++)
            for (int j = 0; j < 7; j++) {
                const float *v[3] = {x[j], w[j], dy[j]};
                const int64_t r[3] = {N, M[j], N}, cols[3] = {K[j], K[j], M[j]};
                for (int t = 0; t < 6; t++) {
                    dw_qstats s = dw_qstats_zero();
                    s.cap = caps[c];
                    if (dw_qstats_measure(ctx, DW_RECIPE_MXFP8, v[t / 2], r[t / 2], cols[t / 2], t & 1, &s) != DW_OK) {
                        fprintf(stderr, "%s\n", dw_errmsg(ctx));
                        return 1;
                    }
                    elems += s.elements, measured += s.q.n, bulk += dw_qstats_bulk_error(&s);
                }
            }
        printf("cap %9lld: %.2f s  (%d layers x 7 linears x 6 tensors: %lld elements, %lld measured; mean bulk "
               "error %.5f)\n", (long long)caps[c], qcm_now() - t0, layers, (long long)elems, (long long)measured,
               bulk / (layers * 42));
    }
    dw_ctx_free(ctx);
    return 0;
}
