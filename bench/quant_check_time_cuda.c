/* quant_check_time_cuda.c — the GPU time of one quantisation-guard check's measurements on the
 * accuracy bench's model (bench/accuracy.sh, bench/accuracy_setup.py: 8 layers, width 512, SwiGLU
 * 1536, 4 K/V heads of 64, batch 16 x seq 256 = 4096 tokens; mxfp8 by default), the shapes of
 * bench/quant_check_time.c (its CPU twin): every decoder linear layer's x, x^T (BF16 on the
 * device), W, W^T (FP32 master) and dy, dy^T (BF16), measured as the CUDA backend's guard does
 * now (kernels/cuda/quant_check.h, dw_qcheck_cuda: the tensors stay on the device) and, for the
 * comparison, as it did before (each tensor copied back whole, then dw_qstats_measure on one host
 * thread), at each cap (quant_check_elements). Wall time per check, syncs included; the check's
 * extra forward is not in it. Random normal values (x sd 1, W sd 0.02, dy sd 1e-4). Not built by
 * CMake; from the repository root on a GPU machine, after a CUDA build in BUILD:
 *   cc -O2 -fopenmp -Iinclude -Isrc -I/usr/local/cuda/include bench/quant_check_time_cuda.c \
 *      BUILD/libdeepwell.a -ljansson -lpcre2-8 -lutf8proc -L/usr/lib/x86_64-linux-gnu/openmpi/lib \
 *      -lmpi -L/usr/local/cuda/lib64 -lcudart_static -lcublasLt -lrt -lpthread -lstdc++ -lm -ldl \
 *      -o /tmp/qctc
 *   OMP_NUM_THREADS=1 /tmp/qctc [LAYERS [RECIPE [CAP ...]]]  (default: 8 mxfp8 0 1048576 65536) */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "formats/formats.h"
#include "kernels/cuda/quant_check.h"
#include "precision/quant_stats.h"
#include "quant_check_model.h"

/* n values of sd on the device: BF16 codes (bf16) or FP32; NULL on failure. */
static void *device_fill(int64_t n, float sd, bool bf16) {
    const size_t bytes = (size_t)n * (bf16 ? 2 : 4);
    void *h = malloc(bytes), *d = NULL;
    for (int64_t i = 0; h && i < n; i++) {
        const float v = qcm_normal(sd);
        if (bf16) ((uint16_t *)h)[i] = dw_encode_bf16(v);
        else ((float *)h)[i] = v;
    }
    if (h && cudaMalloc(&d, bytes) == cudaSuccess && cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
        cudaFree(d), d = NULL;
    free(h);
    return d;
}

/* The old path: v [rows, cols] copied back whole, widened, measured on the host. */
static dw_status host_measure(dw_ctx *ctx, dw_recipe r, const void *v, bool bf16, int64_t rows, int64_t cols,
                              bool trans, float *buf, dw_qstats *s) {
    const int64_t n = rows * cols;
    if (bf16) {
        uint16_t *h = (uint16_t *)buf + n; /* upper halves, widened from the start as engine.c does */
        if (cudaMemcpy(h, v, (size_t)n * 2, cudaMemcpyDeviceToHost) != cudaSuccess) return DW_ERR_CUDA;
        for (int64_t i = 0; i < n; i++) buf[i] = dw_decode_bf16(h[i]);
    } else if (cudaMemcpy(buf, v, (size_t)n * 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
        return DW_ERR_CUDA;
    }
    return dw_qstats_measure(ctx, r, buf, rows, cols, trans, s);
}

int main(int argc, char **argv) {
    const int layers = argc > 1 ? atoi(argv[1]) : 8;
    dw_recipe recipe = DW_RECIPE_MXFP8;
    if (argc > 2 && (!dw_recipe_parse(argv[2], &recipe) || recipe == DW_RECIPE_BF16)) {
        fprintf(stderr, "quant_check_time_cuda: unknown recipe '%s'\n", argv[2]);
        return 2;
    }
    int64_t caps[16];
    const int nc = qcm_caps(argc, argv, 3, caps);
    const int64_t N = QCM_N, *K = qcm_k, *M = qcm_m; /* q k v o gate up down */
    dw_ctx *ctx = NULL;
    dw_ctx_opts o = {.device = DW_DEVICE_CPU}; /* errors only: the calls take their stream */
    if (dw_ctx_create(&o, &ctx) != DW_OK) return 1;
    void *x[7], *w[7], *dy[7];
    for (int j = 0; j < 7; j++) {
        x[j] = device_fill(N * K[j], 1, true), w[j] = device_fill(M[j] * K[j], 0.02f, false);
        dy[j] = device_fill(N * M[j], 1e-4f, true);
        if (!x[j] || !w[j] || !dy[j]) {
            fprintf(stderr, "quant_check_time_cuda: no GPU memory (or no GPU)\n");
            return 1;
        }
    }
    float *buf = malloc((size_t)(N * QCM_F) * sizeof *buf);
    dw_qstats warm = dw_qstats_zero(); /* the stream-ordered pool's first allocation, outside the timing */
    if (!buf || dw_qcheck_cuda(ctx, recipe, DW_QUANT_IN_BF16, x[0], N, K[0], false, &warm, NULL) != DW_OK) {
        fprintf(stderr, "quant_check_time_cuda: %s\n", buf ? dw_errmsg(ctx) : "out of memory");
        return 1;
    }
    for (int c = 0; c < nc; c++)
        for (int path = 0; path < 2; path++) { /* 0: on the device, 1: copied back and measured on the host */
            if (path == 1 && caps[c] == 0 && layers > 2) continue; /* ~60 s: bench/RESULTS.md has it */
            int64_t elems = 0, measured = 0;
            double bulk = 0;
            cudaDeviceSynchronize();
            const double t0 = qcm_now();
            for (int l = 0; l < layers; l++)
                for (int j = 0; j < 7; j++) {
                    const void *v[3] = {x[j], w[j], dy[j]};
                    const int64_t r[3] = {N, M[j], N}, cols[3] = {K[j], K[j], M[j]};
                    for (int t = 0; t < 6; t++) {
                        const bool bf16 = t / 2 != 1;
                        dw_qstats s = dw_qstats_zero();
                        s.cap = caps[c];
                        const dw_status st =
                            path == 0 ? dw_qcheck_cuda(ctx, recipe, bf16 ? DW_QUANT_IN_BF16 : DW_QUANT_IN_F32, v[t / 2],
                                                       r[t / 2], cols[t / 2], t & 1, &s, NULL)
                                      : host_measure(ctx, recipe, v[t / 2], bf16, r[t / 2], cols[t / 2], t & 1, buf, &s);
                        if (st != DW_OK) {
                            fprintf(stderr, "quant_check_time_cuda: %s\n", dw_errmsg(ctx));
                            return 1;
                        }
                        elems += s.elements, measured += s.q.n, bulk += dw_qstats_bulk_error(&s);
                    }
                }
            printf("%s cap %9lld, %s: %.4f s per check  (%d layers x 7 linears x 6 tensors: %lld elements, %lld "
                   "measured; mean bulk error %.5f)\n",
                   dw_recipe_name(recipe), (long long)caps[c], path == 0 ? "on the device     " : "copied to the host",
                   qcm_now() - t0, layers, (long long)elems, (long long)measured, bulk / (layers * 42));
        }
    for (int j = 0; j < 7; j++) cudaFree(x[j]), cudaFree(w[j]), cudaFree(dy[j]);
    free(buf);
    dw_ctx_free(ctx);
    return 0;
}
