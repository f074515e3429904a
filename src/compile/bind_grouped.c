/* bind_grouped.c — the kernel decision of each MoE linear layer (moe_linear): per pass (fprop,
 * dgrad, wgrad) the grouped GEMM the registry selects for the target at the planned shape — the
 * registry entries (src/gemm/grouped_kernels.c) are the one home of the kernels' rules — kept in
 * the node's binding for the runtime to run, and the readable account of every candidate for
 * `deepwell compile --explain`. No kernel for a pass is a compile error naming the node. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "compile/bind_grouped.h"
#include "compile/passes.h"
#include "core/env.h"
#include "core/error.h"
#include "gemm/grouped.h"

/* Pass p of MoE linear node i as the engine issues it: x [R,K] rows grouped by expert, W [E,M,K];
 * FP32 on the CPU (its backend computes in FP32), else the program's activation type. Pointers are
 * placeholders (aligned). */
static dw_grouped_args node_args(const dw_compiled *c, int i, int p) {
    const dw_ir_node *n = &c->g->nodes[i];
    const dw_ir_tensor *w = &c->g->tensors[n->in[1]];
    const bool cuda = c->target.device == DW_DEVICE_CUDA;
    const void *ph = (const void *)(uintptr_t)4096;
    return (dw_grouped_args){.pass = p, .dtype = cuda && c->bf16 ? DW_GROUPED_BF16 : DW_GROUPED_F32,
                             .recipe = DW_RECIPE_BF16, .rows = c->tensor[n->in[0]].rows_cap, .experts = w->shape[0],
                             .m = w->shape[1], .k = w->shape[2], .x = ph, .w = ph, .dy = ph, .out = (void *)ph,
                             .offsets = (const int32_t *)ph};
}

/* DW_MOE_GEMM (core/env.h) on a CUDA target: the built-in kernel asked for (NULL: auto, unset or
 * another target); *bad for a value it does not know. */
static const char *forced_backend(const dw_compiled *c, const char **bad) {
    const char *v = dw_env("DW_MOE_GEMM");
    *bad = NULL;
    if (!v || !strcmp(v, "auto") || c->target.device != DW_DEVICE_CUDA) return NULL;
    static const char *const knob[][2] = {
        {"simt", "grouped_cuda_simt"}, {"mma", "grouped_mma_sm80"}, {"wgmma", "grouped_wgmma_sm90"}};
    for (size_t i = 0; i < sizeof knob / sizeof knob[0]; i++)
        if (!strcmp(v, knob[i][0])) return knob[i][1];
    *bad = v;
    return NULL;
}

static const char *const pass_names[DW_QPASS_COUNT] = {"fprop", "dgrad", "wgrad"};

dw_status dw_compile_bind_grouped(dw_ctx *ctx, dw_compiled *c, int i) {
    const char *bad = NULL, *forced = forced_backend(c, &bad);
    if (bad) return dw_set_error(ctx, DW_ERR_INVALID, "compile: DW_MOE_GEMM must be auto, wgmma, mma or simt, not '%s'", bad);
    for (int p = 0; p < DW_QPASS_COUNT; p++) {
        dw_grouped_args a = node_args(c, i, p);
        a.backend = forced;
        c->node[i].bind.kernel[p] = dw_grouped_registry_pick((dw_device_kind)c->target.device, c->target.sm, &a, NULL, 0);
        if (c->node[i].bind.kernel[p]) continue;
        char log[3072] = "";
        dw_grouped_registry_pick((dw_device_kind)c->target.device, c->target.sm, &a, log, sizeof log);
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "compile: node '%s' (moe_linear): no grouped kernel runs its %s "
                            "(%lld experts, K %lld, M %lld) on %s sm_%d%s:\n%s", c->g->nodes[i].name, pass_names[p],
                            (long long)a.experts, (long long)a.k, (long long)a.m,
                            c->target.device == DW_DEVICE_CUDA ? "cuda" : "cpu", c->target.sm,
                            forced ? " (DW_MOE_GEMM asks for one)" : "", log);
    }
    return DW_OK;
}

void dw_compile_explain_grouped(const dw_compiled *c, int i, FILE *f) {
    const char *bad = NULL, *forced = forced_backend(c, &bad);
    for (int p = 0; p < DW_QPASS_COUNT; p++) {
        dw_grouped_args a = node_args(c, i, p);
        a.backend = forced;
        char log[3072] = "";
        dw_grouped_registry_pick((dw_device_kind)c->target.device, c->target.sm, &a, log, sizeof log);
        fprintf(f, "     %s: rows %lld, %lld experts, K %lld -> M %lld, %s%s\n", pass_names[p], (long long)a.rows,
                (long long)a.experts, (long long)a.k, (long long)a.m, a.dtype == DW_GROUPED_BF16 ? "bf16" : "fp32",
                forced ? " (DW_MOE_GEMM asks for one)" : "");
        for (const char *l = log; *l;) { /* the registry's lines, indented under the pass */
            const char *e = strchr(l, '\n');
            const int n = e ? (int)(e - l) : (int)strlen(l);
            fprintf(f, "     %.*s\n", n, l);
            l += n + (e != NULL);
        }
        fprintf(f, "       selected: %s\n", c->node[i].bind.kernel[p] ? c->node[i].bind.kernel[p] : "(none)");
    }
}
