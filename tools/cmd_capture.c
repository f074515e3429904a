/* cmd_capture.c — `deepwell capture`: a model (config.json directory or preset) as a graph:
 * its nodes with names, ops and shapes, the parameter count and training FLOPs per token. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

static void help(void) {
    printf("Usage: deepwell capture MODEL [--json] [--seq T] [--batch B]\n"
           "       deepwell capture --list-presets\n\n"
           "Builds the training graph of MODEL and prints it: one line per node (Hugging Face\n"
           "module name, op, output shape, inputs), the parameter count (tied embeddings counted\n"
           "once) and the training FLOPs (forward + backward) per token.\n\n"
           "MODEL is a directory holding a Hugging Face config.json (model_type gpt2, llama,\n"
           "mistral, qwen2, mixtral, olmoe, qwen2_moe or qwen3_moe), a path to such a\n"
           "config.json, or a preset name. Planning-only\n"
           "presets (llama-8b, llama-70b, llama-405b, mixtral-8x7b, deepseek-v3) are refused.\n\n"
           "  --json           print one JSON object: top-level \"params\", \"flops_per_token\",\n"
           "                   \"nodes\" (and \"config\", \"tensors\", \"roles\": docs/ir.md)\n"
           "  --seq T          sequence length for shapes and attention FLOPs\n"
           "                   (default: min(max positions, 2048))\n"
           "  --batch B        batch size for shapes (default 1; FLOPs are per token)\n"
           "  --list-presets   list the model presets and exit\n"
           "  -h, --help       this help\n");
}

static int list_presets(void) {
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    if (dw_ctx_create(&co, &ctx) != DW_OK) return cli_fail("capture", NULL, DW_ERR_NOMEM);
    for (int i = 0; i < dw_model_preset_count(); i++) {
        dw_model_info c = {.size = sizeof c};
        if (dw_model_info_load(ctx, dw_model_preset_name(i), &c) != DW_OK) continue;
        printf("%-14s %-12s %3lld layers, d %5lld, heads %3lld/%-3lld kv, ffn %5lld, vocab %6lld, "
               "%8.1f M params%s\n", dw_model_preset_name(i), c.model_type, (long long)c.n_layers,
               (long long)c.d_model, (long long)c.n_heads, (long long)c.n_kv_heads,
               (long long)c.d_ff, (long long)c.vocab_size, (double)c.params / 1e6,
               c.planning_only ? "  (planning only)" : "");
    }
    dw_ctx_free(ctx);
    return DW_EXIT_OK;
}

int cmd_capture(int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, 0, 'j'},
                                         {"seq", required_argument, 0, 's'},
                                         {"batch", required_argument, 0, 'b'},
                                         {"list-presets", no_argument, 0, 'l'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    bool json = false;
    long seq = 0, batch = 1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
        case 's':
            if (!cli_parse_int("capture", "--seq", optarg, 1, 1L << 24, &seq)) return DW_EXIT_USAGE;
            break;
        case 'b':
            if (!cli_parse_int("capture", "--batch", optarg, 1, 1L << 20, &batch)) return DW_EXIT_USAGE;
            break;
        case 'l': return list_presets();
        case 'h': help(); return DW_EXIT_OK;
        default: return cli_usage_error("capture");
        }
    }
    if (optind >= argc || optind + 1 < argc) {
        if (optind >= argc) cli_error("capture", "missing MODEL (a config.json directory or a preset)");
        else cli_error("capture", "unexpected argument '%s'", argv[optind + 1]);
        return cli_usage_error("capture");
    }
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    dw_status s = dw_ctx_create(&co, &ctx);
    if (s != DW_OK) return cli_fail("capture", NULL, s);
    dw_graph *g = NULL;
    char *text = NULL;
    s = dw_capture_hf_shape(ctx, argv[optind], batch, seq, &g);
    if (s == DW_OK) s = json ? dw_graph_to_json(ctx, g, true, &text) : dw_graph_print(ctx, g, &text);
    int rc = DW_EXIT_OK;
    if (s == DW_OK) printf("%s%s", text, json ? "\n" : "");
    else rc = cli_fail("capture", ctx, s);
    dw_free_string(text);
    dw_graph_free(g);
    dw_ctx_free(ctx);
    return rc;
}
