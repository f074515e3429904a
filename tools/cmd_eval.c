/* cmd_eval.c — `deepwell eval`: the mean cross-entropy of a model on one batch of tokens from a
 * raw byte file or an llm.c token shard, on the CPU reference engine. The minimal batch reader
 * here is a stop-gap until the trainer's data loader (src/train/) lands. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/fileio.h"
#include "runtime/engine_cpu.h"
#include "cli.h"

static void help(void) {
    printf("Usage: deepwell eval MODEL --data FILE [--batch B] [--seq T] [--weights W] [--seed S]\n\n"
           "Computes the mean next-token cross-entropy of MODEL on the first B x T tokens of FILE\n"
           "(targets are the tokens shifted by one) on the CPU reference engine, and prints it.\n\n"
           "MODEL is a directory holding a Hugging Face config.json, a config.json path, or a preset\n"
           "name. Weights come from --weights, else from MODEL's directory when it has\n"
           "model.safetensors (or a sharded index), else they are initialised from --seed as the\n"
           "reference implementation does (a notice says so).\n\n"
           "  --data FILE      an llm.c token shard (.bin: 256 x int32 header, magic 20240520 with\n"
           "                   uint16 tokens or 20240801 with uint32 tokens), or any other file,\n"
           "                   read as raw bytes (byte-level tokens 0..255)\n"
           "  --batch B        sequences in the batch (default 4)\n"
           "  --seq T          tokens per sequence (default min(max positions, 128))\n"
           "  --weights W      a .safetensors file or a directory (model.safetensors or\n"
           "                   model.safetensors.index.json), Hugging Face names and layouts\n"
           "  --seed S         seed for initialised weights (default 1337)\n"
           "  --dump FILE      debugging and parity tests: also run backward and write the logits,\n"
           "                   the loss and every parameter's gradient (HF names and layouts) to\n"
           "                   FILE as safetensors\n"
           "  -h, --help       this help\n");
}

/* Reads B*T+1 tokens from `path` into tokens[]; llm.c shards by magic, else raw bytes. */
static dw_status read_tokens(dw_ctx *ctx, const char *path, int64_t need, int32_t *tokens) {
    char *data = NULL;
    size_t size = 0;
    DW_TRY(dw_read_file(ctx, path, &data, &size));
    int32_t hdr[3] = {0, 0, 0};
    if (size >= 1024) memcpy(hdr, data, sizeof hdr);
    dw_status s = DW_OK;
    if (hdr[0] == 20240520 || hdr[0] == 20240801) {
        size_t width = hdr[0] == 20240520 ? 2 : 4;
        int64_t n = hdr[2];
        if (hdr[1] != 1 && hdr[1] != 7)
            s = dw_set_error(ctx, DW_ERR_FORMAT, "%s: llm.c shard version %d is not supported", path, hdr[1]);
        else if (n < 0 || (size - 1024) / width < (size_t)n)
            s = dw_set_error(ctx, DW_ERR_FORMAT, "%s: header says %lld tokens, the file holds %zu",
                             path, (long long)n, (size - 1024) / width);
        else if (n < need)
            s = dw_set_error(ctx, DW_ERR_INVALID, "%s: %lld tokens; one batch needs %lld", path,
                             (long long)n, (long long)need);
        for (int64_t i = 0; s == DW_OK && i < need; i++) {
            uint32_t v = 0;
            if (width == 2) {
                uint16_t h;
                memcpy(&h, data + 1024 + i * 2, 2);
                v = h;
            } else {
                memcpy(&v, data + 1024 + i * 4, 4);
            }
            if (v > INT32_MAX) s = dw_set_error(ctx, DW_ERR_FORMAT, "%s: token %lld is %u", path, (long long)i, v);
            tokens[i] = (int32_t)v;
        }
    } else if ((int64_t)size < need) {
        s = dw_set_error(ctx, DW_ERR_INVALID, "%s: %zu bytes; one batch of byte tokens needs %lld",
                         path, size, (long long)need);
    } else {
        for (int64_t i = 0; i < need; i++) tokens[i] = (unsigned char)data[i];
    }
    free(data);
    return s;
}

static bool has_weights(const char *model) {
    struct stat st;
    char p[4096];
    if (stat(model, &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    snprintf(p, sizeof p, "%s/model.safetensors", model);
    if (stat(p, &st) == 0) return true;
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", model);
    return stat(p, &st) == 0;
}

int cmd_eval(int argc, char **argv) {
    static const struct option opts[] = {{"data", required_argument, 0, 'd'},
                                         {"batch", required_argument, 0, 'b'},
                                         {"seq", required_argument, 0, 's'},
                                         {"weights", required_argument, 0, 'w'},
                                         {"seed", required_argument, 0, 'r'},
                                         {"dump", required_argument, 0, 'u'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *data = NULL, *weights = NULL, *dump = NULL;
    long B = 4, T = 0, seed = 1337;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'd': data = optarg; break;
        case 'b':
            if (!cli_parse_int("eval", "--batch", optarg, 1, 1 << 20, &B)) return DW_EXIT_USAGE;
            break;
        case 's':
            if (!cli_parse_int("eval", "--seq", optarg, 1, 1 << 24, &T)) return DW_EXIT_USAGE;
            break;
        case 'w': weights = optarg; break;
        case 'r':
            if (!cli_parse_int("eval", "--seed", optarg, 0, 0x7fffffffL, &seed)) return DW_EXIT_USAGE;
            break;
        case 'u': dump = optarg; break;
        case 'h': help(); return DW_EXIT_OK;
        default: return cli_usage_error("eval");
        }
    }
    if (optind >= argc || optind + 1 < argc || !data) {
        if (optind + 1 < argc) cli_error("eval", "unexpected argument '%s'", argv[optind + 1]);
        else cli_error("eval", optind >= argc ? "missing MODEL" : "missing --data FILE");
        return cli_usage_error("eval");
    }
    const char *model = argv[optind];
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    dw_status s = dw_ctx_create(&co, &ctx);
    if (s != DW_OK) return cli_fail("eval", NULL, s);
    dw_model_config cfg;
    dw_engine *e = NULL;
    int32_t *tok = NULL;
    float *logits = NULL;
    double loss = 0;
    s = dw_model_config_load(ctx, model, &cfg);
    if (s == DW_OK && T == 0) T = cfg.max_seq < 128 ? (long)cfg.max_seq : 128;
    if (s == DW_OK) s = dw_engine_create_cpu(ctx, &cfg, B, T, &e);
    if (s == DW_OK && !(tok = malloc((size_t)(B * T + 1) * sizeof *tok)))
        s = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory for %ld x %ld tokens", B, T);
    if (s == DW_OK) s = read_tokens(ctx, data, B * T + 1, tok);
    if (s == DW_OK) {
        if (!weights && has_weights(model)) weights = model;
        if (weights) s = dw_engine_load_weights(e, weights);
        else {
            fprintf(stderr, "deepwell eval: no weights given: initialised from seed %ld\n", seed);
            s = dw_engine_init_weights(e, (uint64_t)seed);
        }
    }
    if (s == DW_OK && dump) {
        logits = malloc((size_t)(B * T * cfg.vocab_size) * sizeof *logits);
        if (!logits) s = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory for the logits");
        if (s == DW_OK) s = dw_engine_forward(e, tok, tok + 1, B, T, logits, NULL);
        if (s == DW_OK) {
            dw_engine_zero_grad(e);
            s = dw_engine_forward_backward(e, tok, tok + 1, B, T, 1.0, &loss);
        }
        if (s == DW_OK) s = dw_engine_dump_grads(e, dump, logits, B, T, loss);
    } else if (s == DW_OK) {
        s = dw_engine_forward(e, tok, tok + 1, B, T, NULL, &loss);
    }
    int rc = DW_EXIT_OK;
    if (s == DW_OK) {
        printf("loss %.6f  (perplexity %.4g; %ld x %ld tokens of %s)\n", loss, exp(loss), B, T, data);
    } else {
        rc = cli_fail("eval", ctx, s);
    }
    free(logits);
    free(tok);
    dw_engine_free(e);
    dw_ctx_free(ctx);
    return rc;
}
