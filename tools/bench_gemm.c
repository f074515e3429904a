/* bench_gemm.c — `deepwell bench gemm`: times dw_gemm on the GPU for the recipes and shapes of the
 * GEMM issue (8192^3, GPT-2 and Llama-style layer shapes), prints a table or JSON, and can explain
 * every kernel selection. Inputs are random valid codes (never zeros), rotated between several
 * copies when they are small enough to sit in L2. Not a correctness test (tests/gpu does that). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "formats/formats.h"
#include "gemm/gemm.h"
#include "gemm/gemm_dev.h"

static const char *CMD = "bench gemm";

int dw_bench_gemm(int argc, char **argv); /* `deepwell bench gemm`, dispatched by cmd_bench.c */

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

typedef struct {
    int64_t m, n, k;
} shape;

enum { R_BF16, R_FP8_TENSOR, R_FP8_BLOCK, R_FP8_BLOCK_1X128, R_MXFP8, R_COUNT };
static const char *rname[R_COUNT] = {"bf16", "fp8_tensor", "fp8_block", "fp8_block_1x128", "mxfp8"};

typedef struct {
    dw_ctx *ctx;
    dw_gemm_args args[4];
    int nsets;
} run_arg;

static dw_status run_one(void *p, int i) {
    run_arg *r = p;
    return dw_gemm(r->ctx, &r->args[i % r->nsets]);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static bool list_has(const char *list, const char *word) {
    if (!list) return true;
    size_t n = strlen(word);
    for (const char *p = list; (p = strstr(p, word)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == 0)) return true;
    return false;
}

static bool list_valid(const char *list, const char *const *words, int nw) {
    size_t len = strlen(list) + 1;
    char *copy = malloc(len), *save = NULL;
    if (!copy) return false;
    memcpy(copy, list, len);
    bool ok = true;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        bool found = false;
        for (int i = 0; i < nw; i++) found |= !strcmp(t, words[i]);
        if (!found) {
            cli_error(CMD, "unknown name '%s' in '%s'", t, list);
            ok = false;
        }
    }
    free(copy);
    return ok;
}

/* Operand descriptor of recipe rc for a stored [rows, k] matrix at data/scales. */
static dw_gemm_operand operand(int rc, bool is_b, int64_t rows, int64_t k, const void *data, const void *scales) {
    dw_gemm_operand o = {.trans = is_b, .rows = rows, .cols = k, .data = data, .scales = scales, .tensor_scale = 1};
    switch (rc) {
    case R_BF16: o.recipe = DW_RECIPE_BF16, o.scales = NULL; break;
    case R_FP8_TENSOR: o.recipe = DW_RECIPE_FP8_TENSOR; break;
    case R_FP8_BLOCK: o.recipe = is_b ? DW_RECIPE_FP8_BLOCK2D : DW_RECIPE_FP8_BLOCK; break;
    case R_FP8_BLOCK_1X128: o.recipe = DW_RECIPE_FP8_BLOCK; break;
    default: o.recipe = DW_RECIPE_MXFP8; break;
    }
    return o;
}

int dw_bench_gemm(int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, 0, 'j'},       {"explain", no_argument, 0, 'e'},
                                         {"shapes", required_argument, 0, 's'}, {"recipes", required_argument, 0, 'r'},
                                         {"iters", required_argument, 0, 'i'},  {"help", no_argument, 0, 'h'},
                                         {"backend", required_argument, 0, 'b'}, {"autotune", no_argument, 0, 'a'},
                                         {0, 0, 0, 0}};
    bool json = false, explain = false;
    const char *shapes = NULL, *recipes = NULL, *backend = NULL;
    long iters = 20;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
        case 'e': explain = true; break;
        case 's': shapes = optarg; break;
        case 'r': recipes = optarg; break;
        case 'b': backend = optarg; break;
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
    static const char *const shape_names[] = {"square", "gpt2", "llama", "vocab"};
    if ((shapes && !list_valid(shapes, shape_names, 4)) || (recipes && !list_valid(recipes, rname, R_COUNT)))
        return DW_EXIT_USAGE;

    shape list[16];
    int ns = 0;
    if (list_has(shapes, "square")) list[ns++] = (shape){8192, 8192, 8192};
    if (list_has(shapes, "gpt2")) {
        const int64_t d[3] = {768, 2304, 3072};
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) list[ns++] = (shape){16384, d[i], d[j]};
    }
    if (list_has(shapes, "llama")) {
        list[ns++] = (shape){16384, 14336, 4096};
        list[ns++] = (shape){16384, 4096, 14336};
    }
    if (list_has(shapes, "vocab")) { /* the three LM-head GEMMs of GPT-2 at V = 50257, N = 16384 tokens */
        list[ns++] = (shape){16384, 50257, 768};
        list[ns++] = (shape){16384, 768, 50257};
        list[ns++] = (shape){50257, 768, 16384};
    }

    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_AUTO};
    dw_status st = dw_ctx_create(&co, &ctx);
    if (st != DW_OK) return cli_fail(CMD, NULL, st);
    bool gpu = dw_ctx_device(ctx) == DW_DEVICE_CUDA;
    if (!gpu && !explain) {
        cli_error(CMD, "no CUDA GPU in this build or machine (use --explain to see selections only)");
        dw_ctx_free(ctx);
        return DW_EXIT_FAIL;
    }

    /* device pool: random bytes valid both as E4M3 (|x| in [1, 4)) and as BF16 pairs (finite) */
    size_t max_set = 0;
    for (int i = 0; i < ns; i++) {
        size_t s = (size_t)((list[i].m + list[i].n) * list[i].k) * 2;
        if (s > max_set) max_set = s;
    }
    size_t pool_bytes = gpu ? max_set * 2 : 0;
    if (pool_bytes < ((size_t)1 << 30) && gpu) pool_bytes = (size_t)1 << 30;
    int64_t max_scales = 0;
    for (int i = 0; i < ns; i++) {
        int64_t s = (list[i].m + list[i].n) * (list[i].k / 32 + 1);
        if (s > max_scales) max_scales = s;
    }
    void *pool = NULL, *fscales = NULL, *bscales = NULL;
    int rc = DW_EXIT_OK;
    if (gpu) {
        uint8_t *h = malloc(pool_bytes);
        float *hf = malloc((size_t)max_scales * 4);
        uint8_t *hb = malloc((size_t)max_scales);
        if (!h || !hf || !hb) {
            cli_error(CMD, "out of host memory for %zu bytes of inputs", pool_bytes);
            free(h), free(hf), free(hb);
            dw_ctx_free(ctx);
            return DW_EXIT_FAIL;
        }
        uint64_t x = 0x9E3779B97F4A7C15ull;
        for (size_t i = 0; i < pool_bytes; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            h[i] = (uint8_t)(0x38 + (x >> 40) % 9) | (uint8_t)((x >> 20) & 0x80);
        }
        for (int64_t i = 0; i < max_scales; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            hf[i] = 0.5f + (float)((x >> 11) % 1024) / 683.0f;
            hb[i] = (uint8_t)(125 + (x >> 30) % 5);
        }
        if ((st = dw_gemm_dev_alloc(ctx, pool_bytes, &pool)) != DW_OK ||
            (st = dw_gemm_dev_alloc(ctx, (size_t)max_scales * 4, &fscales)) != DW_OK ||
            (st = dw_gemm_dev_alloc(ctx, (size_t)max_scales, &bscales)) != DW_OK ||
            (st = dw_gemm_dev_upload(ctx, pool, h, pool_bytes)) != DW_OK ||
            (st = dw_gemm_dev_upload(ctx, fscales, hf, (size_t)max_scales * 4)) != DW_OK ||
            (st = dw_gemm_dev_upload(ctx, bscales, hb, (size_t)max_scales)) != DW_OK)
            rc = cli_fail(CMD, ctx, st);
        free(h), free(hf), free(hb);
    }
    void *d = NULL;
    if (rc == DW_EXIT_OK && gpu) {
        size_t dmax = 0;
        for (int i = 0; i < ns; i++)
            if ((size_t)(list[i].m * list[i].n) * 2 > dmax) dmax = (size_t)(list[i].m * list[i].n) * 2;
        if ((st = dw_gemm_dev_alloc(ctx, dmax, &d)) != DW_OK) rc = cli_fail(CMD, ctx, st);
    }
    if (json && rc == DW_EXIT_OK) printf("[");
    int printed = 0;
    if (!json && rc == DW_EXIT_OK && gpu)
        printf("%-6s %-6s %-6s %-11s %-28s %9s %9s\n", "m", "n", "k", "recipe", "backend", "ms", "TFLOP/s");
    for (int si = 0; si < ns && rc == DW_EXIT_OK; si++)
        for (int r = 0; r < R_COUNT && rc == DW_EXIT_OK; r++) {
            if (!list_has(recipes, rname[r])) continue;
            shape s = list[si];
            size_t esz = r == R_BF16 ? 2 : 1, set = (size_t)((s.m + s.n) * s.k) * esz;
            run_arg ra = {.ctx = ctx, .nsets = 1};
            if (gpu) {
                ra.nsets = (int)(pool_bytes / set);
                if (ra.nsets > 4) ra.nsets = 4;
            }
            const void *sc = r == R_MXFP8 ? bscales : fscales;
            for (int q = 0; q < ra.nsets; q++) {
                const uint8_t *base = (const uint8_t *)pool + (size_t)q * set;
                dw_gemm_args a = {.m = s.m, .n = s.n, .k = s.k, .alpha = 1, .d = d, .out_type = DW_GEMM_OUT_BF16};
                a.backend = backend;
                a.a = operand(r, false, s.m, s.k, base, sc);
                a.b = operand(r, true, s.n, s.k, base + (size_t)(s.m * s.k) * esz, sc);
                /* on a CPU-only machine (explain only) any non-NULL pointers do: nothing runs */
                if (!gpu) a.a.data = a.b.data = a.a.scales = a.b.scales = &ra, a.d = &ra;
                if (r == R_BF16) a.a.scales = a.b.scales = NULL;
                ra.args[q] = a;
            }
            if (explain) {
                char *ex = NULL;
                if ((st = dw_gemm_explain(ctx, &ra.args[0], &ex)) != DW_OK) {
                    rc = cli_fail(CMD, ctx, st);
                    break;
                }
                fputs(ex, json ? stderr : stdout);
                dw_free_string(ex);
            }
            if (!gpu) continue;
            const char *name = NULL;
            if ((st = dw_gemm_select(ctx, &ra.args[0], &name)) != DW_OK) {
                fprintf(stderr, "deepwell bench gemm: %lldx%lldx%lld %s skipped: %s\n", (long long)s.m,
                        (long long)s.n, (long long)s.k, rname[r], dw_errmsg(ctx));
                continue;
            }
            double ms[5], t;
            st = dw_gemm_dev_time(ctx, 3, run_one, &ra, &t); /* warm-up (and autotuning, when on) */
            if (st == DW_OK) st = dw_gemm_select(ctx, &ra.args[0], &name);
            for (int b = 0; b < 5 && st == DW_OK; b++) {
                st = dw_gemm_dev_time(ctx, (int)iters, run_one, &ra, &t);
                ms[b] = t / (double)iters;
            }
            if (st != DW_OK) {
                rc = cli_fail(CMD, ctx, st);
                break;
            }
            qsort(ms, 5, sizeof ms[0], cmp_double);
            double tf = 2.0 * (double)s.m * (double)s.n * (double)s.k / (ms[2] * 1e-3) / 1e12;
            if (json)
                printf("%s\n {\"m\": %lld, \"n\": %lld, \"k\": %lld, \"recipe\": \"%s\", \"backend\": \"%s\", "
                       "\"tflops\": %.1f, \"ms\": %.4f}",
                       printed++ ? "," : "", (long long)s.m, (long long)s.n, (long long)s.k, rname[r], name, tf, ms[2]);
            else
                printf("%-6lld %-6lld %-6lld %-11s %-28s %9.4f %9.1f\n", (long long)s.m, (long long)s.n, (long long)s.k,
                       rname[r], name, ms[2], tf);
            fflush(stdout);
        }
    if (json && rc == DW_EXIT_OK) printf("\n]\n");
    dw_gemm_dev_free(pool);
    dw_gemm_dev_free(fscales);
    dw_gemm_dev_free(bscales);
    dw_gemm_dev_free(d);
    dw_ctx_free(ctx);
    return rc;
}
