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

#include "cli.h"
#include "plan_args.h"
#include "step_run.h"

static void help(void) {
    printf("Usage: deepwell dryrun MODEL --hw PRESET|FILE|probe [--nodes N] [--gpus N] --seq S\n"
           "                       --global-batch G [--precision R] [--moe experts=E,top_k=K,capacity=C]\n"
           "                       [--gemm-rates FILE] [--headroom F] [--plan PLAN.json]\n"
           "                       [--run [--steps N] [--warmup N]] [--explain]\n\n"
           "Checks a parallel plan for training MODEL on the machine and prints PASS/FAIL per check:\n"
           "  constraints   divisibility (heads, KV heads by TP; layers by PP x virtual stages;\n"
           "                experts by EP; global batch by DP x micro-batch), TP inside the NVLink\n"
           "                domain, schedule and ZeRO compatibility; on one GPU with a model\n"
           "                Deepwell's engine builds, no ZeRO or offload\n"
           "  memory        peak bytes per GPU (weights, grads, optimizer, activations, workspace,\n"
           "                scales) under HBM minus the headroom; on one GPU the engine's compiled\n"
           "                pools + cuBLASLt workspace + a 0.5 GiB CUDA-context allowance\n"
           "  overlap       communication the schedule cannot hide is at most 50%% of the step\n"
           "  bubble        pipeline idle time is at most 50%% of the step\n"
           "  gpu-run       only with --run: runs the plan on this machine's GPU 0 with Deepwell's\n"
           "                CUDA engine and compares measured with predicted peak memory (PASS within\n"
           "                10%%) and mean step time (PASS within 20%%). Only plans the engine runs as\n"
           "                they are: one GPU (dp = tp = pp = cp = ep = 1), any recompute, no ZeRO or\n"
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
           "                fallback: embedding, LM head, first and last block in BF16; the\n"
           "                gradients and BF16 copies in the activation arena where `deepwell train`\n"
           "                keeps them: one micro-batch a step, ZeRO 0/1), weights\n"
           "                initialised, random tokens; each step = zero_grad, grad_accum x\n"
           "                forward_backward (loss read back), AdamW with clipping; host clock around\n"
           "                synchronised steps. Memory: cudaMemGetInfo, total minus the least free\n"
           "                bytes seen after engine creation and after every step (CUDA context,\n"
           "                pools, cuBLASLt workspace, CUDA graph, kernel images)\n"
           "  --steps N     timed steps for --run (default 10); their mean is compared\n"
           "  --warmup N    untimed steps before them (default 3: eager, graph capture, replay)\n"
           "  --explain     also compile the program the engine would run for the plan (one device,\n"
           "                CUDA sm_90, the plan's micro-batch, precision and recompute) and list each\n"
           "                MoE linear layer's grouped GEMM selection per pass: every registered\n"
           "                grouped kernel, eligible or why not, and the one selected (a failure to\n"
           "                compile it counts as a failed check)\n"
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

/* What the checks print of a plan: every getter's result, and the micro-batches per step. */
typedef struct {
    dw_plan_info in;
    dw_plan_layout l;
    dw_plan_mem m;
    dw_plan_cost k;
    int64_t ga;
} plan_view;

static void view_of(const dw_plan *plan, plan_view *v) {
    v->in = (dw_plan_info){.size = sizeof v->in};
    v->l = (dw_plan_layout){.size = sizeof v->l};
    v->m = (dw_plan_mem){.size = sizeof v->m};
    v->k = (dw_plan_cost){.size = sizeof v->k};
    dw_plan_get_info(plan, &v->in);
    dw_plan_get_layout(plan, &v->l);
    dw_plan_get_memory(plan, &v->m);
    dw_plan_get_cost(plan, &v->k);
    v->ga = v->l.global_batch / ((int64_t)v->l.dp * v->l.micro_batch);
}

/* The name of GPU 0 of hw ("" when it has none). */
static void gpu0_name(const dw_hw *hw, char *buf, size_t n) {
    dw_gpu_info g = {.size = sizeof g};
    snprintf(buf, n, "%s", dw_hw_get_gpu(hw, 0, &g) == DW_OK ? g.name : "");
}

/* The gpu-run check of a well-formed plan (--run): captures the model at the plan's shape,
 * compiles it for this GPU and runs it with the CUDA engine through step_run.h. Returns true when the run
 * happened (its verdicts are added to *fails); false when it could not run (reason printed). */
static bool gpu_run(const dw_plan *plan, long steps, long warm, int *fails) {
    char why[400];
    const char *reason = NULL;
    if (!dw_plan_runs_on_engine(plan, &reason)) {
        not_run(reason);
        return false;
    }
    dw_plan_info pi = {.size = sizeof pi};
    dw_plan_get_info(plan, &pi);
    if (pi.gpus > 1) { /* data parallel: the engine runs it, one process per GPU, under a launcher */
        snprintf(why, sizeof why, "the plan uses %d GPUs; --run executes one (run `deepwell launch -n %d -- "
                 "train ...` and compare its metrics.jsonl with the prediction)", (int)pi.gpus, (int)pi.gpus);
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
    plan_view v;
    view_of(plan, &v);
    const dw_plan_info *in = &v.in;
    const dw_plan_layout *l = &v.l;
    const dw_plan_mem *m = &v.m;
    const dw_plan_cost *k = &v.k;
    dw_plan_engine_mem em = {.size = sizeof em};
    dw_hw *here = NULL;
    char name[256];
    if (dw_probe(ctx, &here) == DW_OK && dw_hw_gpu_count(here) > 0) {
        gpu0_name(here, name, sizeof name);
        if (strcmp(name, in->gpu)) printf("      note: the prediction is for %s, this machine's GPU 0 is %s\n", in->gpu, name);
    }
    dw_hw_free(here);
    dw_policy *pol = NULL;
    dw_graph *g = NULL;
    dw_compiled *cp = NULL;
    dw_step_run_result r = {0};
    dw_step_run_opts o = {.micro_batch = l->micro_batch, .seq = l->seq, .grad_accum = v.ga, .warmup = warm,
                          .steps = steps};
    dw_capture_opts co;
    dw_capture_opts_init(&co, sizeof co);
    co.batch = l->micro_batch, co.seq = l->seq;
    dw_status s = dw_plan_engine_policy(ctx, plan, &pol);
    if (s == DW_OK) s = dw_plan_get_engine_memory(ctx, plan, &em);
    if (s == DW_OK) s = dw_capture(ctx, in->model, &co, &g);
    dw_compile_opts cpo; /* the plan's recompute and fused head, as its prediction assumed */
    dw_compile_opts_init(&cpo, sizeof cpo);
    cpo.recompute = l->recompute, cpo.fused_head = true;
    if (!dw_compile_opts_train_arenas(&cpo, v.ga, v.l.zero)) cpo.grad_arena = false; /* as the planner priced it */
    if (s == DW_OK) s = dw_compile(ctx, g, NULL, pol, &cpo, &cp);
    if (s == DW_OK) s = dw_step_run(ctx, cp, &o, &r, NULL);
    dw_compiled_free(cp);
    dw_graph_free(g);
    if (s != DW_OK) {
        snprintf(why, sizeof why, "the engine failed: %s", r.why ? r.why : dw_errmsg(ctx));
        not_run(why);
        dw_policy_free(pol);
        dw_ctx_free(ctx);
        return false;
    }
    double used = (double)(r.mem_context + r.mem_engine), mr = used / m->total;
    double ctx_pred = (double)em.context, eng_pred = m->total - ctx_pred;
    verdict(fabs(mr - 1) <= 0.10, "gpu-run memory (within 10%)", fails);
    printf("      peak device memory measured %.3f GiB, predicted %.3f GiB: ratio %.3f\n", gib(used), gib(m->total), mr);
    printf("        engine (free before creation - least free after it and after every step): measured %.3f "
           "GiB, predicted %.3f GiB (compiled pools %.3f + cuBLASLt %.3f): ratio %.3f\n",
           gib((double)r.mem_engine), gib(eng_pred), gib((double)r.pools),
           gib((double)em.cublaslt), (double)r.mem_engine / eng_pred);
    printf("        CUDA context before the engine (total - free): measured %.3f GiB, allowance %.3f GiB\n",
           gib((double)r.mem_context), gib(ctx_pred));
    double tr = r.mean / k->step;
    verdict(fabs(tr - 1) <= 0.20, "gpu-run step time (within 20%)", fails);
    printf("      mean step measured %.4g s (median %.4g, min %.4g; %ld steps after %ld warm-up; %lld x "
           "forward_backward of %lld x %lld tokens + AdamW), predicted %.4g s: ratio %.3f\n",
           r.mean, r.median, r.min, steps, warm, (long long)v.ga, (long long)l->micro_batch, (long long)l->seq,
           k->step, tr);
    printf("      measured %.4g tokens/s, predicted %.4g; loss %.4f -> %.4f\n",
           (double)l->global_batch * (double)l->seq / r.mean, k->tokens_per_s, r.loss_first, r.loss_last);
    dw_step_run_result_free(&r);
    dw_policy_free(pol);
    dw_ctx_free(ctx);
    return true;
}

/* The plan of --plan FILE, or the planner's best; on failure the message is printed and the
 * exit code returned. */
static int choose_plan(dw_ctx *ctx, const plan_args *a, const dw_hw *hw, const char *plan_path, dw_plan **out) {
    dw_status s;
    if (plan_path) {
        s = dw_plan_load(ctx, plan_path, a->model, hw, &a->job, out);
        return s == DW_OK ? DW_EXIT_OK : cli_fail("dryrun", ctx, s);
    }
    dw_plan_job job = a->job;
    job.top_k = 1;
    dw_plan_set *set = NULL;
    s = dw_autoplan_search(ctx, a->model, hw, &job, &set);
    int rc = s == DW_OK ? DW_EXIT_OK : cli_fail("dryrun", ctx, s);
    if (rc == DW_EXIT_OK && dw_plan_set_count(set) == 0) {
        cli_error("dryrun", "the planner found no configuration that fits; run `deepwell plan` for the "
                  "rejection counts");
        rc = DW_EXIT_FAIL; /* no plan is a failed check */
    }
    if (rc == DW_EXIT_OK && (s = dw_plan_set_get(ctx, set, 0, out)) != DW_OK) rc = cli_fail("dryrun", ctx, s);
    dw_plan_set_free(set);
    return rc;
}

/* The constraints, memory, overlap and bubble checks; returns whether the plan is well-formed. */
static bool check(dw_ctx *ctx, const dw_plan *plan, int *fails) {
    dw_plan_checks ck = {.size = sizeof ck};
    dw_plan_get_checks(plan, &ck);
    verdict(ck.constraints_ok, "constraints", fails);
    if (!ck.constraints_ok) {
        const char *line = ck.why;
        for (size_t n; *line; line += n + (line[n] == '\n')) {
            n = strcspn(line, "\n");
            if (n) printf("      %.*s\n", (int)n, line);
        }
        printf("SKIP  memory, overlap, bubble (the plan is not well-formed)\n");
        return false;
    }
    plan_view v;
    view_of(plan, &v);
    const dw_plan_mem m = v.m;
    const dw_plan_cost k = v.k;
    const int64_t ga = v.ga;
    verdict(ck.memory_ok, "memory", fails);
    printf("      peak %.2f GiB per GPU on stage %d; limit %.2f GiB = %.0f%% of %.2f GiB HBM\n", gib(m.total),
           m.worst_stage, gib(m.limit), 100 * (1 - v.in.mem_headroom), gib(m.hbm));
    printf("      weights %.2f | grads %.2f | optimizer %.2f | activations %.2f (%.2f micro-batches in "
           "flight) | workspace %.2f | scales %.3f | ep buffers %.2f GiB\n",
           gib(m.weights), gib(m.grads), gib(m.optimizer), gib(m.activations), m.inflight, gib(m.workspace),
           gib(m.scales), gib(m.ep_buffers));
    dw_compile_opts ao; /* the arenas `deepwell train` gives a run of this plan (what the engine's memory priced) */
    dw_compile_opts_init(&ao, sizeof ao);
    if (dw_plan_runs_on_engine(plan, NULL) && dw_compile_opts_train_arenas(&ao, ga, v.l.zero) && ao.grad_arena)
        printf("      gradients%s in the activation arena (`deepwell train`'s default for one micro-batch a step "
               "under ZeRO 0/1; DW_GRAD_ARENA=0: the pools)\n", ao.bf16_arena ? " and BF16 weight copies" : "");
    double hidden = ck.overlap * k.step;
    verdict(ck.overlap_ok, "overlap", fails);
    printf("      non-overlapped communication %.3g s = %.1f%% of the %.4g s step (TP %.3g, CP %.3g, EP "
           "%.3g, p2p %.3g, DP exposed %.3g); DP traffic %.3g s, %.0f%% hidden under backward/forward\n",
           hidden, 100 * ck.overlap, k.step, k.tp_comm, k.cp_comm, k.ep_comm, k.pp_comm, k.dp_exposed, k.dp_comm,
           k.dp_comm > 0 ? 100 * (1 - k.dp_exposed / k.dp_comm) : 100.0);
    verdict(ck.bubble_ok, "bubble", fails);
    printf("      pipeline idle %.1f%% of the busiest stage's %.4g s (event simulation of %s, %lld "
           "micro-batches, %d virtual stages)\n",
           100 * k.bubble_frac, k.pipeline, dw_plan_schedule(plan), (long long)ga, v.l.vpp);
    printf("      predicted: %.4g s/step, %.4g tokens/s, MFU %.1f%%\n", k.step, k.tokens_per_s, 100 * k.mfu);
    dw_plan_engine_cost et = {.size = sizeof et};
    if (dw_plan_runs_on_engine(plan, NULL) && dw_plan_get_engine_cost(ctx, plan, &et) == DW_OK)
        printf("      Deepwell engine, per step: GEMMs %.2f ms, attention %.2f ms, memory-bound kernels %.2f ms "
               "(%lld micro-batch(es)), launch overhead %.2f ms (%.0f launches each), AdamW %.2f ms\n",
               1e3 * ga * et.gemm, 1e3 * ga * et.attn, 1e3 * ga * et.mem, (long long)ga, 1e3 * ga * et.overhead,
               et.launches, 1e3 * et.optimizer);
    return true;
}

/* --explain: the program the engine would run for the plan (one device, CUDA sm_90 as the planner
 * prices it, the plan's micro-batch, sequence, precision and recompute) and why each MoE linear
 * layer gets its grouped GEMMs. Needs no GPU. */
static bool explain_engine(dw_ctx *ctx, const dw_plan *plan) {
    plan_view v;
    view_of(plan, &v);
    dw_policy *pol = NULL;
    dw_graph *g = NULL;
    dw_compiled *cp = NULL;
    char *text = NULL;
    dw_capture_opts co;
    dw_capture_opts_init(&co, sizeof co);
    co.batch = v.l.micro_batch, co.seq = v.l.seq;
    dw_compile_opts cpo;
    dw_compile_opts_init(&cpo, sizeof cpo);
    cpo.device = DW_DEVICE_CUDA, cpo.sm = 90, cpo.recompute = v.l.recompute, cpo.fused_head = true;
    dw_status s = dw_plan_engine_policy(ctx, plan, &pol);
    if (s == DW_OK) s = dw_capture(ctx, v.in.model, &co, &g);
    if (s == DW_OK) s = dw_compile(ctx, g, NULL, pol, &cpo, &cp);
    if (s == DW_OK) s = dw_compiled_explain(ctx, cp, &text);
    printf("\n== the engine's kernels (--explain): micro-batch %lld x seq %lld ==\n", (long long)v.l.micro_batch,
           (long long)v.l.seq);
    if (s == DW_OK) fputs(text, stdout);
    else printf("FAIL  explain: %s\n", dw_errmsg(ctx));
    dw_free_string(text);
    dw_compiled_free(cp);
    dw_graph_free(g);
    dw_policy_free(pol);
    return s == DW_OK;
}

int cmd_dryrun(int argc, char **argv) {
    static const struct option opts[] = {PLAN_ARG_OPTIONS,
                                         {"plan", required_argument, 0, 'p'},
                                         {"run", no_argument, 0, 'r'},
                                         {"explain", no_argument, 0, 'x'},
                                         {"steps", required_argument, 0, 'n'},
                                         {"warmup", required_argument, 0, 'w'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    plan_args a;
    plan_args_init(&a);
    const char *plan_path = NULL;
    bool run = false, explain = false;
    long steps = 10, warm = 3;
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    dw_status s = dw_ctx_create(&co, &ctx);
    if (s != DW_OK) return cli_fail("dryrun", NULL, s);
    int c, rc = DW_EXIT_OK;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c >= PLAN_ARG_FIRST && c <= PLAN_ARG_LAST) {
            if (!plan_args_opt("dryrun", c, optarg, &a)) {
                rc = DW_EXIT_USAGE;
                goto done;
            }
            continue;
        }
        switch (c) {
        case 'p': plan_path = optarg; break;
        case 'r': run = true; break;
        case 'x': explain = true; break;
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
    dw_hw *hw = NULL;
    if ((rc = plan_args_load_hw("dryrun", ctx, &a, &hw)) != DW_EXIT_OK) goto done;
    dw_plan *plan = NULL;
    rc = choose_plan(ctx, &a, hw, plan_path, &plan);
    dw_hw_free(hw);
    if (rc != DW_EXIT_OK) goto done;
    dw_plan_info in = {.size = sizeof in};
    dw_plan_get_info(plan, &in);
    printf("dryrun %s on %d x %s, seq %lld, global batch %lld, %s\nplan: %s%s%s\n\n", a.model, (int)in.gpus, in.gpu,
           (long long)in.seq, (long long)in.global_batch, dw_recipe_name((dw_recipe)in.recipe), dw_plan_summary(plan),
           plan_path ? " from " : " (planner's best)", plan_path ? plan_path : "");
    int fails = 0;
    bool formed = check(ctx, plan, &fails), ran = false;
    const char *why = NULL;
    if (!run)
        printf("SKIP  gpu-run: not requested (--run executes a one-GPU plan with the CUDA engine and compares)\n");
    else if (!formed && !dw_plan_runs_on_engine(plan, &why))
        not_run(why);
    else if (!formed)
        not_run("the plan is not well-formed (see constraints)");
    else
        ran = gpu_run(plan, steps, warm, &fails);
    if (explain && !explain_engine(ctx, plan)) fails++;
    printf("\n%s: %d check(s) failed%s\n", fails || (run && !ran) ? "FAIL" : "PASS", fails,
           run && !ran ? "; gpu-run NOT RUN" : "");
    if (run && !ran) fails++;
    rc = fails ? DW_EXIT_FAIL : DW_EXIT_OK;
    dw_plan_free(plan);
done:
    dw_ctx_free(ctx);
    return rc;
}
