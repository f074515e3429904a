/* bench_step.c — `deepwell bench step`: times the CUDA engine's training step (zero_grad,
 * forward_backward with the loss read back, AdamW with clipping) on a model at B x T, reports
 * tokens/s, MFU (PaLM FLOP convention, as bench/train_anchor.py) and device memory, and with
 * --profile a per-op breakdown of one eager step (CUDA events per schedule step). Not a test. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/model_config.h"
#include "cli.h"
#include "core/ctx.h"
#include "core/error.h"
#include "formats/formats.h"
#include "ir/ir.h"
#include "runtime/engine.h"
#include "runtime/engine_cuda.h"
#include "runtime/profile.h"
#include "step_run.h"

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static const char *CMD = "bench step";

int dw_bench_step(int argc, char **argv); /* dispatched by cmd_bench.c */

static void help(void) {
    printf("Usage: deepwell bench step MODEL [--batch B] [--seq T] [--precision R|fp32] [--fallback safe]\n"
           "                          [--steps N]\n"
           "                          [--warmup N] [--vocab V] [--json] [--profile] [--config-out FILE]\n"
           "                          [--peak-tflops P]\n\n"
           "Times the CUDA engine's training step on device 0: zero_grad, forward_backward (loss read\n"
           "back: one host sync) and dw_engine_adamw_step (lr 3e-4, betas 0.9/0.95, wd 0.1, clip 1.0:\n"
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
           "  --fallback safe   with a recipe: embeddings, LM head, first and last block in BF16\n"
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
           "  -h, --help        this help\n\n"
           "Exit status: 0 measured, 2 bad arguments or model, 1 no GPU or a failure.\n");
}

#if DW_HAVE_CUDA /* the helpers below serve the measurement, which needs CUDA */
/* PaLM-convention training FLOPs per token (bench/train_anchor.py's flops_per_token). */
static double flops_per_token(const dw_model_config *c, int64_t T) {
    const double d = (double)c->d_model, hd = (double)c->head_dim, H = (double)c->n_heads;
    const double Hkv = (double)c->n_kv_heads, ff = (double)c->d_ff;
    const bool glu = strcmp(c->model_type, "gpt2") != 0;
    const double per_layer = d * H * hd + 2 * d * Hkv * hd + H * hd * d + (glu ? 3 : 2) * d * ff;
    const double matmul = (double)c->n_layers * per_layer + (double)c->vocab_size * d;
    return 6 * matmul + 12 * (double)c->n_layers * H * hd * (double)T;
}

#endif /* DW_HAVE_CUDA */

int dw_bench_step(int argc, char **argv) {
    static const struct option opts[] = {{"batch", required_argument, 0, 'b'},
                                         {"seq", required_argument, 0, 's'},
                                         {"precision", required_argument, 0, 'p'},
                                         {"fallback", required_argument, 0, 'f'},
                                         {"steps", required_argument, 0, 'n'},
                                         {"warmup", required_argument, 0, 'w'},
                                         {"vocab", required_argument, 0, 'V'},
                                         {"json", no_argument, 0, 'j'},
                                         {"profile", no_argument, 0, 'P'},
                                         {"config-out", required_argument, 0, 'c'},
                                         {"peak-tflops", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    long B = 16, T = 1024, steps = 20, warm = 3, V = 0;
    double peak = 989.0;
    const char *precision = "bf16", *config_out = NULL;
    bool safe = false;
    bool json = false, profile = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'b': if (!cli_parse_int(CMD, "--batch", optarg, 1, 1 << 16, &B)) return DW_EXIT_USAGE; break;
        case 's': if (!cli_parse_int(CMD, "--seq", optarg, 1, 1 << 20, &T)) return DW_EXIT_USAGE; break;
        case 'n': if (!cli_parse_int(CMD, "--steps", optarg, 1, 100000, &steps)) return DW_EXIT_USAGE; break;
        case 'w': if (!cli_parse_int(CMD, "--warmup", optarg, 0, 100000, &warm)) return DW_EXIT_USAGE; break;
        case 'V': if (!cli_parse_int(CMD, "--vocab", optarg, 1, 1 << 30, &V)) return DW_EXIT_USAGE; break;
        case 'p': precision = optarg; break;
        case 'f':
            if (strcmp(optarg, "safe") && strcmp(optarg, "none")) {
                cli_error(CMD, "--fallback must be 'safe' or 'none', not '%s'", optarg);
                return DW_EXIT_USAGE;
            }
            safe = !strcmp(optarg, "safe");
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
        case 'h': help(); return DW_EXIT_OK;
        default: return cli_usage_error(CMD);
        }
    }
    if (optind + 1 != argc) {
        cli_error(CMD, "expected exactly one MODEL (a config.json directory, file or preset)");
        return DW_EXIT_USAGE;
    }
    dw_recipe rec;
    if (strcmp(precision, "bf16") && strcmp(precision, "fp32") && !dw_recipe_parse(precision, &rec)) {
        cli_error(CMD, "--precision must be bf16, fp32 or a recipe (fp8_tensor, fp8_row, fp8_block, fp8_block2d, "
                  "mxfp8, mxfp8_e5m2, mxfp4, nvfp4), not '%s'", precision);
        return DW_EXIT_USAGE;
    }
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    dw_ctx *hctx = NULL;
    if (dw_ctx_create(&co, &hctx) != DW_OK) {
        cli_error(CMD, "%s", dw_errmsg(NULL));
        return DW_EXIT_FAIL;
    }
    dw_model_config cfg;
    dw_status s = dw_model_config_load(hctx, argv[optind], &cfg);
    if (s != DW_OK) {
        int rc = cli_fail(CMD, hctx, s);
        dw_ctx_free(hctx);
        return rc;
    }
    if (V) cfg.vocab_size = V;
    if (T > cfg.max_seq) {
        cli_error(CMD, "--seq %ld is more than the model's %lld positions", T, (long long)cfg.max_seq);
        dw_ctx_free(hctx);
        return DW_EXIT_USAGE;
    }
    if (config_out && (s = dw_model_config_save(hctx, &cfg, config_out)) != DW_OK) {
        int rc = cli_fail(CMD, hctx, s);
        dw_ctx_free(hctx);
        return rc;
    }
    dw_ctx_free(hctx);
#if !DW_HAVE_CUDA
    (void)steps, (void)warm, (void)peak, (void)json, (void)profile, (void)safe;
    cli_error(CMD, "this build has no CUDA (configure with -DDW_CUDA=ON)");
    return DW_EXIT_FAIL;
#else
    dw_ctx_opts go = {.device = DW_DEVICE_CUDA};
    dw_ctx *ctx = NULL;
    if (dw_ctx_create(&go, &ctx) != DW_OK) {
        cli_error(CMD, "no CUDA device: %s", dw_errmsg(NULL));
        return DW_EXIT_FAIL;
    }
    dw_policy *pol = NULL;
    dw_engine *e = NULL;
    int32_t *tok = NULL;
    dw_step_run_result run = {0};
    int rc = DW_EXIT_OK;
    if (strcmp(precision, "fp32")) s = dw_policy_from_precision(ctx, precision, safe, &pol);
    dw_step_run_opts ro = {.micro_batch = B, .seq = T, .grad_accum = 1, .warmup = 2 + warm, .steps = steps,
                           .policy = pol};
    if (s == DW_OK) s = dw_step_run(ctx, &cfg, &ro, &run, &e);
    if (s != DW_OK) {
        rc = cli_fail(CMD, ctx, s);
        goto done;
    }
    const double loss0 = run.loss_first, loss = run.loss_last;
    const double med = run.median, fbmed = run.fb_median, tps = (double)(B * T) / med;
    const double fpt = flops_per_token(&cfg, T), mfu = tps * fpt / (peak * 1e12);
    const double mem_gib = (double)run.mem_engine / 1073741824.0;
    if (json) {
        printf("{\"impl\": \"deepwell-%s\", \"model\": \"%s\", \"batch\": %ld, \"seq\": %ld, \"vocab\": %lld,\n"
               "  \"step_s_median\": %.6f, \"fwd_bwd_s_median\": %.6f, \"step_s_min\": %.6f, \"tokens_per_s\": %.1f,\n"
               "  \"flops_per_token\": %.6g, \"mfu\": %.4f, \"device_mem_gib\": %.3f, \"loss_first\": %.4f, \"loss_last\": %.4f%s\n",
               precision, argv[optind], B, T, (long long)cfg.vocab_size, med, fbmed, run.min, tps, fpt, mfu, mem_gib,
               loss0, loss, profile ? "," : "}");
    } else {
        printf("deepwell %s, %s, B=%ld T=%ld V=%lld: %.2f ms/step (median of %ld; fwd+bwd %.2f ms, min %.2f ms)\n"
               "  %.0f tokens/s, MFU %.1f%% of %.0f TFLOP/s (%.4g FLOPs/token, PaLM convention)\n"
               "  device memory used by the engine: %.2f GiB; loss %.4f -> %.4f\n",
               precision, argv[optind], B, T, (long long)cfg.vocab_size, 1e3 * med, steps, 1e3 * fbmed,
               1e3 * run.min, tps, 100 * mfu, peak, fpt, mem_gib, loss0, loss);
    }
    if (profile) {
        dw_prof_summary ps;
        tok = dw_step_run_tokens(B * T, cfg.vocab_size);
        s = tok ? dw_prof_run(ctx, e, tok, tok + 1, B, T, 3, &ps) : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
        if (s != DW_OK) {
            rc = cli_fail(CMD, ctx, s);
            goto done;
        }
        dw_prof_opt po;
        if ((s = dw_prof_optimizer(ctx, e, 3, &po)) != DW_OK) {
            dw_prof_free(&ps);
            rc = cli_fail(CMD, ctx, s);
            goto done;
        }
        if (json) {
            printf("  \"profile_eager_ms\": %.4f,\n", ps.total_ms);
            dw_prof_print_json_fields(stdout, &ps);
            printf(",");
            dw_prof_print_optimizer(stdout, &po, true);
            printf("}\n");
        } else {
            dw_prof_print(stdout, &ps, 0);
            dw_prof_print_optimizer(stdout, &po, false);
        }
        dw_prof_free(&ps);
    }
done:
    dw_engine_free(e);
    dw_policy_free(pol);
    free(tok);
    dw_step_run_result_free(&run);
    dw_ctx_free(ctx);
    return rc;
#endif
}
