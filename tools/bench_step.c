/* bench_step.c — `deepwell bench step`: times the CUDA engine's training step (zero_grad,
 * forward_backward with the loss read back, AdamW with clipping) on a model at B x T, reports
 * tokens/s, MFU (the graph's PaLM-convention model FLOPs, as bench/train_anchor.py) and device
 * memory, and with --profile a per-op breakdown of one eager step (CUDA events per program step).
 * Not a test. Public API only. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "step_run.h"

static const char *CMD = "bench step";

int dw_bench_step(int argc, char **argv); /* dispatched by cmd_bench.c */

static void help(void) {
    printf("Usage: deepwell bench step MODEL [--batch B] [--seq T] [--precision R|fp32] [--fallback F]\n"
           "                          [--policy FILE]\n"
           "                          [--steps N]\n"
           "                          [--warmup N] [--vocab V] [--json] [--profile] [--config-out FILE]\n"
           "                          [--peak-tflops P] [--recompute none|selective|full|N] [--no-fused-head]\n"
           "                          [--no-grad-arena]\n\n"
           "Times the CUDA engine's training step on device 0: zero_grad, forward_backward (loss read\n"
           "back: one host sync) and dw_engine_step (AdamW lr 3e-4, betas 0.9/0.95, wd 0.1, clip 1.0:\n"
           "one more sync), on random tokens. The first two steps are warm-up (eager, then the CUDA\n"
           "graph capture); then N steps, each timed on the host clock (every step ends synchronised);\n"
           "the median is reported as ms/step and tokens/s (B*T / median). Device memory used by the\n"
           "engine: cudaMemGetInfo's free bytes before the engine is created minus the least free\n"
           "bytes seen after creation and after every step (pools, cuBLASLt workspace, CUDA graph).\n\n"
           "MFU = tokens/s * FLOPs per token / peak, FLOPs per token in the PaLM convention (as\n"
           "bench/train_anchor.py): 6 x matmul parameters (LM head included) + 12 x layers x heads x\n"
           "head_dim x T (causal masking not discounted).\n\n"
           "MODEL is a directory holding a Hugging Face config.json, a config.json path, or a preset\n"
           "name (see `deepwell capture --list-presets`).\n\n"
           "  --batch B         sequences per step (default 16)\n"
           "  --seq T           tokens per sequence (default 1024, at most the model's positions)\n"
           "  --precision R     bf16 (default: BF16 activations, cuBLASLt BF16 GEMMs), a recipe for\n"
           "                    the linear layers (fp8_block, mxfp8, nvfp4, ...: as `deepwell train\n"
           "                    --precision`) or fp32 (the FP32 reference GEMM)\n"
           "  --fallback F      with a recipe, what stays BF16: head (default) the LM head; safe also\n"
           "                    embeddings and the first and last block; none nothing\n"
           "  --policy FILE     a precision policy JSON instead of --precision and --fallback (rules\n"
           "                    per node, \"bf16_passes\": docs/precision.md); reported as 'policy'\n"
           "  --steps N         timed steps (default 20)\n"
           "  --warmup N        extra untimed steps after the two warm-up steps (default 3)\n"
           "  --vocab V         override the vocabulary size (e.g. 50304: GPT-2's padded vocabulary)\n"
           "  --json            one JSON object instead of the text report\n"
           "  --profile         also run 3 eager steps with a CUDA event around every schedule step and\n"
           "                    print their mean time per op type and direction and per node role\n"
           "                    (node name with layer numbers as '#'), largest first; then 3 eager\n"
           "                    optimizer steps timed per phase (zero grad, grad norm, AdamW, BF16\n"
           "                    copy, quantised weight cache)\n"
           "  --config-out FILE write the measured model's Hugging Face config.json (for\n"
           "                    bench/train_anchor.py --config FILE) before timing\n"
           "  --peak-tflops P   dense BF16 peak for MFU (default 989: H100/H200 SXM)\n"
           "  --recompute R     none (default), selective, full or N (the first N blocks): full runs\n"
           "                    those blocks' forwards again before their backward, keeping only the\n"
           "                    block inputs; selective runs the norms feeding linear layers and the\n"
           "                    MLP activations again (MFU still counts model FLOPs)\n"
           "  --no-fused-head   keep the LM head and the cross-entropy apart (the B x T x V logits\n"
           "                    and their gradient in memory): by default they run as one op over\n"
           "                    chunks of rows (docs/perf.md)\n"
           "  --no-grad-arena   keep the FP32 gradients and the BF16 weight copies in standing pools:\n"
           "                    by default, as `deepwell train` runs one micro-batch a step, they live\n"
           "                    in the activation arena only while needed (less memory, the same\n"
           "                    values; docs/performance.md); DW_GRAD_ARENA=0 or DW_BF16_ARENA=0\n"
           "                    turns one off\n"
           "  -h, --help        this help\n\n"
           "Exit status: 0 measured, 2 bad arguments or model, 1 no GPU or a failure.\n");
}

int dw_bench_step(int argc, char **argv) {
    static const struct option opts[] = {{"batch", required_argument, 0, 'b'},
                                         {"seq", required_argument, 0, 's'},
                                         {"precision", required_argument, 0, 'p'},
                                         {"fallback", required_argument, 0, 'f'},
                                         {"policy", required_argument, 0, 'o'},
                                         {"steps", required_argument, 0, 'n'},
                                         {"warmup", required_argument, 0, 'w'},
                                         {"vocab", required_argument, 0, 'V'},
                                         {"json", no_argument, 0, 'j'},
                                         {"profile", no_argument, 0, 'P'},
                                         {"config-out", required_argument, 0, 'c'},
                                         {"peak-tflops", required_argument, 0, 't'},
                                         {"recompute", required_argument, 0, 'r'},
                                         {"no-fused-head", no_argument, 0, 'H'},
                                         {"no-grad-arena", no_argument, 0, 'A'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    long B = 16, T = 1024, steps = 20, warm = 3, V = 0;
    double peak = 989.0;
    const char *precision = "bf16", *config_out = NULL;
    const char *fallback = "head", *policy_path = NULL;
    bool precision_given = false, fallback_given = false;
    bool json = false, profile = false, fused_head = true, grad_arena = true;
    int c, recompute = DW_RECOMPUTE_NONE, recompute_blocks = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'b': if (!cli_parse_int(CMD, "--batch", optarg, 1, 1 << 16, &B)) return DW_EXIT_USAGE; break;
        case 's': if (!cli_parse_int(CMD, "--seq", optarg, 1, 1 << 20, &T)) return DW_EXIT_USAGE; break;
        case 'n': if (!cli_parse_int(CMD, "--steps", optarg, 1, 100000, &steps)) return DW_EXIT_USAGE; break;
        case 'w': if (!cli_parse_int(CMD, "--warmup", optarg, 0, 100000, &warm)) return DW_EXIT_USAGE; break;
        case 'V': if (!cli_parse_int(CMD, "--vocab", optarg, 1, 1 << 30, &V)) return DW_EXIT_USAGE; break;
        case 'p': precision = optarg, precision_given = true; break;
        case 'o': policy_path = optarg; break;
        case 'f':
            if (strcmp(optarg, "safe") && strcmp(optarg, "head") && strcmp(optarg, "none")) {
                cli_error(CMD, "--fallback must be 'safe', 'head' or 'none', not '%s'", optarg);
                return DW_EXIT_USAGE;
            }
            fallback = optarg, fallback_given = true;
            break;
        case 'j': json = true; break;
        case 'P': profile = true; break;
        case 'c': config_out = optarg; break;
        case 't':
            if (!cli_parse_double(CMD, "--peak-tflops", optarg, &peak)) return DW_EXIT_USAGE;
            if (!(peak > 0)) {
                cli_error(CMD, "--peak-tflops must be > 0");
                return DW_EXIT_USAGE;
            }
            break;
        case 'r':
            if (!cli_parse_recompute(CMD, optarg, &recompute, &recompute_blocks)) return DW_EXIT_USAGE;
            break;
        case 'H': fused_head = false; break;
        case 'A': grad_arena = false; break;
        case 'h': help(); return DW_EXIT_OK;
        default: return cli_usage_error(CMD);
        }
    }
    if (policy_path && (precision_given || fallback_given)) {
        cli_error(CMD, "--policy FILE replaces --precision and --fallback; give one or the other");
        return DW_EXIT_USAGE;
    }
    if (policy_path) precision = "policy"; /* the label of the report */
    if (optind + 1 != argc) {
        cli_error(CMD, "expected exactly one MODEL (a config.json directory, file or preset)");
        return DW_EXIT_USAGE;
    }
    /* the model and the precision first, on a CPU context: bad input is a usage error, GPU or not */
    dw_ctx_opts ho = {.device = DW_DEVICE_CPU};
    dw_ctx *ctx = NULL;
    if (dw_ctx_create(&ho, &ctx) != DW_OK) {
        cli_error(CMD, "%s", dw_errmsg(NULL));
        return DW_EXIT_FAIL;
    }
    dw_policy *pol = NULL;
    dw_graph *g = NULL;
    dw_compiled *cp = NULL;
    dw_engine *e = NULL;
    int32_t *tok = NULL;
    dw_step_run_result run = {0};
    int rc = DW_EXIT_OK;
    dw_capture_opts co;
    dw_capture_opts_init(&co, sizeof co);
    co.batch = B, co.seq = T, co.vocab = V;
    dw_status s = dw_capture(ctx, argv[optind], &co, &g);
    if (s == DW_OK && policy_path) s = dw_policy_load(ctx, policy_path, &pol);
    else if (s == DW_OK && strcmp(precision, "fp32")) s = dw_policy_from_precision(ctx, precision, false, &pol);
    if (s == DW_OK && pol && !policy_path) s = dw_policy_set_fallback(ctx, pol, fallback);
    if (s != DW_OK) {
        rc = cli_fail(CMD, ctx, s);
        goto done;
    }
    if (config_out) { /* the measured model's config.json, for bench/train_anchor.py --config */
        const char *text = dw_graph_config_json(g);
        FILE *f = fopen(config_out, "w");
        bool ok = f && text && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
        if (f && fclose(f) != 0) ok = false;
        if (!ok) {
            cli_error(CMD, "%s: cannot write the config", config_out);
            rc = DW_EXIT_IO;
            goto done;
        }
    }
    dw_ctx_free(ctx);
    ctx = NULL;
    dw_ctx_opts go = {.device = DW_DEVICE_CUDA};
    if (!dw_built_with_cuda() || dw_ctx_create(&go, &ctx) != DW_OK) {
        cli_error(CMD, "%s", dw_built_with_cuda() ? dw_errmsg(NULL) : "this build has no CUDA (configure with -DDW_CUDA=ON)");
        rc = DW_EXIT_FAIL;
        goto done;
    }
    dw_compile_opts cpo;
    dw_compile_opts_init(&cpo, sizeof cpo);
    cpo.recompute = recompute, cpo.recompute_blocks = recompute_blocks, cpo.fused_head = fused_head;
    if (grad_arena) dw_compile_opts_train_arenas(&cpo, 1, 0); /* as `deepwell train` runs a step */
    else cpo.grad_arena = cpo.bf16_arena = false;
    if (s == DW_OK) s = dw_compile(ctx, g, NULL, pol, &cpo, &cp);
    dw_step_run_opts ro = {.micro_batch = B, .seq = T, .grad_accum = 1, .warmup = 2 + warm, .steps = steps};
    if (s == DW_OK) s = dw_step_run(ctx, cp, &ro, &run, &e);
    if (s != DW_OK) {
        if (run.why) cli_error(CMD, "%s", run.why), rc = DW_EXIT_FAIL;
        else rc = cli_fail(CMD, ctx, s);
        goto done;
    }
    const double loss0 = run.loss_first, loss = run.loss_last;
    const double med = run.median, fbmed = run.fb_median, tps = (double)(B * T) / med;
    const double fpt = dw_graph_model_flops_per_token(g), mfu = tps * fpt / (peak * 1e12);
    const double mem_gib = (double)run.mem_engine / 1073741824.0;
    const long long vocab = (long long)dw_graph_vocab(g);
    if (json) {
        printf("{\"impl\": \"deepwell-%s\", \"model\": \"%s\", \"batch\": %ld, \"seq\": %ld, \"vocab\": %lld, "
               "\"recompute\": \"%s\", \"recompute_blocks\": %d, \"head_chunk\": %lld, \"grad_arena\": %s,\n"
               "  \"step_s_median\": %.6f, \"fwd_bwd_s_median\": %.6f, \"step_s_min\": %.6f, \"tokens_per_s\": %.1f,\n"
               "  \"flops_per_token\": %.6g, \"mfu\": %.4f, \"device_mem_gib\": %.3f, \"loss_first\": %.4f, \"loss_last\": %.4f%s\n",
               precision, argv[optind], B, T, vocab, dw_recompute_name((dw_recompute)recompute), recompute_blocks,
               (long long)dw_compiled_head_chunk(cp), dw_compiled_pool_bytes(cp, 1) ? "false" : "true", med, fbmed,
               run.min,
               tps, fpt, mfu, mem_gib,
               loss0, loss, profile ? "," : "}");
    } else {
        printf("deepwell %s, %s, B=%ld T=%ld V=%lld: %.2f ms/step (median of %ld; fwd+bwd %.2f ms, min %.2f ms)\n"
               "  %.0f tokens/s, MFU %.1f%% of %.0f TFLOP/s (%.4g FLOPs/token, PaLM convention)\n"
               "  device memory used by the engine: %.2f GiB; loss %.4f -> %.4f\n",
               precision, argv[optind], B, T, vocab, 1e3 * med, steps, 1e3 * fbmed,
               1e3 * run.min, tps, 100 * mfu, peak, fpt, mem_gib, loss0, loss);
        if (dw_compiled_head_chunk(cp)) printf("  LM head fused with the loss: %lld rows of logits at a time\n",
                                               (long long)dw_compiled_head_chunk(cp));
        else printf("  LM head and loss apart: the whole B x T x V logits\n");
        if (!dw_compiled_pool_bytes(cp, 1)) /* pool 1: the gradients */
            printf("  gradients%s in the activation arena (--no-grad-arena: standing pools)\n",
                   cpo.bf16_arena && pol ? " and BF16 weight copies" : "");
        else printf("  gradients in a standing pool\n");
    }
    if (profile) {
        dw_profile *pr = NULL;
        tok = dw_step_run_tokens(B * T, dw_graph_vocab(g));
        if (!tok) {
            cli_error(CMD, "out of host memory");
            rc = DW_EXIT_FAIL;
            goto done;
        }
        if ((s = dw_engine_profile(e, tok, tok + 1, B, T, 3, true, &pr)) != DW_OK) {
            rc = cli_fail(CMD, ctx, s);
            goto done;
        }
        char *text = json ? dw_profile_json_fields(pr) : dw_profile_text(pr, 0);
        if (text) printf("%s%s", text, json ? "}\n" : "");
        dw_free_string(text);
        dw_profile_free(pr);
    }
done:
    dw_engine_free(e);
    dw_compiled_free(cp);
    dw_graph_free(g);
    dw_policy_free(pol);
    free(tok);
    dw_step_run_result_free(&run);
    dw_ctx_free(ctx);
    return rc;
}
