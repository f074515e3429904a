/* bench_gemm.c — `deepwell bench gemm`: flags, help and printing of dw_bench_gemm (src/bench/
 * gemm.c), which times dw_gemm on the GPU for the recipes and shapes of the GEMM issue (8192^3,
 * GPT-2 and Llama-style layer shapes) and can explain every kernel selection. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *CMD = "bench gemm";


static void help(void) {
    printf("Usage: deepwell bench gemm [--json] [--explain] [--shapes LIST] [--recipes LIST] [--iters N]\n"
           "                          [--backend NAME] [--autotune]\n\n"
           "Times D = A B^T (A [m,k], B [n,k], BF16 output) through dw_gemm on CUDA device 0 with the\n"
           "kernel the registry selects, and reports TFLOP/s (2mnk / time) per shape and recipe.\n"
           "Each measurement: 3 warm-up calls, then 5 batches of N calls timed with CUDA events; the\n"
           "median batch gives ms per call. Inputs: random codes and scales, rotated among up to 4\n"
           "copies in device memory.\n\n"
           "  --json           print a JSON list of {m,n,k,recipe,backend,tflops,ms} (table otherwise)\n"
           "  --explain        print every selection: each registered kernel, eligible or why not\n"
           "                   (on a machine without a GPU: explanations only, no timing)\n"
           "  --shapes LIST    comma list of: square (8192^3), gpt2 (m=16384, n,k in {768,2304,3072}),\n"
           "                   llama (16384x14336x4096, 16384x4096x14336), vocab (GPT-2's LM head at\n"
           "                   its real vocabulary 50257: 16384x50257x768, 16384x768x50257,\n"
           "                   50257x768x16384 — rows off 16-byte alignment); default all\n"
           "  --recipes LIST   comma list of: bf16, fp8_tensor, fp8_block (1x128 A, 128x128 B: the\n"
           "                   engine's fp8_block2d), fp8_block_1x128 (1x128 A and B: the engine's\n"
           "                   fp8_block), mxfp8; default all\n"
           "  --iters N        calls per timed batch (default 20)\n"
           "  --backend NAME   force this registered kernel (cases it cannot run are skipped)\n"
           "  --autotune       time every eligible kernel on the first call of each case and use the\n"
           "                   fastest (the backend column then names the autotuned winner)\n"
           "  -h, --help       this help\n");
}

/* The names dw_bench_gemm knows of one kind (shapes or recipes), as a NULL-terminated list. */
static bool list_valid(const char *list, const char *(*name)(int)) {
    size_t len = strlen(list) + 1;
    char *copy = malloc(len), *save = NULL;
    if (!copy) return false;
    memcpy(copy, list, len);
    bool ok = true;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        bool found = false;
        for (int i = 0; name(i); i++) found |= !strcmp(t, name(i));
        if (!found) {
            cli_error(CMD, "unknown name '%s' in '%s'", t, list);
            ok = false;
        }
    }
    free(copy);
    return ok;
}

/* Printing as the cases come: a table or a JSON list on stdout, explanations on stdout (table)
 * or stderr (JSON), skipped cases on stderr. */
typedef struct {
    bool json, gpu, opened;
    int printed;
} printer;

static void open_output(printer *p) {
    if (p->opened) return;
    p->opened = true;
    if (p->json) printf("[");
    else if (p->gpu) printf("%-6s %-6s %-6s %-11s %-28s %9s %9s\n", "m", "n", "k", "recipe", "backend", "ms", "TFLOP/s");
}

static void on_case(const dw_bench_gemm_case *c, void *user) {
    printer *p = user;
    open_output(p);
    if (c->explain) fputs(c->explain, p->json ? stderr : stdout);
    if (c->skipped)
        fprintf(stderr, "deepwell bench gemm: %lldx%lldx%lld %s skipped: %s\n", (long long)c->m, (long long)c->n,
                (long long)c->k, c->recipe, c->skipped);
    if (!c->timed) return;
    if (p->json)
        printf("%s\n {\"m\": %lld, \"n\": %lld, \"k\": %lld, \"recipe\": \"%s\", \"backend\": \"%s\", "
               "\"tflops\": %.1f, \"ms\": %.4f}",
               p->printed++ ? "," : "", (long long)c->m, (long long)c->n, (long long)c->k, c->recipe, c->backend,
               c->tflops, c->ms);
    else
        printf("%-6lld %-6lld %-6lld %-11s %-28s %9.4f %9.1f\n", (long long)c->m, (long long)c->n, (long long)c->k,
               c->recipe, c->backend, c->ms, c->tflops);
    fflush(stdout);
}

int bench_gemm(int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, 0, 'j'},       {"explain", no_argument, 0, 'e'},
                                         {"shapes", required_argument, 0, 's'}, {"recipes", required_argument, 0, 'r'},
                                         {"iters", required_argument, 0, 'i'},  {"help", no_argument, 0, 'h'},
                                         {"backend", required_argument, 0, 'b'}, {"autotune", no_argument, 0, 'a'},
                                         {0, 0, 0, 0}};
    dw_bench_gemm_opts o;
    dw_bench_gemm_opts_init(&o, sizeof o);
    bool json = false;
    long iters = 20;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
        case 'e': o.explain = true; break;
        case 's': o.shapes = optarg; break;
        case 'r': o.recipes = optarg; break;
        case 'b': o.backend = optarg; break;
        case 'a': dw_gemm_set_autotune(true); break;
        case 'i':
            if (!cli_parse_int(CMD, "--iters", optarg, 1, 10000, &iters)) return DW_EXIT_USAGE;
            break;
        case 'h': help(); return DW_EXIT_OK;
        default: return cli_usage_error(CMD);
        }
    }
    if (optind < argc) {
        cli_error(CMD, "unexpected argument '%s'", argv[optind]);
        return DW_EXIT_USAGE;
    }
    if ((o.shapes && !list_valid(o.shapes, dw_bench_gemm_shape_name)) ||
        (o.recipes && !list_valid(o.recipes, dw_bench_gemm_recipe_name)))
        return DW_EXIT_USAGE;
    o.iters = (int)iters;
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_AUTO};
    dw_status st = dw_ctx_create(&co, &ctx);
    if (st != DW_OK) return cli_fail(CMD, NULL, st);
    printer p = {.json = json, .gpu = dw_ctx_device(ctx) == DW_DEVICE_CUDA};
    if (!p.gpu && !o.explain) {
        cli_error(CMD, "no CUDA GPU in this build or machine (use --explain to see selections only)");
        dw_ctx_free(ctx);
        return DW_EXIT_FAIL;
    }
    st = dw_bench_gemm(ctx, &o, on_case, &p);
    int rc = DW_EXIT_OK;
    if (st != DW_OK) {
        rc = cli_fail(CMD, ctx, st);
    } else {
        open_output(&p); /* no case at all: the empty list or the header still */
        if (json) printf("\n]\n");
    }
    dw_ctx_free(ctx);
    return rc;
}
