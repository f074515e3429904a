/* cmd_dryrun.c — `deepwell dryrun`: checks a plan (given as JSON, or the planner's best) against
 * the model and machine: constraints, memory per GPU with its breakdown, communication overlap
 * and pipeline bubbles, PASS/FAIL per check. It does not run anything on a GPU (no engine yet). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "plan/args.h"
#include "cli.h"

static void help(void) {
    printf("Usage: deepwell dryrun MODEL --hw PRESET|FILE|probe [--nodes N] --seq S --global-batch G\n"
           "                       [--precision R] [--moe experts=E,top_k=K,capacity=C]\n"
           "                       [--gemm-rates FILE] [--headroom F] [--plan PLAN.json]\n\n"
           "Checks a parallel plan for training MODEL on the machine and prints PASS/FAIL per check:\n"
           "  constraints   divisibility (heads, KV heads by TP; layers by PP x virtual stages;\n"
           "                experts by EP; global batch by DP x micro-batch), TP inside the NVLink\n"
           "                domain, schedule and ZeRO compatibility\n"
           "  memory        peak bytes per GPU (weights, grads, optimizer, activations, workspace,\n"
           "                scales) under HBM minus the headroom\n"
           "  overlap       communication the schedule cannot hide is at most 50%% of the step\n"
           "  bubble        pipeline idle time is at most 50%% of the step\n"
           "  gpu-run       NOT RUN: the GPU training engine does not exist yet, so no steps are\n"
           "                executed and no measured numbers are compared\n\n"
           "  --plan FILE   a plan: `deepwell plan --json` output (its \"best\") or one plan object;\n"
           "                without it the planner's best plan is checked\n"
           "  --hw, --nodes, --seq, --global-batch, --precision, --moe, --gemm-rates, --headroom\n"
           "                the job, as in `deepwell plan --help`\n"
           "  -h, --help    this help\n\n"
           "Exit status: 0 every check passed, 1 a check failed, 2 bad input.\n");
}

static double gib(double b) { return b / (1024.0 * 1024 * 1024); }

static void verdict(bool ok, const char *name, int *fails) {
    printf("%s  %s\n", ok ? "PASS" : "FAIL", name);
    if (!ok) (*fails)++;
}

int cmd_dryrun(int argc, char **argv) {
    static const struct option opts[] = {DW_PLAN_ARG_OPTIONS,
                                         {"plan", required_argument, 0, 'p'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    dw_plan_args a = {0};
    const char *plan_path = NULL;
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    dw_status s = dw_ctx_create(&co, &ctx);
    if (s != DW_OK) return cli_fail("dryrun", NULL, s);
    int c, rc = DW_EXIT_OK;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c >= 0x100 && c <= 0x107) {
            if ((s = dw_plan_args_opt(ctx, c, optarg, &a)) != DW_OK) {
                rc = cli_fail("dryrun", ctx, s);
                goto done;
            }
            continue;
        }
        switch (c) {
        case 'p': plan_path = optarg; break;
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
           (long long)st.in.job.global_batch, dw_plan_prec_name(st.in.job.prec), buf,
           plan_path ? " from " : " (planner's best)", plan_path ? plan_path : "");
    int fails = 0;
    /* 1. structure: independent checker (memory is reported separately below) */
    int bad = dw_plan_check(&st.in, &par, why, sizeof why);
    bool mem_only = bad == 1 && strncmp(why, "memory:", 7) == 0;
    verdict(bad == 0 || mem_only, "constraints", &fails);
    if (bad && !mem_only) {
        for (char *line = strtok(why, "\n"); line; line = strtok(NULL, "\n")) printf("      %s\n", line);
        printf("SKIP  memory, overlap, bubble (the plan is not well-formed)\n");
    } else {
        dw_plan_entry e;
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
    }
    printf("SKIP  gpu-run: NOT RUN — the GPU training engine does not exist yet, so no steps were executed\n"
           "      and there are no measured numbers to compare with the prediction.\n");
    printf("\n%s: %d check(s) failed\n", fails ? "FAIL" : "PASS", fails);
    rc = fails ? DW_EXIT_FAIL : DW_EXIT_OK;
    dw_plan_setup_free(&st);
done:
    dw_ctx_free(ctx);
    return rc;
}
