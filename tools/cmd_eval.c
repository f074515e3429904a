/* cmd_eval.c — `deepwell eval`: the mean cross-entropy of a model on one batch of tokens from a
 * raw byte file or an llm.c token shard, read by the trainer's reader (dw_data_open_pattern), on
 * the CPU reference backend (FP32). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void help(void) {
    printf("Usage: deepwell eval MODEL --data FILE [--batch B] [--seq T] [--weights W] [--seed S]\n\n"
           "Computes the mean next-token cross-entropy of MODEL on the first B x T tokens of FILE\n"
           "(targets are the tokens shifted by one) on the CPU reference engine, and prints it;\n"
           "a mixture of experts configured with router losses (output_router_logits,\n"
           "router_z_loss_coef) adds them, as transformers' loss does.\n\n"
           "MODEL is a directory holding a Hugging Face config.json, a checkpoint or run directory (its\n"
           "newest checkpoint, as `latest` names it), a config.json path, or a preset\n"
           "name. Weights come from --weights, else from MODEL's directory when it has\n"
           "model.safetensors (or a sharded index), else they are initialised from --seed as the\n"
           "reference implementation does (a notice says so).\n\n"
           "  --data FILE      read as `deepwell train --data` reads it: a file or glob of llm.c\n"
           "                   token shards (.bin: 256 x int32 header, magic 20240520 with uint16\n"
           "                   tokens or 20240801 with uint32 tokens; checked), of other files read\n"
           "                   as raw bytes (byte-level tokens 0..255), or builtin; the batch is\n"
           "                   its first B windows of T+1 tokens in file order\n"
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

/* The first B windows of T+1 tokens of `data`, read as `deepwell train --data` reads it (one
 * reader: a bad shard is refused the same way). false (the reason printed) when it cannot give
 * them: *rc is then the exit status. */
static bool read_tokens(dw_ctx *ctx, const char *data, int64_t vocab, int64_t B, int64_t T, int32_t *tokens,
                        int32_t *targets, int *rc) {
    dw_data *d = NULL;
    dw_status s = dw_data_open_pattern(ctx, data, T, vocab, &d);
    if (s != DW_OK) {
        *rc = cli_fail("eval", ctx, s);
        return false;
    }
    int64_t have = dw_data_windows(d);
    if (have < B) {
        cli_error("eval", "%s: %lld window(s) of --seq %lld + 1 tokens; --batch %lld needs %lld", data,
                  (long long)have, (long long)T, (long long)B, (long long)B);
        *rc = DW_EXIT_USAGE;
    } else {
        dw_data_next(d, B, tokens, targets);
    }
    dw_data_free(d);
    return have >= B;
}


/* MODEL as a run directory (deepwell train --out): true with `dir/<latest>` in out when `latest`
 * names a checkpoint folder in it. A checkpoint itself, or any other MODEL, is used as given. */
static bool run_newest(const char *dir, char *out, size_t cap) {
    char path[4096], name[256] = "";
    snprintf(path, sizeof path, "%s/latest", dir);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    const bool got = fgets(name, sizeof name, f) != NULL;
    fclose(f);
    name[strcspn(name, "\r\n")] = '\0';
    if (!got || !*name || strchr(name, '/')) return false;
    return snprintf(out, cap, "%s/%s", dir, name) < (int)cap;
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
    char newest[4096]; /* a run directory: its newest checkpoint, as `latest` names it */
    if (run_newest(model, newest, sizeof newest)) model = newest;
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    dw_status s = dw_ctx_create(&co, &ctx);
    if (s != DW_OK) return cli_fail("eval", NULL, s);
    dw_graph *probe = NULL; /* the model's positions bound the default sequence */
    s = dw_capture_hf(ctx, model, &probe);
    if (s == DW_OK && T == 0) T = dw_graph_seq(probe) < 128 ? (long)dw_graph_seq(probe) : 128;
    dw_graph_free(probe);
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.batch = B, mo.seq = T, mo.seed = (uint64_t)seed;
    mo.weights = weights ? DW_WEIGHTS_NONE : DW_WEIGHTS_AUTO;
    dw_model *m = NULL;
    if (s == DW_OK) s = dw_model_open(ctx, model, &mo, &m);
    dw_engine *e = s == DW_OK ? dw_model_engine(m) : NULL;
    if (s == DW_OK && weights) s = dw_engine_load_weights(e, weights);
    else if (s == DW_OK && !dw_model_trained(m))
        fprintf(stderr, "deepwell eval: no weights given: initialised from seed %ld\n", seed);
    int32_t *tok = NULL, *tgt = NULL;
    float *logits = NULL;
    double loss = 0;
    int rc = DW_EXIT_OK;
    if (s == DW_OK && (!(tok = malloc((size_t)(B * T) * sizeof *tok)) || !(tgt = malloc((size_t)(B * T) * sizeof *tgt)))) {
        cli_error("eval", "out of memory for %ld x %ld tokens", B, T);
        rc = DW_EXIT_FAIL;
    }
    if (s == DW_OK && rc == DW_EXIT_OK &&
        !read_tokens(ctx, data, dw_graph_vocab(dw_model_graph(m)), B, T, tok, tgt, &rc))
        goto done;
    if (s == DW_OK && rc == DW_EXIT_OK && dump) {
        logits = malloc((size_t)(B * T * dw_graph_vocab(dw_model_graph(m))) * sizeof *logits);
        if (!logits) {
            cli_error("eval", "out of memory for the logits");
            rc = DW_EXIT_FAIL;
            goto done;
        }
        s = dw_engine_forward(e, tok, tgt, B, T, logits, NULL);
        if (s == DW_OK) s = dw_engine_zero_grad(e);
        if (s == DW_OK) s = dw_engine_forward_backward(e, tok, tgt, B, T, 1.0, &loss);
        if (s == DW_OK) s = dw_engine_dump(e, dump, logits, B, T, loss);
    } else if (s == DW_OK && rc == DW_EXIT_OK) {
        s = dw_engine_forward(e, tok, tgt, B, T, NULL, &loss);
    }
    if (s != DW_OK) rc = cli_fail("eval", ctx, s);
    else if (rc == DW_EXIT_OK) printf("loss %.6f  (perplexity %.4g; %ld x %ld tokens of %s)\n", loss, exp(loss), B, T, data);
done:
    free(logits);
    free(tok);
    free(tgt);
    dw_model_free(m);
    dw_ctx_free(ctx);
    return rc;
}
