/* cmd_quant_report.c — `deepwell quant-report`: how much error each recipe introduces on a
 * checkpoint's tensors (SQNR, max abs and relative error, saturation, flush to zero), per tensor
 * and element-weighted per recipe; or, given a training run's directory, its quantised layers
 * over the run (recipes, fallbacks, error statistics per checkpoint interval). Flags and printing
 * only: the reports are dw_quant_report's and dw_quant_run_report's. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

static void help(void) {
    printf("Usage: deepwell quant-report MODEL.safetensors [--recipes LIST] [--scale-rounding rceil|floor]\n"
           "                             [--pow2] [--json]\n"
           "       deepwell quant-report RUN [--json]\n\n"
           "RUN, a directory `deepwell train --out` wrote: its quantised layers over the run, from\n"
           "RUN/quant_stats.jsonl (every --quant-check-every steps), RUN/precision_decisions.jsonl and\n"
           "the latest checkpoint: per layer the recipe, the recipe now and each fallback (step, tensor,\n"
           "reason); per quantised GEMM operand measured at the checks (x, x^T, w, w^T, and dy, dy^T from\n"
           "the check step's backward) the first, last and largest bulk error (rel error in brackets)\n"
           "with their steps, overflow and underflow summed; the overflows and underflows the quantisers\n"
           "counted at every training step, per layer for x, w and dy, with the steps they cover; then\n"
           "each layer's largest bulk error per checkpoint interval (--ckpt-every). --json: {run,\n"
           "checkpoint, checks, first_step, last_step, ckpt_every, layers: [{layer, recipe, now,\n"
           "fallbacks, tensors, counts: {steps, x, w, dy: {overflow, underflow}}, intervals}]}\n"
           "(docs/precision.md, Guardrails).\n\n"
           "MODEL.safetensors:\n"
           "Quantises every tensor of MODEL with each recipe (exact CPU reference, the same rules as\n"
           "`deepwell quantize`), dequantises it again and compares with the original x:\n"
           "  SQNR dB      10 log10(sum x^2 / sum (x-q)^2)  (inf when exact)\n"
           "  max abs err  max |x - q|\n"
           "  rel err      ||x - q|| / ||x||\n"
           "  sat %%        elements clipped: |x| beyond what rounds to the largest value of its block\n"
           "               (above 464 x scale for E4M3, 61440 x scale for E5M2, 7 x scale for E2M1)\n"
           "  flushed %%    nonzero x whose q is 0\n"
           "then one summary line per recipe, element-weighted over the tensors the recipe applies to\n"
           "(F32, BF16 or F16; 1-D or 2-D; columns a multiple of the block; see deepwell quantize --help).\n"
           "Tensors a recipe does not apply to are listed with the reason.\n\n"
           "  --recipes LIST          comma-separated recipes (default: all of fp8_tensor, fp8_row,\n"
           "                          fp8_block, fp8_block2d, mxfp8, mxfp8_e5m2, mxfp4, nvfp4)\n"
           "  --scale-rounding MODE   for the MX recipes: rceil (default) or floor\n"
           "  --pow2                  for the fp8_* recipes: power-of-two scales\n"
           "  --json                  one JSON object: file, options, recipes, tensors[] with results per\n"
           "                          recipe (sqnr_db is null when exact or x is all zero), summary\n"
           "  -h, --help              this help\n\n"
           "Exit status: 0 reported, 2 bad arguments or malformed input, 3 unreadable input (a RUN\n"
           "without quant_stats.jsonl), 1 other failures.\n");
}

static bool parse_recipes(const char *text, int32_t *list, int *n) {
    *n = 0;
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, ",");
        char tok[32];
        dw_recipe r;
        snprintf(tok, sizeof tok, "%.*s", (int)(len < sizeof tok ? len : sizeof tok - 1), p);
        if (len == 0 || len >= sizeof tok || !dw_recipe_parse(tok, &r) || r == DW_RECIPE_BF16) {
            cli_error("quant-report", "unknown recipe '%.*s' in --recipes", (int)len, p);
            return false;
        }
        bool dup = false;
        for (int i = 0; i < *n; i++) dup |= list[i] == (int32_t)r;
        if (!dup) list[(*n)++] = r;
        p += len;
        if (*p == ',') p++;
    }
    if (*n == 0) {
        cli_error("quant-report", "--recipes is empty");
        return false;
    }
    return true;
}

int cmd_quant_report(int argc, char **argv) {
    static const struct option opts[] = {{"recipes", required_argument, 0, 'r'},
                                         {"scale-rounding", required_argument, 0, 's'},
                                         {"pow2", no_argument, 0, 'p'},
                                         {"json", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    dw_quant_report_opts ro;
    dw_quant_report_opts_init(&ro, sizeof ro);
    int32_t recipes[DW_RECIPE_COUNT];
    dw_scale_rounding rounding = DW_SCALE_RCEIL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'r':
            if (!parse_recipes(optarg, recipes, &ro.n_recipes)) return DW_EXIT_USAGE;
            ro.recipes = recipes;
            break;
        case 's':
            if (!dw_scale_rounding_parse(optarg, &rounding)) {
                cli_error("quant-report", "--scale-rounding expects rceil or floor, got '%s'", optarg);
                return DW_EXIT_USAGE;
            }
            ro.rounding = rounding;
            break;
        case 'p': ro.pow2 = true; break;
        case 'j': ro.json = true; break;
        case 'h': help(); return DW_EXIT_OK;
        default: return cli_usage_error("quant-report");
        }
    }
    if (argc - optind != 1) {
        cli_error("quant-report", "expected one MODEL.safetensors or RUN directory, got %d argument(s)", argc - optind);
        return cli_usage_error("quant-report");
    }
    struct stat sb;
    const bool run = stat(argv[optind], &sb) == 0 && S_ISDIR(sb.st_mode);
    if (run && (ro.recipes || ro.pow2 || rounding != DW_SCALE_RCEIL)) {
        cli_error("quant-report", "%s is a run directory: --recipes, --scale-rounding and --pow2 apply to a "
                  "MODEL.safetensors", argv[optind]);
        return cli_usage_error("quant-report");
    }
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    dw_status s = dw_ctx_create(&co, &ctx);
    if (s != DW_OK) return cli_fail("quant-report", NULL, s);
    char *text = NULL;
    s = run ? dw_quant_run_report(ctx, argv[optind], ro.json, &text) : dw_quant_report(ctx, argv[optind], &ro, &text);
    int rc = s == DW_OK ? DW_EXIT_OK : cli_fail("quant-report", ctx, s);
    if (s == DW_OK) printf("%s%s", text, ro.json ? "\n" : "");
    dw_free_string(text);
    dw_ctx_free(ctx);
    return rc;
}
