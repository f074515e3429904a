/* bench_quant.c — `deepwell bench quant`: flags, help and printing of dw_bench_quant (src/bench/
 * quant.c), which times the CUDA quantisation kernels on a BF16 [rows, cols] tensor — mxfp8 and
 * fp8_block, with and without the transposed copy — against a device-to-device copy of the input
 * timed the same way in the same run. Correctness is tests/gpu. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

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

static const char *kernel_name(int k) { return k == 1 ? "cpasync" : k == 2 ? "bulk" : "default"; }

/* The rows as they come: the anchor first, then the four variants. */
typedef struct {
    dw_bench_quant_row rows[5];
    char device[256];
    int n;
} collected;

static void collect(const dw_bench_quant_row *r, void *user) {
    collected *c = user;
    if (c->n == 0) snprintf(c->device, sizeof c->device, "%s", r->device);
    if (c->n < 5) c->rows[c->n++] = *r;
}

static void print_json(const dw_bench_quant_opts *o, const collected *c) {
    const dw_bench_quant_row *copy = &c->rows[0];
    printf("{\"bench\": \"quant\", \"device\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"iters\": %d, "
           "\"batch\": %d, \"input\": \"bf16\", \"kernel\": \"%s\", \"stages\": %d, \"ctas_per_sm\": %d, "
           "\"t_store\": %d, \"load\": %d, \"group\": %d, \"tile_block\": %d, \"copy\": {\"ms\": %.5f, \"gbps\": %.1f}, "
           "\"variants\": [",
           c->device, (long long)o->rows, (long long)o->cols, o->iters, o->batch, kernel_name(o->kernel), o->stages,
           o->ctas_per_sm, o->t_store, o->load, o->group, o->tile_block, copy->ms, copy->gbps);
    for (int k = 1; k < c->n; k++) {
        const dw_bench_quant_row *v = &c->rows[k];
        printf("%s{\"recipe\": \"%s\", \"transposed\": %s, \"ms\": %.5f, \"bytes\": %.0f, \"gbps\": %.1f, "
               "\"ratio_to_copy\": %.3f}", k > 1 ? ", " : "", dw_recipe_name((dw_recipe)v->recipe),
               v->transposed ? "true" : "false", v->ms, v->bytes, v->gbps, v->ratio_to_copy);
    }
    printf("]}\n");
}

static void print_table(const dw_bench_quant_opts *o, const collected *c) {
    const dw_bench_quant_row *copy = &c->rows[0];
    printf("quantise BF16 [%lld, %lld] on %s, median of %d batches of %d calls (CUDA events); kernels "
           "%s, stages %d, CTAs/SM %d, t-store %d, load %d, group %d, tile block %d (0 = default)\n\n", (long long)o->rows,
           (long long)o->cols, c->device, o->iters, o->batch, kernel_name(o->kernel), o->stages, o->ctas_per_sm,
           o->t_store, o->load, o->group, o->tile_block);
    printf("%-26s %10s %10s %8s\n", "variant", "ms", "GB/s", "vs copy");
    printf("%-26s %10.4f %10.1f %8s\n", "cudaMemcpy D2D (anchor)", copy->ms, copy->gbps, "1.000");
    for (int k = 1; k < c->n; k++) {
        const dw_bench_quant_row *v = &c->rows[k];
        char name[64];
        snprintf(name, sizeof name, "%s%s", dw_recipe_name((dw_recipe)v->recipe), v->transposed ? " + transposed" : "");
        printf("%-26s %10.4f %10.1f %8.3f\n", name, v->ms, v->gbps, v->ratio_to_copy);
    }
    printf("\nGB/s counts bytes read + written (input, codes, scales).\n");
}

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
    dw_bench_quant_opts o;
    dw_bench_quant_opts_init(&o, sizeof o);
    o.rows = rows, o.cols = cols, o.iters = (int)iters, o.batch = (int)batch;
    o.kernel = (int)kernel, o.stages = (int)stages, o.ctas_per_sm = (int)ctas, o.t_store = (int)tstore;
    o.load = (int)load, o.group = (int)group, o.tile_block = (int)tblock;
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_AUTO};
    dw_status s = dw_ctx_create(&co, &ctx);
    if (s != DW_OK) return cli_fail("bench quant", NULL, s);
    collected got = {.n = 0};
    s = dw_bench_quant(ctx, &o, collect, &got);
    int rc = DW_EXIT_OK;
    if (s != DW_OK) rc = cli_fail("bench quant", ctx, s);
    else if (json) print_json(&o, &got);
    else print_table(&o, &got);
    dw_ctx_free(ctx);
    return rc;
}
