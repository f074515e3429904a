/* engine.c — the planner's view of Deepwell's own CUDA engine: which plans it runs as they are
 * (one GPU, no recompute/ZeRO/offload) and its exact device memory, taken from dw_compile's
 * static plan — the code the engine allocates from — so prediction and engine cannot drift.
 * Planning only: captures and compiles a graph of shapes, touches no GPU. */
#include <stdio.h>
#include <string.h>

#include "capture/capture.h"
#include "compile/compile.h"
#include "core/error.h"
#include "plan/plan.h"

_Static_assert(DW_POOL_COUNT == 5, "dw_engine_mem.pool has one entry per pool");

static bool say(char *why, int len, const char *what) {
    if (why && len > 0) snprintf(why, (size_t)len, "%s", what);
    return false;
}

bool dw_plan_engine_runnable(const dw_plan_in *in, const dw_par *par, char *why, int why_len) {
    char buf[320];
    if (par->dp != 1 || par->tp != 1 || par->pp != 1 || par->cp != 1 || par->ep != 1 || par->vpp != 1) {
        snprintf(buf, sizeof buf, "the plan uses %lld GPUs (dp %d tp %d pp %d cp %d ep %d); the engine runs "
                 "on one GPU", (long long)par->dp * par->tp * par->pp * par->cp, par->dp, par->tp, par->pp,
                 par->cp, par->ep);
        return say(why, why_len, buf);
    }
    if (!in->engine_model) return say(why, why_len, in->engine_why);
    if (par->recompute != DW_RC_NONE) {
        snprintf(buf, sizeof buf, "recompute %s: the engine keeps every activation (no recomputation)",
                 dw_recompute_name(par->recompute));
        return say(why, why_len, buf);
    }
    if (par->zero != 0) {
        snprintf(buf, sizeof buf, "ZeRO-%d: the engine has no optimizer-state sharding", par->zero);
        return say(why, why_len, buf);
    }
    if (par->offload) return say(why, why_len, "offload: the engine keeps the optimizer on the GPU");
    return true;
}

/* Sets in->engine_model / engine_why (called by dw_plan_in_init). */
void dw_plan_engine_probe_model(dw_plan_in *in) {
    in->engine_model = false;
    in->engine_why[0] = 0;
    if (in->experts > 0) {
        snprintf(in->engine_why, sizeof in->engine_why, "mixture-of-experts layers: the engine runs dense "
                 "models only");
        return;
    }
    dw_graph *g = NULL;
    if (dw_capture_config(NULL, in->cfg, 1, in->job.seq, &g) == DW_OK) in->engine_model = true;
    else snprintf(in->engine_why, sizeof in->engine_why, "the engine cannot build this model: %s", dw_errmsg(NULL));
    dw_graph_free(g);
}

dw_status dw_plan_engine_policy(dw_ctx *ctx, const dw_plan_in *in, dw_policy **out) {
    dw_plan_prec p = in->job.prec;
    return dw_policy_from_precision(ctx, dw_plan_prec_name(p), p != DW_PREC_BF16, out);
}

dw_status dw_plan_engine_memory(dw_ctx *ctx, const dw_plan_in *in, int64_t micro_batch, dw_engine_mem *out) {
    memset(out, 0, sizeof *out);
    dw_graph *g = NULL;
    dw_policy *pol = NULL;
    dw_compiled *c = NULL;
    dw_status s = dw_capture_config(ctx, in->cfg, micro_batch, in->job.seq, &g);
    if (s == DW_OK) s = dw_plan_engine_policy(ctx, in, &pol);
    if (s == DW_OK) s = dw_compile(ctx, g, NULL, pol, &c);
    if (s == DW_OK) {
        for (int p = 0; p < DW_POOL_COUNT; p++) out->pool[p] = c->pool_bytes[p], out->total += c->pool_bytes[p];
        out->cublaslt = DW_COMPILE_LT_WORKSPACE;
        out->context = DW_PLAN_CUDA_CONTEXT;
        out->total += out->cublaslt + out->context;
    }
    dw_compiled_free(c);
    dw_policy_free(pol);
    dw_graph_free(g);
    return s;
}
