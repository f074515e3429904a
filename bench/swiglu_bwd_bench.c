/* swiglu_bwd_bench.c — the SwiGLU backward that writes the gate and up layers' fp8_block dy and
 * dy^T (src/kernels/cuda/swiglu_bwd_fp8.cu) against what it replaces, in one run on one GPU: the
 * BF16 backward (dw_cuda_swiglu_bwd) and the quantiser's rows-and-transposed pass on each of its
 * two gradients (dw_quantize_cuda, fp8_block). Median of 20 launches each (CUDA events), at
 * [N, F] (default 16384 x 8192: llama-1b B8 T2048's MLP); the bandwidth column counts each path's own bytes (fused: 6 read + 4 written an
 * element, and the scales). Usage: swiglu_bwd_bench [N F] */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/ctx.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/quant.h"

static int cmp_f(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

#define CK(e)                                                                                                          \
    do {                                                                                                               \
        if ((e) != 0) {                                                                                                \
            fprintf(stderr, "swiglu_bwd_bench: %s failed (line %d)\n", #e, __LINE__);                                  \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

int main(int argc, char **argv) {
    const long long N = argc > 2 ? atoll(argv[1]) : 16384, F = argc > 2 ? atoll(argv[2]) : 8192, n = N * F;
    if (N <= 0 || F <= 0 || N % 128 || F % 128) {
        fprintf(stderr, "usage: swiglu_bwd_bench [N F] (multiples of 128)\n");
        return 2;
    }
    dw_ctx *ctx = NULL;
    const dw_ctx_opts co = {.device = DW_DEVICE_CUDA, .device_index = 0};
    CK(dw_ctx_create(&co, &ctx));
    void *stream = NULL;
    CK(dw_ctx_stream(ctx, &stream));
    uint16_t *h = malloc((size_t)n * 2);
    uint32_t s = 12345;
    for (long long i = 0; i < n; i++) { /* BF16 of magnitude ~0.01..1 with random signs */
        s = s * 1664525u + 1013904223u;
        h[i] = (uint16_t)(0x3C00u + (s >> 20 & 0x3FFu)) | (uint16_t)((s >> 31) << 15);
    }
    void *in[3], *bf[2], *ws = NULL;
    uint8_t *codes[4], *codes_t[4];
    float *sc[4], *sct[4];
    for (int k = 0; k < 3; k++) {
        CK(cudaMalloc(&in[k], (size_t)n * 2));
        CK(cudaMemcpy(in[k], h, (size_t)n * 2, cudaMemcpyHostToDevice));
    }
    for (int k = 0; k < 2; k++) CK(cudaMalloc(&bf[k], (size_t)n * 2));
    for (int k = 0; k < 4; k++) {
        CK(cudaMalloc((void **)&codes[k], (size_t)n));
        CK(cudaMalloc((void **)&codes_t[k], (size_t)n));
        CK(cudaMalloc((void **)&sc[k], (size_t)n / 32));
        CK(cudaMalloc((void **)&sct[k], (size_t)n / 32));
    }
    const size_t wsb = dw_quantize_cuda_workspace_bytes(DW_RECIPE_FP8_BLOCK, N, F);
    if (wsb) CK(cudaMalloc(&ws, wsb));
    const dw_quant_opts o = {.recipe = DW_RECIPE_FP8_BLOCK, .rounding = DW_SCALE_RCEIL, .pow2 = false};
    dw_cuda_fp8_grad g[2];
    for (int k = 0; k < 2; k++)
        g[k] = (dw_cuda_fp8_grad){.codes = codes[k], .codes_t = codes_t[k], .scales = sc[k], .scales_t = sct[k]};
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const char *names[] = {"fused", "BF16 backward + 2 quantiser passes", "  of which the BF16 backward",
                           "  of which one quantiser pass"};
    const double bytes[] = {10.0 * n + n / 8.0, 18.0 * n + n / 8.0, 10.0 * n, 4.0 * n + n / 16.0};
    printf("SwiGLU backward into fp8_block dy and dy^T, N=%lld F=%lld\n", N, F);
    for (int v = 0; v < 4; v++) {
        float t[20];
        for (int it = -3; it < 20; it++) {
            CK(cudaEventRecord(e0, stream));
            if (v == 0) {
                CK(dw_cuda_swiglu_bwd_fp8(ctx, in[0], in[1], in[2], N, F, &g[0], &g[1], stream));
            } else {
                if (v != 3) CK(dw_cuda_swiglu_bwd(ctx, DW_ACT_BF16, bf[0], bf[1], in[0], in[1], in[2], n, stream));
                for (int k = 0; k < (v == 1 ? 2 : v == 3 ? 1 : 0); k++) {
                    dw_quant_dev_out a = {.codes = codes[2 + k], .scales = sc[2 + k]};
                    dw_quant_dev_out b = {.codes = codes_t[2 + k], .scales = sct[2 + k]};
                    CK(dw_quantize_cuda(ctx, &o, DW_QUANT_IN_BF16, bf[k], N, F, &a, &b, ws, stream));
                }
            }
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            if (it >= 0) CK(cudaEventElapsedTime(&t[it], e0, e1));
        }
        qsort(t, 20, sizeof t[0], cmp_f);
        printf("  %-36s %8.3f ms  %7.0f GB/s\n", names[v], t[10], bytes[v] / (t[10] * 1e-3) / 1e9);
    }
    free(h);
    dw_ctx_free(ctx);
    return 0;
}
