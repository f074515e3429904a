/* cmd_compile.c — `deepwell compile`: compiles a model's graph into the program a backend runs
 * (the CUDA one by default) under a precision policy and prints it: the steps, per node the recipe
 * and why and the kernels, and the planned memory per pool. Planning only: needs no GPU. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void help(void) {
    printf("Usage: deepwell compile MODEL [--precision R | --policy FILE] [--fallback F]\n"
           "                        [--batch B] [--seq T] [--target cuda|cpu] [--sm N] [--recompute none|selective|full|N]\n"
           "                        [--report] [--explain]\n\n"
           "Compiles MODEL's training graph into the program an engine runs (steps, kernel binding,\n"
           "static memory plan) and prints the planned bytes of each memory pool (weights, grads,\n"
           "optimizer, activations, workspace). Needs no GPU.\n\n"
           "MODEL is a directory holding a Hugging Face config.json, a config.json path, or a preset\n"
           "name (see `deepwell capture --list-presets`).\n\n"
           "  --precision R    default recipe of the linear layers: bf16 (default), fp8_tensor,\n"
           "                   fp8_row, fp8_block, fp8_block2d, mxfp8, mxfp8_e5m2, mxfp4, nvfp4;\n"
           "                   or fp32: FP32 activations and the FP32 reference GEMM (the mode the\n"
           "                   engine's parity tests use). --report shows per quantised node which\n"
           "                   GEMMs run quantised and which fall back to BF16 at this shape on the\n"
           "                   target, with the kernel the GEMM registry picks and why. Under\n"
           "                   fp8_block and fp8_block2d the MoE experts keep their wgrad BF16 by\n"
           "                   default (faster on sm_90; docs/precision.md)\n"
           "  --policy FILE    a precision policy JSON ({\"default\": ..., \"fallback\": ...,\n"
           "                   \"rules\": [...]}) instead of --precision; a rule's \"bf16_passes\"\n"
           "                   names the GEMMs it keeps BF16 ([]: none, the experts' wgrad too)\n"
           "  --fallback F     with --precision, what stays BF16: head (default) the LM head; safe\n"
           "                   also embeddings and the first and last block; none nothing\n"
           "  --batch B        sequences per step (default 1)\n"
           "  --seq T          tokens per sequence (default min(max positions, 2048))\n"
           "  --target D       the backend the program is for: cuda (default) or cpu (the reference,\n"
           "                   which runs any program; its GEMMs are all quantised)\n"
           "  --sm N           CUDA target: compute capability x10 the kernels are chosen for (90)\n"
           "  --recompute R    none (default), selective, full or N (the first N blocks): full runs\n"
           "                   those blocks' forwards again just before their backward and keeps only\n"
           "                   their inputs; selective runs the norms feeding linear layers and the MLP\n"
           "                   activations again (a smaller activation pool)\n"
           "  --report         also list every node: recipe and why, kernel and why\n"
           "  --explain        then each MoE linear layer's grouped GEMM selection per pass (fprop,\n"
           "                   dgrad, wgrad): every registered grouped kernel, eligible or why not,\n"
           "                   and the one the engine runs\n"
           "  -h, --help       this help\n\n"
           "Exit status: 0 planned, 2 bad arguments or model, 1 other failures.\n");
}

int cmd_compile(int argc, char **argv) {
    static const struct option opts[] = {{"precision", required_argument, 0, 'p'},
                                         {"policy", required_argument, 0, 'P'},
                                         {"fallback", required_argument, 0, 'f'},
                                         {"batch", required_argument, 0, 'b'},
                                         {"seq", required_argument, 0, 's'},
                                         {"report", no_argument, 0, 'r'},
                                         {"explain", no_argument, 0, 'x'},
                                         {"target", required_argument, 0, 't'},
                                         {"sm", required_argument, 0, 'm'},
                                         {"recompute", required_argument, 0, 'R'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *precision = NULL, *policy_path = NULL, *fallback = NULL;
    long B = 1, T = 0, sm = 90;
    bool report = false, explain = false;
    dw_device_kind target = DW_DEVICE_CUDA;
    int c, recompute = DW_RECOMPUTE_NONE, recompute_blocks = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'p': precision = optarg; break;
        case 'P': policy_path = optarg; break;
        case 'f': fallback = optarg; break;
        case 'b':
            if (!cli_parse_int("compile", "--batch", optarg, 1, 1 << 20, &B)) return DW_EXIT_USAGE;
            break;
        case 's':
            if (!cli_parse_int("compile", "--seq", optarg, 1, 1 << 24, &T)) return DW_EXIT_USAGE;
            break;
        case 'r': report = true; break;
        case 'x': explain = true; break;
        case 't':
            if (strcmp(optarg, "cuda") && strcmp(optarg, "cpu")) {
                cli_error("compile", "--target must be cuda or cpu, not '%s'", optarg);
                return DW_EXIT_USAGE;
            }
            target = strcmp(optarg, "cuda") ? DW_DEVICE_CPU : DW_DEVICE_CUDA;
            break;
        case 'm':
            if (!cli_parse_int("compile", "--sm", optarg, 50, 200, &sm)) return DW_EXIT_USAGE;
            break;
        case 'R':
            if (!cli_parse_recompute("compile", optarg, &recompute, &recompute_blocks)) return DW_EXIT_USAGE;
            break;
        case 'h': help(); return DW_EXIT_OK;
        default: return cli_usage_error("compile");
        }
    }
    if (optind >= argc || optind + 1 < argc) {
        cli_error("compile", "expected exactly one MODEL (a config.json directory, file or preset)");
        return DW_EXIT_USAGE;
    }
    if (policy_path && (precision || fallback)) {
        cli_error("compile", "--policy FILE replaces --precision and --fallback; give one or the other");
        return DW_EXIT_USAGE;
    }
    if (fallback && strcmp(fallback, "safe") && strcmp(fallback, "head") && strcmp(fallback, "none")) {
        cli_error("compile", "--fallback must be 'safe', 'head' or 'none', not '%s'", fallback);
        return DW_EXIT_USAGE;
    }
    bool fp32 = precision && !strcmp(precision, "fp32");
    if (fp32 && fallback) {
        cli_error("compile", "--fallback applies to quantised recipes, not to --precision fp32");
        return DW_EXIT_USAGE;
    }
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    dw_ctx *ctx = NULL;
    if (dw_ctx_create(&co, &ctx) != DW_OK) {
        cli_error("compile", "%s", dw_errmsg(NULL));
        return DW_EXIT_FAIL;
    }
    dw_graph *g = NULL;
    dw_policy *pol = NULL;
    dw_compiled *cp = NULL;
    char *text = NULL;
    dw_status s = dw_capture_hf_shape(ctx, argv[optind], B, T, &g);
    if (s == DW_OK && policy_path) s = dw_policy_load(ctx, policy_path, &pol);
    else if (s == DW_OK && !fp32)
        s = dw_policy_from_precision(ctx, precision ? precision : "bf16",
                                     fallback && !strcmp(fallback, "safe"), &pol);
    if (s == DW_OK && pol && fallback && !policy_path) s = dw_policy_set_fallback(ctx, pol, fallback);
    dw_compile_opts co2;
    dw_compile_opts_init(&co2, sizeof co2);
    co2.device = target;
    co2.sm = target == DW_DEVICE_CUDA ? (int)sm : 0;
    co2.recompute = recompute, co2.recompute_blocks = recompute_blocks;
    if (s == DW_OK) s = dw_compile(ctx, g, NULL, pol, &co2, &cp);
    if (s == DW_OK) s = dw_compiled_report(ctx, cp, &text);
    char *why = NULL;
    if (s == DW_OK && explain) s = dw_compiled_explain(ctx, cp, &why);
    int rc = DW_EXIT_OK;
    if (s != DW_OK) {
        rc = cli_fail("compile", ctx, s);
    } else if (report) {
        fputs(text, stdout);
    } else { /* the header and the memory plan only */
        const char *nodes = strstr(text, "\nnodes ("), *mem = strstr(text, "\nmemory plan");
        fwrite(text, 1, nodes ? (size_t)(nodes - text) + 1 : strlen(text), stdout);
        const char *uns = strstr(text, " backend cannot run this: "); /* its line, from the "\nthe" before it */
        while (uns && uns > text && uns[-1] != '\n') uns--;
        if (uns) fwrite(uns - 1, 1, (size_t)(strchr(uns, '\n') - uns) + 2, stdout);
        if (mem) fputs(mem, stdout);
    }
    if (rc == DW_EXIT_OK && why) printf("\n%s", why);
    dw_free_string(why);
    dw_free_string(text);
    dw_compiled_free(cp);
    dw_policy_free(pol);
    dw_graph_free(g);
    dw_ctx_free(ctx);
    return rc;
}
