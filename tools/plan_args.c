/* plan_args.c — the job flags of `deepwell plan` / `deepwell dryrun` and the hardware they name
 * (see plan_args.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "plan_args.h"

void plan_args_init(plan_args *a) {
    memset(a, 0, sizeof *a);
    dw_plan_job_init(&a->job, sizeof a->job);
}

/* "experts=E,top_k=K,capacity=C" (any subset, any order) into the job. */
static bool parse_moe(const char *cmd, const char *spec, dw_plan_job *job) {
    char buf[256];
    if (!spec || strlen(spec) >= sizeof buf || !*spec) {
        cli_error(cmd, "--moe expects experts=E,top_k=K,capacity=C");
        return false;
    }
    strcpy(buf, spec);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) {
            cli_error(cmd, "--moe: '%s' is not key=value", tok);
            return false;
        }
        *eq = 0;
        const char *k = tok, *v = eq + 1;
        long x = 0;
        if (!strcmp(k, "experts")) {
            if (!cli_parse_int(cmd, "--moe experts", v, 1, 1 << 20, &x)) return false;
            job->moe_experts = x;
        } else if (!strcmp(k, "top_k")) {
            if (!cli_parse_int(cmd, "--moe top_k", v, 1, 1 << 20, &x)) return false;
            job->moe_top_k = x;
        } else if (!strcmp(k, "capacity")) {
            char *end = NULL;
            double c = strtod(v, &end);
            if (!*v || *end || !isfinite(c) || !(c > 0) || c > 64) {
                cli_error(cmd, "--moe capacity expects a number in (0, 64], got '%s'", v);
                return false;
            }
            job->moe_capacity = c;
        } else {
            cli_error(cmd, "--moe: unknown key '%s' (experts, top_k, capacity)", k);
            return false;
        }
    }
    return true;
}

bool plan_args_opt(const char *cmd, int c, const char *arg, plan_args *a) {
    long x = 0;
    switch (c) {
    case 0x100: a->hw = arg; return true;
    case 0x101:
        if (!cli_parse_int(cmd, "--nodes", arg, 1, 1000000, &x)) return false;
        a->nodes = x;
        return true;
    case 0x102:
        if (!cli_parse_int(cmd, "--seq", arg, 1, 1L << 24, &x)) return false;
        a->job.seq = x, a->seq_given = true;
        return true;
    case 0x103:
        if (!cli_parse_int(cmd, "--global-batch", arg, 1, 1L << 30, &x)) return false;
        a->job.global_batch = x, a->batch_given = true;
        return true;
    case 0x104: {
        dw_recipe r;
        if (!dw_recipe_parse(arg, &r) || !dw_plan_supports_recipe(r)) {
            cli_error(cmd, "--precision: unknown recipe '%s' (bf16, fp8_block, mxfp8, nvfp4)", arg);
            return false;
        }
        a->job.recipe = r;
        return true;
    }
    case 0x105: return parse_moe(cmd, arg, &a->job);
    case 0x106: a->job.gemm_rates = arg; return true;
    case 0x107: {
        char *end = NULL;
        double h = strtod(arg, &end);
        if (!*arg || *end || !isfinite(h) || h < 0.01 || h > 0.8) {
            cli_error(cmd, "--headroom expects a fraction in [0.01, 0.8], got '%s'", arg);
            return false;
        }
        a->job.mem_headroom = h;
        return true;
    }
    case 0x108:
        if (!cli_parse_int(cmd, "--gpus", arg, 1, 4096, &x)) return false;
        a->gpus = x;
        return true;
    default: cli_error(cmd, "internal: option %d is not a plan option", c); return false;
    }
}

int plan_args_load_hw(const char *cmd, dw_ctx *ctx, const plan_args *a, dw_hw **out) {
    *out = NULL;
    const char *missing = !a->model ? "missing MODEL (a preset name or a directory)"
                        : !a->hw ? "missing --hw PRESET|FILE"
                        : !a->seq_given ? "missing --seq S"
                        : !a->batch_given ? "missing --global-batch G" : NULL;
    if (missing) {
        cli_error(cmd, "%s", missing);
        return DW_EXIT_USAGE;
    }
    struct stat st;
    bool is_file = strchr(a->hw, '/') || strstr(a->hw, ".json") || stat(a->hw, &st) == 0;
    dw_hw *hw = NULL;
    dw_status s;
    if (!strcmp(a->hw, "probe")) s = dw_probe(ctx, &hw); /* zero GPUs is refused by the planner */
    else if (is_file) s = dw_hw_load(ctx, a->hw, &hw);
    else s = dw_hw_preset(ctx, a->hw, a->nodes > 0 ? (int)a->nodes : 1, &hw);
    if (s == DW_OK && a->nodes > 0) s = dw_hw_set_nodes(ctx, hw, (int)a->nodes);
    if (s == DW_OK && a->gpus > dw_hw_gpu_count(hw)) {
        cli_error(cmd, "--gpus %ld: the hardware description has %d GPUs per node", a->gpus, dw_hw_gpu_count(hw));
        dw_hw_free(hw);
        return DW_EXIT_USAGE;
    }
    if (s == DW_OK && a->gpus > 0) s = dw_hw_keep_gpus(ctx, hw, (int)a->gpus);
    if (s != DW_OK) {
        dw_hw_free(hw);
        return cli_fail(cmd, ctx, s);
    }
    *out = hw;
    return DW_EXIT_OK;
}
