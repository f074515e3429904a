/* bench_quant.c — `deepwell bench quant`: times the CUDA quantisation kernels (kernels/cuda/quant.h)
 * on a BF16 [rows, cols] tensor — mxfp8 and fp8_block, with and without the transposed copy —
 * with CUDA events around batches of back-to-back calls (warm-up, median of many), as GB/s (bytes
 * read + written) and as a ratio to a device-to-device cudaMemcpy of the input timed the same way
 * in the same run. Correctness is tests/gpu. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "formats/formats.h"

static void help(void) {
    printf("Usage: deepwell bench quant [--json] [--rows R] [--cols C] [--iters N] [--batch B]\n"
           "                            [--kernel default|cpasync|bulk] [--stages S] [--ctas-per-sm K]\n"
           "                            [--t-store 1..5] [--load 1|2] [--group G]\n"
           "                            [--tile-block 1|2|4]\n\n"
           "Quantises a random BF16 [R, C] tensor on GPU 0 to mxfp8 and fp8_block, each without and\n"
           "with the transposed (column-wise) copy produced in the same pass, and times every variant\n"
           "with CUDA events around a batch of B back-to-back calls on the same stream: 5 warm-up\n"
           "batches, then the median of N timed batches, divided by B. Reports GB/s counting bytes\n"
           "read plus bytes written (input, codes, scales) and the ratio to a device-to-device\n"
           "cudaMemcpy of the input timed the same way in the same run (its GB/s also counts read +\n"
           "write). With --batch 1 each call is timed alone, host launch time included.\n"
           "Without a CUDA build or a GPU it says so and exits 1.\n\n"
           "  --json       print one JSON object instead of the table\n"
           "  --rows R     rows (default 8192)\n"
           "  --cols C     columns (default 8192)\n"
           "  --iters N    timed batches per variant (default 50)\n"
           "  --batch B    calls per timed batch (default 10)\n"
           "  --kernel K   tuning: default (the bulk-copy kernels, a producer warp feeding compute\n"
           "               warps through a shared-memory ring, row-wise and transposed), cpasync (the\n"
           "               older kernels: cp.async tiles transposed, the flat grid-stride kernel\n"
           "               row-wise) or bulk (the same as default)\n"
           "  --stages S   tuning: buffers (2..6) in the shared-memory ring: bulk-copy kernels 32 KiB\n"
           "               each (default 3; transposed: 2 with --t-store 1 or 5 (the default),\n"
           "               fp8_block with 4, or 3 CTAs per SM; 4 for mxfp8 with --t-store 3 or 4;\n"
           "               at most 5 with --t-store 5); cpasync one tile each (default 2)\n"
           "  --ctas-per-sm K  tuning: at most K CTAs per SM for the ring kernels (default: bulk-copy\n"
           "               kernels 2, cpasync as many as fit); 3 or more: the bulk-copy transposing\n"
           "               kernel built for 3 CTAs per SM\n"
           "  --t-store M  tuning, how a transposing kernel's codes leave: cpasync kernel, transposed\n"
           "               codes 1 from registers (32 bytes per thread), 2 or 3 through shared memory\n"
           "               as full rows (default); bulk-copy kernel, both copies' codes and scales 1\n"
           "               from registers (8 bytes per store), 2 staged in shared memory and\n"
           "               written by bulk copies of whole rows, 3 staged and written by 16-byte\n"
           "               stores, 4 staged over the tile's ring buffer and written by tensor\n"
           "               stores, 5 the same from a staging buffer of its own (default)\n"
           "  --load L     tuning, bulk-copy transposing kernel: a tile arrives 1 as 128 row copies or\n"
           "               2 as one tensor-map copy (default)\n"
           "  --group G    tuning, bulk-copy transposing kernel: tiles in bands of G tile rows (1..64),\n"
           "               column by column within a band (default 1: row by row; with --tile-block 1)\n"
           "  --tile-block T  tuning, bulk-copy transposing kernel: a CTA takes blocks of T x T tiles\n"
           "               and writes their scales as runs of 4T bytes per row (default: the largest\n"
           "               T that leaves no CTA more tiles than T = 1)\n"
           "  -h, --help   this help\n");
}

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>

static const char *kernel_name(int k) { return k == 1 ? "cpasync" : k == 2 ? "bulk" : "default"; }

#include "kernels/cuda/quant.h"

typedef struct {
    dw_recipe recipe;
    bool trans;
    double ms, gbps, ratio, bytes;
} variant;

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

#define CK(stmt)                                                                                 \
    do {                                                                                         \
        cudaError_t e_ = (stmt);                                                                 \
        if (e_ != cudaSuccess) {                                                                 \
            cli_error("bench quant", "%s failed: %s", #stmt, cudaGetErrorString(e_));            \
            return -1.0;                                                                         \
        }                                                                                        \
    } while (0)

/* Median milliseconds of `iters` runs of either a copy (q == NULL) or a quantisation. */
typedef struct {
    const dw_quant_opts *o;
    const void *x;
    void *copy_dst;
    size_t copy_bytes;
    int64_t rows, cols;
    const dw_quant_dev_out *out, *out_t;
    void *ws;
} job;

static double time_job(const job *j, int iters, int batch) {
    cudaEvent_t ev[2];
    CK(cudaEventCreate(&ev[0]));
    CK(cudaEventCreate(&ev[1]));
    float *ms = malloc((size_t)iters * sizeof *ms);
    for (int i = -5; i < iters; i++) {
        CK(cudaEventRecord(ev[0], 0));
        for (int b = 0; b < batch; b++) {
            if (!j->o) {
                CK(cudaMemcpyAsync(j->copy_dst, j->x, j->copy_bytes, cudaMemcpyDeviceToDevice, 0));
            } else if (dw_quantize_cuda(NULL, j->o, DW_QUANT_IN_BF16, j->x, j->rows, j->cols, j->out, j->out_t,
                                        j->ws, NULL) != DW_OK) {
                cli_error("bench quant", "%s", dw_errmsg(NULL));
                free(ms);
                return -1.0;
            }
        }
        CK(cudaEventRecord(ev[1], 0));
        CK(cudaEventSynchronize(ev[1]));
        if (i >= 0) CK(cudaEventElapsedTime(&ms[i], ev[0], ev[1]));
    }
    qsort(ms, (size_t)iters, sizeof *ms, cmp_float);
    double med = ms[iters / 2] / batch;
    free(ms);
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    return med;
}

/* Random BF16 codes: random sign, exponents spread over 2^-8 .. 2^7, random mantissa (no NaN/Inf). */
static void fill_random_bf16(uint16_t *h, size_t n, uint64_t seed) {
    uint64_t s = seed | 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        unsigned sign = (unsigned)(s >> 63), e = 119 + (unsigned)((s >> 40) % 16), m = (unsigned)(s & 0x7F);
        h[i] = (uint16_t)(sign << 15 | e << 7 | m);
    }
}

static int run(bool json, int64_t rows, int64_t cols, int iters, int batch, const dw_quant_tuning *tune) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        cli_error("bench quant", "no CUDA GPU found: this benchmark needs one");
        return DW_EXIT_FAIL;
    }
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
        cli_error("bench quant", "cannot read the properties of GPU 0");
        return DW_EXIT_FAIL;
    }
    if (dw_quantize_cuda_set_tuning(NULL, tune) != DW_OK) {
        cli_error("bench quant", "%s", dw_errmsg(NULL));
        return DW_EXIT_USAGE;
    }
    size_t n = (size_t)(rows * cols), in_bytes = n * 2;
    uint16_t *hx = malloc(in_bytes);
    if (!hx) {
        cli_error("bench quant", "out of host memory for [%lld, %lld]", (long long)rows, (long long)cols);
        return DW_EXIT_FAIL;
    }
    fill_random_bf16(hx, n, 0x9E3779B97F4A7C15ull ^ (uint64_t)rows << 32 ^ (uint64_t)cols);
    void *dx = NULL, *dcopy = NULL, *dcodes = NULL, *dscales = NULL, *dcodes_t = NULL, *dscales_t = NULL;
    size_t scale_max = dw_quant_scales_bytes(DW_RECIPE_MXFP8, rows, cols) +
                       dw_quant_scales_bytes(DW_RECIPE_FP8_BLOCK, cols, rows);
    int rc = DW_EXIT_FAIL;
    if (cudaMalloc(&dx, in_bytes) != cudaSuccess || cudaMalloc(&dcopy, in_bytes) != cudaSuccess ||
        cudaMalloc(&dcodes, n) != cudaSuccess || cudaMalloc(&dcodes_t, n) != cudaSuccess ||
        cudaMalloc(&dscales, scale_max) != cudaSuccess || cudaMalloc(&dscales_t, scale_max) != cudaSuccess ||
        cudaMemcpy(dx, hx, in_bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        cli_error("bench quant", "device allocation or upload failed for [%lld, %lld]", (long long)rows,
                  (long long)cols);
        goto done;
    }
    job copy = {.x = dx, .copy_dst = dcopy, .copy_bytes = in_bytes};
    double copy_ms = time_job(&copy, iters, batch);
    if (copy_ms < 0) goto done;
    double copy_gbps = 2.0 * (double)in_bytes / (copy_ms * 1e6);
    variant vs[4] = {{.recipe = DW_RECIPE_MXFP8}, {.recipe = DW_RECIPE_MXFP8, .trans = true},
                     {.recipe = DW_RECIPE_FP8_BLOCK}, {.recipe = DW_RECIPE_FP8_BLOCK, .trans = true}};
    for (int k = 0; k < 4; k++) {
        dw_quant_opts o = {.recipe = vs[k].recipe};
        dw_quant_dev_out out = {.codes = dcodes, .scales = dscales};
        dw_quant_dev_out out_t = {.codes = dcodes_t, .scales = dscales_t};
        job j = {.o = &o, .x = dx, .rows = rows, .cols = cols, .out = &out, .out_t = vs[k].trans ? &out_t : NULL};
        vs[k].ms = time_job(&j, iters, batch);
        if (vs[k].ms < 0) goto done;
        vs[k].bytes = (double)in_bytes + (double)dw_quant_codes_bytes(o.recipe, rows, cols) +
                      (double)dw_quant_scales_bytes(o.recipe, rows, cols);
        if (vs[k].trans)
            vs[k].bytes += (double)dw_quant_codes_bytes(o.recipe, cols, rows) +
                           (double)dw_quant_scales_bytes(o.recipe, cols, rows);
        vs[k].gbps = vs[k].bytes / (vs[k].ms * 1e6);
        vs[k].ratio = vs[k].gbps / copy_gbps;
    }
    if (json) {
        printf("{\"bench\": \"quant\", \"device\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"iters\": %d, "
               "\"batch\": %d, \"input\": \"bf16\", \"kernel\": \"%s\", \"stages\": %d, \"ctas_per_sm\": %d, "
               "\"t_store\": %d, \"load\": %d, \"group\": %d, \"tile_block\": %d, \"copy\": {\"ms\": %.5f, \"gbps\": %.1f}, "
               "\"variants\": [",
               prop.name, (long long)rows, (long long)cols, iters, batch, kernel_name(tune->kernel),
               tune->stages, tune->ctas_per_sm, tune->t_store, tune->load, tune->group, tune->tile_block, copy_ms, copy_gbps);
        for (int k = 0; k < 4; k++)
            printf("%s{\"recipe\": \"%s\", \"transposed\": %s, \"ms\": %.5f, \"bytes\": %.0f, \"gbps\": %.1f, "
                   "\"ratio_to_copy\": %.3f}", k ? ", " : "", dw_recipe_name(vs[k].recipe),
                   vs[k].trans ? "true" : "false", vs[k].ms, vs[k].bytes, vs[k].gbps, vs[k].ratio);
        printf("]}\n");
    } else {
        printf("quantise BF16 [%lld, %lld] on %s, median of %d batches of %d calls (CUDA events); kernels "
               "%s, stages %d, CTAs/SM %d, t-store %d, load %d, group %d, tile block %d (0 = default)\n\n", (long long)rows,
               (long long)cols, prop.name, iters, batch, kernel_name(tune->kernel), tune->stages, tune->ctas_per_sm,
               tune->t_store, tune->load, tune->group, tune->tile_block);
        printf("%-26s %10s %10s %8s\n", "variant", "ms", "GB/s", "vs copy");
        printf("%-26s %10.4f %10.1f %8s\n", "cudaMemcpy D2D (anchor)", copy_ms, copy_gbps, "1.000");
        for (int k = 0; k < 4; k++) {
            char name[64];
            snprintf(name, sizeof name, "%s%s", dw_recipe_name(vs[k].recipe), vs[k].trans ? " + transposed" : "");
            printf("%-26s %10.4f %10.1f %8.3f\n", name, vs[k].ms, vs[k].gbps, vs[k].ratio);
        }
        printf("\nGB/s counts bytes read + written (input, codes, scales).\n");
    }
    rc = DW_EXIT_OK;
done:
    cudaFree(dx);
    cudaFree(dcopy);
    cudaFree(dcodes);
    cudaFree(dcodes_t);
    cudaFree(dscales);
    cudaFree(dscales_t);
    free(hx);
    return rc;
}
#endif

int bench_quant(int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, 0, 'j'},
                                         {"rows", required_argument, 0, 'r'},
                                         {"cols", required_argument, 0, 'c'},
                                         {"iters", required_argument, 0, 'n'},
                                         {"batch", required_argument, 0, 'b'},
                                         {"kernel", required_argument, 0, 'K'},
                                         {"stages", required_argument, 0, 's'},
                                         {"ctas-per-sm", required_argument, 0, 'k'},
                                         {"t-store", required_argument, 0, 't'},
                                         {"load", required_argument, 0, 'L'},
                                         {"group", required_argument, 0, 'G'},
                                         {"tile-block", required_argument, 0, 'T'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    bool json = false;
    long rows = 8192, cols = 8192, iters = 50, batch = 10, stages = 0, ctas = 0, tstore = 0, kernel = 0, load = 0, group = 0,
         tblock = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
        case 'r':
            if (!cli_parse_int("bench quant", "--rows", optarg, 1, 1L << 20, &rows)) return DW_EXIT_USAGE;
            break;
        case 'c':
            if (!cli_parse_int("bench quant", "--cols", optarg, 1, 1L << 20, &cols)) return DW_EXIT_USAGE;
            break;
        case 'n':
            if (!cli_parse_int("bench quant", "--iters", optarg, 1, 100000, &iters)) return DW_EXIT_USAGE;
            break;
        case 'b':
            if (!cli_parse_int("bench quant", "--batch", optarg, 1, 1000, &batch)) return DW_EXIT_USAGE;
            break;
        case 'K':
            if (strcmp(optarg, "default") == 0) {
                kernel = 0;
            } else if (strcmp(optarg, "cpasync") == 0) {
                kernel = 1;
            } else if (strcmp(optarg, "bulk") == 0) {
                kernel = 2;
            } else {
                cli_error("bench quant", "--kernel: '%s' is not default, cpasync or bulk", optarg);
                return DW_EXIT_USAGE;
            }
            break;
        case 's':
            if (!cli_parse_int("bench quant", "--stages", optarg, 2, 6, &stages)) return DW_EXIT_USAGE;
            break;
        case 'k':
            if (!cli_parse_int("bench quant", "--ctas-per-sm", optarg, 1, 64, &ctas)) return DW_EXIT_USAGE;
            break;
        case 't':
            if (!cli_parse_int("bench quant", "--t-store", optarg, 1, 5, &tstore)) return DW_EXIT_USAGE;
            break;
        case 'L':
            if (!cli_parse_int("bench quant", "--load", optarg, 1, 2, &load)) return DW_EXIT_USAGE;
            break;
        case 'G':
            if (!cli_parse_int("bench quant", "--group", optarg, 1, 64, &group)) return DW_EXIT_USAGE;
            break;
        case 'T':
            if (!cli_parse_int("bench quant", "--tile-block", optarg, 1, 4, &tblock)) return DW_EXIT_USAGE;
            if (tblock == 3) {
                cli_error("bench quant", "--tile-block: 3 is not 1, 2 or 4");
                return DW_EXIT_USAGE;
            }
            break;
        case 'h': help(); return DW_EXIT_OK;
        default: return cli_usage_error("bench quant");
        }
    }
    if (optind < argc) {
        cli_error("bench quant", "unexpected argument '%s'", argv[optind]);
        return cli_usage_error("bench quant");
    }
    if ((double)rows * (double)cols > 4e9) {
        cli_error("bench quant", "[%ld, %ld] is too large (at most 4e9 elements)", rows, cols);
        return DW_EXIT_USAGE;
    }
#if DW_HAVE_CUDA
    dw_quant_tuning tune = {.stages = (int)stages, .ctas_per_sm = (int)ctas, .t_store = (int)tstore, .kernel = (int)kernel,
                            .load = (int)load, .group = (int)group, .tile_block = (int)tblock};
    return run(json, rows, cols, (int)iters, (int)batch, &tune);
#else
    (void)json, (void)stages, (void)ctas, (void)tstore, (void)batch, (void)kernel, (void)load, (void)group, (void)tblock;
    cli_error("bench quant", "this build has no CUDA (configured without nvcc): it needs a CUDA build and a GPU");
    return DW_EXIT_FAIL;
#endif
}
