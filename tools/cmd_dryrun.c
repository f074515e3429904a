/* cmd_dryrun.c — `deepwell dryrun`: checks a plan (given as JSON, or the planner's best) against
 * the model and machine: constraints, memory per GPU with its breakdown, communication overlap
 * and pipeline bubbles, PASS/FAIL per check; with --run, a plan Deepwell's CUDA engine runs as it
 * is (one GPU) is executed for a few steps and measured memory and step time are compared with
 * the prediction. Multi-GPU plans are never executed here. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "plan/args.h"
#include "cli.h"
#include "compile/compile.h"
#include "probe/hw.h"
#include "step_run.h"

static void help(void) {
    printf("Usage: deepwell dryrun MODEL --hw PRESET|FILE|probe [--nodes N] [--gpus N] --seq S\n"
           "                       --global-batch G [--precision R] [--moe experts=E,top_k=K,capacity=C]\n"
           "                       [--gemm-rates FILE] [--headroom F] [--plan PLAN.json]\n"
           "                       [--run [--steps N] [--warmup N]]\n\n"
           "Checks a parallel plan for training MODEL on the machine and prints PASS/FAIL per check:\n"
           "  constraints   divisibility (heads, KV heads by TP; layers by PP x virtual stages;\n"
           "                experts by EP; global batch by DP x micro-batch), TP inside the NVLink\n"
           "                domain, schedule and ZeRO compatibility; on one GPU with a model\n"
           "                Deepwell's engine builds, no recompute, ZeRO or offload (it has none)\n"
           "  memory        peak bytes per GPU (weights, grads, optimizer, activations, workspace,\n"
           "                scales) under HBM minus the headroom; on one GPU the engine's compiled\n"
           "                pools + cuBLASLt workspace + a 0.5 GiB CUDA-context allowance\n"
           "  overlap       communication the schedule cannot hide is at most 50%% of the step\n"
           "  bubble        pipeline idle time is at most 50%% of the step\n"
           "  gpu-run       only with --run: runs the plan on this machine's GPU 0 with Deepwell's\n"
           "                CUDA engine and compares measured with predicted peak memory (PASS within\n"
           "                10%%) and mean step time (PASS within 20%%). Only plans the engine runs as\n"
           "                they are: one GPU (dp = tp = pp = cp = ep = 1), no recompute, ZeRO or\n"
           "                offload, a dense gpt2/llama/mistral/qwen2 model; anything else (or a build\n"
           "                without CUDA, or no GPU) prints NOT RUN with the reason and exits 1.\n"
           "                Without --run the check is skipped (SKIP, not a pass).\n\n"
           "  --plan FILE   a plan: `deepwell plan --json` output (its \"best\") or one plan object;\n"
           "                without it the planner's best plan is checked\n"
           "  --hw, --nodes, --gpus, --seq, --global-batch, --precision, --moe, --gemm-rates,\n"
           "  --headroom    the job, as in `deepwell plan --help` (e.g. --hw h200 --gpus 1, or\n"
           "                --hw probe on the GPU machine)\n"
           "  --run         execute the plan (see gpu-run): the engine is built for the plan's\n"
           "                micro-batch, sequence and precision (quantised recipes with the safe\n"
           "                fallback: embedding, LM head, first and last block in BF16), weights\n"
           "                initialised, random tokens; each step = zero_grad, grad_accum x\n"
           "                forward_backward (loss read back), AdamW with clipping; host clock around\n"
           "                synchronised steps. Memory: cudaMemGetInfo, total minus the least free\n"
           "                bytes seen after engine creation and after every step (CUDA context,\n"
           "                pools, cuBLASLt workspace, CUDA graph, kernel images)\n"
           "  --steps N     timed steps for --run (default 10); their mean is compared\n"
           "  --warmup N    untimed steps before them (default 3: eager, graph capture, replay)\n"
           "  -h, --help    this help\n\n"
           "Exit status: 0 every check passed (with --run: the GPU run too), 1 a check failed or\n"
           "--run could not run the plan, 2 bad input.\n");
}

static double gib(double b) { return b / (1024.0 * 1024 * 1024); }

static void verdict(bool ok, const char *name, int *fails) {
    printf("%s  %s\n", ok ? "PASS" : "FAIL", name);
    if (!ok) (*fails)++;
}

static void not_run(const char *why) {
    printf("NOT RUN  gpu-run: %s\n", why);
}

/* The gpu-run check of a well-formed plan whose prediction is in e. Returns true when the run
 * happened (its verdicts are added to *fails); false when it could not run (reason printed). */
static bool gpu_run(dw_plan_setup *st, const dw_par *par, const dw_plan_entry *e, long steps, long warm,
                    int *fails) {
    char why[400];
    if (!dw_plan_engine_runnable(&st->in, par, why, sizeof why)) {
        not_run(why);
        return false;
    }
    if (!dw_built_with_cuda()) {
        not_run("this build has no CUDA (configure with -DDW_CUDA=ON); no steps were executed");
        return false;
    }
    dw_ctx *ctx = NULL;
    dw_ctx_opts go = {.device = DW_DEVICE_CUDA};
    if (dw_ctx_create(&go, &ctx) != DW_OK) {
        snprintf(why, sizeof why, "no usable CUDA device: %s", dw_errmsg(NULL));
        not_run(why);
        return false;
    }
    dw_hw *here = NULL;
    if (dw_probe(ctx, &here) == DW_OK && here->n_gpus > 0 && strcmp(here->gpus[0].name, st->hw->gpus[0].name))
        printf("      note: the prediction is for %s, this machine's GPU 0 is %s\n", st->hw->gpus[0].name,
               here->gpus[0].name);
    dw_hw_free(here);
    dw_policy *pol = NULL;
    dw_step_run_result r = {0};
    dw_step_run_opts o = {.micro_batch = par->micro_batch, .seq = st->in.job.seq, .grad_accum = par->grad_accum,
                          .warmup = warm, .steps = steps};
    dw_status s = dw_plan_engine_policy(ctx, &st->in, &pol);
    o.policy = pol;
    if (s == DW_OK) s = dw_step_run(ctx, &st->cfg, &o, &r, NULL);
    if (s != DW_OK) {
        snprintf(why, sizeof why, "the engine failed: %s", dw_errmsg(ctx));
        not_run(why);
        dw_policy_free(pol);
        dw_ctx_free(ctx);
        return false;
    }
    const dw_mem *m = &e->mem;
    double used = (double)(r.mem_context + r.mem_engine), mr = used / m->total;
    double ctx_pred = (double)DW_PLAN_CUDA_CONTEXT, eng_pred = m->total - ctx_pred;
    verdict(fabs(mr - 1) <= 0.10, "gpu-run memory (within 10%)", fails);
    printf("      peak device memory measured %.3f GiB, predicted %.3f GiB: ratio %.3f\n", gib(used), gib(m->total), mr);
    printf("        engine (free before creation - least free after it and after every step): measured %.3f "
           "GiB, predicted %.3f GiB (compiled pools %.3f + cuBLASLt %.3f): ratio %.3f\n",
           gib((double)r.mem_engine), gib(eng_pred), gib((double)r.pools),
           gib((double)DW_COMPILE_LT_WORKSPACE), (double)r.mem_engine / eng_pred);
    printf("        CUDA context before the engine (total - free): measured %.3f GiB, allowance %.3f GiB\n",
           gib((double)r.mem_context), gib(ctx_pred));
    double tr = r.mean / e->cost.step;
    verdict(fabs(tr - 1) <= 0.20, "gpu-run step time (within 20%)", fails);
    printf("      mean step measured %.4g s (median %.4g, min %.4g; %ld steps after %ld warm-up; %lld x "
           "forward_backward of %lld x %lld tokens + AdamW), predicted %.4g s: ratio %.3f\n",
           r.mean, r.median, r.min, steps, warm, (long long)par->grad_accum, (long long)par->micro_batch,
           (long long)st->in.job.seq, e->cost.step, tr);
    printf("      measured %.4g tokens/s, predicted %.4g; loss %.4f -> %.4f\n",
           (double)st->in.job.global_batch * (double)st->in.job.seq / r.mean, e->cost.tokens_per_s, r.loss_first,
           r.loss_last);
    dw_step_run_result_free(&r);
    dw_policy_free(pol);
    dw_ctx_free(ctx);
    return true;
}

int cmd_dryrun(int argc, char **argv) {
    static const struct option opts[] = {DW_PLAN_ARG_OPTIONS,
                                         {"plan", required_argument, 0, 'p'},
                                         {"run", no_argument, 0, 'r'},
                                         {"steps", required_argument, 0, 'n'},
                                         {"warmup", required_argument, 0, 'w'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    dw_plan_args a = {0};
    const char *plan_path = NULL;
    bool run = false;
    long steps = 10, warm = 3;
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    dw_status s = dw_ctx_create(&co, &ctx);
    if (s != DW_OK) return cli_fail("dryrun", NULL, s);
    int c, rc = DW_EXIT_OK;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c >= DW_PLAN_ARG_FIRST && c <= DW_PLAN_ARG_LAST) {
            if ((s = dw_plan_args_opt(ctx, c, optarg, &a)) != DW_OK) {
                rc = cli_fail("dryrun", ctx, s);
                goto done;
            }
            continue;
        }
        switch (c) {
        case 'p': plan_path = optarg; break;
        case 'r': run = true; break;
        case 'n':
            if (!cli_parse_int("dryrun", "--steps", optarg, 1, 100000, &steps)) {
                rc = DW_EXIT_USAGE;
                goto done;
            }
            break;
        case 'w':
            if (!cli_parse_int("dryrun", "--warmup", optarg, 0, 100000, &warm)) {
                rc = DW_EXIT_USAGE;
                goto done;
            }
            break;
        case 'h': help(); goto done;
        default: rc = cli_usage_error("dryrun"); goto done;
        }
    }
    if (optind < argc) a.model = argv[optind++];
    if (optind < argc) {
        cli_error("dryrun", "unexpected argument '%s'", argv[optind]);
        rc = cli_usage_error("dryrun");
        goto done;
    }
    dw_plan_setup st;
    if ((s = dw_plan_setup_load(ctx, &a, &st)) != DW_OK) {
        rc = cli_fail("dryrun", ctx, s);
        goto done;
    }
    dw_par par;
    if (plan_path) {
        json_t *j = NULL;
        s = dw_json_load_file(ctx, plan_path, &j);
        if (s == DW_OK) s = dw_par_from_json(ctx, j, plan_path, &par);
        json_decref(j);
        if (s == DW_OK && par.grad_accum == 0) {
            int64_t per = (int64_t)par.dp * par.micro_batch;
            par.grad_accum = per > 0 && st.in.job.global_batch % per == 0 ? st.in.job.global_batch / per : 0;
        }
    } else {
        dw_plan_result res;
        s = dw_plan_search(ctx, &st.in, 1, &res);
        if (s == DW_OK && res.n_plans == 0)
            s = dw_set_error(ctx, DW_ERR_INVALID, "the planner found no configuration that fits; "
                                                  "run `deepwell plan` for the rejection counts");
        if (s == DW_OK) par = res.plans[0].par;
        dw_plan_result_free(&res);
        if (s == DW_ERR_INVALID) s = DW_ERR_UNSUPPORTED; /* no plan is a failed check, exit 1 */
    }
    if (s != DW_OK) {
        rc = cli_fail("dryrun", ctx, s);
        dw_plan_setup_free(&st);
        goto done;
    }
    char buf[200], why[2048];
    dw_par_format(&par, buf, sizeof buf);
    printf("dryrun %s on %d x %s, seq %lld, global batch %lld, %s\nplan: %s%s%s\n\n", a.model,
           (int)st.in.n_gpus, st.hw->gpus[0].name, (long long)st.in.job.seq,
           (long long)st.in.job.global_batch, dw_recipe_name(st.in.job.recipe), buf,
           plan_path ? " from " : " (planner's best)", plan_path ? plan_path : "");
    int fails = 0;
    bool formed = false, ran = false;
    dw_plan_entry e;
    /* 1. structure: independent checker (memory is reported separately below) */
    int bad = dw_plan_check(&st.in, &par, why, sizeof why);
    bool mem_only = bad == 1 && strncmp(why, "memory:", 7) == 0;
    verdict(bad == 0 || mem_only, "constraints", &fails);
    if (bad && !mem_only) {
        for (char *line = strtok(why, "\n"); line; line = strtok(NULL, "\n")) printf("      %s\n", line);
        printf("SKIP  memory, overlap, bubble (the plan is not well-formed)\n");
    } else {
        formed = true;
        dw_plan_memory(&st.in, &par, &e.mem);
        e.par = par;
        const dw_mem *m = &e.mem;
        verdict(m->total <= m->limit, "memory", &fails);
        printf("      peak %.2f GiB per GPU on stage %d; limit %.2f GiB = %.0f%% of %.2f GiB HBM\n",
               gib(m->total), m->worst_stage, gib(m->limit), 100 * (1 - st.in.job.mem_headroom), gib(m->hbm));
        printf("      weights %.2f | grads %.2f | optimizer %.2f | activations %.2f (%.2f micro-batches in "
               "flight) | workspace %.2f | scales %.3f GiB\n",
               gib(m->weights), gib(m->grads), gib(m->optimizer), gib(m->activations), m->inflight,
               gib(m->workspace), gib(m->scales));
        dw_plan_time(&st.in, &par, &e, NULL);
        const dw_cost *k = &e.cost;
        double hidden = k->tp_comm + k->cp_comm + k->ep_comm + k->pp_comm + k->dp_exposed;
        double frac = k->step > 0 ? hidden / k->step : 0;
        verdict(frac <= 0.5, "overlap", &fails);
        printf("      non-overlapped communication %.3g s = %.1f%% of the %.4g s step (TP %.3g, CP %.3g, EP "
               "%.3g, p2p %.3g, DP exposed %.3g); DP traffic %.3g s, %.0f%% hidden under backward/forward\n",
               hidden, 100 * frac, k->step, k->tp_comm, k->cp_comm, k->ep_comm, k->pp_comm, k->dp_exposed,
               k->dp_comm, k->dp_comm > 0 ? 100 * (1 - k->dp_exposed / k->dp_comm) : 100.0);
        verdict(k->bubble_frac <= 0.5, "bubble", &fails);
        printf("      pipeline idle %.1f%% of the busiest stage's %.4g s (event simulation of %s, %lld "
               "micro-batches, %d virtual stages)\n",
               100 * k->bubble_frac, k->pipeline, dw_sched_name(par.sched), (long long)par.grad_accum, par.vpp);
        printf("      predicted: %.4g s/step, %.4g tokens/s, MFU %.1f%%\n", k->step, k->tokens_per_s,
               100 * k->mfu);
        dw_engine_time et;
        if (dw_plan_engine_runnable(&st.in, &par, NULL, 0) &&
            dw_plan_engine_time(ctx, &st.in, par.micro_batch, &et) == DW_OK) {
            double ga = (double)par.grad_accum;
            printf("      Deepwell engine, per step: GEMMs %.2f ms, attention %.2f ms, memory-bound kernels %.2f ms "
                   "(%lld micro-batch(es)), launch overhead %.2f ms (%.0f launches each), AdamW %.2f ms\n",
                   1e3 * ga * et.gemm, 1e3 * ga * et.attn, 1e3 * ga * et.mem, (long long)par.grad_accum,
                   1e3 * ga * et.overhead, et.launches, 1e3 * et.optimizer);
        }
    }
    if (!run)
        printf("SKIP  gpu-run: not requested (--run executes a one-GPU plan with the CUDA engine and compares)\n");
    else if (!formed && !dw_plan_engine_runnable(&st.in, &par, why, sizeof why))
        not_run(why);
    else if (!formed)
        not_run("the plan is not well-formed (see constraints)");
    else
        ran = gpu_run(&st, &par, &e, steps, warm, &fails);
    printf("\n%s: %d check(s) failed%s\n", fails || (run && !ran) ? "FAIL" : "PASS", fails,
           run && !ran ? "; gpu-run NOT RUN" : "");
    if (run && !ran) fails++;
    rc = fails ? DW_EXIT_FAIL : DW_EXIT_OK;
    dw_plan_setup_free(&st);
done:
    dw_ctx_free(ctx);
    return rc;
}
