/* args.c — shared job flags of `deepwell plan` / `deepwell dryrun` and loading the model,
 * hardware and measured GEMM rates they name. No printing: errors go through dw_set_error. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "plan/args.h"

static dw_status parse_ll(dw_ctx *ctx, const char *flag, const char *s, long long lo, long long hi,
                          long long *out) {
    char *end = NULL;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < lo || v > hi)
        return dw_set_error(ctx, DW_ERR_INVALID, "%s expects an integer in [%lld, %lld], got '%s'", flag, lo,
                            hi, s ? s : "");
    *out = v;
    return DW_OK;
}

dw_status dw_plan_parse_moe(dw_ctx *ctx, const char *spec, dw_job *job) {
    char buf[256];
    if (!spec || strlen(spec) >= sizeof buf || !*spec)
        return dw_set_error(ctx, DW_ERR_INVALID, "--moe expects experts=E,top_k=K,capacity=C");
    strcpy(buf, spec);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) return dw_set_error(ctx, DW_ERR_INVALID, "--moe: '%s' is not key=value", tok);
        *eq = 0;
        const char *k = tok, *v = eq + 1;
        long long x = 0;
        if (!strcmp(k, "experts")) {
            DW_TRY(parse_ll(ctx, "--moe experts", v, 1, 1 << 20, &x));
            job->moe_experts = x;
        } else if (!strcmp(k, "top_k")) {
            DW_TRY(parse_ll(ctx, "--moe top_k", v, 1, 1 << 20, &x));
            job->moe_top_k = x;
        } else if (!strcmp(k, "capacity")) {
            char *end = NULL;
            double c = strtod(v, &end);
            if (!*v || *end || !isfinite(c) || c < 1 || c > 64)
                return dw_set_error(ctx, DW_ERR_INVALID, "--moe capacity expects a number in [1, 64], got '%s'", v);
            job->moe_capacity = c;
        } else {
            return dw_set_error(ctx, DW_ERR_INVALID, "--moe: unknown key '%s' (experts, top_k, capacity)", k);
        }
    }
    return DW_OK;
}

dw_status dw_plan_args_opt(dw_ctx *ctx, int c, const char *arg, dw_plan_args *a) {
    long long x = 0;
    switch (c) {
    case 0x100: a->hw = arg; return DW_OK;
    case 0x101: DW_TRY(parse_ll(ctx, "--nodes", arg, 1, 1000000, &x)); a->nodes = (long)x; return DW_OK;
    case 0x102:
        DW_TRY(parse_ll(ctx, "--seq", arg, 1, 1LL << 24, &x));
        a->job.seq = x, a->seq_given = true;
        return DW_OK;
    case 0x103:
        DW_TRY(parse_ll(ctx, "--global-batch", arg, 1, 1LL << 30, &x));
        a->job.global_batch = x, a->batch_given = true;
        return DW_OK;
    case 0x104:
        if (!dw_recipe_parse(arg, &a->job.recipe) || !dw_plan_supports_recipe(a->job.recipe))
            return dw_set_error(ctx, DW_ERR_INVALID,
                                "--precision: unknown recipe '%s' (bf16, fp8_block, mxfp8, nvfp4)", arg);
        return DW_OK;
    case 0x105: return dw_plan_parse_moe(ctx, arg, &a->job);
    case 0x106: a->gemm = arg; return DW_OK;
    case 0x108: DW_TRY(parse_ll(ctx, "--gpus", arg, 1, 4096, &x)); a->gpus = (long)x; return DW_OK;
    case 0x107: {
        char *end = NULL;
        double h = strtod(arg, &end);
        if (!*arg || *end || !isfinite(h) || h < 0.01 || h > 0.8)
            return dw_set_error(ctx, DW_ERR_INVALID, "--headroom expects a fraction in [0.01, 0.8], got '%s'", arg);
        a->job.mem_headroom = h;
        return DW_OK;
    }
    default: return dw_set_error(ctx, DW_ERR_INVALID, "internal: option %d is not a plan option", c);
    }
}

/* --gpus N: a node of the first N GPUs of the description (NVLink domain capped at N). */
static dw_status keep_gpus(dw_ctx *ctx, long n, dw_hw **hwp) {
    dw_hw *hw = *hwp;
    if (n > hw->n_gpus)
        return dw_set_error(ctx, DW_ERR_INVALID, "--gpus %ld: the hardware description has %d GPUs per node", n,
                            hw->n_gpus);
    if (n == hw->n_gpus) return DW_OK;
    dw_hw *k = dw_hw_alloc((int)n);
    if (!k) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    dw_gpu_info *gpus = k->gpus;
    dw_peer_link *peers = k->peers;
    *k = *hw;
    k->n_gpus = (int)n, k->gpus = gpus, k->peers = peers;
    for (long i = 0; i < n; i++) {
        gpus[i] = hw->gpus[i];
        for (long j = 0; j < n; j++) peers[i * n + j] = hw->peers[i * hw->n_gpus + j];
    }
    if (k->nodes <= 1 && k->nvlink_domain > n) k->nvlink_domain = (int)n;
    dw_hw_free(hw);
    *hwp = k;
    return DW_OK;
}

void dw_plan_setup_free(dw_plan_setup *s) {
    if (!s) return;
    dw_hw_free(s->hw);
    dw_gemm_table_free(&s->gemm);
    memset(s, 0, sizeof *s);
}

dw_status dw_plan_setup_load(dw_ctx *ctx, const dw_plan_args *a, dw_plan_setup *out) {
    memset(out, 0, sizeof *out);
    if (!a->model) return dw_set_error(ctx, DW_ERR_INVALID, "missing MODEL (a preset name or a directory)");
    if (!a->hw) return dw_set_error(ctx, DW_ERR_INVALID, "missing --hw PRESET|FILE");
    if (!a->seq_given) return dw_set_error(ctx, DW_ERR_INVALID, "missing --seq S");
    if (!a->batch_given) return dw_set_error(ctx, DW_ERR_INVALID, "missing --global-batch G");
    dw_status s = dw_model_config_load(ctx, a->model, &out->cfg);
    if (s != DW_OK) return s;
    struct stat st;
    bool is_file = strchr(a->hw, '/') || strstr(a->hw, ".json") || stat(a->hw, &st) == 0;
    if (!strcmp(a->hw, "probe")) {
        s = dw_probe(ctx, &out->hw); /* this machine; zero GPUs is refused by dw_plan_in_init */
        if (s == DW_OK && a->nodes > 0) out->hw->nodes = (int)a->nodes;
    } else if (is_file) {
        s = dw_hw_load(ctx, a->hw, &out->hw);
        if (s == DW_OK && a->nodes > 0) out->hw->nodes = (int)a->nodes;
    } else {
        s = dw_hw_preset(ctx, a->hw, a->nodes > 0 ? (int)a->nodes : 1, &out->hw);
    }
    if (s == DW_OK && a->gpus > 0) s = keep_gpus(ctx, a->gpus, &out->hw);
    if (s == DW_OK && a->gemm) s = dw_gemm_table_load(ctx, a->gemm, &out->gemm);
    if (s == DW_OK)
        s = dw_plan_in_init(ctx, &out->cfg, out->hw, &a->job, a->gemm ? &out->gemm : NULL, &out->in);
    if (s != DW_OK) dw_plan_setup_free(out);
    return s;
}
