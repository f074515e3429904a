/* bench_grouped.c — `deepwell bench grouped`: flags, help and printing of dw_bench_grouped
 * (src/bench/grouped.c), which times the MoE layer's grouped expert GEMMs (fprop, dgrad, wgrad)
 * with balanced and Zipf-skewed routing, in BF16 and fp8_block; bench/grouped_anchor.py times
 * torch._grouped_mm alike. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

static const char *CMD = "bench grouped";

static void help(void) {
    printf("Usage: deepwell bench grouped [--json] [--explain] [--shapes LIST] [--routing LIST] [--passes LIST]\n"
           "                             [--recipe LIST] [--iters N] [--zipf S] [--seed N] [--device auto|cuda|cpu]\n"
           "                             [--rows R --experts E --k K --m M]\n\n"
           "Times the grouped expert GEMMs of the MoE linear layer over E experts' row groups:\n"
           "fprop y_e = x_e W_e^T (rows x K -> M), dgrad dx_e = dy_e W_e, wgrad dW_e += dy_e^T x_e, and\n"
           "reports TFLOP/s (2 rows K M / time, the unpadded rows), each with the kernel the grouped GEMM\n"
           "registry selects (as the engine's): on a GPU BF16 (TMA + wgmma on sm_90), on the CPU the FP32\n"
           "reference. fp8_block runs on E4M3 codes with DeepSeek-V3's scales: W quantised once (128x128\n"
           "blocks), the pass's activation operands (x or dy in 1x128 row blocks; wgrad's dy^T and x^T\n"
           "padded per expert) quantised inside every timed call; \"quant ms\" is that quantisation alone,\n"
           "and ms and TFLOP/s include it (on sm_90 its wgmma kernel unless DW_MOE_FP8=0).\n"
           "Each case: 2 warm-up calls, then 5 batches of N calls (CUDA events on a\n"
           "GPU); the median batch gives ms per call. bench/grouped_anchor.py times torch._grouped_mm\n"
           "on the same shapes and routings for the comparison.\n\n"
           "  --json           print a JSON list of {shape,routing,pass,recipe,rows,experts,k,m,max_rows,\n"
           "                   dtype,quant_ms,ms,tflops} (a table otherwise)\n"
           "  --explain        before each case, the selection: every registered grouped kernel,\n"
           "                   eligible or why not, and the one that runs (on stderr with --json)\n"
           "  --shapes LIST    comma list of: e8 (16384 x 4096 -> 14336, 8 experts), e64 (32768 x 2048\n"
           "                   -> 1408, 64 experts), moe-e8, moe-e8-down (the moe-e8 preset's expert\n"
           "                   GEMMs at batch 8, seq 2048, top-2: 32768 x 2048 -> 5632, 5632 -> 2048),\n"
           "                   moe-e64, moe-e64-down (batch 4, seq 2048, top-8: 65536 x 2048 -> 1024,\n"
           "                   1024 -> 2048), custom (--rows, --experts, --k, --m); default every named\n"
           "                   shape on a GPU; the CPU needs a list\n"
           "  --routing LIST   balanced (equal groups), zipf (expert e's share ~ 1/(e+1)^S); default both\n"
           "  --passes LIST    fprop, dgrad, wgrad; default all three\n"
           "  --recipe LIST    bf16, fp8_block (k and m multiples of 128); default bf16\n"
           "  --iters N        calls per timed batch (default 10)\n"
           "  --zipf S         the Zipf exponent (default 1.0)\n"
           "  --seed N         the random inputs (default 0)\n"
           "  --device D       auto (default: a GPU when usable), cuda or cpu\n"
           "  -h, --help       this help\n\n"
           "Exit status: 0 measured, 2 bad arguments, 1 no usable device or a failure.\n");
}

typedef struct {
    bool json, opened;
    int printed;
} printer;

static void open_output(printer *p) {
    if (p->opened) return;
    p->opened = true;
    if (p->json) printf("[");
    else printf("%-13s %-9s %-6s %-9s %6s %4s %6s %6s %8s %5s %9s %9s %9s\n", "shape", "routing", "pass", "recipe", "rows",
                "E", "K", "M", "max_rows", "dtype", "quant ms", "ms", "TFLOP/s");
}

static void on_case(const dw_bench_grouped_case *c, void *user) {
    printer *p = user;
    open_output(p);
    if (c->explain) fputs(c->explain, p->json ? stderr : stdout);
    if (c->skipped) {
        fprintf(stderr, "deepwell bench grouped: %s %s %s %s skipped: %s\n", c->shape, c->routing, c->pass, c->recipe,
                c->skipped);
        return;
    }
    if (p->json)
        printf("%s\n {\"shape\": \"%s\", \"routing\": \"%s\", \"pass\": \"%s\", \"recipe\": \"%s\", \"rows\": %lld, "
               "\"experts\": %lld, \"k\": %lld, \"m\": %lld, \"max_rows\": %lld, \"dtype\": \"%s\", \"quant_ms\": %.4f, "
               "\"ms\": %.4f, \"tflops\": %.1f}",
               p->printed++ ? "," : "", c->shape, c->routing, c->pass, c->recipe, (long long)c->rows,
               (long long)c->experts, (long long)c->k, (long long)c->m, (long long)c->max_rows, c->dtype, c->quant_ms,
               c->ms, c->tflops);
    else
        printf("%-13s %-9s %-6s %-9s %6lld %4lld %6lld %6lld %8lld %5s %9.4f %9.4f %9.1f\n", c->shape, c->routing,
               c->pass, c->recipe, (long long)c->rows, (long long)c->experts, (long long)c->k, (long long)c->m,
               (long long)c->max_rows, c->dtype, c->quant_ms, c->ms, c->tflops);
    fflush(stdout);
}

int bench_grouped(int argc, char **argv) {
    static const struct option opts[] = {
        {"json", no_argument, 0, 'j'},        {"shapes", required_argument, 0, 's'}, {"routing", required_argument, 0, 'r'},
        {"passes", required_argument, 0, 'p'}, {"iters", required_argument, 0, 'i'},  {"zipf", required_argument, 0, 'z'},
        {"seed", required_argument, 0, 'S'},  {"device", required_argument, 0, 'd'}, {"rows", required_argument, 0, 'R'},
        {"experts", required_argument, 0, 'E'}, {"k", required_argument, 0, 'K'},     {"m", required_argument, 0, 'M'},
        {"explain", no_argument, 0, 'x'},     {"recipe", required_argument, 0, 'c'}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    dw_bench_grouped_opts o;
    dw_bench_grouped_opts_init(&o, sizeof o);
    bool json = false;
    const char *device = "auto";
    long v = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
        case 'x': o.explain = true; break;
        case 's': o.shapes = optarg; break;
        case 'r': o.routings = optarg; break;
        case 'p': o.passes = optarg; break;
        case 'c': o.recipes = optarg; break;
        case 'd': device = optarg; break;
        case 'i':
            if (!cli_parse_int(CMD, "--iters", optarg, 1, 10000, &v)) return DW_EXIT_USAGE;
            o.iters = (int)v;
            break;
        case 'S':
            if (!cli_parse_int(CMD, "--seed", optarg, 0, 1L << 62, &v)) return DW_EXIT_USAGE;
            o.seed = (uint64_t)v;
            break;
        case 'z': {
            char *end = NULL;
            o.zipf_s = strtod(optarg, &end);
            if (!*optarg || *end || !(o.zipf_s > 0) || o.zipf_s > 8) {
                cli_error(CMD, "--zipf must be a number in (0, 8], not '%s'", optarg);
                return DW_EXIT_USAGE;
            }
            break;
        }
        case 'R': case 'E': case 'K': case 'M': {
            const char *flag = c == 'R' ? "--rows" : c == 'E' ? "--experts" : c == 'K' ? "--k" : "--m";
            if (!cli_parse_int(CMD, flag, optarg, 1, c == 'E' ? 4096 : 1L << 30, &v)) return DW_EXIT_USAGE;
            *(c == 'R' ? &o.rows : c == 'E' ? &o.experts : c == 'K' ? &o.k : &o.m) = v;
            break;
        }
        case 'h': help(); return DW_EXIT_OK;
        default: return cli_usage_error(CMD);
        }
    }
    if (optind < argc) {
        cli_error(CMD, "unexpected argument '%s'", argv[optind]);
        return DW_EXIT_USAGE;
    }
    dw_ctx *ctx = NULL;
    dw_status st = cli_ctx_create(CMD, device, &ctx);
    if (st != DW_OK) return cli_exit_for(st);
    printer p = {.json = json};
    st = dw_bench_grouped(ctx, &o, on_case, &p);
    int rc = DW_EXIT_OK;
    if (st != DW_OK) {
        rc = cli_fail(CMD, ctx, st);
    } else {
        open_output(&p);
        if (json) printf("\n]\n");
    }
    dw_ctx_free(ctx);
    return rc;
}
