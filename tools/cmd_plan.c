/* cmd_plan.c — `deepwell plan`: search parallel plans for a model on a machine and print the
 * best ones (table or JSON), with rejection counts and an optional SVG pipeline timeline. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "plan_args.h"
#include "plan_explain.h"

static void help(void) {
    printf("Usage: deepwell plan MODEL --hw PRESET|FILE|probe [--nodes N] [--gpus N] --seq S --global-batch G\n"
           "                     [--precision R] [--moe experts=E,top_k=K,capacity=C]\n"
           "                     [--gemm-rates FILE] [--headroom F] [--json] [--svg FILE] [--top K]\n"
           "                     [--explain]\n\n"
           "Searches data/tensor/pipeline/context/expert parallel degrees, micro-batch size, pipeline\n"
           "schedule (1F1B, interleaved with virtual stages), activation recompute (none, selective,\n"
           "full), ZeRO stage 0-3 and optimizer offload for training MODEL on the machine, and prints the\n"
           "fastest plans that fit in memory, with predicted step time, tokens/s, MFU and memory per GPU.\n"
           "Predictions come from an analytical model (docs/planner.md); nothing is run. A plan that\n"
           "Deepwell's CUDA engine runs as it is (one GPU, or data parallelism alone with ZeRO 0-3, stage 3\n"
           "in bf16 only; any recompute; no offload; a model capture builds) takes its memory\n"
           "from the engine's compiled memory plan (`deepwell compile`), its time from the engine's kernel\n"
           "rates and, on several GPUs, the runtime's collectives and ZeRO-3's gathers; such plans are\n"
           "listed before plans the engine cannot run.\n\n"
           "  MODEL              a model preset (gpt2-124m, llama-8b, llama-405b, mixtral-8x7b, ...)\n"
           "                     or a directory with a Hugging Face config.json\n"
           "  --hw PRESET|FILE   hardware preset (h100-sxm, h200, b200, b100, gb200-nvl72), a JSON\n"
           "                     file written by `deepwell probe --json`, or `probe` for this machine\n"
           "  --nodes N          number of identical nodes (default 1, or the file's / probe's count)\n"
           "  --gpus N           use only the first N GPUs of each node (e.g. --hw h200 --gpus 1)\n"
           "  --seq S            tokens per sequence\n"
           "  --global-batch G   sequences per optimizer step\n"
           "  --precision R      GEMM recipe: bf16 (default), fp8_block, mxfp8, nvfp4\n"
           "  --moe SPEC         override MoE: experts=E,top_k=K,capacity=C (capacity >= 1, default 1)\n"
           "  --gemm-rates FILE  measured GEMM rates ({\"results\":[{m,n,k,recipe,tflops}]}, the\n"
           "                     `deepwell bench gemm --json` schema) replacing the analytical curve\n"
           "  --headroom F       fraction of HBM kept free (default 0.10)\n"
           "  --json             print one JSON object {best, alternatives, rejected, ...}\n"
           "  --svg FILE         write an SVG timeline of one step of the best plan's pipeline\n"
           "  --top K            number of plans to show (default 5)\n"
           "  --explain          after the table, why the best plan won: each kept plan's step split\n"
           "                     into compute, exposed TP/CP/EP/DP communication, recompute, bubble\n"
           "                     and optimizer, what each runner-up lost by, the best plan's memory\n"
           "                     per pipeline rank and layer layout, and what ruled out each rejected\n"
           "                     family (with --json: the document's \"explain\" and \"vs_best\")\n"
           "  -h, --help         this help\n\n"
           "Exit status: 0 a plan was found, 1 no configuration fits, 2 bad input.\n");
}

static double gib(double b) { return b / (1024.0 * 1024 * 1024); }

static void print_entry(const char *label, const dw_plan *p) {
    dw_plan_mem m = {.size = sizeof m};
    dw_plan_cost c = {.size = sizeof c};
    dw_plan_get_memory(p, &m);
    dw_plan_get_cost(p, &c);
    printf("%s %s\n", label, dw_plan_summary(p));
    printf("    step %.4g s   %.4g tokens/s   MFU %.1f%%   HFU %.1f%%\n", c.step, c.tokens_per_s, 100 * c.mfu,
           100 * c.hfu);
    printf("    memory/GPU %.1f GiB of %.1f GiB (limit %.1f): weights %.2f, grads %.2f, optimizer %.2f, "
           "activations %.2f, workspace %.2f, scales %.3f, ep buffers %.2f  [stage %d, %.2f micro-batches in "
           "flight]\n",
           gib(m.total), gib(m.hbm), gib(m.limit), gib(m.weights), gib(m.grads), gib(m.optimizer),
           gib(m.activations), gib(m.workspace), gib(m.scales), gib(m.ep_buffers), m.worst_stage, m.inflight);
    printf("    time: pipeline %.4g s (busy %.4g, bubble %.1f%%), TP %.3g, CP %.3g, EP %.3g, p2p %.3g, "
           "DP %.3g (exposed %.3g), optimizer %.3g\n",
           c.pipeline, c.compute, 100 * c.bubble_frac, c.tp_comm, c.cp_comm, c.ep_comm, c.pp_comm, c.dp_comm,
           c.dp_exposed, c.optimizer);
}

static dw_status print_table(dw_ctx *ctx, const char *model, const dw_plan_set *set) {
    dw_plan_info in = {.size = sizeof in};
    dw_plan_set_get_info(set, &in);
    int64_t evaluated, feasible;
    dw_plan_set_stats(set, &evaluated, &feasible);
    printf("model %s: %.4g params%s; %s x %d GPUs (%d nodes, NVLink domain %d; %s)\n", model, in.params,
           in.experts ? " (MoE)" : "", in.gpu, (int)in.gpus, in.nodes, in.nvlink_domain, in.hw_source);
    printf("job: seq %lld, global batch %lld sequences, %s; searched %lld configurations, %lld feasible\n\n",
           (long long)in.seq, (long long)in.global_batch, dw_recipe_name((dw_recipe)in.recipe), (long long)evaluated,
           (long long)feasible);
    for (int i = 0; i < dw_plan_set_count(set); i++) {
        dw_plan *p = NULL;
        dw_status s = dw_plan_set_get(ctx, set, i, &p);
        if (s != DW_OK) return s;
        char label[16];
        snprintf(label, sizeof label, i == 0 ? "best:" : "#%d:", i + 1);
        print_entry(label, p);
        dw_plan_free(p);
    }
    printf("\nrejected (configurations, examples):\n");
    for (int k = 0; k < dw_plan_reject_reasons(); k++) {
        int examples = 0;
        int64_t n = dw_plan_set_rejected(set, k, &examples);
        if (!n) continue;
        printf("  %-48s %10lld\n", dw_plan_reject_name(k), (long long)n);
        for (int i = 0; i < examples; i++) printf("      e.g. %s\n", dw_plan_set_reject_example(set, k, i));
    }
    printf("\nMFU/HFU are relative to the dense datasheet peak of the recipe's GEMMs (%.0f TFLOP/s per GPU).\n"
           "Predicted by the analytical model in docs/planner.md (datasheet peaks x efficiency curves,\n"
           "alpha-beta collectives, pipeline event simulation); nothing was run.\n",
           in.peak_flops / 1e12);
    if (in.engine)
        printf("One GPU: planned for Deepwell's CUDA engine (memory from its compiled pools, time from its\n"
               "graph at the engine's kernel rates; docs/planner.md). `deepwell dryrun --run` checks it.\n");
    return DW_OK;
}

/* The SVG of the best plan, when there is one. */
static dw_status write_svg(dw_ctx *ctx, const dw_plan_set *set, const char *path) {
    if (dw_plan_set_count(set) == 0) return DW_OK;
    dw_plan *best = NULL;
    dw_status s = dw_plan_set_get(ctx, set, 0, &best);
    if (s == DW_OK) s = dw_plan_write_svg(ctx, best, path);
    dw_plan_free(best);
    return s;
}

int cmd_plan(int argc, char **argv) {
    static const struct option opts[] = {PLAN_ARG_OPTIONS,
                                         {"json", no_argument, 0, 'j'},
                                         {"svg", required_argument, 0, 's'},
                                         {"top", required_argument, 0, 't'},
                                         {"explain", no_argument, 0, 'x'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    plan_args a;
    plan_args_init(&a);
    bool json = false, explain = false;
    const char *svg = NULL;
    long top = 5;
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    dw_status s = dw_ctx_create(&co, &ctx);
    if (s != DW_OK) return cli_fail("plan", NULL, s);
    int c, rc = DW_EXIT_OK;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c >= PLAN_ARG_FIRST && c <= PLAN_ARG_LAST) {
            if (!plan_args_opt("plan", c, optarg, &a)) {
                rc = DW_EXIT_USAGE;
                goto done;
            }
            continue;
        }
        switch (c) {
        case 'j': json = true; break;
        case 'x': explain = true; break;
        case 's': svg = optarg; break;
        case 't':
            if (!cli_parse_int("plan", "--top", optarg, 1, 100000, &top)) { rc = DW_EXIT_USAGE; goto done; }
            break;
        case 'h': help(); goto done;
        default: rc = cli_usage_error("plan"); goto done;
        }
    }
    if (optind < argc) a.model = argv[optind++];
    if (optind < argc) {
        cli_error("plan", "unexpected argument '%s'", argv[optind]);
        rc = cli_usage_error("plan");
        goto done;
    }
    dw_hw *hw = NULL;
    if ((rc = plan_args_load_hw("plan", ctx, &a, &hw)) != DW_EXIT_OK) goto done;
    a.job.top_k = (int)top;
    dw_plan_set *set = NULL;
    s = dw_autoplan_search(ctx, a.model, hw, &a.job, &set);
    dw_hw_free(hw);
    if (s != DW_OK) {
        rc = cli_fail("plan", ctx, s);
        goto done;
    }
    if (svg && (s = write_svg(ctx, set, svg)) != DW_OK) {
        rc = cli_fail("plan", ctx, s);
    } else if (json) {
        char *text = NULL;
        s = dw_plan_set_to_json(ctx, set, true, &text);
        if (s == DW_OK) printf("%s\n", text);
        else rc = cli_fail("plan", ctx, s);
        dw_free_string(text);
    } else if ((s = print_table(ctx, a.model, set)) != DW_OK ||
               (explain && (s = plan_explain_print(ctx, set)) != DW_OK)) {
        rc = cli_fail("plan", ctx, s);
    }
    if (rc == DW_EXIT_OK && dw_plan_set_count(set) == 0) {
        cli_error("plan", "no configuration fits: see the rejection counts");
        rc = DW_EXIT_FAIL;
    }
    dw_plan_set_free(set);
done:
    dw_ctx_free(ctx);
    return rc;
}
