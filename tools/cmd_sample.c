/* cmd_sample.c — `deepwell sample`: generate text from a checkpoint, a run directory, a model
 * directory or a preset (byte-level text for byte-level models, text through a Hugging Face
 * tokenizer.json given or found in the model directory, token ids otherwise). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *CMD = "sample";

static void help(void) {
    printf("Usage: deepwell sample MODEL_OR_CKPT --prompt TEXT [-n N] [options]\n\n"
           "Generates N tokens after the prompt and prints prompt + continuation. MODEL_OR_CKPT is a\n"
           "checkpoint (DIR/ckpt-<step>), a run directory (its latest checkpoint), a model\n"
           "directory (config.json + model.safetensors) or a preset (random weights: untrained).\n"
           "Byte-level models (the built-in data, raw text; vocab 256) and models with a tokenizer\n"
           "(--tokenizer, or the tokenizer.json of the model directory, or of the checkpoint: a run\n"
           "trained with one keeps a copy in each checkpoint) read and write text; others\n"
           "read and write space-separated token ids. On the CPU (FP32 or BF16; MoE without token\n"
           "drops) decoding keeps a K/V cache while the text fits the model's sequence length\n"
           "(DW_KV_CACHE=0: recompute every token; the tokens are the same); on CUDA (BF16) the\n"
           "cache stays on the device. The time taken goes to stderr.\n\n"
           "  --prompt TEXT       the prompt (text, or token ids such as \"50256 464\")\n"
           "  -n, --tokens N      tokens to generate (100)\n"
           "  --temperature T     0 = greedy (default 0.8)\n"
           "  --top-k K           sample among the K most likely tokens, 0 = all (0)\n"
           "  --seed S            sampling seed (1337)\n"
           "  --tokenizer T       bytes, ids, or a Hugging Face tokenizer.json (or a directory\n"
           "                      holding one); default: the model's (see above)\n"
           "  --skip-special      leave special tokens (<|endoftext|>, </s>, ...) out of the text\n"
           "  --device D          cpu, cuda or auto (default auto: cuda when a GPU is usable)\n"
           "  -h, --help          this help\n");
}

/* Whether two files hold the same bytes (false when either cannot be read). */
static bool same_bytes(const char *a, const char *b) {
    FILE *f = fopen(a, "rb"), *g = fopen(b, "rb");
    bool same = f && g;
    for (int c = 0, d = 0; same && c != EOF; same = c == d) c = fgetc(f), d = fgetc(g);
    if (f) fclose(f);
    if (g) fclose(g);
    return same;
}

int cmd_sample(int argc, char **argv) {
    static const struct option longopts[] = {
        {"prompt", required_argument, 0, 'p'}, {"tokens", required_argument, 0, 'n'},
        {"temperature", required_argument, 0, 't'}, {"top-k", required_argument, 0, 'k'},
        {"seed", required_argument, 0, 's'}, {"device", required_argument, 0, 'd'},
        {"tokenizer", required_argument, 0, 'T'}, {"skip-special", no_argument, 0, 'S'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *prompt = NULL, *device = "auto", *tokenizer = NULL;
    bool skip_special = false;
    long n = 100, top_k = 0, seed = 1337;
    double temperature = 0.8;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "hn:", longopts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case 'h': help(); return DW_EXIT_OK;
        case 'p': prompt = optarg; break;
        case 'd': device = optarg; break;
        case 'T': tokenizer = optarg; break;
        case 'S': skip_special = true; break;
        case 'n': ok = cli_parse_int(CMD, "--tokens", optarg, 0, 1 << 20, &n); break;
        case 'k': ok = cli_parse_int(CMD, "--top-k", optarg, 0, 1 << 30, &top_k); break;
        case 's': ok = cli_parse_int(CMD, "--seed", optarg, 0, 0x7fffffffffffffffL, &seed); break;
        case 't':
            ok = cli_parse_double(CMD, "--temperature", optarg, &temperature);
            if (ok && temperature < 0) {
                cli_error(CMD, "--temperature must be >= 0");
                ok = false;
            }
            break;
        default: return cli_usage_error(CMD);
        }
        if (!ok) return cli_usage_error(CMD);
    }
    if (optind != argc - 1 || !prompt) {
        cli_error(CMD, "expected one MODEL_OR_CKPT and --prompt");
        return cli_usage_error(CMD);
    }
    dw_ctx *ctx = NULL;
    dw_status st = cli_ctx_create(CMD, device, &ctx);
    if (st != DW_OK) return cli_exit_for(st);
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.seed = (uint64_t)seed;
    dw_model *m = NULL;
    st = dw_model_open(ctx, argv[optind], &mo, &m);
    dw_engine *e = st == DW_OK ? dw_model_engine(m) : NULL;
    int32_t *ids = NULL;
    int64_t np = 0;
    const char *spec = tokenizer ? tokenizer : st == DW_OK ? dw_model_tokenizer(m) : NULL;
    dw_hf_tokenizer *hf = NULL; /* a tokenizer.json, read once for the prompt and the text */
    if (st == DW_OK && strcmp(spec, "bytes") != 0 && strcmp(spec, "ids") != 0) st = dw_hf_tokenizer_open(ctx, spec, &hf);
    const char *own = st == DW_OK ? dw_model_tokenizer(m) : "bytes"; /* a tokenizer.json it came with */
    if (hf && tokenizer && strcmp(own, "bytes") && strcmp(own, "ids") && !same_bytes(dw_hf_tokenizer_path(hf), own))
        fprintf(stderr, "deepwell sample: warning: --tokenizer %s is not %s, the tokenizer %s came with; decoding "
                "with --tokenizer\n", dw_hf_tokenizer_path(hf), own, argv[optind]);
    if (st == DW_OK) st = dw_tokenize(ctx, hf ? dw_hf_tokenizer_path(hf) : spec, prompt, dw_graph_vocab(dw_model_graph(m)), &ids, &np);
    if (st == DW_OK && np < 1) {
        cli_error(CMD, "the prompt is empty");
        free(ids);
        dw_hf_tokenizer_free(hf);
        dw_model_free(m);
        dw_ctx_free(ctx);
        return DW_EXIT_USAGE;
    }
    if (st == DW_OK && !dw_model_trained(m))
        fprintf(stderr, "deepwell sample: %s is a preset: its weights are untrained\n", argv[optind]);
    int32_t *all = st == DW_OK ? realloc(ids, (size_t)(np + n) * sizeof *all) : NULL;
    if (st == DW_OK && !all) st = DW_ERR_NOMEM;
    if (all) ids = all;
    uint64_t rng = (uint64_t)seed;
    dw_generate_stats gs = {.size = sizeof gs};
    if (st == DW_OK) st = dw_engine_generate_timed(e, ids, np, n, temperature, (int)top_k, &rng, &gs);
    if (st == DW_OK && n > 0) { /* on stderr: stdout stays the text alone; decode tokens/s without the prefill */
        const double secs = gs.prefill_s + gs.decode_s;
        fprintf(stderr, "deepwell sample: %ld tokens in %.2f s: prefill of %lld prompt tokens %.3f s (%.1f tokens/s), "
                "decode %lld tokens %.3f s (%.1f tokens/s, %s)\n", n, secs, (long long)gs.prefill_tokens,
                gs.prefill_s, gs.prefill_s > 0 ? gs.prefill_tokens / gs.prefill_s : 0.0, (long long)gs.decode_tokens,
                gs.decode_s, gs.decode_s > 0 ? gs.decode_tokens / gs.decode_s : 0.0,
                gs.cached ? "KV cache" : "full recompute");
    }
    if (st == DW_OK) {
        char *text = NULL;
        size_t len = 0;
        if (hf) st = dw_hf_tokenizer_decode(ctx, hf, ids, np + n, skip_special, &text, &len);
        else if (!(text = dw_detokenize(spec, ids, np + n))) st = DW_ERR_NOMEM;
        else len = strlen(text);
        if (text) {
            fwrite(text, 1, len, stdout);
            fputc('\n', stdout);
        }
        free(text);
    }
    int rc = st == DW_OK ? DW_EXIT_OK : cli_fail(CMD, ctx, st);
    free(ids);
    dw_hf_tokenizer_free(hf);
    dw_model_free(m);
    dw_ctx_free(ctx);
    return rc;
}
