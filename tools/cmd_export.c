/* cmd_export.c — `deepwell export`: a run, checkpoint or model directory's weights as a Hugging
 * Face model directory (the work is dw_export_hf's; docs/export.md). Parses the flags, the size
 * suffixes of --max-shard-size, and lists what was written. */
#include <dirent.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

#define CMD "export"

static void help(void) {
    printf("Usage: deepwell export SRC --out DIR [--format hf|hf-fp8] [--dtype bf16|f32]\n"
           "                       [--expert-layout per-expert|fused] [--max-shard-size SIZE] [--hf-dir DIR]\n\n"
           "Writes the weights of SRC as a Hugging Face model directory that transformers loads:\n"
           "config.json (model_type and every key of the family, rope scaling included), the weights\n"
           "under the family's tensor names and layouts (tied embeddings once) as model.safetensors,\n"
           "or as model-0000k-of-0000n.safetensors + model.safetensors.index.json past the shard\n"
           "size, and generation_config.json and the tokenizer files of the model directory the\n"
           "weights started from (else a checkpoint's own tokenizer.json). Everything is written into a temporary directory beside DIR and\n"
           "renamed at the end: on any error nothing is left.\n\n"
           "SRC is a run directory (its newest checkpoint), a checkpoint (ckpt-<step>/) or a Hugging\n"
           "Face model directory with weights.\n\n"
           "  --out DIR              the new model directory; must not exist or be empty\n"
           "  --format F             hf (default): every tensor in --dtype;\n"
           "                         hf-fp8: the q/k/v/o and MLP/expert projection weights as FP8 E4M3\n"
           "                         with one F32 scale per 128 x 128 block (NAME.weight_scale_inv;\n"
           "                         fused experts NAME_scale_inv), config quantization_config\n"
           "                         {quant_method fp8, fmt e4m3, activation_scheme dynamic,\n"
           "                         weight_block_size [128, 128]}; embeddings, norms, routers and the\n"
           "                         LM head stay in --dtype (GPT-2 is refused: Conv1D layers)\n"
           "  --dtype D              bf16 (default; round to nearest even) or f32 (the exact weights)\n"
           "  --expert-layout L      mixture of experts: per-expert (block_sparse_moe.experts.{e}.w1/w2/w3,\n"
           "                         as transformers 4) or fused (mlp.experts.gate_up_proj [E,2F,C],\n"
           "                         down_proj [E,C,F], as transformers 5); default: the layout of SRC\n"
           "                         when it is a model directory, else of --hf-dir's weights, else\n"
           "                         per-expert\n"
           "  --max-shard-size SIZE  tensor bytes per file: a number with B, KB, MB, GB (powers of 1000)\n"
           "                         or KiB, MiB, GiB (powers of 1024); default 5GB as transformers\n"
           "  --hf-dir DIR           the Hugging Face model directory the run started from: its\n"
           "                         config.json keys Deepwell does not model are kept and its\n"
           "                         generation_config.json and tokenizer files copied (default: SRC\n"
           "                         when it is a model directory)\n"
           "  -h, --help             this help\n\n"
           "Exit status: 0 written, 2 bad arguments or input (unknown format, a run without\n"
           "checkpoints), 3 I/O (DIR exists and is not empty, cannot be created, a full disk), 1 other\n"
           "failures (deepwell --help has the table).\n");
}

/* "5GB", "500MB", "2GiB", "1048576": bytes, as transformers reads max_shard_size. */
static bool parse_size(const char *text, int64_t *out) {
    static const struct { const char *suffix; double mult; } units[] = {
        {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
        {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1.0}, {"", 1.0}};
    char *end = NULL;
    double v = strtod(text, &end);
    if (end == text || !(v > 0)) return false;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].suffix)) {
            double b = v * units[i].mult;
            if (b < 1 || b > 9e18) return false;
            *out = (int64_t)b;
            return true;
        }
    return false;
}

/* The files of dir with their sizes, on stdout. */
static void list_files(const char *dir) {
    DIR *d = opendir(dir);
    const struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[4096 + 256];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(p, &sb) == 0) printf("  %-40s %12lld bytes\n", e->d_name, (long long)sb.st_size);
    }
    if (d) closedir(d);
}

/* A flag's spellings and the value each stands for; a NULL name ends the list. */
typedef struct {
    const char *name;
    int value;
} choice;
static const choice formats[] = {{"hf", DW_EXPORT_HF}, {"hf-fp8", DW_EXPORT_HF_FP8}, {NULL, 0}};
static const choice dtypes[] = {{"bf16", DW_EXPORT_BF16}, {"bfloat16", DW_EXPORT_BF16}, {"f32", DW_EXPORT_F32},
                                {"fp32", DW_EXPORT_F32},  {"float32", DW_EXPORT_F32},  {NULL, 0}};
static const choice layouts[] = {{"per-expert", DW_WEIGHTS_LAYOUT_PER_EXPERT}, {"fused", DW_WEIGHTS_LAYOUT_FUSED}, {NULL, 0}};

static bool choose(const char *flag, const char *text, const choice *c, const char *expected, int *out) {
    for (; c->name; c++)
        if (!strcmp(text, c->name)) {
            *out = c->value;
            return true;
        }
    cli_error(CMD, "%s '%s': expected %s", flag, text, expected);
    return false;
}

int cmd_export(int argc, char **argv) {
    static const struct option opts[] = {{"out", required_argument, 0, 'o'},
                                         {"format", required_argument, 0, 'f'},
                                         {"dtype", required_argument, 0, 'd'},
                                         {"expert-layout", required_argument, 0, 'l'},
                                         {"max-shard-size", required_argument, 0, 's'},
                                         {"hf-dir", required_argument, 0, 'H'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    dw_export_opts o;
    dw_export_opts_init(&o, sizeof o);
    const char *out = NULL;
    int c, v;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'f':
            if (!choose("--format", optarg, formats, "hf or hf-fp8", &v)) return DW_EXIT_USAGE;
            o.format = (dw_export_format)v;
            break;
        case 'd':
            if (!choose("--dtype", optarg, dtypes, "bf16 or f32", &v)) return DW_EXIT_USAGE;
            o.dtype = (dw_export_dtype)v;
            break;
        case 'l':
            if (!choose("--expert-layout", optarg, layouts, "per-expert or fused", &v)) return DW_EXIT_USAGE;
            o.layout = (dw_weights_layout)v;
            break;
        case 's':
            if (!parse_size(optarg, &o.max_shard_bytes)) {
                cli_error(CMD, "--max-shard-size '%s': expected a positive size such as 5GB, 500MB, 2GiB or bytes",
                          optarg);
                return DW_EXIT_USAGE;
            }
            break;
        case 'H': o.hf_dir = optarg; break;
        case 'h': help(); return DW_EXIT_OK;
        default: return cli_usage_error(CMD);
        }
    }
    if (optind >= argc || optind + 1 < argc || !out) {
        if (optind + 1 < argc) cli_error(CMD, "unexpected argument '%s'", argv[optind + 1]);
        else cli_error(CMD, optind >= argc ? "missing SRC (a run directory, checkpoint or model directory)"
                                           : "missing --out DIR");
        return cli_usage_error(CMD);
    }
    const char *src = argv[optind];
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    dw_status s = dw_ctx_create(&co, &ctx);
    if (s != DW_OK) return cli_fail(CMD, NULL, s);
    const double t0 = cli_now();
    s = dw_export_hf(ctx, src, out, &o);
    int rc = DW_EXIT_OK;
    if (s != DW_OK) {
        rc = cli_fail(CMD, ctx, s);
    } else {
        printf("exported %s -> %s (%s, %s) in %.1f s\n", src, out, o.format == DW_EXPORT_HF_FP8 ? "hf-fp8" : "hf",
               o.dtype == DW_EXPORT_F32 ? "f32" : "bf16", cli_now() - t0);
        list_files(out);
    }
    dw_ctx_free(ctx);
    return rc;
}
